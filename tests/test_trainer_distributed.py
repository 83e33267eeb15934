"""The data-parallel trainer (train.processes / several engine.train_gpus): two real processes
under torch.distributed.run, on the CPU with the gloo backend (the GPU path is the same code with
nccl). One step over two ranks must make the adapter one process makes from the same batch, a turn
one rank cannot take must stop both ranks and be skipped, and a stop must end every rank.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from safetensors.torch import load_file

from clawrl.adapters import versions as adapters
from clawrl.config import ConfigError, load_config
from clawrl.learn.distributed import launch_args, processes
from clawrl.learn.trainer import run_once
from test_trainer import FRANCE, TurnLog, lm, served  # noqa: F401  (lm is a fixture)

pytestmark = pytest.mark.model


def start(log: TurnLog) -> subprocess.Popen:
    """The trainer as the daemon's supervisor starts it, with this test as the daemon; its
    output goes to log.home / trainer.log."""
    env = {**os.environ, **log.env, "CLAWRL_PARENT_PID": str(os.getpid()), "OMP_NUM_THREADS": "1"}
    with open(log.home / "trainer.log", "w") as out:
        return subprocess.Popen(launch_args(log.cfg), env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def said(log: TurnLog) -> str:
    return (log.home / "trainer.log").read_text(errors="replace")


def wait_until(proc: subprocess.Popen, log: TurnLog, what: str, done, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"{what} did not happen; the trainer said:\n{said(log)[-6000:]}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher, as the supervisor sends it; no rank may outlive it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    time.sleep(1)   # orphaned ranks would still be in the launcher's process group
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        leftover = True
    except ProcessLookupError:
        leftover = False
    assert not leftover, "a rank outlived the launcher"


def test_launch_args_and_config_rules():
    one = load_config(env={})
    assert processes(one) == 1 and launch_args(one)[1:] == ["-m", "clawrl", "train"]
    two = load_config(env={"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_TRAIN_GPUS": "2,3"})
    assert processes(two) == 2
    assert "--nproc-per-node=2" in launch_args(two) and launch_args(two)[-2:] == ["clawrl", "train"]
    with pytest.raises(ConfigError, match="one GPU per process"):
        load_config(env={"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_TRAIN_GPUS": "1",
                         "CLAWRL_TRAIN_PROCESSES": "2"})
    with pytest.raises(ConfigError, match="Tinker trains on its own machines"):
        load_config(env={"CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_MODEL_SOURCE": "tinker",
                         "CLAWRL_TRAIN_PROCESSES": "2"})


def test_two_ranks_make_the_adapter_one_process_makes(lm, tmp_path):
    turns = [(served(lm, FRANCE), 1), (served(lm, "Say hello."), -1)]
    single = TurnLog(tmp_path / "one", method_name="rl", train_batch_size="2")
    double = TurnLog(tmp_path / "two", method_name="rl", train_batch_size="2",
                     train_processes="2")
    # On two ranks the first batch pairs a poisoned turn (an id outside the vocabulary, on rank 0)
    # with a good one: both ranks must give the step up, the poison is skipped, and the next
    # batch is the pair the single process trains on.
    poison = double.add({**turns[0][0], "response_ids": [10**6, 2], "logprobs": [-1.0, -1.0]},
                        judge_score=1)
    ids = [double.add(turn, judge_score=r) for turn, r in turns]
    for turn, r in turns:
        single.add(turn, judge_score=r)
    assert run_once(single.cfg) == 1

    proc = start(double)
    wait_until(proc, double, "version 1",
               lambda: adapters.newest(double.cfg.adapters_dir) == 1 and double.rows()[ids[0]][
                   "train_status"] == "trained")
    stop(proc)
    assert "data-parallel over 2 processes" in said(double), said(double)[-4000:]
    assert "Traceback" not in said(double) and said(double).count("stopped\n") == 1, said(double)
    rows = double.rows()
    assert rows[poison]["train_status"] == "skipped"
    assert [rows[i]["train_status"] for i in ids] == ["trained", "trained"]
    assert double.metas()[1]["samples"] == ids
    assert double.metas()[1]["tokens"] == single.metas()[1]["tokens"]

    a = load_file(single.cfg.adapters_dir / "0001" / adapters.WEIGHTS)
    b = load_file(double.cfg.adapters_dir / "0001" / adapters.WEIGHTS)
    assert a.keys() == b.keys()
    # The same update up to the order float sums are taken in: the step moved the weights by
    # ~lr per element, and the two runs differ by orders of magnitude less.
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    step = max(a[k].float().abs().max().item() for k in a if "lora_B" in k)
    print(f"max |difference| {diff:.2e} against a largest lora_B element of {step:.2e}")
    assert step > 0 and diff < step * 1e-2, (diff, step)


def test_a_stop_ends_every_rank_and_writes_nothing_half_done(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl", train_batch_size="2", train_processes="2",
                  train_epochs="400")           # a long step, so the stop lands inside it
    for q in (FRANCE, "Say hello."):
        log.add(served(lm, q), judge_score=1)
    proc = start(log)
    wait_until(proc, log, "a step", lambda: "training step on 2 samples" in said(log))
    time.sleep(2)
    stop(proc)
    assert "step abandoned (shutting down); nothing written" in said(log), said(log)[-4000:]
    assert "Traceback" not in said(log), said(log)[-4000:]
    assert adapters.list_versions(log.cfg.adapters_dir) == []
    assert [p.name for p in log.cfg.adapters_dir.glob(".tmp-*")] == []
    assert all(r["train_status"] is None for r in log.rows().values())
