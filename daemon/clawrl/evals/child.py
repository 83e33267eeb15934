"""A `clawrl serve` child process: the one harness that `clawrl eval`, `clawrl agents`, the bench
scripts and the tests start daemons with.

It owns the process's life: a home and a free loopback port, the environment on top of the
caller's, one log file, waiting until `/readyz` answers (or saying why it never will, with the end
of the log), a SIGTERM that lets the daemon drain and stop its trainer, and SIGKILL after a grace
period. What a caller does with the daemon (an eval's settling, a test's rows) is the caller's.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import httpx

from ..errors import ClawrlError
from ..procs import free_port

LOG_TAIL = 3000          # characters of the daemon's log shown when it fails to start
STOP_GRACE_S = 30.0      # how long a SIGTERM may take before SIGKILL


class DaemonChild:
    """A `clawrl serve` in `home` on `port` (a free one by default), with `env` on top of this
    process's environment (without its own CLAWRL_* settings where `inherit_settings` is false);
    `url` is its base, `db` its turn log, `log` what it printed."""

    def __init__(self, home: Path, env: dict[str, str] | None = None, port: int | None = None,
                 log: Path | None = None, inherit_settings: bool = True):
        home.mkdir(parents=True, exist_ok=True)
        self.home, self.port = home, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if inherit_settings or not k.startswith("CLAWRL_")}
        self.env = {**base, "CLAWRL_HOME": str(home), "CLAWRL_SERVER_PORT": str(self.port),
                    "CLAWRL_SERVER_HOST": "127.0.0.1", **(env or {})}
        self.log = log or home / "daemon.log"
        self.proc: subprocess.Popen | None = None

    @property
    def db(self) -> Path:
        return self.home / "clawrl.db"

    def start(self, timeout: float = 300, **popen) -> Self:
        """Start it and wait until it is ready. `popen`: extra subprocess.Popen arguments (e.g.
        start_new_session, or preexec_fn=procs.die_with_parent: then a run stopped by a signal
        leaves no daemon and trainer behind, but the daemon also ends with the thread that
        started it)."""
        with open(self.log, "ab") as log:      # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "clawrl", "serve"], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, **popen)
        try:
            self._wait_ready(self.proc, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen, timeout: float) -> None:
        key = self.env.get("CLAWRL_SERVER_API_KEY")   # /readyz needs it when one is set
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClawrlError(f"the daemon exited with status {proc.returncode} before it was "
                                  f"ready; the end of {self.log}:\n{self.log_tail()}")
            try:
                r = httpx.get(f"{self.url}/readyz", headers=auth, timeout=2)
                if r.status_code == 200:
                    return
                if r.json().get("status") == "failed":
                    raise ClawrlError(f"the daemon could not load the model: {r.json().get('error')}")
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
        raise ClawrlError(f"the daemon was not ready after {timeout:.0f} s; the end of "
                          f"{self.log}:\n{self.log_tail()}")

    def log_tail(self, chars: int = LOG_TAIL) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (the daemon drains and stops its trainer), then SIGKILL after `grace` s."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would end it."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def rows(self, sql: str, *args) -> list[dict]:
        """Rows of a query on its turn log, through a connection of our own."""
        db = sqlite3.connect(self.db, timeout=30)
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute(sql, args)]
        finally:
            db.close()
