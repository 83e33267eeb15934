"""The Tinker engine: the Tinker service samples; clawrl renders, records and routes.

SDK facts this module follows (the `tinker` package 0.38: `lib/public_interfaces/service_client.py`,
`sampling_client.py`, `api_future.py`, `types/sampled_sequence.py`, `types/_pydantic_types/
sampling_params.py`, `_exceptions.py`, `lib/retry_handler.py`; tinker-cookbook's docs pages
`training-sampling.mdx`, `save-load.mdx` and `renderers.py` `parse_response_for_stop_token`):

* `tinker.ServiceClient()` reads the API key from `TINKER_API_KEY`. `create_sampling_client(
  base_model=...)` or `(model_path="tinker://...")` returns a future of a `SamplingClient`
  (`.result()`, or `await` it); older releases returned the client itself.
* `SamplingClient.sample(prompt=ModelInput.from_ints(ids), num_samples=1, sampling_params=
  SamplingParams(max_tokens, temperature, top_p, stop, seed))` returns an `APIFuture` of a
  `SampleResponse`: `sequences[0].tokens`, `.logprobs` (one per sampled token) and `.stop_reason`
  ("stop" | "length"), plus `prompt_cache_hit_tokens`. `stop` as a list of ints stops at those
  token ids (the chat template's end-of-turn token); the stop token is part of `tokens`.
  Cancelling the future's `concurrent.futures.Future` cancels the request.
* Tinker samples whole sequences, not token streams: a response reaches the client in one burst
  when the sample completes (one SSE chunk per token, ids and logprobs exactly as returned).
* `SamplingClient.compute_logprobs(ModelInput, prompt_logprobs_last_n=N)` scores the last N prompt
  tokens (earlier entries are None): the teacher scores the served tokens with it, on a sampler of
  the frozen base model.
* `get_tokenizer()` loads the base model's tokenizer by name (`model.source = "tinker"`); any
  other `model.source` is a local folder with the tokenizer files.
* Errors: `APIConnectionError` / `APITimeoutError`, `APIStatusError` with `status_code`
  (`RateLimitError` 429, `InternalServerError` 5xx, `BadRequestError` 400, ...), and
  `RequestFailedError`. The SDK would retry connection errors and 408/409/429/5xx for up to two
  hours (`RetryConfig.progress_timeout`): clawrl turns that off (`RetryConfig(enable_retry_logic=
  False)`) and retries a few times itself, so a client waits seconds, not hours.

Adapter versions are remote (adapters.REMOTE): `remote.json` names the sampler weights the trainer
saved on Tinker (learn/tinker_trainer.py); loading one creates a sampling client for that path, new
requests use it, and requests already running finish on the client they started with.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..adapters import versions as adapters
from ..config import Config
from ..errors import AdapterRefused, ConfigError, ModelError, RequestError
from ..types import Finish, GenParams, TokenEvent
from .base import Generation, TaskGeneration, render_checked
from .remote import TextStream

if TYPE_CHECKING:   # the SDK and transformers load with the engine, not with this module
    import tinker
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("clawrl.engine")
RETRIES, BACKOFF_START = 3, 1.0               # a request: 4 tries, 1 + 2 + 4 s apart
COOLDOWN_START, COOLDOWN_MAX = 5.0, 60.0      # then new requests get 503 for this long (doubling)
REQUEST_TIMEOUT_S = 600.0                     # one whole sequence; a longer silence is a failure
CONTROL_TIMEOUT_S = 300.0                     # creating a sampling client


def require_api_key(env: dict | None = None) -> None:
    """TINKER_API_KEY must be set before anything talks to Tinker."""
    if not (os.environ if env is None else env).get("TINKER_API_KEY"):
        raise ConfigError(
            "engine.kind = \"tinker\" needs a Tinker API key in the environment variable "
            "TINKER_API_KEY: create one in the Tinker console and `export TINKER_API_KEY=...` "
            "before `clawrl serve` (under systemd: `Environment=TINKER_API_KEY=...` or an "
            "EnvironmentFile in the unit)")


def default_service():
    """The real SDK's entry point (it reads TINKER_API_KEY itself)."""
    try:
        import tinker
    except ImportError:
        raise ConfigError("engine.kind = \"tinker\" needs the Tinker SDK: "
                          "pip install 'clawrl[tinker]' (or pip install tinker)") from None
    return tinker.ServiceClient()


def default_rest():
    """The SDK's REST client (checkpoint management; it reads TINKER_API_KEY itself)."""
    import tinker
    return tinker.RestClient()


