"""A protocol double of an SGLang server (`python -m sglang.launch_server`), for tests only.

It accepts the command-line options clawrl passes to SGLang (and refuses unknown ones, as SGLang's
argument parser does), binds its port once the model is loaded, and answers the endpoints clawrl
uses in the shapes SGLang documents (see the docstring of clawrl/engines/sglang.py for the facts
and where they come from): `/health`, `/server_info` (`/get_server_info`), `/generate` (streamed or
not, cumulative chunks unless `--incremental-streaming-output`), `/load_lora_adapter`,
`/unload_lora_adapter` (which, like SGLang's, waits for the adapter's running requests). The
compute is clawrl's embedded engine on a real model (compute.py). Not SGLang: no radix cache,
batching policy, CUDA or tensor parallelism; `--tp-size`/`--dp-size` are only reported back.

`--transcript FILE` (double only) appends one JSON line per event: start (with the pid, so a test
can kill it), generate (what came in and exactly what went out), load, unload.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from compute import Compute, Transcript, model_context_length, pid_line, serve


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang_server (double)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=None)
    p.add_argument("--lora-target-modules", nargs="+", default=None)
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--transcript", default=None, help="double only: JSONL log of every event")
    return p.parse_args(argv)


def has_sampling_seed(version: str) -> bool:
    """SamplingParams takes sampling_seed from release 0.5.3 (sampling/sampling_params.py); a
    version that is not a release number ("double") plays the newest."""
    parts = version.split(".")[:3]
    if len(parts) < 3 or not all(x.isdigit() for x in parts):
        return True
    return tuple(int(x) for x in parts) >= (0, 5, 3)


def length_refusal(n_input: int, max_new: int, ctx: int) -> str | None:
    """tokenizer_manager.py, TokenizerManager._validate_one_request, as of releases 0.5.2-0.5.4
    and main at commit 001067f: the input, and the input plus max_new_tokens, must both stay
    below the context (release 0.5.23 lets the sum reach it; this double keeps the stricter
    rule). tests/test_server_contracts.py checks it against each release's source."""
    if n_input >= ctx:
        return (f"The input ({n_input} tokens) is longer than the model's context length "
                f"({ctx} tokens).")
    if n_input + max_new >= ctx:
        return (f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n_input + max_new} tokens: {n_input} tokens "
                f"from the input messages and {max_new} tokens for the completion.")
    return None


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def lora_result(c: Compute, ok: bool, message: str | None = None, status: int = 200) -> JSONResponse:
    return JSONResponse({"success": ok, "error_message": message,
                         "loaded_adapters": dict(c.paths)}, status_code=status if ok else 400)


