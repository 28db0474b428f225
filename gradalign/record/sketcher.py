"""Sketch mode's per-update summaries of weights and gradients (runs/sketches.py defines them).

On the CPU a summary is computed in the background from the snapshot copy (numpy, one pass over
the copy in cache-sized blocks). On a GPU it is computed on the device by torch, without a host
sync: the small results are copied asynchronously to pinned memory and written in the
background. Either way the results land in `sketches/update_NNNNNN.safetensors`, and the
fingerprints in the series.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from ..runs.background import BackgroundWriter
from ..runs.layout import sketch_file
from ..runs.sketches import WIDTH, Summary, signs, summarize
from .facts import fingerprint

_BLOCK = 1 << 24  # elements per device block (the float64 copy of a block is the only temp)


class Sketcher:
    """Summaries per (kind, update): kind "weights" or "grads"; update None = initial."""

    def __init__(
        self,
        files: BackgroundWriter,
        names: list[str],
        declared: dict[str, str],
        width: int = WIDTH,
    ):
        self.files, self.names, self.declared = files, names, declared
        self.width = width
        self.results: dict[tuple[str, int | None], dict[str, Summary]] = {}
        self._lock = threading.Lock()
        self._device_signs: dict[tuple[int, str], torch.Tensor] = {}

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
            found = {n: summarize(a, self.declared[n], self.width) for n, a in arrays.items()}
            self._store(kind, update, found)

        self.files.run(job, sum(a.nbytes for a in arrays.values()), release)

    def device(self, kind: str, update: int | None, tensors: dict[str, torch.Tensor]) -> None:
        """Summarize live device tensors on the device; the results follow asynchronously."""
        with torch.no_grad():
            parts = [self._on_device(t) for t in tensors.values()]
            floats = torch.cat([torch.cat([s, q.reshape(1)]) for s, q, _ in parts]).to(
                "cpu", non_blocking=True
            )
            prints = torch.stack([f for _, _, f in parts]).to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        sizes = [s.numel() for s, _, _ in parts]
        names = list(tensors)

        def job() -> None:
            event.synchronize()
            values, fps = floats.numpy(), prints.numpy()
            found, at = {}, 0
            for p, (name, size) in enumerate(zip(names, sizes, strict=True)):
                found[name] = Summary(
                    values[at : at + size].copy(), float(values[at + size]), int(fps[p])
                )
                at += size + 1
            self._store(kind, update, found)

        self.files.run(job)

    def _on_device(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = tensor.detach().reshape(-1)
        n, width = x.numel(), self.width
        if n <= width:
            exact = x.double()
            return exact, exact.dot(exact), fingerprint(tensor)
        key = (n, str(x.device))
        table = self._device_signs.get(key)
        if table is None:
            table = torch.from_numpy(signs(n)).to(x.device)
            self._device_signs[key] = table
        sums = torch.zeros(width, dtype=torch.float64, device=x.device)
        sumsq = torch.zeros((), dtype=torch.float64, device=x.device)
        step = max(1, _BLOCK // width) * width
        for first in range(0, n, step):
            part = (x[first : first + step].double()) * table[first : first + step]
            sumsq += part.dot(part)
            rows = part.numel() // width
            sums += part[: rows * width].view(rows, width).sum(0)
            tail = part[rows * width :]
            sums[: tail.numel()] += tail
        return sums, sumsq, fingerprint(tensor)

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
            norms = [np.sqrt(found[n].sumsq) if n in found else 0.0 for n in self.names]
            tensors[f"norms/{kind}"] = np.asarray(norms, dtype=np.float64)
        self.files.write_tensors(sketch_file(update), tensors)

    def fingerprints(self, kind: str, update: int | None) -> np.ndarray | None:
        found = self.results.get((kind, update))
        if found is None:
            return None
        return np.asarray([found[n].fingerprint if n in found else 0 for n in self.names], np.int64)
