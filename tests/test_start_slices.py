"""The checks before the judge read a run directory's tensors a slice at a time
(runs/store.slices): the initial weights of both runs (judge/compatible.check_compatible), the
gradients of update 0 beside the reference's (check_first_gradients) and the sample of them
that tells a 16-bit computation (judge/undeclared.sixteen_bit_exact). What they find in a
tensor's last slice is refused or said as when the tensors were read whole, in the same words."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gradalign import api
from gradalign.errors import BadInput
from gradalign.judge.undeclared import SAMPLE, sixteen_bit_exact
from gradalign.runs.portable import write_run
from gradalign.runs.reader import read_run_dir
from gradalign.runs.store import SLICE, slices

SIZE = 2 * SLICE + 5_000  # three slices, the last a short one
LATE = 2 * SLICE + 17  # an element of the last slice


def _weights(seed: int = 1, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=SIZE).astype(dtype), "b": np.zeros(3, dtype)}


def _run(folder: Path, k: int, init: dict, grads: dict | None = None, **extra) -> Path:
    grads = grads if grads is not None else {n: np.full_like(v, 0.5) for n, v in init.items()}
    return write_run(
        folder,
        accum_steps=k,
        micro_losses=np.full(2 * k, 2.0),
        init_weights=init,
        update_weights=[init] * 2,
        grads=[grads] * 2,
        **extra,
    )


def _pair(tmp_path: Path, base_init: dict, merged_init: dict) -> tuple[Path, Path]:
    return _run(tmp_path / "base", 1, base_init), _run(tmp_path / "merged", 2, merged_init)


def test_initial_weights_apart_in_their_last_slice_are_refused_with_their_difference(tmp_path):
    base, merged = _weights(), _weights()
    merged["w"][LATE] += 0.25
    delta = float(np.abs(base["w"][LATE] - merged["w"][LATE].astype(np.float64)))
    with pytest.raises(
        BadInput,
        match=rf"initial weights differ \(first in w, max abs diff "
        rf"{re.escape(f'{delta:.3g}')}\)",
    ):
        api.compare(*_pair(tmp_path, base, merged), reference="none")


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["both", "merged"])
def test_a_non_finite_initial_weight_in_the_last_slice_is_refused_as_such(tmp_path, where, value):
    """In both runs alike (equal slices) as in one."""
    base, merged = _weights(), _weights()
    for run in (merged,) if where == "merged" else (base, merged):
        run["w"][LATE] = value
    with pytest.raises(BadInput, match=r"initial weights hold NaN or infinite values \(first in w"):
        api.compare(*_pair(tmp_path, base, merged), reference="none")


def test_equal_starts_pass_the_check_and_the_judge(tmp_path):
    result = api.compare(*_pair(tmp_path, _weights(), _weights()), reference="none")
    assert result.verdict == "pass"


def _alter(run: Path, element: int, relpath: str = "weights/init.safetensors") -> None:
    """Flip a bit of element `element` of w in the file itself (the manifest's fingerprint
    unchanged)."""
    file = run / relpath
    data = bytearray(file.read_bytes())
    header = int.from_bytes(data[:8], "little")
    entry = read_run_dir(run).store.open(relpath).file.entries["w"]
    width = 8 if entry["dtype"] == "F64" else 4
    data[8 + header + entry["data_offsets"][0] + width * element] ^= 0x01
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("altered", [("base",), ("base", "merged")])
def test_an_initial_weights_file_altered_in_its_last_slice_fails_its_checksum(tmp_path, altered):
    """Altered in one run the slices differ; in both alike they are equal, and the fingerprint
    after the last slice refuses them."""
    runs = dict(zip(("base", "merged"), _pair(tmp_path, _weights(), _weights()), strict=True))
    for name in altered:
        _alter(runs[name], LATE)
    with pytest.raises(BadInput, match=r"init\.safetensors fails its checksum"):
        api.compare(runs["base"], runs["merged"], reference="none")


def _referenced(tmp_path: Path, inf_at: int) -> tuple[Path, Path, Path]:
    """A baseline, merged run and reference whose gradient of w at update 0 is infinite at
    element `inf_at` of the reference only."""
    init = _weights()
    grads = {
        "w": np.random.default_rng(2).normal(size=SIZE).astype(np.float32) * 1e-3,
        "b": np.zeros(3, np.float32),
    }
    wide = {n: v.astype(np.float64) for n, v in grads.items()}
    wide["w"][inf_at] = np.inf
    ref = _run(tmp_path / "ref", 1, {n: v.astype(np.float64) for n, v in init.items()}, wide)
    base = _run(tmp_path / "base", 1, init, grads, reference="../ref")
    return base, _run(tmp_path / "merged", 2, init, grads), ref


def test_a_reference_not_finite_in_its_first_gradients_last_slice_is_refused(tmp_path):
    base, merged, _ = _referenced(tmp_path, LATE)
    with pytest.raises(
        BadInput, match="is not finite where the baseline is: its gradient of w at update 0 is not"
    ):
        api.compare(base, merged)


def test_a_reference_gradients_file_altered_past_its_infinity_fails_its_checksum(tmp_path):
    """Both tensors are read to their end before the infinity is refused, as when they were
    read whole: the altered file is named, not the infinity."""
    base, merged, ref = _referenced(tmp_path, 17)
    _alter(ref, LATE, "grads/update_000000.safetensors")
    with pytest.raises(BadInput, match=r"update_000000\.safetensors fails its checksum"):
        api.compare(base, merged)


def test_the_first_gradients_are_read_to_their_end_before_an_infinity_is_refused(monkeypatch):
    """A file's tensor is checked against its fingerprint after its last slice: both tensors
    are read to their end before the reference's infinity is refused, so a file altered there
    is named first, as when they were read whole."""
    from types import SimpleNamespace

    from gradalign.judge import compatible

    b = np.ones(SIZE, np.float32)
    r = b.astype(np.float64)
    r[17] = np.inf
    grads = {"b": {"w": b}, "r": {"w": r}}
    ended: list[str] = []

    def counted(tensors, name, size=SLICE):
        yield from slices(tensors, name, size)
        ended.append("b" if tensors is grads["b"] else "r")

    base = SimpleNamespace(grads=lambda i: grads["b"])
    ref = SimpleNamespace(grads=lambda i: grads["r"])
    bound = SimpleNamespace(where="reference R", rtol=1e-3, epsilon=1e-7, hint="")
    monkeypatch.setattr(compatible, "slices", counted)
    with pytest.raises(BadInput, match="its gradient of w at update 0 is not"):
        compatible.check_first_gradients(base, ref, bound)
    assert ended == ["b", "r"]


def _plain_sixteen(grads: dict[str, np.ndarray]) -> str | None:
    """The test's own statement of sixteen_bit_exact, over whole tensors in memory."""
    values = []
    for v in grads.values():
        v = v.astype(np.float32).ravel()
        values.append(v[(v != 0) & np.isfinite(v)][:SAMPLE])
    if sum(v.size for v in values) < 1024:
        return None
    bits = np.concatenate(values).view(np.uint32)
    if not (bits & 0xFFFF).any():
        return "bfloat16"
    if not (bits & 0x1FFF).any() and (np.abs(np.concatenate(values)) <= 65504).all():
        return "float16"
    return None


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


