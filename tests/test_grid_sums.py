"""Grid sums (runs/grid_sums.py): a sketched gradient's grid, on the host and on the device, and
the rank the judge reads in its differences (judge/kink_shape.py `one_input`, `same_input`,
`along_input`): one input's share stays one outer product, a spread error or a uniform offset
does not read as one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradalign.judge.kink_shape import ONE_INPUT, WHOLE, along_input, one_input, same_input
from gradalign.record import sketcher as sketcher_module
from gradalign.record.sketcher import Sketcher
from gradalign.runs import grid_sums as grid_module
from gradalign.runs.grid_sums import (
    column_signs,
    grid_shape,
    grid_sums,
    hashed_ones,
    hashed_rows,
    row_signs,
)
from gradalign.runs.reader import read_run_dir
from tests.conftest import one_line_error, rewrite_tensor_file
from tests.devices import DEVICES
from tests.test_sketch_mode import _user_run

SHAPES = [(7, 5), (13, 9, 3), (40, 1000), (3, 2, 2, 5), (70, 33), (100, 1)]


def _by_definition(x: np.ndarray) -> np.ndarray:
    """grid[i mod P, j mod Q] += ρ(i)·γ(j)·X[i, j], element by element (the docstring)."""
    matrix = x.reshape(x.shape[0], -1).astype(np.float64)
    p, q = grid_shape(x.shape)
    rho, gamma = row_signs(matrix.shape[0]), column_signs(matrix.shape[1])
    grid = np.zeros((p, q))
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            grid[i % p, j % q] += rho[i] * gamma[j] * matrix[i, j]
    return grid


@pytest.mark.parametrize("block", [1 << 20, 24, 1000])
def test_grid_sums_are_the_signed_sums_of_each_bucket(monkeypatch, block):
    """In one block, and in blocks of a few rows starting at any row (a row's bucket follows
    its index, not the block's), a row a block where a row holds more than the block."""
    monkeypatch.setattr(grid_module, "BLOCK", block)
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        grid = grid_sums(x, shape)
        assert grid.shape == grid_shape(shape)
        assert np.allclose(grid, _by_definition(x), rtol=1e-12, atol=1e-12), shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_device_grid_sums_equal_the_host_ones(monkeypatch, device, dtype):
    """Sketcher's torch path (a recording on CUDA), in blocks of a few rows."""
    monkeypatch.setattr(sketcher_module, "_BLOCK", 150)
    sketcher = Sketcher(None, [], {}, 61)  # type: ignore[arg-type]
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
        found = sketcher._device_grid(x.to(device), shape).cpu().numpy()
        assert np.allclose(found, grid_sums(x.float().numpy(), shape), atol=1e-12), shape


def _two_runs(error: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two gradients `error` apart, as their grids: the grids' difference is the error's."""
    base = np.random.default_rng(seed).standard_normal(error.shape)
    return grid_sums(base + error, error.shape), grid_sums(base, error.shape)


def test_one_inputs_share_reads_as_one_outer_product_and_a_spread_error_does_not():
    """A token's share gained or lost whole, δ xᵀ beside a spread 1% of its energy, reads as
    one input's share from the grids in every one of 100 draws (as from the values); an error
    spread over every rank, or over 3 outer products of like size, never; a uniform offset
    (a constant added to every element) is rank one and no input's share, read whole or
    from the grids."""
    rng = np.random.default_rng(0)
    shape = (96, 64)
    for seed in range(100):
        share = np.outer(rng.standard_normal(shape[0]), rng.standard_normal(shape[1]))
        spread = rng.standard_normal(shape)
        spread *= 0.1 * np.linalg.norm(share) / np.linalg.norm(spread)
        error = share + spread
        assert one_input(error, np.zeros(shape)) == (ONE_INPUT, WHOLE)
        assert one_input(*_two_runs(error, seed), ones=hashed_ones(shape)) == (ONE_INPUT, WHOLE)
        assert one_input(*_two_runs(rng.standard_normal(shape), seed)) is None
        three = sum(
            np.outer(rng.standard_normal(shape[0]), rng.standard_normal(shape[1])) for _ in range(3)
        )
        assert one_input(*_two_runs(three, seed)) is None
    uniform = np.full(shape, 1e-5) + 1e-8 * rng.standard_normal(shape)
    assert one_input(uniform, np.zeros(shape)) is None
    grids = _two_runs(uniform, 1)
    assert one_input(*grids) == (ONE_INPUT, WHOLE)  # rank one, without the offset's test
    assert one_input(*grids, ones=hashed_ones(shape)) is None


def test_the_same_input_and_a_bias_along_its_weight_read_from_grids():
    """A token's embedding x feeds a router (few rows) and an expert: their errors δ₁ xᵀ and
    δ₂ xᵀ share the grids' right vector; another token's does not. The expert's bias error δ₂,
    hashed as the grid hashes its rows, lies along the weight grid's left vector; another δ
    does not."""
    rng = np.random.default_rng(3)
    x, other = rng.standard_normal(48), rng.standard_normal(48)
    delta = rng.standard_normal(64)
    expert = _two_runs(np.outer(delta, x), 1)
    router = _two_runs(np.outer(rng.standard_normal(4), x), 2)
    assert same_input(expert, router)
    assert not same_input(expert, _two_runs(np.outer(rng.standard_normal(4), other), 2))
    bias = rng.standard_normal(64)
    assert along_input(expert, (hashed_rows(bias + delta), hashed_rows(bias)))
    assert not along_input(expert, (hashed_rows(bias + rng.standard_normal(64)), hashed_rows(bias)))


def test_a_sketched_run_keeps_its_gradients_grid_sums_and_a_reader_checks_them(tmp_path, cli):
    """Every update's sketch file holds the grid sums of each sketched gradient of two axes,
    equal to those of the gradient's values where the run kept them too; grid sums of another
    shape are refused in one line."""
    _user_run(tmp_path / "base", 1, sketch_width=31)  # both weights sketched, the biases whole
    _user_run(tmp_path / "merged", 4, sketch_width=31)
    run = read_run_dir(tmp_path / "merged")
    shapes = {t.name: tuple(t.shape) for t in run.tensors}
    sketched = ("0.weight", "2.weight")
    for update in range(3):
        kept = run.sketches(update)
        assert {key for key in kept if key.startswith("grid/")} == {
            f"grid/grads/{n}" for n in sketched
        }
    full = run.grads(0)  # the first update keeps full files too
    for name in sketched:
        kept = run.sketches(0)[f"grid/grads/{name}"]
        assert kept.shape == grid_shape(shapes[name])
        assert np.allclose(kept, grid_sums(full[name], shapes[name]), rtol=1e-12, atol=0)
    assert cli("compare", tmp_path / "base", tmp_path / "merged").code == 0

    def narrower(data: dict) -> None:
        data["grid/grads/0.weight"] = data["grid/grads/0.weight"][:, :5].copy()

    rewrite_tensor_file(tmp_path / "merged", "sketches/update_000001.safetensors", narrower)
    one_line_error(cli("compare", tmp_path / "base", tmp_path / "merged"), "grid/grads/0.weight")


class _Inline:
    """A background writer that runs each job at once (Sketcher.device's results, read back)."""

    def run(self, job, *args) -> None:
        job()


def test_the_device_summaries_carry_the_unit_and_grid_sums_to_the_host():
    """Sketcher.device packs each tensor's sketch, norm, infinities, unit sums and grid sums into
    one transfer and unpacks them on the host: run on CPU tensors, every part equals the host
    path's (a gradient of two axes sketched, one of three, a bias kept whole)."""
    from gradalign.runs.sketches import summarize
    from gradalign.runs.unit_sums import unit_sums

    shapes = {"w": (40, 36), "conv": (6, 5, 3, 3), "b": (40,)}
    declared = dict.fromkeys(shapes, "float32")
    sketcher = Sketcher(_Inline(), list(shapes), declared, 61, shapes)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(5)
    tensors = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    sketcher.device("grads", 0, tensors)
    found = sketcher.results[("grads", 0)]
    for name, tensor in tensors.items():
        values = tensor.numpy()
        host = summarize(values, "float32", 61, sketcher.whole(name, values.size))
        assert np.allclose(found[name].sketch, host.sketch, atol=1e-9), name
        if name == "b":
            assert found[name].units is None and found[name].grid is None
            continue
        rows, columns = unit_sums(values, shapes[name])
        assert np.allclose(found[name].units[0], rows, atol=1e-9), name
        assert np.allclose(found[name].units[1], columns, atol=1e-9), name
        assert np.allclose(found[name].grid, grid_sums(values, shapes[name]), atol=1e-9), name
