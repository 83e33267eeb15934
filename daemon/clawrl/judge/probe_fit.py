"""Fitting the probe judge's head, and keeping it on disk: where it lives (beside the converted
models, keyed by the base model's hash), when it is fitted (missing, unreadable, or fitted on
another corpus or reader), and the cache of the corpus's features that makes a refit take seconds.

The fit is plain: standardise, a multinomial logistic regression by L-BFGS (on the rows' span,
where there are fewer lines than features) with its L2 strength chosen on the dev split's
log-loss, and the abstention thresholds chosen on dev (probe.THRESHOLD_RULE: the fewest wrong signs
that still find RECALL_FLOORS of the corrections and approvals). The test split is never read
here. What a head computes, and the judge that uses it, are judge/probe.py's.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..models import model_hash
from . import corpus, probe_workers
from .corpus import metrics
from .probe import (CONTEXT, FORMAT, L2_GRID, MAX_WRONG_SIGN, MIN_PRECISION, RECALL_FLOORS,
                    THRESHOLD_RULE, VIEWS, WRONG_SIGN_COST, Head, HeadMeta, ProbeError, Reader, alone,
                    decide, exchange, probs_of)

log = logging.getLogger("clawrl.probe")


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


def _row_space(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """With fewer rows than features, an L2-penalised linear head's weights lie in the span of the
    rows (any part outside it changes no score and only adds to the penalty). So the fit can run on
    the rows' coordinates in an orthonormal basis `q` of that span (z = p q^T, `p` square), where
    every product is smaller, and the weights are c q^T: the same problem, the same penalty, and
    L-BFGS from zero takes the same steps. None when there are as many rows as features."""
    if z.shape[0] >= z.shape[1]:
        return None
    q, r = torch.linalg.qr(z.T)
    return q, r.T.contiguous()


def _score(pred: list[int], gold: list[int]) -> dict:
    m = metrics(gold, pred)
    return {k: m[k] for k in ("correction_precision", "correction_recall", "approval_precision",
                              "approval_recall", "wrong_sign_rate")}


def _choose_thresholds(probs: torch.Tensor, gold: list[int]) -> tuple[float, float, dict]:
    """The thresholds for a correction vote and for an approval vote (each class is calibrated
    its own way), by probe.THRESHOLD_RULE, among the pairs that keep MIN_PRECISION on dev's
    corrections: the fewest wrong signs among those that find RECALL_FLOORS of dev's corrections
    and approvals; where none does at MAX_WRONG_SIGN or less, the most right votes less
    WRONG_SIGN_COST times the wrong ones; where no pair keeps the precision, the best precision."""
    grid = [t / 100 for t in range(34, 100, 2)]
    scored = [(tn, tp, _score(decide(probs, tn, tp), gold)) for tn in grid for tp in grid]
    n = max(1, len(gold))
    share = {lab: sum(g == lab for g in gold) / n for lab in (-1, 1)}

    def right(s: dict) -> float:
        return s["correction_recall"] * share[-1] + s["approval_recall"] * share[1]

    ok = [c for c in scored if c[2]["correction_precision"] >= MIN_PRECISION]
    if not ok:
        return max(scored, key=lambda c: (c[2]["correction_precision"], -c[0] - c[1]))
    floor_c, floor_a = RECALL_FLOORS
    found = [c for c in ok if c[2]["correction_recall"] >= floor_c and c[2]["approval_recall"] >= floor_a
             and c[2]["wrong_sign_rate"] <= MAX_WRONG_SIGN]
    if found:
        return min(found, key=lambda c: (c[2]["wrong_sign_rate"], -right(c[2]), c[0] + c[1]))
    return max(ok, key=lambda c: (right(c[2]) - WRONG_SIGN_COST * c[2]["wrong_sign_rate"], -c[0] - c[1]))


def fit_head(x_tr: torch.Tensor, train: list, x_dev: torch.Tensor, dev: list, reader_key: dict,
             model_hash: str, corpus_print: str, progress=None,
             x_dev_alone: torch.Tensor | None = None) -> Head:
    """A head from features of labelled examples (read in context): L2 strength and thresholds
    chosen on `dev`, on the probabilities a judgment votes on. With `x_dev_alone` (dev's replies
    read alone, probe.alone) the head judges by the mean of both readings (probe.VIEWS)."""
    t0 = time.time()
    views = VIEWS if x_dev_alone is not None else [CONTEXT]
    dev_views = [x_dev] if x_dev_alone is None else [x_dev, x_dev_alone]
    say = progress or (lambda msg: None)
    y_tr, gold_dev = _labels_index([e.label for e in train]), [e.label for e in dev]
    if len(set(y_tr.tolist())) < 3 or len(set(gold_dev)) < 3:
        raise ProbeError("the probe needs every label (-1, 0, +1) in both train and dev data")
    mean, std = x_tr.mean(0), x_tr.std(0).clamp(min=1e-4)
    z_tr = (x_tr - mean) / std
    best: tuple[float, float, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    basis = _row_space(z_tr)
    for l2 in L2_GRID:
        if basis is None:
            w, b = _fit(z_tr, y_tr, l2)
        else:
            c, b = _fit(basis[1], y_tr, l2)
            w = c @ basis[0].T
        probs = probs_of(dev_views, mean, std, w, b)
        loss = torch.nn.functional.nll_loss(probs.clamp(min=1e-12).log(), _labels_index(gold_dev)).item()
        say(f"L2 {l2:g}: dev log-loss {loss:.3f}")
        if best is None or loss < best[0]:
            best = (loss, l2, w, b, probs)
    assert best is not None     # L2_GRID is not empty
    _, l2, w, b, probs = best
    threshold, approval, dev_score = _choose_thresholds(probs, gold_dev)
    meta = HeadMeta(format=FORMAT, model_hash=model_hash, corpus=corpus_print,
                    **reader_key, l2=l2, threshold=threshold, approval_threshold=approval,
                    dev=dev_score, train_lines=len(train), fit_s=round(time.time() - t0, 1),
                    created_at=time.time(), rule=THRESHOLD_RULE, views=list(views))
    return Head(mean, std, w, b, meta)


def line_key(messages: list[dict]) -> bytes:
    """What a cached feature row is found by: a digest of the exchange the base model read."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).digest()[:16]


