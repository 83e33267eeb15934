"""The turn log: one SQLite file (WAL), written by the daemon through one aiosqlite connection.

A turn's row is inserted when its request arrives and completed when its response ends, so a
crash mid-stream leaves a row with status `started`, never nothing. Each write is one transaction.
When a main turn arrives, the messages it adds after the previous main turn's response (a user
reply, tool results) are stored on that previous turn as its next state.

Every text written passes through a redact.Redactor first: a turn in which a secret was masked
keeps no token ids that spell it and is never trained on (see turnlog/redact.py). The file is created 0600
inside a 0700 folder: it holds the user's conversations.

Reads for the CLI go through plain sqlite3 on the same file (`read_*` functions below).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path

import aiosqlite

from . import migrations
from ..chat.format import content_text
from .redact import Redactor
from .rows import value
from ..types import Attribution, Finish

log = logging.getLogger("clawrl.store")


def connect_sync(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection to the turn log (WAL, rows by name, explicit transactions),
    for readers and for the trainer process; safe beside the daemon's own connection."""
    db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA busy_timeout=5000")
    db.row_factory = sqlite3.Row
    return db


# Where a turn stands in the learning loop, as SQL over `turns`. The status summary and the
# retention prune read these, and the trainer's samples.READY is AWAITING_TRAINER.
AWAITING_NEXT_STATE = ("trainable=1 AND status='complete' AND judge_status IS NULL"
                       " AND next_state_at IS NULL")
AWAITING_JUDGE = ("trainable=1 AND status='complete' AND judge_status IS NULL"
                  " AND next_state_at IS NOT NULL")
AWAITING_TRAINER = ("trainable=1 AND status='complete' AND train_status IS NULL"
                    " AND (judge_status='done' OR feedback_reward IS NOT NULL)")
# Settled: nothing will happen to it any more. A turn still waiting for its next state counts as
# unsettled while its session is open (the next request, or the session's end, will settle it).
UNSETTLED = (f"({AWAITING_JUDGE}) OR ({AWAITING_TRAINER}) OR (({AWAITING_NEXT_STATE})"
             " AND session_id IN (SELECT id FROM sessions WHERE ended_at IS NULL))")


# The judge's own reading beside the user's explicit feedback on the same turn: how well the judge
# hears this user. Both are kept (feedback overrides the reward, never the judge's record).
JUDGE_VS_FEEDBACK = (
    "SELECT count(*) AS rated, coalesce(sum(judge_score = feedback_reward), 0) AS agree,"
    " coalesce(sum(judge_score * feedback_reward = -1), 0) AS wrong_sign,"
    " coalesce(sum(judge_score = 0), 0) AS abstain"
    " FROM turns WHERE judge_status='done' AND feedback_reward IS NOT NULL")


def judge_agreement(row) -> dict:
    """The counts of JUDGE_VS_FEEDBACK with the agreement as a share (None with nothing rated)."""
    rated, agree, wrong, abstain = (int(x or 0) for x in row)
    return {"rated": rated, "agree": agree, "wrong_sign": wrong, "abstain": abstain,
            "agreement": agree / rated if rated else None}


def _dumps(x) -> str:
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False)


def _tighten(path: Path, mode: int) -> None:
    """Take away any permission beyond `mode`, saying so: a looser one is someone's old setup."""
    try:
        current = stat.S_IMODE(path.stat().st_mode)
        if current & ~mode:
            path.chmod(current & mode)
            log.warning("tightened the permissions of %s from %03o to %03o: it holds conversations "
                        "that other users of this machine must not read", path, current,
                        current & mode)
    except OSError as e:   # not ours to change: say so and go on
        log.warning("could not tighten the permissions of %s (%s); run: chmod %03o %s",
                    path, e, mode, path)


def private_dir(path: Path) -> None:
    """Create the data directory 0700, or tighten an existing one to it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)


def private_db(path: Path) -> None:
    """Create the turn log's file 0600 before SQLite does (SQLite gives its -wal and -shm files the
    database's own permissions), or tighten an existing one and its side files."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            _tighten(p, 0o600)


WRITE_WAIT_S = 5.0   # as long as SQLite's busy timeout (connect_sync, Store.open)


