"""Optimizers whose param groups hold what the Recorder reads in other forms than torch's own
(an lr of None), recorded without touching the loop's own step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.runs.reader import read_run_dir


def test_an_optimizer_that_keeps_no_lr_is_recorded(tmp_path):
    """transformers' Adafactor in its documented relative-step mode keeps `lr=None` in its
    param group and computes the lr from its step count: reading it raised a TypeError inside
    the loop's own optimizer.step(), killing the training. It is recorded as unknown (NaN, as a
    skipped step's), and a clean pair passes."""
    adafactor = pytest.importorskip("transformers.optimization").Adafactor

    def relative(out, k):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        opt = adafactor(model.parameters(), lr=None, relative_step=True, warmup_init=True)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g)
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for rows in torch.arange(48).split(16 // k):
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
                if (rows[-1] + 1) % 16 == 0:  # the window's last micro-batch
                    opt.step()
                    rec.update()
                    opt.zero_grad()
        return read_run_dir(out)

    base = relative(tmp_path / "b", 1)
    assert np.isnan(base.lr).all() and base.updates == 3
    relative(tmp_path / "m", 2)
    assert api.compare(tmp_path / "b", tmp_path / "m").verdict == "pass"


@pytest.mark.parametrize(("optimizer", "identical"), [("rprop", True), ("sgd", False)])
def test_a_loss_scale_an_optimizer_ignores_says_the_weights_are_identical(
    tmp_path, optimizer, identical
):
    """Rprop steps by the gradient's sign: micro-batch losses not divided by K leave its weights
    bit-identical. Still `loss-scale` (the gradient is wrong, as a clip or another optimizer
    would show), now saying the weights are the same; under SGD they are not, and it says none."""
    from .recorded_loop import classifier, train

    def record(out, k: int, scale: float) -> None:
        model, x, y = classifier(16 * 4)
        make = torch.optim.Rprop if optimizer == "rprop" else torch.optim.SGD
        opt = make(model.parameters(), lr=0.01)
        train(out, model, opt, x, y, k, batch=16, scale=scale)

    record(tmp_path / "k1", 1, 1.0)
    record(tmp_path / "k4", 4, 4.0)  # each micro-batch's loss times K / K: not divided
    (first, *_) = api.compare(tmp_path / "k1", tmp_path / "k4", reference="none").diagnosis
    assert first.code == "loss-scale", first.message
    assert ("the weights are identical at every update" in first.message) is identical


def _two_optimizers(out, k, bug=None):
    """A sparse embedding under SparseAdam (given to the Recorder) and a dense head under an
    Adam of its own, not given to it: the usual recipe for sparse embeddings."""
    torch.manual_seed(0)
    emb = nn.Embedding(50, 8, sparse=True)
    head = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    model = nn.ModuleDict({"emb": emb, "head": head})
    sparse = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
    dense = torch.optim.Adam(head.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 50, (16 * 4, 5), generator=g)
    y = ids[:, 0] % 3
    with gradalign.Recorder(out, model, sparse, accum_steps=k) as rec:
        for rows in torch.arange(len(ids)).split(16 // k):
            loss = nn.functional.cross_entropy(head(emb(ids[rows]).mean(1)), y[rows])
            (loss / k).backward()
            rec.micro(loss, batch=(ids[rows], y[rows]))
            if bug == "second-steps-every-micro":
                dense.step()
                dense.zero_grad()
            if (rows[-1] + 1) % 16 == 0:  # the window's last micro-batch
                sparse.step()
                if bug != "second-steps-every-micro":
                    dense.step()
                rec.update()
                sparse.zero_grad()
                dense.zero_grad()
    return out


def test_a_second_optimizer_stepping_inside_the_window_is_named_as_one(tmp_path):
    """A second optimizer, which the Recorder does not count, stepping at every micro-step: the
    weights change inside the window, and the message said "no optimizer step happened", that
    something other than the optimizer wrote to the weights."""
    base = _two_optimizers(tmp_path / "b", 1)
    assert api.compare(base, _two_optimizers(tmp_path / "m", 4), reference="none").verdict == "pass"
    c = api.compare(base, _two_optimizers(tmp_path / "bug", 4, "second-steps-every-micro"))
    found = c.diagnosis[0]
    assert found.code == "weights-changed-in-window", [(d.code, d.message) for d in c.diagnosis]
    assert "a second optimizer" in found.message and "no optimizer step" not in found.message
    assert "step every optimizer once per update" in found.fix
