"""How `clawrl eval --consolidate-at` waits for the daemon's consolidation: through the real status
file that the trainer writes (adapters.write_consolidation), as long as the run keeps taking steps,
and no longer once it stops moving. On a slow CPU one consolidation takes longer than a
checkpoint's settle timeout, and a run that is still training must not be failed for that."""
from __future__ import annotations

import threading
import time

import pytest

from clawrl.adapters import versions as adapters
from clawrl.errors import ClawrlError
from clawrl.evals.evaluate import wait_for_consolidation


def _trainer(root, rid, steps, every_s, end="done"):
    """What the trainer writes: a running status per step, then the final one."""
    def write():
        for step in range(steps + 1):
            adapters.write_consolidation(root, {"request": rid, "state": "running", "step": step,
                                                "steps": steps, "message": "training"})
            time.sleep(every_s)
        adapters.write_consolidation(root, {"request": rid, "state": end, "version": 7, "step": steps,
                                            "steps": steps, "message": "version 0007"})
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


def test_a_run_longer_than_the_stall_limit_is_waited_for_while_it_takes_steps(tmp_path):
    said: list[str] = []
    # 7 writes 0.25 s apart: 1.75 s in all, past the 1 s stall limit, but never still for long.
    t = _trainer(tmp_path, "r1", steps=6, every_s=0.25)
    status = wait_for_consolidation(tmp_path, "r1", stall_s=1.0, progress=said.append, poll_s=0.02)
    t.join()
    assert status["state"] == "done" and status["version"] == 7
    assert said[0] == "consolidation step 0/6" and said[-1] == "consolidation step 6/6"


def test_a_run_that_stops_moving_is_given_up_with_where_it_stood(tmp_path):
    adapters.write_consolidation(tmp_path, {"request": "r2", "state": "running", "step": 3, "steps": 30})
    with pytest.raises(ClawrlError, match="no progress for 0.3 s: at step 3 of 30"):
        wait_for_consolidation(tmp_path, "r2", stall_s=0.3, poll_s=0.02)


def test_another_request_s_status_is_not_taken_for_this_one(tmp_path):
    """A finished status of an earlier request is in the folder: it is not this run's outcome."""
    adapters.write_consolidation(tmp_path, {"request": "old", "state": "done", "version": 3})
    with pytest.raises(ClawrlError, match="never started"):
        wait_for_consolidation(tmp_path, "new", stall_s=0.3, poll_s=0.02)


def test_a_refused_or_failed_run_is_returned_as_it_ended(tmp_path):
    t = _trainer(tmp_path, "r3", steps=1, every_s=0.05, end="failed")
    assert wait_for_consolidation(tmp_path, "r3", stall_s=2, poll_s=0.02)["state"] == "failed"
    t.join()
