"""A Recorder of K > 1 micro-steps over BatchNorm in training mode warns when it opens, as the
commands warn before training (a loop of one's own recorded with no word of it, and the judge
named `batchnorm` after the run); over BatchNorm in eval mode, or at K = 1, it does not. The
built-in trainer's Recorder stays silent: its command printed the warning already."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import gradalign


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))


def _open(out, model: nn.Module, k: int) -> list[str]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = gradalign.Recorder(out, model, opt, accum_steps=k)
    rec.abort()
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_batchnorm_in_training_mode_warns_at_k_above_one(tmp_path):
    said = _open(tmp_path / "k4", _model(), 4)
    assert any("BatchNorm (1)" in s and "'batchnorm'" in s for s in said), said
    assert not [s for s in _open(tmp_path / "k1", _model(), 1) if "BatchNorm" in s]
    assert not [s for s in _open(tmp_path / "eval", _model().eval(), 4) if "BatchNorm" in s]


def test_the_built_in_trainer_does_not_warn_twice(tmp_path):
    from gradalign.config import TrainConfig
    from gradalign.record.loop import train

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(TrainConfig(model="cnn-bn", updates=1, batch_size=8, accum_steps=2), tmp_path / "m")
    assert not [w for w in caught if "BatchNorm" in str(w.message)]
