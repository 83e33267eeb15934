"""What every engine offers the proxy, and the handle of one running generation.

A `Generation` is filled by the engine's worker (any thread) and read by the proxy in the event
loop: `async for event in gen` yields `TokenEvent`s as they are produced; afterwards
`gen.finish` says how it ended. Closing the iteration early (client gone, stop string found)
cancels the generation at the engine's next step.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import AsyncIterator, Protocol

from ..chat.format import render_prompt
from ..errors import RequestError
from ..types import Finish, GenParams, TokenEvent

_DONE = object()


class Generation:
    def __init__(self, prompt_ids: list[int], params: GenParams, loop: asyncio.AbstractEventLoop):
        self.prompt_ids = prompt_ids
        self.params = params
        self.adapter = 0                  # adapter version it runs on (set by the engine)
        self.created = time.perf_counter()
        self.first_token_at: float | None = None
        self.finish: Finish | None = None
        self.error: BaseException | None = None
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()

    # -- engine side (worker thread) -------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event: TokenEvent) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    def close(self, finish: Finish | None = None, error: BaseException | None = None) -> None:
        def done():
            self.finish, self.error = finish, error
            self._queue.put_nowait(_DONE)
        self._loop.call_soon_threadsafe(done)

    # -- proxy side (event loop) -----------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    if self.error is not None:
                        raise self.error
                    return
                yield item
        finally:
            self.cancel()  # no-op once finished; stops the engine if the reader left early

    async def wait(self) -> Finish:
        """Drain what is left (after cancel) and return how it ended."""
        while self.finish is None and self.error is None:
            if await self._queue.get() is _DONE:
                break
        return self.finish or Finish("error", len(self.prompt_ids), 0, adapter_version=self.adapter)


class TaskGeneration(Generation):
    """A generation fed by an asyncio task (an HTTP stream, an SDK future); cancelling it cancels
    the task, which aborts the request on the server's side."""
    task: asyncio.Task | None = None
    _closed = False

    def close(self, finish: Finish | None = None, error: BaseException | None = None) -> None:
        if not self._closed:
            self._closed = True
            super().close(finish, error)

    def cancel(self) -> None:
        super().cancel()
        if self.task is not None and not self.task.done():
            self._loop.call_soon_threadsafe(self.task.cancel)


def token_budget(engine: "Engine", prompt_len: int, asked: int) -> int:
    """The new tokens a request gets: `asked`, cut to what the server accepts after the prompt."""
    return min(asked, engine.context_length - prompt_len - engine.generation_margin)


def render_checked(tokenizer, messages: list[dict], tools: list[dict] | None,
                   context_length: int, margin: int = 0) -> list[int]:
    """Prompt ids for a request, or the OpenAI-style 400 when they leave no room to answer
    (`margin`: the tokens the server keeps free, see Engine.generation_margin)."""
    ids = render_prompt(tokenizer, messages, tools)
    if len(ids) + margin >= context_length:
        raise RequestError(
            f"This model's maximum context length is {context_length} tokens, but the "
            f"messages come to {len(ids)} tokens. Shorten the conversation or its tools.",
            param="messages", code="context_length_exceeded")
    return ids


class Engine(Protocol):
    model_id: str
    context_length: int
    # Tokens the server keeps free past prompt + max_tokens: a request may ask for at most
    # context_length - len(prompt) - generation_margin new tokens.
    generation_margin: int
    adapter_version: int
    parse_tools: bool
    # What its adapter versions are: "peft" (weights in the folder) or "remote" (adapters/versions.py).
    adapter_kind: str

    def load(self) -> None: ...
    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]: ...
    def submit(self, prompt_ids: list[int], params: GenParams,
               adapter: int | None = None) -> Generation: ...
    def load_adapter(self, version: int, path): ...
    def unload_adapter(self, version: int): ...
    def activate(self, version: int) -> None: ...
    def queue_depth(self) -> int: ...
    def active_count(self) -> int: ...    # requests being generated now
    @property
    def loaded_adapters(self) -> set[int]: ...   # versions it can serve without loading
    def status(self) -> dict: ...     # {"kind", "available", ...}: shown by /readyz and status
    def close(self) -> None: ...
