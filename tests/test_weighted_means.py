"""A class-weighted loss summed and divided by the window's total weight trains as the batch's
weighted mean; recorded as each micro-batch's own weighted mean without its weight (`items=`),
the window's plain mean of those is not the batch's, so the losses alone differ (near 1, by a
ratio that varies with the update). `loss-averaging` says to give the weights; with them the
run passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES = 32, 4, 4


def loop(out, k: int, items: bool = True):
    model, x, y = classifier(UPDATES * BATCH)
    weight = torch.tensor([0.2, 1.0, 3.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            window = weight[y[u * BATCH : (u + 1) * BATCH]].sum()
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                total = nn.functional.cross_entropy(
                    model(x[rows]), y[rows], weight=weight, reduction="sum"
                )
                (total / window).backward()
                own = weight[y[rows]].sum()
                kwargs = {"items": float(own)} if items else {}
                rec.micro((total / own).detach(), batch=(x[rows], y[rows]), **kwargs)
            opt.step()
            opt.zero_grad()
            rec.update()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("weighted")
    return {
        "base": loop(root / "base", 1),
        "merged": loop(root / "merged", K),
        "unweighted": loop(root / "unweighted", K, items=False),
    }


def test_weighted_means_given_their_weights_pass(runs):
    assert compare(runs["base"], runs["merged"]).verdict == "pass"


def test_weighted_means_without_their_weights_are_told_to_give_them(runs):
    c = compare(runs["base"], runs["unweighted"])
    status = {check.name: check.status for check in c.checks}
    assert (status["losses"], status["weights"], status["gradients"]) == ("fail", "pass", "pass")
    first = c.diagnosis[0]
    assert first.code == "loss-averaging", [(d.code, d.message) for d in c.diagnosis]
    assert "weighted otherwise" in first.message and "items=w" in first.fix


@pytest.mark.parametrize("items", [False, True])
def test_window_means_of_losses_near_the_largest_float_stay_finite(tmp_path, items):
    """Four micro losses of 1e308 summed to inf, so the window's mean of them failed "finite
    losses" against a baseline whose loss was the same 1e308; the mean is finite now, plain
    and weighted, and an infinite micro loss still makes its window's infinite."""
    import dataclasses

    import numpy as np

    run = runs_by_k(tmp_path, items)
    huge = dataclasses.replace(run, micro_loss=np.full_like(run.micro_loss, 1e308))
    assert np.all(huge.window_losses() == 1e308)
    one_inf = huge.micro_loss.copy()
    one_inf[5] = np.inf
    losses = dataclasses.replace(run, micro_loss=one_inf).window_losses()
    assert np.isinf(losses[1]) and np.all(losses[[0, 2, 3]] == 1e308)


def runs_by_k(root, items: bool):
    return loop(root / "merged", K, items=items)
