"""`clawrl agents ...`: play an environment's episodes against a daemon and measure what it learns.

`clawrl agents run RECIPE` starts its own `clawrl serve` child (evaluate.Child: a fresh home, the
converted models shared) or attaches to a running daemon with --url. With training on and a
held-out count it measures, on the same held-out tasks: success before training (no-train
requests), success after the training episodes once the loop has settled (judged, trained,
hot-swapped), and the no-train control: the base model (adapter 0) with the very seeds of the
after-measure, so the two differ only by training. `sandbox` prints the isolation in force,
`tasks` shows generated tasks.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ..errors import ClawrlError

BEFORE_SEED, AFTER_SEED = 1_000_003, 2_000_003


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sub = sp.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("run", help="play a recipe's episodes against a daemon; with training on, "
                                   "measure held-out success before and after, and a control")
    p.add_argument("agent_recipe", metavar="RECIPE",
                   help="a recipe under recipes/agents/ (toolcall, terminal, swe) or a .toml path")
    p.add_argument("--episodes", type=int, help="training episodes (default: the recipe's)")
    p.add_argument("--heldout", type=int, help="held-out episodes per measurement (0 = none)")
    p.add_argument("--concurrency", type=int, help="episodes played at once")
    p.add_argument("--no-train", dest="train", action="store_const", const=False,
                   help="serve and record, never train (X-Clawrl-No-Train); no before/after")
    p.add_argument("--url", help="attach to the daemon at this URL instead of starting one "
                                 "(settling reads the turn log of $CLAWRL_HOME)")
    p.add_argument("--out", help="where result.json and result.md go "
                                 "(default bench/out/agents/ENV)")
    p.add_argument("--work", help="with a started daemon: where its home goes (default: a temp folder)")
    sub.add_parser("sandbox", help="print what the sandbox isolates on this machine")
    p = sub.add_parser("tasks", help="print generated tasks of an environment")
    p.add_argument("env", help="toolcall, terminal or swe")
    p.add_argument("--split", default="train", choices=("train", "heldout"))
    p.add_argument("-n", type=int, default=5, help="how many (default 5)")
    p.add_argument("--seed", type=int, default=0)


def main(args, cfg) -> int:
    if args.action == "sandbox":
        from .sandbox import isolation
        print(json.dumps(isolation().describe(), indent=1))
        return 0
    if args.action == "tasks":
        from . import envs
        env = envs.get(args.env)
        for t in env.tasks(args.split, args.n, args.seed):
            print(json.dumps({"id": t.id, "split": t.split, "prompt": t.prompt}))
        return 0
    return run_command(args, cfg)


def attach(url: str, home: Path):
    """An evaluate.Child for a daemon someone else started: settle and count read its home,
    stop leaves it running."""
    from ..evals.evaluate import Child
    child = Child.__new__(Child)
    child.url, child.home, child.proc = url.rstrip("/"), home, None
    return child


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_command(args, cfg) -> int:
    from . import envs, recipe as recipes
    from ..evals.evaluate import Child

    recipe = recipes.with_overrides(recipes.load(args.agent_recipe), episodes=args.episodes,
                                    heldout=args.heldout, concurrency=args.concurrency,
                                    train=args.train)
    env = envs.get(recipe.env)
    out = Path(args.out or f"bench/out/agents/{recipe.env}")
    headers = {"Authorization": f"Bearer {cfg.server.api_key}"} if cfg.server.api_key else {}
    if args.url:
        daemon = attach(args.url, cfg.home)
        if recipe.play.train and recipe.run.heldout and not cfg.db_path.exists():
            raise ClawrlError(f"measuring before/after needs the attached daemon's turn log; none at "
                              f"{cfg.db_path}: set CLAWRL_HOME to its data directory, or --heldout 0")
    else:
        work = Path(args.work or tempfile.mkdtemp(prefix="clawrl-agents-"))
        child_env = {**recipe.daemon_env(),
                     "CLAWRL_TRAIN_ENABLED": "true" if recipe.play.train else "false"}
        _say(f"starting a daemon in {work / 'home'} (recipe {recipe.daemon_recipe})")
        daemon = Child(work / "home", cfg.models_dir, child_env, recipe.daemon_recipe).start()
    t0 = time.time()
    try:
        result = measure(recipe, env, daemon, headers)
    finally:
        daemon.stop()
    result.update(command="clawrl agents " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                  wall_s=round(time.time() - t0, 1))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    (out / "result.md").write_text(report(result))
    print(report(result))
    _say(f"wrote {out / 'result.json'} and {out / 'result.md'}")
    return 1 if any(p["summary"]["errors"] for p in result["phases"].values()) else 0


def measure(recipe, env, daemon, headers: dict) -> dict:
    """The phases: before, train, after, control (training on); or one no-train phase."""
    from dataclasses import asdict, replace

    from .runner import play_all, summary
    from .sandbox import isolation

    r, opts = recipe.run, recipe.play
    frozen = replace(opts, train=False)
    phases: dict[str, dict] = {}

    def phase(name: str, tasks, play, seed: int, adapter: int | None = None) -> dict:
        done = [0]

        def progress(ep):
            done[0] += 1
            _say(f"[{name} {done[0]}/{len(tasks)}] {ep.task} {'ok  ' if ep.ok else 'fail'} "
                 f"steps {ep.steps} calls {ep.tool_calls} {ep.seconds:.1f}s: {ep.reason[:90]}")

        t0 = time.monotonic()
        eps = asyncio.run(play_all(daemon.url, env, tasks, play, r.concurrency, seed, headers,
                                   progress))
        s = summary(eps, time.monotonic() - t0)
        _say(f"{name}: success {s['successes']}/{s['episodes']}, {s['steps_per_s']} steps/s")
        phases[name] = {"summary": s, "adapter": adapter, "episodes": [asdict(e) for e in eps]}
        return phases[name]

    held = env.tasks("heldout", r.heldout, recipe.seed) if opts.train and r.heldout else []
    if held:
        phase("before", held, frozen, BEFORE_SEED, adapter=_active(daemon, headers))
    phase("train" if opts.train else "episodes", env.tasks("train", r.episodes, recipe.seed),
          opts, recipe.seed)
    if held:
        _say(f"settling: waiting for the judge, the trainer and the hot-swap (at most "
             f"{r.settle_timeout_s:.0f} s)")
        version = daemon.settle(r.settle_timeout_s)
        phase("after", held, frozen, AFTER_SEED, adapter=version)
        if r.control and version:
            _activate(daemon, headers, 0)
            try:
                phase("control", held, frozen, AFTER_SEED, adapter=0)
            finally:
                _activate(daemon, headers, version)
    return {"env": recipe.env, "recipe": str(recipe.path), "seed": recipe.seed,
            "daemon_recipe": recipe.daemon_recipe, "daemon_set": recipe.daemon_set,
            "play": {k: v for k, v in asdict(opts).items() if k != "limits"},
            "limits": asdict(opts.limits), "isolation": isolation().describe(), "phases": phases}


def _active(daemon, headers) -> int | None:
    try:
        return httpx.get(f"{daemon.url}/v1/adapters", headers=headers, timeout=30).json()["active"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _activate(daemon, headers, version: int) -> None:
    r = httpx.post(f"{daemon.url}/v1/adapters/activate", json={"version": version},
                   headers=headers, timeout=120)
    if r.status_code != 200:
        raise ClawrlError(f"could not activate adapter {version}: {r.text[:300]}")


def report(result: dict) -> str:
    lines = [f"# clawrl agents: {result['env']}", "", f"`{result.get('command', '')}`", "",
             "| phase | episodes | success | steps | tool calls | steps/s | stopped by sandbox | "
             "adapter |", "|---|---|---|---|---|---|---|---|"]
    for name, p in result["phases"].items():
        s = p["summary"]
        stops = ", ".join(f"{k} {v}" for k, v in s["stopped"].items()) or "-"
        lines.append(f"| {name} | {s['episodes']} | {s['success']:.2f} ({s['successes']}) | "
                     f"{s['steps']} | {s['tool_calls']} | {s['steps_per_s']} | {stops} | "
                     f"{p['adapter'] if p['adapter'] is not None else '-'} |")
    iso = result["isolation"]
    lines += ["", f"Sandbox: {iso['network']}; own uid: {iso['own_uid']}; "
              f"pid/mount namespaces: {iso['namespaces']}.", ""]
    if result.get("wall_s") is not None:
        lines.append(f"Wall time: {result['wall_s']:.0f} s.")
    return "\n".join(lines) + "\n"
