"""Swap benchmark: what it costs to bring a new adapter version live in the embedded engine.

One engine on the recipe's defaults (the fast decode step), and a stream of LoRA versions with the
recipe's rank and targets, each written as the trainer writes it (`adapters.write_version`:
temp folder, fsync, rename), checked as the swapper checks it (`weights_problem`), loaded and
made active; the version before the previous one is then unloaded, as the swapper does once a
new version has served. Per version it times the write, the guard and the load.

Two ways to load, alternating in blocks of four versions on the same engine so that a busy
machine slows both alike: `peft` (no free slot is kept: every version builds its LoRA layers
through PEFT's `load_adapter`, the path before adapter slots) and `slot` (an unloaded version's
slot is kept and the next version is copied into it, engines/adapter_slots.py, the default).

    .venv/bin/python bench/swap.py [--versions 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402
from decode import write_adapter  # noqa: E402

from clawrl.adapters import versions as adapters  # noqa: E402
from clawrl.config import load_config  # noqa: E402
from clawrl.engines import make_engine  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, default=16, help="versions to bring live (default 16)")
    ap.add_argument("--out", help="also write the JSON result here")
    args = ap.parse_args(argv)
    engine = make_engine(load_config(None))
    engine.load()
    root = Path(tempfile.mkdtemp(prefix="clawrl-bench-swap-")) / "adapters"
    source = write_adapter(engine.cfg, engine.base_model, root.parent / "source")
    rows = []
    for v in range(1, args.versions + 1):
        way = "peft" if (v - 1) // 4 % 2 == 0 else "slot"
        engine.slots.keep_free = 0 if way == "peft" else 2
        torch.manual_seed(v)

        def save(folder: Path) -> None:     # the source adapter's files, its B's made anew
            from safetensors.torch import load_file, save_file
            t = {k: (torch.randn_like(x) * 0.01 if "lora_B" in k else x)
                 for k, x in load_file(str(source / "adapter_model.safetensors")).items()}
            save_file(t, str(folder / "adapter_model.safetensors"))
            (folder / "adapter_config.json").write_text((source / "adapter_config.json").read_text())
        t0 = time.perf_counter()
        path = adapters.write_version(root, v, save, {"parent": v - 1, "samples": [], "loss": 0.5})
        t1 = time.perf_counter()
        problem = adapters.weights_problem(path)
        t2 = time.perf_counter()
        before = engine.slots.copied
        engine.load_adapter(v, path).result()
        engine.activate(v)
        t3 = time.perf_counter()
        assert problem is None
        copied = engine.slots.copied > before
        if v > 2:
            engine.unload_adapter(v - 2).result()
        rows.append({"version": v, "way": way, "copied": copied, "write_s": t1 - t0,
                     "guard_s": t2 - t1, "load_s": t3 - t2})
        print(f"v{v:<3} {way:5} {'copied' if copied else 'PEFT  '}  write {t1 - t0:.3f} s  "
              f"guard {t2 - t1:.3f} s  load + activate {t3 - t2:.3f} s", file=sys.stderr)
        time.sleep(3)       # the background merge of the fast step, as between two real versions
    engine.close()
    # The first version wraps the model in PEFT, and the first of each slot block still takes
    # PEFT's path (no slot is free yet): the steady state of each way is what the rest measure.
    steady = {way: [r for r in rows[1:] if r["way"] == way and r["copied"] == (way == "slot")]
              for way in ("peft", "slot")}
    res = {way: {"n": len(rs), "load_median_s": statistics.median(r["load_s"] for r in rs),
                 "write_median_s": statistics.median(r["write_s"] for r in rs),
                 "guard_median_s": statistics.median(r["guard_s"] for r in rs)}
           for way, rs in steady.items() if rs}
    if len(res) == 2:
        res["load_ratio_peft_over_slot"] = res["peft"]["load_median_s"] / res["slot"]["load_median_s"]
        print(f"load + activate, median: PEFT {res['peft']['load_median_s']:.3f} s, slot "
              f"{res['slot']['load_median_s']:.3f} s ({res['load_ratio_peft_over_slot']:.1f}x)",
              file=sys.stderr)
    res["rows"] = rows
    emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
