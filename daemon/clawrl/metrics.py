"""Prometheus metrics for `GET /metrics`: what the daemon served, judged, trained and swapped.

Each app owns one `Metrics` with its own registry, so several daemons in one process never share
counts. Events are counted where they happen: the middleware below when a response starts, the
proxy when a turn is finalized, the judging loop when a judgment is stored, the swapper when it
activates or rejects a version. What is state rather than an event (samples waiting, training
steps and loss, the active adapter) is read at scrape time from the turn log and the adapters
folder: the trainer is another process, and those files are the truth about it.

This module only counts and reports; it decides nothing and never fails a request.
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from .adapters import versions as adapters
from .turnlog.store import AWAITING_TRAINER, JUDGE_VS_FEEDBACK, connect_sync, judge_agreement
from .types import Attribution

log = logging.getLogger("clawrl.metrics")

# A CPU model: a short answer's first token in tens of milliseconds, a long one in minutes.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
# Version written -> serving: one poll (0.1 s) and a load (~0.3 s), unless the daemon was busy or down.
SWAP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Turn kinds come from a client header; past this many distinct ones the rest count as "other",
# so a misbehaving client cannot grow the registry without bound.
MAX_KINDS = 32


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.state = None           # the DaemonState read at scrape time; see watch()
        self.requests = Counter(
            "clawrl_http_requests", "HTTP responses by route and status (errors included; a "
            "stream counts when its headers are sent)", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(
            "clawrl_prompt_tokens", "Prompt tokens of finalized chat completions", registry=r)
        self.completion_tokens = Counter(
            "clawrl_completion_tokens", "Tokens generated for finalized chat completions", registry=r)
        self.ttft = Histogram(
            "clawrl_time_to_first_token_seconds", "Chat completion: request arrival to the first "
            "generated token", buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram(
            "clawrl_chat_completion_duration_seconds", "Chat completion: request arrival to the "
            "turn being finalized", buckets=LATENCY_BUCKETS, registry=r)
        self.turns = Counter(
            "clawrl_turns", "Finalized turns by type, kind and how they ended "
            "(complete, cancelled, failed)", ["turn_type", "kind", "status"], registry=r)
        self.judge_scores = Counter(
            "clawrl_judge_scores", "Judgments stored, by score (-1, 0, 1)", ["score"], registry=r)
        self.judge_failures = Counter(
            "clawrl_judge_failures", "Judge calls that failed (the turn is retried or given up)",
            registry=r)
        self.swap_latency = Histogram(
            "clawrl_adapter_swap_latency_seconds", "A new adapter version: written (meta.json "
            "created_at) to serving", buckets=SWAP_BUCKETS, registry=r)
        self.swaps = Counter(
            "clawrl_adapter_swaps", "Adapter activations: new versions, operator commands, "
            "rollbacks and restores after a rejection", registry=r)
        self.rejections = Counter(
            "clawrl_adapter_rejections", "Adapter versions rejected, by the check that failed "
            "(guard: weights or loss; canary: collapsed answers)", ["check"], registry=r)
        self._kinds: set[str] = set()
        self._newest: tuple[int, float | None] = (0, None)   # (version, loss): meta.json never changes
        r.register(self)

    def watch(self, state) -> None:
        """Report this daemon's state (engine, turn log, adapters folder) at scrape time."""
        self.state = state

    # -- events --------------------------------------------------------------------------------
    def turn_done(self, att: Attribution, status: str, prompt_tokens: int, completion_tokens: int,
                  ttft_s: float | None, total_s: float) -> None:
        kind = att.kind
        if kind not in self._kinds:
            if len(self._kinds) >= MAX_KINDS:
                kind = "other"
            else:
                self._kinds.add(kind)
        self.turns.labels(att.turn_type, kind, status).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.latency.observe(total_s)

    def judged(self, score: int) -> None:
        self.judge_scores.labels(str(int(score))).inc()

    def swapped_in(self, created_at) -> None:
        """A new version went live; `created_at` is its meta.json time (absent in old versions)."""
        if isinstance(created_at, (int, float)):
            self.swap_latency.observe(max(0.0, time.time() - created_at))

    # -- scrape-time state (runs in a worker thread: generate_latest is sent there) -------------
    def collect(self):
        state = self.state
        if state is None:
            return
        yield GaugeMetricFamily("clawrl_adapter_active_version",
                                "Adapter version new requests are served by (0 = the base model)",
                                value=state.engine.adapter_version)
        read = self._from_turn_log(state.cfg.db_path)
        if read is not None:
            waiting, agreement = read
            g = GaugeMetricFamily("clawrl_samples_waiting", "Turns waiting: 'judge' = next state "
                                  "arrived, not judged yet; 'train' = judged or rated, not trained "
                                  "yet", labels=["stage"])
            g.add_metric(["judge"], waiting[0])
            g.add_metric(["train"], waiting[1])
            yield g
            g = GaugeMetricFamily("clawrl_judge_vs_feedback_turns",
                                  "Turns both judged and rated by explicit feedback, by how the "
                                  "judge's reading compares: agree, wrong_sign, abstain (read 0)",
                                  labels=["reading"])
            for key in ("agree", "wrong_sign", "abstain"):
                g.add_metric([key], agreement[key])
            yield g
        steps, loss = self._training(state.cfg.adapters_dir)
        yield CounterMetricFamily("clawrl_training_steps", "Training steps completed (each writes "
                                  "one adapter version; the newest version's number)", value=steps)
        if loss is not None:
            yield GaugeMetricFamily("clawrl_training_last_loss",
                                    "Training loss of the newest adapter version", value=loss)

    @staticmethod
    def _from_turn_log(path) -> tuple[tuple[int, int], dict] | None:
        """The samples waiting (judge, train) and the judge's agreement with explicit feedback, in
        one read; None when the log is missing, not migrated yet, or busy."""
        if not path.exists():
            return None
        try:
            db = connect_sync(path)    # its own reader: never queues behind the daemon's writes
            try:
                waiting = db.execute(
                    "SELECT (SELECT count(*) FROM turns WHERE judge_status IS NULL AND"
                    " next_state_at IS NOT NULL AND status='complete' AND trainable=1),"
                    f" (SELECT count(*) FROM turns WHERE {AWAITING_TRAINER})").fetchone()
                return waiting, judge_agreement(db.execute(JUDGE_VS_FEEDBACK).fetchone())
            finally:
                db.close()
        except sqlite3.Error as e:     # leave these gauges out this time
            log.debug("turn log not read for metrics: %s", e)
            return None

    def _training(self, root) -> tuple[int, float | None]:
        version = adapters.newest(root) or 0
        if version and version != self._newest[0]:
            try:
                loss = adapters.read_meta(root, version).get("loss")
            except (OSError, ValueError):
                loss = None
            self._newest = (version, float(loss) if isinstance(loss, (int, float)) else None)
        return version, self._newest[1] if version else None


async def scrape(request: Request) -> Response:
    """GET /metrics: the Prometheus text format."""
    metrics: Metrics = request.app.state.daemon.metrics
    body = await asyncio.to_thread(generate_latest, metrics.registry)
    return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _endpoint(scope) -> str:
    """The route template (bounded label values); a request refused before routing (401) is
    matched here."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in scope["app"].routes if r.matches(scope)[0] is not Match.NONE), None)
    return getattr(route, "path", "unmatched")


class MetricsMiddleware:
    """Counts every HTTP response by route and status when it starts."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counted(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.requests.labels(_endpoint(scope), str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:   # Starlette's outermost error middleware answers it with a 500
                self.metrics.requests.labels(_endpoint(scope), "500").inc()
            raise
