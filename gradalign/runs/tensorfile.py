"""A numpy-only reader and writer for the safetensors file format.

Files written here load with the `safetensors` package and vice versa. Nothing is unpickled: the
format is an 8-byte little-endian header length, a JSON header of names, dtypes, shapes and byte
offsets, then the raw little-endian tensor bytes.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

from ..errors import BadInput

_TO_NUMPY = {
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
_FROM_NUMPY = {np.dtype(v).str.lstrip("<>|="): k for k, v in _TO_NUMPY.items()}
_MAX_HEADER = 100 * 1024 * 1024


def encode(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """Serialize named arrays (sorted by name, so equal input gives equal bytes)."""
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])  # ascontiguousarray would turn 0-d into shape (1,)
        code = _FROM_NUMPY.get(array.dtype.str.lstrip("<>|="))
        if code is None:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} cannot be stored")
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def decode(blob: bytes, source: str = "<bytes>") -> dict[str, np.ndarray]:
    """Parse safetensors bytes into arrays, validating every offset; BF16 becomes float32."""
    if len(blob) < 8:
        raise BadInput(f"{source}: not a tensor file (too short)")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > min(_MAX_HEADER, len(blob) - 8):
        raise BadInput(f"{source}: not a tensor file (bad header length)")
    try:
        header = json.loads(blob[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput(f"{source}: not a tensor file (unreadable header)") from None
    if not isinstance(header, dict):
        raise BadInput(f"{source}: not a tensor file (header is not a table)")
    header.pop("__metadata__", None)
    buffer = memoryview(blob)[8 + size :]
    out: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        out[name] = _tensor(name, spec, buffer, source)
    return out


def _tensor(name: str, spec: object, buffer: memoryview, source: str) -> np.ndarray:
    try:
        code, shape = spec["dtype"], tuple(int(d) for d in spec["shape"])  # type: ignore[index]
        begin, end = (int(v) for v in spec["data_offsets"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        raise BadInput(f"{source}: tensor {name!r} has a malformed entry") from None
    if not isinstance(code, str):
        raise BadInput(f"{source}: tensor {name!r} has a malformed dtype")
    if code == "BF16":
        dtype, itemsize = None, 2
    elif code in _TO_NUMPY:
        dtype = np.dtype(_TO_NUMPY[code]).newbyteorder("<")
        itemsize = dtype.itemsize
    else:
        raise BadInput(f"{source}: tensor {name!r} has unsupported dtype {code}")
    count = math.prod(shape)  # Python ints: no overflow on absurd shapes
    if min(shape, default=0) < 0 or not 0 <= begin <= end <= len(buffer):
        raise BadInput(f"{source}: tensor {name!r} points outside the file")
    if end - begin != count * itemsize:
        raise BadInput(f"{source}: tensor {name!r} has {end - begin} bytes for shape {shape}")
    raw = buffer[begin:end]
    if dtype is None:
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def load(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file from disk."""
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    return decode(blob, str(path))
