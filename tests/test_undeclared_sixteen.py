"""A loop that computes in a bfloat16 model copy beside float32 master weights, recorded without
`compute_dtype="bfloat16"`: its runs declare float32 and were judged with float32's tolerances
and references, and nothing said why a clean pair failed or a float64 rerun was refused. The
baseline's gradient at update 0 is bfloat16-exact in every value: a note says so, and so does
the refusal of a float64 reference. A float32 loop gets no such note."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign import api

BATCH, K, UPDATES = 32, 4, 3


def loop(out, k: int, master: bool = True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 8))
    masters = nn.ParameterList([nn.Parameter(p.detach().clone()) for p in model.parameters()])
    if master:
        model = model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(UPDATES * BATCH, 24, generator=g)
    y = torch.randint(0, 8, (UPDATES * BATCH,), generator=g)
    watched = masters if master else model
    opt = torch.optim.SGD(watched.parameters(), lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, watched, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                logits = model(x[rows].to(next(model.parameters()).dtype))
                loss = nn.functional.cross_entropy(logits.float(), y[rows])
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            if master:  # the 16-bit gradients onto the masters, the masters' step back
                for p, m in zip(model.parameters(), masters, strict=True):
                    m.grad = p.grad.float()
            opt.step()
            if master:
                with torch.no_grad():
                    for p, m in zip(model.parameters(), masters, strict=True):
                        p.copy_(m)
            opt.zero_grad()
            model.zero_grad()
            rec.update()
    return out


@pytest.mark.parametrize("master", [True, False])
def test_a_bfloat16_computation_declared_float32_is_noted(tmp_path, master):
    base, merged = loop(tmp_path / "b", 1, master), loop(tmp_path / "m", K, master)
    c = api.compare(base, merged, reference="none")
    noted = [n for n in c.notes if "bfloat16-exact" in n]
    assert bool(noted) == master, c.notes
    if master:
        assert 'compute_dtype="bfloat16"' in noted[0]