def _rows_of(path: Path, width: int) -> dict[bytes, torch.Tensor]:
    """The rows of a feature file (the cache or a worker's shard) by line key; {} when it is torn
    or holds another reading (a cache is only a cache)."""
    from safetensors.torch import load_file
    try:
        t = load_file(str(path))
        if t["x"].shape[1:] == (width,) and t["keys"].shape == (len(t["x"]), 16):
            return {bytes(k.tolist()): row for k, row in zip(t["keys"], t["x"])}
        log.warning("probe features in %s are of another reading; recomputing", path)
    except Exception as e:
        log.warning("probe features in %s unreadable (%s); recomputing", path, e)
    return {}


def corpus_features(reader: Reader, examples: list, cache: Path | None, progress=None,
                    cancel: threading.Event | None = None, nice: int = 0, workers: int = 0,
                    view=None):
    """Features of labelled examples, kept in `cache` (a safetensors file) row by row, each found
    by its exchange's digest: the base model's reading of a line never changes, so a refit takes
    seconds, and a corpus that gained or changed lines has only those read again. Many lines are
    read in `workers` processes (judge/probe_workers.py, 0: as many as suit this machine; at
    niceness `nice`), whose shards a stopped
    or killed fit leaves for the next. The cache is rewritten to hold exactly `examples`
    (tmp + rename), and the shards are then removed. `view`: what is read of a line's reply
    (default: the reply in its context; probe.alone: the reply alone)."""
    from safetensors.torch import save_file
    exchanges = [view(e.text) if view else exchange(e.question, e.answer, e.text) for e in examples]
    keys = [line_key(m) for m in exchanges]
    width = reader.width
    with tempfile.TemporaryDirectory(prefix="clawrl-probe-") as scratch:
        prefix = cache if cache is not None else Path(scratch) / "features"
        known = _rows_of(cache, width) if cache is not None and cache.exists() else {}
        for shard in probe_workers.shard_files(prefix):
            known.update(_rows_of(shard, width))
        todo = [i for i, k in enumerate(keys) if k not in known]
        if todo:
            if progress:
                progress(f"reading {len(todo)} labelled lines through the base model"
                         + (f" ({len(examples) - len(todo)} more were read before)" if known else ""))
            told = (lambda done, total: progress(f"  read {done}/{total} lines")) if progress else None
            workers = probe_workers.workers_for(len(todo), workers)
            if workers > 1:
                probe_workers.read_in_workers(reader, [exchanges[i] for i in todo], [keys[i] for i in todo],
                                              prefix, workers, nice, told, cancel)
                for shard in probe_workers.shard_files(prefix):
                    known.update(_rows_of(shard, width))
            else:
                fresh = reader.features([exchanges[i] for i in todo], cancel=cancel, progress=told)
                known.update({keys[i]: row for i, row in zip(todo, fresh)})
        x = torch.stack([known[k] for k in keys]) if keys else torch.zeros((0, width))
        shards = probe_workers.shard_files(prefix)
        if cache is not None and (todo or shards or len(known) != len(set(keys))):
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
            save_file({"x": x.contiguous(), "keys": torch.tensor([list(k) for k in keys], dtype=torch.uint8)
                       .reshape(-1, 16)}, str(tmp))
            os.replace(tmp, cache)
        for shard in shards:                 # all in the cache now (or scratch)
            shard.unlink(missing_ok=True)
    return x


