"""Bookkeeping scalars at the precision they were recorded in, and diagnoses that claim only
what the runs show (no data-order from a loss gap that a step inside the window explains)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradalign import api
from gradalign.judge.bookkeeping import distinct, recorded_dtype, same_scalar
from gradalign.judge.compare import compare
from gradalign.record.faults import FAULTS
from gradalign.record.loop import train
from gradalign.runs.portable import write_run
from gradalign.runs.reader import read_run_dir

from .conftest import SMALL


def test_recorded_dtype():
    assert recorded_dtype(np.array([0.1, 0.2], dtype=np.float32)) == "float32"
    widened = np.array([0.1, 0.05], dtype=np.float32).astype(np.float64)
    assert recorded_dtype(widened) == "float32"  # a float32 written as F64: still float32
    assert recorded_dtype(np.array([0.1, np.nan])) == "float64"
    assert recorded_dtype(np.array([np.nan])) == "float64"


def test_same_scalar_at_the_coarser_precision():
    lr32 = float(np.float32(0.1))  # 0.10000000149011612
    assert same_scalar(0.1, lr32, "float64", "float32")
    assert not same_scalar(0.1, lr32)  # both float64: they differ
    assert not same_scalar(0.1000001, lr32, "float64", "float32")
    assert same_scalar(float("nan"), float("nan")) and not same_scalar(0.1, float("nan"))


def test_distinct_shows_a_real_difference():
    assert distinct(0.1, float(np.float32(0.1))) == ("0.1", "0.100000001")
    assert distinct(0.1000001, 0.1) == ("0.1000001", "0.1")
    assert distinct(0.5, 0.25) == ("0.5", "0.25")


@pytest.fixture(scope="module")
def runs(small_runs):
    return read_run_dir(small_runs["baseline"]), read_run_dir(small_runs["merged"])


def test_a_python_float_lr_equals_the_same_lr_kept_in_float32(runs):
    """gradalign 0.1 failed this pair with lr-schedule: "0.1 in merged, 0.1 in baseline"."""
    base, merged = runs
    assert merged.lr is not None and merged.lr[0] == 0.1
    float32_base = dataclasses.replace(base, lr=base.lr.astype(np.float32))
    result = compare(float32_base, merged)
    assert result.verdict == "pass", [(c.name, c.detail) for c in result.checks]
    assert {c.name: c.status for c in result.checks}["learning rate"] == "pass"


def test_a_real_lr_difference_is_shown_with_the_digits_that_differ(runs):
    base, merged = runs
    float32_base = dataclasses.replace(base, lr=base.lr.astype(np.float32))
    other = dataclasses.replace(merged, lr=merged.lr + 1e-7)
    result = compare(float32_base, other)
    assert result.verdict == "fail"
    lr = next(d for d in result.diagnosis if d.code == "lr-schedule")
    assert "0.1000001 in merged, 0.1 in baseline" in lr.message


def test_a_step_inside_window_0_is_not_also_called_data_order(runs, tmp_path):
    """Without sample digests, a loss gap at update 0 hints at other samples only if the weights
    provably did not change inside window 0 (gradalign 0.1 named data-order here too)."""
    base, _ = runs
    stepping = read_run_dir(train(SMALL, tmp_path / "s", fault=FAULTS["step-every-micro"]))
    result = compare(
        dataclasses.replace(base, micro_data=None), dataclasses.replace(stepping, micro_data=None)
    )
    assert [d.code for d in result.diagnosis if d.severity == "error"] == ["step-in-window"]
    assert "changed at micro-step 0 (position 1 of 4), before micro-step 1" in (
        result.diagnosis[0].message
    )


def test_a_schedule_stepped_per_micro_step_is_found_across_precisions():
    from gradalign.judge.signatures.learning_rate import schedule_offset

    schedule = [0.1 / (1 + 0.3 * t) for t in range(40)]
    base32 = np.array(schedule[:8], dtype=np.float32)  # a framework keeping its lr in float32
    merged = np.array(schedule[0:32:4][:8])  # a Python-float lr, stepped K=4 times per update
    assert schedule_offset(base32, merged, (4,)) == (4, 0)
    assert schedule_offset(base32, np.array(schedule[:8]), (4,)) is None
    ahead = np.array(schedule[3:35:4][:8])  # K-1 steps inside the window before the first step
    assert schedule_offset(base32, ahead, (4,)) == (4, 3)
    # two updates show the pace: K's, where the judge asks (it always names K); a pace nothing
    # suggests needs three (two lrs of a step schedule fit one by chance)
    assert schedule_offset(base32, merged) is None


def test_a_forgotten_k_for_a_log_is_named(cli):
    from .conftest import FIXTURES

    logs = FIXTURES / "paddle"
    result = cli("compare", logs / "run.log", logs / "run_grad.log")
    assert result.code == 2 and "give --accum-steps 4" in result.err


@pytest.mark.parametrize(("merged_lr", "named"), [(6.5e-3, False), (4e-2, True)])
def test_one_updates_lr_ratio_names_lr_scaled_only_at_a_scaling_rule(tmp_path, merged_lr, named):
    """A run judged over one update (its windows stop lining up after it) whose learning rate
    is 0.65 times the baseline's: one ratio is no constant multiple (a scheduler stepped at
    another pace reads alike), so `lr-scaled` is not named; 4 = K times is a scaling rule."""
    w0, g = np.ones((3, 2), np.float32), np.full((3, 2), 0.5, np.float32)

    def run(path, k: int, lr: float):
        return read_run_dir(
            write_run(
                path,
                accum_steps=k,
                micro_losses=[1.0] * k,
                init_weights={"w": w0},
                update_weights=[{"w": w0 - np.float32(lr) * g}],
                grads=[{"w": g}],
                lr=[lr],
            )
        )

    c = compare(run(tmp_path / "b", 1, 1e-2), run(tmp_path / "m", 4, merged_lr))
    assert c.verdict == "fail"
    assert ("lr-scaled" in [d.code for d in c.diagnosis]) is named


def test_a_schedule_one_update_behind_is_found():
    from gradalign.judge.signatures.learning_rate import schedule_offset

    schedule = np.array([0.1 * min(1.0, (t + 1) / 4) for t in range(8)])
    assert schedule_offset(schedule, np.concatenate([[0.0], schedule[:-1]])) == (1, -1)
    assert schedule_offset(schedule, schedule) is None


def test_logs_printing_the_lr_at_other_points_say_so(tmp_path):
    """The baseline prints the lr after scheduler.step(), the merged log before it (the print
    moved into the window's `if`): the same schedule one update apart, named as such, with a
    fix about the print, not only the scheduler."""
    lrs = [0.1 * min(1.0, (t + 1) / 4) for t in range(9)]
    losses = [2.0 * 0.9**t for t in range(8)]
    base, merged = tmp_path / "base.log", tmp_path / "merged.log"
    base.write_text(
        "".join(f"step {t} loss {losses[t]:.6f} lr {lrs[t + 1]:.6e}\n" for t in range(8))
    )
    merged.write_text("".join(f"step {t} loss {losses[t]:.6f} lr {lrs[t]:.6e}\n" for t in range(8)))
    result = api.compare(base, merged, accum_steps=1)
    lr = next(d for d in result.diagnosis if d.code == "lr-schedule")
    assert lr.evidence["schedule_offset"] == -1
    assert "print the lr at the same point of both loops" in lr.fix
    assert "different points of the loop" in lr.message


@pytest.mark.parametrize(
    ("late", "code"), [(4.0, "lr-scaled"), (2.0, "lr-scaled"), (0.65, "lr-schedule")]
)
def test_an_lr_rescaled_from_a_later_update_is_lr_scaled_at_a_scaling_rule(tmp_path, late, code):
    """Equal learning rates for three updates, then the merged one `late` times the baseline's
    (a rule applied when a run was resumed): K=4 and sqrt(K)=2 are scaling rules, named
    `lr-scaled` from update 3; 0.65 is in no rule, a schedule's doing (`lr-schedule`)."""
    w0, g = np.ones((3, 2), np.float32), np.full((3, 2), 0.5, np.float32)
    base_lrs = [1e-2 * (1 - 0.1 * u) for u in range(6)]

    def run(path, k: int, lrs: list[float]):
        weights, w = [], w0
        for lr in lrs:
            w = w - np.float32(lr) * g
            weights.append({"w": w})
        return read_run_dir(
            write_run(
                path,
                accum_steps=k,
                micro_losses=[1.0] * (k * len(lrs)),
                init_weights={"w": w0},
                update_weights=weights,
                grads=[{"w": g}] * len(lrs),
                lr=lrs,
            )
        )

    merged_lrs = [lr * (late if u >= 3 else 1.0) for u, lr in enumerate(base_lrs)]
    c = compare(run(tmp_path / "b", 1, base_lrs), run(tmp_path / "m", 4, merged_lrs))
    assert c.verdict == "fail" and c.diagnosis[0].code == code, c.diagnosis
    if code == "lr-scaled":
        assert c.diagnosis[0].evidence["first_update"] == 3
        assert "from update 3 on" in c.diagnosis[0].message
