"""The SGLang engine: SGLang's native API, token ids in and token ids out.

Protocol facts this module follows (SGLang's `python/sglang/srt/managers/io_struct.py`
GenerateReqInput / LoadLoRAAdapterReqInput / LoRAUpdateOutput, `entrypoints/http_server.py`, and
the "Sampling Parameters" and "LoRA Serving" documentation pages):

* `POST /generate` takes `input_ids`, `sampling_params` (`max_new_tokens`, `temperature` (0 =
  greedy), `top_p`, and from release 0.5.3 on `sampling_seed`: 0.5.2's SamplingParams has no such
  argument and refuses the request), `return_logprob`, `logprob_start_len` (-1 = output tokens only),
  `top_logprobs_num`, `stream` and `lora_path` (the *name* an adapter was loaded under; null =
  the base model).
* Streaming answers `data: {...}` lines and ends with `data: [DONE]`; a request SGLang refuses
  (a ValueError: too long, an unknown adapter, a bad parameter) is a `data: {"error":
  {"message"}}` line after the 200 (`entrypoints/http_server.py`, generate_request), a 400
  without streaming. Input and output must stay *below* the context: `input >= context_len` is
  refused, and so is `max_new_tokens + input >= context_len` up to at least release 0.5.4 and on
  main at commit 001067f (release 0.5.23 relaxed it to `>`), so `generation_margin` is 1. Each
  chunk has `text`, `output_ids` and `meta_info` with `output_token_logprobs` as `[logprob,
  token_id, text|null]` triples, `finish_reason` (null, or `{"type": "stop"|"length"|"abort",
  ...}`), `prompt_tokens`, `completion_tokens` and `cached_tokens`. Chunks are cumulative unless the server runs with
  `--incremental-streaming-output` (tokenizer_manager's output handling); `completion_tokens`
  is cumulative in both, so the new tokens are always the last `completion_tokens - seen`.
* Output logprobs are taken after temperature scaling unless the server process has
  `SGLANG_RETURN_ORIGINAL_LOGPROB=1` (layers/sampler.py from release 0.5.4; up to 0.5.3 it reads
  `RETURN_ORIGINAL_LOGPROB`). clawrl records the model's own logprobs (temperature 1), so it sets
  both for a server it launches.
* Scoring: `max_new_tokens: 0` with `return_logprob` and `logprob_start_len` returns
  `meta_info.input_token_logprobs` (and `input_top_logprobs` with `top_logprobs_num`) for the
  prompt positions from that start; the first position returned (the start itself) has no
  logprob (null), so `score` starts one token before the response.
* `POST /load_lora_adapter {"lora_name", "lora_path"}` and `POST /unload_lora_adapter
  {"lora_name"}` answer `{"success", "error_message", "loaded_adapters"}`, 400 on failure (e.g.
  a rank above `--max-lora-rank`). Runtime loading needs `--enable-lora` and `--dp-size 1`.
* `GET /health` is 200 when serving; `GET /server_info` (older: `/get_server_info`) returns the
  server arguments, among them `max_lora_rank`, `enable_lora` and `incremental_streaming_output`.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import httpx

from ..config import Config
from ..errors import AdapterRefused, RequestError
from ..types import Finish, GenParams
from .remote import (RemoteEngine, RemoteGeneration, TextStream, check_scored, error_message,
                     lora_load_body, lora_unload_body, refused, upstream_error)

FINISH = {"stop": "stop", "length": "length"}
# The first release whose SamplingParams takes `sampling_seed` (0.5.2's refuses it).
SEED_SINCE = (0, 5, 3)


def release(version: str) -> tuple[int, ...] | None:
    """'0.5.3.post1' -> (0, 5, 3); None when the server does not say or says something else."""
    parts = []
    for part in version.strip().lstrip("v").split(".")[:3]:
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts) if len(parts) == 3 else None


def generate_body(prompt_ids: list[int], p: GenParams, name: str | None) -> dict:
    """The streamed `/generate` request of one served turn (`name`: the adapter, None = base)."""
    sampling = {"max_new_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p}
    if p.seed is not None:   # honoured by SGLang with --enable-deterministic-inference
        sampling["sampling_seed"] = p.seed
    return {"input_ids": prompt_ids, "sampling_params": sampling,
            "return_logprob": True, "logprob_start_len": -1, "stream": True, "lora_path": name}


def score_body(context: list[int], response: list[int], k: int) -> dict:
    """The `/generate` request that scores `response` after `context` and generates nothing."""
    body = {"input_ids": context + response,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": max(0, len(context) - 1), "stream": False}
    if k:
        body["top_logprobs_num"] = k
    return body


class SGLangEngine(RemoteEngine):
    kind = "sglang"
    # SGLang refuses max_new_tokens + input >= context_len (tokenizer_manager.py,
    # _validate_one_request; only --allow-auto-truncate relaxes it): one position stays free.
    generation_margin = 1

    def launch_command(self, model_path: Path) -> tuple[list[str], dict[str, str]]:
        e, t = self.cfg.engine, self.cfg.train
        targets = ["all"] if t.lora_targets == "all-linear" else \
            [s.strip() for s in t.lora_targets.split(",") if s.strip()]
        argv = (shlex.split(e.command) or [sys.executable, "-m", "sglang.launch_server"]) + [
            "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(e.port),
            "--served-model-name", self.cfg.model.name,
            "--context-length", str(self.cfg.model.context_length),
            "--enable-lora", "--max-lora-rank", str(e.max_lora_rank),
            "--lora-target-modules", *targets,
            "--max-loras-per-batch", str(e.max_loras_per_batch),
            "--tp-size", str(e.tensor_parallel), "--dp-size", str(e.data_parallel),
        ] + shlex.split(e.extra_args)
        # SGLang reads the first name from 0.5.4, the second up to 0.5.3 (layers/sampler.py);
        # without it the recorded logprobs would silently be temperature-scaled.
        env = {**os.environ, "SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "RETURN_ORIGINAL_LOGPROB": "1"}
        if e.serve_gpus:
            env["CUDA_VISIBLE_DEVICES"] = e.serve_gpus
        return argv, env

    def check(self, params: GenParams) -> None:
        """A seed on a server without `sampling_seed` is the caller's to drop, not a 502 later."""
        known = release(self.server_version)
        if params.seed is not None and known is not None and known < SEED_SINCE:
            raise RequestError(
                f"this SGLang server ({self.server_version}) has no per-request seed: "
                f"'sampling_seed' came in SGLang {'.'.join(map(str, SEED_SINCE))}. Send the request "
                "without 'seed', or upgrade the server", param="seed", code="unsupported_parameter")

    def server_info(self) -> dict:
        for path in ("/server_info", "/get_server_info"):
            r = self._client.get(f"{self.url}{path}")
            if r.status_code == 200:
                return r.json()
        return {}

    async def _stream(self, gen: RemoteGeneration, name: str | None, text: TextStream) -> Finish:
        body = generate_body(gen.prompt_ids, gen.params, name)
        seen, prompt_tokens, cached = 0, len(gen.prompt_ids), 0
        assert self._aclient is not None     # submit() made it
        async with self._aclient.stream("POST", f"{self.url}/generate", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                raise upstream_error(self.kind, r)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:     # SGLang's own refusal of this request (a ValueError)
                    raise refused(self.kind, str(chunk["error"].get("message", chunk)))
                meta = chunk.get("meta_info") or {}
                triples = meta.get("output_token_logprobs") or []
                total = meta.get("completion_tokens", seen + len(triples))
                for lp, token, _ in (triples[len(triples) - (total - seen):] if total > seen else []):
                    self.emit(gen, text, int(token), lp)
                seen = max(seen, total)
                prompt_tokens = meta.get("prompt_tokens", prompt_tokens)
                cached = meta.get("cached_tokens", cached) or 0
                finish = meta.get("finish_reason")
                if finish:
                    kind = finish.get("type", "") if isinstance(finish, dict) else str(finish)
                    if kind == "abort":
                        raise upstream_error(self.kind, r, f"request aborted: "
                                                           f"{finish.get('message', finish)}")
                    return Finish(FINISH.get(kind, "stop"), prompt_tokens, len(text.ids), cached,
                                  gen.adapter)
        return Finish("stop", prompt_tokens, len(text.ids), cached, gen.adapter)

    def _server_load(self, name: str, path: Path) -> None:
        r = self._client.post(f"{self.url}/load_lora_adapter", json=lora_load_body(name, path))
        if r.status_code != 200 or r.json().get("success") is False:
            raise AdapterRefused(f"SGLang refused the adapter: {error_message(r)}")

    def _server_unload(self, name: str) -> None:
        r = self._client.post(f"{self.url}/unload_lora_adapter", json=lora_unload_body(name))
        if r.status_code != 200:
            raise RuntimeError(error_message(r))


def score(client: httpx.Client, url: str, cfg: Config, context: list[int], response: list[int],
          k: int):
    """Logprob of each response token after `context` under the base model (and the top `k`
    per position): one `/generate` call that generates nothing."""
    r = client.post(f"{url}/generate", json=score_body(context, response, k))
    if r.status_code != 200:
        if r.status_code >= 500:
            raise httpx.HTTPStatusError(error_message(r), request=r.request, response=r)
        raise ValueError(f"SGLang refused to score: {error_message(r)}")
    meta = r.json()["meta_info"]
    tail = meta["input_token_logprobs"][-len(response):]
    logps = check_scored("sglang", response, [int(t[1]) for t in tail], [t[0] for t in tail])
    top = None
    if k:
        rows = meta["input_top_logprobs"][-len(response):]
        top = {"ids": [[int(t[1]) for t in row[:k]] for row in rows],
               "logp": [[float(t[0]) for t in row[:k]] for row in rows]}
    return logps, top
