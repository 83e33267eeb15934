"""Crash consistency: SIGKILL the daemon or its trainer at chosen moments, restart, and check that
nothing a client received is lost and nothing half-done is let in.

The first test kills once mid-stream with the real model. The second runs ROUNDS rounds against
the scripted model of scripted_model.py (it serves in milliseconds and PEFT trains it in a fraction
of a second), with the whole loop on: rules judge, trainer child (batch 2), hot-swap. Each round
starts the daemon if it is down, lets a few conversations run (streaming and not, each reply the
next state of the turn before), aims a SIGKILL at one phase (mid-stream, mid-judge, mid-training
step, mid-adapter-write, mid-swap) by watching the clients, the log and the adapters folder, kills
the daemon's whole process group or only the trainer child, and records which phases the kill
really hit, read from what it left behind. Invariants are checked after every kill, after every
restart and at the end; the phases the plan aims at must each have been hit at least once.
The third test kills nothing itself: it lays out on disk what a kill mid-canary leaves (ACTIVE
ahead of SEEN) with a version that collapses, and checks that the restart checks it again.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from clawrl.adapters import versions as adapters
from clawrl.turnlog.store import AWAITING_JUDGE, AWAITING_TRAINER
from conftest import SCRIPTED_PLAIN as PLAIN
from conftest import Daemon, make_home, scripted_env, until

pytestmark = pytest.mark.model


def test_kill_mid_stream_leaves_an_incomplete_row(tmp_path):
    home = make_home(tmp_path / "home")
    d = Daemon(home).start()
    body = {"model": "m", "stream": True, "max_tokens": 300, "temperature": 0.8,
            "messages": [{"role": "user", "content": "Write a long poem about the moon."}]}
    received = []
    try:
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body,
                          headers={"X-Session-Id": "doomed"}, timeout=60) as r:
            turn_id = int(r.headers["x-clawrl-turn-id"])
            for line in r.iter_lines():
                if line.startswith("data: "):
                    received.append(line)
                if len(received) >= 5:
                    d.kill()   # SIGKILL: no cleanup of any kind
                    break
    except httpx.HTTPError:
        pass
    assert len(received) >= 5
    db = sqlite3.connect(home / "clawrl.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    d2 = Daemon(home, port=d.port).start()   # restarts cleanly over the same data
    try:
        (row,) = d2.rows("SELECT * FROM turns WHERE id=?", turn_id)
        assert row["session_id"] == "doomed" and row["status"] == "started"
        assert row["prompt_ids"] and row["completed_at"] is None
        r = httpx.post(f"{d2.url}/v1/chat/completions", timeout=60, headers={"X-Session-Id": "doomed"},
                       json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200
        rows = d2.rows("SELECT turn_index, status FROM turns WHERE session_id='doomed' ORDER BY turn_index")
        assert [r_["turn_index"] for r_ in rows] == [0, 1]
    finally:
        d2.stop()


# -- SIGKILL rounds over the whole loop ------------------------------------------------------------

SEED = 20261130
PHASES = ("stream", "judge", "train", "write", "swap")
ROUNDS = 20                       # 4 aimed at each phase
BATCH = 2                         # train.batch_size: two turns per adapter version
QUESTIONS = ["What is the capital of France?", "Where does the river Seine flow?",
             "What does the note about the kangaroo say?", "Tell me something about Paris."]
REPLIES = ["Thanks, that helps. Next question please.", "No, that's wrong. Redo it please.",
           "Great, thank you!", "That is not what I asked, try again."]
STEP = re.compile(r"clawrl-trainer: training step on \d+ samples .* -> version (\d+)")
LOADED = re.compile(r"adapter (\d{4}) (activated|restored)")


class Conversations:
    """Client threads that talk to the daemon until told to stop or until it dies. Each keeps what
    it received in full (turn id -> text) and signals the moments a kill can aim at."""

    def __init__(self, url: str, tag: str, rng: random.Random, n: int = 3):
        self.url, self.tag = url, tag
        self.received: dict[int, str] = {}
        self.errors: list[str] = []        # answers other than 200 (there should be none)
        self.cut_streams = 0               # streams that had sent text and then broke off
        self.mid_stream = threading.Event()   # a stream has begun to send text
        self.next_state = threading.Event()   # a request carrying a next state was recorded
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._talk, args=(k, random.Random(rng.random())),
                                         daemon=True) for k in range(n)]

    def start(self) -> "Conversations":
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _talk(self, k: int, rng: random.Random) -> None:
        with httpx.Client(timeout=30) as client:
            for n in range(1000):
                session = f"{self.tag}-c{k}-{n}"
                messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
                for _ in range(4):
                    if self.stop.is_set():
                        return
                    try:
                        send = self._stream if rng.random() < 0.5 else self._plain
                        got = send(client, session, messages)
                    except httpx.HTTPError:
                        return   # the daemon is gone
                    if got is None:
                        return
                    turn_id, text = got
                    with self.lock:
                        self.received[turn_id] = text
                    messages += [{"role": "assistant", "content": text},
                                 {"role": "user", "content": rng.choice(REPLIES)}]
                    self.stop.wait(rng.uniform(0.1, 0.4))   # a user reads, then answers

    def _body(self, messages: list[dict], stream: bool) -> dict:
        return {"model": "scripted", "messages": messages, "max_tokens": 64, "stream": stream}

    def _plain(self, client, session, messages):
        r = client.post(f"{self.url}/v1/chat/completions", json=self._body(messages, False),
                        headers={"X-Session-Id": session})
        if r.status_code != 200:
            self.errors.append(f"{r.status_code}: {r.text}")
            return None
        if len(messages) > 1:
            self.next_state.set()
        return int(r.headers["x-clawrl-turn-id"]), r.json()["choices"][0]["message"]["content"]

    def _stream(self, client, session, messages):
        text, done, counted = "", False, False
        try:
            with client.stream("POST", f"{self.url}/v1/chat/completions",
                               json=self._body(messages, True),
                               headers={"X-Session-Id": session}) as r:
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code}: {r.read()!r}")
                    return None
                turn_id = int(r.headers["x-clawrl-turn-id"])
                if len(messages) > 1:   # its row (and so the next state) is written before any byte
                    self.next_state.set()
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        text += choices[0].get("delta", {}).get("content") or ""
                        if text and not counted:
                            counted = True
                            self.mid_stream.set()
        except httpx.HTTPError:
            if counted:
                with self.lock:
                    self.cut_streams += 1
            raise
        return (turn_id, text) if done else None


def group_alive(pgid: int) -> list[int]:
    """Processes of a process group that have not exited (zombies have)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            out.append(int(p.name))
    return out


