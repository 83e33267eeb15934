"""A background loop's failing pass: reported once with its traceback, then as a count once a
minute, the recovery once; the wait between passes doubles up to its cap."""
from __future__ import annotations

import logging

from clawrl import background
from clawrl.background import FailingPass


def test_a_pass_failing_the_same_way_is_reported_once_then_counted(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(background.time, "monotonic", lambda: now[0])
    failing = FailingPass(logging.getLogger("t"), "judging pass", base_s=1.0, cap_s=10.0)
    disk_full = OSError(28, "No space left on device")
    with caplog.at_level(logging.WARNING, "t"):
        waits = []
        for _ in range(6):
            waits.append(failing.failed(disk_full))
            now[0] += 1
        assert waits == [1, 2, 4, 8, 10, 10]
        assert [r.exc_info is not None for r in caplog.records] == [True]   # one traceback
        now[0] += background.REPEAT_EVERY_S
        failing.failed(disk_full)
        assert "still failing (7 times so far)" in caplog.records[-1].getMessage()
        failing.failed(PermissionError("read-only"))          # a new error: told in full
        assert caplog.records[-1].exc_info is not None and len(caplog.records) == 3
        failing.succeeded()
        assert "works again after 8 failures" in caplog.records[-1].getMessage()
        failing.succeeded()                                   # and only once
        assert len(caplog.records) == 4
    assert failing.failed(disk_full) == 1                     # the backoff starts over
