"""A baseline whose loss blows up (LBFGS at a large step, a learning rate too high): without a
reference the fixed tolerances failed such runs naming a bug that was absent (`weights-decayed`,
`unexplained`), with nothing to say that the training itself had blown up."""

from __future__ import annotations

from gradalign import api
from gradalign.judge.unstable import unstable_note

CALM = [1.6, 1.5, 1.45, 1.4, 1.38]
BLOWN = [*CALM, 434.0, 401.0, 102.0]


def _log(tmp_path, name: str, losses: list[float]):
    path = tmp_path / f"{name}.log"
    path.write_text("".join(f"step {i} loss {v!r}\n" for i, v in enumerate(losses)))
    return path


def _notes(tmp_path, base: list[float], merged: list[float]):
    found = api.compare(_log(tmp_path, "base", base), _log(tmp_path, "merged", merged))
    return found.verdict, [n for n in found.notes if "unstable" in n]


def test_runs_that_part_where_the_baseline_blew_up_are_warned_of_it(tmp_path):
    verdict, notes = _notes(tmp_path, BLOWN, [*CALM, 440.0, 380.0, 150.0])
    assert verdict == "fail" and len(notes) == 1
    said = "jumped from 1.38 to 434 (314x) at update 5, and the runs differ from update 5"
    assert said in notes[0]
    assert "float64 reference" in notes[0]


def test_no_warning_where_the_runs_parted_before_the_jump_or_agree(tmp_path):
    early = [1.6, 1.2, 1.1, 1.0, 0.9, 400.0, 380.0, 100.0]  # apart from update 1, the jump at 5
    assert _notes(tmp_path, BLOWN, early) == ("fail", [])
    assert _notes(tmp_path, BLOWN, BLOWN) == ("pass", [])
    calm = [*CALM, 1.3, 1.25, 1.2]
    assert _notes(tmp_path, calm, [*CALM, 1.4, 1.35, 1.3]) == ("fail", [])


def test_a_reference_measures_the_noise_of_that_training_itself(tmp_path):
    merged = _log(tmp_path, "merged", [*CALM, 440.0, 380.0, 150.0])
    found = api.compare(_log(tmp_path, "base", BLOWN), merged)
    assert unstable_note(found.results, calibrated=False)
    assert unstable_note(found.results, calibrated=True) == []
