"""Decode benchmark: the embedded engine's decode paths side by side, in one run, on one model.

Each path is an engine built in this process from the same recipe, differing only in
`engine.decode_weights`: `general` (transformers' own forward, the path before the fast step),
`float32` and `int8` (the fast step, engines/fastdecode.py). Each serves the base model and, in a
second pass, a LoRA adapter (rank and targets of the recipe, random non-zero weights) loaded and
activated the way the swapper does it. Workloads, greedy, interleaved across paths so that a
busy machine slows every path alike:

  short   a one-line question, `--tokens` tokens decoded: tokens/s after the first token
  long    a ~`--context`-token prompt (cold prefill timed), then `--tokens` decoded after it, and the
          same prompt again (cached TTFT: prefix reuse)
  swap    an adapter folder -> loaded and live (`load_adapter(...).result()` + `activate`), ms;
          on the fast step it is live unmerged at once, and merged (`merged_s`) in the background

Ratios are against `general` at the recipe's dtype: the previous default. Progress goes to
stderr; the table, then one JSON line, to stdout. Each (repetition, path) runs in a child process
of its own (`--out FILE` writes the JSON too).

    .venv/bin/python bench/decode.py [--paths general,float32,int8] [--reps 3] [--tokens 128]
                                     [--context 7000] [--home DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import clawrl.config
import clawrl.engines
from clawrl.types import GenParams

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402

SHORT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]


def say(msg: str) -> None:
    print(f"[decode] {msg}", file=sys.stderr, flush=True)


def long_prompt(engine, tokens: int) -> list[dict]:
    """A system prompt of varied numbered notes, about `tokens` long once rendered."""
    def msgs(n):
        notes = "\n".join(f"Note {i}: the {('north', 'east', 'south', 'west')[i % 4]} shed holds "
                          f"{i * 37 % 101} crates of item {i * 13 % 97}." for i in range(n))
        return [{"role": "system", "content": "Inventory notes.\n" + notes},
                {"role": "user", "content": "Summarise what the north shed holds."}]
    n = max(1, tokens // 25)
    for _ in range(4):
        n = max(1, round(n * tokens / len(engine.render(msgs(n), None))))
    return msgs(n)


async def stream(engine, messages: list[dict], tokens: int, adapter: int | None) -> dict:
    ids = engine.render(messages, None)
    t0 = time.perf_counter()
    gen = engine.submit(ids, GenParams(max_tokens=tokens, temperature=0), adapter=adapter)
    stamps = []
    async for _ in gen:
        stamps.append(time.perf_counter())
    n = len(stamps)
    rate = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else 0.0
    return {"ttft_s": stamps[0] - t0 if stamps else None, "decode_tok_s": rate, "tokens": n,
            "prompt_tokens": len(ids)}


def write_adapter(cfg, model, folder: Path) -> Path:
    """A PEFT LoRA folder with the recipe's rank and targets, weights random and not zero."""
    import copy

    from peft import LoraConfig, get_peft_model
    targets = cfg.train.lora_targets
    lcfg = LoraConfig(r=cfg.train.lora_r, lora_alpha=cfg.train.lora_alpha, init_lora_weights=False,
                      target_modules=targets if targets == "all-linear" else targets.split(","))
    pm = get_peft_model(copy.deepcopy(model), lcfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.mul_(0.01)          # an adapter that moves answers a little, as trained ones do
    pm.save_pretrained(folder)
    return folder


def build(path: str, home: Path) -> object:
    env = {"CLAWRL_HOME": str(home), "CLAWRL_ENGINE_DECODE_WEIGHTS": path}
    if os.environ.get("CLAWRL_RECIPE"):
        env["CLAWRL_RECIPE"] = os.environ["CLAWRL_RECIPE"]
    engine = clawrl.engines.make_engine(clawrl.config.load_config(env=env))
    engine.load()
    return engine


def median_of(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


async def child(args) -> dict:
    """One path, one repetition: base, then the adapter loaded, activated and merged."""
    home = Path(args.home).expanduser()
    engine = build(args.child, home)
    adapter_dir = Path(args.adapter)
    if not (adapter_dir / "adapter_config.json").exists():
        torch.manual_seed(0)
        write_adapter(engine.cfg, engine.base_model, adapter_dir)
    long_msgs = long_prompt(engine, args.context)
    out: dict = {"decode": engine.decode_path,
                 "dtype": str(engine.dtype).removeprefix("torch."),
                 "threads": engine.cfg.engine.threads or os.cpu_count()}
    for live in ("base", "adapter"):
        if live == "adapter":
            t0 = time.perf_counter()
            await asyncio.wrap_future(engine.load_adapter(1, adapter_dir))
            engine.activate(1)
            out["swap_ms"] = 1000 * (time.perf_counter() - t0)
            if engine.fast is not None:           # merged for decode in the background
                while not engine.fast.is_merged("v1") and time.perf_counter() - t0 < 300:
                    await asyncio.sleep(0.05)
                out["merged_s"] = time.perf_counter() - t0
        r = {"short": await stream(engine, SHORT, args.tokens, None)}
        if not args.no_long:
            engine._pool.clear()                     # a cold prefill
            r["long"] = await stream(engine, long_msgs, args.tokens, None)
            r["cached"] = await stream(engine, long_msgs, 1, None)
        out[live] = r
    engine.close()
    return out


def run(args) -> dict:
    """Each (repetition, path) in a child process of its own, interleaved: engines in one process
    would each keep an OpenMP pool and slow one another (engines/embedded.py, load)."""
    paths = args.paths.split(",")
    adapter = Path(tempfile.mkdtemp(prefix="clawrl-decode-")) / "v1"
    runs: dict = {p: [] for p in paths}
    for rep in range(args.reps):
        for p in paths:
            say(f"rep {rep + 1}/{args.reps}: decode_weights = {p}")
            cmd = [sys.executable, __file__, "--child", p, "--adapter", str(adapter),
                   "--tokens", str(args.tokens), "--context", str(args.context),
                   "--home", args.home] + (["--no-long"] if args.no_long else [])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{p} child failed:\n{done.stderr[-3000:]}")
            runs[p].append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = runs[paths[0]][0]
    out: dict = {"paths": {}, "meta": {
        "threads": first["threads"], "cpus": os.cpu_count(), "reps": args.reps,
        "tokens": args.tokens, "dtype": first["dtype"],
        "context": None if args.no_long else first["base"]["long"]["prompt_tokens"],
        "decode": {p: runs[p][0]["decode"] for p in paths}}}
    for p in paths:
        row = {}
        for live in ("base", "adapter"):
            rs = [r[live] for r in runs[p]]
            row[live] = {"short_tok_s": median_of([r["short"] for r in rs], "decode_tok_s")}
            if not args.no_long:
                row[live].update({
                    "long_tok_s": median_of([r["long"] for r in rs], "decode_tok_s"),
                    "cold_prefill_s": median_of([r["long"] for r in rs], "ttft_s"),
                    "cached_ttft_s": median_of([r["cached"] for r in rs], "ttft_s")})
        row["swap_ms"] = statistics.median(r["swap_ms"] for r in runs[p])
        merged = [r["merged_s"] for r in runs[p] if "merged_s" in r]
        row["merged_s"] = statistics.median(merged) if merged else None
        out["paths"][p] = row
    base = out["paths"].get("general")
    if base:
        for p, row in out["paths"].items():
            row["vs_general"] = {live: {k: row[live][k] / base[live][k] for k in row[live]
                                        if k.endswith("tok_s") and base[live][k]}
                                 for live in ("base", "adapter")}
    out["runs"] = runs
    return out


def print_table(res: dict) -> None:
    m = res["meta"]
    print(f"\ndecode paths, {m['threads']} threads, model dtype {m['dtype']}, {m['tokens']} tokens, "
          f"median of {m['reps']}; long prompt {m['context']} tokens")
    print(f"{'path':<10} {'live':<8} {'short tok/s':>11} {'long tok/s':>10} {'cold prefill s':>14} "
          f"{'cached TTFT s':>13} {'swap ms':>8} {'short vs general':>16} {'long vs general':>15}")
    for p, row in res["paths"].items():
        for live in ("base", "adapter"):
            r, v = row[live], row.get("vs_general", {}).get(live, {})
            print(f"{p:<10} {live:<8} {r['short_tok_s']:>11.1f} {r.get('long_tok_s', float('nan')):>10.1f} "
                  f"{r.get('cold_prefill_s', float('nan')):>14.2f} {r.get('cached_ttft_s', float('nan')):>13.3f} "
                  f"{row['swap_ms'] if live == 'adapter' else float('nan'):>8.0f} "
                  f"{v.get('short_tok_s', float('nan')):>15.2f}x {v.get('long_tok_s', float('nan')):>14.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--paths", default="general,float32,int8",
                   help="engine.decode_weights values to compare (default general,float32,int8)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per workload (default 3)")
    p.add_argument("--tokens", type=int, default=128, help="tokens decoded per stream (default 128)")
    p.add_argument("--context", type=int, default=7000, help="long prompt length (default 7000)")
    p.add_argument("--no-long", action="store_true", help="only the short workload")
    p.add_argument("--home", default="~/.cache/clawrl-bench",
                   help="CLAWRL_HOME (the model is converted there once)")
    p.add_argument("--out", help="also write the JSON results to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)      # one path, one repetition
    p.add_argument("--adapter", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return 0
    res = run(args)
    print_table(res)
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
