"""What a judge costs: milliseconds per judgment, and whether judging slows serving.

1. Latency: the corpus's test split judged one line at a time (as the judging loop does under
   light load) by the rules judge, by the probe, and by the same probe head reading the reply in
   context only (the reading before the reply-alone view), interleaved; median and 95th
   percentile per judgment, on the machine's threads (the daemon's, on the embedded engine's
   worker) and on one thread (beside any other engine).
   Beside it, the base model's reading alone, this path (packed layers, the matrix products in
   bfloat16 where the CPU multiplies it natively) against the previous one (transformers'
   forward, the same products) and the one before it (float32 products) on the same lines, as
   ratios, with the cosine between their feature rows.
2. Serving: a real `clawrl serve` per judge (the converted model shared). A streamed 160-token
   answer is timed while another client keeps sending short sessions whose replies the judge must
   read (each asks for one token, so what the daemon does for them is mostly judging). The decode
   rate under the probe's judging is reported as a ratio to the same load under the rules judge,
   whose judgments cost nothing, and to the idle rate.

    .venv/bin/python bench/judge.py [--lines 154] [--rounds 3] [--out bench/results/judge.json]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from clawrl.judge import corpus
from clawrl.judge import evaluate as judge_eval, probe, probe_fit
from clawrl.config import load_config
from clawrl.evals.evaluate import Child
from clawrl.judge.judges import RulesJudge

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402

PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def latency(judges: dict, lines: list) -> dict:
    """Milliseconds per judgment of each judge (name: judge_one), one line at a time, the judges
    interleaved line by line so that a drift of the machine hits all alike."""
    times: dict = {name: [] for name in judges}
    for e in lines:
        inp = judge_eval.judge_input(e)
        for name, judge_one in judges.items():
            t0 = time.perf_counter()
            judge_one(inp)
            times[name].append(1000 * (time.perf_counter() - t0))
    out = {}
    for name, seen in times.items():
        seen.sort()
        out[name] = {"p50_ms": statistics.median(seen), "p95_ms": seen[int(0.95 * (len(seen) - 1))],
                     "n": len(seen)}
    return out


def reading_paths(reader, lines: list) -> dict:
    """Milliseconds of the base model's reading per line: this path (packed layers, the products
    in bfloat16 where the CPU has it) against the previous one (transformers' forward with the
    same products) and the one before (transformers' forward, float32 products), interleaved on
    the same lines, and how close their feature rows are (cosine)."""
    import torch
    exchanges = [probe.exchange(e.question, e.answer, e.text) for e in lines]
    previous = probe.Reader(reader.model_dir, products=reader.products, packed=False)
    before = probe.Reader(reader.model_dir, products=torch.float32, packed=False)
    readers = (reader, previous, before)
    for m in exchanges[:3]:                     # warm up
        for r in readers:
            r.read_one(m)
    times: dict = {r: [] for r in readers}
    cosines: dict = {previous: [], before: []}
    for m in exchanges:                         # interleaved, so a drift of the machine hits all
        rows = {}
        for r, seen in times.items():
            t0 = time.perf_counter()
            rows[r] = r.read_one(m)
            seen.append(1000 * (time.perf_counter() - t0))
        for r, cos in cosines.items():
            cos.append(torch.nn.functional.cosine_similarity(rows[reader], rows[r], dim=0).item())
    now, then, first = (statistics.median(times[r]) for r in readers)
    return {"this_path": f"packed layers, {reader.precision}",
            "previous_path": f"transformers, {previous.precision}",
            "float32_path": f"transformers, {before.precision}",
            "this_path_p50_ms": now, "previous_path_p50_ms": then, "float32_path_p50_ms": first,
            "speedup": then / now, "speedup_over_float32": first / now,
            "feature_cosine_min": min(cosines[previous]),
            "feature_cosine_min_float32": min(cosines[before]), "n": len(exchanges)}


def decode_rate(url: str) -> float:
    """Tokens per second of one streamed answer, first token excluded."""
    n, first = 0, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=600, json={
            "messages": PROMPT, "max_tokens": 160, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}, headers={"X-Clawrl-No-Train": "1"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                first = first or time.perf_counter()
                n += 1
    return (n - 1) / (time.perf_counter() - first)


def feedback_load(url: str, replies: list[str], stop: threading.Event) -> None:
    """Short sessions, each ending in a reply the judge must read."""
    i = 0
    with httpx.Client(timeout=600) as c:
        while not stop.is_set():
            sid = f"bench-{uuid.uuid4().hex[:8]}"
            msgs = [{"role": "user", "content": "What is the capital of Peru?"}]
            for reply in (replies[i % len(replies)], None):
                r = c.post(f"{url}/v1/chat/completions", headers={"X-Session-Id": sid},
                           json={"messages": msgs, "max_tokens": 1, "temperature": 0})
                msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]
                          ["content"] or "Lima."}, {"role": "user", "content": reply or "ok"}]
            i += 1


def serving(judge: str, models: Path, work: Path, replies: list[str], rounds: int) -> dict:
    child = Child(work / judge, models, {"CLAWRL_JUDGE_BACKEND": judge,
                                         "CLAWRL_TRAIN_ENABLED": "false"}, None).start()
    try:
        decode_rate(child.url)                          # warm up (and the probe's head loads)
        time.sleep(5)
        idle = [decode_rate(child.url) for _ in range(rounds)]
        stop = threading.Event()
        load = threading.Thread(target=feedback_load, args=(child.url, replies, stop))
        load.start()
        time.sleep(3)
        loaded = [decode_rate(child.url) for _ in range(rounds)]
        stop.set()
        load.join()
        judged = child.count("SELECT count(*) FROM turns WHERE judge_status='done'")
    finally:
        child.stop()
    return {"idle_tok_s": statistics.median(idle), "under_load_tok_s": statistics.median(loaded),
            "judged": judged}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=154, help="test-split lines to time (default 154)")
    ap.add_argument("--rounds", type=int, default=3, help="streamed answers per condition")
    ap.add_argument("--out", help="also write the JSON result here")
    args = ap.parse_args()
    cfg = load_config(None)
    lines = corpus.load("test")[:args.lines]
    head, reader = probe_fit.head_for(cfg)
    mine = probe.ProbeJudge(head, reader)
    # The same head reading the reply in context only (its views less the reply alone): the
    # previous reading, as the baseline of what the second view costs.
    context_only = probe.ProbeJudge(probe.Head(head.mean, head.std, head.weight, head.bias,
                                               dataclasses.replace(head.meta, views=[probe.CONTEXT])), reader)
    rules = RulesJudge()
    judges = {"probe": mine.judge_sync, "probe_context_only": context_only.judge_sync,
              "rules": lambda inp: asyncio.run(rules.judge(inp))}
    latency(judges, lines[:5])                          # warm up
    result: dict = {"views": head.meta.views, "latency": latency(judges, lines)}
    result["latency"]["probe_vs_context_only"] = (result["latency"]["probe"]["p50_ms"]
                                                  / result["latency"]["probe_context_only"]["p50_ms"])
    print(f"probe: {result['latency']['probe']['p50_ms']:.0f} ms median per judgment, "
          f"p95 {result['latency']['probe']['p95_ms']:.0f} ms; in context only "
          f"{result['latency']['probe_context_only']['p50_ms']:.0f} ms", file=sys.stderr)
    result["reading"] = reading_paths(reader, lines)
    print(f"reading: {result['reading']['this_path_p50_ms']:.0f} ms against "
          f"{result['reading']['previous_path_p50_ms']:.0f} ms on the previous path and "
          f"{result['reading']['float32_path_p50_ms']:.0f} ms in float32", file=sys.stderr)
    # Beside a remote engine the daemon reads on one thread (judge/loop.py): the same lines so.
    one = probe.ProbeJudge(head, reader, threads=1)
    result["latency"]["probe_one_thread"] = latency({"probe": one.judge_sync}, lines)["probe"]
    print(f"probe on one thread: {result['latency']['probe_one_thread']['p50_ms']:.0f} ms median",
          file=sys.stderr)
    del mine, one, reader
    replies = [e.text for e in lines]
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-judge-") as tmp:
        runs = {j: serving(j, cfg.models_dir, Path(tmp), replies, args.rounds)
                for j in ("rules", "probe")}
    result["serving"] = runs
    result["serving"]["probe_vs_rules_under_load"] = (runs["probe"]["under_load_tok_s"]
                                                      / runs["rules"]["under_load_tok_s"])
    result["serving"]["probe_under_load_vs_idle"] = (runs["probe"]["under_load_tok_s"]
                                                     / runs["probe"]["idle_tok_s"])
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
