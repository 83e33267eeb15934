"""The embedded engine: transformers in this process, one worker thread that owns the model.

Scheduling: requests wait in a FIFO; up to `engine.max_concurrent` are active at once. Each pass
of the worker gives every active request one unit of work: a prefill chunk for each request still
reading its prompt (prefilled alone: padding long prompts together wastes time), then one token
for all decoding requests in a single batched forward (`kvbatch.DecodeBatch`). A long prompt never
starves a stream that is already decoding, and nobody waits behind a full answer. Cancelled
requests (client gone) stop at their next step.

Prefix reuse: every request's KV cache comes from a pool keyed by the tokens it holds, so only
what is new in a prompt is prefilled (engines/prefix_pool.py). Versions live in adapter slots
(engines/adapter_slots.py); the decode step is engines/fastdecode.py's.

Logprobs are those of the model itself (temperature 1, before top-p), as OpenAI and vLLM report
them and as the trainer recomputes them; sampling applies temperature and top-p on top.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch

from ..chat.format import template_supports_tools
from ..adapters.versions import PEFT_KIND
from ..config import Config
from ..models import bf16_supported, log, model_dir
from ..types import Finish, GenParams, TokenEvent
from .adapter_slots import AdapterSlots
from .base import Generation, render_checked
from .fastdecode import FastDecoder, int8_available, supported
from .kvbatch import DecodeBatch
from .prefix_pool import Entry, PrefixPool

if TYPE_CHECKING:   # transformers and peft load with the model, not with this module
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Prompt tokens per scheduling step while other requests are active. Alone, a request prefills its
# whole prompt in one forward: every chunk after the first attends through an explicit mask, which
# on CPU is ~2.4x slower in total for a 9k prompt (measured: 64 s in 512-token chunks, 27 s whole).
PREFILL_CHUNK = 2048


@dataclass
class _Request:
    gen: Generation
    entry: Entry
    generator: torch.Generator
    adapter: int = 0                  # the version this request runs on from start to end
    next_token: int | None = None     # sampled, sent, not yet fed to the model
    out_ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0            # incremental detokenizing: tokens [prefix, read) are
    read_offset: int = 0              # context, tokens from `read` on are not yet sent as text
    cached: int = 0


class EmbeddedEngine:
    generation_margin = 0      # it generates up to the last position of the context
    adapter_kind = PEFT_KIND

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model_id = cfg.model.name
        self.context_length = cfg.model.context_length
        self.adapter_version = 0          # what new requests get; 0 = the base model
        self.loaded_adapters: set[int] = set()
        self._set_adapter: int | None = None   # PEFT's current adapter, to skip needless switches
        self.parse_tools = True
        self.model: PreTrainedModel | PeftModel | None = None   # the base, or PeftModel around it
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._pending: collections.deque[Generation] = collections.deque()
        self._active: list[_Request] = []
        self.prefix_pool = PrefixPool(cfg.engine.prefix_cache_entries)
        self._cv = threading.Condition()
        self._commands: collections.deque = collections.deque()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._batch: DecodeBatch | None = None
        self.fast: FastDecoder | None = None   # the decode step (engines/fastdecode.py)
        self.slots = AdapterSlots()            # where loaded versions live in the PeftModel
        self.decode_path = "transformers"

    # -- lifecycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load the model and start serving, both on the worker thread, which then owns every
        multi-threaded torch operation of the process: libgomp gives each thread that runs
        parallel regions its own pool, and once a second live pool exists it stops spinning
        between regions, which made each decode step ~2x slower (bench/RESULTS-serve.md)."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="clawrl-engine",
                                        daemon=True)
        self._thread.start()
        ready.result()          # a load error is raised here, in the caller

    def _main(self, ready: concurrent.futures.Future) -> None:
        try:
            self._load()
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(None)
        self._run()

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = model_dir(self.cfg)
        want = self.cfg.engine.dtype
        if want == "auto":
            want = "bfloat16" if bf16_supported() else "float32"
        self.dtype = getattr(torch, want)
        torch.set_num_threads(self.cfg.engine.threads or os.cpu_count() or 1)
        # The worker runs the model's Python between torch ops while holding the GIL; at the
        # default 5 ms switch interval the event loop waited up to 5 ms to send each token.
        sys.setswitchinterval(0.0005)
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.base_model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype).eval()
        self.model = self.base_model      # becomes a PeftModel around it at the first adapter
        self.model.generation_config.max_length = None  # we bound length ourselves
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {i for i in eos + [self.tokenizer.eos_token_id] if i is not None}
        self.tools_in_template = template_supports_tools(self.tokenizer)
        self.fast = self._fast_decoder(want)
        log(f"loaded {self.model_id} from {path} in {time.perf_counter() - t0:.1f} s ({want}; "
            f"decode: {self.decode_path})")
        self._batch = DecodeBatch(self.base_model.config)

    def _fast_decoder(self, dtype: str) -> FastDecoder | None:
        """The decode step `engine.decode_weights` asks for, or None for transformers' forward
        (asked for, or the model has no fast step: said once in the log)."""
        want = self.cfg.engine.decode_weights
        if want == "auto":
            want = "int8" if int8_available() else dtype
        elif want == "int8" and not int8_available():
            log("engine.decode_weights = int8 needs fbgemm (an x86 CPU); decoding in "
                f"{dtype} instead")
            want = dtype
        why = None if want == "general" else supported(self.base_model)
        if want == "general" or why:
            if why:
                log(f"{why}; decoding with transformers' forward")
            self.decode_path = "transformers"
            return None
        self.decode_path = f"fast step, {want} weights"
        return FastDecoder(self.base_model, want)

    def _fast_name(self, version: int) -> str | None | Literal[False]:
        """The fast step's name for `version` (None = the base), or False where it cannot
        decode it (an adapter it could not read: PEFT's path serves that version)."""
        if self.fast is None:
            return False
        if not version:
            return None
        name = self.slots.slot.get(version)
        return name if name is not None and self.fast.has_adapter(name) else False

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread:
            self._thread.join(timeout=10)

    # -- proxy-facing -------------------------------------------------------------------------
    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return render_checked(self.tokenizer, messages, tools, self.context_length)

    def submit(self, prompt_ids: list[int], params: GenParams,
               adapter: int | None = None) -> Generation:
        """Queue a generation on `adapter` (a loaded version; 0 = base; None = the active one)."""
        import asyncio
        gen = Generation(prompt_ids, params, asyncio.get_running_loop())
        gen.adapter = self.adapter_version if adapter is None else adapter
        with self._cv:
            self._pending.append(gen)
            self._cv.notify()
        return gen

    # -- adapters (hot-swap) --------------------------------------------------------------------
    def _call_in_worker(self, fn):
        """Run fn on the worker thread between two passes (never during a forward); a future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._commands.append((fn, fut))
            self._cv.notify()
        return fut

    def between_passes(self, fn) -> concurrent.futures.Future:
        """Run `fn` on the worker thread between two scheduling passes, on the worker's own torch
        threads (a future of its result). For short CPU work of another stage that would
        otherwise start a second thread pool (see load): the probe judge's readings. Every
        request waits while it runs, so keep each call short."""
        return self._call_in_worker(fn)

    def load_adapter(self, version: int, path) -> concurrent.futures.Future:
        """Load a version into a slot (engines/adapter_slots.py): copied into a free one when
        its LoRA config fits, else through PEFT."""
        def load():
            # peft asks transformers a deprecated question on every load; the answer is still right.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                    category=FutureWarning)
            assert self.model is not None       # loaded before any request or command
            self.model = self.slots.load(self.model, self.base_model, version, Path(path))
            name = self.slots.name(version)
            if self.fast is not None:
                try:
                    self.fast.add_adapter(self.model, name)
                except ValueError as e:
                    log(f"adapter {name}: {e}; it decodes through PEFT")
                else:   # live at once, unmerged; merged (as fast as the base) a few seconds later
                    threading.Thread(target=self._merge, args=(self.fast, name), daemon=True,
                                     name=f"clawrl-merge-{name}").start()
            self.loaded_adapters.add(version)
        return self._call_in_worker(load)

    def _merge(self, fast: FastDecoder, name: str) -> None:
        """Off the worker thread: pack the weights with adapter `name` merged in for the fast
        step. Until it is done, and if it fails, the adapter decodes unmerged."""
        torch.set_num_threads(1)    # a second thread pool would slow the worker (see load)
        try:    # the lowest priority: a core it holds stalls every parallel region of a step
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
        t0 = time.perf_counter()
        try:
            if fast.merge_adapter(self.model, name):
                log(f"adapter {name} merged into the decode weights in "
                    f"{time.perf_counter() - t0:.1f} s")
        except Exception as e:     # unloaded meanwhile, or out of memory: unmerged still serves
            log(f"adapter {name} not merged ({e!r}); it decodes unmerged")

    def unload_adapter(self, version: int) -> concurrent.futures.Future:
        """Free a version's weights once no running request uses it (it is then skipped)."""
        def unload():
            busy = {r.adapter for r in self._active} | {g.adapter for g in self._pending}
            if version in self.loaded_adapters and version not in busy and version != self.adapter_version:
                name = self.slots.name(version)
                if self.fast is not None:
                    self.fast.drop_adapter(name)
                self.model = self.slots.release(self._peft(), self.base_model, version)
                if self._set_adapter == version:
                    self._set_adapter = None
                self.loaded_adapters.discard(version)
                self.prefix_pool.drop_version(version)
                return True
            return False
        return self._call_in_worker(unload)

    def activate(self, version: int) -> None:
        """New requests run on `version` from now on; running ones finish on theirs."""
        if version != 0 and version not in self.loaded_adapters:
            raise ValueError(f"adapter version {version} is not loaded")
        self.adapter_version = version

    def _peft(self) -> PeftModel:
        """The PeftModel around the base: what self.model is once an adapter was loaded."""
        return cast("PeftModel", self.model)

    def _adapter_call(self, reqs):
        """Keyword arguments and context for a forward over `reqs`. One shared version takes
        PEFT's plain path (set_adapter / disable_adapter); only a batch that mixes versions pays
        for per-row routing (`adapter_names`), which is several times slower on CPU."""
        if self.model is self.base_model:
            return {}, contextlib.nullcontext()
        versions = {r.adapter for r in reqs}
        if len(versions) > 1:
            return ({"adapter_names": [self.slots.name(r.adapter) if r.adapter else "__base__"
                                       for r in reqs]},
                    contextlib.nullcontext())
        (version,) = versions
        if version == 0:
            return {}, self._peft().disable_adapter()
        if self._set_adapter != version:
            self._peft().set_adapter(self.slots.name(version))
            self._set_adapter = version
        return {}, contextlib.nullcontext()

    def queue_depth(self) -> int:
        """Requests waiting for a decode slot (not counting the active ones)."""
        return len(self._pending)

    def active_count(self) -> int:
        return len(self._active)

    def status(self) -> dict:
        alive = bool(self._thread and self._thread.is_alive())
        return {"kind": "embedded", "state": "running" if alive else "not started",
                "available": alive, "active": len(self._active), "decode": self.decode_path,
                "adapters": sorted(self.loaded_adapters), "adapter_slots": self.slots.status()}

    # -- worker ---------------------------------------------------------------------------------
    def _run(self) -> None:
        assert self._batch is not None      # _load made it
        torch.set_num_threads(self.cfg.engine.threads or os.cpu_count() or 1)
        while True:
            with self._cv:
                while not self._stop and not self._pending and not self._active and not self._commands:
                    self._cv.wait()
                if self._stop:
                    break
                commands = list(self._commands)
                self._commands.clear()
                admit: list[Generation] = []
                while self._pending and len(self._active) + len(admit) < self.cfg.engine.max_concurrent:
                    admit.append(self._pending.popleft())
            for fn, fut in commands:
                try:
                    fut.set_result(fn())
                except Exception as e:
                    fut.set_exception(e)
            for gen in admit:
                if gen.adapter and gen.adapter not in self.loaded_adapters:
                    gen.close(error=RuntimeError(f"adapter version {gen.adapter} was unloaded"))
                    continue
                self._active.append(self._admit(gen))
            self._pass()
        self._batch.split()
        for req in self._active:
            req.gen.close(self._finish(req, "cancelled"))

    def _pass(self) -> None:
        """One scheduling pass: a prefill chunk for each prefilling request, then one decode
        step for all decoding requests together."""
        decoding = []
        for req in list(self._active):
            if req.gen.cancelled:
                self._done(req, self._finish(req, "cancelled"))
            elif req.next_token is None:
                self._guarded([req], self._prefill_chunk)
            else:
                decoding.append(req)
        if decoding:
            self._guarded(decoding, self._decode)

    def _guarded(self, reqs: list[_Request], work) -> None:
        """Run work on requests; if it fails, fail them (a bad request must not stop the engine)."""
        assert self._batch is not None      # _load made it
        try:
            work(reqs)
        except Exception as e:
            log(f"generation failed: {e!r}")
            if any(r in self._batch.members for r in reqs):
                self._batch.members, self._batch.cache = [], None   # its caches are suspect
            for req in reqs:
                if req in self._active:
                    self._active.remove(req)
                    self.prefix_pool.drop(req.entry)
                    req.gen.close(error=e)

    def _done(self, req: _Request, finish: Finish | None) -> None:
        assert self._batch is not None      # _load made it
        if req in self._batch.members:
            self._batch.split()
        if finish is not None:
            req.gen.close(finish)
        self._active.remove(req)
        self.prefix_pool.release(req.entry)

    def _prefill_chunk(self, reqs: list[_Request]) -> None:
        """Feed the next chunk of the prompt. On the fast step, the prompt's last token is fed
        by it, alone: a reused prefix then ends exactly where a cold prefill does, so the
        first token's logits, and every one after, are the same bits warm or cold (int8's
        per-step quantization would magnify the rounding of a longer forward into other
        tokens, and seeded sampling would not repeat)."""
        (req,) = reqs
        ids, fed = req.gen.prompt_ids, len(req.entry.ids)
        name = self._fast_name(req.adapter)
        end = len(ids) - 1 if name is not False else len(ids)
        if fed >= end:
            assert self.fast is not None and name is not False   # end is one short on the fast step only
            logits = self.fast.step([ids[-1]], [fed], req.entry.cache, adapter=name)[0]
            req.entry.ids.append(ids[-1])
            self._emit(req, logits)
            return
        stop = min(end, fed + PREFILL_CHUNK) if len(self._active) > 1 else end
        logits = self._forward(req, ids[fed:stop])
        if len(req.entry.ids) == len(ids):
            self._emit(req, logits)

    def _decode(self, reqs: list[_Request]) -> None:
        assert self._batch is not None      # _load made it
        tokens = [r.next_token for r in reqs if r.next_token is not None]
        assert len(tokens) == len(reqs)     # _pass decodes only the requests with a token to feed
        names = {self._fast_name(r.adapter) for r in reqs}
        name = names.pop() if len(names) == 1 else False   # one version the fast step knows, or False
        if len(reqs) == 1:
            if self._batch.members:
                self._batch.split()
            req = reqs[0]
            if name is not False:
                assert self.fast is not None    # _fast_name says False without it
                logits = self.fast.step(tokens, [len(req.entry.ids)], req.entry.cache, adapter=name)
                req.entry.ids.append(tokens[0])
            else:
                logits = self._forward(req, tokens).unsqueeze(0)
        else:
            if not self._batch.matches(reqs):
                self._batch.split()
                self._batch.join(reqs)
            if name is not False:
                logits = self._batch.step_with(self.fast, tokens, name)
            else:
                kwargs, ctx = self._adapter_call(reqs)
                with ctx:
                    logits = self._batch.step(self.model, tokens, kwargs)
        for req, row in zip(list(reqs), logits):
            self._emit(req, row)

    def _admit(self, gen: Generation) -> _Request:
        from transformers import DynamicCache

        assert self._batch is not None      # _load made it
        entry, cached = self.prefix_pool.take(
            gen.prompt_ids, gen.adapter, lambda: DynamicCache(config=self.base_model.config),
            self._batch.split)
        g = torch.Generator()
        g.manual_seed(gen.params.seed if gen.params.seed is not None else int.from_bytes(os.urandom(4), "little"))
        return _Request(gen=gen, entry=entry, generator=g, cached=cached, adapter=gen.adapter)

    @torch.inference_mode()
    def _forward(self, req: _Request, tokens: list[int]) -> torch.Tensor:
        assert self.model is not None       # _load made it
        kwargs, ctx = self._adapter_call([req])
        with ctx:
            out = self.model(input_ids=torch.tensor([tokens]), cache=req.entry.cache, use_cache=True,
                             logits_to_keep=1, **kwargs)
        req.entry.ids.extend(tokens)
        return out.logits[0, -1].float()

    def _emit(self, req: _Request, logits: torch.Tensor) -> None:
        """Sample the next token, send it, and finish the request at EOS or its length limit."""
        p = req.gen.params
        logprobs = torch.log_softmax(logits, dim=-1)
        if p.temperature <= 1e-5:
            token = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                sorted_p[(sorted_p.cumsum(0) - sorted_p) > p.top_p] = 0.0
                token = int(order[torch.multinomial(sorted_p, 1, generator=req.generator)])
            else:
                token = int(torch.multinomial(probs, 1, generator=req.generator))
        lp = float(logprobs[token])
        if token in self.eos_ids:
            req.gen.put(TokenEvent(token, lp, ""))
            req.out_ids.append(token)
            self._done(req, self._finish(req, "stop"))
            return
        req.out_ids.append(token)
        req.gen.put(TokenEvent(token, lp, self._new_text(req)))
        req.next_token = token
        total = len(req.gen.prompt_ids) + len(req.out_ids)
        if len(req.out_ids) >= p.max_tokens or total >= self.context_length:
            self._done(req, self._finish(req, "length"))

    def _new_text(self, req: _Request) -> str:
        """The text the newest token adds. Only a short window is decoded (a token's text depends
        on its neighbours, not on the whole answer), so each step costs the same however long the
        answer grows; a multi-byte character split across tokens waits for its last byte."""
        tokenizer = self.tokenizer
        assert tokenizer is not None        # _load made it

        def decode(ids):
            return tokenizer.decode(ids, skip_special_tokens=True,
                                    clean_up_tokenization_spaces=False)
        ids = req.out_ids
        before = decode(ids[req.prefix_offset:req.read_offset])
        after = decode(ids[req.prefix_offset:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        req.prefix_offset, req.read_offset = req.read_offset, len(ids)
        return after[len(before):]

    def _finish(self, req: _Request, reason: str) -> Finish:
        return Finish(reason, len(req.gen.prompt_ids), len(req.out_ids), req.cached, req.adapter)
