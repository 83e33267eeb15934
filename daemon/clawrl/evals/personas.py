"""Simulated users for `clawrl eval`: the `Persona` record and `load`, which finds, imports and
checks a persona file.

A persona is a plain Python module: a built-in one lives in the repository's
`recipes/personas/<name>.py`, any other is given by its path. It defines at module level:

    NAME: str                      who this user is
    PREFERENCE: str                one sentence: what this user wants
    SYSTEM: str | None             optional system prompt for every conversation
    TRAIN_PROMPTS: list[str]       first messages used while training
    HELDOUT_PROMPTS: list[str]     first messages scored only, disjoint from TRAIN_PROMPTS, >= 40
    MAX_TOKENS: int                optional reply budget the eval should request (default 160)
    HAPPY: float                   optional: the score at which this user is satisfied (default
                                   1.0); the eval checks the judge's reading against it
    def score(prompt, response) -> float                  in [0, 1]
    def reply(prompt, response, score, rng) -> str        the user's next message
    def criteria(prompt, response) -> dict[str, bool]     optional: each criterion of the score,
                                                          met or not (for reports on what moved)

This module owns only finding, importing and validating; what a persona wants and how it scores
is owned by its file, and driving personas through the daemon by the eval driver.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import REPO_RECIPES
from ..errors import ClawrlError

PERSONAS_DIR = REPO_RECIPES / "personas"
BUILTIN: list[str] = sorted(p.stem for p in PERSONAS_DIR.glob("*.py") if not p.stem.startswith("_"))
MIN_HELDOUT = 40
DEFAULT_MAX_TOKENS = 160
REQUIRED = ("NAME", "PREFERENCE", "TRAIN_PROMPTS", "HELDOUT_PROMPTS", "score", "reply")
EXAMPLE = "see recipes/personas/concise.py for a complete example"


@dataclass
class Persona:
    name: str
    preference: str                      # one sentence: what this user wants
    system: str | None                   # optional system prompt for every conversation
    train_prompts: list[str]
    heldout_prompts: list[str]           # disjoint from train_prompts, >= 40
    score: Callable[[str, str], float]   # (prompt, response) -> [0, 1]
    reply: Callable[[str, str, float, random.Random], str]  # (prompt, response, score, rng) -> next
    max_tokens: int                      # reply budget the eval should request
    criteria: Callable[[str, str], dict[str, bool]] | None = None   # optional per-criterion view
    happy: float = 1.0                   # satisfied at or above this score

    def satisfied(self, score: float) -> bool:
        return score >= self.happy


def resolve(name_or_path: str) -> Path:
    """A persona is a path to a .py file, or the name of one under recipes/personas/."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    cand = PERSONAS_DIR / f"{name_or_path}.py"
    if cand.is_file():
        return cand
    raise ClawrlError(f"persona {name_or_path!r} not found; give a path to a .py file or one of: "
                      + (", ".join(BUILTIN) or "(none shipped)"))


def load(name_or_path: str) -> Persona:
    """Import and check a persona file; raise ClawrlError naming the file and the problem."""
    path = resolve(str(name_or_path))
    mod = _import(path)

    def bad(problem: str) -> ClawrlError:
        return ClawrlError(f"persona file {path}: {problem}")

    missing = [n for n in REQUIRED if not hasattr(mod, n)]
    if missing:
        raise bad(f"missing {', '.join(missing)}; define them at module level ({EXAMPLE})")
    for key in ("NAME", "PREFERENCE"):
        if not isinstance(getattr(mod, key), str) or not getattr(mod, key).strip():
            raise bad(f"{key} must be a non-empty string")
    system = getattr(mod, "SYSTEM", None)
    if system is not None and not isinstance(system, str):
        raise bad("SYSTEM must be a string or None")
    prompts = {}
    for key in ("TRAIN_PROMPTS", "HELDOUT_PROMPTS"):
        value = getattr(mod, key)
        if not isinstance(value, (list, tuple)) or not value:
            raise bad(f"{key} must be a non-empty list of strings")
        wrong = [i for i, s in enumerate(value) if not isinstance(s, str) or not s.strip()]
        if wrong:
            raise bad(f"{key}[{wrong[0]}] is not a non-empty string; every prompt must be one")
        prompts[key] = list(value)
    shared = set(prompts["TRAIN_PROMPTS"]) & set(prompts["HELDOUT_PROMPTS"])
    if shared:
        raise bad(f"{len(shared)} prompt(s) are in both TRAIN_PROMPTS and HELDOUT_PROMPTS, e.g. "
                  f"{next(iter(shared))[:60]!r}; held-out prompts must not be trained on")
    if len(prompts["HELDOUT_PROMPTS"]) < MIN_HELDOUT:
        raise bad(f"HELDOUT_PROMPTS has {len(prompts['HELDOUT_PROMPTS'])} prompts; at least "
                  f"{MIN_HELDOUT} are needed for a stable held-out score")
    max_tokens = getattr(mod, "MAX_TOKENS", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad("MAX_TOKENS must be a positive integer (or left out for 160)")
    for key in ("score", "reply"):
        if not callable(getattr(mod, key)):
            raise bad(f"{key} must be a function")
    criteria = getattr(mod, "criteria", None)
    if criteria is not None and not callable(criteria):
        raise bad("criteria must be a function (or left out)")
    happy = getattr(mod, "HAPPY", 1.0)
    if isinstance(happy, bool) or not isinstance(happy, (int, float)) or not 0 < happy <= 1:
        raise bad("HAPPY must be a number in (0, 1] (or left out for 1.0): the score at which "
                  "the user is satisfied")
    return Persona(name=mod.NAME, preference=mod.PREFERENCE, system=system,
                   train_prompts=prompts["TRAIN_PROMPTS"],
                   heldout_prompts=prompts["HELDOUT_PROMPTS"],
                   score=_checked_score(mod.score, path), reply=_checked_reply(mod.reply, path),
                   max_tokens=max_tokens, criteria=criteria, happy=float(happy))


def _import(path: Path):
    """Import a file under a name unique to its path (so two `student.py` files never collide)."""
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    modname = f"_clawrl_persona_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(modname, resolved)
    if spec is None or spec.loader is None:
        raise ClawrlError(f"persona file {path}: cannot be imported; it must be a .py file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod          # dataclasses and pickling in the file look themselves up
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(modname, None)
        raise ClawrlError(f"persona file {path}: importing it failed with "
                          f"{type(e).__name__}: {e}; fix the file so it imports") from e
    return mod


def _checked_score(fn, path: Path):
    """Wrap a persona's score so a value outside [0, 1] is reported, not silently used."""
    @functools.wraps(fn)
    def score(prompt: str, response: str) -> float:
        value = fn(prompt, response)
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = math.nan
        if not 0.0 <= value <= 1.0:
            raise ClawrlError(f"persona file {path}: score() returned {value!r}; it must return "
                              "a number in [0, 1]")
        return value
    return score


def _checked_reply(fn, path: Path):
    """Wrap a persona's reply so a non-string or empty next message is reported."""
    @functools.wraps(fn)
    def reply(prompt: str, response: str, score: float, rng: random.Random) -> str:
        text = fn(prompt, response, score, rng)
        if not isinstance(text, str) or not text.strip():
            raise ClawrlError(f"persona file {path}: reply() returned {text!r}; it must return "
                              "the user's next message as a non-empty string")
        return text
    return reply
