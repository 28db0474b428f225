"""Input that would turn a check off, or an error that points at the wrong place: a tolerance so
large that nothing fails, a golden whose norms cannot be, a count of 0 compared with the runs,
a baseline's config blamed on the options. Each is one line on stderr and exit 2."""

from __future__ import annotations

import pytest

from gradalign import api
from gradalign.errors import BadInput

from .conftest import one_line_error

VACUOUS = [
    ("--loss-rtol", "loss_rtol", "1"),
    ("--weight-rtol", "weight_rtol", "1"),
    ("--grad-rtol", "grad_rtol", "10"),
    ("--noise-factor", "noise_factor", "1e308"),
    ("--noise-factor", "noise_factor", "100"),
    ("--noise-floor", "noise_floor", "1e9"),
]


@pytest.mark.parametrize(("option", "name", "value"), VACUOUS)
def test_a_tolerance_that_could_not_fail_is_refused_saying_why(
    cli, small_runs, tmp_path, option, name, value
):
    base, merged = small_runs["baseline"], small_runs["merged"]
    one_line_error(cli("compare", base, merged, option, value), name, "must be below", "vacuous")
    config = tmp_path / "t.yaml"
    config.write_text(f"tolerances:\n  {name}: {value}\n")
    one_line_error(cli("compare", base, merged, "-c", config), str(config), name, "must be below")
    with pytest.raises(BadInput, match=f"{name} must be below"):
        api.compare(base, merged, tolerances={name: float(value)})


def test_tolerances_just_inside_the_bounds_are_judged(cli, small_runs):
    result = cli(
        "compare",
        small_runs["baseline"],
        small_runs["merged"],
        "--weight-rtol",
        "0.5",
        "--noise-factor",
        "99",
        "--noise-floor",
        "127",
    )
    assert result.code == 0, result.err
