"""The daemon's lifecycle: open the turn log, bind the port, load the model, serve, shut down.

The port is bound first so `/healthz` answers at once; `/readyz` turns 200 once the model is
loaded (a first start converts the model, which takes a while). Then the background parts start:
the judging loop, the hot-swap watcher and the trainer child process. SIGTERM/SIGINT are handled
by uvicorn: it stops accepting, lets in-flight responses finish (bounded), then the lifespan stops
the trainer, the watcher and the judge, and closes the engine and the store.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import uvicorn

from .config import Config
from .engines import make_engine
from .judging import Judging
from .supervisor import TrainerSupervisor
from .swap import Swapper
from .proxy import DaemonState, build_app
from .store import Store

log = logging.getLogger("clawrl")
DRAIN_SECONDS = 10


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
    state.judging.start()
    state.swapper.start()
    if state.cfg.train.enabled:
        state.trainer.start()


def make_lifespan(state: DaemonState):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.store = await Store.open(state.cfg.db_path)
        loader = asyncio.get_running_loop().run_in_executor(None, _load, state)
        state.judging = Judging(state.cfg, state.store, state.engine)
        state.swapper = Swapper(state.cfg, state.engine, state.store)
        state.trainer = TrainerSupervisor(state.cfg)
        started = asyncio.create_task(_after_load(state))
        try:
            yield
        finally:
            started.cancel()
            await state.trainer.stop()
            await state.swapper.stop()
            await state.judging.stop()
            with contextlib.suppress(Exception):
                await loader
            state.engine.close()
            await state.store.close()
    return lifespan


def serve(cfg: Config) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = DaemonState(cfg=cfg, engine=make_engine(cfg))
    app = build_app(state, lifespan=make_lifespan(state))
    log.info("turn log: %s", cfg.db_path)
    uvicorn.run(app, host=cfg.server.host, port=cfg.server.port, log_level="warning",
                timeout_graceful_shutdown=DRAIN_SECONDS, access_log=False)
