"""A reference computes more precisely than the runs: for runs under 16-bit autocast, a float32
rerun without autocast is one (its rounding, 2^-24 of each value, far below bfloat16's 2^-8),
as a float64 rerun is. Runs that compute in float32 still need float64, and a "reference" that
computes in the runs' own 16 bits is refused (bench/model_zoo.py's loops). A float64 rerun
stays one whatever compute dtype it declares (copied from the runs' Recorder call)."""

from __future__ import annotations

import pytest
import torch

from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train
from .zoo_runs import zoo

LOOP = ("convtext", "adam-1e-2")  # bfloat16 gradients part by 0.21 of their norm by update 7
SEED = 14


def _record(path, k: int, **options) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        zoo.record(path, *LOOP, k, SEED, **options)
    finally:
        torch.set_num_threads(threads)


def _judged(root, merged: str, reference: str, base: str = "base"):
    base = read_run_dir(root / base)
    return compare(base, read_run_dir(root / merged), reference=read_run_dir(root / reference))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ref32")
    sixteen = {"autocast": "bfloat16"}
    _record(root / "ref32", 1)  # float32, no autocast
    _record(root / "ref16", 1, **sixteen)  # float32 weights, the forward in bfloat16
    _record(root / "base", 1, **sixteen)
    _record(root / "merged", 4, **sixteen)
    _record(root / "bug", 4, bug="no-loss-scale", **sixteen)
    _record(root / "merged32", 4)
    return root


def test_a_float32_rerun_without_autocast_is_the_reference_of_bfloat16_runs(runs):
    """Accepted and used: the clean pair passes by its noise floor (no fixed tolerance's note),
    its message naming the float32 reference (it said "float64 reference"), and a loss not
    divided by K is named."""
    clean = _judged(runs, "merged", "ref32")
    assert clean.verdict == "pass", [d.message for d in clean.diagnosis]
    said = clean.diagnosis[0].message
    assert "from the float32 reference" in said and "float64" not in said, said
    assert clean.reference is not None
    assert not any("grad_rtol_apart" in note for note in clean.notes)
    bug = _judged(runs, "bug", "ref32")
    assert (bug.verdict, bug.diagnosis[0].code) == ("fail", "loss-scale")


def test_a_reference_computing_in_the_runs_16_bits_is_refused(runs):
    said = (
        r"ref16 is float32 computing in bfloat16: a reference must be more precise than the "
        r"runs \(float32, computing in bfloat16\): a float64 rerun, or one in float32 without "
        r"autocast or TF32$"
    )
    with pytest.raises(BadInput, match=said):
        _judged(runs, "merged", "ref16")


def test_float32_runs_still_need_a_float64_reference(runs):
    """The float32 rerun is no reference of float32 runs: the message offers float64 alone."""
    with pytest.raises(BadInput, match=r"ref32 is float32: .* \(float32\): a float64 rerun$"):
        _judged(runs, "merged32", "ref32", base="ref32")


def test_a_16_bit_failure_without_a_reference_names_the_float32_rerun(tmp_path):
    """Judged by the fixed tolerances, an unexplained failure in bfloat16 says which reruns
    would measure its noise: float64, or float32 without autocast; in float32, float64 alone."""
    from gradalign import api
    from gradalign.runs.portable import write_run

    from .test_apart import _sign_steps

    def pushed(u, w):
        if u == 2:
            w[:16] -= 0.3
        return w

    fixes = {}
    for dtype in ("bfloat16", "float32"):
        declared = {"compute_dtype": dtype, "accum_steps": 1}
        base = write_run(tmp_path / f"base-{dtype}", **declared, **_sign_steps(0.2, 1))
        bug = write_run(tmp_path / f"bug-{dtype}", **declared, **_sign_steps(0.2, 2, pushed))
        c = api.compare(base, bug, reference="none")
        assert c.verdict == "fail" and c.diagnosis[0].code == "unexplained", dtype
        fixes[dtype] = c.diagnosis[0].fix
    assert "in float64 (or in float32 without autocast or TF32) and pass" in fixes["bfloat16"]
    assert "in float64 and pass it as --reference" in fixes["float32"]


def test_float64_runs_are_told_to_judge_without_a_reference(tmp_path):
    """Nothing computes more precisely than float64 runs: the refusal says to judge them
    without a reference (it asked for a float64 rerun, which they already are)."""
    for name, k in (("base", 1), ("ref", 1), ("merged", 4)):
        model, x, y = classifier(64)
        model, x = model.double(), x.double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train(tmp_path / name, model, opt, x, y, k, batch=16)
    said = r"ref is float64: .* \(float64\): nothing is more precise than float64 runs: judge with"
    with pytest.raises(BadInput, match=said):
        _judged(tmp_path, "merged", "ref")
    base, merged = (read_run_dir(tmp_path / n) for n in ("base", "merged"))
    assert compare(base, merged).verdict == "pass"
