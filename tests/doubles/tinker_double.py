"""A DOUBLE of the Tinker service at the SDK-object boundary, not Tinker: Tinker cannot be reached
from these machines.

It stands in for `tinker.ServiceClient` and the object tree it returns, and for
`tinker.RestClient`, with the signatures clawrl calls in the real SDK (0.38,
`tinker/lib/public_interfaces/`): ServiceClient.create_sampling_client /
create_lora_training_client / create_training_client_from_state_with_optimizer / close,
SamplingClient.sample / compute_logprobs / get_tokenizer, TrainingClient.forward /
forward_backward / optim_step / save_state / save_weights_for_sampler,
RestClient.delete_checkpoint_from_tinker_path. Everything it hands back is
the real SDK's: its futures (`AwaitableConcurrentFuture`: `.result()`, `await`, `.future()`),
response types (SampleResponse, SampledSequence, ForwardBackwardOutput, TensorData,
OptimStepResponse, SaveWeights*Response) and exception classes. Only ServiceClient and RestClient
are replaced.

The compute is real: sampling and scoring run on clawrl's embedded engine with SmolLM2 (float32),
so tokens and logprobs are a real model's; training is PEFT LoRA plus AdamW with the loss formulas
of Tinker's "Loss functions" page (per-token losses summed; gradients accumulate until optim_step).

Tinker's storage is a folder: TINKER_DOUBLE_ROOT/checkpoints/<run>/{weights,sampler_weights}/<name>
holds PEFT files (and the optimizer state under weights/), named by tinker://<run>/<kind>/<name>;
so the trainer process saves a checkpoint and the daemon process samples from it, as on Tinker.
Every call is logged to TINKER_DOUBLE_ROOT/transcript.jsonl. Test knobs are read from
TINKER_DOUBLE_ROOT/control.json at each call:
  {"fail": {"<op>": {"id": "...", "error": "connection|unavailable|internal|bad_request",
                     "times": N}},        # the first N calls of op (per id and process) fail
   "hold": ["tinker://...", "base"]}      # samples on these samplers wait before they answer

Injected into `clawrl serve` and its trainer by tests/doubles/tinker_site/sitecustomize.py (on
PYTHONPATH), or passed in-process as an engine's `service_factory`. TINKER_DOUBLE_MODEL names the
local model folder that stands for every base model.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import tinker
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

FAKE_URL = "http://tinker-double.invalid/api/v1"   # for the SDK exceptions' httpx objects only
LAYERS = {"train_attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
          "train_mlp": ["gate_proj", "up_proj", "down_proj"], "train_unembed": ["lm_head"]}
LORA_ALPHA = 32


# -- storage, transcript, knobs -------------------------------------------------------------------------

def checkpoint_dir(root: Path, path: str) -> Path:
    """tinker://<run>/<kind>/<name> -> the folder that holds it."""
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(path)
    kind = {"training": "weights", "sampler": "sampler_weights"}[parsed.checkpoint_type]
    return root / "checkpoints" / parsed.training_run_id / kind / parsed.checkpoint_id


def error(kind: str, op: str) -> Exception:
    request = httpx.Request("POST", f"{FAKE_URL}/{op}")
    if kind == "connection":
        return tinker.APIConnectionError(request=request)
    status = {"unavailable": 503, "internal": 500, "bad_request": 400}[kind]
    cls = tinker.BadRequestError if status == 400 else tinker.InternalServerError
    return cls(f"double: {op} failed with {status}", response=httpx.Response(status, request=request),
               body=None)


