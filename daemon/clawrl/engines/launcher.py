"""Run a server engine's process (or watch one someone else runs) and keep it healthy.

`ServerProcess` starts the server in its own process group (SIGTERM to it if the daemon dies),
waits for `/health`, hands it to the engine to prepare (adapters), restarts it with doubling
backoff when it exits, and says at every moment whether requests can be sent (`available`). It
knows nothing of the server's protocol beyond `/health`; engines/remote.py does the rest.
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from ..errors import ModelError
from ..procs import die_with_parent

log = logging.getLogger("clawrl.engine")
BACKOFF_START, BACKOFF_MAX, HEALTHY_RUN_S = 1.0, 120.0, 60.0
HEALTH_POLL_S, STOP_GRACE_S = 1.0, 20.0


class ServerProcess:
    """Launch (or, with `argv=None`, only watch) a server and keep it healthy.

    One thread does everything: start the process, wait for `/health`, call `on_ready` (the engine
    loads its adapters again: a fresh server has none), mark it available, wait for it to exit,
    and start it again with doubling backoff. `available` is False whenever requests would fail.
    """

    def __init__(self, kind: str, url: str, argv: list[str] | None, env: dict | None,
                 log_path: Path | None, startup_timeout: float, on_ready=None):
        self.kind, self.url, self.argv, self.env = kind, url, argv, env
        self.log_path, self.startup_timeout, self.on_ready = log_path, startup_timeout, on_ready
        self.proc: subprocess.Popen | None = None
        self.available = False
        self.state = "stopped"
        self.restarts = 0
        self.last_exit: int | None = None
        self.first_start = threading.Event()
        self.start_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"clawrl-{self.kind}-server",
                                        daemon=True)
        self._thread.start()

    def wait_started(self) -> None:
        """Block until the first start succeeded; raise ModelError saying why if it did not."""
        self.first_start.wait()
        if self.start_error:
            raise ModelError(self.start_error)

    def suspect(self) -> None:
        """A request could not reach the server: stop sending until /health answers again."""
        self.available = False

    def status(self) -> dict:
        return {"state": self.state, "pid": self.proc.pid if self.proc else None,
                "restarts": self.restarts, "last_exit": self.last_exit, "url": self.url}

    # -- the supervising thread --------------------------------------------------------------------
    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
        except OSError:
            return ""

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        assert self.log_path is not None     # remote.py passes a log with every command it launches
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n--- clawrl starts: {shlex.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent)
        return self.proc

    def _wait_healthy(self) -> bool:
        """Until /health answers, the process exits, the timeout passes or stop() is called."""
        deadline = time.monotonic() + self.startup_timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            if self._healthy():
                return True
            self._stop.wait(0.5)
        return False

    def _become_ready(self) -> None:
        if self.on_ready:
            self.on_ready()
        self.available = True
        self.state = "running"

    def _fail_first_start(self, why: str) -> None:
        self.start_error = why
        self.first_start.set()

    def _run(self) -> None:
        if self.argv is None:
            return self._watch()
        delay = BACKOFF_START
        while not self._stop.is_set():
            self.state = "starting"
            try:
                proc = self._spawn(self.argv)
            except OSError as e:
                return self._fail_first_start(
                    f"could not start the {self.kind} server with {shlex.join(self.argv)!r}: {e}. "
                    f"Install {self.kind} where that command finds it, or set engine.command")
            started = time.monotonic()
            if self._wait_healthy():
                try:
                    self._become_ready()
                except Exception as e:
                    if not self.first_start.is_set():    # e.g. it reports a too small LoRA rank
                        self._kill()
                        return self._fail_first_start(str(e))
                    log.exception("%s server restarted but could not be prepared", self.kind)
                    self.available, self.state = True, "running"
                self.first_start.set()
                log.info("%s server ready at %s (pid %d)", self.kind, self.url, proc.pid)
                while proc.poll() is None and not self._stop.is_set():
                    if not self.available and self._healthy():   # a request failed, it lives on
                        self.available = True
                    self._stop.wait(HEALTH_POLL_S)
            elif not self.first_start.is_set() and not self._stop.is_set():
                code = proc.poll()
                self._kill()
                return self._fail_first_start(
                    f"the {self.kind} server did not become healthy at {self.url}/health "
                    + (f"(it exited with {code})" if code is not None
                       else f"within engine.startup_timeout_s = {self.startup_timeout:.0f} s")
                    + f"; its log {self.log_path} ends with:\n{self._log_tail()}")
            self.available = False
            if self._stop.is_set():
                break
            self._kill()
            self.last_exit = proc.returncode
            if time.monotonic() - started > HEALTHY_RUN_S:
                delay = BACKOFF_START            # it ran a good while: not a crash loop
            self.restarts += 1
            self.state = f"restarting in {delay:.0f} s after exit code {self.last_exit}"
            log.warning("%s server exited with %s; %s", self.kind, self.last_exit, self.state)
            self._stop.wait(delay)
            delay = min(BACKOFF_MAX, delay * 2)
        self.state = "stopped"

    def _watch(self) -> None:
        """Attach mode: someone else runs the server; follow its health, and prepare it again
        (adapters) whenever it comes back after being unreachable."""
        deadline = time.monotonic() + self.startup_timeout
        while not self._stop.is_set():
            healthy = self._healthy()
            if healthy and not self.available:
                self.state = "preparing"
                try:
                    self._become_ready()
                except Exception as e:
                    if not self.first_start.is_set():
                        return self._fail_first_start(f"the {self.kind} server at {self.url} "
                                                      f"cannot be used: {e}")
                    log.exception("%s server at %s came back but could not be prepared", self.kind,
                                  self.url)
                    self.available, self.state = True, "running"
                if not self.first_start.is_set():
                    log.info("attached to the %s server at %s", self.kind, self.url)
                self.first_start.set()
            elif not healthy:
                if self.available:
                    log.warning("%s server at %s stopped answering /health", self.kind, self.url)
                self.available, self.state = False, "unreachable"
                if not self.first_start.is_set() and time.monotonic() > deadline:
                    return self._fail_first_start(
                        f"no {self.kind} server answers at {self.url}/health (engine.url); start "
                        "it, or set engine.launch = true and let clawrl start one")
            self._stop.wait(HEALTH_POLL_S if self.first_start.is_set() else 0.5)

    def _kill(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        self._stop.set()
        self.available = False
        if self.argv is not None:
            self._kill()
        if self._thread:
            self._thread.join(timeout=STOP_GRACE_S + 15)
        self.first_start.set()
