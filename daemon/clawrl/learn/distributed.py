"""Data-parallel training over several processes (one per training GPU).

With `engine.train_gpus = "2,3"` (or `train.processes = N`) the supervisor starts the trainer
under `torch.distributed.run` (the launcher `accelerate launch` runs for multi-GPU; clawrl needs
nothing of accelerate's on top), and every process runs learn/trainer.py. Rank 0 alone reads and writes
the turn log and the adapters folder: it plans each step (which version to continue from, which
turns) and broadcasts the plan; every rank prepares and runs its share of the batch; gradients are
summed over the ranks before one identical optimizer step on each, so the ranks' LoRA weights
never differ and rank 0 writes them.

Every decision that ends a step early (shutdown, a turn that cannot be trained, the serving
server down) is taken together at a collective point, so no rank is ever left waiting on one
that quit. With one process all of this is a no-op.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import train_gpu_count
from ..procs import die_with_parent

# A rank waits this long at a collective for a slower one (a teacher call to a busy server,
# a long shard) before the step fails and the supervisor restarts the trainer.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


def processes(cfg) -> int:
    """How many trainer processes the recipe asks for."""
    if cfg.train.processes:
        return cfg.train.processes
    return max(1, train_gpu_count(cfg))


def launch_args(cfg) -> list[str]:
    """The trainer's command line: plain for one process, under torchrun for several."""
    n = processes(cfg)
    if n == 1:
        return [sys.executable, "-m", "clawrl", "train"]
    # torch.distributed.run through launch() below; --standalone: a rendezvous on a free local
    # port, so two daemons never collide.
    return [sys.executable, "-m", "clawrl.learn.distributed", "--standalone", f"--nproc-per-node={n}",
            "--no-python", sys.executable, "-m", "clawrl", "train"]


class Group:
    """This process's place among the trainer processes."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.lead = self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def start(self, device: torch.device) -> None:
        if not self.active:
            return
        die_with_parent(signal.SIGKILL)   # the launcher killed: no waiting at a collective
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=COLLECTIVE_TIMEOUT)

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any."""
        return any(self.gather(bool(flag)))

    def sum_grads(self, params: Sequence[torch.Tensor], stats: dict[str, float]) -> dict[str, float]:
        """Sum the gradients (each rank holds its shard's token-weighted share) and `stats` over
        the ranks, in one flat all-reduce."""
        if not self.active:
            return stats
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads]
                         + [torch.tensor(list(stats.values()), device=grads[0].device)])
        dist.all_reduce(flat)
        at = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[at:at + n].view_as(g).to(g.dtype)
            at += n
        return dict(zip(stats, flat[at:].tolist()))

    def shard(self, items: list) -> list:
        """This rank's share of a batch (round-robin, so lengths spread evenly)."""
        return items[self.rank::self.world]

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def daemon_pid(group: Group) -> int:
    """The pid that started this trainer: the parent, or under the launcher the grandparent."""
    pid = os.getppid()
    if group.active:
        try:
            # Field 4 of /proc/PID/stat, after the parenthesised name (which may hold spaces).
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return -1
    return pid


def launch() -> None:
    """torch.distributed.run, with a stop as a clean exit: on SIGTERM the launcher passes the
    signal to the ranks, waits for them, then raises, which would end in a traceback in the
    daemon's log on every shutdown."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main
    try:
        main()
    except SignalException as e:
        print(f"clawrl-trainer: launcher stopped by signal {e.sigval.name}", file=sys.stderr)


if __name__ == "__main__":
    launch()
