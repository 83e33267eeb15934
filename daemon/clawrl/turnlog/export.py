"""`clawrl export`: the turn log as JSON Lines, one turn per line, for other trainers.

Rows are streamed from one read transaction (a consistent snapshot while the daemon keeps
writing, thanks to WAL) and written as they come; nothing holds the whole log. Each line carries
what an outside trainer needs: the request (messages, tools, sampling parameters), the response
(text, tool calls, token ids and their logprobs), the next state, the judge's verdict, explicit
feedback, and the turn's attribution, adapter version and timestamps (Unix seconds).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from ..errors import ClawrlError
from .rows import value
from .store import connect_sync

PROGRESS_MIN_ROWS = 1000     # smaller exports finish before a counter would help


@dataclass
class Filters:
    session: str | None = None
    user: str | None = None
    since: float | None = None     # created_at >= since
    until: float | None = None     # created_at < until
    judged_only: bool = False      # a judge score or explicit feedback: something to learn from

    def where(self) -> tuple[str, list]:
        clauses: list[str] = []
        args: list[str | float] = []
        if self.session is not None:
            clauses.append("session_id = ?")
            args.append(self.session)
        if self.user is not None:
            clauses.append("(user_id = ? OR session_id IN (SELECT id FROM sessions WHERE user_id = ?))")
            args += [self.user, self.user]
        if self.since is not None:
            clauses.append("created_at >= ?")
            args.append(self.since)
        if self.until is not None:
            clauses.append("created_at < ?")
            args.append(self.until)
        if self.judged_only:
            clauses.append("(judge_status = 'done' OR feedback_reward IS NOT NULL)")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def parse_when(text: str, end: bool = False) -> float:
    """A date (`2025-03-01`) or ISO date-time (`2025-03-01T14:30`, with or without an offset;
    local time without one) as Unix seconds. A bare date as an end means the end of that day."""
    try:
        if len(text) == 10:
            day = dt.datetime.combine(dt.date.fromisoformat(text), dt.time())
            return (day + dt.timedelta(days=1) if end else day).timestamp()
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ClawrlError(f"{text!r} is not a date: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]") from None


def record(row) -> dict:
    """One exported turn from its database row."""
    request = value(row, "request_json") or {}
    return {
        "id": row["id"], "session_id": row["session_id"], "user_id": row["user_id"],
        "turn_index": row["turn_index"], "turn_type": row["turn_type"], "kind": row["kind"],
        "trainable": bool(row["trainable"]), "status": row["status"], "model": row["model"],
        "adapter_version": row["adapter_version"],
        "messages": request.get("messages", []), "tools": request.get("tools"),
        "params": request.get("params"),
        "response": {"text": row["response_text"], "tool_calls": value(row, "tool_calls"),
                     "finish_reason": row["finish_reason"], "error": row["error"]},
        "prompt_ids": value(row, "prompt_ids"),
        "response_ids": value(row, "response_ids"),
        "response_logprobs": value(row, "response_logprobs"),
        "usage": {"prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"],
                  "cached_tokens": row["cached_tokens"]},
        "next_state": ({"role": row["next_state_role"], "messages": value(row, "next_state_json")}
                       if row["next_state_at"] is not None else None),
        "judge": {"status": row["judge_status"], "score": row["judge_score"],
                  "votes": value(row, "judge_votes"), "hint": row["judge_hint"],
                  "attempts": row["judge_attempts"], "error": row["judge_error"]},
        "feedback": ({"reward": row["feedback_reward"], "comment": row["feedback_comment"],
                      "user_id": row["feedback_user"], "at": row["feedback_at"]}
                     if row["feedback_reward"] is not None else None),
        "train": {"status": row["train_status"], "adapter": row["trained_adapter"]},
        "teacher_logprobs": value(row, "teacher_logprobs"),
        "created_at": row["created_at"], "completed_at": row["completed_at"],
        "next_state_at": row["next_state_at"], "judged_at": row["judged_at"],
        "ttft_ms": row["ttft_ms"], "total_ms": row["total_ms"],
    }


class Progress:
    """A counter on stderr: redrawn in place on a terminal, a line per tenth otherwise."""

    def __init__(self, total: int, stream: IO[str], min_rows: int = PROGRESS_MIN_ROWS):
        self.total, self.stream = total, stream
        self.on = total >= min_rows
        self.tty = getattr(stream, "isatty", lambda: False)()
        self.last_draw, self.last_tenth = 0.0, 0

    def update(self, done: int) -> None:
        if not self.on:
            return
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= 0.2 or done == self.total:
                self.last_draw = now
                width = 30
                filled = width * done // max(self.total, 1)
                self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} turns")
                self.stream.flush()
        elif (tenth := 10 * done // max(self.total, 1)) > self.last_tenth:
            self.last_tenth = tenth
            self.stream.write(f"exported {done}/{self.total} turns\n")

    def close(self) -> None:
        if self.on and self.tty:
            self.stream.write("\n")


def _rows(path: Path, filters: Filters) -> Iterator:
    """The total first, then the matching rows in id order, from one snapshot."""
    where, args = filters.where()
    db = connect_sync(path)
    try:
        db.execute("BEGIN")     # a read transaction: count and rows see the same snapshot
        yield db.execute(f"SELECT count(*) FROM turns{where}", args).fetchone()[0]
        yield from db.execute(f"SELECT * FROM turns{where} ORDER BY id", args)
        db.execute("COMMIT")
    finally:
        db.close()


def export(path: Path, filters: Filters, out: IO[str], progress: IO[str] | None = None,
           progress_min: int = PROGRESS_MIN_ROWS) -> int:
    """Write the matching turns to `out` as JSON Lines; return how many."""
    rows = _rows(path, filters)
    bar = Progress(next(rows), progress or sys.stderr, progress_min)
    n = 0
    for row in rows:
        out.write(json.dumps(record(row), ensure_ascii=False, separators=(",", ":")) + "\n")
        n += 1
        bar.update(n)
    bar.close()
    return n


def export_to_file(path: Path, filters: Filters, dest: Path, **kw) -> int:
    """Export into `dest` through a temp file beside it: a failed export leaves no half file."""
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            n = export(path, filters, f, **kw)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return n
