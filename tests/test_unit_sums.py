"""Unit sums (runs/unit_sums.py): a sketched gradient's signed row and column sums, on the host
and on the device, and what the kink diagnoses find in their differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradalign.judge.kink_shape import ESTIMATED_SHARE, kink_units, units_holding
from gradalign.record import sketcher as sketcher_module
from gradalign.record.sketcher import Sketcher
from gradalign.runs import unit_sums as unit_sums_module
from gradalign.runs.reader import read_run_dir
from gradalign.runs.summaries import _signs
from gradalign.runs.unit_sums import GROUPS, unit_energies, unit_sums
from tests.conftest import one_line_error, rewrite_tensor_file
from tests.devices import DEVICES
from tests.test_sketch_mode import _user_run

SHAPES = [(7, 5), (13, 9, 3), (40, 1000), (3, 2, 2, 5), (33, 17)]


def _by_definition(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rows[i, k mod G] and columns[j, i mod G] summed element by element (the docstring)."""
    rows_n, columns_n = x.shape[0], x.shape[1]
    signed = _signs(0, x.size).reshape(rows_n, -1) * x.reshape(rows_n, -1).astype(np.float64)
    inner = signed.shape[1] // columns_n
    rows, columns = np.zeros((rows_n, GROUPS)), np.zeros((columns_n, GROUPS))
    for i in range(rows_n):
        for k in range(signed.shape[1]):
            rows[i, k % GROUPS] += signed[i, k]
            columns[k // inner, i % GROUPS] += signed[i, k]
    return rows, columns


@pytest.mark.parametrize("block", [1 << 20, 24])
def test_unit_sums_are_the_signed_sums_of_each_rows_and_columns_groups(monkeypatch, block):
    """In one block, and in blocks of a few rows that start at any row (the column groups
    follow the row's index, not the block's)."""
    monkeypatch.setattr(unit_sums_module, "BLOCK", block)
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        rows, columns = unit_sums(x, shape)
        expected_rows, expected_columns = _by_definition(x)
        assert rows.shape == (shape[0], GROUPS) and columns.shape == (shape[1], GROUPS)
        assert np.allclose(rows, expected_rows, rtol=1e-12, atol=1e-12), shape
        assert np.allclose(columns, expected_columns, rtol=1e-12, atol=1e-12), shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_device_unit_sums_equal_the_host_ones(monkeypatch, device, dtype):
    """Sketcher's torch path (a recording on CUDA), in blocks whose first element is no
    multiple of 8 (the packed signs start at whole bytes)."""
    monkeypatch.setattr(sketcher_module, "_BLOCK", 128)  # signs packed 32 at a time
    sketcher = Sketcher(None, [], {}, 61)  # type: ignore[arg-type]
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
        found = sketcher._device_units(x.to(device), shape).cpu().numpy()
        rows, columns = unit_sums(x.float().numpy(), shape)
        assert np.allclose(found, np.concatenate([rows.ravel(), columns.ravel()]), atol=1e-12)


def _apart(error: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two gradients `error` apart: the unit sums' differences give the error's."""
    base = np.random.default_rng(seed).standard_normal(error.shape)
    rows_a, columns_a = unit_sums(base + error, error.shape)
    rows_b, columns_b = unit_sums(base, error.shape)
    return unit_energies(rows_a - rows_b, columns_a - columns_b)


def _kinked(shape, share: float, rng) -> tuple[np.ndarray, int]:
    """An error spread over every element, with one row holding `share` of its energy."""
    spread = rng.standard_normal(shape) * 1e-3
    row = int(rng.integers(shape[0]))
    kink = np.zeros(shape)
    kink[row] = rng.standard_normal(shape[1])
    kink *= np.sqrt(share / (1 - share) * np.sum(spread**2) / np.sum(kink**2))
    return spread + kink, row


def test_a_row_holding_the_error_is_found_and_a_spread_error_is_not():
    """What the judge reads (`ESTIMATED_SHARE` of the estimated energies in at most 1% of the
    rows): a kink's row holding 99% of the error is found in every one of 200 draws, one holding
    90% (the exact rule's edge) in about 95% of them, one holding half of it in about 0.2%; the
    error spread over the rows, or over 8 of 192 of them (a bug in a part of a layer), never."""
    rng = np.random.default_rng(0)
    shape = (192, 96)
    found = {0.99: 0, 0.9: 0, 0.5: 0}
    for seed in range(200):
        for share in found:
            error, row = _kinked(shape, share, rng)
            if share == 0.99:
                assert kink_units(error, np.zeros(shape)) == (0, frozenset({row}))
            units = units_holding(_apart(error, seed), None, 0.01, ESTIMATED_SHARE)
            found[share] += units == (0, frozenset({row}))
        spread = rng.standard_normal(shape)
        assert units_holding(_apart(spread, seed), None, 0.01, ESTIMATED_SHARE) is None
        part = np.zeros(shape)
        part[rng.choice(shape[0], 8, replace=False)] = rng.standard_normal((8, shape[1]))
        assert units_holding(_apart(part, seed), None, 0.01, ESTIMATED_SHARE) is None
    assert found[0.99] == 200 and found[0.9] >= 180 and found[0.5] <= 3, found


def test_a_sketched_run_keeps_its_gradients_unit_sums_and_a_reader_checks_them(tmp_path, cli):
    """Every update's sketch file holds the unit sums of each sketched gradient of two axes
    (not of weights, nor of tensors kept whole), equal to those of the gradient's values where
    the run kept them too; unit sums of another shape are refused in one line."""
    _user_run(tmp_path / "base", 1, sketch_width=31)  # both weights sketched, the biases whole
    _user_run(tmp_path / "merged", 4, sketch_width=31)
    run = read_run_dir(tmp_path / "merged")
    shapes = {t.name: tuple(t.shape) for t in run.tensors}
    for update in range(3):
        kept = run.sketches(update)
        units = {key for key in kept if key.startswith(("rows/", "columns/"))}
        sketched = ("0.weight", "2.weight")
        assert units == {f"{axis}/grads/{n}" for axis in ("rows", "columns") for n in sketched}
        for name in sketched:
            assert kept[f"rows/grads/{name}"].shape == (shapes[name][0], GROUPS)
            assert kept[f"columns/grads/{name}"].shape == (shapes[name][1], GROUPS)
    full = run.grads(0)  # the first update keeps full files too
    for name in ("0.weight", "2.weight"):
        rows, columns = unit_sums(full[name], shapes[name])
        assert np.allclose(run.sketches(0)[f"rows/grads/{name}"], rows, rtol=1e-12, atol=0)
        assert np.allclose(run.sketches(0)[f"columns/grads/{name}"], columns, rtol=1e-12, atol=0)
    assert cli("compare", tmp_path / "base", tmp_path / "merged").code == 0

    def narrower(data: dict) -> None:
        data["rows/grads/0.weight"] = data["rows/grads/0.weight"][:, :5].copy()

    rewrite_tensor_file(tmp_path / "merged", "sketches/update_000001.safetensors", narrower)
    one_line_error(cli("compare", tmp_path / "base", tmp_path / "merged"), "rows/grads/0.weight")
