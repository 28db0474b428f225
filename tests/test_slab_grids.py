"""Slab grids (runs/grid_sums.py `slab_grids`): a sketched gradient of three axes or more, as
transformers' mixtures of experts fuse their experts (experts first), keeps one grid per slab,
on the host and on the device; the judge reads there a token routed from one expert to another
as one input's share in two slabs (judge/kink_shape.py `one_input`), and a router's input as a
slab's (`slab_input`), where the tensor's one grid reads rank two."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradalign.judge import kink_pair
from gradalign.judge.kink_shape import ONE_INPUT, one_input, slab_input
from gradalign.record import sketcher as sketcher_module
from gradalign.record.sketcher import Sketcher
from gradalign.runs.grid_sums import (
    SLAB_CELLS,
    grid_sums,
    has_slabs,
    hashed_ones,
    slab_grid_shape,
    slab_grids,
    slab_ones,
)
from gradalign.runs.reader import read_run_dir
from gradalign.runs.sketches import summarize
from tests.conftest import one_line_error, rewrite_tensor_file
from tests.devices import DEVICES
from tests.test_grid_sums import _Inline
from tests.test_sketch_mode import _train

SHAPES = [(4, 40, 24), (3, 10, 4, 5), (6, 33, 70)]
EXPERTS, OUT, IN = 4, 64, 48


def test_slab_grids_are_each_slab_s_grid():
    """Slab e's grid is the grid of values[e] read as its own rows and columns."""
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        found = slab_grids(x, shape)
        assert found.shape == slab_grid_shape(shape)
        for e in range(shape[0]):
            assert np.allclose(found[e], grid_sums(x[e], shape[1:]), rtol=0, atol=1e-12), shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [150, 2000, 1 << 24])
def test_the_device_slab_grids_equal_the_host_ones(monkeypatch, device, block):
    """Sketcher's torch path (a recording on CUDA): slabs batched in blocks, or a slab larger
    than a block read in blocks of its rows."""
    monkeypatch.setattr(sketcher_module, "_BLOCK", block)
    sketcher = Sketcher(None, [], {}, 61)  # type: ignore[arg-type]
    for shape in SHAPES:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
        found = sketcher._device_slabs(x.to(device), shape).cpu().numpy()
        assert np.allclose(found, slab_grids(x.numpy(), shape), rtol=0, atol=1e-12), shape


def _runs(error: np.ndarray, seed: int, grids=slab_grids) -> tuple[np.ndarray, np.ndarray]:
    """Two gradients `error` apart, as their slab grids (or `grids`)."""
    base = np.random.default_rng(seed).standard_normal(error.shape)
    return grids(base + error, error.shape), grids(base, error.shape)


def _moved(rng: np.random.Generator, x: np.ndarray, spread: float = 0.1) -> np.ndarray:
    """A token's route from expert 0 to expert 2: −δ₀ xᵀ in slab 0, δ₂ xᵀ in slab 2, beside an
    error spread over every slab of `spread` times their norm."""
    error = np.zeros((EXPERTS, OUT, IN))
    error[0] = -np.outer(rng.standard_normal(OUT), x)
    error[2] = np.outer(rng.standard_normal(OUT), x)
    noise = rng.standard_normal(error.shape)
    return error + noise * spread * np.linalg.norm(error) / np.linalg.norm(noise)


