"""Unit tests for clawrl.advantages against hand-computed values (the arithmetic is in comments)."""
from __future__ import annotations

import math

import pytest
import torch

from clawrl.learn.advantages import (RunningBaseline, combine_advantages, guard_empty,
                                     method_advantages, opd_advantages, ppo_loss, rl_advantages,
                                     topk_distill_loss, truncated_is_weights)

F64 = torch.float64
LN = math.log


def t(*values, dtype=F64, grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


def rows(*rows_, dtype=F64, grad=False):
    return torch.tensor(rows_, dtype=dtype, requires_grad=grad)


def close(actual: torch.Tensor, expected, tol=1e-12):
    assert actual.tolist() == pytest.approx(expected, abs=tol)


# --- advantages ------------------------------------------------------------------------------

def test_rl_advantages_reward_minus_baseline_on_every_token():
    adv = rl_advantages(1.0, 4, baseline=0.25)
    assert adv.dtype == torch.float32 and adv.shape == (4,)
    close(adv, [0.75] * 4)                                   # 1 - 0.25
    close(rl_advantages(-1.0, 2), [-1.0, -1.0])              # -1 - 0
    assert rl_advantages(1.0, 0).shape == (0,)


# teacher - old = [-1-(-2), -0.5-(-0.5), -9-(-1), -0.1-(-5)] = [1, 0, -8, 4.9]
TEACHER = t(-1.0, -0.5, -9.0, -0.1)
OLD = t(-2.0, -0.5, -1.0, -5.0)


def test_opd_advantages_difference_and_cap():
    close(opd_advantages(TEACHER, OLD, cap=None), [1.0, 0.0, -8.0, 4.9])
    close(opd_advantages(TEACHER, OLD), [1.0, 0.0, -3.0, 3.0])            # clamp to [-3, 3]
    close(opd_advantages(TEACHER, OLD, cap=0.5), [0.5, 0.0, -0.5, 0.5])   # clamp to [-0.5, 0.5]


def test_opd_advantages_carry_no_gradient_and_refuse_mismatched_shapes():
    old = OLD.clone().requires_grad_(True)
    assert not opd_advantages(TEACHER, old).requires_grad
    with pytest.raises(ValueError, match="shape"):
        opd_advantages(TEACHER[:3], OLD)


def test_combine_weights_both_parts():
    # 0.5 * [1, 0, -3, 3] + 2 * (1 - 0.25) = [0.5+1.5, 0+1.5, -1.5+1.5, 1.5+1.5]
    adv = combine_advantages(1.0, TEACHER, OLD, w_rl=2.0, w_opd=0.5, baseline=0.25)
    close(adv, [2.0, 1.5, 0.0, 3.0])
    # default weights 1, cap 3: [1, 0, -3, 3] + (-1) = [0, -1, -4, 2]
    close(combine_advantages(-1.0, TEACHER, OLD), [0.0, -1.0, -4.0, 2.0])


def test_combine_missing_parts_contribute_zero():
    # reward only: 2 * (1 - 0.25) = 1.5 everywhere
    close(combine_advantages(1.0, None, OLD, w_rl=2.0, w_opd=0.5, baseline=0.25), [1.5] * 4)
    # hint only: 0.5 * [1, 0, -3, 3]
    close(combine_advantages(None, TEACHER, OLD, w_rl=2.0, w_opd=0.5), [0.5, 0.0, -1.5, 1.5])
    close(combine_advantages(None, None, OLD), [0.0] * 4)


def test_method_advantages_values():
    close(method_advantages("rl", -1.0, TEACHER, OLD, baseline=0.5), [-1.5] * 4)   # -1 - 0.5
    close(method_advantages("opd", 1.0, TEACHER, OLD, cap=None), [1.0, 0.0, -8.0, 4.9])
    close(method_advantages("combine", 1.0, TEACHER, OLD), [2.0, 1.0, -2.0, 4.0])  # [1,0,-3,3]+1
    # combine with a reward of 0 ("unclear") trains on the hint alone: the baseline is not applied
    close(method_advantages("combine", 0, TEACHER, OLD, baseline=0.5), [1.0, 0.0, -3.0, 3.0])
    # a reward that equals the baseline is still a signal: zeros, not None
    close(method_advantages("rl", 1.0, None, OLD, baseline=1.0), [0.0] * 4)


def test_method_advantages_none_when_no_signal():
    assert method_advantages("rl", None, TEACHER, OLD) is None
    assert method_advantages("rl", 0, TEACHER, OLD) is None
    assert method_advantages("rl", 0.0, TEACHER, OLD, baseline=0.5) is None
    assert method_advantages("opd", 1.0, None, OLD) is None
    assert method_advantages("combine", None, None, OLD) is None
    assert method_advantages("combine", 0, None, OLD) is None


def test_method_advantages_rejects_unknown_method_and_arguments():
    with pytest.raises(ValueError, match="rl, opd, combine"):
        method_advantages("grpo", 1.0, None, OLD)
    with pytest.raises(TypeError, match="kl_coef"):
        method_advantages("rl", 1.0, None, OLD, kl_coef=0.1)


def test_guard_empty_zeroes_positive_advantages_only():
    adv = t(0.5, -1.0, 0.0, 2.0)
    close(guard_empty(adv, True), [0.0, -1.0, 0.0, 0.0])
    close(guard_empty(adv, False), [0.5, -1.0, 0.0, 2.0])
    close(adv, [0.5, -1.0, 0.0, 2.0])                        # input untouched


def test_running_baseline_ema_per_key():
    b = RunningBaseline(decay=0.9)
    assert b.value("alice") == 0.0
    b.update("alice", 1.0)
    assert b.value("alice") == pytest.approx(1.0)            # first update: the reward itself
    b.update("alice", -1.0)
    assert b.value("alice") == pytest.approx(0.8)            # 0.9*1 + 0.1*(-1)
    b.update("alice", -1.0)
    assert b.value("alice") == pytest.approx(0.62)           # 0.9*0.8 + 0.1*(-1) = 0.72 - 0.1
    b.update("bob", -1.0)
    assert b.value("bob") == pytest.approx(-1.0)
    assert b.value("alice") == pytest.approx(0.62)           # bob's reward left alice alone
    with pytest.raises(ValueError):
        RunningBaseline(decay=1.5)


def test_truncated_is_weights_values_cap_and_no_gradient():
    # exp(ln .3 - ln .6) = 0.5; exp(ln .9 - ln .3) = 3 -> cap 2; equal -> 1
    old = t(LN(0.3), LN(0.9), -1.0, grad=True)
    served = t(LN(0.6), LN(0.3), -1.0, grad=True)
    w = truncated_is_weights(old, served)
    close(w, [0.5, 2.0, 1.0])
    assert not w.requires_grad and w.grad_fn is None
    close(truncated_is_weights(old, served, cap=5.0), [0.5, 3.0, 1.0])


# --- ppo_loss --------------------------------------------------------------------------------

def test_ppo_ratio_one_gives_minus_mean_advantage():
    old = rows([-1.0, -2.0, -0.5])
    adv = rows([1.0, -2.0, 3.0])
    loss, stats = ppo_loss(old.clone(), old, adv, torch.ones_like(old))
    assert loss.item() == pytest.approx(-2 / 3)              # -(1 - 2 + 3) / 3
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["adv_mean"] == pytest.approx(2 / 3)
    assert stats["clip_fraction"] == 0.0
    assert "kl" not in stats


def test_ppo_positive_advantage_above_one_plus_eps_high_is_clipped_without_gradient():
    # token 0: A=+1, ratio 1.5 > 1.28 -> -min(1.5, 1.28) = -1.28, no gradient
    # token 1: A=+2, ratio 1    -> -2, d/dnew = -ratio*A/N = -2/2 = -1
    old = rows([-1.0, -1.0])
    new = (old + rows([LN(1.5), 0.0])).detach().requires_grad_(True)
    loss, stats = ppo_loss(new, old, rows([1.0, 2.0]), torch.ones_like(old))
    assert loss.item() == pytest.approx((-1.28 - 2.0) / 2)   # -1.64
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-1.0)


