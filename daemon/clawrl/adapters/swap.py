"""Hot-swap: notice new adapter versions, guard them, load them, and route new requests to them.

One asyncio task in the daemon polls the adapters folder (a few times a second: cheaper and more
robust than inotify for one folder). A new complete version is checked (weights and training loss
finite), loaded into the engine between two decode steps and made active; then a canary answers
recent served prompts with it, and if it has collapsed (empty or looping answers, where the base
model's answers to the same prompts are not) it is marked REJECTED, the previous version is
restored and the bad one unloaded. Activating before the canary
keeps the swap itself at a load (~0.3 s); a canary first would add its whole run (~2 s) to every
swap, for a collapse that is rare and is taken back within that same time. Requests already
running finish on the version they started with, so a swap never fails or refuses a request.
`activate` and `rollback` serve the operator's commands.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time

from . import versions as adapters
from ..background import BackgroundLoop, FailingPass
from ..config import Config
from ..errors import AdapterRefused
from ..metrics import Metrics
from ..turnlog.store import Store
from ..types import GenParams

log = logging.getLogger("clawrl.swap")
POLL_S = 0.1
CANARY_PROMPTS, CANARY_TOKENS = 2, 16
LOOPS, LOOPS_OVER_BASE = 0.5, 0.2    # a loop: this much 4-gram repetition, and this much above the base's


def repetition(ids: list[int], n: int = 4) -> float:
    """Share of repeated n-grams in a token sequence (0 = none, near 1 = a loop)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def collapse(answers: list[tuple[list[int], str]], base: list[tuple[list[int], str]]) -> str | None:
    """Why a version's canary answers (token ids, text) show a collapse, or None. They are read
    against the base model's answers to the same prompts: a small model can loop on a prompt by
    itself, greedily (SmolLM2-135M on int8 weights repeated a phrase within 16 tokens on both
    prompts of a test), and a version that loops no more than its base has not collapsed."""
    def empty(outs):
        return all(not text.strip() for _, text in outs)

    if empty(answers) and not empty(base):
        return "canary: every answer was empty"
    loops = min(repetition(ids) for ids, _ in answers)
    before = min(repetition(ids) for ids, _ in base)
    if loops > LOOPS and loops > before + LOOPS_OVER_BASE:
        return f"canary: answers loop (4-gram repetition {loops:.2f}, the base model's {before:.2f})"
    return None


