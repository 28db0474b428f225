"""Without a reference, a gradient that is rounding alone (a conv bias right before
InstanceNorm: zero in exact arithmetic) is judged with the rounding floor (judge/rounding.py):
clean runs pass, under SGD and under NAdam (which steps on that noise), and a bug still fails."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import gradalign  # noqa: E402

UPDATES, BATCH, LENGTH = 6, 16, 12


def _record(out, k: int, optimizer: str, seed: int, bug: bool = False, record="full") -> None:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv1d(3, 8, 3, padding=1),
        nn.InstanceNorm1d(8, affine=True),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * LENGTH, 4),
    )
    if optimizer == "nadam":
        opt = torch.optim.NAdam(model.parameters(), lr=3e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(UPDATES * BATCH, 3, LENGTH, generator=g) * 2 + 1
    y = torch.randint(0, 4, (UPDATES * BATCH,), generator=g)
    rows = BATCH // k
    sketch = (
        {"record": "sketch", "sketch_width": 17, "updates": UPDATES} if record != "full" else {}
    )
    with gradalign.Recorder(out, model, opt, accum_steps=k, **sketch) as rec:
        for update in range(UPDATES):
            for i in range(k):
                part = slice(update * BATCH + i * rows, update * BATCH + (i + 1) * rows)
                loss = nn.functional.cross_entropy(model(x[part]), y[part])
                (loss if bug else loss / k).backward()
                rec.micro(loss.detach(), batch=(x[part], y[part]))
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.mark.parametrize(
    ("optimizer", "record"), [("sgd", "full"), ("nadam", "full"), ("nadam", "sketch")]
)
def test_a_gradient_of_rounding_alone_passes_clean_and_a_bug_fails(
    cli, tmp_path, optimizer, record
):
    _record(tmp_path / "base", 1, optimizer, seed=0, record=record)
    _record(tmp_path / "merged", 4, optimizer, seed=0, record=record)
    report = tmp_path / "r.json"
    clean = cli(
        "compare", tmp_path / "base", tmp_path / "merged", "--reference", "none", "--json", report
    )
    assert clean.code == 0, clean.out
    notes = json.loads(report.read_text())["notes"]
    assert any("rounding floor" in n and "0.bias" in n for n in notes), notes
    _record(tmp_path / "bug", 4, optimizer, seed=0, bug=True, record=record)
    broken = cli("compare", tmp_path / "base", tmp_path / "bug", "--reference", "none")
    assert broken.code == 1, broken.out


def test_the_floor_is_a_small_share_of_a_typical_gradient():
    """8 units of float32 rounding of the model's RMS gradient element: 1e-6 of a typical
    tensor's norm, a hundredth of grad_rtol there; never more than a sixteenth of it."""
    import dataclasses

    from gradalign.judge.rounding import gradient_atol
    from gradalign.judge.tolerances import DEFAULTS

    tol = dataclasses.replace(DEFAULTS["float32"], weight_atol=0.0)
    extra = gradient_atol(tol, "float32", sumsq=1e4, elements=10**4)  # RMS element 1
    assert extra == pytest.approx(8 * 2.0**-23)
    assert gradient_atol(DEFAULTS["float32"], "float32", float("nan"), 10) == 1e-9
    # at most a sixteenth of grad_rtol; none in 16 bits, whose grad_rtol is coarse already (a
    # floor of the model's scale let a bfloat16 token-normalization bug through)
    coarse = dataclasses.replace(tol, grad_rtol=1e-6)
    assert gradient_atol(coarse, "float32", 1e4, 10**4) == pytest.approx(1e-6 / 16)
    bf16 = dataclasses.replace(DEFAULTS["bfloat16"], weight_atol=0.0)
    assert gradient_atol(bf16, "bfloat16", 1e4, 10**4) == 0.0
