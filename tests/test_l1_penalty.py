"""An L1 penalty λ·‖w‖₁ added to every micro loss is `penalty-not-scaled`, its λ read off the
gradient error (λ·(K−1) times the weights' signs), as an L2 penalty's is off the weights. A cold
probe's loop (Adam, micro-batches of 8, 8, 8 and 6 rows each weighted by its share, penalties
added once per window) was `unexplained` with even micro-batches and `token-normalization` with
uneven ones, claiming the samples were weighted equally, with a fix that would not cure it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

B, N, K, LAMBDA = 30, 6, 4, 1e-3
SIZES = {30: [8, 8, 8, 6], 32: [8, 8, 8, 8]}


def train(out, k: int, batch: int, dtype=torch.float32, bug: str | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 40), nn.Softplus(), nn.Linear(40, 1)).to(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    g = torch.Generator().manual_seed(4)
    x_all = torch.randn(batch * N, 10, generator=g)
    y_all = x_all[:, :3].sum(1, keepdim=True) ** 2 / 3
    x_all, y_all = x_all.to(dtype), y_all.to(dtype)
    sizes = [batch] if k == 1 else SIZES[batch]
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(N):
            start = u * batch
            for j, n in enumerate(sizes):
                x, y = x_all[start : start + n], y_all[start : start + n]
                start += n
                loss = F.smooth_l1_loss(model(x), y)
                share = 1 / k if bug == "mean-over-k" else n / batch
                objective = loss * share
                if bug == "l1-every-micro" or j == len(sizes) - 1:
                    objective = objective + LAMBDA * sum(p.abs().sum() for p in model.parameters())
                objective.backward()
                rec.micro(loss, batch=(x, y))
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.fixture(scope="module", params=[30, 32], ids=["uneven", "even"])
def runs(request, tmp_path_factory):
    root, batch = tmp_path_factory.mktemp("l1"), request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        made = {"batch": batch, "ref": train(root / "ref", 1, batch, torch.float64)}
        made["base"] = train(root / "base", 1, batch)
        for name in ("clean", "l1-every-micro", "mean-over-k"):
            made[name] = train(root / name, K, batch, bug=None if name == "clean" else name)
    finally:
        torch.set_num_threads(threads)
    return made


@pytest.mark.parametrize("reference", [True, False], ids=["reference", "no-reference"])
def test_an_l1_penalty_in_every_micro_loss_is_named_with_its_lambda(runs, reference):
    ref = runs["ref"] if reference else None
    assert compare(runs["base"], runs["clean"], reference=ref).verdict == "pass"
    result = compare(runs["base"], runs["l1-every-micro"], reference=ref)
    assert result.verdict == "fail"
    lead = result.diagnosis[0]
    assert lead.code == "penalty-not-scaled", [d.code for d in result.diagnosis]
    assert "L1 penalty" in lead.message and "weights' signs" in lead.message
    assert lead.evidence["implied_l1"] == pytest.approx(LAMBDA, rel=0.02)


def test_a_mean_over_k_is_still_no_penalty(runs):
    result = compare(runs["base"], runs["mean-over-k"], reference=runs["ref"])
    if runs["batch"] == 32:  # even micro-batches: a mean over K is each one's share
        assert result.verdict == "pass"
    else:
        assert result.diagnosis[0].code == "token-normalization", result.diagnosis
