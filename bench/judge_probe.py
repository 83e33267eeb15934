"""Can the served model judge at all? Forced-choice probes against the rules judge.

The `engine` judge asks the served model to reason and end with `\\boxed{1|0|-1}`. On the embedded
default it almost never produces a parseable vote (bench/RESULTS.md). This script asks whether
that is only a formatting problem: it takes turns that a `clawrl eval` logged with their next
state, and scores the model's *choice* without letting it generate anything:

  boxed    the judge's own vote prompt, on the turn exactly as the judging loop shows it (with
           the recipe's judge.context_messages); the answer is whichever of `\\boxed{1}`, `\\boxed{0}`,
           `\\boxed{-1}` the model gives the highest log-probability as its whole reply.
  yes/no   a one-line question about the next state alone ("was the user satisfied?"); the vote
           is +1 where log P(Yes) - log P(No) is above the same margin on a content-free reply
           ("N/A"), the label-free calibration of contextual calibration.

The reference is the rules judge on the same turns (for a simulated user it reads the reply
exactly). A judge worth using agrees far above the majority-class rate.

    .venv/bin/python bench/judge_probe.py EVAL_WORK_DIR/concise-combine-0/clawrl.db [...]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.judge import judges as judge
from clawrl.chat.format import render_prompt
from clawrl.config import load_config
from clawrl.judge.loop import judge_input
from clawrl.models import provision
from clawrl.turnlog.store import connect_sync
from clawrl.learn.trainer import token_logprobs

TURNS_SQL = ("SELECT request_json, response_text, tool_calls, next_state_json FROM turns "
             "WHERE next_state_json IS NOT NULL AND session_id LIKE 'sim-%' ORDER BY id")
SATISFIED = ("An assistant answered a user. The user then replied:\n\n\"{reply}\"\n\n"
             "Was the user satisfied with the assistant's answer? Answer Yes or No.")


class Scorer:
    """Log-probability of a continuation after a chat prompt, with the served base model."""

    def __init__(self, path: Path):
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()

    def logprob(self, messages: list[dict], continuation: str) -> float:
        """The prompt as the engine renders a judge call, then the continuation's tokens."""
        p_ids = render_prompt(self.tok, messages, None)
        c_ids = self.tok(continuation, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = self.model(torch.tensor([p_ids + c_ids])).logits[0].float()
        return float(token_logprobs(logits[len(p_ids) - 1:-1], c_ids).sum())

    def boxed_vote(self, inp: judge.JudgeInput) -> int:
        msgs = judge.vote_prompt(inp)
        return max((1, 0, -1), key=lambda v: self.logprob(msgs, f"\\boxed{{{v}}}"))

    def satisfied_margin(self, reply: str) -> float:
        msgs = [{"role": "user", "content": SATISFIED.format(reply=reply)}]
        return self.logprob(msgs, "Yes") - self.logprob(msgs, "No")


def turns(dbs: list[Path], context_messages: int) -> list[judge.JudgeInput]:
    """Each logged turn as the judging loop shows it to a judge."""
    out = []
    for path in dbs:
        db = connect_sync(path)
        try:
            out += [judge_input(dict(row), context_messages) for row in db.execute(TURNS_SQL)]
        finally:
            db.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", nargs="+", type=Path, help="clawrl.db files of eval runs")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: short forward passes gain little from more, "
                         "and it leaves the other cores to a running daemon)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(None)
    inputs = turns(args.db, cfg.judge.context_messages)
    if not inputs:
        print("no simulated-user turn with a next state in these databases", file=sys.stderr)
        return 2
    scorer = Scorer(provision(cfg.model.source, cfg.models_dir, cfg.home / "cache"))
    rules = judge.RulesJudge()
    reference = [asyncio.run(rules.judge(inp)).score for inp in inputs]
    boxed = [scorer.boxed_vote(inp) for inp in inputs]
    threshold = scorer.satisfied_margin("N/A")
    yes_no = [1 if scorer.satisfied_margin(inp.next_state[0]["content"]) > threshold else -1
              for inp in inputs]
    n, majority = len(inputs), Counter(reference).most_common(1)[0][1] / len(inputs)
    print(json.dumps({
        "turns": n, "reference votes": dict(Counter(reference)),
        "majority-class rate": round(majority, 3),
        "boxed": {"agreement": round(sum(map(int.__eq__, boxed, reference)) / n, 3),
                  "votes": dict(Counter(boxed))},
        "yes/no": {"agreement": round(sum(map(int.__eq__, yes_no, reference)) / n, 3),
                   "votes": dict(Counter(yes_no)), "content-free margin": round(threshold, 3)},
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
