"""The probe judge: a small head on the frozen base model's own hidden states reads a user's reply
as approval, correction or neither.

The base model reads the exchange in chat form (the question, the tail of the answer, the user's
reply); the last token's hidden state at a few layers and the reply's mean hidden state at two
more are the feature vector; a multinomial logistic head, fitted on the feedback corpus's train
split, gives p(-1), p(0), p(+1). A vote is cast only when its probability reaches the threshold chosen on the
dev split, so unsure readings answer 0 and never train. Tool results keep the rules judge's
structured reading (JSON fields, exit codes), and on -1 the user's own words are the hint.

It owns the features, the head (fit, save, load) and the `ProbeJudge`. Where the head file lives
and when it is built is `ensure_head`'s business; the judging loop only calls it. The base model is
a private copy cut after the last layer read (no LM head), so the probe never touches the engine.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import feedback_corpus as corpus
from .chat_format import content_text
from .errors import ClawrlError
from .judge import JudgeInput, Judgment, combine, rules_hint, tool_vote

log = logging.getLogger("clawrl.probe")

FORMAT = 2
# What is read, as fractions of the model's depth (measured on the dev split with SmolLM2-135M:
# these two views together beat either alone, any single layer, and a 2-layer MLP head):
LAST_TOKEN_AT = (1 / 6, 1 / 3, 1 / 2)   # the hidden state of the exchange's last token
REPLY_MEAN_AT = (1 / 2, 2 / 3)          # the mean over the reply's tokens
QUESTION_CHARS, ANSWER_CHARS, REPLY_CHARS = 160, 240, 600
MAX_TOKENS = 192          # the rendered exchange, cut from the left (the reply sits at its end)
L2_GRID = (1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)
MIN_PRECISION = 0.90      # the dev split's correction precision the threshold must keep
MAX_WRONG_SIGN = 0.03     # and the share of dev lines read with the wrong sign


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


def _depths(fractions, depth: int) -> tuple[int, ...]:
    return tuple(max(1, round(f * depth)) for f in fractions)


class Reader:
    """The frozen base model, cut after the deepest layer read, turning exchanges into features."""

    def __init__(self, model_dir: Path | str):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        from .models import bf16_supported
        # bfloat16 halves the time of a judgment where the CPU computes it natively; the head is
        # fitted on features read in the same dtype (the feature cache and head record it).
        self.dtype = torch.bfloat16 if bf16_supported() else torch.float32
        full = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=self.dtype)
        depth = full.config.num_hidden_layers
        self.last_at, self.mean_at = _depths(LAST_TOKEN_AT, depth), _depths(REPLY_MEAN_AT, depth)
        self.layers = self.last_at + self.mean_at
        self.model = full.model          # the decoder without the LM head
        self.model.layers = self.model.layers[:max(self.layers)]
        self.model.eval().requires_grad_(False)
        self.pad = self.tokenizer.pad_token_id
        if self.pad is None:
            self.pad = self.tokenizer.eos_token_id or 0

    def _render(self, messages: list[dict]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def _ids(self, messages: list[dict]) -> tuple[list[int], int]:
        """The exchange's token ids (cut from the left) and how many of them the reply takes."""
        ids = self._render(messages)
        reply = len(ids) - len(self._render(messages[:-1]))
        ids = ids[-MAX_TOKENS:]
        return ids, max(1, min(reply, len(ids)))

    @torch.inference_mode()
    def features(self, exchanges: list[list[dict]], batch: int = 16,
                 cancel: threading.Event | None = None) -> torch.Tensor:
        """One row per exchange: the last token's hidden state at LAST_TOKEN_AT and the reply's
        mean at REPLY_MEAN_AT, concatenated. Left padding with explicit positions, so a batch
        reads as the exchanges would one by one."""
        rows = []
        for i in range(0, len(exchanges), batch):
            if cancel is not None and cancel.is_set():
                raise ProbeError("stopped before the probe's features were read")
            seqs = [self._ids(m) for m in exchanges[i:i + batch]]
            width = max(len(s) for s, _ in seqs)
            ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            reply = torch.zeros((len(seqs), width, 1))
            for j, (s, n) in enumerate(seqs):
                ids[j, width - len(s):] = torch.tensor(s)
                mask[j, width - len(s):] = 1
                reply[j, width - n:] = 1.0 / n
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            hidden = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                output_hidden_states=True).hidden_states
            parts = [hidden[layer][:, -1, :] for layer in self.last_at]
            parts += [(hidden[layer] * reply).sum(1) for layer in self.mean_at]
            rows.append(torch.cat(parts, dim=-1).float())
        return torch.cat(rows) if rows else torch.zeros((0, 0))


