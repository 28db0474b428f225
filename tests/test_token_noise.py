"""BERT's attention key bias: its gradient is zero in exact arithmetic (the softmax cancels it),
rounding noise in float32, which Adam steps by about lr·g/eps.

Without a reference such a tensor's steps are judged by the share its gradient's noise explains;
Adam's moments carry the earlier updates' disagreement into an update where this one's happens
to agree, and a clean float32 run failed (3.7x at update 2). Under bfloat16 autocast a clean
run fails by 16-bit drift all the same, and was named `token-normalization` (its micro-batches
hold unequal token counts, so the reweighting bound, 42% wrong, covered a 0.3% gradient error).
The same loop dividing each micro-batch's mean by K is still named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare

from .frameworks import require

transformers = require("transformers")
UPDATES, B, K, LENGTH, VOCAB = 8, 16, 4, 16, 64


def _data(updates: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000)
    n = updates * B
    ids = torch.randint(3, VOCAB, (n, LENGTH), generator=g)
    lengths = torch.randint(LENGTH // 3, LENGTH + 1, (n,), generator=g)
    mask = (torch.arange(LENGTH)[None] < lengths[:, None]).long()
    ids = ids * mask
    masked = (torch.rand(n, LENGTH, generator=g) < 0.3) & (mask == 1)
    masked[:, 0] = True
    return ids.masked_fill(masked, 1), mask, ids.masked_fill(~masked, -100)


def record(
    out, k: int, micro_mean: bool = False, bf16: bool = True, updates: int = UPDATES
) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        hidden_dropout_prob=0,
        attention_probs_dropout_prob=0,
        attn_implementation="eager",
    )
    model = transformers.BertForMaskedLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, mask, labels = _data(updates)
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for update in range(updates):
            rows = torch.arange(update * B, (update + 1) * B)
            window = int((labels[rows] != -100).sum())
            for part in torch.tensor_split(rows, k):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(input_ids=ids[part], attention_mask=mask[part]).logits
                total = nn.functional.cross_entropy(
                    logits.float().reshape(-1, VOCAB), labels[part].reshape(-1), reduction="sum"
                )
                items = int((labels[part] != -100).sum())
                (total / items / k if micro_mean else total / window).backward()
                rec.micro(loss_sum=total.detach(), items=items, batch=(ids[part], labels[part]))
            opt.step()
            rec.update()
            opt.zero_grad()


def test_a_reweighting_within_the_gradients_noise_is_not_named(tmp_path):
    record(tmp_path / "base", 1)
    record(tmp_path / "merged", K)
    record(tmp_path / "bug", K, micro_mean=True)
    clean = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert "token-normalization" not in [d.code for d in clean.diagnosis]
    bug = compare(tmp_path / "base", tmp_path / "bug", reference="none")
    assert bug.diagnosis[0].code == "token-normalization", bug.diagnosis[0].message


@pytest.mark.parametrize("threads", [2, 1])  # 1: a step that turned failed (1.39x), judge/drift.py
def test_a_tensor_whose_gradient_is_rounding_noise_passes_without_a_reference(tmp_path, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        record(tmp_path / "base", 1, bf16=False, updates=10)
        record(tmp_path / "merged", K, bf16=False, updates=10)
    finally:
        torch.set_num_threads(before)
    clean = compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
