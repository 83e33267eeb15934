"""A crash mid-stream leaves the turn row marked incomplete, never nothing."""
from __future__ import annotations

import sqlite3

import httpx
import pytest

from conftest import Daemon, make_home

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
