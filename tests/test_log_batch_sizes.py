"""Micro-batches of unequal sizes in logs: a count printed on each line (`bsz 7`, JSON
`num_items`) weights the window mean, as a recorded run's items do; and an `unexplained` failure
says what its evidence still shows (a loss apart at update 0, micro-batches of unequal sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.judge.results import FAIL, PASS
from gradalign.runs.logs.build import _sizes
from gradalign.runs.logs.names import batch_size, is_size_field

B, K, UPDATES, LR = 30, 4, 20, 0.2


def _train(kind: str) -> list[tuple[float, int]]:
    """Softmax regression under SGD with momentum, float32: per micro-step its loss and size.
    B=30 splits into 8, 8, 7, 7. 'weighted' scales each micro loss by its share of the batch
    (the baseline's gradient), 'naive' divides it by K (the bug)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((UPDATES * B, 10)).astype(np.float32)
    y = rng.integers(0, 3, UPDATES * B)
    w = (rng.standard_normal((10, 3)) * 0.3).astype(np.float32)
    velocity = np.zeros_like(w)
    printed = []
    for u in range(UPDATES):
        rows = np.arange(u * B, (u + 1) * B)
        parts = [rows] if kind == "base" else np.array_split(rows, K)
        grad = np.zeros_like(w)
        for idx in parts:
            logits = x[idx] @ w
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            loss = float(-np.log(p[np.arange(len(idx)), y[idx]]).mean())
            p[np.arange(len(idx)), y[idx]] -= 1
            share = 1.0 if kind == "base" else len(idx) / B if kind == "weighted" else 1.0 / K
            grad += (x[idx].T @ p / len(idx) * np.float32(share)).astype(np.float32)
            printed.append((loss, len(idx)))
        velocity = np.float32(0.9) * velocity + grad
        w = w - np.float32(LR) * velocity
    return printed


def _log(tmp_path, kind: str, form: str = "keyed") -> str:
    lines = []
    for i, (loss, n) in enumerate(_train(kind)):
        if form == "keyed":
            lines.append(f"step {i} loss {loss:.6f} bsz {n} lr {LR:.6e}")
        elif form == "json":
            lines.append(f'{{"step": {i}, "loss": {loss:.7f}, "num_items": {n}}}')
        else:  # no count printed
            lines.append(f"step {i} loss {loss:.6f} lr {LR:.6e}")
    path = tmp_path / f"{kind}-{form}.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("form", ["keyed", "json"])
def test_micro_losses_weighted_by_their_printed_counts_pass(tmp_path, form):
    c = api.compare(_log(tmp_path, "base", form), _log(tmp_path, "weighted", form), accum_steps=K)
    assert c.verdict == PASS


def test_micro_losses_divided_by_k_fail_and_the_message_names_the_unequal_sizes(tmp_path):
    c = api.compare(_log(tmp_path, "base"), _log(tmp_path, "naive"), accum_steps=K)
    assert c.verdict == FAIL
    assert c.first_divergence["update"] > 0  # the same losses at update 0: no step yet
    assert "differ in size (8, 8, 7, 7)" in c.diagnosis[0].message


def test_a_loss_apart_at_update_0_is_said_to_be_printed_otherwise_or_a_step(tmp_path):
    """Without counts the window mean is unweighted: apart at update 0. A log of micro-steps
    shows no step, so the message does not rule out one inside the window (it said the gap was
    not in training, where a loop stepping at every micro-batch made it)."""
    base, merged = _log(tmp_path, "base", "bare"), _log(tmp_path, "weighted", "bare")
    c = api.compare(base, merged, accum_steps=K)
    assert c.verdict == FAIL and c.first_divergence["update"] == 0
    d = c.diagnosis[0]
    assert d.code == "unexplained"
    assert "from the initial weights unless the merged loop stepped inside" in d.message
    assert "an optimizer stepped at every micro-batch" in d.message
    assert "not in training" not in d.message and "smoothed loss" in d.message
    assert "`bsz 7`" in d.fix


def test_which_fields_count_a_micro_batch():
    assert [batch_size(t) for t in ("step 3 loss 2.1 bsz 8", "loss: 2 num_items: 120")] == [8, 120]
    assert batch_size("iter 3 loss 2.1 batch_size=16 tokens 4096") == 16
    for text in (
        "step 3 loss 2.1 consumed samples: 6400",
        "step 3 loss 2.1 total tokens 1200",
        "step 3 loss 2.1 samples/s: 300",
        "step 3 loss 2.1 samples_per_second 300",
        "step 3 loss 2.1 bsz 7.5",
    ):
        assert batch_size(text) is None, text
    assert all(is_size_field(n) for n in ("num_items", "num_items_in_batch", "ntokens", "bsz"))
    assert not any(is_size_field(n) for n in ("tokens_per_second", "consumed_samples", "lr"))


def test_counts_that_rise_at_every_line_count_the_run_not_the_batch():
    assert _sizes([8, 16, 24, 32]) is None
    assert _sizes([8, None, 7]) is None
    assert _sizes([8, 8, 7, 7]).tolist() == [8, 8, 7, 7]
