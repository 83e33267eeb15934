"""The trainer for engine.kind = "tinker": judged turns -> one LoRA step on Tinker -> a remote version.

The same loop as learn/trainer.py (learn/samples.py picks the turns, learn/advantages.py does the
math, adapters/versions.py owns the folder, learn/step.py commits, crash safety is the same), but
the policy lives on Tinker and this process only sends token ids and per-token numbers. One step:

1. teacher: a sampling client of the frozen base model scores the served tokens in the hinted
   context (`compute_logprobs` on the last len(response) positions); stored on the turn once.
2. old logprobs: the policy being updated recomputes them (`TrainingClient.forward`, cross-entropy
   datums), as the embedded trainer does; the logprobs recorded at serving time only correct
   staleness (truncated importance weights).
3. advantages: advantages.method_advantages (rl / opd / combine) on the old logprobs, never
   rewarding an empty answer, times the importance weights, divided by the batch's response tokens
   (Tinker sums token losses; clawrl's PPO loss is a token mean, so every token counts alike).
4. `train.epochs` times: `forward_backward(datums, "ppo", {clip_low_threshold: 1 - eps_low,
   clip_high_threshold: 1 + eps_high})` then `optim_step(AdamParams(...))`. The SDK takes the
   thresholds; Tinker's documentation of `ppo` says the service fixes both at 0.2 for now. Datums follow Tinker's
   next-token alignment: model_input = sequence[:-1], target_tokens = sequence[1:], and
   `logprobs` / `advantages` are 0 on prompt positions.
5. `save_state(name)` (where a later trainer resumes: `create_training_client_from_state_with_
   optimizer`) and `save_weights_for_sampler(name)` (persistent sampler weights), written as
   adapters/NNNN/remote.json; the daemon creates a sampling client from that path.

Why not `save_weights_and_get_sampling_client`: the daemon that serves is another process, and a
version must outlive both processes (a daemon restart serves the active version again, a rollback
goes back to an old one). That method's checkpoint is ephemeral and its sampler belongs to this
process's session; its documented persistent form is exactly save_weights_for_sampler(name) +
create_sampling_client(model_path=...), split here between the trainer and the daemon.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import torch

from ..adapters import versions as adapters
from .advantages import guard_empty, method_advantages, ppo_loss, truncated_is_weights
from ..config import Config, tinker_layers
from ..engines.tinker import (base_model_name, default_rest, default_service, load_tokenizer,
                              require_api_key, resolved, retryable, score)
from ..types import Sample
from .samples import connect, log, mark_skipped, next_batch, store_teacher, take_over
from .teacher import teacher_prompt
from .distributed import Group
from .step import Abandoned, commit, history_baseline, settle, step_lr, summary, version_meta

if TYPE_CHECKING:
    from tinker import TrainingClient

TRAIN_TIMEOUT_S = 3600.0          # one Tinker training call, queueing included
DELETE_TIMEOUT_S = 60.0           # deleting one checkpoint
BACKOFF_START, BACKOFF_MAX = 2.0, 120.0


class TinkerUnavailable(Exception):
    """Tinker failed in a way that may pass (connection, overload, server error)."""


class Untrainable(Exception):
    """Tinker refused these turns for good (too long, bad ids, ...): they are skipped."""

    def __init__(self, ids: list[int], why: Exception):
        super().__init__(f"{type(why).__name__}: {why}")
        self.ids = ids


def sequence(context: list[int], response: list[int]) -> tuple[list[int], list[int]]:
    """Tinker's alignment: position i of model_input predicts target i (the next token)."""
    full = context + response
    return full[:-1], full[1:]


def logprob_datum(context: list[int], response: list[int]):
    """A cross-entropy datum whose forward pass gives the policy's logprob of each token."""
    import tinker
    inputs, targets = sequence(context, response)
    weights = [0.0] * (len(context) - 1) + [1.0] * len(response)
    fields = {"target_tokens": targets, "weights": weights}
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(inputs),
                        loss_fn_inputs=fields)  # type: ignore[arg-type]  # hint: TensorData; it converts lists


