"""Assemble a streamed response: content deltas, stop strings, and `<tool_call>` blocks.

The engine yields raw text. This parser decides what the client sees as it arrives: it holds back
only the few characters that might be the start of a stop string or of a `<tool_call>` tag, cuts
the text at a stop string, and once a tool call starts it buffers the rest and turns it into
OpenAI `tool_calls` at the end. A block whose JSON does not parse is given back as plain content,
so nothing the model wrote is lost.
"""
from __future__ import annotations

import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _held_back(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def _parse_call(raw: str) -> dict | None:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)}}


class OutputParser:
    def __init__(self, stop: list[str], parse_tools: bool):
        self.stop = [s for s in stop if s]
        self.parse_tools = parse_tools
        self.text = ""          # everything generated, cut at a stop string
        self.emitted = 0        # characters of self.text already sent as content
        self.stopped = False    # a stop string was found: generation should end
        self.tool_start: int | None = None
        self.content = ""

    def feed(self, delta: str) -> str:
        """Add generated text; return the content that can be sent now."""
        if self.stopped or not delta:
            return ""
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True
        if self.parse_tools and self.tool_start is None:
            i = self.text.find(OPEN, max(0, self.emitted - len(OPEN)))
            if i >= 0:
                self.tool_start = i
        if self.tool_start is not None:
            limit = self.tool_start
        elif self.stopped:
            limit = len(self.text)
        else:
            markers = self.stop + ([OPEN] if self.parse_tools else [])
            limit = len(self.text) - _held_back(self.text, markers)
        out = self.text[self.emitted:limit] if limit > self.emitted else ""
        self.emitted = max(self.emitted, limit)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """At the end: the content not yet sent, and the tool calls (if all blocks parsed).
        Afterwards `self.content` is the response's content as the client saw it."""
        calls: list = []
        if self.tool_start is not None:
            tail = self.text[self.tool_start:]
            calls = [_parse_call(raw) for raw in _BLOCK.findall(tail)]
            if calls and all(calls):
                leftover = _BLOCK.sub("", tail).strip()
                self.content = self.text[:self.tool_start] + (("\n" + leftover) if leftover else "")
                rest = self.content[self.emitted:]
                self.emitted = len(self.text)
                return rest, calls
        self.content = self.text
        rest, self.emitted = self.text[self.emitted:], len(self.text)
        return rest, []
