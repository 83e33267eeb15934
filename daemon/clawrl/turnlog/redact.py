"""Masking secrets before a turn is written to the turn log.

Conversations with an agent carry secrets: a pasted API key, a `.env` file a tool read, a private
key in a config the user asked about. The turn log keeps conversations for weeks and exports them,
so every text the store writes goes through `Redactor.text` (or `.json` for message lists), which
replaces the secret part of each match with `[REDACTED]`. The built-in patterns cover common
shapes (provider API keys, GitHub, AWS, Slack and Google tokens, JWTs, bearer tokens, PEM private
keys, `password = ...`-style assignments); `[privacy] redact_patterns` adds the user's own.

Masking the text is not enough: the turn's token ids (prompt_ids, response_ids) spell the same
secret and decode back to it, and training on the turn would teach the weights to say it. So a
turn in which anything was masked keeps no token ids for the masked part and is never trained on
(turnlog/store.py does that); the rest of the conversation is unaffected.

Pattern matching is best effort: it misses secrets of shapes it does not know (SECURITY.md says
so). It is off with `[privacy] redact = false`.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

MASK = "[REDACTED]"

# name -> pattern. Where a pattern has a group named `secret`, only that group is masked, so
# "Bearer [REDACTED]" and 'api_key: "[REDACTED]"' still read as what they were (and JSON inside a
# string stays JSON: no value class below crosses a quote).
BUILTIN: dict[str, str] = {
    "pem private key": r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?"
                       r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
    "openai/anthropic key": r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}",
    "stripe key": r"(?<![A-Za-z0-9_])[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}",
    "github token": r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})",
    "aws access key id": r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])",
    "slack token": r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}",
    "google api key": r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35}",
    "jwt": r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
    "bearer token": r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{12,}=*)",
    # key = value, key: value, "key": "value" for names that hold nothing but secrets. Names like
    # `token` or `secret` alone are left out: code and prose use them for other things, and every
    # false alarm costs a turn of training data.
    # The name may end a longer one (OPENAI_API_KEY); it is found where it starts, not by
    # matching the prefix: a prefix pattern took quadratic time on text like "a-a-a-a-...".
    "secret assignment": r"(?i)(?<![a-z0-9])(?:api[_-]?key|apikey|secret[_-]?key|"
                         r"secret[_-]?access[_-]?key|"
                         r"access[_-]?token|auth[_-]?token|refresh[_-]?token|client[_-]?secret|"
                         r"private[_-]?key|password|passwd)(?![a-z0-9])[\"']?\s*[:=]\s*[\"']?"
                         # Possessive, and not itself a key: in "password: password: x" the
                         # secret is x, not the second "password".
                         r"(?P<secret>[^\s\"'`,;(){}\[\]<>]{6,}+)(?<!:)(?!\s*[:=])",
}


@dataclass
class Redactor:
    patterns: list[re.Pattern] = field(default_factory=list)

    @classmethod
    def default(cls, extra: Sequence[str] = ()) -> "Redactor":
        return cls([re.compile(p) for p in [*BUILTIN.values(), *extra]])

    @classmethod
    def from_config(cls, privacy) -> "Redactor":
        """From a config.PrivacyConfig (its patterns were checked at start-up)."""
        return cls.default(privacy.redact_patterns) if privacy.redact else cls([])

    @overload
    def text(self, s: str) -> tuple[str, int]: ...
    @overload
    def text(self, s: str | None) -> tuple[str | None, int]: ...

    def text(self, s: str | None) -> tuple[str | None, int]:
        """`s` with every secret masked, and how many were."""
        if not s or not self.patterns:
            return s, 0
        total = 0
        for pattern in self.patterns:
            s, n = pattern.subn(_masker, s)
            total += n
        return s, total

    def json(self, value):
        """A copy of a JSON value (messages, tool calls) with every string masked; and the count.
        Keys are kept: they name fields, and the values are what hold secrets."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            items, total = [], 0
            for item in value:
                item, n = self.json(item)
                items.append(item)
                total += n
            return items, total
        if isinstance(value, dict):
            fields, total = {}, 0
            for key, item in value.items():
                fields[key], n = self.json(item)
                total += n
            return fields, total
        return value, 0


def _masker(m: re.Match) -> str:
    if "secret" in m.re.groupindex and m.group("secret") is not None:
        start, end = m.span("secret")
        whole = m.group(0)
        return whole[:start - m.start()] + MASK + whole[end - m.start():]
    return MASK


def check_pattern(pattern: str) -> str | None:
    """Why a user pattern cannot be used, or None when it can."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        return f"not a valid regular expression ({e})"
    if compiled.search("") is not None:
        return "it matches the empty string, so it would mask between every character"
    return None
