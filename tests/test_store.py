"""The turn log's writer (turnlog/store.py) on real SQLite files: what each write leaves in the
database, read back with plain sqlite3 or the module's own read functions.

Fast: no daemon, no model, no network. Every test opens a real Store on a file under tmp_path and
drives it with asyncio.run, as the daemon's coroutines would.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import stat
import time
from pathlib import Path

import pytest

from clawrl.turnlog import store
from clawrl.turnlog.redact import MASK, Redactor
from clawrl.turnlog.store import Store, read_counts, read_sessions, read_turns, replayed_response
from clawrl.types import Attribution, Finish

# Secret-shaped strings the built-in patterns mask (made up; built in pieces so that no scanner
# mistakes this file for a leak).
KEY = "sk-" + "Zq7" * 8
TOKEN = "gh" + "p_" + "A1b2" * 9


# -- helpers ----------------------------------------------------------------------------------------

@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "clawrl.db"


def with_store(path: Path, body, redactor: Redactor | None = None):
    """body(store)'s result, run on a Store opened on `path` and closed after."""
    async def main():
        s = await Store.open(path, redactor)
        try:
            return await body(s)
        finally:
            await s.close()
    return asyncio.run(main())


def rows(path: Path, query: str, *args) -> list[dict]:
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(query, args)]
    finally:
        con.close()


def write(path: Path, query: str, *args) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute(query, args)
        con.commit()
    finally:
        con.close()


def turn_row(path: Path, turn_id: int) -> dict:
    (row,) = rows(path, "SELECT * FROM turns WHERE id=?", turn_id)
    return row


def stored_bytes(path: Path) -> bytes:
    """The database file and its side files, as they lie on disk."""
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None, calls: list[dict] | None = None) -> dict:
    m: dict = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = calls
    return m


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def call(name: str, arguments: str, id: str = "c1") -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def request(messages: list[dict]) -> dict:
    return {"messages": messages, "tools": None, "params": {"max_tokens": 8}}


async def answer(s: Store, att: Attribution, messages: list[dict], text: str, *,
                 tool_calls: list[dict] | None = None, prompt_ids=(1, 2, 3), token_ids=(7, 8, 9)) -> int:
    """One turn begun and completed, as the daemon records a served request."""
    tid = await s.begin_turn(att, request(messages), list(prompt_ids), "m", 0)
    await s.finish_turn(tid, status="complete", text=text, token_ids=list(token_ids),
                        logprobs=[-0.5] * len(token_ids), tool_calls=tool_calls,
                        finish=Finish("stop", len(prompt_ids), len(token_ids)), ttft_ms=1.0, total_ms=2.0)
    return tid


async def conversation(s: Store, session_id: str, prompts: list[str], **att) -> list[int]:
    """Main turns of one session; each request replays the answer before it, as a client does, so
    every turn but the last gets its next state."""
    messages: list[dict] = []
    ids = []
    for i, prompt in enumerate(prompts):
        messages = [*messages, user(prompt)]
        text = f"answer {i} in {session_id}"
        ids.append(await answer(s, Attribution(session_id, **att), messages, text))
        messages = [*messages, assistant(text)]
    return ids


# -- recording a turn -------------------------------------------------------------------------------

def test_a_turn_is_recorded_as_started_on_arrival_and_completed_with_its_response_at_the_end(db):
    req = {"messages": [system("be kind"), user("hi")],
           "tools": [{"type": "function", "function": {"name": "read"}}], "params": {"max_tokens": 8}}

    async def body(s):
        tid = await s.begin_turn(Attribution("s1", user_id="alice"), req, [1, 2, 3], "smol", 2,
                                 skills={"notes": "h1"})
        started = turn_row(db, tid)        # what a crash mid-stream would leave
        await s.finish_turn(tid, status="complete", text="Hello!", token_ids=[7, 8, 2],
                            logprobs=[-0.5, -0.25, -0.125], tool_calls=None,
                            finish=Finish("stop", 3, 3, cached_tokens=1, adapter_version=4),
                            ttft_ms=12.5, total_ms=40.0, reasoning="they greet me")
        return tid, started

    tid, started = with_store(db, body)
    assert started["status"] == "started" and started["response_text"] is None
    assert started["completed_at"] is None and started["created_at"] is not None
    assert json.loads(started["request_json"]) == req
    assert json.loads(started["prompt_ids"]) == [1, 2, 3]
    assert json.loads(started["skills"]) == {"notes": "h1"}
    assert (started["session_id"], started["user_id"], started["turn_index"], started["turn_type"],
            started["kind"], started["trainable"], started["model"], started["adapter_version"],
            started["n_messages"]) == ("s1", "alice", 0, "main", "main", 1, "smol", 2, 2)

    done = turn_row(db, tid)
    assert done["status"] == "complete" and done["response_text"] == "Hello!"
    assert done["reasoning_text"] == "they greet me"
    assert json.loads(done["response_ids"]) == [7, 8, 2]
    assert json.loads(done["response_logprobs"]) == [-0.5, -0.25, -0.125]
    assert done["tool_calls"] is None and done["error"] is None and done["trainable"] == 1
    assert (done["finish_reason"], done["prompt_tokens"], done["completion_tokens"], done["cached_tokens"],
            done["ttft_ms"], done["total_ms"]) == ("stop", 3, 3, 1, 12.5, 40.0)
    assert done["adapter_version"] == 4          # the adapter that actually served it
    assert done["completed_at"] is not None
    assert rows(db, "SELECT id, user_id, derived, ended_at FROM sessions") == [
        {"id": "s1", "user_id": "alice", "derived": 0, "ended_at": None}]


