"""Hinted-base compliance: does the base model do what a persona's user asks once it is told?

The hint teacher of on-policy distillation is the base model shown the user's correction. It can
only pull the policy toward behaviour that the *hinted* base actually produces, so this number
predicts where `opd` and `combine` can help (LEARNING-FACTS.md: only where the hinted base
complies). For each persona, on its first N training prompts, through a real `clawrl serve` with
training off:

  base     the first answer, scored by the persona's verifier
  hinted   a fresh answer to the same request with the simulated user's reply to the base answer
           appended as the hint (exactly the teacher's context, teacher.hinted_messages)

It reports the mean score and the pass rate (score >= 0.9) of both, and hinted/base as a ratio.

    .venv/bin/python bench/hinted.py --persona concise --persona student --persona teacher --n 40
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import sys
import tempfile
import uuid
from pathlib import Path

import httpx

from clawrl.evals import personas
from clawrl.config import load_config
from clawrl.evals.evaluate import Child, chat, opening
from clawrl.learn.teacher import hinted_messages

PASS = 0.9


def measure(persona: personas.Persona, child: Child, n: int, workers: int = 4) -> dict:
    def one(i: int):
        prompt, seed = persona.train_prompts[i % len(persona.train_prompts)], 7_919 * i
        msgs = opening(persona, prompt)
        with httpx.Client() as c:
            base = chat(c, child.url, msgs, f"hb-{uuid.uuid4().hex[:8]}", persona.max_tokens, seed,
                        train=False)
            s_base = persona.score(prompt, base)
            hint = persona.reply(prompt, base, s_base, random.Random(seed))
            hinted = chat(c, child.url, hinted_messages(msgs, hint), f"hh-{uuid.uuid4().hex[:8]}",
                          persona.max_tokens, seed, train=False)
        return {"base": s_base, "hinted": persona.score(prompt, hinted), "hint": hint,
                "base_text": base, "hinted_text": hinted}

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        rows = list(pool.map(one, range(n)))

    def mean(xs):
        return sum(xs) / len(xs)

    base, hinted = [r["base"] for r in rows], [r["hinted"] for r in rows]
    return {"persona": persona.name, "n": n,
            "base_score": mean(base), "hinted_score": mean(hinted),
            "base_pass": mean([s >= PASS for s in base]), "hinted_pass": mean([s >= PASS for s in hinted]),
            "ratio_score": mean(hinted) / mean(base) if mean(base) else None,
            "examples": rows[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--persona", action="append", required=True, help="built-in name or .py path")
    ap.add_argument("--n", type=int, default=40, help="prompts per persona (default 40)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    cfg = load_config()
    results = []
    with tempfile.TemporaryDirectory(prefix="clawrl-hinted-") as home:
        child = Child(Path(home), cfg.models_dir, {"CLAWRL_TRAIN_ENABLED": "false"}, None).start()
        try:
            for name in args.persona:
                r = measure(personas.load(name), child, args.n)
                results.append(r)
                print(f"{r['persona']:<10} n={r['n']}  score base {r['base_score']:.2f} -> hinted "
                      f"{r['hinted_score']:.2f}  pass base {r['base_pass']:.2f} -> hinted "
                      f"{r['hinted_pass']:.2f}", file=sys.stderr)
        finally:
            child.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps([{k: v for k, v in r.items() if k != "examples"} for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
