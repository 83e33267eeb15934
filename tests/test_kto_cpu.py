"""learn/kto_cpu.py against the real thing: its LM head gives what TRL's fused LM head gives (TRL
1.16's own `add_fused_lm_head`, on a tiny random Llama), with the same gradients; the frozen
base's bfloat16 products stay close to float32 in value and in the gradient they pass down, and
keep the weight out of the state dict and the optimizer."""
from __future__ import annotations

import pytest
import torch

from clawrl.bf16 import Products, products_in
from clawrl.learn import kto_cpu

trl_utils = pytest.importorskip("trl.trainer.utils", reason="trl is a dependency: `make setup` installs it")


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).float()


def batch():
    """Three rows, left-padded as TRL's KTO collator pads them; the prompt and the padding carry
    no label."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (3, 12), generator=g)
    attention = torch.ones_like(ids)
    attention[0, :4] = 0
    attention[1, :2] = 0
    labels = ids.clone()
    labels[attention == 0] = -100
    labels[:, :7] = -100           # the prompt
    labels[2, 7:] = -100           # a row whose answer is cut to its last token
    labels[2, 11] = ids[2, 11]
    return {"input_ids": ids, "attention_mask": attention}, labels


def run(model, inputs, labels):
    model.zero_grad()
    out = model(**inputs, labels=labels, fused_lm_head=True)
    (out.log_probs.sum() * 0.5 + out.loss).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_the_answer_head_gives_what_trls_fused_head_gives():
    inputs, labels = batch()
    theirs, ours = tiny_llama(), tiny_llama()
    trl_utils.add_fused_lm_head(theirs, outputs=("log_probs", "entropy", "mean_logits"))
    trl_utils.add_fused_lm_head(ours, outputs=("log_probs", "entropy", "mean_logits"))
    assert kto_cpu.answer_lm_head(ours)
    want, want_grads = run(theirs, inputs, labels)
    got, got_grads = run(ours, inputs, labels)
    assert torch.equal(got.label_mask, want.label_mask) and got.label_mask.sum() == 11
    for field in ("log_probs", "entropy", "mean_logits", "loss"):
        torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=1e-5, atol=1e-5)
    assert set(got_grads) == set(want_grads)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-6)
    # Without fused_lm_head the model's own forward (generation) is untouched.
    plain = ours(**inputs).logits
    torch.testing.assert_close(plain, theirs(**inputs).logits)


def test_a_model_with_scaled_logits_keeps_trls_head():
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0
    trl_utils.add_fused_lm_head(model)
    before = model.forward
    assert kto_cpu.answer_lm_head(model) is False and model.forward == before


def test_bfloat16_products_stay_close_and_pass_the_gradient_down():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).requires_grad_(False)
    fast = Products(linear)
    x = torch.randn(5, 7, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = linear(x), fast(x2)
    assert y2.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(y.flatten(), y2.flatten(), dim=0) > 0.9999
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    assert torch.nn.functional.cosine_similarity(x.grad.flatten(), x2.grad.flatten(), dim=0) > 0.9999
    assert list(fast.state_dict()) == [] and list(fast.parameters()) == []


def test_only_frozen_linears_are_swapped():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)
    assert products_in(model, skip=("2",)) == 1
    assert isinstance(model[0], Products) and isinstance(model[1], torch.nn.Linear)
    assert isinstance(model[2], torch.nn.Linear)