def test_a_turn_that_ends_without_a_finish_keeps_its_error_and_the_adapter_it_began_with(db):
    async def body(s):
        tid = await s.begin_turn(Attribution("s"), request([user("hi")]), [1, 2], "m", 3)
        await s.finish_turn(tid, status="failed", text="", token_ids=[], logprobs=[], tool_calls=[],
                            finish=None, ttft_ms=None, total_ms=5.0, error="engine died")
        return tid

    row = turn_row(db, with_store(db, body))
    assert row["status"] == "failed" and row["error"] == "engine died"
    assert row["adapter_version"] == 3 and row["finish_reason"] is None and row["prompt_tokens"] is None
    assert row["tool_calls"] is None and json.loads(row["response_ids"]) == [] and row["completion_tokens"] == 0


def test_side_turns_and_opted_out_turns_are_recorded_but_not_trainable(db):
    async def body(s):
        side = await answer(s, Attribution("s", turn_type="side", kind="heartbeat"), [user("beat")], "ok")
        opted_out = await answer(s, Attribution("s", no_train=True), [user("hi")], "hello")
        main = await answer(s, Attribution("s", kind="subagent"), [user("go")], "went")
        return side, opted_out, main

    side, opted_out, main = (turn_row(db, t) for t in with_store(db, body))
    assert (side["turn_type"], side["kind"], side["trainable"], side["turn_index"]) == ("side", "heartbeat", 0, 0)
    assert (opted_out["trainable"], opted_out["turn_index"]) == (0, 1)
    assert (main["kind"], main["trainable"], main["turn_index"]) == ("subagent", 1, 2)


def test_concurrent_requests_of_one_session_each_get_their_own_turn_index(db):
    async def body(s):
        return await asyncio.gather(*(s.begin_turn(Attribution("s"), request([user(f"q{i}")]), [i], "m", 0)
                                      for i in range(12)))

    ids = with_store(db, body)
    got = rows(db, "SELECT id, turn_index, prompt_ids FROM turns ORDER BY turn_index")
    assert len(set(ids)) == 12 and sorted(r["id"] for r in got) == sorted(ids)
    assert [r["turn_index"] for r in got] == list(range(12))
    assert sorted(json.loads(r["prompt_ids"])[0] for r in got) == list(range(12))


# -- next states ------------------------------------------------------------------------------------

def test_a_second_turn_of_a_session_becomes_the_next_state_of_the_first(db):
    async def body(s):
        first = await answer(s, Attribution("s"), [user("What is 2+2?")], "5")
        second = await answer(s, Attribution("s"), [user("What is 2+2?"), assistant("5"), user("No, it is 4.")],
                              "Sorry, 4.")
        return first, second

    first, second = with_store(db, body)
    t0, t1 = turn_row(db, first), turn_row(db, second)
    assert t0["next_state_role"] == "user" and json.loads(t0["next_state_json"]) == [user("No, it is 4.")]
    assert t0["next_state_at"] is not None
    assert t1["turn_index"] == 1 and t1["next_state_json"] is None and t1["next_state_at"] is None


def test_tool_results_after_a_tool_call_become_its_next_state(db):
    served = call("read", '{"path": "a.txt", "n": 1}')
    replayed = call("read", '{"n":1,"path":"a.txt"}')    # the client re-serialised the arguments
    result = {"role": "tool", "tool_call_id": "c1", "content": "file body"}

    async def body(s):
        first = await answer(s, Attribution("s"), [user("read a.txt")], "", tool_calls=[served])
        await answer(s, Attribution("s"), [user("read a.txt"), assistant(None, [replayed]), result], "It says...")
        return first

    t0 = turn_row(db, with_store(db, body))
    assert json.loads(t0["tool_calls"]) == [served]
    assert t0["next_state_role"] == "tool" and json.loads(t0["next_state_json"]) == [result]