def test_ppo_negative_advantage_below_one_minus_eps_low_is_clipped_without_gradient():
    # token 0: A=-1, ratio 0.5 < 0.8 -> -min(-0.5, -0.8) = 0.8, no gradient
    # token 1: A=-1, ratio 1 -> 1, d/dnew = -ratio*A/N = 1/2
    old = rows([-1.0, -1.0])
    new = (old + rows([LN(0.5), 0.0])).detach().requires_grad_(True)
    loss, stats = ppo_loss(new, old, rows([-1.0, -1.0]), torch.ones_like(old))
    assert loss.item() == pytest.approx((0.8 + 1.0) / 2)     # 0.9
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(0.5)


def test_ppo_asymmetric_clip():
    # A=+1 at ratio 1.25: 1.25 < 1.28, unclipped -> -1.25 (with gradient)
    # A=-1 at ratio 0.75: 0.75 < 0.8, clipped -> -min(-0.75, -0.8) = 0.8
    old = rows([-1.0, -1.0])
    new = (old + rows([LN(1.25), LN(0.75)])).detach().requires_grad_(True)
    adv, mask = rows([1.0, -1.0]), torch.ones_like(old)
    loss, stats = ppo_loss(new, old, adv, mask)
    assert loss.item() == pytest.approx((-1.25 + 0.8) / 2, abs=1e-12)   # -0.225
    assert stats["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0, 0].item() == pytest.approx(-1.25 / 2)            # -ratio*A/N
    assert new.grad[0, 1].item() == 0.0
    # a symmetric 0.2 clip would have clipped the first token too: (-1.2 + 0.8) / 2 = -0.2
    sym, sym_stats = ppo_loss(new, old, adv, mask, eps_high=0.2)
    assert sym.item() == pytest.approx(-0.2, abs=1e-12)
    assert sym_stats["clip_fraction"] == pytest.approx(1.0)


def test_ppo_masked_tokens_contribute_nothing_and_mean_is_over_batch_tokens():
    # row 0: one response token (A=+1); row 1: three (A=-1 each); ratio 1 everywhere
    # token mean over the batch: -(1 - 3) / 4 = 0.5 (a per-sample mean would give 0)
    old = rows([-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0])
    mask = rows([1, 0, 0, 0], [1, 1, 1, 0])
    adv = rows([1.0, 5.0, 5.0, 5.0], [-1.0, -1.0, -1.0, 7.0])
    loss, stats = ppo_loss(old.clone(), old, adv, mask)
    assert loss.item() == pytest.approx(0.5)
    assert stats["adv_mean"] == pytest.approx(-0.5)          # (1 - 3) / 4
    junk = mask == 0
    new2 = torch.where(junk, torch.full_like(old, 3.0), old)
    adv2 = torch.where(junk, torch.full_like(adv, -100.0), adv)
    loss2, stats2 = ppo_loss(new2, old, adv2, mask)
    assert loss2.item() == loss.item()
    assert stats2 == stats


def test_ppo_all_masked_gives_zero_not_nan():
    old = rows([-1.0, -2.0])
    loss, stats = ppo_loss(old.clone(), old, rows([1.0, 1.0]), torch.zeros_like(old))
    assert loss.item() == 0.0 and stats["clip_fraction"] == 0.0


def test_ppo_is_weights_scale_per_token_terms():
    # ratio 1, A = [1, 2], w = [0.5, 2] -> per token [-0.5, -4]; mean -2.25
    old = rows([-1.0, -1.0])
    new = old.clone().requires_grad_(True)
    loss, _ = ppo_loss(new, old, rows([1.0, 2.0]), torch.ones_like(old), is_weights=rows([0.5, 2.0]))
    assert loss.item() == pytest.approx(-2.25)
    loss.backward()
    close(new.grad[0], [-0.25, -2.0])                           # -w*ratio*A/N = [-0.5/2, -4/2]


def test_ppo_kl_term_k3_times_coef():
    # A = 0, ratio 1; token 0: ref - new = ln 2 -> k3 = 2 - ln 2 - 1 = 1 - ln 2; token 1: 0
    old = rows([-1.0, -1.0])
    ref = old + rows([LN(2.0), 0.0])
    adv, mask = rows([0.0, 0.0]), torch.ones_like(old)
    loss, stats = ppo_loss(old.clone(), old, adv, mask, ref_logp=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (1 - LN(2.0)) / 2, abs=1e-12)
    assert stats["kl"] == pytest.approx((1 - LN(2.0)) / 2, abs=1e-12)
    off, off_stats = ppo_loss(old.clone(), old, adv, mask, ref_logp=ref)   # kl_coef 0: reported only
    assert off.item() == 0.0
    assert off_stats["kl"] == pytest.approx((1 - LN(2.0)) / 2, abs=1e-12)


def test_ppo_clip_fraction_and_stats_on_constructed_case():
    # (A, ratio): (+1, 1.5) clipped: -1.28 | (-1, 0.5) clipped: +0.8
    #             (+1, 0.5) unclipped (0.5 < 0.8): -0.5 | (-1, 1.5) unclipped (-1.5 < -1.28): +1.5
    #             fifth token masked out, though it would be clipped
    old = rows([-1.0] * 5)
    new = old + rows([LN(1.5), LN(0.5), LN(0.5), LN(1.5), LN(3.0)])
    adv = rows([1.0, -1.0, 1.0, -1.0, 1.0])
    mask = rows([1, 1, 1, 1, 0])
    loss, stats = ppo_loss(new, old, adv, mask)
    assert stats["clip_fraction"] == pytest.approx(0.5)      # 2 of 4
    assert stats["ratio_mean"] == pytest.approx(1.0)         # (1.5 + 0.5 + 0.5 + 1.5) / 4
    assert stats["adv_mean"] == pytest.approx(0.0)
    assert stats["loss"] == pytest.approx((-1.28 + 0.8 - 0.5 + 1.5) / 4)   # 0.13
    assert loss.item() == stats["loss"]
    assert all(isinstance(v, float) for v in stats.values())


# --- topk_distill_loss -----------------------------------------------------------------------

# Teacher at one position: top-2 ids [1, 3] with p = 0.5, 0.2; tail 0.3.
T_IDS = torch.tensor([[[1, 3]]])
T_LOGP = t(LN(0.5), LN(0.2)).reshape(1, 1, 2)


def logits_for(probs):
    return torch.tensor([[[LN(p) for p in probs]]], dtype=F64)


def test_topk_distill_zero_when_bins_match():
    # student: p[1] = 0.5, p[3] = 0.2, the rest 0.3 spread unevenly: bins agree -> KL 0
    student = logits_for([0.05, 0.5, 0.15, 0.2, 0.04, 0.06])
    loss = topk_distill_loss(student, T_IDS, T_LOGP, torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


def test_topk_distill_value_when_bins_differ():
    # student bins: 0.25, 0.25, tail 0.5; teacher: 0.5, 0.2, tail 0.3
    # KL = .25 ln(.25/.5) + .25 ln(.25/.2) + .5 ln(.5/.3) = -0.17329 + 0.05579 + 0.25541 = 0.13791
    student = logits_for([0.1, 0.25, 0.2, 0.25, 0.1, 0.1])
    expected = 0.25 * LN(0.25 / 0.5) + 0.25 * LN(0.25 / 0.2) + 0.5 * LN(0.5 / 0.3)
    loss = topk_distill_loss(student, T_IDS, T_LOGP, torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(0.13791, abs=1e-5)


def test_topk_distill_teacher_tail_floor():
    # teacher top-2 holds all mass (0.5 + 0.5): tail floored at 1e-8, student tail 0.5
    # KL = .25 ln(.25/.5) * 2 + .5 ln(.5 / 1e-8)
    student = logits_for([0.1, 0.25, 0.2, 0.25, 0.1, 0.1])
    t_logp = t(LN(0.5), LN(0.5)).reshape(1, 1, 2)
    expected = 2 * 0.25 * LN(0.5) + 0.5 * LN(0.5 / 1e-8)
    loss = topk_distill_loss(student, T_IDS, t_logp, torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_topk_distill_mask_and_gradient():
    # position 0 matches the teacher (KL 0), position 1 is the differing case, position 2 masked
    matching = [0.05, 0.5, 0.15, 0.2, 0.04, 0.06]
    differing = [0.1, 0.25, 0.2, 0.25, 0.1, 0.1]
    logits = torch.tensor([[[LN(p) for p in matching], [LN(p) for p in differing],
                            [LN(p) for p in differing]]], dtype=F64, requires_grad=True)
    ids = T_IDS.expand(1, 3, 2)
    logp = T_LOGP.expand(1, 3, 2)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    kl_differing = 0.25 * LN(0.25 / 0.5) + 0.25 * LN(0.25 / 0.2) + 0.5 * LN(0.5 / 0.3)
    loss = topk_distill_loss(logits, ids, logp, mask)
    assert loss.item() == pytest.approx(kl_differing / 2, abs=1e-12)   # (0 + KL) / 2 masked
    loss.backward()
    grad = logits.grad[0]
    assert grad[1].abs().sum().item() > 1e-3                 # flows where the bins differ
    assert grad[2].abs().sum().item() == 0.0                 # nothing from the masked position
    assert grad[0].abs().max().item() == pytest.approx(0.0, abs=1e-12)  # minimum: zero gradient
    # changing the masked position changes nothing
    other = logits.detach().clone()
    other[0, 2] = torch.tensor([5.0, -3.0, 0.0, 2.0, 1.0, -1.0], dtype=F64)
    assert topk_distill_loss(other, ids, logp, mask).item() == loss.item()
    # and a gradient step lowers the loss
    stepped = (logits - 1.0 * logits.grad).detach()
    assert topk_distill_loss(stepped, ids, logp, mask).item() < loss.item()
