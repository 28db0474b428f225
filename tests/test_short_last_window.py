"""A last window shorter than K whose micro-batches differ in size (250 samples in batches of 24,
micro-batches of 6: the last window holds 6 and 4 rows). Each micro-batch's mean weighted by its
share of the window's rows is the baseline's last batch, and passes; each divided by K (as
accelerate's `accumulate()` and Lightning do in a short last window) is first of all a loss
scaled by 2/4, `loss-scale` naming the short window, with the 6:4 reweighting beside it (it was
`token-normalization` alone, "weighted up to 58.3% wrong", the scale folded into the
reweighting); each divided by the window's own 2 micro-batches is the reweighting alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier

BATCH, K, UPDATES, TAIL = 24, 4, 4, 10  # four whole batches, then 10 rows: micro-batches 6, 4


def loop(out, k: int, divide: str = "share"):
    """`divide`: how each micro-batch's mean is scaled in the merged run: by its share of the
    window's rows (right), by K, or by the window's micro-batches."""
    model, x, y = classifier(BATCH * UPDATES + TAIL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    micro = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for start in range(0, x.shape[0], BATCH):
            end = min(start + BATCH, x.shape[0])
            cuts = list(range(start, end, micro))
            for a in cuts:
                rows = slice(a, min(a + micro, end))
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                n = rows.stop - rows.start
                weight = {"share": n / (end - start), "k": 1 / k, "window": 1 / len(cuts)}[divide]
                (loss * weight).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return loop(tmp_path_factory.mktemp("tail") / "base", 1)


def _said(c) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in c.diagnosis]


def test_each_micro_batch_weighted_by_its_share_passes(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", K))
    assert c.verdict == "pass", _said(c)


def test_each_divided_by_k_is_the_short_windows_scale_beside_a_reweighting(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", K, divide="k"))
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    assert codes[:2] == ["loss-scale", "token-normalization"], _said(c)
    first, second = c.diagnosis[0], c.diagnosis[1]
    assert first.evidence["update"] == UPDATES and first.evidence["expected_ratio"] == 2 / K
    assert "2 micro-step(s)" in first.message and "K=4" in first.message, first.message
    assert "its own window's micro-batches" in first.fix
    assert "6, 4 samples" in second.message and "25.0% wrong" in second.message, second.message


def test_each_divided_by_the_windows_micro_batches_is_the_reweighting_alone(base, tmp_path):
    c = compare(base, loop(tmp_path / "m", K, divide="window"))
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    assert codes[:1] == ["token-normalization"] and "loss-scale" not in codes, _said(c)
    said = c.diagnosis[0].message
    assert "6, 4 samples" in said and "25.0% wrong" in said, said
