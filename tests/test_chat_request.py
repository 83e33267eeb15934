"""Unit tests for clawrl.chat_request: request validation (parse_chat) and attribution.

Headers are plain dicts with lower-case keys: attribute() looks them up in lower case, and
Starlette's Headers.get is case-insensitive, so a lower-case dict stands in for it faithfully.
"""
from __future__ import annotations

import json

import pytest

from clawrl.chat.request import ChatRequest, attribute, derived_session_id, parse_chat
from clawrl.errors import RequestError
from clawrl.types import Attribution

USER = {"role": "user", "content": "hi"}


def body(**kw) -> dict:
    b = {"model": "m", "messages": [USER]}
    b.update(kw)
    return b


def reject(b, param: str) -> RequestError:
    """parse_chat(b) must fail with a 400 naming `param`, with OpenAI's error shape."""
    with pytest.raises(RequestError) as ei:
        parse_chat(b)
    e = ei.value
    assert e.status == 400
    assert e.param == param, (e.param, e.message)
    out = e.body()
    assert set(out) == {"error"}
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error"
    assert out["error"]["param"] == param
    assert isinstance(out["error"]["message"], str) and out["error"]["message"]
    assert out["error"]["message"] == str(e)
    json.dumps(out)   # serialisable as is
    return e


# -- accepted requests -------------------------------------------------------------------------------

def test_minimal_request_defaults():
    r = parse_chat(body())
    assert isinstance(r, ChatRequest)
    assert r.messages == [USER]
    assert r.tools is None
    assert r.stream is False and r.include_usage is False
    assert r.max_tokens is None
    assert r.temperature == 1.0 and r.top_p == 1.0
    assert r.stop == [] and r.seed is None and r.logprobs is False
    assert r.model == "m"


def test_model_is_optional():
    b = body()
    del b["model"]
    assert parse_chat(b).model is None


def test_sampling_params_read():
    r = parse_chat(body(temperature=0, top_p=0.5, seed=7, logprobs=True, stream=True,
                        stream_options={"include_usage": True}, max_tokens=10, stop="\n\n"))
    assert r.temperature == 0.0 and isinstance(r.temperature, float)
    assert r.top_p == 0.5
    assert r.seed == 7
    assert r.logprobs is True
    assert r.stream is True and r.include_usage is True
    assert r.max_tokens == 10
    assert r.stop == ["\n\n"]


def test_boundaries_accepted():
    r = parse_chat(body(temperature=2.0, top_p=0.0, max_tokens=1))
    assert r.temperature == 2.0 and r.top_p == 0.0 and r.max_tokens == 1
    r = parse_chat(body(stop=["a", "b", "c", "d"]))
    assert r.stop == ["a", "b", "c", "d"]


def test_nullable_fields_accepted():
    r = parse_chat(body(temperature=None, top_p=None, max_tokens=None, stop=None, seed=None,
                        stream_options=None, tools=None))
    assert r.temperature == 1.0 and r.top_p == 1.0 and r.max_tokens is None and r.stop == []


def test_unused_openai_fields_are_ignored():
    r = parse_chat(body(frequency_penalty=0.5, presence_penalty=0.1, user="u", metadata={"a": "b"},
                        n=1, top_logprobs=3, response_format={"type": "text"}))
    assert r.messages == [USER]


def test_max_completion_tokens_wins_over_max_tokens():
    assert parse_chat(body(max_tokens=100, max_completion_tokens=7)).max_tokens == 7
    assert parse_chat(body(max_completion_tokens=9)).max_tokens == 9
    assert parse_chat(body(max_tokens=11)).max_tokens == 11


def test_content_as_array_of_text_parts():
    msgs = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    r = parse_chat(body(messages=msgs))
    assert r.messages == msgs


def test_every_role_accepted():
    msgs = [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}, USER,
            {"role": "assistant", "content": "a"},
            {"role": "tool", "tool_call_id": "c1", "content": "t"}]
    assert len(parse_chat(body(messages=msgs)).messages) == 5


