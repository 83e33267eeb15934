"""Consolidation with TRL's KTOTrainer, on a real turn log with answers the real model served.

It trains a fresh adapter that raises the answers judged +1 and lowers those judged -1; the result
is a complete version with TRL's loss curve; opted-out and forgotten turns are never read; a
window that cannot teach is refused with a reason and writes nothing; SIGTERM mid-run writes
nothing, and a SIGKILL leaves only a staging folder that the next trainer start removes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from clawrl.adapters import versions as adapters
from clawrl.config import load_config
from clawrl.errors import ConfigError
from clawrl.learn import consolidate
from clawrl.learn.samples import connect
from clawrl.turnlog.forget import forget
from test_trainer import TurnLog, adapter_model, lm, score, served, wait_line  # noqa: F401

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Say hello.", "Name a primary color.",
             "What is 2 + 2?", "Name a fruit.", "What day comes after Monday?"]
# Fast KTO for a test: a few steps that must visibly move the answers.
FAST = {"consolidate_lr": "2e-3", "consolidate_epochs": "4", "consolidate_batch_size": "4",
        "consolidate_min_steps": "1",
        "consolidate_max_completion_tokens": "32"}


def judged_log(lm, tmp_path, **env) -> tuple[TurnLog, dict[int, bool]]:
    """Each question twice: the greedy answer the model served, judged -1, and a short answer
    written for it, judged +1 (as if the user had said "just the answer")."""
    log = TurnLog(tmp_path, **{**FAST, **env})
    tok = lm[0]
    labels = {}
    for q, short in zip(QUESTIONS, ["Paris.", "Hello!", "Red.", "4.", "Apple.", "Tuesday."]):
        bad = served(lm, q)
        good = {**bad, "text": short, "logprobs": None,
                "response_ids": tok.encode(short) + [tok.convert_tokens_to_ids("<|im_end|>")]}
        labels[log.add(bad, judge_score=-1)] = False
        labels[log.add({**good, "logprobs": []}, judge_score=1)] = True
    return log, labels


def total_logp(model, row: dict) -> float:
    return float(score(model, json.loads(row["prompt_ids"]), json.loads(row["response_ids"])).sum())


def test_kto_raises_the_good_answers_lowers_the_bad_and_writes_a_version(lm, tmp_path):
    log, labels = judged_log(lm, tmp_path)
    opted_out = log.add(served(lm, "Tell me a secret."), judge_score=1, trainable=0)
    other = log.add(served(lm, "What is the capital of Spain?"), judge_score=-1, user_id="v")
    db = connect(log.cfg.db_path)
    forget(log.cfg.db_path, user="v")    # a forgotten turn is never consolidated
    before = log.rows()
    import torch
    torch.set_num_threads(1)   # the online trainer's default, which consolidation's 2 must not leak into
    version = consolidate.run(log.cfg, db, log.cfg.adapters_dir, threading.Event())
    db.close()
    assert torch.get_num_threads() == 1

    assert version == 1
    meta = log.metas()[1]
    assert meta["method"] == consolidate.METHOD and meta["parent"] is None
    assert meta["consolidated"] == sorted(labels) and opted_out not in meta["consolidated"]
    assert other not in meta["consolidated"]
    assert meta["window"]["desirable"] == meta["window"]["undesirable"] == len(QUESTIONS)
    assert meta["samples"] == [] and meta["steps"] >= 4 and len(meta["loss_curve"]) == meta["steps"]
    assert meta["trl"] and all(isinstance(x, float) for x in meta["loss_curve"])
    # On a CPU, TRL's step runs with learn/kto_cpu.py's answer head, and the learning below is its.
    assert meta["path"] == {"device": "cpu", "answer_lm_head": True, "frozen_linears": 0,
                            "products": "float32"}
    root = log.cfg.adapters_dir
    assert adapters.weights_problem(adapters.version_dir(root, 1)) is None
    assert not list(root.glob(".tmp-*"))
    # No turn changed state: the online trainer still owns what it has not trained.
    after = log.rows()
    assert all(after[i]["train_status"] == before[i]["train_status"] for i in labels)
    status = adapters.read_consolidation(root)
    assert status["state"] == "done" and status["version"] == 1 and status["step"] == meta["steps"]

    # What KTO is for: the desirable answers gain against the base, the undesirable ones lose.
    tuned = adapter_model(log.home, 1)
    base = lm[1]
    moved = {i: total_logp(tuned, after[i]) - total_logp(base, after[i]) for i in labels}
    good = [d for i, d in moved.items() if labels[i]]
    bad = [d for i, d in moved.items() if not labels[i]]
    assert sum(good) / len(good) > 0.5, moved
    assert sum(bad) / len(bad) < -0.5, moved


def test_the_recipe_asks_for_bfloat16_products_where_the_cpu_has_them(lm, tmp_path):
    """consolidate.cpu_products = "bfloat16" runs the frozen base's products in bfloat16 where the
    CPU multiplies it natively (float32 elsewhere: emulated bfloat16 is slower), and what it
    learns goes the same way as the float32 path's."""
    from clawrl.models import bf16_supported
    log, labels = judged_log(lm, tmp_path, consolidate_cpu_products="bfloat16")
    db = connect(log.cfg.db_path)
    assert consolidate.run(log.cfg, db, log.cfg.adapters_dir, threading.Event()) == 1
    db.close()
    path = log.metas()[1]["path"]
    native = bf16_supported()
    assert path["products"] == ("bfloat16" if native else "float32")
    assert (path["frozen_linears"] > 0) == native and path["answer_lm_head"]
    tuned, after = adapter_model(log.home, 1), log.rows()
    moved = {i: total_logp(tuned, after[i]) - total_logp(lm[1], after[i]) for i in labels}
    good = [d for i, d in moved.items() if labels[i]]
    bad = [d for i, d in moved.items() if not labels[i]]
    assert sum(good) / len(good) > 0.5 and sum(bad) / len(bad) < -0.5, moved


