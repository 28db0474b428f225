"""A hand-written accumulation loop (not the built-in trainer) records through `Recorder`, and the
judge treats its runs exactly like the built-in ones: the clean loop passes within its noise, and
each bug such a loop may have is named by its own code, beside clipping (by norm or by value),
dropout, a 16-bit running sum, float16 autocast or a learning rate that follows the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .user_loop import user_loop

BUGS = {  # the bug a user's loop may have -> the diagnosis code the judge must name
    "no-loss-scale": "loss-scale",
    "double-loss-scale": "loss-scale",
    "loss-plus-scaled": "loss-scale",
    "zero-grad-every-micro": "zero-grad-in-window",
    "step-every-micro": "step-in-window",
    "step-every-micro-budget": "step-in-window",  # was window-bookkeeping, the early end first
    "scheduler-every-micro": "lr-schedule",
    "clip-every-micro": "clip-per-micro",
    "clip-value-every-micro": "clip-per-micro",
    "clip-value-over-k": "clip-threshold",
    "data-order": "data-order",
    "dropout-reseed": "dropout-rng",
    "bf16-accum": "grad-accum-dtype",
    "no-zero-grad": "grad-not-cleared",
    "penalty-every-micro": "penalty-not-scaled",
    "penalty-over-k-twice": "penalty-not-scaled",  # counted too little: was cross-sample-loss
    "scaler-every-micro": "scaler-per-micro",
    "skip-last-backward": "micro-batch-missing",
    "edit-weights-every-micro": "weights-changed-in-window",
    "lr-times-k": "lr-scaled",
    "log-scaled-loss": "loss-averaging",
    "double-loss-scale-logged": "loss-scale",
    "forget-update": "window-bookkeeping",
}


def setup_for(bug: str | None) -> dict:
    """The setup in which a bug can show: a schedule, clipping that engages, dropout."""
    return {
        "scheduler-every-micro": {"schedule": True},
        "clip-every-micro": {"clip": 0.05},
        "clip-value-every-micro": {"clip_value": 0.01},
        "clip-value-over-k": {"clip_value": 0.01},
        # divided by K twice, and the loss given to backward recorded (as accelerate does): a
        # clip under both runs' norms makes the steps agree within float16's noise (in float32,
        # clip_grad_norm_'s 1e-6 beside a 16x smaller norm tells them apart)
        "double-loss-scale-logged": {"clip": 0.02, "fp16": True},
        "dropout-reseed": {"dropout": 0.2},
        "penalty-every-micro": {"penalty": 1e-3},
        "penalty-over-k-twice": {"penalty": 1e-3},
        "scaler-every-micro": {"fp16": True, "optimizer": "adamw"},
    }.get(bug or "", {})


def judged(tmp_path, bug: str | None, **setup):
    base = user_loop(tmp_path / "b", 1, **setup)
    ref = user_loop(tmp_path / "r", 1, dtype=torch.float64, **setup)
    merged = user_loop(tmp_path / "m", 4, bug=bug, **setup)
    return compare(base, merged, reference=ref)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize(
    "setup",
    [
        *({}, {"schedule": True, "clip": 0.05}, {"clip_value": 0.01}, {"dropout": 0.2}),
        *({"penalty": 1e-3}, {"fp16": True}),
    ],
)
def test_clean_user_loop_passes_within_its_noise(tmp_path, optimizer, setup):
    result = judged(tmp_path, None, optimizer=optimizer, **setup)
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert {c.name: c.status for c in result.checks}["gradients"] == "pass"
    close = 1e-2 if setup.get("fp16") else 1e-5  # float16 autocast's own gradient noise
    assert all(abs(r.grad_ratio - 1) < close for r in result.results)
    assert [d.severity for d in result.diagnosis].count("error") == 0
    assert result.diagnosis[0].code == "within-noise"


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_user_loop_bug_is_named(tmp_path, bug):
    setup = setup_for(bug)
    optimizer = setup.pop("optimizer", "sgd")
    result = judged(tmp_path, bug, optimizer=optimizer, **setup)
    assert result.verdict == "fail"
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert codes[:1] == [BUGS[bug]], [(d.code, d.message) for d in result.diagnosis]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_loss_scale_under_adam_says_why_the_steps_still_differ(tmp_path, optimizer):
    """A loop's author may leave the loss undivided "because Adam divides the scale out": it
    does, but for eps (and a clip threshold, an L2 decay in the gradient): said under Adam's
    family only."""
    result = judged(tmp_path, "no-loss-scale", optimizer=optimizer)
    first = result.diagnosis[0]
    assert first.code == "loss-scale"
    said = "AdamW divides a gradient's scale out of its step except for eps" in first.message
    assert said == (optimizer == "adamw"), first.message
    assert "weighs 0.25 times as much" in first.message or optimizer == "sgd"


def test_losses_recorded_off_by_a_ratio_not_k_are_loss_averaging_alone(tmp_path):
    """The same training, its losses recorded 1.003 times as large: weights and gradients
    agree, so no training difference is named beside `loss-averaging` (`cross-sample-loss`
    was, its own evidence a gradient cosine of 1)."""
    result = judged(tmp_path, "log-loss-off")
    status = {c.name: c.status for c in result.checks}
    assert (status["losses"], status["weights"], status["gradients"]) == ("fail", "pass", "pass")
    assert [d.code for d in result.diagnosis] == ["loss-averaging"], result.diagnosis


def test_a_bug_from_update_0_is_named_before_other_samples_from_a_later_window(tmp_path):
    """Losses not divided by K, and from update 2 the windows of updates 0 and 1 again (a
    sampler without set_epoch): `data-order` (first: update 2) was named alone, though the
    gradient fails from update 0, where the windows held their baseline batches."""
    result = judged(tmp_path, "late-repeat-no-loss-scale")
    assert result.first_divergence["update"] == 0
    assert errors_of(result) == ["loss-scale", "data-order"], result.diagnosis
    assert result.diagnosis[1].evidence["first_update"] == 2
    # the windows of updates 2, 3 hold the batches of 0, 1: set_epoch is said
    assert result.diagnosis[1].evidence["batches_of_earlier_updates"] == {2: 0, 3: 1, 4: 0}
    assert "without set_epoch(epoch)" in result.diagnosis[1].message
    shuffled = judged(tmp_path / "shuffled", "data-order").diagnosis[0]  # other mixtures
    assert shuffled.code == "data-order" and "set_epoch" not in shuffled.message


def test_a_loss_not_divided_by_k_beside_a_16_bit_buffer_is_named_with_it(tmp_path):
    """The gradient on bfloat16's grid and 4 times too large: `grad-accum-dtype` was named
    alone, its 'gradient 3 off' far beyond any rounding (so was a DDP fp16 hook beside it)."""
    result = judged(tmp_path, "bf16-accum-no-loss-scale")
    assert errors_of(result) == ["loss-scale", "grad-accum-dtype"], result.diagnosis
    alone = judged(tmp_path / "alone", "bf16-accum")
    assert errors_of(alone) == ["grad-accum-dtype"], alone.diagnosis


def errors_of(result) -> list[str]:
    return [d.code for d in result.diagnosis if d.severity == "error"]


@pytest.mark.parametrize("bug", ["no-loss-scale", "clip-every-micro"])
def test_a_gradient_bug_in_a_model_with_dropout_is_named_by_its_own_code(tmp_path, bug):
    """Dropout whose masks match: the loss at update 0 agrees, so the masks did not differ,
    and the gradient's own shape names the bug (not `dropout-rng`)."""
    setup = {**setup_for(bug), "dropout": 0.2}
    result = judged(tmp_path, bug, **setup)
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert result.results[0].loss_ok and codes[:1] == [BUGS[bug]], codes


