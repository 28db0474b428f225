"""Names inside a run directory: the manifest, the series and the per-update tensor files."""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "gradalign-run"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SERIES = "series.safetensors"
JOURNAL = ".gradalign-commit-{pid}.json"  # a set of runs being put in place (runs/writer.py)


def weights_file(update: int | None) -> str:
    """Relative path of the weight snapshot after `update` (None: the initial weights)."""
    return (
        "weights/init.safetensors" if update is None else f"weights/update_{update:06d}.safetensors"
    )


def grads_file(update: int) -> str:
    """Relative path of the accumulated gradient recorded just before optimizer step `update`."""
    return f"grads/update_{update:06d}.safetensors"


def sketch_file(update: int | None) -> str:
    """Relative path of the sketches of update `update` (None: of the initial weights)."""
    return (
        "sketches/init.safetensors"
        if update is None
        else f"sketches/update_{update:06d}.safetensors"
    )


def is_run_dir(path: Path) -> bool:
    """True when `path` holds a manifest that names this format (a pipe named manifest.json is
    none: reading it would wait forever)."""
    from ..paths import is_stream

    try:
        if is_stream(path / MANIFEST):
            return False
        return json.loads((path / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False
