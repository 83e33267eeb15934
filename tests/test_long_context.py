"""A window past the model's native positions (models.long_context): the YaRN variant a recipe's
`model.context_length` asks for, made once from links and its own config.json, loaded as such by
transformers, and decoded by the fast step exactly as the model's own forward computes it past
the native window. On a tiny random Llama built here: no weights are fetched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from clawrl import config, models
from clawrl.engines.fastdecode import FastDecoder, supported

NATIVE = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Llama with a native window of 64 positions, saved as a model folder."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=NATIVE)
    folder = tmp_path_factory.mktemp("models") / "tiny"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def test_the_factor_is_the_windows_ratio_and_only_where_the_rope_is_static():
    own = {"max_position_embeddings": 8192, "rope_parameters": {"rope_type": "default"}}
    assert models.yarn_factor(own, 32768) == 4
    assert models.yarn_factor(own, 8192) is None and models.yarn_factor(own, 4096) is None
    legacy = {"max_position_embeddings": 8192, "rope_scaling": {"type": "dynamic", "factor": 2}}
    assert models.yarn_factor(legacy, 32768) is None          # it already stretches itself
    assert models.yarn_factor({"max_position_embeddings": 8192}, 12288) == 1.5


def test_the_variant_links_the_weights_and_carries_yarn_in_its_config(tiny):
    out = models.long_context(tiny, 4 * NATIVE, tiny.parent)
    assert out == tiny.parent / "tiny-yarn4"
    weights = out / "model.safetensors"
    assert weights.is_symlink() and weights.resolve() == (tiny / "model.safetensors").resolve()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_parameters"]["factor"] == 4
    assert cfg["rope_parameters"]["original_max_position_embeddings"] == NATIVE
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["max_position_embeddings"] == 4 * NATIVE
    assert json.loads((tiny / "config.json").read_text())["max_position_embeddings"] == NATIVE
    # Made once: a second call finds it; within the native window the model is used as it is.
    stamp = (out / "config.json").stat().st_mtime_ns
    assert models.long_context(tiny, 4 * NATIVE, tiny.parent) == out
    assert (out / "config.json").stat().st_mtime_ns == stamp
    assert models.long_context(tiny, NATIVE, tiny.parent) == tiny
    assert not [p for p in tiny.parent.iterdir() if p.name.startswith(".")]   # no leftovers


def test_an_older_config_keeps_its_rope_theta(tmp_path):
    src = tmp_path / "models" / "old"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps({"max_position_embeddings": 4096,
                                                 "rope_theta": 500000.0}))
    out = models.long_context(src, 8192, tmp_path / "models")
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope == {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 2.0,
                    "original_max_position_embeddings": 4096}


def test_a_users_own_model_gets_a_variant_named_for_its_path(tiny, tmp_path):
    out = models.long_context(tiny, 2 * NATIVE, tmp_path / "models")
    assert out.parent == tmp_path / "models" and out.name.startswith("tiny-yarn2-")
    assert (out / "model.safetensors").resolve() == (tiny / "model.safetensors").resolve()
    # A variant whose links no longer lead anywhere (its source moved) is made again.
    (out / "model.safetensors").unlink()
    (out / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    assert models.long_context(tiny, 2 * NATIVE, tmp_path / "models") == out
    assert (out / "model.safetensors").resolve() == (tiny / "model.safetensors").resolve()


def test_the_recipe_picks_the_variant_unless_told_none(tiny, tmp_path):
    env = {"CLAWRL_HOME": str(tmp_path / "home"), "CLAWRL_MODEL_SOURCE": str(tiny),
           "CLAWRL_MODEL_CONTEXT_LENGTH": str(4 * NATIVE)}
    cfg = config.load_config(env=env)
    assert cfg.model.rope_scaling == "auto"
    assert json.loads((models.model_dir(cfg) / "config.json").read_text())[
        "rope_parameters"]["rope_type"] == "yarn"
    assert models.model_dir(config.load_config(env={**env, "CLAWRL_MODEL_ROPE_SCALING": "none"})) \
        == tiny


def test_transformers_loads_the_variant_and_the_fast_step_decodes_it_past_the_native_window(tiny):
    from transformers import DynamicCache
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(models.long_context(tiny, 4 * NATIVE, tiny.parent),
                                                 dtype=torch.float32).eval()
    rotary = model.model.rotary_emb
    assert rotary.attention_scaling > 1 and not torch.equal(rotary.inv_freq,
                                                             base.model.rotary_emb.inv_freq)
    assert supported(model) is None
    fast = FastDecoder(model, "float32")
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 97, (3 * NATIVE,), generator=g).tolist()
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([seq]), cache=cache, use_cache=True)
        for t in torch.randint(0, 97, (6,), generator=g).tolist():
            got = fast.step([t], [len(seq)], cache)[0]
            seq.append(t)
            want = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
