"""`clawrl eval`: does the loop make the model better for a simulated user, and how fast?

One *run* is one (persona, method, seed) — or a no-train control — against its own `clawrl serve`
child: a fresh CLAWRL_HOME (the converted models are shared), the recipe's engine and model, the
method and judge under test, training on or off. The run alternates two things:

* interactions: a training prompt, the model's answer, then the simulated user's next message (a
  correction when the persona's verifier is unhappy, thanks when it is happy), sent in the same
  session so the daemon reads it as the answer's next state; then the session is ended. The real
  judge, trainer and hot-swap do the rest.
* checkpoints (after 0, 12, 24, 36 interactions by default): wait until everything sent so far is
  judged, trained and live, then score the *first response* to every held-out prompt with the
  adapter live at that moment. Held-out requests carry X-Clawrl-No-Train, so they never train.

What is measured per checkpoint: the mean verifier score, the share of empty answers and of
degenerate ones (a repeated 4-gram makes up half the words), the live adapter, and the wall time.
Per run: how the daemon's judge read each training answer against whether the simulated user was
satisfied (the persona's HAPPY), and the interactions until the preference held (3 satisfied
training answers in a row).
The results, tables and plot are written by `evals/report.py`.
"""
from __future__ import annotations

import concurrent.futures
import os
import random
import re
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Self

import httpx

from ..config import env_key, is_override
from ..errors import ClawrlError
from ..procs import die_with_parent
from .child import DaemonChild
from .personas import Persona
from ..turnlog.store import AWAITING_JUDGE, AWAITING_TRAINER

# Where the loop still has work, in the store's own terms (the trainer's rule included).
READY_SQL = f"SELECT count(*) FROM turns WHERE {AWAITING_TRAINER}"
WAITING_SQL = f"SELECT count(*) FROM turns WHERE {AWAITING_JUDGE}"


# Set by the eval for each run (its own server, the method and judge under test): not the user's.
EVAL_SET = ("CLAWRL_SERVER_", "CLAWRL_JUDGE_BACKEND", "CLAWRL_TRAIN_ENABLED", "CLAWRL_METHOD_NAME",
            "CLAWRL_SKILLS_ENABLED", "CLAWRL_CONSOLIDATE_WHEN")
CONSOLIDATED = "+consolidate"   # the label suffix of a run that also consolidates (--consolidate-at)


SECRET_KEYS = ("api_key", "token", "secret", "password")


def recipe_overrides(env: dict[str, str]) -> dict[str, str]:
    """The `CLAWRL_<SECTION>_<KEY>` settings given on top of the recipe, as `section.key`: a
    result is reproducible only with them, so every run records them (a secret only as set)."""
    out = {}
    for name, value in sorted(env.items()):
        if is_override(name) and not name.startswith(EVAL_SET):
            key = ".".join(env_key(name))
            out[key] = "(set)" if key.endswith(SECRET_KEYS) else value
    return out


class Child(DaemonChild):
    """A `clawrl serve` of our own, in `home`, with `env` overrides on top of the recipe."""

    def __init__(self, home: Path, models: Path, env: dict[str, str], recipe: str | None):
        home.mkdir(parents=True, exist_ok=True)
        if not (home / "models").exists():
            models.mkdir(parents=True, exist_ok=True)
            (home / "models").symlink_to(models.resolve(), target_is_directory=True)
        super().__init__(home, {"CLAWRL_SERVER_API_KEY": "",
                                # A simulated user's skills must not reach the real OpenClaw workspace.
                                "CLAWRL_SKILLS_ENABLED": "false",
                                # Consolidation runs only where the eval asks for it (--consolidate-at).
                                "CLAWRL_CONSOLIDATE_WHEN": "off", **env,
                                **({"CLAWRL_RECIPE": recipe} if recipe else {})})

    def start(self, timeout: float = 600, **popen) -> Self:
        # An eval stopped by a signal must not leave its daemon (and trainer) running.
        return super().start(timeout, preexec_fn=die_with_parent, **popen)

    def count(self, sql: str) -> int:
        db = sqlite3.connect(self.db, timeout=30)
        try:
            return db.execute(sql).fetchone()[0]
        finally:
            db.close()

    def settle(self, timeout: float) -> int:
        """Wait until every next state is judged, every judged turn trained, and the newest
        adapter live (or rejected). Returns the live adapter version."""
        deadline = time.time() + timeout
        while True:
            adapters = httpx.get(f"{self.url}/v1/adapters", timeout=10).json()
            good = [v["version"] for v in adapters["versions"] if not v["rejected"]]
            newest = max(good, default=0)
            if (self.count(WAITING_SQL) == 0 and self.count(READY_SQL) == 0
                    and (adapters["active"] or 0) == newest):
                return adapters["active"] or 0
            if time.time() > deadline:
                raise ClawrlError(f"the loop did not settle within {timeout:.0f} s (waiting judge: "
                                  f"{self.count(WAITING_SQL)}, untrained: {self.count(READY_SQL)}, "
                                  f"live {adapters['active']}, newest {newest})")
            time.sleep(0.5)


    def consolidate(self, stall_s: float, progress=None) -> dict:
        """Ask the daemon's trainer to consolidate now and wait for the outcome (its status)."""
        from ..learn.consolidate import request
        root = self.home / "adapters"
        return wait_for_consolidation(root, request(root), stall_s, progress)


