"""How fast a first fit reads the corpus: the probe's base-model reading of labelled lines in this
process (torch's threads) against worker processes (judge/probe_workers.py, one thread each on a
2-core CPU), on the same dev lines, in interleaved rounds. Reports lines per second of each, their
ratio, and the largest difference between the two paths' feature rows.

    .venv/bin/python bench/probe_read.py [--lines 300] [--rounds 2] [--workers N] [--out FILE.json]

Run it alone on the machine; it needs the converted default model (`clawrl judge train` once).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from clawrl.config import load_config
from clawrl.judge import corpus, probe, probe_fit, probe_workers
from clawrl.models import provision

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=300, help="dev lines read per path and round (default 300)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--workers", type=int, default=0,
                    help="worker processes (default: what a fit uses on this machine)")
    ap.add_argument("--out", help="also write the JSON result here")
    args = ap.parse_args()
    cfg = load_config()
    model_dir = provision(cfg.model.source, cfg.models_dir, cfg.home / "cache")
    reader = probe.Reader(model_dir)
    lines = corpus.load("dev")[:args.lines]
    workers = args.workers or probe_workers.workers_for(max(len(lines), probe_workers.MIN_LINES))
    rates: dict[str, list[float]] = {"in_process": [], "workers": []}
    rows = {}
    for _ in range(args.rounds):
        for path, n in (("in_process", 1), ("workers", workers)):
            with tempfile.TemporaryDirectory() as scratch:    # no cache: every line is read
                t0 = time.perf_counter()
                rows[path] = probe_fit.corpus_features(reader, lines, Path(scratch) / "features", workers=n)
                rates[path].append(len(lines) / (time.perf_counter() - t0))
    diff = (rows["in_process"] - rows["workers"]).abs().max().item()
    cos = torch.nn.functional.cosine_similarity(rows["in_process"], rows["workers"], dim=1).min().item()
    med = {k: statistics.median(v) for k, v in rates.items()}
    emit({"lines": len(lines), "rounds": args.rounds, "workers": workers,
          "threads_in_process": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(),
          "lines_per_s": rates, "median_lines_per_s": med, "speedup": med["workers"] / med["in_process"],
          "max_abs_diff": diff, "min_cosine": cos}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
