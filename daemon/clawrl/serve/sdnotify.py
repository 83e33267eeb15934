"""Telling systemd how the daemon is doing: the sd_notify protocol, spoken without libsystemd.

`send()` puts one datagram of `KEY=value` lines on `$NOTIFY_SOCKET` (a path, or `@name` for an
abstract socket) and does nothing when that is unset, so the daemon runs the same with or without
systemd. `Notifier` is the daemon's side of a `Type=notify` unit:

- `WATCHDOG=1` every half of `$WATCHDOG_USEC` from the first moment of the lifespan, through the
  model load and the shutdown: systemd arms the watchdog at the first ping (or at READY), and a
  ping that comes from the event loop also proves that the loop is not stuck;
- `READY=1` once the model is loaded *and* uvicorn has bound the port. uvicorn runs the lifespan
  startup before it binds, so the lifespan cannot say it; the loop waits for `server.started`,
  which uvicorn sets after `create_server()` returns, i.e. once the socket listens;
- `STATUS=...`: model, adapter version, queue, turns waiting for the judge, the trainer; sent when
  any of those may have changed and at least every few seconds;
- `STOPPING=1` as soon as uvicorn is told to exit (SIGTERM/SIGINT), before it drains.

It reports; it never starts or stops anything (serve/server.py owns the lifecycle).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

log = logging.getLogger("clawrl.sdnotify")
TICK = 0.25           # how often the loop looks at the daemon; cheap: no I/O unless something changed
STATUS_EVERY = 5.0    # a STATUS refresh (turn counts move without any other sign) at least this often
WATCHDOG_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def send(address: str | None, *lines: str) -> bool:
    """Send `lines` as one notification; False when there is no socket or it could not be sent."""
    if not address:
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            # A full receive queue must not stall the event loop; systemd drains it quickly.
            s.settimeout(1.0)
            s.sendto("\n".join(lines).encode(), target)
        return True
    except OSError as e:
        log.debug("could not notify systemd at %s: %s", address, e)
        return False


def watchdog_period(env=os.environ) -> float | None:
    """Seconds between pings (half the timeout, as sd_watchdog_enabled(3) advises), or None when no
    watchdog is asked of this process: WATCHDOG_PID, when set, names the process that is watched."""
    try:
        usec = int(env.get("WATCHDOG_USEC") or 0)
        pid = int(env.get("WATCHDOG_PID") or os.getpid())
    except ValueError:
        return None
    if usec <= 0 or pid != os.getpid():
        return None
    return usec / 2e6


async def status_line(state, bound: bool) -> str:
    """What `systemctl status clawrl` shows under the unit name."""
    engine = state.engine
    if state.load_error:
        return f"{engine.model_id} failed to load: {state.load_error}"
    if not state.ready:
        return f"loading {engine.model_id} (a first start converts it, which takes a while)"
    if not bound:
        return f"{engine.model_id} loaded; binding {state.cfg.server.host}:{state.cfg.server.port}"
    counts = await state.store.counts()
    trainer = state.trainer.status()["state"] if state.cfg.train.enabled and state.trainer else "off"
    return (f"serving {engine.model_id} adapter v{engine.adapter_version} on "
            f"{state.cfg.server.host}:{state.cfg.server.port}; queue {engine.queue_depth()}; "
            f"{counts['awaiting_judge']} turns awaiting judge, {counts['judged']} judged; "
            f"trainer {trainer}")


class Notifier:
    """The notification loop for one daemon run. `server` (the uvicorn.Server) is set by
    server.serve() once it exists; the loop reads its `started` and `should_exit` flags."""

    def __init__(self, state, env=os.environ):
        self.state = state
        self.server = None
        self.address = env.get("NOTIFY_SOCKET")
        self.period = watchdog_period(env)
        # Children (the trainer) must not speak for the daemon, nor think they are watched: clear
        # the variables as sd_notify(3) does with unset_environment.
        for name in WATCHDOG_ENV:
            os.environ.pop(name, None)
        self.ready_sent = self.stopping_sent = False
        self._seen: tuple | None = None
        self._status: str | None = None
        self._status_at = 0.0
        self._failing = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.address:
            self._task = asyncio.create_task(self._run(), name="clawrl-sdnotify")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def send(self, *lines: str) -> bool:
        ok = send(self.address, *lines)
        if not ok and not self._failing:  # once per outage, not once per ping
            log.warning("cannot reach systemd's notification socket %s", self.address)
        self._failing = not ok
        return ok

    async def _run(self) -> None:
        next_ping = 0.0
        while True:
            now = time.monotonic()
            if self.period and now >= next_ping:
                self.send("WATCHDOG=1")
                next_ping = now + self.period
            try:
                await self._update(now)
            except Exception as e:  # a failed status must never stop the pings
                log.warning("systemd status update failed: %s", e)
            await asyncio.sleep(TICK)

    async def _update(self, now: float) -> None:
        state, server = self.state, self.server
        if server is not None and server.should_exit:
            if not self.stopping_sent:
                self.stopping_sent = True
                self.send("STOPPING=1", "STATUS=stopping: finishing in-flight requests, then the trainer")
            return
        bound = server is not None and server.started
        trainer = state.trainer.status()["state"] if state.trainer else None
        seen = (state.ready, bound, state.load_error, state.engine.adapter_version, trainer)
        if seen == self._seen and now - self._status_at < STATUS_EVERY:
            return
        self._seen, self._status_at = seen, now
        text = await status_line(state, bound)
        lines = [f"STATUS={text}"] if text != self._status else []
        if state.ready and bound and not self.ready_sent:
            lines.insert(0, "READY=1")
        if lines and self.send(*lines):
            self._status = text
            self.ready_sent = self.ready_sent or lines[0] == "READY=1"
