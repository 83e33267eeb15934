"""Append-only schema migrations for the turn log. Never edit a shipped one: add the next.

Each is a named function run once, in order, inside the transaction that records it in
`_migrations`. Opening the store runs the ones not yet applied.
"""
from __future__ import annotations

import sqlite3
from typing import Callable

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []


def migration(fn: Callable[[sqlite3.Connection], None]):
    MIGRATIONS.append(fn)
    return fn


@migration
def m001_sessions_and_turns(db: sqlite3.Connection) -> None:
    db.execute("""
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            user_id TEXT,
            derived INTEGER NOT NULL DEFAULT 0,   -- id derived from the opening messages
            created_at REAL NOT NULL,
            last_seen REAL NOT NULL,
            ended_at REAL
        )""")
    db.execute("""
        CREATE TABLE turns (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            user_id TEXT,
            turn_index INTEGER NOT NULL,          -- 0, 1, 2, ... within the session
            turn_type TEXT NOT NULL,              -- main | side
            kind TEXT NOT NULL,                   -- main, heartbeat, memory, cron, ...
            trainable INTEGER NOT NULL,           -- main and not opted out
            status TEXT NOT NULL,                 -- started | complete | cancelled | failed
            model TEXT NOT NULL,
            adapter_version INTEGER NOT NULL,
            request_json TEXT NOT NULL,           -- {messages, tools, params}
            n_messages INTEGER NOT NULL,
            prompt_ids TEXT NOT NULL,             -- JSON list of token ids
            response_text TEXT,
            response_ids TEXT,                    -- JSON list, EOS included when generated
            response_logprobs TEXT,               -- JSON list, one per response id
            tool_calls TEXT,                      -- JSON list in OpenAI shape
            finish_reason TEXT,
            prompt_tokens INTEGER,
            completion_tokens INTEGER,
            cached_tokens INTEGER,
            error TEXT,
            created_at REAL NOT NULL,
            completed_at REAL,
            ttft_ms REAL,
            total_ms REAL,
            next_state_role TEXT,                 -- user | tool | ...
            next_state_json TEXT,                 -- the messages that followed the response
            next_state_at REAL,
            judge_votes TEXT,
            judge_score REAL,
            judge_hint TEXT,
            teacher_logprobs TEXT,
            train_status TEXT,
            trained_adapter INTEGER
        )""")
    db.execute("CREATE INDEX turns_session ON turns(session_id, turn_index)")
    db.execute("CREATE INDEX turns_status ON turns(status)")


def apply(db: sqlite3.Connection) -> list[str]:
    """Run the migrations not yet applied; return their names."""
    # Explicit transactions: sqlite3's implicit ones would commit DDL statement by statement.
    db.isolation_level = None
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    ran = []
    for fn in MIGRATIONS:
        db.execute("BEGIN IMMEDIATE")   # also keeps two processes from running the same one
        try:
            if db.execute("SELECT 1 FROM _migrations WHERE name=?", (fn.__name__,)).fetchone():
                db.execute("COMMIT")
                continue
            fn(db)
            db.execute("INSERT INTO _migrations VALUES (?, julianday('now'))", (fn.__name__,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        ran.append(fn.__name__)
    return ran


@migration
def m002_judgments_and_feedback(db: sqlite3.Connection) -> None:
    for column in (
        "judge_status TEXT",            # NULL = waiting | done | no_next_state | failed
        "judge_raw TEXT",               # JSON list of the judge's raw outputs
        "judge_attempts INTEGER NOT NULL DEFAULT 0",
        "judge_retry_at REAL",          # next try after a failure (backoff)
        "judge_error TEXT",
        "judged_at REAL",
        "feedback_reward INTEGER",      # explicit feedback: overrides the judge's vote
        "feedback_comment TEXT",        # ... and is used as the hint
        "feedback_user TEXT",
        "feedback_at REAL",
    ):
        db.execute(f"ALTER TABLE turns ADD COLUMN {column}")
    db.execute("CREATE INDEX turns_judge ON turns(judge_status, next_state_at)")


@migration
def m003_teacher_topk(db: sqlite3.Connection) -> None:
    # {"ids": [[K ids] per response token], "logp": [[K logprobs] ...]} when opd.topk > 0
    db.execute("ALTER TABLE turns ADD COLUMN teacher_topk TEXT")


@migration
def m004_skills(db: sqlite3.Connection) -> None:
    # One row each time skill_bridge sees a skill change state: a new content hash, published or
    # refused (issues = the validator's errors), unpublished, or a name clash with a foreign skill.
    db.execute("""
        CREATE TABLE skill_versions (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            hash TEXT,                            -- sha256 of the source skill's files
            status TEXT NOT NULL,                 -- published | error | unpublished | conflict
            published_hash TEXT,                  -- what OpenClaw loads after this event
            issues TEXT,                          -- JSON list of {file, line, field, message, fix}
            at REAL NOT NULL
        )""")
    db.execute("CREATE INDEX skill_versions_name ON skill_versions(name, id)")
    # The clawrl-published skills in force when the turn arrived: JSON {name: hash}.
    db.execute("ALTER TABLE turns ADD COLUMN skills TEXT")


@migration
def m005_reasoning(db: sqlite3.Connection) -> None:
    # A reasoning model's <think> part, apart from the answer in response_text (chat/reasoning.py).
    db.execute("ALTER TABLE turns ADD COLUMN reasoning_text TEXT")


@migration
def m006_teacher_answer(db: sqlite3.Connection) -> None:
    # Consolidation's hinted teacher's own answer to a -1 turn (learn/hinted_answers.py): JSON
    # {"key": what it was written under, "ids": token ids, or null when it was left out}.
    db.execute("ALTER TABLE turns ADD COLUMN teacher_answer TEXT")