def test_a_client_that_rebuilds_a_context_block_last_still_links_the_next_state(db):
    async def body(s):
        first = await answer(s, Attribution("s"), [system("rules"), user("hi"), system("<context 1>")], "hello")
        await answer(s, Attribution("s"),
                     [system("rules"), user("hi"), assistant("hello"), user("and?"), system("<context 2>")], "more")
        return first

    t0 = turn_row(db, with_store(db, body))
    assert t0["next_state_role"] == "user"
    assert json.loads(t0["next_state_json"]) == [user("and?"), system("<context 2>")]


def test_neither_another_sessions_turn_nor_a_side_turn_becomes_the_next_state(db):
    replay = [user("hi"), assistant("hello"), user("thanks")]

    async def body(s):
        first = await answer(s, Attribution("a"), [user("hi")], "hello")
        beat = await answer(s, Attribution("a", turn_type="side", kind="heartbeat"), replay, "ok")
        after_side = turn_row(db, first)
        other = await answer(s, Attribution("b"), replay, "np")
        after_other = turn_row(db, first)
        second = await answer(s, Attribution("a"), replay, "you're welcome")
        return first, beat, other, second, after_side, after_other

    first, beat, other, second, after_side, after_other = with_store(db, body)
    assert after_side["next_state_at"] is None and after_other["next_state_at"] is None
    # The main turn that follows links past the side turn in between.
    assert json.loads(turn_row(db, first)["next_state_json"]) == [user("thanks")]
    assert turn_row(db, second)["turn_index"] == 2
    for tid in (beat, other, second):
        assert turn_row(db, tid)["next_state_at"] is None, tid
    assert turn_row(db, other)["turn_index"] == 0


def test_only_a_completed_turn_gets_a_next_state_and_only_the_first_one(db):
    history = [user("hi"), assistant("hello"), user("again?")]

    async def body(s):
        att = Attribution("s")
        t0 = await s.begin_turn(att, request([user("hi")]), [1], "m", 0)      # still streaming
        t1 = await answer(s, att, history, "yes")
        await s.finish_turn(t0, status="complete", text="hello", token_ids=[5], logprobs=[-0.1],
                            tool_calls=None, finish=Finish("stop", 1, 1), ttft_ms=1, total_ms=1)
        await s.begin_turn(att, request([*history, assistant("yes"), user("first reply")]), [1], "m", 0)
        # A retry of that request, still with t1 as the last complete main turn: t1 keeps its link.
        await s.begin_turn(att, request([*history, assistant("yes"), user("second reply")]), [1], "m", 0)
        return t0, t1

    t0, t1 = with_store(db, body)
    assert turn_row(db, t0)["next_state_at"] is None
    assert json.loads(turn_row(db, t1)["next_state_json"]) == [user("first reply")]


def test_a_history_cut_short_settles_its_turn_and_one_ending_at_the_response_waits(db):
    async def body(s):
        compacted = await answer(s, Attribution("c"), [user("a long chat")], "a long answer")
        await answer(s, Attribution("c"), [system("summary of the chat so far"), user("next")], "ok")
        continued = await answer(s, Attribution("e"), [user("write a poem")], "Roses")
        await s.begin_turn(Attribution("e"), request([user("write a poem"), assistant("Roses")]), [1], "m", 0)
        return compacted, continued

    compacted, continued = with_store(db, body)
    for tid in (compacted, continued):
        row = turn_row(db, tid)
        assert row["next_state_at"] is None and row["next_state_json"] is None, tid
    # A history without the answer will never hold it again: settled, not left waiting forever;
    # one that ends at the answer may still be followed.
    assert turn_row(db, compacted)["judge_status"] == "no_next_state"
    assert turn_row(db, continued)["judge_status"] is None
    assert read_counts(db)["awaiting_next_state"] == 2     # `continued`, and the newest turn of "c"


A_CALL = call("read", '{"path": "a.txt"}')
A_CALL_REPLAYED = call("read", '{ "path" : "a.txt" }', id="other-id")


@pytest.mark.parametrize("messages, n_prev, text, calls, at", [
    ([user("q"), assistant("x")], 1, "x", None, 1),
    ([system("s"), user("q"), assistant("x"), user("q2"), system("ctx")], 3, "x", None, 2),
    ([user("q"), assistant("x"), assistant("y"), user("q2")], 2, "x", None, 1),
    ([user("q"), {"role": "assistant", "content": [{"type": "text", "text": "  x "}]}, assistant("y")],
     2, "x", None, 1),
    ([user("q"), assistant("x", [A_CALL_REPLAYED]), assistant("x"), user("q2")], 2, "x", [A_CALL], 1),
    ([user("q"), assistant("x", [call("write", '{"path": "a.txt"}')]), {"role": "tool", "content": "ok"}],
     1, "x", [A_CALL], 1),
    ([user("q"), assistant("x, edited by the client"), user("q2")], 1, "x", None, 1),
    ([system("summary"), user("next")], 1, "x", None, None),
    ([user("q")], 5, "x", None, None),
    ([user("q"), assistant("x"), user("q2"), user("q3")], 3, "x", None, None),
], ids=["at-n-prev", "context-block-last", "content-beats-position", "text-parts-and-whitespace",
        "tool-calls-by-name-and-parsed-arguments", "rewritten-call-taken-at-its-place",
        "rewritten-text-taken-at-its-place", "history-compacted", "history-shorter", "no-assistant-there"])
