"""Contract tests: what clawrl sends to SGLang and vLLM, run through the servers' own code.

Neither server can run here (they need a GPU), but much of their request checking is plain Python.
`make servers` (part of `make test`) installs sglang 0.5.23 and vllm 0.33.0 with `--no-deps` into
`.cache/servers/site`, a folder only this file puts on sys.path, and keeps the wheels of SGLang
0.5.2, 0.5.3 and 0.5.4 to read as source. The requests are the ones the clients build
(`generate_body`, `score_body`, `completion_body`, `lora_load_body`, ...), with the budgets and
trims of the real code (`token_budget`, `remote_teacher`) on the shipped Qwen3 recipes.

How each server rule is reached:
* imported and called: vLLM's CompletionRequest, LoadLoRAAdapterRequest and
  UnloadLoRAAdapterRequest, SamplingParams._validate_logprobs, get_max_tokens
  (entrypoints/serve/utils/api_utils.py), and EngineArgs / FrontendArgs, the dataclasses its CLI is
  generated from; SGLang's SamplingParams (normalize, verify) and its real CLI parser
  (ServerArgs.add_cli_args).
* executed from the source, because the module does not import without CUDA (torchvision ops,
  tvm_ffi): vLLM's InputProcessor._validate_prompt_len (v1/engine/input_processor.py) is compiled
  alone and called; SGLang's length conditions in TokenizerManager._validate_one_request
  (managers/tokenizer_manager.py) are taken from its syntax tree and evaluated, per release.
* read from the source, per SGLang release: the fields of GenerateReqInput and the LoRA requests
  (managers/io_struct.py), whether SamplingParams takes `sampling_seed`
  (sampling/sampling_params.py), and the logprob variable its sampler reads (layers/sampler.py).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys
import typing
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from clawrl.config import load_config
from clawrl.learn import remote_teacher
from clawrl.engines import sglang, vllm
from clawrl.engines.base import token_budget
from clawrl.engines.remote import lora_load_body, lora_unload_body
from clawrl.learn.remote_teacher import SCORING_MARGIN
from clawrl.engines.sglang import SGLangEngine
from clawrl.engines.vllm import VLLMEngine
from clawrl.types import GenParams
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "doubles"))   # the doubles import their siblings
import sglang_server  # noqa: E402
import vllm_server  # noqa: E402

SERVERS = REPO / ".cache" / "servers"
SITE, WHEELS = SERVERS / "site", SERVERS / "wheels"
INSTALLED_SGLANG = "0.5.23"
SGLANG_RELEASES = ["0.5.2", "0.5.3", "0.5.4", INSTALLED_SGLANG]
OPENCLAW_MAX_TOKENS = 8192       # OpenClaw asks for its configured maxTokens whatever the prompt
QWEN3_VOCAB = 151936


@pytest.fixture(scope="module", autouse=True)
def server_code():
    if not any(SERVERS.glob(".installed-*")):
        pytest.skip("the servers' code is not installed: run `make servers` (`make test` does)")
    if str(SITE) not in sys.path:
        sys.path.append(str(SITE))     # last: the daemon's own packages still win


def recipe(name: str, **overrides):
    return load_config(name, env={}, overrides=overrides)


# -- reading the servers' source ------------------------------------------------------------------

def sglang_source(release: str, path: str) -> str:
    if release == INSTALLED_SGLANG:
        return (SITE / "sglang" / path).read_text()
    wheel = next(WHEELS.glob(f"sglang-{release}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        return z.read(f"sglang/{path}").decode()


def find(tree: ast.AST, kind: type, name: str):
    found = [n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name]
    assert found, f"no {kind.__name__} {name} in the source: the server changed, re-read it"
    return found[0]


def mentions(node: ast.AST, name: str) -> bool:
    return any((isinstance(n, ast.Name) and n.id == name) or
               (isinstance(n, ast.Attribute) and n.attr == name) for n in ast.walk(node))


def class_fields(source: str, cls: str) -> set[str]:
    """The fields a class takes: its annotated attributes (dataclasses) and __init__'s arguments."""
    node = find(ast.parse(source), ast.ClassDef, cls)
    fields = {s.target.id for s in node.body
              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    for s in node.body:
        if isinstance(s, ast.FunctionDef) and s.name == "__init__":
            fields |= {a.arg for a in s.args.args + s.args.kwonlyargs} - {"self"}
    return fields


class _Manager:
    """The TokenizerManager attributes the length checks read, with the launch clawrl makes
    (no --allow-auto-truncate, no reserved tokens)."""

    def __init__(self, context_len: int):
        self.context_len = context_len
        self.allow_auto_truncate = False
        self.validate_total_tokens = True
        self.num_reserved_tokens = 0


def sglang_refuses(release: str):
    """(input tokens, max_new_tokens, context) -> whether SGLang `release` refuses the request,
    from the `if` tests of TokenizerManager._validate_one_request that compare with the context."""
    path = "srt/managers/tokenizer_manager.py"
    fn = find(ast.parse(sglang_source(release, path)), ast.FunctionDef, "_validate_one_request")
    limit = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "_max_req_len" for t in n.targets)]
    tests = [n.test for n in ast.walk(fn) if isinstance(n, ast.If) and mentions(n.test, "input_token_num")
             and (mentions(n.test, "context_len") or mentions(n.test, "_max_req_len"))]
    assert len(limit) == 1 and len(tests) == 2, f"SGLang {release}'s length checks changed: re-read {path}"
    code = [compile(ast.Expression(t), f"sglang-{release}/{path}", "eval") for t in [limit[0], *tests]]

    def refuses(n_input: int, max_new: int, ctx: int) -> bool:
        names = {"self": _Manager(ctx), "input_token_num": n_input, "max_new_tokens": max_new}
        names["_max_req_len"] = eval(code[0], {}, names)
        return any(eval(c, {}, names) for c in code[1:])
    return refuses


