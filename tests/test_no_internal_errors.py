"""Loops that once ended `compare` in an internal error (exit 3): each must get a verdict."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import gradalign  # noqa: E402


def test_a_first_window_that_never_closed_is_window_bookkeeping(cli, tmp_path):
    """No window could be judged (window 0 holds 2K micro-steps) and no sample digests: the
    judge names the bookkeeping, instead of reading a first judged update that is not there."""

    def record(out, k: int, forget: bool) -> None:
        torch.manual_seed(0)
        model, (x, y) = nn.Linear(4, 2), (torch.randn(16, 4), torch.randn(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for update in range(4):
                for i in range(k):
                    loss = nn.functional.mse_loss(model(x.chunk(k)[i]), y.chunk(k)[i])
                    (loss / k).backward()
                    rec.micro(loss)
                opt.step()
                opt.zero_grad()
                if not (forget and update == 0):
                    rec.update()

    record(tmp_path / "base", 1, False)
    record(tmp_path / "merged", 4, True)
    report = tmp_path / "r.json"
    result = cli(
        "compare", tmp_path / "base", tmp_path / "merged", "--reference", "none", "--json", report
    )
    assert result.code == 1, result.out + result.err
    codes = [d["code"] for d in json.loads(report.read_text())["diagnosis"]]
    assert codes[0] == "window-bookkeeping", codes


class _Counter(nn.Module):
    """A buffer the forward writes (a count of forwards) and nothing reads."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.ones(()))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.count += 1
        return x


def test_a_buffer_failing_alone_is_judged_not_widened(cli, tmp_path):
    """Against a reference, where only a buffer fails (the loss and every gradient pass), the
    optimizer-gain rule, which reads gradients, leaves it alone: buffers-in-forward."""

    def record(out, k: int, dtype=torch.float32, reference=None) -> None:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), _Counter(), nn.Tanh(), nn.Linear(16, 3))
        model = model.to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(96, 8, generator=g)
        y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
        x, b = x.to(dtype), 24 // k
        with gradalign.Recorder(out, model, opt, k, reference=reference) as rec:
            for update in range(4):
                for i in range(k):
                    rows = slice(update * 24 + i * b, update * 24 + (i + 1) * b)
                    loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                    (loss / k).backward()
                    rec.micro(loss, batch=(x[rows], y[rows]))
                opt.step()
                rec.update()
                opt.zero_grad()

    record(tmp_path / "base-fp64", 1, torch.float64)
    record(tmp_path / "base", 1, reference="../base-fp64")
    record(tmp_path / "merged", 3)
    report = tmp_path / "r.json"
    result = cli("compare", tmp_path / "base", tmp_path / "merged", "--json", report)
    assert result.code == 1, result.out + result.err
    codes = [d["code"] for d in json.loads(report.read_text())["diagnosis"]]
    assert codes[0] == "buffers-in-forward", codes
