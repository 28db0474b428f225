"""A layer frozen for the first updates and then trained (`requires_grad_(True)`): unfrozen at
the same update in both runs it passes; unfrozen at a count of micro-steps (update 1 instead of
3 at K=4), or never in the merged run, it is named `lr-schedule` with the tensors and the update
each run trained them from (was `unexplained`). A layer trained and then frozen
(`requires_grad_(False)`) at a count of micro-steps, inside a window: the same code, from the
micro-step its gradient was last written (was `zero-grad-in-window`, "cleared inside the
window")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

UPDATES, BATCH, UNFREEZE, FREEZE = 5, 32, 3, 2


def freeze_loop(out, k: int, unfreeze_at: str = "update", float64: bool = False, freeze=False):
    """An MLP whose first layer trains from update UNFREEZE on, counted in updates, in
    micro-steps after the first window (`micro`: from micro-step UNFREEZE + 1, update 1 at K=4)
    or `never` (or from the first, `always`); with `freeze`, trains until FREEZE, counted alike
    (`micro`: until micro-step FREEZE + 1, inside window 0 at K=4)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 3))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    if float64:
        model, x = model.double(), x.double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    n, micro = BATCH // k, 0
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                count = {"update": u, "micro": micro - 1, "never": -1, "always": UNFREEZE}[
                    unfreeze_at
                ]
                for p in model[0].parameters():
                    p.requires_grad_(0 <= count < FREEZE if freeze else count >= UNFREEZE)
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
                micro += 1
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("freeze")
    return {
        "base": freeze_loop(root / "base", 1),
        "ref": freeze_loop(root / "ref", 1, float64=True),
        **{at: freeze_loop(root / at, 4, at) for at in ("update", "micro", "never")},
        "freeze-base": freeze_loop(root / "freeze-base", 1, freeze=True),
        **{
            f"freeze-{at}": freeze_loop(root / f"freeze-{at}", 4, at, freeze=True)
            for at in ("update", "micro")
        },
    }


@pytest.mark.parametrize("reference", [True, False])
def test_unfrozen_at_the_same_update_passes(runs, reference):
    ref = runs["ref"] if reference else None
    assert compare(runs["base"], runs["update"], reference=ref).verdict == "pass"


@pytest.mark.parametrize("reference", [True, False])
@pytest.mark.parametrize(("at", "merged_from"), [("micro", 1), ("never", None)])
def test_unfrozen_at_another_update_is_named(runs, reference, at, merged_from):
    c = compare(runs["base"], runs[at], reference=runs["ref"] if reference else None)
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "lr-schedule", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["tensors"] == ["0.weight", "0.bias"]
    assert first.evidence["baseline_from"] == UNFREEZE
    assert first.evidence["merged_from"] == merged_from
    assert "unfrozen (requires_grad)" in first.message


def test_frozen_inside_a_window_is_named_from_its_last_written_micro_step(runs):
    assert compare(runs["freeze-base"], runs["freeze-update"]).verdict == "pass"
    c = compare(runs["freeze-base"], runs["freeze-micro"])
    first = c.diagnosis[0]
    assert first.code == "lr-schedule", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["tensors"] == ["0.weight", "0.bias"]
    assert first.evidence["first_update"] == 0 and first.evidence["last_written_micro_step"] == 2
    assert "frozen (requires_grad_(False)) inside the window" in first.message


@pytest.mark.parametrize("reference", [True, False])
def test_a_layer_frozen_in_one_run_only_is_named_from_the_first_update(tmp_path, reference):
    """Frozen throughout the baseline and trained from update 0 in the merged run (its
    `requires_grad_(False)` forgotten): the first update fails in those tensors alone, exactly
    zero in one run; named `lr-schedule`, frozen in one run only (was `cross-sample-loss`)."""
    base = freeze_loop(tmp_path / "base", 1, "never")
    merged = freeze_loop(tmp_path / "merged", 4, "always")
    ref = freeze_loop(tmp_path / "ref", 1, "never", float64=True) if reference else None
    c = compare(base, merged, reference=ref)
    assert c.verdict == "fail"
    first = c.diagnosis[0]
    assert first.code == "lr-schedule", [(d.code, d.message) for d in c.diagnosis]
    assert first.evidence["first_update"] == 0
    assert (first.evidence["baseline_from"], first.evidence["merged_from"]) == (None, 0)
    assert set(first.evidence["tensors"]) == {"0.weight", "0.bias"}
    assert "in one run only" in first.message
    assert (
        compare(base, freeze_loop(tmp_path / "same", 4, "never"), reference=ref).verdict == "pass"
    )


def test_a_golden_files_diff_does_not_say_whether_a_gradient_is_zero():
    """A golden keeps the baseline's norm, not the elementwise difference: a baseline gradient of
    0 beside an unknown merged one tells nothing of a freeze (the signature needs both)."""
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.signatures.frozen import _zero

    nan = float("nan")
    from_summaries = TensorDiff("w", nan, nan, nan, nan, 1.0, 0.5, norm=0.0, size=4)
    from_values = TensorDiff("w", 1.0, nan, nan, nan, 1.0, 0.5, norm=0.0, size=4)
    assert _zero(from_summaries) is None
    assert _zero(from_values) == (True, False)
