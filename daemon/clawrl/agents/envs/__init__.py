"""The environments, by name."""
from __future__ import annotations

from ..env import Env

NAMES = ("toolcall", "terminal", "swe")


def get(name: str) -> Env:
    if name == "toolcall":
        from .toolcall import ToolCallEnv
        return ToolCallEnv()
    if name == "terminal":
        from .terminal import TerminalEnv
        return TerminalEnv()
    if name == "swe":
        from .swe import SweEnv
        return SweEnv()
    raise ValueError(f"unknown environment {name!r}; the environments are {', '.join(NAMES)}")