def wait_for_consolidation(root: Path, rid: str, stall_s: float, progress=None,
                           poll_s: float = 1.0) -> dict:
    """The final status of consolidation request `rid` in adapters folder `root`. A consolidation
    takes as long as its window needs (minutes per 30 steps on a CPU), so it is given up on only
    when it makes no progress (its step, state or message) for `stall_s`; each new step is passed
    to `progress`."""
    from ..adapters.versions import read_consolidation
    seen, moved = None, time.time()
    while True:
        status = read_consolidation(root) or {}
        mine = status.get("request") == rid
        if mine and status.get("state") not in (None, "running"):
            return status
        now = (status.get("state"), status.get("step"), status.get("message")) if mine else None
        if now != seen:
            seen, moved = now, time.time()
            if mine and progress and status.get("steps"):
                progress(f"consolidation step {status.get('step') or 0}/{status['steps']}")
        elif time.time() - moved > stall_s:
            where = f"at step {status.get('step') or 0} of {status.get('steps')}" if mine \
                else "it never started (is the daemon's trainer running?)"
            raise ClawrlError(f"consolidation made no progress for {stall_s:g} s: {where}")
        time.sleep(poll_s)


def chat(client: httpx.Client, url: str, messages: list[dict], session: str, max_tokens: int,
         seed: int, train: bool) -> str:
    headers = {"X-Session-Id": session}
    if not train:
        headers["X-Clawrl-No-Train"] = "1"
    r = client.post(f"{url}/v1/chat/completions", headers=headers, timeout=600, json={
        "messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed})
    r.raise_for_status()
    return r.json()["choices"][0]["message"].get("content") or ""


def degenerate(text: str) -> bool:
    """A repeated 4-gram covers at least half of the words."""
    words = re.findall(r"\w+", text.lower())
    if len(words) < 12:
        return False
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    top = max(grams.count(g) for g in set(grams))
    return top * 4 >= len(words) / 2


def opening(persona: Persona, prompt: str) -> list[dict]:
    return ([{"role": "system", "content": persona.system}] if persona.system else []) + \
        [{"role": "user", "content": prompt}]


def heldout(child: Child, persona: Persona, n: int, seed: int, workers: int = 4) -> dict:
    """Score the first response to the first `n` held-out prompts, a few at a time."""
    prompts = persona.heldout_prompts[:n]

    def one(i_prompt):
        i, prompt = i_prompt
        with httpx.Client() as c:
            text = chat(c, child.url, opening(persona, prompt), f"eval-{uuid.uuid4().hex[:12]}",
                        persona.max_tokens, seed * 100_003 + i, train=False)
        return persona.score(prompt, text), text

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, enumerate(prompts)))
    scores = [s for s, _ in done]
    return {"score": sum(scores) / len(scores), "scores": scores,
            "empty": sum(not t.strip() for _, t in done) / len(done),
            "degenerate": sum(degenerate(t) for _, t in done) / len(done),
            "samples": [t for _, t in done[:3]]}


