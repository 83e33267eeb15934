"""The feedback corpus as data: big and varied enough, labelled as documented, and split for good
(the split files are exactly what the passes build, and no text sits in two splits)."""
from __future__ import annotations

import collections
import json

import pytest

from clawrl.judge import corpus
from clawrl.judge.corpus import CorpusError


@pytest.fixture(scope="module")
def lines():
    return {s: corpus.load(s) for s in corpus.SPLITS}


def test_size_labels_and_languages(lines):
    every = [e for s in lines.values() for e in s]
    assert len(every) >= 800
    labels = collections.Counter(e.label for e in every)
    assert all(labels[lab] >= 0.15 * len(every) for lab in (-1, 0, 1)), labels
    langs = collections.Counter(e.lang for e in every)
    assert sum(n for lang, n in langs.items() if lang != "en") >= 0.10 * len(every)
    assert all(langs[lang] >= 20 for lang in ("zh", "es", "de", "fr")), langs
    # Each split holds every label, so dev can pick a threshold and test can measure each.
    for name, split in lines.items():
        assert {e.label for e in split} == {-1, 0, 1}, name


def test_situations_are_covered(lines):
    kinds = collections.Counter(e.kind.split("/")[0] for s in lines.values() for e in s)
    for kind in ("correction", "approval", "followup-builds", "new-request", "smalltalk",
                 "ambiguous", "sarcastic", "future-directed", "mixed"):
        assert kinds[kind] >= 10, (kind, kinds)
    assert all(e.context[-1]["role"] == "assistant" for s in lines.values() for e in s)


def test_splits_are_what_the_passes_build_and_never_overlap(lines):
    built = corpus.build()
    for name in corpus.SPLITS:
        assert (corpus.CORPUS_DIR / f"{name}.jsonl").read_text() == corpus.render(built[name]), \
            f"{name}.jsonl is stale: run python -m clawrl.judge.corpus"
        assert all(corpus.split_of(e.text) == name for e in lines[name])
    keys = [corpus.normalise(e.text) for s in lines.values() for e in s]
    assert len(keys) == len(set(keys))


def test_split_is_a_fixed_function_of_the_text():
    assert corpus.split_of("Thanks!") == corpus.split_of("  thanks ")
    shares = collections.Counter(corpus.split_of(f"line {i}") for i in range(3000))
    assert 0.65 < shares["train"] / 3000 < 0.75 and 0.12 < shares["test"] / 3000 < 0.18


@pytest.mark.parametrize("line, problem", [
    ('{"text": "", "label": 1}', "non-empty string"),
    ('{"text": "ok", "label": 2}', "-1, 0 or 1"),
    ('{"text": "ok", "label": true}', "-1, 0 or 1"),
    ('{"text": "ok", "label": 1, "context": "hi"}', "list of messages"),
    ('["text"]', "JSON object"),
    ("not json", "not JSON"),
])
def test_a_bad_line_is_named(tmp_path, line, problem):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"text": "fine", "label": 1}\n' + line + "\n")
    with pytest.raises(CorpusError, match=problem) as e:
        corpus.read(f)
    assert "mine.jsonl:2" in str(e.value)


def test_a_line_without_context_gets_the_neutral_exchange(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"text": "wrong again", "label": -1}) + "\n\n")
    (e,) = corpus.read(f)
    assert e.context == corpus.NEUTRAL_CONTEXT and e.answer and e.question
    with pytest.raises(CorpusError, match="no labelled lines"):
        (tmp_path / "empty.jsonl").write_text("\n")
        corpus.read(tmp_path / "empty.jsonl")
