"""Does the base model still read text far past its native window? The cost of a longer
`model.context_length`, in quality: the same passage's loss after ever longer unrelated text.

A passage (the README's first ~`--passage` tokens) is scored, token by token, after a prefix of
`P` tokens of other text (this repository's Python sources, in a fixed order), for each `P` in
`--prefixes`. A model whose positions still work past its native window gives the passage about
the same loss at every `P` (a longer prefix may even help a little); one whose positions broke
gives a loss that climbs with `P`. Read in float32 with a KV cache, `--chunk` tokens at a time, as
the engine prefills. `--ask N` also asks three questions after N tokens, as OpenClaw asks after its
long system prompt. One JSON line, and a table on stderr:

    .venv/bin/python bench/long_context.py --rope own --ask 13000 --out bench/results/long-context-own.json
    .venv/bin/python bench/long_context.py --ask 13000 --out bench/results/long-context-served.json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import REPO, emit

sys.path.insert(0, str(REPO / "daemon"))


def prefix_text() -> str:
    """Text unrelated to the passage: the package's sources, in a fixed order."""
    return "\n\n".join(p.read_text() for p in sorted((REPO / "daemon" / "clawrl").rglob("*.py")))


@torch.inference_mode()
def passage_loss(model, prefix: list[int], passage: list[int], chunk: int) -> float:
    """Mean next-token loss over `passage` read after `prefix`."""
    from transformers import DynamicCache
    ids = torch.tensor([prefix + passage])
    cache, losses, start = DynamicCache(), [], len(prefix)
    for at in range(0, ids.shape[1], chunk):
        piece = ids[:, at:at + chunk]
        logits = model(input_ids=piece, past_key_values=cache, use_cache=True).logits[0].float()
        # position at+i predicts at+i+1: keep the predictions of the passage's tokens
        targets = torch.arange(at + 1, at + 1 + piece.shape[1])
        keep = (targets > start) & (targets < ids.shape[1])
        if keep.any():
            losses.append(torch.nn.functional.cross_entropy(logits[keep], ids[0, targets[keep]],
                                                            reduction="none"))
    return float(torch.cat(losses).mean())


QUESTIONS = ["What is the capital of France? Answer in one sentence.",
             "Write a haiku about the sea.",
             "Name three primary colours."]


