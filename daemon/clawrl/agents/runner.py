"""Play episodes of an environment against a daemon, many at once, and report their outcomes.

One episode is one session (X-Session-Id) of main turns, over the daemon's OpenAI API:

  request(messages, tools) -> tool calls -> each runs in the episode's sandbox -> the assistant
  message and one `role: tool` message per call are appended -> the next request -> ...

until the model answers without a tool call, `max_steps` requests have acted, or a sandbox limit
stops a command (the episode then fails at once). The daemon reads each request's new messages,
the tool results, as the next state of the turn before. An episode that ends on tool calls sends
one more request carrying their results, so that its last acting turn gets its next state too;
that request asks for one token and is marked no-train.

Then the environment's verifier decides, and the verdict goes to POST /v1/feedback as reward +1
or -1 on every acting turn (the episode's outcome is each step's reward), or, with `step_judge`,
on the last one only, leaving the steps to the daemon's judge (the PRM). A failed episode's
feedback can carry the environment's hint as its comment. The session is then ended.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx

from .env import Env, Task, Verdict
from .sandbox import Limits, Sandbox


@dataclass(frozen=True)
class Play:
    """How episodes are played; recipe.py fills it from a recipe."""
    max_steps: int = 4
    max_tokens: int = 192
    temperature: float = 0.7
    limits: Limits = field(default_factory=Limits)
    train: bool = True          # false: X-Clawrl-No-Train on every request
    step_judge: bool = False    # true: the verdict goes to the last turn only
    hints: bool = True          # a failed episode's feedback carries the environment's hint
    user: str = "agents"
    timeout_s: float = 600.0    # one model request


@dataclass
class Episode:
    task: str
    kind: str
    split: str
    session: str
    ok: bool = False
    reason: str = ""
    steps: int = 0              # model requests that acted (tool calls or the final answer)
    tool_calls: int = 0
    stopped: str | None = None  # the sandbox limit that ended it
    turns: list[int] = field(default_factory=list)   # acting turns, in order
    carry_turn: int | None = None
    final: str | None = None
    seconds: float = 0.0
    model_s: float = 0.0        # of which waiting for the model's acting requests
    tool_s: float = 0.0         # and running tool calls in the sandbox
    error: str | None = None    # the daemon failed us: counted as failed, no feedback sent


class DaemonError(Exception):
    pass


async def _post(client: httpx.AsyncClient, url: str, tries: int = 6, **kw) -> httpx.Response:
    """POST, waiting out 503s (model loading, queue full) as the daemon's Retry-After says."""
    for attempt in range(tries):
        r = await client.post(url, **kw)
        if r.status_code != 503 or attempt == tries - 1:
            break
        await asyncio.sleep(float(r.headers.get("retry-after", 1)))
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:300]
        raise DaemonError(f"{url} answered {r.status_code}: {message}")
    return r


async def _chat(client, url, opts: Play, env: Env, ep: Episode, messages, seed: int,
                max_tokens: int, no_train: bool) -> tuple[int | None, dict]:
    headers = {"X-Session-Id": ep.session, "X-User-Id": opts.user, "X-Turn-Kind": "agent"}
    if no_train:
        headers["X-Clawrl-No-Train"] = "1"
    r = await _post(client, f"{url}/v1/chat/completions", headers=headers, timeout=opts.timeout_s,
                    json={"model": "clawrl", "messages": messages, "tools": env.tools,
                          "max_tokens": max_tokens, "temperature": opts.temperature, "seed": seed})
    turn = r.headers.get("x-clawrl-turn-id")
    return (int(turn) if turn else None), r.json()["choices"][0]["message"]