@pytest.mark.parametrize(("bug", "expected"), [("no-loss-scale", 4), ("double-loss-scale", 0.25)])
def test_a_loss_scale_where_one_run_alone_clips_is_read_before_the_clip(tmp_path, bug, expected):
    """The baseline's norms are 0.32-0.41: a clip at 0.5 engages only on the gradient K times
    too large, a clip at 0.2 only on the correct one. The gradients stepped with are then some
    other multiple; the norms before clipping keep K (or 1/K)."""
    clip = 0.5 if expected > 1 else 0.2
    result = judged(tmp_path, bug, clip=clip)
    found = result.diagnosis[0]
    assert found.code == "loss-scale", [(d.code, d.message) for d in result.diagnosis]
    assert found.evidence["expected_ratio"] == expected
    assert found.evidence["pre_clip_ratio"] == pytest.approx(expected, rel=1e-3)
    assert abs(found.evidence["grad_ratio"] / expected - 1) > 0.05
    assert "before clipping" in found.message


@pytest.mark.parametrize("clip", [0.5, 0.2])
def test_gradients_never_cleared_under_a_clip_are_named(tmp_path, clip):
    """zero_grad() forgotten in a loop that clips (the baseline's norms 0.32-0.41): at update 1
    the merged run steps with c·(carried + g), the baseline with c'·g, and the difference is
    neither a multiple of the carried gradient nor of the baseline's: at 0.5 the merged run
    alone clips, at 0.2 both do, each by its own factor. Both were `unexplained` (`--clip 1.0`
    in the model zoo: 14 of 30 runs)."""
    result = judged(tmp_path, "no-zero-grad", clip=clip)
    found = result.diagnosis[0]
    assert found.code == "grad-not-cleared", [(d.code, d.message) for d in result.diagnosis]
    assert "a clip scaled each run's gradient" in found.message
    assert found.evidence["carried_fraction"] > 0 and found.evidence["explained_share"] > 0.95


