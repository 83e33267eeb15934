"""Scenarios both server-engine test files run against their double (same steps, same claims):
exact served tokens, teacher scoring, routing across a swap, a refused adapter, and the server
dying in the middle of a request."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from clawrl.adapters import versions as adapters
from clawrl.config import load_config
from clawrl.learn.remote_teacher import remote_teacher

from .harness import Transcript, chat, hold, sse, wait_active, write_adapter


@dataclass
class Ctx:
    kind: str
    daemon: object          # conftest.Daemon
    transcript: Transcript
    engine_url: str
    model_dir: Path

    @property
    def url(self) -> str:
        return self.daemon.url

    @property
    def root(self) -> Path:
        return self.daemon.home / "adapters"


class Stream:
    """A streamed chat request read in a thread; `chunks` grows as the data lines arrive."""

    def __init__(self, url: str, text: str, session: str, max_tokens: int):
        self.lines: list[str] = []
        self.turn_id: int | None = None
        body = {"model": "m", "stream": True, "max_tokens": max_tokens, "temperature": 0,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": text}]}

        def run():
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300,
                              headers={"X-Session-Id": session}) as r:
                self.turn_id = int(r.headers["x-clawrl-turn-id"])
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def content_chunks(self) -> int:
        return sum(1 for p in sse(self.lines) if isinstance(p, dict) and p.get("choices")
                   and p["choices"][0]["delta"].get("content"))

    def wait_tokens(self, n: int = 2, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while self.content_chunks() < n:
            assert time.time() < deadline and self.thread.is_alive(), self.lines[-3:]
            time.sleep(0.05)

    def join(self) -> list:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive()
        return sse(self.lines)


def served_tokens_are_exact(ctx: Ctx, tokenizer) -> None:
    """What the turn log records is exactly what the server sent: prompt ids in, ids and
    logprobs out, for a streamed and a non-streamed request."""
    s = Stream(ctx.url, "Name three colours of the rainbow.", f"{ctx.kind}-exact-s", 12)
    payloads = s.join()
    assert payloads[-1] == "[DONE]"
    streamed = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads
                       if isinstance(p, dict) and p.get("choices"))
    r = chat(ctx.url, "What is two plus two?", f"{ctx.kind}-exact-n", max_tokens=10)
    assert r.status_code == 200, r.text
    for turn_id, text in ((s.turn_id, streamed), (int(r.headers["x-clawrl-turn-id"]),
                                                  r.json()["choices"][0]["message"]["content"])):
        row = ctx.daemon.wait_turn(turn_id)
        assert row["status"] == "complete", row
        prompt, ids, lps = (json.loads(row[k]) for k in ("prompt_ids", "response_ids",
                                                         "response_logprobs"))
        sent = ctx.transcript.generation(prompt)          # the server got clawrl's own ids
        assert ids == sent["output_ids"] and lps == sent["output_logprobs"]
        assert sent["lora_path"] is None and row["adapter_version"] == 0
        assert all(lp <= 0 for lp in lps) and len(set(lps)) > 1
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
        assert row["completion_tokens"] == len(ids)


def teacher_scores_served_tokens(ctx: Ctx) -> None:
    """The trainer's remote teacher (the real client code) scores a served response on the
    server: its logprobs are those the server served (same base model, same context)."""
    row = ctx.daemon.rows("SELECT * FROM turns WHERE status='complete' AND adapter_version=0 "
                          "ORDER BY id LIMIT 1")[0]
    prompt, ids, served = (json.loads(row[k]) for k in ("prompt_ids", "response_ids",
                                                        "response_logprobs"))
    cfg = load_config(env={k: v for k, v in ctx.daemon.env.items() if k.startswith("CLAWRL_")})
    teacher = remote_teacher(cfg)
    logps, top = teacher(prompt, ids, 3)
    assert len(logps) == len(ids) and len(top["ids"]) == len(ids)
    for lp, s, tids, tlps in zip(logps, served, top["ids"], top["logp"]):
        assert abs(lp - s) < 2e-3                        # float32 both ways; cached vs full pass
        assert len(tids) == 3 and tlps == sorted(tlps, reverse=True) and tlps[0] >= lp - 1e-6
    logps0, none = teacher(prompt, ids, 0)
    assert logps0 == logps and none is None
    assert ctx.transcript.events("score")


def swap_routes_new_requests_and_unloads_when_idle(ctx: Ctx) -> None:
    """Across swaps a running request keeps its adapter; new requests get the new one; a retired
    adapter is unloaded from the server only after its last request finished."""
    base = adapters.newest(ctx.root) or 0
    a, b, c = base + 1, base + 2, base + 3
    write_adapter(ctx.root, a, 8, ctx.model_dir)
    wait_active(ctx.url, a)
    name_a = ctx.transcript.name_of(a)
    s = Stream(ctx.url, "Count from one to thirty, in words.", f"{ctx.kind}-swap-long", 48)
    s.wait_tokens(2)
    hold(ctx.engine_url, name_a, True)          # it stays in flight while we swap twice
    try:
        for v in (b, c):
            write_adapter(ctx.root, v, 8, ctx.model_dir)
            wait_active(ctx.url, v)
        r = chat(ctx.url, "Say hello.", f"{ctx.kind}-swap-new")
        assert r.status_code == 200, r.text
        row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
        assert row["adapter_version"] == c
        assert ctx.transcript.generation(json.loads(row["prompt_ids"]))["lora_path"] == \
            ctx.transcript.name_of(c)
        assert s.thread.is_alive()
        assert not [e for e in ctx.transcript.events("unload") if e["lora_name"] == name_a]
    finally:
        hold(ctx.engine_url, name_a, False)
    assert s.join()[-1] == "[DONE]"
    old = ctx.daemon.wait_turn(s.turn_id)
    assert old["status"] == "complete" and old["adapter_version"] == a
    assert ctx.transcript.generation(json.loads(old["prompt_ids"]))["lora_path"] == name_a
    gone = ctx.transcript.wait(lambda e: e["event"] == "unload" and e["lora_name"] == name_a,
                               what=f"the unload of {name_a}")
    assert gone["inflight_at_arrival"] == 0
    assert all(e["inflight_at_arrival"] == 0 for e in ctx.transcript.events("unload"))
    names = [e["lora_name"] for e in ctx.transcript.events("load") if e["ok"]]
    assert len(names) == len(set(names))           # a fresh name for every load


def refuses_adapter_above_server_rank(ctx: Ctx, max_rank: int) -> None:
    """An adapter whose rank is above the server's --max-lora-rank is refused by the server; the
    daemon marks it REJECTED with the server's reason and keeps serving what it served."""
    active = httpx.get(f"{ctx.url}/v1/adapters", timeout=10).json()["active"]
    v = (adapters.newest(ctx.root) or 0) + 1
    write_adapter(ctx.root, v, 2 * max_rank, ctx.model_dir)
    deadline = time.time() + 120
    while adapters.rejection(ctx.root, v) is None:
        assert time.time() < deadline, "the adapter was never rejected"
        time.sleep(0.1)
    reason = adapters.rejection(ctx.root, v)
    assert "refused" in reason and str(2 * max_rank) in reason and "rank" in reason, reason
    refused = ctx.transcript.wait(lambda e: e["event"] == "load" and not e["ok"]
                                  and Path(e["lora_path"]).name == f"{v:04d}")
    assert str(max_rank) in refused["error"]
    assert httpx.get(f"{ctx.url}/v1/adapters", timeout=10).json()["active"] == active
    r = chat(ctx.url, "Still there?", f"{ctx.kind}-after-refusal")
    assert r.status_code == 200 and ctx.daemon.wait_turn(
        int(r.headers["x-clawrl-turn-id"]))["adapter_version"] == active