def test_the_previous_response_is_found_where_a_replayed_history_puts_it(messages, n_prev, text, calls, at):
    assert replayed_response(messages, n_prev, text, calls) == at


# -- judging ----------------------------------------------------------------------------------------

def test_turns_to_judge_are_complete_trainable_turns_with_a_next_state_until_judged(db):
    async def body(s):
        a0, a1, a2 = await conversation(s, "a", ["q0", "q1", "q2"])
        n0, _ = await conversation(s, "n", ["q0", "q1"], no_train=True)
        await answer(s, Attribution("a", turn_type="side", kind="memory"), [user("remember")], "ok")
        before = await s.turns_to_judge()
        first = await s.turns_to_judge(limit=1)
        await s.save_judgment(a0, 1, [1, 1, 1], ["\\boxed{1}"] * 3, None)
        return (a0, a1, a2, n0), before, first, await s.turns_to_judge()

    (a0, a1, a2, n0), before, first, after = with_store(db, body)
    assert [r["id"] for r in before] == [a0, a1]        # in the order their next states arrived
    assert [r["id"] for r in first] == [a0] and [r["id"] for r in after] == [a1]
    r = before[0]
    assert set(r) == {"id", "session_id", "request_json", "response_text", "tool_calls", "next_state_json",
                      "judge_attempts"}
    assert (r["session_id"], r["response_text"], r["judge_attempts"]) == ("a", "answer 0 in a", 0)
    assert json.loads(r["next_state_json"]) == [user("q1")]
    # The opted-out turn has its next state, and is left out for not being trainable.
    assert turn_row(db, n0)["next_state_at"] is not None and turn_row(db, n0)["trainable"] == 0
    assert turn_row(db, a2)["next_state_at"] is None
    assert turn_row(db, a0)["judge_status"] == "done"


def test_a_judgment_is_stored_with_its_score_votes_raw_outputs_and_hint(db):
    raw = ["\\boxed{-1}", "garbled", "\\boxed{-1}", "Hint: answer in one line"]

    async def body(s):
        a0, a1, _ = await conversation(s, "s", ["q0", "q1", "q2"])
        await s.judge_failed(a0, "timeout", 3600)
        await s.save_judgment(a0, -1, [-1, None, -1], raw, "answer in one line")
        await s.save_judgment(a1, 0, [0, 1, -1], ["a", "b", "c"], None)
        return a0, a1

    a0, a1 = with_store(db, body)
    r0, r1 = turn_row(db, a0), turn_row(db, a1)
    assert (r0["judge_status"], r0["judge_score"], r0["judge_hint"]) == ("done", -1, "answer in one line")
    assert json.loads(r0["judge_votes"]) == [-1, None, -1] and json.loads(r0["judge_raw"]) == raw
    assert r0["judged_at"] is not None
    assert r0["judge_error"] is None and r0["judge_attempts"] == 1    # the failure before is cleared
    assert (r1["judge_status"], r1["judge_score"], r1["judge_hint"]) == ("done", 0, None)


def test_a_failed_judgment_is_retried_after_its_delay_and_given_up_when_told(db):
    async def body(s):
        t0, _ = await conversation(s, "s", ["q0", "q1"])
        before = time.time()
        await s.judge_failed(t0, "timeout", 3600)
        after = time.time()
        waiting = turn_row(db, t0), await s.turns_to_judge()
        await s.judge_failed(t0, "timeout again", 0.01)
        await asyncio.sleep(0.05)
        retried = turn_row(db, t0), await s.turns_to_judge()
        await s.judge_failed(t0, "x" * 5000, None)
        return t0, before, after, waiting, retried, await s.turns_to_judge(), await s.counts()

    t0, before, after, (row1, queue1), (row2, queue2), queue3, counts = with_store(db, body)
    assert (row1["judge_attempts"], row1["judge_error"], row1["judge_status"]) == (1, "timeout", None)
    assert before + 3600 <= row1["judge_retry_at"] <= after + 3600
    assert queue1 == []                                      # not before its retry time
    assert (row2["judge_attempts"], row2["judge_error"], row2["judge_status"]) == (2, "timeout again", None)
    assert [(r["id"], r["judge_attempts"]) for r in queue2] == [(t0, 2)]
    gave_up = turn_row(db, t0)
    assert (gave_up["judge_attempts"], gave_up["judge_status"]) == (3, "failed")
    assert gave_up["judge_error"] == "x" * 2000              # kept bounded
    assert queue3 == [] and counts["awaiting_judge"] == 0 and read_counts(db)["awaiting_judge"] == 0


