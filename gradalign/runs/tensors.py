"""Tensor files of a run: safetensors, written and read through the `safetensors` package.

Nothing is unpickled. What the package alone would accept but a run must not hold is refused
here first, each as a one-line `BadInput`: duplicate names in the header (the package keeps the
last), a header nested deeper than a table of tables, dtypes outside the run format. bfloat16
tensors, which numpy lacks, are widened to float32 exactly when read (the Recorder writes them
widened already); see docs/FORMAT.md.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from ..errors import BadInput
from . import jsonfile

# The dtypes a run file may hold, by their safetensors codes; BF16 is read as float32.
DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_WRITABLE = {np.dtype(v) for v in DTYPES.values()}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors package's own bound
METADATA = "__metadata__"


def encode(tensors: dict[str, np.ndarray]) -> bytes:
    """Serialize named arrays; equal input gives equal bytes, whatever the insertion order.

    No `__metadata__` is written: the package orders its entries differently from one process
    to the next, and a run must be the same bytes every time."""
    arrays = {}
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        if array.dtype.newbyteorder("=") not in _WRITABLE:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be stored")
        # The package writes a Fortran-ordered array's memory as is (a transpose comes back
        # untransposed): hand it C order. ascontiguousarray makes 0-d arrays 1-d; reshape back.
        arrays[name] = np.ascontiguousarray(array).reshape(array.shape)
    return save(arrays)


def read_header(handle, size_on_disk: int, where: str) -> tuple[dict[str, dict], int]:
    """The header's tensor entries (metadata dropped) and where the data starts."""
    raw = header_bytes(handle, size_on_disk, where)
    return parse_header(raw, where), 8 + len(raw)


def header_bytes(handle, size_on_disk: int, where: str) -> bytes:
    """The header's bytes as stored (the 8-byte length before them checked and dropped)."""
    first = handle.read(8)
    if len(first) < 8:
        raise BadInput(f"{where}: not a tensor file (too short)")
    (size,) = struct.unpack("<Q", first)
    if size > min(MAX_HEADER, size_on_disk - 8):
        raise BadInput(f"{where}: not a tensor file (bad header length)")
    raw = handle.read(size)
    if len(raw) != size:
        raise BadInput(f"{where}: not a tensor file (bad header length)")
    return raw


def parse_header(raw: bytes, where: str) -> dict[str, dict]:
    """The tensor entries of a header's bytes (metadata dropped), each checked."""
    try:
        header = jsonfile.loads(raw)
    except jsonfile.DuplicateKey as exc:
        raise BadInput(f"{where}: tensor {exc.key!r} is named twice in the header") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadInput(f"{where}: not a tensor file (unreadable header)") from None
    if not isinstance(header, dict):
        raise BadInput(f"{where}: not a tensor file (header is not a table)")
    header.pop(METADATA, None)
    for name, spec in header.items():
        _check_entry(name, spec, where)
    return header


def _check_entry(name: str, spec: object, where: str) -> None:
    ok = (
        isinstance(spec, dict)
        and isinstance(spec.get("dtype"), str)
        and isinstance(spec.get("shape"), list)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in spec["shape"])
        and isinstance(spec.get("data_offsets"), list)
        and len(spec["data_offsets"]) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in spec["data_offsets"])
    )
    if not ok:
        raise BadInput(f"{where}: tensor {name!r} has a malformed entry")
    if spec["dtype"] not in DTYPES and spec["dtype"] != "BF16":
        raise BadInput(f"{where}: tensor {name!r} has unsupported dtype {spec['dtype']}")
    if min(spec["shape"], default=0) < 0 or min(spec["data_offsets"]) < 0:
        raise BadInput(f"{where}: tensor {name!r} points outside the file")


def read(path: Path, where: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a file, as writable numpy arrays (BF16 widened to float32 exactly)."""
    where = where or str(path)
    try:
        with open(path, "rb") as handle:
            header, start = read_header(handle, os.fstat(handle.fileno()).st_size, where)
            with safe_open(str(path), framework="np") as f:  # validates every offset
                return {
                    name: _bf16(handle, start, spec)
                    if spec["dtype"] == "BF16"
                    else f.get_tensor(name)
                    for name, spec in header.items()
                }
    except OSError as exc:
        raise BadInput(f"{where}: cannot read ({exc.strerror})") from None
    except (SafetensorError, ValueError, TypeError, KeyError) as exc:
        text = " ".join(str(exc).split())[:160]
        raise BadInput(f"{where}: not a valid tensor file ({text})") from None


def _bf16(handle, start: int, spec: dict) -> np.ndarray:
    """A bfloat16 tensor, widened to float32 (bfloat16 is the upper half of a float32); the
    package has checked its offsets against its shape already."""
    begin, end = spec["data_offsets"]
    handle.seek(start + begin)
    bits = np.frombuffer(handle.read(end - begin), dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(spec["shape"])
