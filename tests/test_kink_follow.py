"""A kink crossed in one run and not the other, on the least-squares runs (tests/least_squares.py):
the divergence it starts is followed at the kink's own size (judge/kink_divergence.py), raised by
a later, larger kink, with a reference or against the baseline, and jumps the baseline makes too
are excused; a jump that is not one unit's, one too large to leave a check, or a bug that starts
after the kink still fails."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.least_squares import _failing, merged, runs  # noqa: F401 (the fixture)


def _kink_then(bug_from: int | None = None, scale: float = 1.01, size: float = 1e-3):
    """One unit's row jumps at update 6 and the step is taken with it; from `bug_from` on, the
    gradient is `scale` times itself (a bug that starts after the kink)."""

    def spike(u, g):
        if u == 6:
            g[3] += size * np.abs(g).max()
        if bug_from is not None and u >= bug_from:
            g *= scale
        return g

    return spike


def test_a_divergence_that_starts_at_a_kink_is_followed(runs):  # noqa: F811
    result = merged(runs, "kink-fed", _kink_then(), feed=True)
    assert result.verdict == "pass", _failing(result)
    (note,) = [n for n in result.notes if "crossed its kink" in n]
    assert note.startswith("update 6: the gradient of w jumped") and "From update 6 on" in note
    stepped = result.results[6].weights[0]  # the step with the jump left the noise ...
    assert stepped.error > 100 * stepped.noise and stepped.ok  # ... and is followed


def test_without_the_follow_the_same_run_fails(runs, monkeypatch):  # noqa: F811
    monkeypatch.setattr("gradalign.judge.honest.follow_kink_divergence", lambda *a: [])
    result = merged(runs, "kink-unfollowed", _kink_then(), feed=True)
    assert result.verdict == "fail" and "weights" in _failing(result)


def test_a_bug_that_starts_after_the_kink_still_fails(runs):  # noqa: F811
    result = merged(runs, "kink-then-bug", _kink_then(bug_from=9), feed=True)
    assert result.verdict == "fail"
    assert result.results[8].ok and not result.results[9].ok


def test_a_spread_jump_fed_to_the_step_is_not_a_kink(runs):  # noqa: F811
    def spread(u, g):
        return g * (1 + 1e-3) if u == 6 else g

    result = merged(runs, "spread-fed", spread, feed=True)
    assert result.verdict == "fail"
    assert not any("crossed its kink" in n for n in result.notes)


def test_a_jump_too_large_to_leave_a_check_is_not_followed(runs):  # noqa: F811
    result = merged(runs, "kink-huge", _kink_then(size=30.0), feed=True)
    assert result.verdict == "fail"
    assert not any("crossed its kink" in n for n in result.notes)


def test_a_kink_at_a_sketched_update_says_what_it_needs(runs):  # noqa: F811
    """Without the update's full tensors (a sketched run) the kink cannot be told from a bug:
    the run still fails, and a note says what would tell them apart."""
    from types import SimpleNamespace

    from gradalign.judge.kink_divergence import follow_kink_divergence

    sketched = SimpleNamespace(grads=lambda u: None, weights=lambda u: None)
    for spike, said in ((_kink_then(), True), (_kink_then(size=30.0), False)):
        result = merged(runs, f"kink-sketched-{said}", spike, feed=True)
        for r in result.results:  # as the judge had them before following the kink
            for kind in (r.grads, r.weights):
                kind[:] = [dataclasses.replace(d, allowed=4 * d.noise) for d in kind]
        notes = follow_kink_divergence(result.results, sketched, sketched, 4.0)
        assert not result.results[6].ok and result.results[5].ok
        assert len(notes) == said  # a jump too large to be followed is no kink to explain
        assert not said or notes[0].startswith("update 6: gradients failed")
        assert not said or "--record full --updates 7" in notes[0]


def _rows_at(updates, rows=(3,), size: float = 1e-3):
    """The recorded gradient's `rows` jump at `updates` (a kink crossed, not fed to the step)."""

    def spike(u, g):
        if u in updates:
            for row in rows:
                g[row] += size * np.abs(g).max()
        return g

    return spike


def _base(runs, updates: tuple[int, ...], rows: tuple[int, ...] = (3, 10)):  # noqa: F811
    """A baseline whose own gradient jumps against the reference at `updates`, in `rows` (the
    noise there, pooled over 3 updates each side, then covers the merged run's jumps)."""
    from gradalign.runs.portable import write_run
    from tests.least_squares import train

    path = runs["root"] / f"base-jumps-{'-'.join(map(str, updates))}"
    if not path.exists():
        run = train(np.float32, spike=_rows_at(updates, rows))
        write_run(path, accum_steps=1, reference="../ref", **run)
    return path


def _merged_against(runs, base, name: str, spike):  # noqa: F811
    from gradalign import api
    from gradalign.runs.portable import write_run
    from tests.least_squares import train

    path = write_run(runs["root"] / name, accum_steps=4, **train(np.float32, k=4, spike=spike))
    return api.compare(base, path)