def test_assistant_tool_calls_with_null_content():
    msgs = [USER,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = parse_chat(body(messages=msgs))
    assert r.messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_tools_accepted():
    assert parse_chat(body(tools=TOOLS)).tools == TOOLS


def test_empty_tools_is_no_tools():
    assert parse_chat(body(tools=[])).tools is None


def test_tool_choice_none_drops_tools():
    assert parse_chat(body(tools=TOOLS, tool_choice="none")).tools is None
    assert parse_chat(body(tools=TOOLS, tool_choice="auto")).tools == TOOLS


# -- rejections: each a 400 naming the parameter -----------------------------------------------------

@pytest.mark.parametrize("b", [None, [], "text", 3, [USER]])
def test_body_not_an_object(b):
    e = reject(b, "body")
    assert "JSON object" in e.message


def test_messages_missing():
    b = body()
    del b["messages"]
    reject(b, "messages")


@pytest.mark.parametrize("messages", ["hi", {"role": "user", "content": "hi"}, None, 5])
def test_messages_not_a_list(messages):
    e = reject(body(messages=messages), "messages")
    assert e.code == "invalid_type"


def test_messages_empty():
    e = reject(body(messages=[]), "messages")
    assert "at least one" in e.message


@pytest.mark.parametrize("m", ["hi", None, ["user", "hi"], 1])
def test_message_not_an_object(m):
    reject(body(messages=[USER, m]), "messages[1]")


@pytest.mark.parametrize("role", ["robot", None, "User", "function", 3])
def test_unknown_role(role):
    e = reject(body(messages=[{"role": role, "content": "x"}]), "messages[0].role")
    assert "user" in e.message and "assistant" in e.message


def test_missing_role():
    reject(body(messages=[{"content": "x"}]), "messages[0].role")


@pytest.mark.parametrize("content", [5, {"type": "text", "text": "x"}, True, 1.5])
def test_content_wrong_type(content):
    e = reject(body(messages=[{"role": "user", "content": content}]), "messages[0].content")
    assert e.code == "invalid_type"


@pytest.mark.parametrize("role", ["user", "system", "tool", "assistant"])
def test_content_missing(role):
    reject(body(messages=[{"role": role}]), "messages[0].content")


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    {"type": "text"},
    {"type": "text", "text": 5},
    "plain string",
])
def test_non_text_content_part(part):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
    e = reject(body(messages=msgs), "messages[0].content[1]")
    assert "text" in e.message


def test_image_part_message_names_the_kind():
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]
    e = reject(body(messages=msgs), "messages[0].content[0]")
    assert "image_url" in e.message


@pytest.mark.parametrize("calls", [
    "not a list",
    [{"id": "c1", "type": "function"}],                           # no function
    [{"id": "c1", "type": "function", "function": "get_weather"}],  # function not an object
    [{"id": "c1", "type": "function", "function": {"arguments": "{}"}}],  # no name
    [{"id": "c1", "type": "function", "function": {"name": 5}}],
    ["c1"],
])
def test_bad_tool_calls(calls):
    msgs = [USER, {"role": "assistant", "content": None, "tool_calls": calls}]
    reject(body(messages=msgs), "messages[1].tool_calls")


def test_tool_calls_on_a_user_message_rejected():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    reject(body(messages=[{"role": "user", "content": "x", "tool_calls": calls}]),
           "messages[0].tool_calls")


def test_assistant_null_content_without_tool_calls_rejected():
    reject(body(messages=[USER, {"role": "assistant", "content": None}]), "messages[1].content")


@pytest.mark.parametrize("tools", ["get_weather", {"type": "function"}, 5])
def test_tools_not_a_list(tools):
    reject(body(tools=tools), "tools")


@pytest.mark.parametrize("tool", [
    {"type": "function", "function": {"parameters": {}}},
    {"type": "function", "function": {"name": ""}},
    {"type": "function", "function": {"name": 3}},
    {"type": "function"},
    "get_weather",
])
def test_tool_missing_function_name(tool):
    reject(body(tools=[TOOLS[0], tool]), "tools[1]")


