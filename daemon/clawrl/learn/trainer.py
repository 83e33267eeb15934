"""The background trainer: judged turns from the turn log -> one LoRA PPO step -> adapters/NNNN/.

A separate process (`python -m clawrl.learn.trainer`, or `clawrl train` from the daemon's supervisor).
It owns the policy (base model + LoRA), teacher scoring, the optimizer step and writing versions.
Which turns are ready and how they are marked is learn/samples.py; the math is learn/advantages.py; the folder
format is adapters/versions.py; the schema is turnlog/migrations.py (the daemon applies it, not the trainer).
On several GPUs it runs as one process per GPU, rank 0 alone writing (learn/distributed.py); one trainer
at a time writes an adapters folder (adapters.hold_trainer_lock).

Crash safety: a version is written to a temp folder and renamed (adapters.write_version); only
then are its turns marked trained, in one transaction. A crash before the rename leaves the turns
ready and they are trained again; a crash between the rename and the mark is repaired on the next
start from the `samples` list in each version's meta.json, and a mark that fails (the turn log
locked past its timeout, or its disk full) before the next step. So no turn is lost, and none is
trained into two versions.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Callable, TypedDict

# Set before torch loads: OpenMP's spin-wait slows every op on a 2-core box shared with serving.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from ..adapters import versions as adapters  # noqa: E402
from .. import models  # noqa: E402
from .advantages import (guard_empty, method_advantages, ppo_loss, topk_distill_loss,  # noqa: E402
                         truncated_is_weights)
from ..config import Config, load_config  # noqa: E402
from .consolidate import between_steps  # noqa: E402
from .distributed import Group, daemon_pid  # noqa: E402
from .remote_teacher import TeacherUnavailable, remote_teacher  # noqa: E402
from ..types import Sample  # noqa: E402
from .samples import (connect, log, mark_skipped, next_batch, store_teacher, take_over)  # noqa: E402
from .teacher import teacher_prompt  # noqa: E402
from .step import (Abandoned, commit, fold_rewards, history_baseline, parent_rejected, settle,  # noqa: E402
                   step_lr, summary, version_meta)


def token_logprobs(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Log-probability of each token under its row of logits."""
    index = torch.tensor(tokens, device=logits.device)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, index).squeeze(-1)


class Outcome(TypedDict):
    """What one rank found preparing its share of a batch; every rank reads every rank's."""
    stop: bool              # shutdown was asked for
    retry: str | None       # why the serving server's teacher cannot score now
    skip: list[int]         # turns the model cannot take
    teacher: list[tuple]    # teacher scores computed (Trainer.fresh_teacher), for the lead to store


