"""A baseline whose recorded loss is NaN at one micro-step, the runs otherwise alike: that update
fails (`finite losses`) and the cause is `non-finite`, naming the baseline. The loss noise was
pooled over every update's error with the NaN in it, so every update's loss failed ("1.08e-07 >
nan"), and `loss-averaging` led, "the merged window losses are nan times the baseline's"."""

from __future__ import annotations

import numpy as np

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .conftest import rewrite_tensor_file


def test_a_nan_in_the_baselines_recorded_loss_is_non_finite_alone(small_copy, small_runs):
    def poison(series: dict) -> None:
        series["micro/loss"] = series["micro/loss"].copy()
        series["micro/loss"][0] = np.nan

    rewrite_tensor_file(small_copy["baseline"], "series.safetensors", poison)
    base = read_run_dir(small_copy["baseline"])
    result = compare(base, read_run_dir(small_runs["merged"]))
    status = {c.name: (c.status, c.detail) for c in result.checks}
    assert status["finite losses"][0] == "fail" and "baseline" in status["finite losses"][1]
    assert status["losses"][1].startswith("1/"), status["losses"]  # update 0 alone
    assert [d.code for d in result.diagnosis] == ["non-finite"], result.diagnosis
    assert compare(read_run_dir(small_runs["baseline"]), result.merged).verdict == "pass"
