"""Reading a JSON request body within a size limit, with OpenAI-shaped errors.

Beyond well-formed JSON, a body must be nested at most MAX_DEPTH deep and hold no lone surrogate
(`"\\ud800"` is valid JSON but no valid text). Either would otherwise fail far from here, as a
500: deep nesting in the chat template or the turn log's encoder, a surrogate wherever the string
is encoded (SQLite, the tokenizer, the response).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

from starlette.requests import Request

from ..errors import RequestError

MAX_DEPTH = 64
THREAD_ABOVE = 256 * 1024   # bodies this large are parsed off the event loop


async def read_json(request: Request, limit: int):
    declared = request.headers.get("content-length")
    # Only the leading digits matter, and int() refuses numbers of thousands of digits.
    if declared and declared.isascii() and declared.isdigit() and int(declared[:20]) > limit:
        raise RequestError(f"request body is larger than {limit} bytes", status=413,
                           code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body is larger than {limit} bytes", status=413,
                               code="request_too_large")
        chunks.append(chunk)
    data = b"".join(chunks)
    return await asyncio.to_thread(parse, data) if size > THREAD_ABOVE else parse(data)


def parse(data: bytes):
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    _check(value)
    return value


def _too_deep() -> RequestError:
    return RequestError(f"the request body is nested more than {MAX_DEPTH} levels deep",
                        code="invalid_json")


def _check_text(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("the request body holds a lone UTF-16 surrogate escape (like "
                               "\\ud800), which is not text; send valid Unicode",
                               code="invalid_json") from None


def _check(value) -> None:
    """Depth and text of every value, without recursion (the depth is what is in question)."""
    if isinstance(value, str):
        _check_text(value)
    stack = [(value, 1)] if isinstance(value, (list, dict)) else []
    while stack:
        container, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        items: Iterable[object]
        if isinstance(container, dict):
            for key in container:
                _check_text(key)
            items = container.values()
        else:
            items = container
        for item in items:
            if isinstance(item, str):
                _check_text(item)
            elif isinstance(item, (list, dict)):
                stack.append((item, depth + 1))
