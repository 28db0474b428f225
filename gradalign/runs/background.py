"""A run's files written in the background: `RunWriter`'s tensor files encoded, written, hashed
and fingerprinted on a `Spool` thread, so the training loop only hands over copies.

The run stays complete-or-absent: `finish` waits for every file, then writes the series and the
manifest and swaps the run into place as `RunWriter` does; a write that failed in the background
raises on the caller's thread (at the next `write`, `run` or at `finish`), and the run is then
aborted by its owner, leaving nothing behind.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import BadInput
from . import writer as files
from .digests import bitsum
from .model import Tensors
from .spool import DEFAULT_LIMIT, Spool
from .tensorfile import parts

_UNFINISHED: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


@atexit.register
def _drop_unfinished() -> None:
    """Runs this process staged but never finished nor aborted (a Recorder never closed) are
    dropped as it exits: no staged files or lock stay behind."""
    for writer in list(_UNFINISHED):
        if writer.pid == os.getpid():
            writer.abort()


class BackgroundWriter:
    """Writes a `RunWriter`'s data files on one background thread, in submission order.
    Without a writer (a data-parallel rank that does not write the run) nothing is written,
    and the fingerprints are kept all the same."""

    def __init__(self, writer: files.RunWriter | None, limit: int = DEFAULT_LIMIT) -> None:
        self.writer = writer
        self.spool = Spool(limit, name="gradalign-writer")
        self.fingerprints: dict[str, dict[str, int]] = {}  # per file, per tensor
        self._lock = threading.Lock()
        self.pid = os.getpid()
        _UNFINISHED.add(self)

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
        writer = self.writer

        def job() -> None:
            if ready is not None:
                ready()
            if writer is not None:
                digest = _written(writer, relpath, tensors)
            prints = (
                {name: bitsum(tensors[name], dtype) for name, dtype in declared.items()}
                if declared is not None
                else None
            )
            with self._lock:
                if writer is not None:
                    writer.checksums[relpath] = digest
                if prints is not None:
                    self.fingerprints[relpath] = prints

        nbytes = sum(np.asarray(a).nbytes for a in tensors.values())
        self.spool.submit(job, nbytes, release)

    def write_tensors(self, relpath: str, tensors: Tensors) -> None:
        """Write a small file now, on the calling thread (a background job's own output, the
        ranks' series)."""
        if self.writer is None:
            return
        digest = _written(self.writer, relpath, tensors)
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

    def finish(self, manifest: dict, series: Tensors | Callable[[], Tensors]) -> Path:
        """Wait for every file, then write the series (built now, when given as a function)
        and the manifest and move the run into place."""
        try:
            self.spool.close()
            built = series() if callable(series) else series
        except BaseException:
            self.abort()
            raise
        assert self.writer is not None, "a rank that writes no run finishes none"
        _UNFINISHED.discard(self)
        return self.writer.finish(manifest, built)

    def abort(self) -> None:
        """Stop writing and drop the staged run; an earlier run at the path stays."""
        _UNFINISHED.discard(self)
        self.spool.abort()
        if self.writer is not None:
            self.writer.abort()


def _written(writer: files.RunWriter, relpath: str, tensors: Tensors) -> str:
    """Write one tensor file of the run; its checksum. A write the system refuses (a full disk,
    a file-size limit, a folder removed) is said with the run and the file, in one line."""
    try:
        return files._write_atomic(writer.staging / relpath, parts(tensors))
    except OSError as exc:
        raise BadInput(
            f"{writer.final}: cannot write {relpath} ({exc.strerror or exc}); the run is "
            "dropped, and what stood there stays"
        ) from None
