"""A buffer holding -inf (an attention mask, `register_buffer("mask", triu(full(-inf), 1))`)
is the same in every run: every comparison of such a model failed on it ("infx the noise
floor"), with and without a reference, where no weight differed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign import api

T, V, D = 8, 16, 16


class MaskedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.o = nn.Embedding(V, D), nn.Linear(D, V)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.e(x)
        scores = self.q(h) @ self.k(h).transpose(1, 2) / D**0.5 + self.mask
        return self.o(scores.softmax(-1) @ self.v(h))


def record(out, k: int, dtype=torch.float32, reference=None, bug=False, mode="full"):
    model = MaskedLM().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, V, (48, T + 1), generator=torch.Generator().manual_seed(1))
    batch, rows = 16, 16 // k
    with gradalign.Recorder(out, model, opt, k, reference=reference, record=mode) as rec:
        for update in range(3):
            for i in range(k):
                x = data[update * batch + i * rows : update * batch + (i + 1) * rows]
                logits = model(x[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
                (loss if bug else loss / k).backward()
                rec.micro(loss, batch=x)
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.mark.parametrize("mode", ["full", "sketch"])
def test_a_mask_buffer_of_minus_inf_passes_and_a_bug_beside_it_is_named(tmp_path, mode):
    record(tmp_path / "k1-fp64", 1, torch.float64, mode=mode)
    base = record(tmp_path / "k1", 1, reference="../k1-fp64", mode=mode)
    for reference in (None, "none"):
        clean = api.compare(base, record(tmp_path / "k4", 4, mode=mode), reference=reference)
        assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
    broken = api.compare(base, record(tmp_path / "k4-bug", 4, bug=True, mode=mode))
    assert broken.verdict == "fail" and broken.diagnosis[0].code == "loss-scale"
