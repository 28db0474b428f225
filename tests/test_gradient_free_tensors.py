"""Tensors that never had a gradient (an EMA copy inside the model, updated after each step) are
not stepped by gradient noise: their steps widen no allowance, so a bug that moves them fails,
with the reference and without, and a clean run still passes."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import gradalign  # noqa: E402

UPDATES, BATCH, K = 6, 16, 4


class _WithEma(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.ema = copy.deepcopy(net).requires_grad_(False)

    def forward(self, x):
        return self.net(x)

    @torch.no_grad()
    def ema_update(self, step: int) -> None:
        decay = min(0.99, (1 + step) / (10 + step))
        for e, p in zip(self.ema.parameters(), self.net.parameters(), strict=True):
            e.mul_(decay).add_(p, alpha=1 - decay)


def _record(
    out, k: int, dtype=torch.float32, reference=None, bug: bool = False, ema: str = "in-update"
) -> None:
    """The EMA updated between step() and update() (`in-update`), after update() (as timm's
    ModelEmaV2 is once the step is taken), or, a bug, after every micro-step's backward
    (`every-micro`); `bug`: warmed up by micro-steps instead of updates."""
    torch.manual_seed(0)
    model = _WithEma(nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 4))).to(dtype)
    opt = torch.optim.SGD(model.net.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 10, generator=g).to(dtype)
    y = torch.randint(0, 4, (UPDATES * BATCH,), generator=g)
    rows, micro = BATCH // k, 0
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            for i in range(k):
                part = slice(update * BATCH + i * rows, update * BATCH + (i + 1) * rows)
                loss = nn.functional.cross_entropy(model(x[part]), y[part])
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(x[part], y[part]))
                micro += 1
                if ema == "every-micro":
                    model.ema_update(update)
            opt.step()
            if ema == "in-update":
                model.ema_update(micro - 1 if bug else update)
            rec.update()
            opt.zero_grad()
            if ema == "after-update":
                model.ema_update(update)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ema")
    _record(root / "base-fp64", 1, torch.float64)
    _record(root / "base", 1, reference="../base-fp64")
    _record(root / "merged", K)
    _record(root / "bug", K, bug=True)
    return root


@pytest.mark.parametrize("reference", ["default", "none"])
def test_an_ema_copy_is_judged_strictly(cli, runs, tmp_path, reference):
    extra = [] if reference == "default" else ["--reference", "none"]
    clean = cli("compare", runs / "base", runs / "merged", *extra)
    assert clean.code == 0, clean.out
    report = tmp_path / "r.json"
    bug = cli("compare", runs / "base", runs / "bug", *extra, "--json", report)
    assert bug.code == 1, bug.out
    failed = {
        d["name"]
        for u in json.loads(report.read_text())["per_update"]
        for d in u["weights"] or []
        if d["error"] is not None and d["allowed"] is not None and d["error"] > d["allowed"]
    }
    assert failed and all(name.startswith("ema.") for name in failed), failed


def test_an_ema_updated_at_every_micro_step_is_named(tmp_path):
    """Updated after update(), the K=1 baseline's EMA changes before each forward, as a
    forward's writes do, and so was exempt from the window check: the merged run's EMA updated
    at every micro-step failed its weights `unexplained` (an AveragedModel's, named
    `buffers-in-forward` by its count). Its changes come between micro-steps, never at a
    window's first forward: `weights-changed-in-window`, the EMA's tensors named."""
    from gradalign import api

    _record(tmp_path / "base", 1, ema="after-update")
    _record(tmp_path / "ref", 1, torch.float64, ema="after-update")
    _record(tmp_path / "merged", K, ema="after-update")
    _record(tmp_path / "bug", K, ema="every-micro")
    ref = tmp_path / "ref"
    assert api.compare(tmp_path / "base", tmp_path / "merged", reference=ref).verdict == "pass"
    c = api.compare(tmp_path / "base", tmp_path / "bug", reference=ref)
    found = c.diagnosis[0]
    assert found.code == "weights-changed-in-window", [(d.code, d.message) for d in c.diagnosis]
    assert found.evidence["tensors"] and all(
        n.startswith("ema.") for n in found.evidence["tensors"]
    )
