"""A bounded run of bench/load.py: 16 clients for 10 s against a daemon whose queue holds 4.

Every request gets an answer: 200, or 503/429 with Retry-After once the queue is full, never
another 5xx and never a dropped connection (except the streams the clients drop themselves).
Afterwards the daemon still serves, every turn row is finalized, and its file descriptors and
threads are back where they were before the load (memory within a margin). No timing is
asserted; the numbers it measures are the benchmark's business (bench/RESULTS-load.md).
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
