"""The drift (judge/drift.py) by slice, for the streamed judge: 16 MiB of slices in memory, the
rest in one sparse float64 scratch file per tensor, only changed slices read and written back,
each slice's sum of squares kept: the allowance costs no pass over the file.

Where the judge runs in several processes (judge/owners.py), each keeps its own tensors' drift;
a tensor whose drift another process may follow (`published`) always lives in its file, and that
process reads it through the file's path and slice sums (`facts`, `foreign`)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading

import numpy as np

from ..runs.sketches import dot
from .drift import stepped


class DriftFiles:
    """Per tensor, the drift (float64 per element) by slice: held in memory up to `HELD_BYTES` in
    all, the rest in a scratch file per tensor; per slice, its Σ drift²."""

    HELD_BYTES = 16 << 20  # a file costs an open (0.1-0.6 ms): many small tensors stay in memory

    def __init__(self, folder: str | None = None, published: set[str] | None = None) -> None:
        """`folder`: where the scratch files go (made on first use; default: a new temporary
        folder, removed by `close`); `published`: tensors never held in memory."""
        self.folder: str | None = folder
        self.own_folder = folder is None
        self.published = published or set()
        self.foreign: dict[str, tuple[str, dict[int, float]]] = {}  # name: (path, slice sums)
        self.foreign_fds: dict[str, int] = {}
        self.sums: dict[str, dict[int, float]] = {}
        self.explained: dict[str, float] = {}  # per tensor, as `Drift.explained`
        self.stepped: dict[str, float] = {}  # per tensor, as `Drift.stepped`
        self.fds: dict[str, int] = {}
        self.paths: dict[str, str] = {}
        self.held: dict[tuple[str, int], np.ndarray] = {}
        self.held_bytes = 0
        self.noisy: set[str] = set()  # as `Drift.noisy`
        self.graded: set[str] = set()  # as `Drift.graded`
        self._lock = threading.Lock()

    def _fd(self, name: str) -> int:
        with self._lock:
            fd = self.fds.get(name)
            if fd is None:
                if self.folder is None:
                    self.folder = tempfile.mkdtemp(prefix="gradalign-drift-")
                os.makedirs(self.folder, exist_ok=True)
                path = os.path.join(self.folder, f"{len(self.fds)}.f64")
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                self.fds[name], self.paths[name] = fd, path
            return fd

    def _hold(self, name: str, first: int, count: int) -> np.ndarray | None:
        """The slice's array in memory: the one held, or a new one of zeros while the budget
        lasts and the slice was never written to the file (None: it lives in the file)."""
        with self._lock:
            key = (name, first)
            held = self.held.get(key)
            if held is not None or first in self.sums.get(name, {}) or name in self.published:
                return held
            if self.held_bytes + count * 8 > self.HELD_BYTES:
                return None
            self.held_bytes += count * 8
            held = self.held[key] = np.zeros(count)
            return held

    def add(
        self, name: str, first: int, steps: np.ndarray, now: np.ndarray | None = None
    ) -> np.ndarray | None:
        """drift[first : first + len(steps)] += steps; returns that slice of the drift as it is
        now (None where nothing was added: all steps 0). `now`: the slice as `slice` just
        returned it, updated in place instead of read from the file again."""
        if not steps.any():
            return None
        new = self._hold(name, first, steps.size)
        if new is not None:
            new += steps
        else:
            fd = self._fd(name)
            new = now if now is not None else self._read(fd, first, steps.size)
            new += steps
            os.pwrite(fd, memoryview(new).cast("B"), first * 8)
        self.sums.setdefault(name, {})[first] = dot(new, new)
        return new

    def slice(self, name: str, first: int, count: int) -> np.ndarray | None:
        """drift[first : first + count] (None while it is all 0)."""
        if name in self.foreign:
            path, sums = self.foreign[name]
            return (
                self._read(self._foreign_fd(name, path), first, count) if sums.get(first) else None
            )
        if not self.sums.get(name, {}).get(first):
            return None
        held = self.held.get((name, first))
        return held if held is not None else self._read(self.fds[name], first, count)

    def _foreign_fd(self, name: str, path: str) -> int:
        with self._lock:
            fd = self.foreign_fds.get(name)
            if fd is None:
                fd = self.foreign_fds[name] = os.open(path, os.O_RDONLY)
            return fd

    def facts(self, names: list[str]) -> dict[str, tuple[bool, str | None, dict[int, float]]]:
        """Per tensor named, what another process needs to follow its drift: whether it is
        graded, its file's path (None where it has none) and its slices' sums."""
        return {n: (n in self.graded, self.paths.get(n), dict(self.sums.get(n, {}))) for n in names}

    def follow(self, facts: dict[str, tuple[str, dict[int, float]]]) -> None:
        """Read these tensors of another process (name: path and slice sums) as they are now."""
        self.foreign.update(facts)

    @staticmethod
    def _read(fd: int, first: int, count: int) -> np.ndarray:
        found = np.zeros(count)  # what lies beyond the file's end is 0
        os.preadv(fd, [memoryview(found).cast("B")], first * 8)
        return found

    def allowance(self, name: str) -> float:  # ||drift|| (0 while no element was dominated)
        return allowance(self.sums.get(name))

    def explain(self, name: str, sumsq: float, largest: float = 0.0) -> None:
        """Take one update's Σ(TAU·ρ·step)² of a tensor and its largest step (`noise_steps`,
        over its slices)."""
        self.explained[name] = self.explained.get(name, 0.0) + math.sqrt(sumsq)
        stepped(self.stepped, name, largest)

    def strayed(self, name: str) -> float:
        """How far the baseline may stray from the reference on its noise (as `Drift`)."""
        return self.allowance(name) + self.explained.get(name, 0.0)

    def close(self) -> None:
        for fd in [*self.fds.values(), *self.foreign_fds.values()]:
            os.close(fd)
        self.fds.clear()
        self.foreign_fds.clear()
        self.held.clear()
        self.held_bytes = 0
        if self.folder is not None and self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def allowance(sums: dict[int, float] | None) -> float:
    """||drift|| from a tensor's slice sums (0 while no element was dominated)."""
    return math.sqrt(math.fsum(sums.values())) if sums else 0.0
