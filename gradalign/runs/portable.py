"""A run-directory writer for any framework, numpy only (docs/FORMAT.md, "Reference writer").

JAX, PaddlePaddle, MindSpore or C++ trainers write the run format with this one file: import
it (`from gradalign.runs.portable import write_run, sample_digest, fingerprint`) or copy it into
your project; it needs numpy and the standard library, nothing else. Pass numpy arrays.
"""

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

_CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",  # ml_dtypes' (JAX's), a dtype of kind "V"
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
_COMPUTE = ("float64", "float32", "tf32", "float16", "bfloat16")  # what a run may compute in
_BITS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.int8}


def encode_safetensors(tensors):
    """{name: array} -> safetensors bytes (names sorted, so equal input gives equal bytes)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        data = a.tobytes(order="C")  # np.ascontiguousarray would turn shape () into (1,)
        header[name] = {
            "dtype": _CODES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def fingerprint(array):
    """int64 sum of the elements' bit patterns (floats viewed as same-width ints)."""
    a = np.asarray(array)
    a = a.astype(a.dtype.newbyteorder("="), copy=False)
    if a.dtype.kind not in "biu":  # a float, numpy's or ml_dtypes' bfloat16
        a = a.view(_BITS[a.dtype.itemsize])
    return int(a.sum(dtype=np.int64))


def sample_digest(*arrays):
    """Order-free int64 digest of one micro-batch's samples (inputs, targets, masks...), the
    one gradalign's Recorder takes: floating arrays as float32 bits, integer and bool arrays as
    values, all summed with wrap-around. Digests add up: a window's sum equals the digest of the
    baseline batch that holds the same samples."""
    total = 0
    for array in arrays:
        a = np.asarray(array)
        if a.dtype.kind not in "biu":  # a float, numpy's or ml_dtypes' bfloat16
            a = a.astype(np.float32).view(np.int32)
        total += int(a.astype(np.int64, copy=False).sum(dtype=np.int64))
    return (total + 2**63) % 2**64 - 2**63


def _series(value, rows, dtype, name):
    a = np.asarray(value, dtype=dtype)
    if a.shape[:1] != (rows,):
        raise ValueError(f"{name} needs {rows} rows, got shape {a.shape}")
    return a


