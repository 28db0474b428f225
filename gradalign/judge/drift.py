"""The noise-dominated drift of `noise.Drift`, kept in scratch files instead of memory: one sparse
float64 file per tensor, created when the tensor's first element is dominated, and only the
slices that change are read and written back. Each slice's sum of squares is remembered, so the
allowance ||drift|| costs no pass over the file. What the other elements' noise explains is a
number per tensor, kept beside it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading

import numpy as np

from ..runs.sketches import dot


class DriftFiles:
    """Per tensor, the drift (float64 per element) in a file; per slice, its Σ drift²."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.sums: dict[str, dict[int, float]] = {}
        self.explained: dict[str, float] = {}  # per tensor, as `noise.Drift.explained`
        self.fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, name: str) -> int:
        with self._lock:
            fd = self.fds.get(name)
            if fd is None:
                if self.folder is None:
                    self.folder = tempfile.mkdtemp(prefix="gradalign-drift-")
                path = os.path.join(self.folder, f"{len(self.fds)}.f64")
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                self.fds[name] = fd
                self.sums[name] = {}
            return fd

    def add(self, name: str, first: int, steps: np.ndarray) -> np.ndarray | None:
        """drift[first : first + len(steps)] += steps; returns that slice of the drift as it is
        now (None where nothing was added: all steps 0)."""
        if not steps.any():
            return None
        fd = self._fd(name)
        new = self._read(fd, first, steps.size)
        new += steps
        os.pwrite(fd, memoryview(new).cast("B"), first * 8)
        self.sums[name][first] = dot(new, new)
        return new

    def slice(self, name: str, first: int, count: int) -> np.ndarray | None:
        """drift[first : first + count] (None while it is all 0)."""
        if not self.sums.get(name, {}).get(first):
            return None
        return self._read(self.fds[name], first, count)

    @staticmethod
    def _read(fd: int, first: int, count: int) -> np.ndarray:
        found = np.zeros(count)  # what lies beyond the file's end is 0
        os.preadv(fd, [memoryview(found).cast("B")], first * 8)
        return found

    def allowance(self, name: str) -> float:
        """||drift|| of a tensor (0 while none of its elements was dominated)."""
        sums = self.sums.get(name)
        return math.sqrt(math.fsum(sums.values())) if sums else 0.0

    def explain(self, name: str, sumsq: float) -> None:
        """Take one update's Σ(TAU·ρ·step)² of a tensor (`noise.noise_steps`, summed over its
        slices)."""
        self.explained[name] = self.explained.get(name, 0.0) + math.sqrt(sumsq)

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise (as `noise.Drift`)."""
        return self.allowance(name) + self.explained.get(name, 0.0)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
