"""A bug smaller than the baseline's own rounding, in a run that shares that rounding: inputs
near 1e5 centred per sample put a float32 gradient about 0.6% off its float64 rerun, and the
merged run computes every sample as the baseline does. A weight penalty counted K times moves
the gradient 0.4%: within the noise floor, yet exactly a multiple of the weights. It fails by
its shape (judge/below_noise.py); the clean run and other seeds' clean runs still pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import gradalign
from gradalign.api import compare
from gradalign.judge.below_noise import CHECK

UPDATES, B, K, L2, OFFSET = 5, 16, 4, 1e-4, 1e5


class Centred(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x - x.mean(-1, keepdim=True))


def record(out, k: int, seed: int, float64: bool = False, bug: bool = False, reference=None):
    torch.manual_seed(seed)
    model = Centred().double() if float64 else Centred()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    z = torch.randn(UPDATES * B, 8, generator=torch.Generator().manual_seed(seed + 1))
    x, y = z + OFFSET, torch.sin(2 * z[:, :1])
    if float64:
        x, y = x.double(), y.double()
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            for micro in range(k):
                rows = slice(update * B + micro * n, update * B + (micro + 1) * n)
                loss = F.mse_loss(model(x[rows]), y[rows])
                penalty = L2 * sum((p**2).sum() for p in model.parameters())
                (loss / k + (penalty if bug else penalty / k)).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_penalty_counted_k_times_under_the_noise_floor_is_named(tmp_path, seed):
    record(tmp_path / "fp64", 1, seed, float64=True)
    record(tmp_path / "base", 1, seed, reference="../fp64")
    record(tmp_path / "merged", K, seed)
    record(tmp_path / "bug", K, seed, bug=True)
    clean = compare(tmp_path / "base", tmp_path / "merged")
    assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
    bug = compare(tmp_path / "base", tmp_path / "bug")
    failed = [c.name for c in bug.checks if c.status == "fail"]
    assert failed == [CHECK]  # every other check passes: the reference's floor covers the bug
    first = bug.diagnosis[0]
    assert first.code == "penalty-not-scaled" and first.evidence["below_noise_floor"]
    assert first.evidence["implied_l2"] == pytest.approx(L2, rel=0.05)
    assert "written as c·‖w‖²" in first.message and "written as λ/2·‖w‖²" in first.message
    assert bug.first_divergence["update"] == 0


def test_without_a_reference_a_penalty_counted_k_times_within_the_tolerance_is_named(tmp_path):
    """The built-in MLP with λ = 1e-6 counted K times moves the gradient 3.9e-5 of itself, within
    grad_rtol (1e-4): it passed without a reference. Exactly a multiple of the weights (99.6% of
    the difference explained), it fails by that shape; the clean pair, 1.5e-7 apart, passes."""
    from gradalign import api
    from gradalign.config import TrainConfig
    from gradalign.judge.below_noise import FIXED_CHECK

    config = TrainConfig(hidden=32, updates=3, batch_size=32, accum_steps=K, l2_penalty=1e-6)
    base = api.record_baseline(config, tmp_path / "base", reference="none")
    clean = compare(base, api.record_merged(config, tmp_path / "merged"), reference="none")
    assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
    merged = api.record_merged(config, tmp_path / "bug", fault="penalty-every-micro")
    bug = compare(base, merged, reference="none")
    assert bug.verdict == "fail"
    assert bug.diagnosis[0].code == "penalty-not-scaled"
    assert bug.diagnosis[0].evidence["implied_l2"] == pytest.approx(1e-6, rel=0.05)
    failed = [c for c in bug.checks if c.status == "fail"]
    assert [c.name for c in failed] == [FIXED_CHECK]
    assert all(d.ok for r in bug.results for d in r.grads)  # within grad_rtol everywhere
