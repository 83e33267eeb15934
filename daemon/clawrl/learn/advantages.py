"""Per-token advantages and the losses that consume them (README, "How it learns").

This module owns the math only: small pure functions on torch tensors. It does not load models,
read the turn log or pick samples; the trainer does that and calls these.

Conventions: a 1-D tensor runs over the response tokens of ONE sample; the losses take 2-D
`[batch, T]` tensors with a `mask` of the same shape (1 = response token, 0 = prompt or padding).
Logprobs are natural-log probabilities. Advantages, old logprobs, importance weights and teacher
scores are constants of the update: the functions here detach them.
"""
from __future__ import annotations

import torch

METHODS = ("rl", "opd", "combine")
_METHOD_KWARGS = ("w_rl", "w_opd", "baseline", "cap")
_TAIL_FLOOR = 1e-8


def rl_advantages(reward: float, n_tokens: int, baseline: float = 0.0) -> torch.Tensor:
    """Binary-RL advantage: A_t = reward - baseline on every one of the `n_tokens` tokens (float32).

    One sample per prompt means there is no group baseline; `baseline` is where a running mean
    (see `RunningBaseline`) comes in, so an all-fail stretch is not pure "push down".
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return torch.full((n_tokens,), float(reward) - float(baseline), dtype=torch.float32)


def opd_advantages(teacher_logp: torch.Tensor, old_logp: torch.Tensor,
                   cap: float | None = 3.0) -> torch.Tensor:
    """On-policy distillation advantage: A_t = clamp(teacher_logp_t - old_logp_t, -cap, cap).

    No clamp when `cap` is None. The cap exists because one token the teacher finds very unlikely
    (an advantage of about -18 on an immediate end-of-sequence was measured) can dominate a whole
    batch's gradient. Keeps the inputs' dtype; the result carries no gradient.
    """
    _check_same_shape(teacher_logp=teacher_logp, old_logp=old_logp)
    adv = (teacher_logp - old_logp).detach()
    if cap is not None:
        if cap <= 0:
            raise ValueError(f"cap must be > 0 or None, got {cap}")
        adv = adv.clamp(-cap, cap)
    return adv


def combine_advantages(reward: float | None, teacher_logp: torch.Tensor | None,
                       old_logp: torch.Tensor, w_rl: float = 1.0, w_opd: float = 1.0,
                       baseline: float = 0.0, cap: float | None = 3.0) -> torch.Tensor:
    """Combined advantage: A_t = w_opd * clamp(teacher_t - old_t, ±cap) + w_rl * (reward - baseline).

    A missing part (reward None, teacher_logp None) contributes 0, so a turn with only a reward or
    only a hint still trains on that part; with neither the result is all zeros. The result has
    `old_logp`'s shape, dtype and device and carries no gradient.
    """
    adv = torch.zeros_like(old_logp).detach()
    if teacher_logp is not None:
        adv = adv + w_opd * opd_advantages(teacher_logp, old_logp, cap).to(adv.dtype)
    if reward is not None:
        adv = adv + w_rl * (float(reward) - float(baseline))
    return adv


def method_advantages(method: str, reward, teacher_logp, old_logp, **kw) -> torch.Tensor | None:
    """Advantages for one sample under `method` (rl | opd | combine), or None if it has no signal.

    - rl: None when reward is None or reward == 0 (the judge's "unclear" is no signal); else
      A_t = reward - baseline. A reward that equals the baseline still trains (all zeros).
    - opd: None when teacher_logp is None; else the capped teacher - old difference.
    - combine: a reward of 0 counts as missing, as in rl; None when both parts are missing.

    `kw` may hold w_rl, w_opd, baseline, cap; each method uses those that apply to it, so the
    trainer can pass the same settings whatever the method.
    """
    unknown = sorted(set(kw) - set(_METHOD_KWARGS))
    if unknown:
        raise TypeError(f"unknown argument(s) {unknown}; accepted: {list(_METHOD_KWARGS)}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    has_reward = reward is not None and reward != 0
    if method == "rl":
        if not has_reward:
            return None
        adv = rl_advantages(reward, old_logp.numel(), kw.get("baseline", 0.0))
        return adv.reshape(old_logp.shape).to(old_logp.device)
    if method == "opd":
        if teacher_logp is None:
            return None
        return opd_advantages(teacher_logp, old_logp, kw.get("cap", 3.0))
    if not has_reward and teacher_logp is None:
        return None
    return combine_advantages(reward if has_reward else None, teacher_logp, old_logp, **kw)


def guard_empty(advantages: torch.Tensor, response_is_empty: bool) -> torch.Tensor:
    """Never reward an empty answer: if the response has no visible text, A_t <- min(A_t, 0).

    Negative advantages stay, so an empty answer can still be pushed down. (Pure OPD once drove
    40 % of answers empty by rewarding an early end-of-sequence.) Returns a new tensor.
    """
    return advantages.clamp(max=0.0) if response_is_empty else advantages.clone()


class RunningBaseline:
    """Per-key (e.g. per user) exponential moving average of rewards.

    The first reward for a key sets b = r; each later one sets b <- decay * b + (1 - decay) * r.
    An unseen key has baseline 0.0.
    """

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        self.decay = decay
        self._values: dict = {}

    def value(self, key) -> float:
        """The current baseline for `key` (0.0 if it has never been updated)."""
        return self._values.get(key, 0.0)

    def update(self, key, reward: float) -> None:
        """Fold `reward` into the moving average for `key`."""
        reward = float(reward)
        if key not in self._values:
            self._values[key] = reward
        else:
            self._values[key] = self.decay * self._values[key] + (1.0 - self.decay) * reward


def truncated_is_weights(old_logp: torch.Tensor, served_logp: torch.Tensor,
                         cap: float = 2.0) -> torch.Tensor:
    """Staleness correction: w_t = min(exp(old_logp_t - served_logp_t), cap), detached.

    `served_logp` was recorded when the turn was served (possibly by an older adapter);
    `old_logp` is the trainer's recomputation under the policy being updated. The ratio
    pi_old / pi_served corrects old data instead of ignoring it; the cap bounds its variance.
    """
    _check_same_shape(old_logp=old_logp, served_logp=served_logp)
    return torch.exp(old_logp - served_logp).clamp(max=cap).detach()


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28,
             is_weights: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
             kl_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate with asymmetric clip, token-mean over the batch.

    All tensors are [batch, T]. With r_t = exp(new_t - old_t):
        l_t = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)   (* w_t if is_weights)
            + kl_coef * (exp(ref_t - new_t) - (ref_t - new_t) - 1)           (k3 KL, if ref_logp)
        loss = sum_t mask_t * l_t / sum_t mask_t
    Dividing by the batch's token count (not per sample) weights every token alike. The larger
    eps_high lets a good token's probability rise further than a bad one's may fall.

    Stats (python floats): loss, clip_fraction (share of masked tokens where the clipped term was
    strictly smaller, so it was picked and carries no gradient), ratio_mean, adv_mean, and kl
    (masked mean of the k3 estimate) when ref_logp is given.
    """
    _check_same_shape(new_logp=new_logp, old_logp=old_logp, advantages=advantages, mask=mask)
    on = mask.bool()
    n = on.sum().clamp(min=1).to(new_logp.dtype)
    old_logp, advantages = old_logp.detach(), advantages.detach().to(new_logp.dtype)

    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    took_clip = clipped < unclipped
    per_token = -torch.where(took_clip, clipped, unclipped)
    if is_weights is not None:
        _check_same_shape(new_logp=new_logp, is_weights=is_weights)
        per_token = per_token * is_weights.detach().to(new_logp.dtype)
    kl = None
    if ref_logp is not None:
        _check_same_shape(new_logp=new_logp, ref_logp=ref_logp)
        d = ref_logp.detach() - new_logp
        kl = torch.exp(d) - d - 1.0
        per_token = per_token + kl_coef * kl

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        # where, not multiply: a NaN or inf at a padded position must not leak into the sum
        return torch.where(on, x, torch.zeros_like(x)).sum() / n

    loss = masked_mean(per_token)
    stats = {
        "loss": loss.item(),
        "clip_fraction": masked_mean(took_clip.to(new_logp.dtype)).item(),
        "ratio_mean": masked_mean(ratio.detach()).item(),
        "adv_mean": masked_mean(advantages).item(),
    }
    if kl is not None:
        stats["kl"] = masked_mean(kl.detach()).item()
    return loss, stats


def topk_distill_loss(student_logits: torch.Tensor, teacher_topk_ids: torch.Tensor,
                      teacher_topk_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Reverse KL to the teacher over its top-K tokens plus one tail bin, token-mean over `mask`.

    Shapes: student_logits [B, T, V], teacher_topk_ids / teacher_topk_logp [B, T, K], mask [B, T].
    At each position, with s = softmax(student_logits) and S the teacher's K ids:
        s_k = s[id_k],  s_tail = 1 - sum_k s_k;   t_k = exp(teacher_logp_k),  t_tail = 1 - sum_k t_k
        KL = sum_k s_k (log s_k - log t_k) + s_tail (log s_tail - log t_tail)
    Both tails are floored at 1e-8: the teacher's because a top-K holding (numerically) all mass
    would give log 0; the student's because 0 * log 0 has an infinite gradient.
    loss = sum over masked positions of KL / number of masked positions.
    """
    if student_logits.shape[:-1] != mask.shape:
        raise ValueError(f"student_logits {tuple(student_logits.shape)} does not match "
                         f"mask {tuple(mask.shape)} in its first two dimensions")
    _check_same_shape(teacher_topk_ids=teacher_topk_ids, teacher_topk_logp=teacher_topk_logp)
    student_logp = torch.log_softmax(student_logits, dim=-1)
    s_logp = student_logp.gather(-1, teacher_topk_ids.long())
    s_tail = (1.0 - s_logp.exp().sum(-1)).clamp(min=_TAIL_FLOOR)
    t_logp = teacher_topk_logp.detach().to(s_logp.dtype)
    t_tail = (1.0 - t_logp.exp().sum(-1)).clamp(min=_TAIL_FLOOR)

    kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1) + s_tail * (s_tail.log() - t_tail.log())
    on = mask.bool()
    n = on.sum().clamp(min=1).to(kl.dtype)
    return torch.where(on, kl, torch.zeros_like(kl)).sum() / n


def _check_same_shape(**tensors: torch.Tensor) -> None:
    """Refuse silent broadcasting: every named tensor must have the first one's shape."""
    (first, ref), *rest = tensors.items()
    for name, t in rest:
        if t.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {first} has "
                             f"{tuple(ref.shape)}; they must match token for token")
