"""The turn log's schema: migrations applied in memory, and the columns the code relies on.

Fast: no daemon, no model. A column that a module reads or writes but no migration creates, or a
migration that runs twice, fails here instead of in a daemon's first start.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from clawrl.learn import samples
from clawrl.turnlog import migrations, rows, store

PACKAGE = Path(__file__).resolve().parents[1] / "daemon" / "clawrl"


def migrated() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    migrations.apply(db)
    return db


def columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def test_every_migration_runs_once_in_order():
    db = sqlite3.connect(":memory:")
    ran = migrations.apply(db)
    assert ran == [fn.__name__ for fn in migrations.MIGRATIONS]
    assert ran == sorted(ran) and all(re.fullmatch(r"m\d{3}_\w+", n) for n in ran)
    assert migrations.apply(db) == []          # a second open applies nothing
    assert [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY name")] == ran


def test_a_log_from_the_first_release_migrates_to_the_same_schema():
    old = sqlite3.connect(":memory:")
    old.isolation_level = None
    migrations.MIGRATIONS[0](old)              # what the first release created, nothing after
    old.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL)")
    old.execute("INSERT INTO _migrations VALUES (?, 0)", (migrations.MIGRATIONS[0].__name__,))
    assert migrations.apply(old) == [fn.__name__ for fn in migrations.MIGRATIONS[1:]]
    fresh = migrated()
    for table in ("sessions", "turns", "skill_versions"):
        assert columns(old, table) == columns(fresh, table), table


def test_the_json_columns_the_decoder_knows_exist():
    turns = columns(migrated(), "turns")
    assert rows.JSON_COLUMNS <= turns, rows.JSON_COLUMNS - turns


def test_the_turn_state_predicates_are_valid_sql_on_the_schema():
    db = migrated()
    for predicate in (store.AWAITING_NEXT_STATE, store.AWAITING_JUDGE, store.AWAITING_TRAINER,
                      samples.READY):
        db.execute(f"SELECT count(*) FROM turns WHERE {predicate}").fetchone()


def test_every_turns_column_the_code_names_exists():
    """Columns named in `UPDATE turns SET a=?, b=...` and `turns.x` anywhere in the package."""
    turns = columns(migrated(), "turns")
    named = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for sets in re.findall(r"UPDATE turns SET (.+?) WHERE", text, flags=re.S):
            named |= set(re.findall(r"(\w+)\s*=", sets.replace('"', " ")))
    assert named and named <= turns, named - turns
