"""Consolidation: a fresh adapter trained from the whole judged log with TRL, in quiet hours.

The online trainer (learn/trainer.py) takes one PPO step per judged turn, each continuing from the
last version, so after weeks an adapter is the sum of thousands of small steps. Consolidation
starts again from the base model and trains one LoRA on the newest `consolidate.window` judged
turns at once: TRL's `KTOTrainer`, the +1 turns desirable and the -1 turns undesirable, unpaired
(which is what the turn log holds). The result is an adapter version like any other (meta.json
says `method: consolidate-kto`, which turns it saw and TRL's loss curve), so the daemon's guard,
canary and hot-swap treat it as they treat every version, and online training continues from it.

It reads only trainable turns: an opted-out turn or one that held a secret is never read, and a
forgotten turn is deleted from the log, so it is never consolidated again. It marks no turn: the
turns the online trainer has not taken yet are still trained online, on top of this version. (It
only keeps, in a -1 turn's row, the answer the hinted teacher wrote for it: learn/hinted_answers.py.)

Where it runs: inside the trainer process (the one writer of the adapters folder) when the
schedule says so (`due`) or when `clawrl consolidate` leaves a request file; without a running
trainer the command runs it itself, holding the same lock. Progress goes to CONSOLIDATION.json
in the adapters folder (adapters.read_consolidation: the dashboard and `clawrl consolidate` read
it). TRL writes into a staging
folder `.tmp-consolidate-PID`, which a trainer start removes (adapters.clean_temp); the version
itself is written by adapters.write_version (temp folder, then rename), so a crash or SIGTERM at
any moment leaves no half-written version.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..adapters import versions as adapters
from ..config import Config, consolidate_schedule
from ..errors import ClawrlError
from ..turnlog.rows import value
from .samples import judged_since, judged_window, last_request_at, log, reward_of, write
from .teacher import pick_hint

REQUEST = "CONSOLIDATE"         # `clawrl consolidate` asks a running trainer to run one now
METHOD = "consolidate-kto"      # meta.json's method of a consolidated version
# consolidate.method -> TRL's KTOConfig.loss_type. APO-zero (unpaired) is KTO's loss with the KL
# reference point held at 0: no mismatched pairs to read, so a step is three passes, not five.
LOSS_TYPES = {"kto": "kto", "apo-zero": "apo_zero_unpaired"}


class NothingToConsolidate(ClawrlError):
    """The window cannot make a version (no judged turns, one label only): nothing is written."""


class Stopped(Exception):
    """SIGTERM or shutdown during the run: nothing is written."""


@dataclass
class Example:
    id: int
    prompt_ids: list[int]
    response_ids: list[int]
    desirable: bool
    hint: str | None = None          # the user's words on a -1 turn (learn/teacher.pick_hint)
    request: dict | None = None      # what was asked ({messages, tools}), for the hinted teacher
    teacher: bool = False            # an answer the hinted teacher wrote (learn/hinted_answers.py)
    kept: str | None = None          # the row's teacher_answer: one written before


def examples(db: sqlite3.Connection, size: int) -> list[Example]:
    """The window as KTO examples, oldest first; a row whose ids do not parse is left out."""
    out = []
    for r in judged_window(db, size):
        try:
            prompt, response = value(r, "prompt_ids"), value(r, "response_ids")
        except ValueError as e:
            log(f"consolidation: {e}; left out")
            continue
        try:
            request = value(r, "request_json")
        except ValueError:
            request = None        # KTO still takes the turn; the hinted teacher cannot
        if prompt and response:
            reward = reward_of(r)
            assert reward is not None       # a JUDGED row has one
            hint = pick_hint(r["feedback_comment"], r["judge_hint"]) if reward < 0 else None
            out.append(Example(r["id"], prompt, response, reward > 0, hint,
                               request if isinstance(request, dict) and request.get("messages") else None,
                               kept=r["teacher_answer"]))
    return out


def check_window(window: list[Example], batch_size: int) -> None:
    """Refuse a window that cannot teach anything, saying why and what to do."""
    good = sum(e.desirable for e in window)
    bad = len(window) - good
    if not window:
        raise NothingToConsolidate(
            "no judged turns to consolidate: the judge has not scored any answer +1 or -1 yet "
            "(each answer is judged when the next message of its session arrives); nothing written")
    if not good or not bad:
        which = "+1 (good)" if good else "-1 (bad)"
        raise NothingToConsolidate(
            f"all {len(window)} judged turns in the window are {which}: KTO learns from the "
            "contrast of good and bad answers, so there is nothing to consolidate yet; nothing "
            "written (a larger consolidate.window may take in both)")
    if len(window) < batch_size:
        raise NothingToConsolidate(
            f"only {len(window)} judged turns, fewer than consolidate.batch_size = {batch_size}; "
            "nothing written (lower the batch size, or wait for more feedback)")


# -- progress ----------------------------------------------------------------------------------------

def request(root: Path, window: int | None = None) -> str:
    """Ask the running trainer to consolidate now; returns the request's id."""
    rid = f"{time.time():.6f}-{os.getpid()}"
    adapters.write_small(root, REQUEST, json.dumps({"id": rid, "window": window}))
    return rid