def test_a_read_waits_for_a_write_in_progress_and_never_sees_what_it_rolls_back(db):
    async def body(s):
        t0, _ = await conversation(s, "s", ["q0", "q1"])
        async with s.lock:          # another coroutine's write: open, then rolled back
            await s.db.execute("BEGIN IMMEDIATE")
            await s.db.execute("UPDATE turns SET judge_status='done' WHERE id=?", (t0,))
            reader = asyncio.ensure_future(s.turns_to_judge())
            await asyncio.sleep(0.05)
            waited = not reader.done()
            await s.db.execute("ROLLBACK")
        return t0, waited, await reader

    t0, waited, queue = with_store(db, body)
    assert waited                                   # it took its turn after the write
    assert [r["id"] for r in queue] == [t0]         # and saw the state that was committed


def test_a_failed_judgment_with_no_delay_is_retried_at_once_not_given_up(db):
    async def body(s):
        t0, _ = await conversation(s, "s", ["q0", "q1"])
        await s.judge_failed(t0, "busy", 0)
        return t0, await s.turns_to_judge()

    t0, queue = with_store(db, body)
    assert turn_row(db, t0)["judge_status"] is None          # only None means give up
    assert [r["id"] for r in queue] == [t0]


def test_a_generation_that_ends_in_an_error_reports_the_adapter_it_ran_on():
    from clawrl.engines.base import Generation
    from clawrl.types import GenParams

    async def main():
        gen = Generation([1, 2, 3], GenParams(max_tokens=4), asyncio.get_running_loop())
        gen.adapter = 7
        gen.close(error=RuntimeError("engine stopped"))
        return await gen.wait()

    finish = asyncio.run(main())
    assert (finish.reason, finish.prompt_tokens, finish.adapter_version) == ("error", 3, 7)


# -- sessions ---------------------------------------------------------------------------------------

def test_ending_a_session_settles_its_last_main_turn_as_without_a_next_state(db):
    async def body(s):
        t0, t1 = await conversation(s, "s", ["q0", "q1"])
        side = await answer(s, Attribution("s", turn_type="side", kind="heartbeat"), [user("beat")], "ok")
        ended = await s.end_session("s")
        first_end = rows(db, "SELECT ended_at FROM sessions WHERE id='s'")[0]["ended_at"]
        again, unknown = await s.end_session("s"), await s.end_session("nobody")
        return (t0, t1, side), (ended, again, unknown), first_end, await s.turns_to_judge()

    (t0, t1, side), results, first_end, queue = with_store(db, body)
    assert results == (True, False, None)
    assert first_end is not None
    assert rows(db, "SELECT ended_at FROM sessions WHERE id='s'")[0]["ended_at"] == first_end
    last = turn_row(db, t1)
    assert last["judge_status"] == "no_next_state" and last["judged_at"] is not None
    assert turn_row(db, t0)["judge_status"] is None and [r["id"] for r in queue] == [t0]
    assert turn_row(db, side)["judge_status"] is None
    assert rows(db, "SELECT count(*) AS n FROM sessions WHERE id='nobody'")[0]["n"] == 0


def test_idle_sessions_are_the_open_ones_not_seen_for_the_given_time(db):
    async def body(s):
        for sid in ("old", "fresh", "old-ended"):
            await answer(s, Attribution(sid), [user("hi")], "hello")
        write(db, "UPDATE sessions SET last_seen=last_seen-3600 WHERE id IN ('old', 'old-ended')")
        await s.end_session("old-ended")
        idle = await s.idle_sessions(60)
        await answer(s, Attribution("old"), [user("hi"), assistant("hello"), user("back")], "welcome back")
        return idle, await s.idle_sessions(60)

    idle, after_a_new_turn = with_store(db, body)
    assert idle == ["old"] and after_a_new_turn == []
    (old,) = rows(db, "SELECT last_seen FROM sessions WHERE id='old'")
    assert old["last_seen"] > time.time() - 60