@torch.inference_mode()
def answers_after(model, tok, material: list[int], tokens: int) -> list[str]:
    """Greedy answers to QUESTIONS asked after `material` (as a system message), as OpenClaw asks
    after its long system prompt."""
    out = []
    for q in QUESTIONS:
        messages = [{"role": "system", "content": "Reference material follows.\n\n"
                     + tok.decode(material)}, {"role": "user", "content": q}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        gen = model.generate(ids, max_new_tokens=tokens, do_sample=False)
        out.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def short_questions(n: int) -> list[str]:
    """`n` short questions people asked, from the feedback corpus's dev split, in a fixed order."""
    import json
    import random
    seen: list[str] = []
    for line in (REPO / "recipes" / "feedback" / "dev.jsonl").read_text().splitlines():
        context = json.loads(line).get("context") or []
        q = next((m["content"] for m in context if m["role"] == "user"), None)
        if q and 15 < len(q) < 200 and q not in seen:
            seen.append(q)
    random.Random(0).shuffle(seen)
    return seen[:n]


@torch.inference_mode()
def short_range(own, served, tok, questions: list[str], tokens: int = 32, agree: int = 16) -> dict:
    """How far the served model moves from the model's own on short prompts: the mean logprob it
    gives the own model's greedy answers (teacher-forced; the own model's own figure beside it),
    and on how many answers the first `agree` tokens' argmax is the same."""
    lp_own, lp_served, same = [], [], 0
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        answer = own.generate(ids, max_new_tokens=tokens, do_sample=False)[0, ids.shape[1]:]
        full = torch.cat([ids[0], answer])[None]
        for model, into in ((own, lp_own), (served, lp_served)):
            lp = model(full).logits[0, ids.shape[1] - 1:-1].float().log_softmax(-1)
            into.append(lp.gather(-1, answer[:, None]).mean().item())
        same += int(torch.equal(lp.argmax(-1)[:agree], answer[:agree]))
    return {"questions": len(questions), "own_mean_logprob": round(sum(lp_own) / len(questions), 4),
            "served_mean_logprob": round(sum(lp_served) / len(questions), 4),
            f"first_{agree}_argmax_agree": same}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"),
                   help="a converted model folder (default: the default recipe's, made by `clawrl serve`)")
    p.add_argument("--prefixes", default="0,4096,8192,12288,16384,20480,24576,28672",
                   help="prefix lengths in tokens, comma-separated")
    p.add_argument("--passage", type=int, default=2048, help="passage length in tokens (default 2048)")
    p.add_argument("--chunk", type=int, default=2048, help="tokens read per forward (default 2048)")
    p.add_argument("--rope", choices=("own", "served"), default="served",
                   help="own: the model's own RoPE; served (default): what clawrl serves for a "
                        "window of --context-length (models.long_context: YaRN past the native one)")
    p.add_argument("--context-length", type=int, default=32768,
                   help="the recipe's model.context_length, for --rope served (default 32768)")
    p.add_argument("--attention-factor", type=float,
                   help="--rope served: override YaRN's attention temperature (1 = none), to compare")
    p.add_argument("--short", type=int, default=0, metavar="N",
                   help="also compare the read model with the model's own on N short questions "
                        "(teacher-forced on the own model's greedy answers; default: don't)")
    p.add_argument("--ask", type=int, default=0, metavar="N",
                   help="also ask three questions after N tokens of this repository's docs and "
                        "print the greedy answers (default: don't)")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawrl.models import long_context
    if not Path(args.model, "config.json").exists():
        p.error(f"no model in {args.model}: run `clawrl serve` once (it converts the default model), "
                "or pass --model")
    with tempfile.TemporaryDirectory() as variants:
        folder = (long_context(Path(args.model), args.context_length, Path(variants))
                  if args.rope == "served" else Path(args.model))
        if args.attention_factor is not None:
            if folder == Path(args.model):
                p.error("--attention-factor needs --rope served and a --context-length past the "
                        "model's native window")
            import json
            cfg = json.loads((folder / "config.json").read_text())
            for key in ("rope_parameters", "rope_scaling"):
                cfg[key]["attention_factor"] = args.attention_factor
            (folder / "config.json").unlink()
            (folder / "config.json").write_text(json.dumps(cfg))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    passage = tok((REPO / "README.md").read_text())["input_ids"][:args.passage]
    other = tok(prefix_text())["input_ids"]
    prefixes = [int(x) for x in args.prefixes.split(",") if x]
    if prefixes and max(prefixes) > len(other):
        p.error(f"the prefix text has only {len(other)} tokens")
    rows = []
    for n in prefixes:
        t0 = time.time()
        loss = passage_loss(model, other[:n], passage, args.chunk)
        rows.append({"prefix_tokens": n, "passage_from": n, "passage_to": n + len(passage),
                     "loss": round(loss, 4), "seconds": round(time.time() - t0, 1)})
        print(f"passage at {n:>6}-{n + len(passage):<6} loss {loss:.3f}  ({rows[-1]['seconds']} s)",
              file=sys.stderr, flush=True)
    short = None
    if args.short:
        own = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        short = short_range(own, model, tok, short_questions(args.short))
        print(f"short range: {short}", file=sys.stderr, flush=True)
    asked = None
    if args.ask:
        docs = "\n\n".join(f.read_text() for f in sorted(REPO.glob("*.md"))
                            + sorted((REPO / "bench").glob("RESULTS*.md")))
        material = tok(docs)["input_ids"][:args.ask]
        asked = {"after_tokens": len(material),
                 "answers": dict(zip(QUESTIONS, answers_after(model, tok, material, 40)))}
        for q, a in asked["answers"].items():
            print(f"after {len(material)} tokens: {q!r} -> {a!r}", file=sys.stderr, flush=True)
    emit({"model": Path(args.model).name, "rope": args.rope, "context_length": args.context_length,
          "passage_tokens": len(passage),
          "rope_parameters": model.config.rope_parameters, "rows": rows, "short_range": short,
          "asked": asked}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