@pytest.mark.parametrize("method,passes", [("kto", 4), ("apo-zero", 2)])
def test_each_method_reads_its_passes_and_learns_the_way_the_labels_say(lm, tmp_path, monkeypatch,
                                                                        method, passes):
    """consolidate.method picks TRL's loss. KTO reads the batch and its mismatched (KL) pairs,
    each through the policy and the reference: four forward passes of the model a step (the
    backward comes on top). APO-zero has no KL reference point, so it reads two. Both raise the
    good answers and lower the bad ones."""
    calls: list[int] = []
    real = consolidate._kto_trainer

    def spy(*args, **kw):
        trainer, path = real(*args, **kw)
        decoder = trainer.model.get_base_model().model
        decoder.register_forward_pre_hook(lambda _m, _a: calls.append(1))
        return trainer, path
    monkeypatch.setattr(consolidate, "_kto_trainer", spy)
    log, labels = judged_log(lm, tmp_path, consolidate_method=method)
    db = connect(log.cfg.db_path)
    assert consolidate.run(log.cfg, db, log.cfg.adapters_dir, threading.Event()) == 1
    db.close()
    meta = log.metas()[1]
    assert meta["recipe"]["consolidate"]["method"] == method
    assert len(calls) == passes * meta["steps"]
    tuned, after = adapter_model(log.home, 1), log.rows()
    moved = {i: total_logp(tuned, after[i]) - total_logp(lm[1], after[i]) for i in labels}
    good = [d for i, d in moved.items() if labels[i]]
    bad = [d for i, d in moved.items() if not labels[i]]
    assert sum(good) / len(good) > 0.5 and sum(bad) / len(bad) < -0.5, moved


