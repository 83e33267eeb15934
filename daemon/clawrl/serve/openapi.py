"""The OpenAPI 3.1 description of the daemon's HTTP API, served at `GET /openapi.json`.

Written by hand from what the handlers accept (chat/request.py, serve/control.py, serve/dashboard.py,
serve/skills_api.py), not generated from them: the handlers validate bodies themselves, and a document
that says what they promise is what clients and the fuzzer (tests/test_fuzz.py) need. A test keeps
it complete: every route of the app must be described here. Limits that depend on the recipe
(the context length) are filled in from the running daemon's config.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import __version__

JSON = "application/json"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str = "") -> dict:
    return {"description": description or "OK", "content": {JSON: {"schema": schema}}}


def _body(schema: dict, required: bool = True) -> dict:
    return {"required": required, "content": {JSON: {"schema": schema}}}


ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
ERRORS = {
    "4XX": _json(_ref("Error"), "The caller's mistake (bad body, missing key, no such thing, "
                 "body too large), in OpenAI's error shape"),
    "503": _json(_ref("Error"), "Not ready yet or the queue is full: retry after Retry-After"),
}
OPEN_OBJECT = {"type": "object", "additionalProperties": True}


def _limit(most: int) -> dict:
    return {"name": "limit", "in": "query", "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": most}}


def _path(name: str, description: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": schema or {"type": "string", "minLength": 1}}


# skill_bridge's rule: 1-64 lowercase letters, digits and single inner hyphens.
SKILL_NAME = {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$", "maxLength": 64}


ATTRIBUTION_HEADERS = [
    {"name": name, "in": "header", "required": False, "description": text, "schema": schema}
    for name, text, schema in (
        ("X-Session-Id", "the conversation this turn belongs to (else derived from its opening)",
         {"type": "string", "maxLength": 256}),
        ("X-Turn-Type", "main (user-driven, trainable) or side; empty = main",
         {"type": "string", "enum": ["main", "side", ""]}),
        ("X-Turn-Kind", "main, heartbeat, memory, cron, compaction, subagent, announce, ...",
         {"type": "string", "maxLength": 256}),
        ("X-User-Id", "whose turn and feedback this is", {"type": "string", "maxLength": 256}),
        ("X-Session-Done", "1: the session ends with this turn", {"type": "string"}),
        ("X-Clawrl-No-Train", "1: serve and record, never train", {"type": "string"}),
    )
]


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def schemas(context_length: int) -> dict:
    # Only what the daemon checks is constrained; fields it passes through or ignores are left
    # open (the fuzzer's negative cases hold the daemon to every constraint written here).
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    tool_call = {"type": "object", "required": ["function"],
                 "description": "{id, type: 'function', function: {name, arguments: JSON text}}",
                 "properties": {"function": {"type": "object", "required": ["name"],
                                             "properties": {"name": {"type": "string"}}}}}
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": text_part}]}
    # Only an assistant message may carry tool calls, and then may leave its content null.
    message = {"anyOf": [
        {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"enum": ["system", "developer", "user", "tool"]}, "content": content,
            "tool_calls": {"type": "null"}}},
        {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"const": "assistant"}, "content": content, "tool_calls": {"type": "null"}}},
        {"type": "object", "required": ["role", "tool_calls"], "properties": {
            "role": {"const": "assistant"}, "content": _nullable(content),
            "tool_calls": {"type": "array", "items": tool_call}}}]}
    tool = {"type": "object", "required": ["function"],
            "description": "{type: 'function', function: {name, description, parameters}}",
            "properties": {"function": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "minLength": 1}}}}}
    tokens = {"type": "integer", "minimum": 1, "maximum": context_length,
              "description": "completion budget; cut to what the context leaves after the prompt"}
    attribution = {"type": "string", "maxLength": 256}
    flag = {"type": ["boolean", "integer", "string"], "description": "true, 1, \"yes\", \"on\""}
    # null is the same as leaving a field out, as with OpenAI.
    optional: dict[str, dict] = {
        "model": {"type": "string"},
        "tools": {"type": "array", "items": tool},
        "n": {"const": 1},
        "max_tokens": tokens, "max_completion_tokens": tokens,
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "stop": {"anyOf": [{"type": "string"},
                           {"type": "array", "maxItems": 4, "items": {"type": "string"}}]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {
            "include_usage": _nullable({"type": "boolean"})}},
        "seed": {"type": "integer", "minimum": -2**63, "maximum": 2**64 - 1},
        "logprobs": {"type": "boolean"},
        # The attribution headers' body twins, for clients that cannot set headers.
        "session_id": attribution, "turn_kind": attribution, "user_id": attribution,
        "turn_type": {"enum": ["main", "side", ""]},
        "session_done": flag, "no_train": flag}
    chat = {"type": "object", "required": ["messages"], "properties": {
        "messages": {"type": "array", "minItems": 1, "items": message},
        **{key: _nullable(schema) for key, schema in optional.items()},
        "tool_choice": {"description": "\"none\" drops the tools; anything else is ignored"}}}
    completion = {"type": "object", "required": ["id", "object", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "index": {"type": "integer"}, "finish_reason": {"type": "string"},
            "message": {"type": "object", "properties": {
                "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                "reasoning_content": {"type": "string",
                                      "description": "a reasoning model's <think> part"},
                "tool_calls": {"type": "array", "items": tool_call}}}}}},
        "usage": {"type": "object", "properties": {
            "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"}}}}}
    feedback = {"type": "object", "required": ["session_id", "reward"], "properties": {
        "session_id": {"type": "string", "minLength": 1},
        "turn_id": _nullable({"type": "integer",
                              "description": "default: the session's last main turn"}),
        "reward": {"enum": [-1, 0, 1]},
        "comment": _nullable({"type": "string",
                              "description": "becomes the hint (first 4000 characters)"}),
        "user_id": _nullable({"type": "string", "maxLength": 256})}}
    skill_write = {"type": "object", "properties": {
        "name": {**SKILL_NAME, "description": "the skill's folder name"},
        "description": {"type": "string"}, "instructions": {"type": "string"},
        "files": {"type": "object", "additionalProperties": {"type": "string"},
                  "description": "relative path -> text content, inside the skill's folder"}}}
    return {"Error": ERROR, "ChatRequest": chat, "ChatCompletion": completion,
            "Feedback": feedback, "SkillWrite": skill_write,
            "Activate": {"type": "object", "required": ["version"], "properties": {
                "version": {"type": "integer", "minimum": 0,
                            "description": "adapter version; 0 = the base model"}}}}


def _op(summary: str, responses: dict, **more) -> dict:
    return {"summary": summary, "responses": {**ERRORS, **responses}, **more}


def paths() -> dict:
    active = _json({"type": "object", "required": ["active"],
                    "properties": {"active": {"type": "integer"}}})
    text = {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}
    return {
        "/v1/chat/completions": {"post": _op(
            "OpenAI chat completion; `stream: true` answers server-sent events, one per token",
            {"502": _json(_ref("Error"), "a server engine (SGLang, vLLM) failed the request"),
             "200": {"description": "the completion (or its event stream)", "content": {
                JSON: {"schema": _ref("ChatCompletion")},
                # Each event: a chat.completion.chunk as JSON, then the text [DONE].
                "text/event-stream": {"schema": {"type": "object", "required": ["data"],
                                                 "properties": {"data": {"type": "string"}}}}}}},
            parameters=ATTRIBUTION_HEADERS, requestBody=_body(_ref("ChatRequest")))},
        "/v1/models": {"get": _op("The served model", {"200": _json(OPEN_OBJECT)})},
        "/v1/feedback": {"post": _op("Explicit reward for a turn: overrides the judge",
                                     {"200": _json(OPEN_OBJECT)},
                                     parameters=[h for h in ATTRIBUTION_HEADERS
                                                 if h["name"] == "X-User-Id"],
                                     requestBody=_body(_ref("Feedback")))},
        "/v1/sessions/{session_id}/end": {"post": _op(
            "The session is over: its last turn is judged with what is known",
            {"200": _json(OPEN_OBJECT)}, parameters=[_path("session_id", "the session")])},
        "/v1/adapters": {"get": _op("Adapter versions, the live one and the trainer's state",
                                    {"200": _json(OPEN_OBJECT)})},
        "/v1/adapters/activate": {"post": _op("Make a version live (0 = the base model)",
                                              {"200": active}, requestBody=_body(_ref("Activate")))},
        "/v1/adapters/rollback": {"post": _op(
            "Return to the version before the live one; later ones are marked rejected",
            {"200": active})},
        "/v1/skills": {
            "get": _op("Skills in the source folder and what OpenClaw loads",
                       {"200": _json(OPEN_OBJECT)}),
            "post": _op("Create a skill (validated before it is written)",
                        {"201": _json(OPEN_OBJECT)},
                        requestBody=_body({**_ref("SkillWrite"), "required": ["name"]}))},
        "/v1/skills/{name}": {
            "get": _op("A skill's files", {"200": _json(OPEN_OBJECT)},
                       parameters=[_path("name", "the skill's folder name", SKILL_NAME)]),
            "patch": _op("Change a skill's files", {"200": _json(OPEN_OBJECT)},
                         parameters=[_path("name", "the skill's folder name", SKILL_NAME)],
                         requestBody=_body(_ref("SkillWrite"))),
            "delete": _op("Delete a skill and unpublish it", {"200": _json(OPEN_OBJECT)},
                          parameters=[_path("name", "the skill's folder name", SKILL_NAME)])},
        "/dashboard": {"get": _op("The web dashboard (HTML); a browser without the key gets a "
                                  "login page", {"200": {"description": "the page", "content": {
                                      "text/html": {"schema": {"type": "string"}}}}})},
        "/v1/dashboard/sessions": {"get": _op("Recent sessions with turn and judgment counts",
                                              {"200": _json(OPEN_OBJECT)},
                                              parameters=[_limit(1000)])},
        "/v1/dashboard/sessions/{session_id}/turns": {"get": _op(
            "A session's turns: prompt excerpt, response, judgment, feedback",
            {"200": _json(OPEN_OBJECT)},
            parameters=[_path("session_id", "the session"), _limit(2000)])},
        "/v1/dashboard/rewards": {"get": _op("Judged and rated turns over time, adapter switches",
                                             {"200": _json(OPEN_OBJECT)},
                                             parameters=[_limit(20000)])},
        "/v1/dashboard/skills": {"get": _op("The OpenClaw workspace's skills",
                                            {"200": _json(OPEN_OBJECT)})},
        "/healthz": {"get": {"summary": "Liveness: the process answers (never needs the key)",
                             "security": [], "responses": {"200": _json(OPEN_OBJECT)}}},
        "/readyz": {"get": _op("Readiness: the model is loaded; what is served", {
            "200": _json(OPEN_OBJECT), "503": _json(OPEN_OBJECT, "loading, or the load failed")})},
        "/metrics": {"get": _op("Prometheus metrics", {"200": text})},
        "/openapi.json": {"get": _op("This document", {"200": _json(OPEN_OBJECT)})},
    }


def document(context_length: int) -> dict:
    return {
        "openapi": "3.1.0",
        "info": {"title": "clawrl", "version": __version__,
                 "description": "OpenAI-compatible serving plus the learning loop's controls. "
                 "With server.api_key set, every operation but /healthz needs "
                 "'Authorization: Bearer <key>'."},
        "paths": paths(),
        "components": {"schemas": schemas(context_length),
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}],
    }


async def serve(request: Request) -> Response:
    state = request.app.state.daemon
    return JSONResponse(document(state.cfg.model.context_length))
