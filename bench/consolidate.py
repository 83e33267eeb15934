"""Consolidation benchmark: how long `clawrl consolidate` takes on N judged turns, and what serving
keeps of its idle decode speed while it runs.

The turn log is built for the run: N trainable main turns, each judged +1 or -1 (seeded, about
half each). Their text is drawn from the feedback corpus (recipes/feedback/train.jsonl: things
people write), rendered with the model's chat template, at the lengths of one of two shapes:
  chat      prompts of 40 to 190 tokens, answers of 16 to 128: the range of the turns a
            `clawrl eval` run records (means 69-83 and 23-36 tokens there)
  openclaw  prompts of 40 to 1,000 tokens (consolidation keeps the last
            consolidate.max_prompt_tokens of each, as it would of a 13k-token OpenClaw prompt)
            and answers of 16 to 240
Each -1 turn carries a hint, as the probe judge records one (the user's words): a correction from
the same corpus. So the run includes the hinted teacher writing its answers where
`consolidate.teacher_answers` asks for them (by default, as many as the window has more -1 than +1
turns: a few here, as the labels are drawn about half each); `--no-hints` leaves the hints out
(the earlier runs' log).
The run itself is the real command, `clawrl consolidate`, in a child process: TRL's KTOTrainer at
the recipe's settings.

With `--serve`, a `clawrl serve` (no trainer, rules judge) on the same model measures streaming
decode (200 tokens at temperature 0) idle, then `--samples` times while consolidation trains (from
90 s in), and reports the ratio of the medians. Serving comes first (consolidation runs at nice
10), so those answers slow the consolidation down while they stream: the run's time is then the
quiet time plus what serving took.

    .venv/bin/python bench/consolidate.py [--turns 500] [--shape chat|openclaw] [--serve]
                                          [--products float32|bfloat16] [--method kto|apo-zero]
                                          [--no-hints]
                                          [--out FILE] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from clawrl.evals.child import DaemonChild
from clawrl.learn.consolidate import LOSS_TYPES

from common import emit, env_for  # noqa: E402  (bench/ is on sys.path)

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".cache" / "models"


def say(msg: str) -> None:
    print(f"[consolidate-bench] {msg}", file=sys.stderr, flush=True)


def corpus_rows() -> list[dict]:
    return [json.loads(line) for line in
            (REPO / "recipes" / "feedback" / "train.jsonl").read_text().splitlines() if line.strip()]


SHAPES = {"chat": ((40, 190), (16, 128)), "openclaw": ((40, 990), (16, 240))}


def build_log(home: Path, n: int, seed: int, shape: str, hints: bool = True) -> dict:
    """A migrated turn log with `n` judged turns; returns their length statistics."""
    from transformers import AutoTokenizer

    from clawrl.turnlog import migrations
    tok = AutoTokenizer.from_pretrained(MODELS / "SmolLM2-135M-Instruct")
    rng = random.Random(seed)
    rows = corpus_rows()
    lines = [r["text"] for r in rows]
    corrections = [r["text"] for r in rows if r["label"] == -1]
    db = sqlite3.connect(home / "clawrl.db")
    migrations.apply(db)
    db.execute("INSERT INTO sessions (id, user_id, created_at, last_seen) VALUES ('s', 'u', 0, 0)")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    plens, rlens, labels = [], [], []
    (p_lo, p_hi), (r_lo, r_hi) = SHAPES[shape]

    def text(tokens: int) -> str:
        out = []
        while len(tok.encode(" ".join(out))) < tokens:
            out.append(rng.choice(lines))
        return " ".join(out)

    for i in range(n):
        messages = [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": text(rng.randint(p_lo, p_hi))}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tok.encode(prompt)
        response_ids = tok.encode(text(rng.randint(r_lo, r_hi)))[:r_hi - 1] + [end]
        reward = rng.choice((1, -1))
        hint = rng.choice(corrections) if reward < 0 and hints else None
        db.execute(
            "INSERT INTO turns (session_id, user_id, turn_index, turn_type, kind, trainable, status,"
            " model, adapter_version, n_messages, created_at, request_json, prompt_ids,"
            " response_text, response_ids, judge_status, judge_score, judge_hint)"
            " VALUES ('s', 'u', ?, 'main', 'main', 1, 'complete', 'm', 0, 2, ?, ?, ?, ?, ?, 'done', ?, ?)",
            (i, time.time() - 7200, json.dumps({"messages": messages}), json.dumps(prompt_ids),
             tok.decode(response_ids), json.dumps(response_ids), reward, hint))
        plens.append(len(prompt_ids))
        rlens.append(len(response_ids))
        labels.append(reward)
    db.commit()
    db.close()
    return {"turns": n, "shape": shape, "prompt_tokens_mean": statistics.mean(plens),
            "response_tokens_mean": statistics.mean(rlens), "good": labels.count(1),
            "bad": labels.count(-1), "hints": hints}


def decode_rate(url: str) -> float:
    """Tokens per second of one streamed 200-token greedy answer, first token to last."""
    body = {"model": "clawrl", "stream": True, "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
            "stream_options": {"include_usage": True}}
    first = done = None
    tokens = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                first = first or time.perf_counter()
                done = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (tokens - 1) / (done - first)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=500, help="judged turns in the log (default 500)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="chat",
                    help="the turns' lengths (default chat; see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--products", choices=("float32", "bfloat16"), default="float32",
                    help="consolidate.cpu_products: the frozen base's products on a CPU (default float32)")
    ap.add_argument("--method", choices=sorted(LOSS_TYPES), default="kto",
                    help="consolidate.method: TRL's KTO loss, or its unpaired APO-zero (default kto)")
    ap.add_argument("--no-hints", action="store_true",
                    help="no hint on the -1 turns, so the hinted teacher writes nothing")
    ap.add_argument("--serve", action="store_true", help="also measure decode while it runs")
    ap.add_argument("--samples", type=int, default=5,
                    help="with --serve: answers streamed while it runs (default 5)")
    ap.add_argument("--port", type=int, default=30931)
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--keep", help="build the home in this folder and keep it")
    args = ap.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="clawrl-consolidate-bench-"))
    home = work / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "models").symlink_to(MODELS, target_is_directory=True)
    log = build_log(home, args.turns, args.seed, args.shape, hints=not args.no_hints)
    say(f"turn log: {log}")
    res = {"bench": "consolidate", "log": log, "machine": {"cpus": os.cpu_count()}}
    server: DaemonChild | None = None
    url = f"http://127.0.0.1:{args.port}"
    try:
        if args.serve:
            serve_home = work / "serve-home"
            serve_home.mkdir(exist_ok=True)
            if not (serve_home / "models").exists():
                (serve_home / "models").symlink_to(MODELS, target_is_directory=True)
            server = DaemonChild(serve_home, {"CLAWRL_TRAIN_ENABLED": "false", "CLAWRL_JUDGE_BACKEND": "rules"},
                                 port=args.port, log=work / "serve.log", inherit_settings=False).start()
            decode_rate(url)   # warm-up
            idle = [decode_rate(url) for _ in range(3)]
            res["decode_idle_tok_s"] = idle
            say(f"idle decode: {[round(x, 1) for x in idle]} tok/s")
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "clawrl", "consolidate"],
                                env=env_for(home, {"CLAWRL_CONSOLIDATE_CPU_PRODUCTS": args.products,
                                                  "CLAWRL_CONSOLIDATE_METHOD": args.method}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        busy: list[float] = []
        if server is not None:
            def sample():   # a few answers, well into training; the rest of the run is quiet
                time.sleep(90)
                while proc.poll() is None and len(busy) < args.samples:
                    busy.append(decode_rate(url))
            t = threading.Thread(target=sample, daemon=True)
            t.start()
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"clawrl consolidate failed ({proc.returncode}):\n{err[-3000:]}")
        meta = json.loads((home / "adapters" / "0001" / "meta.json").read_text())
        res.update({"wall_s": round(wall, 1), "meta_seconds": meta["seconds"], "steps": meta["steps"],
                    "loss_first": meta["loss_curve"][0], "loss_last": meta["loss_curve"][-1],
                    "loss": meta["loss"], "trl": meta["trl"], "recipe": meta["recipe"], "path": meta.get("path"),
                    "window": meta["window"],
                    "target_s": 600, "meets_target": wall <= 600})
        say(f"consolidated {args.turns} turns in {wall:.0f} s ({meta['steps']} steps, loss "
            f"{meta['loss_curve'][0]:.4f} -> {meta['loss_curve'][-1]:.4f})")
        if server is not None:
            res["decode_busy_tok_s"] = busy
            if busy:
                ratio = statistics.median(busy) / statistics.median(res["decode_idle_tok_s"])
                res["decode_ratio"] = round(ratio, 3)
                say(f"decode while consolidating: {[round(x, 1) for x in busy]} tok/s: "
                    f"{ratio:.2f}x idle (target >= 0.6)")
    finally:
        if server is not None:
            server.stop(grace=20)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