def no_sdk_retries():
    """RetryConfig that leaves retrying to clawrl (None where the SDK has no such option)."""
    try:
        from tinker.lib.retry_handler import RetryConfig
        return RetryConfig(enable_retry_logic=False)
    except (ImportError, TypeError):
        return None


def resolved(value, timeout: float = CONTROL_TIMEOUT_S):
    """A client from a client-creation call: newer SDKs return a future of it, older the client."""
    return value.result(timeout) if hasattr(value, "future") else value


def base_model_name(cfg: Config) -> str:
    return cfg.engine.base_model or cfg.model.name


def load_tokenizer(cfg: Config, base_sampler) -> tuple[PreTrainedTokenizerBase, set[int]]:
    """The served model's tokenizer and its end-of-turn token ids."""
    from transformers import AutoTokenizer, GenerationConfig

    eos: list = []
    if cfg.model.source == "tinker":
        tokenizer = base_sampler.get_tokenizer()
    else:
        path = Path(cfg.model.source).expanduser()
        if not path.is_dir():
            raise ModelError(f"model.source = {cfg.model.source!r} is not a folder: put the tokenizer "
                             f"files of {base_model_name(cfg)} there (e.g. huggingface-cli download "
                             f"{base_model_name(cfg)} --include '*.json' '*.txt' --local-dir DIR), or "
                             "set model.source = \"tinker\" to have the SDK fetch them")
        tokenizer = AutoTokenizer.from_pretrained(path)
        try:
            found = GenerationConfig.from_pretrained(path).eos_token_id
            eos = found if isinstance(found, list) else [found]
        except OSError:
            pass
    return tokenizer, {i for i in eos + [tokenizer.eos_token_id] if i is not None}


# -- errors -------------------------------------------------------------------------------------------

def retryable(e: BaseException) -> bool:
    import tinker
    if isinstance(e, (tinker.APIConnectionError, asyncio.TimeoutError, TimeoutError)):
        return True
    if isinstance(e, tinker.APIStatusError):
        return e.status_code in (408, 409, 429) or e.status_code >= 500
    if isinstance(e, tinker.RequestFailedError):
        return str(getattr(e, "category", "")).lower() != "user"
    return False


