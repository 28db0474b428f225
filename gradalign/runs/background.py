"""A run's files written in the background: `RunWriter`'s tensor files encoded, written, hashed
and fingerprinted on a `Spool` thread, so the training loop only hands over copies.

The run stays complete-or-absent: `finish` waits for every file, then writes the series and the
manifest and swaps the run into place as `RunWriter` does; a write that failed in the background
raises on the caller's thread (at the next `write`, `run` or at `finish`), and the run is then
aborted by its owner, leaving nothing behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import writer as files
from .digests import bitsum
from .model import Tensors
from .spool import DEFAULT_LIMIT, Spool
from .tensorfile import parts


class BackgroundWriter:
    """Writes a `RunWriter`'s data files on one background thread, in submission order."""

    def __init__(self, writer: files.RunWriter, limit: int = DEFAULT_LIMIT) -> None:
        self.writer = writer
        self.spool = Spool(limit, name=f"gradalign-writer-{writer.final.name}")
        self.fingerprints: dict[str, dict[str, int]] = {}  # per file, per tensor
        self._lock = threading.Lock()

    @property
    def final(self) -> Path:
        return self.writer.final

    def write(
        self,
        relpath: str,
        tensors: Tensors,
        *,
        declared: dict[str, str] | None = None,
        ready: Callable[[], None] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Write `tensors` to `relpath` in the background. The arrays must not change until
        `release` is called (or the file is written, without one). `declared`: the manifest
        dtype of each tensor whose fingerprint (docs/FORMAT.md) is to be kept in
        `fingerprints[relpath]`. `ready`: waited for first (an asynchronous device copy)."""
        target = self.writer.staging / relpath

        def job() -> None:
            if ready is not None:
                ready()
            digest = files._write_atomic(target, parts(tensors))
            prints = (
                {name: bitsum(tensors[name], dtype) for name, dtype in declared.items()}
                if declared is not None
                else None
            )
            with self._lock:
                self.writer.checksums[relpath] = digest
                if prints is not None:
                    self.fingerprints[relpath] = prints

        nbytes = sum(np.asarray(a).nbytes for a in tensors.values())
        self.spool.submit(job, nbytes, release)

    def write_now(self, relpath: str, tensors: Tensors) -> None:
        """Write a small file on the calling thread (a background job's own output)."""
        digest = files._write_atomic(self.writer.staging / relpath, parts(tensors))
        with self._lock:
            self.writer.checksums[relpath] = digest

    def run(
        self, job: Callable[[], None], nbytes: int = 0, release: Callable[[], None] | None = None
    ) -> None:
        """Any other background work (summaries of a snapshot), in the same order."""
        self.spool.submit(job, nbytes, release)

    def drain(self) -> None:
        """Wait for every file; raise the first background error."""
        self.spool.drain()

    def finish(self, manifest: dict, series: Callable[[], Tensors]) -> Path:
        """Wait for every file, then write the series (built now) and the manifest and move
        the run into place."""
        try:
            self.spool.close()
            built = series()
        except BaseException:
            self.abort()
            raise
        return self.writer.finish(manifest, built)

    def abort(self) -> None:
        """Stop writing and drop the staged run; an earlier run at the path stays."""
        self.spool.abort()
        self.writer.abort()