def ppo_datum(context: list[int], response: list[int], old: list[float], adv: list[float]):
    """A PPO datum: the response positions carry the old logprobs and the advantages."""
    import tinker
    inputs, targets = sequence(context, response)
    pad = [0.0] * (len(context) - 1)
    fields = {"target_tokens": targets, "logprobs": pad + list(old), "advantages": pad + list(adv)}
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(inputs),
                        loss_fn_inputs=fields)  # type: ignore[arg-type]  # hint: TensorData; it converts lists


def response_logprobs(output: dict, n: int) -> torch.Tensor:
    """The last n entries of a datum's `logprobs` output: those of the response tokens."""
    return torch.tensor(output["logprobs"].tolist()[-n:], dtype=torch.float32)


def forget_checkpoints(refs: list[dict]) -> None:
    """Delete on Tinker the checkpoints of versions pruned here: they fill the account's storage
    and nothing reaches them any more. Best effort: a failure only leaves them there."""
    paths = [ref[k] for ref in refs for k in ("sampler_path", "state_path")
             if isinstance(ref, dict) and ref.get(k)]
    if not paths:
        return
    try:
        rest = default_rest()
        for path in paths:
            rest.delete_checkpoint_from_tinker_path(path).result(DELETE_TIMEOUT_S)
    except Exception as e:
        log(f"old checkpoints not deleted on Tinker ({type(e).__name__}: {e}); they stay there: "
            f"{', '.join(paths)}")
        return
    log(f"deleted {len(paths)} checkpoints of pruned versions on Tinker")


