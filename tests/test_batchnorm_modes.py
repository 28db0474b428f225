"""BatchNorm in eval mode in one run and in train mode in the other (a frozen backbone that one
loop forgot to put back in eval mode after model.train()): `batchnorm`, saying the runs put it
in different modes; it was told as each micro-batch normalized with its own statistics, which
is what both runs in train mode are told."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import train

BATCH, K = 32, 4


def loop(out, k: int, frozen_statistics: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.Tanh(), nn.Linear(32, 3))
    if frozen_statistics:
        model[1].eval()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4 * BATCH, 20, generator=g)
    y = x[:, :3].argmax(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(out, model, opt, x, y, k, batch=BATCH)
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bn")
    return {
        "eval": loop(root / "eval", 1, True),
        "train": loop(root / "train", 1, False),
        "merged_eval": loop(root / "merged_eval", K, True),
        "merged_train": loop(root / "merged_train", K, False),
    }


def test_batchnorm_in_eval_mode_in_both_runs_passes(runs):
    assert compare(runs["eval"], runs["merged_eval"]).verdict == "pass"


@pytest.mark.parametrize(
    ("base", "merged", "moved"),
    [("eval", "merged_train", "merged"), ("train", "merged_eval", "baseline")],
)
def test_batchnorm_in_other_modes_says_so(runs, base, merged, moved):
    c = compare(runs[base], runs[merged])
    first = c.diagnosis[0]
    assert first.code == "batchnorm", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["batch_statistics_in"] == moved
    assert "different modes" in first.message and ".eval()" in first.fix


def test_batchnorm_in_train_mode_in_both_runs_is_told_as_before(runs):
    c = compare(runs["train"], runs["merged_train"])
    first = c.diagnosis[0]
    assert first.code == "batchnorm" and "batch_statistics_in" not in first.evidence
    assert "its own statistics" in first.message