def test_the_hinted_teachers_answers_join_the_window_and_are_raised(lm, tmp_path, monkeypatch,
                                                                    capsys):
    """With a hint on each -1 turn (the user's words), the base model shown the hint writes its
    own answer, which KTO trains as desirable under the original prompt: the fresh adapter makes
    those answers likelier. The version's turns are still the turn log's; with
    consolidate.teacher_answers off, the teacher writes nothing."""
    from clawrl.learn import hinted_answers
    written: list[dict[int, list[int]]] = []
    real = hinted_answers.write

    def spy(*args, **kw):
        written.append(real(*args, **kw))
        return written[-1]
    monkeypatch.setattr(hinted_answers, "write", spy)
    log, labels = judged_log(lm, tmp_path, consolidate_max_completion_tokens="48",
                             consolidate_teacher_answers="always")
    hinted = {i: log.add(served(lm, q), judge_score=-1, judge_hint="Way too long. One word only.")
              for i, q in enumerate(QUESTIONS)}
    db = connect(log.cfg.db_path)
    assert consolidate.run(log.cfg, db, log.cfg.adapters_dir, threading.Event()) == 1
    [answers] = written
    assert set(answers) == set(hinted.values()) and any(answers.values())
    meta = log.metas()[1]
    assert meta["window"]["teacher_answers"] == sum(bool(a) for a in answers.values())
    assert meta["consolidated"] == sorted([*labels, *hinted.values()])
    assert meta["window"]["desirable"] == len(QUESTIONS)
    rows, tuned = log.rows(), adapter_model(log.home, 1)
    moved = [total_logp(tuned, {**rows[i], "response_ids": json.dumps(ids)})
             - total_logp(lm[1], {**rows[i], "response_ids": json.dumps(ids)})
             for i, ids in answers.items() if ids]
    assert sum(moved) / len(moved) > 0.5, moved

    # Each answer is kept in its turn's row: the next run reads them back and writes none.
    from clawrl.config import consolidate_schedule
    from clawrl.ops import consolidate as command
    command._dry_run(log.cfg, db, log.cfg.adapters_dir, None, consolidate, consolidate_schedule)
    assert (f"the hinted teacher answers {len(QUESTIONS)} corrected turns ({len(QUESTIONS)} answers "
            "kept") in capsys.readouterr().out
    window = consolidate.examples(db, 100)
    assert sum(bool(e.hint) for e in window) == len(QUESTIONS)
    from clawrl.models import model_dir
    model_path = model_dir(log.cfg)
    added = consolidate._add_teacher_answers(log.cfg, db, model_path, None, lm[0], window,
                                             threading.Event(), lambda _: None, lambda _: None)
    assert added == len(answers) and len(written) == 1
    assert {e.id: e.response_ids for e in window if e.teacher} == {i: a for i, a in answers.items() if a}

    off = load_config(env={**log.env, "CLAWRL_CONSOLIDATE_TEACHER_ANSWERS": "off"})
    window = consolidate.examples(db, 100)
    assert consolidate._add_teacher_answers(off, db, model_path, lm[1], lm[0], window,
                                            threading.Event(), lambda _: None, lambda _: None) == 0
    assert len(written) == 1 and not any(e.teacher for e in window)
    db.close()


def test_a_window_that_cannot_teach_is_refused_and_writes_nothing(lm, tmp_path):
    log = TurnLog(tmp_path)
    root = log.cfg.adapters_dir
    db = connect(log.cfg.db_path)
    with pytest.raises(consolidate.NothingToConsolidate, match="no judged turns"):
        consolidate.run(log.cfg, db, root, threading.Event())
    log.add(served(lm, QUESTIONS[0]), judge_score=0)          # read, but no evidence: not judged
    for q in QUESTIONS[:3]:
        log.add(served(lm, q), judge_score=1)
    with pytest.raises(consolidate.NothingToConsolidate, match=r"all 3 judged turns .* \+1"):
        consolidate.run(log.cfg, db, root, threading.Event())
    db.close()
    assert adapters.list_versions(root) == [] and not list(root.glob(".tmp-*"))
    status = adapters.read_consolidation(root)
    assert status["state"] == "refused" and "KTO" in status["message"]

    # Tinker serves only what Tinker trained: a request is refused with the reason, in the status
    # `clawrl consolidate` follows.
    tinker = TurnLog(tmp_path / "tinker", engine_kind="tinker", model_source="tinker")
    db = connect(tinker.cfg.db_path)
    with pytest.raises(consolidate.NothingToConsolidate, match="Tinker|tinker"):
        consolidate.run(tinker.cfg, db, tinker.cfg.adapters_dir, threading.Event(), request_id="r1")
    db.close()
    status = adapters.read_consolidation(tinker.cfg.adapters_dir)
    assert status["state"] == "refused" and status["request"] == "r1"


