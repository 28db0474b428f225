"""Tensors without a gradient that follow a noise-walking one (judge/followers.py): a Conv1d's
bias right before InstanceNorm has an exact gradient of 0, so Adam walks it on float32 rounding,
differently in each run, and an EMA copy of the model (buffers, updated once per update) walks
with it. The float64 reference was refused ("not a rerun of the baseline's training") and,
without it, the EMA failed `unexplained`; the merged run is the same training. An EMA updated
at every micro-step still fails (its buffers written inside the window), in both judges."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradalign
from gradalign.judge.compare import compare as judge
from gradalign.runs.reader import read_run_dir

UPDATES, B, K, L = 6, 16, 4, 12


class _Net(nn.Module):
    """A conv whose bias InstanceNorm cancels, a head, and an EMA of both kept as buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.norm = nn.InstanceNorm1d(8, affine=True)
        self.head = nn.Linear(8 * L, 4)
        self.names = [n for n, _ in self.named_parameters()]
        for name, p in self.named_parameters():
            self.register_buffer("ema_" + name.replace(".", "_"), p.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.norm(self.conv(x))).flatten(1))

    @torch.no_grad()
    def average(self) -> None:
        for name, p in self.named_parameters():
            getattr(self, "ema_" + name.replace(".", "_")).mul_(0.9).add_(p, alpha=0.1)


def _record(out, k: int, float64: bool = False, per_micro: bool = False, reference=None) -> None:
    torch.manual_seed(0)
    net = _Net().to(torch.float64 if float64 else torch.float32)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * B, 3, L, generator=g).to(next(net.parameters()).dtype)
    y = torch.randint(0, 4, (UPDATES * B,), generator=g)
    n = B // k
    with gradalign.Recorder(out, net, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            for j in range(k):
                rows = slice(update * B + j * n, update * B + (j + 1) * n)
                loss = F.cross_entropy(net(x[rows]), y[rows])
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(x[rows], y[rows]))
                if per_micro:
                    net.average()
            opt.step()
            if not per_micro:
                net.average()
            rec.update()
            opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("followers")
    _record(root / "ref", 1, float64=True)
    _record(root / "base", 1, reference="../ref")
    _record(root / "merged", K)
    _record(root / "per-micro", K, per_micro=True)
    return {name: read_run_dir(root / name) for name in ("ref", "base", "merged", "per-micro")}


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("referenced", [True, False])
def test_an_ema_of_a_noise_walking_bias_passes(runs, streaming, referenced):
    ref = runs["ref"] if referenced else None
    c = judge(runs["base"], runs["merged"], None, ref, streaming=streaming)
    assert c.verdict == "pass", [(d.code, d.message[:90]) for d in c.diagnosis]
    ema = [d for r in c.results for d in r.weights if d.name == "ema_conv_bias"]
    assert any(d.drift for d in ema)  # the bias's walk, lent to the EMA that follows it


@pytest.mark.parametrize("streaming", [True, False])
def test_an_ema_updated_at_every_micro_step_still_fails(runs, streaming):
    c = judge(runs["base"], runs["per-micro"], None, runs["ref"], streaming=streaming)
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == "buffers-in-forward", [d.code for d in c.diagnosis]


def test_a_golden_keeps_the_walk_and_judges_as_compare(runs, tmp_path):
    """`golden write` checked the reference without the drift `compare` measures, and refused it
    ("not a rerun of the baseline's training", as every transformer's run under Adam was: its
    attention key bias walks on rounding). The golden keeps each weight's drift: the merged run
    passes it, the EMA written at every micro-step fails it, and a golden whose drift is taken
    out is refused, its noise more than a reference may stray."""
    from gradalign.errors import BadInput
    from gradalign.judge import golden
    from gradalign.runs import golden as fmt

    path = tmp_path / "g.json"
    path.write_text(fmt.dumps(golden.build(runs["base"], runs["ref"])))
    data = fmt.load(path)
    kept = data["per_update"][-1]["weights"]
    assert kept["conv.bias"]["drift"] > 0 and kept["ema_conv_bias"]["drift"] > 0
    assert golden.judge(data, str(path), runs["merged"]).verdict == "pass"
    failed = golden.judge(data, str(path), runs["per-micro"])
    assert failed.verdict == "fail"
    assert failed.diagnosis[0].code == "buffers-in-forward"
    for entry in data["per_update"]:
        for item in entry["weights"].values():
            item.pop("drift", None)
            item.pop("explained", None)
    path.write_text(fmt.dumps(data))
    with pytest.raises(BadInput, match="more than a reference may stray"):
        golden.judge(fmt.load(path), str(path), runs["merged"])


def test_a_golden_failing_after_drifted_weights_says_compare_can_tell():
    """`compare` carries the excess merged weights took within their drift to later tensors,
    from their real distance to the reference; a golden sees a lower bound of it. Where a golden
    check fails `unexplained` after such weights passed, its note says so; not where a cause is
    named, nor without a drift."""
    from types import SimpleNamespace as Of

    from gradalign.judge.golden import _drifted_before_failing

    def judged(code: str, drift: float) -> Of:
        weights = [Of(name="conv.bias", drift=drift, ok=True)]
        results = [Of(update=0, ok=True, weights=weights), Of(update=1, ok=False, weights=[])]
        return Of(results=results, diagnosis=[Of(code=code, severity="error")])

    note = _drifted_before_failing(judged("unexplained", 0.01))
    assert note.startswith("by update 1 the weights of conv.bias passed within their drift")
    assert "compare against the baseline's run directory" in note
    assert _drifted_before_failing(judged("loss-scale", 0.01)) == ""
    assert _drifted_before_failing(judged("unexplained", 0.0)) == ""
