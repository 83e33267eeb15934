"""Per-seed gaps over the no-train control, read from a `clawrl eval` results.json.

For each persona and seed: the held-out score of every method after N interactions (default: the
last checkpoint), its gap over that seed's no-train control, and the share of empty / degenerate
answers next to the control's. This is the table the issue's goal is checked against ("at least
0.3 above the control in every seed, with no collapse").

    .venv/bin/python bench/eval_gaps.py bench/results/concise-3seeds.json [--at 36] [--goal 0.3]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from clawrl.evals.report import label


def table(runs: list[dict], at: int | None, goal: float) -> str:
    by = defaultdict(dict)      # (persona, seed) -> method -> point
    for r in runs:
        if not r.get("points"):
            continue
        pts = {p["interactions"]: p for p in r["points"]}
        n = at if at is not None else max(pts)
        if n in pts:
            by[(r["persona"], r["seed"])][label(r, runs)] = pts[n]
    lines = ["| persona | seed | method | score | gap over control | empty / degenerate (control) | goal |",
             "|---|---|---|---|---|---|---|"]
    for (persona, seed), methods in sorted(by.items()):
        control = methods.get("no-train")
        for method, p in sorted(methods.items()):
            if method == "no-train":
                continue
            gap = p["score"] - control["score"] if control else None
            ok = "-" if gap is None else ("met" if gap >= goal and p["empty"] <= control["empty"]
                                          and p["degenerate"] <= control["degenerate"] else "not met")
            ce = f"{control['empty']:.1%} / {control['degenerate']:.1%}" if control else "-"
            lines.append(f"| {persona} | {seed} | {method} | {p['score']:.3f} | "
                         f"{'-' if gap is None else f'{gap:+.3f}'} | "
                         f"{p['empty']:.1%} / {p['degenerate']:.1%} ({ce}) | {ok} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a results.json written by clawrl eval")
    ap.add_argument("--at", type=int, help="interactions (default: each run's last checkpoint)")
    ap.add_argument("--goal", type=float, default=0.3, help="required gap over control (0.3)")
    args = ap.parse_args()
    print(table(json.loads(open(args.results).read())["runs"], args.at, args.goal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
