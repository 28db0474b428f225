"""A baseline that accumulates too (`--baseline-accum-steps`, K_b = 2) against a merged run of
K = 4: a bug in the merged loop scales its gradient by its own K, the baseline's windows summing
their shares to the batch's gradient. A loss left undivided is 4 times the baseline's, named
"not divided by K=4" (the judge read the K of the merged run over the baseline's, 2, and named
no scale, "the loss is scaled by the wrong factor"); on 2 ranks against a 2-rank K_b = 2
baseline, a loss divided by W = 2 stood at 1/2 = 1/(K/K_b) and was named "divided by K=2 once
too often, with W = K = 2" instead of `dp-loss-reduction` (a cold probe's runs; the same
reading, signatures/common.own_k, serves dp_loss_reduction)."""

from __future__ import annotations

import torch

from gradalign import api

from .recorded_loop import classifier, train

BATCH, UPDATES = 16, 3


def _run(out, k: int, scale: float = 1.0):
    model, x, y = classifier(BATCH * UPDATES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(out, model, opt, x, y, k, batch=BATCH, scale=scale)
    return out


def test_a_merged_loss_left_undivided_is_k_times_an_accumulating_baseline(tmp_path):
    base = _run(tmp_path / "k2", 2)
    clean = api.compare(base, _run(tmp_path / "k4", 4), baseline_accum_steps=2)
    assert clean.verdict == "pass", [(d.code, d.message) for d in clean.diagnosis]
    c = api.compare(base, _run(tmp_path / "bug", 4, scale=4.0), baseline_accum_steps=2)
    first = c.diagnosis[0]
    assert first.code == "loss-scale" and first.evidence["expected_ratio"] == 4, c.diagnosis
    assert "not divided by K=4" in first.message, first.message
