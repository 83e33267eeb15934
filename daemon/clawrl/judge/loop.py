"""The judging loop: read each next state as feedback on the turn before it, in the background.

Runs as one asyncio task in the daemon. It wakes when a next state arrives (or every second),
judges waiting turns a few at a time, and stores every raw vote, the score and the hint on the
turn. A judge that fails (endpoint down, garbage output, timeout) is retried with doubling backoff;
the turn keeps waiting in the database meanwhile, so nothing is lost across restarts. It also ends
sessions that have been idle past `session.idle_timeout_s`. Serving never waits for any of this,
and the probe, which reads on the same CPU cores as the engine, waits for serving: a judging pass
starts once no answer is being generated, or after `judge.defer_s` at the most.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading

from ..chat.format import content_text
from ..background import BackgroundLoop, FailingPass
from ..config import Config
from ..engines.base import token_budget
from .judges import Judge, make_judge, openai_complete
from ..metrics import Metrics
from ..turnlog.rows import turn
from ..turnlog.store import Store
from ..types import GenParams, JudgeInput

log = logging.getLogger("clawrl.judging")
BACKOFF_START, BACKOFF_MAX = 2.0, 300.0
CALL_TIMEOUT = 120.0
DEFER_POLL_S = 0.05


async def after_serving(engine, most_s: float, poll_s: float = DEFER_POLL_S) -> float:
    """Wait until `engine` generates nothing, or `most_s` seconds; returns the seconds waited."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while engine is not None and most_s > 0 and engine.active_count() > 0:
        if loop.time() - start >= most_s:
            break
        await asyncio.sleep(poll_s)
    return loop.time() - start


def judge_input(row: dict, context_messages: int) -> JudgeInput:
    """What the judge sees of a turn: the conversation just before it (system prompts left out:
    OpenClaw's are ~10k tokens of instructions), the response, and what followed."""
    t = turn(row)
    window = [m for m in t.request["messages"] if m.get("role") not in ("system", "developer")]
    window = window[-context_messages:] if context_messages else []
    return JudgeInput(
        context=[{**m, "content": content_text(m.get("content"))} for m in window],
        response=t.response_text, tool_calls=t.tool_calls or [],
        next_state=[{**m, "content": content_text(m.get("content"))} for m in t.next_state or []])


# A judge call is over once it has given its answer; on a CPU every token after that is waste.
ANSWERED = re.compile(r"\\boxed\{[^{}]*\}|\[HINT_END\]|\[NO_HINT\]")


def engine_complete(engine, temperature: float, max_tokens: int):
    """Judge calls through the serving engine itself (the base model: adapters off)."""

    async def complete(messages: list[dict]) -> str:
        ids = await asyncio.to_thread(engine.render, messages, None)
        budget = token_budget(engine, len(ids), max_tokens)
        gen = engine.submit(ids, GenParams(max_tokens=budget, temperature=temperature), adapter=0)
        text = ""
        async for ev in gen:
            text += ev.text
            if ANSWERED.search(text[-40:]):
                gen.cancel()
                break
        return text
    return complete


def judge_for(cfg: Config, backend: str, engine=None):
    """A rules, engine or openai judge with the recipe's judge settings (`engine`: the loaded
    engine the engine judge calls through)."""
    j = cfg.judge
    complete = None
    if backend == "openai":
        complete = openai_complete(j.url, j.model, j.api_key or None, j.temperature, j.max_tokens)
    elif backend == "engine":
        complete = engine_complete(engine, j.temperature, j.max_tokens)
    return make_judge(backend, j.votes, complete)


