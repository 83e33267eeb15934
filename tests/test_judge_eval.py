"""`clawrl judge eval`: any judge scored on labelled feedback lines, as numbers a user can trust
(hand-checked here on the deterministic rules judge), and a clear error for a bad file."""
from __future__ import annotations

import json
import subprocess

from clawrl.judge.evaluate import KEYS, metrics
from conftest import CLAWRL

LINES = [
    {"text": "No, that's wrong.", "label": -1},                      # rules: -1 (right)
    {"text": "thanks!", "label": 1},                                 # rules: +1 (right)
    {"text": "pretty sure it's canberra", "label": -1},              # rules: 0 (missed)
    {"text": "ok", "label": 0},                                      # rules: +1 (wrong, not sign)
    {"text": "ty, next time skip the intro", "label": -1,            # rules: +1 (wrong sign)
     "context": [{"role": "user", "content": "Capital of Peru?"},
                 {"role": "assistant", "content": "Great question! It is Lima."}]},
]


def test_metrics_by_hand():
    m = metrics([-1, 1, -1, 0, -1], [-1, 1, 0, 1, 1])
    assert m["correction_recall"] == 1 / 3 and m["correction_precision"] == 1.0
    assert m["approval_recall"] == 1.0 and m["approval_precision"] == 1 / 3
    assert m["wrong_sign_rate"] == 1 / 5 and m["abstain_rate"] == 1 / 5 and m["n"] == 5
    assert m["confusion"]["-1"] == {"-1": 1, "0": 1, "1": 1}
    empty = metrics([], [])
    assert empty["n"] == 0 and empty["wrong_sign_rate"] == 0.0


def test_judge_eval_on_a_users_file(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    r = subprocess.run([*CLAWRL, "judge", "eval", "--backend", "rules", "--data", str(data),
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(KEYS) <= set(out)
    assert (out["correction_recall"], out["correction_precision"]) == (1 / 3, 1.0)
    assert (out["approval_recall"], out["approval_precision"]) == (1.0, 1 / 3)
    assert out["wrong_sign_rate"] == 0.2 and out["abstain_rate"] == 0.2 and out["n"] == 5
    assert out["worst_misses"][0]["text"] == "ty, next time skip the intro"   # wrong sign first
    text = subprocess.run([*CLAWRL, "judge", "eval", "--backend", "rules", "--data", str(data)],
                          capture_output=True, text=True, timeout=120).stdout
    assert "corrections (-1): recall  33.3 %, precision 100.0 %" in text
    assert "wrong sign  20.0 %" in text and "worst misses:" in text


def test_a_bad_file_is_named_with_its_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine", "label": 1}\n{"text": "meh", "label": "bad"}\n')
    r = subprocess.run([*CLAWRL, "judge", "eval", "--backend", "rules", "--data", str(data)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "bad.jsonl:2" in r.stderr and "-1, 0 or 1" in r.stderr
    r = subprocess.run([*CLAWRL, "judge", "eval", "--backend", "rules", "--data",
                        str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot read labelled data" in r.stderr
