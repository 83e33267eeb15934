"""Tests for clawrl.judge: parsing, majority, prompts, the rules judge, the model judge over a
scripted completion function, and openai_complete against a real local HTTP server."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from clawrl.errors import ClawrlError, ConfigError
from clawrl.judge.judges import (JudgeInput, Judgment, JudgeUnavailable, ModelJudge, RulesJudge,
                                 hint_prompt, majority, make_judge, openai_complete, parse_hint,
                                 parse_vote, vote_prompt)

SYSTEM = {"role": "system", "content": "You are OpenClaw, a personal assistant."}


def turn(next_state, response="Here is the summary.", context=None, tool_calls=()):
    context = context or [SYSTEM, {"role": "user", "content": "Summarise the meeting notes."}]
    return JudgeInput(context=context, response=response, tool_calls=list(tool_calls),
                      next_state=next_state)


def user(text):
    return {"role": "user", "content": text}


def tool(text, name="exec"):
    return {"role": "tool", "tool_call_id": "call_1", "name": name, "content": text}


def prompt_text(messages):
    return "\n".join(m["content"] for m in messages)


# ---------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text, vote", [
    ("The user thanked the assistant. \\boxed{1}", 1),
    ("They asked to redo it.\n\\boxed{-1}", -1),
    ("Unclear. \\boxed{0}", 0),
    ("At first \\boxed{1} seemed right, but the tool failed: \\boxed{-1}", -1),
    ("Answer with \\boxed{1}, \\boxed{0} or \\boxed{-1}. The user moved on. \\boxed{1}", 1),
    ("\\boxed{+1}", 1),
    ("\\boxed{ -1 }", -1),
    ("\\boxed{ + 1}", 1),
    ("\\boxed{2}", None),
    ("\\boxed{yes}", None),
    ("\\boxed{}", None),
    ("The turn succeeded, score 1.", None),
    ("\\boxed{1", None),
    ("Earlier \\boxed{1}, final \\boxed{yes}", None),   # the last box is the answer, and it is invalid
    ("", None),
])
def test_parse_vote(text, vote):
    assert parse_vote(text) == vote


@pytest.mark.parametrize("text, hint", [
    ("The user wanted bullets.\n[HINT_START] Answer with a bulleted list. [HINT_END]",
     "Answer with a bulleted list."),
    ("[HINT_START]Use metric units.[HINT_END] then revised: [HINT_START]Give distances in "
     "kilometres, not miles.[HINT_END]", "Give distances in kilometres, not miles."),
    ("[HINT_START] Use the staging server for deploys.", None),        # no end tag
    ("[HINT_START] Be short. [HINT_END]", None),                       # 9 characters
    ("[HINT_START]   [HINT_END]", None),
    ("Nothing in the reply says how to do better. [NO_HINT]", None),
    ("", None),
])
def test_parse_hint(text, hint):
    assert parse_hint(text) == hint


@pytest.mark.parametrize("votes, score", [
    ([1, 1, -1], 1),
    ([-1, -1, 1], -1),
    ([0, 0, 1], 0),
    ([1, -1], 0),
    ([1, -1, 0], 0),
    ([1, 1, -1, -1, 0], 0),
    ([None, None, None], 0),
    ([], 0),
    ([None, -1, None], -1),
    ([1, None, -1], 0),
    ([None, 1, 1, -1], 1),
])
def test_majority(votes, score):
    assert majority(votes) == score


# ------------------------------------------------------------------------------------ rules judge

CASES = [
    ("thanks", [user("Thanks, that's exactly what I needed!")], 1, None),
    ("moves on with a new question", [user("What's on my calendar tomorrow?")], 1, None),
    ("moves on with 'now'", [user("Now email it to the team.")], 1, None),
    ("correction", [user("No, that's wrong: the meeting was on Tuesday, not Monday.")], -1,
     "No, that's wrong: the meeting was on Tuesday, not Monday."),
    ("thanks but correction", [user("Thanks, but please use bullet points instead.")], -1,
     "Thanks, but please use bullet points instead."),
    ("curly apostrophe", [user("Don’t add emojis to my emails.")], -1, "Don’t add emojis to my emails."),
    ("preference", [user("Too long. Keep summaries under five lines.")], -1,
     "Too long. Keep summaries under five lines."),
    ("rephrase", [user("Can you summarise the meeting notes from the shared folder?")], -1,
     "Can you summarise the meeting notes from the shared folder?"),
    ("unclear", [user("hmm")], 0, None),
    ("tool success JSON", [tool('{"status": "ok", "stdout": "3 files copied", "error": null}')], 1, None),
    ("tool success text mentioning no error words", [tool("total 12\n-rw-r--r-- notes.md")], 1, None),
    ("tool JSON payload mentioning errors", [tool('{"results": [{"title": "Error handling in Python"}]}')],
     1, None),
    ("tool traceback", [tool('Traceback (most recent call last):\n  File "x.py", line 3\n'
                             "ZeroDivisionError: division by zero")], -1, None),
    ("tool exit code", [tool("make: *** [all] Exit code 2")], -1, None),
    ("tool exit code 0", [tool("build finished, exit code 0")], 1, None),
    ("tool JSON error", [tool('{"status": "error", "error": "ENOENT: no such file"}')], -1, None),
    ("tool JSON exit code", [tool('{"stdout": "", "exit_code": 1}')], -1, None),
    ("one of two tools failed", [tool('{"ok": true}'), tool("permission denied: /etc/shadow")], -1, None),
    ("no next state", [], 0, None),
]


@pytest.mark.parametrize("name, next_state, score, hint", CASES, ids=[c[0] for c in CASES])
def test_rules_judge(name, next_state, score, hint):
    j = asyncio.run(RulesJudge().judge(turn(next_state)))
    assert isinstance(j, Judgment)
    assert (j.score, j.votes, j.hint) == (score, [score], hint)
    assert len(j.raw) == 1 and j.raw[0].startswith("rules: ")


def test_rules_hint_is_trimmed():
    long = "No, you forgot the budget section. " + "It must list every line item. " * 30
    j = asyncio.run(RulesJudge().judge(turn([user(long)])))
    assert j.score == -1
    assert j.hint.startswith("No, you forgot the budget section.")
    assert 10 < len(j.hint) <= 301


def test_rules_reason_names_the_cue():
    j = asyncio.run(RulesJudge().judge(turn([user("Try again, in French this time.")])))
    assert "try again" in j.raw[0].lower()


# ---------------------------------------------------------------------------------------- prompts

def test_prompts_show_context_response_tool_calls_and_next_state():
    inp = turn([tool("ENOENT: /tmp/report.pdf not found", name="read_file")],
               response="Let me read the report.",
               context=[SYSTEM, user("Open the quarterly report and list the risks.")],
               tool_calls=[{"id": "call_1", "type": "function",
                            "function": {"name": "read_file", "arguments": '{"path": "/tmp/report.pdf"}'}}])
    vote, hint = prompt_text(vote_prompt(inp)), prompt_text(hint_prompt(inp))
    for text in (vote, hint):
        assert "Open the quarterly report and list the risks." in text
        assert "Let me read the report." in text
        assert 'read_file({"path": "/tmp/report.pdf"})' in text
        assert "[tool read_file] ENOENT: /tmp/report.pdf not found" in text
        assert "[user] Open the quarterly report" in text
        assert "OpenClaw" in text
    assert "\\boxed{1}" in vote and "\\boxed{-1}" in vote and "\\boxed{0}" in vote
    assert "[HINT_START]" in hint and "[HINT_END]" in hint and "[NO_HINT]" in hint
    assert "HINT" not in vote and "boxed" not in hint
    assert vote_prompt(inp)[0]["role"] == "system" and vote_prompt(inp)[-1]["role"] == "user"


def test_prompt_labels_a_user_next_state():
    text = prompt_text(vote_prompt(turn([user("Shorter please.")])))
    assert "[user] Shorter please." in text.split("Next state")[1]


def test_long_contents_are_clipped_keeping_head_and_tail():
    body = "HEAD " + "x" * 20_000 + " TAIL"
    text = prompt_text(vote_prompt(turn([tool(body)], response="START " + "y" * 20_000 + " END")))
    assert "HEAD" in text and "TAIL" in text and "START" in text and "END" in text
    assert "characters cut" in text
    assert len(text) < 8_000


def test_huge_system_prompt_and_long_history_stay_bounded():
    system = {"role": "system", "content": "SYSTEM-HEAD " + "s" * 40_000 + " SYSTEM-TAIL"}
    history = [user(f"message {i} " + "m" * 3_000) for i in range(30)]
    inp = turn([user("thanks " + "t" * 5_000)], context=[system, *history])
    for messages in (vote_prompt(inp), hint_prompt(inp)):
        text = prompt_text(messages)
        assert "SYSTEM-HEAD" in text and "SYSTEM-TAIL" not in text
        assert "message 29" in text and "message 0 " not in text
        assert len(text) < 16_000


def test_a_window_of_short_messages_is_shown_whole():
    history = [user(f"step {i}: rename file {i}") for i in range(12)]
    text = prompt_text(vote_prompt(turn([user("thanks")], context=history)))
    assert all(f"step {i}: rename file {i}" in text for i in range(12))


# ------------------------------------------------------------------------------------ model judge

class Scripted:
    """A fake completion function: canned outputs by prompt kind; records every prompt.

    Each call waits until all `expect` calls have started, so a judge that awaited them one by one
    would time out instead of passing."""

    def __init__(self, votes, hints, expect, fail=False):
        self.votes, self.hints, self.expect, self.fail = list(votes), list(hints), expect, fail
        self.prompts: list[list[dict]] = []
        self.running = self.peak = 0
        self.all_started: asyncio.Event | None = None

    async def __call__(self, messages):
        self.all_started = self.all_started or asyncio.Event()
        self.prompts.append(messages)
        self.running += 1
        self.peak = max(self.peak, self.running)
        if len(self.prompts) == self.expect:
            self.all_started.set()
        await asyncio.wait_for(self.all_started.wait(), 2)
        await asyncio.sleep(0)
        self.running -= 1
        if self.fail and len(self.prompts) == self.expect:
            raise JudgeUnavailable("judge down")
        is_vote = "boxed" in messages[0]["content"]
        return (self.votes if is_vote else self.hints).pop(0)


def test_model_judge_runs_all_calls_concurrently_and_combines():
    complete = Scripted(votes=["ok \\boxed{-1}", "garbled", "\\boxed{-1}"],
                        hints=["[NO_HINT]", "[HINT_START]Use Tuesday.[HINT_END]",
                               "[HINT_START]The meeting was on Tuesday; give its date correctly.[HINT_END]"],
                        expect=6)
    inp = turn([user("No, the meeting was on Tuesday.")])
    j = asyncio.run(ModelJudge(complete, votes=3).judge(inp))
    assert complete.peak == 6
    assert j.score == -1
    assert j.votes == [-1, None, -1]
    assert j.hint == "The meeting was on Tuesday; give its date correctly."
    assert j.raw[:3] == ["ok \\boxed{-1}", "garbled", "\\boxed{-1}"]
    assert j.raw[3] == "[NO_HINT]" and len(j.raw) == 6
    kinds = sorted("boxed" in p[0]["content"] for p in complete.prompts)
    assert kinds == [False] * 3 + [True] * 3
    assert complete.prompts.count(vote_prompt(inp)) == 3
    assert complete.prompts.count(hint_prompt(inp)) == 3


def test_model_judge_tie_and_no_hint():
    complete = Scripted(votes=["\\boxed{1}", "\\boxed{-1}"],
                        hints=["[NO_HINT]", "[HINT_START]short[HINT_END]"], expect=4)
    j = asyncio.run(ModelJudge(complete, votes=2).judge(turn([user("ok")])))
    assert (j.score, j.votes, j.hint) == (0, [1, -1], None)


def test_model_judge_propagates_errors():
    complete = Scripted(votes=["\\boxed{1}"] * 3, hints=["[NO_HINT]"] * 3, expect=6, fail=True)
    with pytest.raises(JudgeUnavailable):
        asyncio.run(ModelJudge(complete).judge(turn([user("thanks")])))


def test_make_judge():
    assert isinstance(make_judge("rules", 3), RulesJudge)
    complete = Scripted([], [], expect=0)
    j = make_judge("openai", 5, complete)
    assert isinstance(j, ModelJudge) and j.votes == 5 and j.complete is complete
    assert isinstance(make_judge("engine", 3, complete), ModelJudge)
    with pytest.raises(ConfigError, match="needs a completion function"):
        make_judge("engine", 3)
    with pytest.raises(ConfigError, match="rules, probe, engine, openai"):
        make_judge("gpt", 3, complete)
    with pytest.raises(ConfigError, match="probe_fit.ensure_head"):   # it needs the base model
        make_judge("probe", 3, complete)
    with pytest.raises(ConfigError, match="at least 1"):
        make_judge("openai", 0, complete)


# ------------------------------------------------------------------- openai_complete, real HTTP

class FakeJudgeEndpoint:
    """A real uvicorn server in a thread speaking the OpenAI chat-completions shape.

    `mode` picks the answer: "ok" (canned content), "500", "garbage" (200, not JSON), "nofield"."""

    def __init__(self):
        self.mode, self.bodies, self.headers = "ok", [], []
        app = Starlette(routes=[Route("/v1/chat/completions", self.handle, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def handle(self, request: Request):
        self.bodies.append(await request.json())
        self.headers.append(dict(request.headers))
        if self.mode == "500":
            return PlainTextResponse("model crashed", status_code=500)
        if self.mode == "garbage":
            return PlainTextResponse("<html>gateway</html>")
        if self.mode == "nofield":
            return JSONResponse({"choices": []})
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                             "model": "judge", "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Moved on. \\boxed{1}"}}]})

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "fake judge endpoint did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def endpoint():
    with FakeJudgeEndpoint() as e:
        yield e


def test_openai_complete_against_fake_judge_endpoint(endpoint):
    endpoint.mode = "ok"
    complete = openai_complete(endpoint.url + "/", "judge-model", "sk-test", temperature=0.6, max_tokens=128)
    messages = vote_prompt(turn([user("thanks!")]))
    assert asyncio.run(complete(messages)) == "Moved on. \\boxed{1}"
    body = endpoint.bodies[-1]
    assert body["model"] == "judge-model"
    assert body["messages"] == messages
    assert body["temperature"] == 0.6 and body["max_tokens"] == 128
    assert endpoint.headers[-1]["authorization"] == "Bearer sk-test"


def test_model_judge_over_fake_judge_endpoint(endpoint):
    endpoint.mode = "ok"
    j = asyncio.run(ModelJudge(openai_complete(endpoint.url, "judge", None), votes=3)
                    .judge(turn([user("Thanks!")])))
    assert (j.score, j.votes, j.hint) == (1, [1, 1, 1], None)
    assert "authorization" not in endpoint.headers[-1]


@pytest.mark.parametrize("mode, match", [("500", "HTTP 500"), ("garbage", "message.content"),
                                         ("nofield", "message.content")])
def test_openai_complete_bad_answers_from_fake_judge_endpoint(endpoint, mode, match):
    endpoint.mode = mode
    with pytest.raises(JudgeUnavailable, match=match) as e:
        asyncio.run(openai_complete(endpoint.url, "judge", None)([user("hi")]))
    assert isinstance(e.value, ClawrlError)


def test_openai_complete_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]        # closed again: nothing listens there
    with pytest.raises(JudgeUnavailable, match="unreachable"):
        asyncio.run(openai_complete(f"http://127.0.0.1:{port}/v1", "judge", None, timeout=5)([user("hi")]))


def test_an_echo_of_the_listed_choices_is_not_a_vote():
    # Seen with the 135M engine judge: it repeats the instruction line, whose last box is -1.
    assert parse_vote("Answer \\boxed{1}, \\boxed{0} or \\boxed{-1}.") is None
    assert parse_vote("\\boxed{1}: moves on. \\boxed{-1}: corrects. \\boxed{0}: unclear.") is None
    assert parse_vote("It failed, so \\boxed{-1}") == -1


def test_the_probe_waits_for_serving_but_not_forever():
    """A judging pass with the probe (which reads on the engine's cores) starts once the engine
    generates nothing, and after `most_s` even when it never stops."""
    from clawrl.judge.loop import after_serving

    class Streams:            # what the judging loop reads of an engine: Engine.active_count
        def __init__(self, active: int):
            self.active = active

        def active_count(self) -> int:
            return self.active

    async def scenario():
        idle = await after_serving(Streams(0), 5.0)
        busy = Streams(1)
        asyncio.get_running_loop().call_later(0.3, setattr, busy, "active", 0)
        ends = await after_serving(busy, 5.0)
        never = await after_serving(Streams(2), 0.4)
        off = await after_serving(Streams(2), 0.0)
        return idle, ends, never, off

    idle, ends, never, off = asyncio.run(scenario())
    assert idle < 0.05 and off < 0.05
    assert 0.25 <= ends < 1.0
    assert 0.4 <= never < 1.0