def build(args: argparse.Namespace, c: Compute, log: Transcript) -> Starlette:
    info = {k: v for k, v in vars(args).items() if k != "transcript"}
    # SGLANG_DOUBLE_VERSION (a test knob) makes it report, and behave as, an older release.
    version = os.environ.get("SGLANG_DOUBLE_VERSION", "double")
    info.update(version=version, context_length=c.engine.context_length,
                served_model_name=args.served_model_name or args.model_path)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def server_info(request: Request) -> Response:
        return JSONResponse(info)

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": args.model_path, "is_generation": True})

    async def generate(request: Request) -> Response:
        body = await request.json()
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return error("this double takes input_ids only (clawrl never sends text)")
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        name = body.get("lora_path")

        def refuse(message: str) -> Response:
            # SGLang's generate_request (entrypoints/http_server.py): a ValueError raised while
            # checking the request is a 400 without streaming, and with streaming an in-band
            # error line after the 200.
            if not body.get("stream"):
                return error(message)
            lines = f"data: {json.dumps({'error': {'message': message}})}\n\ndata: [DONE]\n\n"
            return Response(lines, media_type="text/event-stream")
        if name is not None and name not in c.adapters:
            return refuse(f"LoRA adapter {name!r} is not loaded")
        if "sampling_seed" in sp and not has_sampling_seed(version):
            # SamplingParams(**sampling_params) before 0.5.3 (sampling/sampling_params.py).
            return refuse("SamplingParams.__init__() got an unexpected keyword argument "
                          "'sampling_seed'")
        if (why := length_refusal(len(ids), max_new, c.engine.context_length)) is not None:
            return refuse(why)
        want_lp, start = bool(body.get("return_logprob")), int(body.get("logprob_start_len", -1))
        top_k = int(body.get("top_logprobs_num") or 0)
        rid = body.get("rid") or uuid.uuid4().hex
        meta = {"id": rid, "finish_reason": None, "prompt_tokens": len(ids), "completion_tokens": 0,
                "cached_tokens": 0, "weight_version": "default"}
        if max_new == 0:                       # scoring: logprobs of the prompt, nothing new
            rows = await c.prompt_logprobs(ids, top_k) if want_lp else []
            if want_lp:
                # Current SGLang leaves the first position it returns (logprob_start_len) without
                # a logprob, not only position 0 of the prompt.
                first = max(0, start)
                meta["input_token_logprobs"] = [
                    [None if i == first else rows[i - 1][0], ids[i], None]
                    for i in range(first, len(ids))]
                if top_k:
                    meta["input_top_logprobs"] = [
                        None if i == first else [[lp, t, None] for t, lp in rows[i - 1][1]]
                        for i in range(first, len(ids))]
                meta["output_token_logprobs"] = []
            meta["finish_reason"] = {"type": "length", "length": 0}
            log.write("score", input_ids=ids, logprob_start_len=start, top_logprobs_num=top_k,
                      lora_path=name)
            return JSONResponse({"text": "", "output_ids": [], "meta_info": meta})

        gen = c.submit(ids, max_new, float(sp.get("temperature", 1.0)), float(sp.get("top_p", 1.0)),
                       sp.get("sampling_seed"), name)
        out_ids, out_lp, text = [], [], []

        def chunk(delta_from: int) -> dict:
            # Cumulative unless the server streams increments (never for a non-streamed answer).
            cut = delta_from if args.incremental_streaming_output and body.get("stream") else 0
            m = {**meta, "completion_tokens": len(out_ids)}
            if want_lp:
                m["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                              zip(out_lp[cut:], out_ids[cut:])]
            return {"text": "".join(text[cut:]), "output_ids": out_ids[cut:], "meta_info": m}

        async def run():
            status = "cancelled"
            async with c.running(name):
                try:
                    async for ev in gen:
                        await c.gate(name)
                        out_ids.append(ev.token_id)
                        out_lp.append(ev.logprob)
                        text.append(ev.text)
                        if body.get("stream"):
                            yield chunk(len(out_ids) - 1)
                    finish = await gen.wait()
                    meta["finish_reason"] = ({"type": "length", "length": max_new}
                                             if finish.reason == "length" else
                                             {"type": "stop", "matched": out_ids[-1] if out_ids else None})
                    status = finish.reason
                    yield chunk(len(out_ids))
                finally:
                    gen.cancel()
                    log.write("generate", input_ids=ids, lora_path=name, sampling_params=sp,
                              stream=bool(body.get("stream")), output_ids=out_ids,
                              output_logprobs=out_lp, finish=status)

        if not body.get("stream"):
            last = None
            async for last in run():
                pass
            return JSONResponse(last)

        async def sse():
            async for part in run():
                yield f"data: {json.dumps(part)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(sse(), media_type="text/event-stream")

    async def load_lora(request: Request) -> Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not args.enable_lora:
            return lora_result(c, False, "LoRA is not enabled: start the server with --enable-lora")
        if name in c.adapters:
            return lora_result(c, False, f"LoRA adapter {name} is already loaded")
        try:
            rank = c.adapter_rank(path)
        except (OSError, ValueError, KeyError) as e:
            log.write("load", lora_name=name, lora_path=path, ok=False, error=str(e))
            return lora_result(c, False, f"cannot read LoRA adapter {name} at {path}: {e}")
        limit = args.max_lora_rank
        if limit is not None and rank > limit:
            message = (f"LoRA adapter {name} has rank {rank}, above this server's --max-lora-rank "
                       f"{limit}; it does not fit the LoRA memory pool")
            log.write("load", lora_name=name, lora_path=path, ok=False, error=message)
            return lora_result(c, False, message)
        await c.load(name, path)
        log.write("load", lora_name=name, lora_path=path, ok=True, rank=rank)
        return lora_result(c, True)

    async def unload_lora(request: Request) -> Response:
        name = (await request.json()).get("lora_name")
        if name not in c.adapters:
            return lora_result(c, False, f"LoRA adapter {name} is not loaded")
        busy = c.inflight.get(name, 0)
        while c.inflight.get(name, 0):          # SGLang lets running requests finish first
            await asyncio.sleep(0.05)
        await c.unload(name)
        log.write("unload", lora_name=name, inflight_at_arrival=busy)
        return lora_result(c, True)

    async def hold(request: Request) -> Response:     # test knob, not SGLang
        body = await request.json()
        c.hold(body.get("lora_name"), bool(body.get("hold")))
        return JSONResponse({"held": sorted(c.held)})

    return Starlette(routes=[
        Route("/_double/hold", hold, methods=["POST"]),
        Route("/health", health), Route("/server_info", server_info),
        Route("/get_server_info", server_info), Route("/model_info", model_info),
        Route("/get_model_info", model_info),
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/load_lora_adapter", load_lora, methods=["POST"]),
        Route("/unload_lora_adapter", unload_lora, methods=["POST"]),
    ])


def main(argv: list[str]) -> None:
    args = parse(argv)
    log = Transcript(args.transcript)
    t0 = time.time()
    c = Compute(args.model_path, model_context_length(args.model_path, args.context_length),
                args.max_lora_rank or 0, log)
    pid_line(log, ["sglang", *argv])
    print(f"sglang double: model loaded in {time.time() - t0:.1f} s; serving on "
          f"{args.host}:{args.port}", file=sys.stderr, flush=True)
    serve(build(args, c, log), args.host, args.port)


if __name__ == "__main__":
    main(sys.argv[1:])