def unavailable(why: str, retry_after: float) -> RequestError:
    return RequestError(f"Tinker is not available ({why}); retry in {math.ceil(retry_after)} s",
                        status=503, type="server_error", code="engine_unavailable",
                        headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


def as_request_error(e: BaseException, tries: int, retry_after: float) -> RequestError:
    """What the client is told about a failed sample: 503 while Tinker cannot be reached or is
    overloaded, 502 when it failed the request, 400 when it refused the request itself."""
    import tinker
    why = f"{type(e).__name__}: {e}".strip()
    if isinstance(e, (tinker.APIConnectionError, asyncio.TimeoutError, TimeoutError)) \
            or getattr(e, "status_code", None) in (408, 429, 503):
        return unavailable(f"{why}, after {tries} tries", retry_after)
    if retryable(e) or (isinstance(e, tinker.APIStatusError) and e.status_code in (401, 402, 403, 404)):
        return RequestError(f"Tinker failed the request ({why}, after {tries} tries); retry in a few "
                            "seconds", status=502, type="server_error", code="engine_error",
                            headers={"Retry-After": str(max(1, math.ceil(retry_after)))})
    return RequestError(f"Tinker refused the request: {why}", status=400, code="engine_refused")


# -- the engine ---------------------------------------------------------------------------------------

class TinkerEngine:
    """The engine interface (engines/base.py) over Tinker's sampling clients: version 0 is the
    base model, every other version a sampling client for the sampler weights it names."""
    kind = "tinker"
    generation_margin = 0
    adapter_kind = adapters.REMOTE_KIND

    def __init__(self, cfg: Config, service_factory=None):
        require_api_key()
        self.cfg = cfg
        self.model_id = cfg.model.name
        self.context_length = cfg.model.context_length
        self.adapter_version = 0
        self.parse_tools = True
        self.base_model = base_model_name(cfg)
        self.service_factory = service_factory or default_service
        self.service: tinker.ServiceClient | None = None    # or a stand-in from service_factory
        self.samplers: dict[int, object] = {}    # version -> SamplingClient (0 = the base model)
        self.paths: dict[int, str] = {}          # version -> its sampler weights on Tinker
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.eos_ids: set[int] = set()
        self.failures = 0                        # consecutive requests that failed after retries
        self.open_until = 0.0                    # until then new requests get 503 at once
        self.last_error: str | None = None
        self._inflight: set[TaskGeneration] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="clawrl-tinker")

    @property
    def loaded_adapters(self) -> set[int]:
        return set(self.samplers) - {0}

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> None:
        """A sampler of the base model (tried until engine.startup_timeout_s while Tinker cannot
        be reached), and the tokenizer."""
        self.service = self.service_factory()
        deadline = time.monotonic() + self.cfg.engine.startup_timeout_s
        delay = BACKOFF_START
        while True:
            try:
                base = resolved(self.service.create_sampling_client(base_model=self.base_model,
                                                                     retry_config=no_sdk_retries()))
                break
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
                if not retryable(e) or time.monotonic() + delay > deadline:
                    raise ModelError(f"Tinker could not start a sampler for {self.base_model!r} "
                                     f"(engine.base_model): {why}") from None
                log.warning("Tinker is not reachable yet (%s); trying again in %.0f s", why, delay)
                time.sleep(delay)
                delay = min(COOLDOWN_MAX, delay * 2)
        self.tokenizer, self.eos_ids = load_tokenizer(self.cfg, base)
        self.samplers[0] = base
        log.info("Tinker samples %s for %s", self.base_model, self.model_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.service, "close", None)
        if close is not None:
            try:      # finishes the session on Tinker; best effort on the way out
                close("success").result(5)
            except Exception as e:
                log.debug("closing the Tinker session: %s", e)

    def status(self) -> dict:
        return {"kind": self.kind, "base_model": self.base_model,
                "available": time.monotonic() >= self.open_until, "failures": self.failures,
                "last_error": self.last_error, "inflight": len(self._inflight),
                "adapters": dict(sorted(self.paths.items()))}

    # -- proxy-facing ---------------------------------------------------------------------------------
    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return render_checked(self.tokenizer, messages, tools, self.context_length)

    def submit(self, prompt_ids: list[int], params: GenParams,
               adapter: int | None = None) -> Generation:
        wait = self.open_until - time.monotonic()
        if wait > 0:
            raise unavailable(f"the last requests failed: {self.last_error}", wait)
        version = self.adapter_version if adapter is None else adapter
        sampler = self.samplers.get(version)
        if sampler is None:
            raise RuntimeError(f"adapter version {version} is not loaded")
        loop = asyncio.get_running_loop()
        gen = TaskGeneration(prompt_ids, params, loop)
        gen.adapter = version
        self._inflight.add(gen)
        gen.task = loop.create_task(self._run(gen, sampler), name="clawrl-tinker-request")
        return gen

    async def _run(self, gen: TaskGeneration, sampler) -> None:
        text = TextStream(self.tokenizer)
        try:
            response = await self._sample(gen, sampler)
            seq = response.sequences[0]
            if seq.logprobs is None or len(seq.logprobs) != len(seq.tokens):
                raise RuntimeError("Tinker returned a sample without a logprob for every token")
            for token, logprob in zip(seq.tokens, seq.logprobs):
                piece = "" if token in self.eos_ids else text.add(token)
                gen.put(TokenEvent(int(token), float(logprob), piece))
            cached = int(getattr(response, "prompt_cache_hit_tokens", 0) or 0)
            gen.close(Finish("length" if seq.stop_reason == "length" else "stop",
                             len(gen.prompt_ids), len(seq.tokens), cached, gen.adapter))
        except asyncio.CancelledError:
            gen.close(Finish("cancelled", len(gen.prompt_ids), 0, 0, gen.adapter))
        except RequestError as e:
            gen.close(error=e)
        except Exception as e:
            log.exception("Tinker request failed")
            gen.close(error=e)
        finally:
            self._inflight.discard(gen)

    async def _sample(self, gen: TaskGeneration, sampler):
        """One sample, tried again with doubling backoff while the failure is transient; the whole
        sequence arrives at once, so a retry is invisible to the client."""
        import tinker

        p = gen.params
        params = tinker.SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature,
                                       top_p=p.top_p, seed=p.seed,
                                       stop=sorted(self.eos_ids) or None)
        prompt = tinker.ModelInput.from_ints(gen.prompt_ids)
        delay = BACKOFF_START
        for attempt in range(1, RETRIES + 2):
            try:
                future = sampler.sample(prompt=prompt, num_samples=1, sampling_params=params)
                response = await asyncio.wait_for(_awaited(future), REQUEST_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if retryable(e) and attempt <= RETRIES and not isinstance(e, asyncio.TimeoutError):
                    log.warning("Tinker sample failed (%s: %s); try %d of %d in %.0f s",
                                type(e).__name__, e, attempt + 1, RETRIES + 1, delay)
                    await asyncio.sleep(delay)
                    delay *= 2
                    continue
                raise self._failed(e, attempt) from None
            self.failures, self.open_until = 0, 0.0
            return response

    def _failed(self, e: BaseException, tries: int) -> RequestError:
        """A request gave up: a transient failure also stops new requests for a cooldown that
        doubles while failures go on (they get 503 + Retry-After without waiting on Tinker)."""
        cooldown = 0.0
        if retryable(e):
            self.failures += 1
            cooldown = min(COOLDOWN_MAX, COOLDOWN_START * 2 ** (self.failures - 1))
            self.open_until = time.monotonic() + cooldown
        self.last_error = f"{type(e).__name__}: {e}"
        log.error("Tinker sample failed after %d tries: %s", tries, self.last_error)
        return as_request_error(e, tries, cooldown or COOLDOWN_START)

    def queue_depth(self) -> int:
        """Requests beyond engine.max_concurrent (Tinker queues them itself)."""
        return max(0, len(self._inflight) - self.cfg.engine.max_concurrent)

    def active_count(self) -> int:
        return len(self._inflight)

    # -- adapters (hot-swap) --------------------------------------------------------------------------
    def load_adapter(self, version: int, path) -> concurrent.futures.Future:
        return self._pool.submit(self._load_now, version, Path(path))

    def _load_now(self, version: int, path: Path) -> None:
        if version in self.samplers:
            return
        import tinker
        if adapters.kind(path) != adapters.REMOTE_KIND:
            raise AdapterRefused(f"adapter {version:04d} holds local weights; the Tinker engine "
                                 "serves versions its trainer saved on Tinker")
        sampler_path = adapters.read_remote(path).get("sampler_path")
        assert self.service is not None     # adapters load after load()
        try:
            client = resolved(self.service.create_sampling_client(model_path=sampler_path,
                                                                  retry_config=no_sdk_retries()))
        except tinker.APIStatusError as e:
            if retryable(e):
                raise unavailable(f"loading adapter {version:04d}: {e}", COOLDOWN_START) from None
            raise AdapterRefused(f"Tinker refused the sampler weights {sampler_path}: "
                                 f"{type(e).__name__}: {e}") from None
        except tinker.APIConnectionError as e:
            raise unavailable(f"loading adapter {version:04d}: {e}", COOLDOWN_START) from None
        assert sampler_path is not None     # create_sampling_client refused None (ValueError)
        self.samplers[version], self.paths[version] = client, sampler_path
        log.info("adapter %04d samples from %s", version, sampler_path)

    def unload_adapter(self, version: int) -> concurrent.futures.Future:
        """Forget a version's sampling client (never the active one). Tinker holds nothing for it
        that needs freeing, and requests still running keep the client they started with."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        if version and version != self.adapter_version and version in self.samplers:
            del self.samplers[version]
            self.paths.pop(version, None)
            done.set_result(True)
        else:
            done.set_result(False)
        return done

    def activate(self, version: int) -> None:
        """New requests run on `version` from now on; running ones finish on theirs."""
        if version not in self.samplers:
            raise ValueError(f"adapter version {version} is not loaded")
        self.adapter_version = version


async def _awaited(future):
    """An SDK future's result; cancelling this cancels the request (APIFuture.future() is the
    concurrent future behind it; releases before APIFuture returned that future itself)."""
    return await asyncio.wrap_future(future.future() if hasattr(future, "future") else future)


# -- teacher scoring (the trainer's, on a sampler of the frozen base model) --------------------------

def score(sampler, context: list[int], response: list[int]) -> list[float]:
    """Logprob of each response token after `context`, from `compute_logprobs` on the last
    len(response) positions of context + response."""
    import tinker
    prompt = tinker.ModelInput.from_ints(context + response)
    logps = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=len(response)).result(
        REQUEST_TIMEOUT_S)
    tail = list(logps)[-len(response):]
    if len(tail) != len(response) or any(lp is None for lp in tail):
        raise ValueError(f"Tinker scored {sum(lp is not None for lp in tail)} of the "
                         f"{len(response)} served tokens")
    return [float(lp) for lp in tail]
