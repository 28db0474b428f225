"""`batch-dependent-targets` (judge/signatures/items.py): the same samples count other items in the
merged windows than in the baseline's batches. A collator pads each batch to its own longest
sequence; where padding counts as a target (labels copied from the padded inputs), a window of
K micro-batches holds fewer targets than the batch of B. It was `token-normalization` ("each
was weighted equally", though the loop divides by the window's items) or `loss-scale`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

UPDATES, B, K, VOCAB, PAD = 3, 8, 4, 11, 0


def _sequences() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(2, 9, (UPDATES * B,), generator=g)
    return [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]


def _collate(rows: list[torch.Tensor], pad_targets: bool) -> tuple[torch.Tensor, ...]:
    """Padded to the batch's longest; labels shifted within each row, padding masked unless
    `pad_targets` (labels copied from the padded inputs, as a collator that forgets -100)."""
    longest = max(len(r) for r in rows)
    inputs = torch.full((len(rows), longest), PAD)
    for i, r in enumerate(rows):
        inputs[i, : len(r)] = r
    labels = torch.full_like(inputs, PAD)
    labels[:, :-1] = inputs[:, 1:]  # each position predicts the next token of its row
    if not pad_targets:
        labels[labels == PAD] = -100
    return inputs, labels, inputs != PAD


def _record(
    out, k: int, pad_targets: bool, float64: bool = False, reference=None, weights: bool = False
) -> None:
    """`weights`: each target weighs 0.1, the items are those weights summed in float32, and
    the merged run backpropagates twice its share (a loss-scale bug beside float items)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 6), nn.Linear(6, VOCAB))
    model = model.double() if float64 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data, n = _sequences(), B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            batch = data[update * B : (update + 1) * B]
            micro = [_collate(batch[j * n : (j + 1) * n], pad_targets) for j in range(k)]
            count = [(labels != -100).float().mul(0.1).sum() for _, labels, _ in micro]
            count = count if weights else [int((labels != -100).sum()) for _, labels, _ in micro]
            window_items = sum(count)
            for (inputs, labels, mask), items in zip(micro, count, strict=True):
                logits = model(inputs)
                summed = nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum"
                )
                summed = summed * 0.1 if weights else summed
                scale = 2.0 if weights and k > 1 else 1.0
                (scale * summed / window_items).backward()  # the window's items: right
                rec.micro(loss_sum=summed.detach(), items=float(items), batch=inputs, mask=mask)
            opt.step()
            opt.zero_grad()
            rec.update()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("padding")
    for pad_targets in (False, True):
        name = "pad" if pad_targets else "clean"
        _record(root / f"{name}-ref", 1, pad_targets, float64=True)
        _record(root / f"{name}-base", 1, pad_targets, reference=f"../{name}-ref")
        _record(root / f"{name}-merged", K, pad_targets)
    return root


@pytest.mark.parametrize("reference", [None, "none"])
def test_padding_counted_as_targets_is_named(runs, reference):
    c = compare(runs / "pad-base", runs / "pad-merged", reference=reference)
    codes = [d.code for d in c.diagnosis]
    assert c.verdict == "fail" and codes == ["batch-dependent-targets"], codes
    evidence = c.diagnosis[0].evidence
    assert evidence["windows_with_other_items"] == UPDATES
    assert evidence["merged_items"] < evidence["baseline_items"]  # less padding per window


def test_padding_masked_passes(runs):
    """Each batch padded to its own longest, the padding masked: the same targets, a pass
    (the padding itself is left out of the sample digests by the attention mask)."""
    c = compare(runs / "clean-base", runs / "clean-merged", reference=None)
    assert c.verdict == "pass", [d.code for d in c.diagnosis]


def test_float_item_weights_rounding_apart_are_the_same_targets(tmp_path):
    """Items that are weights summed in float32 differ between a window's sum and the batch's by
    rounding: a loss-scale bug beside them was named `batch-dependent-targets`."""
    _record(tmp_path / "base", 1, False, weights=True)
    _record(tmp_path / "merged", K, False, weights=True)
    c = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    codes = [d.code for d in c.diagnosis]
    assert c.verdict == "fail" and codes[0] == "loss-scale", codes
    assert "batch-dependent-targets" not in codes
