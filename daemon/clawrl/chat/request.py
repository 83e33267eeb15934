"""Validate an OpenAI chat-completions body and read who it is from (attribution).

Every rejection is a `RequestError` naming the offending parameter, answered as a 400 with
OpenAI's error shape. Fields clawrl does not use (frequency_penalty, user, metadata, ...) are
accepted and ignored, as OpenAI-compatible servers do.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .format import content_text
from ..errors import RequestError
from ..types import TURN_TYPES, Attribution

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None
    logprobs: bool
    model: str | None


def _bad(msg: str, param: str, code: str | None = None) -> RequestError:
    return RequestError(msg, param=param, code=code)


def _number(body: dict, key: str, default, lo: float, hi: float, integer: bool = False):
    v = body.get(key)
    if v is None:
        return default
    if integer and isinstance(v, float) and v.is_integer():
        v = int(v)   # 256.0 is an integer to JSON (and to JSON Schema); 256.5 is not
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise _bad(f"'{key}' must be {kind}, got {json.dumps(v)[:40]}", key, "invalid_type")
    if not lo <= v <= hi:
        raise _bad(f"'{key}' must be between {lo} and {hi}, got {v}", key, "invalid_value")
    return v


def _boolean(d: dict, key: str, param: str) -> bool:
    v = d.get(key)
    if v is not None and not isinstance(v, bool):
        raise _bad(f"'{param}' must be a boolean, got {json.dumps(v)[:40]}", param, "invalid_type")
    return bool(v)


def _check_content(content, i: int, role: str, has_calls: bool) -> None:
    where = f"messages[{i}].content"
    if content is None:
        if role == "assistant" and has_calls:
            return
        raise _bad(f"{where} is required for role '{role}'", where, "invalid_value")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or an array of content parts", where, "invalid_type")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _bad(f"{where}[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                       f"supported by this model, got {kind!r}", f"{where}[{j}]", "invalid_value")


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, list):
        raise _bad("'messages' must be an array of message objects", "messages", "invalid_type")
    if not messages:
        raise _bad("'messages' must contain at least one message", "messages", "invalid_value")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {json.dumps(role)[:40]}",
                       f"messages[{i}].role", "invalid_value")
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict)
                    and isinstance(c["function"].get("name"), str) for c in calls):
                raise _bad(f"messages[{i}].tool_calls must be a list of "
                           "{id, type: 'function', function: {name, arguments}} on an assistant message",
                           f"messages[{i}].tool_calls", "invalid_value")
        _check_content(m.get("content"), i, role, bool(calls))
    return messages


def _check_tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("'tools' must be an array", "tools", "invalid_type")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                       f"tools[{i}]", "invalid_value")
    return tools or None


def parse_chat(body) -> ChatRequest:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "body", "invalid_type")
    messages = _check_messages(body.get("messages"))
    tools = _check_tools(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = None
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise _bad("only n = 1 is supported: one sample per request", "n", "invalid_value")
    # Both are checked; the newer name wins when both are given.
    max_tokens = _number(body, "max_tokens", None, 1, 2**31, integer=True)
    newer = _number(body, "max_completion_tokens", None, 1, 2**31, integer=True)
    max_tokens = newer if newer is not None else max_tokens
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop)):
        raise _bad("'stop' must be a string or an array of at most 4 strings", "stop", "invalid_value")
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    opts = body.get("stream_options")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("'model' must be a string", "model", "invalid_type")
    return ChatRequest(
        messages=messages, tools=tools, stream=stream,
        include_usage=_boolean(opts, "include_usage", "stream_options.include_usage"),
        max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
        top_p=float(_number(body, "top_p", 1.0, 0.0, 1.0)),
        stop=stop, seed=_number(body, "seed", None, -2**63, 2**64 - 1, integer=True),
        logprobs=_boolean(body, "logprobs", "logprobs"), model=model)


# -- attribution -----------------------------------------------------------------------------------

def _flag(v, name: str) -> bool:
    """A yes/no header or body field: true, 1, "1", "true", "yes", "on" mean yes."""
    if v is None:
        return False
    if not isinstance(v, (bool, int, str)):
        raise _bad(f"'{name}' must be a boolean", name, "invalid_type")
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def derived_session_id(messages: list[dict]) -> str:
    """A stable id for a conversation sent without a session header: a hash of its opening
    messages (everything up to and including the first user message)."""
    opening = []
    for m in messages:
        opening.append([m.get("role"), content_text(m.get("content"))])
        if m.get("role") == "user":
            break
    return "auto-" + hashlib.sha256(json.dumps(opening).encode()).hexdigest()[:20]


def attribute(headers, body: dict, messages: list[dict]) -> Attribution:
    """Headers first, then body fields of the same name."""
    def get(header: str, field: str):
        v = headers.get(header)
        return v if v not in (None, "") else body.get(field)

    def text(name: str, v) -> None:
        if v is not None and (not isinstance(v, str) or len(v) > 256):
            raise _bad(f"'{name}' must be a string of at most 256 characters", name, "invalid_value")

    # A body field of the wrong type is a malformed request even where a header overrides it.
    for name in ("session_id", "turn_kind", "user_id"):
        text(name, body.get(name))
    for name in ("no_train", "session_done"):
        _flag(body.get(name), name)
    session = get("x-session-id", "session_id")
    turn_type = get("x-turn-type", "turn_type")
    turn_type = "main" if turn_type in (None, "") else turn_type
    for v in (turn_type, body.get("turn_type")):
        if v not in (None, "", *TURN_TYPES):
            raise _bad(f"X-Turn-Type must be 'main' or 'side', got {str(v)[:40]!r}", "turn_type",
                       "invalid_value")
    kind = get("x-turn-kind", "turn_kind")
    kind = ("main" if turn_type == "main" else "side") if kind in (None, "") else kind
    user = get("x-user-id", "user_id")
    for name, v in (("session_id", session), ("turn_kind", kind), ("user_id", user)):
        text(name, v)
    return Attribution(
        session_id=session or derived_session_id(messages),
        turn_type=turn_type, kind=kind, user_id=user,
        no_train=_flag(get("x-clawrl-no-train", "no_train"), "no_train"),
        session_done=_flag(get("x-session-done", "session_done"), "session_done"),
        derived_session=not session)