class Judging(BackgroundLoop):
    name = "clawrl-judging"

    def __init__(self, cfg: Config, store: Store, engine, metrics: Metrics | None = None):
        self.cfg, self.store, self.engine = cfg, store, engine
        self.metrics = metrics or Metrics()
        # The probe's head needs the base model and minutes to fit the first time: made in _run.
        self.judge: Judge | None = (None if cfg.judge.backend == "probe"
                                    else judge_for(cfg, cfg.judge.backend, engine))
        self.wake = asyncio.Event()
        self.defer_s = 0.0      # how long a pass waits for serving: set once the probe is built

    async def _prepare_probe(self) -> None:
        """Load (or fit, the first time) the probe's head; without one, judge by the rules.
        Turns wait in the turn log meanwhile, so nothing is lost while it fits."""
        from . import probe, probe_fit
        self._stopping = threading.Event()
        try:
            def build():
                # The corpus is read at the trainer's priority: serving comes first.
                return probe_fit.head_for(self.cfg, cancel=self._stopping, nice=10,
                                          progress=lambda msg: log.info("probe head: %s", msg))
            # A thread of its own that ends with the fit: a thread that ran multi-threaded torch
            # keeps its OpenMP pool while it lives, and a second live pool slows the embedded
            # engine's decode ~2x (engines/embedded.py, load). Readings then run on one thread.
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="clawrl-probe-fit")
            try:
                head, reader = await asyncio.shield(
                    asyncio.get_running_loop().run_in_executor(pool, build))
            except asyncio.CancelledError:
                self._stopping.set()     # the fit stops at its next line; shutdown goes on
                raise
            finally:
                pool.shutdown(wait=False)
            # It reads on the engine's cores: on the embedded engine's worker, between two of its
            # passes and on its threads (58-78 ms a judgment on 2 cores, against about 105 ms on
            # one thread of its own: bench/judge.py; on one thread of its own while the worker is
            # in a long prefill); beside any other engine on one thread.
            run = getattr(self.engine, "between_passes", None)
            self.judge = probe.ProbeJudge(head, reader, threads=None if run else 1, run=run)
            self.defer_s = self.cfg.judge.defer_s
            log.info("judge: probe (thresholds %.2f/%.2f, dev correction recall %.2f; reading %s)",
                     head.meta.threshold, head.meta.approval_threshold,
                     head.meta.dev.get("correction_recall", 0.0),
                     "on the engine's worker" if run else "on a thread of its own")
        except Exception as e:
            self.judge = make_judge("rules", 1)
            log.error("judge: the probe could not be built (%s); judging by the rules judge "
                      "instead. Fix it with `clawrl judge train`, then restart.", e)

    async def _run(self) -> None:
        if self.judge is None:
            await self._prepare_probe()
        failing = FailingPass(log, "judging pass")
        while True:
            wait = 1.0
            try:
                await self._end_idle_sessions()
                rows = await self.store.turns_to_judge(limit=4)
                failing.succeeded()
                if rows:
                    await after_serving(self.engine, self.defer_s)
                    await asyncio.gather(*(self._judge_one(r) for r in rows))
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a database hiccup must not end the loop
                wait = failing.failed(e)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def _judge_one(self, row: dict) -> None:
        try:
            inp = judge_input(row, self.cfg.judge.context_messages)
            assert self.judge is not None       # _run sets one (the probe or the rules) before any pass
            result = await asyncio.wait_for(self.judge.judge(inp), CALL_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            attempts = row["judge_attempts"] + 1
            give_up = attempts >= self.cfg.judge.max_attempts
            delay = None if give_up else min(BACKOFF_MAX, BACKOFF_START * 2 ** (attempts - 1))
            log.warning("judging turn %s failed (try %d): %r%s", row["id"], attempts, e,
                        "; giving up" if give_up else f"; retrying in {delay:.0f} s")
            await self.store.judge_failed(row["id"], repr(e), delay)
            self.metrics.judge_failures.inc()
            return
        await self.store.save_judgment(row["id"], result.score, result.votes, result.raw, result.hint)
        self.metrics.judged(result.score)
        log.info("turn %s judged %+d%s", row["id"], result.score, " with a hint" if result.hint else "")

    async def _end_idle_sessions(self) -> None:
        for session_id in await self.store.idle_sessions(self.cfg.session.idle_timeout_s):
            await self.store.end_session(session_id)
            log.info("session %s ended after %.0f s idle", session_id, self.cfg.session.idle_timeout_s)
