"""`clawrl eval` end to end on the real SmolLM2 default, kept small: a persona file written here
(outside the package), two interactions, two held-out prompts, one training method and the no-train
control. It checks the driver, not the learning: that interactions reach the judge and trainer, that
a checkpoint waits for the new adapter to be live, that held-out requests never train, and that
the results, table and plot are written."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawrl.evals.evaluate import recipe_overrides
from conftest import MODEL_CACHE, REPO

# Starts daemons, server doubles or OpenClaw: not in `make test-fast`.
pytestmark = pytest.mark.slow

PERSONA = '''
NAME = "shouty"
PREFERENCE = "answers that end with an exclamation mark"
SYSTEM = None
MAX_TOKENS = 12
TRAIN_PROMPTS = ["Say hello.", "Name a colour."]
HELDOUT_PROMPTS = [f"Name an animal, number {i}." for i in range(40)]


def score(prompt, response):
    return 1.0 if response.strip().endswith("!") else 0.0


def criteria(prompt, response):
    return {"exclaims": response.strip().endswith("!"), "short": len(response.split()) <= 5}


def reply(prompt, response, score, rng):
    return "Thanks, great answer!" if score >= 0.5 else rng.choice(
        ["No, that's wrong. End with an exclamation mark.", "No, that's wrong. Finish with '!'."])
'''


def test_eval_runs_control_and_a_method_and_writes_the_report(tmp_path):
    persona = tmp_path / "shouty.py"
    persona.write_text(PERSONA)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "CLAWRL_HOME": str(tmp_path / "home"), "CLAWRL_TRAIN_POLL_S": "0.2"}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    r = subprocess.run([sys.executable, "-m", "clawrl", "eval", "--persona", str(persona),
                        "--methods", "rl", "--judge", "rules", "--seeds", "1", "--interactions", "2",
                        "--checkpoints", "0,2", "--heldout", "2", "--out", str(out),
                        "--work", str(work)], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "interaction 2/2" in r.stderr and "held-out score" in r.stderr  # progress is shown
    results = json.loads((out / "results.json").read_text())
    runs = {run["method"]: run for run in results["runs"]}
    assert set(runs) == {"no-train", "rl"}
    for run in runs.values():
        assert [p["interactions"] for p in run["points"]] == [0, 2]
        assert all(0.0 <= p["score"] <= 1.0 for p in run["points"])
        assert len(run["train_scores"]) == 2
        # The judge's reading of each training answer against the user's own satisfaction: this
        # persona's replies are plain, so the rules judge reads both right.
        assert run["judge_check"] == {"n": 2, "agreement": 1.0, "wrong_sign": 0.0,
                                      "abstain": 0.0, "unjudged": 0.0}
        assert run["satisfied"] == [s >= 1.0 for s in run["train_scores"]]
        assert run["until_holds"] is None          # 3 satisfied in a row cannot fit in 2
    assert runs["no-train"]["points"][-1]["adapter"] == 0
    # What the user set on top of the recipe is recorded with every run and shown in the table.
    assert all(run["settings"].get("train.poll_s") == "0.2" for run in runs.values())
    assert "train.poll_s=0.2" in (out / "results.md").read_text().split("Settings on top of the "
                                                                        "recipe: ")[1]
    # The rl run's checkpoint waited for its adapters: both interactions were trained (a turn the
    # rules judge scores +1 or -1 always has a signal under rl) and the newest version was live.
    db = sqlite3.connect(work / "shouty-rl-0" / "clawrl.db")
    trained = db.execute("SELECT count(*) FROM turns WHERE train_status='trained'").fetchone()[0]
    heldout_trainable = db.execute("SELECT count(*) FROM turns WHERE session_id LIKE 'eval-%'"
                                   " AND trainable=1").fetchone()[0]
    assert trained == 2 and heldout_trainable == 0
    assert runs["rl"]["points"][-1]["adapter"] >= 1
    table = (out / "results.md").read_text()
    assert "## shouty" in table and "| rl |" in table and "| no-train |" in table
    assert "| rl | rules | 1.00 | 0.00 | 0.00 | 0.00 | > 0 |" in table
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # bench/criteria.py splits each checkpoint's held-out answers by criterion, from the daemons'
    # own logs: its per-checkpoint scores are the eval's, so its blocks are the checkpoints.
    r = subprocess.run([sys.executable, str(REPO / "bench" / "criteria.py"), "--persona",
                        str(persona), "--work", str(work), "--heldout", "2", "--block", "2"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    header, _, *rows = r.stdout.splitlines()
    assert "| exclaims | short |" in header
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    for method, run in runs.items():
        held = [float(c[4]) for c in cells if c[0] == f"shouty-{method}-0" and c[1] == "held-out"]
        assert held == [round(p["score"], 2) for p in run["points"]]
        training = [c for c in cells if c[0] == f"shouty-{method}-0" and c[1] == "training"]
        assert len(training) == 1 and training[0][3] == "2"

    # bench/judge_probe.py replays those turns to the model by forced choice; its reference is
    # the rules judge, which is what judged them in the run.
    r = subprocess.run([sys.executable, str(REPO / "bench" / "judge_probe.py"),
                        str(work / "shouty-rl-0" / "clawrl.db")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    probe = json.loads(r.stdout)
    votes = [v for (v,) in db.execute("SELECT judge_score FROM turns WHERE session_id LIKE 'sim-%'"
                                      " AND next_state_json IS NOT NULL")]
    assert probe["turns"] == 2 and sum(probe["reference votes"].values()) == 2
    assert {int(k): n for k, n in probe["reference votes"].items()} == \
        {v: votes.count(v) for v in {int(x) for x in votes}}
    for mode in ("boxed", "yes/no"):
        assert 0.0 <= probe[mode]["agreement"] <= 1.0 and sum(probe[mode]["votes"].values()) == 2

    # --resume keeps the finished runs; a run that fails (here: its daemon finds no model) is
    # recorded with its error and does not stop the evaluation.
    r = subprocess.run([sys.executable, "-m", "clawrl", "eval", "--persona", str(persona),
                        "--methods", "rl,opd", "--judge", "rules", "--seeds", "1", "--interactions", "2",
                        "--checkpoints", "0,2", "--heldout", "2", "--out", str(out),
                        "--work", str(work), "--resume"],
                       env={**env, "CLAWRL_MODEL_SOURCE": str(tmp_path / "no-model")},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stderr.count("done before, kept") == 2 and "run failed" in r.stderr
    again = {run["method"]: run for run in json.loads((out / "results.json").read_text())["runs"]}
    assert again["rl"]["points"] == runs["rl"]["points"]
    assert again["opd"]["points"] == [] and again["opd"]["error"]
    assert "## Failed runs" in (out / "results.md").read_text()


def test_recipe_overrides_are_the_users_not_the_evals():
    env = {"CLAWRL_TRAIN_BASELINE_DECAY": "0.9", "CLAWRL_ENGINE_THREADS": "1", "PATH": "/bin",
           "CLAWRL_HOME": "/somewhere", "CLAWRL_SERVER_PORT": "1", "CLAWRL_METHOD_NAME": "rl",
           "CLAWRL_JUDGE_BACKEND": "engine", "CLAWRL_TRAIN_ENABLED": "false",
           "CLAWRL_JUDGE_API_KEY": "sk-secret"}
    assert recipe_overrides(env) == {"engine.threads": "1", "train.baseline_decay": "0.9",
                                     "judge.api_key": "(set)"}   # results files get committed


def test_a_killed_eval_takes_its_daemon_with_it(tmp_path):
    """SIGKILL to `clawrl eval` (no chance to clean up): the daemon it started stops too, instead of
    serving and training on, orphaned, until someone finds it."""
    persona = tmp_path / "shouty.py"
    persona.write_text(PERSONA)
    env = {**os.environ, "CLAWRL_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    work = tmp_path / "work"
    ev = subprocess.Popen([sys.executable, "-m", "clawrl", "eval", "--persona", str(persona),
                           "--methods", "rl", "--judge", "rules", "--seeds", "1", "--no-control",
                           "--interactions", "2",
                           "--checkpoints", "0,2", "--heldout", "2", "--out", str(tmp_path / "out"),
                           "--work", str(work)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    db, deadline = work / "shouty-rl-0" / "clawrl.db", time.time() + 300
    while not db.exists():                       # the daemon is up once its turn log exists
        assert ev.poll() is None and time.time() < deadline, "the eval's daemon never started"
        time.sleep(0.2)
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == ev.pid]
    assert pids, "no child daemon found"
    ev.send_signal(signal.SIGKILL)
    ev.wait()
    deadline = time.time() + 60
    while any(_alive(pid) for pid in pids):
        assert time.time() < deadline, "the eval's daemon outlived it"
        time.sleep(0.2)


def _ppid(proc_dir) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_interactions_until_the_preference_holds():
    from clawrl.evals.evaluate import until_holds
    assert until_holds([True, True, True]) == 0
    assert until_holds([False, True, True, False, True, True, True, False]) == 4
    assert until_holds([True, True, False] * 4) is None
    assert until_holds([]) is None


def test_rows_name_their_judge_only_when_judges_are_compared():
    from clawrl.evals.report import label, persona_table
    point = {"interactions": 0, "score": 0.5, "empty": 0.0, "degenerate": 0.0}
    check = {"n": 3, "agreement": 1.0, "wrong_sign": 0.0, "abstain": 0.0, "unjudged": 0.0}
    runs = [{"persona": "p", "method": m, "judge": j, "seed": 0, "points": [point],
             "train_scores": [1.0] * 3, "until_holds": 0, "judge_check": check, "wall_s": 60}
            for m, j in (("no-train", "rules"), ("combine", "probe"), ("combine", "rules"))]
    assert [label(r, runs) for r in runs] == ["no-train", "combine (probe judge)",
                                              "combine (rules judge)"]
    assert [label(r, runs[:2]) for r in runs[:2]] == ["no-train", "combine"]
    table = "\n".join(persona_table(runs, "p"))
    assert "| combine (probe judge) | 0.50 ± 0.00 | 1 |" in table
    assert "| combine (rules judge) | rules | 1.00 | 0.00 | 0.00 | 0.00 | 0 |" in table


def test_consolidate_at_runs_the_method_again_with_a_consolidation_on_the_same_seed(tmp_path):
    """`--consolidate-at 2`: beside the rl run, an rl+consolidate run whose checkpoint at 2 has
    the daemon's trainer consolidate the judged turns (one thanked, one corrected) and serves the
    result before it measures."""
    persona = tmp_path / "half.py"
    persona.write_text(PERSONA.replace('NAME = "shouty"', 'NAME = "half"').replace(
        'return 1.0 if response.strip().endswith("!") else 0.0',
        'return 1.0 if prompt == "Say hello." else 0.0'))
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "CLAWRL_HOME": str(tmp_path / "home"), "CLAWRL_TRAIN_POLL_S": "0.2",
           "CLAWRL_CONSOLIDATE_BATCH_SIZE": "2", "CLAWRL_CONSOLIDATE_MAX_COMPLETION_TOKENS": "16",
           "CLAWRL_CONSOLIDATE_MIN_STEPS": "2"}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    r = subprocess.run([sys.executable, "-m", "clawrl", "eval", "--persona", str(persona),
                        "--methods", "rl", "--judge", "rules", "--seeds", "1", "--interactions", "2",
                        "--checkpoints", "0", "--consolidate-at", "2", "--heldout", "2",
                        "--no-control", "--out", str(out), "--work", str(work)],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    runs = {run["method"]: run for run in json.loads((out / "results.json").read_text())["runs"]}
    assert set(runs) == {"rl", "rl+consolidate"}
    assert "consolidation done" in r.stderr
    plain, both = runs["rl"], runs["rl+consolidate"]
    assert [p["interactions"] for p in both["points"]] == [0, 2]
    assert both["train_scores"] == plain["train_scores"]          # the same seed: the same prompts
    last = both["points"][-1]
    assert last["consolidated"] >= 2 and last["adapter"] == last["consolidated"]   # after 2 online
    assert "consolidated" not in plain["points"][-1]
    meta = json.loads((work / "half-rl+consolidate-0" / "adapters" / f"{last['consolidated']:04d}"
                       / "meta.json").read_text())
    assert meta["method"] == "consolidate-kto" and meta["window"]["size"] == 2


def test_a_report_of_only_failed_runs_is_written_without_a_plot(tmp_path):
    """Every run failing (a daemon that never settles) must still leave results and a table."""
    from clawrl.evals.report import write
    failed = [{"persona": "concise", "method": "combine", "judge": "probe", "seed": 0, "points": [],
               "train_scores": [], "wall_s": 700.0, "error": "the loop did not settle"}]
    written = write(failed, tmp_path, "clawrl eval --persona concise")
    assert [p.name for p in written] == ["results.json", "results.md"]
    assert "## Failed runs" in (tmp_path / "results.md").read_text()
