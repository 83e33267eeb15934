"""The probe's reading workers (judge/probe_workers.py) where no model is read: how many there
are, and what a worker that cannot read says. Their readings, a stopped fit's shards and the
resumed fit are checked on the real model in test_probe.py."""
from types import SimpleNamespace

import pytest
import torch

from clawrl.judge import probe, probe_workers


def test_few_lines_or_one_core_read_in_process_and_the_setting_overrides(monkeypatch):
    assert probe_workers.workers_for(probe_workers.MIN_LINES - 1) == 1
    monkeypatch.setattr(probe_workers, "_cores", lambda: 1)
    assert probe_workers.workers_for(5000) == 1
    monkeypatch.setattr(probe_workers, "_cores", lambda: 64)
    assert probe_workers.workers_for(5000) == probe_workers.MAX_WORKERS
    assert probe_workers.workers_for(5, setting=3) == 3 and probe_workers.workers_for(5000, setting=1) == 1


def test_the_recipe_sets_the_readers_and_refuses_a_negative_count():
    from clawrl.config import load_config
    from clawrl.errors import ConfigError
    assert load_config(env={"CLAWRL_JUDGE_PROBE_WORKERS": "2"}).judge.probe_workers == 2
    with pytest.raises(ConfigError, match="CLAWRL_JUDGE_PROBE_WORKERS = -1 is too small"):
        load_config(env={"CLAWRL_JUDGE_PROBE_WORKERS": "-1"})


def test_a_worker_that_cannot_read_fails_the_fit_with_its_reason(tmp_path):
    missing = SimpleNamespace(model_dir=tmp_path / "no-model", products=torch.float32)
    lines = [probe.exchange("q", "a", f"reply {i}") for i in range(4)]
    with pytest.raises(probe.ProbeError, match=r"worker failed \(exit code 1\) after 0 of 4 lines: .*no-model"):
        probe_workers.read_in_workers(missing, lines, [bytes([i]) * 16 for i in range(4)],
                                      tmp_path / "features", workers=2)
    assert not probe_workers.shard_files(tmp_path / "features")