class TinkerTrainer:
    """Holds the Tinker training client (the policy), a base-model sampler (the teacher) and the
    turn-log connection; `step()` is trainer.Trainer.step's contract."""

    def __init__(self, cfg: Config, stop: threading.Event | None = None, service_factory=None):
        require_api_key()
        self.cfg, self.stop = cfg, stop or threading.Event()
        self.root = cfg.adapters_dir
        self.db = connect(cfg.db_path)
        self.lock = take_over(self.db, self.root, self.stop)
        self.base_model = base_model_name(cfg)
        self.service = (service_factory or default_service)()
        self.teacher = resolved(self.service.create_sampling_client(base_model=self.base_model))
        self.tokenizer, _ = load_tokenizer(cfg, self.teacher)
        self.training: TrainingClient | None = None      # the policy: made by load()
        self.parent: int | None = -1      # the version the policy continues (-1: none loaded yet)
        self.lineage: int | None = None   # the same, when its Tinker state could be resumed
        self.retry_at, self.backoff = 0.0, BACKOFF_START
        self.unmarked = False   # a version is on disk whose turns are not marked trained yet
        self.dirty = False      # Tinker's policy has updates that no version holds
        self.baseline = history_baseline(cfg, self.db)
        self.group = Group()      # one process: Tinker holds the policy
        self.say = log

    def load(self, parent: int | None) -> None:
        """The policy: resumed from version `parent`'s Tinker state (weights and optimizer), or a
        fresh LoRA of train.lora_r on the layers train.lora_targets names."""
        t, t0 = self.cfg.train, time.perf_counter()
        ref = None
        if parent:
            path = adapters.version_dir(self.root, parent)
            if adapters.kind(path) == adapters.REMOTE_KIND:
                ref = adapters.read_remote(path)
            if not (ref and ref.get("state_path")):
                log(f"version {parent:04d} has no Tinker training state; starting a new LoRA")
                ref = None
        if ref:
            self.training = resolved(self.service.create_training_client_from_state_with_optimizer(
                ref["state_path"]), TRAIN_TIMEOUT_S)
        else:
            self.training = resolved(self.service.create_lora_training_client(
                base_model=self.base_model, rank=t.lora_r, seed=0, **tinker_layers(t.lora_targets)),
                TRAIN_TIMEOUT_S)
        self.parent, self.lineage = parent, parent if ref else None
        log(f"{self.base_model} + LoRA from {f'version {parent:04d}' if ref else 'a new adapter'} "
            f"ready on Tinker in {time.perf_counter() - t0:.1f} s")

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Abandoned("shutting down")

    def _call(self, what: str, future):
        """The result of one Tinker call; a transient failure becomes TinkerUnavailable."""
        try:
            return future.result(TRAIN_TIMEOUT_S)
        except Exception as e:
            if retryable(e):
                raise TinkerUnavailable(f"Tinker {what} failed: {type(e).__name__}: {e}") from None
            raise

    # -- one step ---------------------------------------------------------------------------------------
    def teacher_logprobs(self, s: Sample) -> list[float]:
        assert s.hint is not None       # prepare asks only for a hinted turn's teacher
        if s.teacher_logp is None:
            context = teacher_prompt(self.tokenizer, s.request, s.hint)
            room = max(1, self.cfg.model.context_length - len(s.response_ids))
            try:
                s.teacher_logp = score(self.teacher, context[-room:], s.response_ids)
            except Exception as e:
                if retryable(e):
                    raise TinkerUnavailable(f"Tinker could not score turn {s.id}: {e}") from None
                raise Untrainable([s.id], e) from None
            store_teacher(self.db, [(s.id, s.teacher_logp, None)])
        return s.teacher_logp

    def prepare(self, samples: list[Sample]) -> list[dict]:
        """Context, response, old logprobs, advantages and importance weights of each sample."""
        t, method = self.cfg.train, self.cfg.method
        items: list[dict] = []
        for s in samples:
            self.check_stop()
            teacher = None
            if s.hint and method.name != "rl":
                teacher = torch.tensor(self.teacher_logprobs(s))
            items.append({"sample": s, "context": s.prompt_ids[-t.max_prompt_tokens:],
                          "response": s.response_ids, "teacher": teacher})
        assert self.training is not None        # _step loads the policy first
        try:
            out = self._call("forward", self.training.forward(
                [logprob_datum(i["context"], i["response"]) for i in items], "cross_entropy"))
        except TinkerUnavailable:
            raise
        except Exception as e:      # which turn it was Tinker does not say: the batch goes
            raise Untrainable([s.id for s in samples], e) from None
        for item, output in zip(items, out.loss_fn_outputs):
            s = item["sample"]
            old = response_logprobs(output, len(s.response_ids))
            baseline = self.baseline.value(s.user_id or "") if self.baseline else 0.0
            adv = method_advantages(method.name, s.reward, item["teacher"], old, w_rl=method.w_rl,
                                    w_opd=method.w_opd, baseline=baseline, cap=t.opd_cap or None)
            if adv is None:   # cannot happen after select_ready, but never train on nothing
                raise ValueError(f"turn {s.id} has no signal for method {method.name}")
            weights = (truncated_is_weights(old, torch.tensor(s.served_logp), t.tis_cap)
                       if s.served_logp is not None else torch.ones_like(old))
            item.update(old=old, adv=guard_empty(adv, s.empty), weights=weights)
        return items

    def optimize(self, items: list[dict], lr: float) -> dict:
        """`epochs` rounds of forward_backward + optim_step over the whole batch."""
        import tinker
        t = self.cfg.train
        n_tokens = sum(len(i["response"]) for i in items)
        # Tinker's PPO loss sums over tokens; advantages / n_tokens make it clawrl's token mean.
        # The importance weights are constants >= 0, so they scale the advantages exactly.
        datums = [ppo_datum(i["context"], i["response"], i["old"].tolist(),
                            (i["adv"] * i["weights"] / n_tokens).tolist()) for i in items]
        clip = {"clip_low_threshold": 1.0 - t.eps_low, "clip_high_threshold": 1.0 + t.eps_high}
        adam = tinker.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.999, eps=1e-8,
                                 weight_decay=0.0, grad_clip_norm=t.max_grad_norm)
        old = torch.cat([i["old"] for i in items])[None]
        adv = torch.cat([i["adv"] for i in items])[None]
        weights = torch.cat([i["weights"] for i in items])[None]
        epochs = []
        assert self.training is not None        # _step loads the policy first
        for _ in range(t.epochs):
            self.check_stop()
            self.dirty = True
            backward = self.training.forward_backward(datums, "ppo", clip)
            step = self.training.optim_step(adam)        # queued behind it, as Tinker intends
            out = self._call("forward_backward", backward)
            self._call("optim_step", step)
            # The loss as clawrl defines it, from the logprobs this pass computed (pre-update).
            new = torch.cat([response_logprobs(o, len(i["response"]))
                             for o, i in zip(out.loss_fn_outputs, items)])[None]
            _, stats = ppo_loss(new, old, adv, torch.ones_like(new), t.eps_low, t.eps_high,
                                is_weights=weights)
            epochs.append(stats)
        return {"loss": sum(e["loss"] for e in epochs) / len(epochs),
                "epoch_losses": [e["loss"] for e in epochs],
                "clip_fraction": epochs[-1]["clip_fraction"], "kl": None, "tokens": n_tokens,
                "tinker": {"loss_fn": "ppo", **clip}}

    def save(self, version: int) -> dict:
        """Tinker's training state and sampler weights for `version`: the pointer it is stored as."""
        name = f"clawrl-{version:04d}-{uuid.uuid4().hex[:6]}"
        assert self.training is not None        # _step loads the policy first
        state = self.training.save_state(name)
        sampler = self.training.save_weights_for_sampler(name)
        return {"service": "tinker", "base_model": self.base_model,
                "sampler_path": self._call("save_weights_for_sampler", sampler).path,
                "state_path": self._call("save_state", state).path,
                "training_run": str(getattr(self.training, "model_id", ""))}

    def step(self) -> int | None:
        """At most one training step: the new version, or None (too few samples, abandoned, or
        Tinker unavailable: then the next try waits, doubling up to BACKOFF_MAX)."""
        if time.monotonic() < self.retry_at:
            return None
        try:
            version = self._step()
        except Exception as e:
            if not (isinstance(e, TinkerUnavailable) or retryable(e)):
                raise
            self.retry_at = time.monotonic() + self.backoff
            log(f"{e}; trying again in {self.backoff:.0f} s")
            self.backoff = min(BACKOFF_MAX, self.backoff * 2)
            if self.dirty:            # an optimizer step may have landed: reload before the next
                self.parent, self.dirty = -1, False
            return None
        self.backoff = BACKOFF_START
        return version

    def _step(self) -> int | None:
        cfg = self.cfg
        settle(self)
        samples = next_batch(self.db, cfg.method.name, cfg.train.batch_size)
        if samples is None:
            return None
        # Only now (a training client on Tinker holds resources): the first step, or after a
        # rollback, a rejection or an abandoned step.
        good = adapters.newest_good(self.root)
        if good != self.parent:
            self.load(good)
        version = (adapters.newest(self.root) or 0) + 1
        lr = step_lr(cfg, version)
        log(f"training step on Tinker, {len(samples)} samples (turns {[s.id for s in samples]})"
            f" -> version {version:04d}")
        t0 = time.perf_counter()
        try:
            try:
                items = self.prepare(samples)
            except Untrainable as e:   # nothing was updated yet; choose a full batch next time
                log(f"turns {e.ids} cannot be trained on Tinker ({e}); skipped")
                mark_skipped(self.db, e.ids)
                return None
            stats = self.optimize(items, lr)
            self.check_stop()
            ref = self.save(version)
            if self.lineage and adapters.rejection(self.root, self.lineage):
                raise Abandoned(f"parent {self.lineage:04d} was rejected during the step")
        except Abandoned as e:
            log(f"step abandoned ({e}); nothing written")
            if self.dirty:     # Tinker's weights may be half-updated: reload before the next step
                self.parent, self.dirty = -1, False
            return None
        meta = version_meta(cfg, samples, stats, lr, t0, self.lineage,
                            {"name": cfg.model.name, "tinker": self.base_model,
                             "source": cfg.model.source})
        forget_checkpoints(commit(self, version, samples, adapters.save_remote(ref), meta))
        log(f"version {version:04d} on Tinker: {summary(meta)} ({ref['sampler_path']})")
        return version

    def became(self, version: int) -> None:
        self.parent = self.lineage = version          # Tinker's policy is this version now
        self.dirty = False

    def close(self) -> None:
        self.db.close()
        self.lock.close()
        close = getattr(self.service, "close", None)
        if close is not None:
            try:
                close("success").result(10)
            except Exception as e:
                log(f"closing the Tinker session: {e}")
