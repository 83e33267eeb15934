"""The vocabulary the daemon speaks: request attribution, generation parameters, token events, a
turn of the log, what a judge reads and says, and what the trainer takes.

Small dataclasses only; no behaviour beyond trivial helpers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

TURN_TYPES = ("main", "side")
# Kinds the OpenClaw extension sends; anything else is kept as given.
MAIN_KINDS = ("main", "subagent")


@dataclass(frozen=True)
class Attribution:
    """Who and what a request is, from X-* headers or body fields of the same name."""
    session_id: str
    turn_type: str = "main"          # main | side
    kind: str = "main"               # main, heartbeat, memory, cron, compaction, subagent, announce, ...
    user_id: str | None = None
    no_train: bool = False
    session_done: bool = False
    derived_session: bool = False    # no session header: id derived from the opening messages


@dataclass
class GenParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass(frozen=True)
class TokenEvent:
    """One served token: its id, its logprob under the model (temperature 1, no top-p),
    and the text it adds to the response (may be empty while a multi-byte char completes)."""
    token_id: int
    logprob: float
    text: str


@dataclass
class Finish:
    """How a generation ended."""
    reason: str                      # stop | length | tool_calls | cancelled | error
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0           # prompt tokens served from the prefix cache
    adapter_version: int = 0


@dataclass
class Turn:
    """One row of the turn log with its JSON columns decoded (turnlog/rows.py builds it). Only
    what the stages read after the turn is recorded; the row has more (timings, statuses)."""
    id: int
    session_id: str
    user_id: str | None
    request: dict                    # {messages, tools, params}
    prompt_ids: list[int]
    response_text: str
    response_ids: list[int] | None
    response_logprobs: list[float] | None
    tool_calls: list[dict] | None
    next_state: list[dict] | None    # the messages that followed the response
    judge_hint: str | None
    feedback_comment: str | None
    teacher_logprobs: list[float] | None
    teacher_topk: dict | None


@dataclass(frozen=True)
class JudgeInput:
    context: list[dict]        # conversation before the turn; the last is what the turn answered
    response: str              # the assistant's served text
    tool_calls: list[dict]     # OpenAI tool_calls the assistant made (may be empty)
    next_state: list[dict]     # the messages that followed (role user or tool)


@dataclass
class Judgment:
    score: int                 # majority of valid votes in {1, 0, -1}; ties and no valid votes -> 0
    votes: list[int | None]    # parsed vote per judge call (None = unparseable)
    raw: list[str]             # raw judge outputs, vote calls then hint calls
    hint: str | None           # longest valid hint among the hint calls, else None


@dataclass
class Sample:
    """One ready turn, decoded: what the trainer needs and nothing else."""
    id: int
    user_id: str | None
    request: dict
    prompt_ids: list[int]
    response_ids: list[int]
    served_logp: list[float] | None
    empty: bool                          # no visible text and no tool call
    reward: float | None
    hint: str | None
    teacher_logp: list[float] | None
    teacher_topk: dict | None = None     # {"ids": [[K]...], "logp": [[K]...]} when opd.topk > 0
