"""The training step that every trainer shares, whatever holds the policy.

A step takes the next batch of ready turns, continues from the newest good version (reloading
after a rollback or a rejection), and uses a learning rate that decays with every version. The
policy then prepares and optimizes: the local PEFT model in learn/trainer.py, or Tinker's training
client in learn/tinker_trainer.py. After that the step checks that the parent was not rejected
meanwhile, and commits: it writes the version folder atomically, marks its turns trained, folds
their rewards into the per-user baseline and prunes old versions. Everything but the policy's own
work is here, so the two trainers cannot drift apart.

A trainer (the `Stepper` protocol) has `cfg`, `db`, `root`, `baseline`, `unmarked` and
`became(version)`, which it calls once a version's folder is in place: its policy now holds that
version.
"""
from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Callable, Protocol

from ..adapters import versions as adapters
from .advantages import RunningBaseline
from ..config import Config
from ..types import Sample
from .samples import mark_trained, reconcile, trained_rewards


class Abandoned(Exception):
    """The step stopped part way (shutdown, a rejected parent): nothing is written."""


class Stepper(Protocol):
    cfg: Config
    db: sqlite3.Connection
    root: Path
    baseline: RunningBaseline | None
    unmarked: bool      # a version is on disk whose turns are not marked trained yet

    def became(self, version: int) -> None: ...


def history_baseline(cfg: Config, db: sqlite3.Connection) -> RunningBaseline | None:
    """The per-user reward baseline rebuilt from the turns already trained, so a restart does not
    change what the next step learns (None when train.baseline_decay is 0)."""
    if cfg.train.baseline_decay <= 0:
        return None
    b = RunningBaseline(cfg.train.baseline_decay)
    for user, reward in trained_rewards(db):
        b.update(user, reward)
    return b


def settle(t: Stepper) -> None:
    """Mark what the last version took, if marking it failed, before choosing again."""
    if t.unmarked:
        reconcile(t.db, t.root)
        t.unmarked = False


def step_lr(cfg: Config, version: int) -> float:
    return cfg.train.lr * cfg.train.lr_decay ** (version - 1)


def parent_rejected(root: Path, parent: int | None) -> bool:
    return bool(parent and adapters.rejection(root, parent))


def version_meta(cfg: Config, samples: list[Sample], stats: dict, lr: float, started: float,
                 parent: int | None, base_model: dict) -> dict:
    """meta.json of a version: its lineage, what it saw, how the step went, the recipe."""
    rewards = [s.reward for s in samples if s.reward is not None]
    return {
        "parent": parent, "samples": [s.id for s in samples], "base_model": base_model,
        "method": cfg.method.name, **stats,
        "reward": {"mean": sum(rewards) / len(rewards), "min": min(rewards),
                   "max": max(rewards), "n": len(rewards)} if rewards else None,
        "n_hints": sum(1 for s in samples if s.hint and cfg.method.name != "rl"),
        "lr": lr, "seconds": round(time.perf_counter() - started, 3),
        "recipe": {"train": dataclasses.asdict(cfg.train), "method": dataclasses.asdict(cfg.method)},
    }


def fold_rewards(baseline: RunningBaseline | None, samples: list[Sample]) -> None:
    """The batch used the baseline from before it; now its rewards count."""
    if baseline:
        for s in samples:
            if s.reward:
                baseline.update(s.user_id or "", s.reward)


def commit(t: Stepper, version: int, samples: list[Sample], writer: Callable[[Path], None],
           meta: dict) -> list[dict]:
    """Write the version (temp folder, then rename), mark its turns, fold its rewards, prune.
    Returns what pruning removed (adapters.prune). A crash before the rename leaves the turns
    ready; one between the rename and the mark, or a mark that fails, is repaired by reconcile()
    (on the next start, or by settle() before the next step)."""
    adapters.write_version(t.root, version, writer, meta)
    t.became(version)
    t.unmarked = True
    mark_trained(t.db, version, [s.id for s in samples])
    t.unmarked = False
    fold_rewards(t.baseline, samples)
    return adapters.prune(t.root, t.cfg.train.keep_adapters,
                          protect={version, adapters.read_active(t.root) or 0})


def summary(meta: dict) -> str:
    reward = f"{meta['reward']['mean']:+.2f}" if meta["reward"] else "-"
    return (f"{len(meta['samples'])} samples, loss {meta['loss']:.4f}, mean reward {reward}, "
            f"{meta['seconds']:.1f} s")
