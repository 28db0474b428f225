"""A micro-batch's sample digests (docs/FORMAT.md, "Sample digests").

    micro/data    the order-free sum of the bits of every kept element of every tensor of the
                  batch: the same values in a window as in the baseline's batch
    micro/pairs   the same elements summed per row (a sample: row i of every tensor), each row's
                  sums over the tensors mixed into one number (splitmix64), the rows' numbers
                  summed: it changes where a row's elements move to another row, as when inputs
                  are paired with another micro-batch's targets (two loaders zipped) or rows are
                  split or joined (a sequence cut along time)

Both add up over micro-batches and over ranks. `micro/pairs` is kept only where every tensor of
every micro-batch shares one leading dimension; the judge reads it as evidence, never as a check
(a collator that packs each batch into other rows trains alike with other rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..runs.digests import wrap

_MASK64 = (1 << 64) - 1
_MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _splitmix(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX[0]) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX[1]) & _MASK64
    return value ^ (value >> 31)


def tensor_weight(index: int) -> int:
    """The odd multiplier of the batch's `index`-th tensor in a row's combination."""
    return _splitmix(index) | 1


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass
class Digest:
    """One micro-batch's digests: `data` (an int, or a 0-d int64 tensor on a device: no host
    sync) and `pairs` (likewise; None where the tensors share no leading dimension). On a
    device a batch whose tensors share their rows keeps only its row sums (`rows`, [tensors,
    rows] int64, `_InFlight` once on their way to the host); on the CPU likewise, one int64
    array per tensor, mixed later with other batches' (`mix_host`): `resolve` makes both ints."""

    data: int | torch.Tensor | None
    pairs: int | torch.Tensor | None
    rows: torch.Tensor | _InFlight | tuple[np.ndarray, ...] | None = None


@dataclass
class _InFlight:
    """Row sums copied to the host (`held[at:at + size]`, shaped as `shape`), readable once
    `landed` has happened (None: the copy waited)."""

    held: torch.Tensor
    at: int
    shape: tuple[int, int]
    landed: torch.cuda.Event | None

    def array(self) -> np.ndarray:
        if self.landed is not None:
            self.landed.synchronize()
        size = self.shape[0] * self.shape[1]
        return self.held[self.at : self.at + size].numpy().reshape(self.shape)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The int64 bit patterns the digests sum: floating values as float32 bits (so a float64
    rerun of float32 data digests alike), integers and bools as they are."""
    tensor = tensor.detach()
    if tensor.dtype.is_floating_point:
        tensor = tensor.float().view(torch.int32)
    return tensor.to(torch.int64)


def row_sums(tensor: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Per row (the leading dimension), the sum of the kept elements' bits, int64 with wrap:
    the bits in their own integer type, widened by the sum as it reads them (one kernel for a
    float32 or integer tensor without a mask, where `bits` would copy them to int64 first)."""
    values = tensor.detach()
    if values.dtype.is_floating_point:
        values = values.float().view(torch.int32)
    if keep is not None:
        values = torch.where(keep, values, 0)
    return values.reshape(values.shape[0], _row_size(values.shape)).sum(dim=1, dtype=torch.int64)


def digest(tensors: list[torch.Tensor], keeps: list[torch.Tensor | None]) -> Digest:
    """The digests of a micro-batch's tensors, each with its kept elements (None: all). On the
    CPU by numpy (which reads memory ~10x faster than torch's int64 sum on one thread), on a
    device by torch without a host sync."""
    leading = {t.shape[0] if t.dim() else None for t in tensors}
    paired = bool(tensors) and len(leading) == 1 and None not in leading
    if tensors and all(t.device.type == "cpu" for t in tensors):
        arrays = [_host_bits(t) for t in tensors]
        masks = [None if k is None else k.cpu().numpy() for k in keeps]
        if not paired:
            data = sum(int(_np_total(a, k)) for a, k in zip(arrays, masks, strict=True))
            return Digest(wrap(data), None)
        return Digest(None, None, tuple(_np_rows(a, k) for a, k in zip(arrays, masks, strict=True)))
    if not paired:  # a device's tensors: 0-d int64 tensors, read at the end
        totals = [_total(t, k) for t, k in zip(tensors, keeps, strict=True)]
        return Digest(torch.stack([v.to(totals[0].device) for v in totals]).sum(), None)
    device = next(t.device for t in tensors if t.device.type != "cpu")
    return device_rows(tensors, keeps, device)


