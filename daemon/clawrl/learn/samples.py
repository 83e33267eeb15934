"""The trainer's side of the turn log: which turns are ready to learn from, and marking them.

Every training write to `turns` is here (trained, skipped, teacher scores); the trainers call
these functions and hold no SQL of their own.

Plain sqlite3 on the daemon's WAL database; every write is one short transaction, so the daemon's
own writes never wait long. A turn is ready when it is a complete, trainable main turn with a
judgment or explicit feedback that has not been trained or skipped. Turns with nothing to learn
from under the configured method are marked `skipped` once and never read again. The schema is
turnlog/migrations.py's; this module never changes it.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import TextIO

import torch

from ..adapters import versions as adapters
from .advantages import method_advantages
from ..turnlog.rows import turn
from ..turnlog.store import AWAITING_TRAINER, connect_sync
from ..errors import ClawrlError
from .teacher import pick_hint
from ..types import Sample


def log(msg: str) -> None:
    print(f"clawrl-trainer: {msg}", file=sys.stderr, flush=True)


READY = AWAITING_TRAINER     # the turn log's own predicate: the trainer keeps no copy


def connect(path: Path) -> sqlite3.Connection:
    if not Path(path).exists():
        raise ClawrlError(f"no turn log at {path}: the daemon creates it; start `clawrl serve` "
                          "(or set CLAWRL_HOME to the daemon's data directory)")
    return connect_sync(path)


def write(db: sqlite3.Connection, sql: str, rows: list[tuple]) -> None:
    """`sql` once per row, all in one short transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(sql, rows)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def take_over(db: sqlite3.Connection, root: Path, stop) -> TextIO:
    """A trainer's start: hold the adapters folder's trainer lock (waiting for a trainer left by a
    stopped daemon), remove half-written versions and mark what the versions on disk took.
    Returns the lock's open file; exits quietly if `stop` is set while it waits."""
    lock = adapters.hold_trainer_lock(root, stop.wait, log)
    if lock is None:
        raise SystemExit(0)   # stopped while waiting for the other trainer
    adapters.clean_temp(root)
    fixed = reconcile(db, root)
    if fixed:
        log(f"reconciled {fixed} turns with the versions on disk")
    return lock


def reconcile(db: sqlite3.Connection, root: Path) -> int:
    """Mark every turn listed in a version's meta.json as trained into it (oldest version first,
    so a turn keeps the first version that consumed it). Turns of rejected versions stay consumed:
    they may be what made that version bad. Returns how many rows changed."""
    rows = []
    for v in adapters.list_versions(root):
        try:
            rows += [(v, int(i)) for i in adapters.read_meta(root, v).get("samples", [])]
        except (OSError, ValueError):
            log(f"version {v:04d}: unreadable meta.json; its turns are not reconciled")
    before = db.total_changes
    write(db, "UPDATE turns SET train_status='trained', trained_adapter=?"
              " WHERE id=? AND train_status IS NOT 'trained'", rows)
    return db.total_changes - before


def mark_trained(db: sqlite3.Connection, version: int, ids: list[int]) -> None:
    """The turns a version was trained on, once its folder is in place."""
    write(db, "UPDATE turns SET train_status='trained', trained_adapter=? WHERE id=?",
          [(version, i) for i in ids])


def mark_skipped(db: sqlite3.Connection, ids: list[int]) -> None:
    """Turns the model cannot take (bad ids, too long for the teacher, ...): never read again."""
    write(db, "UPDATE turns SET train_status='skipped' WHERE id=?", [(i,) for i in ids])


def store_teacher(db: sqlite3.Connection, rows: list[tuple[int, list[float], dict | None]]) -> None:
    """Teacher scores (turn id, logprobs, top-k or None), kept so a retried step does not compute
    them again."""
    write(db, "UPDATE turns SET teacher_logprobs=?, teacher_topk=? WHERE id=?",
          [(json.dumps(lp), json.dumps(top) if top is not None else None, i) for i, lp, top in rows])


def trained_rewards(db: sqlite3.Connection):
    """(user id, reward) of every trained turn, oldest first: what a per-user baseline replays."""
    for r in db.execute("SELECT user_id, feedback_reward, judge_score FROM turns"
                        " WHERE train_status='trained' ORDER BY id"):
        if reward_of(r):
            yield r["user_id"] or "", reward_of(r)


