"""Reading many labelled lines through the base model in worker processes (a head's first fit).

At batch 1 a 135M model's products are too small for two threads to share well: on a 2-core CPU
one reading takes 197 ms on two threads and 264 ms on one, so two processes on one thread each
read more lines a second. bench/probe_read.py times both: 5.53 against 4.85 lines a second on a
2-core AVX2 machine (1.14x, 300 dev lines in 2 interleaved rounds, identical rows;
bench/results/probe-read.json), less than the 1.4x those single timings suggest. Each worker
loads its own `probe.Reader` (the same code and weights; its rows equal the parent's to float
rounding), reads an interleaved share of the lines and writes its rows to shard files as it goes (tmp + rename,
keyed by line like the feature cache): a fit that is stopped or killed keeps what was read, and the
next one reads only the rest (`probe_fit.corpus_features` merges the shards). The workers run at
the given niceness, so a daemon's first fit gives way to serving, and each exits when its parent
is gone. Workers are plain subprocesses (`python -m clawrl.judge.probe_workers`), so they never
re-import the caller's main module.

It owns the processes and the shards; what a reading is, is judge/probe.py's; the cache,
probe_fit's.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from .probe import ProbeError, Reader

log = logging.getLogger("clawrl.probe")

MIN_LINES = 200         # below this, starting processes (seconds each) costs more than it saves
MAX_WORKERS = 4
SHARD_LINES = 256       # rows a worker writes at once: what a kill can lose, per worker


def workers_for(lines: int, setting: int = 0) -> int:
    """How many processes read `lines` lines: `setting` (judge.probe_workers) where it is not 0;
    else one per usable core (at most MAX_WORKERS), or 1 (read in this process) for few lines or
    one core."""
    if setting:
        return setting
    return 1 if lines < MIN_LINES else max(1, min(_cores(), MAX_WORKERS))


def shard_files(prefix: Path) -> list[Path]:
    """The shards written for the cache `prefix` (complete files only: each is renamed into place)."""
    return sorted(prefix.parent.glob(f"{prefix.name}.part-*.safetensors"))


def _write_shard(prefix: Path, tag: str, rows: list[torch.Tensor], keys: list[bytes]) -> None:
    from safetensors.torch import save_file
    final = prefix.with_name(f"{prefix.name}.part-{tag}.safetensors")
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    save_file({"x": torch.stack(rows).contiguous(),
               "keys": torch.tensor([list(k) for k in keys], dtype=torch.uint8).reshape(-1, 16)}, str(tmp))
    os.replace(tmp, final)


def _work(job: dict) -> None:
    """One worker: read the job's exchanges in order, a shard every `shard_lines` rows, and a line on
    stdout per row read (the parent's progress)."""
    parent = os.getppid()
    if job["nice"]:
        os.nice(job["nice"])
    torch.set_num_threads(job["threads"])
    reader = Reader(job["model_dir"], products=getattr(torch, job["products"]))
    prefix, keys = Path(job["prefix"]), [bytes.fromhex(k) for k in job["keys"]]
    rows: list[torch.Tensor] = []
    batch: list[bytes] = []
    for i, (messages, key) in enumerate(zip(job["exchanges"], keys)):
        if os.getppid() != parent:       # the fit that asked is gone: keep what is written
            return
        rows.append(reader.read_one(messages))
        batch.append(key)
        if len(rows) == job["shard_lines"] or i + 1 == len(keys):
            _write_shard(prefix, f"{os.getpid()}-{i}", rows, batch)
            rows, batch = [], []
        print(i + 1, flush=True)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _count_lines(out, ticks: queue.Queue) -> None:
    for _ in out:
        ticks.put(1)


def read_in_workers(reader: Reader, exchanges: list[list[dict]], keys: list[bytes], prefix: Path,
                    workers: int, nice: int = 0, progress=None, cancel: threading.Event | None = None,
                    shard_lines: int = SHARD_LINES) -> None:
    """Read `exchanges` in `workers` processes (`python -m clawrl.judge.probe_workers JOB`) into
    shards beside `prefix` (see shard_files). Raises ProbeError when stopped by `cancel` or when
    a worker fails; the shards written stay."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    threads = max(1, _cores() // workers)
    ticks: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="clawrl-probe-read-") as scratch:
        procs: list[subprocess.Popen] = []
        errs: list[Path] = []
        for w in range(workers):
            job = Path(scratch) / f"job-{w}.json"
            job.write_text(json.dumps({
                "model_dir": str(reader.model_dir), "products": str(reader.products).removeprefix("torch."),
                "threads": threads, "nice": nice, "shard_lines": shard_lines, "prefix": str(prefix),
                "exchanges": exchanges[w::workers],
                "keys": [k.hex() for k in keys[w::workers]]}, ensure_ascii=False))
            errs.append(Path(scratch) / f"worker-{w}.log")
            with open(errs[-1], "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "clawrl.judge.probe_workers", str(job)], stdout=subprocess.PIPE,
                    stderr=err, stdin=subprocess.DEVNULL, text=True))
        for p in procs:
            threading.Thread(target=_count_lines, args=(p.stdout, ticks), daemon=True).start()
        total, read, said, t0 = len(keys), 0, 0, time.time()
        try:
            while read < total:
                if cancel is not None and cancel.is_set():
                    raise ProbeError("stopped before the probe's features were read "
                                     f"({read} of {total} lines kept for the next fit)")
                try:
                    ticks.get(timeout=0.5)
                    read += 1
                except queue.Empty:       # nothing read for a while: is every worker still there?
                    for p, said_why in zip(procs, errs):
                        if p.poll() not in (None, 0):
                            tail = said_why.read_text(errors="replace").strip().splitlines()[-3:]
                            raise ProbeError(f"a probe reading worker failed (exit code {p.returncode}) "
                                             f"after {read} of {total} lines: {' | '.join(tail)}")
                    if all(p.poll() == 0 for p in procs) and ticks.empty():
                        raise ProbeError(f"the probe's reading workers ended after {read} of {total} lines")
                if progress and (read == total or read - said >= max(1, total // 20)):
                    said = read
                    progress(read, total)
            for p in procs:
                p.wait()
            log.info("read %d lines in %d processes (%d thread(s) each) in %.0f s", total, workers,
                     threads, time.time() - t0)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    _work(json.loads(Path(sys.argv[1]).read_text()))
