"""Packed layers reading whole sequences (engines/packed.py, `PackedModel.read`), on tiny random
Llamas built here through transformers: every hidden state and every key and value is what the
model's own forward computes, with and without a cached prefix, with grouped-query heads and
with YaRN's attention scaling; bfloat16 products in oneDNN's blocked layout give the plain
product's results to the bit."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from clawrl.engines.packed import Matrix, PackedModel, _blocked


def tiny(**rope) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      **rope)
    return LlamaForCausalLM(cfg).eval()


def reference(model, ids: list[int], past: list[int] | None = None):
    """transformers' hidden states of `ids` (after `past`, read into its own cache first) and the
    cache's keys and values."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        if past:
            model(input_ids=torch.tensor([past]), cache=cache, use_cache=True)
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, output_hidden_states=True)
    return out.hidden_states, [(layer.keys, layer.values) for layer in cache.layers]


YARN = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 16}}


@pytest.mark.parametrize("rope", [{}, YARN], ids=["own", "yarn"])
def test_a_whole_sequence_reads_as_the_models_own_forward(rope):
    model = tiny(**rope)
    packed = PackedModel(model)
    ids = [5, 17, 3, 88, 41, 2, 60, 33, 12, 1, 90, 4, 7, 9, 11, 30, 31, 32, 70, 71]
    states, kv = reference(model, ids)
    hidden, mine = packed.read(ids, keep={1, 2, 3, 4})
    for layer in (1, 2, 3):     # transformers' last entry is after the final norm
        torch.testing.assert_close(hidden[layer], states[layer][0], atol=2e-5, rtol=1e-4)
    final = model.model.norm(hidden[4])
    torch.testing.assert_close(final, states[4][0], atol=2e-5, rtol=1e-4)
    for (k, v), (rk, rv) in zip(mine, kv):
        torch.testing.assert_close(k, rk, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(v, rv, atol=2e-5, rtol=1e-4)


def test_after_a_cached_prefix_each_position_sees_the_prefix_and_what_came_before_it():
    model = tiny()
    packed = PackedModel(model, depth=3)
    prefix, ids = [8, 6, 44, 21, 19], [5, 17, 3, 88, 41, 2, 60]
    _, past = packed.read(prefix)
    kept = [(k.clone(), v.clone()) for k, v in past]
    hidden, kv = packed.read(ids, past, keep={2, 3})
    states, ref_kv = reference(model, ids, past=prefix)
    torch.testing.assert_close(hidden[2], states[2][0], atol=2e-5, rtol=1e-4)
    assert len(packed.layers) == 3 and set(hidden) == {2, 3}
    # the whole sequence at once reads the same
    whole, _ = packed.read(prefix + ids, keep={3})
    torch.testing.assert_close(hidden[3], whole[3][len(prefix):], atol=2e-5, rtol=1e-4)
    assert kv[0][0].shape[-2] == len(prefix) + len(ids)
    torch.testing.assert_close(kv[1][0], ref_kv[1][0], atol=2e-5, rtol=1e-4)
    # the past handed in is never changed
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(past, kept))


def test_bfloat16_products_in_the_blocked_layout_equal_the_plain_ones():
    torch.manual_seed(1)
    w, x = torch.randn(96, 48), torch.randn(37, 48)
    plain, blocked = Matrix(w, None, "bfloat16"), Matrix(w, None, "bfloat16", rows=64)
    if _blocked(plain.weight, 64) is None:
        pytest.skip("this torch or CPU has no oneDNN blocked bfloat16 linear (the plain product serves)")
    assert plain.blocked is None and blocked.blocked is not None
    assert torch.equal(plain(x), blocked(x))
    # and both are the bfloat16 product of float32 inputs, with float32 out
    want = torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float()
    assert blocked(x).dtype == torch.float32 and torch.equal(blocked(x), want)


def test_a_model_the_packed_layers_cannot_read_is_refused_with_the_reason():
    model = tiny()
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="gelu"):
        PackedModel(model)
