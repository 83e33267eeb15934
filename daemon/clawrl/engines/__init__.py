"""Serving engines. Only `embedded` exists in this release; `make_engine` picks by recipe."""
from __future__ import annotations

from ..config import Config
from .base import Engine, Generation


def make_engine(cfg: Config) -> Engine:
    if cfg.engine.kind == "embedded":
        from .embedded import EmbeddedEngine
        return EmbeddedEngine(cfg)
    raise NotImplementedError(cfg.engine.kind)  # config._check refuses other kinds first


__all__ = ["Engine", "Generation", "make_engine"]
