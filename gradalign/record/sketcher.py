"""Sketch mode's per-update summaries of weights and gradients (runs/sketches.py defines them).

On the CPU a summary is computed in the background from the snapshot copy (numpy, one pass over
the copy in cache-sized blocks). On a GPU it is computed on the device by torch, without a host
sync: the small results are copied asynchronously to pinned memory and written in the
background. The signs are made on the device too, once per tensor size, and kept one bit per
element (1/32 of the tensor's float32 size; a float32 table would cost the GPU memory of a
copy of the model). Infinities are held apart from the sketch as on the host
(runs/sketches.py), their codes' sketch made for every block: the host learns only when the
results arrive whether there was one. Either way the results land in
`sketches/update_NNNNNN.safetensors`, and the fingerprints in the series.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import numpy as np
import torch

from ..runs.background import BackgroundWriter
from ..runs.grid_sums import (
    COLUMNS,
    ROWS,
    grid_shape,
    grid_sums,
    has_slabs,
    slab_grid_shape,
    slab_grids,
)
from ..runs.layout import sketch_file
from ..runs.sketches import WHOLE_1D, WIDTH, Summary, kept_whole, summarize
from ..runs.unit_sums import GROUPS, has_units, unit_sums
from .facts import fingerprint

_NOTHING = np.zeros(0)  # a written summary's sketch: its file holds it
_BLOCK = 1 << 24  # elements per device block (its float64 copy and its infinities' codes)
# splitmix64's constants as int64 (torch has no uint64 arithmetic; int64 wraps the same way)
_GOLDEN, _M1, _M2 = (
    c - (1 << 64) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
)


def negative_signs(first: int, count: int, device: torch.device | str) -> torch.Tensor:
    """Whether σ(i) = −1 for i in first..first+count−1, computed on `device`: bit 63 of
    splitmix64(i), as `runs.summaries._signs` (a logical shift is an arithmetic one masked;
    splitmix64's last step, z ^ (z >> 31), leaves bit 63 as it is)."""
    z = torch.arange(first, first + count, dtype=torch.int64, device=device) + _GOLDEN
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _M1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _M2
    return z < 0


def packed_signs(n: int, device: torch.device | str) -> torch.Tensor:
    """σ(0..n−1) as bits, 8 to a byte (bit j of byte k: element 8k + j is negative)."""
    weights = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8, device=device)
    packed = torch.empty((n + 7) // 8, dtype=torch.uint8, device=device)
    step = _BLOCK >> 2  # int64 temporaries of 32 MiB
    for first in range(0, n, step):
        count = min(step, n - first)
        bits = torch.zeros((count + 7) // 8 * 8, dtype=torch.uint8, device=device)
        bits[:count] = negative_signs(first, count, device)
        packed[first // 8 : first // 8 + bits.numel() // 8] = (bits.view(-1, 8) * weights).sum(
            1, dtype=torch.uint8
        )
    return packed


def unpacked_signs(packed: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """σ(first..first+count−1) as int8 ±1 from `packed_signs` (`first` a multiple of 8)."""
    part = packed[first // 8 : (first + count + 7) // 8]
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = ((part.unsqueeze(1) >> shifts) & 1).view(-1)[:count]
    return 1 - 2 * bits.to(torch.int8)


def _add_signed_rows(values: torch.Tensor, signs: torch.Tensor, into: torch.Tensor) -> None:
    """into += Σ over rows of (values × signs) laid out in rows of into's width (in place)."""
    width = into.numel()
    values *= signs
    rows = values.numel() // width
    into += values[: rows * width].view(rows, width).sum(0, dtype=torch.float64)
    tail = values[rows * width :]
    into[: tail.numel()] += tail


class Sketcher:
    """Summaries per (kind, update): kind "weights" or "grads"; update None = initial."""

    def __init__(
        self,
        files: BackgroundWriter,
        names: list[str],
        declared: dict[str, str],
        width: int = WIDTH,
        shapes: dict[str, tuple[int, ...]] | None = None,
        whole_1d: int = WHOLE_1D,
    ):
        """`shapes`: each tensor's (global) shape, which says whether it is kept whole
        (`runs.sketches.kept_whole`; without shapes, by its size alone)."""
        self.files, self.names, self.declared = files, names, declared
        self.width, self.shapes = width, shapes or {}
        self.whole_1d = whole_1d if shapes is not None else 0
        self.results: dict[tuple[str, int | None], dict[str, Summary]] = {}
        self._lock = threading.Lock()
        self._device_signs: dict[tuple[int, str], torch.Tensor] = {}
        self._grid_signs: dict[tuple[int, int, str], torch.Tensor] = {}

    def host(
        self,
        kind: str,
        update: int | None,
        arrays: dict[str, np.ndarray],
        ready: Callable[[], None] | None,
        release: Callable[[], None],
    ) -> None:
        """Summarize host copies in the background (they are released afterwards)."""

        def job() -> None:
            if ready is not None:
                ready()
            found = {}
            for n, a in arrays.items():
                summary = summarize(a, self.declared[n], self.width, self.whole(n, a.size))
                if self.with_units(kind, n, a.size):
                    shape = self.shapes[n]
                    slabs = slab_grids(a, shape) if has_slabs(shape) else None
                    summary = dataclasses.replace(
                        summary, units=unit_sums(a, shape), grid=grid_sums(a, shape), slabs=slabs
                    )
                found[n] = summary
            self._store(kind, update, found)

        self.files.run(job, sum(a.nbytes for a in arrays.values()), release)

    def device(self, kind: str, update: int | None, tensors: dict[str, torch.Tensor]) -> None:
        """Summarize live device tensors on the device; the results follow asynchronously."""
        with torch.no_grad():
            parts = [self._on_device(t, self.whole(n, t.numel())) for n, t in tensors.items()]
            units = [
                self._device_unit_parts(t, self.shapes[n])
                if self.with_units(kind, n, t.numel())
                else None
                for n, t in tensors.items()
            ]
            floats = torch.cat(
                [
                    torch.cat([s, q.reshape(1), h, c.reshape(1), *([] if u is None else [u])])
                    for (s, q, _, h, c), u in zip(parts, units, strict=True)
                ]
            ).to("cpu", non_blocking=True)
            prints = torch.stack([p[2] for p in parts]).to("cpu", non_blocking=True)
        event = None  # tensors on the CPU (the suite's check of this path) are there already
        if any(t.is_cuda for t in tensors.values()):
            event = torch.cuda.Event()
            event.record()
        kept = [u is not None for u in units]
        sizes = [(p[0].numel(), p[3].numel(), k) for p, k in zip(parts, kept, strict=True)]
        names = list(tensors)

        def job() -> None:
            if event is not None:
                event.synchronize()
            values, fps = floats.numpy(), prints.numpy()
            found, at = {}, 0
            for p, (name, (size, held, kept)) in enumerate(zip(names, sizes, strict=True)):
                sketch, sumsq = values[at : at + size].copy(), float(values[at + size])
                at += size + 1
                marks, count = values[at : at + held].copy(), values[at + held]
                at += held + 1
                summary = Summary(sketch, sumsq, int(fps[p]), marks if count else None)
                if kept:
                    rows_n, columns_n = self.shapes[name][:2]
                    rows = values[at : at + rows_n * GROUPS].reshape(rows_n, GROUPS).copy()
                    at += rows_n * GROUPS
                    columns = values[at : at + columns_n * GROUPS].reshape(columns_n, GROUPS)
                    at += columns_n * GROUPS
                    grid_rows, grid_columns = grid_shape(self.shapes[name])
                    cells = grid_rows * grid_columns
                    grid = values[at : at + cells].reshape(grid_rows, grid_columns).copy()
                    at += cells
                    slabs = None
                    if has_slabs(self.shapes[name]):
                        shape = slab_grid_shape(self.shapes[name])
                        cells = shape[0] * shape[1] * shape[2]
                        slabs = values[at : at + cells].reshape(shape).copy()
                        at += cells
                    summary = dataclasses.replace(
                        summary, units=(rows, columns.copy()), grid=grid, slabs=slabs
                    )
                found[name] = summary
            self._store(kind, update, found)

        self.files.run(job)

    def whole(self, name: str, size: int) -> bool:
        """Whether the tensor `name` (of `size` elements) is kept whole."""
        return kept_whole(self.shapes.get(name, (size,)), self.width, self.whole_1d)

    def with_units(self, kind: str, name: str, size: int) -> bool:
        """Whether a summary keeps unit sums: a sketched gradient of two axes or more (the
        judge reads them to tell a kink from a bug: runs/unit_sums.py)."""
        shape = self.shapes.get(name)
        return (
            kind == "grads"
            and shape is not None
            and has_units(shape)
            and not self.whole(name, size)
        )

    def _device_units(self, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """`runs.unit_sums.unit_sums` by torch, on the device, in blocks of rows: the row sums
        and then the column sums, flattened (float64)."""
        x = tensor.detach().reshape(-1)
        n = x.numel()
        rows_n, columns_n = int(shape[0]), int(shape[1])
        per_row = n // rows_n
        inner = per_row // columns_n
        table = self._signs(n, x.device)
        rows = torch.zeros(rows_n, GROUPS, dtype=torch.float64, device=x.device)
        columns = torch.zeros(GROUPS, columns_n, dtype=torch.float64, device=x.device)
        grouped = per_row - per_row % GROUPS
        step = max(1, _BLOCK // per_row)
        for first in range(0, rows_n, step):
            count = min(step, rows_n - first)
            start = first * per_row
            low = start - start % 8  # the packed signs start at whole bytes
            signs = unpacked_signs(table, low, start - low + count * per_row)[start - low :]
            signed = x[start : start + count * per_row].to(torch.float64) * signs
            signed = signed.view(count, per_row)
            held = rows[first : first + count]
            held += signed[:, :grouped].reshape(count, -1, GROUPS).sum(1)
            held[:, : per_row - grouped] += signed[:, grouped:]
            by_column = signed.view(count, columns_n, inner).sum(2)
            for t in range(GROUPS):
                columns[t] += by_column[(t - first) % GROUPS :: GROUPS].sum(0)
            del signed, signs, by_column
        return torch.cat([rows.reshape(-1), columns.t().reshape(-1)])

    def _device_unit_parts(self, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A gradient's unit sums, grid sums and (three axes or more) slab grids, flattened in
        that order into one float64 vector, on the device."""
        parts = [self._device_units(tensor, shape), self._device_grid(tensor, shape).reshape(-1)]
        if has_slabs(shape):
            parts.append(self._device_slabs(tensor, shape).reshape(-1))
        return torch.cat(parts)

    def _device_slabs(self, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """`runs.grid_sums.slab_grids` by torch, on the device: [E, P, Q], float64, in blocks
        of whole slabs (a slab larger than a block by `_device_grid`, in blocks of its rows)."""
        slabs, rows_n = int(shape[0]), int(shape[1])
        x = tensor.detach().reshape(slabs, rows_n, -1)
        columns_n = x.shape[2]
        if rows_n * columns_n > _BLOCK:
            return torch.stack([self._device_grid(x[e], tuple(shape[1:])) for e in range(slabs)])
        p, q = grid_shape((rows_n, columns_n))
        flip_columns = self._axis_signs(COLUMNS, columns_n, x.device)
        flip_rows = self._axis_signs(ROWS, rows_n, x.device)
        found = torch.empty(slabs, p, q, dtype=torch.float64, device=x.device)
        grouped, padded = columns_n - columns_n % q, -(-rows_n // p) * p
        step = max(1, _BLOCK // (rows_n * columns_n))  # whole slabs
        for first in range(0, slabs, step):
            signed = x[first : first + step].to(torch.float64) * flip_columns
            count = signed.shape[0]
            folded = signed[..., :grouped].reshape(count, rows_n, -1, q).sum(2)
            folded[..., : columns_n - grouped] += signed[..., grouped:]
            folded *= flip_rows[:, None]
            laid = folded.new_zeros(count, padded, q)  # row r goes to bucket r mod P
            laid[:, :rows_n] = folded
            found[first : first + count] = laid.reshape(count, -1, p, q).sum(1)
            del signed, folded, laid
        return found

    def _device_grid(self, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """`runs.grid_sums.grid_sums` by torch, on the device, in blocks of rows: [P, Q],
        float64."""
        rows_n = int(shape[0])
        x = tensor.detach().reshape(rows_n, -1)
        columns_n = x.shape[1]
        p, q = grid_shape((rows_n, columns_n))
        flip_columns = self._axis_signs(COLUMNS, columns_n, x.device)
        flip_rows = self._axis_signs(ROWS, rows_n, x.device)
        grid = torch.zeros(p, q, dtype=torch.float64, device=x.device)
        grouped = columns_n - columns_n % q
        step = max(1, _BLOCK // columns_n)  # whole rows
        for first in range(0, rows_n, step):
            signed = x[first : first + step].to(torch.float64) * flip_columns
            count = signed.shape[0]
            folded = signed[:, :grouped].reshape(count, -1, q).sum(1)
            folded[:, : columns_n - grouped] += signed[:, grouped:]
            folded *= flip_rows[first : first + count, None]
            shift = first % p  # row first + r goes to bucket (first + r) mod P
            laid = folded.new_zeros(-(-(shift + count) // p) * p, q)
            laid[shift : shift + count] = folded
            grid += laid.reshape(-1, p, q).sum(0)
            del signed, folded, laid
        return grid

    def _axis_signs(self, offset: int, count: int, device: torch.device) -> torch.Tensor:
        """A grid's row or column signs (`runs.grid_sums`) as float64 ±1 on `device`, made once
        per count."""
        key = (offset, count, str(device))
        signs = self._grid_signs.get(key)
        if signs is None:
            signs = 1.0 - 2.0 * negative_signs(offset, count, device).to(torch.float64)
            self._grid_signs[key] = signs
        return signs

    def _signs(self, n: int, device: torch.device) -> torch.Tensor:
        """The packed signs of a tensor of n elements on `device`, made once per size."""
        key = (n, str(device))
        table = self._device_signs.get(key)
        if table is None:
            table = packed_signs(n, device)
            self._device_signs[key] = table
        return table

    def _on_device(
        self, tensor: torch.Tensor, whole: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`runs.sketches.summarize` by torch: the sketch, the squared norm, the fingerprint, and
        the infinities held apart (their codes' sketch, and their count: 0 where none)."""
        x = tensor.detach().reshape(-1)
        n, width = x.numel(), self.width
        none = torch.zeros((), dtype=torch.float64, device=x.device)
        if whole:
            exact = x.double()
            return exact, exact.dot(exact), fingerprint(tensor), none.new_zeros(0), none
        table = self._signs(n, x.device)
        sums = torch.zeros(width, dtype=torch.float64, device=x.device)
        held = torch.zeros(width, dtype=torch.float64, device=x.device)
        sumsq, count = none.clone(), none.clone()
        step = max(1, _BLOCK // (8 * width)) * 8 * width  # whole rows, whole bytes of signs
        for first in range(0, n, step):
            part = x[first : first + step].to(torch.float64, copy=True)  # never the tensor
            signs = unpacked_signs(table, first, part.numel())
            infinite = part.isinf()
            codes = infinite.to(torch.int8)  # 1 for +inf, 2 for -inf, 0 elsewhere: one byte each
            codes += part.signbit() & infinite
            part.masked_fill_(infinite, 0.0)
            count += infinite.sum()
            _add_signed_rows(part, signs, sums)
            _add_signed_rows(codes, signs, held)
            sumsq += part.dot(part)
            del part, signs, infinite, codes  # freed before the next block is made
        return sums, sumsq, fingerprint(tensor), held, count

    def _store(self, kind: str, update: int | None, found: dict[str, Summary]) -> None:
        with self._lock:
            self.results[(kind, update)] = found
        if kind == "weights":
            self._write(update)

    def _write(self, update: int | None) -> None:
        """The update's sketch file: its weights, and its gradient when one was recorded."""
        tensors: dict[str, np.ndarray] = {}
        for kind in ("weights", "grads"):
            found = self.results.get((kind, update))
            if found is None:
                continue
            for name, summary in found.items():
                tensors[f"{kind}/{name}"] = summary.sketch
                if summary.held is not None:
                    tensors[f"held/{kind}/{name}"] = summary.held
                if summary.units is not None:
                    tensors[f"rows/{kind}/{name}"] = summary.units[0]
                    tensors[f"columns/{kind}/{name}"] = summary.units[1]
                if summary.grid is not None:
                    tensors[f"grid/{kind}/{name}"] = summary.grid
                if summary.slabs is not None:
                    tensors[f"slabs/{kind}/{name}"] = summary.slabs
            norms = [np.sqrt(found[n].sumsq) if n in found else 0.0 for n in self.names]
            tensors[f"norms/{kind}"] = np.asarray(norms, dtype=np.float64)
            with self._lock:  # only the fingerprints are read again (the series)
                self.results[(kind, update)] = {
                    name: Summary(_NOTHING, 0.0, summary.fingerprint)
                    for name, summary in found.items()
                }
        self.files.write_tensors(sketch_file(update), tensors)

    def fingerprints(self, kind: str, update: int | None) -> np.ndarray | None:
        found = self.results.get((kind, update))
        if found is None:
            return None
        return np.asarray([found[n].fingerprint if n in found else 0 for n in self.names], np.int64)
