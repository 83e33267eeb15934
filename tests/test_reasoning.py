"""Reasoning output (`<think>…</think>`, Qwen3 / DeepSeek-R1 style) goes to `reasoning_content`,
streamed and not; tool calls and stop strings are found in the answer only; the turn log keeps
the thinking apart from the answer.

The splitter alone, then the daemon's app (real proxy, real SQLite turn log) over a *replaying
engine*: it serves fixed texts as the token ids and pieces the real SmolLM2 tokenizer makes of
them. No small model here thinks in tags (and the one-layer scripted model cannot spell both
`<think>` and `</think>`), so this is the honest edge to fake: the engine's token stream."""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import threading

import pytest
from starlette.testclient import TestClient

from clawrl.chat.format import render_prompt
from clawrl.config import load_config
from clawrl.engines.base import Generation
from clawrl.serve.proxy import DaemonState, build_app
from clawrl.chat.reasoning import ReasoningSplitter
from clawrl.turnlog.store import Store
from clawrl.types import Finish, TokenEvent
from conftest import MODEL_CACHE

THINK = "<think>\nThe user wants the note read first.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "read", "arguments": {"path": "notes.txt"}}\n</tool_call>'
ANSWER = "Done: the note says kangaroo."
MARKER = " kangaroo"
READ = {"type": "function", "function": {"name": "read", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


def split(text: str, sizes) -> tuple[str, str]:
    s, thought, answer, i = ReasoningSplitter(), "", "", 0
    for n in sizes:
        r, c = s.feed(text[i:i + n])
        thought, answer, i = thought + r, answer + c, i + n
    r, c = s.finish()
    return thought + r, answer + c


@pytest.mark.parametrize("text,want", [
    (THINK + "Hello!", ("The user wants the note read first.\n", "Hello!")),
    ("  \n<think>x</think>y", ("x", "y")),
    ("Hello <think>not reasoning</think>", ("", "Hello <think>not reasoning</think>")),
    ("<thinking>is content</thinking>", ("", "<thinking>is content</thinking>")),
    ("<think>never closed", ("never closed", "")),
    ("<thi", ("", "<thi")),
    ("", ("", "")),
])
def test_the_split_does_not_depend_on_how_the_text_is_chunked(text, want):
    rng = random.Random(0)
    for sizes in ([len(text) or 1], [1] * (len(text) + 1),
                  *[[rng.randint(1, 5) for _ in range(len(text) + 1)] for _ in range(20)]):
        assert split(text, sizes) == want


class ReplayEngine:
    """Answers THINK + CALL, or THINK + ANSWER once a tool result is in the conversation."""
    model_id, context_length, adapter_version, parse_tools, max_queue = "replay", 4096, 0, True, 8
    generation_margin = 0

    def __init__(self):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(MODEL_CACHE / "SmolLM2-135M-Instruct")
        self.replies: dict[int, str] = {}

    def render(self, messages, tools):
        ids = render_prompt(self.tok, messages, tools)
        self.replies[len(ids)] = THINK + (ANSWER if messages[-1]["role"] == "tool" else CALL)
        return ids

    def queue_depth(self) -> int:
        return 0

    def submit(self, prompt_ids, params, adapter=None):
        gen = Generation(prompt_ids, params, asyncio.get_running_loop())
        ids = self.tok.encode(self.replies[len(prompt_ids)], add_special_tokens=False)

        def run():
            said = ""
            for i, t in enumerate(ids):
                if gen.cancelled:
                    break
                text = self.tok.decode(ids[:i + 1])
                gen.put(TokenEvent(t, -0.5, text[len(said):]))
                said = text
            gen.close(Finish("stop", len(prompt_ids), len(ids)))
        threading.Thread(target=run, daemon=True).start()
        return gen


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    db = tmp_path_factory.mktemp("reasoning") / "clawrl.db"
    state = DaemonState(cfg=load_config(env={}), engine=ReplayEngine(), ready=True)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.store = await Store.open(db)
        yield
        await state.store.close()

    with TestClient(build_app(state, lifespan=lifespan), base_url="http://127.0.0.1") as client:
        client.db = db
        yield client


def turn(app, turn_id: int) -> dict:
    db = sqlite3.connect(app.db)
    db.row_factory = sqlite3.Row
    try:
        return dict(db.execute("SELECT * FROM turns WHERE id=?", (turn_id,)).fetchone())
    finally:
        db.close()


def test_thinking_then_a_tool_call(app):
    r = app.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "What does notes.txt say?"}], "tools": [READ]})
    msg = r.json()["choices"][0]["message"]
    assert msg["reasoning_content"] == "The user wants the note read first.\n"
    assert msg["tool_calls"][0]["function"]["name"] == "read" and not msg["content"]
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    row = turn(app, int(r.headers["x-clawrl-turn-id"]))
    assert row["reasoning_text"] == msg["reasoning_content"]
    assert "<think>" not in (row["response_text"] or "") and row["tool_calls"]
    assert len(json.loads(row["response_ids"])) == row["completion_tokens"] > 20  # every token kept


def test_streamed_thinking_and_answer_arrive_in_their_own_fields(app):
    messages = [{"role": "user", "content": "What does notes.txt say?"},
                {"role": "tool", "content": f"The secret animal is a{MARKER}."}]
    thought, answer = "", ""
    with app.stream("POST", "/v1/chat/completions", json={"messages": messages, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                thought += delta.get("reasoning_content", "")
                answer += delta.get("content") or ""
    assert thought == "The user wants the note read first.\n"
    assert answer == ANSWER


def test_a_stop_string_in_the_thinking_does_not_stop_the_answer(app):
    messages = [{"role": "user", "content": "Read it."}, {"role": "tool", "content": "kangaroo"}]
    r = app.post("/v1/chat/completions", json={"messages": messages, "stop": ["note"]})
    msg = r.json()["choices"][0]["message"]
    assert msg["reasoning_content"] == "The user wants the note read first.\n"
    assert msg["content"] == "Done: the "