def test_a_clip_by_value_inside_the_window_is_counted_and_named(tmp_path):
    """clip_grad_value_ is seen like clip_grad_norm_: its calls are counted and its value kept.
    Applied to each partial sum, with elements at the clip value, it is `clip-per-micro`."""
    result = judged(tmp_path, "clip-value-every-micro", clip_value=0.01)
    base, merged = read_run_dir(tmp_path / "b"), read_run_dir(tmp_path / "m")
    assert list(base.clip_calls) == [1] * 5 and list(merged.clip_calls) == [5] * 5
    assert list(merged.clip_value) == [0.01] * 5 and base.grad_norm_pre_clip is None
    found = result.diagnosis[0]
    assert found.code == "clip-per-micro" and "clip_grad_value_ called 5 times" in found.message
    assert found.evidence["elements_at_clip_value"]["baseline"] > 0


def test_a_clip_by_value_that_never_engages_is_named_all_the_same(tmp_path):
    """Clipping each partial sum at a value no element reaches changed nothing in this run, but
    clips partial sums as soon as an element reaches it: named by the counts, saying none
    engaged (it passed until the clip calls per window were checked)."""
    base = user_loop(tmp_path / "b", 1, clip_value=10.0)
    merged = user_loop(tmp_path / "m", 4, bug="clip-value-every-micro", clip_value=10.0)
    assert list(merged.clip_calls) == [5] * 5
    c = compare(base, merged)
    assert all(d.ok for r in c.results for d in (*r.weights, *r.grads))
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "clip-per-micro"
    assert "clip_grad_value_ 5 times in window 0" in found.message
    assert "No clip engaged" in found.message


def test_a_loss_scale_a_clip_hides_is_named_alone(tmp_path):
    """The loss K times too large under a clip that engages in both runs: the stepped gradients
    nearly agree, the norms before clipping are K apart. `loss-scale` alone: what is left once
    K is divided out is within the gradient's noise, so no second cause is named."""
    result = judged(tmp_path, "no-loss-scale", clip=0.05)
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert codes == ["loss-scale"], [(d.code, d.message) for d in result.diagnosis]
    assert "before clipping" in result.diagnosis[0].message


def test_user_loop_missing_loss_scale_fails_at_update_0(tmp_path):
    result = compare(
        user_loop(tmp_path / "b", 1), user_loop(tmp_path / "m", 4, bug="no-loss-scale")
    )
    assert result.verdict == "fail"
    assert result.first_divergence == {"update": 0, "parameter": "0.weight", "in": "gradient"}
    assert result.results[0].grad_ratio == pytest.approx(4.0, rel=1e-5)
    assert result.diagnosis[0].evidence["expected_ratio"] == 4


def test_user_loop_stepping_inside_the_window_fails(tmp_path):
    base = user_loop(tmp_path / "b", 1)
    merged = user_loop(tmp_path / "m", 4, bug="step-every-micro")
    result = compare(base, merged)
    checks = {c.name: c for c in result.checks}
    assert checks["no weight change inside a window"].status == "fail"
    # micro-step 1 computed with other weights: the step was taken at micro-step 0
    detail = checks["no weight change inside a window"].detail
    assert "changed at micro-step 0 (position 1 of 4), before micro-step 1" in detail
    assert checks["optimizer steps"].status == "fail"
    assert "4 optimizer step(s) in merged, 1 in baseline" in checks["optimizer steps"].detail
    assert result.first_divergence["update"] == 0


