"""What `clawrl eval` writes: results.json (every point of every run), results.md (a table per
persona: baseline and each checkpoint, mean ± spread over seeds, per method and the no-train
control; and how the judge read the simulated user, with the interactions until the preference
held) and plot.png (held-out score against interactions, one line per method, the band the
spread over seeds)."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path


def label(run: dict, runs: list[dict]) -> str:
    """A run's row: its method, and its judge too where the trained runs used several judges
    (a comparison of judges); the no-train control is one row whatever judged it."""
    judges = {r.get("judge") for r in runs if r["method"] != "no-train"}
    if run["method"] == "no-train" or len(judges) < 2:
        return run["method"]
    return f"{run['method']} ({run.get('judge')} judge)"


def grouped(runs: list[dict]) -> dict:
    """{persona: {row label: {interactions: [score per seed]}}}"""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in runs:
        for p in r["points"]:
            out[r["persona"]][label(r, runs)][p["interactions"]].append(p["score"])
    return out


def _cell(scores: list[float]) -> str:
    if not scores:
        return "-"
    mean = statistics.fmean(scores)
    spread = (max(scores) - min(scores)) / 2 if len(scores) > 1 else 0.0
    return f"{mean:.2f} ± {spread:.2f}"


def markdown(runs: list[dict], command: str) -> str:
    lines = ["# clawrl eval results", "", f"Reproduce: `{command}`", "", *settings(runs)]
    for persona in grouped(runs):
        lines += [f"## {persona}", "", *persona_table(runs, persona), ""]
    failed = [r for r in runs if r.get("error")]
    if failed:
        lines += ["## Failed runs", ""] + [f"- {r['persona']} {r['method']} seed {r['seed']}: "
                                           f"{r['error']}" for r in failed] + [""]
    lines.append("Cells: mean held-out score of the first response ± half the range over seeds. "
                 "Judge columns: the judge's reading of each training answer against whether the "
                 "simulated user was satisfied (mean over seeds). \"Until the preference holds\": "
                 "training interactions before the first 3 satisfied in a row (\"> N\": never); "
                 "OpenClaw-RL (v2) reports 10.3 sessions for its hybrid method, 14.1 for GRPO, 29.7 "
                 "for OPD and about 14.5 for memory baselines, on Qwen3-4B with a Qwen3-32B "
                 "simulated user.")
    return "\n".join(lines) + "\n"


def settings(runs: list[dict]) -> list[str]:
    """The recipe overrides the runs were made with (older results files do not record them)."""
    seen = sorted({", ".join(f"{k}={v}" for k, v in r["settings"].items()) or "none"
                   for r in runs if "settings" in r})
    if seen in ([], ["none"]):
        return []
    return [f"Settings on top of the recipe: {'; '.join(f'`{s}`' for s in seen)}"
            + (" (differing between runs: see results.json)" if len(seen) > 1 else ""), ""]


METHOD_ORDER = ("no-train", "rl", "opd", "combine")


def _method_rank(method: str) -> tuple:
    base = method.split(" (")[0]          # a row label may name its judge
    return (METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER), method)


def persona_table(runs: list[dict], persona: str) -> list[str]:
    """One persona's table (a row per method: each checkpoint, seeds, mean wall time) and its
    worst share of empty + degenerate answers."""
    methods = grouped(runs)[persona]
    cps = sorted({cp for m in methods.values() for cp in m})
    lines = ["| method | " + " | ".join(f"after {c}" for c in cps) + " | seeds | wall (mean) |",
             "|---" * (len(cps) + 3) + "|"]
    for method, points in sorted(methods.items(), key=lambda kv: _method_rank(kv[0])):
        walls = [r["wall_s"] for r in runs if r["persona"] == persona
                 and label(r, runs) == method and not r.get("error")]
        lines.append(f"| {method} | " + " | ".join(_cell(points.get(c, [])) for c in cps)
                     + f" | {len(walls)} | {statistics.fmean(walls) / 60:.1f} min |")
    judged = judge_table(runs, persona)
    if judged:
        lines += ["", *judged]
    bad = [(label(r, runs), r["seed"], p["interactions"], p["empty"], p["degenerate"])
           for r in runs if r["persona"] == persona for p in r["points"]]
    worst = max(bad, key=lambda b: b[3] + b[4], default=None)
    if worst:
        lines += ["", f"Most empty + degenerate answers: {worst[0]} seed {worst[1]} after "
                      f"{worst[2]}: {worst[3]:.0%} empty, {worst[4]:.0%} degenerate."]
    return lines


def _holds(value, n: int) -> str:
    return str(value) if value is not None else f"> {max(0, n - 3)}"


def judge_table(runs: list[dict], persona: str) -> list[str]:
    """Per method: how the daemon's judge read the simulated user (mean over seeds), and the
    training interactions before the user was satisfied 3 times in a row, per seed."""
    rows = []
    for r in sorted((r for r in runs if r["persona"] == persona and "judge_check" in r),
                    key=lambda r: (_method_rank(r["method"]), r["seed"])):
        rows.append((label(r, runs), r["judge"], r["judge_check"],
                     _holds(r.get("until_holds"), len(r["train_scores"]))))
    if not rows:
        return []
    lines = ["| method | judge | agreement with the user | wrong sign | read as 0 | unjudged "
             "| interactions until the preference holds (per seed) |", "|---" * 7 + "|"]
    for method in dict.fromkeys(m for m, *_ in rows):
        mine = [row for row in rows if row[0] == method]

        def mean(key):
            return statistics.fmean(c[key] for _, _, c, _ in mine)
        lines.append(f"| {method} | {mine[0][1]} | {mean('agreement'):.2f} | "
                     f"{mean('wrong_sign'):.2f} | {mean('abstain'):.2f} | {mean('unjudged'):.2f} | "
                     + ", ".join(h for *_, h in mine) + " |")
    return lines


def plot(runs: list[dict], path: Path) -> bool:
    """Write the PNG; False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    data = grouped(runs)
    if not data:   # every run failed: nothing to draw
        return False
    fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 4), squeeze=False)
    for ax, (persona, methods) in zip(axes[0], data.items()):
        for method, points in methods.items():
            xs = sorted(points)
            means = [statistics.fmean(points[x]) for x in xs]
            ax.plot(xs, means, marker="o", label=method)
            ax.fill_between(xs, [min(points[x]) for x in xs], [max(points[x]) for x in xs], alpha=0.2)
        ax.set(title=persona, xlabel="interactions", ylabel="held-out score", ylim=(0, 1))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def finished(out: Path) -> list[dict]:
    """The runs an earlier `clawrl eval` wrote to `out` and completed (for --resume)."""
    try:
        runs = json.loads((out / "results.json").read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return []
    return [r for r in runs if r.get("points") and not r.get("error")]


def write(runs: list[dict], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    (out / "results.md").write_text(markdown(runs, command))
    written = [out / "results.json", out / "results.md"]
    if plot(runs, out / "plot.png"):
        written.append(out / "plot.png")
    return written
