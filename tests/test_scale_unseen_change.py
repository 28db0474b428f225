"""A loss not divided by K beside a second change of its gradient that the losses barely show
(label smoothing dropped: near a uniform prediction it scales the gradient and hardly moves the
loss): the gradient stands about 4.4 times the baseline's at update 0, beyond 5% of K, and was
named `cross-sample-loss`, its message calling the losses' K a matter of the log. It is
`loss-scale` now, with the losses recorded before the scale or as backpropagated; a
gradient nearer 1 than K is not."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import train

BATCH, K = 32, 4
smoothed = functools.partial(nn.functional.cross_entropy, label_smoothing=0.1)


def loop(out, k: int, loss_fn=smoothed, scale: float = 1.0, record_scaled: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    with torch.no_grad():
        model[2].weight.mul_(0.01)  # a near-uniform prediction, as at a classifier's start
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6 * BATCH, 20, generator=g)
    y = x[:, :3].argmax(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {"scale": scale, "record_scaled": record_scaled}
    train(out, model, opt, x, y, k, batch=BATCH, loss_fn=loss_fn, **kwargs)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("unseen")
    plain = nn.functional.cross_entropy
    return {
        "base": loop(root / "base", 1),
        "clean": loop(root / "clean", K),
        "bug": loop(root / "bug", K, plain, scale=K),
        "bug_recorded": loop(root / "bug_recorded", K, plain, scale=K, record_scaled=True),
        "small": loop(root / "small", K, plain, scale=1.6),
    }


@pytest.mark.parametrize("bug", ["bug", "bug_recorded"])
def test_a_scale_beside_a_change_the_losses_do_not_show_is_loss_scale(runs, bug):
    assert compare(runs["base"], runs["clean"]).verdict == "pass"
    c = compare(runs["base"], runs[bug])
    first = c.diagnosis[0]
    assert first.code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["expected_ratio"] == K
    assert abs(first.evidence["grad_ratio"] / K - 1) > 0.05  # beyond what loss-scale read before
    assert "second change" in first.message and "matter of the log" not in first.message


def test_a_gradient_nearer_one_than_k_is_not_called_a_scale_of_k(runs):
    c = compare(runs["base"], runs["small"])
    assert c.verdict == "fail"
    assert all(d.evidence.get("expected_ratio") != K for d in c.diagnosis)
