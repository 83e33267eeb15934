"""Consolidation's paths against each other on one judged window: the same turn log is
consolidated once per path, and each fresh adapter is served and scored on the persona's held-out
prompts, beside the online adapter the log already had. One window and the same sampling seeds
for every adapter, so the paths differ in nothing else.

A path is a `consolidate.cpu_products` value (float32, bfloat16), with `+teacher` (every corrected
turn), `+balance` (as many as even the window's labels) or `-teacher` (none) for
`consolidate.teacher_answers` (none when not named, the setting of the earlier A/B).

HOME is a daemon home kept by an eval (`clawrl eval --work DIR` keeps DIR/<persona>-<method>-<seed>;
without --work the eval's temporary folder is kept too). It is copied, never changed.

    .venv/bin/python bench/consolidate_ab.py HOME [--persona concise] [--heldout 40] [--seed 0]
                                             [--paths float32,float32+teacher] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from clawrl.evals import personas
from clawrl.evals.evaluate import Child, heldout

from common import emit, env_for  # noqa: E402  (bench/ is on sys.path)

SERVE = {"CLAWRL_TRAIN_ENABLED": "false", "CLAWRL_JUDGE_BACKEND": "rules"}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def newest_live(url: str, timeout: float = 600) -> int:
    """Wait until the newest version that was not rejected is the live one; its number."""
    deadline = time.time() + timeout
    while True:
        a = httpx.get(f"{url}/v1/adapters", timeout=10).json()
        newest = max((v["version"] for v in a["versions"] if not v["rejected"]), default=0)
        if (a["active"] or 0) == newest or time.time() > deadline:
            return a["active"] or 0
        time.sleep(1)


def score(home: Path, models: Path, persona, n: int, seed: int) -> dict:
    child = Child(home, models, SERVE, None).start()
    try:
        version = newest_live(child.url)
        h = heldout(child, persona, n, seed)
    finally:
        child.stop()
    return {"adapter": version, **{k: h[k] for k in ("score", "empty", "degenerate", "scores")}}


def consolidate(home: Path, path: str, extra: dict[str, str]) -> dict:
    products, _, teacher = path.partition("+")
    products = products.removesuffix("-teacher")
    settings = {"CLAWRL_CONSOLIDATE_CPU_PRODUCTS": products,
                "CLAWRL_CONSOLIDATE_TEACHER_ANSWERS": {"teacher": "always", "balance": "balance"}.get(
                    teacher, "off"),
                **extra}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "clawrl", "consolidate"],
                          env=env_for(home, settings), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"clawrl consolidate ({path}) failed:\n{proc.stderr[-3000:]}")
    version = max(int(p.name) for p in (home / "adapters").iterdir() if p.name.isdigit())
    meta = json.loads((home / "adapters" / f"{version:04d}" / "meta.json").read_text())
    return {"version": version, "wall_s": round(wall, 1), "steps": meta["steps"],
            "window": meta["window"], "loss_first": meta["loss_curve"][0],
            "loss_last": meta["loss_curve"][-1], "path": meta["path"], "settings": settings}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("home", help="a daemon home with a judged turn log (kept by clawrl eval)")
    ap.add_argument("--persona", default="concise")
    ap.add_argument("--heldout", type=int, default=40, help="held-out prompts per adapter")
    ap.add_argument("--seed", type=int, default=0, help="the sampling seeds of the held-out answers")
    ap.add_argument("--paths", default="float32-teacher,float32+teacher",
                    help="cpu_products values, each with +teacher or -teacher (see above)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a [consolidate] setting for every path, e.g. lr=3e-4 (repeatable)")
    ap.add_argument("--out", help="also write the JSON result here")
    args = ap.parse_args()
    extra = {}
    for item in args.set:
        key, sep, val = item.partition("=")
        if not sep:
            ap.error(f"--set {item}: give KEY=VALUE, e.g. lr=3e-4")
        extra[f"CLAWRL_CONSOLIDATE_{key.strip().upper()}"] = val.strip()
    source = Path(args.home)
    models = (source / "models").resolve()
    persona = personas.load(args.persona)
    res: dict = {"bench": "consolidate_ab", "home": source.name, "persona": persona.name,
                 "heldout": args.heldout, "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="clawrl-consolidate-ab-") as tmp:
        def copy(name: str) -> Path:
            home = Path(tmp) / name
            shutil.copytree(source, home, symlinks=True,
                            ignore=shutil.ignore_patterns("daemon.log", "*.sock", ".tmp-*"))
            return home

        res["online"] = score(copy("online"), models, persona, args.heldout, args.seed)
        say(f"online adapter {res['online']['adapter']}: held-out {res['online']['score']:.3f}")
        for products in args.paths.split(","):
            home = copy(products)
            run = consolidate(home, products, extra)
            run.update(score(home, models, persona, args.heldout, args.seed))
            res[products] = run
            say(f"{products}: version {run['version']} in {run['wall_s']:.0f} s ({run['steps']} steps, "
                f"loss {run['loss_first']:.3f} -> {run['loss_last']:.3f}); held-out {run['score']:.3f}, "
                f"degenerate {run['degenerate']:.0%} (served {run['adapter']})")
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
