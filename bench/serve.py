"""Serving benchmark: what the HTTP proxy costs, what prefix reuse saves, how decoding scales.

Everything is measured in one run, against the same converted model and the same recipe:

(a) Proxy overhead. The same prompts go (1) straight to an engine built in this process
    (`make_engine(cfg)`, `render`, `submit`, `async for ev in gen`) and (2) through a real
    `clawrl serve` subprocess as streaming POST /v1/chat/completions. Greedy decoding
    (temperature 0), so both sides produce the same tokens (checked). Direct and proxy calls
    alternate and never overlap, so only one process computes at a time.
      total time ratio proxy/direct (median over prompt x repetition pairs)   target <= 1.05
      added time to first token, proxy - direct (median over pairs)            target <= 5 ms
(b) Prefix reuse. One session through the proxy: call 1 carries a ~8k-token system prompt and a
    short user message; call 2 resends it with the first reply and a new user message.
      TTFT(call 2) / TTFT(call 1)                                               target <= 0.1
      usage.prompt_tokens_details.cached_tokens of call 2 (should be ~ the whole old prompt)
(c) Decode throughput through the proxy with 1 and with 4 concurrent streams (temperature 0.7,
    fixed seeds), counted from usage.completion_tokens: aggregate tokens/s and the ratio 4/1.

With `--against URL`, (a)-(c) give way to one comparison (bench/against.py): the same decode
workload, short and at long contexts, on this clawrl and on the OpenAI-compatible server at URL
(a llama.cpp `llama-server` on the same GGUF, or another clawrl), interleaved, as ratios.

The table goes to stdout, followed by one JSON line with every number; `--out FILE` also writes
that JSON to a file. Progress goes to stderr. The machine this runs on may be busy with other work
(the load average at start and end is reported): treat the numbers as contended if it is high.

    .venv/bin/python bench/serve.py [--quick] [--home DIR] [--port P] [--threads N]
                                    [--max-tokens N] [--prefix-tokens N] [--out FILE]
                                    [--against URL [--against-contexts 7000,13000]
                                     [--against-adapter]]
"""
from __future__ import annotations

import os

# OpenMP keeps its default wait policy, as the daemon does (ops/cli.py): the direct engine and
# the server never compute at the same time, so neither spins while the other works.

import argparse
import asyncio
import json
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from clawrl.evals.child import DaemonChild
from clawrl.procs import free_port

from against import compare, print_against  # noqa: E402  (bench/ is on sys.path)
from common import emit  # noqa: E402

import clawrl.config
import clawrl.engines
import clawrl.types

TARGETS = {"total_ratio": 1.05, "added_ttft_ms": 5.0, "prefix_ttft_ratio": 0.1}

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List three tips for writing clean Python code.",
    "Describe how a bicycle works to a ten-year-old.",
    "What are the main differences between a cat and a dog as pets?",
]
STREAM_PROMPTS = [
    "Write a long story about a robot who learns to paint.",
    "Write a long story about a sailor lost in a storm.",
    "Write a long story about a village that runs out of water.",
    "Write a long story about two friends who open a bakery.",
]
T_START = time.perf_counter()