class WriteTurn:
    """The store's writes take turns on its one connection, so that no statement lands inside
    another coroutine's open transaction. A write that does not get its turn within `timeout`
    fails the way SQLite's busy timeout does: while another process holds the write lock, every
    write in the queue would otherwise wait out a full busy timeout after the one before it, and
    the requests that record turns would wait longer the more of them there are."""

    def __init__(self, timeout: float = WRITE_WAIT_S):
        self.timeout = timeout
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._lock.acquire()
        except TimeoutError:
            raise sqlite3.OperationalError(
                f"database is locked: no turn to write within {self.timeout:g} s") from None

    async def __aexit__(self, *exc) -> None:
        self._lock.release()


class Store:
    def __init__(self, db: aiosqlite.Connection, redactor: Redactor | None = None):
        self.db = db
        self.redactor = redactor if redactor is not None else Redactor.default()
        self.lock = WriteTurn()

    @classmethod
    async def open(cls, path: Path, redactor: Redactor | None = None) -> "Store":
        """`redactor`: what to mask in stored text; None = the built-in patterns."""
        private_db(path)
        sync = connect_sync(path)
        migrations.apply(sync)
        sync.close()
        db = await aiosqlite.connect(path, isolation_level=None)
        await db.execute("PRAGMA synchronous=NORMAL")   # WAL: a killed process loses nothing
        await db.execute("PRAGMA busy_timeout=5000")
        await db.execute("PRAGMA foreign_keys=ON")
        db.row_factory = aiosqlite.Row
        return cls(db, redactor)

    async def close(self) -> None:
        await self.db.close()

    async def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """Rows of a query, read in the writes' turn: the one connection would otherwise show it
        the rows of another coroutine's transaction that is still open (and may roll back). For
        the reads that work is done from (what to judge); the counts that status and /readyz
        show, and the canary's prompts, never wait behind a write."""
        async with self.lock:
            async with self.db.execute(sql, args) as cur:
                return list(await cur.fetchall())

    async def begin_turn(self, att: Attribution, request: dict, prompt_ids: list[int], model: str,
                         adapter_version: int, skills: dict[str, str] | None = None) -> int:
        """Record an arriving request; link it as the next state of the session's last main turn.
        `skills`: the clawrl-published skills in force (name -> content hash)."""
        request, masked = await asyncio.to_thread(self.redactor.json, request)
        if masked:
            # The prompt ids spell the secret: keep none, and never train on this turn.
            att, prompt_ids = dataclasses.replace(att, no_train=True), []
        async with self.lock:
            return await self._begin_turn(att, request, prompt_ids, model, adapter_version, skills)

    async def _begin_turn(self, att: Attribution, request: dict, prompt_ids: list[int], model: str,
                          adapter_version: int, skills: dict[str, str] | None) -> int:
        now = time.time()
        messages = request["messages"]
        trainable = att.turn_type == "main" and not att.no_train
        await self.db.execute("BEGIN IMMEDIATE")
        try:
            await self.db.execute(
                "INSERT INTO sessions (id, user_id, derived, created_at, last_seen) VALUES (?,?,?,?,?) "
                "ON CONFLICT(id) DO UPDATE SET last_seen=excluded.last_seen, "
                "user_id=coalesce(excluded.user_id, sessions.user_id)",
                (att.session_id, att.user_id, int(att.derived_session), now, now))
            async with self.db.execute(
                    "SELECT coalesce(max(turn_index)+1, 0) FROM turns WHERE session_id=?",
                    (att.session_id,)) as cur:
                row = await cur.fetchone()
            assert row is not None   # an aggregate gives one row, even over no rows
            (index,) = row
            if att.turn_type == "main":
                await self._link_next_state(att.session_id, messages, now)
            cur = await self.db.execute(
                "INSERT INTO turns (session_id, user_id, turn_index, turn_type, kind, trainable, status,"
                " model, adapter_version, request_json, n_messages, prompt_ids, created_at, skills)"
                " VALUES (?,?,?,?,?,?,'started',?,?,?,?,?,?,?)",
                (att.session_id, att.user_id, index, att.turn_type, att.kind, int(trainable), model,
                 adapter_version, _dumps(request), len(messages), _dumps(prompt_ids), now,
                 _dumps(skills) if skills is not None else None))
            turn_id = cur.lastrowid
            assert turn_id is not None   # every INSERT sets it
            await self.db.execute("COMMIT")
        except BaseException:
            await self.db.execute("ROLLBACK")
            raise
        return turn_id

    async def _link_next_state(self, session_id: str, messages: list[dict], now: float) -> None:
        async with self.db.execute(
                "SELECT id, n_messages, next_state_at, response_text, tool_calls FROM turns"
                " WHERE session_id=? AND turn_type='main' AND status='complete'"
                " ORDER BY turn_index DESC LIMIT 1", (session_id,)) as cur:
            prev = await cur.fetchone()
        if prev is None or prev["next_state_at"] is not None:
            return
        at = replayed_response(messages, prev["n_messages"], prev["response_text"],
                               value(prev, "tool_calls"))
        if at is None:
            # The history no longer holds the answer (compacted, or cut): no later request of
            # this session will either, so the turn is settled the way a session's end settles
            # its last one, instead of waiting for a next state forever.
            await self.db.execute(
                "UPDATE turns SET judge_status='no_next_state', judged_at=? WHERE id=?"
                " AND judge_status IS NULL", (now, prev["id"]))
            return
        if at + 1 >= len(messages):      # it ends at the answer: the next request may follow it
            return
        following = messages[at + 1:]
        await self.db.execute(
            "UPDATE turns SET next_state_role=?, next_state_json=?, next_state_at=? WHERE id=?",
            (following[0].get("role"), _dumps(following), now, prev["id"]))

    async def finish_turn(self, turn_id: int, *, status: str, text: str, token_ids: list[int],
                          logprobs: list[float], tool_calls: list[dict] | None, finish: Finish | None,
                          ttft_ms: float | None, total_ms: float, error: str | None = None,
                          reasoning: str | None = None) -> None:
        """`text` is the answer as the client saw it; `reasoning` the thinking before it, if any."""
        n_tokens = len(token_ids)
        text, masked = self.redactor.text(text)
        reasoning, masked_thought = self.redactor.text(reasoning)
        tool_calls, masked_calls = self.redactor.json(tool_calls)
        error, _ = self.redactor.text(error)
        masked = masked or masked_thought or masked_calls
        if masked:
            # They spell the secret; the turn is no longer trainable (below), and logprobs
            # without their tokens would only mislead an export.
            token_ids, logprobs = [], []
        async with self.lock:
            await self.db.execute(
                "UPDATE turns SET trainable=trainable AND ?, reasoning_text=?,"
                " status=?, response_text=?, response_ids=?, response_logprobs=?,"
                " tool_calls=?, finish_reason=?, prompt_tokens=?, completion_tokens=?, cached_tokens=?,"
                " error=?, completed_at=?, ttft_ms=?, total_ms=?, adapter_version=coalesce(?, adapter_version)"
                " WHERE id=?",
                (int(not masked), reasoning, status, text, _dumps(token_ids), _dumps(logprobs),
                 _dumps(tool_calls) if tool_calls else None,
                 finish.reason if finish else None,
                 finish.prompt_tokens if finish else None,
                 n_tokens, finish.cached_tokens if finish else None,
                 error, time.time(), ttft_ms, total_ms,
                 finish.adapter_version if finish else None, turn_id))

    async def end_session(self, session_id: str) -> bool | None:
        """Mark the session over. Its last main turn has no next state and never will: it is
        recorded as judged with what is known (nothing), so it is not trained.
        True if it ends now, False if it had ended before, None if there is no such session."""
        async with self.lock:
            async with self.db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)) as c:
                if await c.fetchone() is None:
                    return None
            # One transaction: a crash between the two would leave an ended session whose last
            # turn waits for a next state forever (the idle sweep never ends it again).
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                cur = await self.db.execute(
                    "UPDATE sessions SET ended_at=? WHERE id=? AND ended_at IS NULL",
                    (time.time(), session_id))
                await self.db.execute(
                    "UPDATE turns SET judge_status='no_next_state', judged_at=? WHERE id=("
                    " SELECT id FROM turns WHERE session_id=? AND turn_type='main'"
                    " ORDER BY turn_index DESC LIMIT 1) AND next_state_at IS NULL AND judge_status IS NULL",
                    (time.time(), session_id))
                await self.db.execute("COMMIT")
            except BaseException:
                await self.db.execute("ROLLBACK")
                raise
            return cur.rowcount > 0

    async def idle_sessions(self, idle_for: float) -> list[str]:
        async with self.db.execute(
                "SELECT id FROM sessions WHERE ended_at IS NULL AND last_seen < ?",
                (time.time() - idle_for,)) as cur:
            return [r[0] for r in await cur.fetchall()]

    async def recent_prompts(self, n: int, max_tokens: int) -> list[list[int]]:
        """Prompt ids of the last n complete main turns that are at most max_tokens long (turns
        whose ids were dropped with a masked secret have none to give)."""
        async with self.db.execute(
                "SELECT prompt_ids FROM turns WHERE status='complete' AND turn_type='main'"
                " AND prompt_tokens <= ? AND prompt_ids != '[]' ORDER BY id DESC LIMIT ?",
                (max_tokens, n)) as cur:
            return [json.loads(r[0]) for r in await cur.fetchall()]

    # -- judging and feedback ---------------------------------------------------------------------
    async def turns_to_judge(self, limit: int = 8) -> list[dict]:
        """Complete, trainable turns whose next state has arrived and that await a judgment."""
        rows = await self._read(
            "SELECT id, session_id, request_json, response_text, tool_calls, next_state_json,"
            " judge_attempts FROM turns WHERE judge_status IS NULL AND next_state_at IS NOT NULL"
            " AND status='complete' AND trainable=1 AND coalesce(judge_retry_at, 0) <= ?"
            " ORDER BY next_state_at LIMIT ?", (time.time(), limit))
        return [dict(r) for r in rows]

    async def save_judgment(self, turn_id: int, score: int, votes: list, raw: list[str],
                            hint: str | None) -> None:
        # The judge read masked text, but a model can still write a secret-shaped string.
        hint, _ = self.redactor.text(hint)
        raw, _ = self.redactor.json(raw)
        async with self.lock:
            await self.db.execute(
                "UPDATE turns SET judge_status='done', judge_score=?, judge_votes=?, judge_raw=?,"
                " judge_hint=?, judged_at=?, judge_error=NULL WHERE id=?",
                (score, _dumps(votes), _dumps(raw), hint, time.time(), turn_id))

    async def judge_failed(self, turn_id: int, error: str, retry_in: float | None) -> None:
        """Count a failed try; retry after `retry_in` seconds, or give up (None): status failed."""
        error, _ = self.redactor.text(error)
        async with self.lock:
            await self.db.execute(
                "UPDATE turns SET judge_attempts=judge_attempts+1, judge_error=?, judge_retry_at=?,"
                " judge_status=? WHERE id=?",
                (error[:2000], time.time() + (retry_in or 0), None if retry_in is not None else "failed",
                 turn_id))

    async def record_feedback(self, session_id: str, turn_id: int | None, reward: int,
                              comment: str | None, user_id: str | None) -> int | None:
        """Explicit feedback on a turn, or on the session's last main turn. Returns the turn id,
        None when there is no such turn."""
        if turn_id is not None and not -2**63 <= turn_id < 2**63:
            return None   # no row has an id SQLite cannot even hold
        comment, _ = self.redactor.text(comment)
        async with self.lock:
            if turn_id is None:
                async with self.db.execute(
                        "SELECT id FROM turns WHERE session_id=? AND turn_type='main'"
                        " ORDER BY turn_index DESC LIMIT 1", (session_id,)) as cur:
                    row = await cur.fetchone()
                turn_id = row[0] if row else None
            if turn_id is None:
                return None
            cur = await self.db.execute(
                "UPDATE turns SET feedback_reward=?, feedback_comment=?, feedback_user=?, feedback_at=?"
                " WHERE id=? AND session_id=?",
                (reward, comment, user_id, time.time(), turn_id, session_id))
            return turn_id if cur.rowcount else None

    async def counts(self) -> dict:
        async with self.db.execute(
                "SELECT count(*), sum(status='started'), sum(trainable AND next_state_at IS NOT NULL),"
                " sum(judge_status='done'), sum(trainable AND next_state_at IS NOT NULL"
                " AND status='complete' AND judge_status IS NULL)"
                " FROM turns") as cur:
            row = await cur.fetchone()
        assert row is not None   # an aggregate gives one row, even over no rows
        total, open_, with_next, judged, waiting = row
        async with self.db.execute(JUDGE_VS_FEEDBACK) as cur:
            agreement = judge_agreement(await cur.fetchone())
        return {"turns": total, "in_flight_or_incomplete": open_ or 0,
                "with_next_state": with_next or 0, "judged": judged or 0,
                "awaiting_judge": waiting or 0, "judge_vs_feedback": agreement}


