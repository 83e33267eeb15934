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

Ratios are against `general` at the recipe's dtype: the previous default. A path may name a git
revision, `int8@HEAD~1`: its children import the daemon's code as it was at that revision (the
bench's own code stays this one's), so a change is measured against the code before it, in one
run; ratios are then against the first path that names a revision. Progress goes to stderr; the
table, then one JSON line, to stdout. Each (repetition, path) runs in a child process of its own
(`--out FILE` writes the JSON too).

    .venv/bin/python bench/decode.py [--paths general,float32,int8,int8@REV] [--reps 3] [--tokens 128]
                                     [--context 7000] [--home DIR] [--out FILE]
                                     [--child-env KEY=VALUE] [--accuracy]
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
from against import long_messages  # noqa: E402
from common import emit  # noqa: E402

SHORT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]


def say(msg: str) -> None:
    print(f"[decode] {msg}", file=sys.stderr, flush=True)


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
    long_msgs = long_messages(lambda m: engine.render(m, None), args.context)
    out: dict = {"decode": engine.decode_path, "code": clawrl.__file__,
                 "dtype": str(engine.dtype).removeprefix("torch."),
                 "threads": engine.cfg.engine.threads or os.cpu_count()}
    for live in ("base", "adapter"):
        if live == "adapter":
            t0 = time.perf_counter()
            await asyncio.wrap_future(engine.load_adapter(1, adapter_dir))
            engine.activate(1)
            out["swap_ms"] = 1000 * (time.perf_counter() - t0)
            if engine.fast is not None:           # merged for decode in the background
                while not engine.fast.is_merged(engine.slots.name(1)) and time.perf_counter() - t0 < 300:
                    await asyncio.sleep(0.05)
                out["merged_s"] = time.perf_counter() - t0
        r = {"short": await stream(engine, SHORT, args.tokens, None)}
        if not args.no_long:
            engine.prefix_pool.clear()                     # a cold prefill
            r["long"] = await stream(engine, long_msgs, args.tokens, None)
            r["cached"] = await stream(engine, long_msgs, 1, None)
        out[live] = r
    engine.close()
    return out


def export_daemon(rev: str, scratch: Path) -> Path:
    """The daemon's code at git revision `rev`, written under `scratch`: the folder to put first
    on a child's PYTHONPATH."""
    repo = Path(__file__).resolve().parent.parent
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"--paths: {rev!r} is not a git revision of this repository")
    commit = found.stdout.strip()
    tree = scratch / f"rev-{commit[:12]}"
    tree.mkdir()
    # the daemon finds its recipes (and skills) beside it, as in a checkout
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit, "daemon", "recipes", "skill_bridge"],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree / "daemon"


def run(args) -> dict:
    """Each (repetition, path) in a child process of its own, interleaved: engines in one process
    would each keep an OpenMP pool and slow one another (engines/embedded.py, load)."""
    paths = args.paths.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="clawrl-decode-"))
    adapter = scratch / "v1"
    trees = {p: export_daemon(p.partition("@")[2], scratch) for p in paths if "@" in p}
    runs: dict = {p: [] for p in paths}
    for rep in range(args.reps):
        for p in paths:
            say(f"rep {rep + 1}/{args.reps}: decode_weights = {p}")
            cmd = [sys.executable, __file__, "--child", p.partition("@")[0], "--adapter", str(adapter),
                   "--tokens", str(args.tokens), "--context", str(args.context),
                   "--home", args.home] + (["--no-long"] if args.no_long else [])
            env = {**os.environ, **dict(kv.split("=", 1) for kv in args.child_env)}
            if p in trees:
                env["PYTHONPATH"] = os.pathsep.join([str(trees[p]), *filter(None, [env.get("PYTHONPATH")])])
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"{p} child failed:\n{done.stderr[-3000:]}")
            runs[p].append(json.loads(done.stdout.strip().splitlines()[-1]))
            code = Path(runs[p][-1].pop("code"))
            if p in trees and not code.is_relative_to(trees[p]):
                raise RuntimeError(f"{p}: the child imported {code}, not the revision's code")
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
    baseline = next((p for p in paths if "@" in p), "general")
    base = out["paths"].get(baseline)
    out["meta"]["baseline"] = baseline if base else None
    if base:
        for p, row in out["paths"].items():
            row["vs_baseline"] = {live: {k: row[live][k] / base[live][k] for k in row[live]
                                        if k.endswith("tok_s") and base[live][k]}
                                 for live in ("base", "adapter")}
    out["runs"] = runs
    return out


