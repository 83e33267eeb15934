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
