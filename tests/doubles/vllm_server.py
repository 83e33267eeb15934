"""A protocol double of a vLLM OpenAI-compatible server (`vllm serve MODEL ...`), for tests only.

It takes the options clawrl passes to `vllm serve` (refusing unknown ones, and `--max-lora-rank`
values vLLM does not accept), binds once the model is loaded, and answers what clawrl uses in the
shapes vLLM documents (see clawrl/engines/vllm.py for the facts and their sources): `/health`,
`/v1/models`, `/v1/completions` with token-id prompts (streamed deltas or not, `logprobs`,
`return_tokens_as_token_ids`, `return_token_ids`, `prompt_logprobs`, `stream_options`), and, only
with VLLM_ALLOW_RUNTIME_LORA_UPDATING set, `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`.
The compute is clawrl's embedded engine on a real model (compute.py). Not vLLM: no paged attention,
scheduler or GPUs; `--max-loras` and the parallel sizes are accepted and ignored.

`--transcript FILE` (double only) appends one JSON line per event, as in sglang_server.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from compute import Compute, Transcript, model_context_length, pid_line, serve

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm_server (double)")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=16, choices=MAX_LORA_RANKS)
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--transcript", default=None, help="double only: JSONL log of every event")
    return p.parse_args(argv)


def length_refusal(n_prompt: int, max_tokens: int, ctx: int) -> str | None:
    """The prompt and max_tokens must fit max_model_len together. Release 0.33.0 refuses a
    prompt of max_model_len or more (v1/engine/input_processor.py, _validate_prompt_len) and cuts
    max_tokens to what is left (entrypoints/serve/utils/api_utils.py, get_max_tokens); older
    releases refused the sum. This double refuses the sum: stricter than both, as
    tests/test_server_contracts.py checks against the source."""
    if n_prompt + max_tokens > ctx:
        return (f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the "
                "completion).")
    return None


def error(message: str, status: int, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


def build(args: argparse.Namespace, c: Compute, log: Transcript) -> Starlette:
    served = args.served_model_name or args.model
    runtime_lora = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    tok = c.tokenizer

    def token_str(t: int, as_id: bool) -> str:
        return f"token_id:{t}" if as_id else tok.decode([t])

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": "double"})

    async def models(request: Request) -> Response:
        cards = [{"id": served, "object": "model", "owned_by": "vllm", "root": args.model,
                  "parent": None, "max_model_len": c.engine.context_length}]
        cards += [{"id": n, "object": "model", "owned_by": "vllm", "root": p, "parent": served}
                  for n, p in c.paths.items()]
        return JSONResponse({"object": "list", "data": cards})

    async def completions(request: Request) -> Response:
        body = await request.json()
        model, ids = body.get("model"), body.get("prompt")
        if model not in (served, None) and model not in c.adapters:
            return error(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
        name = model if model in c.adapters else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return error("this double takes a token-id prompt only (clawrl never sends text)", 400,
                         "BadRequestError", "prompt")
        stream, k_prompt = bool(body.get("stream")), body.get("prompt_logprobs")
        if stream and k_prompt is not None:
            return error("prompt_logprobs cannot be streamed", 400, "BadRequestError",
                         "prompt_logprobs")
        max_tokens = body.get("max_tokens") or 16
        if (why := length_refusal(len(ids), max_tokens, c.engine.context_length)) is not None:
            return error(why, 400, "BadRequestError", "max_tokens")
        n_lp, as_id = body.get("logprobs"), bool(body.get("return_tokens_as_token_ids"))
        want_ids = bool(body.get("return_token_ids"))
        usage_chunk = bool((body.get("stream_options") or {}).get("include_usage"))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        prompt_rows = None
        if k_prompt is not None:
            rows = await c.prompt_logprobs(ids, int(k_prompt))
            prompt_rows = [None] + [
                {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": tok.decode([t])}
                 for r, (t, lp) in enumerate(top)} | {str(ids[i + 1]): {
                    "logprob": actual, "rank": None, "decoded_token": tok.decode([ids[i + 1]])}}
                for i, (actual, top) in enumerate(rows)]
            log.write("score", input_ids=ids, prompt_logprobs=k_prompt, model=model)
        temperature = body.get("temperature")
        gen = c.submit(ids, max_tokens, 1.0 if temperature is None else float(temperature),
                       float(body.get("top_p") or 1.0), body.get("seed"), name)

        def logprobs(tokens: list[int], lps: list[float], offset: int) -> dict | None:
            if n_lp is None:
                return None
            offsets, at = [], offset
            for t in tokens:
                offsets.append(at)
                at += len(tok.decode([t]))
            return {"text_offset": offsets, "token_logprobs": lps,
                    "tokens": [token_str(t, as_id) for t in tokens],
                    "top_logprobs": [{token_str(t, as_id): lp} for t, lp in zip(tokens, lps)]}

        out_ids, out_lp, texts = [], [], []
        usage = {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}

        async def run():
            """(delta ids, delta logprobs, delta text, finish reason) as tokens come."""
            status = "cancelled"
            async with c.running(name):
                try:
                    async for ev in gen:
                        await c.gate(name)
                        out_ids.append(ev.token_id)
                        out_lp.append(ev.logprob)
                        texts.append(ev.text)
                        yield [ev.token_id], [ev.logprob], ev.text, None
                    finish = await gen.wait()
                    status = finish.reason
                    yield [], [], "", "length" if finish.reason == "length" else "stop"
                finally:
                    gen.cancel()
                    usage.update(completion_tokens=len(out_ids), total_tokens=len(ids) + len(out_ids))
                    log.write("generate", input_ids=ids, model=model, lora_path=name,
                              sampling_params={k: body.get(k) for k in
                                               ("max_tokens", "temperature", "top_p", "seed")},
                              stream=stream, output_ids=out_ids, output_logprobs=out_lp,
                              finish=status)

        if not stream:
            reason = None
            async for _, _, _, r in run():
                reason = r or reason
            choice = {"index": 0, "text": "".join(texts), "logprobs": logprobs(out_ids, out_lp, 0),
                      "finish_reason": reason, "stop_reason": None, "prompt_logprobs": prompt_rows}
            if want_ids:
                choice.update(token_ids=out_ids, prompt_token_ids=ids)
            return JSONResponse({"id": rid, "object": "text_completion", "created": created,
                                 "model": model, "choices": [choice], "usage": usage})

        async def sse():
            offset, first = 0, True
            async for d_ids, d_lp, d_text, reason in run():
                choice = {"index": 0, "text": d_text, "logprobs": logprobs(d_ids, d_lp, offset),
                          "finish_reason": reason, "stop_reason": None}
                if want_ids:
                    choice["token_ids"] = d_ids
                    if first:
                        choice["prompt_token_ids"] = ids
                first, offset = False, offset + len(d_text)
                yield "data: " + json.dumps({"id": rid, "object": "text_completion",
                                             "created": created, "model": model,
                                             "choices": [choice]}) + "\n\n"
            if usage_chunk:
                yield "data: " + json.dumps({"id": rid, "object": "text_completion",
                                             "created": created, "model": model, "choices": [],
                                             "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(sse(), media_type="text/event-stream")

    async def load_lora(request: Request) -> Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error("lora_name and lora_path are both required", 400, "InvalidUserInput")
        if name in c.adapters:
            return error(f"adapter {name!r} is loaded already", 400, "InvalidUserInput")
        try:
            rank = c.adapter_rank(path)
        except (OSError, ValueError, KeyError) as e:
            log.write("load", lora_name=name, lora_path=path, ok=False, error=str(e))
            return error(f"no LoRA adapter {name!r} at {path}: {e}", 404, "NotFoundError")
        if rank > args.max_lora_rank:
            message = f"LoRA rank {rank} exceeds this server's max_lora_rank {args.max_lora_rank}."
            log.write("load", lora_name=name, lora_path=path, ok=False, error=message)
            return error(message, 500, "InternalServerError")
        await c.load(name, path)
        log.write("load", lora_name=name, lora_path=path, ok=True, rank=rank)
        return PlainTextResponse(f"Success: adapter {name!r} loaded")

    async def unload_lora(request: Request) -> Response:
        name = (await request.json()).get("lora_name")
        if name not in c.adapters:
            return error(f"adapter {name!r} is not loaded", 404, "NotFoundError")
        busy = c.inflight.get(name, 0)
        await c.unload(name)
        log.write("unload", lora_name=name, inflight_at_arrival=busy)
        return PlainTextResponse(f"Success: adapter {name!r} removed")

    async def hold(request: Request) -> Response:     # test knob, not vLLM
        body = await request.json()
        c.hold(body.get("lora_name"), bool(body.get("hold")))
        return JSONResponse({"held": sorted(c.held)})

    routes = [Route("/_double/hold", hold, methods=["POST"]), Route("/health", health),
              Route("/version", version), Route("/v1/models", models),
              Route("/v1/completions", completions, methods=["POST"])]
    if runtime_lora and args.enable_lora:
        routes += [Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
                   Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"])]
    async def not_found(request: Request, exc) -> Response:   # FastAPI's shape for no route
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    return Starlette(routes=routes, exception_handlers={404: not_found})


def main(argv: list[str]) -> None:
    args = parse(argv)
    log = Transcript(args.transcript)
    t0 = time.time()
    c = Compute(args.model, model_context_length(args.model, args.max_model_len),
                args.max_lora_rank, log)
    pid_line(log, ["vllm", *argv])
    print(f"vllm double: model loaded in {time.time() - t0:.1f} s; serving on "
          f"{args.host}:{args.port}", file=sys.stderr, flush=True)
    serve(build(args, c, log), args.host, args.port)


if __name__ == "__main__":
    main(sys.argv[1:])