ACCURACY_PROMPTS = [
    "What is the capital of France?", "Write a haiku about snow and mountains.",
    "Explain how a bicycle works in three sentences.", "Give me a Python function that reverses a "
    "string.", "List three tips for better sleep.", "What's the difference between a virus and "
    "bacteria?", "Summarise the plot of Romeo and Juliet.", "How do I boil an egg?"]


def accuracy(args) -> dict:
    """How far each fast path's served logprobs are from float32 transformers: per token of
    float32's greedy answer (what the trainer recomputes), |logprob difference| and whether the
    path's own greedy choice is the same token."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from clawrl.engines.fastdecode import FastDecoder
    home = Path(args.home).expanduser()
    tok_engine = build("general", home)            # only to find the model and render
    path, render = tok_engine.base_model.name_or_path, tok_engine.render
    tok_engine.close()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    refs = []
    with torch.inference_mode():
        for q in ACCURACY_PROMPTS:
            ids = render([{"role": "user", "content": q}], None)
            out = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens, do_sample=False)
            gen = out[0, len(ids):].tolist()
            lp = model(input_ids=out).logits[0].float().log_softmax(-1)
            refs.append((ids, gen, [float(lp[len(ids) - 1 + j, t]) for j, t in enumerate(gen)]))
    res = {"tokens": sum(len(g) - 1 for _, g, _ in refs), "prompts": len(refs), "paths": {}}
    for kind in [p for p in args.paths.split(",") if p != "general"]:
        fast = FastDecoder(model, kind)
        diffs, agree = [], 0
        for ids, gen, lps in refs:
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
            for j in range(1, len(gen)):
                logits = fast.step([gen[j - 1]], [len(ids) + j - 1], cache)[0]
                diffs.append(abs(float(logits.log_softmax(-1)[gen[j]]) - lps[j]))
                agree += int(logits.argmax()) == gen[j]
        diffs.sort()
        res["paths"][kind] = {"mean_abs_dlogprob": statistics.mean(diffs),
                              "p95_abs_dlogprob": diffs[int(0.95 * (len(diffs) - 1))],
                              "max_abs_dlogprob": diffs[-1], "greedy_agreement": agree / len(diffs)}
        say(f"{kind}: {res['paths'][kind]}")
    print(f"\nlogprobs against float32 transformers, {res['tokens']} tokens of "
          f"{res['prompts']} greedy answers")
    print(f"{'path':<10}{'mean |d|':>10}{'p95 |d|':>10}{'max |d|':>10}{'same greedy token':>19}")
    for kind, r in res["paths"].items():
        print(f"{kind:<10}{r['mean_abs_dlogprob']:>10.4f}{r['p95_abs_dlogprob']:>10.4f}"
              f"{r['max_abs_dlogprob']:>10.3f}{r['greedy_agreement']:>19.3f}")
    return res


def print_table(res: dict) -> None:
    m = res["meta"]
    print(f"\ndecode paths, {m['threads']} threads, model dtype {m['dtype']}, {m['tokens']} tokens, "
          f"median of {m['reps']}; long prompt {m['context']} tokens")
    width = max(10, *(len(p) + 1 for p in res["paths"]))
    print(f"{'path':<{width}} {'live':<8} {'short tok/s':>11} {'long tok/s':>10} {'cold prefill s':>14} "
          f"{'cached TTFT s':>13} {'swap ms':>8} {'short ratio':>16} {'long ratio':>15}"
          f"   (ratios against {m.get('baseline') or 'none'})")
    for p, row in res["paths"].items():
        for live in ("base", "adapter"):
            r, v = row[live], row.get("vs_baseline", {}).get(live, {})
            print(f"{p:<{width}} {live:<8} {r['short_tok_s']:>11.1f} {r.get('long_tok_s', float('nan')):>10.1f} "
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
    p.add_argument("--child-env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in every child's environment (e.g. OMP_WAIT_POLICY=PASSIVE)")
    p.add_argument("--accuracy", action="store_true",
                   help="instead of speed: each path's logprobs against transformers' float32 "
                        "forward, teacher-forced on float32's greedy answers")
    p.add_argument("--child", help=argparse.SUPPRESS)      # one path, one repetition
    p.add_argument("--adapter", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
        return 0
    if args.accuracy:
        res = accuracy(args)
        emit(res, args.out)
        return 0
    res = run(args)
    print_table(res)
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