class Trainer:
    """Holds the policy (base + LoRA), its optimizer and the turn-log connection."""

    def __init__(self, cfg: Config, stop: threading.Event | None = None):
        self.cfg, self.stop = cfg, stop or threading.Event()
        # Several processes (learn/distributed.py): rank 0, the lead, alone writes the turn log and
        # the adapters folder; the others read the turn log only for the reward baseline.
        self.group = Group()
        self.lead = self.group.lead
        self.root = cfg.adapters_dir
        self.db = connect(cfg.db_path)
        self.unmarked = False   # a version is on disk whose turns are not marked trained yet
        self.fresh_teacher: list[tuple] = []   # teacher scores computed, not yet stored
        if self.lead:
            self.lock = take_over(self.db, self.root, self.stop)
        torch.set_num_threads(cfg.train.threads)
        self.device = torch.device("cpu")
        if cfg.engine.train_gpus:      # a server engine's recipe gives the trainer its own GPU(s)
            os.environ["CUDA_VISIBLE_DEVICES"] = cfg.engine.train_gpus   # before CUDA starts
            if torch.cuda.is_available():   # one GPU per process of the group
                self.device = torch.device("cuda", self.group.local_rank)
            elif self.lead:
                log(f"engine.train_gpus = {cfg.engine.train_gpus!r} but CUDA is not available "
                    "to torch here; training on the CPU")
        self.group.start(self.device)
        if self.group.active and self.lead:
            log(f"data-parallel over {self.group.world} processes ({self.device.type})")
        self.autocast: Callable[[], AbstractContextManager[object]]
        if self.device.type == "cuda":
            self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
        else:
            bf16 = models.bf16_supported()
            self.autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
        # sglang / vllm: the frozen base model on the serving server scores the hinted context.
        self.remote_teacher = remote_teacher(cfg)
        self.model_path = models.model_dir(cfg)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.load(adapters.newest_good(self.root))
        self.baseline = history_baseline(cfg, self.db)

    def load(self, parent: int | None) -> None:
        """Base model in float32 (master weights; compute runs under bf16 autocast) plus LoRA:
        fresh, or resumed from version `parent`, which the next version then names as parent."""
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()   # one line per event in the daemon's log, not bars
        # peft asks transformers a deprecated question on every load; the answer is still right.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                category=FutureWarning)
        t0 = time.perf_counter()
        base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        base.to(self.device)  # type: ignore[arg-type]  # transformers' @wraps(Module.to) leaves self unbound
        t = self.cfg.train
        if parent is None:
            torch.manual_seed(0)   # the same first adapter from the same data
            targets = "all-linear" if t.lora_targets == "all-linear" else \
                [s.strip() for s in t.lora_targets.split(",") if s.strip()]
            # No dropout: the no-grad "old" pass and the first training pass see the same
            # network, so the PPO ratio starts at exactly 1.
            lora = LoraConfig(r=t.lora_r, lora_alpha=t.lora_alpha, target_modules=targets,
                              lora_dropout=0.0, task_type="CAUSAL_LM")
            self.model: PeftModel = get_peft_model(base, lora)
        else:
            # The saved adapter's rank and targets win over the recipe: a lineage keeps its shape.
            self.model = PeftModel.from_pretrained(base, adapters.version_dir(self.root, parent),
                                                   is_trainable=True)
        self.model.eval()   # no dropout anywhere; gradients still flow
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # No weight decay: the adapter moves only where the feedback says so.
        self.opt = torch.optim.AdamW(self.params, lr=t.lr, weight_decay=0.0)
        self.parent = parent
        lora_from = f"version {parent:04d}" if parent else "a new adapter"
        self.say(f"{self.model_path.name} + LoRA from {lora_from} ready"
                 f" in {time.perf_counter() - t0:.1f} s")

    def say(self, msg: str) -> None:
        """Progress is the lead's to report; the other ranks would only repeat it."""
        if self.lead:
            log(msg)

    def response_logits(self, context: list[int], response: list[int]) -> torch.Tensor:
        """Logits [T, V] predicting each response token after `context`: one sequence, one forward.

        The last response token is not fed (nothing after it is scored) and only the response
        positions' logits are kept, which spares a (context x vocabulary) tensor."""
        ids = torch.tensor([context + response[:-1]], device=self.device)
        with self.autocast():
            logits = self.model(input_ids=ids, logits_to_keep=len(response), use_cache=False).logits
        return logits[0].float()

    def logprobs(self, context: list[int], response: list[int]) -> torch.Tensor:
        """Logprob of each response token after `context`."""
        return token_logprobs(self.response_logits(context, response), response)

    def teacher_logprobs(self, s: Sample) -> list[float]:
        """The frozen base, shown the hint, scores the served tokens (and, with opd.topk, keeps
        its K most likely tokens per position); stored on the turn once."""
        assert s.hint is not None       # prepare asks only for a hinted turn's teacher
        k = self.cfg.opd.topk
        if (s.teacher_logp is None or (k and s.teacher_topk is None)) and self.remote_teacher:
            context = teacher_prompt(self.tokenizer, s.request, s.hint)
            s.teacher_logp, top = self.remote_teacher(context, s.response_ids, k)
            s.teacher_topk = top if k else None
            self.fresh_teacher.append((s.id, s.teacher_logp, s.teacher_topk))
        elif s.teacher_logp is None or (k and s.teacher_topk is None):
            context = teacher_prompt(self.tokenizer, s.request, s.hint)
            with torch.no_grad(), self.model.disable_adapter():
                logits = self.response_logits(context[-self.cfg.train.max_prompt_tokens:],
                                              s.response_ids)
            s.teacher_logp = token_logprobs(logits, s.response_ids).tolist()
            if k:
                top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
                s.teacher_topk = {"ids": top.indices.tolist(), "logp": top.values.tolist()}
            self.fresh_teacher.append((s.id, s.teacher_logp, s.teacher_topk if k else None))
        return s.teacher_logp

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Abandoned("shutting down")

    def prepare(self, s: Sample) -> dict:
        """Everything that is constant during the update: old/ref logprobs, advantages, weights."""
        t, method = self.cfg.train, self.cfg.method
        # Left truncation: the end of the prompt (latest user message, tool results, the
        # assistant header) is what the response answers; a long OpenClaw system prompt at the
        # front is the part a CPU can least afford and the update can best do without.
        context = s.prompt_ids[-t.max_prompt_tokens:]
        teacher = None
        if s.hint and method.name != "rl":
            teacher = torch.tensor(self.teacher_logprobs(s), device=self.device)
        with torch.no_grad():
            old = self.logprobs(context, s.response_ids)
            ref = None
            if t.kl_coef > 0:
                with self.model.disable_adapter():
                    ref = self.logprobs(context, s.response_ids)
        baseline = self.baseline.value(s.user_id or "") if self.baseline else 0.0
        adv = method_advantages(method.name, s.reward, teacher, old, w_rl=method.w_rl,
                                w_opd=method.w_opd, baseline=baseline, cap=t.opd_cap or None)
        if adv is None:   # cannot happen after select_ready, but never train on nothing
            raise ValueError(f"turn {s.id} has no signal for method {method.name}")
        weights = None
        if s.served_logp is not None:
            weights = truncated_is_weights(old, torch.tensor(s.served_logp, device=self.device),
                                           t.tis_cap)
        topk = None
        if teacher is not None and self.cfg.opd.topk and s.teacher_topk:
            topk = (torch.tensor(s.teacher_topk["ids"], device=self.device),
                    torch.tensor(s.teacher_topk["logp"], device=self.device))
        return {"context": context, "response": s.response_ids, "old": old, "ref": ref,
                "adv": guard_empty(adv, s.empty), "weights": weights, "topk": topk}

    def optimize(self, batch: list[dict], lr: float, n_tokens: int) -> dict:
        """`epochs` PPO epochs, each one optimizer step over the whole batch. One sequence per
        forward (lengths differ; memory stays small), gradients summed with token weights so every
        token of the batch (`n_tokens`, over all ranks; `batch` is this rank's share) counts
        alike."""
        t = self.cfg.train
        for group in self.opt.param_groups:
            group["lr"] = lr
        epochs = []
        for _ in range(t.epochs):
            self.opt.zero_grad(set_to_none=True)
            totals = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0}
            for b in batch:
                if not self.group.active:   # with several ranks, stop only where all agree
                    self.check_stop()
                logits = self.response_logits(b["context"], b["response"])
                new = token_logprobs(logits, b["response"])[None]   # [1, T]
                weights, ref = b["weights"], b["ref"]
                loss, stats = ppo_loss(new, b["old"][None], b["adv"][None], torch.ones_like(new),
                                       t.eps_low, t.eps_high,
                                       is_weights=None if weights is None else weights[None],
                                       ref_logp=None if ref is None else ref[None],
                                       kl_coef=t.kl_coef)
                if b["topk"] is not None:   # reverse KL to the teacher over its top K + a tail
                    ids, logp = b["topk"]
                    loss = loss + self.cfg.method.w_opd * topk_distill_loss(
                        logits[None], ids[None], logp[None], torch.ones_like(new))
                share = len(b["response"]) / n_tokens
                (loss * share).backward()
                for k in totals:
                    totals[k] += stats.get(k, 0.0) * share
            if self.group.any(self.stop.is_set()):
                raise Abandoned("shutting down")
            totals = self.group.sum_grads(self.params, totals)
            norm = torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm or float("inf"))
            totals["grad_norm"] = float(norm)
            self.opt.step()
            epochs.append(totals)
        return {"loss": sum(e["loss"] for e in epochs) / len(epochs),
                "epoch_losses": [e["loss"] for e in epochs],
                "clip_fraction": epochs[-1]["clip_fraction"],   # 0 in the first epoch by design
                "kl": epochs[-1]["kl"] if t.kl_coef > 0 else None,
                "grad_norm": [e["grad_norm"] for e in epochs], "tokens": n_tokens}

    def plan(self) -> tuple[int | None, list[Sample] | None, int]:
        """The lead's choice for the next step, the same on every rank: the version to continue
        from, the batch (None: too few samples) and the number of the version it makes."""
        plan = None
        if self.lead:
            good = adapters.newest_good(self.root)
            settle(self)
            plan = (good, next_batch(self.db, self.cfg.method.name, self.cfg.train.batch_size),
                    (adapters.newest(self.root) or 0) + 1)
        return self.group.broadcast(plan)

    def prepare_batch(self, samples: list[Sample]) -> list[dict] | None:
        """This rank's share of the batch, prepared; None on every rank when any rank cannot
        (shutdown: Abandoned; the serving server down; a turn the model cannot take, skipped)."""
        batch: list[dict] = []
        outcome: Outcome = {"stop": False, "retry": None, "skip": [], "teacher": []}
        self.fresh_teacher = []
        for s in self.group.shard(samples):
            if self.stop.is_set():
                outcome["stop"] = True
                break
            try:
                batch.append(self.prepare(s))
            except TeacherUnavailable as e:   # the serving server is down: not the turn's fault
                outcome["retry"] = str(e)
                break
            except Exception as e:   # a turn the model cannot take (bad ids, too long, ...)
                log(f"turn {s.id} cannot be trained ({type(e).__name__}: {e}); skipped")
                outcome["skip"].append(s.id)
                break
        outcome["teacher"] = self.fresh_teacher
        everyone = self.group.gather(outcome)
        if self.lead:
            self.store(everyone)
        if any(o["stop"] for o in everyone):
            raise Abandoned("shutting down")
        retry = next((o["retry"] for o in everyone if o["retry"]), None)
        if retry:
            self.say(f"{retry}; trying again in a moment")
            return None
        if any(o["skip"] for o in everyone):
            return None   # nothing was updated yet; choose a full batch next time
        return batch

    def store(self, outcomes: list[dict]) -> None:
        """The lead stores what the ranks found: teacher scores (kept so a retried step does not
        compute them again; losing them costs only time) and turns to skip."""
        teacher = [row for o in outcomes for row in o["teacher"]]
        if teacher:
            try:
                store_teacher(self.db, teacher)
            except sqlite3.Error as e:
                log(f"teacher scores not stored ({e}); they are computed again if needed")
        skipped = [i for o in outcomes for i in o["skip"]]
        if skipped:
            mark_skipped(self.db, skipped)

    def step(self) -> int | None:
        """At most one training step: the new version, or None (too few samples, or abandoned)."""
        cfg = self.cfg
        good, samples, version = self.plan()
        if good != self.parent:   # a rollback, a rejection or an abandoned step
            self.say(f"continuing from {f'version {good:04d}' if good else 'the base model'}")
            self.load(good)
        if samples is None:
            return None
        lr = step_lr(cfg, version)
        self.say(f"training step on {len(samples)} samples (turns {[s.id for s in samples]})"
                 f" -> version {version:04d}")
        t0 = time.perf_counter()
        try:
            batch = self.prepare_batch(samples)
            if batch is None:
                return None
            stats = self.optimize(batch, lr, sum(len(s.response_ids) for s in samples))
            rejected = self.group.broadcast(parent_rejected(self.root, self.parent))
            if rejected:
                raise Abandoned(f"parent {self.parent:04d} was rejected during the step")
        except Abandoned as e:
            self.say(f"step abandoned ({e}); nothing written")
            self.parent = -1   # the weights are half-updated: the next step reloads them
            return None
        if not self.lead:   # the lead writes the version; this rank's weights are the same
            self.became(version)
            fold_rewards(self.baseline, samples)
            return version
        meta = version_meta(cfg, samples, stats, lr, t0, self.parent,
                            {"name": cfg.model.name, "source": cfg.model.source,
                             "path": str(self.model_path)})
        # peft types save_pretrained's folder as str; it takes the Path that write_version passes
        commit(self, version, samples, self.model.save_pretrained, meta)  # type: ignore[arg-type]
        log(f"version {version:04d}: {summary(meta)}")
        return version

    def became(self, version: int) -> None:
        self.parent = version   # the weights in memory are this version's

    def close(self) -> None:
        self.db.close()
        self.group.close()
        if self.lead and self.lock:
            self.lock.close()   # lets the next trainer in (the kernel does it on exit anyway)