def test_schedule_idle_and_daily(lm, tmp_path):
    log = TurnLog(tmp_path, consolidate_when="idle", consolidate_idle_minutes="10",
                  consolidate_min_new="2")
    root = log.cfg.adapters_dir
    db = connect(log.cfg.db_path)
    now = time.time()
    assert consolidate.due(log.cfg, db, root, now) is None            # nothing judged yet
    log.add(served(lm, QUESTIONS[0]), judge_score=1, created_at=now - 3600)
    assert consolidate.due(log.cfg, db, root, now) is None            # one is fewer than min_new
    last = log.add(served(lm, QUESTIONS[1]), judge_score=-1, created_at=now - 300)
    assert consolidate.due(log.cfg, db, root, now) is None            # used 5 minutes ago
    assert "no request for 15 minutes" in consolidate.due(log.cfg, db, root, now + 600)
    # Once a run has covered these turns (or was refused on them), they do not call for another.
    adapters.write_consolidation(root, {"state": "refused", "last_id": last, "started_at": now})
    assert consolidate.due(log.cfg, db, root, now + 600) is None

    daily = load_config(env={**log.env, "CLAWRL_CONSOLIDATE_WHEN": "daily 03:30",
                             "CLAWRL_CONSOLIDATE_MIN_NEW": "1"})
    log.add(served(lm, QUESTIONS[2]), judge_score=1, created_at=now)
    import datetime as dt
    day = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    at = day.replace(hour=3, minute=30).timestamp()
    adapters.write_consolidation(root, {"state": "refused", "last_id": last, "started_at": at - 86400})
    assert consolidate.due(daily, db, root, at - 60) is None           # not yet 03:30
    assert "daily run at 03:30" in consolidate.due(daily, db, root, at + 60)
    adapters.write_consolidation(root, {"state": "done", "last_id": last, "started_at": at + 10})
    assert consolidate.due(daily, db, root, at + 60) is None           # it ran today already
    db.close()
    for bad in ("sometimes", "daily 25:00", "daily 3", "idle now"):
        with pytest.raises(ConfigError, match="consolidate.when"):
            load_config(env={**log.env, "CLAWRL_CONSOLIDATE_WHEN": bad})


def start_trainer(log: TurnLog) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWRL_")}, **log.env}
    return subprocess.Popen([sys.executable, "-m", "clawrl.learn.trainer"], env=env, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)