def interact(client: httpx.Client, child: Child, persona: Persona, prompt: str,
             rng: random.Random, seed: int) -> tuple[float, str]:
    """One interaction: answer, the simulated user's reply as the next state, session end.
    Returns the verifier's score and the session id."""
    session = f"sim-{uuid.uuid4().hex[:12]}"
    messages = opening(persona, prompt)
    answer = chat(client, child.url, messages, session, persona.max_tokens, seed, train=True)
    score = persona.score(prompt, answer)
    follow = persona.reply(prompt, answer, score, rng)
    # The reply is the next state; what the model says to it is not needed, so ask for one token.
    chat(client, child.url, messages + [{"role": "assistant", "content": answer},
                                        {"role": "user", "content": follow}],
         session, 1, seed + 1, train=True)
    client.post(f"{child.url}/v1/sessions/{session}/end", timeout=30)
    return score, session


JUDGED_SQL = ("SELECT session_id, judge_score FROM turns WHERE judge_status='done' AND id IN"
              " (SELECT min(id) FROM turns WHERE session_id LIKE 'sim-%' GROUP BY session_id)")


def judge_check(child: Child, persona: Persona, sessions: list[str], scores: list[float],
                timeout: float) -> dict:
    """How the daemon's judge read each answer, against whether the simulated user was satisfied:
    agreement (the vote's sign is the user's), wrong sign, abstention (a 0), and unjudged turns."""
    deadline = time.time() + timeout
    while child.count(WAITING_SQL) and time.time() < deadline:
        time.sleep(0.5)
    db = sqlite3.connect(child.home / "clawrl.db", timeout=30)
    try:
        read = dict(db.execute(JUDGED_SQL).fetchall())
    finally:
        db.close()
    agree = wrong = abstain = missing = 0
    for session, score in zip(sessions, scores):
        truth = 1 if persona.satisfied(score) else -1
        vote = read.get(session)
        if vote is None:
            missing += 1
        elif vote == truth:
            agree += 1
        elif vote == -truth:
            wrong += 1
        else:
            abstain += 1
    n = len(sessions) or 1
    return {"n": len(sessions), "agreement": agree / n, "wrong_sign": wrong / n,
            "abstain": abstain / n, "unjudged": missing / n}


def until_holds(satisfied: list[bool], streak: int = 3) -> int | None:
    """Training interactions before the first run of `streak` satisfying ones began (OpenClaw-RL's
    "sessions until the preference holds"); None when it never held."""
    for i in range(len(satisfied) - streak + 1):
        if all(satisfied[i:i + streak]):
            return i
    return None


def run(persona: Persona, *, method: str | None, judge: str, seed: int, interactions: int,
        checkpoints: list[int], n_heldout: int, home: Path, models: Path, recipe: str | None,
        settle_timeout: float, progress=print, consolidate_at: tuple[int, ...] = ()) -> dict:
    """One run; method None is the no-train control. At the checkpoints in `consolidate_at` the
    run first has the daemon consolidate (a fresh adapter from the whole log) and serves it."""
    env = {"CLAWRL_JUDGE_BACKEND": judge, "CLAWRL_TRAIN_ENABLED": "false" if method is None else "true"}
    if method:
        env["CLAWRL_METHOD_NAME"] = method
    label = (method or "no-train") + (CONSOLIDATED if consolidate_at else "")
    child = Child(home, models, env, recipe).start()
    rng = random.Random(seed)
    order = persona.train_prompts[:]
    rng.shuffle(order)
    t0, points, train_scores, sessions, done = time.time(), [], [], [], 0
    try:
        with httpx.Client() as client:
            for cp in sorted(set(checkpoints)):
                while done < min(cp, interactions):
                    score, session = interact(client, child, persona, order[done % len(order)],
                                              rng, seed * 1_000_003 + done)
                    train_scores.append(score)
                    sessions.append(session)
                    done += 1
                    progress(f"{persona.name}/{label}/seed {seed}: interaction {done}/{interactions} "
                             f"scored {train_scores[-1]:.2f}")
                version = child.settle(settle_timeout) if method else 0
                consolidated = None
                if method and done in consolidate_at:
                    status = child.consolidate(settle_timeout, lambda msg: progress(
                        f"{persona.name}/{label}/seed {seed}: {msg}"))
                    consolidated = status.get("version")
                    progress(f"{persona.name}/{label}/seed {seed}: consolidation {status['state']}: "
                             f"{status.get('message')}")
                    version = child.settle(settle_timeout)
                h = heldout(child, persona, n_heldout, seed)
                points.append({"interactions": done, "adapter": version, "wall_s": time.time() - t0,
                               **({"consolidated": consolidated} if consolidated else {}),
                               **{k: h[k] for k in ("score", "empty", "degenerate", "samples")}})
                progress(f"{persona.name}/{label}/seed {seed}: after {done} interactions held-out "
                         f"score {h['score']:.3f} (adapter {version}, {time.time() - t0:.0f} s)")
        check = judge_check(child, persona, sessions, train_scores, settle_timeout)
        progress(f"{persona.name}/{label}/seed {seed}: judge {judge} agreed with the user on "
                 f"{check['agreement']:.0%} of {check['n']} answers, wrong sign "
                 f"{check['wrong_sign']:.0%}, abstained {check['abstain']:.0%}")
    finally:
        child.stop()
    satisfied = [persona.satisfied(x) for x in train_scores]
    return {"persona": persona.name, "method": label, "judge": judge, "seed": seed,
            "settings": recipe_overrides(dict(os.environ)), "points": points,
            "train_scores": train_scores, "satisfied": satisfied,
            "until_holds": until_holds(satisfied), "judge_check": check,
            "wall_s": time.time() - t0}


