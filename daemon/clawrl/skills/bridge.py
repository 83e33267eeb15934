"""skill_bridge inside the daemon: which folders, the watcher's lifecycle, and the record in SQLite.

skill_bridge (its own package) validates and publishes skill folders; this module decides where
they come from and go to, runs its watcher while `clawrl serve` runs, writes one `skill_versions`
row per change of a skill's state, and knows which clawrl-published skills are in force now, which
every turn records. It also lets the daemon's endpoint reconcile a skill at once after the agent
wrote it, so the answer says whether it went live.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from skill_bridge import Publisher, SkillResult, SkillWatcher

from ..config import Config
from ..turnlog.store import connect_sync

log = logging.getLogger("clawrl.skills")


def source_folder(cfg: Config) -> Path:
    return Path(cfg.skills.source).expanduser() if cfg.skills.source else cfg.home / "skills"


def proposals_folder(cfg: Config) -> Path:
    return cfg.home / "skills-proposed"


def target_folder(cfg: Config) -> Path:
    """OpenClaw's `<workspace>/skills`, the folder it loads first and watches."""
    if cfg.skills.target:
        return Path(cfg.skills.target).expanduser()
    import json5

    from ..ops import openclaw_config
    config = openclaw_config.default_path()
    workspace = None
    try:
        doc = json5.loads(config.read_text() or "{}") if config.exists() else {}
        workspace = doc.get("agents", {}).get("defaults", {}).get("workspace")
    except (ValueError, AttributeError, OSError):   # a broken config is `clawrl doctor`'s to report
        workspace = None
    return Path(workspace or config.parent / "workspace").expanduser() / "skills"


def record(db_path: Path, result: SkillResult, last: dict[str, tuple]) -> None:
    """One skill_versions row, unless nothing changed since the last one for this name."""
    key = (result.hash, result.status, result.published_hash)
    if result.status == "unchanged" or last.get(result.name) == key:
        return
    last[result.name] = key
    db = connect_sync(db_path)
    try:
        with db:
            db.execute(
                "INSERT INTO skill_versions (name, hash, status, published_hash, issues, at)"
                " VALUES (?,?,?,?,?,?)",
                (result.name, result.hash, result.status, result.published_hash,
                 json.dumps([i.to_dict() for i in result.issues]) if result.issues else None,
                 time.time()))
    finally:
        db.close()


def latest_versions(db_path: Path) -> dict[str, dict]:
    """Each skill's newest recorded state, by name."""
    db = connect_sync(db_path)
    try:
        rows = db.execute(
            "SELECT name, hash, status, published_hash, issues, at FROM skill_versions"
            " WHERE id IN (SELECT max(id) FROM skill_versions GROUP BY name) ORDER BY name").fetchall()
    finally:
        db.close()
    return {r[0]: {"name": r[0], "hash": r[1], "status": r[2], "published_hash": r[3],
                   "issues": json.loads(r[4]) if r[4] else [], "at": r[5]} for r in rows}


class SkillBridge:
    """The watcher over `skills.source`, publishing into OpenClaw's workspace while the daemon runs."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.source, self.target = source_folder(cfg), target_folder(cfg)
        self.publisher = Publisher(self.source, self.target)
        self.watcher: SkillWatcher | None = None
        self._last: dict[str, tuple] = {}
        self._lock = threading.Lock()
        self._in_force: dict[str, str] = {}

    def start(self) -> None:
        self.source.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._in_force = {n: m["hash"] for n, m in self.publisher.managed().items()}
        self.watcher = SkillWatcher(self.publisher, debounce_s=self.cfg.skills.debounce_s,
                                    on_result=self._on_result)
        self.watcher.start()
        log.info("skills: publishing %s into %s", self.source, self.target)

    def stop(self) -> None:
        if self.watcher:
            self.watcher.stop()
            self.watcher = None

    def reconcile(self, name: str) -> SkillResult:
        """Check and publish one skill now (the watcher will find it unchanged)."""
        return self.author(name, lambda: None)

    def author(self, name: str, change: Callable[[], object]) -> SkillResult:
        """Make a change to the skill's source and publish it at once, before the watcher can:
        the result (published, unpublished, error) is what this change did."""
        result = self.publisher.apply(name, change)
        self._on_result(result)
        return result

    def in_force(self) -> dict[str, str]:
        """name -> content hash of every skill clawrl has published and not withdrawn."""
        with self._lock:
            return dict(self._in_force)

    def _on_result(self, result: SkillResult) -> None:
        with self._lock:
            if result.published_hash:
                self._in_force[result.name] = result.published_hash
            else:
                self._in_force.pop(result.name, None)
        if result.status == "error":
            log.warning("skill %s not published: %s", result.name,
                        "; ".join(str(i) for i in result.issues))
        elif result.status == "conflict":
            log.warning("skill %s not published: %s already has a skill of that name that "
                        "clawrl did not publish; rename yours", result.name, self.target)
        elif result.status != "unchanged":
            log.info("skill %s %s", result.name, result.status)
        try:
            record(self.cfg.db_path, result, self._last)
        except Exception as e:   # the record is for the operator; publishing must go on
            log.error("could not record skill %s: %s", result.name, e)
