"""How near the probe's judgment and a consolidation run to what this CPU's matrix products allow.

Both are nearly all matrix products of the base model's layers, and what they read fixes how
many: a judgment reads the tokens of its two readings (judge/probe.py) through the layers up to
the deepest one read; a consolidation step of TRL's KTO reads its batch and its mismatched (KL)
batch through the whole model several times (learn/kto_cpu.py says which passes). For each job
this times the products alone, on the job's own shapes and kernels, on this CPU (the fastest of
several repetitions), and puts the result beside the job's measured time from its benchmark's
result file (bench/judge.py, bench/consolidate.py). That is a floor: attention, norms, the LoRA's
own products and everything else come on top. A target under its floor is not reached by making
the rest faster, only by reading fewer tokens, making fewer passes or cheaper products.

    .venv/bin/python bench/floors.py [--judge bench/results/judge-speed.json] \\
        [--consolidate bench/results/consolidate-500-chat-zen4.json ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from clawrl.config import load_config
from clawrl.judge import corpus, evaluate as judge_eval, probe
from clawrl.judge.judges import last_question
from clawrl.models import bf16_supported, provision

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402

REPS = 7
# The passes of one step over the model's decoder layers and over its LM head (answers only,
# learn/kto_cpu.py), with the frozen weights' products: forward passes, and passes that carry a
# gradient down to the input (the frozen weights themselves get none). KTO: the policy on the KL
# batch (no gradient), the policy on the batch, its recomputation under gradient checkpointing
# (decoder only) and its backward, the reference on both. APO-zero reads no KL batch.
PASSES = {"kto": {"decoder": (5, 1), "lm_head": (4, 1)},
          "apo-zero": {"decoder": (3, 1), "lm_head": (2, 1)}}


def fastest(fn) -> float:
    """Seconds of `fn`'s fastest run of REPS, after two to warm up."""
    fn(), fn()
    best = float("inf")
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def layer_shapes(config) -> list[tuple[int, int]]:
    """(in, out) of a Llama-family decoder layer's seven products."""
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * getattr(config, "head_dim", h // config.num_attention_heads)
    return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]


def products_s(rows: int, shapes: list[tuple[int, int]], dtype: torch.dtype, backward: bool = False) -> float:
    """The fastest time of the products x Wᵀ (or, `backward`, g W) of `rows` rows for `shapes`,
    as consolidation runs them: float32, or bfloat16 in and float32 out (clawrl/bf16.py)."""
    total = 0.0
    for n_in, n_out in shapes:
        w = torch.randn(n_out, n_in).to(dtype)
        x = torch.randn(rows, n_out if backward else n_in)
        if backward:
            total += fastest(lambda: torch.matmul(x.to(dtype), w).float())
        else:
            total += fastest(lambda: F.linear(x.to(dtype), w).float())
    return total


def probe_floor(model_dir: Path, judge_result: dict, lines: int) -> dict:
    """A judgment's products through the probe's own kernels (the packed layers' matrices) for
    the tokens each test-split line reads, beside bench/judge.py's measured median."""
    reader = probe.Reader(model_dir)
    if reader.packed is None:
        raise SystemExit("the probe's reader is not packed for this model: no floor to compare")
    layer = reader.packed.layers[0]          # every layer's products have the same shapes
    mats = [layer.qkv, layer.o, layer.gate_up, layer.down]
    depth = len(reader.packed.layers)

    def products_ms(tokens: int) -> float:
        x, xd = torch.randn(tokens, mats[0].weight.shape[1]), torch.randn(tokens, mats[3].weight.shape[1])
        return 1000 * depth * sum(fastest(lambda m=m, v=v: m(v)) for m, v in zip(mats, (x, x, x, xd)))
    both, context = [], []          # (floor ms, tokens) per line
    for e in corpus.load("test")[:lines]:
        inp = judge_eval.judge_input(e)
        ctx = len(reader._ids(probe.exchange(last_question(inp.context), inp.response, e.text))[0])
        lone = len(reader._ids(probe.alone(e.text))[0])
        both.append((products_ms(ctx + lone), ctx + lone))
        context.append((products_ms(ctx), ctx))
    lat = judge_result["latency"]
    rows = {}
    for name, seen, measured in (("probe", both, lat["probe"]["p50_ms"]),
                                 ("probe_context_only", context, lat["probe_context_only"]["p50_ms"])):
        floor = statistics.median(ms for ms, _ in seen)
        rows[name] = {"tokens_median": statistics.median(t for _, t in seen), "floor_ms": round(floor, 1),
                      "measured_ms": round(measured, 1), "measured_over_floor": round(measured / floor, 2)}
    return {"products": layer.qkv.kind, "layers_read": depth, "lines": lines, "target_ms": 50, **rows,
            "target_over_floor": round(50 / rows["probe"]["floor_ms"], 2)}