def say(msg: str) -> None:
    print(f"[bench {time.perf_counter() - T_START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# -- one call, either side ---------------------------------------------------------------------------

@dataclass
class Call:
    """One generation as a client sees it. Times are perf_counter() values."""
    start: float
    first: float | None = None      # first non-empty content
    done: float | None = None       # generation complete ([DONE] / engine closed the stream)
    text: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    usage: dict = field(default_factory=dict)
    session: str = ""

    @property
    def ttft(self) -> float:
        return self.first - self.start

    @property
    def total(self) -> float:
        return self.done - self.start


async def direct_call(engine, messages: list[dict], max_tokens: int) -> Call:
    """Render + submit to the in-process engine; time the first content and the end."""
    call = Call(start=time.perf_counter())
    ids = engine.render(messages, None)
    gen = engine.submit(ids, clawrl.types.GenParams(max_tokens=max_tokens, temperature=0))
    parts = []
    async for ev in gen:
        if call.first is None and ev.text:
            call.first = time.perf_counter()
        parts.append(ev.text)
        call.completion_tokens += 1
    call.done = time.perf_counter()
    call.text = "".join(parts)
    call.prompt_tokens = len(ids)
    call.cached_tokens = gen.finish.cached_tokens if gen.finish else 0
    return call


async def proxy_call(client: httpx.AsyncClient, messages: list[dict], *, max_tokens: int,
                     temperature: float = 0.0, seed: int | None = None,
                     session: str | None = None) -> Call:
    """Streaming POST /v1/chat/completions; time the first content chunk and [DONE].
    The response is read to its very end (the server writes the turn log before closing it),
    so the server is idle again when this returns."""
    body = {"model": "clawrl", "messages": messages, "stream": True, "max_tokens": max_tokens,
            "temperature": temperature, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    session = session or f"bench-{uuid.uuid4().hex[:16]}"
    headers = {"X-Session-Id": session}
    call = Call(start=time.perf_counter(), session=session)
    parts = []
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"proxy answered {r.status_code}: {r.text[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                call.done = time.perf_counter()
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"proxy stream error: {chunk['error']}")
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") or ""
                if piece and call.first is None:
                    call.first = time.perf_counter()
                parts.append(piece)
            if chunk.get("usage"):
                call.usage = chunk["usage"]
    if call.done is None:
        raise RuntimeError("proxy stream ended without [DONE]")
    call.text = "".join(parts)
    call.completion_tokens = call.usage.get("completion_tokens", 0)
    call.prompt_tokens = call.usage.get("prompt_tokens", 0)
    call.cached_tokens = call.usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return call


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- (a) proxy overhead ------------------------------------------------------------------------------

def server_ttft_ms(db_path: Path, sessions: list[str]) -> list[float]:
    """TTFT as the server itself logged it (request arrival -> first token) for these sessions."""
    if not db_path.exists():
        return []
    db = sqlite3.connect(db_path)
    try:
        marks = ",".join("?" * len(sessions))
        rows = db.execute(f"SELECT ttft_ms FROM turns WHERE session_id IN ({marks}) "
                          "AND ttft_ms IS NOT NULL", sessions).fetchall()
    finally:
        db.close()
    return [r[0] for r in rows]


async def bench_overhead(engine, client, reps: int, max_tokens: int, db_path: Path) -> dict:
    # Prefix-cache fairness: both engines (this process's and the server's) have the same recipe,
    # hence the same prefix pool, and each receives exactly the same sequence of requests: one
    # untimed warm-up call per prompt, then the timed repetitions in the same prompt order. Their
    # pools therefore evolve identically and every timed pair reuses the same number of cached
    # prompt tokens on both sides (checked below via cached_tokens). The warm-up also pays the
    # one-off first-forward costs on both sides.
    say(f"(a) warm-up: {len(PROMPTS)} prompts on each side")
    for p in PROMPTS:
        await direct_call(engine, user(p), max_tokens)
        await proxy_call(client, user(p), max_tokens=max_tokens)
    pairs = []
    for rep in range(reps):
        for i, p in enumerate(PROMPTS):
            # Alternate which side goes first so slow drifts (other load, thermal) even out.
            if (rep + i) % 2 == 0:
                d = await direct_call(engine, user(p), max_tokens)
                x = await proxy_call(client, user(p), max_tokens=max_tokens)
            else:
                x = await proxy_call(client, user(p), max_tokens=max_tokens)
                d = await direct_call(engine, user(p), max_tokens)
            pairs.append((d, x))
            say(f"(a) rep {rep + 1}/{reps} prompt {i + 1}: direct {d.total:.2f}s "
                f"proxy {x.total:.2f}s  ttft {d.ttft * 1e3:.0f}/{x.ttft * 1e3:.0f} ms")
    # Where the added TTFT goes: inside the server (arrival -> first token, from the turn log;
    # includes JSON parsing, render in a thread, the turn-log insert racing the prefill) versus
    # outside it (HTTP, uvicorn, SSE framing, the client's parsing).
    server = server_ttft_ms(db_path, [x.session for _, x in pairs])
    return {
        "pairs": len(pairs), "max_tokens": max_tokens,
        "server_logged_ttft_ms": median(server) if server else None,
        "direct_ttft_ms": median([d.ttft * 1e3 for d, _ in pairs]),
        "proxy_ttft_ms": median([x.ttft * 1e3 for _, x in pairs]),
        "direct_total_s": median([d.total for d, _ in pairs]),
        "proxy_total_s": median([x.total for _, x in pairs]),
        "total_ratio": median([x.total / d.total for d, x in pairs]),
        "added_ttft_ms": median([(x.ttft - d.ttft) * 1e3 for d, x in pairs]),
        "added_total_ms": median([(x.total - d.total) * 1e3 for d, x in pairs]),
        "identical_outputs": sum(d.text == x.text for d, x in pairs),
        "same_token_count": sum(d.completion_tokens == x.completion_tokens for d, x in pairs),
        "same_cached_tokens": sum(d.cached_tokens == x.cached_tokens for d, x in pairs),
        "completion_tokens": median([x.completion_tokens for _, x in pairs]),
        "cached_tokens": median([x.cached_tokens for _, x in pairs]),
        "raw": [{"direct_ttft_ms": round(d.ttft * 1e3, 2), "proxy_ttft_ms": round(x.ttft * 1e3, 2),
                 "direct_total_s": round(d.total, 4), "proxy_total_s": round(x.total, 4),
                 "tokens": x.completion_tokens} for d, x in pairs],
    }


# -- (b) prefix reuse --------------------------------------------------------------------------------

SUBJECTS = ["the deploy script", "every cron job", "the memory file", "a subagent", "the heartbeat",
            "the browser tool", "a shell command", "the calendar sync", "the mail digest",
            "a git push", "the backup task", "the chat summary", "a file upload"]
ACTIONS = ["must log its arguments", "should retry twice", "may run without asking",
           "has to be confirmed by the user", "must never touch production",
           "should report its duration", "needs a dry run first", "must stay under a minute",
           "should write a short note", "has to check the disk space"]
WHENS = ["before noon", "on weekends", "when the queue is long", "after a failed build",
         "during a meeting", "if the battery is low", "while travelling", "at the end of a sprint",
         "when a new user joins", "after midnight", "if the network is slow"]
FIRST_Q = "In one sentence: what does rule 12 say?"
SECOND_Q = "And what does rule 40 say?"


def long_system_prompt(engine, target_tokens: int) -> tuple[str, int]:
    """Numbered, varied rules until call 1's rendered prompt is about `target_tokens` long."""
    def text(n: int) -> str:
        rules = [f"Rule {i}: {SUBJECTS[i % 13]} {ACTIONS[(i * 3) % 10]} {WHENS[(i * 7) % 11]}."
                 for i in range(1, n + 1)]
        return "You are the operations assistant. Follow these house rules.\n" + "\n".join(rules)

    def count(n: int) -> int:
        msgs = [{"role": "system", "content": text(n)}] + user(FIRST_Q)
        return len(engine.render(msgs, None))

    n = max(1, target_tokens // 20)
    for _ in range(4):   # proportional refinement converges in two or three steps
        n = max(1, round(n * target_tokens / count(n)))
    return text(n), count(n)


async def bench_prefix(engine, client, target_tokens: int, max_tokens: int) -> dict:
    system, n_tokens = long_system_prompt(engine, target_tokens)
    session = f"bench-prefix-{uuid.uuid4().hex[:12]}"
    msgs1 = [{"role": "system", "content": system}] + user(FIRST_Q)
    say(f"(b) call 1: {n_tokens}-token prompt, cold (this prefill is the slow part)")
    c1 = await proxy_call(client, msgs1, max_tokens=max_tokens, session=session)
    msgs2 = msgs1 + [{"role": "assistant", "content": c1.text}] + user(SECOND_Q)
    say(f"(b) call 1 TTFT {c1.ttft:.2f}s; call 2, same session")
    c2 = await proxy_call(client, msgs2, max_tokens=max_tokens, session=session)
    say(f"(b) call 2 TTFT {c2.ttft:.3f}s, cached {c2.cached_tokens}/{c2.prompt_tokens}")
    return {
        "rendered_prompt_tokens": n_tokens,
        "call1_prompt_tokens": c1.prompt_tokens, "call1_cached_tokens": c1.cached_tokens,
        "call1_ttft_s": c1.ttft, "call1_total_s": c1.total,
        "call2_prompt_tokens": c2.prompt_tokens, "call2_cached_tokens": c2.cached_tokens,
        "call2_ttft_s": c2.ttft, "call2_total_s": c2.total,
        "ttft_ratio": c2.ttft / c1.ttft,
    }


# -- (c) decode throughput ---------------------------------------------------------------------------

async def stream_round(client, n: int, round_no: int, max_tokens: int) -> dict:
    """n concurrent streams; aggregate completion tokens / wall time from first send to last end."""
    calls = await asyncio.gather(*[
        proxy_call(client, user(STREAM_PROMPTS[i % len(STREAM_PROMPTS)]), max_tokens=max_tokens,
                   temperature=0.7, seed=1000 * round_no + i)
        for i in range(n)])
    wall = max(c.done for c in calls) - min(c.start for c in calls)
    tokens = sum(c.completion_tokens for c in calls)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "per_stream_tokens": [c.completion_tokens for c in calls]}


async def bench_concurrency(client, rounds: int, max_tokens: int) -> dict:
    out = {"max_tokens": max_tokens, "rounds": rounds}
    for n in (1, 4):
        results = []
        for r in range(rounds):
            res = await stream_round(client, n, r, max_tokens)
            results.append(res)
            say(f"(c) {n} stream(s), round {r + 1}/{rounds}: {res['tokens']} tokens in "
                f"{res['wall_s']:.2f}s = {res['tok_s']:.1f} tok/s")
        out[f"streams{n}_tok_s"] = median([x["tok_s"] for x in results])
        out[f"streams{n}_rounds"] = results
    out["ratio_4_over_1"] = out["streams4_tok_s"] / out["streams1_tok_s"]
    return out


# -- the daemon subprocess ---------------------------------------------------------------------------

def bench_env(home: Path, work: Path, threads: int) -> dict[str, str]:
    """One environment for both sides: same recipe, same home (model converted once), same threads.
    The turn log goes to a throwaway file so runs don't grow the home directory."""
    env = dict(os.environ)
    env.update({"CLAWRL_HOME": str(home), "CLAWRL_STORE_PATH": str(work / "bench.db")})
    if threads:
        env["CLAWRL_ENGINE_THREADS"] = str(threads)
    return env


def adapter_home(cfg, engine, home: Path, work: Path) -> Path:
    """A home for `--against-adapter`: the bench home's converted model, and adapter version 1
    (bench/decode.py's: the recipe's rank and targets, small random weights) for the daemon to
    swap in at start. The bench home itself gets no adapter, so a later run serves the base."""
    from decode import write_adapter

    from clawrl.adapters import versions
    served = work / "home"
    served.mkdir()
    (served / "models").symlink_to(home / "models")
    versions.write_version(served / "adapters", 1,
                           lambda d: write_adapter(cfg, engine.base_model, d),
                           {"parent": None, "samples": [], "loss": 0.0})
    return served


def wait_live(url: str, version: int, log: Path, timeout: float = 120) -> None:
    """Until `version` serves, its canary has passed and the engine has merged it into its decode
    weights (what serving on a version costs from a few seconds after its swap on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = httpx.get(f"{url}/v1/adapters", timeout=10).json()
        if info["active"] == version and any(e["version"] == version and e["event"] == "canary passed"
                                             for e in info["events"]) \
                and "merged into the decode weights" in log.read_text(errors="replace"):
            return
        for v in info["versions"]:
            if v["version"] == version and v["rejected"]:
                raise RuntimeError(f"adapter {version} was rejected: {v['rejected']}")
        time.sleep(0.2)
    raise RuntimeError(f"adapter {version} did not go live within {timeout:.0f} s")


def cpu_seconds(server_pid: int) -> tuple[float, float, float] | None:
    """(whole machine busy, this process, the server) CPU seconds so far; None off Linux.
    Their difference over the run is what other processes used: the contention."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick   # all but idle and iowait
        with open(f"/proc/{server_pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        server = (int(rest[11]) + int(rest[12])) / tick           # utime + stime
        return busy, time.process_time(), server
    except (OSError, ValueError, IndexError):
        return None


def other_load(before, after, wall: float) -> float | None:
    """Average cores used by processes other than the bench and its server during the run."""
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1]) - (after[2] - before[2])) / wall)


