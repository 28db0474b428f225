"""Without a reference, a 16-bit run's gradient that is rounding in both runs passes
(judge/rounding.rounding_in_both): an attention key bias under bfloat16 autocast, whose gradient
softmax cancels, failed clean runs at 3-8x; a wrong loss scale still fails."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gradalign.api import compare
from gradalign.judge.metrics import TensorDiff
from gradalign.judge.rounding import rounding_in_both, sixteen_bit_floor
from gradalign.judge.tolerances import for_dtype

from .recorded_loop import train

VOCAB, SEQ, D, CLASSES, B, K, UPDATES = 24, 10, 16, 5, 48, 4, 12


class Attention(nn.Module):
    """q/k/v Linear layers with bias (softmax ignores the key bias), then LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.ln = nn.LayerNorm(D)
        self.out = nn.Linear(D, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / math.sqrt(D), -1)
        return self.out(self.ln(a @ self.v(h)).mean(dim=1))


def _record(out, seed: int, k: int, scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randint(1, VOCAB, (B * UPDATES, SEQ), generator=g)
    torch.manual_seed(seed)
    model = Attention()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def forward(rows: torch.Tensor, update: int) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(rows).float()

    train(out, model, opt, x, x[:, 0] % CLASSES, k, batch=B, forward=forward, scale=scale)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_key_bias_rounding_in_both_runs_passes_without_a_reference(tmp_path, seed):
    _record(tmp_path / "base", seed, 1)
    _record(tmp_path / "merged", seed, K)
    c = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert c.verdict == "pass", [ch.detail for ch in c.checks if ch.status == "fail"]
    bug = tmp_path / "bug"
    _record(bug, seed, K, scale=K)  # each micro loss not divided by K
    c = compare(tmp_path / "base", bug, reference="none")
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale"


def _diff(norm: float, error: float, size: int = 16) -> TensorDiff:
    return TensorDiff("t", 0.0, 0.0, 0.0, 0.0, error, 1e-9, None, norm=norm, size=size)


def test_only_a_gradient_at_rounding_scale_in_both_runs_passes():
    tol = for_dtype("bfloat16")
    floor = sixteen_bit_floor(tol, "bfloat16", sumsq=100.0 * 4, elements=100)  # RMS 2
    assert floor == pytest.approx(tol.grad_rtol / 16 * 2)
    scale = floor * 4  # sqrt(16) elements
    assert rounding_in_both(_diff(scale, 2 * scale), floor).ok
    assert not rounding_in_both(_diff(1.5 * scale, scale), floor).ok  # the baseline's larger
    assert not rounding_in_both(_diff(scale, 2.5 * scale), floor).ok  # the merged run's farther
    assert sixteen_bit_floor(for_dtype("float32"), "float32", 400.0, 100) == 0.0
