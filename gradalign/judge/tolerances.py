"""Default tolerances per parameter dtype, and the names users override them by."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadInput, shown
from ..runs.model import COMPUTE_ORDER


@dataclass(frozen=True)
class Tolerances:
    """How far a merged run may stray from its baseline and still be the same training.

    Weights are judged against how far training moved them:
    ||w_merged - w_base|| <= weight_rtol * ||w_base - w_init|| + weight_atol * sqrt(n).
    Gradients against their own size: ||g_merged - g_base|| <= grad_rtol * ||g_base|| + ...
    Losses: |l_merged - l_base| <= loss_atol + loss_rtol * |l_base|, plus a log's print resolution.

    With a more precise reference run the fixed tolerances give way to the run's own noise: per
    update and tensor, ||merged - ref|| <= noise_factor * ||base - ref|| + noise_floor * eps *
    ||ref||, where eps is the machine epsilon of the runs' dtype (see noise.py).
    """

    loss_atol: float
    loss_rtol: float
    weight_rtol: float
    weight_atol: float
    grad_rtol: float
    noise_factor: float = 4.0
    noise_floor: float = 1.0
    # Without a reference: the gradient tolerance at an update the runs enter with weights that
    # differ (never below grad_rtol; judge/apart.py). In 16 bits a gradient evaluated at other
    # weights is rounded otherwise throughout the forward, not only summed in another order.
    grad_rtol_apart: float = 0.0
    # The same for the loss: a 16-bit forward at other weights rounds the loss otherwise, by up
    # to about one rounding of the loss itself (the compute dtype's epsilon).
    loss_rtol_apart: float = 0.0

    def __post_init__(self) -> None:
        """The apart tolerances as judged: never below grad_rtol and loss_rtol (reports say
        what was used, not 0.0 or a value the judge raised)."""
        for apart, floor in (("grad_rtol_apart", "grad_rtol"), ("loss_rtol_apart", "loss_rtol")):
            value, least = getattr(self, apart), getattr(self, floor)
            if isinstance(value, float | int) and isinstance(least, float | int) and value < least:
                object.__setattr__(self, apart, float(least))

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


# float32 and float64 come from runs of the built-in MLP (README, "Tolerances", has the commands):
# clean Adam in float32 errs by 1.8e-5 of its displacement, a missing 1/K under Adam by 1.4e-3.
DEFAULTS: dict[str, Tolerances] = {
    "float64": Tolerances(
        loss_atol=1e-12, loss_rtol=1e-12, weight_rtol=1e-9, weight_atol=1e-15, grad_rtol=1e-9
    ),
    "float32": Tolerances(
        loss_atol=1e-6, loss_rtol=1e-5, weight_rtol=1e-4, weight_atol=1e-9, grad_rtol=1e-4
    ),
    # Autocast, measured on the built-in default with --reference none (README): clean float16
    # runs err by up to 3.3e-5 (loss, relative), 1.0e-2 (weights, of the distance moved) and
    # 1.5e-2 (gradients); bfloat16 by 1.9e-4, 3.4e-2 and 3.4e-2. About 3x margin: coarse, which
    # is why the float64 reference (the default) is the way to judge reduced precision.
    # From update 1 on the runs' weights differ and each gradient is rounded otherwise:
    # `bench/model_zoo.py --autocast [float16] --reference-none` (150 clean runs of 5 families
    # and 10 optimizers) erred there by up to 0.118 (float16) and 0.209 (bfloat16) of the norm,
    # against 0.0019 and 0.0186 from the same weights (docs/NOISE.md, "Without a reference").
    "float16": Tolerances(
        loss_atol=1e-5,
        loss_rtol=1e-4,
        weight_rtol=3e-2,
        weight_atol=1e-9,
        grad_rtol=5e-2,
        grad_rtol_apart=0.2,
        loss_rtol_apart=1e-3,
    ),
    "bfloat16": Tolerances(
        loss_atol=1e-5,
        loss_rtol=1e-3,
        weight_rtol=1e-1,
        weight_atol=1e-9,
        grad_rtol=1e-1,
        grad_rtol_apart=0.3,
        loss_rtol_apart=8e-3,
    ),
}
# TF32 (float32 math on a GPU's tensor cores) rounds each product's inputs to float16's 10 bits
# but keeps float32's range and its sums: float16's defaults, not measured on TF32 itself (a CPU
# emulation of TF32 convolutions, tests/test_tf32.py, passes within them).
DEFAULTS["tf32"] = DEFAULTS["float16"]
NAMES = tuple(f.name for f in dataclasses.fields(Tolerances))


def for_dtype(dtype: str, overrides: dict[str, Any] | None = None) -> Tolerances:
    """The defaults for `dtype` (the least precise of the runs), with user overrides applied.

    Names it does not know get the float32 defaults.
    """
    base = DEFAULTS.get(dtype.removeprefix("torch."), DEFAULTS["float32"])
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(overrides) - set(NAMES), key=str)
    if unknown:
        raise BadInput(f"unknown tolerance {shown(unknown[0])} (known: {', '.join(NAMES)})")
    for name, value in overrides.items():
        check_tolerance(name, value)
    return dataclasses.replace(base, **{k: float(v) for k, v in overrides.items()})


# Upper bounds (exclusive) past which a tolerance passes what no training could be: with a
# relative tolerance of 1 an error as large as the value itself passes (a merged run whose weights
# never moved, a zero gradient, a zero loss); a reference is accepted while the baseline stays
# within 1% (compatible.REFERENCE_SANITY_RTOL) of the distance training moved it, so 100 times
# its noise may be the whole distance; 128 roundings (1/eps of bfloat16) are a bfloat16 tensor's
# whole size. The absolute tolerances carry the data's units: only finiteness bounds them.
LIMITS: dict[str, tuple[float, str]] = {
    "loss_rtol": (1.0, "at 1 an error as large as the loss itself passes (a zero loss)"),
    "weight_rtol": (1.0, "at 1 a merged run whose weights never moved passes"),
    "grad_rtol": (1.0, "at 1 an error as large as the gradient itself (a zero gradient) passes"),
    "grad_rtol_apart": (
        1.0,
        "at 1 an error as large as the gradient itself (a zero gradient) passes",
    ),
    "loss_rtol_apart": (1.0, "at 1 an error as large as the loss itself passes (a zero loss)"),
    "noise_factor": (
        100.0,
        "a reference may stand 1% of the distance trained away from the baseline, so 100 times "
        "its noise can pass a run that did not train",
    ),
    "noise_floor": (128.0, "128 roundings are a whole bfloat16 tensor: a zero tensor passes"),
}


def check_tolerance(name: str, value: Any) -> None:
    """Refuse a tolerance that is not a number, negative, infinite, or so large that the check
    it sets could not fail (`LIMITS`), saying why."""
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if not number or not 0 <= value < math.inf:
        why = (
            "a number written as text, or a list, is no tolerance"
            if not number
            else "an infinite tolerance would pass any bug"
            if value == math.inf
            else "an error is never below a negative tolerance: every check would fail"
            if value < 0
            else "NaN compares as no number"
        )
        raise BadInput(f"tolerance {name} must be a finite number >= 0, got {shown(value)} ({why})")
    if name in LIMITS and not value < LIMITS[name][0]:
        limit, why = LIMITS[name]
        raise BadInput(
            f"tolerance {name} must be below {limit:g}, got {shown(value)}: {why} (the check would "
            "be vacuous)"
        )


EPS = {
    "float64": 2.0**-52,
    "float32": 2.0**-23,
    "tf32": 2.0**-10,  # float32 math on tensor cores rounds its inputs to float16's mantissa
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
}


def eps(dtype: str) -> float:
    """Machine epsilon of a dtype name (float32's for names it does not know)."""
    return EPS.get(dtype.removeprefix("torch."), EPS["float32"])


def least_precise(dtypes: list[str]) -> str:
    """The dtype whose defaults apply when runs mix dtypes."""
    known = [d for d in dtypes if d in COMPUTE_ORDER] or ["float32"]
    return max(known, key=COMPUTE_ORDER.index)


def held_exactly(values: np.ndarray, dtype: str) -> np.ndarray:
    """Which of `values` the 16-bit `dtype` (float16 or bfloat16) holds exactly."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32) == values
    return (values.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) == values


def loss_rounding(losses: list[np.ndarray], compute: str) -> float:
    """The epsilon of a dtype less precise than the run's that every recorded loss is a number
    of, where the loss was computed or rounded in it: under a 16-bit compute dtype, that dtype
    (a bfloat16 loss near 21 is a multiple of 0.125, and two runs' losses differ by a step or two
    of it); in a float64 model, float32 (a loss computed as `cross_entropy(logits.float(), y)`
    was judged to float64's 1e-12 and failed at 3e-8). Else 0: losses as precise as the run.
    Two losses or more all held exactly by chance would be 2^-29 (float32) a draw or less."""
    values = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in losses])
    values = values[np.isfinite(values) & (values != 0)]
    if values.size < 2 or compute not in ("float64", "float16", "bfloat16"):
        return 0.0
    if (values.astype(np.float32).astype(np.float64) != values).any():
        return 0.0  # wider than float32
    if compute == "float64" or held_exactly(values, compute).all():
        return eps("float32" if compute == "float64" else compute)
    return 0.0