def test_a_token_moved_between_two_slabs_is_one_input_s_share_in_each():
    """Read from the slab grids, a token's route (two slabs, one outer product each, 1% of the
    energy spread beside) is one input's share in slabs 0 and 2 in every one of 50 draws, as
    from the values; the tensor's one grid reads it as rank two, no input's share. An error
    spread over every slab, or over three outer products in each of two, never reads as one;
    nor does a uniform offset (rank one in every slab)."""
    rng = np.random.default_rng(1)
    shape = (EXPERTS, OUT, IN)
    for seed in range(50):
        error = _moved(rng, rng.standard_normal(IN))
        assert one_input(error, np.zeros(shape)) == (ONE_INPUT, frozenset({0, 2}))
        assert one_input(*_runs(error, seed), ones=slab_ones(shape)) == (
            ONE_INPUT,
            frozenset({0, 2}),
        )
        assert one_input(*_runs(error, seed, grid_sums), ones=hashed_ones(shape)) is None
        assert one_input(*_runs(rng.standard_normal(shape), seed), ones=slab_ones(shape)) is None
        three = np.zeros(shape)
        for e in (1, 3):
            three[e] = sum(
                np.outer(rng.standard_normal(OUT), rng.standard_normal(IN)) for _ in range(3)
            )
        assert one_input(*_runs(three, seed), ones=slab_ones(shape)) is None
    uniform = np.full(shape, 1e-5) + 1e-8 * rng.standard_normal(shape)
    assert one_input(*_runs(uniform, 1), ones=slab_ones(shape)) is None


def test_a_router_s_input_is_the_slab_s_input():
    """The router's error δ_r xᵀ (4 rows) against the slabs the token left and joined: the same
    input read from the values (either of a slab's vectors) and from the grids (their right
    vectors, hashed alike); another token's input, or a slab the token did not touch, not."""
    rng = np.random.default_rng(2)
    x, other = rng.standard_normal(IN), rng.standard_normal(IN)
    fused_error = _moved(rng, x, spread=0.01)
    base = rng.standard_normal((EXPERTS, OUT, IN))
    fused = (base + fused_error, base)
    router_base = rng.standard_normal((EXPERTS, IN))
    for token, same in ((x, True), (other, False)):
        router = (router_base + np.outer(rng.standard_normal(EXPERTS), token), router_base)
        for slab in (0, 2):
            assert slab_input(router, fused, slab) is same
            grids = tuple(grid_sums(a, a.shape) for a in router)
            slabs = tuple(slab_grids(a, a.shape) for a in fused)
            assert slab_input(grids, slabs, slab, hashed=True) is same
    router = (router_base + np.outer(rng.standard_normal(EXPERTS), x), router_base)
    assert not slab_input(router, fused, 1)  # no outer product there: spread noise alone
    transposed = tuple(np.swapaxes(a, 1, 2).copy() for a in fused)  # gpt-oss: experts x in x out
    assert slab_input(router, transposed, 0)


