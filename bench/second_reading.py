"""A blind second reading of the feedback corpus: do careful readers give its lines the labels
their writers gave them? It bounds what any judge can be asked to reach on the corpus: where two
careful readings disagree, neither is wrong for sure.

    prepare DIR    the splits' lines, shuffled, without labels, in --readers chunk files, with the
                   readers' brief (BRIEF.md). Each reader gets one chunk and the brief, and writes
                   labels<i>.jsonl ({"id", "label", "note"?} per line). The key from a reader's id
                   to its line (.key.json) stays in DIR: readers are told to open nothing else.
    score DIR|FILE...
                   the readers' labels against the corpus's, per split: agreement, the confusion,
                   the lines read with the other sign, and each disagreement. DIR: a prepared
                   folder with the readers' labels; FILE: a result of an earlier score (the
                   reading is kept in it, by a digest of each line's normalised text, so it can
                   be scored again against a corpus that has grown since). Several are merged:
                   `prepare --skip FILE` leaves out the lines an earlier reading read, so a
                   grown corpus needs only its new lines read.
    relabel FILE   a split with the reading's labels in place of the writers' (a labelled JSONL
                   file), so that `clawrl judge eval --data` scores any judge against the reading.

    .venv/bin/python bench/second_reading.py prepare $TMPDIR/reading --readers 8
    # ... each reader labels its chunk ...
    .venv/bin/python bench/second_reading.py score $TMPDIR/reading --out bench/results/second-reading.json
    .venv/bin/python bench/second_reading.py relabel bench/results/second-reading.json --split test \
        --out $TMPDIR/test-read.jsonl
    .venv/bin/clawrl judge eval --backend probe --data $TMPDIR/test-read.jsonl
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from clawrl.judge import corpus

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402

BRIEF = """# Reading task: what does the user's next message say about the assistant's answer?

Each line of your chunk file is a JSON object: `id`, `context` (the conversation so far, ending
with the assistant's answer) and `text` (the user's next message). For every line, read the
context and the text yourself and decide the verdict the text carries on the assistant's LAST
answer:

{meanings}
Rules:
- Judge every line by reading it. Do not write a program, keyword list or heuristic that
  assigns labels; you may use a script only to split the file into pieces you read and to
  write your answers out.
- Open no other file: your chunk file and this brief are all you need.
- Write one JSON object per line to your output file: `{{"id": "...", "label": -1|0|1}}`,
  one for every id in your chunk, in any order. Add `"note": "..."` (a few words) only where
  you found the line genuinely ambiguous.
"""


def label_meanings() -> str:
    """What each label means, as the corpus README gives it (its `label` item's sub-list): the
    readers get the same words as the corpus's users."""
    lines = (corpus.CORPUS_DIR / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("- `label` (required):") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("  "))
    return "".join(line[2:] + "\n" for line in lines[start:end])


def digest(text: str) -> str:
    """A line's key across corpus rebuilds: its normalised text (what fixes its split too)."""
    return hashlib.sha256(corpus.normalise(text).encode()).hexdigest()[:16]


def prepare(folder: Path, splits: list[str], readers: int, seed: int, data: Path | None = None,
            skip: dict | None = None) -> dict:
    """`skip`: an earlier reading; the lines it read are left out."""
    rows = [(s, e) for s in splits for e in corpus.load(s, data) if digest(e.text) not in (skip or {})]
    random.Random(seed).shuffle(rows)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "BRIEF.md").write_text(BRIEF.format(meanings=label_meanings()), encoding="utf-8")
    key = {}
    for c in range(readers):
        with open(folder / f"chunk{c}.jsonl", "w", encoding="utf-8") as f:
            for j, (split, e) in enumerate(rows[c::readers]):
                rid = f"c{c}-{j:03d}"
                key[rid] = [split, digest(e.text)]
                f.write(json.dumps({"id": rid, "context": list(e.context), "text": e.text},
                                   ensure_ascii=False) + "\n")
    (folder / ".key.json").write_text(json.dumps(key))
    return {"lines": len(rows), "readers": readers}


