"""The probe head's fit (judge/probe_fit.py) on features made for the purpose: no model is read."""
import torch

from clawrl.judge import probe_fit


def test_fitting_on_the_rows_span_gives_the_weights_of_the_full_fit():
    """With fewer lines than features the fit runs in the rows' span: the same penalised problem,
    so the same weights and the same probabilities as fitting every feature."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (60,), generator=g)
    z = torch.randn(60, 400, generator=g) + 0.4 * torch.nn.functional.one_hot(y, 3).float().repeat(1, 134)[:, :400]
    q, p = probe_fit._row_space(z)
    assert q.shape == (400, 60) and p.shape == (60, 60) and torch.allclose(p @ q.T, z, atol=1e-4)
    for l2 in (1e-2, 1.0):
        w, b = probe_fit._fit(z, y, l2)
        c, b2 = probe_fit._fit(p, y, l2)
        assert torch.allclose(c @ q.T, w, atol=2e-3), (c @ q.T - w).abs().max()
        new = torch.randn(30, 400, generator=g)
        assert torch.allclose(torch.softmax(new @ (c @ q.T).T + b2, -1), torch.softmax(new @ w.T + b, -1),
                              atol=2e-3)
    assert probe_fit._row_space(torch.randn(500, 400)) is None     # more lines than features


def test_with_dev_read_alone_the_head_is_chosen_on_the_mean_of_both_readings():
    """Given dev's replies read alone too, the L2 strength and the thresholds are chosen on the
    mean of the two readings' probabilities (what a judgment votes on), and the head says so;
    without, on the reading in context alone."""
    from clawrl.judge import probe
    from clawrl.judge.corpus import Example, metrics

    g = torch.Generator().manual_seed(1)

    def lines(n):
        y = torch.arange(n) % 3
        centre = torch.nn.functional.one_hot(y, 3).float().repeat(1, 10)
        return y, [Example(text=f"line {i}", label=int(v) - 1) for i, v in enumerate(y)], centre

    y_tr, train, c_tr = lines(90)
    y_dev, dev, c_dev = lines(60)
    x_tr = c_tr + 0.8 * torch.randn(c_tr.shape, generator=g)
    in_context = c_dev + 0.8 * torch.randn(c_dev.shape, generator=g)
    alone = 0.5 * c_dev + 0.8 * torch.randn(c_dev.shape, generator=g)     # less sure, and other rows
    key = {"layers": [1], "dtype": "float32"}
    one = probe_fit.fit_head(x_tr, train, in_context, dev, key, "m", "c")
    both = probe_fit.fit_head(x_tr, train, in_context, dev, key, "m", "c", x_dev_alone=alone)
    assert one.meta.views == [probe.CONTEXT] and both.meta.views == probe.VIEWS
    gold = [e.label for e in dev]
    for head, views in ((one, [in_context]), (both, [in_context, alone])):
        probs = head.probs_of(views)
        m = metrics(gold, probe.decide(probs, head.meta.threshold, head.meta.approval_threshold))
        assert all(abs(m[k] - v) < 1e-9 for k, v in head.meta.dev.items()), (m, head.meta.dev)
    assert both.meta.dev != one.meta.dev