def server_killed_mid_request(ctx: Ctx) -> None:
    """SIGKILL the server while a response streams: that client gets an in-band 502 error, new
    requests get 503 + Retry-After while it restarts, the supervisor restarts it, the active
    adapter is loaded again under a fresh name, and serving resumes."""
    active = httpx.get(f"{ctx.url}/v1/adapters", timeout=10).json()["active"]
    old_name = ctx.transcript.name_of(active) if active else None
    pid, starts = ctx.transcript.pid(), len(ctx.transcript.events("start"))
    s = Stream(ctx.url, "Tell me a long story about a lighthouse.", f"{ctx.kind}-killed", 64)
    s.wait_tokens(2)
    hold(ctx.engine_url, old_name, True)         # certainly mid-request when it dies
    os.kill(pid, signal.SIGKILL)
    payloads = s.join()
    assert "[DONE]" not in payloads
    err = payloads[-1]["error"]
    assert err["code"] == "engine_disconnected" and err["status"] == 502, err
    assert ctx.kind in err["message"]
    first = chat(ctx.url, "Are you back?", f"{ctx.kind}-during-restart")
    assert first.status_code == 503, first.text
    assert first.headers["retry-after"] and first.json()["error"]["code"] == "engine_unavailable"
    down = httpx.get(f"{ctx.url}/readyz", timeout=10).json()["engine"]   # what an operator sees
    assert down["kind"] == ctx.kind and down["available"] is False, down
    deadline = time.time() + 300
    while True:
        r = chat(ctx.url, "Are you back?", f"{ctx.kind}-after-restart")
        if r.status_code == 200:
            break
        assert r.status_code == 503 and r.headers.get("retry-after"), r.text
        assert time.time() < deadline, "the server never came back"
        time.sleep(1.0)
    assert len(ctx.transcript.events("start")) == starts + 1 and ctx.transcript.pid() != pid
    up = httpx.get(f"{ctx.url}/readyz", timeout=10).json()["engine"]
    assert up["state"] == "running" and up["available"] and up["restarts"] >= 1, up
    failed = ctx.daemon.wait_turn(s.turn_id)
    assert failed["status"] == "failed" and "dropped" in failed["error"]
    row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
    assert row["adapter_version"] == active
    if active:
        new_name = ctx.transcript.name_of(active)
        assert new_name != old_name
        assert ctx.transcript.generation(json.loads(row["prompt_ids"]))["lora_path"] == new_name


