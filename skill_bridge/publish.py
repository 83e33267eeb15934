"""Publishing: make OpenClaw's skills folder mirror the valid skills of a source folder.

Owns the target folder's managed set (a manifest of what clawrl put there) and the atomic
copy-then-rename that makes a new version live. It never touches a target entry it did not
publish, and it never publishes content that failed validation: the last valid version stays.
Staging and rename-aside folders are dot-prefixed inside the target, on the same filesystem,
because OpenClaw's skill discovery skips dot-prefixed entries (skill-root-discovery in its
dist) while it would find a SKILL.md up to six levels below any other folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .validate import SkillIssue, is_hidden, validate_skill, walk

MANIFEST = ".clawrl-published.json"
_STAGE, _ASIDE = ".clawrl-stage-", ".clawrl-old-"
STATUSES = ("published", "unchanged", "error", "unpublished", "conflict")


@dataclass
class SkillResult:
    """What reconciling one skill did. `hash` is the source's, `published_hash` what is live."""

    name: str
    status: str
    hash: str | None = None
    published_hash: str | None = None
    issues: list[SkillIssue] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "hash": self.hash,
                "published_hash": self.published_hash,
                "issues": [i.to_dict() for i in self.issues]}


def skill_hash(folder: Path) -> str:
    """sha256 over the sorted relative paths, executable bits and bytes of the skill's files.
    The executable bit counts because a chmod +x on scripts/ must republish."""
    h = hashlib.sha256()
    for rel, path, st in walk(Path(folder)):
        if stat.S_ISDIR(st.st_mode):
            continue
        body = os.readlink(path).encode() if stat.S_ISLNK(st.st_mode) else path.read_bytes()
        kind = "x" if st.st_mode & 0o111 else "f"
        h.update(f"{rel.as_posix()}\0{kind}\0{len(body)}\0".encode())
        h.update(body)
    return h.hexdigest()


