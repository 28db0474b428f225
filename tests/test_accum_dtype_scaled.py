"""Gradients accumulated in bfloat16 and scaled after the sum (a norm clip that engaged): each
value is fl(c·q) for a bfloat16 q, exactly representable in no 16-bit format, so the check of
exact values saw a float32 gradient, and the run was named `clip-threshold` ("a norm 0.9998 times
the baseline's", which is the same norm). Each tensor still holds at most 128 distinct float32
mantissas (judge/signatures/accum_dtype.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradalign import Recorder, api
from gradalign.judge.signatures import accum_dtype
from gradalign.judge.signatures.accum_dtype import _mantissas

UPDATES, BATCH = 6, 32


def _run(out, k: int, dtype=torch.float32, bf16_sum: bool = False, **recorder) -> None:
    """An MLP under SGD with momentum, its gradient's norm clipped at 0.1 (always engaged);
    `bf16_sum`: each micro-step's .grad is rounded to bfloat16 (a bfloat16 accumulator)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.GELU(), torch.nn.Linear(256, 10)
    ).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 64, generator=generator).to(dtype)
    y = torch.randint(0, 10, (UPDATES * BATCH,), generator=generator)
    with Recorder(out, model, optimizer, k, updates=UPDATES, **recorder) as rec:
        for update in range(UPDATES):
            for rows in torch.arange(update * BATCH, (update + 1) * BATCH).chunk(k):
                loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                if bf16_sum:
                    for p in model.parameters():
                        p.grad.copy_(p.grad.bfloat16())
                rec.micro(loss, batch=(x[rows], y[rows]))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            rec.update()
            optimizer.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaled")
    _run(root / "ref", 1, torch.float64)
    _run(root / "base", 1, reference="../ref")
    _run(root / "clean", 4)
    _run(root / "bug", 4, bf16_sum=True)
    return root


def test_a_clipped_bfloat16_sum_is_named_grad_accum_dtype(runs):
    assert api.compare(runs / "base", runs / "clean").verdict == "pass"
    result = api.compare(runs / "base", runs / "bug")
    first = result.diagnosis[0]
    assert result.verdict == "fail" and first.code == "grad-accum-dtype", result.diagnosis
    assert "bfloat16 numbers times one factor" in first.message
    assert first.evidence["merged_mantissas_max"] <= 128


def test_without_it_the_same_norm_is_no_clip_threshold(runs, monkeypatch):
    """The clip signature read ρ·(1/ρ) = 1 at ρ = 0.9998: the same norm, which says nothing."""
    monkeypatch.setattr(accum_dtype, "_scaled_narrow", lambda *a: None)
    result = api.compare(runs / "base", runs / "bug")
    assert result.verdict == "fail"
    assert "clip-threshold" not in [d.code for d in result.diagnosis], result.diagnosis


def test_mantissas_are_counted_per_tensor_and_only_where_enough_values_tell():
    rng = np.random.default_rng(0)
    q = rng.normal(size=4096).astype(np.float32)
    q = (q.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # bfloat16 numbers
    scaled = (q * np.float32(0.0137)).astype(np.float32)
    counts = _mantissas({"scaled": scaled, "wide": rng.normal(size=4096).astype(np.float32)}, 7)
    assert counts["scaled"] <= 128 < 4000 < counts["wide"]
    assert _mantissas({"small": scaled[:1000]}, 7) == {}  # fewer than 8 x 128 values
