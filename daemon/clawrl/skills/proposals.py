"""From feedback to skills: when one user's corrections keep saying the same thing, draft a skill.

Weights learn over dozens of turns; a skill changes the next one. This module reads the hints of
turns judged wrong (the judge's hint, or the user's own feedback comment) and, per user, finds a
word that their corrections share across `skills.propose_after` different sessions ("shorter",
"bullet", "metric"). Each such preference becomes a *proposed* skill in
`$CLAWRL_HOME/skills-proposed/NAME/SKILL.md`: a draft quoting the corrections, never published by
itself. `clawrl skills accept NAME` moves it into the skills source, where skill_bridge checks and
publishes it; `clawrl skills reject NAME` deletes it. Either way the preference is remembered in
`skills-proposed/.state.json` and not proposed again.

Matching is lexical on purpose: it is cheap, explainable and never invents a preference the user
did not put into words; corrections that say the same thing in different words are missed.
"""
from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import time
from collections import defaultdict
from pathlib import Path

from skill_bridge import NAME_RE, validate_skill

from ..turnlog.store import connect_sync

STATE_FILE = ".state.json"
MAX_QUOTES = 8
# Words that say nothing about *what* the user wants changed.
GENERIC = set("""
a about above after again all also am an and any are as at be because been before being below
both but by can could did do does doing done down during each even few for from further get got
had has have having he her here hers him his how i if in into is it its just know let like make
me more most my no nor not now of off on once only or other our out over own please really redo
right same she should so some such than thank thanks that the their them then there these they
this those through to too try under until up us very want was way we were what when where which
while who why will with would yes yet you your answer answers reply response again wrong mistake
think seems need needs still instead next time something thing things much many one two
""".split())


def words(text: str) -> set[str]:
    """The content words of a hint, lower-cased, with a plain plural 's' dropped."""
    out = set()
    for w in re.findall(r"[a-z][a-z'-]{2,}", text.lower()):
        w = w.strip("'-")
        if w.endswith("s") and not w.endswith("ss") and len(w) > 4:
            w = w[:-1]
        if len(w) > 2 and w not in GENERIC:
            out.add(w)
    return out


def corrections(db_path: Path, limit: int = 2000) -> list[dict]:
    """The newest hints of turns judged or marked wrong, with who and which session."""
    db = connect_sync(db_path)
    try:
        rows = db.execute(
            "SELECT coalesce(t.user_id, s.user_id, 'default') AS user_id, t.session_id,"
            " coalesce(t.feedback_comment, t.judge_hint) AS hint FROM turns t"
            " JOIN sessions s ON s.id = t.session_id"
            " WHERE coalesce(t.feedback_reward, t.judge_score) < 0"
            " AND coalesce(t.feedback_comment, t.judge_hint) IS NOT NULL"
            " ORDER BY t.id DESC LIMIT ?", (limit,)).fetchall()
    finally:
        db.close()
    return [{"user": r[0], "session": r[1], "hint": r[2]} for r in rows]


def preferences(hints: list[dict], min_sessions: int) -> list[dict]:
    """Per user, each word their corrections share across at least `min_sessions` sessions, with
    the corrections that say it; strongest first, one per group of hints."""
    found = []
    by_user: dict[str, list[dict]] = defaultdict(list)
    for h in hints:
        by_user[h["user"]].append({**h, "words": words(h["hint"])})
    for user, items in by_user.items():
        sessions: dict[str, set[str]] = defaultdict(set)
        for h in items:
            for w in h["words"]:
                sessions[w].add(h["session"])
        used: set[int] = set()
        for word in sorted(sessions, key=lambda w: (-len(sessions[w]), w)):
            if len(sessions[word]) < min_sessions:
                break
            evidence = [i for i, h in enumerate(items) if word in h["words"] and i not in used]
            if len({items[i]["session"] for i in evidence}) < min_sessions:
                continue    # these corrections already back a stronger word
            used.update(evidence)
            found.append({"user": user, "word": word, "sessions": sorted(sessions[word]),
                          "hints": [items[i]["hint"] for i in evidence]})
    return found


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:40].strip("-") or "user"


