"""The labelled feedback corpus: next-state messages with the verdict they carry on the answer
before them. It owns reading and checking labelled JSONL files, the fixed train/dev/test split,
and building the split files from the writing passes (`python -m clawrl.judge.corpus`).

A line is `{"text": the next user message, "label": -1|0|1}`, optionally with `"context"` (the
messages before it, ending with the assistant's answer), `"kind"` and `"lang"`. Labels: -1 the
answer failed (a correction, complaint or redo), +1 it worked (thanks, approval, moving on with a
follow-up), 0 no evidence. The corpus itself, and how it was written, live in `recipes/feedback/`.

It also owns how a judge's readings are scored against labels (`metrics`). It does not judge
anything: the probe judge trains from it, and `judge_eval` scores judges on it.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from ..config import REPO_RECIPES
from ..errors import ClawrlError

CORPUS_DIR = REPO_RECIPES / "feedback"
PASSES_DIR = CORPUS_DIR / "passes"
SPLITS = ("train", "dev", "test")
LABELS = (-1, 0, 1)
# Shares of the hash space: 70 % train, 15 % dev (thresholds are chosen there), 15 % test.
_SPLIT_AT = (0.70, 0.85)
# A judge given a line without context sees this neutral one-question exchange.
NEUTRAL_CONTEXT = ({"role": "user", "content": "Can you help me with this?"},
                   {"role": "assistant", "content": "Sure. Here is my answer to your question."})


class CorpusError(ClawrlError):
    """A labelled feedback file is missing or malformed."""


@dataclass(frozen=True)
class Example:
    text: str                       # the next user message: what is labelled
    label: int                      # -1 failed, 0 no evidence, +1 worked
    context: tuple = field(default=NEUTRAL_CONTEXT)   # messages before it, last is the answer
    kind: str = ""
    lang: str = ""

    @property
    def answer(self) -> str:
        """The assistant's answer the message reacts to ('' when the context has none)."""
        last = self.context[-1] if self.context else {}
        return str(last.get("content") or "") if last.get("role") == "assistant" else ""

    @property
    def question(self) -> str:
        """The user message the answer answered ('' when there is none)."""
        for m in reversed(self.context[:-1]):
            if m.get("role") == "user":
                return str(m.get("content") or "")
        return ""


def normalise(text: str) -> str:
    """The form two lines are compared in: NFKC, case-folded, punctuation and spacing dropped."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def split_of(text: str) -> str:
    """train, dev or test, fixed forever by a hash of the normalised text."""
    h = int.from_bytes(hashlib.sha256(normalise(text).encode()).digest()[:8], "big") / 2 ** 64
    return "train" if h < _SPLIT_AT[0] else "dev" if h < _SPLIT_AT[1] else "test"


def _parse(obj, where: str) -> Example:
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    text, label = obj.get("text"), obj.get("label")
    if not isinstance(text, str) or not text.strip():
        raise CorpusError(f"{where}: \"text\" must be a non-empty string (the next user message)")
    if isinstance(label, bool) or label not in LABELS:
        raise CorpusError(f"{where}: \"label\" must be -1, 0 or 1, got {label!r}")
    context = obj.get("context")
    if context is None:
        context = NEUTRAL_CONTEXT
    elif (not isinstance(context, list) or not context
          or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in context)):
        raise CorpusError(f"{where}: \"context\" must be a non-empty list of messages with a "
                          "\"role\" (the conversation before the message, ending with the answer)")
    else:
        context = tuple({"role": m["role"], "content": m.get("content") or ""} for m in context)
    return Example(text=text, label=label, context=tuple(context),
                   kind=str(obj.get("kind") or ""), lang=str(obj.get("lang") or ""))


def read(path: Path | str) -> list[Example]:
    """Every line of a labelled JSONL file, checked; an error names the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"cannot read labelled data {path}: {e}") from e
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise CorpusError(f"{path}:{n}: not JSON ({e}); each line is one object like "
                              '{"text": "that is wrong", "label": -1}') from e
        out.append(_parse(obj, f"{path}:{n}"))
    if not out:
        raise CorpusError(f"{path} holds no labelled lines")
    return out


def load(split: str, folder: Path | None = None) -> list[Example]:
    """One split of a corpus folder (default: the built-in corpus)."""
    if split not in SPLITS:
        raise CorpusError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return read(Path(folder or CORPUS_DIR) / f"{split}.jsonl")


def fingerprint(folder: Path | None = None, splits: tuple[str, ...] = ("train", "dev")) -> str:
    """A hash of the split files a head is fitted on: a changed corpus means a new head."""
    h = hashlib.sha256()
    for s in splits:
        path = Path(folder or CORPUS_DIR) / f"{s}.jsonl"
        try:
            h.update(path.read_bytes())
        except OSError as e:
            raise CorpusError(f"cannot read {path}: {e}; a corpus folder needs train.jsonl and "
                              "dev.jsonl") from e
    return h.hexdigest()[:16]


def metrics(gold: list[int], pred: list[int]) -> dict:
    """The numbers `--json` prints; a precision with nothing predicted is 1.0 (nothing wrong said),
    a recall with nothing to find is 1.0."""
    def pr(label):
        said = sum(p == label for p in pred)
        right = sum(p == label == g for p, g in zip(pred, gold))
        real = sum(g == label for g in gold)
        return (right / said if said else 1.0), (right / real if real else 1.0)
    n = len(gold)
    (cp, cr), (ap, ar) = pr(-1), pr(1)
    confusion = {str(g): {str(p): sum(1 for a, b in zip(gold, pred) if a == g and b == p)
                          for p in LABELS} for g in LABELS}
    return {"correction_recall": cr, "correction_precision": cp, "approval_recall": ar,
            "approval_precision": ap,
            "wrong_sign_rate": sum(p * g == -1 for p, g in zip(pred, gold)) / n if n else 0.0,
            "abstain_rate": sum(p == 0 for p in pred) / n if n else 0.0,
            "accuracy": sum(p == g for p, g in zip(pred, gold)) / n if n else 0.0,
            "n": n, "confusion": confusion}


def _dump(e: Example) -> str:
    obj = {"text": e.text, "label": e.label, "context": list(e.context), "kind": e.kind,
           "lang": e.lang}
    return json.dumps(obj, ensure_ascii=False)


def build(passes_dir: Path = PASSES_DIR) -> dict[str, list[Example]]:
    """The passes merged: a line whose normalised text was seen before is dropped (the first pass
    in name order keeps it), then each line goes to the split its hash names."""
    seen: set[str] = set()
    splits: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for path in sorted(passes_dir.glob("*.jsonl")):
        for e in read(path):
            key = normalise(e.text)
            if key in seen or not key:
                continue
            seen.add(key)
            splits[split_of(e.text)].append(e)
    return splits


def render(examples: list[Example]) -> str:
    return "".join(_dump(e) + "\n" for e in examples)


def main() -> int:
    """Rebuild recipes/feedback/{train,dev,test}.jsonl from the passes."""
    splits = build()
    for name, examples in splits.items():
        (CORPUS_DIR / f"{name}.jsonl").write_text(render(examples), encoding="utf-8")
        counts = {lab: sum(e.label == lab for e in examples) for lab in LABELS}
        print(f"{name}: {len(examples)} lines (-1: {counts[-1]}, 0: {counts[0]}, +1: {counts[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
