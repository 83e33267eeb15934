"""Serving engines; `make_engine` picks one by recipe (engine.kind).

embedded: transformers in this process. sglang / vllm: a server process over HTTP (remote.py).
tinker: the Tinker service through its SDK (tinker.py).
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
    if cfg.engine.kind == "tinker":
        from .tinker import TinkerEngine
        return TinkerEngine(cfg)
    raise NotImplementedError(cfg.engine.kind)  # config._check refuses other kinds first


__all__ = ["Engine", "Generation", "make_engine"]