def test_sessions_and_turns_are_listed_for_the_cli(db):
    async def body(s):
        await answer(s, Attribution("a", user_id="alice", derived_session=True), [user("hi")], "hello")
        await answer(s, Attribution("a", turn_type="side", kind="heartbeat"), [user("beat")], "ok")
        await answer(s, Attribution("a"), [user("hi"), assistant("hello"), user("more")], "sure")
        await answer(s, Attribution("b", user_id="bob"), [user("yo")], "hey")

    with_store(db, body)
    sessions = read_sessions(db)
    assert [(r["id"], r["user_id"], r["derived"], r["turns"], r["main_turns"], r["ended_at"]) for r in sessions] == [
        ("b", "bob", 0, 1, 1, None), ("a", "alice", 1, 3, 2, None)]      # newest first; a keeps its user
    assert [r["id"] for r in read_sessions(db, limit=1)] == ["b"]
    a = read_turns(db, "a")
    assert [(r["session_id"], r["turn_index"], r["turn_type"]) for r in a] == [
        ("a", 0, "main"), ("a", 1, "side"), ("a", 2, "main")]
    everything = read_turns(db)
    assert [r["id"] for r in everything] == sorted(r["id"] for r in everything) and len(everything) == 4
    assert [r["id"] for r in read_turns(db, limit=2)] == [r["id"] for r in everything[-2:]]


# -- feedback ---------------------------------------------------------------------------------------

def test_feedback_lands_on_the_named_turn_or_else_the_sessions_last_main_turn(db):
    async def body(s):
        t0, t1 = await conversation(s, "s", ["q0", "q1"])
        await answer(s, Attribution("s", turn_type="side", kind="heartbeat"), [user("beat")], "ok")
        (o0,) = await conversation(s, "other", ["q"])
        results = [await s.record_feedback("s", None, -1, "too long", "alice"),
                   await s.record_feedback("s", t0, 1, None, None),
                   await s.record_feedback("other", t0, -1, "not theirs", "mallory"),
                   await s.record_feedback("s", 2 ** 63, 1, None, None),
                   await s.record_feedback("nobody", None, 1, None, None)]
        return (t0, t1, o0), results

    (t0, t1, o0), results = with_store(db, body)
    assert results == [t1, t0, None, None, None]
    last = turn_row(db, t1)
    assert (last["feedback_reward"], last["feedback_comment"], last["feedback_user"]) == (-1, "too long", "alice")
    assert last["feedback_at"] is not None
    first = turn_row(db, t0)     # the other session's feedback did not touch it
    assert (first["feedback_reward"], first["feedback_comment"], first["feedback_user"]) == (1, None, None)
    assert rows(db, "SELECT count(*) AS n FROM turns WHERE feedback_at IS NOT NULL")[0]["n"] == 2
    assert turn_row(db, o0)["feedback_reward"] is None


# -- counts -----------------------------------------------------------------------------------------

def test_an_empty_log_counts_nothing_and_has_no_agreement(db):
    counts = with_store(db, lambda s: s.counts())
    assert counts == {"turns": 0, "in_flight_or_incomplete": 0, "with_next_state": 0, "judged": 0,
                      "awaiting_judge": 0, "judge_vs_feedback": {"rated": 0, "agree": 0, "wrong_sign": 0,
                                                                 "abstain": 0, "agreement": None}}
    c = read_counts(db)
    assert c["turns"] == c["in_flight"] == c["awaiting_trainer"] == c["sessions"] == c["open_sessions"] == 0
    assert c["first_at"] is None and c["judge_vs_feedback"]["agreement"] is None


def test_counts_say_where_each_turn_stands(db):
    async def body(s):
        a0, a1, a2 = await conversation(s, "a", ["q0", "q1", "q2"])
        await answer(s, Attribution("a", turn_type="side", kind="memory"), [user("remember")], "ok")
        await s.begin_turn(Attribution("b"), request([user("streaming")]), [1], "m", 0)
        await s.save_judgment(a0, 1, [1, 1, 1], ["\\boxed{1}"] * 3, None)
        await s.record_feedback("a", a0, 1, None, None)
        counts, open_counts = await s.counts(), read_counts(db)
        await s.end_session("b")
        return (a0, a1, a2), counts, open_counts

    (a0, a1, a2), counts, c = with_store(db, body)
    assert {k: v for k, v in counts.items() if k != "judge_vs_feedback"} == {
        "turns": 5, "in_flight_or_incomplete": 1, "with_next_state": 2, "judged": 1, "awaiting_judge": 1}
    assert counts["judge_vs_feedback"]["rated"] == 1 and counts["judge_vs_feedback"]["agreement"] == 1.0
    times = rows(db, "SELECT min(created_at) AS first, max(created_at) AS last FROM turns")[0]
    assert {k: v for k, v in c.items() if k != "judge_vs_feedback"} == {
        "turns": 5, "in_flight": 1, "awaiting_next_state": 1, "awaiting_judge": 1, "awaiting_trainer": 1,
        "judged": 1, "with_feedback": 1, "trained": 0, "first_at": times["first"], "last_at": times["last"],
        "sessions": 2, "open_sessions": 2}
    assert read_counts(db)["open_sessions"] == 1
    write(db, "UPDATE turns SET train_status='trained', trained_adapter=1 WHERE id=?", a0)
    c = read_counts(db)
    assert (c["awaiting_trainer"], c["trained"]) == (0, 1)