class Backend:
    """One per process: the engine that samples, the folder that stores, the knobs and the log.
    Work runs on a background event loop thread, as the SDK runs its requests."""

    def __init__(self, root: Path, model_dir: Path):
        self.root, self.model_dir = root, model_dir
        self.root.mkdir(parents=True, exist_ok=True)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tinker-double", daemon=True).start()
        self.train_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self.pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="tinker-control")
        self.engine = None
        self.numbers: dict[str, int] = {}      # sampler weights folder -> engine adapter number
        self.failed: dict[str, int] = {}       # knob id -> failures injected so far
        self._lock = threading.Lock()

    def log(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), **fields})
        with self._lock, open(self.root / "transcript.jsonl", "a") as f:
            f.write(line + "\n")

    def control(self) -> dict:
        try:
            return json.loads((self.root / "control.json").read_text())
        except (OSError, ValueError):
            return {}

    def maybe_fail(self, op: str) -> None:
        knob = self.control().get("fail", {}).get(op)
        if not knob:
            return
        with self._lock:
            done = self.failed.get(knob["id"], 0)
            if done >= knob["times"]:
                return
            self.failed[knob["id"]] = done + 1
        self.log("fail", op=op, error=knob["error"], n=done + 1)
        raise error(knob["error"], op)

    async def held(self, key: str) -> None:
        while key in self.control().get("hold", []):
            await asyncio.sleep(0.05)

    def submit(self, coro) -> AwaitableConcurrentFuture:
        return AwaitableConcurrentFuture(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def run(self, pool, fn, *args) -> AwaitableConcurrentFuture:
        return AwaitableConcurrentFuture(pool.submit(fn, *args))

    def ensure_engine(self):
        with self._lock:
            if self.engine is None:
                from clawrl.config import Config
                from clawrl.engines.embedded import EmbeddedEngine
                cfg = Config()
                cfg.home = Path(tempfile.mkdtemp(prefix="tinker-double-"))
                cfg.model.source = str(self.model_dir)
                cfg.model.rope_scaling = "none"     # Tinker samples its model as it is
                cfg.engine.dtype = "float32"    # served logprobs then match a fresh forward pass
                cfg.engine.decode_weights = "float32"   # (int8 decode would be ~0.07 off)
                cfg.engine.threads = 1
                cfg.engine.max_concurrent = 8
                engine = EmbeddedEngine(cfg)
                engine.load()
                self.engine = engine
        return self.engine

    def adapter_number(self, model_path: str) -> int:
        folder = checkpoint_dir(self.root, model_path)
        if not (folder / "adapter_config.json").exists():
            request = httpx.Request("POST", f"{FAKE_URL}/create_sampling_session")
            raise tinker.NotFoundError(f"double: no sampler weights at {model_path}",
                                       response=httpx.Response(404, request=request), body=None)
        engine = self.ensure_engine()
        with self._lock:
            number = self.numbers.get(str(folder))
            if number is None:
                number = self.numbers[str(folder)] = len(self.numbers) + 1
                fresh = True
            else:
                fresh = False
        if fresh:
            engine.load_adapter(number, folder).result()
        return number


_BACKENDS: dict[tuple, Backend] = {}


def backend() -> Backend:
    key = (os.environ["TINKER_DOUBLE_ROOT"], os.environ["TINKER_DOUBLE_MODEL"])
    if key not in _BACKENDS:
        _BACKENDS[key] = Backend(Path(key[0]), Path(key[1]))
    return _BACKENDS[key]


# -- sampling ---------------------------------------------------------------------------------------------

class SamplingClient:
    def __init__(self, b: Backend, base_model: str, model_path: str | None, number: int):
        self.b, self.base_model, self.model_path, self.number = b, base_model, model_path, number

    @property
    def key(self) -> str:
        return self.model_path or "base"

    def get_base_model(self) -> str:
        return self.base_model

    def get_tokenizer(self):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(self.b.model_dir)

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
               **unsupported) -> AwaitableConcurrentFuture:
        if include_prompt_logprobs or topk_prompt_logprobs or any(unsupported.values()):
            raise NotImplementedError("the double samples; score with compute_logprobs")
        return self.b.submit(self._sample(prompt.to_ints(), num_samples, sampling_params))

    async def _sample(self, ids: list[int], n: int, p: types.SamplingParams) -> types.SampleResponse:
        from clawrl.types import GenParams
        self.b.log("sample_begin", model_path=self.model_path, prompt=ids)
        self.b.maybe_fail("sample")
        engine = self.b.engine
        stop = set(p.stop or []) if not isinstance(p.stop, str) else set()
        if any(not isinstance(s, int) for s in stop):
            raise NotImplementedError("the double stops at token ids only")
        sequences, cached = [], 0
        for _ in range(n):
            gen = engine.submit(ids, GenParams(max_tokens=p.max_tokens or 16,
                                               temperature=p.temperature, top_p=p.top_p,
                                               seed=p.seed), adapter=self.number)
            tokens, logprobs, stopped = [], [], False
            async for ev in gen:
                tokens.append(ev.token_id)
                logprobs.append(ev.logprob)
                if ev.token_id in stop:
                    stopped = True
                    gen.cancel()
                    break
            finish = await gen.wait()
            cached = finish.cached_tokens
            reason = "stop" if stopped or finish.reason == "stop" else "length"
            sequences.append(types.SampledSequence(
                stop_reason=reason, sequence_id=uuid.uuid4().hex,
                tokens_np=np.array(tokens, dtype=np.int32),
                logprobs_np=np.array(logprobs, dtype=np.float32)))
        await self.b.held(self.key)     # the test keeps this request in flight
        self.b.log("sample", model_path=self.model_path, base_model=self.base_model, prompt=ids,
                   params=p.model_dump(), output_ids=sequences[0].tokens,
                   output_logprobs=sequences[0].logprobs, stop_reason=sequences[0].stop_reason)
        return types.SampleResponse(sequences=sequences, prompt_cache_hit_tokens=cached)

    def compute_logprobs(self, prompt: types.ModelInput,
                         prompt_logprobs_last_n: int | None = None) -> AwaitableConcurrentFuture:
        return self.b.submit(self._logprobs(prompt.to_ints(), prompt_logprobs_last_n))

    async def _logprobs(self, ids: list[int], last_n: int | None) -> list[float | None]:
        import torch
        self.b.maybe_fail("compute_logprobs")
        engine, number = self.b.engine, self.number

        def forward():
            model = engine.model
            if number:
                model.set_adapter(f"v{number}")
                engine._set_adapter = number
                off = contextlib.nullcontext()
            else:
                off = model.disable_adapter() if model is not engine.base_model else \
                    contextlib.nullcontext()
            with torch.inference_mode(), off:
                logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])
            return [None] + logp.squeeze(-1).tolist()
        out = await asyncio.wrap_future(engine._call_in_worker(forward))
        if last_n is not None:
            out = [None] * (len(out) - last_n) + out[-last_n:]
        self.b.log("compute_logprobs", model_path=self.model_path, n=len(ids), last_n=last_n)
        return out