async def play_episode(client: httpx.AsyncClient, url: str, env: Env, task: Task, opts: Play,
                       seed: int = 0) -> Episode:
    """One episode of `task`; never raises for what the model or the daemon does."""
    ep = Episode(task.id, task.kind, task.split, f"agent-{env.name}-{uuid.uuid4().hex[:12]}")
    t0 = time.monotonic()
    with Sandbox(opts.limits) as box:
        env.setup(task, box)
        box.seal()
        messages = env.messages(task)
        pending = False   # the last message is a tool result no request has carried yet
        try:
            for step in range(opts.max_steps):
                t = time.monotonic()
                turn, msg = await _chat(client, url, opts, env, ep, messages, seed + step,
                                        opts.max_tokens, not opts.train)
                ep.model_s += time.monotonic() - t
                ep.steps += 1
                if turn is not None:
                    ep.turns.append(turn)
                calls = msg.get("tool_calls") or []
                if not calls:
                    ep.final, pending = msg.get("content") or "", False
                    break
                messages.append({"role": "assistant", "content": msg.get("content"),
                                 "tool_calls": calls})
                for call in calls:
                    fn = call.get("function") or {}
                    t = time.monotonic()
                    result = await env.call(task, box, fn.get("name"), fn.get("arguments"))
                    ep.tool_s += time.monotonic() - t
                    ep.tool_calls += 1
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                     "name": fn.get("name"), "content": result.content})
                    ep.stopped = ep.stopped or result.stopped
                pending = True
                if ep.stopped:
                    break
            if pending:
                ep.carry_turn, _ = await _chat(client, url, opts, env, ep, messages,
                                               seed + opts.max_steps, 1, True)
            verdict = (Verdict(False, f"stopped by the sandbox: {ep.stopped}") if ep.stopped
                       else await env.verify(task, box, ep.final))
        except (httpx.HTTPError, DaemonError, KeyError, ValueError) as e:
            ep.error = f"{type(e).__name__}: {e}"[:500]
            verdict = Verdict(False, f"the episode could not be played: {ep.error}")
        ep.ok, ep.reason = verdict.ok, verdict.reason
        try:
            await _report(client, url, env, task, opts, ep, verdict)
        except (httpx.HTTPError, DaemonError) as e:
            ep.error = ep.error or f"feedback failed: {e}"[:500]
    ep.seconds = time.monotonic() - t0
    return ep


async def _report(client, url, env: Env, task: Task, opts: Play, ep: Episode,
                  verdict: Verdict) -> None:
    if not ep.turns:
        return
    comment = None if verdict.ok or not opts.hints else env.hint(task, verdict)
    # An episode the daemon broke off says nothing about the model: no reward for it.
    targets = [] if ep.error else ep.turns[-1:] if opts.step_judge else ep.turns
    for turn in targets:
        await _post(client, f"{url}/v1/feedback", timeout=60, headers={"X-User-Id": opts.user},
                    json={"session_id": ep.session, "turn_id": turn,
                          "reward": 1 if verdict.ok else -1, "comment": comment})
    await _post(client, f"{url}/v1/sessions/{ep.session}/end", timeout=60)


async def play_all(url: str, env: Env, tasks: list[Task], opts: Play, concurrency: int = 1,
                   seed: int = 0, headers: dict | None = None, progress=None) -> list[Episode]:
    """Every task once, `concurrency` at a time; results in the order of `tasks`. Episode i
    samples with seed `seed + 1000 * i`, so two runs with the same seed sample alike."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)

    async with httpx.AsyncClient(headers=headers or {}, limits=limits) as client:
        async def one(i: int, task: Task) -> Episode:
            async with sem:
                ep = await play_episode(client, url.rstrip("/"), env, task, opts, seed + 1000 * i)
            if progress:
                progress(ep)
            return ep

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))


def summary(episodes: list[Episode], wall_s: float) -> dict:
    n = len(episodes)
    steps, calls = sum(e.steps for e in episodes), sum(e.tool_calls for e in episodes)
    stops: dict[str, int] = {}
    for e in episodes:
        if e.stopped:
            stops[e.stopped] = stops.get(e.stopped, 0) + 1
    return {"episodes": n, "success": sum(e.ok for e in episodes) / n if n else 0.0,
            "successes": sum(e.ok for e in episodes), "steps": steps,
            "tool_calls": calls, "wall_s": round(wall_s, 2),
            "steps_per_s": round(steps / wall_s, 3) if wall_s > 0 else None,
            "model_s_per_step": round(sum(e.model_s for e in episodes) / steps, 3) if steps else None,
            "tool_s_per_call": round(sum(e.tool_s for e in episodes) / calls, 3) if calls else None,
            "stopped": stops, "errors": sum(e.error is not None for e in episodes)}