def device_rows(
    tensors: list[torch.Tensor], keeps: list[torch.Tensor | None], device: torch.device
) -> Digest:
    """A device batch whose tensors share their rows: its row sums alone, stacked on `device`
    (an operation a tensor and one to stack them; mixing them there took 25 for two tensors,
    each launched from the training thread); `resolve` mixes them on the host, as the CPU's
    digest does."""
    rows = [row_sums(t, k).to(device) for t, k in zip(tensors, keeps, strict=True)]
    return Digest(None, None, torch.stack(rows))


def _total(tensor: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    values = bits(tensor)
    return (values if keep is None else values[keep]).sum(dtype=torch.int64)


def _host_bits(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.dtype.is_floating_point:
        return tensor.float().contiguous().numpy().view(np.int32)
    return tensor.contiguous().numpy()


def _np_total(values: np.ndarray, keep: np.ndarray | None) -> np.integer:
    return (values if keep is None else values[keep]).sum(dtype=np.int64)


def _row_size(shape) -> int:
    """Elements per row (explicit: a reshape to (0, -1) of a micro-batch of no rows fails)."""
    return math.prod(shape[1:])


def _np_rows(values: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    if keep is not None:
        values = np.where(keep, values, 0)
    return values.reshape(values.shape[0], _row_size(values.shape)).sum(axis=1, dtype=np.int64)


def np_mixed_rows(rows: np.ndarray) -> int:
    """Σ_rows splitmix64(Σ_tensors weight_t · row sum), in uint64 (two's complement wrap, as
    int64): `rows` holds one tensor's row sums per line (int64, [tensors, rows])."""
    return _signed(int(_mixed(rows).sum(dtype=np.uint64)))


def _mixed(rows: np.ndarray) -> np.ndarray:
    """Per row (a column of `rows`, int64 [tensors, rows]), splitmix64(Σ_tensors weight_t · row
    sum) as uint64; every operation wraps, in place where it can (`rows` is left as it is)."""
    sums = rows.view(np.uint64)
    z = _weights(sums.shape[0]) @ sums  # Σ_tensors weight_t · row sum, per row
    z += np.uint64(0x9E3779B97F4A7C15)
    for shift, factor in ((30, _MIX[0]), (27, _MIX[1])):
        z ^= z >> np.uint64(shift)
        z *= np.uint64(factor)
    z ^= z >> np.uint64(31)
    return z


def mix_host(digests: list[Digest]) -> None:
    """Give each CPU batch's digest still holding its row sums its `data` and `pairs` as
    `np_mixed_rows` would, the batches of one tensor count mixed in one pass over all their
    rows (a dozen numpy calls per batch cost more than the row sums themselves at B=32)."""
    groups: dict[int, list[Digest]] = {}
    for digest in digests:
        if isinstance(digest.rows, tuple):
            groups.setdefault(len(digest.rows), []).append(digest)
    for count, these in groups.items():
        held = [d.rows for d in these]
        lengths = np.array([r[0].shape[0] for r in held], dtype=np.int64)  # type: ignore[index]
        rows = np.stack([np.concatenate([r[t] for r in held]) for t in range(count)])  # type: ignore[index]
        data = _segment_sums(rows.sum(axis=0, dtype=np.int64), lengths)  # wraps, as one sum
        pairs = _segment_sums(_mixed(rows), lengths)
        for digest, total, mixed in zip(these, data.tolist(), pairs.tolist(), strict=True):
            digest.data, digest.pairs, digest.rows = wrap(total), _signed(mixed), None


def _segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The sums of consecutive runs of `values` of these lengths (0 for an empty one; reduceat
    would give the next element), wrapping."""
    out = np.zeros(len(lengths), dtype=values.dtype)
    starts = np.cumsum(lengths) - lengths
    filled = lengths > 0
    if filled.any():
        out[filled] = np.add.reduceat(values, starts[filled])
    return out


_WEIGHTS: dict[int, np.ndarray] = {}
_MIX_AT = 1 << 16  # CPU row sums a run holds before `Digests.send` mixes them


def _weights(count: int) -> np.ndarray:
    """The first `count` tensors' weights (`tensor_weight`) as uint64, made once per count."""
    found = _WEIGHTS.get(count)
    if found is None:
        found = _WEIGHTS[count] = np.array([tensor_weight(i) for i in range(count)], np.uint64)
    return found


class Digests:
    """A run's digests in micro-step order. On a device, each window's row sums start for the
    host at its `send()` (one copy into pinned memory, no wait: the run's device memory does
    not grow with them), and those landed by a later `send()` are mixed, freeing their host
    memory too; `series()` reads the rest. On the CPU the row sums wait for `send()` to mix
    them once they hold `_MIX_AT` values (so a long run's host memory does not grow either)."""

    def __init__(self) -> None:
        self.all: list[Digest] = []
        self._unsent = 0  # the first digest `send` has not seen
        self._unmixed = 0  # the first digest that may still be in flight
        self._host = 0  # the first digest whose CPU row sums may be unmixed
        self._held = 0  # CPU row sums held since then

    def __len__(self) -> int:
        return len(self.all)

    def append(self, digest: Digest) -> None:
        self.all.append(digest)
        if isinstance(digest.rows, tuple):
            self._held += sum(r.size for r in digest.rows)

    def send(self) -> None:
        while self._unmixed < self._unsent:  # copies land in the order they were made
            rows = self.all[self._unmixed].rows
            if isinstance(rows, _InFlight):
                if not rows.landed.query():
                    break
                _mix(self.all[self._unmixed], rows.array())
            self._unmixed += 1
        if self._held >= _MIX_AT:
            mix_host(self.all[self._host :])
            self._host, self._held = len(self.all), 0
        waiting = _by_device(self.all[self._unsent :], cuda_only=True)
        self._unsent = len(self.all)
        for these in waiting:
            _to_host(these, wait=False)

    def series(self) -> dict[str, np.ndarray]:
        return series(self.all)


def resolve(digests: list[Digest]) -> None:
    """Give every digest still holding row sums its `data` and `pairs` as ints: those on a
    device fetched in one transfer, those on their way to the host once landed, those on the
    CPU mixed together."""
    for these in _by_device(digests, cuda_only=False):
        _to_host(these, wait=True)
    for digest in digests:
        if isinstance(digest.rows, _InFlight):
            _mix(digest, digest.rows.array())
    mix_host(digests)


def _by_device(digests: list[Digest], cuda_only: bool) -> list[list[Digest]]:
    """The digests whose row sums are still a tensor (a CUDA one, with `cuda_only`), by device."""
    found: dict[torch.device, list[Digest]] = {}
    for digest in digests:
        rows = digest.rows
        if isinstance(rows, torch.Tensor) and (rows.is_cuda or not cuda_only):
            found.setdefault(rows.device, []).append(digest)
    return list(found.values())


def _to_host(these: list[Digest], wait: bool) -> None:
    """Copy the row sums `these` keep on one device to the host in one transfer and point each
    digest at its part: waiting for it, or not (into pinned memory, an event recorded on the
    device's current stream after the copy)."""
    rows = torch.cat([d.rows.reshape(-1) for d in these])  # type: ignore[union-attr]
    held = rows.to("cpu", non_blocking=not wait)
    landed = None
    if not wait:
        landed = torch.cuda.Event()
        landed.record(torch.cuda.current_stream(rows.device))
    at = 0
    for digest in these:
        shape = (digest.rows.shape[0], digest.rows.shape[1])  # type: ignore[union-attr]
        digest.rows = _InFlight(held, at, shape, landed)
        at += shape[0] * shape[1]


def _mix(digest: Digest, rows: np.ndarray) -> None:
    """`data` and `pairs` from the row sums [tensors, rows], as `digest` computes them."""
    digest.data = wrap(int(rows.sum(dtype=np.int64)))
    digest.pairs = np_mixed_rows(rows)
    digest.rows = None


def series(digests: list[Digest]) -> dict[str, np.ndarray]:
    """`micro/data`, and `micro/pairs` where every micro-step has it; device values fetched in
    one transfer."""
    resolve(digests)
    values = [d.data for d in digests] + [d.pairs for d in digests]
    device = [v for v in values if isinstance(v, torch.Tensor)]
    fetched = iter(torch.stack(device).cpu().tolist() if device else [])
    plain = [wrap(next(fetched)) if isinstance(v, torch.Tensor) else v for v in values]
    n = len(digests)
    out = {"micro/data": np.asarray(plain[:n], dtype=np.int64)}
    if n and all(v is not None for v in plain[n:]):
        out["micro/pairs"] = np.asarray(plain[n:], dtype=np.int64)
    return out