def has_signal(method: str, reward: float | None, hint: str | None) -> bool:
    """Whether advantages.method_advantages would give this sample anything to learn from."""
    zero = torch.zeros(1)
    return method_advantages(method, reward, zero if hint else None, zero) is not None


def reward_of(row) -> float | None:
    return row["feedback_reward"] if row["feedback_reward"] is not None else row["judge_score"]


def select_ready(db: sqlite3.Connection, method: str) -> list[int]:
    """Ids of ready turns with a signal, oldest first; the others are marked skipped for good."""
    rows = db.execute(
        "SELECT id, feedback_reward, judge_score, feedback_comment, judge_hint,"
        " coalesce(response_ids, '[]') = '[]' AS no_response, prompt_ids = '[]' AS no_prompt"
        f" FROM turns WHERE {READY} ORDER BY id").fetchall()
    keep: list[int] = []
    skip: list[int] = []
    for r in rows:
        hint = pick_hint(r["feedback_comment"], r["judge_hint"])
        ok = not (r["no_response"] or r["no_prompt"]) and has_signal(method, reward_of(r), hint)
        (keep if ok else skip).append(r["id"])
    if skip:
        write(db, "UPDATE turns SET train_status='skipped' WHERE id=? AND train_status IS NULL",
              [(i,) for i in skip])
    return keep


def load_samples(db: sqlite3.Connection, ids: list[int]) -> list[Sample]:
    """The rows behind `ids`; a row whose JSON does not parse is marked skipped instead."""
    out, bad = [], []
    for i in ids:
        r = db.execute("SELECT * FROM turns WHERE id=?", (i,)).fetchone()
        try:
            t = turn(r)
            response_ids, served, teacher = t.response_ids, t.response_logprobs, t.teacher_logprobs
            if not t.request or not t.prompt_ids or response_ids is None:
                raise ValueError("no request, prompt or response ids")
            out.append(Sample(
                id=i, user_id=t.user_id, request=t.request,
                prompt_ids=t.prompt_ids, response_ids=response_ids,
                # Served logprobs that do not line up with the tokens cannot correct anything.
                served_logp=served if served and len(served) == len(response_ids) else None,
                empty=not t.response_text.strip() and not t.tool_calls,
                reward=reward_of(r), hint=pick_hint(t.feedback_comment, t.judge_hint),
                teacher_logp=teacher if teacher and len(teacher) == len(response_ids) else None,
                teacher_topk=t.teacher_topk))
        except (ValueError, TypeError, KeyError) as e:
            log(f"turn {i}: unreadable record ({e}); skipped")
            bad.append((i,))
    if bad:
        write(db, "UPDATE turns SET train_status='skipped' WHERE id=?", bad)
    return out


def next_batch(db: sqlite3.Connection, method: str, size: int) -> list[Sample] | None:
    """The next `size` ready samples, or None until that many are ready and readable (an
    unreadable one is chosen again next time)."""
    ready = select_ready(db, method)
    if len(ready) < size:
        return None
    samples = load_samples(db, ready[:size])
    return samples if len(samples) == size else None


JUDGED = ("trainable=1 AND status='complete' AND coalesce(feedback_reward, judge_score) IS NOT NULL"
          " AND coalesce(feedback_reward, judge_score) <> 0")   # +1 or -1, by the judge or the user


def judged_window(db: sqlite3.Connection, size: int) -> list:
    """The newest `size` judged (+1 or -1) trainable turns, oldest first, whatever the online
    trainer did with them: what consolidation learns from. Opted-out and secret-holding turns are
    not trainable, and forgotten ones are gone, so neither is ever read here."""
    rows = db.execute(f"SELECT id, user_id, prompt_ids, response_ids, feedback_reward, judge_score,"
                      f" request_json, feedback_comment, judge_hint, teacher_answer FROM turns WHERE {JUDGED}"
                      " ORDER BY id DESC LIMIT ?", (size,)).fetchall()
    return rows[::-1]


def judged_since(db: sqlite3.Connection, after_id: int) -> int:
    """How many judged turns have a larger id than `after_id`."""
    return db.execute(f"SELECT count(*) FROM turns WHERE {JUDGED} AND id > ?", (after_id,)).fetchone()[0]


def last_request_at(db: sqlite3.Connection) -> float | None:
    """When the newest turn (of any kind) began: the last time anyone used the daemon."""
    return db.execute("SELECT max(created_at) FROM turns").fetchone()[0]
