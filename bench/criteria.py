"""What moved, criterion by criterion: read the turns of a `clawrl eval` work folder.

`clawrl eval` reports one score per checkpoint. When a persona defines `criteria` (student and
teacher do), this script splits that score into its parts, from the answers each run's daemon
logged to its own database:

- **held-out**: the first answers to the held-out prompts, one block per checkpoint (the eval
  sends them in checkpoint order, `--heldout` per block);
- **training**: the answers the simulated user replied to, in blocks of `--block` interactions,
  with the judge's mean score and the share of turns that got a hint.

    .venv/bin/python bench/criteria.py --persona teacher --work EVAL_WORK_DIR [--heldout 40]

EVAL_WORK_DIR is the `--work` folder of a `clawrl eval` run (one `<persona>-<method>-<seed>`
folder per run, each with its `clawrl.db`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from clawrl.evals import personas
from clawrl.turnlog.store import connect_sync

HELDOUT_SQL = ("SELECT request_json, response_text, NULL, NULL FROM turns WHERE turn_index = 0 "
               "AND session_id LIKE 'eval-%' AND status = 'complete' ORDER BY id")
TRAINING_SQL = ("SELECT request_json, response_text, judge_score, judge_hint FROM turns "
                "WHERE turn_index = 0 AND session_id LIKE 'sim-%' AND status = 'complete' "
                "ORDER BY id")


def first_user_message(request_json: str) -> str:
    return next(m["content"] for m in json.loads(request_json)["messages"] if m["role"] == "user")


def words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def summarize(persona: personas.Persona, rows: list[tuple]) -> dict:
    """Mean score, the share of answers meeting each criterion, mean words, judge and hints."""
    out = {"n": len(rows), "score": 0.0, "words": 0.0}
    judged = [r[2] for r in rows if r[2] is not None]
    for request_json, text, _, _ in rows:
        prompt, text = first_user_message(request_json), text or ""
        out["score"] += persona.score(prompt, text) / len(rows)
        out["words"] += words(text) / len(rows)
        for name, met in persona.criteria(prompt, text).items():
            out[name] = out.get(name, 0.0) + met / len(rows)
    if judged:
        out["judge"] = sum(judged) / len(judged)
        out["hinted"] = sum(bool(r[3]) for r in rows) / len(rows)
    return out


def blocks(rows: list, size: int) -> list[list]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def run_tables(persona: personas.Persona, home: Path, heldout: int, block: int) -> list[str]:
    db = connect_sync(home / "clawrl.db")
    try:
        held = blocks(db.execute(HELDOUT_SQL).fetchall(), heldout)
        train = blocks(db.execute(TRAINING_SQL).fetchall(), block)
    finally:
        db.close()
    lines = []
    for phase, chunks, label in (("held-out", held, lambda i: f"checkpoint {i + 1}"),
                                 ("training", train,
                                  lambda i: f"interactions {i * block + 1}-{i * block + block}")):
        for i, chunk in enumerate(chunks):
            s = summarize(persona, chunk)
            crit = " | ".join(f"{s[k]:.2f}" for k in criterion_names(persona))
            extra = (f"{s['judge']:+.2f} | {s['hinted']:.2f}" if "judge" in s else "- | -")
            lines.append(f"| {home.name} | {phase} | {label(i)} | {s['n']} | {s['score']:.2f} | "
                         f"{crit} | {s['words']:.0f} | {extra} |")
    return lines


def criterion_names(persona: personas.Persona) -> list[str]:
    return list(persona.criteria(persona.heldout_prompts[0], ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persona", required=True, help="persona name or path (must define criteria)")
    ap.add_argument("--work", required=True, type=Path, help="the --work folder of a clawrl eval")
    ap.add_argument("--heldout", type=int, default=40, help="held-out prompts per checkpoint")
    ap.add_argument("--block", type=int, default=12, help="training interactions per row")
    args = ap.parse_args(argv)
    persona = personas.load(args.persona)
    if persona.criteria is None:
        print(f"persona {persona.name} defines no criteria(prompt, response); nothing to split",
              file=sys.stderr)
        return 2
    homes = sorted(h for h in args.work.glob(f"{persona.name}-*") if (h / "clawrl.db").is_file())
    if not homes:
        print(f"no {persona.name}-* run with a clawrl.db under {args.work}", file=sys.stderr)
        return 2
    header = ["run", "answers", "block", "n", "score", *criterion_names(persona), "words",
              "judge", "hinted"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for home in homes:
        print("\n".join(run_tables(persona, home, args.heldout, args.block)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
