"""The whole loop through the HTTP API: a conversation → next state → rules judge → trainer
child process → new adapter live → the next request is served by it. A request streaming while
the adapter swaps in finishes normally."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from clawrl.adapters import versions as adapters
from conftest import Daemon, make_home

pytestmark = pytest.mark.model


def chat(url: str, session: str, messages: list[dict], max_tokens: int = 12) -> tuple[str, int]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, headers={"X-Session-Id": session},
                   json={"model": "m", "max_tokens": max_tokens, "temperature": 0, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], int(r.headers["x-clawrl-turn-id"])


def test_feedback_trains_an_adapter_that_serves_the_next_request(tmp_path):
    home = make_home(tmp_path / "home")
    d = Daemon(home, env={"CLAWRL_TRAIN_ENABLED": "true", "CLAWRL_TRAIN_BATCH_SIZE": "1",
                          "CLAWRL_TRAIN_POLL_S": "0.2"}).start()
    try:
        msgs = [{"role": "user", "content": "What is the capital of Italy?"}]
        text, t1 = chat(d.url, "loop", msgs)
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks, that's great!"}]
        _, t2 = chat(d.url, "loop", msgs)          # carries turn 1's next state

        lines: list[str] = []

        def stream():  # a long answer that runs across the swap
            body = {"model": "m", "stream": True, "max_tokens": 160, "temperature": 0.7, "seed": 3,
                    "messages": [{"role": "user", "content": "Tell me a long story about a heron."}]}
            with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=600,
                              headers={"X-Session-Id": "across-swap"}) as r:
                lines.append(r.headers["x-clawrl-turn-id"])
                lines.extend(line for line in r.iter_lines() if line.startswith("data: "))

        streamer = threading.Thread(target=stream)
        streamer.start()

        deadline = time.time() + 240
        while time.time() < deadline:
            info = httpx.get(f"{d.url}/v1/adapters", timeout=10).json()
            if info["active"] >= 1:
                break
            time.sleep(0.2)
        assert info["active"] == 1, info
        row1 = d.turn(t1)
        assert row1["judge_score"] == 1 and row1["train_status"] == "trained"
        assert row1["trained_adapter"] == 1
        meta = adapters.read_meta(home / "adapters", 1)
        assert t1 in meta["samples"] and meta["parent"] in (None, 0)

        _, t3 = chat(d.url, "after", [{"role": "user", "content": "What is the capital of Spain?"}])
        assert d.wait_turn(t3)["adapter_version"] == 1

        streamer.join(timeout=600)
        assert lines[-1] == "data: [DONE]"
        row = d.wait_turn(int(lines[0]))
        assert row["status"] == "complete" and row["completion_tokens"] == 160
    finally:
        d.stop()


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"   # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_trainer_stops_when_the_daemon_is_killed(tmp_path):
    d = Daemon(make_home(tmp_path / "home"), env={"CLAWRL_TRAIN_ENABLED": "true"}).start()
    pid, deadline = None, time.time() + 60
    while not pid and time.time() < deadline:
        pid = (httpx.get(f"{d.url}/v1/adapters", timeout=10).json()["trainer"] or {}).get("pid")
        time.sleep(0.2)
    assert pid and alive(pid)
    d.kill()                                   # SIGKILL: the daemon cannot clean up
    deadline = time.time() + 60
    while alive(pid) and time.time() < deadline:
        time.sleep(0.3)
    assert not alive(pid), "the orphaned trainer kept running"
