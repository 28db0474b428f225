"""The loops and the check that the tests of a model's features share
(tests/test_model_dtypes.py, tests/test_model_features.py): a model of two heads, a
classification head's mean and a regression head's sum, with its loop (`heads_loop`); and a
loop's clean merged run passing where its unscaled loss is named `loss-scale`."""

from __future__ import annotations

import torch
from torch import nn

import gradalign
from gradalign import api


def _clean_passes_and_unscaled_loss_is_named(loop, tmp_path) -> None:
    """`loop` recorded as the float64 reference, the baseline (K=1), a clean merged run (K=4)
    and one whose loss is not divided by K: the clean one passes, the other is `loss-scale`."""
    loop(tmp_path / "r", 1, float64=True)
    loop(tmp_path / "b", 1, reference="../r")
    loop(tmp_path / "m", 4)
    loop(tmp_path / "bug", 4, bug="no-loss-scale")
    clean = api.compare(tmp_path / "b", tmp_path / "m")
    assert clean.verdict == "pass", [d.code for d in clean.diagnosis]
    buggy = api.compare(tmp_path / "b", tmp_path / "bug")
    assert [d.code for d in buggy.diagnosis][:1] == ["loss-scale"]


class TwoHeads(nn.Module):
    """Classification logits and a scalar regression value, returned in a dict."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(20, 32), nn.Tanh())
        self.cls = nn.Linear(32, 5)
        self.reg = nn.Linear(32, 1)

    def forward(self, x):
        h = self.trunk(x)
        return {"logits": self.cls(h), "value": self.reg(h).squeeze(-1)}


def heads_loop(out, k, seed, *, float64=False, reference=None, bug=None):
    """`bug`: "mean-head-not-over-k" (the classification head's mean over the micro-batch, not
    divided by K) or "sum-head-over-k" (the regression head's sum divided by K too)."""
    torch.manual_seed(seed)
    model = TwoHeads().double() if float64 else TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(32 * 6, 20, generator=g)
    y = (x[:, :5] + 0.5 * torch.randn(32 * 6, 5, generator=g)).argmax(1)
    x = x.double() if float64 else x
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(6):
            for rows in torch.arange(update * 32, (update + 1) * 32).chunk(k):
                out_ = model(x[rows])
                mean = nn.functional.cross_entropy(out_["logits"], y[rows])  # over the micro-batch
                total = 0.5 * nn.functional.mse_loss(out_["value"], x[rows, 0], reduction="sum")
                loss = mean * len(rows) + total
                share = {
                    "mean-head-not-over-k": mean * len(rows) / 32 * k + total / 32,
                    "sum-head-over-k": mean * len(rows) / 32 + total / 32 / k,
                }.get(bug or "", loss / 32)
                share.backward()
                rec.micro(loss_sum=loss.detach().float(), items=len(rows), batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
