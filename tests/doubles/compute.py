"""The compute behind the protocol doubles: clawrl's own embedded engine, so the tokens and
logprobs a double serves are real ones from a real model (float32 on the CPU).

A double is a stand-in for a server that cannot run on these machines (SGLang, vLLM): it speaks
that server's documented HTTP shapes and nothing more. This module holds what both doubles share:
the model, LoRA adapters loaded by name with the server's rank limit, scoring of prompt tokens,
and a transcript (JSONL) of every request, so tests can compare what clawrl recorded with what
the server actually sent. One test-only control route, `POST /_double/hold {"lora_name", "hold"}`,
pauses (and resumes) the streams of requests on an adapter, so a test can keep a request in
flight across a swap without depending on how fast this machine is.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import torch

from clawrl.config import Config
from clawrl.engines.embedded import EmbeddedEngine
from clawrl.types import GenParams


class Transcript:
    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": event, "at": time.time(), **fields})
        with self._lock, open(self.path, "a") as f:
            f.write(line + "\n")


class Compute:
    def __init__(self, model_path: str, context_length: int, max_lora_rank: int,
                 transcript: Transcript):
        cfg = Config()
        cfg.home = Path(tempfile.mkdtemp(prefix="clawrl-double-"))
        cfg.model.source = model_path
        cfg.model.context_length = context_length
        # A server reads the model folder it is given as it is (its config.json says the RoPE: the
        # long-context variant clawrl hands a server it launches carries YaRN in it).
        cfg.model.rope_scaling = "none"
        cfg.engine.dtype = "float32"       # served logprobs then match a fresh forward pass
        cfg.engine.decode_weights = "float32"   # (int8 decode would be ~0.07 off)
        cfg.engine.threads = 1
        cfg.engine.max_concurrent = 8
        self.engine = EmbeddedEngine(cfg)
        self.engine.load()
        self.tokenizer = self.engine.tokenizer
        self.max_lora_rank = max_lora_rank
        self.transcript = transcript
        self.adapters: dict[str, int] = {}     # lora name -> the engine's adapter number
        self.paths: dict[str, str] = {}
        self.inflight: dict[str, int] = {}
        self.held: dict[str, asyncio.Event] = {}   # test knob: pause streams on an adapter
        self._next = 1

    # -- adapters ------------------------------------------------------------------------------------
    @staticmethod
    def adapter_rank(path: str) -> int:
        return int(json.loads((Path(path) / "adapter_config.json").read_text())["r"])

    async def load(self, name: str, path: str) -> None:
        number, self._next = self._next, self._next + 1
        await asyncio.wrap_future(self.engine.load_adapter(number, path))
        self.adapters[name], self.paths[name] = number, path

    async def unload(self, name: str) -> None:
        number = self.adapters.pop(name)
        self.paths.pop(name, None)
        await asyncio.wrap_future(self.engine.unload_adapter(number))

    # -- generation and scoring --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self, name: str | None):
        """Count a request on adapter `name` while it runs."""
        key = name or ""
        self.inflight[key] = self.inflight.get(key, 0) + 1
        try:
            yield
        finally:
            self.inflight[key] -= 1

    async def gate(self, name: str | None) -> None:
        """Wait while a test holds requests on adapter `name` (see /_double/hold)."""
        event = self.held.get(name or "")
        if event is not None:
            await event.wait()

    def hold(self, name: str | None, on: bool) -> None:
        key = name or ""
        if on:
            self.held.setdefault(key, asyncio.Event())
        elif key in self.held:
            self.held.pop(key).set()

    def submit(self, ids: list[int], max_tokens: int, temperature: float, top_p: float,
               seed: int | None, name: str | None):
        adapter = self.adapters[name] if name else 0
        return self.engine.submit(ids, GenParams(max_tokens=max_tokens, temperature=temperature,
                                                 top_p=top_p, seed=seed), adapter=adapter)

    async def prompt_logprobs(self, ids: list[int], k: int) -> list[tuple[float, list[tuple[int, float]]]]:
        """For every position i >= 1: (logprob of ids[i] after ids[:i], its top k (id, logprob)),
        from the base model, computed on the engine's worker between two decode steps."""
        engine = self.engine

        def forward():
            off = (engine.model.disable_adapter() if engine.model is not engine.base_model
                   else contextlib.nullcontext())
            with torch.inference_mode(), off:
                logits = engine.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            actual = logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()
            top = logp.topk(k, dim=-1) if k else None
            return [(a, list(zip(top.indices[i].tolist(), top.values[i].tolist())) if top else [])
                    for i, a in enumerate(actual)]
        return await asyncio.wrap_future(engine._call_in_worker(forward))


def model_context_length(model_path: str, asked: int | None) -> int:
    if asked:
        return asked
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings", 8192))


def serve(app, host: str, port: int) -> None:
    """Bind only now, after the model loaded: like the real servers, the port refuses connections
    until the server can answer."""
    import uvicorn
    uvicorn.run(app, host=host, port=port, log_level="warning")


def pid_line(transcript: Transcript, argv: list[str]) -> None:
    transcript.write("start", pid=os.getpid(), argv=argv)