def seed_reaches_the_server(ctx: Ctx) -> None:
    """A request's seed goes to the server (SGLang: sampling_params.sampling_seed, vLLM: seed), so
    the same seed at temperature 1 samples the same tokens."""
    key = "sampling_seed" if ctx.kind == "sglang" else "seed"
    answers = []
    for i in range(2):
        r = chat(ctx.url, "Name a colour and a fruit.", f"{ctx.kind}-seed-{i}", max_tokens=12,
                 temperature=1.0, seed=1234)
        assert r.status_code == 200, r.text
        row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
        sent = ctx.transcript.generation(json.loads(row["prompt_ids"]))["sampling_params"]
        assert sent[key] == 1234, sent
        answers.append(json.loads(row["response_ids"]))
    assert answers[0] == answers[1]


def fills_the_context(ctx: Ctx, tokenizer, free: int) -> None:
    """A prompt 10 tokens short of the context, asking for as many tokens as the context holds:
    the budget is cut to what the server accepts (it keeps `free` positions past prompt +
    max_tokens: SGLang 1, vLLM 0), so the request is served, not refused. Then a hinted
    teacher context that, with the response, would fill the context exactly is cut to leave the
    one position both servers need to score it."""
    from clawrl.chat.format import render_prompt
    limit = httpx.get(f"{ctx.url}/v1/models", timeout=30).json()["data"][0]["context_length"]
    words = limit
    for _ in range(8):            # " word" is one token; the template adds a few around it
        text = "word" + " word" * (words - 1)
        n = len(render_prompt(tokenizer, [{"role": "user", "content": text}], None))
        if n == limit - 10:
            break
        words -= n - (limit - 10)
    assert n == limit - 10
    r = chat(ctx.url, text, f"{ctx.kind}-fill", max_tokens=limit)
    assert r.status_code == 200, r.text
    row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
    assert len(json.loads(row["prompt_ids"])) == limit - 10
    assert json.loads(row["request_json"])["params"]["max_tokens"] == 10 - free
    assert row["completion_tokens"] <= 10 - free
    prompt, ids = json.loads(row["prompt_ids"]), json.loads(row["response_ids"])
    assert ids, "the model answered nothing; the teacher half needs a response"
    context = prompt + prompt[-1:] * (limit - len(prompt) - len(ids))
    assert len(context) + len(ids) == limit
    cfg = load_config(env={k: v for k, v in ctx.daemon.env.items() if k.startswith("CLAWRL_")})
    logps, _ = remote_teacher(cfg)(context, ids, 0)
    assert len(logps) == len(ids)
    assert len(ctx.transcript.events("score")[-1]["input_ids"]) == limit - 1