def test_sigterm_mid_run_writes_nothing_and_sigkill_leaves_only_staging(lm, tmp_path):
    # The online trainer has nothing to do (method rl, every turn already trained), so it takes
    # the request that `clawrl consolidate` leaves for a running trainer.
    log, labels = judged_log(lm, tmp_path, method_name="rl", consolidate_epochs="50")
    db = connect(log.cfg.db_path)
    db.execute("UPDATE turns SET train_status='trained'")
    db.close()
    root = log.cfg.adapters_dir
    rid = consolidate.request(root)
    proc = start_trainer(log)
    wait_line(proc, "consolidating 12 judged turns", timeout=300)
    deadline = time.time() + 300
    while (adapters.read_consolidation(root) or {}).get("step", 0) < 1 and time.time() < deadline:
        time.sleep(0.5)
    assert list(root.glob(".tmp-consolidate-*")), "TRL's staging folder"
    proc.send_signal(signal.SIGTERM)
    stopped_at = time.time()
    rest = proc.communicate(timeout=120)[1]
    # Inside a step, not after it: the daemon kills a trainer that takes over 15 s.
    assert time.time() - stopped_at < 10, rest
    assert proc.returncode == 0, rest
    assert "stopped during consolidation" in rest
    assert adapters.list_versions(root) == [] and not list(root.glob(".tmp-*"))
    status = adapters.read_consolidation(root)
    assert status["state"] == "stopped" and status["request"] == rid

    consolidate.request(root)
    proc = start_trainer(log)
    wait_line(proc, "consolidating 12 judged turns", timeout=300)
    while not list(root.glob(".tmp-consolidate-*")) and time.time() < deadline + 300:
        time.sleep(0.1)
    time.sleep(2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert adapters.list_versions(root) == []
    assert list(root.glob(".tmp-consolidate-*"))   # what a crash leaves: the staging folder
    proc = start_trainer(log)                      # the next start cleans it
    wait_line(proc, "watching", timeout=300)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert not list(root.glob(".tmp-*")) and adapters.list_versions(root) == []
    assert all(r["train_status"] == "trained" for r in log.rows().values())


def test_cli_dry_run_and_a_run_on_a_stopped_daemon(lm, tmp_path):
    log, labels = judged_log(lm, tmp_path, consolidate_epochs="1")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWRL_")}, **log.env}
    cli = [sys.executable, "-m", "clawrl", "consolidate"]
    out = subprocess.run(cli + ["--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "12 judged turns (of at most 500): 6 good, 6 bad" in out.stdout
    assert "it would train a fresh adapter" in out.stdout
    assert "schedule: off (only this command runs one" in out.stdout     # the default
    assert adapters.list_versions(log.cfg.adapters_dir) == []

    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "version 0001 written" in out.stdout
    assert "consolidating [" in out.stderr and "step 3/3" in out.stderr   # the progress bar
    assert adapters.read_meta(log.cfg.adapters_dir, 1)["method"] == consolidate.METHOD

    # a dry run now says how long the window would take, at the pace of the run just made
    out = subprocess.run(cli + ["--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "last consolidation: version 0001, 12 turns, 3 steps in " in out.stdout, out.stdout
    assert "this window: 3 steps (with its teacher answers), about " in out.stdout
    assert "at the last consolidation's pace" in out.stdout

    status = subprocess.run([sys.executable, "-m", "clawrl", "status"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert "consolidate  done" in status.stdout and "12 samples" in status.stdout, status.stdout
    assert "schedule: off" in status.stdout

    few = subprocess.run(cli + ["--window", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert few.returncode == 2 and "at least 2" in few.stderr


def test_through_a_running_daemon_the_consolidated_version_is_swapped_in_with_no_refusal(tmp_path):
    """Real traffic, explicit feedback, then `clawrl consolidate` while a daemon serves: its
    trainer takes the request, the daemon's guard and canary pass the version, it goes live
    between two requests, and nothing is refused meanwhile."""
    import httpx

    from conftest import Daemon, make_home
    home = make_home(tmp_path / "home")
    # The online trainer waits for 1,000 turns: only the consolidation writes a version here.
    d = Daemon(home, env={"CLAWRL_TRAIN_ENABLED": "true", "CLAWRL_TRAIN_BATCH_SIZE": "1000",
                          "CLAWRL_TRAIN_POLL_S": "0.2", **{f"CLAWRL_{k.upper()}": v for k, v in FAST.items()},
                          "CLAWRL_CONSOLIDATE_EPOCHS": "1"}).start()
    statuses: list[int] = []
    try:
        for i, q in enumerate(QUESTIONS + [q + " Be brief." for q in QUESTIONS]):
            r = httpx.post(f"{d.url}/v1/chat/completions", timeout=120, headers={"X-Session-Id": f"s{i}"},
                           json={"model": "m", "max_tokens": 12, "temperature": 0,
                                 "messages": [{"role": "user", "content": q}]})
            assert r.status_code == 200, r.text
            turn = int(r.headers["x-clawrl-turn-id"])
            f = httpx.post(f"{d.url}/v1/feedback", timeout=30,
                           json={"session_id": f"s{i}", "turn_id": turn, "reward": 1 if i % 2 else -1})
            assert f.status_code == 200, f.text
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWRL_")},
               **{k: v for k, v in d.env.items() if k.startswith("CLAWRL_")}}
        cli = subprocess.Popen([sys.executable, "-m", "clawrl", "consolidate"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        done = threading.Event()

        def traffic():   # requests all through the run and the swap
            while not done.is_set():
                r = httpx.post(f"{d.url}/v1/chat/completions", timeout=300,
                               json={"model": "m", "max_tokens": 24, "temperature": 0.7,
                                     "messages": [{"role": "user", "content": "Tell me about herons."}]})
                statuses.append(r.status_code)

        t = threading.Thread(target=traffic)
        t.start()
        out, err = cli.communicate(timeout=900)
        assert cli.returncode == 0, err
        assert "asked the running trainer" in err and "version 0001" in out
        deadline = time.time() + 300
        while time.time() < deadline:
            info = httpx.get(f"{d.url}/v1/adapters", timeout=10).json()
            if info["active"] == 1:
                break
            time.sleep(0.3)
        done.set()
        t.join(timeout=300)
        assert info["active"] == 1, info
        assert info["consolidation"]["state"] == "done" and info["consolidation"]["version"] == 1
        v1 = next(v for v in info["versions"] if v["version"] == 1)
        assert v1["method"] == consolidate.METHOD and v1["samples"] == 12 and not v1["rejected"]
        r = httpx.post(f"{d.url}/v1/chat/completions", timeout=120,
                       json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
        assert d.wait_turn(int(r.headers["x-clawrl-turn-id"]))["adapter_version"] == 1
        assert statuses and set(statuses) == {200}, statuses
    finally:
        done_set = locals().get("done")
        if done_set is not None:
            done_set.set()
        d.stop()