# -- training ---------------------------------------------------------------------------------------------

def _loss(loss_fn: str, lp, inputs: dict, config: dict):
    """Tinker's built-in losses as its documentation writes them (sums over tokens)."""
    import torch
    t = {k: v.to_torch().float() for k, v in inputs.items() if k != "target_tokens"}
    if loss_fn == "cross_entropy":
        return -(lp * t["weights"]).sum()
    ratio = torch.exp(lp - t["logprobs"])
    if loss_fn == "importance_sampling":
        return -(ratio * t["advantages"]).sum()
    if loss_fn == "ppo":
        clipped = torch.clamp(ratio, config.get("clip_low_threshold", 0.8),
                              config.get("clip_high_threshold", 1.2))
        return -torch.min(ratio * t["advantages"], clipped * t["advantages"]).sum()
    raise NotImplementedError(f"the double has no {loss_fn!r} loss")


class TrainingClient:
    def __init__(self, b: Backend, base_model: str, model, run: str):
        self.b, self.base_model, self.model, self.model_id = b, base_model, model, run
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = None

    def get_tokenizer(self):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(self.b.model_dir)

    def _adam(self):
        import torch
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.params, lr=0.0)
        return self.optimizer

    def _pass(self, data: list[types.Datum], loss_fn: str, config, backward: bool):
        import torch
        self.b.maybe_fail("forward_backward" if backward else "forward")
        outputs, total = [], 0.0
        for d in data:
            ids = d.model_input.to_ints()
            targets = d.loss_fn_inputs["target_tokens"].to_torch().long()
            with contextlib.nullcontext() if backward else torch.no_grad():
                logits = self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
                lp = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
                loss = _loss(loss_fn, lp, d.loss_fn_inputs, dict(config or {}))
                if backward:
                    loss.backward()
            outputs.append({"logprobs": types.TensorData.from_torch(lp.detach())})
            total += float(loss.detach())
        self.b.log("forward_backward" if backward else "forward", run=self.model_id,
                   loss_fn=loss_fn, config=dict(config or {}), lengths=[d.model_input.length for d in data],
                   inputs=[{k: v.tolist() for k, v in d.loss_fn_inputs.items()} for d in data],
                   loss=total)
        return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": total})

    def forward(self, data, loss_fn, loss_fn_config=None) -> AwaitableConcurrentFuture:
        return self.b.run(self.b.train_pool, self._pass, data, loss_fn, loss_fn_config, False)

    def forward_backward(self, data, loss_fn, loss_fn_config=None) -> AwaitableConcurrentFuture:
        return self.b.run(self.b.train_pool, self._pass, data, loss_fn, loss_fn_config, True)

    def optim_step(self, optim_params=None, *, adam_params=None) -> AwaitableConcurrentFuture:
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("Expected AdamParams")
        return self.b.run(self.b.train_pool, self._step, params)

    def _step(self, p: types.AdamParams) -> types.OptimStepResponse:
        import torch
        self.b.maybe_fail("optim_step")
        opt = self._adam()
        for group in opt.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps,
                         weight_decay=p.weight_decay)
        norm = torch.nn.utils.clip_grad_norm_(self.params, p.grad_clip_norm or float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.b.log("optim_step", run=self.model_id, params=p.model_dump(), grad_norm=float(norm))
        return types.OptimStepResponse(metrics={"grad_norm": float(norm)})

    def _save(self, kind: str, name: str):
        import torch
        path = f"tinker://{self.model_id}/{kind}/{name}"
        folder = checkpoint_dir(self.b.root, path)
        if folder.exists():
            request = httpx.Request("POST", f"{FAKE_URL}/save")
            raise tinker.ConflictError(f"double: {path} exists",
                                       response=httpx.Response(409, request=request), body=None)
        self.model.save_pretrained(folder)
        if kind == "weights":
            torch.save(self._adam().state_dict(), folder / "optimizer.pt")
        self.b.log("save_state" if kind == "weights" else "save_weights_for_sampler", path=path)
        return path

    def save_state(self, name: str, ttl_seconds=None, overwrite=False,
                   user_metadata=None) -> AwaitableConcurrentFuture:
        return self.b.run(self.b.train_pool, lambda: types.SaveWeightsResponse(
            path=self._save("weights", name)))

    def save_weights_for_sampler(self, name: str, ttl_seconds=None,
                                 user_metadata=None) -> AwaitableConcurrentFuture:
        return self.b.run(self.b.train_pool, lambda: types.SaveWeightsForSamplerResponse(
            path=self._save("sampler_weights", name)))


# -- the entry point ---------------------------------------------------------------------------------------

class ServiceClient:
    """Stands in for tinker.ServiceClient (it, too, reads TINKER_API_KEY)."""

    def __init__(self, user_metadata=None, project_id=None, *, api_key=None, **_):
        if not (api_key or os.environ.get("TINKER_API_KEY")):
            raise RuntimeError("double: no TINKER_API_KEY (the real SDK would fail to authenticate)")
        self.b = backend()
        self.b.log("service", api_key_set=True)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config=None, record_stability_info: bool = False):
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")

        def create():
            self.b.ensure_engine()
            number = self.b.adapter_number(model_path) if model_path else 0
            self.b.log("create_sampling_client", model_path=model_path, base_model=base_model,
                       sdk_retries=getattr(retry_config, "enable_retry_logic", None))
            return SamplingClient(self.b, base_model or "", model_path, number)
        return self.b.run(self.b.pool, create)

    def _training_client(self, base_model: str, rank: int, seed, layers: dict, path: str | None,
                         optimizer: bool) -> TrainingClient:
        import warnings

        import torch
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        base = AutoModelForCausalLM.from_pretrained(self.b.model_dir, dtype=torch.float32)
        run = f"run-{uuid.uuid4().hex[:8]}"
        if path is None:
            if seed is not None:
                torch.manual_seed(seed)
            targets = [m for flag, mods in LAYERS.items() if layers.get(flag) for m in mods]
            model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                    target_modules=targets, task_type="CAUSAL_LM"))
        else:
            model = PeftModel.from_pretrained(base, checkpoint_dir(self.b.root, path), is_trainable=True)
        model.eval()     # no dropout; gradients still flow
        client = TrainingClient(self.b, base_model, model, run)
        if path and optimizer:
            client._adam().load_state_dict(torch.load(checkpoint_dir(self.b.root, path) / "optimizer.pt"))
        self.b.log("training_client", run=run, base_model=base_model, rank=rank, layers=layers,
                   from_state=path, with_optimizer=optimizer)
        return client

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True,
                                    train_unembed: bool = True, user_metadata=None, optimizer=None):
        layers = {"train_mlp": train_mlp, "train_attn": train_attn, "train_unembed": train_unembed}
        return self.b.run(self.b.train_pool, self._training_client, base_model, rank, seed, layers,
                          None, False)

    def create_training_client_from_state_with_optimizer(self, path: str, base_model=None,
                                                          user_metadata=None,
                                                          weights_access_token=None):
        return self.b.run(self.b.train_pool, self._training_client, base_model or "", 0, None, {},
                          path, True)

    def close(self, status: str, detail: str | None = None) -> AwaitableConcurrentFuture:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        self.b.log("close", status=status)
        return AwaitableConcurrentFuture(done)


