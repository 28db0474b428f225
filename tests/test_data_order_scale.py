"""A wrong loss scale beside other samples: a collator that draws its masks per batch (masked-LM
masking) gives the merged run other samples (`data-order`), which turn the gradient, so its
shape cannot name a scale; its size still does (`signatures.paired.scale_beside_other_samples`).
Named beside `data-order` where the loss is not divided by K (or divided twice), with or
without a clip that engaged; not where the scale is right, nor over too few windows."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

B, K, FEATURES = 32, 4, 12


def record(
    out,
    k: int,
    updates: int,
    scale: str = "right",
    clip: float | None = None,
    dtype: torch.dtype = torch.float32,
    reference: str | None = None,
):
    """A loop whose inputs are masked (30% set to 0) by draws made per micro-batch from a seed
    of the micro-batch's place, as a masked-LM collator draws them per batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 24), nn.Tanh(), nn.Linear(24, 3)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(updates * B, FEATURES, generator=g).to(dtype)
    y = torch.randint(0, 3, (updates * B,), generator=g)
    n = B // k
    divide = {"right": k, "none": 1, "twice": k * k}[scale]
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(updates):
            for j in range(k):
                rows = slice(update * B + j * n, update * B + (j + 1) * n)
                draws = torch.Generator().manual_seed(1000 * update + j)
                keep = torch.rand(n, FEATURES, generator=draws) >= 0.3
                inputs = x[rows] * keep.to(dtype)
                loss = nn.functional.cross_entropy(model(inputs), y[rows])
                (loss / divide).backward()
                rec.micro(loss.detach(), batch=(inputs, y[rows]))
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            rec.update()
            opt.zero_grad()


def judged(tmp_path, updates: int = 6, **merged):
    clip = merged.get("clip")
    record(tmp_path / "ref", 1, updates, clip=clip, dtype=torch.float64)
    record(tmp_path / "base", 1, updates, clip=clip, reference="../ref")
    record(tmp_path / "merged", K, updates, **merged)
    return compare(tmp_path / "base", tmp_path / "merged")


@pytest.mark.parametrize(
    ("scale", "clip", "expected"),
    [("none", None, K), ("twice", None, 1 / K), ("none", 0.05, K)],
)
def test_a_wrong_scale_is_named_beside_other_samples(tmp_path, scale, clip, expected):
    result = judged(tmp_path, scale=scale, clip=clip)
    codes = [d.code for d in result.diagnosis]
    assert codes == ["data-order", "loss-scale"], result.diagnosis
    scaled = result.diagnosis[1]
    assert scaled.evidence["expected_ratio"] == expected
    assert abs(scaled.evidence["size_ratio"] / expected - 1) <= 0.10
    assert scaled.evidence["windows"] == 6
    assert "window_loss_ratio" not in scaled.evidence  # the loss recorded is each one's own
    assert "beside the other samples" in scaled.message


@pytest.mark.parametrize("clip", [None, 0.05])
def test_other_samples_at_the_right_scale_are_data_order_alone(tmp_path, clip):
    result = judged(tmp_path, clip=clip)
    assert [d.code for d in result.diagnosis] == ["data-order"], result.diagnosis


def test_too_few_windows_with_other_samples_name_no_scale(tmp_path):
    result = judged(tmp_path, updates=2, scale="none")
    assert [d.code for d in result.diagnosis] == ["data-order"], result.diagnosis