def vllm_prompt_check(ctx: int):
    """vLLM 0.33.0's InputProcessor._validate_prompt_len, compiled from its source and bound to a
    text-only generate model of `ctx` tokens: n -> None, or VLLMValidationError."""
    from vllm.exceptions import VLLMValidationError
    path = SITE / "vllm" / "v1" / "engine" / "input_processor.py"
    fn = find(ast.parse(path.read_text()), ast.FunctionDef, "_validate_prompt_len")
    ns = {"VLLMValidationError": VLLMValidationError, "Literal": typing.Literal}
    exec(compile(ast.Module([fn], []), str(path), "exec"), ns)
    processor = SimpleNamespace(skip_prompt_length_check=False, supports_mm_inputs=False,
                                mm_encoder_cache_size=0,
                                model_config=SimpleNamespace(max_model_len=ctx, runner_type="generate"))
    return lambda n: ns["_validate_prompt_len"](processor, n, "decoder")


def captured_score(monkeypatch, module, cfg, context: list[int], response: list[int]) -> dict:
    """The body `remote_teacher` has `module.score` send for a hinted context: the real trim."""
    sent = []

    def score(client, url, cfg, ctx, resp, k):
        sent.append(module.score_body("base", ctx, resp, k) if module is vllm else
                    module.score_body(ctx, resp, k))
        return [0.0] * len(resp), None
    monkeypatch.setattr(module, "score", score)
    remote_teacher.remote_teacher(cfg)(context, response, cfg.opd.topk)
    return sent[0]


