"""A Lightning Fabric loop recorded by the plain Recorder, given what `fabric.setup` returns: its
tensors are named as the model's own (Fabric's `_forward_module.` prefix, and DDP's `module.`
inside it under `strategy="ddp"`, were kept, so a Fabric run could not be judged against the
same loop recorded otherwise: "runs of different models"), and a `zero_grad()` of Fabric's
module inside the window is counted."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .frameworks import require

require("lightning")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

B, UPDATES = 16, 4


def fabric_loop(out, k: int, *, wrap: bool = True, bug: str | None = None):
    """Fabric on the CPU, `no_backward_sync` for the window's first K-1 micro-batches;
    `wrap=False` hands the Recorder the model and optimizer Fabric was given."""
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    fmodel, foptimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B * UPDATES, 6, generator=g)
    y = torch.randint(0, 3, (B * UPDATES,), generator=g)
    n = B // k
    given = (fmodel, foptimizer) if wrap else (model, optimizer)
    with gradalign.Recorder(out, *given, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * B + j * n, u * B + (j + 1) * n)
                with fabric.no_backward_sync(fmodel, enabled=j < k - 1):
                    loss = nn.functional.cross_entropy(fmodel(x[rows]), y[rows])
                    fabric.backward(loss / k)
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
                if bug == "module-zero-grad" and j < k - 1:
                    fmodel.zero_grad()
            foptimizer.step()
            rec.update()
            foptimizer.zero_grad()
    return read_run_dir(out)


def test_a_fabric_run_names_its_tensors_as_the_model_does_and_is_judged(tmp_path):
    base = fabric_loop(tmp_path / "k1", 1)
    assert [t.name for t in base.tensors if t.kind == "param"][:2] == ["0.weight", "0.bias"]
    merged = fabric_loop(tmp_path / "k4", 4, wrap=False)
    assert compare(base, merged).verdict == "pass"
    cleared = compare(base, fabric_loop(tmp_path / "bug", 4, bug="module-zero-grad"))
    assert [d.code for d in cleared.diagnosis][:1] == ["zero-grad-in-window"]
    assert cleared.diagnosis[0].evidence["zero_grad_calls_inside_window"] == 3
