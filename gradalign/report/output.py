"""Writing report files: whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import BadInput


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary name and rename: a reader never sees half a file. Missing parent
    directories are created (the checks before any work found a writable ancestor)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"{path}: cannot write the report ({exc.strerror})") from None


def write_text_atomic(path: Path, text: str) -> None:
    """Text written whole or not at all (UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"))
