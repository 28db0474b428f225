"""The file checksums a run's manifest lists (docs/FORMAT.md, "Integrity"): which algorithm a
manifest declares, and the digest of a file or of what is being written.

The Recorder writes XXH3-128 (`"checksum": "xxh3-128"` in the manifest): it guards against
files cut short or altered by accident, as SHA-256 does, at 28 GB/s against SHA-256's 1.7 GB/s
here (docs/PERFORMANCE.md), so hashing every snapshot costs the recording next to nothing. A
manifest without `checksum` lists SHA-256 digests (runs written by other tools with `hashlib`
alone, and by earlier versions of gradalign).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..errors import BadInput

try:
    import xxhash
except ImportError:  # a core dependency; absent only where gradalign runs from a source tree
    xxhash = None

SHA256 = "sha256"
XXH3 = "xxh3-128"
HEX_DIGITS = {SHA256: 64, XXH3: 32}
WRITTEN = XXH3 if xxhash is not None else SHA256  # what this installation writes
_CHUNK = 1 << 20


def declared(manifest: dict[str, Any]) -> str:
    """The algorithm of a manifest's `files` digests (SHA-256 unless it says otherwise)."""
    return manifest.get("checksum", SHA256)


def hasher(algorithm: str) -> Any:
    """A fresh digest object (`update`, `hexdigest`) of `algorithm`."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == XXH3:
        if xxhash is None:
            raise BadInput(
                "this run's files are checked by XXH3-128, which needs the xxhash package: "
                "pip install xxhash"
            )
        return xxhash.xxh3_128()
    raise BadInput(f"unknown file checksum {algorithm!r} (known: {', '.join(HEX_DIGITS)})")


def of_file(file: Path, algorithm: str) -> str:
    """The checksum of a file, read in 1 MiB chunks."""
    digest = hasher(algorithm)
    with open(file, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
