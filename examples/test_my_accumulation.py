"""Gate your own gradient-accumulation loop in your pytest suite with gradalign.

Your loop records each run through `gradalign.Recorder`; `assert_aligned` judges the K-step run
against the large-batch one (K=1), calibrated by a float64 rerun of it, and fails the test with the
cause and its fix when they are not the same training. Copy this file next to your tests and put
your own model, data and loop in place of `make_model`, `make_data` and `train`.

    pytest examples/test_my_accumulation.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import gradalign
from gradalign.testing import assert_aligned

BATCH, UPDATES, FEATURES = 32, 6, 16


def make_model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)  # both runs start from the same weights
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 3)).to(dtype)


def make_data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * UPDATES, FEATURES, generator=g)
    y = (x[:, :3].argmax(dim=1)).long()
    return x.to(dtype), y


def train(out: Path, accum_steps: int, dtype=torch.float32, scale_loss: bool = True) -> Path:
    """The training loop under test: K micro-batches of B/K per optimizer step."""
    model = make_model(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = make_data(dtype)
    micro = BATCH // accum_steps
    with gradalign.Recorder(out, model, optimizer, accum_steps=accum_steps) as rec:
        for update in range(UPDATES):
            for k in range(accum_steps):
                step = update * accum_steps + k
                rows = slice(step * micro, (step + 1) * micro)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / accum_steps if scale_loss else loss).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))  # its own mean loss, its samples
            rec.grads()  # the accumulated gradient, just before step()
            optimizer.step()
            rec.update()
            optimizer.zero_grad()
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, Path]:
    """The large-batch run (K=1) and its float64 rerun, the noise floor, recorded once."""
    root = tmp_path_factory.mktemp("gradalign")
    return train(root / "k1", 1), train(root / "k1-fp64", 1, dtype=torch.float64)


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_is_the_same_training(baseline, tmp_path, k):
    base, reference = baseline
    assert_aligned(base, train(tmp_path / f"k{k}", k), reference=reference)


def test_the_gate_names_a_missing_loss_scale(baseline, tmp_path):
    base, reference = baseline
    with pytest.raises(AssertionError, match="cause loss-scale"):
        assert_aligned(base, train(tmp_path / "bug", 4, scale_loss=False), reference=reference)