def write_run(
    out_dir,
    *,
    accum_steps,
    micro_losses,
    init_weights,
    update_weights,
    grads=None,
    lr=None,
    micro_items=None,
    micro_data=None,
    micro_state=None,
    optimizer_steps=None,
    state_step=None,
    loss_scale=None,
    grad_norm_pre_clip=None,
    reference=None,
    grad_dtype=None,
    model=None,
    dtype=None,
    compute_dtype=None,
    config=None,
    more_series=None,
):
    """Write one run directory; returns its path. Per update i (N updates, K = accum_steps):
    `update_weights[i]` and `grads[i]` are {name: array}, `lr`, `optimizer_steps` (step()
    calls in window i), `state_step` (the optimizer's own counter after it), `loss_scale`,
    `grad_norm_pre_clip` are [N]. Per micro-step m (M = N*K): `micro_losses` (each micro-
    batch's own mean loss, not divided by K), `micro_items` (its item count), `micro_data`
    (`sample_digest` of its samples), `micro_state` ([M, P] fingerprints of the weights it
    computed with). `lr` keeps float32 if given float32 (judged at that precision).
    `reference`: path of a float64 rerun of this training, relative to this run directory.
    `dtype`/`compute_dtype`: the weights' and the compute precision, if not the weights' own.
    `more_series`: {key: array} of any other series the format lists, by its key and in its
    dtype (`micro/samples`, `micro/grad_state`, `update/clip_calls`, `update/zero_grads_inside`,
    `micro/steps`...), each naming more causes."""
    final = Path(out_dir)
    if final.exists():
        raise FileExistsError(f"{final} exists; remove it first")
    stage = final.parent / f".{final.name}.partial-{os.getpid()}"
    if isinstance(accum_steps, bool) or int(accum_steps) != accum_steps or accum_steps < 1:
        raise ValueError(f"accum_steps must be a whole number >= 1, got {accum_steps!r}")
    if compute_dtype is not None and compute_dtype not in _COMPUTE:
        known = ", ".join(_COMPUTE)
        raise ValueError(f"compute_dtype must be one of {known}, got {compute_dtype!r}")
    k, n = int(accum_steps), len(update_weights)
    names = list(init_weights)
    if "__metadata__" in names:
        raise ValueError(
            "no tensor may be named __metadata__: safetensors keeps its metadata there"
        )
    p = len(names)
    files = {}

    def state(weights):
        return np.array([fingerprint(weights[name]) for name in names], dtype=np.int64)

    series = {
        "micro/loss": _series(micro_losses, n * k, np.float64, "micro_losses"),
        "init/state": state(init_weights),
        "update/state": np.array([state(w) for w in update_weights], np.int64).reshape(n, p),
    }
    if micro_state is not None:
        rows = _series(micro_state, n * k, np.int64, "micro_state")
        series["micro/state"] = rows.reshape(n * k, p)
    if lr is not None:
        narrow = np.asarray(lr).dtype in (np.float32, np.float16)
        series["update/lr"] = _series(lr, n, np.asarray(lr).dtype if narrow else np.float64, "lr")
    optional = {
        "micro/items": (micro_items, n * k, np.float64),
        "micro/data": (micro_data, n * k, np.int64),
        "update/optimizer_steps": (optimizer_steps, n, np.int64),
        "update/state_step": (state_step, n, np.int64),
        "update/loss_scale": (loss_scale, n, np.float64),
        "update/grad_norm_pre_clip": (grad_norm_pre_clip, n, np.float64),
    }
    for key, (value, rows, kind) in optional.items():
        if value is not None:
            series[key] = _series(value, rows, kind, key)
    for key, value in (more_series or {}).items():
        if key in series:
            raise ValueError(f"series {key} is written from its own argument")
        series[key] = np.asarray(value)
    items = series.get("micro/items")
    if items is not None and not (np.isfinite(items).all() and (items >= 0).all()):
        raise ValueError("micro_items must be finite counts >= 0")
    json.dumps(config or {}, allow_nan=False)  # strict JSON: refused before anything is written
    try:  # nothing half-written is left behind

        def put(relpath, tensors):
            data = encode_safetensors(tensors)
            (stage / relpath).parent.mkdir(parents=True, exist_ok=True)
            (stage / relpath).write_bytes(data)
            files[relpath] = hashlib.sha256(data).hexdigest()

        put("weights/init.safetensors", init_weights)
        for i, weights in enumerate(update_weights):
            put(f"weights/update_{i:06d}.safetensors", weights)
        if grads is not None:
            for i, g in enumerate(grads):
                put(f"grads/update_{i:06d}.safetensors", g)
        put("series.safetensors", series)
        held = {}  # the working precision: the floating dtype holding the most elements
        for name in names:
            value = np.asarray(init_weights[name])
            if value.dtype.name in ("float64", "float32", "float16", "bfloat16"):
                held[value.dtype.name] = held.get(value.dtype.name, 0) + value.size
        environment = {
            "writer": "gradalign portable writer",
            "numpy": np.__version__,
            "dtype": dtype or max(held, key=held.get, default="float32"),
        }
        if compute_dtype:
            environment["compute_dtype"] = compute_dtype
        manifest = {
            "format": "gradalign-run",
            "format_version": 1,
            "accum_steps": k,
            "updates": n,
            "micro_steps": n * k,
            "tensors": [
                {
                    "name": name,
                    "shape": list(np.shape(init_weights[name])),
                    "dtype": np.asarray(init_weights[name]).dtype.name,
                    "kind": "param" if not grads or name in grads[0] else "buffer",
                }
                for name in names
            ],
            "config": config or {},
            "environment": environment,
            "fault": None,
            "files": dict(sorted(files.items())),
        }
        for key, value in (("reference", reference), ("grad_dtype", grad_dtype), ("model", model)):
            if value is not None:
                manifest[key] = value
        text = json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n"
        (stage / "manifest.json").write_text(text)  # last: a run without a manifest is no run
        os.replace(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final
