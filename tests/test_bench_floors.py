"""bench/floors.py counts the products a consolidation step makes: the shapes must be a real
Llama layer's Linears, every consolidation method must have its passes, and the floor must follow
them. Fast: a tiny random Llama, no weights."""
from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from conftest import bench_module
from clawrl.learn.consolidate import LOSS_TYPES

floors = bench_module("floors")

TINY = LlamaConfig(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=2, vocab_size=300, head_dim=16)


def test_layer_shapes_are_a_llama_layers_linears():
    layer = LlamaDecoderLayer(TINY, 0)
    real = sorted((m.in_features, m.out_features) for m in layer.modules() if isinstance(m, torch.nn.Linear))
    assert sorted(floors.layer_shapes(TINY)) == real


def test_every_consolidation_method_has_its_passes():
    assert set(floors.PASSES) == set(LOSS_TYPES)


def result(method: str) -> dict:
    return {"recipe": {"consolidate": {"batch_size": 2, "method": method}},
            "log": {"turns": 8, "prompt_tokens_mean": 12, "response_tokens_mean": 6},
            "path": {"products": "float32"}, "steps": 4, "wall_s": 10.0}


def test_the_floor_follows_the_passes(monkeypatch):
    # each product is timed as its arithmetic (rows x in x out), so the floor is a pure count
    monkeypatch.setattr(floors, "products_s", lambda rows, shapes, dtype, backward=False:
                        rows * sum(i * o for i, o in shapes) * 1e-3)
    kto, apo = (floors.consolidate_floor(result(m), TINY)["floor_s"] for m in ("kto", "apo-zero"))
    layer = sum(i * o for i, o in floors.layer_shapes(TINY))
    head = TINY.hidden_size * TINY.vocab_size

    def expected(method: str) -> float:
        (df, db), (hf, hb) = floors.PASSES[method]["decoder"], floors.PASSES[method]["lm_head"]
        return 4 * (TINY.num_hidden_layers * (df + db) * 36 * layer + (hf + hb) * 12 * head) * 1e-3
    assert kto == round(expected("kto")) and apo == round(expected("apo-zero"))
    assert floors.PASSES["kto"]["decoder"][0] > floors.PASSES["apo-zero"]["decoder"][0]
