"""A daemon component that runs one asyncio task for its lifetime (judging, hot-swap), and how
such a loop reports a pass that keeps failing.

A turn log on a full or read-only disk fails every pass of the judge and adapter loops; one
traceback per second would bury the log line that says why. So FailingPass logs the first failure
with its traceback, the same failure again only as a count once a minute, and the recovery once;
and the wait before the next pass doubles up to a cap while it keeps failing.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time


class BackgroundLoop:
    name = "clawrl-loop"
    _task: asyncio.Task | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


REPEAT_EVERY_S = 60.0


class FailingPass:
    """One loop's run of failed passes: `failed(e)` after each (it logs as fits and returns the
    wait before the next pass), `succeeded()` after a good one."""

    def __init__(self, log: logging.Logger, what: str, base_s: float = 1.0, cap_s: float = 10.0):
        self.log, self.what, self.base_s, self.cap_s = log, what, base_s, cap_s
        self.failures, self.last_error, self.reported_at = 0, "", 0.0

    def failed(self, e: BaseException) -> float:
        """Report `e` as fits; the seconds to wait before the next pass."""
        self.failures += 1
        error = f"{type(e).__name__}: {e}"
        now = time.monotonic()
        if error != self.last_error:
            self.log.error("%s failed; retrying", self.what, exc_info=e)
            self.last_error, self.reported_at = error, now
        elif now - self.reported_at >= REPEAT_EVERY_S:
            self.log.error("%s still failing (%d times so far): %s", self.what, self.failures,
                           error)
            self.reported_at = now
        return min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 16))

    def succeeded(self) -> None:
        if self.failures:
            self.log.warning("%s works again after %d failures", self.what, self.failures)
        self.failures, self.last_error = 0, ""
