"""The probe judge: a small head on the frozen base model's own hidden states reads a user's reply
as approval, correction or neither.

The base model reads the exchange in chat form (the question, the tail of the answer, the user's
reply, then the generation prompt of the assistant's next turn); at every other layer of the
model's first two thirds, the hidden state of the reply's last token, the reply's mean hidden
state and the state where the assistant would begin its next answer (the generation prompt's last
token) are the feature vector; a multinomial logistic head, fitted on the
feedback corpus's train split, gives p(-1), p(0), p(+1). The reply is read twice, in its context
and alone (after a neutral one-question exchange), and a judgment takes the mean of the two
readings' probabilities (VIEWS says why). A vote is cast only when that probability reaches its
class's threshold, chosen on the dev split, and is the likelier of the two signs, so unsure
readings answer 0 and never train. Tool results keep the rules judge's structured reading (JSON
fields, exit codes), and on -1 the user's own words are the hint.

It owns the features, the head (what it computes, save, load) and the `ProbeJudge`. Fitting a
head, where it lives and when it is refitted are judge/probe_fit.py's; the judging loop only calls
`probe_fit.ensure_head`. The base model is
a private copy cut after the last layer read (no LM head), so the probe never touches the engine.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import torch

from ..bf16 import products_in
from ..chat.format import content_text
from ..errors import ClawrlError
from ..engines.packed import PackedModel, rms_norm, supported
from ..models import bf16_supported
from ..types import JudgeInput, Judgment
from .corpus import NEUTRAL_CONTEXT
from .judges import combine, last_question, rules_hint, tool_vote

log = logging.getLogger("clawrl.probe")

FORMAT = 5
# What is read: at every other layer up to two thirds of the model's depth, the hidden state of
# the reply's last token, the mean over the reply's tokens, and the state at the end of the
# assistant's generation prompt: where the model is about to answer the reply, and so has read it
# as something to apologise for, to thank for or to act on. Chosen with SmolLM2-135M by five-fold
# cross-validation over train and dev (5,404 lines, L2 0.1): log-loss 0.253, and 1.8 % wrong
# signs where corrections are found at 0.85 and approvals at 0.80, against 0.266 and 2.1 %
# without the generation prompt's state (FORMAT 4) and 0.364 and 4.3 % with it alone. Reading the
# three views less deep costs accuracy: to layer 15, 0.269 and 2.1 %; to layer 13, 0.302 and
# 3.1 %. (On 4,316 lines: 2/5 of the depth, or a 2-layer MLP head, was worse too.)
READ_TO, READ_EVERY = 2 / 3, 2
QUESTION_CHARS, ANSWER_CHARS, REPLY_CHARS = 160, 240, 600
MAX_TOKENS = 192          # the rendered exchange, cut from the left (the reply sits at its end)
L2_GRID = (1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)
MIN_PRECISION = 0.90      # the dev split's correction precision the thresholds must keep
# How the abstention thresholds are chosen on dev (a head chosen by another rule is refitted).
# The operating point is what a reading must find: at least RECALL_FLOORS of dev's corrections
# and approvals; among the pairs that find that many, the one with the fewest wrong signs. Where
# none does (or only at more than MAX_WRONG_SIGN), the pair with the most right votes less
# WRONG_SIGN_COST times the wrong ones: a vote with the wrong sign undoes one and trains the
# other way. Chosen by cross-validation over train and dev (7,100 lines; thresholds chosen on
# 1,200 out-of-fold lines and scored on 1,300 others, 6 draws): wrong signs 2.2 % on average
# (1.7 to 3.1 %) at recall 0.85 / 0.81, against 2.8 % at 0.88 / 0.82 for the net rule alone.
# Rule 2: a vote is never the less likely sign (`decide`). Under rule 1 an approval threshold
# under 0.5 (dev chose 0.42) voted +1 on replies the head found likelier corrections ("Too
# wordy. Tighten it up." at p(-1) 0.54, p(+1) 0.46). With the 8,408-line head, rule 2 read the
# test split with 2.6 % wrong signs against 2.8 % (approval recall 0.811 against 0.827), and 120
# fresh simulated turns with 8 wrong signs against 11, agreeing on the same 96.
THRESHOLD_RULE = "recall-floors-2"
RECALL_FLOORS = (0.85, 0.80)     # corrections, approvals
MAX_WRONG_SIGN = 0.05
WRONG_SIGN_COST = 3
# The readings a judgment averages the head's probabilities over: the reply in context (after the
# question and the answer's tail) and the reply alone (after the neutral one-question exchange).
# In context the head also reads the answer, and it learnt from the corpus, whose answers were
# written to fit their labels, that an answer that looks right is thanked: after a small model's
# long, confident and wrong answers it read corrections such as "that can't be right. Can you
# double-check?" as approvals, or abstained. Against simulated users (bench/judge_agreement.py:
# recorded eval turns, judged against whether the user was satisfied), the mean of the two
# readings agreed on 0.933 of 826 turns against 0.895 in context alone (student 0.85 against
# 0.69, teacher 0.91 against 0.68), and on held-out fresh turns teacher 0.85 against 0.60,
# student 0.65 against 0.50, yesno 0.925 for both. The corpus's splits pay a little: wrong
# signs 3.1 % against 2.7 % on dev, 3.0 % against 2.4 % on test. The reply alone is no reading
# by itself: it finds 0.69 of dev's corrections. Its start is read once (Reader), so the second
# reading costs the reply's turn and the generation prompt, and both are read in one pass
# (Reader.read_both): 78 ms a judgment against 61 ms in context only (bench/judge.py). A head
# without ALONE in its views is refitted.
CONTEXT, ALONE = "context", "alone"
VIEWS = [CONTEXT, ALONE]
# How long a judgment waits for the engine's worker to take it (judge/loop.py) before it is read
# on a thread of its own: a decode pass takes tens of milliseconds, a long prefill minutes.
LEND_WAIT_S = 2.0


class ProbeError(ClawrlError):
    """The probe's head could not be read or built."""


