"""A jump excused where the losses stand off throughout (judge/jump_losses.py's
`loss_as_around`, read by judge/kinks.py): synthetic update results for each of its
conditions, and model zoo run 301504, whose losses were logged times their shares beside a
token's route."""

from __future__ import annotations

import pytest

from gradalign.judge import kinks
from gradalign.judge.jump_losses import LOSS_AS_AROUND, LOSS_WITHIN, loss_as_around
from gradalign.judge.results import UpdateResult

from .zoo_runs import _compare, _one_thread_judge


def _results(errors: list[float], allowed: float = 0.05) -> list[UpdateResult]:
    """One update per error: losses near 1.8, each allowed `allowed`."""
    return [UpdateResult(u, 1.8, 1.8 + e, e, e, allowed) for u, e in enumerate(errors)]


def test_a_loss_within_noise_says_so():
    assert loss_as_around(_results([0.9, 0.01, 0.9]), 1) == LOSS_WITHIN


def test_a_loss_as_far_off_as_the_updates_either_side_says_nothing_of_the_step():
    results = _results([0.8, 0.85, 0.9, 0.86, 0.84])
    assert loss_as_around(results, 2) == LOSS_AS_AROUND
    assert loss_as_around(_results([0.8, 0.92, 0.9]), 1) == LOSS_AS_AROUND


@pytest.mark.parametrize(
    ("errors", "i", "why"),
    [
        ([0.01, 0.9, 0.01], 1, "its neighbours pass: the loss moved at this update"),
        ([0.9, 0.9, 0.01], 1, "one neighbour passes"),
        ([0.8, 1.5, 0.85], 1, "further off than either neighbour by more than it is allowed"),
        ([0.8, 0.2, 0.85], 1, "nearer than either neighbour by more than it is allowed"),
        ([0.9, 0.9], 0, "the first update: no update before it to read"),
        ([0.9, 0.9], 1, "the last update: no update after it to read"),
    ],
)
def test_a_loss_that_moved_here_or_cannot_be_read_around_refuses(errors, i, why):
    assert loss_as_around(_results(errors), i) is None, why


def test_a_loss_around_an_update_both_runs_skipped_is_not_read():
    results = _results([0.9, 0.9, 0.9])
    results[0].loss_judged = False
    assert loss_as_around(results, 1) is None


def test_a_route_beside_losses_logged_times_their_shares_names_the_losses(tmp_path, monkeypatch):
    """Model zoo run 301504: the zoo's tiny mixture of experts under bfloat16 autocast and
    RMSprop, K=2 over unequal micro-batches, each micro-batch's loss logged times its share of
    the batch from update 8 (`log-scaled-loss`), 20 updates. At update 14 a token's route went
    otherwise (one input's share of expert 1's first weight, 3.4 times its noise floor), which
    the judge excuses where the loss passes, as in this run without the bug; here every loss
    from update 8 fails, so the route failed the gradients and the run was `unexplained`. Its
    loss stands as far off as those either side: the route is excused with a note saying so,
    and the run fails by its losses alone, `loss-averaging`. Without that reading it is
    `unexplained` again. One thread."""
    loop = {"updates": 20, "autocast": "bfloat16", "clip": 1.0, "schedule": True, "uneven": True}
    root = tmp_path / "logged"
    _one_thread_judge(root, "moe", "rmsprop", 2, 301504, "log-scaled-loss", bug_from=8, **loop)
    c = _compare(root)
    jumps = [n for n in c.notes if n.startswith("update 14:")]
    if not jumps:
        pytest.skip("this machine's rounding took another path: no route at update 14")
    assert LOSS_AS_AROUND in jumps[0]
    assert c.verdict == "fail" and [d.code for d in c.diagnosis] == ["loss-averaging"]
    with monkeypatch.context() as m:
        m.setattr(kinks, "loss_as_around", lambda results, i: _strict(results[i]))
        assert [d.code for d in _compare(root).diagnosis] == ["unexplained"]
    clean = tmp_path / "clean"
    _one_thread_judge(clean, "moe", "rmsprop", 2, 301504, None, **loop)
    c = _compare(clean)
    assert c.verdict == "pass"
    assert any(n.startswith("update 14:") and LOSS_WITHIN in n for n in c.notes)


def _strict(r: UpdateResult) -> str | None:
    return LOSS_WITHIN if r.loss_ok else None
