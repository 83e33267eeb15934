"""Split a reasoning model's thinking from its answer, as the text streams.

Qwen3 and DeepSeek-R1 style models write `<think>…</think>` before the answer. OpenAI-compatible
servers hand that part to clients as `reasoning_content` (the name vLLM and SGLang use), so tool
calls and stop strings are looked for in the answer only and a client that replays the
conversation sends back the answer alone. A response that does not *start* with `<think>` (after
whitespace) has no reasoning: everything is content, so models that never think (SmolLM2) are
untouched. An unclosed block is all reasoning; the token ids keep every token either way.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningSplitter:
    """feed(delta) -> (reasoning, content) parts that can be sent now; finish() for the rest."""

    def __init__(self):
        self.state = "start"        # start -> thinking -> answer (or start -> answer)
        self.buf = ""               # text not yet classified
        self.reasoning = ""         # all reasoning so far
        self.trim = False           # drop the newlines that follow a tag, whatever the chunking

    def _trimmed(self) -> None:
        if self.trim:
            self.buf = self.buf.lstrip("\n")
            self.trim = not self.buf

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(OPEN):
                self.state, self.buf, self.trim = "thinking", head[len(OPEN):], True
            elif not OPEN.startswith(head):     # can no longer become "<think>"
                self.state = "answer"
            else:
                return "", ""
        self._trimmed()
        if self.state == "thinking":
            end = self.buf.find(CLOSE)
            if end < 0:
                keep = _partial_suffix(self.buf, CLOSE)
                out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                self.reasoning += out
                return out, ""
            thought, self.buf = self.buf[:end], self.buf[end + len(CLOSE):]
            self.reasoning += thought
            self.state, self.trim = "answer", True
            self._trimmed()
            answer, self.buf = self.buf, ""
            return thought, answer
        out, self.buf = self.buf, ""
        return "", out

    def finish(self) -> tuple[str, str]:
        """What is left when generation ends: unclosed thinking stays reasoning."""
        rest, self.buf = self.buf, ""
        if self.state == "thinking":
            self.reasoning += rest
            return rest, ""
        return "", rest