def take_request(root: Path) -> dict | None:
    """The pending request, removed from the folder (so it runs once)."""
    path = root / REQUEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    path.unlink(missing_ok=True)
    try:
        req = json.loads(text)
    except ValueError:
        req = {}   # unreadable: still a request, with the recipe's window
    return req if isinstance(req, dict) else {}


# -- the schedule ------------------------------------------------------------------------------------

def last_consolidation(root: Path) -> dict | None:
    """meta.json of the newest consolidated version on disk."""
    for v in reversed(adapters.list_versions(root)):
        try:
            meta = adapters.read_meta(root, v)
        except (OSError, ValueError):
            continue
        if meta.get("method") == METHOD:
            return meta
    return None


def due(cfg: Config, db: sqlite3.Connection, root: Path, now: float | None = None) -> str | None:
    """Why a scheduled consolidation should run now, or None. It needs consolidate.min_new judged
    turns newer than the last consolidation's window, and then the quiet its schedule names: no
    request for idle_minutes, or today's HH:MM passed with no run since."""
    kind, at = consolidate_schedule(cfg.consolidate.when)
    if kind == "off" or cfg.engine.kind == "tinker":   # Tinker serves only what it trained
        return None
    now = time.time() if now is None else now
    last = last_consolidation(root)
    status = adapters.read_consolidation(root) or {}
    # A run that failed or was refused is not retried until more feedback arrives.
    after = max((last or {}).get("window", {}).get("last_id", 0), status.get("last_id", 0))
    new = judged_since(db, after)
    if new < cfg.consolidate.min_new:
        return None
    if kind == "idle":
        quiet = now - (last_request_at(db) or 0)
        if quiet < cfg.consolidate.idle_minutes * 60:
            return None
        return f"{new} new judged turns and no request for {quiet / 60:.0f} minutes"
    assert at is not None               # a "daily" schedule comes with its time
    hour, minute = at
    today = dt.datetime.fromtimestamp(now).replace(hour=hour, minute=minute, second=0, microsecond=0)
    ran = max((last or {}).get("created_at", 0), status.get("started_at", 0))
    if now < today.timestamp() or ran >= today.timestamp():
        return None
    return f"{new} new judged turns; daily run at {hour:02d}:{minute:02d}"


# -- the run -----------------------------------------------------------------------------------------

def _kto_dataset(tokenizer, window: list[Example], cfg: Config):
    """TRL's unpaired preference format: prompt and completion text and a boolean label. The prompt
    is the one served (the most recent max_prompt_tokens of it), as text: TRL tokenizes it.

    TRL reads the rows in order (its KL estimate pairs each prompt with the answer before it in
    the batch) and pads a batch to its longest row. So the rows are bucketed: sorted by length,
    cut into batches, and the batches shuffled (seeded). A batch then holds rows of about one
    length, and padding costs little."""
    import random

    from datasets import Dataset
    c = cfg.consolidate
    rows = [{"prompt": tokenizer.decode(e.prompt_ids[-c.max_prompt_tokens:]),
             "completion": tokenizer.decode(e.response_ids), "label": e.desirable,
             "length": min(len(e.prompt_ids), c.max_prompt_tokens)
             + min(len(e.response_ids), c.max_completion_tokens)} for e in window]
    rows.sort(key=lambda r: r["length"])
    batches = [rows[i:i + c.batch_size] for i in range(0, len(rows), c.batch_size)]
    random.Random(0).shuffle(batches)
    return Dataset.from_list([{k: r[k] for k in ("prompt", "completion", "label")}
                              for b in batches for r in b])