def test_the_judges_agreement_with_feedback_counts_agreements_wrong_signs_and_abstentions(db):
    async def body(s):
        t = await conversation(s, "s", ["q0", "q1", "q2", "q3", "q4"])
        for tid, score in zip(t, (1, -1, 0, 1)):
            await s.save_judgment(tid, score, [score], [f"\\boxed{{{score}}}"], None)
        for tid, reward in ((t[0], 1), (t[1], 1), (t[2], -1), (t[4], 1)):     # t[4]: no judgment to compare
            await s.record_feedback("s", tid, reward, None, None)
        return await s.counts()

    counts = with_store(db, body)
    expected = {"rated": 3, "agree": 1, "wrong_sign": 1, "abstain": 1, "agreement": 1 / 3}
    assert counts["judge_vs_feedback"] == expected
    assert read_counts(db)["judge_vs_feedback"] == expected
    assert store.judge_agreement((0, None, None, None)) == {"rated": 0, "agree": 0, "wrong_sign": 0,
                                                            "abstain": 0, "agreement": None}


def test_recent_prompts_are_the_newest_complete_main_turns_within_the_limit(db):
    async def body(s):
        await answer(s, Attribution("s"), [user("short")], "a", prompt_ids=[1, 2, 3])
        await answer(s, Attribution("s"), [user("long")], "b", prompt_ids=list(range(50)))
        await answer(s, Attribution("s", turn_type="side", kind="heartbeat"), [user("beat")], "c", prompt_ids=[4])
        await answer(s, Attribution("s"), [user(f"key {KEY}")], "d", prompt_ids=[9, 9])   # ids dropped
        await s.begin_turn(Attribution("s"), request([user("streaming")]), [6, 6], "m", 0)
        await answer(s, Attribution("s"), [user("newest")], "e", prompt_ids=[8, 8])
        return await s.recent_prompts(8, 10), await s.recent_prompts(1, 10)

    everything, one = with_store(db, body)
    assert everything == [[8, 8], [1, 2, 3]] and one == [[8, 8]]


# -- secrets ----------------------------------------------------------------------------------------

def test_a_secret_in_a_request_is_masked_and_its_turn_keeps_no_prompt_ids_and_is_never_trained(db):
    async def body(s):
        first = await answer(s, Attribution("s"), [user(f"my key is {KEY}")], "Noted.")
        second = await answer(s, Attribution("s"),
                              [user(f"my key is {KEY}"), assistant("Noted."), user(f"and {KEY} again?")], "Yes.")
        return first, second

    first, second = with_store(db, body)
    t0 = turn_row(db, first)
    assert json.loads(t0["request_json"])["messages"] == [user(f"my key is {MASK}")]
    assert json.loads(t0["prompt_ids"]) == [] and t0["trainable"] == 0
    assert json.loads(t0["response_ids"]) == [7, 8, 9]       # the answer itself held no secret
    # The history that replays the turn is masked alike, so its next state still links, masked.
    assert json.loads(t0["next_state_json"]) == [user(f"and {MASK} again?")]
    assert turn_row(db, second)["trainable"] == 0
    assert KEY.encode() not in stored_bytes(db)


@pytest.mark.parametrize("where", ["text", "reasoning", "tool_calls", "nowhere"])
def test_a_secret_in_the_answer_drops_its_token_ids_and_the_turn_is_never_trained(db, where):
    text = f"Stored {TOKEN}" if where == "text" else "Stored."
    reasoning = f"the token is {TOKEN}" if where == "reasoning" else "a plain thought"
    calls = [call("save", json.dumps({"token": TOKEN if where == "tool_calls" else "none"}))]

    async def body(s):
        tid = await s.begin_turn(Attribution("s"), request([user("save it")]), [1, 2, 3], "m", 0)
        await s.finish_turn(tid, status="complete", text=text, token_ids=[7, 8, 9], logprobs=[-0.1] * 3,
                            tool_calls=calls, finish=Finish("tool_calls", 3, 3), ttft_ms=1, total_ms=2,
                            reasoning=reasoning)
        return tid

    row = turn_row(db, with_store(db, body))
    assert json.loads(row["prompt_ids"]) == [1, 2, 3]         # the request held no secret
    assert row["completion_tokens"] == 3
    if where == "nowhere":
        assert row["trainable"] == 1 and json.loads(row["response_ids"]) == [7, 8, 9]
        assert json.loads(row["response_logprobs"]) == [-0.1] * 3
        return
    assert row["trainable"] == 0 and json.loads(row["response_ids"]) == []
    assert json.loads(row["response_logprobs"]) == []          # none without their tokens
    assert TOKEN.encode() not in stored_bytes(db)
    stored_args = json.loads(json.loads(row["tool_calls"])[0]["function"]["arguments"])
    assert {"text": row["response_text"] == f"Stored {MASK}",
            "reasoning": row["reasoning_text"] == f"the token is {MASK}",
            "tool_calls": stored_args == {"token": MASK}}[where]