# -- SGLang ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_accepts_the_budget_clawrl_gives_a_prompt_near_the_context(release):
    refuses, cfg = sglang_refuses(release), recipe("qwen3-4b-sglang")
    ctx = cfg.model.context_length
    engine = SimpleNamespace(context_length=ctx, generation_margin=SGLangEngine.generation_margin)
    longest = ctx - SGLangEngine.generation_margin - 1      # what render_checked lets through
    for n in (1000, ctx - OPENCLAW_MAX_TOKENS, ctx - 10, longest):
        budget = token_budget(engine, n, OPENCLAW_MAX_TOKENS)
        body = sglang.generate_body(list(range(n)), GenParams(max_tokens=budget), None)
        assert budget >= 1
        assert not refuses(len(body["input_ids"]), body["sampling_params"]["max_new_tokens"], ctx)
    # The rule is live: an input alone at the context is refused by every release, and filling
    # the context exactly by all before 0.5.23 (what clawrl sent before generation_margin).
    assert refuses(ctx, 0, ctx)
    assert refuses(ctx - 10, 10, ctx) == (sglang.release(release) < (0, 5, 23))


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_accepts_a_hinted_teacher_score_at_the_context_limit(release, monkeypatch):
    refuses, cfg = sglang_refuses(release), recipe("qwen3-4b-sglang")
    ctx, response = cfg.model.context_length, list(range(300))
    body = captured_score(monkeypatch, sglang, cfg, list(range(ctx + 500)), response)
    assert body["input_ids"][-len(response):] == response
    assert len(body["input_ids"]) == ctx - SCORING_MARGIN
    assert not refuses(len(body["input_ids"]), body["sampling_params"]["max_new_tokens"], ctx)
    assert refuses(ctx, 0, ctx)      # a context cut to fit exactly (the old trim) is refused


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_the_sglang_double_refuses_whatever_sglang_refuses(release):
    refuses, ctx = sglang_refuses(release), 64
    for n in range(1, ctx + 3):
        for new in range(0, 12):
            if refuses(n, new, ctx):
                assert sglang_server.length_refusal(n, new, ctx), (n, new)


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_requests_have_only_fields_sglang_declares(release):
    io = sglang_source(release, "srt/managers/io_struct.py")
    generate = class_fields(io, "GenerateReqInput")
    for body in (sglang.generate_body([1, 2, 3], GenParams(max_tokens=5, seed=7), "clawrl-v0003"),
                 sglang.score_body([1, 2, 3], [4, 5], 20)):
        assert set(body) <= generate, set(body) - generate
    assert set(lora_load_body("clawrl-v0003", Path("/a"))) <= class_fields(io, "LoadLoRAAdapterReqInput")
    assert set(lora_unload_body("clawrl-v0003")) <= class_fields(io, "UnloadLoRAAdapterReqInput")


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_takes_sampling_seed_exactly_from_the_release_clawrl_assumes(release):
    takes = "sampling_seed" in class_fields(sglang_source(release, "srt/sampling/sampling_params.py"),
                                            "SamplingParams")
    assert takes == (sglang.release(release) >= sglang.SEED_SINCE)


@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_reads_one_of_the_logprob_variables_clawrl_sets(release):
    read = set(re.findall(r"\b[A-Z_]*RETURN_ORIGINAL_LOGPROB\b",
                          sglang_source(release, "srt/layers/sampler.py")))
    _, env = SGLangEngine(recipe("qwen3-4b-sglang")).launch_command(Path("/models/qwen3"))
    assert read and read <= {k for k, v in env.items() if v == "1"}, read


def test_sglang_sampling_params_take_what_clawrl_sends():
    from sglang.srt.sampling.sampling_params import SamplingParams
    for body in (sglang.generate_body([1, 2], GenParams(max_tokens=9, temperature=0.7, top_p=0.9,
                                                        seed=7), "clawrl-v0003"),
                 sglang.score_body([1, 2, 3], [4, 5], 20)):
        params = SamplingParams(**body["sampling_params"])
        params.normalize(None)
        params.verify(QWEN3_VOCAB)
    with pytest.raises(TypeError):       # live: a name SGLang does not know is refused
        SamplingParams(max_new_tokens=1, sampling_sead=7)


def test_sglang_parses_the_launch_command_with_its_own_parser():
    from sglang.srt.server_args import ServerArgs
    cfg = recipe("qwen3-4b-sglang")
    argv, _ = SGLangEngine(cfg).launch_command(Path("/models/qwen3"))
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert (SITE / "sglang" / "launch_server.py").is_file()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert args.model_path == "/models/qwen3" and args.context_length == cfg.model.context_length
    assert args.enable_lora and args.max_lora_rank == cfg.engine.max_lora_rank
    assert args.lora_target_modules == ["all"] and args.dp_size == cfg.engine.data_parallel


# -- vLLM ------------------------------------------------------------------------------------------

def declared(model) -> set[str]:
    """vLLM's request models accept and ignore unknown fields (with a warning), so a misspelt
    field would validate: what clawrl sends must be declared."""
    return set(model.model_fields)