def _weights(window: list[Example]) -> float:
    """desirable_weight that balances the two labels (KTO paper, eq. 8: the desirable share of
    the loss at 1 to 4/3 of the undesirable one), the undesirable weight staying 1."""
    good = sum(e.desirable for e in window)
    return min(4.0, max(0.25, (len(window) - good) / good))


def _callback(progress: Callable[[dict], None], stop: threading.Event):
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        """Stops TRL between two optimizer steps on SIGTERM; reports each step and its loss."""
        def __init__(self):
            self.losses: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            if stop.is_set():
                control.should_training_stop = True
            progress({"step": state.global_step, "steps": state.max_steps, "loss": self.losses})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and isinstance(logs["loss"], (int, float)):
                self.losses.append(round(float(logs["loss"]), 5))

    return Watch()


def run(cfg: Config, db: sqlite3.Connection, root: Path, stop: threading.Event,
        say: Callable[[str], None] = log, window_size: int | None = None,
        request_id: str | None = None, on_progress: Callable[[dict], None] | None = None) -> int:
    """One consolidation: the new version's number. NothingToConsolidate (with the reason) when the
    window cannot make one; Stopped when `stop` is set during it. The caller holds the trainer
    lock (it is the trainer, or `clawrl consolidate` on a stopped daemon)."""
    c = cfg.consolidate
    started = time.time()
    status: dict[str, object] = {"state": "running", "request": request_id, "started_at": started,
                                 "pid": os.getpid(), "step": 0, "steps": None, "loss": [], "version": None,
                                 "message": "reading the turn log"}

    def progress(update: dict) -> None:
        status.update(update)
        adapters.write_consolidation(root, status)
        if on_progress:
            on_progress(status)

    progress({})
    if cfg.engine.kind == "tinker":
        why = ("consolidation trains a local PEFT adapter, which engine.kind = \"tinker\" cannot "
               "serve; it runs with the embedded, sglang and vllm engines")
        progress({"state": "refused", "message": why, "finished_at": time.time()})
        raise NothingToConsolidate(why)
    window = examples(db, window_size or c.window)
    last_id = window[-1].id if window else 0
    try:
        check_window(window, c.batch_size)
    except NothingToConsolidate as e:
        progress({"state": "refused", "message": str(e), "last_id": last_id, "finished_at": time.time()})
        raise
    good = sum(e.desirable for e in window)
    say(f"consolidating {len(window)} judged turns ({good} good, {len(window) - good} bad; "
        f"turns {window[0].id}..{last_id}) into a fresh adapter with TRL's KTOTrainer ({LOSS_TYPES[c.method]} loss)")
    staging = root / f".tmp-consolidate-{os.getpid()}"
    from .. import models
    model_path = models.model_dir(cfg)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    import gc

    import torch
    threads = torch.get_num_threads()   # the online trainer's, restored after the run
    trainer = None
    try:
        watch = _callback(progress, stop)
        torch.set_num_threads(c.threads)
        tokenizer, model = _base(cfg, model_path)
        taught = _add_teacher_answers(cfg, db, model_path, model, tokenizer, window, stop, progress, say)
        trainer, path = _kto_trainer(cfg, model, tokenizer, window, staging, watch)
        _stop_inside_steps(trainer.model, stop)
        progress({"message": "training", "steps": trainer.state.max_steps or None, "training_at": time.time()})
        result = trainer.train()
        if stop.is_set():
            raise Stopped("stopped during consolidation; nothing written")
        losses = list(watch.losses)
        loss = float(result.training_loss)
        if not math.isfinite(loss):
            raise ClawrlError(f"consolidation's training loss was {loss}; nothing written")
        version = (adapters.newest(root) or 0) + 1
        turns = [e for e in window if not e.teacher]
        meta = {
            "parent": None, "samples": [], "method": METHOD,
            "consolidated": [e.id for e in turns],
            "window": {"first_id": turns[0].id, "last_id": last_id, "size": len(turns),
                       "desirable": good, "undesirable": len(turns) - good,
                       "teacher_answers": taught},
            "loss": loss, "loss_curve": losses, "steps": trainer.state.global_step,
            "base_model": {"name": cfg.model.name, "source": cfg.model.source, "path": str(model_path)},
            "seconds": round(time.time() - started, 1), "trl": _trl_version(), "path": path,
            "recipe": {"consolidate": {k: getattr(c, k) for k in c.__dataclass_fields__},
                       "lora": {"r": cfg.train.lora_r, "alpha": cfg.train.lora_alpha,
                                "targets": cfg.train.lora_targets}},
        }
        adapters.write_version(root, version, trainer.model.save_pretrained, meta)
    except BaseException as e:
        state = "stopped" if isinstance(e, Stopped) or stop.is_set() else "failed"
        progress({"state": state, "message": str(e) or type(e).__name__, "last_id": last_id,
                  "finished_at": time.time()})
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        del trainer   # a long-lived trainer process gets the memory back
        gc.collect()
        torch.set_num_threads(threads)
    progress({"state": "done", "version": version, "last_id": last_id, "finished_at": time.time(),
              "message": f"version {version:04d}: {len(turns)} turns, loss {loss:.4f}, "
                         f"{meta['seconds']:.0f} s"})
    say(f"consolidated version {version:04d}: {len(turns)} turns ({taught} teacher answers), "
        f"{meta['steps']} steps, "
        f"loss {losses[0] if losses else loss:.4f} -> {loss:.4f}, {meta['seconds']:.0f} s")
    return version


