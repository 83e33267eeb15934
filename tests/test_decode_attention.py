"""The fast decode step's attention at one query position (engines/fastdecode.py, `_attend`):
grouped float32 products computing what PyTorch's SDPA computes with grouped-query heads, over a
float32 or a bfloat16 cache, and a left-padded batch row exactly as that row alone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from clawrl.engines.fastdecode import FastDecoder


@pytest.fixture(scope="module")
def fast():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=96, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    return FastDecoder(LlamaForCausalLM(cfg).eval())


def sdpa(q, keys, values):
    """The reference: SDPA in float32, each key/value head shared by its query heads."""
    return F.scaled_dot_product_attention(q.float(), keys.float(), values.float(), enable_gqa=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_products_compute_sdpa(fast, dtype):
    torch.manual_seed(1)
    q = torch.randn(1, 6, 1, 16) * 2
    keys, values = (torch.randn(1, 2, 300, 16) * 2).to(dtype), torch.randn(1, 2, 300, 16).to(dtype)
    got = fast._attend(q, keys, values, None)
    assert got.dtype == torch.float32 and got.shape == (1, 6, 1, 16)
    torch.testing.assert_close(got, sdpa(q, keys, values), atol=1e-5, rtol=1e-5)


def test_a_padded_row_attends_only_over_its_own_keys(fast):
    torch.manual_seed(2)
    q = torch.randn(2, 6, 1, 16)
    keys, values = torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    got = fast._attend(q, keys, values, [0, 15])          # row 1's first 15 positions are padding
    torch.testing.assert_close(got[0:1], sdpa(q[0:1], keys[0:1], values[0:1]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1:2], sdpa(q[1:2], keys[1:2, :, 15:], values[1:2, :, 15:]),
                               atol=1e-5, rtol=1e-5)
