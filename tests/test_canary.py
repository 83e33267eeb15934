"""The swap's canary verdict: a version is rejected for a collapse its base model does not show.

The daemon-level paths (a collapsed version rejected and the previous one restored, before and
after a restart) are in test_swap.py and test_crash.py; these pin the verdict itself, which reads
the new version's answers against the base model's answers to the same prompts."""
from __future__ import annotations

from clawrl.adapters.swap import collapse, repetition

PROSE = ([5, 9, 14, 2, 77, 31, 8, 40, 12, 6, 19, 23, 51, 3, 88, 61], "a varied answer")
LOOPING = ([7, 8, 9, 10] * 4, "over and over and over")
HALF_LOOPING = ([1, 2, 3, 4] + [7, 8, 9, 10] * 3, "starts well, then repeats")


def test_the_answers_it_reads_are_what_repetition_says():
    assert repetition(PROSE[0]) == 0.0
    assert repetition(LOOPING[0]) > 0.6
    assert 0.2 < repetition(HALF_LOOPING[0]) < 0.5


def test_a_version_that_loops_where_the_base_does_not_is_rejected():
    reason = collapse([LOOPING, LOOPING], [PROSE, HALF_LOOPING])
    assert reason and "loop" in reason and "base" in reason


def test_a_version_that_loops_no_more_than_its_base_is_kept():
    """A near-copy of the base on a prompt the base loops on by itself (what the dashboard's tests
    met under int8 weights): not a collapse of the version."""
    assert collapse([LOOPING, LOOPING], [LOOPING, LOOPING]) is None
    assert collapse([PROSE, LOOPING], [PROSE, PROSE]) is None       # one answer still fine


def test_empty_answers_are_a_collapse_unless_the_base_is_silent_too():
    silent = ([], "")
    assert collapse([silent, ([5], "  ")], [PROSE, PROSE]) == "canary: every answer was empty"
    assert collapse([silent, silent], [silent, silent]) is None
    assert collapse([silent, PROSE], [PROSE, PROSE]) is None