def _stop_inside_steps(model, stop: threading.Event) -> None:
    """A step takes half a minute on a CPU, and the daemon kills its trainer 15 s after SIGTERM:
    so the run checks `stop` before every decoder layer, and a stopped run leaves TRL's step at
    once, by Stopped, with nothing written."""
    def check(_module, _args):
        if stop.is_set():
            raise Stopped("stopped during consolidation; nothing written")
    for name, module in model.named_modules():
        if name.split(".")[-2:-1] == ["layers"]:   # ...layers.N: one decoder layer
            module.register_forward_pre_hook(check)


def _trl_version() -> str:
    import trl
    return trl.__version__


def _base(cfg: Config, model_path: Path):
    """The base model's tokenizer (left padding) and the model itself, in float32 and eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return tokenizer, model.eval()


def _add_teacher_answers(cfg: Config, db: sqlite3.Connection, model_path: Path, model, tokenizer,
                         window: list[Example], stop: threading.Event,
                         progress: Callable[[dict], None], say: Callable[[str], None]) -> int:
    """The hinted teacher's own answers to the -1 turns that `teacher_asked` picks join `window`
    (in place) as desirable examples (learn/hinted_answers.py); how many. Answers kept in the
    turn log from an earlier run are read back; new ones are kept there."""
    import torch

    from ..models import model_hash
    from . import hinted_answers as teach
    c = cfg.consolidate
    asked = teacher_asked(window, c.teacher_answers)
    if not asked:
        return 0
    digest = model_hash(model_path)
    if cfg.engine.train_gpus and torch.cuda.is_available():
        model.to("cuda")       # where TRL will train it: the answers are written there too
    keys = {e.id: teach.key(digest, str(e.hint), c.max_prompt_tokens, c.max_completion_tokens)
            for e in asked}
    answers: dict[int, list[int] | None] = {}
    wanted = []
    for e in asked:
        found, ids = teach.recall(e.kept, keys[e.id])
        if found:
            answers[e.id] = ids
        else:
            wanted.append(teach.Wanted(e.id, dict(e.request or {}), str(e.hint), e.response_ids))
    t0 = time.time()
    if wanted:
        progress({"message": f"the hinted teacher answers {len(wanted)} corrected turns"})
        new = teach.write(model, tokenizer, wanted, c.max_prompt_tokens, c.max_completion_tokens,
                          stop, lambda done, total: progress(
                              {"message": f"the hinted teacher answered {done}/{total} corrected turns"}))
        # kept even when stopped: the next run starts where this one ended
        write(db, "UPDATE turns SET teacher_answer=? WHERE id=?",
              [(teach.keep(ids, keys[i]), i) for i, ids in new.items()])
        answers.update(new)
        if stop.is_set():
            raise Stopped("stopped during consolidation; nothing written")
    by_id = {e.id: e for e in window}
    kept = {i: ids for i, ids in answers.items() if ids}
    window.extend(Example(i, by_id[i].prompt_ids, ids, True, teacher=True) for i, ids in kept.items())
    say(f"consolidation: the hinted teacher's answers to {len(asked)} corrected turns: "
        f"{len(answers) - len(wanted)} kept from before, {len(wanted)} written in "
        f"{time.time() - t0:.0f} s; {len(kept)} join the window (the rest were cut off or empty)")
    return len(kept)


def teacher_asked(window: list[Example], mode: str) -> list[Example]:
    """The -1 turns (with a hint and the request) whose teacher answers join the window, oldest
    first. consolidate.teacher_answers = "always": all of them; "off": none; "balance": only as
    many as the window has more -1 than +1 turns, the newest first (they say what the user wants
    now). A window of nearly all corrections is where a fresh adapter lost what online training
    had learned, and where these answers gave it back; on balanced windows they were mixed
    (bench/RESULTS-consolidate.md), so there "balance" asks for none."""
    hinted = [e for e in window if not e.desirable and e.hint and e.request]
    if mode == "always":
        return hinted
    if mode == "off":
        return []
    good = sum(e.desirable for e in window)
    gap = len(window) - 2 * good          # bad - good
    return hinted[max(0, len(hinted) - gap):] if gap > 0 else []


def planned_steps(rows: int, c) -> int:
    """The optimizer steps of a consolidation over `rows` examples (teacher answers included):
    `consolidate.epochs` passes in batches of `batch_size`, at least `min_steps`."""
    return max(c.min_steps, math.ceil(math.ceil(rows / c.batch_size) * c.epochs))


def _kto_trainer(cfg: Config, model, tokenizer, window: list[Example], staging: Path, watch):
    """TRL's KTOTrainer on the window: a fresh LoRA on the base model (the reference model is the
    base itself, the adapter disabled), on the CPU unless the trainer has a GPU; and how it runs
    there (meta.json's `path`). On a CPU, float32 with learn/kto_cpu.py's LM head that projects
    only the answers (a step in 0.68 of TRL's float32 time); bfloat16 autocast took 4.5 s a turn
    against 2.9 s for plain float32 here, even with AVX-512 BF16."""
    import torch
    import datasets
    from peft import LoraConfig
    from trl import KTOConfig, KTOTrainer

    from . import kto_cpu
    datasets.disable_progress_bars()
    c, t = cfg.consolidate, cfg.train
    cuda = bool(cfg.engine.train_gpus) and torch.cuda.is_available()
    model.train()
    targets = "all-linear" if t.lora_targets == "all-linear" else \
        [s.strip() for s in t.lora_targets.split(",") if s.strip()]
    steps = planned_steps(len(window), c)
    args = KTOConfig(
        output_dir=str(staging), per_device_train_batch_size=c.batch_size,
        max_steps=steps, learning_rate=c.lr, beta=c.beta, lr_scheduler_type="linear",
        loss_type=LOSS_TYPES[c.method],
        desirable_weight=_weights(window), undesirable_weight=1.0,
        max_length=c.max_prompt_tokens + c.max_completion_tokens,
        max_grad_norm=t.max_grad_norm or 1.0, logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=not cuda, bf16=cuda,
        dataloader_num_workers=0, seed=0, remove_unused_columns=False)
    trainer = KTOTrainer(model=model, args=args, train_dataset=_kto_dataset(tokenizer, window, cfg),
                         processing_class=tokenizer, callbacks=[watch],
                         peft_config=LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha,
                                                target_modules=targets, lora_dropout=0.0,
                                                task_type="CAUSAL_LM"))
    path = {"device": "cuda", "bf16": True} if cuda else \
        {"device": "cpu", **kto_cpu.for_cpu(trainer, getattr(torch, c.cpu_products))}
    return trainer, path


def between_steps(cfg: Config, db: sqlite3.Connection, root: Path, stop: threading.Event,
                  say: Callable[[str], None] = log, scheduled: bool = True) -> int | None:
    """The trainer's turn, when it has no batch: run a requested consolidation, or (when
    `scheduled`) a due one. The new version, or None (none due, refused with a logged reason, or
    stopped)."""
    req = take_request(root)
    why = "requested by `clawrl consolidate`" if req is not None else \
        (due(cfg, db, root) if scheduled else None)
    if not why:
        return None
    say(f"consolidation: {why}")
    req = req or {}
    try:
        return run(cfg, db, root, stop, say, window_size=req.get("window"), request_id=req.get("id"))
    except NothingToConsolidate as e:
        say(f"consolidation refused: {e}")
    except Stopped as e:
        say(str(e))
    except Exception as e:   # a failed run must not take the online trainer down
        say(f"consolidation failed ({type(e).__name__}: {e}); nothing written")
    return None
