"""How well the probe judge hears simulated users: its reading of their replies against whether
they were satisfied, per persona, outside any eval run.

Turns come from two places:
- `--runs`: eval work folders (`clawrl eval --work DIR`). Each run's home keeps every turn: the
  question, the answer and the simulated user's reply. The persona's score is a pure function of
  the question and the answer, so it is computed again, and the truth is +1 where the user was
  satisfied (score at or above its HAPPY), else -1: what `clawrl eval`'s judge check counts.
- `--fresh PERSONA:N`: N new turns, where the served base model (the recipe's, adapters off)
  answers the persona's first N training prompts (sampled at temperature 0.7) and the persona
  replies: answers no adapter and replies no judge has seen.

The judge reads each reply as the daemon does (probe.ProbeJudge.read, in the head's views), with
the home's head or the one in `--head`. Agreement: the vote has the user's sign; wrong sign: the
opposite; abstain: a 0.

    CLAWRL_HOME=.cache/bench-home .venv/bin/python bench/judge_agreement.py \
        --runs EVAL_WORK_DIR... [--fresh yesno:40 ...] [--head DIR] [--turns FILE.json] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from clawrl.config import load_config
from clawrl.evals.personas import Persona, load as load_persona
from clawrl.judge import probe, probe_fit

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402

FIRST_TURNS = ("SELECT request_json, response_text, next_state_json FROM turns WHERE id IN "
               "(SELECT min(id) FROM turns WHERE session_id LIKE 'sim-%' GROUP BY session_id) "
               "AND next_state_json IS NOT NULL ORDER BY id")


def _turn(p: Persona, question: str, answer: str, reply: str, source: str) -> dict:
    return {"persona": p.name, "source": source, "question": question, "answer": answer,
            "reply": reply, "truth": 1 if p.satisfied(p.score(question, answer)) else -1}


def recorded(work: Path) -> list[dict]:
    """The first turn of every simulated session in each run under `work` (a run's folder is
    named PERSONA-METHOD-SEED)."""
    turns = []
    for db in sorted(work.glob("*/clawrl.db")):
        p = load_persona(db.parent.name.split("-")[0])
        con = sqlite3.connect(db)
        try:
            rows = con.execute(FIRST_TURNS).fetchall()
        finally:
            con.close()
        for request, answer, next_state in rows:
            question = next(m["content"] for m in reversed(json.loads(request)["messages"])
                            if m["role"] == "user")
            reply = json.loads(next_state)[0]["content"]
            turns.append(_turn(p, question, answer or "", reply, db.parent.name))
    return turns


def fresh(model_dir: Path, spec: str, seed: int = 0) -> list[dict]:
    """`spec` PERSONA:N: the base model answers the persona's first N training prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    name, n = spec.split(":")
    p = load_persona(name)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    rng = random.Random(seed + 7)
    turns = []
    for question in p.train_prompts[:int(n)]:
        msgs = ([{"role": "system", "content": p.system}] if p.system else []) + \
            [{"role": "user", "content": question}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=p.max_tokens, do_sample=True, temperature=0.7,
                                 top_p=0.95)
        answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        turns.append(_turn(p, question, answer, p.reply(question, answer, p.score(question, answer), rng),
                           "fresh"))
    return turns


def agreement(judge: probe.ProbeJudge, turns: list[dict]) -> dict:
    """Agreement, wrong signs and abstentions per persona, per persona and source, and over all
    turns; `satisfied`: how many of the turns the user was satisfied with."""
    counts: dict = defaultdict(lambda: {"agree": 0, "wrong_sign": 0, "abstain": 0, "satisfied": 0, "n": 0})
    for t in turns:
        ((vote, _),) = judge.read(t["question"], t["answer"], [t["reply"]])
        outcome = "agree" if vote == t["truth"] else "wrong_sign" if vote == -t["truth"] else "abstain"
        source = "fresh" if t["source"] == "fresh" else "runs"
        for key in (t["persona"], f"{t['persona']} ({source})", "all"):
            counts[key][outcome] += 1
            counts[key]["satisfied"] += t["truth"] == 1
            counts[key]["n"] += 1
    return {k: {"agreement": c["agree"] / c["n"], "wrong_sign": c["wrong_sign"] / c["n"],
                "abstain": c["abstain"] / c["n"], "satisfied": c["satisfied"], "n": c["n"]}
            for k, c in sorted(counts.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=[], help="eval work folders (clawrl eval --work)")
    ap.add_argument("--fresh", nargs="*", default=[], metavar="PERSONA:N",
                    help="N new turns of the persona, answered by the served base model")
    ap.add_argument("--head", help="a head folder to read with (default: the home's, fitted if missing)")
    ap.add_argument("--turns", help="a JSON file of the turns: read from it where it exists (--runs "
                    "and --fresh are then not read), else written to it, so that other heads read the same")
    ap.add_argument("--out", help="write the result here too")
    args = ap.parse_args()
    cfg = load_config()
    from clawrl.models import model_dir
    if args.turns and Path(args.turns).exists():
        turns = json.loads(Path(args.turns).read_text())
    else:
        turns = [t for work in args.runs for t in recorded(Path(work))]
        turns += [t for spec in args.fresh for t in fresh(model_dir(cfg), spec)]
        if args.turns:
            Path(args.turns).write_text(json.dumps(turns, ensure_ascii=False))
    head, reader = probe_fit.head_for(cfg)
    if args.head:
        head = probe.Head.load(Path(args.head))
    t0 = time.time()
    result = {"command": " ".join(["bench/judge_agreement.py"] + sys.argv[1:]),
              "head": {"views": head.meta.views, "threshold": head.meta.threshold,
                       "approval_threshold": head.meta.approval_threshold,
                       "train_lines": head.meta.train_lines, "dev": head.meta.dev},
              "runs": args.runs, "fresh": args.fresh, "by_persona": agreement(probe.ProbeJudge(head, reader), turns),
              "read_s": round(time.time() - t0, 1)}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
