"""Per-tensor fingerprints as the run format defines them: the int64 sum, with wrap-around, of
the elements' bit patterns (float64 as int64, float32 as int32, float16 and bfloat16 as int16;
integers and bools as they are). A stored tensor is checked against its recorded fingerprint as
it is read (docs/FORMAT.md, "Integrity"); summed a slice at a time, the sum is the same.
"""

from __future__ import annotations

import numpy as np

_BITS = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.int8}


def bitsum(values: np.ndarray, declared: str | None = None) -> int:
    """The fingerprint of `values` (any slice of a tensor; sums of slices add up with wrap).

    `declared`: the tensor's dtype in the manifest. A bfloat16 tensor stored widened to float32
    is summed as the int16 bit patterns it widened from (its upper 16 bits)."""
    a = np.asarray(values)
    if a.dtype.kind == "f":
        a = a.view(_BITS[a.dtype.itemsize])
        if declared == "bfloat16" and a.dtype == np.int32:
            return wrap(int(np.right_shift(a, 16).sum(dtype=np.int64)))
    return wrap(int(a.sum(dtype=np.int64)))


def wrap(value: int) -> int:
    """An integer as int64 with two's-complement wrap-around."""
    return (value + 2**63) % 2**64 - 2**63