class Swapper(BackgroundLoop):
    name = "clawrl-swap"

    def __init__(self, cfg: Config, engine, store: Store, metrics: Metrics | None = None):
        self.cfg, self.engine, self.store = cfg, engine, store
        self.metrics = metrics or Metrics()
        self.root = cfg.adapters_dir
        self.seen = 0                       # versions up to this one have been considered
        # Recent decisions, newest last (for status), kept across restarts in adapters/EVENTS.jsonl.
        self.events: list[dict] = adapters.read_events(self.root, 50)
        self.swapped_at: dict[int, float] = {}
        self._lock = asyncio.Lock()

    def _event(self, version: int, event: str, reason: str = "") -> None:
        entry = {"version": version, "event": event, "reason": reason, "at": time.time()}
        self.events = [*self.events[-49:], entry]
        try:
            adapters.append_event(self.root, entry)
        except OSError as e:   # a full disk: the decision stands, only its record is lost
            log.warning("adapter event not recorded (%s)", e)
        log.info("adapter %04d %s%s", version, event, f": {reason}" if reason else "")

    async def _run(self) -> None:
        if not adapters.trainer_running(self.root):   # else the trainer cleans up, when it may
            adapters.clean_temp(self.root)
        await self._restore()
        failing = FailingPass(log, "adapter watch pass")
        while True:
            try:
                for v in adapters.list_versions(self.root):
                    if v > self.seen:
                        async with self._lock:
                            await self._consider(v)
                        self.seen = max(self.seen, v)
                        adapters.write_seen(self.root, self.seen)
                failing.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as e:   # e.g. a server engine restarting, a full disk: do not spin
                await asyncio.sleep(failing.failed(e))
            await asyncio.sleep(POLL_S)

    async def _restore(self) -> None:
        """After a restart, serve what was active (if it is still good); versions written while
        the daemon was down are considered next, like any new one.

        ACTIVE is written when a new version goes live, SEEN once its canary is done. A daemon
        killed in between left an ACTIVE ahead of SEEN (or, on the first swap, no SEEN at all):
        that version has not passed its canary, so it is considered again like a new one, and
        until then the newest good version decided before it serves."""
        versions = adapters.list_versions(self.root)
        active = adapters.read_active(self.root) or 0
        seen = adapters.read_seen(self.root)
        self.seen = max(active - 1, 0) if seen is None else seen
        if active > self.seen:
            good = [v for v in adapters.good_versions(self.root) if v <= self.seen]
            active = good[-1] if good else 0
        if active and active in versions and adapters.rejection(self.root, active) is None:
            try:
                await self._load(active)
            except AdapterRefused as e:
                self._refused(active, e)
                return
            self.engine.activate(active)
            self._event(active, "restored")

    async def _load(self, version: int) -> None:
        if version and version not in self.engine.loaded_adapters:
            path = adapters.version_dir(self.root, version)
            # A version written for another engine (local PEFT weights vs a Tinker pointer) is
            # refused, so it is marked REJECTED once instead of failing every pass.
            serves = self.engine.adapter_kind
            if adapters.kind(path) != serves:
                raise AdapterRefused(f"adapter {version:04d} is a {adapters.kind(path)} version; "
                                     f"this engine serves {serves} versions")
            await asyncio.wrap_future(self.engine.load_adapter(version, path))

    async def _consider(self, version: int) -> None:
        if adapters.rejection(self.root, version) is not None:
            return
        path = adapters.version_dir(self.root, version)
        problem = await asyncio.to_thread(adapters.weights_problem, path)
        meta = adapters.read_meta(self.root, version)
        loss = meta.get("loss")
        if problem is None and isinstance(loss, (int, float)) and not math.isfinite(loss):
            problem = f"training loss was {loss}"
        if problem:
            adapters.reject(self.root, version, problem)
            self.metrics.rejections.labels("guard").inc()
            self._event(version, "rejected", problem)
            return
        # Serve it at once (the swap takes a load, ~0.3 s), then watch it answer: a collapsed
        # version is taken back within the canary's time (~1-2 s on this CPU) and never returns.
        previous = self.engine.adapter_version
        try:
            await self._load(version)
        except AdapterRefused as e:   # a server engine would not take it (e.g. its rank)
            self._refused(version, e)
            return
        await self._switch(version, "activated")
        self.metrics.swapped_in(meta.get("created_at"))
        problem = await self._canary(version)
        if not problem:
            self._event(version, "canary passed")   # the swap is over (tests wait for this)
        else:
            adapters.reject(self.root, version, problem)
            self.metrics.rejections.labels("canary").inc()
            await self._switch(previous, f"restored after rejecting {version:04d}")
            await asyncio.wrap_future(self.engine.unload_adapter(version))
            self._event(version, "rejected", problem)

    def _refused(self, version: int, e: AdapterRefused) -> None:
        adapters.reject(self.root, version, str(e))
        self.metrics.rejections.labels("engine").inc()
        self._event(version, "rejected", str(e))

    async def _switch(self, version: int, event: str) -> None:
        previous = self.engine.adapter_version
        self.engine.activate(version)
        adapters.write_active(self.root, version)
        self.swapped_at[version] = time.time()
        self.metrics.swaps.inc()
        self._event(version, event)
        # Keep the previous version loaded for requests still running on it; free older ones.
        for v in sorted(self.engine.loaded_adapters):
            if v not in (version, previous):
                await asyncio.wrap_future(self.engine.unload_adapter(v))

    async def _canary(self, version: int) -> str | None:
        """Answer a few recent prompts with the new version and with the base model; a collapse
        the base does not show is a reason to reject."""
        prompts = await self.store.recent_prompts(CANARY_PROMPTS, max_tokens=1024)
        if not prompts:
            return None

        async def answer(ids, adapter):    # run together: the engine decodes them in one batch
            gen = self.engine.submit(ids, GenParams(max_tokens=CANARY_TOKENS, temperature=0),
                                     adapter=adapter)
            tokens = [(ev.token_id, ev.text) async for ev in gen]
            return [i for i, _ in tokens], "".join(t for _, t in tokens)

        outs = await asyncio.gather(*(answer(ids, a) for a in (version, 0) for ids in prompts))
        return collapse(outs[:len(prompts)], outs[len(prompts):])

    # -- operator commands ---------------------------------------------------------------------
    async def activate(self, version: int) -> None:
        async with self._lock:
            if version:
                if version not in adapters.list_versions(self.root):
                    raise LookupError(f"adapter version {version} does not exist")
                reason = adapters.rejection(self.root, version)
                if reason:
                    raise LookupError(f"adapter version {version} was rejected ({reason})")
                try:
                    await self._load(version)
                except AdapterRefused as e:
                    self._refused(version, e)
                    raise LookupError(f"adapter version {version} was rejected ({e})") from None
            await self._switch(version, "activated by operator")

    async def rollback(self) -> int:
        """Back to the good version before the active one (or the base); the versions after it
        are marked rejected so neither the server nor the trainer builds on them."""
        async with self._lock:
            current = self.engine.adapter_version
            good = [v for v in adapters.good_versions(self.root) if v < current] if current else []
            target = good[-1] if good else 0
            for v in adapters.list_versions(self.root):
                if v > target and adapters.rejection(self.root, v) is None:
                    adapters.reject(self.root, v, f"rolled back to {target} by operator")
            await self._load(target)
            await self._switch(target, "rolled back to")
            return target

    def status(self) -> dict:
        versions = []
        for v in adapters.list_versions(self.root):
            try:
                meta = adapters.read_meta(self.root, v)
            except (OSError, json.JSONDecodeError):
                meta = {}
            versions.append({"version": v, "parent": meta.get("parent"),
                             "samples": len(meta.get("samples") or meta.get("consolidated") or []),
                             "method": meta.get("method"), "loss": meta.get("loss"),
                             "created_at": meta.get("created_at"),
                             "rejected": adapters.rejection(self.root, v),
                             "loaded": v in self.engine.loaded_adapters})
        return {"active": self.engine.adapter_version, "versions": versions, "events": self.events[-20:],
                "consolidation": adapters.read_consolidation(self.root)}
