"""What the server engines (sglang, vllm) share: a model served by another process over HTTP.

clawrl still renders the prompt with the model's own tokenizer and sends token ids, so the ids and
logprobs it records are exactly the ones the server sampled. `RemoteEngine` implements the engine
interface (engines/base.py) for any such server: each request is an asyncio task that reads the
server's stream into a `Generation`; adapter versions are loaded under fresh names and retired
when idle (registry.py); the process is launched or watched by launcher.py. Connection failures
become `RequestError`s the proxy answers with: 503 + Retry-After while the server is down or
restarting, 502 when it drops a request mid-stream.

What it does not own: the wire formats (sglang.py, vllm.py) and which version serves (adapters/swap.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from ..adapters.versions import PEFT_KIND
from ..config import Config
from ..errors import ModelError, RequestError
from ..models import model_dir
from ..types import Finish, GenParams, TokenEvent
from .base import Generation, TaskGeneration, render_checked
from .launcher import ServerProcess
from .registry import AdapterRegistry

if TYPE_CHECKING:   # transformers loads with the model, not with this module
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("clawrl.engine")
# Between two streamed chunks a server may spend a long prefill; a silent minute is a dead server.
STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=60.0, pool=30.0)
CONTROL_TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=30.0)


def server_url(cfg: Config) -> str:
    """Where the engine's server answers: engine.url when attached, else the launched one's port."""
    return cfg.engine.url.rstrip("/") if not cfg.engine.launch else f"http://127.0.0.1:{cfg.engine.port}"


def unavailable(kind: str, why: str, retry_after: int = 5) -> RequestError:
    return RequestError(f"the {kind} server is not available ({why}); retry in a few seconds",
                        status=503, type="server_error", code="engine_unavailable",
                        headers={"Retry-After": str(retry_after)})


def dropped(kind: str, why: str) -> RequestError:
    return RequestError(f"the {kind} server dropped the request ({why}); it is being restarted or "
                        "checked, retry in a few seconds", status=502, type="server_error",
                        code="engine_disconnected", headers={"Retry-After": "5"})


def error_message(response: httpx.Response) -> str:
    """The message of an error response in any of the shapes servers use: OpenAI's
    {"error": {"message"}}, vLLM's older {"object": "error", "message"}, SGLang's
    {"success": false, "error_message"}, FastAPI's {"detail"}, or plain text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("error_message", "message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return json.dumps(body)[:500]


def refused(kind: str, message: str) -> RequestError:
    """The server refused this request for what it asks (400 `engine_refused`): sending it
    again would fail again."""
    return RequestError(f"the {kind} server refused the request: {message}", status=400,
                        code="engine_refused")


def lora_load_body(name: str, path: Path) -> dict:
    """What both servers' runtime LoRA loading takes: the name to serve it under and its folder."""
    return {"lora_name": name, "lora_path": str(path)}


def lora_unload_body(name: str) -> dict:
    return {"lora_name": name}


def upstream_error(kind: str, response: httpx.Response, message: str | None = None) -> RequestError:
    """A non-200 answer to a generation: the caller's fault stays 4xx, the server's becomes 502/503."""
    message = message or error_message(response)
    if response.status_code == 503:
        return unavailable(kind, message)
    if 400 <= response.status_code < 500:
        return refused(kind, message)
    return RequestError(f"the {kind} server failed: {message}", status=502, type="server_error",
                        code="engine_error")


# The shared task-fed generation under the name this module's callers know.
RemoteGeneration = TaskGeneration


