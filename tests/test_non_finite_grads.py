"""A merged gradient that holds an inf or a NaN while the losses and the baseline's gradient are
finite (a backward that overflowed, a division by an empty count), the step taken with it:
`non-finite`, naming the update and the tensor, and nothing read from its numbers (a NaN was
`unexplained`, an inf `cross-sample-loss`, "inf times what noise allows")."""

from __future__ import annotations

import math

import pytest

from gradalign.judge.compare import compare
from gradalign.runs.layout import grads_file
from gradalign.runs.portable import fingerprint
from gradalign.runs.reader import read_run_dir

from .conftest import rewrite_tensor_file


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_merged_gradient_not_finite_is_named_non_finite(small_copy, value):
    run = small_copy["merged"]
    names = [t.name for t in read_run_dir(run).tensors]
    spoiled_name = []

    def spoiled(tensors: dict) -> None:
        name = sorted(tensors)[0]
        tensors[name] = tensors[name].copy()
        tensors[name].flat[3] = value
        spoiled_name.append((name, fingerprint(tensors[name])))

    def fingerprinted(series: dict) -> None:  # the run's own fingerprint of what it holds
        name, print_ = spoiled_name[0]
        series["update/grad_state"] = series["update/grad_state"].copy()
        series["update/grad_state"][1, names.index(name)] = print_

    rewrite_tensor_file(run, grads_file(1), spoiled)
    rewrite_tensor_file(run, "series.safetensors", fingerprinted)
    c = compare(read_run_dir(small_copy["baseline"]), read_run_dir(small_copy["merged"]))
    assert c.verdict == "fail"
    codes = [d.code for d in c.diagnosis]
    assert codes == ["non-finite"], [(d.code, d.message) for d in c.diagnosis]
    said = c.diagnosis[0].message
    assert "at update 1 the merged run's gradient of" in said and "not finite" in said, said