class RestClient:
    """Stands in for tinker.RestClient: checkpoint deletion, as clawrl uses it."""

    def __init__(self, api_key=None, **_):
        if not (api_key or os.environ.get("TINKER_API_KEY")):
            raise RuntimeError("double: no TINKER_API_KEY (the real SDK would fail to authenticate)")
        self.b = backend()

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> AwaitableConcurrentFuture:
        def delete():
            self.b.maybe_fail("delete_checkpoint")
            folder = checkpoint_dir(self.b.root, tinker_path)
            if not folder.exists():
                request = httpx.Request("DELETE", f"{FAKE_URL}/checkpoints")
                raise tinker.NotFoundError(f"double: no checkpoint at {tinker_path}",
                                           response=httpx.Response(404, request=request), body=None)
            shutil.rmtree(folder)
            self.b.log("delete_checkpoint", path=tinker_path)
        return self.b.run(self.b.pool, delete)


def install() -> None:
    """Make `tinker.ServiceClient` and `tinker.RestClient` the double in this process."""
    tinker.ServiceClient = ServiceClient
    tinker.RestClient = RestClient


# -- helpers for tests --------------------------------------------------------------------------------------

def write_sampler_weights(root: Path, model_dir: Path, name: str, seed: int, rank: int = 8) -> str:
    """Sampler weights as the trainer would leave them on Tinker, with a random small LoRA B (a
    version whose answers differ from the base): their tinker:// path."""
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=rank, lora_alpha=LORA_ALPHA,
                                           target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    path = f"tinker://test-run/sampler_weights/{name}"
    peft.save_pretrained(checkpoint_dir(root, path))
    return path