class TextStream:
    """Incremental detokenizing of one response (the same window rule as the embedded engine: a
    token's text depends on its neighbours, and a multi-byte character waits for its last byte)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.prefix, self.read = tokenizer, [], 0, 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


# -- the engine --------------------------------------------------------------------------------------

class RemoteEngine:
    """The engine interface over a server. Subclasses set `kind` and implement `launch_command`,
    `server_info`, `_stream`, `_server_load` and `_server_unload`."""
    kind = "remote"
    generation_margin = 0      # vLLM: prompt + max_tokens <= max_model_len
    adapter_kind = PEFT_KIND

    def __init__(self, cfg: Config):
        logging.getLogger("httpx").setLevel(logging.WARNING)   # not a line per health check
        self.cfg = cfg
        self.model_id = cfg.model.name
        self.context_length = cfg.model.context_length
        self.adapter_version = 0
        self.parse_tools = True
        self.url = server_url(cfg)
        self.registry = AdapterRegistry()
        self.paths: dict[int, Path] = {}
        self.server: ServerProcess | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.eos_ids: set[int] = set()
        self.info: dict = {}
        self.server_version = ""       # what the server says it is, read at every (re)start
        self._inflight: set[RemoteGeneration] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=f"clawrl-{self.kind}")
        self._client = httpx.Client(timeout=CONTROL_TIMEOUT)
        self._aclient: httpx.AsyncClient | None = None

    @property
    def loaded_adapters(self) -> set[int]:
        return set(self.registry.names)

    # -- subclass hooks -------------------------------------------------------------------------------
    def launch_command(self, model_path: Path) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def server_info(self) -> dict:
        """Whatever the server reports about itself ({} when it reports nothing)."""
        return {}

    def read_version(self) -> str:
        """The server's release, '' when it does not say."""
        return str(self.info.get("version") or "")

    def check(self, params: GenParams) -> None:
        """Refuse (RequestError) what this server is known to refuse, before anything is sent."""

    async def _stream(self, gen: RemoteGeneration, name: str | None, text: TextStream) -> Finish:
        raise NotImplementedError

    def _server_load(self, name: str, path: Path) -> None:
        raise NotImplementedError

    def _server_unload(self, name: str) -> None:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------------------------
    def load(self) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        e = self.cfg.engine
        self.model_path = model_dir(self.cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        eos: list = []
        try:
            found = GenerationConfig.from_pretrained(self.model_path).eos_token_id
            eos = found if isinstance(found, list) else [found]
        except OSError:
            pass
        self.eos_ids = {i for i in eos + [self.tokenizer.eos_token_id] if i is not None}
        if e.launch:
            argv, env = self.launch_command(self.model_path)
            log_path = self.cfg.home / "logs" / f"{self.kind}-server.log"
            log.info("starting the %s server: %s (log: %s)", self.kind, shlex.join(argv), log_path)
        else:
            argv, env, log_path = None, None, None
        self.server = ServerProcess(self.kind, self.url, argv, env, log_path, e.startup_timeout_s,
                                    on_ready=self._prepare_server)
        self.server.start()
        self.server.wait_started()

    def _prepare_server(self) -> None:
        """On every (re)start: check what the server says about itself, then load the adapters
        that were loaded before (a fresh server has none) under fresh names."""
        self.info = self.server_info()
        self.server_version = self.read_version()
        log.info("%s server at %s: version %s", self.kind, self.url,
                 self.server_version or "unknown (it does not say)")
        rank = self.info.get("max_lora_rank")
        if isinstance(rank, int) and rank < self.cfg.train.lora_r:
            raise ModelError(f"the {self.kind} server at {self.url} accepts LoRA ranks up to {rank} "
                             f"(--max-lora-rank), but train.lora_r = {self.cfg.train.lora_r}: every "
                             f"adapter would be refused. Start it with --max-lora-rank "
                             f"{self.cfg.train.lora_r} or more (engine.max_lora_rank when clawrl "
                             "launches it), or lower train.lora_r")
        if self.info.get("enable_lora") is False:
            raise ModelError(f"the {self.kind} server at {self.url} runs without --enable-lora; "
                             "adapters cannot be served")
        for version, stale in self.registry.reset():
            if stale:   # attached: it may have kept it through the outage; free it when it can
                self._pool.submit(self._unload_now, version, stale, True)
            try:
                self._load_now(version, self.paths[version])
            except Exception as e:
                log.error("adapter %04d could not be loaded again after the server restarted: %s",
                          version, e)
                if version == self.adapter_version:
                    log.error("serving the base model until an adapter is activated")
                    self.adapter_version = 0

    def close(self) -> None:
        if self.server:
            self.server.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def status(self) -> dict:
        return {"kind": self.kind, **(self.server.status() if self.server else {}),
                "available": bool(self.server and self.server.available),
                "server_version": self.server_version or None,
                "adapters": {v: n for v, n in sorted(self.registry.names.items())}}

    # -- proxy-facing -------------------------------------------------------------------------------------
    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return render_checked(self.tokenizer, messages, tools, self.context_length,
                              self.generation_margin)

    def submit(self, prompt_ids: list[int], params: GenParams,
               adapter: int | None = None) -> Generation:
        if self.server is None or not self.server.available:
            state = self.server.state if self.server else "not started"
            raise unavailable(self.kind, state)
        self.check(params)
        loop = asyncio.get_running_loop()
        if self._aclient is None:
            self._aclient = httpx.AsyncClient(timeout=STREAM_TIMEOUT)
        version = self.adapter_version if adapter is None else adapter
        name = self.registry.acquire(version)
        gen = RemoteGeneration(prompt_ids, params, loop)
        gen.adapter = version
        self._inflight.add(gen)
        gen.task = loop.create_task(self._run(gen, name), name=f"clawrl-{self.kind}-request")
        return gen

    async def _run(self, gen: RemoteGeneration, name: str | None) -> None:
        assert self.server is not None      # submit() runs requests only on a started server
        text = TextStream(self.tokenizer)

        def finished(reason: str) -> Finish:
            return Finish(reason, len(gen.prompt_ids), len(text.ids), 0, gen.adapter)
        try:
            gen.close(await self._stream(gen, name, text))
        except asyncio.CancelledError:
            gen.close(finished("cancelled"))
        except RequestError as e:
            gen.close(error=e)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            self.server.suspect()
            gen.close(error=unavailable(self.kind, f"cannot connect to {self.url}: {e}"))
        except (httpx.TransportError, httpx.StreamError) as e:
            self.server.suspect()
            gen.close(error=dropped(self.kind, f"after {len(text.ids)} tokens: "
                                               f"{type(e).__name__}: {e}"))
        except Exception as e:
            log.exception("%s request failed", self.kind)
            gen.close(error=e)
        finally:
            self._inflight.discard(gen)
            idle = self.registry.release(name)
            if idle:
                self._pool.submit(self._unload_now, *idle)

    def emit(self, gen: RemoteGeneration, text: TextStream, token: int, logprob: float) -> None:
        """Hand one served token to the proxy (its id and logprob as the server sent them)."""
        piece = text.add(token)
        gen.put(TokenEvent(token, float(logprob), "" if token in self.eos_ids else piece))

    def queue_depth(self) -> int:
        """Requests beyond engine.max_concurrent (the server queues them itself)."""
        return max(0, len(self._inflight) - self.cfg.engine.max_concurrent)

    def active_count(self) -> int:
        return len(self._inflight)

    # -- adapters (hot-swap) --------------------------------------------------------------------------
    def load_adapter(self, version: int, path) -> concurrent.futures.Future:
        return self._pool.submit(self._load_now, version, Path(path))

    def _load_now(self, version: int, path: Path) -> None:
        if version in self.registry.names:
            self.registry.keep(version)
            return
        name = self.registry.fresh_name(version)
        try:
            self._server_load(name, path.resolve())
        except httpx.HTTPError as e:
            assert self.server is not None  # adapters load on a started server (load() or on_ready)
            self.server.suspect()
            raise unavailable(self.kind, f"loading adapter {version:04d}: {e}") from None
        self.registry.add(version, name)
        self.paths[version] = path
        log.info("adapter %04d loaded on the %s server as %s", version, self.kind, name)

    def unload_adapter(self, version: int) -> concurrent.futures.Future:
        """Free a version on the server once no request runs on it; never the active one."""
        if version == self.adapter_version:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(False)
            return done
        idle = self.registry.retire(version)
        if idle is None:      # not loaded, or busy: released by the last request that uses it
            done = concurrent.futures.Future()
            done.set_result(False)
            return done
        return self._pool.submit(self._unload_now, *idle)

    def _unload_now(self, version: int, name: str, stale: bool = False) -> bool:
        """Unload `name`; `stale`: an old name of a version that was loaded again under a new one."""
        if not stale and version not in self.registry.names:
            self.paths.pop(version, None)
        try:
            self._server_unload(name)
            log.info("adapter %04d (%s) unloaded from the %s server", version, name, self.kind)
            return True
        except Exception as e:   # a server that restarted has dropped it already
            if not stale:
                log.warning("unloading adapter %04d (%s) from the %s server failed: %s", version,
                            name, self.kind, e)
            return False

    def activate(self, version: int) -> None:
        """New requests run on `version` from now on; running ones finish on theirs."""
        if version and version not in self.registry.names:
            raise ValueError(f"adapter version {version} is not loaded")
        if version:
            self.registry.keep(version)
        self.adapter_version = version


# -- teacher scoring (used by the trainer process, which has no engine) ------------------------------

def check_scored(kind: str, response: list[int], ids: list[int], logps: list) -> list[float]:
    """The scored positions must be exactly the served tokens, each with a logprob (a mismatch
    is permanent: the trainer skips the turn)."""
    if ids != response or any(lp is None for lp in logps):
        raise ValueError(f"the {kind} server scored other tokens than the served ones "
                         f"({len(ids)} positions for {len(response)} tokens)")
    return [float(lp) for lp in logps]
