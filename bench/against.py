"""`bench/serve.py --against URL`: the same decode workload on clawrl and on any other
OpenAI-compatible server (a llama.cpp `llama-server`, a second clawrl on another decode path),
interleaved call by call so that a busy machine slows both alike; ratios clawrl / other.

Workloads, greedy, `--against-tokens` tokens each:
  short       a one-line request: decode tokens/s after the first token
  ctx N       a system prompt of about N rendered tokens, new to both servers (a nonce leads
              it): cold prefill (TTFT), decode tokens/s after it, then the same request again:
              cached TTFT (prefix reuse)

Decode rate = (completion_tokens - 1) / (end of stream - first content), from the servers' own
usage counts. Both servers should serve the same model (the other at the precision it ships).
"""
from __future__ import annotations

import statistics
import uuid

import httpx

SHORT_Q = "Tell me a long story about a lighthouse keeper and a storm."


def long_messages(render, tokens: int) -> list[dict]:
    """A system prompt of numbered notes, about `tokens` long once rendered, led by a nonce so
    neither server has it cached."""
    nonce = uuid.uuid4().hex[:8]

    def msgs(n):
        notes = "\n".join(f"Note {i}: the {('north', 'east', 'south', 'west')[i % 4]} shed holds "
                          f"{i * 37 % 101} crates of item {i * 13 % 97}." for i in range(n))
        return [{"role": "system", "content": f"Inventory {nonce}.\n{notes}"},
                {"role": "user", "content": "Summarise what the north shed holds."}]
    n = max(1, tokens // 25)
    for _ in range(4):
        n = max(1, round(n * tokens / len(render(msgs(n)))))
    return msgs(n)


def _rate(call) -> float | None:
    n, span = call.completion_tokens, (call.done - call.first) if call.first else None
    return (n - 1) / span if n > 1 and span else None


async def compare(call, render, clawrl_url: str, other_url: str, contexts: list[int],
                  tokens: int, reps: int, say) -> dict:
    """`call(client, messages, max_tokens=...)` streams one request (serve.py's proxy_call)."""
    out: dict = {"clawrl_url": clawrl_url, "other_url": other_url, "tokens": tokens, "reps": reps,
                 "workloads": {}}
    # a fresh connection per request: llama-server drops a kept-alive one after a long answer
    limits, timeout = httpx.Limits(max_keepalive_connections=0), httpx.Timeout(None)
    async with httpx.AsyncClient(base_url=clawrl_url, timeout=timeout, limits=limits) as mine, \
            httpx.AsyncClient(base_url=other_url, timeout=timeout, limits=limits) as other:
        sides = {"clawrl": mine, "other": other}
        for side, client in sides.items():           # warm-up: load, first-call costs
            await call(client, [{"role": "user", "content": "Hi."}], max_tokens=4)
        rows: dict = {"short": {s: [] for s in sides}}
        for c in contexts:
            rows[f"ctx {c}"] = {s: [] for s in sides}
        for rep in range(reps):
            for side, client in sides.items():
                say(f"--against rep {rep + 1}/{reps}: short on {side}")
                r = await call(client, [{"role": "user", "content": SHORT_Q}], max_tokens=tokens)
                rows["short"][side].append({"decode_tok_s": _rate(r)})
            for c in contexts:
                msgs = long_messages(render, c)
                for side, client in sides.items():
                    say(f"--against rep {rep + 1}/{reps}: {c}-token prompt on {side} (cold)")
                    cold = await call(client, msgs, max_tokens=tokens)
                    warm = await call(client, msgs, max_tokens=1)
                    rows[f"ctx {c}"][side].append({
                        "decode_tok_s": _rate(cold), "cold_ttft_s": cold.ttft,
                        "cached_ttft_s": warm.ttft, "prompt_tokens": cold.prompt_tokens})
    for name, by_side in rows.items():
        summary = {}
        for side, runs in by_side.items():
            summary[side] = {k: statistics.median([r[k] for r in runs if r.get(k) is not None])
                             for k in runs[0] if any(r.get(k) is not None for r in runs)}
        ratio = {k: summary["clawrl"][k] / summary["other"][k] for k in summary["clawrl"]
                 if k in summary["other"] and summary["other"][k] and k != "prompt_tokens"}
        out["workloads"][name] = {**summary, "ratio_clawrl_over_other": ratio}
    return out


def print_against(res: dict) -> None:
    live = " (clawrl on adapter 1, merged)" if res.get("meta", {}).get("adapter_live") else ""
    print(f"clawrl ({res['clawrl_url']}){live} against {res['other_url']}: {res['tokens']} tokens, "
          f"greedy, median of {res['reps']}, interleaved")
    print(f"  {'workload':<12}{'metric':<16}{'clawrl':>10}{'other':>10}{'ratio':>8}")
    for name, w in res["workloads"].items():
        for k in ("decode_tok_s", "cold_ttft_s", "cached_ttft_s"):
            if k in w["clawrl"]:
                r = w["ratio_clawrl_over_other"].get(k, float("nan"))
                print(f"  {name:<12}{k:<16}{w['clawrl'][k]:>10.2f}{w['other'].get(k, float('nan')):>10.2f}"
                      f"{r:>8.2f}")
    print("  (decode: higher is better; TTFT: lower is better)")