def _calls_key(calls) -> list | None:
    try:
        return [(c["function"]["name"], json.loads(c["function"].get("arguments") or "{}"))
                for c in calls]
    except (KeyError, TypeError, ValueError):
        return None


def replayed_response(messages: list[dict], n_prev: int, text: str | None,
                      calls: list[dict] | None) -> int | None:
    """Where the previous turn's response sits in a later request of its session, or None.

    The previous request had `n_prev` messages, so the response comes back at index n_prev, or at
    n_prev - 1 when the client sends a context block last and rebuilds it each call (OpenClaw
    does). It is found by content (same tool calls, else same text); when the client rewrote it,
    an assistant message at one of those two places is taken. Anything shorter means the history
    was cut (a compaction): no link, rather than a wrong one.
    """
    places = [i for i in (n_prev, n_prev - 1) if 0 <= i < len(messages)
              and messages[i].get("role") == "assistant"]
    want_calls = _calls_key(calls) if calls else None
    for i in places:
        m = messages[i]
        if want_calls is not None and _calls_key(m.get("tool_calls") or []) == want_calls:
            return i
        if want_calls is None and content_text(m.get("content")).strip() == (text or "").strip():
            return i
    return places[0] if places else None


# -- reads for the CLI (plain sqlite3; safe while the daemon writes, thanks to WAL) ---------------