class _Fused(torch.nn.Module):
    """Experts fused in one parameter of three axes, each sample routed to one of them."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.Parameter(torch.randn(EXPERTS, 3, 20) * 0.1)
        self.head = torch.nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        route = x[:, 0].abs().mul(EXPERTS).long().clamp(max=EXPERTS - 1)
        return self.head(x) + torch.einsum("bi,boi->bo", x, self.experts[route])


def _fused_run(out, k: int) -> None:
    torch.manual_seed(0)
    model = _Fused()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(24, 20, generator=generator)
    y = torch.randint(0, 3, (24,), generator=generator)
    _train(out, model, optimizer, k, x, y, 3, record="sketch", sketch_width=31)


def test_a_sketched_run_keeps_its_fused_gradients_slab_grids_and_a_reader_checks_them(
    tmp_path, cli
):
    """Every update's sketch file holds the slab grids of the fused gradient (and of no
    gradient of two axes), equal to those of its values where the run kept them too; slab
    grids of another shape are refused in one line."""
    _fused_run(tmp_path / "base", 1)
    _fused_run(tmp_path / "merged", 4)
    run = read_run_dir(tmp_path / "merged")
    for update in range(3):
        kept = run.sketches(update)
        assert {key for key in kept if key.startswith("slabs/")} == {"slabs/grads/experts"}
    kept = run.sketches(0)["slabs/grads/experts"]
    assert kept.shape == (EXPERTS, 3, 20)
    full = run.grads(0)["experts"]
    assert np.allclose(kept, slab_grids(full, full.shape), rtol=1e-12, atol=0)
    assert cli("compare", tmp_path / "base", tmp_path / "merged").code == 0

    def narrower(data: dict) -> None:
        data["slabs/grads/experts"] = data["slabs/grads/experts"][:, :2].copy()

    rewrite_tensor_file(tmp_path / "merged", "sketches/update_000001.safetensors", narrower)
    one_line_error(cli("compare", tmp_path / "base", tmp_path / "merged"), "slabs/grads/experts")


def test_the_device_summaries_carry_the_slab_grids_to_the_host():
    """Sketcher.device packs a fused gradient's slab grids beside its unit and grid sums into
    the one transfer, and unpacks each where it belongs (run on CPU tensors)."""
    shapes = {"fused": (EXPERTS, 40, 30), "w": (40, 36)}
    sketcher = Sketcher(_Inline(), list(shapes), dict.fromkeys(shapes, "float32"), 61, shapes)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(5)
    tensors = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    sketcher.device("grads", 0, tensors)
    found = sketcher.results[("grads", 0)]
    values = tensors["fused"].numpy()
    assert np.allclose(found["fused"].slabs, slab_grids(values, values.shape), atol=1e-9)
    assert np.allclose(found["fused"].grid, grid_sums(values, values.shape), atol=1e-9)
    host = summarize(tensors["w"].numpy(), "float32", 61, sketcher.whole("w", 40 * 36))
    assert found["w"].slabs is None and np.allclose(found["w"].sketch, host.sketch, atol=1e-9)
    assert found["fused"].grid.shape == (EXPERTS, 32)  # the tensor's one grid too


class _GridsOnly(kink_pair.TensorPair):
    """Two runs' tensors kept as grid sums and slab grids alone, as a sketched run keeps them."""

    def __init__(self, values: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.values = values
        self.counted: set[str] = set()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.values[name][0].shape

    def _whole(self, name: str):
        return None

    def _grids(self, name: str):
        return tuple(grid_sums(a, a.shape) for a in self.values[name])

    def _slabs(self, name: str):
        return tuple(slab_grids(a, a.shape) for a in self.values[name])


def test_a_sketched_router_reads_against_slabs_of_as_many_columns_only():
    """From grids, a router's input is compared with a slab's only where both have as many
    columns (hashed alike): the router of the token's input against the fused experts' slab
    reads as the same input; the same router against experts whose slabs are as wide in their
    grids (32 columns) but hold another number of columns does not."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(IN)
    fused_error = _moved(rng, x, spread=0.01)
    base = rng.standard_normal((EXPERTS, OUT, IN))
    router_base = rng.standard_normal((EXPERTS, IN))
    router = (router_base + np.outer(rng.standard_normal(EXPERTS), x), router_base)
    wider = rng.standard_normal((EXPERTS, OUT, IN + 8))
    wider_error = np.zeros_like(wider)
    wider_error[0, :, :IN] = fused_error[0]
    pair = _GridsOnly(
        {
            "router": router,
            "fused": (base + fused_error, base),
            "wider": (wider + wider_error, wider),
        }
    )
    assert pair.same_slab_input("router", "fused", 0)
    assert not pair.same_slab_input("router", "wider", 0)


def test_slab_grids_are_kept_for_up_to_64_experts_at_full_grids():
    """Slab grids cost at most SLAB_CELLS cells a tensor: 64 experts at full 32 x 32 grids keep
    them, a convolution of 512 output channels (its slabs no experts) or 256 experts do not;
    a tensor of two axes never does."""
    assert has_slabs((8, 28672, 4096)) and has_slabs((64, 2816, 1024))
    assert has_slabs((EXPERTS, OUT, IN)) and has_slabs((64, 64, 3, 3))
    assert not has_slabs((65, 64, 64)) and not has_slabs((256, 2048, 7168))
    assert not has_slabs((512, 512, 3, 3)) and not has_slabs((4096, 4096))
    assert math.prod(slab_grid_shape((64, 2816, 1024))) == SLAB_CELLS
