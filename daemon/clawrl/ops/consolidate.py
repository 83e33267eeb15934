"""`clawrl consolidate`: train a fresh adapter from the judged log now (learn/consolidate.py).

With the daemon's trainer running, the command leaves a request in the adapters folder and follows
the trainer's progress; without one it runs the consolidation itself, holding the trainer's lock,
so a daemon started meanwhile waits for it. Either way the result is a version the daemon's guard,
canary and hot-swap take like any other.
"""
from __future__ import annotations

import signal
import sys
import threading
import time

from ..errors import ClawrlError

TERMINAL = ("done", "refused", "failed", "stopped")
TAKE_S = 600.0   # a trainer takes a request once its current step is done


def add_arguments(sp) -> None:
    sp.add_argument("--window", type=int, help="the newest judged turns to train on "
                                               "(default: the recipe's consolidate.window)")
    sp.add_argument("--dry-run", action="store_true",
                    help="say what the window holds and whether the schedule is due; train nothing")
    sp.add_argument("--no-wait", action="store_true",
                    help="with a running trainer: leave the request and return")


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: 40 s, 12 min, 1 h 05 min."""
    seconds = max(0, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def about_left(elapsed: float, steps_seen: int, steps_to_go: int) -> str:
    """The words `about N min left`: the steps to go at the pace of the steps seen in `elapsed`
    seconds."""
    return f"about {duration(elapsed / steps_seen * steps_to_go)} left"


class Bar:
    """One progress line: redrawn on a terminal, a line per tenth otherwise. Once a step has been
    seen to finish, it also says about how long is left, at the pace of the steps seen so far."""
    def __init__(self, out=sys.stderr, clock=time.monotonic):
        self.out, self.tty, self.shown, self.clock = out, out.isatty(), -1, clock
        self.first: tuple[float, int] | None = None    # (when, step) of the first status seen

    def __call__(self, status: dict) -> None:
        step, steps = status.get("step") or 0, status.get("steps") or 0
        loss = status.get("loss") or []
        if not steps:
            return
        now = self.clock()
        if self.first is None or step < self.first[1]:
            self.first = (now, step)
        tenth = int(10 * step / steps)
        if not self.tty and (tenth == self.shown or step == 0):
            return
        self.shown = tenth
        filled = int(30 * step / steps)
        text = (f"consolidating [{'#' * filled}{'.' * (30 - filled)}] step {step}/{steps}"
                + (f"  loss {loss[-1]:.4f}" if loss else ""))
        seen = step - self.first[1]
        if seen > 0 and step < steps:
            text += "  " + about_left(now - self.first[0], seen, steps - step)
        self.out.write(("\r" + text.ljust(90)) if self.tty else text + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.tty and self.shown >= 0:
            self.out.write("\n")


def main(args, cfg) -> int:
    from ..adapters import versions as adapters
    from ..config import consolidate_schedule
    from ..learn import consolidate
    from ..learn.samples import connect

    root = cfg.adapters_dir
    if args.window is not None and args.window < 2:
        raise ClawrlError(f"--window {args.window}: give at least 2 turns")
    db = connect(cfg.db_path)
    try:
        from ..turnlog import migrations
        migrations.apply(db)   # a turn log last opened by an older daemon
        if args.dry_run:
            return _dry_run(cfg, db, root, args.window, consolidate, consolidate_schedule)
        if adapters.trainer_running(root):
            return _through_trainer(root, args, consolidate)
        return _here(cfg, db, root, args.window, consolidate)
    finally:
        db.close()


def _dry_run(cfg, db, root, window, consolidate, schedule) -> int:
    size = window or cfg.consolidate.window
    ex = consolidate.examples(db, size)
    good = sum(e.desirable for e in ex)
    print(f"window: {len(ex)} judged turns (of at most {size}): {good} good, {len(ex) - good} bad"
          + (f"; turns {ex[0].id}..{ex[-1].id}" if ex else ""))
    hinted = consolidate.teacher_asked(ex, cfg.consolidate.teacher_answers)
    if hinted:
        kept = sum(bool(e.kept) for e in hinted)
        print(f"the hinted teacher answers {len(hinted)} corrected turns ({kept} answers kept from "
              "an earlier run are read back when the model and hint are the same; "
              f"consolidate.teacher_answers = {cfg.consolidate.teacher_answers})")
    runs = True
    try:
        consolidate.check_window(ex, cfg.consolidate.batch_size)
        print("it would train a fresh adapter from them")
    except consolidate.NothingToConsolidate as e:
        runs = False
        print(f"it would not run: {e}")
    last = consolidate.last_consolidation(root)
    paced = bool(last and last.get("steps") and last.get("seconds"))
    if last is None:
        print("last consolidation: none")
    else:
        print(f"last consolidation: version {last['version']:04d}, {last['window']['size']} turns"
              + (f", {last['steps']} steps in {duration(last['seconds'])}" if paced else ""))
    if runs and paced:
        assert last is not None
        steps = consolidate.planned_steps(len(ex) + len(hinted), cfg.consolidate)
        print(f"this window: {steps} steps (with its teacher answers), about "
              f"{duration(last['seconds'] * steps / last['steps'])} at the last consolidation's pace")
    kind, _ = schedule(cfg.consolidate.when)
    why = consolidate.due(cfg, db, root)
    print(f"schedule: {cfg.consolidate.when}" + (
        " (only this command runs one; consolidate.when = \"idle\" or \"daily HH:MM\" schedules it)"
        if kind == "off" else f"; {'due: ' + why if why else 'not due'}"))
    return 0


def _through_trainer(root, args, consolidate) -> int:
    rid = consolidate.request(root, args.window)
    print("asked the running trainer to consolidate (it starts once its current step is done)",
          file=sys.stderr)
    if args.no_wait:
        return 0
    from ..adapters import versions as adapters
    bar = Bar()
    asked = time.monotonic()
    try:
        while True:
            if (root / consolidate.REQUEST).exists() and time.monotonic() - asked > TAKE_S:
                (root / consolidate.REQUEST).unlink(missing_ok=True)
                raise ClawrlError(f"the running trainer did not take the request in {TAKE_S:.0f} s "
                                  "(a data-parallel trainer, train.processes > 1, does not "
                                  "consolidate); see the daemon's log")
            status = adapters.read_consolidation(root) or {}
            if status.get("request") == rid:
                bar(status)
                if status.get("state") in TERMINAL:
                    bar.end()
                    return _outcome(status)
            time.sleep(1.0)
    except KeyboardInterrupt:
        bar.end()
        print("stopped following; the trainer goes on (see `clawrl status` or the dashboard)",
              file=sys.stderr)
        return 130


def _here(cfg, db, root, window, consolidate) -> int:
    import os

    from ..adapters import versions as adapters
    stop = threading.Event()
    lock = adapters.hold_trainer_lock(root, lambda s: stop.wait(s), lambda m: print(m, file=sys.stderr))
    if lock is None:
        return 130
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    os.nice(10)   # the trainer's priority: a daemon started meanwhile serves first
    bar = Bar()
    try:
        adapters.clean_temp(root)
        version = consolidate.run(cfg, db, root, stop, lambda m: print(m, file=sys.stderr),
                                  window_size=window, on_progress=bar)
    except consolidate.Stopped as e:
        bar.end()
        print(f"clawrl: {e}", file=sys.stderr)
        return 130
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        lock.close()
    bar.end()
    print(f"version {version:04d} written; the daemon checks it and serves it like any version")
    return 0


def _outcome(status: dict) -> int:
    if status["state"] == "done":
        print(status.get("message", ""))
        return 0
    raise ClawrlError(f"consolidation {status['state']}: {status.get('message')}")
