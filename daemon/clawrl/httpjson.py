"""Reading a JSON request body within a size limit, with OpenAI-shaped errors."""
from __future__ import annotations

import json

from starlette.requests import Request

from .errors import RequestError


async def read_json(request: Request, limit: int):
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body is larger than {limit} bytes", status=413,
                           code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body is larger than {limit} bytes", status=413,
                               code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
