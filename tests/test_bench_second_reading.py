"""bench/second_reading.py: the readers' chunks carry no label and cover every line once, and a
reading is scored against the corpus's labels (agreement, the other sign, the disagreements),
again from its saved result. Fast: a small corpus folder, readers played by the test."""
from __future__ import annotations

import json

import pytest

from clawrl.judge import corpus
from conftest import bench_module

second_reading = bench_module("second_reading")

LINES = {"dev": [("that's wrong, it's 12", -1), ("thanks!", 1), ("what's the weather", 0),
                 ("too long, shorter please", -1)],
         "test": [("perfect, ty", 1), ("no, I meant the bus", -1), ("brb", 0)]}


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, lines in LINES.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}) + "\n"
                                                        for t, lab in lines))
    return folder


def chunks(folder):
    return [json.loads(line) for path in sorted(folder.glob("chunk*.jsonl")) for line in path.open()]


def test_chunks_hide_the_labels_and_cover_every_line_once(data, tmp_path):
    out = tmp_path / "reading"
    second_reading.main(["prepare", str(out), "--readers", "3", "--data", str(data)])
    rows = chunks(out)
    assert sorted(r["text"] for r in rows) == sorted(t for lines in LINES.values() for t, _ in lines)
    assert all(set(r) == {"id", "context", "text"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert "-1" in (out / "BRIEF.md").read_text()


def test_a_reading_is_scored_against_the_labels_and_again_from_its_result(data, tmp_path, capsys):
    out = tmp_path / "reading"
    second_reading.main(["prepare", str(out), "--readers", "2", "--data", str(data)])
    truth = {t: lab for lines in LINES.values() for t, lab in lines}
    read = {"thanks!": -1, "brb": 1}                    # one line read with the other sign, one 0 read +1
    for c in range(2):
        with open(out / f"labels{c}.jsonl", "w") as f:
            for r in chunks(out):
                if r["id"].startswith(f"c{c}-"):
                    f.write(json.dumps({"id": r["id"], "label": read.get(r["text"], truth[r["text"]]),
                                        **({"note": "unsure"} if r["text"] == "brb" else {})}) + "\n")
    result = tmp_path / "result.json"
    second_reading.main(["score", str(out), "--data", str(data), "--out", str(result)])
    splits = json.loads(result.read_text())["splits"]
    assert splits["dev"]["n"] == 4 and splits["dev"]["unread"] == 0 and splits["dev"]["agreement"] == 0.75
    assert splits["dev"]["other_sign"] == 1 and splits["dev"]["confusion"]["1"]["-1"] == 1
    assert splits["test"]["other_sign"] == 0 and splits["test"]["agreement"] == pytest.approx(2 / 3)
    assert splits["test"]["disagreements"] == [{"text": "brb", "label": 0, "reading": 1, "note": "unsure"}]
    capsys.readouterr()
    second_reading.main(["score", str(result), "--data", str(data)])
    assert json.loads(capsys.readouterr().out)["splits"] == splits
    # the split with the reading's labels, for `clawrl judge eval --data`
    relabelled = tmp_path / "dev-read.jsonl"
    second_reading.main(["relabel", str(result), "--split", "dev", "--data", str(data), "--out", str(relabelled)])
    assert [(e.text, e.label) for e in corpus.read(relabelled)] == \
        [(t, read.get(t, lab)) for t, lab in LINES["dev"]]


def test_an_unfinished_reading_is_refused(data, tmp_path):
    out = tmp_path / "reading"
    second_reading.main(["prepare", str(out), "--readers", "2", "--data", str(data)])
    first = chunks(out)[0]
    (out / "labels0.jsonl").write_text(json.dumps({"id": first["id"], "label": 0}) + "\n")
    with pytest.raises(SystemExit, match="have no reader's label"):
        second_reading.main(["score", str(out), "--data", str(data)])


def test_a_grown_corpus_has_only_its_new_lines_read(data, tmp_path):
    first, result = tmp_path / "first", tmp_path / "first.json"
    second_reading.main(["prepare", str(first), "--readers", "1", "--data", str(data)])
    for r in chunks(first):
        with open(first / "labels0.jsonl", "a") as f:
            f.write(json.dumps({"id": r["id"], "label": 0}) + "\n")
    second_reading.main(["score", str(first), "--data", str(data), "--out", str(result)])
    with open(data / "dev.jsonl", "a") as f:                  # the corpus grows by a line
        f.write(json.dumps({"text": "ok that fixed it", "label": 1}) + "\n")
    assert json.loads(result.read_text())["splits"]["dev"]["unread"] == 0
    second_reading.main(["score", str(result), "--data", str(data), "--out", str(result)])
    assert json.loads(result.read_text())["splits"]["dev"]["unread"] == 1
    more = tmp_path / "more"
    second_reading.main(["prepare", str(more), "--readers", "1", "--data", str(data), "--skip", str(result)])
    (row,) = chunks(more)
    assert row["text"] == "ok that fixed it"
    (more / "labels0.jsonl").write_text(json.dumps({"id": row["id"], "label": 1}) + "\n")
    merged = tmp_path / "merged.json"
    second_reading.main(["score", str(result), str(more), "--data", str(data), "--out", str(merged)])
    dev = json.loads(merged.read_text())["splits"]["dev"]
    assert dev["unread"] == 0 and dev["n"] == 5