# ------------------------------------------------------------------------------------- features

def _head_tail(text: str, limit: int, tail_only: bool = False) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail_only else text[:limit * 2 // 3] + " … " + text[-limit // 3:]


def exchange(question: str, answer: str, reply: str) -> list[dict]:
    """What the base model reads: the question, the end of the answer, the reply."""
    msgs = [{"role": "user", "content": _head_tail(question, QUESTION_CHARS)}] if question else []
    return msgs + [{"role": "assistant", "content": _head_tail(answer, ANSWER_CHARS, True) or "…"},
                   {"role": "user", "content": _head_tail(reply, REPLY_CHARS)}]


def alone(reply: str) -> list[dict]:
    """The reply's other reading: after the neutral one-question exchange (the one a judge is
    given for a labelled line without context), so that what it says is read apart from the
    answer it follows."""
    return exchange(NEUTRAL_CONTEXT[0]["content"], NEUTRAL_CONTEXT[1]["content"], reply)


def read_layers(depth: int) -> tuple[int, ...]:
    """The layers read in a model of `depth` layers: 1, 3, 5, ... up to READ_TO of the depth."""
    return tuple(range(1, max(1, round(READ_TO * depth)) + 1, READ_EVERY))


class Reader:
    """The frozen base model, cut after the deepest layer read, turning exchanges into features.

    Activations stay float32. The layers' matrix products run in bfloat16 (float32 sums) where
    the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): the products are nearly all of a
    reading's arithmetic, and there they run 2.4x faster, while a feature row keeps a cosine
    of 0.99998 or more to float32's and five-fold cross-validation gives the same log-loss and
    wrong signs (0.251 and 1.9 % against 0.250 and 1.9 %; bench/judge.py times both paths).
    Elsewhere they stay float32, since emulated bfloat16 is slower. A whole model in bfloat16
    was slower than float32 (its other operations), and int8 activations lose too much of what
    the head reads: dynamic int8 Linears read 1.8x faster, but a head refitted on their
    features had log-loss 0.365 against 0.262 and 4.6 % wrong signs against 2.0 % (5-fold
    cross-validation over train and dev).
    A Llama-family model (SmolLM2 among them) is read through its layers packed
    (engines/packed.py: q/k/v and gate/up one product each, bfloat16 weights in oneDNN's
    blocked layout), not transformers' forward: the same features (a cosine of 0.99998 or more;
    the same to 1e-4 in float32) 1.3x faster. Other models take transformers' forward with the
    same bfloat16 products.
    The chat template's fixed head (SmolLM2's default system prompt, ~20 tokens) is the same in
    every exchange, so its key/value cache is computed once and only the rest is read.
    Exchanges are read one at a time: no padding, so a reading never depends on its batch. (A
    first fit reads the corpus in several such readers, one per process: judge/probe_workers.py.)"""

    def __init__(self, model_dir: Path | str, products: torch.dtype | None = None,
                 packed: bool = True):
        """`products`: the dtype of the layers' matrix products (default: bfloat16 where the CPU
        has native bfloat16 arithmetic, else float32). `packed`: read through packed layers where
        the model is of the Llama family (else, or when False, through transformers' forward)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.dtype = torch.float32
        self.products = products or (torch.bfloat16 if bf16_supported() else torch.float32)
        full = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype)
        full.eval().requires_grad_(False)
        depth = full.config.num_hidden_layers
        self.last_at = self.mean_at = self.prompt_at = read_layers(depth)
        self.layers = self.last_at + self.mean_at + self.prompt_at
        self.width = len(self.layers) * full.config.hidden_size
        self.packed: PackedModel | None = None
        self.model = None
        if packed and supported(full) is None:
            self.packed = PackedModel(full, str(self.products).removeprefix("torch."), max(self.layers))
        else:
            self.model = full.model          # the decoder without the LM head
            self.model.layers = self.model.layers[:max(self.layers)]
            if self.products != self.dtype:
                products_in(self.model.layers, self.products)
        self._head_ids, self._head_kv = self._template_head()
        self._alone_ids, self._alone_kv = self._alone_prefix()
        self._prompt_ids = self._prompt_suffix()

    @property
    def precision(self) -> str:
        """What the features were computed in (part of a head's key: a head is fitted on one)."""
        return str(self.dtype) if self.products == self.dtype else \
            f"{self.dtype}, {self.products} products"

    @property
    def tag(self) -> str:
        """The precision in a file name: `float32`, or `float32-bfloat16` with bfloat16 products."""
        return "-".join(str(t).removeprefix("torch.") for t in dict.fromkeys((self.dtype, self.products)))

    def _render(self, messages: list[dict], prompt: bool = False) -> list[int]:
        """Token ids of `messages` in chat form; `prompt`: with the assistant's generation
        prompt after them."""
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
        if isinstance(ids, Mapping):     # a BatchEncoding (return_dict, transformers 5's default) or a dict
            ids = ids["input_ids"]
        return list(ids)

    @torch.inference_mode()
    def _keys_values(self, ids: list[int], past=None) -> list:
        """Each layer's keys and values of `ids` read after `past` (past's included)."""
        if self.packed is not None:
            return self.packed.read(ids, past)[1]
        from transformers.cache_utils import DynamicLayer
        assert self.model is not None
        cache = self._cache_of(past or [])
        self.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
        # Cache.layers is typed for any model's layers; a DynamicCache() built without a config only holds these
        layers = cast(list[DynamicLayer], cache.layers[:len(self.model.layers)])
        return [(layer.keys, layer.values) for layer in layers]

    def _template_head(self):
        """The tokens every rendered exchange starts with, and their keys and values per layer."""
        a = self._render([{"role": "user", "content": "a"}])
        b = self._render([{"role": "assistant", "content": "b"}])
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return (a[:n], self._keys_values(a[:n])) if n else ([], [])

    def _alone_prefix(self):
        """The tokens of the reply-alone reading (`alone`) before the reply's turn (the neutral
        exchange), and their keys and values: the same in every such reading, so it reads only
        the reply's turn and the generation prompt, the tokens it reads in context too."""
        ids, whole = self._render(alone("a")[:-1]), self._render(alone("a"))
        head = len(self._head_ids)
        if not head or len(ids) <= head or ids[:head] != self._head_ids or whole[:len(ids)] != ids:
            return [], []
        return ids, self._keys_values(ids[head:], self._head_kv)

    def _prompt_suffix(self) -> list[int] | None:
        """The generation prompt's tokens where the template appends the same ones to every
        exchange (ChatML: `<|im_start|>assistant` and a newline), so one render serves both;
        else None."""
        suffixes = []
        for m in ([{"role": "user", "content": "a"}],
                  [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c d"}]):
            plain, ids = self._render(m), self._render(m, prompt=True)
            suffixes.append(ids[len(plain):] if ids[:len(plain)] == plain else None)
        return suffixes[0] if suffixes[0] and suffixes[0] == suffixes[1] else None

    @staticmethod
    def _cache_of(kv: list):
        """A fresh cache holding stored keys and values: a reading appends to it by
        concatenation, so the stored ones are never changed and readings may run at once."""
        from transformers import DynamicCache
        cache = DynamicCache()
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)
        return cache

    def _ids(self, messages: list[dict]) -> tuple[list[int], int, int, list | None]:
        """The exchange's token ids, generation prompt included, after the longest stored start
        it begins with (the reply-alone reading's, or the template's head), cut from the left to
        fit MAX_TOKENS; how many of them the reply takes; how many the generation prompt takes
        (0 for a template whose prompt does not extend the exchange); and the stored keys and
        values they follow (None: read from the first token, the start was cut off)."""
        plain = self._render(messages)
        ids = plain + self._prompt_ids if self._prompt_ids is not None else \
            self._render(messages, prompt=True)
        prompt = len(ids) - len(plain) if ids[:len(plain)] == plain else 0
        if not prompt:
            ids = plain
        reply = len(plain) - len(self._render(messages[:-1]))
        rest, past = ids[-MAX_TOKENS:], None
        for start, kv in ((self._alone_ids, self._alone_kv), (self._head_ids, self._head_kv)):
            if start and ids[:len(start)] == start:
                rest, past = ids[len(start):][-(MAX_TOKENS - len(start)):], kv
                break
        return rest, max(1, min(reply, len(rest) - prompt)), prompt, past

    @torch.inference_mode()
    def _hidden(self, ids: list[int], past: list | None, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        """The hidden states [len(ids), hidden] after each layer read, `ids` following the stored
        keys and values `past` (`positions` and `mask`: several sequences at once, packed layers
        only; PackedModel.read). The deepest is taken after the model's final norm: that is how
        transformers reports a cut model's last hidden state, and what heads were fitted on."""
        if self.packed is not None:
            deepest = max(self.layers)
            hidden, _ = self.packed.read(ids, past, set(self.layers), positions, mask)
            hidden[deepest] = rms_norm(hidden[deepest], self.packed.norm, self.packed.eps)
            return hidden
        assert self.model is not None
        kw = {"cache": self._cache_of(past), "use_cache": True} if past else {}
        states = self.model(input_ids=torch.tensor([ids]), output_hidden_states=True, **kw).hidden_states
        return {layer: states[layer][0] for layer in set(self.layers)}

    def read_one(self, messages: list[dict]) -> torch.Tensor:
        """One exchange's feature row: the reply's last token, the reply's mean and the
        generation prompt's last token, each at every layer read, concatenated."""
        ids, n, prompt, past = self._ids(messages)
        return self._row(self._hidden(ids, past), n, prompt)

    def _row(self, hidden: dict[int, torch.Tensor], n: int, prompt: int) -> torch.Tensor:
        """The feature row of one reading's hidden states (`n` the reply's tokens, `prompt` the
        generation prompt's, at the end)."""
        end = len(hidden[self.layers[0]]) - prompt            # one past the reply's last token
        parts = [hidden[layer][end - 1] for layer in self.last_at]
        parts += [hidden[layer][end - n:end].mean(0) for layer in self.mean_at]
        parts += [hidden[layer][-1] for layer in self.prompt_at]
        return torch.cat(parts)

    def read_both(self, messages: list[dict], reply: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the reply in context (`messages`, ending with it) and alone (`alone`), as
        read_one gives them. Through packed layers both are read in one pass: the two token runs
        side by side after the reply-alone start, which begins with the template's head, each
        seeing only its own start and itself (a mask and their own positions), so a judgment
        pays a reading's fixed costs once. Elsewhere, one reading each."""
        lone = alone(reply)
        ids_c, n_c, prompt_c, past_c = self._ids(messages)
        ids_a, n_a, prompt_a, past_a = self._ids(lone)
        if self.packed is None or past_c is not self._head_kv or past_a is not self._alone_kv:
            return (self._row(self._hidden(ids_c, past_c), n_c, prompt_c),
                    self._row(self._hidden(ids_a, past_a), n_a, prompt_a))
        head, start, lc, la = len(self._head_ids), len(self._alone_ids), len(ids_c), len(ids_a)
        positions = torch.cat([torch.arange(head, head + lc), torch.arange(start, start + la)])
        mask = torch.zeros(lc + la, start + lc + la, dtype=torch.bool)
        mask[:lc, :head] = True
        mask[:lc, start:start + lc] = torch.ones(lc, lc, dtype=torch.bool).tril()
        mask[lc:, :start] = True
        mask[lc:, start + lc:] = torch.ones(la, la, dtype=torch.bool).tril()
        hidden = self._hidden(ids_c + ids_a, self._alone_kv, positions, mask)
        return (self._row({k: v[:lc] for k, v in hidden.items()}, n_c, prompt_c),
                self._row({k: v[lc:] for k, v in hidden.items()}, n_a, prompt_a))

    def features(self, exchanges: list[list[dict]], cancel: threading.Event | None = None,
                 progress=None) -> torch.Tensor:
        """One row per exchange; `progress(done, total)` is told every few percent."""
        rows, total = [], len(exchanges)
        for i, messages in enumerate(exchanges):
            if cancel is not None and cancel.is_set():
                raise ProbeError("stopped before the probe's features were read")
            rows.append(self.read_one(messages))
            if progress and (i + 1 == total or (i + 1) % max(1, total // 20) == 0):
                progress(i + 1, total)
        return torch.stack(rows) if rows else torch.zeros((0, 0))


# ------------------------------------------------------------------------------------------ head

@dataclass
class HeadMeta:
    format: int
    model_hash: str
    corpus: str               # fingerprint of the split files it was fitted on
    layers: list[int]         # reply's last-token layers, reply-mean layers, prompt layers
    dtype: str                # what the base model read in (Reader.precision)
    l2: float
    threshold: float          # a correction vote needs at least this p(-1)
    approval_threshold: float  # an approval vote needs at least this p(+1)
    dev: dict                 # the dev split's numbers at those thresholds
    train_lines: int
    fit_s: float
    created_at: float
    rule: str = ""            # THRESHOLD_RULE when it was fitted
    views: list[str] = field(default_factory=lambda: ["context"])   # the readings it averages (VIEWS)


class Head:
    """Standardise, then a linear map to logits over (-1, 0, +1)."""

    def __init__(self, mean, std, weight, bias, meta: HeadMeta):
        self.mean, self.std, self.weight, self.bias, self.meta = mean, std, weight, bias, meta

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return probs_of([x], self.mean, self.std, self.weight, self.bias)

    def probs_of(self, views: list[torch.Tensor]) -> torch.Tensor:
        """The probabilities a judgment votes on: the mean of each view's (VIEWS, rows aligned)."""
        return probs_of(views, self.mean, self.std, self.weight, self.bias)

    def save(self, folder: Path) -> None:
        """Written to a temp folder, then renamed into place: never half a head."""
        from safetensors.torch import save_file
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file({"mean": self.mean, "std": self.std, "weight": self.weight, "bias": self.bias},
                  str(tmp / "head.safetensors"))
        (tmp / "meta.json").write_text(json.dumps(asdict(self.meta), indent=2) + "\n")
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def load(cls, folder: Path) -> "Head":
        from safetensors.torch import load_file
        try:
            t = load_file(str(folder / "head.safetensors"))
            meta = HeadMeta(**json.loads((folder / "meta.json").read_text()))
            head = cls(t["mean"], t["std"], t["weight"], t["bias"], meta)
            n = head.weight.shape[1]
            if head.weight.shape[0] != 3 or head.mean.shape != (n,) or head.std.shape != (n,):
                raise ValueError(f"tensor shapes {tuple(head.weight.shape)} do not fit")
        except Exception as e:   # missing, truncated, or from another format: one clear error
            raise ProbeError(f"probe head in {folder} is unreadable ({e})") from e
        return head


def probs_of(views: list[torch.Tensor], mean, std, weight, bias) -> torch.Tensor:
    """A head's p(-1), p(0), p(+1) (standardise, then a linear map), averaged over `views`."""
    return torch.stack([torch.softmax(((x - mean) / std) @ weight.T + bias, dim=-1)
                        for x in views]).mean(0)


def decide(probs: torch.Tensor, threshold: float, approval: float) -> list[int]:
    """The vote per row: -1 when p(-1) reaches `threshold`, +1 when p(+1) reaches `approval`,
    else 0; never the less likely of the two signs (a tie goes to the correction)."""
    out = []
    for p in probs.tolist():
        out.append(-1 if p[0] >= threshold and p[0] >= p[2]
                   else 1 if p[2] >= approval and p[2] > p[0] else 0)
    return out


# ------------------------------------------------------------------------------------------ judge

def unreadable(text: str) -> str | None:
    """Why a next-state text cannot be read as a reply, or None when it can."""
    if not text.strip():
        return "the reply has no text (empty, or only non-text parts)"
    if "\x00" in text:
        return "the reply is binary data"
    odd = sum(unicodedata.category(c) in ("Cc", "Cs", "Co") and c not in "\n\r\t" or c == "\ufffd"
              for c in text[:4000])
    if odd > max(4, len(text[:4000]) // 20):
        return "the reply is mostly control characters (binary data?)"
    return None


class ProbeJudge:
    """Votes with the probe on user replies, with the rules' structured reading on tool results."""

    def __init__(self, head: Head, reader: Reader, threads: int | None = None, run=None,
                 lend_wait_s: float = LEND_WAIT_S):
        """`threads`: torch threads of each reading on a thread of its own. `run`: where a
        judgment runs instead (a callable taking a function, returning a concurrent future:
        the embedded engine's `between_passes`, whose worker lends its threads); one judgment
        at a time, so a request that arrives meanwhile waits for one judgment at most. A judgment
        the worker has not started within `lend_wait_s` (it is in a long prefill) is read on a
        thread of its own, on one torch thread, instead, and the worker skips it."""
        self.head, self.reader, self.threads, self.run = head, reader, threads, run
        self.lend_wait_s = lend_wait_s
        self._one_at_a_time: asyncio.Lock | None = None

    def read(self, question: str, answer: str, replies: list[str]) -> list[tuple[int, str]]:
        """(vote, reason) per reply, each read through the base model in the head's views."""
        m = self.head.meta
        if ALONE in m.views:
            rows = [self.reader.read_both(exchange(question, answer, r), r) for r in replies]
            views = [torch.stack([c for c, _ in rows]), torch.stack([a for _, a in rows])]
        else:
            views = [self.reader.features([exchange(question, answer, r) for r in replies])]
        probs = self.head.probs_of(views)
        votes = decide(probs, m.threshold, m.approval_threshold)
        return [(v, "probe p(-1)={:.2f} p(0)={:.2f} p(+1)={:.2f} thresholds {:.2f}/{:.2f}".format(
                 *p, m.threshold, m.approval_threshold)) for v, p in zip(votes, probs.tolist())]

    def judge_sync(self, inp: JudgeInput, threads: int | None = None) -> Judgment:
        """`threads`: this thread's torch threads for the reading (default: the judge's)."""
        n = threads or self.threads
        if n:
            torch.set_num_threads(n)      # this thread's own setting
        question = last_question(inp.context)
        results: list[tuple[int, str, str | None]] = []
        to_read: list[str] = []
        for m in inp.next_state:
            text = content_text(m.get("content"))
            if m.get("role") == "tool":
                vote, why = tool_vote(text)
                results.append((vote, f"tool: {why}", None))
            elif m.get("role") == "user":
                unread = unreadable(text)
                if unread:
                    results.append((0, f"probe: {unread}", None))
                else:
                    to_read.append(text)
        if to_read:
            for text, (vote, reason) in zip(to_read, self.read(question, inp.response, to_read)):
                results.append((vote, reason, rules_hint(text) if vote == -1 else None))
        return combine(results, "probe")

    async def judge(self, inp: JudgeInput) -> Judgment:
        if self.run is None:
            return await asyncio.to_thread(self.judge_sync, inp)
        if self._one_at_a_time is None:
            self._one_at_a_time = asyncio.Lock()
        async with self._one_at_a_time:
            state, lock = ["queued"], threading.Lock()

            def lent() -> Judgment | None:
                with lock:
                    if state[0] == "abandoned":
                        return None
                    state[0] = "running"
                return self.judge_sync(inp)
            done = asyncio.wrap_future(self.run(lent))
            try:
                judged = await asyncio.wait_for(asyncio.shield(done), self.lend_wait_s)
                assert judged is not None
                return judged
            except asyncio.TimeoutError:
                with lock:
                    if state[0] == "queued":
                        state[0] = "abandoned"
                if state[0] == "running":
                    judged = await done
                    assert judged is not None       # only a job skipped as abandoned has none
                    return judged
        return await asyncio.to_thread(self.judge_sync, inp, 1)
