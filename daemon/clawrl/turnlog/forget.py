"""Deleting recorded turns: a session's, a user's, or those past the retention.

`forget` deletes what one session or one user left in the turn log (turns, session rows, and that
user's feedback on other turns) in one transaction. `prune` deletes turns older than a cutoff that
are settled (store.UNSETTLED: never one the judge or the trainer still waits for), in short
transactions so the daemon's writes never wait long; `Retention` runs it hourly in the daemon when
`store.retention_days` is set. Adapters are never touched: what a version learned from a deleted
turn stays in its weights, and the ids in its meta.json then name nothing.

Both work beside a running daemon: WAL, and a busy timeout for the moment the daemon writes.
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..background import BackgroundLoop
from .store import UNSETTLED, connect_sync

log = logging.getLogger("clawrl.retention")
DAY = 86400.0
PRUNE_EVERY_S = 3600.0
PRUNE_CHUNK = 500


@dataclass
class Deleted:
    """What a deletion removed (or, for a preview, would remove)."""
    turns: int = 0
    sessions: list[str] = field(default_factory=list)      # session rows deleted
    per_session: dict[str, int] = field(default_factory=dict)   # turns deleted, by session
    adapters: list[int] = field(default_factory=list)      # versions trained on deleted turns
    feedback_cleared: int = 0     # the user's feedback on turns that stay
    kept_unsettled: int = 0       # prune: old turns kept because the loop still waits for them


def _selection(session: str | None, user: str | None) -> tuple[str, tuple]:
    """The turns and sessions that `forget` removes, as WHERE clauses over each table."""
    if (session is None) == (user is None):
        raise ValueError("name exactly one of a session or a user")
    if session is not None:
        return "session_id = ?", (session,)
    # A user's turns, plus every turn of the sessions recorded as theirs.
    return "(user_id = ? OR session_id IN (SELECT id FROM sessions WHERE user_id = ?))", (user, user)


def _sessions_where(session: str | None, user: str | None) -> tuple[str, tuple]:
    return ("id = ?", (session,)) if session is not None else ("user_id = ?", (user,))


def _tally(db: sqlite3.Connection, where: str, args: tuple) -> Deleted:
    out = Deleted()
    for sid, n in db.execute(f"SELECT session_id, count(*) FROM turns WHERE {where}"
                             " GROUP BY session_id ORDER BY min(id)", args):
        out.per_session[sid] = n
    out.turns = sum(out.per_session.values())
    out.adapters = [r[0] for r in db.execute(
        f"SELECT DISTINCT trained_adapter FROM turns WHERE ({where}) AND trained_adapter IS NOT NULL"
        " ORDER BY 1", args)]
    return out


def preview(path: Path, session: str | None = None, user: str | None = None) -> Deleted:
    """What `forget` would delete now (the daemon may add turns before it runs)."""
    where, args = _selection(session, user)
    swhere, sargs = _sessions_where(session, user)
    db = connect_sync(path)
    try:
        out = _tally(db, where, args)
        out.sessions = [r[0] for r in db.execute(f"SELECT id FROM sessions WHERE {swhere}", sargs)]
        if user is not None:
            out.feedback_cleared = db.execute(
                f"SELECT count(*) FROM turns WHERE feedback_user = ? AND NOT ({where})",
                (user, *args)).fetchone()[0]
    finally:
        db.close()
    return out


def forget(path: Path, session: str | None = None, user: str | None = None) -> Deleted:
    """Delete a session's or a user's turns and session rows, in one transaction."""
    where, args = _selection(session, user)
    swhere, sargs = _sessions_where(session, user)
    db = connect_sync(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            out = _tally(db, where, args)
            if user is not None:
                # Their feedback on someone else's turn is theirs too; the turn itself stays.
                out.feedback_cleared = db.execute(
                    "UPDATE turns SET feedback_reward=NULL, feedback_comment=NULL, feedback_user=NULL,"
                    f" feedback_at=NULL WHERE feedback_user = ? AND NOT ({where})",
                    (user, *args)).rowcount
            db.execute(f"DELETE FROM turns WHERE {where}", args)
            # Session rows named, plus any a user's turns emptied out.
            doomed = [r[0] for r in db.execute(
                f"SELECT id FROM sessions WHERE {swhere} OR (id IN ({','.join('?' * len(out.per_session))})"
                " AND NOT EXISTS (SELECT 1 FROM turns WHERE turns.session_id = sessions.id))",
                (*sargs, *out.per_session))]
            db.executemany("DELETE FROM sessions WHERE id = ?", [(s,) for s in doomed])
            out.sessions = doomed
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()
    return out


def prune(path: Path, older_than_days: float, now: float | None = None,
          chunk: int = PRUNE_CHUNK) -> Deleted:
    """Delete settled turns created more than `older_than_days` ago, and the session rows left
    without turns that have been quiet as long. A chunk of turns per transaction."""
    if older_than_days <= 0:
        raise ValueError("older_than_days must be positive")
    cutoff = (time.time() if now is None else now) - older_than_days * DAY
    out = Deleted()
    db = connect_sync(path)
    try:
        while True:
            db.execute("BEGIN IMMEDIATE")
            try:
                rows = db.execute(
                    f"SELECT id, session_id, trained_adapter FROM turns WHERE created_at < ?"
                    f" AND NOT ({UNSETTLED}) ORDER BY id LIMIT ?", (cutoff, chunk)).fetchall()
                db.executemany("DELETE FROM turns WHERE id = ?", [(r["id"],) for r in rows])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            for r in rows:
                out.per_session[r["session_id"]] = out.per_session.get(r["session_id"], 0) + 1
                if r["trained_adapter"] is not None and r["trained_adapter"] not in out.adapters:
                    out.adapters.append(r["trained_adapter"])
            out.turns += len(rows)
            if len(rows) < chunk:
                break
        db.execute("BEGIN IMMEDIATE")
        try:
            out.sessions = [r[0] for r in db.execute(
                "SELECT id FROM sessions WHERE last_seen < ? AND NOT EXISTS"
                " (SELECT 1 FROM turns WHERE turns.session_id = sessions.id)", (cutoff,))]
            db.executemany("DELETE FROM sessions WHERE id = ?", [(s,) for s in out.sessions])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        out.kept_unsettled = db.execute(
            f"SELECT count(*) FROM turns WHERE created_at < ? AND ({UNSETTLED})", (cutoff,)
        ).fetchone()[0]
    finally:
        db.close()
    out.adapters.sort()
    return out


def count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def describe(d: Deleted) -> str:
    """What was deleted, for the operator."""
    lines = [f"deleted {count(d.turns, 'turn')} in {count(len(d.per_session), 'session')}; "
             f"{count(len(d.sessions), 'session row')} removed"]
    lines += [f"  {sid}  {count(n, 'turn')}" for sid, n in d.per_session.items()]
    lines += [f"  {sid}  session row" for sid in d.sessions if sid not in d.per_session]
    if d.feedback_cleared:
        lines.append(f"cleared the user's feedback on {count(d.feedback_cleared, 'other turn')}")
    if d.kept_unsettled:
        lines.append(f"kept {count(d.kept_unsettled, 'old turn')} the judge or trainer still "
                     "waits for")
    if d.adapters:
        lines.append("adapters are kept; trained on deleted turns, and still carrying what they "
                     "learned: " + ", ".join(f"{v:04d}" for v in d.adapters)
                     + " (`clawrl adapters activate N` serves another version)")
    return "\n".join(lines)


class Retention(BackgroundLoop):
    """The daemon's hourly prune (`store.retention_days`); does nothing when that is 0."""
    name = "clawrl-retention"

    def __init__(self, db_path: Path, retention_days: float, every_s: float = PRUNE_EVERY_S):
        self.db_path, self.days, self.every_s = db_path, retention_days, every_s

    def start(self) -> None:
        if self.days > 0:
            super().start()

    async def _run(self) -> None:
        while True:
            try:
                out = await asyncio.to_thread(prune, self.db_path, self.days)
                if out.turns or out.sessions:
                    log.info("retention (%g days): deleted %d turns and %d sessions; %d old turns "
                             "kept until the judge and trainer are done", self.days, out.turns,
                             len(out.sessions), out.kept_unsettled)
            except asyncio.CancelledError:
                raise
            except Exception:   # a locked or busy database now is no reason to stop for good
                log.exception("retention prune failed; trying again later")
            await asyncio.sleep(self.every_s)
