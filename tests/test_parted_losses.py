"""Losses a choice made per input moved: now and then inside a divergence the judge followed, a
parted run's choices, not a loss recorded otherwise (judge/parted_losses.py: synthetic update
results, and model zoo run 295652 with a loss recorded otherwise from its first such update);
at once with the gradients where a route starts the divergence (judge/kink_divergence.py: model
zoo run 296273)."""

from __future__ import annotations

import pytest

from gradalign.judge.parted_losses import excuse_parted_losses
from gradalign.judge.results import UpdateResult

from .zoo_runs import _compare, _followed, _one_thread_judge


def _results(offs: dict[int, float], share: float = 0.05, followed_from: int = 4) -> list:
    """Ten updates of losses near 3.47 allowed 2e-6 each, off by `offs` (update: error) and
    within it elsewhere; updates from `followed_from` inside a followed divergence."""
    results = []
    for u in range(10):
        error = offs.get(u, 1e-7)
        r = UpdateResult(u, 3.47, 3.47 + error, error, error, 2e-6)
        r.followed_share = share if u >= followed_from else 0.0
        results.append(r)
    return results


def test_losses_off_now_and_then_inside_a_followed_divergence_are_excused():
    results = _results({6: 4e-6, 8: 1.8e-5})
    notes = excuse_parted_losses(results)
    assert all(r.loss_ok for r in results)
    assert len(notes) == 1 and notes[0].startswith("updates 6, 8: the loss alone stood off")
    assert "9 times what the weights explain" in notes[0]


@pytest.mark.parametrize(
    ("offs", "share", "why"),
    [
        ({6: 4e-6, 7: 4e-6, 8: 4e-6, 9: 4e-6}, 0.05, "off at every update from its first"),
        ({9: 4e-6}, 0.05, "off at the last update only: nothing after it to read"),
        ({2: 4e-6, 6: 4e-6}, 0.05, "off where the runs shared their path"),
        ({6: 0.5}, 0.05, "off by more than the share followed of the loss"),
        ({6: 4e-6}, 0.0, "no divergence followed"),
    ],
)
def test_losses_off_otherwise_still_fail(offs, share, why):
    results = _results(offs, share)
    assert excuse_parted_losses(results) == [], why
    assert [r.update for r in results if not r.loss_ok] == sorted(offs), why


def test_losses_allowed_nothing_are_excused_without_a_ratio_to_divide_by():
    results = _results({6: 4e-6, 8: 1.8e-5})
    for r in results:
        r.loss_allowed = 0.0 if r.update in (6, 8) else r.loss_allowed
    notes = excuse_parted_losses(results)
    assert "up to inf times what the weights explain" in notes[0]
    assert results[6].loss_ok and results[8].loss_ok


def test_a_run_failing_beside_its_losses_is_left_as_it_is():
    results = _results({6: 4e-6})
    results[3].problems.append(("optimizer_steps", "two steps in window 3"))
    assert excuse_parted_losses(results) == [] and not results[6].loss_ok


def test_a_route_s_loss_inside_a_kink_s_divergence_passes_and_a_recorded_loss_still_fails(
    tmp_path,
):
    """Model zoo run 295652: transformers' Qwen2-MoE under RMSprop, K=4 over micro-batches of
    unequal sizes, a clip and a schedule, 30 updates. A kink at update 22 is followed; the loss
    alone stood 1.33 and 5.1 times what the weights explain at updates 26 and 29, 27 and 28
    within it, every tensor within the divergence: named `loss-averaging`. It passes now,
    noted (else this machine's rounding took another path: skipped). The same loop recording
    its losses scaled from update 26 on still fails, `loss-averaging`. One thread."""
    pytest.importorskip("transformers")
    loop = {"uneven": True, "schedule": True, "clip": 1.0, "updates": 30}
    root = tmp_path / "clean"
    _one_thread_judge(root, "hf-qwen2moe", "rmsprop", 4, 295652, None, **loop)
    c = _compare(root)
    note = next((n for n in c.notes if "the loss alone stood off" in n), None)
    if note is None:
        pytest.skip(f"this machine's rounding took another path here ({c.first_divergence})")
    assert c.verdict == "pass", [d.code for d in c.diagnosis]
    bug = tmp_path / "bug"
    _one_thread_judge(
        bug, "hf-qwen2moe", "rmsprop", 4, 295652, "log-scaled-loss", bug_from=26, **loop
    )
    buggy = _compare(bug)
    assert buggy.verdict == "fail" and buggy.diagnosis[0].code == "loss-averaging"


def test_a_route_that_moves_the_loss_at_once_is_followed_as_a_choice(tmp_path, monkeypatch):
    """Model zoo run 296273: transformers' Mixtral at width 2 under Adamax, K=8 over
    micro-batches of unequal sizes, a clip and a schedule, 30 updates. Every check of update 14
    passed; at update 15 the loss stood 1.08 times its allowed error off and layer 0's query
    weight 1.31 times, each failing gradient one input's share: a token's route, which moves
    the loss by a jump where a kink moves it smoothly. It was not followed (a loss that failed
    ruled a divergence's start out) and failed `unexplained`; followed as a choice now, it
    passes, noted (else this machine's rounding took another path: skipped). A micro-batch
    left without its backward from update 15 on is still named. One thread."""
    pytest.importorskip("transformers")
    loop = {"uneven": True, "schedule": True, "clip": 1.0, "updates": 30, "width": 2}
    root = tmp_path / "clean"
    _one_thread_judge(root, "hf-mixtral", "adamax", 8, 296273, None, **loop)
    _followed(
        root,
        monkeypatch,
        "gradalign.judge.kink_divergence.choice",
        15,
        r"update 15: the gradient of .* every earlier update within noise and the loss .* off",
        lambda *a: None,
    )
    bug = tmp_path / "bug"
    _one_thread_judge(
        bug, "hf-mixtral", "adamax", 8, 296273, "skip-last-backward", bug_from=15, **loop
    )
    buggy = _compare(bug)
    assert buggy.verdict == "fail" and buggy.diagnosis[0].code == "micro-batch-missing"