@pytest.mark.parametrize(
    "case", ["bf16-after-zeros", "inexact-in-second-slice", "inexact-past-the-sample", "sparse"]
)
def test_the_sixteen_bit_sample_read_in_slices_is_the_whole_tensors(tmp_path, case):
    rng = np.random.default_rng(4)
    g = _bf16(rng.normal(size=SIZE))
    if case == "bf16-after-zeros":
        g[: SLICE + 100] = 0  # the sample starts in the second slice
    elif case == "inexact-in-second-slice":
        g[: SLICE + 100] = 0
        g[SLICE + 150] = np.float32(0.1)  # within the first SAMPLE nonzero values
    elif case == "inexact-past-the-sample":
        g[SAMPLE + 10] = np.float32(0.1)  # read whole or not, no part of the sample
    else:
        g[:] = 0
        g[:: SLICE // 3] = _bf16(rng.normal(size=g[:: SLICE // 3].size))
    grads = {"w": g, "b": np.zeros(3, np.float32)}
    run = read_run_dir(_run(tmp_path / "run", 1, _weights(), grads))
    expected = {
        "bf16-after-zeros": "bfloat16",
        "inexact-in-second-slice": None,
        "inexact-past-the-sample": "bfloat16",
        "sparse": None,
    }[case]
    assert _plain_sixteen(grads) == expected
    assert sixteen_bit_exact(run) == expected


def test_slices_of_a_file_and_of_an_array_are_the_same_values(tmp_path):
    init = _weights()
    run = read_run_dir(_run(tmp_path / "run", 1, init))
    for name, whole in init.items():
        for source in (run.init_weights(), init):
            parts = list(slices(source, name, 100_000))
            assert [p.size for p in parts] == [
                min(100_000, whole.size - i) for i in range(0, whole.size, 100_000)
            ]
            assert np.array_equal(np.concatenate(parts), whole.ravel())
    assert [p.size for p in slices({"e": np.zeros(0)}, "e")] == [0]