def read_sessions(path: Path, limit: int = 50) -> list[dict]:
    db = connect_sync(path)
    rows = db.execute(
        "SELECT s.id, s.user_id, s.derived, s.created_at, s.last_seen, s.ended_at,"
        " count(t.id) AS turns, sum(t.turn_type='main') AS main_turns"
        " FROM sessions s LEFT JOIN turns t ON t.session_id = s.id"
        " GROUP BY s.id ORDER BY s.last_seen DESC LIMIT ?", (limit,)).fetchall()
    db.close()
    return [dict(r) for r in rows]


def read_turns(path: Path, session_id: str | None = None, limit: int = 50) -> list[dict]:
    db = connect_sync(path)
    where, args = ("WHERE session_id=?", [session_id]) if session_id else ("", [])
    rows = db.execute(
        f"SELECT * FROM turns {where} ORDER BY id DESC LIMIT ?", (*args, limit)).fetchall()
    db.close()
    return [dict(r) for r in reversed(rows)]


def read_counts(path: Path) -> dict:
    """How many turns there are and where they stand, for `clawrl status`."""
    db = connect_sync(path)
    try:
        row = db.execute(
            f"SELECT count(*) AS turns, coalesce(sum(status='started'), 0) AS in_flight,"
            f" coalesce(sum({AWAITING_NEXT_STATE}), 0) AS awaiting_next_state,"
            f" coalesce(sum({AWAITING_JUDGE}), 0) AS awaiting_judge,"
            f" coalesce(sum({AWAITING_TRAINER}), 0) AS awaiting_trainer,"
            f" coalesce(sum(judge_status='done'), 0) AS judged,"
            f" coalesce(sum(feedback_reward IS NOT NULL), 0) AS with_feedback,"
            f" coalesce(sum(train_status='trained'), 0) AS trained,"
            f" min(created_at) AS first_at, max(created_at) AS last_at FROM turns").fetchone()
        sessions = db.execute("SELECT count(*), coalesce(sum(ended_at IS NULL), 0) FROM sessions"
                              ).fetchone()
        agreement = judge_agreement(db.execute(JUDGE_VS_FEEDBACK).fetchone())
    finally:
        db.close()
    return {**dict(row), "sessions": sessions[0], "open_sessions": sessions[1],
            "judge_vs_feedback": agreement}
