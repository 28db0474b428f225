"""An optimizer whose step() evaluates its closure several times (LBFGS, max_iter=3), the
closure holding the window's micro-steps: each evaluation records its micro-steps, so the
baseline's window holds 3 of them and the weights change between them. It fails
`window-bookkeeping`; the note on the weights written between micro-steps named only a forward
that writes them ("e.g. an Embedding with max_norm") and now names such an optimizer too."""

from __future__ import annotations

import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

B, UPDATES = 16, 3


def _run(out, k: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B * UPDATES, 6, generator=g), torch.randn(B * UPDATES, 1, generator=g)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3, history_size=5)
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):

            def closure(u: int = u) -> torch.Tensor:
                opt.zero_grad()
                total = torch.zeros(())
                for j in range(k):
                    rows = slice(u * B + j * n, u * B + (j + 1) * n)
                    loss = nn.functional.mse_loss(model(x[rows]), y[rows])
                    (loss / k).backward()
                    rec.micro(loss.detach(), batch=(x[rows], y[rows]))
                    total += loss.detach() / k
                return total

            opt.step(closure)
            rec.update()
    return read_run_dir(out)


def test_an_optimizer_that_runs_its_closure_thrice_is_named_in_the_note(tmp_path):
    c = compare(_run(tmp_path / "base", 1), _run(tmp_path / "merged", 2))
    assert c.verdict == "fail" and c.diagnosis[0].code == "window-bookkeeping", c.diagnosis
    assert any("LBFGS" in note for note in c.notes), c.notes
