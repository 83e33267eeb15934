"""Unit tests for clawrl.chat_format: content_text and the tool inlining used for templates that
know only role + content (SmolLM2's). No tokenizer is loaded here; render_prompt with the real
tokenizer is covered by the integration tests."""
from __future__ import annotations

import json

import pytest

from clawrl.chat.format import (TOOLS_PREAMBLE, _inline_tools, _tool_call_text, content_text,
                                template_supports_tools)
from clawrl.chat.toolcalls import OutputParser

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def call(name, args, cid="c1"):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


# -- content_text ------------------------------------------------------------------------------------

def test_content_text_string():
    assert content_text("hello") == "hello"
    assert content_text("") == ""


def test_content_text_none():
    assert content_text(None) == ""


def test_content_text_parts():
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    assert content_text(parts) == "Hello, world"
    assert content_text([]) == ""
    assert content_text([{"type": "text"}]) == ""


def test_template_supports_tools():
    class Tok:
        chat_template = None
    assert template_supports_tools(Tok()) is False
    Tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert template_supports_tools(Tok()) is False
    Tok.chat_template = "{% if tools %}{{ tools | tojson }}{% endif %}"
    assert template_supports_tools(Tok()) is True


# -- _inline_tools -----------------------------------------------------------------------------------

def test_plain_conversation_unchanged():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]
    assert _inline_tools(msgs, None) == msgs
    assert _inline_tools(msgs, []) == msgs


def test_input_is_not_mutated():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"}]
    snapshot = json.loads(json.dumps(msgs))
    _inline_tools(msgs, [WEATHER])
    assert msgs == snapshot


def test_output_messages_have_only_role_and_content():
    msgs = [{"role": "user", "content": "hi", "name": "bob"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "P"})]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    for m in _inline_tools(msgs, [WEATHER]):
        assert set(m) == {"role", "content"}
        assert isinstance(m["content"], str)


def test_content_parts_flattened():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert _inline_tools(msgs, None) == [{"role": "user", "content": "ab"}]


def test_tools_extend_an_existing_system_message():
    msgs = [{"role": "system", "content": "You are Claw."}, {"role": "user", "content": "weather?"}]
    out = _inline_tools(msgs, [WEATHER, SEARCH])
    assert len(out) == 2
    assert out[0]["role"] == "system"
    sys = out[0]["content"]
    assert sys.startswith("You are Claw.\n\n# Tools")
    assert "<tools>" in sys and "</tools>" in sys
    # each tool's function spec appears as one JSON line, in order
    inside = sys.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line) for line in inside] == [WEATHER["function"], SEARCH["function"]]
    assert "<tool_call>" in sys and "</tool_call>" in sys
    assert out[1] == {"role": "user", "content": "weather?"}


def test_tools_preamble_matches_template():
    out = _inline_tools([{"role": "user", "content": "x"}], [WEATHER])
    assert out[0]["content"] == TOOLS_PREAMBLE.format(tools=json.dumps(WEATHER["function"]))
    # the format braces were escaped correctly: the example call is literal JSON-ish text
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in out[0]["content"]


def test_tools_insert_a_system_message_when_there_is_none():
    msgs = [{"role": "user", "content": "weather?"}]
    out = _inline_tools(msgs, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user"]
    assert out[0]["content"].startswith("# Tools")
    assert "get_weather" in out[0]["content"]
    assert out[1] == {"role": "user", "content": "weather?"}


def test_system_not_first_gets_a_new_leading_system():
    msgs = [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]
    out = _inline_tools(msgs, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "system"]
    assert out[2]["content"] == "late"


def test_tool_without_function_wrapper_is_described_as_is():
    bare = {"name": "bare_tool", "parameters": {}}
    out = _inline_tools([{"role": "user", "content": "x"}], [bare])
    assert json.dumps(bare) in out[0]["content"]


def test_developer_role_mapped_to_system():
    msgs = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    assert _inline_tools(msgs, None) == [{"role": "system", "content": "Be terse."},
                                         {"role": "user", "content": "hi"}]


def test_developer_message_extended_with_tools():
    msgs = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    out = _inline_tools(msgs, [WEATHER])
    assert len(out) == 2
    assert out[0]["role"] == "system"
    assert out[0]["content"].startswith("Be terse.\n\n# Tools")


def test_assistant_tool_calls_rendered_as_blocks():
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [call("get_weather", {"city": "Paris"})]}]
    out = _inline_tools(msgs, None)
    assert out[1]["role"] == "assistant"
    text = out[1]["content"]
    assert text == "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}) \
        + "\n</tool_call>"


