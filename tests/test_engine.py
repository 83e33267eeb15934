"""The embedded engine in-process, in float32 where batched, cached and cold paths are exact."""
from __future__ import annotations

import asyncio

import pytest

from conftest import make_home
from clawrl.config import load_config
from clawrl.engines import embedded, make_engine
from clawrl.engines.fastdecode import int8_available
from clawrl.types import GenParams

pytestmark = pytest.mark.model

PROMPTS = ["What is the capital of France?", "Write a haiku about snow and mountains.",
           "Count to ten.", "Explain gravity in one sentence, like I'm five years old."]
LIMITS = [24, 12, 18, 30]


@pytest.fixture(scope="module", params=["float32", "int8", "general"])
def engine(request, tmp_path_factory):
    """The engine on each decode path: the fast step with float32 weights (exact) and with int8
    weights (the default on x86), and transformers' own forward."""
    if request.param == "int8" and not int8_available():
        pytest.skip("int8 products need fbgemm (an x86 CPU)")
    home = make_home(tmp_path_factory.mktemp("engine-home"))
    cfg = load_config(env={"CLAWRL_HOME": str(home), "CLAWRL_ENGINE_DTYPE": "float32",
                           "CLAWRL_ENGINE_DECODE_WEIGHTS": request.param})
    e = make_engine(cfg)
    e.load()
    assert (e.fast is None) == (request.param == "general")
    yield e
    e.close()


async def generate(engine, prompt: str, n: int = 24, **kw):
    gen = engine.submit(engine.render([{"role": "user", "content": prompt}], None),
                        GenParams(max_tokens=n, temperature=kw.pop("temperature", 0), **kw))
    events = [ev async for ev in gen]
    return events, gen.finish


def test_batched_decode_gives_each_stream_its_single_stream_tokens(engine, monkeypatch):
    if engine.cfg.engine.decode_weights == "int8":
        # int8 quantizes each step's activations, which turns the last-bit rounding of a prefix
        # computed by another forward (a reused cache) into other tokens now and then; batching
        # itself is exact (test_fastdecode.py), so here every prompt is prefilled cold
        monkeypatch.setattr(embedded, "_worth_reusing", lambda cached, total: False)

    async def main():
        # each stream its own length limit, so streams leave the batch mid-way whatever they say
        single = [[e.token_id for e in (await generate(engine, p, n))[0]]
                  for p, n in zip(PROMPTS, LIMITS)]
        together = await asyncio.gather(*(generate(engine, p, n) for p, n in zip(PROMPTS, LIMITS)))
        return single, [[e.token_id for e in evs] for evs, _ in together]
    single, batched = asyncio.run(main())
    assert batched == single
    assert len({len(s) for s in single}) > 1, "streams of different lengths leave the batch mid-way"


def test_prefix_cache_gives_the_same_tokens_as_a_cold_prefill(engine):
    long = "Remember these facts. " + " ".join(f"Item {i} is {i * 7 % 13}." for i in range(120))

    async def main():
        cold, f1 = await generate(engine, long + " What is item 5?")
        warm, f2 = await generate(engine, long + " What is item 5?")
        return cold, f1, warm, f2
    cold, f1, warm, f2 = asyncio.run(main())
    assert f1.cached_tokens < f2.cached_tokens and f2.cached_tokens >= f2.prompt_tokens - 1
    assert [e.token_id for e in warm] == [e.token_id for e in cold]
    assert [e.logprob for e in warm] == pytest.approx([e.logprob for e in cold], abs=1e-3)


def test_cancel_stops_generation_at_the_next_step(engine):
    async def main():
        gen = engine.submit(engine.render([{"role": "user", "content": "Write a long essay."}], None),
                            GenParams(max_tokens=500, temperature=0.8, seed=1))
        n = 0
        async for _ in gen:
            n += 1
            if n == 3:
                gen.cancel()
        return n, gen.finish
    n, finish = asyncio.run(main())
    assert finish.reason == "cancelled" and finish.completion_tokens < 10


def test_text_deltas_rebuild_the_decoded_text(engine):
    events, finish = asyncio.run(generate(engine, "Write two sentences about cats.", 40,
                                          temperature=1.0, seed=3))
    text = "".join(e.text for e in events)
    ids = [e.token_id for e in events]
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert finish.completion_tokens == len(ids)


def test_seeded_sampling_is_reproducible_and_top_p_narrows(engine):
    async def main():
        a = await generate(engine, "Name an animal.", 12, temperature=1.5, seed=11)
        b = await generate(engine, "Name an animal.", 12, temperature=1.5, seed=11)
        c = await generate(engine, "Name an animal.", 12, temperature=1.5, seed=11, top_p=0.01)
        g = await generate(engine, "Name an animal.", 12, temperature=0)
        return a, b, c, g
    a, b, c, g = asyncio.run(main())
    assert [e.token_id for e in a[0]] == [e.token_id for e in b[0]]
    # top_p this small keeps only the most likely token: the greedy answer
    assert [e.token_id for e in c[0]] == [e.token_id for e in g[0]]


def test_an_adapter_serves_what_peft_computes_unmerged_then_merged(engine, tmp_path):
    """A LoRA version, loaded and activated as the swapper does, decodes what PEFT computes
    (float32 and general: the same greedy tokens; int8: close logprobs), first unmerged, then
    merged into the fast step's weights, and the base model still serves beside it."""
    import copy
    import time

    import torch
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(copy.deepcopy(engine.base_model), LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)).eval()
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.mul_(0.3)
    pm.save_pretrained(tmp_path / "v1")
    prompt = "Name three rivers in Europe."
    ids = engine.render([{"role": "user", "content": prompt}], None)
    with torch.inference_mode():
        want = pm.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):]
        logits = pm(input_ids=torch.cat([torch.tensor(ids), want]).unsqueeze(0)).logits[0].float()
    want_lp = [float(v) for v in logits[len(ids) - 1:-1].log_softmax(-1)
               .gather(1, want.unsqueeze(1))[:, 0]]

    before = [e.token_id for e in asyncio.run(generate(engine, prompt, 16))[0]]
    engine.load_adapter(1, tmp_path / "v1").result(timeout=60)
    try:
        engine.activate(1)
        runs = [asyncio.run(generate(engine, prompt, 16))]
        if engine.fast is not None:
            deadline = time.monotonic() + 120
            while not engine.fast.is_merged("v1") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert engine.fast.is_merged("v1"), "the adapter was never merged for decode"
            runs.append(asyncio.run(generate(engine, prompt, 16)))
        for events, finish in runs:
            assert finish.adapter_version == 1
            if engine.cfg.engine.decode_weights == "int8":   # close while the tokens agree
                toks = [e.token_id for e in events]
                n = next((i for i, (a, b) in enumerate(zip(toks, want.tolist())) if a != b),
                         min(len(toks), len(want)))
                assert n >= 4, f"int8 left float32's greedy answer at token {n}"
                assert sum(abs(e.logprob - w) for e, w in zip(events[:n], want_lp)) / n < 0.15
            else:
                assert [e.token_id for e in events] == want.tolist()[:len(events)]
                assert [e.logprob for e in events] == pytest.approx(want_lp[:len(events)], abs=2e-3)
        engine.activate(0)
        base, finish = asyncio.run(generate(engine, prompt, 16))
        assert finish.adapter_version == 0
    finally:
        engine.activate(0)
        assert engine.unload_adapter(1).result(timeout=60)
    # The last adapter gone, the base serves as before it came (PEFT would fail on it).
    assert [e.token_id for e in asyncio.run(generate(engine, prompt, 16))[0]] == before
    assert engine.loaded_adapters == set()