@pytest.mark.parametrize("key,value,code", [
    ("temperature", -0.1, "invalid_value"),
    ("temperature", 2.01, "invalid_value"),
    ("temperature", "0.7", "invalid_type"),
    ("temperature", True, "invalid_type"),
    ("temperature", False, "invalid_type"),
    ("temperature", [1], "invalid_type"),
    ("temperature", float("nan"), "invalid_value"),
    ("top_p", 1.5, "invalid_value"),
    ("top_p", -1, "invalid_value"),
    ("top_p", "1", "invalid_type"),
    ("top_p", True, "invalid_type"),
    ("max_tokens", 0, "invalid_value"),
    ("max_tokens", -3, "invalid_value"),
    ("max_tokens", 1.5, "invalid_type"),
    ("max_tokens", "10", "invalid_type"),
    ("max_tokens", True, "invalid_type"),
    ("max_completion_tokens", 0, "invalid_value"),
    ("seed", "42", "invalid_type"),
    ("seed", True, "invalid_type"),
])
def test_number_params_out_of_range_or_wrong_type(key, value, code):
    e = reject(body(**{key: value}), key)
    assert e.code == code
    assert key in e.message


def test_max_completion_tokens_invalid_even_with_valid_max_tokens():
    reject(body(max_tokens=10, max_completion_tokens=0), "max_completion_tokens")


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], [1], "a b".split() + [None], 5,
                                  {"a": 1}])
def test_bad_stop(stop):
    e = reject(body(stop=stop), "stop")
    assert "4" in e.message


@pytest.mark.parametrize("stream", ["true", 1, 0, "yes"])
def test_stream_not_bool(stream):
    reject(body(stream=stream), "stream")


def test_stream_options_not_object():
    reject(body(stream=True, stream_options="include_usage"), "stream_options")


@pytest.mark.parametrize("n", [2, 0, 5])
def test_n_other_than_one(n):
    e = reject(body(n=n), "n")
    assert "n = 1" in e.message


def test_model_not_a_string():
    reject(body(model=5), "model")


@pytest.mark.parametrize("key", ["n", "stream"])
def test_explicit_null_n_and_stream_accepted(key):
    r = parse_chat(body(**{key: None}))
    assert r.stream is False


def test_request_error_body_shape():
    e = RequestError("boom", param="x", code="c")
    assert e.status == 400
    assert e.body() == {"error": {"message": "boom", "type": "invalid_request_error",
                                  "param": "x", "code": "c"}}


# -- attribution -------------------------------------------------------------------------------------

CONV = [{"role": "system", "content": "You are Claw."}, {"role": "user", "content": "hello"}]


def test_attribution_from_headers():
    h = {"x-session-id": "s1", "x-turn-type": "side", "x-turn-kind": "heartbeat",
         "x-user-id": "u1", "x-clawrl-no-train": "1", "x-session-done": "true"}
    a = attribute(h, {}, CONV)
    assert isinstance(a, Attribution)
    assert a == Attribution(session_id="s1", turn_type="side", kind="heartbeat", user_id="u1",
                            no_train=True, session_done=True, derived_session=False)


def test_attribution_from_body_fields_when_headers_absent():
    b = {"session_id": "s2", "turn_type": "side", "turn_kind": "memory", "user_id": "u2",
         "no_train": True, "session_done": "yes"}
    a = attribute({}, b, CONV)
    assert a == Attribution(session_id="s2", turn_type="side", kind="memory", user_id="u2",
                            no_train=True, session_done=True, derived_session=False)


def test_headers_win_over_body_fields():
    h = {"x-session-id": "from-header", "x-turn-type": "main", "x-turn-kind": "subagent",
         "x-user-id": "hu", "x-clawrl-no-train": "0", "x-session-done": "no"}
    b = {"session_id": "from-body", "turn_type": "side", "turn_kind": "cron", "user_id": "bu",
         "no_train": True, "session_done": True}
    a = attribute(h, b, CONV)
    assert a.session_id == "from-header"
    assert a.turn_type == "main"
    assert a.kind == "subagent"
    assert a.user_id == "hu"
    assert a.no_train is False
    assert a.session_done is False