# ----------------------------------------------------------------------------------- where/when

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
                cancel: threading.Event | None = None, nice: int = 0,
                workers: int = 0) -> tuple[Head, Reader]:
    """The head for this base model and corpus (`data`, default the built-in one): loaded, or
    fitted and saved when it is missing, unreadable, or fitted on another corpus. `cancel` stops
    a fit between lines (ProbeError); nothing half-written is left, and what was read is kept for
    the next fit. `nice` and `workers`: the niceness and number of the processes that read the
    corpus (corpus_features)."""
    data = Path(data or corpus.CORPUS_DIR)
    digest, corpus_print = model_hash(model_dir), corpus.fingerprint(data)
    folder = head_folder(models_dir, digest)
    if folder.parent.exists():
        _clean_leftovers(folder.parent)
    if folder.exists() and not rebuild:
        try:
            head = Head.load(folder)
            reader = reader or Reader(model_dir)
            m = head.meta
            if (m.corpus, m.format, m.layers, m.dtype, m.rule, m.views) == \
                    (corpus_print, FORMAT, list(reader.layers), reader.precision, THRESHOLD_RULE, VIEWS):
                return head, reader
            log.info("probe head in %s was fitted on another corpus, reader, threshold rule or "
                     "views; fitting a new one", folder)
        except ProbeError as e:
            log.warning("%s; fitting a new one", e)
    reader = reader or Reader(model_dir)
    train, dev = corpus.load("train", data), corpus.load("dev", data)
    reading = hashlib.sha256(repr(reader.layers).encode()).hexdigest()[:8]   # which layers
    # Kept per split and reading, across corpus versions: rows are found by their line.
    cache = folder.parent / f"features-{FORMAT}-{reader.tag}-{reading}"
    x_tr = corpus_features(reader, train, cache.with_suffix(".train.safetensors"), progress, cancel, nice,
                           workers)
    x_dev = corpus_features(reader, dev, cache.with_suffix(".dev.safetensors"), progress, cancel, nice, workers)
    x_alone = corpus_features(reader, dev, cache.with_suffix(".dev-alone.safetensors"), progress, cancel,
                              nice, workers, view=alone)
    head = fit_head(x_tr, train, x_dev, dev, {"layers": list(reader.layers), "dtype": reader.precision},
                    digest, corpus_print, progress, x_dev_alone=x_alone)
    head.save(folder)
    for stale in folder.parent.glob("features-*"):    # caches of readings no longer fitted on
        if not stale.name.startswith(cache.name + "."):
            stale.unlink(missing_ok=True)
    log.info("probe head fitted in %.0f s, thresholds %.2f (correction) and %.2f (approval), "
             "saved to %s", head.meta.fit_s, head.meta.threshold, head.meta.approval_threshold,
             folder)
    return head, reader


def head_for(cfg, rebuild: bool = False, progress=None,
             cancel: threading.Event | None = None, nice: int = 0) -> tuple[Head, Reader]:
    """The head for a recipe: its base model (converted if needed) and `judge.probe_data`. The
    base model as provisioned, not its long-context variant (models.model_dir): the probe reads
    exchanges of at most probe.MAX_TOKENS, well inside the native window, so its head stays the
    one fitted for these weights whatever window the recipe serves."""
    from ..models import provision
    model_dir = provision(cfg.model.source, cfg.models_dir, cfg.home / "cache")
    return ensure_head(model_dir, cfg.models_dir, cfg.judge.probe_data or None, rebuild=rebuild,
                       progress=progress, cancel=cancel, nice=nice, workers=cfg.judge.probe_workers)
