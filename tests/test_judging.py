"""Next states become judgments (rules judge, real daemon); sessions end; explicit feedback."""
from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.model


def post_chat(daemon, session: str, messages: list[dict]) -> tuple[str, int]:
    r = httpx.post(f"{daemon.url}/v1/chat/completions", timeout=120, headers={"X-Session-Id": session},
                   json={"model": "m", "max_tokens": 8, "temperature": 0, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], int(r.headers["x-clawrl-turn-id"])


def wait_judged(daemon, turn_id: int, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = daemon.turn(turn_id)
        if row["judge_status"] is not None:
            return row
        time.sleep(0.1)
    raise AssertionError(f"turn {turn_id} not judged within {timeout} s: {daemon.turn(turn_id)}")


def converse(daemon, replies: list[str]) -> tuple[str, list[int]]:
    """A session where the user answers each response with the next reply."""
    session = f"judge-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "user", "content": "Explain photosynthesis."}]
    turns = []
    for reply in replies + [None]:
        text, turn_id = post_chat(daemon, session, msgs)
        turns.append(turn_id)
        if reply is None:
            break
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": reply}]
    return session, turns


def test_correction_and_thanks_are_judged_with_votes_and_hint(daemon):
    correction = "No, that's wrong. Please answer in one short sentence without jargon."
    _, (t1, t2, t3) = converse(daemon, [correction, "Thanks, that is great!"])
    r1, r2 = wait_judged(daemon, t1), wait_judged(daemon, t2)
    assert (r1["judge_status"], r1["judge_score"]) == ("done", -1)
    assert correction in r1["judge_hint"]
    assert json.loads(r1["judge_votes"]) == [-1] and json.loads(r1["judge_raw"])
    assert (r2["judge_score"], r2["judge_hint"]) == (1, None)
    assert daemon.turn(t3)["judge_status"] is None     # no next state yet: waits


def test_session_end_records_the_last_turn_as_without_next_state(daemon):
    session, (t1, t2) = converse(daemon, ["Thanks!"])
    r = httpx.post(f"{daemon.url}/v1/sessions/{session}/end", timeout=30)
    assert r.json() == {"session_id": session, "ended": True}
    last = daemon.turn(t2)
    assert last["judge_status"] == "no_next_state" and last["judge_score"] is None
    assert wait_judged(daemon, t1)["judge_score"] == 1
    missing = httpx.post(f"{daemon.url}/v1/sessions/nope-{uuid.uuid4().hex}/end", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"


def test_explicit_feedback_is_stored_on_the_right_turn(daemon):
    session, (t1, t2) = converse(daemon, ["ok, next question: what is rain?"])
    r = httpx.post(f"{daemon.url}/v1/feedback", timeout=30, headers={"X-User-Id": "ada"},
                   json={"session_id": session, "reward": -1, "comment": "Too long, keep it to a line."})
    assert r.status_code == 200 and r.json() == {"session_id": session, "turn_id": t2, "reward": -1}
    r = httpx.post(f"{daemon.url}/v1/feedback", timeout=30,
                   json={"session_id": session, "turn_id": t1, "reward": 1})
    assert r.json()["turn_id"] == t1
    rows = {t: daemon.turn(t) for t in (t1, t2)}
    assert (rows[t2]["feedback_reward"], rows[t2]["feedback_comment"], rows[t2]["feedback_user"]) == \
        (-1, "Too long, keep it to a line.", "ada")
    assert rows[t1]["feedback_reward"] == 1 and rows[t1]["feedback_comment"] is None


@pytest.mark.parametrize("body,status,param", [
    ({"reward": 1}, 400, "session_id"),
    ({"session_id": "s", "reward": 2}, 400, "reward"),
    ({"session_id": "s", "reward": True}, 400, "reward"),
    ({"session_id": "s", "reward": 1, "turn_id": "x"}, 400, "turn_id"),
    ({"session_id": "s", "reward": 1, "comment": 5}, 400, "comment"),
    ({"session_id": "never-seen", "reward": 1}, 404, "turn_id"),
])
def test_bad_feedback_is_a_clear_error(daemon, body, status, param):
    r = httpx.post(f"{daemon.url}/v1/feedback", json=body, timeout=30)
    assert r.status_code == status and r.json()["error"]["param"] == param
