"""Which corrected turns of a consolidation window get the hinted teacher's answer
(consolidate.teacher_answers): by default only as many as the window has more -1 than +1 turns,
the newest ones; never a turn without the user's words or without its request. No model here:
the answers themselves are written in tests/test_consolidate.py."""
from __future__ import annotations

import pytest

from clawrl.config import load_config
from clawrl.errors import ConfigError
from clawrl.learn.consolidate import Example, teacher_asked

REQUEST = {"messages": [{"role": "user", "content": "Tell me about tides."}]}


def window(labels: str, hintless: set[int] = frozenset(), requestless: set[int] = frozenset()):
    """One example per character, oldest first: '+' a turn judged +1, '-' one judged -1 (with the
    user's words as its hint unless its index is in `hintless`); every turn keeps its request
    unless its index is in `requestless`."""
    return [Example(i, [1, 2], [3], c == "+",
                    hint=None if c == "+" or i in hintless else f"shorter please ({i})",
                    request=None if i in requestless else REQUEST)
            for i, c in enumerate(labels)]


def ids(examples):
    return [e.id for e in examples]


def test_balance_asks_for_the_newest_corrections_until_the_labels_are_even():
    w = window("+--+-----")                 # 2 good, 7 bad: 5 answers even it
    assert ids(teacher_asked(w, "balance")) == [4, 5, 6, 7, 8]
    assert len(teacher_asked(w, "balance")) + 2 == 7


def test_balance_asks_for_none_on_a_window_with_as_many_approvals():
    assert teacher_asked(window("+-+-+-"), "balance") == []
    assert teacher_asked(window("++-+"), "balance") == []


def test_balance_asks_for_every_usable_correction_when_the_gap_is_larger():
    w = window("------+", hintless={1}, requestless={3})   # gap 5, but only 4 can be asked
    assert ids(teacher_asked(w, "balance")) == [0, 2, 4, 5]


def test_always_and_off():
    w = window("+-+--", hintless={3})
    assert ids(teacher_asked(w, "always")) == [1, 4]
    assert teacher_asked(w, "off") == []


def test_the_setting_is_balance_by_default_and_names_its_choices():
    assert load_config(env={}).consolidate.teacher_answers == "balance"
    assert load_config(env={"CLAWRL_CONSOLIDATE_TEACHER_ANSWERS": "always"}).consolidate.teacher_answers \
        == "always"
    with pytest.raises(ConfigError, match="balance, always, off"):
        load_config(env={"CLAWRL_CONSOLIDATE_TEACHER_ANSWERS": "true"})
