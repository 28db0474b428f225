"""Whether two runs start from the same weights: tensor by tensor, a slice at a time, or by
their bit fingerprints where the tensors are not kept (a golden file); where they differ, why:
NaN weights, a more precise rerun cast from weights before their 16-bit rounding, or one that
computed its initial weights at another precision (within a few units in the last place)."""

from __future__ import annotations

import numpy as np

from ..errors import BadInput
from ..runs.model import Run, Tensors
from ..runs.store import shape_of, slices
from .checks import fingerprint_mismatches


def same_initial_weights(base: Run, other: Run, what: str, other_name: str) -> Tensors | None:
    """The baseline's initial weights, where `other` starts from the same ones (else BadInput);
    None where either run keeps none (their fingerprints are compared)."""
    init_b, init_m = base.init_weights(), other.init_weights()
    if init_b is None or init_m is None:
        _same_fingerprints(base, other, what)
    else:
        if set(init_b) != set(init_m):
            odd = sorted(set(init_b) ^ set(init_m))[0]
            raise BadInput(f"the initial weights of the {what} hold other tensors (first: {odd})")
        declared = {t.name: t.dtype for t in base.tensors}
        params = {t.name for t in base.tensors if t.kind == "param"}  # a mask buffer holds -inf
        for name in init_b:
            if _same_start(init_b, init_m, name, name in params):
                continue  # else the whole tensors tell what is wrong
            for run_name, values in (("baseline", init_b[name]), (other_name, init_m[name])):
                if name in params and values.dtype.kind == "f" and not np.isfinite(values).all():
                    raise BadInput(
                        f"the {run_name}'s initial weights hold NaN or infinite values (first "
                        f"in {name}): no training starts from them; record the run from a model "
                        "whose weights are initialised"
                    )
            if not np.array_equal(init_b[name], init_m[name]):
                delta = float(np.abs(init_b[name] - init_m[name].astype(np.float64)).max())
                cause = _why_apart(
                    init_b[name], init_m[name], declared.get(name, ""), what, other_name
                )
                raise BadInput(
                    f"initial weights differ (first in {name}, max abs diff {delta:.3g}){cause}"
                )
    return init_b


def _why_apart(base: np.ndarray, other: np.ndarray, low: str, what: str, other_name: str) -> str:
    """Why a tensor's initial weights differ, the baseline's declared `low` dtype: the other's
    rounded to it, or within a few of its units in the last place, else another model."""
    if _rounded(other, low, base):
        return (
            f": the baseline's are the {other_name}'s rounded to {low}; make the {other_name} "
            f"from the {low} model's weights (cast after rounding, as "
            f"model.to(torch.{low}).double())"
        )
    if _near(other, low, base):
        return (
            f": they differ by {low} rounding alone (at most {_ULPS} units in the last place): "
            f"the {other_name} computed its initial weights at another precision (a "
            "parametrization such as weight_norm applied after .double(), weights derived from "
            f"others); initialise the model at {low}, then cast it (model.double() after every "
            "initialisation)"
        )
    return f": the {what} did not start from the same model; use the same seed and initialisation"


def _same_start(init_b: Tensors, init_m: Tensors, name: str, param: bool) -> bool:
    """Whether a tensor's initial weights are the same in both runs, and finite where it is a
    parameter; read a slice at a time (equal slices are finite in both or in neither)."""
    if shape_of(init_b, name) != shape_of(init_m, name):
        return False
    for b, m in zip(slices(init_b, name), slices(init_m, name), strict=True):
        if not np.array_equal(b, m) or (param and b.dtype.kind == "f" and not np.isfinite(b).all()):
            return False
    return True


def _rounded(values: np.ndarray, dtype: str, rounded: np.ndarray) -> bool:
    """Whether `rounded` is `values` rounded to the 16-bit `dtype` (a float16 or bfloat16 model
    whose more precise rerun was cast from the weights before they were rounded)."""
    if dtype not in ("float16", "bfloat16") or values.shape != rounded.shape:
        return False
    if dtype == "float16":
        return np.array_equal(values.astype(np.float16), rounded.astype(np.float16))
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
    return np.array_equal(bits.astype(np.uint32).view(np.float32), rounded.astype(np.float32))


_ULPS = 4  # units in the last place an initialisation computed at another precision moves
_EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}


def _near(values: np.ndarray, dtype: str, rounded: np.ndarray) -> bool:
    """Whether `rounded` stands within _ULPS of `dtype`'s units in the last place of `values`
    everywhere (weight_norm's g = ||v|| computed in float64 by a reference cast before the
    parametrization, against the float32 baseline's: 4.6e-8 apart, refused as runs of two
    models)."""
    eps = _EPS.get(dtype)
    if eps is None or values.shape != rounded.shape or values.dtype.kind != "f":
        return False
    exact = values.astype(np.float64)
    tiny = float(np.finfo(np.float32).tiny) if dtype == "float32" else 2.0**-14
    bound = _ULPS * eps * np.maximum(np.abs(exact), tiny)
    return bool((np.abs(rounded.astype(np.float64) - exact) <= bound).all())


def _same_fingerprints(base: Run, other: Run, what: str) -> None:
    """Without the initial tensors (a golden file), their bit fingerprints must agree."""
    differ = fingerprint_mismatches(base, other)
    if differ is not None and differ.size:
        raise BadInput(
            f"initial weights differ (the bit fingerprint of {base.tensors[differ[0]].name}): "
            f"the {what} did not start from the same model; use the same seed and initialisation"
        )
