"""The hinted teacher's own answers (learn/hinted_answers.py), written by the real base model.

What would break: answers written from the plain request (the hint ignored), cut-off answers
kept as if the teacher preferred them, or a stop that does not stop.
"""
from __future__ import annotations

import threading

import pytest

from clawrl.chat.format import render_prompt
from clawrl.learn import hinted_answers
from clawrl.learn.teacher import hinted_messages
from test_trainer import lm, score, served  # noqa: F401

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "Name a primary color.",
             "How do vaccines work?", "What day comes after Monday?", "Who wrote Hamlet?"]
HINT = "Way too long. Answer with one word only, nothing else."


def wanted(lm) -> list[hinted_answers.Wanted]:
    out = []
    for i, q in enumerate(QUESTIONS):
        turn = served(lm, q)
        out.append(hinted_answers.Wanted(i, {"messages": turn["messages"], "tools": None}, HINT,
                                         turn["response_ids"]))
    return out


def test_the_answers_come_from_the_hinted_request(lm):
    """Sampled from the hinted request, the answers are likelier there than under the plain one:
    on average by KL(hinted || plain) > 0. Sampled from the plain request, they would be less
    likely there (by -KL(plain || hinted))."""
    tok, model, _ = lm
    asked = wanted(lm)
    answers = hinted_answers.write(model, tok, asked, 512, 96, threading.Event())
    assert set(answers) == {w.id for w in asked}
    assert sum(a is not None for a in answers.values()) >= 4, answers
    gain = []
    for w in asked:
        if answers[w.id] is None:
            continue
        ids = answers[w.id]
        assert ids[-1] == tok.eos_token_id and ids != w.response_ids
        plain = render_prompt(tok, w.request["messages"], None)
        hinted = render_prompt(tok, hinted_messages(w.request["messages"], w.hint), None)
        gain.append(float(score(model, hinted, ids).sum() - score(model, plain, ids).sum()))
    assert sum(gain) / len(gain) > 1.0, gain
    # The same seed writes the same answers; the global generator is left as it was.
    import torch
    state = torch.random.get_rng_state()
    assert hinted_answers.write(model, tok, asked, 512, 96, threading.Event()) == answers
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_answer_cut_off_by_the_budget_is_left_out(lm):
    tok, model, _ = lm
    asked = wanted(lm)[1:4:2]          # "why" and "how" questions: never done in 2 tokens
    assert hinted_answers.write(model, tok, asked, 512, 2, threading.Event()) == {1: None, 3: None}
    assert hinted_answers.finished([5, 6, 2, 7], 2) == [5, 6, 2]
    assert hinted_answers.finished([5, 6, 7], 2) is None


def test_a_kept_answer_is_read_back_only_under_its_key():
    under = hinted_answers.key("model-a", "shorter please", 256, 128)
    assert under != hinted_answers.key("model-b", "shorter please", 256, 128)
    assert under != hinted_answers.key("model-a", "in French please", 256, 128)
    assert under != hinted_answers.key("model-a", "shorter please", 256, 64)
    assert hinted_answers.recall(hinted_answers.keep([4, 5, 2], under), under) == (True, [4, 5, 2])
    assert hinted_answers.recall(hinted_answers.keep(None, under), under) == (True, None)
    other = hinted_answers.key("model-b", "shorter please", 256, 128)
    assert hinted_answers.recall(hinted_answers.keep([4, 5, 2], other), under) == (False, None)
    for stored in (None, "", "not json", "[1, 2]", '{"key": 3}'):
        assert hinted_answers.recall(stored, under) == (False, None)


def test_a_stop_ends_the_writing_between_batches(lm):
    tok, model, _ = lm
    stop = threading.Event()
    stop.set()
    seen = []
    assert hinted_answers.write(model, tok, wanted(lm), 512, 32, stop,
                                lambda done, total: seen.append(done)) == {}
    assert seen == []