def log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# -- report ------------------------------------------------------------------------------------------

def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "FAIL"


def print_table(res: dict) -> None:
    a, b, c, m = res["overhead"], res["prefix"], res["concurrency"], res["meta"]
    other = m["other_load_cores"]
    print(f"clawrl serving bench — {m['model']} ({m['dtype']}, {m['threads']} threads, "
          f"{m['cpus']} CPUs), {m['wall_s']:.0f} s")
    print(f"  load avg before the run {m['loadavg_start']:.2f}; other processes used "
          + (f"{other:.2f} cores on average during it" if other is not None else "(unknown)"))
    if other is None or other > 0.25 or m["loadavg_start"] > 0.5:
        print("  note: the machine was (or may have been) busy: numbers may be contended")
    print()
    print(f"(a) proxy vs direct engine   {a['pairs']} pairs, max_tokens {a['max_tokens']}, "
          f"temperature 0, medians")
    print(f"    {'':32}{'direct':>10}{'proxy':>10}")
    print(f"    {'time to first token (ms)':32}{a['direct_ttft_ms']:>10.1f}{a['proxy_ttft_ms']:>10.1f}")
    print(f"    {'total (s)':32}{a['direct_total_s']:>10.3f}{a['proxy_total_s']:>10.3f}")
    print(f"    {'total ratio proxy/direct':32}{a['total_ratio']:>20.3f}   target <= "
          f"{TARGETS['total_ratio']}  {verdict(a['total_ratio'], TARGETS['total_ratio'])}")
    print(f"    {'added TTFT (ms)':32}{a['added_ttft_ms']:>20.1f}   target <= "
          f"{TARGETS['added_ttft_ms']:.0f}     {verdict(a['added_ttft_ms'], TARGETS['added_ttft_ms'])}")
    print(f"    {'added total (ms)':32}{a['added_total_ms']:>20.1f}")
    if a["server_logged_ttft_ms"] is not None:
        print(f"    {'TTFT as logged by the server':32}{a['server_logged_ttft_ms']:>20.1f}   "
              f"(arrival -> first token; the rest of the proxy TTFT is HTTP + client)")
    print(f"    identical outputs {a['identical_outputs']}/{a['pairs']}, same token counts "
          f"{a['same_token_count']}/{a['pairs']}, same cached tokens {a['same_cached_tokens']}/"
          f"{a['pairs']} (median {a['cached_tokens']:.0f} cached, {a['completion_tokens']:.0f} generated)")
    print()
    print(f"(b) prefix reuse through the proxy   prompt {b['call1_prompt_tokens']} tokens")
    print(f"    {'call 1 TTFT (s)':32}{b['call1_ttft_s']:>20.3f}   (cached {b['call1_cached_tokens']})")
    print(f"    {'call 2 TTFT (s)':32}{b['call2_ttft_s']:>20.3f}   (prompt {b['call2_prompt_tokens']})")
    print(f"    {'ratio call 2 / call 1':32}{b['ttft_ratio']:>20.4f}   target <= "
          f"{TARGETS['prefix_ttft_ratio']}   {verdict(b['ttft_ratio'], TARGETS['prefix_ttft_ratio'])}")
    print(f"    {'call 2 cached_tokens':32}{b['call2_cached_tokens']:>20d}")
    print()
    print(f"(c) decode throughput through the proxy   max_tokens {c['max_tokens']}, temperature 0.7, "
          f"{c['rounds']} round(s), median")
    print(f"    {'1 stream  (tok/s)':32}{c['streams1_tok_s']:>20.1f}")
    print(f"    {'4 streams (tok/s, aggregate)':32}{c['streams4_tok_s']:>20.1f}")
    print(f"    {'ratio 4 / 1':32}{c['ratio_4_over_1']:>20.2f}")
    print()


