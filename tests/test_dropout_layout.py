"""One dropout per forward draws the same masks at B and B/K on the CPU only where its input's
rows are the samples in memory: a mask is drawn in memory order, and nn.MultiheadAttention's
batch_first output is a transposed view (time-major memory), so sample b's mask at time t sits
at t·B + b, which the batch size moves. A cold probe's loop: `dropout-rng`, right, but its fix
spoke only of reseeding and several random ops; it now names `.contiguous()`, which passes."""

from __future__ import annotations

import torch
from torch import nn

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import train

B, K, T, E, UPDATES = 16, 4, 6, 8, 3


class Attention(nn.Module):
    def __init__(self, contiguous: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, 2, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(E, 3)
        self.contiguous = contiguous

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.out(self.drop(a.contiguous() if self.contiguous else a).mean(1))


def record(out, k: int, contiguous: bool):
    torch.manual_seed(0)
    model = Attention(contiguous)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * B, T, E, generator=g)
    y = torch.randint(0, 3, (UPDATES * B,), generator=g)
    train(out, model, opt, x, y, k, batch=B)
    return read_run_dir(out)


def test_dropout_on_a_transposed_view_is_named_with_contiguous_as_its_fix(tmp_path):
    probe = nn.MultiheadAttention(E, 2, batch_first=True)
    x = torch.randn(2, T, E)
    assert not probe(x, x, x, need_weights=False)[0].is_contiguous()  # the layout at issue
    result = compare(record(tmp_path / "b", 1, False), record(tmp_path / "m", K, False))
    lead = result.diagnosis[0]
    assert result.verdict == "fail" and lead.code == "dropout-rng", result.diagnosis
    assert ".contiguous()" in (lead.fix or "")


def test_the_same_dropout_on_a_contiguous_tensor_passes(tmp_path):
    result = compare(record(tmp_path / "b", 1, True), record(tmp_path / "m", K, True))
    assert result.verdict == "pass", result.diagnosis