def consolidate_floor(result: dict, config) -> dict:
    """One consolidation's products (its log's mean batch, its method's passes, its product path)
    beside its measured wall time."""
    c, log = result["recipe"]["consolidate"], result["log"]
    products = result["path"]["products"]
    dtype = torch.bfloat16 if products == "bfloat16" else torch.float32
    batch = c["batch_size"]
    rows = round(batch * (log["prompt_tokens_mean"] + log["response_tokens_mean"]))
    answers = round(batch * log["response_tokens_mean"])
    (dec_f, dec_b), (lm_f, lm_b) = PASSES[c["method"]]["decoder"], PASSES[c["method"]]["lm_head"]
    shapes, head = layer_shapes(config), [(config.hidden_size, config.vocab_size)]
    step = config.num_hidden_layers * (dec_f * products_s(rows, shapes, dtype)
                                       + dec_b * products_s(rows, shapes, dtype, backward=True))
    step += lm_f * products_s(answers, head, torch.float32) + lm_b * products_s(answers, head, torch.float32,
                                                                               backward=True)
    floor = step * result["steps"]
    return {"method": c["method"], "products": products, "turns": log["turns"], "steps": result["steps"],
            "batch_tokens": rows, "floor_s": round(floor), "measured_s": result["wall_s"],
            "measured_over_floor": round(result["wall_s"] / floor, 2), "target_s": result.get("target_s", 600),
            "target_over_floor": round(result.get("target_s", 600) / floor, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", default="bench/results/judge-speed.json",
                    help="bench/judge.py's result whose latencies to compare (default: %(default)s)")
    ap.add_argument("--lines", type=int, default=154, help="test-split lines, as bench/judge.py (default 154)")
    ap.add_argument("--consolidate", nargs="*", default=["bench/results/consolidate-500-chat-zen4.json",
                                                         "bench/results/consolidate-500-chat-apo-zero-bfloat16.json"],
                    help="bench/consolidate.py results to compare (default: the default path and APO-zero)")
    ap.add_argument("--out", help="write the JSON result here too")
    args = ap.parse_args(argv)
    from transformers import AutoConfig
    cfg = load_config(None)
    model_dir = provision(cfg.model.source, cfg.models_dir, cfg.home / "cache")
    config = AutoConfig.from_pretrained(model_dir)
    out: dict = {"bench": "floors", "threads": torch.get_num_threads(), "native_bfloat16": bf16_supported()}
    out["probe"] = probe_floor(model_dir, json.loads(Path(args.judge).read_text()), args.lines)
    p, c = out["probe"]["probe"], out["probe"]["probe_context_only"]
    print(f"probe judgment: {p['tokens_median']:.0f} tokens, products alone {p['floor_ms']} ms (measured "
          f"{p['measured_ms']} ms, target 50 ms); context only {c['floor_ms']} ms (measured {c['measured_ms']} ms)",
          flush=True)
    out["consolidate"] = {}
    for path in args.consolidate:
        row = consolidate_floor(json.loads(Path(path).read_text()), config)
        out["consolidate"][Path(path).name] = row
        print(f"consolidation {Path(path).name}: {row['method']}, {row['products']} products: products alone "
              f"{row['floor_s']} s (measured {row['measured_s']} s, target {row['target_s']} s)", flush=True)
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