def test_empty_header_falls_back_to_body():
    a = attribute({"x-session-id": ""}, {"session_id": "b"}, CONV)
    assert a.session_id == "b" and a.derived_session is False


def test_attribution_defaults():
    a = attribute({}, {}, CONV)
    assert a.turn_type == "main" and a.kind == "main"
    assert a.user_id is None
    assert a.no_train is False and a.session_done is False


def test_side_turn_kind_defaults_to_side():
    assert attribute({"x-turn-type": "side"}, {}, CONV).kind == "side"


@pytest.mark.parametrize("tt", ["bogus", "MAIN", "sidecar"])
def test_invalid_turn_type(tt):
    with pytest.raises(RequestError) as ei:
        attribute({"x-turn-type": tt}, {}, CONV)
    e = ei.value
    assert e.status == 400 and e.param == "turn_type"
    assert "main" in e.message and "side" in e.message
    assert e.body()["error"]["param"] == "turn_type"


def test_invalid_turn_type_in_body():
    with pytest.raises(RequestError) as ei:
        attribute({}, {"turn_type": "other"}, CONV)
    assert ei.value.status == 400 and ei.value.param == "turn_type"


@pytest.mark.parametrize("field,value", [("session_id", 5), ("session_id", "x" * 257),
                                         ("user_id", ["u"]), ("turn_kind", {"k": 1})])
def test_attribution_field_wrong_type_or_too_long(field, value):
    with pytest.raises(RequestError) as ei:
        attribute({}, {field: value}, CONV)
    assert ei.value.status == 400 and ei.value.param == field


@pytest.mark.parametrize("raw,want", [("1", True), ("true", True), ("TRUE", True), ("yes", True),
                                      ("on", True), (" 1 ", True), ("0", False), ("false", False),
                                      ("no", False), ("off", False), ("anything", False)])
def test_flags_parsed(raw, want):
    a = attribute({"x-clawrl-no-train": raw, "x-session-done": raw}, {}, CONV)
    assert a.no_train is want and a.session_done is want


def test_flags_from_body_bools():
    assert attribute({}, {"no_train": True}, CONV).no_train is True
    assert attribute({}, {"no_train": False}, CONV).no_train is False
    assert attribute({}, {"session_done": 1}, CONV).session_done is True


def test_missing_session_gets_a_derived_id():
    a = attribute({}, {}, CONV)
    assert a.derived_session is True
    assert a.session_id == derived_session_id(CONV)
    assert a.session_id.startswith("auto-")


def test_derived_id_stable_across_later_turns():
    turn1 = list(CONV)
    turn2 = turn1 + [{"role": "assistant", "content": "Hi! How can I help?"},
                     {"role": "user", "content": "what's the weather?"}]
    turn3 = turn2 + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}]
    ids = {attribute({}, {}, t).session_id for t in (turn1, turn2, turn3)}
    assert len(ids) == 1


def test_derived_id_ignores_content_representation():
    parts = [{"role": "system", "content": [{"type": "text", "text": "You are "},
                                            {"type": "text", "text": "Claw."}]},
             {"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert derived_session_id(parts) == derived_session_id(CONV)


def test_derived_id_differs_for_a_different_opening():
    other_user = [CONV[0], {"role": "user", "content": "goodbye"}]
    other_system = [{"role": "system", "content": "You are Paw."}, CONV[1]]
    no_system = [CONV[1]]
    ids = {derived_session_id(m) for m in (CONV, other_user, other_system, no_system)}
    assert len(ids) == 4


def test_derived_id_is_deterministic():
    assert derived_session_id(CONV) == derived_session_id([dict(m) for m in CONV])
    assert len(derived_session_id(CONV)) == len("auto-") + 20


def test_explicit_session_is_not_derived():
    a = attribute({"x-session-id": "abc"}, {}, CONV)
    assert a.session_id == "abc" and a.derived_session is False