def collect(folder: Path) -> tuple[dict[str, int], dict[str, str]]:
    """The readers' labels and notes by line digest; every chunk must be read in full."""
    key = json.loads((folder / ".key.json").read_text())
    labels, notes = {}, {}
    for path in sorted(folder.glob("labels*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if obj.get("id") not in key or obj.get("label") not in corpus.LABELS:
                raise SystemExit(f"{path}:{n}: an unknown id or a label other than -1, 0, 1: {line}")
            d = key[obj["id"]][1]
            labels[d] = obj["label"]
            if obj.get("note"):
                notes[d] = str(obj["note"])
    missing = len(key) - sum(1 for split, d in key.values() if d in labels)
    if missing:
        raise SystemExit(f"{missing} of {len(key)} lines have no reader's label yet")
    return labels, notes


def score(labels: dict[str, int], notes: dict[str, str], splits: list[str], data: Path | None = None) -> dict:
    out = {}
    for split in splits:
        examples = corpus.load(split, data)
        keyed = [(e, digest(e.text)) for e in examples]
        lines = [(e, labels[d], d) for e, d in keyed if d in labels]
        n = len(lines)
        pairs = Counter((e.label, r) for e, r, _ in lines)
        other_sign = sum(e.label * r == -1 for e, r, _ in lines)
        out[split] = {
            "n": n, "unread": len(examples) - n,
            "agreement": sum(e.label == r for e, r, _ in lines) / n if n else 0.0,
            "other_sign": other_sign, "other_sign_rate": other_sign / n if n else 0.0,
            "confusion": {str(g): {str(r): pairs[(g, r)] for r in corpus.LABELS} for g in corpus.LABELS},
            "disagreements": [{"text": e.text, "label": e.label, "reading": r,
                               **({"note": notes[d]} if d in notes else {})}
                              for e, r, d in lines if e.label != r]}
    return out


def relabel(labels: dict[str, int], split: str, data: Path | None = None) -> str:
    """The split's lines that were read, each with the reading's label."""
    return corpus.render([replace(e, label=labels[digest(e.text)]) for e in corpus.load(split, data)
                          if digest(e.text) in labels])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the readers' chunks and brief")
    p.add_argument("folder")
    p.add_argument("--readers", type=int, default=8)
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--skip", help="an earlier result of score: the lines it read are left out")
    s = sub.add_parser("score", help="score a reading against the corpus's labels")
    s.add_argument("sources", nargs="+", help="prepared folders with the readers' labels, or earlier "
                   "results (merged: a line read in several takes the last)")
    s.add_argument("--out")
    r = sub.add_parser("relabel", help="write a split with the reading's labels")
    r.add_argument("source", help="a result of score")
    r.add_argument("--split", default="test", choices=corpus.SPLITS)
    r.add_argument("--out", required=True, help="the labelled JSONL file to write")
    for q in (p, s):
        q.add_argument("--splits", nargs="+", default=["dev", "test"], choices=corpus.SPLITS)
    for q in (p, s, r):
        q.add_argument("--data", help="a corpus folder (default: the built-in one)")
    args = ap.parse_args(argv)
    data = Path(args.data) if args.data else None
    if args.cmd == "prepare":
        skip = json.loads(Path(args.skip).read_text())["reading"] if args.skip else None
        print(json.dumps(prepare(Path(args.folder), args.splits, args.readers, args.seed, data, skip)))
        return 0
    if args.cmd == "relabel":
        Path(args.out).write_text(relabel(json.loads(Path(args.source).read_text())["reading"], args.split,
                                          data), encoding="utf-8")
        return 0
    labels, notes = {}, {}
    for source in map(Path, args.sources):
        if source.is_dir():
            more, more_notes = collect(source)
        else:
            earlier = json.loads(source.read_text())
            more, more_notes = earlier["reading"], earlier.get("notes", {})
        labels.update(more)
        notes.update(more_notes)
    emit({"command": " ".join(["bench/second_reading.py", *(argv or sys.argv[1:])]),
          "splits": score(labels, notes, args.splits, data), "reading": labels, "notes": notes}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
