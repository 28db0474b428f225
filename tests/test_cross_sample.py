"""`cross-sample-loss` (judge/signatures/decisive.py): from identical weights over the same
samples, update 0 already differs, and nothing that names itself does (BatchNorm, dropout, other
samples, losses recorded scaled): part of the loss is computed over each micro-batch as a whole.
Runs written with numpy (tests/test_noise_model.py's least squares, SGD), each micro-batch's
sample digest recorded so the samples are known to be the same."""

from __future__ import annotations

import numpy as np

from gradalign import api
from gradalign.runs.portable import write_run
from tests.test_noise_model import UPDATES, train

K = 4


def _digests(k: int) -> list[int]:
    """Per micro-step, a digest of its samples: the baseline's per update is the sum of the
    merged run's K (the same rows, digested order-free)."""
    parts = np.arange(1, UPDATES * K + 1, dtype=np.int64) * 7919
    return (parts if k == K else parts.reshape(UPDATES, K).sum(axis=1)).tolist()


def _runs(
    tmp_path,
    *,
    term: float = 0.0,
    digests: bool = True,
    model=None,
    scale=1.0,
    spike=None,
    compute_dtype=None,
    items=None,
):
    """The float64 reference, the baseline (K=1) and the merged run (K): `term` is added to each
    of the merged run's micro losses, as a loss over the micro-batch's own statistics adds one
    that the batch's does not (its gradient `spike(update, grad)` too); `scale`: its losses
    recorded so many times too large; `items`: the merged run's item counts per micro-step
    (the baseline's the sum of each window's)."""
    for name, dtype, k in (("ref", np.float64, 1), ("base", np.float32, 1)):
        run = train(dtype)
        extra = {"reference": "../ref"} if name == "base" else {}
        data = {"micro_data": _digests(1)} if digests else {}
        write_run(
            tmp_path / name, accum_steps=k, compute_dtype=compute_dtype, **run, **extra, **data
        )
    run = train(np.float32, k=K, spike=spike, feed=True)
    run["micro_losses"] = [(loss + term) * scale for loss in run["micro_losses"]]
    data = {"micro_data": _digests(K)} if digests else {}
    if items is not None:
        data["micro_items"] = items
    write_run(
        tmp_path / "merged", accum_steps=K, model=model, compute_dtype=compute_dtype, **run, **data
    )
    return api.compare(tmp_path / "base", tmp_path / "merged")


def _codes(c) -> list[str]:
    return [d.code for d in c.diagnosis if d.severity == "error"]


def _spread(updates: range, size: float = 1e-3):
    """A gradient off by a spread draw of `size` of its largest element at `updates`: what a
    term over the micro-batch adds to the backward."""
    rng = np.random.default_rng(3)

    def spike(u, g):
        return g + rng.normal(size=g.shape) * size * np.abs(g).max() if u in updates else g

    return spike


def test_a_loss_over_each_micro_batch_is_named_at_update_0(tmp_path):
    c = _runs(tmp_path, term=1e-3, spike=_spread(range(UPDATES)))
    assert c.verdict == "fail" and _codes(c)[0] == "cross-sample-loss"
    (found, *_) = c.diagnosis
    assert "update 0" in found.message and "load-balancing" in found.message
    assert "items=" in found.message  # no item counts recorded: a per-token mean reads alike
    assert found.evidence["K"] == K and found.fix and "once per" in found.fix


def test_the_same_clean_run_passes(tmp_path):
    assert _runs(tmp_path).verdict == "pass"


def test_without_sample_digests_it_is_not_claimed(tmp_path):
    """Without digests the samples are not known to be the same: data-order says what it can."""
    c = _runs(tmp_path, term=1e-3, digests=False, spike=_spread(range(UPDATES)))
    assert "cross-sample-loss" not in _codes(c)


def test_dropout_or_losses_recorded_k_times_are_named_so(tmp_path):
    facts = {"dropout": ["drop"], "batchnorm": []}
    dropout = _runs(tmp_path / "dropout", term=1e-3, model=facts, spike=_spread(range(UPDATES)))
    assert _codes(dropout)[0] == "dropout-rng"
    scaled = _runs(tmp_path / "scaled", scale=1 / K)
    assert "cross-sample-loss" not in _codes(scaled)


def test_a_gradient_alone_differing_at_update_0_is_read_last(tmp_path):
    """The loss agrees at update 0 but the gradient differs there, spread over the rows, in no
    known shape: named last (a load-balancing loss too small to show in the loss), against the
    reference and by float32's fixed tolerances; computed in bfloat16 without a reference it
    stays unexplained (noise could do it)."""
    c = _runs(tmp_path, spike=_spread(range(1)))
    assert c.results[0].loss_ok and not all(d.ok for d in c.results[0].grads)
    assert _codes(c)[0] == "cross-sample-loss"
    assert "the loss agrees but the gradient does not" in c.diagnosis[0].message
    alone = api.compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert _codes(alone)[0] == "cross-sample-loss"
    coarse = _runs(tmp_path / "bf16", spike=_spread(range(1), 3e-1), compute_dtype="bfloat16")
    assert not coarse.results[0].loss_ok or not all(d.ok for d in coarse.results[0].grads)
    unreferenced = api.compare(
        tmp_path / "bf16" / "base", tmp_path / "bf16" / "merged", reference="none"
    )
    assert "cross-sample-loss" not in _codes(unreferenced)


def test_unequal_micro_batches_are_left_to_token_normalization(tmp_path):
    """The same gap with micro-batches of unequal item counts: each one's own mean reweights
    them (a per-micro-batch token mean, the pre-2024 transformers Trainer), which the gradient's
    shape reads; this signature does not claim it."""
    items = [10, 30, 20, 20] * UPDATES
    c = _runs(tmp_path, term=1e-3, spike=_spread(range(UPDATES)), items=items)
    assert c.verdict == "fail" and "cross-sample-loss" not in _codes(c)
