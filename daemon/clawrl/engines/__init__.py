"""Serving engines; `make_engine` picks one by recipe (engine.kind).

embedded: transformers in this process. sglang / vllm: a server process over HTTP (remote.py).
tinker is refused by config._check in this release.
"""
from __future__ import annotations

from ..config import Config
from .base import Engine, Generation


def make_engine(cfg: Config) -> Engine:
    if cfg.engine.kind == "embedded":
        from .embedded import EmbeddedEngine
        return EmbeddedEngine(cfg)
    if cfg.engine.kind == "sglang":
        from .sglang import SGLangEngine
        return SGLangEngine(cfg)
    if cfg.engine.kind == "vllm":
        from .vllm import VLLMEngine
        return VLLMEngine(cfg)
    raise NotImplementedError(cfg.engine.kind)  # config._check refuses other kinds first


__all__ = ["Engine", "Generation", "make_engine"]
