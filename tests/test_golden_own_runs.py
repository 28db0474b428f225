"""Goldens of runs whose config names no dtype (a user's loop, the run format): a float64 run is
told apart by its own dtype all the same."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign import api
from gradalign.errors import BadInput
from gradalign.runs.portable import write_run

from .test_few_draws import _train


def test_a_float64_run_is_refused_beside_float32_goldens_without_a_dtype_in_its_config(tmp_path):
    """The refusal read the config's `dtype`, which only the built-in trainer writes: a float64
    rerun written by the run format (or recorded by a loop) joined float32 goldens."""
    write_run(tmp_path / "base", accum_steps=1, config={"lr": 0.1}, **_train(np.float32, 0))
    ref = _train(np.float64, 0, rounded_from=np.float32)
    write_run(tmp_path / "ref", accum_steps=1, dtype="float64", config={"lr": 0.1}, **ref)
    folder = tmp_path / "goldens"
    api.golden_write(tmp_path / "base", folder)
    with pytest.raises(BadInput, match="dtype 'float64' \\(goldens 'float32'\\)"):
        api.golden_write(tmp_path / "ref", folder)
    assert api.golden_write(tmp_path / "ref", tmp_path / "apart").exists()  # a folder of its own


def test_a_run_of_no_updates_is_no_golden(tmp_path):
    """A run that holds no update was kept as a golden file its own reader then refused."""
    weights = {"w": np.ones((4, 3), np.float32)}
    write_run(
        tmp_path / "b0", accum_steps=1, micro_losses=[], init_weights=weights, update_weights=[]
    )
    with pytest.raises(BadInput, match="holds no updates, so there is nothing to keep"):
        api.golden_write(tmp_path / "b0", tmp_path / "g.json")
    assert not (tmp_path / "g.json").exists()
