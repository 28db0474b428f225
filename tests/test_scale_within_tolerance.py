"""A short last window divided by K (accelerate's `accumulate()`, Lightning's automatic
optimization) steps with n/K of the baseline's gradient. In bfloat16 without a reference that
stood within `grad_rtol_apart` and passed; a scale by one of a wrong loss scale's ratios, with
the gradient's direction kept to far less than that, fails (judge/below_noise.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

B, K, FULL, TAIL = 16, 4, 5, 3  # five full windows, then 3 micro-batches of B/K


def _record(out, k: int, tail_by_k: bool = False, lr: float = 0.5, full: int = FULL) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    rows = full * B + TAIL * B // K
    x, y = torch.randn(rows, 8, generator=g), torch.randint(0, 4, (rows,), generator=g)
    batches = list(zip(x.split(B // k), y.split(B // k), strict=True))
    windows = [batches[i : i + k] for i in range(0, len(batches), k)]
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for window in windows:
            for xb, yb in window:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out_ = model(xb)
                loss = nn.functional.cross_entropy(out_.float(), yb)
                (loss / (k if tail_by_k else len(window))).backward()
                rec.micro(loss.detach(), batch=(xb, yb))
            opt.step()
            opt.zero_grad()
            rec.update()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tail")
    _record(root / "base", 1)
    _record(root / "merged", K)
    _record(root / "tail-by-k", K, tail_by_k=True)
    for k in (1, K):  # a step too small for the weights to fail by the tolerance
        _record(root / f"small-{k}", k, tail_by_k=k > 1, full=4 * FULL)
    return root


def test_a_tail_divided_by_its_own_size_passes(runs):
    c = compare(runs / "base", runs / "merged", reference="none")
    assert c.verdict == "pass", [(d.code, d.message) for d in c.diagnosis]


@pytest.mark.parametrize("pair", [("base", "tail-by-k"), ("small-1", "small-4")])
def test_a_tail_divided_by_k_fails_as_a_loss_scale_within_the_tolerance(runs, pair):
    """Whether the tail's step is a large share of how far the weights moved (after 5 full
    updates) or a small one (after 20), the weights pass: the tail's gradient, 0.75 of the
    baseline's, passes by grad_rtol_apart, and the drift then grants each element the share of
    its steps that gradient's noise explains (judge/drift.py `shared_steps`; before `e88e84b`
    the drift counted steps only where the gradient passed by grad_rtol, and the weights failed
    after 5 updates). The scale's shape names it either way."""
    c = compare(runs / pair[0], runs / pair[1], reference="none")
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["update"] == (FULL if pair[0] == "base" else 4 * FULL)
    assert first.evidence["expected_ratio"] == pytest.approx(TAIL / K)
    assert first.evidence["within_tolerance"]
    tensors = [check for check in c.checks if check.name in ("weights", "gradients")]
    assert [check.status for check in tensors] == ["pass", "pass"]
