"""`clawrl judge eval` and `clawrl judge train`: how well does a judge read feedback, measured on
labelled lines, and the probe's head fitted from the corpus.

`measure` runs any judge (rules, probe, engine, openai) on labelled examples exactly as the
judging loop would show it a turn: the example's context (or a neutral one-question exchange), the
answer, and the reply as the next state. It reports per-class precision and recall, the share of
replies read with the wrong sign, the share left at 0, the confusion matrix and the worst misses.

It owns the measuring and the printing, not the judges (judge/judges.py, judge/probe.py) nor the data
(judge/corpus.py).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

from . import corpus
from ..errors import ClawrlError
from .corpus import metrics
from ..types import JudgeInput

KEYS = ("correction_recall", "correction_precision", "approval_recall", "approval_precision",
        "wrong_sign_rate", "abstain_rate", "n")


def judge_input(e: corpus.Example) -> JudgeInput:
    context = list(e.context)
    answer = context.pop()["content"] if context and context[-1]["role"] == "assistant" else ""
    return JudgeInput(context=context, response=answer, tool_calls=[],
                      next_state=[{"role": "user", "content": e.text}])


async def _run(judge, examples: list[corpus.Example], concurrency: int, progress) -> list:
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def one(e):
        nonlocal done
        async with sem:
            j = await judge.judge(judge_input(e))
        done += 1
        progress(done, len(examples))
        return j
    return await asyncio.gather(*(one(e) for e in examples))


def measure(judge, examples: list[corpus.Example], concurrency: int = 4, progress=None) -> dict:
    """Judge every example; the metrics, the time per judgment and the worst misses (wrong sign
    first, then missed votes)."""
    progress = progress or (lambda done, total: None)
    t0 = time.perf_counter()
    judgments = asyncio.run(_run(judge, examples, concurrency, progress))
    elapsed = time.perf_counter() - t0
    pred = [j.score for j in judgments]
    out = metrics([e.label for e in examples], pred)
    misses = sorted(((abs(e.label - p), e, j) for e, p, j in zip(examples, pred, judgments)
                     if p != e.label), key=lambda m: -m[0])
    out["ms_per_judgment"] = 1000 * elapsed / max(1, len(examples))
    out["worst_misses"] = [{"text": e.text, "label": e.label, "read": j.score,
                            "why": (j.raw or [""])[-1][:160]} for _, e, j in misses[:12]]
    return out


def render(report: dict, title: str) -> str:
    def pct(x):
        return f"{100 * x:5.1f} %"
    c = report["confusion"]
    lines = [f"{title}: {report['n']} lines, {report['ms_per_judgment']:.0f} ms per judgment",
             f"  corrections (-1): recall {pct(report['correction_recall'])}, "
             f"precision {pct(report['correction_precision'])}",
             f"  approvals   (+1): recall {pct(report['approval_recall'])}, "
             f"precision {pct(report['approval_precision'])}",
             f"  wrong sign {pct(report['wrong_sign_rate'])}, read as 0 {pct(report['abstain_rate'])}"
             f", exact {pct(report['accuracy'])}",
             "  confusion (rows: label, columns: judge's reading)",
             "          -1     0    +1"]
    for g in ("-1", "0", "1"):
        lines.append(f"    {g:>3} " + " ".join(f"{c[g][p]:5d}" for p in ("-1", "0", "1")))
    if report["worst_misses"]:
        lines.append("  worst misses:")
        for m in report["worst_misses"]:
            lines.append(f"    label {m['label']:+d} read {m['read']:+d}: {m['text'][:70]!r}  "
                         f"({m['why']})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- commands

def _judge_for(backend: str, cfg):
    """The judge a daemon with this recipe would use, built outside the daemon, and the engine
    it needs closed afterwards (or None)."""
    from .loop import judge_for
    if backend == "probe":
        from . import probe, probe_fit
        return probe.ProbeJudge(*probe_fit.head_for(cfg, progress=_say)), None
    if backend == "openai" and not (cfg.judge.url and cfg.judge.model):
        raise ClawrlError("--backend openai needs judge.url and judge.model: set them in the "
                          "recipe or as CLAWRL_JUDGE_URL and CLAWRL_JUDGE_MODEL")
    engine = None
    if backend == "engine":
        from ..engines import make_engine
        engine = make_engine(cfg)
        engine.load()
    return judge_for(cfg, backend, engine), engine


def _say(msg: str) -> None:
    print(f"clawrl: {msg}", file=sys.stderr)


def _bar(done: int, total: int) -> None:
    if sys.stderr.isatty() or done == total:
        width = 30
        fill = width * done // max(1, total)
        print(f"\r  judging [{'#' * fill}{'.' * (width - fill)}] {done}/{total}", end="",
              file=sys.stderr)
        if done == total:
            print(file=sys.stderr)


def cmd_eval(args, cfg) -> int:
    examples = corpus.read(args.data) if args.data else corpus.load(args.split)
    source = args.data or f"the corpus's {args.split} split"
    judge, engine = _judge_for(args.backend, cfg)
    try:
        report = measure(judge, examples, concurrency=args.concurrency,
                         progress=None if args.json else _bar)
    finally:
        if engine is not None:
            engine.close()
    report["backend"], report["data"] = args.backend, str(source)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(render(report, f"judge {args.backend} on {source}"))
    return 0


def cmd_train(args, cfg) -> int:
    from . import probe_fit
    head, reader = probe_fit.head_for(cfg, rebuild=True, progress=_say)
    m = head.meta
    print(f"probe head for {reader.model_dir.name} ({m.model_hash}) fitted on {m.train_lines} "
          f"lines (the regression took {m.fit_s:.0f} s): layers {m.layers}, L2 {m.l2:g}, "
          f"threshold {m.threshold:.2f} (corrections) / {m.approval_threshold:.2f} (approvals), "
          f"judging by the mean of the readings {' and '.join(m.views)}")
    print("  on the dev split: " + ", ".join(f"{k} {v:.3f}" for k, v in m.dev.items()))
    print(f"  saved in {probe_fit.head_folder(cfg.models_dir, m.model_hash)}")
    return 0


def add_arguments(sp) -> None:
    sub = sp.add_subparsers(dest="judge_command", metavar="ACTION", required=True)
    e = sub.add_parser("eval", help="score a judge on labelled feedback lines",
                       description="Score a judge on labelled feedback: per-class precision and "
                       "recall, wrong-sign and abstention rates, confusion matrix, worst misses. "
                       "Each JSONL line is {\"text\": the next user message, \"label\": -1|0|1}, "
                       "optionally with \"context\" (the messages before it, ending with the "
                       "assistant's answer).")
    e.add_argument("--backend", default="probe", choices=("rules", "probe", "engine", "openai"),
                   help="which judge (default probe); openai reads judge.url/model from the recipe")
    e.add_argument("--data", help="a labelled JSONL file (default: the built-in corpus)")
    e.add_argument("--split", default="test", choices=corpus.SPLITS,
                   help="without --data: which split of the built-in corpus (default test)")
    e.add_argument("--concurrency", type=int, default=4, help="judgments at once (default 4)")
    e.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    e.set_defaults(judge_fn=cmd_eval)
    t = sub.add_parser("train", help="fit the probe judge's head from the corpus now",
                       description="Fit the probe judge's head for the recipe's base model from "
                       "the corpus's train split (thresholds chosen on dev) and store it under "
                       "$CLAWRL_HOME/models/probes/. The daemon does this itself on first start.")
    t.set_defaults(judge_fn=cmd_train)
    for p in (e, t):
        p.add_argument("--recipe", help="recipe TOML path or name under recipes/ "
                                        "(default: $CLAWRL_RECIPE or default)")


def main(args, cfg) -> int:
    return args.judge_fn(args, cfg)
