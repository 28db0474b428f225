"""Writing a run directory: staged in a hidden sibling, renamed into place when complete.

An interrupted run is never readable as a finished one, and a previous run at the same path stays
intact until the new one is complete. Every data file's SHA-256 goes into the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..errors import BadInput
from . import tensors as tensorfiles
from .layout import FORMAT, FORMAT_VERSION, MANIFEST, SERIES, is_run_dir
from .model import Tensors


def _write_atomic(path: Path, data: bytes, durable: bool = False) -> None:
    """Write via a temporary name and rename. Data files skip fsync: the manifest's checksums
    already expose a file that a crash left short, so only the manifest itself is synced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def ensure_writable(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse a path that holds something other than a run (or an empty directory)."""
    path = Path(out_dir)
    if path.exists() and not (path.is_dir() and _replaceable(path)):
        raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
    return path


def _replaceable(path: Path) -> bool:
    return is_run_dir(path) or not any(path.iterdir())


class RunWriter:
    """Writes one run directory: data files first, then the manifest, then an atomic rename."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.final = ensure_writable(out_dir)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir()
        self.checksums: dict[str, str] = {}

    def write_tensors(self, relpath: str, tensors: Tensors) -> None:
        data = tensorfiles.encode(tensors)
        _write_atomic(self.staging / relpath, data)
        self.checksums[relpath] = hashlib.sha256(data).hexdigest()

    def finish(self, manifest: dict, series: Tensors) -> Path:
        """Write the series and the manifest, then move the run into place."""
        self.write_tensors(SERIES, series)
        body = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
        body["files"] = dict(sorted(self.checksums.items()))
        text = json.dumps(body, indent=2, sort_keys=True, allow_nan=False) + "\n"
        _write_atomic(self.staging / MANIFEST, text.encode(), durable=True)
        old = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.staging, self.final)
        if old.exists():
            shutil.rmtree(old)
        return self.final

    def abort(self) -> None:
        """Drop the staged files; whatever stood at the final path stays untouched."""
        shutil.rmtree(self.staging, ignore_errors=True)
