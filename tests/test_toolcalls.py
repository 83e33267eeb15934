"""Unit tests for clawrl.toolcalls.OutputParser: streamed content, stop strings, <tool_call> blocks."""
from __future__ import annotations

import json

import pytest

from clawrl.chat.toolcalls import CLOSE, OPEN, OutputParser


def chunks_of(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def run(deltas, stop=(), parse_tools=True):
    """Feed deltas; return (streamed pieces, finish rest, calls, parser)."""
    p = OutputParser(list(stop), parse_tools=parse_tools)
    pieces = [p.feed(d) for d in deltas]
    rest, calls = p.finish()
    return pieces, rest, calls, p


def streamed(text, size, stop=(), parse_tools=True):
    """What the client sees (all content, concatenated) plus calls and parser."""
    pieces, rest, calls, p = run(chunks_of(text, size), stop, parse_tools)
    return "".join(pieces) + rest, calls, p


def strip_ids(calls):
    return [{**c, "id": None} for c in calls]


SAMPLES = [
    "Hello, world! This is a plain answer.",
    "Answer <not a tag> and <tool plus < signs <tool_cal",
    "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "Two calls:\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
    "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>",
    "Broken <tool_call>{\"name\": \"a\", \"arguments\": </tool_call> after",
    "unterminated <tool_call>{\"name\": \"a\", \"arguments\": {\"q\": \"z\"}}",
    "stop here STOP and not this",
    "almost ST but no, then END",
    "ünïcödé ✓ <tool_call>{\"name\": \"ü\", \"arguments\": {\"s\": \"✓\"}}</tool_call>",
]


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_chunking_does_not_change_the_output(text, size):
    stop = ["STOP", "END"]
    whole, whole_calls, whole_p = streamed(text, 10_000, stop)
    got, calls, p = streamed(text, size, stop)
    assert got == whole
    assert strip_ids(calls) == strip_ids(whole_calls)
    assert p.stopped == whole_p.stopped
    assert p.content == whole_p.content


def test_plain_text_streams_through():
    pieces, rest, calls, p = run(list("Hello there"))
    assert "".join(pieces) + rest == "Hello there"
    assert calls == [] and not p.stopped
    assert p.content == "Hello there"
    # plain letters are sent at once, not held back
    assert pieces == list("Hello there") and rest == ""


def test_big_chunk_and_char_by_char_identical_for_plain_text():
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert streamed(text, 1)[0] == streamed(text, len(text))[0] == text


# -- stop strings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("split", [["Hello ST", "OP more"], ["Hello S", "T", "O", "P more"],
                                   ["Hello STO", "P", " more"], ["Hello STOP more"],
                                   list("Hello STOP more")])
def test_stop_string_split_across_deltas(split):
    pieces, rest, calls, p = run(split, stop=["STOP"])
    out = "".join(pieces) + rest
    assert out == "Hello "
    assert "S" not in out
    assert p.stopped is True
    assert calls == []
    assert p.content == "Hello "


def test_nothing_fed_after_stop_is_emitted():
    p = OutputParser(["STOP"], parse_tools=False)
    assert p.feed("a STOP b") == "a "
    assert p.stopped
    assert p.feed("more text") == ""
    assert p.finish() == ("", [])
    assert p.content == "a "


def test_stop_string_never_emitted_even_partially():
    p = OutputParser(["<|end|>"], parse_tools=False)
    seen = ""
    for ch in "answer<|end|>junk":
        seen += p.feed(ch)
        assert "<" not in seen
    assert seen == "answer" and p.stopped


def test_earliest_of_several_stop_strings_wins():
    pieces, rest, _, p = run(["one two three"], stop=["three", "two"])
    assert "".join(pieces) + rest == "one " and p.stopped


def test_stop_overlapping_an_earlier_partial():
    # "ab" is held back as a possible "abc"; then "xabc" arrives: the stop is at the second "ab".
    p = OutputParser(["abc"], parse_tools=False)
    assert p.feed("ab") == ""
    assert p.feed("xabc") == "abx"
    assert p.stopped


def test_prefix_of_stop_that_is_not_a_stop_is_eventually_emitted():
    p = OutputParser(["STOP"], parse_tools=False)
    assert p.feed("Hello ST") == "Hello "   # "ST" held back
    assert p.feed("ILL") == "STILL"
    assert not p.stopped
    assert p.finish() == ("", [])
    assert p.content == "Hello STILL"


def test_held_back_prefix_released_at_finish():
    p = OutputParser(["STOP"], parse_tools=True)
    assert p.feed("the end is ST") == "the end is "
    rest, calls = p.finish()
    assert rest == "ST" and calls == []
    assert not p.stopped
    assert p.content == "the end is ST"


def test_held_back_tag_prefix_released_at_finish():
    p = OutputParser([], parse_tools=True)
    assert p.feed("a <tool_ca") == "a "
    assert p.finish() == ("<tool_ca", [])


def test_empty_stop_strings_ignored():
    pieces, rest, _, p = run(["abc"], stop=["", ""])
    assert "".join(pieces) + rest == "abc" and not p.stopped


def test_empty_delta_is_harmless():
    p = OutputParser(["X"], parse_tools=True)
    assert p.feed("") == ""
    assert p.feed("ab") == "ab"
    assert p.feed("") == ""
    assert p.finish() == ("", [])