def make_trainer(cfg: Config, stop: threading.Event | None = None):
    """This module's trainer, or on engine.kind = "tinker" the one that trains on Tinker."""
    if cfg.engine.kind == "tinker":
        from .tinker_trainer import TinkerTrainer
        return TinkerTrainer(cfg, stop)
    return Trainer(cfg, stop)


def run_once(cfg: Config) -> int | None:
    """One training step in a fresh trainer (for tests and one-off use)."""
    trainer = make_trainer(cfg)
    try:
        return trainer.step()
    finally:
        trainer.close()


SCHEDULE_S = 30.0   # how often the trainer asks whether a scheduled consolidation is due


def main_loop(cfg: Config, stop: threading.Event | None = None) -> None:
    """Train whenever enough samples are ready; return when `stop` is set or on SIGTERM/SIGINT.
    A step under way when that happens is abandoned: no partial version is ever written."""
    stop = stop or threading.Event()

    def on_signal(sig, _frame):
        if sig == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt   # a second Ctrl-C: stop now
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    trainer = make_trainer(cfg, stop)
    say = trainer.say
    say(f"watching {cfg.db_path} every {cfg.train.poll_s} s"
        f" (method {cfg.method.name}, batch {cfg.train.batch_size})")
    parent = int(os.environ.get("CLAWRL_PARENT_PID") or 0)
    if parent:
        os.nice(10)   # started by the daemon: serving comes first on a shared CPU
    group = trainer.group
    next_schedule = 0.0
    try:
        while not stop.is_set():
            if parent and daemon_pid(group) != parent:
                say("the daemon that started this trainer is gone; stopping")
                break
            try:
                version = trainer.step()
            except sqlite3.OperationalError as e:   # e.g. locked past busy_timeout: try again
                log(f"turn log busy ({e}); retrying")
                version = None
            if version is None and group.lead and not group.active:
                # No batch: the quiet moment a requested or scheduled consolidation runs in (the
                # schedule is read every SCHEDULE_S, a request at every poll).
                scheduled = time.monotonic() >= next_schedule
                if scheduled:
                    next_schedule = time.monotonic() + SCHEDULE_S
                version = between_steps(cfg, trainer.db, trainer.root, stop, say, scheduled)
            if version is None:
                stop.wait(cfg.train.poll_s)
    finally:
        trainer.close()
    say("stopped")


if __name__ == "__main__":
    main_loop(load_config())
