"""The vLLM engine: vLLM's OpenAI-compatible completions API with token-id prompts.

Protocol facts this module follows (vLLM's `vllm/entrypoints/openai/completion/protocol.py`
CompletionRequest / CompletionLogProbs, `completion/serving.py`, `models/serving.py` and the "LoRA
Adapters" documentation page, section "Dynamically serving LoRA Adapters"):

* `POST /v1/completions` accepts `prompt` as a list of token ids, used as given. `model` names the
  base model (`--served-model-name`) or a loaded LoRA adapter. With `logprobs: N` each choice has
  `logprobs: {tokens, token_logprobs, top_logprobs, text_offset}`; `return_tokens_as_token_ids`
  writes each token as `"token_id:<id>"`, so ids come back exactly. Logprobs are the model's own
  (the sampler's default `logprobs_mode` is `raw_logprobs`: before temperature and top-p).
* `stream: true` sends `data: {...}` chunks holding only the new tokens (delta output) and ends
  with `data: [DONE]`; with `stream_options.include_usage` a last chunk with no choices carries
  `usage` (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens` when the
  server reports it). `finish_reason` is `stop`, `length` or `abort`. Errors are
  `{"error": {"message", "type", "param", "code"}}` (older servers: `{"object": "error", ...}`).
* Scoring: `prompt_logprobs: K` (not with `stream`) adds `prompt_logprobs` to the choice: one entry
  per prompt token, null for the first, else `{"<token id>": {"logprob", "rank",
  "decoded_token"}}` holding the actual token and the top K.
* With `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` the server has `POST /v1/load_lora_adapter
  {"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter {"lora_name"}`; success is 200
  with a plain-text body, failure an error body (an adapter whose rank is above
  `--max-lora-rank` fails with "LoRA rank R is greater than max_lora_rank M."). A name can be
  loaded once: each version gets a new name and path.
* Server options: `vllm serve MODEL --enable-lora --max-lora-rank R --max-loras N
  --tensor-parallel-size T --data-parallel-size D`, plus `--enable-prompt-tokens-details` (else
  usage has no cached tokens) and `--max-logprobs` (default 20: more logprobs per position are
  refused); `--max-lora-rank` takes 1, 8, 16, 32, 64, 128,
  256, 320 or 512 (vllm/config/lora.py). `GET /health` is 200 when serving.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import httpx

from ..config import Config
from ..errors import AdapterRefused
from ..types import Finish, GenParams
from .remote import (RemoteEngine, RemoteGeneration, TextStream, check_scored, error_message,
                     lora_load_body, lora_unload_body, upstream_error)

TOKEN_ID = "token_id:"
FINISH = {"stop": "stop", "length": "length"}


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID):
        raise ValueError(f"vLLM sent token {token!r} without its id (return_tokens_as_token_ids)")
    return int(token[len(TOKEN_ID):])


def completion_body(model: str, prompt_ids: list[int], p: GenParams) -> dict:
    """The streamed `/v1/completions` request of one served turn (`model`: base or adapter name)."""
    body = {"model": model, "prompt": prompt_ids,
            "max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "stream": True, "stream_options": {"include_usage": True},
            "logprobs": 0, "return_tokens_as_token_ids": True}
    if p.seed is not None:
        body["seed"] = p.seed
    return body


def score_body(model: str, context: list[int], response: list[int], k: int) -> dict:
    """The one-token completion whose `prompt_logprobs` score `response` after `context`."""
    return {"model": model, "prompt": context + response, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": k}


def base_model_name(client: httpx.Client, url: str, cfg: Config) -> str:
    """The name requests use for the base model: ours when clawrl launched the server, else the
    first model `/v1/models` lists without a parent (LoRA adapters name theirs)."""
    if cfg.engine.launch:
        return cfg.model.name
    r = client.get(f"{url}/v1/models")
    r.raise_for_status()
    models = r.json().get("data", [])
    for m in models:
        if not m.get("parent"):
            return m["id"]
    raise ValueError(f"the vLLM server at {url} lists no base model on /v1/models")


class VLLMEngine(RemoteEngine):
    kind = "vllm"
    served_name: str = ""

    def launch_command(self, model_path: Path) -> tuple[list[str], dict[str, str]]:
        e = self.cfg.engine
        # The daemon's own interpreter, not a `vllm` found on PATH (systemd units set no PATH to
        # a virtual environment); vllm/entrypoints/cli/main.py is what the `vllm` script runs.
        argv = (shlex.split(e.command) or [sys.executable, "-m", "vllm.entrypoints.cli.main",
                                           "serve"]) + [
            str(model_path), "--host", "127.0.0.1", "--port", str(e.port),
            "--served-model-name", self.cfg.model.name,
            "--max-model-len", str(self.cfg.model.context_length),
            "--enable-lora", "--max-lora-rank", str(e.max_lora_rank),
            "--max-loras", str(e.max_loras_per_batch),
            "--tensor-parallel-size", str(e.tensor_parallel),
            "--data-parallel-size", str(e.data_parallel),
            # Without it usage has no prompt_tokens_details, so cached tokens always read 0.
            "--enable-prompt-tokens-details",
            # vLLM refuses more logprobs per position than this (default 20); opd.topk needs K.
            "--max-logprobs", str(max(20, self.cfg.opd.topk)),
        ] + shlex.split(e.extra_args)
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        if e.serve_gpus:
            env["CUDA_VISIBLE_DEVICES"] = e.serve_gpus
        return argv, env

    def server_info(self) -> dict:
        self.served_name = base_model_name(self._client, self.url, self.cfg)
        return {}   # vLLM does not report its LoRA limits outside its development mode

    def read_version(self) -> str:
        """`GET /version` answers {"version": ...} (entrypoints/openai/api_server.py)."""
        try:
            r = self._client.get(f"{self.url}/version")
            return str(r.json().get("version") or "") if r.status_code == 200 else ""
        except (httpx.HTTPError, ValueError, AttributeError):
            return ""

    async def _stream(self, gen: RemoteGeneration, name: str | None, text: TextStream) -> Finish:
        body = completion_body(name or self.served_name, gen.prompt_ids, gen.params)
        reason = ""                      # the server's finish_reason ("stop" when it gives none)
        usage: dict = {}
        assert self._aclient is not None     # submit() made it
        async with self._aclient.stream("POST", f"{self.url}/v1/completions", json=body) as r:
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
                if "error" in chunk or chunk.get("object") == "error":
                    err = chunk.get("error", chunk)
                    raise upstream_error(self.kind, r, str(err.get("message", chunk)))
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    lp = choice.get("logprobs") or {}
                    for token, logprob in zip(lp.get("tokens") or [], lp.get("token_logprobs") or []):
                        self.emit(gen, text, _token_id(token), logprob)
                    reason = choice.get("finish_reason") or reason
        if reason == "abort":
            raise upstream_error(self.kind, r, "request aborted by the server")
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return Finish(FINISH.get(reason, "stop"), usage.get("prompt_tokens", len(gen.prompt_ids)),
                      len(text.ids), cached, gen.adapter)

    def _server_load(self, name: str, path: Path) -> None:
        r = self._client.post(f"{self.url}/v1/load_lora_adapter", json=lora_load_body(name, path))
        if r.status_code == 404 and "detail" in r.text:
            raise AdapterRefused("the vLLM server has no /v1/load_lora_adapter: start it with "
                                 "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (clawrl does when it "
                                 "launches vLLM)")
        if r.status_code != 200:
            raise AdapterRefused(f"vLLM refused the adapter: {error_message(r)}")

    def _server_unload(self, name: str) -> None:
        r = self._client.post(f"{self.url}/v1/unload_lora_adapter", json=lora_unload_body(name))
        if r.status_code != 200:
            raise RuntimeError(error_message(r))


def score(client: httpx.Client, url: str, cfg: Config, context: list[int], response: list[int],
          k: int):
    """Logprob of each response token after `context` under the base model (and the top `k`
    per position), from `prompt_logprobs` of a one-token completion."""
    body = score_body(base_model_name(client, url, cfg), context, response, k)
    r = client.post(f"{url}/v1/completions", json=body)
    if r.status_code != 200:
        if r.status_code >= 500:
            raise httpx.HTTPStatusError(error_message(r), request=r.request, response=r)
        raise ValueError(f"vLLM refused to score: {error_message(r)}")
    rows = r.json()["choices"][0]["prompt_logprobs"][-len(response):]
    logps = check_scored("vllm", response, response,
                         [(row or {}).get(str(t), {}).get("logprob") for row, t in zip(rows, response)])
    top = None
    if k:
        best = [sorted(((int(i), v["logprob"]) for i, v in (row or {}).items()),
                       key=lambda x: -x[1])[:k] for row in rows]
        top = {"ids": [[i for i, _ in b] for b in best], "logp": [[float(lp) for _, lp in b] for b in best]}
    return logps, top