def test_assistant_text_and_several_tool_calls():
    msgs = [{"role": "assistant", "content": "Checking both.",
             "tool_calls": [call("get_weather", {"city": "Paris"}, "c1"),
                            call("search", {"q": "cats"}, "c2")]}]
    text = _inline_tools(msgs, None)[0]["content"]
    assert text.startswith("Checking both.\n<tool_call>\n")
    assert text.count("<tool_call>") == 2 and text.count("</tool_call>") == 2
    assert text.index("get_weather") < text.index("search")
    assert "</tool_call>\n<tool_call>" in text


def test_tool_call_arguments_rendered_as_json_objects():
    # arguments arrive as a JSON string; the model should see an object, not a quoted string
    text = _tool_call_text(call("f", "{\"a\": 1}"))
    body = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body == {"name": "f", "arguments": {"a": 1}}
    # already an object
    text = _tool_call_text({"function": {"name": "f", "arguments": {"b": 2}}})
    assert json.loads(text.split("\n")[1]) == {"name": "f", "arguments": {"b": 2}}


def test_tool_call_invalid_json_arguments_kept_as_string():
    text = _tool_call_text(call("f", "{not json"))
    assert json.loads(text.split("\n")[1]) == {"name": "f", "arguments": "{not json"}


def test_rendered_tool_calls_round_trip_through_the_output_parser():
    """What the prompt shows as an earlier call is what the parser turns back into tool_calls."""
    calls = [call("get_weather", {"city": "Paris"}, "c1"), call("search", {"q": "x"}, "c2")]
    text = _inline_tools([{"role": "assistant", "content": "Hm.", "tool_calls": calls}], None)[0]["content"]
    p = OutputParser([], parse_tools=True)
    live = p.feed(text)
    rest, parsed = p.finish()
    assert (live + rest).strip() == "Hm."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == \
        [("get_weather", {"city": "Paris"}), ("search", {"q": "x"})]


def test_consecutive_tool_messages_merged_into_one_user_message():
    msgs = [{"role": "user", "content": "both please"},
            {"role": "assistant", "content": None,
             "tool_calls": [call("get_weather", {"city": "Paris"}, "c1"), call("search", {"q": "x"}, "c2")]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "found"}]},
            {"role": "assistant", "content": "Sunny, and found it."}]
    out = _inline_tools(msgs, None)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant"]
    assert out[2]["content"] == ("<tool_response>\nsunny\n</tool_response>\n"
                                 "<tool_response>\nfound\n</tool_response>")
    assert out[3] == {"role": "assistant", "content": "Sunny, and found it."}


def test_tool_messages_separated_by_assistant_are_not_merged():
    msgs = [{"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "assistant", "content": None, "tool_calls": [call("f", {}, "c2")]},
            {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    out = _inline_tools(msgs, None)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[0]["content"] == "<tool_response>\none\n</tool_response>"
    assert out[2]["content"] == "<tool_response>\ntwo\n</tool_response>"


def test_user_message_after_tool_results_is_not_merged():
    msgs = [{"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "user", "content": "thanks"},
            {"role": "tool", "tool_call_id": "c2", "content": "s"}]
    out = _inline_tools(msgs, None)
    assert out == [{"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                   {"role": "user", "content": "thanks"},
                   {"role": "user", "content": "<tool_response>\ns\n</tool_response>"}]


def test_full_tool_conversation():
    msgs = [{"role": "system", "content": "You are Claw."},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    out = _inline_tools(msgs, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert "get_weather" in out[0]["content"] and out[0]["content"].startswith("You are Claw.")
    assert out[2]["content"].startswith("<tool_call>")
    assert out[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
    assert not any("_tool_block" in m for m in out)


@pytest.mark.parametrize("tools", [None, []])
def test_no_tools_means_no_preamble(tools):
    out = _inline_tools([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], tools)
    assert out[0]["content"] == "s"
    assert "<tools>" not in json.dumps(out)
