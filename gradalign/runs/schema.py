"""The manifest's schema: every field's type and range, checked before anything else is read.

A manifest is data from wherever a run came from; a wrong type must be a one-line error that
names the field, never an exception deep inside the judge.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import BadInput, shown
from . import checksums
from .model import COMPUTE_ORDER
from .store import FINGERPRINTS

_HEX = re.compile(r"^[0-9a-f]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_MICRO_STEPS = 100_000_000  # a series longer than this is not a training run's


def is_int(value: Any) -> bool:
    """A whole number as JSON or Python holds it, not a bool (`True` is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def compute_dtype_error(value: Any) -> str | None:
    """Why `value` is no precision a run may declare it computed in (None: it is one). An
    unknown name was taken for none at all, and a `bf16` run judged to float32's tolerances."""
    if value is None or value in COMPUTE_ORDER:
        return None
    return f"must be one of {', '.join(COMPUTE_ORDER)} (torch's spelling), got {shown(value)}"


def check_manifest(manifest: dict, where: str) -> None:
    """Raise BadInput naming the first field that is missing, of the wrong type or out of range."""

    def bad(field: str, what: str) -> BadInput:
        return BadInput(f"{where}: manifest field {field!r} {what}")

    k, n = manifest.get("accum_steps"), manifest.get("updates")
    if not is_int(k) or k < 1:
        raise bad("accum_steps", f"must be an integer >= 1, got {shown(k)}")
    if not is_int(n) or n < 0:
        raise bad("updates", f"must be an integer >= 0, got {shown(n)}")
    if k * n > MAX_MICRO_STEPS:
        raise bad("updates", f"times accum_steps is {k * n} micro-steps, beyond any real run")
    for field in ("micro_steps", "unclosed_micro_steps", "unclosed_steps"):
        if field in manifest and (not is_int(manifest[field]) or manifest[field] < 0):
            raise bad(field, "must be an integer >= 0")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise bad("files", "is missing or not an object of file checksums")
    algorithm = checksums.declared(manifest)
    digits = checksums.HEX_DIGITS.get(algorithm) if isinstance(algorithm, str) else None
    if digits is None:
        known = ", ".join(checksums.HEX_DIGITS)
        raise bad("checksum", f"must be one of {known}, got {shown(algorithm)}")
    for rel, digest in files.items():
        if not isinstance(digest, str) or len(digest) != digits or not _HEX.match(digest):
            raise bad("files", f"lists {shown(rel)} without a {algorithm} hex digest")
    integrity = manifest.get("integrity")
    if integrity is not None and integrity != FINGERPRINTS:  # never a silent other way of checking
        raise bad("integrity", f"must be {FINGERPRINTS!r} or absent, got {shown(integrity)}")
    _check_tensors(manifest.get("tensors"), bad)
    for field in ("config", "environment"):
        if manifest.get(field) is not None and not isinstance(manifest[field], dict):
            raise bad(field, "must be an object")
    environment = manifest.get("environment") or {}
    for key in ("dtype", "compute_dtype"):
        if environment.get(key) is not None and not isinstance(environment[key], str):
            raise bad(f"environment.{key}", "must be a string")
    if (why := compute_dtype_error(environment.get("compute_dtype"))) is not None:
        raise bad("environment.compute_dtype", why)
    uses = environment.get("tf32")
    if uses is not None and not _strings(uses):
        raise bad("environment.tf32", "must be a list of strings (cudnn, cublas, cublas-bfloat16)")
    for field in ("fault", "grad_dtype"):
        if manifest.get(field) is not None and not isinstance(manifest[field], str):
            raise bad(field, "must be a string or null")
    reference = manifest.get("reference")
    if reference is not None and (not isinstance(reference, str) or not reference):
        raise bad("reference", "must be a path relative to the run")
    if reference is not None and _CONTROL.search(reference):  # printed in notes and reports
        raise bad("reference", f"holds control characters: {shown(reference)}")
    check_optimizer(manifest.get("optimizer"), len(manifest["tensors"]), bad)
    model = manifest.get("model")
    if model is not None:
        ok = isinstance(model, dict) and all(
            _strings(model.get(key, []))
            for key in ("batchnorm", "dropout", "comm_hooks", "grad_by_frequency", "grad_hooks")
        )
        if not ok:
            what = (
                "{batchnorm: [names], dropout: [names]} (and comm_hooks, grad_by_frequency, "
                "grad_hooks: [names])"
            )
            raise bad("model", f"must be {what}")


TENSOR_DTYPES = {  # torch's spelling of what a recorded tensor may hold
    *("float64", "float32", "float16", "bfloat16"),
    *("int64", "int32", "int16", "int8", "uint8", "bool"),
}


def _check_tensors(tensors: Any, bad) -> None:
    if not isinstance(tensors, list) or not tensors:
        raise bad("tensors", "must be a non-empty list")
    names: set[str] = set()
    for index, t in enumerate(tensors):
        entry = f"tensors[{index}]"
        if not isinstance(t, dict):
            raise bad(entry, "must be an object {name, shape, dtype, kind}")
        name, shape = t.get("name"), t.get("shape")
        if not isinstance(name, str) or not name:
            raise bad(f"{entry}.name", f"must be a non-empty string, got {shown(name)}")
        if name == "__metadata__":  # safetensors' own key: the tensor cannot be stored
            raise bad(f"{entry}.name", "is __metadata__, the key safetensors keeps its metadata in")
        if _CONTROL.search(name):  # an escape sequence would reach the terminal and the reports
            raise bad(f"{entry}.name", f"holds control characters: {shown(name)}")
        if name in names:
            raise bad(f"{entry}.name", f"repeats {shown(name)}")
        names.add(name)
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            raise bad(f"{entry}.shape", f"must be a list of sizes >= 0, got {shown(shape)}")
        dtype = t.get("dtype")  # a list is unhashable: test the type first
        if not isinstance(dtype, str) or dtype not in TENSOR_DTYPES:
            raise bad(
                f"{entry}.dtype",
                f"must be a torch dtype such as 'float32', got {shown(t.get('dtype'))}",
            )
        if t.get("kind", "param") not in ("param", "buffer"):
            raise bad(f"{entry}.kind", f"must be 'param' or 'buffer', got {shown(t.get('kind'))}")


def check_optimizer(optimizer: Any, tensors: int, bad) -> None:
    """`{"type": str, "groups": [objects], "tensor_groups": [one group index per tensor, -1
    for none], "counters": [setting names] (optional)}`, or absent (a manifest's and a golden
    file's)."""
    if optimizer is None:
        return
    what = "{type, groups: [settings], tensor_groups: [a group index per tensor]}"
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("type"), str):
        raise bad("optimizer", f"must be {what}")
    groups, places = optimizer.get("groups"), optimizer.get("tensor_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise bad("optimizer.groups", "must be a list of objects")
    fits = isinstance(places, list) and len(places) == tensors
    if not fits or not all(is_int(g) and -1 <= g < len(groups) for g in places):
        raise bad("optimizer.tensor_groups", f"must hold one group index per tensor ({tensors})")
    counters = optimizer.get("counters", [])
    if not isinstance(counters, list) or not all(isinstance(k, str) for k in counters):
        raise bad("optimizer.counters", "must be a list of setting names")