def test_judge_outputs_errors_and_feedback_comments_are_masked_too(db):
    async def body(s):
        t0, _ = await conversation(s, "s", ["q0", "q1"])
        await s.judge_failed(t0, f"auth failed for {TOKEN}", 60)
        failed_error = turn_row(db, t0)["judge_error"]
        await s.save_judgment(t0, 1, [1], [f"\\boxed{{1}} {TOKEN}"], f"use {TOKEN}")
        await s.record_feedback("s", t0, 1, f"my token {TOKEN}", "alice")
        broken = await s.begin_turn(Attribution("s2"), request([user("hi")]), [1], "m", 0)
        await s.finish_turn(broken, status="failed", text="", token_ids=[5], logprobs=[-0.1], tool_calls=None,
                            finish=None, ttft_ms=None, total_ms=3.0, error=f"upstream said {TOKEN}")
        return t0, broken, failed_error

    t0, broken, failed_error = with_store(db, body)
    assert failed_error == f"auth failed for {MASK}"
    r = turn_row(db, t0)
    assert json.loads(r["judge_raw"]) == [f"\\boxed{{1}} {MASK}"] and r["judge_hint"] == f"use {MASK}"
    assert r["feedback_comment"] == f"my token {MASK}"
    b = turn_row(db, broken)
    assert b["error"] == f"upstream said {MASK}"
    assert json.loads(b["response_ids"]) == [5]              # an error message is not what the ids spell
    assert TOKEN.encode() not in stored_bytes(db)


def test_the_store_masks_with_the_redactor_it_is_given(tmp_path):
    messages = [user(f"key {KEY} and tag kangaroo-42")]

    async def body(s):
        return await answer(s, Attribution("s"), messages, "ok")

    off = tmp_path / "off.db"
    row = turn_row(off, with_store(off, body, Redactor([])))
    assert json.loads(row["request_json"])["messages"] == messages
    assert row["trainable"] == 1 and json.loads(row["prompt_ids"]) == [1, 2, 3]

    custom = tmp_path / "custom.db"
    row = turn_row(custom, with_store(custom, body, Redactor.default([r"kangaroo-\d+"])))
    assert json.loads(row["request_json"])["messages"] == [user(f"key {MASK} and tag {MASK}")]
    assert row["trainable"] == 0


# -- permissions ------------------------------------------------------------------------------------

def test_a_new_turn_log_is_created_0600_in_a_0700_folder_and_so_are_its_wal_files(tmp_path):
    path = tmp_path / "home" / "clawrl.db"

    async def body(s):
        await answer(s, Attribution("s"), [user("hi")], "hello")
        return {p.name: mode(p) for p in path.parent.iterdir()}

    modes = with_store(path, body)
    assert mode(path.parent) == 0o700
    assert modes == {"clawrl.db": 0o600, "clawrl.db-wal": 0o600, "clawrl.db-shm": 0o600}
    loose = tmp_path / "loose-home"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    store.private_dir(loose)
    assert mode(loose) == 0o700


def test_a_loose_existing_turn_log_and_its_side_files_are_tightened(tmp_path, caplog):
    path = tmp_path / "clawrl.db"
    for name, m in (("clawrl.db", 0o644), ("clawrl.db-wal", 0o666), ("clawrl.db-shm", 0o640),
                    ("notes.txt", 0o644)):
        (tmp_path / name).write_bytes(b"")
        (tmp_path / name).chmod(m)
    with caplog.at_level(logging.WARNING, logger="clawrl.store"):
        store.private_db(path)
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == {
        "clawrl.db": 0o600, "clawrl.db-wal": 0o600, "clawrl.db-shm": 0o600, "notes.txt": 0o644}
    assert caplog.text.count("tightened the permissions") == 3
    caplog.clear()
    store.private_db(path)                                   # already private: nothing to say
    assert "tightened" not in caplog.text


def test_reopening_a_loose_turn_log_tightens_it_and_keeps_its_turns(db):
    first = with_store(db, lambda s: answer(s, Attribution("s"), [user("hi")], "hello"))
    db.chmod(0o644)
    with_store(db, lambda s: s.counts())
    assert mode(db) == 0o600
    assert [r["id"] for r in read_turns(db)] == [first]
