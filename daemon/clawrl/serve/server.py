"""The daemon's lifecycle: open the turn log, bind the port, load the model, serve, shut down.

The port is bound first so `/healthz` answers at once; `/readyz` turns 200 once the model is
loaded (a first start converts the model, which takes a while). Then the background parts start:
the judging loop, the hot-swap watcher and the trainer child process. SIGTERM/SIGINT are handled
by uvicorn: it stops accepting, lets in-flight responses finish (bounded), then the lifespan stops
the trainer, the watcher and the judge, and closes the engine and the store. Under systemd
(`Type=notify`), sdnotify.Notifier reports each step; a SIGTERM stop exits 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

import uvicorn

from ..config import Config
from ..engines import make_engine
from ..turnlog.forget import Retention
from ..judge.loop import Judging
from .sdnotify import Notifier
from ..skills.proposals import Proposals
from ..skills.bridge import SkillBridge, proposals_folder
from ..learn.supervisor import TrainerSupervisor
from ..adapters.swap import Swapper
from .proxy import DaemonState, build_app
from ..turnlog.redact import Redactor
from ..turnlog.store import Store, private_dir

log = logging.getLogger("clawrl")
DRAIN_SECONDS = 10
# The largest header block the HTTP layer parses (uvicorn's h11 default is 16 KiB). Within it an
# overlong attribution header reaches clawrl and gets an OpenAI-style 400; beyond it h11 refuses
# the request itself and closes the connection.
MAX_HEADER_BYTES = 64 * 1024
PROPOSE_EVERY_S = 60.0


def _load(state: DaemonState) -> None:
    try:
        state.engine.load()
        state.ready = True
        log.info("ready: serving %s on http://%s:%d/v1", state.engine.model_id,
                 state.cfg.server.host, state.cfg.server.port)
    except Exception as e:  # keep serving /readyz so the operator can see why
        state.load_error = str(e)
        log.error("could not load the model: %s", e)


async def _after_load(state: DaemonState) -> None:
    """Judging (the engine backend needs the model), hot-swap and training start once the model
    is loaded."""
    while not state.ready:
        if state.load_error:
            return
        await asyncio.sleep(0.2)
    # The lifespan made these before it started this task.
    assert state.judging is not None and state.swapper is not None and state.trainer is not None
    state.judging.start()
    state.swapper.start()
    if state.cfg.train.enabled:
        state.trainer.start()


def _start_skills(state: DaemonState) -> None:
    if not state.cfg.skills.enabled:
        return
    try:
        state.skills = SkillBridge(state.cfg)
        state.skills.start()
    except Exception as e:   # skills are an extra: serving goes on without them
        state.skills = None
        log.error("skill_bridge did not start (%s); fix it or set skills.enabled = false", e)


async def _propose_skills(state: DaemonState) -> None:
    """Draft skills from corrections that keep coming back (see skill_proposals)."""
    assert state.skills is not None   # started only when the skill bridge is
    proposals = Proposals(proposals_folder(state.cfg), state.skills.source)
    while True:
        await asyncio.sleep(PROPOSE_EVERY_S)
        try:
            for name in await asyncio.to_thread(proposals.propose, state.cfg.db_path,
                                                state.cfg.skills.propose_after):
                log.info("proposed skill %s: `clawrl skills list` shows it, "
                         "`clawrl skills accept %s` publishes it", name, name)
        except Exception as e:
            log.error("skill proposals: %s", e)


def make_lifespan(state: DaemonState, notifier: Notifier):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        notifier.start()    # first and last: watchdog pings cover the model load and the shutdown
        private_dir(state.cfg.home)   # 0700 before anything is written into it
        state.store = await Store.open(state.cfg.db_path, Redactor.from_config(state.cfg.privacy))
        loader = asyncio.get_running_loop().run_in_executor(None, _load, state)
        state.judging = Judging(state.cfg, state.store, state.engine, metrics=state.metrics)
        state.swapper = Swapper(state.cfg, state.engine, state.store, metrics=state.metrics)
        state.trainer = TrainerSupervisor(state.cfg)
        retention = Retention(state.cfg.db_path, state.cfg.store.retention_days)
        retention.start()   # nothing to do when store.retention_days is 0
        started = asyncio.create_task(_after_load(state))
        await asyncio.to_thread(_start_skills, state)
        proposing = (asyncio.create_task(_propose_skills(state))
                     if state.skills and state.cfg.skills.propose_after else None)
        try:
            yield
        finally:
            started.cancel()
            if proposing:
                proposing.cancel()
            if state.skills:
                await asyncio.to_thread(state.skills.stop)
            await retention.stop()
            await state.trainer.stop()
            await state.swapper.stop()
            await state.judging.stop()
            with contextlib.suppress(Exception):
                await loader
            state.engine.close()
            await state.store.close()
            await notifier.stop()
    return lifespan


def serve(cfg: Config) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = DaemonState(cfg=cfg, engine=make_engine(cfg))
    notifier = Notifier(state)
    app = build_app(state, lifespan=make_lifespan(state, notifier))
    server = uvicorn.Server(uvicorn.Config(
        app, host=cfg.server.host, port=cfg.server.port, log_level="warning",
        timeout_graceful_shutdown=DRAIN_SECONDS, access_log=False,
        http="h11", h11_max_incomplete_event_size=MAX_HEADER_BYTES))
    notifier.server = server
    log.info("turn log: %s", cfg.db_path)
    # Once it has drained and shut down, uvicorn re-raises the signal that stopped it to whatever
    # handler was there before. By then everything is closed, so a SIGTERM ends in exit 0 (a clean
    # stop for systemd and other supervisors) instead of death by the signal. A SIGINT comes back
    # as KeyboardInterrupt, which uvicorn.run() swallows too.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:      # the port could not be bound, or the lifespan failed
        sys.exit(3)