# -- <tool_call> blocks ------------------------------------------------------------------------------

def test_single_tool_call_with_text_before():
    text = ("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
            "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>")
    for size in (1, 4, len(text)):
        content, calls, p = streamed(text, size)
        assert content == "Let me check.\n"
        assert p.content == "Let me check.\n"
        assert len(calls) == 1
        call = calls[0]
        assert call["type"] == "function"
        assert call["id"].startswith("call_") and len(call["id"]) > len("call_")
        assert call["function"]["name"] == "get_weather"
        args = call["function"]["arguments"]
        assert isinstance(args, str)
        assert json.loads(args) == {"city": "Paris", "days": 2}


def test_two_tool_calls():
    text = ("I'll do both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [1, 2]}}\n</tool_call>\n")
    content, calls, p = streamed(text, 3)
    assert content == "I'll do both.\n"
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"x": 1}, {"y": [1, 2]}]
    assert calls[0]["id"] != calls[1]["id"]


def test_tool_call_without_text_before():
    content, calls, p = streamed("<tool_call>{\"name\": \"f\"}</tool_call>", 2)
    assert content == ""
    assert calls[0]["function"] == {"name": "f", "arguments": "{}"}


def test_arguments_given_as_string_or_parameters():
    _, calls, _ = streamed("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", 5)
    assert calls[0]["function"]["arguments"] == "{\"a\": 1}"
    _, calls, _ = streamed("<tool_call>{\"name\": \"f\", \"parameters\": {\"b\": 2}}</tool_call>", 5)
    assert json.loads(calls[0]["function"]["arguments"]) == {"b": 2}


def test_text_after_the_block_is_kept_as_content():
    text = "Before <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> after"
    content, calls, p = streamed(text, 1)
    assert len(calls) == 1
    assert content.startswith("Before ") and "after" in content
    assert OPEN not in content and CLOSE not in content
    assert p.content == content


@pytest.mark.parametrize("split_at", range(1, len(OPEN)))
def test_tool_call_tag_split_across_deltas_never_leaks(split_at):
    deltas = ["Sure. " + OPEN[:split_at], OPEN[split_at:] + "{\"name\": \"f\", \"arguments\": {}}",
              CLOSE]
    p = OutputParser([], parse_tools=True)
    live = ""
    for d in deltas:
        live += p.feed(d)
        assert "<" not in live
    rest, calls = p.finish()
    assert live + rest == "Sure. "
    assert [c["function"]["name"] for c in calls] == ["f"]


def test_tag_char_by_char_never_leaks():
    text = "Hi " + OPEN + "{\"name\": \"f\", \"arguments\": {}}" + CLOSE
    p = OutputParser([], parse_tools=True)
    live = ""
    for ch in text:
        live += p.feed(ch)
        assert "<" not in live and "tool" not in live
    rest, calls = p.finish()
    assert live + rest == "Hi " and len(calls) == 1


def test_block_content_is_not_streamed_before_finish():
    p = OutputParser([], parse_tools=True)
    assert p.feed("x <tool_call>{\"name\": ") == "x "
    assert p.feed("\"f\"}</tool_call> trailing") == ""


@pytest.mark.parametrize("block", [
    "<tool_call>{\"name\": \"f\", \"arguments\": }</tool_call>",   # bad JSON
    "<tool_call>not json at all</tool_call>",
    "<tool_call>[1, 2, 3]</tool_call>",                           # JSON but not an object
    "<tool_call>{\"arguments\": {}}</tool_call>",                 # no name
    "<tool_call>{\"name\": 5}</tool_call>",
])
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_malformed_block_falls_back_to_plain_content(block, size):
    text = "Before " + block + " after"
    content, calls, p = streamed(text, size)
    assert calls == []
    assert content == text          # nothing lost
    assert p.content == text


def test_one_bad_block_among_good_ones_falls_back_entirely():
    text = ("<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
            "<tool_call>{oops}</tool_call>")
    content, calls, p = streamed(text, 4)
    assert calls == [] and content == text


def test_unterminated_block_with_valid_json_still_parses():
    text = "Checking.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"cats\"}}\n"
    for size in (1, 6, len(text)):
        content, calls, p = streamed(text, size)
        assert content == "Checking.\n"
        assert len(calls) == 1
        assert calls[0]["function"]["name"] == "search"
        assert json.loads(calls[0]["function"]["arguments"]) == {"q": "cats"}


def test_unterminated_block_with_invalid_json_is_content():
    text = "Checking. <tool_call>{\"name\": \"search\", \"argu"
    content, calls, _ = streamed(text, 2)
    assert calls == [] and content == text


def test_stop_string_inside_a_block_cuts_it():
    text = "x <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>STOP ignored"
    content, calls, p = streamed(text, 1, stop=["STOP"])
    assert p.stopped
    assert len(calls) == 1 and content == "x "


def test_parse_tools_false_leaves_tags_as_content():
    text = "Before <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> after"
    for size in (1, 5, len(text)):
        content, calls, p = streamed(text, size, parse_tools=False)
        assert calls == []
        assert content == text
        assert p.tool_start is None


def test_parse_tools_false_does_not_hold_back_tag_prefix():
    p = OutputParser([], parse_tools=False)
    assert p.feed("a <tool_ca") == "a <tool_ca"
