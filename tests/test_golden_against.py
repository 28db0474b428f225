"""Golden files and the environment they were recorded in: `golden check` refuses a golden of
another environment (exit 2, naming the environments a folder holds), a hand-edited environment
key and a broken golden for this environment; `merged --against` a golden trains and judges, and
trains nothing it would refuse (other updates, another model); `compare` given a golden says
what judges against it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradalign.runs import golden as fmt

from .conftest import one_line_error


def _elsewhere(small: dict, path: Path, **environment: str) -> Path:
    """The small golden as if recorded in another environment."""
    data = json.loads(small["golden"].read_text())
    data["environment"].update(environment)
    data["environment_key"] = fmt.environment_key(data["environment"])
    path.write_text(fmt.dumps(data))
    return path


def test_another_environment_is_refused(cli, small, tmp_path):
    other = _elsewhere(small, tmp_path / "other.json", torch="1.13.1")
    result = cli("golden", "check", other, small["merged"])
    assert result.code == 2 and "no golden for this environment" in result.err
    (tmp_path / "dir").mkdir()
    shutil.copy(other, tmp_path / "dir" / other.name)
    result = cli("golden", "check", tmp_path / "dir", small["merged"])
    assert result.code == 2 and "no golden for this environment" in result.err
    assert "torch1.13" in result.err  # says which environments the directory holds


def test_two_goldens_for_this_environment_in_one_directory_are_refused(cli, small, tmp_path):
    """A directory holding the goldens of two experiments for one environment (an SGD and an
    Adam baseline's) judged the run against the first by name: a false alarm, `lr-scaled`."""
    (tmp_path / "dir").mkdir()
    other = _elsewhere(small, tmp_path / "dir" / "adam.json")  # the same environment
    shutil.copy(small["golden"], tmp_path / "dir" / "sgd.json")
    folder = tmp_path / "dir"
    against = ("merged", "--against", folder, "--out", tmp_path / "m")
    for command in (("golden", "check", folder, small["merged"]), against):
        result = cli(*command)
        one_line_error(result, "holds 2 goldens for this environment", other.name, "sgd.json")
    assert not (tmp_path / "m").exists()


def test_a_hand_edited_environment_key_is_refused(cli, small, tmp_path):
    data = json.loads(small["golden"].read_text())
    data["environment_key"] = data["environment_key"].replace("-ws1-", "-ws2-")
    edited = tmp_path / "edited.json"
    edited.write_text(fmt.dumps(data))
    result = cli("golden", "check", edited, small["merged"])
    assert result.code == 2 and "does not match its environment" in result.err


def test_a_golden_of_an_unknown_compute_dtype_is_refused(cli, small, tmp_path):
    """`bf16` is no precision the judge knows: it was taken for none, float32's tolerances."""
    other = _elsewhere(small, tmp_path / "bf16.json", compute_dtype="bf16")
    result = cli("golden", "check", other, small["merged"])
    one_line_error(result, "environment.compute_dtype", "bfloat16", "'bf16'")


def test_merged_against_a_golden_trains_and_judges(cli, small, tmp_path):
    golden_dir = small["golden"].parent
    out = tmp_path / "m"
    result = cli("merged", "--against", golden_dir, "-k", "4", "--out", out)
    assert result.code == 0, result.out + result.err
    assert "lower bounds" in result.out
    bug = ("--fault", "no-loss-scale")
    result = cli("merged", "--against", golden_dir, "--out", tmp_path / "b", *bug)
    assert result.code == 1 and "loss-scale" in result.out


def test_merged_against_a_golden_of_another_environment_trains_nothing(cli, small, tmp_path):
    other = _elsewhere(small, tmp_path / "f64.json", dtype="float64")
    result = cli("merged", "--against", other, "--out", tmp_path / "m")
    assert result.code == 2 and "no golden for this environment" in result.err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("against", ["golden", "baseline"])
def test_merged_against_with_other_updates_trains_nothing(cli, small, tmp_path, against):
    """`merged --against X --updates 3` trained the whole run, then refused it: "runs of
    different lengths"."""
    result = cli("merged", "--against", small[against], "--updates", "3", "--out", tmp_path / "m")
    one_line_error(result, "--updates 3:", "holds 4 updates", "leave --updates out")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("against", ["golden", "baseline"])
def test_merged_against_with_another_model_trains_nothing(cli, small, tmp_path, against):
    """`merged --against X --hidden 32` trained the whole run, then refused it: "runs of
    different models"."""
    result = cli("merged", "--against", small[against], "--hidden", "24", "--out", tmp_path / "m")
    one_line_error(result, "is not the one", "in the merged run", "[24, ", "--hidden")
    assert not (tmp_path / "m").exists()


def test_merged_against_a_run_no_built_in_trainer_recorded_is_refused(cli, tmp_path):
    """A baseline (or its golden) written by the numpy writer has no training config to rerun:
    `merged --against` its golden was an internal error (KeyError 'updates', exit 3), against
    the run a refusal of an `--updates` never given."""
    import numpy as np

    from gradalign.runs.portable import write_run

    weights = [{"w": np.full(3, 1.0 - 0.1 * i, dtype=np.float32)} for i in range(3)]
    write_run(
        tmp_path / "base",
        accum_steps=1,
        micro_losses=[1.0, 0.9],
        init_weights=weights[0],
        update_weights=weights[1:],
    )
    assert cli("golden", "write", tmp_path / "base", "--out", tmp_path / "g.json").code == 0
    for against in (tmp_path / "g.json", tmp_path / "base"):
        result = cli("merged", "--against", against, "-k", "2", "--out", tmp_path / "m")
        one_line_error(result, "not recorded by gradalign's built-in trainer", "gradalign compare")
        assert not (tmp_path / "m").exists()


def test_a_golden_given_to_compare_says_what_judges_against_it(cli, small):
    """`compare GOLDEN RUN` was refused as neither a run nor a training log, naming log formats."""
    result = cli("compare", small["golden"], small["merged"])
    one_line_error(result, "a golden file, not a run", "gradalign golden check")


def test_a_broken_golden_for_this_environment_is_named(cli, small, tmp_path):
    folder = tmp_path / "goldens"
    folder.mkdir()
    (folder / small["golden"].name).write_text("{not json")
    result = cli("golden", "check", folder, small["merged"])
    assert result.code == 2 and small["golden"].name in result.err