def main(args, cfg) -> int:
    """`clawrl eval`: every (persona, method, seed) run in turn; the report is rewritten after each."""
    import shlex
    import tempfile

    from . import report as eval_report, personas
    methods = [m for m in args.methods.split(",") if m]
    args.judge = args.judge or cfg.judge.backend
    consolidate_at = tuple(sorted({int(c) for c in (args.consolidate_at or "").split(",") if c}))
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",")} | {args.interactions}
                         | set(consolidate_at))
    work = Path(args.work or tempfile.mkdtemp(prefix="clawrl-eval-"))
    loaded = [personas.load(name) for name in args.persona]   # fail on a bad file before any run
    # With --consolidate-at, each method also runs with consolidation, on the same seeds.
    plan = [(p, m, s, c) for p in loaded for s in range(args.seeds)
            for m, c in ([(None, ())] if args.control else []) + [(m, ()) for m in methods]
            + ([(m, consolidate_at) for m in methods] if consolidate_at else [])]
    command = "clawrl eval " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    runs = eval_report.finished(Path(args.out)) if args.resume else []
    done = {(r["persona"], r["method"], r["seed"]) for r in runs}
    written, failed = [], 0
    for i, (persona, method, seed, at) in enumerate(plan, 1):
        label = (method or "no-train") + (CONSOLIDATED if at else "")
        if (persona.name, label, seed) in done:
            print(f"[{i}/{len(plan)}] {persona.name} {label} seed {seed}: done before, kept",
                  file=sys.stderr)
            continue
        print(f"[{i}/{len(plan)}] {persona.name} {label} seed {seed}", file=sys.stderr)
        home, t0 = work / f"{persona.name}-{label}-{seed}", time.time()
        try:
            runs.append(run(persona, method=method, judge=args.judge, seed=seed,
                            interactions=args.interactions, checkpoints=checkpoints,
                            n_heldout=args.heldout, home=home, models=cfg.models_dir,
                            recipe=args.recipe, settle_timeout=args.settle_timeout,
                            progress=lambda msg: print(f"  {msg}", file=sys.stderr),
                            consolidate_at=at))
        except (ClawrlError, httpx.HTTPError, OSError) as e:
            # One broken run must not cost the hours of the others: record it and go on.
            failed += 1
            print(f"  run failed: {e} (its daemon's log: {home / 'daemon.log'})", file=sys.stderr)
            runs.append({"persona": persona.name, "method": label, "judge": args.judge,
                         "seed": seed, "points": [], "train_scores": [],
                         "wall_s": time.time() - t0, "error": str(e)[:500]})
        # After every run, so a long evaluation that is stopped keeps what it measured.
        written = eval_report.write(runs, Path(args.out), command)
    for path in written:
        print(f"wrote {path}")
    return 1 if failed else 0
