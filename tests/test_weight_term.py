"""Without a reference, a loss holding a penalty on the weights (judge/weight_term.py): the
gradients at weights the runs' noise set apart differ by 2λ·Δw, which the fixed tolerance took
for a bug. A Transformer encoder under AdamW with λ·Σw² in its loss: the key part of an
attention's `in_proj_bias` has no data gradient, Adam steps its rounding apart in the two runs,
and from update 2 the penalty's gradient there differs by 2λ·Δw: it failed at 1.78x its
tolerance, and its weights (whose drift counts only where the gradient passed) at 180x."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge import sketched, stream, weight_term
from gradalign.judge.compare import compare
from gradalign.judge.metrics import TensorDiff
from gradalign.judge.weight_term import Sums, coefficient, netted, whole_sums
from gradalign.runs.reader import read_run_dir

L2, K, UPDATES, BATCH, SEED = 1e-3, 2, 8, 48, 92


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(1, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.inp(x.unsqueeze(-1))).mean(1))


def _record(out, k: int, *, penalty_k_times: bool = False, unscaled_from: int | None = None,
            record: str = "full", float64: bool = False, reference=None):  # fmt: skip
    torch.manual_seed(SEED)
    net = Encoder().double() if float64 else Encoder()
    opt = torch.optim.AdamW(net.parameters(), 3e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(1000 + SEED)
    x = torch.randn(BATCH * UPDATES, 16, generator=g)
    y = (x @ torch.randn(16, 10, generator=g)).argmax(1)
    x = x.double() if float64 else x
    with gradalign.Recorder(
        out, net, opt, accum_steps=k, record=record, updates=UPDATES, reference=reference
    ) as rec:
        for u in range(UPDATES):
            for j in range(k):
                rows = slice(u * BATCH + j * BATCH // k, u * BATCH + (j + 1) * BATCH // k)
                loss = nn.functional.cross_entropy(net(x[rows]), y[rows])
                penalty = L2 * sum((p**2).sum() for p in net.parameters())
                share = (loss + penalty) / k
                if penalty_k_times:
                    share = loss / k + penalty
                if unscaled_from is not None and u >= unscaled_from:
                    share = loss + penalty
                share.backward()
                rec.micro(loss + penalty, batch=(x[rows], y[rows]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("weight_term")
    made = {"base": _record(root / "base", 1, reference="../ref")}
    made["ref"] = _record(root / "ref", 1, float64=True)
    made["merged"] = _record(root / "merged", K)
    made["base-sketch"] = _record(root / "base-sketch", 1, record="sketch")
    made["merged-sketch"] = _record(root / "merged-sketch", K, record="sketch")
    made["penalty-k"] = _record(root / "penalty-k", K, penalty_k_times=True)
    made["unscaled-4"] = _record(root / "unscaled-4", K, unscaled_from=4)
    return {name: read_run_dir(path) for name, path in made.items()}


def _judged(runs, base="base", merged="merged", **options):
    return compare(runs[base], runs[merged], reference=None, **options)


@pytest.mark.parametrize("mode", ["streamed", "whole", "sketch"])
def test_a_penalty_at_weights_apart_passes_net_of_it(runs, mode):
    options = {"streaming": False} if mode == "whole" else {}
    pair = ("base-sketch", "merged-sketch") if mode == "sketch" else ("base", "merged")
    c = _judged(runs, *pair, **options)
    assert c.verdict == "pass", [d.code for d in c.diagnosis]
    netted_grads = [(r.update, d) for r in c.results for d in r.grads if d.netted > 0]
    assert netted_grads and min(u for u, _ in netted_grads) >= 1
    assert {d.name for _, d in netted_grads} <= {
        f"enc.layers.{i}.self_attn.in_proj_bias" for i in range(2)
    }
    assert all(d.netted == pytest.approx(2 * L2, rel=0.01) for _, d in netted_grads)
    note = next(n for n in c.notes if "net of a term proportional" in n)
    assert "in_proj_bias" in note and "c = 0.002" in note


@pytest.mark.parametrize("mode", ["streamed", "whole", "sketch"])
def test_without_the_netting_the_clean_pair_failed(runs, monkeypatch, mode):
    for module in (weight_term, stream, sketched):
        monkeypatch.setattr(module, "coefficient", lambda sums: 0.0)  # raises if gone
    options = {"streaming": False} if mode == "whole" else {}
    pair = ("base-sketch", "merged-sketch") if mode == "sketch" else ("base", "merged")
    c = _judged(runs, *pair, **options)
    assert c.verdict == "fail"
    assert "in_proj_bias" in c.first_divergence["parameter"]


def test_with_the_reference_it_passes_and_nothing_is_netted(runs):
    c = compare(runs["base"], runs["merged"], reference=runs["ref"])
    assert c.verdict == "pass"
    assert not any(d.netted for r in c.results for d in r.grads)


def test_a_penalty_counted_k_times_is_still_named(runs):
    c = _judged(runs, merged="penalty-k")
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == "penalty-not-scaled"


def test_a_loss_left_undivided_after_the_runs_parted_still_fails_where_it_starts(runs):
    c = _judged(runs, merged="unscaled-4")
    assert c.verdict == "fail"
    assert c.first_divergence["update"] == 4
    assert c.diagnosis[0].code == "loss-scale"
    assert not any(d.netted for r in c.results[4:] for d in r.grads)


def test_the_fit_is_the_penalty_and_leaves_a_spread_error():
    rng = np.random.default_rng(0)
    dw = np.zeros(1000)
    dw[:40] = rng.normal(size=40) * 1e-3  # a key bias's elements, stepped apart
    exact = 2 * L2 * dw
    assert coefficient([whole_sums(np.zeros(1000), exact, np.zeros(1000), dw)]) == pytest.approx(
        2 * L2
    )
    assert coefficient([Sums(1.0, -1e-3, 1.0)]) == 0.0  # a negative fit is none
    assert coefficient([Sums(1.0, 0.0, 0.0)]) == 0.0  # the runs entered alike
    spread = rng.normal(size=1000) * 3e-5  # the data term's difference at weights parted
    parted = whole_sums(np.zeros(1000), exact + spread, np.zeros(1000), dw)
    assert coefficient([parted]) == 0.0  # the weights' term explains too little of it
    bug = rng.normal(size=1000) * 1e-3  # an error over the whole tensor
    s = whole_sums(np.zeros(1000), exact + bug, np.zeros(1000), dw)
    assert coefficient([s]) == 0.0  # a bug's difference is not the weights'
    c = coefficient([s, Sums(0.0, 0.0, 0.0)]) or 2 * L2  # netted all the same: it stays
    d = TensorDiff("w", 0.0, 0.0, 0.0, 1.0, float(np.linalg.norm(exact + bug)), 1e-3)
    assert not netted(d, s.residual(c), c).ok  # the bug's part stays
    assert s.residual(c) == pytest.approx(np.linalg.norm(bug), rel=0.05)
