"""A 16-bit computation the runs did not declare: float32 runs whose recorded gradients at
update 0 all fit in bfloat16 (or float16), as a loop that keeps float32 master weights and
computes in a 16-bit model copy records them. Judged as float32, they get float32's
tolerances and references (a float64 rerun computes otherwise): say so, with the declaration."""

from __future__ import annotations

import numpy as np

from ..runs.model import Run, Tensors
from ..runs.store import slices

SAMPLE = 4096  # nonzero values read per tensor
EVIDENT = 1024  # nonzero values over the whole gradient, at least, before anything is said
_FLOAT16_MAX = 65504.0


def sixteen_bit_exact(run: Run) -> str | None:
    """'bfloat16' or 'float16' where every nonzero finite value of the run's gradient at update
    0 (its first SAMPLE per tensor, EVIDENT at least) is exact in that type; else None."""
    if getattr(run, "compute_dtype", None) != "float32" or getattr(run, "record", "") != "full":
        return None
    if not run.has_grads:
        return None
    return sixteen_bit_kind((run.grads(0) if run.updates else None) or {})


def sampled(grads: Tensors) -> list[np.ndarray]:
    """Per tensor of `grads`, its first SAMPLE nonzero finite values (`sample_of`)."""
    return [sample_of(grads, name) for name in grads]


def sample_of(grads: Tensors, name: str, size: int = SAMPLE) -> np.ndarray:
    """A tensor's first `size` nonzero finite values (float32), read a slice at a time."""
    found, wanted = [], size
    for part in slices(grads, name, size):
        v = np.asarray(part, dtype=np.float32)
        found.append(np.array(v[(v != 0) & np.isfinite(v)][:wanted]))  # a copy: v goes
        wanted -= found[-1].size
        if not wanted:
            break
    return np.concatenate(found)


def sixteen_bit_kind(grads: Tensors, values: list[np.ndarray] | None = None) -> str | None:
    """'bfloat16' or 'float16' where every nonzero finite value of `grads` (the first SAMPLE of
    each tensor, EVIDENT at least over them all; `values`, where `sampled` read them) is exact
    in that type; else None."""
    values = sampled(grads) if values is None else values
    if sum(v.size for v in values) < EVIDENT:
        return None
    bits = np.concatenate([v.view(np.uint32) for v in values])
    if not (bits & np.uint32(0xFFFF)).any():
        return "bfloat16"
    wide = np.concatenate(values)
    if not (bits & np.uint32(0x1FFF)).any() and (np.abs(wide) <= _FLOAT16_MAX).all():
        return "float16"
    return None


def undeclared_note(base: Run, merged: Run) -> list[str]:
    """The note where the baseline's gradient is exact in a 16-bit type while both runs declare
    float32 (`sixteen_bit_exact`; the merged run may sum its micro-batches' 16-bit gradients in
    float32, which leaves them inexact)."""
    kind = sixteen_bit_exact(base)
    if kind is None or merged.compute_dtype != "float32":
        return []
    return [undeclared(kind, "judged here with float32's tolerances")]


def undeclared(kind: str, so: str) -> str:
    """What a baseline `sixteen_bit_exact` in `kind` says, `so` what follows from it here (the
    report's note; a float64 reference's refusal)."""
    return (
        f"every gradient value the baseline recorded at update 0 is {kind}-exact, though the "
        f"runs declare float32: the loop computed in {kind} (a {kind} model copy beside "
        f"float32 master weights?), {so}; record both runs with "
        f'Recorder(..., compute_dtype="{kind}"), and judge them with --reference none or a '
        "reference recorded as the README's mixed-precision section says"
    )
