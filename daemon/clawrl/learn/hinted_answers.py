"""The hinted teacher's own answers, for consolidation (learn/consolidate.py).

Online, on-policy distillation moves every token of a -1 answer toward what the teacher (the
frozen base model shown the request with the user's words as a hint, learn/teacher.py) would
have said. A sequence-level +1/-1 cannot carry that: a fresh KTO adapter trained on the judged
turns alone (at lr 1e-4) kept what the online adapter had learned on one window of three, and
at the default lr 3e-4 it still lost most of it on a window of nearly all corrections
(bench/RESULTS-consolidate.md). So, before KTO runs, the teacher writes its own answer to a -1
turn's request once, and that answer joins the window as a desirable example under the
*original* prompt: KTO then raises the answer the hint asked for, where the served one is only
lowered. Measured helpful on windows of nearly all corrections, mixed on balanced ones, and
costly on a CPU; so by default only a window with more -1 than +1 turns gets them, as many as
even its labels (`consolidate.teacher_answers`, learn/consolidate.teacher_asked).

An answer the teacher did not finish within the completion budget is left out (a cut-off answer
is not one it prefers as a whole), and so is an empty one or one equal to the served answer.

Each turn's answer is written once: it is kept in the turn's row (`teacher_answer`, under a key of
the base model's hash, the hint and the budgets), so the next consolidation, whose window mostly
overlaps, reads it back instead of writing it again. It goes with the row when the turn is
forgotten.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from ..chat.format import render_prompt
from .teacher import hinted_messages

BATCH = 16           # answers written at once (left-padded prompts, one generate call; 16 took
                     # 3.6 s a turn against 5.1 s for 8 on 2 CPU cores)
TEMPERATURE = 0.7    # the eval's and a chat client's usual sampling; greedy repeats itself
VERSION = 1          # of how an answer is written: a change makes every kept answer stale


@dataclass
class Wanted:
    """One -1 turn that has a hint: its request and the answer that was served."""
    id: int
    request: dict
    hint: str
    response_ids: list[int]


def key(model_digest: str, hint: str, max_prompt_tokens: int, max_new_tokens: int) -> str:
    """What a kept answer was written under; one that differs is written again."""
    what = [VERSION, model_digest, hint, max_prompt_tokens, max_new_tokens, TEMPERATURE]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def recall(kept: str | None, under: str) -> tuple[bool, list[int] | None]:
    """(found, answer) from a row's teacher_answer: found when it was written under `under`
    (the answer is None when it was left out then)."""
    try:
        value = json.loads(kept) if kept else None
    except ValueError:
        return False, None
    if not isinstance(value, dict) or value.get("key") != under:
        return False, None
    ids = value.get("ids")
    return True, ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None


def keep(answer: list[int] | None, under: str) -> str:
    """The teacher_answer column's value for an answer written under `under`."""
    return json.dumps({"key": under, "ids": answer})


def write(model, tokenizer, wanted: list[Wanted], max_prompt_tokens: int, max_new_tokens: int,
          stop: threading.Event, progress: Callable[[int, int], None] | None = None,
          seed: int = 0) -> dict[int, list[int] | None]:
    """The teacher's answer (token ids, EOS included) to each wanted turn, by turn id; None for a
    turn whose answer was left out (see the module's doc). `model` is the base model in eval
    mode; the prompt is the hinted request's last `max_prompt_tokens` tokens. Stops between two
    batches when `stop` is set (the caller then writes nothing)."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    out: dict[int, list[int] | None] = {}
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    prompts = {w.id: render_prompt(tokenizer, hinted_messages(w.request["messages"], w.hint),
                                   w.request.get("tools"))[-max_prompt_tokens:] for w in wanted}
    wanted = sorted(wanted, key=lambda w: len(prompts[w.id]))   # a batch of one length pads little
    try:
        for start in range(0, len(wanted), BATCH):
            if stop.is_set():
                break
            batch = wanted[start:start + BATCH]
            prompts_now = [prompts[w.id] for w in batch]
            width = max(map(len, prompts_now))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts_now], device=model.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_now],
                                device=model.device)
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     do_sample=True, temperature=TEMPERATURE, top_p=1.0,
                                     pad_token_id=pad, eos_token_id=eos)
            for w, row in zip(batch, gen[:, width:].tolist()):
                answer = finished(row, eos)
                useful = answer and answer != w.response_ids and tokenizer.decode(answer[:-1]).strip()
                out[w.id] = answer if useful else None
            if progress:
                progress(min(start + BATCH, len(wanted)), len(wanted))
    finally:
        torch.random.set_rng_state(generator_state)
    return out


def finished(row: list[int], eos: int) -> list[int] | None:
    """The generated ids up to and including the first EOS; None when there is none (cut off)."""
    return row[:row.index(eos) + 1] if eos in row else None