def draft(name: str, pref: dict) -> str:
    quotes = list(dict.fromkeys(" ".join(h.split()) for h in pref["hints"]))[:MAX_QUOTES]
    n = len(pref["sessions"])
    description = (f"Follow a standing preference of user {pref['user']} about "
                   f"'{pref['word']}': they corrected answers on it in {n} sessions.")
    lines = ["---", f"name: {name}", f"description: {json.dumps(description)}", "---", "",
             f"# Preference: {pref['word']}", "",
             f"Drafted by clawrl from {len(pref['hints'])} corrections by user {pref['user']} "
             f"in {n} sessions. Review and edit it before accepting.", "",
             "## What the user keeps asking for", ""]
    lines += [f"- \"{q}\"" for q in quotes]
    lines += ["", "## How to apply it", "",
              "Before you answer this user, check your draft against the corrections above and "
              "change it the way they asked. Keep doing the rest of the task as usual.", ""]
    return "\n".join(lines)


class Proposals:
    """The `skills-proposed/` folder: drafts, and what was proposed before."""
    # `list` below is a method, so annotations after it in this class say `builtins.list`.

    def __init__(self, folder: Path, source: Path):
        self.folder, self.source = folder, source

    def _state(self) -> dict:
        try:
            return json.loads((self.folder / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {"seen": {}}

    def _save(self, state: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.folder / STATE_FILE)

    def list(self) -> list[dict]:
        state = self._state()
        by_name = {v["name"]: v for v in state["seen"].values()}
        out = []
        for d in sorted(self.folder.glob("*/SKILL.md")) if self.folder.is_dir() else []:
            meta = by_name.get(d.parent.name, {})
            out.append({"name": d.parent.name, "user": meta.get("user"), "word": meta.get("word"),
                        "sessions": meta.get("sessions"), "at": meta.get("at"),
                        "path": str(d.parent)})
        return out

    def propose(self, db_path: Path, min_sessions: int) -> builtins.list[str]:
        """Write a draft for each new preference; return the new drafts' names."""
        if min_sessions <= 0 or not db_path.exists():
            return []
        state, new = self._state(), []
        for pref in preferences(corrections(db_path), min_sessions):
            key = f"{pref['user']}\x1f{pref['word']}"
            if key in state["seen"]:
                continue
            name = f"{slug(pref['user'])}-prefers-{slug(pref['word'])}"[:64].strip("-")
            if not NAME_RE.fullmatch(name) or (self.source / name).exists():
                continue
            folder = self.folder / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "SKILL.md").write_text(draft(name, pref))
            state["seen"][key] = {"name": name, "user": pref["user"], "word": pref["word"],
                                  "sessions": len(pref["sessions"]), "at": time.time(),
                                  "state": "proposed"}
            new.append(name)
        if new:
            self._save(state)
        return new

    def _mark(self, name: str, how: str) -> None:
        state = self._state()
        for v in state["seen"].values():
            if v["name"] == name:
                v["state"] = how
        self._save(state)

    def accept(self, name: str) -> Path:
        """Move a draft into the skills source (validated first); return where it went."""
        draft_dir = self._find(name)
        issues = validate_skill(draft_dir, self.folder)
        if issues:
            raise ValueError(f"the draft {name} does not validate; fix it in {draft_dir} first: "
                             + "; ".join(str(i) for i in issues))
        dest = self.source / name
        if dest.exists():
            raise FileExistsError(f"a skill named {name} exists already in {self.source}; "
                                  "rename the draft's folder and its name field, or delete that skill")
        self.source.mkdir(parents=True, exist_ok=True)
        shutil.move(str(draft_dir), str(dest))
        self._mark(name, "accepted")
        return dest

    def reject(self, name: str) -> None:
        shutil.rmtree(self._find(name))
        self._mark(name, "rejected")

    def forget_user(self, user: str) -> builtins.list[str]:
        """Delete the drafts quoting `user`'s corrections and what was proposed for them (accepted
        skills are the user's own now and stay). Returns the deleted drafts' names."""
        state, gone = self._state(), []
        for key, v in list(state["seen"].items()):
            if v["user"] != user:
                continue
            if v.get("state") == "proposed" and (self.folder / v["name"]).is_dir():
                shutil.rmtree(self.folder / v["name"])
                gone.append(v["name"])
            del state["seen"][key]
        self._save(state)
        return gone

    def _find(self, name: str) -> Path:
        if not NAME_RE.fullmatch(name) or not (self.folder / name / "SKILL.md").is_file():
            known = ", ".join(p["name"] for p in self.list()) or "none"
            raise LookupError(f"no proposed skill named {name!r} (proposed: {known}); "
                              "`clawrl skills list` shows them")
        return self.folder / name
