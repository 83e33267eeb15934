"""Run the trainer as a child process and keep it running.

The trainer is a separate process so that a crash, a leak or a long step there never touches
serving. It is restarted after a crash with doubling backoff (a visible status says so) and sent
SIGTERM on shutdown, then SIGKILL if it does not stop in time.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from ..config import Config
from .distributed import launch_args

log = logging.getLogger("clawrl.trainer")
BACKOFF_START, BACKOFF_MAX, STOP_GRACE = 1.0, 120.0, 15.0


class TrainerSupervisor:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.last_exit: int | None = None
        self.state = "stopped"
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="clawrl-trainer-supervisor")

    async def _run(self) -> None:
        delay = BACKOFF_START
        while True:
            # The child watches for this pid: if the daemon dies (even by SIGKILL) it stops too.
            env = {**os.environ, "CLAWRL_HOME": str(self.cfg.home), "CLAWRL_PARENT_PID": str(os.getpid()),
                   # the trainer sets its threads itself; this keeps torch.distributed.run from
                   # setting (and announcing) 1
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(self.cfg.train.threads))}
            args = launch_args(self.cfg)   # under torch.distributed.run for several processes
            if self.cfg.recipe:
                args += ["--recipe", str(self.cfg.recipe)]
            started = time.monotonic()
            self.proc = await asyncio.create_subprocess_exec(*args, env=env)
            self.state = "running"
            self.last_exit = await self.proc.wait()
            if time.monotonic() - started > 60:
                delay = BACKOFF_START          # it ran a good while: not a crash loop
            self.restarts += 1
            self.state = f"restarting in {delay:.0f} s after exit code {self.last_exit}"
            log.warning("trainer exited with %s; %s", self.last_exit, self.state)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX, delay * 2)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.state = "stopped"

    def status(self) -> dict:
        return {"state": self.state, "pid": self.proc.pid if self.proc else None,
                "restarts": self.restarts, "last_exit": self.last_exit}