def test_a_step_budget_spent_inside_the_windows_is_named_as_the_steps_not_the_early_end(
    tmp_path,
):
    """A loop stepping at every micro-step that stops at a count of optimizer steps (Lightning's
    max_steps under manual optimization) ends inside its second window: the windows' early end
    was named first (`window-bookkeeping`), its cause second; now the steps alone, saying so."""
    result = judged(tmp_path, "step-every-micro-budget")
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert codes == ["step-in-window"], [(d.code, d.message) for d in result.diagnosis]
    message = result.diagnosis[0].message
    assert "ended after 1 update(s) against the baseline's 5" in message and "max_steps" in message


@pytest.mark.parametrize("bug", ["zero-grad-every-micro", "no-loss-scale"])
def test_a_learning_rate_that_follows_the_divergence_does_not_hide_its_cause(tmp_path, bug):
    """ReduceLROnPlateau stepped on each window's loss: a bug that diverges the loss at update 0
    makes the merged run cut its learning rate at other updates. That difference came after the
    gradients failed and fits no schedule, so it is a consequence: the bug is named, not
    `lr-schedule` (it was, and alone). The clean loop passes with the same scheduler."""
    setup = {"updates": 10, "plateau": True}
    base = user_loop(tmp_path / "base", 1, **setup)
    assert compare(base, user_loop(tmp_path / "clean", 4, **setup)).verdict == "pass"
    merged = user_loop(tmp_path / "merged", 4, bug=bug, **setup)
    assert not np.array_equal(base.lr, merged.lr)  # the bug's loss made it cut the lr
    codes = [d.code for d in compare(base, merged).diagnosis]
    assert codes[0] == BUGS[bug] and "lr-schedule" not in codes, codes


@pytest.mark.parametrize("bug", ["no-loss-scale", "double-loss-scale"])
def test_a_loss_scale_clip_grad_value_turned_is_read_below_the_clip_value(tmp_path, bug):
    """clip_grad_value_ at 0.02 clips most of a gradient 4 times too large to the value, so the
    gradient stepped with points elsewhere (cosine 0.90) and was `cross-sample-loss`. The
    elements both runs left below the value hold the scale whole: named `loss-scale`."""
    setup = {"clip_value": 0.02, "optimizer": "adamw"}
    c = compare(
        user_loop(tmp_path / "b", 1, **setup), user_loop(tmp_path / "m", 4, bug=bug, **setup)
    )
    assert c.results[0].grad_cosine < 0.95
    (found,) = [d for d in c.diagnosis if d.severity == "error"][:1]
    assert found.code == "loss-scale" and "below the clip value" in found.message
    assert found.evidence["below_clip_value"] is True


@pytest.mark.parametrize("clipping", ["baseline", "merged"])
def test_a_clip_by_value_in_one_run_only_is_named_clip_threshold(tmp_path, clipping):
    """One run clips by value at 0.01 once per update, the other not at all: the elements at
    the clip value in one and beyond it in the other say so. They were `cross-sample-loss`
    (the baseline alone) and `zero-grad-in-window` (the merged run alone)."""
    base = user_loop(tmp_path / "b", 1, clip_value=0.01 if clipping == "baseline" else None)
    merged = user_loop(tmp_path / "m", 4, clip_value=0.01 if clipping == "merged" else None)
    c = compare(base, merged)
    found = c.diagnosis[0]
    assert c.verdict == "fail" and found.code == "clip-threshold", [
        (d.code, d.message) for d in c.diagnosis
    ]
    assert found.evidence["clip_value"] == {clipping: 0.01}
    assert found.evidence["elements_at_clip_value"] > 0
    assert found.evidence["elements_beyond_clip_value"] > 0


def test_a_gradient_k_times_too_small_names_a_summed_loss_too(tmp_path):
    """1/K times the baseline's gradient: a mean loss divided by K twice, or a summed loss
    (reduction='sum', the baseline's batch sum) divided by K at all. It said "divided by K=4
    twice" with the fix "divide by K once", which a loop that divided its summed loss once
    cannot follow."""
    found = judged(tmp_path, "double-loss-scale").diagnosis[0]
    assert found.code == "loss-scale" and "divided by K=4 once too often" in found.message
    assert "a summed loss (reduction='sum'" in found.fix and "K once" in found.fix