def integrity(db_path: Path) -> str:
    db = sqlite3.connect(db_path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


class CrashRounds:
    def __init__(self, home: Path, model: Path):
        self.home = home
        self.root = home / "adapters"
        self.root.mkdir(exist_ok=True)
        self.env = scripted_env(model, CLAWRL_ENGINE_THREADS="1", CLAWRL_TRAIN_ENABLED="true",
                                CLAWRL_TRAIN_BATCH_SIZE=str(BATCH), CLAWRL_TRAIN_POLL_S="0.05",
                                # Every version stays on disk: lineages are checked end to end.
                                CLAWRL_TRAIN_KEEP_ADAPTERS="1000")
        self.daemon: Daemon | None = None
        self.logs: list[Path] = []
        self.trainer_kills = 0             # in the current daemon's life (its backoff doubles)
        self.received: dict[int, str] = {}
        self.awaiting_judge_at_kill: set[int] = set()
        self.hits: Counter = Counter()
        self.kills: Counter = Counter()

    # -- the daemon and its trainer ------------------------------------------------------------
    def start(self) -> Daemon:
        d = Daemon(self.home, env=self.env).start(start_new_session=True)
        self.daemon, self.trainer_kills = d, 0
        self.logs.append(d.log)
        self.check_loaded(d)
        return d

    def log_text(self, offset: int = 0) -> str:
        with open(self.daemon.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def trainer_pid(self) -> int:
        """The running trainer's pid, once it is watching the turn log."""
        def ready():
            t = httpx.get(f"{self.daemon.url}/v1/adapters", timeout=10).json()["trainer"]
            watching = self.log_text().count("clawrl-trainer: watching")
            return t["pid"] if t["state"] == "running" and watching > t["restarts"] else None
        return until("the trainer to watch the turn log", ready, timeout=120, every=0.1)

    @staticmethod
    def still_trainer(pid: int, d) -> bool:
        """Is `pid` still the daemon's child (a pid can be reused once it has exited)?"""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return int(stat[stat.rindex(")") + 2:].split()[1]) == d.proc.pid

    def kill_group(self) -> None:
        d = self.daemon
        os.killpg(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        until("the daemon's process group to be gone", lambda: not group_alive(d.proc.pid))
        self.daemon = None

    # -- aiming ---------------------------------------------------------------------------------
    def aim(self, phase: str, conv: Conversations, offset: int, rng: random.Random) -> None:
        """Return at a moment inside `phase` (as near as can be seen from outside)."""
        if phase == "stream":
            assert conv.mid_stream.wait(60), "no stream started"
            time.sleep(rng.uniform(0, 0.003))
        elif phase == "judge":
            # The rules judge takes milliseconds: watch the turn log for a turn that has its next
            # state and no judgment yet.
            assert conv.next_state.wait(60), "no next state was sent"
            db = sqlite3.connect(self.home / "clawrl.db")
            try:
                until("a turn waiting for the judge", lambda: db.execute(
                    f"SELECT 1 FROM turns WHERE {AWAITING_JUDGE} LIMIT 1").fetchone(), every=0.0005)
            finally:
                db.close()
        elif phase == "train":
            until("a training step", lambda: STEP.search(self.log_text(offset)), timeout=120,
                  every=0.01)
            time.sleep(rng.uniform(0, 0.2))
        elif phase == "write":
            # A version's temp folder lives for a few tens of milliseconds: poll for it tightly,
            # but only once a step has begun (burning a core meanwhile would slow everything).
            deadline = time.time() + 120
            while time.time() < deadline:
                steps = STEP.findall(self.log_text(offset))
                if not steps:
                    time.sleep(0.02)
                    continue
                want, step_deadline = int(steps[-1]), time.time() + 30
                written = adapters.version_dir(self.root, want)
                while time.time() < step_deadline and not written.exists():
                    if any(n.startswith(".tmp-") for n in os.listdir(self.root)):
                        time.sleep(rng.uniform(0, 0.002))
                        return
                    time.sleep(0.0005)
                offset = self.daemon.log.stat().st_size   # missed it: wait for the next step
            raise AssertionError("no adapter write seen in 120 s")
        elif phase == "swap":
            # Activated but its canary not finished: ACTIVE is ahead of SEEN.
            deadline = time.time() + 120
            while time.time() < deadline:
                seen = adapters.read_seen(self.root) or 0
                if (adapters.newest(self.root) or 0) <= seen:
                    time.sleep(0.02)
                    continue
                while (adapters.read_seen(self.root) or 0) == seen:
                    if (adapters.read_active(self.root) or 0) > seen:
                        return
                    time.sleep(0.0005)
            raise AssertionError("no adapter swap seen in 120 s")

    @contextlib.contextmanager
    def explained(self, i: int):
        """A wait that timed out says what the daemon was doing instead."""
        try:
            yield
        except AssertionError as e:
            raise AssertionError(f"round {i}: {e}; the daemon's log ends:\n"
                                 f"{self.log_text()[-3000:]}") from None

    # -- one round --------------------------------------------------------------------------------
    def round(self, i: int, phase: str, rng: random.Random) -> None:
        t0 = time.time()
        d = self.daemon or self.start()
        offset = d.log.stat().st_size
        # Killing only the trainer spares a daemon restart; its backoff doubles with each kill.
        trainer_only = (phase in ("train", "write") and self.trainer_kills < 3
                        and rng.random() < 0.7)
        with self.explained(i):
            trainer = self.trainer_pid() if phase in ("train", "write", "swap") else None
        conv = Conversations(d.url, f"r{i}", random.Random(rng.random())).start()
        try:
            with self.explained(i):
                self.aim(phase, conv, offset, rng)
            if trainer_only and not self.still_trainer(trainer, d):
                # It ended while we aimed (a supervised restart under load): kill the group instead.
                trainer_only = False
            if trainer_only:
                os.kill(trainer, signal.SIGKILL)
                self.trainer_kills += 1
            else:
                self.kill_group()
        finally:
            conv.join()
        assert not conv.errors, conv.errors
        target = "trainer" if trainer_only else "group"
        self.kills[target] += 1
        self.received.update(conv.received)
        hit = self.after_kill(target, conv, offset if trainer_only else 0,
                              d.log if not trainer_only else None)
        self.hits.update(hit)
        print(f"round {i:2d}: aimed at {phase:6s}, killed {target:7s}, hit {sorted(hit)}"
              f" ({time.time() - t0:.1f} s)")
        if trainer_only:   # the daemon serves on while its trainer is down
            r = httpx.post(f"{d.url}/v1/chat/completions", timeout=30, json={
                "model": "scripted", "max_tokens": 64,
                "messages": [{"role": "user", "content": "Are you still there?"}]})
            assert r.status_code == 200

    def after_kill(self, target: str, conv: Conversations, offset: int, log: Path | None) -> set:
        """Check what the kill left behind and say which phases it interrupted."""
        assert integrity(self.home / "clawrl.db") == "ok"
        hit = set()
        if target == "group" and conv.cut_streams:
            hit.add("stream")
        db = sqlite3.connect(self.home / "clawrl.db")
        waiting = {r[0] for r in db.execute(f"SELECT id FROM turns WHERE {AWAITING_JUDGE}")}
        db.close()
        if target == "group" and waiting:
            hit.add("judge")
            self.awaiting_judge_at_kill |= waiting
        names = os.listdir(self.root) if self.root.exists() else []
        if any(n.startswith(".tmp-") for n in names):
            hit.add("write")
        text = (log or self.daemon.log).read_bytes()[offset:].decode(errors="replace")
        said = [line for line in text.splitlines() if line.startswith("clawrl-trainer: ")]
        if said and STEP.match(said[-1]):   # its last word: a step had begun, and not ended
            hit.add("train")
        active, seen = adapters.read_active(self.root) or 0, adapters.read_seen(self.root) or 0
        if target == "group" and active > seen:
            hit.add("swap")
        db = sqlite3.connect(self.home / "clawrl.db")
        for v in adapters.list_versions(self.root):   # renamed into place, turns not yet marked
            ids = adapters.read_meta(self.root, v)["samples"]
            marked = db.execute(f"SELECT count(*) FROM turns WHERE trained_adapter=? AND id IN "
                                f"({','.join('?' * len(ids))})", (v, *ids)).fetchone()[0]
            if marked < len(ids):
                hit.add("mark")
        db.close()
        # Every numbered folder is a whole version (nothing is pruned here), and a valid one.
        for name in names:
            if name.isdigit():
                self.check_version(int(name))
        return hit

    # -- invariants -------------------------------------------------------------------------------
    def check_version(self, v: int) -> None:
        path = adapters.version_dir(self.root, v)
        assert adapters.is_complete(path), f"version {v} is not complete: {os.listdir(path)}"
        assert adapters.weights_problem(path) is None
        meta = adapters.read_meta(self.root, v)
        assert meta["version"] == v and len(meta["samples"]) == BATCH

    def check_loaded(self, d: Daemon) -> None:
        """Whatever the daemon serves or keeps loaded is a whole, valid version."""
        status = httpx.get(f"{d.url}/v1/adapters", timeout=10).json()
        for v in status["versions"]:
            if v["loaded"]:
                self.check_version(v["version"])
        if status["active"]:
            self.check_version(status["active"])

    def finish(self) -> None:
        """A last start: the trainer and the judge finish what the kills left, then the whole
        history is checked."""
        d = self.daemon or self.start()
        db = d.db

        def settled():
            c = sqlite3.connect(db)
            try:
                judge, train = (c.execute(f"SELECT count(*) FROM turns WHERE {w}").fetchone()[0]
                                for w in (AWAITING_JUDGE, AWAITING_TRAINER))
            finally:
                c.close()
            newest = adapters.newest(self.root) or 0
            return judge == 0 and train < BATCH and (adapters.read_seen(self.root) or 0) >= newest
        until("the judge, the trainer and the swapper to catch up", settled, timeout=180, every=0.2)
        self.check_loaded(d)
        d.stop()
        self.daemon = None
        assert integrity(db) == "ok"

        rows = {r["id"]: r for r in d.rows("SELECT * FROM turns")}
        # Every response a client received in full has its complete row, with the same text.
        for turn_id, text in self.received.items():
            row = rows[turn_id]
            assert row["status"] == "complete", (turn_id, row["status"])
            assert row["response_text"] == text
        # Pending judgments were resumed after the restarts.
        for turn_id in self.awaiting_judge_at_kill:
            assert rows[turn_id]["judge_status"] == "done", (turn_id, rows[turn_id]["judge_status"])

        metas = {v: adapters.read_meta(self.root, v) for v in adapters.list_versions(self.root)}
        assert metas, "no adapter was ever written"
        # One turn, one version: no sample is trained into two versions, least of all two of one
        # lineage, and the turn log says which version took it.
        owner: dict[int, int] = {}
        for v, meta in metas.items():
            for t in meta["samples"]:
                assert t not in owner, f"turn {t} was trained into {owner[t]:04d} and {v:04d}"
                owner[t] = v
        for v in metas:
            lineage, node = set(), v
            while node:
                assert node in metas, f"version {v}: parent {node} is missing"
                assert not lineage & set(metas[node]["samples"])
                lineage |= set(metas[node]["samples"])
                node = metas[node]["parent"]
        for t, v in owner.items():
            assert (rows[t]["train_status"], rows[t]["trained_adapter"]) == ("trained", v), t
        assert {t for t, r in rows.items() if r["train_status"] == "trained"} == set(owner)
        # Only whole versions were ever loaded; no daemon life logged an unexpected error.
        for log in self.logs:
            text = log.read_text(errors="replace")
            for v, _ in LOADED.findall(text):
                self.check_version(int(v))
            assert "Traceback" not in text, text[text.index("Traceback") - 2000:][:5000]


def test_sigkill_rounds_lose_nothing_and_let_nothing_half_done_in(scripted_chat_model, tmp_path):
    rng = random.Random(SEED)
    plan = [p for p in PHASES for _ in range(ROUNDS // len(PHASES))]
    rng.shuffle(plan)
    kit = CrashRounds(make_home(tmp_path / "home"), scripted_chat_model)
    try:
        for i, phase in enumerate(plan):
            kit.round(i, phase, rng)
        kit.finish()
    finally:
        if kit.daemon:
            kit.kill_group()
    print(f"kills: {dict(kit.kills)}; phases hit: {dict(kit.hits)}; "
          f"{len(kit.received)} complete responses checked")
    assert sum(kit.kills.values()) >= ROUNDS and kit.kills["trainer"] and kit.kills["group"]
    missed = [p for p in PHASES if not kit.hits[p]]
    assert not missed, f"no kill landed in {missed}; hits: {dict(kit.hits)}"


# -- a daemon killed while a new version's canary ran ----------------------------------------------

def write_adapter(model: Path, root: Path, version: int, parent: int | None,
                  collapsed: bool) -> None:
    """A LoRA version of the scripted model on its lm_head: a no-op, or one whose every answer is
    empty (its delta puts end-of-turn far ahead from the first step on)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=1, lora_alpha=1, target_modules=["lm_head"],
                                           lora_dropout=0.0))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.zero_()
                if collapsed and "lora_A" in name:
                    p[0, 0] = 1.0    # the dim that is 1 for every token (scripted_model.BIAS)
                if collapsed and "lora_B" in name:
                    p[base.config.eos_token_id, 0] = 1e3
    adapters.write_version(root, version, lora.save_pretrained,
                           {"parent": parent, "samples": [], "loss": 0.0})


def test_a_version_killed_mid_canary_is_checked_again_before_it_serves(scripted_chat_model,
                                                                        tmp_path):
    """ACTIVE names a version whose canary never finished (ahead of SEEN, or no SEEN at all after
    a first swap): after the restart it is not trusted but checked again, and a collapsed one is
    rejected while the version before it serves."""
    home = make_home(tmp_path / "home")
    root = home / "adapters"
    env = scripted_env(scripted_chat_model)

    def ask(d: Daemon) -> str:
        r = httpx.post(f"{d.url}/v1/chat/completions", timeout=30, json={
            "model": "scripted", "max_tokens": 64,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert r.status_code == 200
        return r.json()["choices"][0]["message"]["content"]

    def decided(d: Daemon, version: int) -> dict:
        until(f"version {version} to be decided",
              lambda: (adapters.read_seen(root) or 0) >= version, timeout=60)
        return httpx.get(f"{d.url}/v1/adapters", timeout=10).json()

    d = Daemon(home, env=env).start()
    try:
        assert ask(d) == PLAIN                # a served prompt for the canary to replay
        write_adapter(scripted_chat_model, root, 1, None, collapsed=False)
        assert decided(d, 1)["active"] == 1
    finally:
        d.stop()

    # Killed after activating version 2 and before its canary ended: ACTIVE 2, SEEN 1.
    write_adapter(scripted_chat_model, root, 2, 1, collapsed=True)
    adapters.write_active(root, 2)
    d = Daemon(home, env=env).start()
    try:
        status = decided(d, 2)
        assert adapters.rejection(root, 2), status
        assert status["active"] == 1 and ask(d) == PLAIN
    finally:
        d.stop()

    # The same on a first swap, which leaves no SEEN at all.
    (root / adapters.SEEN).unlink()
    write_adapter(scripted_chat_model, root, 3, 1, collapsed=True)
    adapters.write_active(root, 3)
    d = Daemon(home, env=env).start()
    try:
        status = decided(d, 3)
        assert adapters.rejection(root, 3), status
        assert status["active"] == 1 and ask(d) == PLAIN
    finally:
        d.stop()
