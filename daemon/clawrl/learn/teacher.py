"""The teacher's context for on-policy distillation (README, "How it learns": opd).

The teacher is the frozen base model shown the original request with the hint the judge (or the
user's own comment) gave, appended to the last user message. It scores the tokens that were
*served*, so its logprobs and the policy's line up token for token. This module builds that
context; who runs the forward pass (the trainer here, an engine's scoring call elsewhere) is not
its concern.
"""
from __future__ import annotations

import copy

from ..chat.format import content_text, render_prompt

HINT_HEADER = "\n\n[user's hint / instruction]\n"
MIN_HINT_CHARS = 10   # shorter comments ("ok", "thanks!") carry no instruction


def pick_hint(feedback_comment: str | None, judge_hint: str | None) -> str | None:
    """The user's own comment wins when it says something; else the judge's hint, if any."""
    comment = (feedback_comment or "").strip()
    if len(comment) > MIN_HINT_CHARS:
        return comment
    hint = (judge_hint or "").strip()
    return hint or None


def hinted_messages(messages: list[dict], hint: str) -> list[dict]:
    """A copy of `messages` with the hint appended to the last user message.

    List-of-parts content becomes plain text (the chat template sees text only anyway). With no
    user message at all, the hint becomes one, so the teacher still sees it.
    """
    out = copy.deepcopy(messages)
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = content_text(m.get("content")) + HINT_HEADER + hint
            return out
    out.append({"role": "user", "content": HINT_HEADER.lstrip("\n") + hint})
    return out


def teacher_prompt(tokenizer, request: dict, hint: str) -> list[int]:
    """Prompt token ids of the teacher context for a recorded request ({messages, tools})."""
    messages = hinted_messages(request["messages"], hint)
    return render_prompt(tokenizer, messages, request.get("tools"))