def copy_skill(src: Path, dst: Path) -> None:
    """Copy the skill's non-hidden files and folders to `dst` (which must not exist). Links are
    copied as links so that validating the copy still refuses them; files are opened with
    O_NOFOLLOW so a file swapped for a link mid-copy cannot pull in outside content."""
    dst.mkdir()
    for rel, path, st in walk(src):
        out = dst / rel
        if stat.S_ISDIR(st.st_mode):
            out.mkdir()
        elif stat.S_ISLNK(st.st_mode):
            out.symlink_to(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fin, open(out, "xb") as fout:
                shutil.copyfileobj(fin, fout)
            shutil.copystat(path, out, follow_symlinks=False)


def _remove(path: Path) -> None:
    """Make `path` vanish at once (rename aside), then delete it at leisure."""
    if not os.path.lexists(path):
        return
    aside = Path(tempfile.mkdtemp(prefix=_ASIDE, dir=path.parent))
    os.rename(path, aside / "old")
    shutil.rmtree(aside)


class Publisher:
    """Reconciles skills from `source` into OpenClaw's `target` skills folder. Thread-safe."""

    def __init__(self, source: Path, target: Path):
        self.source = Path(source)
        self.target = Path(target)
        src, dst = self.source.resolve(), self.target.resolve()
        if src == dst or src.is_relative_to(dst) or dst.is_relative_to(src):
            # Publishing into the watched folder would feed every copy back to the watcher.
            raise ValueError(f"skills source {self.source} and OpenClaw skills folder "
                             f"{self.target} overlap — fix: use two separate folders")
        self._lock = threading.RLock()

    # -- the manifest: clawrl's claim on target entries ----------------------------------------
    def _manifest_path(self) -> Path:
        return self.target / MANIFEST

    def _load(self) -> dict[str, dict]:
        try:
            data = json.loads(self._manifest_path().read_text("utf-8"))
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(
                f"{self._manifest_path()} is not valid JSON ({e}) — fix: restore it, or delete "
                "it and remove the skills clawrl had published from that folder by hand "
                "(without it they look like your own skills and clawrl will not touch them)"
            ) from None
        return dict(data.get("skills", {}))

    def _save(self, skills: dict[str, dict]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=MANIFEST + ".", dir=self.target)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": 1, "skills": skills}, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._manifest_path())

    def managed(self) -> dict[str, dict]:
        """name -> {"hash", "published_at"} for every skill clawrl has live in the target."""
        with self._lock:
            return {k: dict(v) for k, v in self._load().items()}

    # -- reconciling -----------------------------------------------------------------------------
    def sync(self) -> list[SkillResult]:
        """Reconcile every skill in the source, and unpublish managed skills whose source is
        gone. Creates both folders if missing and clears leftovers of an interrupted publish."""
        with self._lock:
            self.source.mkdir(parents=True, exist_ok=True)
            self.target.mkdir(parents=True, exist_ok=True)
            for entry in self.target.iterdir():
                if entry.name.startswith((_STAGE, _ASIDE)):
                    shutil.rmtree(entry, ignore_errors=True)
            names = {p.name for p in self.source.iterdir() if not is_hidden(p.name)}
            names |= set(self._load())
            return [self.reconcile(n) for n in sorted(names)]

    def apply(self, name: str, change: Callable[[], object]) -> SkillResult:
        """Run `change` (a write to source/<name>) and reconcile the skill, with no reconcile of
        anyone else (the watcher) in between: the result is the transition this change caused,
        so whoever made it can say whether it went live. An exception from `change` propagates
        and nothing is reconciled."""
        with self._lock:
            change()
            return self.reconcile(name)

    def reconcile(self, name: str) -> SkillResult:
        """Bring target/<name> in line with source/<name>."""
        if not name or is_hidden(name) or "/" in name or os.sep in name or name == "..":
            raise ValueError(f"{name!r} is not a skill folder name (hidden or a path)")
        with self._lock:
            self.target.mkdir(parents=True, exist_ok=True)
            skills = self._load()
            entry = skills.get(name)
            src, dst = self.source / name, self.target / name
            live = entry["hash"] if entry else None
            if not os.path.lexists(src):
                if entry is None:
                    return SkillResult(name, "unchanged")
                _remove(dst)
                del skills[name]
                self._save(skills)
                return SkillResult(name, "unpublished")
            if entry is None and os.path.lexists(dst):
                return SkillResult(name, "conflict", issues=[SkillIssue(
                    name, None, None,
                    "OpenClaw's skills folder already has a skill of this name that clawrl "
                    "did not publish; it is left untouched",
                    "rename your skill (folder and 'name:' field), or remove the other one from "
                    "OpenClaw's skills folder if you no longer want it")])
            issues = validate_skill(src, self.source)
            if issues:
                return SkillResult(name, "error", None, live, issues)
            digest = skill_hash(src)
            if digest == live and dst.is_dir() and not dst.is_symlink() \
                    and skill_hash(dst) == digest:
                return SkillResult(name, "unchanged", digest, live)
            return self._publish(name, skills)

    def _publish(self, name: str, skills: dict[str, dict]) -> SkillResult:
        live = skills[name]["hash"] if name in skills else None
        stage = Path(tempfile.mkdtemp(prefix=_STAGE, dir=self.target))
        try:
            copy_skill(self.source / name, stage / name)
            # Validate and hash the copy, not the source: the source may change while we copy,
            # and what goes live must be exactly what passed.
            issues = validate_skill(stage / name, stage)
            if issues:
                return SkillResult(name, "error", None, live, issues)
            digest = skill_hash(stage / name)
            # Claim the name before it appears, so a crash in between leaves a managed entry
            # that the next sync repairs, never an unclaimed folder that reads as a conflict.
            skills[name] = {"hash": digest,
                            "published_at": datetime.now(timezone.utc).isoformat()}
            self._save(skills)
            dst = self.target / name
            if os.path.lexists(dst):  # swap: old aside, new in, then delete the old at leisure
                os.rename(dst, stage / ".old")
            os.rename(stage / name, dst)
            return SkillResult(name, "published", digest, digest)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
