"""The fast decode step's in-place KV appends (engines/fastdecode.py, `_Room`), on a tiny random
Llama built here through transformers: the steps compute what the model's own forward computes
over the whole sequence, the room is really reused, and what else holds or cuts a cache (a crop,
a copy, a batch) never sees a position it did not write."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from clawrl.engines.fastdecode import FastDecoder, _Room
from clawrl.engines.kvbatch import DecodeBatch


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval()
    return model, FastDecoder(model)


@pytest.fixture(autouse=True)
def little_room(monkeypatch):
    """Two spare positions, so a few steps already run out of room and grow it."""
    monkeypatch.setattr(_Room, "_spare", staticmethod(lambda n: 2))


def prefill(model, ids):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


def full(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def run(model, fast, cache, ids, tokens):
    """Feed `tokens` one step at a time after `ids`; check each step's logits against the whole
    sequence's forward. Returns the sequence."""
    seq = list(ids)
    for t in tokens:
        got = fast.step([t], [len(seq)], cache)[0]
        seq.append(t)
        torch.testing.assert_close(got, full(model, seq), atol=2e-5, rtol=1e-4)
        assert cache.get_seq_length() == len(seq)
    return seq


def test_steps_in_the_room_compute_the_models_own_forward(tiny):
    model, fast = tiny
    ids = [5, 17, 3, 88, 41]
    cache = prefill(model, ids)
    run(model, fast, cache, ids, [7, 9, 11, 2, 60, 33, 12, 1, 90, 4])   # grows 3 times


def test_a_step_writes_in_place_while_there_is_room(tiny):
    model, fast = tiny
    ids = [5, 17, 3]
    cache = prefill(model, ids)
    fast.step([8], [3], cache)                   # makes the room (a copy)
    ptr = cache.layers[0].keys.data_ptr()
    fast.step([9], [4], cache)                   # writes into it
    assert cache.layers[0].keys.data_ptr() == ptr
    assert cache.layers[0].keys.shape[-2] == 5


def test_a_crop_never_lets_a_step_overwrite_what_another_view_holds(tiny):
    model, fast = tiny
    ids = [5, 17, 3, 88]
    cache = prefill(model, ids)
    seq = run(model, fast, cache, ids, [7, 9])
    held = cache.layers[1].keys                  # a view of the room, as a pool entry would hold it
    before = held.clone()
    cache.crop(-1)                               # the prefix pool cuts back to a common prefix
    run(model, fast, cache, seq[:-1], [50, 51, 52])
    assert torch.equal(held, before)


def test_copies_and_batches_of_a_cache_in_the_room_go_on_correctly(tiny):
    model, fast = tiny
    ids = [5, 17, 3, 88]
    cache = prefill(model, ids)
    seq = run(model, fast, cache, ids, [7])
    twin = copy.deepcopy(cache)                  # the prefix pool's copy of a cache in use
    run(model, fast, cache, seq, [20, 21, 22])
    run(model, fast, twin, seq, [30, 31, 32])

    # two streams joined into one batch, stepped, split back: each equals its stream alone
    class Req:
        def __init__(self, ids, cache):
            self.entry = type("Entry", (), {"ids": list(ids), "cache": cache})()

    a, b = Req(ids, prefill(model, ids)), Req(ids[:2], prefill(model, ids[:2]))
    batch = DecodeBatch(model.config)
    batch.join([a, b])
    for t in (40, 41, 42):
        batch.step_with(fast, [t, t + 10], None)
    batch.split()
    for req, fed in ((a, ids + [40, 41, 42]), (b, ids[:2] + [50, 51, 52])):
        assert req.entry.ids == fed
        got = fast.step([3], [len(fed)], req.entry.cache)[0]
        torch.testing.assert_close(got, full(model, fed + [3]), atol=2e-5, rtol=1e-4)


def test_another_kind_of_cache_takes_its_own_update():
    calls = []

    class Other:                                 # a cache with no DynamicLayer (quantized, static, ...)
        layers = [object()]

        def update(self, k, v, i):
            calls.append(i)
            return k, v

    k = torch.zeros(1, 2, 1, 4)
    assert _Room().append(Other(), 0, k, k)[0] is k
    assert calls == [0]
