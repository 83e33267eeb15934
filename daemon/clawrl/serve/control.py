"""The learning loop's controls over HTTP: session ends, explicit feedback, adapter versions.

Kept apart from serve/proxy.py, which owns serving; both speak the same OpenAI-shaped errors.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import RequestError
from .httpjson import read_json


async def end_session(request: Request) -> Response:
    state = request.app.state.daemon
    session_id = request.path_params["session_id"]
    if await state.store.end_session(session_id) is None:
        raise RequestError(f"no session {session_id!r} has been recorded", status=404,
                           param="session_id", code="session_not_found")
    return JSONResponse({"session_id": session_id, "ended": True})


async def feedback(request: Request) -> Response:
    """Explicit feedback: overrides the judge's vote; a comment becomes the hint."""
    state = request.app.state.daemon
    body = await read_json(request, 64 * 1024)
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", param="body", code="invalid_type")
    session_id, turn_id = body.get("session_id"), body.get("turn_id")
    reward, comment = body.get("reward"), body.get("comment")
    if not isinstance(session_id, str) or not session_id:
        raise RequestError("'session_id' (a string) is required", param="session_id", code="invalid_value")
    if turn_id is not None and (isinstance(turn_id, bool) or not isinstance(turn_id, int)):
        raise RequestError("'turn_id' must be an integer", param="turn_id", code="invalid_type")
    if isinstance(reward, bool) or reward not in (-1, 0, 1):
        raise RequestError("'reward' must be -1, 0 or 1", param="reward", code="invalid_value")
    if comment is not None and not isinstance(comment, str):
        raise RequestError("'comment' must be a string", param="comment", code="invalid_type")
    # As for chat requests: the header wins, both must be short strings (SQLite cannot bind an
    # object: that was a 500).
    header, user = request.headers.get("x-user-id"), body.get("user_id")
    for v in (header, user):
        if v is not None and (not isinstance(v, str) or len(v) > 256):
            raise RequestError("'user_id' must be a string of at most 256 characters",
                               param="user_id", code="invalid_value")
    user = header or user
    found = await state.store.record_feedback(session_id, turn_id, int(reward),
                                              (comment or "").strip()[:4000] or None, user)
    if found is None:
        which = f"turn {turn_id} in session {session_id!r}" if turn_id else f"a turn in session {session_id!r}"
        raise RequestError(f"no {which} has been recorded", status=404, param="turn_id",
                           code="turn_not_found")
    return JSONResponse({"session_id": session_id, "turn_id": found, "reward": int(reward)})


async def adapters_list(request: Request) -> Response:
    state = request.app.state.daemon
    return JSONResponse({**state.swapper.status(),
                         "trainer": state.trainer.status() if state.trainer else None})


async def adapters_activate(request: Request) -> Response:
    state = request.app.state.daemon
    body = await read_json(request, 4096)
    version = body.get("version") if isinstance(body, dict) else None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise RequestError("'version' must be an adapter version number (0 = the base model)",
                           param="version", code="invalid_value")
    try:
        await state.swapper.activate(version)
    except LookupError as e:
        raise RequestError(str(e), status=404, param="version", code="adapter_not_found") from None
    return JSONResponse({"active": version})


async def adapters_rollback(request: Request) -> Response:
    state = request.app.state.daemon
    return JSONResponse({"active": await state.swapper.rollback()})


def routes() -> list[Route]:
    return [
        Route("/v1/sessions/{session_id}/end", end_session, methods=["POST"]),
        Route("/v1/feedback", feedback, methods=["POST"]),
        Route("/v1/adapters", adapters_list, methods=["GET"]),
        Route("/v1/adapters/activate", adapters_activate, methods=["POST"]),
        Route("/v1/adapters/rollback", adapters_rollback, methods=["POST"]),
    ]
