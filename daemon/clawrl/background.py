"""A daemon component that runs one asyncio task for its lifetime (judging, hot-swap)."""
from __future__ import annotations

import asyncio
import contextlib


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