# -- main --------------------------------------------------------------------------------------------

async def run_all(engine, url: str, db_path: Path, args) -> dict:
    reps, rounds = (1, 1) if args.quick else (3, 2)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None)) as client:
        overhead = await bench_overhead(engine, client, reps, args.max_tokens, db_path)
        prefix = await bench_prefix(engine, client, args.prefix_tokens, 16)
        concurrency = await bench_concurrency(client, rounds, 64)
    return {"overhead": overhead, "prefix": prefix, "concurrency": concurrency}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--home", default="~/.cache/clawrl-bench",
                   help="CLAWRL_HOME for both sides; the model is converted there once "
                        "(default ~/.cache/clawrl-bench)")
    p.add_argument("--port", type=int, default=0, help="port for clawrl serve (default: a free one)")
    p.add_argument("--threads", type=int, default=0,
                   help="engine.threads for both sides (default 0 = all cores)")
    p.add_argument("--max-tokens", type=int, default=32, help="completion length in (a) (default 32)")
    p.add_argument("--prefix-tokens", type=int, default=8000,
                   help="prompt length of (b)'s first call (default 8000)")
    p.add_argument("--quick", action="store_true", help="1 repetition in (a), 1 round in (c)")
    p.add_argument("--against", metavar="URL",
                   help="instead of (a)-(c): the same decode workload on clawrl and on the "
                        "OpenAI-compatible server at URL, interleaved, as ratios (bench/against.py)")
    p.add_argument("--against-contexts", default="7000,13000",
                   help="--against: long-prompt lengths in tokens (default 7000,13000)")
    p.add_argument("--against-tokens", type=int, default=128,
                   help="--against: tokens decoded per request (default 128)")
    p.add_argument("--against-reps", type=int, default=3, help="--against: repetitions (default 3)")
    p.add_argument("--against-adapter", action="store_true",
                   help="--against: clawrl serves a LoRA version (the recipe's rank and targets, "
                        "small random weights), live before the comparison starts")
    p.add_argument("--out", help="also write the JSON results to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM -> SystemExit, so the finally below still stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    home = Path(args.home).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="clawrl-bench-"))
    env = bench_env(home, work, args.threads)
    load_start = os.getloadavg()[0]
    daemon: DaemonChild | None = None
    proc, engine, ok = None, None, False
    try:
        cfg = clawrl.config.load_config(env=env)
        say(f"loading the direct engine (home {home}; a first run converts the model)")
        engine = clawrl.engines.make_engine(cfg)
        engine.load()   # converts the model into home before the server starts: no race
        port = args.port or free_port()
        url = f"http://127.0.0.1:{port}"
        # --against: the rules judge and no trainer, whose first probe fit or start-up would
        # compete for the cores
        served = adapter_home(cfg, engine, home, work) if args.against_adapter else home
        daemon = DaemonChild(served, {**env, "CLAWRL_HOME": str(served), "CLAWRL_JUDGE_BACKEND": "rules",
                                      "CLAWRL_TRAIN_ENABLED": "false"} if args.against else env,
                             port=port, log=work / "serve.log").start()
        proc = daemon.proc
        assert proc is not None     # start() made it
        if args.against_adapter:
            wait_live(url, 1, work / "serve.log")
        say("server ready" + (", adapter 1 live" if args.against_adapter else ""))
        t0, cpu0 = time.perf_counter(), cpu_seconds(proc.pid)
        if args.against:
            contexts = [int(c) for c in args.against_contexts.split(",") if c]
            results = asyncio.run(compare(proxy_call, lambda m: engine.render(m, None), url,
                                          args.against.rstrip("/"), contexts, args.against_tokens,
                                          args.against_reps, say))
        else:
            results = asyncio.run(run_all(engine, url, work / "bench.db", args))
        cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
        results["meta"] = {
            "model": engine.model_id, "dtype": str(engine.dtype).removeprefix("torch."),
            "threads": cfg.engine.threads or os.cpu_count(), "cpus": os.cpu_count(),
            "loadavg_start": load_start,
            "other_load_cores": other_load(cpu0, cpu1, t1 - t0),
            "quick": args.quick, "home": str(home), "targets": TARGETS,
            "wall_s": time.perf_counter() - T_START,
            "decode": engine.decode_path, "adapter_live": bool(args.against_adapter)}
        ok = True
    except BaseException:
        if proc is not None:
            print(f"--- clawrl serve log (tail) ---\n{log_tail(work / 'serve.log')}", file=sys.stderr)
        raise
    finally:
        if daemon is not None:
            daemon.stop(grace=20)
        if engine is not None:
            engine.close()
        shutil.rmtree(work, ignore_errors=True)
    if ok:
        print_against(results) if args.against else print_table(results)
        emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
