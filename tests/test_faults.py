"""Faults around the daemon: each leaves serving untouched and loses or corrupts nothing.

- The judge endpoint (backend `openai`, a real local HTTP server this test controls) refuses
  connections, answers garbage, answers 500, then is slow: the turn waits in the turn log with its
  tries counted and a retry time, and is judged once the endpoint answers; chats are answered
  all along, also while a judge call hangs.
- Another process holds the turn log's write lock: requests are answered, recorded once the lock
  is gone, or answered unrecorded after bounded retries with a clear log line; nothing is corrupted.
- The data directory's filesystem fills up (a small tmpfs): chats are answered, the log says the
  disk is full, nothing is corrupted, and once space is back turns are recorded and judged again.
- The trainer crashes at every start: the supervisor restarts it with doubling backoff, the status
  says so, and serving goes on.

Every daemon serves the scripted model (conftest.scripted_chat_model): fast and deterministic.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from clawrl.adapters import versions as adapters
from conftest import (CLAWRL, REPO, SCRIPTED_PLAIN, Daemon, free_port, make_home, scripted_env,
                      until)

pytestmark = pytest.mark.model


def chat(d: Daemon, session: str, messages: list[dict], stream: bool = False) -> tuple[str, str]:
    """(turn id header, answer text) of one chat completion, which must succeed."""
    body = {"model": "scripted", "messages": messages, "max_tokens": 64, "stream": stream}
    headers = {"X-Session-Id": session}
    if not stream:
        r = httpx.post(f"{d.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.headers["x-clawrl-turn-id"], r.json()["choices"][0]["message"]["content"]
    text, done = "", False
    with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                text += ((event.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
        assert done
        return r.headers["x-clawrl-turn-id"], text


def integrity(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


# -- the judge endpoint: down, garbage, 500, slow --------------------------------------------------

class JudgeEndpoint:
    """A local OpenAI-compatible judge whose behaviour the test switches: `garbage` (200, not
    JSON), `error` (500), `hold` (waits until released, then a good verdict), `good`."""

    def __init__(self, port: int):
        self.port, self.mode = port, "good"
        self.calls: list[str] = []          # the mode each call met
        self.arrived = threading.Event()    # a call is being held
        self.release = threading.Event()
        self.server: ThreadingHTTPServer | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                mode = outer.mode
                outer.calls.append(mode)
                if mode == "hold":
                    outer.arrived.set()
                    outer.release.wait(120)
                if mode == "garbage":
                    status, body = 200, b"<html>upstream proxy says hello</html>"
                elif mode == "error":
                    status, body = 500, b'{"error": {"message": "model crashed"}}'
                else:   # one answer serves both the vote call and the hint call
                    content = "The user thanks the assistant. \\boxed{1} [NO_HINT]"
                    message = {"role": "assistant", "content": content}
                    status, body = 200, json.dumps({"choices": [{"message": message}]}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.handler = Handler

    def up(self, mode: str) -> None:
        self.mode = mode
        if self.server is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
            threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def test_turns_wait_for_a_failing_judge_and_serving_does_not(scripted_chat_model, tmp_path):
    judge = JudgeEndpoint(free_port())          # not listening yet: connection refused
    d = Daemon(make_home(tmp_path / "home"), env=scripted_env(
        scripted_chat_model, CLAWRL_JUDGE_BACKEND="openai", CLAWRL_JUDGE_VOTES="1",
        CLAWRL_JUDGE_URL=f"http://127.0.0.1:{judge.port}/v1", CLAWRL_JUDGE_MODEL="judge")).start()
    q = [{"role": "user", "content": "What is the capital of France?"}]

    def judged_turn(session: str) -> int:
        """A turn whose next state (a thank-you) has just arrived."""
        tid, answer = chat(d, session, q)
        chat(d, session, [*q, {"role": "assistant", "content": answer},
                          {"role": "user", "content": "Thanks, that helps!"}], stream=True)
        return int(tid)

    def failed_tries(turn: int, n: int, error: str) -> None:
        row = until(f"judge try {n} of turn {turn}",
                    lambda: (r := d.turn(turn))["judge_attempts"] >= n and r)
        assert row["judge_attempts"] == n and error in row["judge_error"], row
        assert row["judge_status"] is None and row["judge_score"] is None, row   # it waits
        assert row["judge_retry_at"] > row["next_state_at"], row                 # for a retry
        for stream in (False, True):   # ... and serving goes on, and records its turns
            tid, text = chat(d, f"other-{turn}-{n}-{stream}", q, stream=stream)
            assert text == SCRIPTED_PLAIN and d.wait_turn(int(tid))["status"] == "complete"

    try:
        a = judged_turn("a")
        failed_tries(a, 1, "unreachable")            # connection refused
        judge.up("garbage")
        failed_tries(a, 2, "gave no choices")        # 200 with a body that is not JSON
        judge.mode = "error"
        b = judged_turn("b")
        failed_tries(b, 1, "HTTP 500")
        judge.mode = "hold"                          # slow: each call hangs until released
        assert judge.arrived.wait(60), "the judge was not called again"
        tid, text = chat(d, "while-judging", q, stream=True)
        assert text == SCRIPTED_PLAIN
        assert d.turn(a)["judge_status"] is None and d.turn(b)["judge_status"] is None
        judge.release.set()
        for turn, tries in ((a, 2), (b, 1)):
            row = until(f"turn {turn} judged",
                        lambda: (r := d.turn(turn))["judge_status"] == "done" and r)
            assert row["judge_score"] == 1 and json.loads(row["judge_votes"]) == [1]
            assert row["judge_attempts"] == tries and row["judge_error"] is None, row
    finally:
        d.stop()
        judge.down()
    assert integrity(d.db) == "ok"


# -- the turn log held by another writer -----------------------------------------------------------

def test_a_busy_turn_log_delays_or_skips_recording_never_serving(scripted_chat_model, tmp_path):
    d = Daemon(make_home(tmp_path / "home"), env=scripted_env(scripted_chat_model)).start()
    q = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        chat(d, "warm", q)
        # A short hold (well under the 5 s busy timeout): requests wait, then are recorded.
        holder = sqlite3.connect(d.db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(chat, d, f"short-{i}", q, i % 2 == 1) for i in range(4)]
            time.sleep(1.0)   # the hold itself: what is measured is only that nothing fails
            holder.execute("ROLLBACK")
            for f in futures:
                tid, text = f.result(timeout=60)
                assert text == SCRIPTED_PLAIN and d.wait_turn(int(tid))["status"] == "complete"

        # A hold past every retry: each request is still answered while the lock is held (its
        # retries are bounded, whatever the queue of writers), unrecorded, and the log says why.
        holder.execute("BEGIN IMMEDIATE")
        try:
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                futures = [pool.submit(chat, d, f"long-{i}", q, i % 2 == 1) for i in range(6)]
                results = [f.result(timeout=120) for f in futures]
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert all(text == SCRIPTED_PLAIN for _, text in results)
        unrecorded = [tid for tid, _ in results if not tid]
        assert unrecorded, results
        log = d.log.read_text()
        assert "could not record turn" in log and "database is locked" in log

        # The lock is gone: turns are recorded again; no row is left half-written.
        tid, text = chat(d, "after", q, stream=True)
        assert d.wait_turn(int(tid))["status"] == "complete"
        assert not d.rows("SELECT id FROM turns WHERE status='started'")
    finally:
        d.stop()
    assert integrity(d.db) == "ok"


def test_a_queue_of_writes_gives_up_together_not_one_after_another():
    """The store's writes take turns; while one is stuck (another process holds the database),
    every write queued behind it fails after its own bounded wait instead of each waiting for all
    the ones before it."""
    import asyncio

    from clawrl.turnlog.store import WriteTurn

    async def scenario() -> list:
        turn = WriteTurn(timeout=0.05)
        stuck = asyncio.Event()

        async def holder():
            async with turn:
                stuck.set()
                await asyncio.sleep(3600)    # never lets go while the others try

        async def writer():
            async with turn:
                return "wrote"

        held = asyncio.create_task(holder())
        await stuck.wait()
        results = await asyncio.wait_for(
            asyncio.gather(*(writer() for _ in range(8)), return_exceptions=True), 30)
        held.cancel()
        async with turn:                     # a cancelled holder hands its turn on
            results.append("wrote after")
        return results

    results = asyncio.run(scenario())
    assert all(isinstance(r, sqlite3.OperationalError) and "database is locked" in str(r)
               for r in results[:8]), results
    assert results[8] == "wrote after"


def test_a_mark_that_fails_after_the_rename_never_trains_a_turn_twice(scripted_chat_model,
                                                                       tmp_path):
    """The trainer renames a version into place, then cannot mark its turns (the turn log is held
    past the busy timeout; a full disk fails the same way): its next step must not choose those
    turns again, or one lineage would learn them twice."""
    from transformers import AutoTokenizer

    from clawrl.turnlog import migrations
    from clawrl.chat.format import render_prompt
    from clawrl.config import load_config
    from clawrl.learn.trainer import Trainer

    home = make_home(tmp_path / "home")
    cfg = load_config(env={"CLAWRL_HOME": str(home), "CLAWRL_MODEL_SOURCE": str(scripted_chat_model),
                           "CLAWRL_METHOD_NAME": "rl", "CLAWRL_TRAIN_BATCH_SIZE": "2",
                           "CLAWRL_TRAIN_THREADS": "1"})
    tok = AutoTokenizer.from_pretrained(scripted_chat_model)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    response = tok.encode(SCRIPTED_PLAIN, add_special_tokens=False) + [tok.eos_token_id]
    db = sqlite3.connect(cfg.db_path)
    migrations.apply(db)
    with db:
        db.execute("INSERT INTO sessions (id, created_at, last_seen) VALUES ('s', 0, 0)")
        for i, score in enumerate((1, -1, 1, -1)):
            db.execute(
                "INSERT INTO turns (session_id, turn_index, turn_type, kind, trainable, status,"
                " model, adapter_version, request_json, n_messages, prompt_ids, response_text,"
                " response_ids, response_logprobs, created_at, judge_status, judge_score)"
                " VALUES ('s', ?, 'main', 'main', 1, 'complete', 'scripted', 0, ?, 1, ?, ?, ?, ?,"
                " 0, 'done', ?)",
                (i, json.dumps({"messages": messages, "tools": None}),
                 json.dumps(render_prompt(tok, messages, None)), SCRIPTED_PLAIN,
                 json.dumps(response), json.dumps([0.0] * len(response)), score))
    db.close()

    trainer = Trainer(cfg)
    trainer.db.execute("PRAGMA busy_timeout=100")   # the test need not wait out 5 s
    holder = sqlite3.connect(cfg.db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")               # reads go on (WAL); the mark cannot
    try:
        with pytest.raises(sqlite3.OperationalError):
            trainer.step()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    root = cfg.adapters_dir
    assert adapters.list_versions(root) == [1]      # renamed into place, its turns unmarked

    assert trainer.step() == 2 and trainer.step() is None
    trainer.close()
    metas = {v: adapters.read_meta(root, v) for v in adapters.list_versions(root)}
    assert metas[2]["parent"] == 1
    assert sorted(metas[1]["samples"] + metas[2]["samples"]) == [1, 2, 3, 4]   # each once
    db = sqlite3.connect(cfg.db_path)
    marks = dict(db.execute("SELECT id, trained_adapter FROM turns").fetchall())
    db.close()
    assert marks == {t: v for v, m in metas.items() for t in m["samples"]}


# -- the data directory's disk is full ---------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs (CI runs as root in a container where this works); skipped elsewhere."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if out.returncode:
        pytest.skip(f"cannot mount a small tmpfs here ({out.stderr.strip()}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the filesystem is full; delete it to give the space back."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_stops_recording_not_serving(scripted_chat_model, small_disk, tmp_path):
    home = make_home(small_disk / "home")      # models/ links to the shared cache, off this disk
    d = Daemon(home, env=scripted_env(scripted_chat_model))
    d.log = tmp_path / "daemon.log"             # the log is not on the full disk
    d.start()
    q = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        tid, _ = chat(d, "before", q)
        assert d.wait_turn(int(tid))["status"] == "complete"

        filler = fill(small_disk)
        results = [chat(d, "full", q, stream=i % 2 == 1) for i in range(4)]
        assert all(text == SCRIPTED_PLAIN for _, text in results)
        assert not all(tid for tid, _ in results), results   # the turn log could not take them
        log = d.log.read_text()
        assert "could not record turn" in log and "database or disk is full" in log
        assert httpx.get(f"{d.url}/readyz", timeout=10).status_code == 200

        filler.unlink()                              # space is back
        tid, answer = chat(d, "after", q, stream=True)
        assert d.wait_turn(int(tid))["status"] == "complete"
        chat(d, "after", [*q, {"role": "assistant", "content": answer},
                          {"role": "user", "content": "Great, thank you!"}])
        row = until("the judgment after the disk freed up",
                    lambda: (r := d.turn(int(tid)))["judge_status"] == "done" and r)
        assert row["judge_score"] == 1
    finally:
        d.stop()
    assert integrity(d.db) == "ok"


def test_an_adapter_write_on_a_full_disk_leaves_nothing_behind(small_disk):
    """The trainer's side: a version that does not fit fails whole (the trainer exits, its
    supervisor restarts it with backoff) and leaves neither a version nor a temp folder."""
    root = small_disk / "adapters"
    adapters.write_version(root, 1, lambda p: (p / adapters.WEIGHTS).write_bytes(b"w"),
                           {"samples": [1]})
    filler = fill(small_disk)

    def save(p: Path) -> None:
        (p / "adapter_config.json").write_text("{}")
        (p / adapters.WEIGHTS).write_bytes(b"\0" * (1 << 20))   # no room for this

    with pytest.raises(OSError):
        adapters.write_version(root, 2, save, {"samples": [2]})
    assert sorted(p.name for p in root.iterdir()) == ["0001"]
    filler.unlink()
    adapters.write_version(root, 2, save, {"samples": [2]})
    assert adapters.list_versions(root) == [2] and adapters.is_complete(root / "0002")


# -- the trainer crashing in a loop ----------------------------------------------------------------

def test_a_crashing_trainer_backs_off_visibly_and_serving_goes_on(scripted_chat_model, tmp_path):
    """The recipe is broken while the daemon runs (a typo saved in an editor): every trainer start
    fails at once, the supervisor doubles its wait each time and says so, serving goes on, and
    once the recipe is fixed the trainer comes back."""
    home = make_home(tmp_path / "home")
    recipe = tmp_path / "recipe.toml"
    good = (REPO / "recipes" / "default.toml").read_text()
    recipe.write_text(good)
    d = Daemon(home, env=scripted_env(scripted_chat_model, CLAWRL_RECIPE=str(recipe),
                                      CLAWRL_TRAIN_ENABLED="true")).start()
    q = [{"role": "user", "content": "What is the capital of France?"}]

    def trainer() -> dict:
        return httpx.get(f"{d.url}/v1/adapters", timeout=10).json()["trainer"]

    def backing_off(n: int) -> dict:
        """The status while the trainer waits to restart after its n-th crash."""
        t = until(f"crash {n}", lambda: (t := trainer())["restarts"] >= n
                  and t["state"].startswith("restarting") and t, timeout=120, every=0.02)
        assert t["restarts"] == n, t
        assert t["state"] == f"restarting in {2 ** (n - 1)} s after exit code {t['last_exit']}", t
        return t

    try:
        pid = until("the trainer", lambda: (t := trainer())["state"] == "running" and t["pid"])
        recipe.write_text(good.replace("[train]\n", "[train]\nbatchsize = 4\n"))   # no such key
        os.kill(pid, signal.SIGKILL)   # the healthy trainer goes; the next ones read the typo
        assert backing_off(1)["last_exit"] == -signal.SIGKILL
        assert backing_off(2)["last_exit"] == 2
        tid, text = chat(d, "s", q, stream=True)
        assert text == SCRIPTED_PLAIN and d.wait_turn(int(tid))["status"] == "complete"
        assert backing_off(3)["last_exit"] == 2
        ready = httpx.get(f"{d.url}/readyz", timeout=10).json()
        assert ready["status"] == "ready" and ready["trainer"].startswith("restarting in")
        default = str(REPO / "recipes" / "default.toml")   # `clawrl status` reads a recipe too
        status = subprocess.run([*CLAWRL, "status"], capture_output=True, text=True, timeout=60,
                                env={**d.env, "CLAWRL_RECIPE": default})
        assert status.returncode == 0 and "restarting in" in status.stdout, status.stdout
        assert "unknown key train.batchsize" in d.log.read_text()   # why, in the daemon's log
        for stream in (False, True):
            _, text = chat(d, "s2", q, stream=stream)
            assert text == SCRIPTED_PLAIN

        recipe.write_text(good)                      # fixed: the next start stays up
        seen = len(d.log.read_bytes())
        until("the trainer back at work", lambda: trainer()["state"] == "running"
              and b"clawrl-trainer: watching" in d.log.read_bytes()[seen:], timeout=120)
        assert trainer()["restarts"] == 3
    finally:
        d.stop()