# ------------------------------------------------------------------------------------------ head

@dataclass
class HeadMeta:
    format: int
    model_hash: str
    corpus: str               # fingerprint of the split files it was fitted on
    layers: list[int]         # last-token layers, then reply-mean layers
    dtype: str                # what the base model read in (bfloat16 or float32)
    l2: float
    threshold: float          # a vote needs at least this probability
    dev: dict                 # the dev split's numbers at that threshold
    train_lines: int
    fit_s: float
    created_at: float


class Head:
    """Standardise, then a linear map to logits over (-1, 0, +1)."""

    def __init__(self, mean, std, weight, bias, meta: HeadMeta):
        self.mean, self.std, self.weight, self.bias, self.meta = mean, std, weight, bias, meta

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(((x - self.mean) / self.std) @ self.weight.T + self.bias, dim=-1)

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


def _labels_index(labels: list[int]) -> torch.Tensor:
    return torch.tensor([lab + 1 for lab in labels])      # -1, 0, +1 -> 0, 1, 2


def _fit(x: torch.Tensor, y: torch.Tensor, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression with an L2 penalty, full batch, by L-BFGS; classes are
    weighted by inverse frequency so a rare class is not ignored."""
    torch.manual_seed(0)
    w = torch.zeros((3, x.shape[1]), requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    counts = torch.bincount(y, minlength=3).float().clamp(min=1)
    weights = counts.sum() / (3 * counts)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=300, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y, weight=weights) \
            + l2 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def decide(probs: torch.Tensor, threshold: float) -> list[int]:
    """The vote per row: -1 or +1 when its probability reaches the threshold, else 0."""
    out = []
    for p in probs.tolist():
        out.append(-1 if p[0] >= threshold and p[0] >= p[2]
                   else 1 if p[2] >= threshold else 0)
    return out


def _score(pred: list[int], gold: list[int]) -> dict:
    def pr(label):
        said = sum(p == label for p in pred)
        right = sum(p == label == g for p, g in zip(pred, gold))
        real = sum(g == label for g in gold)
        return right / said if said else 1.0, right / real if real else 1.0
    (cp, cr), (ap, ar) = pr(-1), pr(1)
    wrong = sum(p * g == -1 for p, g in zip(pred, gold)) / len(gold)
    return {"correction_precision": cp, "correction_recall": cr, "approval_precision": ap,
            "approval_recall": ar, "wrong_sign_rate": wrong}


def _choose_threshold(probs: torch.Tensor, gold: list[int]) -> tuple[float, dict]:
    """The threshold with the most recall (corrections and approvals) at which dev keeps
    MIN_PRECISION on corrections and at most MAX_WRONG_SIGN wrong signs; where none does, the
    one with the fewest wrong signs."""
    scored = [(t / 100, _score(decide(probs, t / 100), gold)) for t in range(34, 100)]
    ok = [(t, s) for t, s in scored if s["correction_precision"] >= MIN_PRECISION
          and s["wrong_sign_rate"] <= MAX_WRONG_SIGN]
    if ok:
        return max(ok, key=lambda ts: (ts[1]["correction_recall"] + ts[1]["approval_recall"],
                                       -ts[0]))
    return min(scored, key=lambda ts: (ts[1]["wrong_sign_rate"], -ts[0]))


def fit_head(x_tr: torch.Tensor, train: list, x_dev: torch.Tensor, dev: list, reader_key: dict,
             model_hash: str, corpus_print: str, progress=None) -> Head:
    """A head from features of labelled examples: L2 strength and threshold chosen on `dev`."""
    t0 = time.time()
    say = progress or (lambda msg: None)
    y_tr, gold_dev = _labels_index([e.label for e in train]), [e.label for e in dev]
    if len(set(y_tr.tolist())) < 3 or len(set(gold_dev)) < 3:
        raise ProbeError("the probe needs every label (-1, 0, +1) in both train and dev data")
    mean, std = x_tr.mean(0), x_tr.std(0).clamp(min=1e-4)
    z_tr, z_dev = (x_tr - mean) / std, (x_dev - mean) / std
    best = None
    for l2 in L2_GRID:
        w, b = _fit(z_tr, y_tr, l2)
        loss = torch.nn.functional.cross_entropy(z_dev @ w.T + b, _labels_index(gold_dev)).item()
        say(f"L2 {l2:g}: dev log-loss {loss:.3f}")
        if best is None or loss < best[0]:
            best = (loss, l2, w, b)
    _, l2, w, b = best
    probs = torch.softmax(z_dev @ w.T + b, dim=-1)
    threshold, dev_score = _choose_threshold(probs, gold_dev)
    meta = HeadMeta(format=FORMAT, model_hash=model_hash, corpus=corpus_print,
                    **reader_key, l2=l2, threshold=threshold,
                    dev=dev_score, train_lines=len(train), fit_s=round(time.time() - t0, 1),
                    created_at=time.time())
    return Head(mean, std, w, b, meta)


def corpus_features(reader: Reader, examples: list, cache: Path | None, progress=None,
                    cancel: threading.Event | None = None):
    """Features of labelled examples, kept in `cache` (a safetensors file) once computed: the
    base model's reading of a fixed corpus never changes, so a refit takes seconds."""
    from safetensors.torch import load_file, save_file
    if cache is not None and cache.exists():
        try:
            x = load_file(str(cache))["x"]
            if x.shape[0] == len(examples):
                return x
        except Exception as e:   # a torn cache is only a cache
            log.warning("probe feature cache %s unreadable (%s); recomputing", cache, e)
    if progress:
        progress(f"reading {len(examples)} labelled lines through the base model")
    x = reader.features([exchange(e.question, e.answer, e.text) for e in examples], cancel=cancel)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
        save_file({"x": x.contiguous()}, str(tmp))
        os.replace(tmp, cache)
    return x


# ----------------------------------------------------------------------------------- where/when

def model_hash(model_dir: Path) -> str:
    """sha256 over the model's weight files and config: the head belongs to exactly these."""
    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


def head_folder(models_dir: Path, digest: str) -> Path:
    """Beside the converted models (which homes may share), keyed by the model's hash."""
    return models_dir / "probes" / digest / "head"


def _clean_leftovers(folder: Path) -> None:
    """Temp files and folders of a fit that was killed midway (each write is tmp + rename)."""
    for junk in folder.glob(".*.tmp-*"):
        shutil.rmtree(junk, ignore_errors=True) if junk.is_dir() else junk.unlink(missing_ok=True)
    for junk in folder.glob(".head.old-*"):
        shutil.rmtree(junk, ignore_errors=True)


def ensure_head(model_dir: Path, models_dir: Path, data: Path | None = None,
                reader: Reader | None = None, rebuild: bool = False, progress=None,
                cancel: threading.Event | None = None) -> tuple[Head, Reader]:
    """The head for this base model and corpus (`data`, default the built-in one): loaded, or
    fitted and saved when it is missing, unreadable, or fitted on another corpus. `cancel` stops
    a fit between batches (ProbeError); nothing half-written is left."""
    data = Path(data or corpus.CORPUS_DIR)
    digest, corpus_print = model_hash(model_dir), corpus.fingerprint(data)
    folder = head_folder(models_dir, digest)
    if folder.parent.exists():
        _clean_leftovers(folder.parent)
    if folder.exists() and not rebuild:
        try:
            head = Head.load(folder)
            reader = reader or Reader(model_dir)
            if (head.meta.corpus, head.meta.format, head.meta.layers, head.meta.dtype) == \
                    (corpus_print, FORMAT, list(reader.layers), str(reader.dtype)):
                return head, reader
            log.info("probe head in %s was fitted on another corpus or reader; fitting a new "
                     "one", folder)
        except ProbeError as e:
            log.warning("%s; fitting a new one", e)
    reader = reader or Reader(model_dir)
    train, dev = corpus.load("train", data), corpus.load("dev", data)
    dtype = str(reader.dtype).removeprefix("torch.")
    cache = folder.parent / f"features-{corpus_print}-{FORMAT}-{dtype}"
    x_tr = corpus_features(reader, train, cache.with_suffix(".train.safetensors"), progress, cancel)
    x_dev = corpus_features(reader, dev, cache.with_suffix(".dev.safetensors"), progress, cancel)
    head = fit_head(x_tr, train, x_dev, dev, {"layers": list(reader.layers), "dtype": str(reader.dtype)},
                    digest, corpus_print, progress)
    head.save(folder)
    for stale in folder.parent.glob("features-*"):    # caches of corpora no longer fitted on
        if not stale.name.startswith(cache.name + "."):
            stale.unlink(missing_ok=True)
    log.info("probe head fitted in %.0f s, threshold %.2f, saved to %s", head.meta.fit_s,
             head.meta.threshold, folder)
    return head, reader


# ------------------------------------------------------------------------------------------ judge

def unreadable(text: str) -> str | None:
    """Why a next-state text cannot be read as a reply, or None when it can."""
    if not text.strip():
        return "the reply is empty"
    if "\x00" in text:
        return "the reply is binary data"
    odd = sum(unicodedata.category(c) in ("Cc", "Cs", "Co") and c not in "\n\r\t" or c == "\ufffd"
              for c in text[:4000])
    if odd > max(4, len(text[:4000]) // 20):
        return "the reply is mostly control characters (binary data?)"
    return None


class ProbeJudge:
    """Votes with the probe on user replies, with the rules' structured reading on tool results."""

    def __init__(self, head: Head, reader: Reader):
        self.head, self.reader = head, reader

    def read(self, question: str, answer: str, replies: list[str]) -> list[tuple[int, str]]:
        """(vote, reason) per reply, in one batch through the base model."""
        probs = self.head.probs(self.reader.features([exchange(question, answer, r)
                                                      for r in replies]))
        votes = decide(probs, self.head.meta.threshold)
        return [(v, "probe p(-1)={:.2f} p(0)={:.2f} p(+1)={:.2f} threshold {:.2f}".format(
                 *p, self.head.meta.threshold)) for v, p in zip(votes, probs.tolist())]

    def judge_sync(self, inp: JudgeInput) -> Judgment:
        question = next((content_text(m.get("content")) for m in reversed(inp.context)
                         if m.get("role") == "user"), "")
        results: list[tuple[int, str, str | None]] = []
        to_read: list[str] = []
        for m in inp.next_state:
            text = content_text(m.get("content"))
            if m.get("role") == "tool":
                vote, why = tool_vote(text)
                results.append((vote, f"tool: {why}", None))
            elif m.get("role") == "user":
                why = unreadable(text)
                if why:
                    results.append((0, f"probe: {why}", None))
                else:
                    to_read.append(text)
        if to_read:
            for text, (vote, reason) in zip(to_read, self.read(question, inp.response, to_read)):
                results.append((vote, reason, rules_hint(text) if vote == -1 else None))
        return combine(results, "probe")

    async def judge(self, inp: JudgeInput) -> Judgment:
        return await asyncio.to_thread(self.judge_sync, inp)

