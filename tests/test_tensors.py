"""Tests for gradalign.runs.tensors: run files through the safetensors package, and what a run's
reader refuses beyond what the package refuses."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs import tensors as tensorfile

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def sample(dtype: str) -> np.ndarray:
    """A 2x3 array that includes each dtype's awkward values."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        values = [0.0, -0.0, np.inf, -np.inf, np.finfo(dt).tiny, np.finfo(dt).max]
        out = np.array(values, dtype=dt)
        out[1] = -0.0
        return np.concatenate([out, [np.nan]]).astype(dt)[:6].reshape(2, 3)
    if dt.kind == "b":
        return np.array([[True, False, True], [False, False, True]])
    info = np.iinfo(dt)
    return np.array([info.min, -1 if info.min else 0, 0, 1, 7, info.max], dtype=dt).reshape(2, 3)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bits (so NaN and -0.0 count)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def decode(blob: bytes, name: str = "t.safetensors") -> dict[str, np.ndarray]:
    """Read `blob` as a file, the only way runs are read."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.safetensors"
        path.write_bytes(blob)
        return tensorfile.read(path, name)


def raw_file(header: dict, data: bytes = b"", length: int | None = None) -> bytes:
    return raw_text(json.dumps(header).encode(), data, length)


def raw_text(text: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text + data


# -- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype):
    value = sample(dtype)
    back = decode(tensorfile.encode({"x": value}))
    assert same(back["x"], value)


def test_round_trip_many_tensors_at_once():
    tensors = {f"layer.{d}": sample(d) for d in DTYPES}
    back = decode(tensorfile.encode(tensors))
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert same(back[name], value), name


def test_nan_and_negative_zero_keep_their_bits():
    value = np.array([np.nan, -0.0, 0.0], dtype=np.float32)
    value[0] = np.frombuffer(struct.pack("<I", 0x7FC0_1234), dtype=np.float32)[0]  # a payload NaN
    back = decode(tensorfile.encode({"x": value}))["x"]
    assert back.tobytes() == value.tobytes()


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "bool"])
def test_zero_dim_arrays_keep_their_shape(dtype):
    value = np.array(sample(dtype).flat[3], dtype=dtype)
    assert value.shape == ()
    blob = tensorfile.encode({"s": value})
    header = json.loads(blob[8 : 8 + struct.unpack("<Q", blob[:8])[0]])
    assert header["s"]["shape"] == []
    assert same(decode(blob)["s"], value)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 5)])
def test_empty_arrays(shape):
    value = np.zeros(shape, dtype=np.float32)
    back = decode(tensorfile.encode({"e": value, "f": np.ones(2)}))
    assert same(back["e"], value)
    assert same(back["f"], np.ones(2))


def test_empty_dict():
    assert decode(tensorfile.encode({})) == {}


def test_non_contiguous_and_big_endian_inputs():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    tensors = {
        "t": base.T,
        "s": base[:, ::2],
        "be": np.arange(5, dtype=">i4"),
        "bf": np.linspace(-1, 1, 4).astype(">f8"),
    }
    blob = tensorfile.encode(tensors)
    back = decode(blob)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value)
        assert back[name].dtype == value.dtype.newbyteorder("=")
    # the stored bytes are little-endian
    assert np.linspace(-1, 1, 4).astype("<f8").tobytes() in blob
    assert np.linspace(-1, 1, 4).astype(">f8").tobytes() not in blob


def test_decoded_arrays_are_writable_copies():
    blob = tensorfile.encode({"x": np.zeros(3)})
    back = decode(blob)["x"]
    back[0] = 1.0
    assert decode(blob)["x"][0] == 0.0


def test_bytes_are_deterministic_regardless_of_insertion_order():
    a, b = np.arange(3, dtype=np.int32), np.ones((2, 2), dtype=np.float16)
    first = tensorfile.encode({"a": a, "b": b, "c": np.array(True)})
    second = tensorfile.encode({"c": np.array(True), "b": b.copy(), "a": a.copy()})
    assert first == second
    assert tensorfile.encode({"a": a, "b": b}) != tensorfile.encode({"a": a, "b": b + 1})


def test_metadata_of_other_writers_is_ignored_on_read():
    st = pytest.importorskip("safetensors.numpy")
    blob = st.save({"x": np.ones(2)}, metadata={"b": "2", "a": "1"})
    assert set(decode(blob)) == {"x"}


def test_header_is_padded_to_eight_bytes():
    for name in ("a", "ab", "abc", "abcd", "abcde"):
        blob = tensorfile.encode({name: np.ones(1, dtype=np.uint8)})
        (size,) = struct.unpack("<Q", blob[:8])
        assert size % 8 == 0
        assert len(blob) == 8 + size + 1


@pytest.mark.parametrize(
    "value", [np.zeros(2, np.complex64), np.zeros(2, np.uint16), np.array(["a"])]
)
def test_unsupported_dtypes_are_refused_on_write(value):
    with pytest.raises(ValueError, match="cannot be stored"):
        tensorfile.encode({"x": value})


def test_read_reads_a_file_and_reports_a_missing_one(tmp_path: Path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(tensorfile.encode({"x": np.arange(4)}))
    np.testing.assert_array_equal(tensorfile.read(path)["x"], np.arange(4))
    with pytest.raises(BadInput, match="cannot read"):
        tensorfile.read(tmp_path / "missing.safetensors")


# -- BF16 ------------------------------------------------------------------------------------------


def test_bf16_is_read_as_float32():
    # values exactly representable in bfloat16: their float32 bits end in 16 zero bits
    values = np.array([[1.0, -2.5, 3.140625], [0.0, np.inf, -1.0e-38]], dtype=np.float32)
    values = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)
    upper = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    blob = raw_file(
        {
            "first": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [4, 16]},
        },
        np.float32(7).tobytes() + upper,
    )
    back = decode(blob)
    assert back["w"].dtype == np.float32
    assert same(back["w"], values)
    assert back["first"][0] == 7.0


def test_bf16_byte_count_is_checked():
    blob = raw_file({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(BadInput, match="not a valid tensor file"):
        decode(blob)


# -- compatibility with the safetensors package ----------------------------------------------------


def compatible_tensors() -> dict[str, np.ndarray]:
    tensors = {f"t.{d}": sample(d) for d in DTYPES}
    tensors["scalar"] = np.array(1.25, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 3), dtype=np.int16)
    return tensors


def test_safetensors_package_output_decodes():
    st = pytest.importorskip("safetensors.numpy")
    tensors = compatible_tensors()
    back = decode(st.save(tensors, metadata={"format": "np"}))
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert same(back[name], value), name


def test_our_output_loads_with_safetensors_package():
    st = pytest.importorskip("safetensors.numpy")
    tensors = {k: v for k, v in compatible_tensors().items() if k != "scalar"}
    back = st.load(tensorfile.encode(tensors))
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert same(back[name], value), name


def test_our_zero_dim_output_loads_with_safetensors_package():
    st = pytest.importorskip("safetensors.numpy")
    back = st.load(tensorfile.encode({"scalar": np.array(1.25, dtype=np.float32)}))
    assert same(back["scalar"], np.array(1.25, dtype=np.float32))


# -- corrupt input ---------------------------------------------------------------------------------

GOOD = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}

CORRUPT = {
    "empty": b"",
    "too short": b"\x01\x00\x00",
    "only a length": struct.pack("<Q", 0),
    "header length beyond file": raw_file(GOOD, b"\0" * 8, length=10_000),
    "absurd header length": struct.pack("<Q", 2**63) + b"{}",
    "non-JSON header": struct.pack("<Q", 9) + b"not json!",
    "non-UTF-8 header": struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc",
    "header is a list": raw_file([1, 2]),  # type: ignore[arg-type]
    "entry is not a table": raw_file({"x": [0, 8]}),
    "entry lacks offsets": raw_file({"x": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
    "entry lacks dtype": raw_file({"x": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
    "non-numeric shape": raw_file(
        {"x": {"dtype": "F32", "shape": ["two"], "data_offsets": [0, 8]}}, b"\0" * 8
    ),
    "unknown dtype": raw_file(
        {"x": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2
    ),
    "dtype is not a string": raw_file(
        {"x": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8
    ),
    "end beyond buffer": raw_file(
        {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4
    ),
    "begin after end": raw_file(
        {"x": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}, b"\0" * 8
    ),
    "negative offset": raw_file(
        {"x": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 8
    ),
    "negative dimension": raw_file(
        {"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 0]}}, b"\0" * 8
    ),
    "too few bytes for shape": raw_file(
        {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8
    ),
    "too many bytes for shape": raw_file(
        {"x": {"dtype": "F64", "shape": [2, 2], "data_offsets": [0, 40]}}, b"\0" * 40
    ),
    "shape whose size overflows": raw_file(
        {"x": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}
    ),
    "dimension beyond int64": raw_file(
        {"x": {"dtype": "U8", "shape": [2**70], "data_offsets": [0, 0]}}
    ),
    # what the safetensors package alone accepts (it keeps the last entry of a name)
    "a name twice": raw_text(
        b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
        b"\0" * 4,
    ),
    "deeply nested header": raw_text(b'{"__metadata__":' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
}


@pytest.mark.parametrize("blob", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_input_raises_bad_input(blob):
    with pytest.raises(BadInput):
        decode(blob, "broken.safetensors")


def test_a_name_twice_is_refused_by_name():
    with pytest.raises(BadInput, match="'x' is named twice"):
        decode(CORRUPT["a name twice"])


def test_the_package_alone_accepts_a_name_twice():
    # why the reader parses the header itself first: the package keeps the last entry
    st = pytest.importorskip("safetensors.numpy")
    assert set(st.load(CORRUPT["a name twice"])) == {"x"}


def test_corrupt_input_message_names_the_source():
    with pytest.raises(BadInput, match=r"^broken\.safetensors: "):
        decode(b"\0", "broken.safetensors")


def test_truncated_real_file_raises_bad_input():
    blob = tensorfile.encode({"a": np.arange(10.0), "b": np.ones(3, dtype=np.int8)})
    for cut in (1, 3, 40, len(blob) - 9):
        with pytest.raises(BadInput):
            decode(blob[:-cut])


def test_good_raw_file_decodes():
    # the hand-built files above differ from this one only in what they break
    back = decode(raw_file(GOOD, np.array([1.5, -2], dtype="<f4").tobytes()))
    np.testing.assert_array_equal(back["x"], np.array([1.5, -2], dtype=np.float32))