def test_jumps_the_baseline_makes_too_are_excused(runs):  # noqa: F811
    """Two jumps in a row in two rows each, more of its rows than an isolated jump may hold
    (1%), where the baseline jumped twice against the reference itself, in two rows as these."""
    base = _base(runs, (0, 11))
    result = _merged_against(runs, base, "jumps-like-base", _rows_at((5, 6), rows=(3, 10)))
    assert result.verdict == "pass", _failing(result)
    (note,) = [n for n in result.notes if "as the baseline's own gradients jumped" in n]
    assert note.startswith("updates 5, 6: the gradients of w") and "update(s) 0, 11" in note
    assert [result.results[u].grads[0].excused for u in (5, 6)] == ["jump", "jump"]


def test_without_the_baselines_own_jumps_they_fail(runs):  # noqa: F811
    result = _merged_against(runs, runs["base"], "jumps-alone", _rows_at((5, 6), rows=(3, 10)))
    assert result.verdict == "fail"


@pytest.mark.parametrize(
    "why, base, spike",
    [
        ("in more rows than the baseline's", (0, 11), _rows_at((5, 6), rows=(3, 10, 20))),
        ("spread", (0, 11), lambda u, g: g * (1 + 1e-3) if u in (5, 6) else g),
    ],
)
def test_jumps_unlike_the_baselines_fail(runs, why, base, spike):  # noqa: F811
    result = _merged_against(runs, _base(runs, base), f"jumps-{why.replace(' ', '-')}", spike)
    assert result.verdict == "fail", why
    assert not any("as the baseline's own gradients jumped" in n for n in result.notes)


def _unreferenced(runs, name: str, spike):  # noqa: F811
    """The merged run (the step taken with the recorded gradient) judged without a reference:
    the kink is measured against the baseline."""
    from gradalign import api
    from gradalign.runs.portable import write_run
    from tests.least_squares import train

    path = write_run(
        runs["root"] / name, accum_steps=4, **train(np.float32, k=4, spike=spike, feed=True)
    )
    return api.compare(runs["base"], path, reference="none")


def test_without_a_reference_a_kink_is_followed_against_the_baseline(runs, monkeypatch):  # noqa: F811
    """One unit's row 1% off at update 6, the step taken with it: the fixed tolerances fail
    that gradient and the weights after it; followed from there at the kink's size measured
    against the baseline, with a note. Without the follow the same run fails."""
    kink = _kink_then(size=1e-2)
    result = _unreferenced(runs, "kink-unreferenced", kink)
    assert result.verdict == "pass", _failing(result)
    (note,) = [n for n in result.notes if "crossed its kink" in n]
    assert note.startswith("update 6: the gradient of w jumped")
    with monkeypatch.context() as m:
        m.setattr("gradalign.judge.honest.follow_kink_divergence", lambda *a, **k: [])
        unfollowed = _unreferenced(runs, "kink-unreferenced-unfollowed", kink)
    assert unfollowed.verdict == "fail" and not unfollowed.results[6].ok


def test_without_a_reference_a_spread_jump_or_a_later_bug_still_fails(runs):  # noqa: F811
    def spread(u, g):
        return g * (1 + 1e-2) if u == 6 else g

    result = _unreferenced(runs, "spread-unreferenced", spread)
    assert result.verdict == "fail"
    assert not any("crossed its kink" in n for n in result.notes)
    later = _unreferenced(runs, "kink-then-bug-unreferenced", _kink_then(9, 1.05, 1e-2))
    assert later.verdict == "fail" and not later.results[9].ok


def _two_kinks(size: float, bug_from: int | None = None):
    """A unit's row jumps at update 6 (1e-3 of the gradient's largest element: 0.05% of the
    gradient's norm) and another's at update 8 (`size`: 8e-3 is 0.35%), both fed to the step;
    from `bug_from` on, the gradient is 1.03 times itself (beyond 4 x 0.35%)."""

    def spike(u, g):
        if u in (6, 8):
            g[3 if u == 6 else 5] += (1e-3 if u == 6 else size) * np.abs(g).max()
        if bug_from is not None and u >= bug_from:
            g *= 1.03
        return g

    return spike


def test_a_later_larger_kink_raises_the_size_followed(runs, monkeypatch):  # noqa: F811
    """Runs parted at one kink cross others (model zoo run 753: 0.57% at update 4, 1.66% at
    update 6): a later jump in one row, larger than the kink followed, is followed at its own
    size from its update on, with a note; without that it fails there."""
    result = merged(runs, "two-kinks", _two_kinks(8e-3), feed=True)
    assert result.verdict == "pass", _failing(result)
    (note,) = [n for n in result.notes if "another kink" in n]
    assert note.startswith("update 8: another kink crossed, the gradient of w ")
    monkeypatch.setattr("gradalign.judge.kink_divergence.later_kink", lambda *a: None)
    result = merged(runs, "two-kinks-unfollowed", _two_kinks(8e-3), feed=True)
    assert result.verdict == "fail" and result.results[7].ok and not result.results[8].ok


def test_a_bug_after_two_kinks_still_fails(runs):  # noqa: F811
    result = merged(runs, "two-kinks-then-bug", _two_kinks(8e-3, bug_from=10), feed=True)
    assert result.verdict == "fail"
    assert result.results[9].ok and not result.results[10].ok
