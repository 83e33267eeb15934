"""A bounded run of bench/load.py: 16 clients for 10 s against a daemon whose queue holds 4.

Every request gets an answer: 200, or 503/429 with Retry-After once the queue is full, never
another 5xx and never a dropped connection (except the streams the clients drop themselves).
Afterwards the daemon still serves, every turn row is finalized, and its file descriptors and
threads are back where they were before the load (memory within a margin). No timing is
asserted; the numbers it measures are the benchmark's business (bench/RESULTS-load.md).
A burst of requests at once must not overfill the queue either.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.model


def test_every_request_is_answered_or_refused_with_retry_after(scripted_chat_model, tmp_path):
    out = tmp_path / "load.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "load.py"), "--clients", "16", "--seconds", "10",
         "--baseline-seconds", "3", "--max-concurrent", "2", "--max-queue", "4",
         "--model", str(scripted_chat_model), "--home", str(tmp_path / "home"), "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    res = json.loads(out.read_text())
    load = res["load"]
    print(run.stdout)

    assert set(load["by_status"]) <= {"200", "429", "503"}, load["by_status"]
    assert load["client_errors"] == 0 and load["other_status"] == 0
    assert load["refused"] > 0, "the queue limit was never reached: the test proves nothing"
    assert load["refused_with_retry_after"] == load["refused"]
    assert load["completed"] > 0 and load["dropped_mid_stream"] > 0

    assert res["served_after"]
    d = res["daemon"]
    assert d["settled"]["unfinished_turns"] == 0 and d["settled"]["queue"] == 0
    assert d["settled"]["fds"] <= d["before"]["fds"] + 2, d
    assert d["settled"]["threads"] <= d["before"]["threads"] + 2, d
    assert d["settled"]["rss_mib"] < 1.5 * d["before"]["rss_mib"], d


def test_a_burst_cannot_overfill_the_queue(scripted_chat_model, tmp_path):
    """20 requests at once against max_concurrent 1 + max_queue 2: at no moment are more than
    those 3 (plus what the client sees late) in the daemon; the rest get 503 + Retry-After.
    The queue is checked again right before the submit: a burst used to pass the first check
    all together while its requests were being rendered, and all 20 were queued."""
    import asyncio
    import time

    import httpx

    from conftest import Daemon, make_home, scripted_env

    d = Daemon(make_home(tmp_path / "home"), env=scripted_env(
        scripted_chat_model, CLAWRL_ENGINE_MAX_CONCURRENT="1", CLAWRL_ENGINE_MAX_QUEUE="2")).start()

    async def burst() -> list[tuple]:
        async with httpx.AsyncClient(base_url=d.url, timeout=60,
                                     limits=httpx.Limits(max_connections=32)) as client:
            async def one(i: int) -> tuple:
                body = {"model": "scripted", "max_tokens": 64, "stream": True,
                        "messages": [{"role": "user", "content": f"Question {i}?"}]}
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    admitted = time.perf_counter()     # a 200's headers follow its submit
                    lines = [line async for line in r.aiter_lines()]
                    return r.status_code, r.headers.get("retry-after"), admitted, \
                        time.perf_counter(), "data: [DONE]" in lines
            return await asyncio.gather(*(one(i) for i in range(20)))

    try:
        results = asyncio.run(burst())
    finally:
        d.stop()
    ok = [r for r in results if r[0] == 200]
    assert all(r[4] for r in ok)
    assert all(r[0] == 503 and r[1] for r in results if r[0] != 200), results
    most = max(sum(o[2] <= a[2] for o in ok) - sum(o[3] <= a[2] for o in ok) for a in ok)
    assert most <= 3 + 2, f"{most} requests in the daemon at once; {len(ok)} of 20 taken"
