"""The OpenAI-compatible HTTP API (Starlette): chat completions with real streaming, models,
health and readiness, and session ends.

A chat request is validated, attributed, rendered to prompt tokens and submitted to the engine;
its turn row is written while the engine prefills. Each token the engine yields is sent on as it
comes (one SSE chunk per token) and kept on the side; the turn is completed when the stream ends,
whether it ended normally, at a stop string, by a client disconnect or by an error.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import control, dashboard, openapi, skills_api
from .access import ApiKeyMiddleware
from ..chat.request import ChatRequest, attribute, parse_chat
from ..config import Config
from ..engines.base import Engine, Generation, token_budget
from ..errors import RequestError
from .httpjson import read_json
from ..metrics import Metrics, MetricsMiddleware, scrape
from ..turnlog.store import Store
from ..chat.reasoning import ReasoningSplitter
from ..chat.toolcalls import OutputParser
from ..types import Attribution, Finish, GenParams

if TYPE_CHECKING:   # the stages the server starts; serving itself does not import them
    from ..adapters.swap import Swapper
    from ..judge.loop import Judging
    from ..learn.supervisor import TrainerSupervisor
    from ..skills.bridge import SkillBridge

log = logging.getLogger("clawrl.proxy")


@dataclass
class DaemonState:
    """What the handlers share: set up by the server, read by every request."""
    cfg: Config
    engine: Engine
    store: Store | None = None
    judging: Judging | None = None     # once started
    swapper: Swapper | None = None
    trainer: TrainerSupervisor | None = None
    skills: SkillBridge | None = None  # when skills.enabled
    ready: bool = False
    load_error: str | None = None
    started: float = field(default_factory=time.time)
    metrics: Metrics = field(default_factory=Metrics)


def error_response(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# -- request plumbing --------------------------------------------------------------------------------

class _Turn:
    """One response being produced: what the client has been sent, kept for the turn log."""

    def __init__(self, state: DaemonState, req: ChatRequest, att: Attribution, gen: Generation,
                 arrived: float):
        self.state, self.req, self.att, self.gen, self.arrived = state, req, att, gen, arrived
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.thinking = ReasoningSplitter()
        self.parser = OutputParser(req.stop, parse_tools=bool(req.tools))
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.token_texts: list[str] = []
        self.first_token: float | None = None
        self.turn_id: int | None = None
        self.finish: Finish | None = None
        self.tool_calls: list[dict] = []
        self.streaming = False
        self.recorded = False

    async def deltas(self):
        """("reasoning" | "content", text) deltas as tokens arrive; ends at EOS, the length limit
        or a stop string (looked for in the answer, not in the thinking)."""
        async for ev in self.gen:
            if self.first_token is None:
                self.first_token = time.perf_counter()
            self.token_ids.append(ev.token_id)
            self.logprobs.append(ev.logprob)
            self.token_texts.append(ev.text)
            thought, answer = self.thinking.feed(ev.text)
            if thought:
                yield "reasoning", thought
            out = self.parser.feed(answer)
            if out:
                yield "content", out
            if self.parser.stopped:
                self.gen.cancel()
                break
        self.finish = await self.gen.wait()
        thought, answer = self.thinking.finish()
        if thought:
            yield "reasoning", thought
        out = self.parser.feed(answer)
        if out:
            yield "content", out
        rest, self.tool_calls = self.parser.finish()
        if rest:
            yield "content", rest

    @property
    def finish_reason(self) -> str:
        if self.tool_calls:
            return "tool_calls"
        if self.parser.stopped:
            return "stop"
        return self.finish.reason if self.finish else "stop"

    def usage(self) -> dict:
        prompt = len(self.gen.prompt_ids)
        cached = self.finish.cached_tokens if self.finish else 0
        return {"prompt_tokens": prompt, "completion_tokens": len(self.token_ids),
                "total_tokens": prompt + len(self.token_ids),
                "prompt_tokens_details": {"cached_tokens": cached}}

    def logprobs_block(self) -> dict | None:
        if not self.req.logprobs:
            return None
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                            for t, lp in zip(self.token_texts, self.logprobs)]}

    async def record(self, status: str, error: str | None = None) -> None:
        """Complete the turn row, once. Shielded: a client that disconnects cannot cut it short."""
        if self.recorded:
            return
        self.recorded = True
        now = time.perf_counter()
        ttft = self.first_token - self.arrived if self.first_token else None
        self.state.metrics.turn_done(self.att, status, len(self.gen.prompt_ids), len(self.token_ids),
                                     ttft, now - self.arrived)
        if self.turn_id is None or self.state.store is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.state.store.finish_turn(
                    self.turn_id, status=status, text=self.parser.content or self.parser.text,
                    reasoning=self.thinking.reasoning or None,
                    token_ids=self.token_ids, logprobs=self.logprobs, tool_calls=self.tool_calls,
                    finish=self.finish, error=error,
                    ttft_ms=ttft * 1000 if ttft is not None else None,
                    total_ms=(now - self.arrived) * 1000)
                if self.att.session_done:
                    await self.state.store.end_session(self.att.session_id)
            except Exception:
                log.exception("could not complete turn %s in the turn log", self.turn_id)

    def chunk(self, delta: dict, finish_reason: str | None = None, logprobs=None) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.state.engine.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                             "finish_reason": finish_reason}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(turn: _Turn):
    status, error = "cancelled", None
    turn.streaming = True
    try:
        yield turn.chunk({"role": "assistant", "content": ""})
        async for kind, text in turn.deltas():
            yield turn.chunk({"reasoning_content" if kind == "reasoning" else "content": text})
        for i, call in enumerate(turn.tool_calls):
            yield turn.chunk({"tool_calls": [{"index": i, **call}]})
        yield turn.chunk({}, turn.finish_reason, turn.logprobs_block())
        if turn.req.include_usage:
            body = {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created,
                    "model": turn.state.engine.model_id, "choices": [], "usage": turn.usage()}
            yield f"data: {json.dumps(body)}\n\n"
        status = "complete"
        # Recorded before [DONE]: a client may send its next request (this turn's next state)
        # the moment it reads [DONE], and only complete turns are linked to one.
        await turn.record(status)
        yield "data: [DONE]\n\n"
    except RequestError as e:  # a server engine went away mid-stream (502) or is down (503)
        log.warning("generation failed: %s", e.message)
        status, error = "failed", repr(e)
        yield f"data: {json.dumps({'error': {**e.body()['error'], 'status': e.status}})}\n\n"
    except Exception as e:  # the engine failed mid-stream: tell the client in-band
        log.exception("generation failed")
        status, error = "failed", repr(e)
        body = {"message": f"generation failed: {e}", "type": "server_error", "param": None,
                "code": "engine_error"}
        yield f"data: {json.dumps({'error': body})}\n\n"
    finally:
        turn.gen.cancel()
        await turn.record(status, error)


class _TurnStream(StreamingResponse):
    """SSE response that still closes its turn if the client is gone before streaming starts
    (then `_stream`'s own cleanup never runs)."""

    def __init__(self, turn: _Turn, headers: dict):
        super().__init__(_stream(turn), media_type="text/event-stream",
                         headers={**headers, "Cache-Control": "no-cache"})
        self.turn = turn

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.turn.streaming:
                self.turn.gen.cancel()
                await self.turn.record("cancelled")


async def _complete(turn: _Turn) -> JSONResponse:
    status, error = "cancelled", None
    try:
        async for _ in turn.deltas():
            pass
        status = "complete"
    except RequestError as e:   # a server engine dropped the request (502) or is down (503)
        log.warning("generation failed: %s", e.message)
        status, error = "failed", repr(e)
        return error_response(e)
    except Exception as e:
        log.exception("generation failed")
        status, error = "failed", repr(e)
        return JSONResponse({"error": {"message": f"generation failed: {e}", "type": "server_error",
                                       "param": None, "code": "engine_error"}}, status_code=500)
    finally:
        turn.gen.cancel()
        await turn.record(status, error)
    message: dict[str, object] = {"role": "assistant", "content": turn.parser.content}
    if turn.thinking.reasoning:
        message["reasoning_content"] = turn.thinking.reasoning
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
        message["content"] = turn.parser.content or None
    return JSONResponse({
        "id": turn.id, "object": "chat.completion", "created": turn.created,
        "model": turn.state.engine.model_id,
        "choices": [{"index": 0, "message": message, "logprobs": turn.logprobs_block(),
                     "finish_reason": turn.finish_reason}],
        "usage": turn.usage()}, headers={"X-Clawrl-Turn-Id": str(turn.turn_id or "")})


# -- handlers ----------------------------------------------------------------------------------------

def _refuse_if_queue_full(state: DaemonState) -> None:
    if state.engine.queue_depth() >= state.cfg.engine.max_queue:
        raise RequestError("too many requests are waiting; retry shortly", status=503,
                           type="server_error", code="queue_full", headers={"Retry-After": "1"})


async def chat_completions(request: Request) -> Response:
    state: DaemonState = request.app.state.daemon
    arrived = time.perf_counter()
    body = await read_json(request, state.cfg.server.max_body_bytes)
    req = parse_chat(body)
    att = attribute(request.headers, body, req.messages)
    if not state.ready:
        raise RequestError("the model is still loading; retry shortly", status=503,
                           type="server_error", code="model_loading", headers={"Retry-After": "2"})
    engine = state.engine
    _refuse_if_queue_full(state)   # before the work of rendering, when it is full already
    for param in ("max_tokens", "max_completion_tokens"):
        # A budget too large for the prompt is cut to fit (OpenClaw asks for its configured
        # maxTokens whatever the prompt); one that no prompt could fit is the caller's mistake.
        if (asked := body.get(param)) is not None and asked > engine.context_length:
            raise RequestError(f"'{param}' is {asked}, more than this model's context length of "
                               f"{engine.context_length} tokens", param=param, code="invalid_value")
    prompt_ids = await asyncio.to_thread(engine.render, req.messages, req.tools)
    # And again with no await before the submit: a burst that passed the first check together,
    # while its requests were being rendered, must not all join the queue.
    _refuse_if_queue_full(state)
    asked = req.max_tokens or state.cfg.model.default_max_tokens
    params = GenParams(max_tokens=token_budget(engine, len(prompt_ids), asked),
                       temperature=req.temperature, top_p=req.top_p, stop=req.stop, seed=req.seed)
    gen = engine.submit(prompt_ids, params)
    turn = _Turn(state, req, att, gen, arrived)
    record = {"messages": req.messages, "tools": req.tools,
              "params": {"max_tokens": params.max_tokens, "temperature": params.temperature,
                         "top_p": params.top_p, "stop": params.stop, "seed": params.seed}}
    try:
        # Written while the engine prefills, and before any byte reaches the client.
        assert state.store is not None   # the lifespan opens it before serving
        turn.turn_id = await state.store.begin_turn(
            att, record, prompt_ids, engine.model_id, engine.adapter_version,
            skills=state.skills.in_force() if state.skills else None)
    except asyncio.CancelledError:   # the client left before we answered: stop the engine
        gen.cancel()
        raise
    except Exception:  # serving goes on without the record; the log says why
        log.exception("could not record turn for session %s", att.session_id)
    if state.judging is not None and att.turn_type == "main":
        state.judging.wake.set()       # this request may carry the previous turn's next state
    headers = {"X-Clawrl-Turn-Id": str(turn.turn_id or ""), "X-Session-Id": att.session_id}
    if req.stream:
        return _TurnStream(turn, headers)
    response = await _complete(turn)
    response.headers.update(headers)
    return response


async def models(request: Request) -> Response:
    state: DaemonState = request.app.state.daemon
    return JSONResponse({"object": "list", "data": [{
        "id": state.engine.model_id, "object": "model", "created": int(state.started),
        "owned_by": "clawrl", "context_length": state.engine.context_length,
        "max_model_len": state.engine.context_length}]})


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    state: DaemonState = request.app.state.daemon
    if state.ready:
        assert state.store is not None   # the lifespan opens it before the model loads
        counts = await state.store.counts()
        trainer = state.trainer.status()["state"] if state.trainer else "off"
        return JSONResponse({"status": "ready", "model": state.engine.model_id,
                             "adapter_version": state.engine.adapter_version,
                             "context_length": state.engine.context_length,
                             "queue": state.engine.queue_depth(), "trainer": trainer,
                             "engine": state.engine.status(), **counts})
    status = "failed" if state.load_error else "loading"
    return JSONResponse({"status": status, "error": state.load_error}, status_code=503)


# -- errors and auth ---------------------------------------------------------------------------------

async def _request_error(request: Request, exc: RequestError) -> Response:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(RequestError(f"{request.method} {request.url.path}: {exc.detail}",
                                       status=exc.status_code, code=kind))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse({"error": {"message": "internal error", "type": "server_error",
                                   "param": None, "code": None}}, status_code=500)


def build_app(state: DaemonState, lifespan=None) -> Starlette:
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            *control.routes(),
            *dashboard.routes(),
            *skills_api.routes(),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/metrics", scrape, methods=["GET"]),
            Route("/openapi.json", openapi.serve, methods=["GET"]),
        ],
        # Outermost first: responses refused for a missing API key are counted too.
        middleware=[Middleware(MetricsMiddleware, metrics=state.metrics),
                    Middleware(ApiKeyMiddleware, api_key=state.cfg.server.api_key)],
        # starlette types every handler as taking any Exception; each gets only its key's type.
        exception_handlers={RequestError: _request_error, HTTPException: _http_error,  # type: ignore[dict-item]
                            Exception: _server_error},
        lifespan=lifespan)
    app.state.daemon = state
    state.metrics.watch(state)
    return app