def test_vllm_serves_the_budget_clawrl_gives_a_prompt_near_the_context():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    cfg = recipe("qwen3-4b-vllm")
    ctx = cfg.model.context_length
    engine = SimpleNamespace(context_length=ctx, generation_margin=VLLMEngine.generation_margin)
    check = vllm_prompt_check(ctx)
    for n in (1000, ctx - OPENCLAW_MAX_TOKENS, ctx - 10, ctx - VLLMEngine.generation_margin - 1):
        budget = token_budget(engine, n, OPENCLAW_MAX_TOKENS)
        body = vllm.completion_body("clawrl-v0003", list(range(n)),
                                    GenParams(max_tokens=budget, temperature=0.7, top_p=0.9, seed=3))
        assert set(body) <= declared(CompletionRequest), set(body) - declared(CompletionRequest)
        req = CompletionRequest.model_validate(body)
        check(len(body["prompt"]))
        served = get_max_tokens(ctx, req.max_tokens, n, {})
        assert served == budget          # vLLM serves the whole budget clawrl recorded
        params = req.to_sampling_params(served, {})
        assert (params.max_tokens, params.seed, params.logprobs) == (budget, 3, 0)


def test_vllm_scores_a_hinted_teacher_context_at_the_limit(monkeypatch):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    from vllm.exceptions import VLLMValidationError
    cfg = recipe("qwen3-4b-vllm", **{"opd.topk": 50})
    ctx, response = cfg.model.context_length, list(range(300))
    body = captured_score(monkeypatch, vllm, cfg, list(range(ctx + 500)), response)
    assert body["prompt"][-len(response):] == response and len(body["prompt"]) == ctx - SCORING_MARGIN
    assert set(body) <= declared(CompletionRequest)
    req = CompletionRequest.model_validate(body)
    check = vllm_prompt_check(ctx)
    check(len(body["prompt"]))
    with pytest.raises(VLLMValidationError):     # what the old trim sent: prompt = max_model_len
        check(ctx)
    params = req.to_sampling_params(get_max_tokens(ctx, req.max_tokens, len(body["prompt"]), {}), {})
    argv, _ = VLLMEngine(cfg).launch_command(Path("/models/qwen3"))
    launched = int(argv[argv.index("--max-logprobs") + 1])
    params._validate_logprobs(SimpleNamespace(max_logprobs=launched, get_vocab_size=lambda: QWEN3_VOCAB))
    with pytest.raises(VLLMValidationError):     # vLLM's default of 20 refuses topk 50
        params._validate_logprobs(SimpleNamespace(max_logprobs=20, get_vocab_size=lambda: QWEN3_VOCAB))


def test_the_vllm_double_refuses_whatever_vllm_refuses():
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    from vllm.exceptions import VLLMValidationError
    ctx = 64
    check = vllm_prompt_check(ctx)
    for n in range(1, ctx + 3):
        for max_tokens in range(1, 12):
            try:
                check(n)
                get_max_tokens(ctx, max_tokens, n, {})
            except (VLLMValidationError, ValueError):
                assert vllm_server.length_refusal(n, max_tokens, ctx), (n, max_tokens)


def test_vllm_lora_requests_take_what_clawrl_sends():
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
    load, unload = lora_load_body("clawrl-v0003", Path("/a/v0003")), lora_unload_body("clawrl-v0003")
    assert set(load) <= declared(LoadLoRAAdapterRequest)
    assert LoadLoRAAdapterRequest.model_validate(load).lora_path == "/a/v0003"
    assert set(unload) <= declared(UnloadLoRAAdapterRequest)
    UnloadLoRAAdapterRequest.model_validate(unload)


def test_vllm_launch_flags_are_vllm_options():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.common.cli_args import FrontendArgs
    argv, env = VLLMEngine(recipe("qwen3-4b-vllm")).launch_command(Path("/models/qwen3"))
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/qwen3"]
    assert (SITE / "vllm" / "entrypoints" / "cli" / "main.py").is_file()
    options = {f.name for f in dataclasses.fields(EngineArgs)} | \
              {f.name for f in dataclasses.fields(FrontendArgs)}
    flags = {a[2:].replace("-", "_") for a in argv[5:] if a.startswith("--")}
    assert flags <= options, flags - options
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in (SITE / "vllm" / "envs.py").read_text()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
