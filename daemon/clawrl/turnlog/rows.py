"""Reading turn rows: the one place that knows which columns of `turns` hold JSON.

`turn(row)` decodes a whole row into a types.Turn and raises ValueError when a JSON column does
not parse; `value(row, column)` decodes one column. A column the row does not have (a SELECT of
a few columns) reads as None.
"""
from __future__ import annotations

import json

from ..types import Turn

JSON_COLUMNS = frozenset({"request_json", "prompt_ids", "response_ids", "response_logprobs",
                          "tool_calls", "next_state_json", "judge_votes", "judge_raw",
                          "teacher_logprobs", "teacher_topk", "skills"})


def value(row, column: str):
    """The Python value of `column` (None when NULL or empty). ValueError if it does not parse."""
    if column not in JSON_COLUMNS:
        raise KeyError(f"{column} is not a JSON column of turns")
    try:
        text = row[column]
    except (IndexError, KeyError):
        return None
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"turn {_id(row)}: {column} is not valid JSON ({e})") from None


def turn(row) -> Turn:
    """The row decoded; ValueError when one of its JSON columns does not parse."""
    def text(column: str):
        try:
            return row[column]
        except (IndexError, KeyError):
            return None
    return Turn(
        id=text("id") or 0, session_id=text("session_id") or "", user_id=text("user_id"),
        request=value(row, "request_json") or {}, prompt_ids=value(row, "prompt_ids") or [],
        response_text=text("response_text") or "", response_ids=value(row, "response_ids"),
        response_logprobs=value(row, "response_logprobs"), tool_calls=value(row, "tool_calls"),
        next_state=value(row, "next_state_json"), judge_hint=text("judge_hint"),
        feedback_comment=text("feedback_comment"),
        teacher_logprobs=value(row, "teacher_logprobs"), teacher_topk=value(row, "teacher_topk"))


def _id(row) -> str:
    try:
        return str(row["id"])
    except (IndexError, KeyError):
        return "?"
