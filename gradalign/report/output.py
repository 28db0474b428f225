"""Writing report files: whole or not at all."""

from __future__ import annotations

from pathlib import Path

from ..errors import BadInput


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary name and rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write the report ({exc.strerror})") from None
