"""`clawrl consolidate`'s progress line: the steps, the loss, and about how long is left at the
pace of the steps seen so far. Fast: no model, a clock the test moves."""
from __future__ import annotations

import io

from clawrl.ops.consolidate import Bar, duration


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line]


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (0, 40.4, 89, 90, 725, 3600, 3900, -3)] == \
        ["0 s", "40 s", "89 s", "2 min", "12 min", "1 h 00 min", "1 h 05 min", "0 s"]


def test_time_left_follows_the_pace_of_the_steps_seen():
    out, clock = io.StringIO(), Clock()
    bar = Bar(out, clock)
    bar({"step": 0, "steps": 60})                 # training starts: no line, no pace yet
    for step in range(1, 61):
        clock.now += 20                            # 20 s a step
        bar({"step": step, "steps": 60, "loss": [0.5]})
    shown = lines(out)
    # not a terminal: a line for the first step, then one per tenth
    assert [int(line.split("step ")[1].split("/")[0]) for line in shown] == [1, 6, 12, 18, 24, 30, 36, 42,
                                                                            48, 54, 60]
    assert shown[1].startswith("consolidating [") and "loss 0.5000" in shown[1]
    assert "about 18 min left" in shown[1]         # step 6: 54 steps left at 20 s
    assert "about 10 min left" in shown[5]         # step 30: 30 left
    assert "step 60/60" in shown[-1] and "left" not in shown[-1]


def test_a_follower_that_joins_late_times_only_what_it_saw():
    # `clawrl consolidate` may follow a trainer's run from its 40th step: the pace is measured
    # from there, not from step 0
    out, clock = io.StringIO(), Clock()
    bar = Bar(out, clock)
    bar({"step": 40, "steps": 100})
    clock.now += 100
    bar({"step": 50, "steps": 100})                # 10 steps in 100 s
    assert "about 8 min left" in lines(out)[-1]    # 50 steps x 10 s = 500 s


def test_no_line_before_the_steps_are_known():
    out = io.StringIO()
    Bar(out, Clock())({"step": 0, "steps": None, "message": "the hinted teacher answers 3 turns"})
    assert out.getvalue() == ""


def test_status_says_how_long_a_running_consolidation_has_left():
    from clawrl.ops.status import consolidation_text, time_left
    running = {"state": "running", "started_at": 900.0, "training_at": 1000.0, "step": 10, "steps": 40,
               "loss": [0.5, 0.48]}
    assert time_left(running, now=1200.0) == ", about 10 min left"        # 20 s a step, 30 to go
    assert time_left({**running, "step": 0}, now=1200.0) == ""           # no step taken: no pace
    assert time_left({**running, "training_at": None}, now=1200.0) == ""  # a status from before this
    assert time_left({**running, "step": 40}, now=1200.0) == ""          # the last step is done
    assert "step 10 of 40, loss 0.4800, about " in consolidation_text(running, "off")
