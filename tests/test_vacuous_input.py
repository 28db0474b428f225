"""Input that would turn a check off, or an error that points at the wrong place: a tolerance so
large that nothing fails, a golden whose norms cannot be, a count of 0 compared with the runs,
a baseline's config blamed on the options. Each is one line on stderr and exit 2."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from gradalign import api
from gradalign.errors import BadInput

from .conftest import one_line_error, still_runs

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


def _edited_baseline(small_runs, tmp_path, **config) -> Path:
    """A copy of the small baseline whose manifest records `config`."""
    base = Path(shutil.copytree(small_runs["baseline"], tmp_path / "base"))
    manifest = json.loads((base / "manifest.json").read_text())
    manifest["config"].update(config)
    (base / "manifest.json").write_text(json.dumps(manifest))
    return base


def test_a_baseline_config_error_names_the_baseline_manifest(cli, small_runs, tmp_path):
    """The config of `merged --against` comes from the baseline: its errors were blamed on
    "options:", which the user never gave."""
    base = _edited_baseline(small_runs, tmp_path, lr=-1.0)
    result = cli("merged", "--against", base, "--out", tmp_path / "m")
    one_line_error(result, f"{base / 'manifest.json'}: recorded config: lr must be positive")
    shutil.rmtree(base)
    base = _edited_baseline(small_runs, tmp_path, optimizer="lamb")
    result = cli("merged", "--against", base, "--out", tmp_path / "m")
    one_line_error(result, f"{base / 'manifest.json'}: recorded config: optimizer must be one of")
    assert not (tmp_path / "m").exists()


def test_an_error_of_keys_from_two_places_names_both(cli, small_runs, tmp_path):
    """B from the baseline, K from the options: both are named."""
    base = small_runs["baseline"]
    result = cli("merged", "--against", base, "-k", "3", "--out", tmp_path / "m")
    one_line_error(
        result, f"{base / 'manifest.json'}: recorded config and options: batch_size 16 is not"
    )
    golden = api.golden_write(base, tmp_path / "g.json")
    result = cli("merged", "--against", golden, "-k", "3", "--out", tmp_path / "m")
    one_line_error(result, f"{golden}: recorded config and options: batch_size 16 is not")


def test_a_config_file_range_error_names_the_file(cli, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("lr: -2\nupdates: 1\n")
    one_line_error(cli("verify", "-c", config, "--out", tmp_path / "v"), f"{config}: lr must")
    result = cli("verify", "-c", config, "--lr", "-3", "--out", tmp_path / "v")
    one_line_error(result, "options: lr must be positive, got -3")


@pytest.mark.parametrize("option", ["--accum-steps", "--baseline-accum-steps"])
@pytest.mark.parametrize("k", ["0", "-3", str(10**20)])
def test_a_k_below_1_is_refused_before_it_is_compared_with_the_runs(cli, small_runs, option, k):
    result = cli("compare", small_runs["baseline"], small_runs["merged"], option, k)
    one_line_error(result, option, "must be an integer from 1", f"got {k}")
    assert "recorded with" not in result.err
    with pytest.raises(BadInput, match="must be an integer from 1"):
        api.compare(small_runs["baseline"], small_runs["merged"], accum_steps=int(k))


def test_an_absolute_tolerance_that_passes_anything_is_said(cli, small_runs, tmp_path):
    """loss_atol and weight_atol carry the data's units: no fixed bound, but when the data show
    that the check could not fail, the report and the JSON say so."""
    base, merged, report = small_runs["baseline"], small_runs["merged"], tmp_path / "r.json"
    huge = ["--loss-atol", "1e300", "--weight-atol", "1e300", "--json", report]
    result = cli("compare", base, merged, "--reference", "none", *huge)
    assert result.code == 0 and "could not fail" in result.out
    notes = [n for n in json.loads(report.read_text())["notes"] if "could not fail" in n]
    assert [n.split(":")[1].strip() for n in notes] == [
        "the loss check could not fail",
        "the weight check could not fail",
    ]
    result = cli("compare", base, merged, "--reference", "none", "--json", report)
    assert result.code == 0 and "could not fail" not in result.out + report.read_text()


def test_an_infinite_error_never_passes_even_under_an_overflowed_bound():
    """Finite weights near 1e200 square past float64's range: the error and the bound both
    overflowed to inf, and inf <= inf passed a merged tensor of -w against the baseline's w."""
    import numpy as np

    from gradalign.judge.metrics import diff
    from gradalign.judge.results import UpdateResult

    base, start = np.array([1e200, 1.0]), np.zeros(2)
    with np.errstate(over="ignore"):
        d = diff("w", base, -base, rtol=1e-4, atol=0.0, start=start)
    assert d.error == math.inf and d.allowed == math.inf and not d.ok
    result = UpdateResult(0, 1e308, -1e308, math.inf, math.inf, math.inf)
    assert not result.loss_ok


def test_runs_whose_weights_never_moved_pass_with_a_warning(small_runs, tmp_path):
    """Weights written as integers, or with no elements, by a writer of its own: every check
    passed and nothing said that no weight had moved."""
    import numpy as np

    for weights in ({"w": np.arange(4, dtype=np.int64)}, {"w": np.zeros(0, np.float32)}):
        runs = still_runs(tmp_path / str(weights["w"].dtype), weights)
        c = api.compare(*runs, reference="none")
        assert c.verdict == "pass"
        assert any(n.startswith("warning: no weight of the baseline moved") for n in c.notes)
    trained = api.compare(small_runs["baseline"], small_runs["merged"], reference="none")
    assert not any("no weight of the baseline moved" in n for n in trained.notes)
