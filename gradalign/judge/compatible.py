"""Whether runs can be judged against each other at all (else BadInput, exit 2)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import BadInput
from ..runs.model import PRECISION_ORDER, Run, Tensors
from ..runs.schema import is_int
from ..runs.sketches import dot
from ..runs.store import shape_of, slices
from .initial_weights import same_initial_weights
from .lengths import length_hint
from .metrics import diff
from .rerun import (
    check_finite_losses,
    check_more_precise,
    check_same_optimizer,
    check_same_steps,
    not_finite,
)
from .tolerances import eps, for_dtype, least_precise
from .undeclared import sixteen_bit_exact, undeclared
from .window_sizes import has_problems

# Config keys a float64 reference may legitimately change: its precision, K and device.
_REFERENCE_MAY_DIFFER = {
    *("dtype", "accum_steps", "device", "precision", "amp_level", "mixed_precision", "round_to"),
    *("record", "snapshot_every"),  # what was kept of the training, not the training
}
# A float32 baseline drifts from its float64 rerun by up to ~1e-4 of the distance moved (SGD,
# momentum 0.9, 12 updates); another training is off by orders of magnitude more: 1% separates
# them. Autocast drifts further (Adam: 4.6% in float16, 11% in bfloat16), so the bound is at
# least 64 epsilons of the compute dtype (6.3% for float16, 50% for bfloat16).
REFERENCE_SANITY_RTOL = 1e-2
REFERENCE_SANITY_EPS = 64


def first_difference(
    base: list[tuple[str, tuple, str]], other: list[tuple[str, tuple, str]], other_name: str
) -> str:
    """Where two models' tensor lists (name, shape, kind) first part, in model order, both
    sides."""

    def shown(tensor: tuple[str, tuple, str]) -> str:
        name, shape, kind = tensor
        return f"{name} {list(shape)}" + (" (a buffer)" if kind == "buffer" else "")

    for i, (x, y) in enumerate(zip(base, other, strict=False)):
        if x != y:
            return f"tensor {i} is {shown(x)} in the baseline and {shown(y)} in the {other_name}"
    longer, name = (base, "baseline") if len(base) > len(other) else (other, other_name)
    return (
        f"the baseline holds {len(base)} tensors and the {other_name} {len(other)}; the "
        f"{name}'s next is {shown(longer[min(len(base), len(other))])}"
    )


def _resumed_at(run: Run) -> int:
    """The update a run resumed from a checkpoint began at (its config's `resumed_at_update`,
    the transformers integration's), 0 for one from its start (or a value that is no count)."""
    value = run.config.get("resumed_at_update")
    return value if is_int(value) and value > 0 else 0


def check_compatible(
    base: Run, other: Run, what: str = "runs", other_name: str = "merged"
) -> Tensors | None:
    """Raise BadInput when the two runs cannot be the same training at all.

    Returns the baseline's initial weights when the sources recorded them.
    """
    starts = [_resumed_at(run) for run in (base, other)]
    if starts[0] != starts[1]:
        shown = " and ".join(
            f"the {name} at update {s}" if s else f"the {name} from its start"
            for name, s in (("baseline", starts[0]), (other_name, starts[1]))
        )
        raise BadInput(
            f"{what} that began at other updates: {shown} (a run resumed from a checkpoint "
            "records from there): their updates are not the same ones; resume both from the "
            "same checkpoint, or neither"
        )
    b = [(t.name, t.shape, t.kind) for t in base.tensors]
    m = [(t.name, t.shape, t.kind) for t in other.tensors]
    if b != m:  # before the lengths: two models' runs are told so, not how their data ended
        if {base.kind, other.kind} == {"log", "run-dir"}:  # a log prints a few values
            named = f"{other_name} run" if other_name == "merged" else other_name
            log, run = ("baseline", named) if base.kind == "log" else (named, "baseline")
            raise BadInput(
                f"the {log} is read from a training log and the {run} from a run directory: a "
                f"log holds the values it printed ({len(b if base.kind == 'log' else m)} "
                "tensor(s)), not the run's tensors; compare logs with logs, or run directories "
                "with run directories"
            )
        raise BadInput(f"{what} of different models: {first_difference(b, m, other_name)}")
    bookkeeping = has_problems(base) or has_problems(other)  # judged, not refused
    if base.updates != other.updates and not bookkeeping:
        raise BadInput(
            f"{what} of different lengths: baseline has {base.updates} updates, "
            f"{other_name} has {other.updates}" + length_hint(base, other, other_name)
        )
    if base.updates == 0 or (other.updates == 0 and not bookkeeping):
        raise BadInput("the runs hold no updates to compare")
    if base.full_weights != other.full_weights:
        raise BadInput("cannot compare a run with full weights against one with printed values")
    return same_initial_weights(base, other, what, other_name)


def check_same_precision(base: Run, merged: Run) -> None:
    """The two runs must compute at one precision: the noise floor measured on the baseline says
    nothing about a run that computes in fewer bits (autocast, or FSDP's mixed precision in one
    run only), nor about one whose parameters are of another dtype (a whole model cast to
    bfloat16 against a float32 baseline passed the fixed tolerances; a float64 model's merged
    run that forgot `.double()` too). Logs, which record neither, are taken as they are."""
    said = [run.environment.get("compute_dtype") for run in (base, merged)]
    stored = all(run.full_weights and run.tensors for run in (base, merged))
    if not (any(said) or stored) or base.compute_dtype == merged.compute_dtype:
        return
    raise BadInput(
        f"the baseline computes in {base.compute_dtype}, the merged run in "
        f"{merged.compute_dtype}: record both with the same precision (the same parameter "
        "dtype, autocast or mixed-precision policy), or the merged run's rounding is taken for "
        "an accumulation bug"
    )


@dataclass(frozen=True)
class ReferenceBound:
    """How far the baseline may stray from an accepted reference: rtol of the distance moved,
    plus atol per element and one rounding of the reference's values."""

    where: str
    rtol: float
    atol: float
    epsilon: float
    hint: str = ""  # a likely cause, said with the refusal
    # tensors stored less precisely than the run's dtype (a bfloat16 layer beside float32
    # ones): their values are rounded to their own dtype at every step
    epsilons: dict[str, float] = field(default_factory=dict)

    def rounding(self, name: str, update: int = 0) -> float:
        """The relative rounding `name`'s values may hold after `update`, in the baseline's
        storage: one rounding of the reference's values, and the baseline's weights rounded to
        their storage at every step, by at most half a unit in the last place (eps/2 of each
        value). Where the steps are a few units in the last place and alike from update to
        update (an RMSNorm weight near 1 under SGD-like steps of 3e-6), each update's rounding
        errs the same way and they add up: 2.3% of the distance moved after 10 updates, against
        the 1% `rtol` allows (model zoo `hf-llama` under ASGD, run 901)."""
        return max(self.epsilon, self.epsilons.get(name, 0.0)) * max(1.0, (update + 1) / 2)


def check_reference(base: Run, merged: Run, ref: Run) -> ReferenceBound:
    """A reference must be a more precise rerun of the baseline's own training.

    A wrong reference would inflate the noise floor and pass anything, so it is refused unless it
    starts from the same weights, saw the same samples, has the same config apart from dtype,
    K and device, and gives the baseline's gradients at update 0 within the bound
    (`check_first_gradients`; all checked here), and the baseline stays within the returned
    bound of it at every update (checked by `check_reference_weights` as the judge reads each
    update's weights).
    """
    where = f"reference {ref.source}"
    check_more_precise(base, merged, ref, where)
    check_compatible(base, ref, "baseline and reference", "reference")
    shared = (set(base.config) & set(ref.config)) - _REFERENCE_MAY_DIFFER
    changed = sorted(k for k in shared if base.config[k] != ref.config[k])
    if changed:
        key = changed[0]
        raise BadInput(
            f"{where} is another training: {key} is {ref.config[key]!r} there, "
            f"{base.config[key]!r} in the baseline"
        )
    if base.micro_data is not None and ref.micro_data is not None:
        same = base.window_sums(base.micro_data) == ref.window_sums(ref.micro_data)
        if not same.all():
            working = base.dtype if base.dtype in ("float16", "bfloat16") else "float32"
            raise BadInput(
                f"{where} saw other samples than the baseline (first at update "
                f"{int(np.flatnonzero(~same)[0])}; where the samples digested are the forward's "
                "inputs, transformed in the loop, a float64 rerun rounds them otherwise: "
                f"transform them in {working} and cast the result)"
            )
    check_same_steps(base, ref, where)
    check_same_optimizer(base, ref, where)
    check_finite_losses(base, ref, where)
    bound = reference_bound(base, merged, where)
    check_first_gradients(base, ref, bound)
    return bound


def reference_bound(base: Run, merged: Run, where: str) -> ReferenceBound:
    """How far the baseline may stray from an accepted reference, from the runs' dtypes."""
    dtype = least_precise([base.dtype, merged.dtype])
    # compute_dtype counts a bfloat16 layer beside float32 ones; its own tensors round in it
    compute = least_precise([base.compute_dtype, merged.compute_dtype])
    stored = {t.name: t.dtype for t in base.tensors if t.dtype in PRECISION_ORDER}
    tol = for_dtype(dtype)
    rtol = max(tol.weight_rtol, REFERENCE_SANITY_RTOL, REFERENCE_SANITY_EPS * eps(compute))
    lower = {name: eps(d) for name, d in stored.items() if eps(d) > eps(dtype)}
    return ReferenceBound(where, rtol, tol.weight_atol, eps(dtype), _rerun_hint(base), lower)


def check_first_gradients(base: Run, ref: Run, bound: ReferenceBound) -> None:
    """Refuse a reference whose gradients at update 0 (the same weights and samples, only the
    precision differs) stand farther from the baseline's, over the whole model, than `bound.rtol`
    of their size. The weights' check cannot see that: noise allowances grow with the very
    disagreement, and a reference with a wrong loss scale would widen every noise floor. One
    tensor at a time, a slice at a time; skipped where the baseline's gradient is not finite or
    either run's was not recorded; refused where only the reference's is not finite."""
    gb, gr = base.grads(0), ref.grads(0)
    if gb is None or gr is None:
        return
    apart = size = 0.0
    for name in [n for n in gb if n in gr]:
        if math.prod(shape_of(gb, name)) != math.prod(shape_of(gr, name)):
            return
        pairs = zip(slices(gb, name), slices(gr, name), strict=True)
        for b, r in pairs:  # float64 a slice at a time
            bs, rs = b.astype(np.float64), r.astype(np.float64)
            if not (np.isfinite(bs).all() and np.isfinite(rs).all()):
                for _ in pairs:  # both tensors read to their end: a file altered is refused first
                    pass
                if not np.isfinite(bs).all():
                    return  # a baseline gone non-finite fails on its own
                raise not_finite(bound.where, f"its gradient of {name} at update 0 is not")
            bs -= rs
            apart, size = apart + dot(bs, bs), size + dot(rs, rs)
    if apart > (bound.rtol + bound.epsilon) ** 2 * size:
        share = math.sqrt(apart / size) if size else math.inf
        raise BadInput(
            f"{bound.where} is not a rerun of the baseline's training: at update 0, from the "
            f"same weights and samples, its gradients are {share:.3g} of their size away from "
            f"the baseline's, more than {bound.rtol:g}{bound.hint}"
        )


def _tf32_hint(base: Run) -> str:
    """Where a float32 baseline on CUDA may have computed in TF32 that its manifest does not
    list (recorded before `tf32` was, or by a loop whose layers the Recorder could not see)."""
    env = base.environment
    flags = [f for f in ("cudnn_allow_tf32", "matmul_allow_tf32") if env.get(f)]
    if env.get("dtype") != "float32" or env.get("tf32") or not flags:
        return ""
    return (
        f". The baseline ran on CUDA with {' and '.join(flags)}: on Ampere and later GPUs float32 "
        "convolutions (and matmuls, where allowed) round their inputs to TF32's 10 bits, which a "
        "float64 rerun does not; turn it off in both runs (torch.backends.cudnn.conv."
        'fp32_precision = "ieee" and torch.backends.cuda.matmul.fp32_precision = "ieee", or '
        "before torch 2.9 torch.backends.cudnn.allow_tf32 = False), or record them with this "
        "version, which lists it"
    )


def _rerun_hint(base: Run) -> str:
    """Why a float64 rerun may compute another function: an optimizer's epsilon taken from the
    dtype, dropout on CUDA drawing its masks per dtype, any random draw in the model's own
    dtype."""
    kind = sixteen_bit_exact(base)
    if kind is not None:
        return f" ({undeclared(kind, 'which a float64 rerun does not compute')})"
    unset = _dtype_epsilon(base.optimizer_settings or {})
    if unset:
        return (
            f" ({unset} is None, which torch fills with the dtype's epsilon: 1.2e-7 in "
            "float32, 2.2e-16 in float64, so the float64 rerun steps small gradients otherwise; "
            "set it in both runs, as torch.finfo(torch.float32).eps, or judge with --reference "
            "none)"
        )
    on_cuda = str(base.environment.get("device", "")).startswith("cuda")
    dropout = base.model_facts.get("dropout") or []
    if not dropout or not on_cuda:
        return (
            " (a float64 rerun must compute the same function of the same samples: random "
            "numbers drawn in the model's dtype, such as torch.randn_like on a float64 tensor, "
            "come out other than the float32 draws, and a loss scaled otherwise shows the same "
            "way; draw such numbers in float32 and cast them, or judge with --reference none. An "
            "optimizer that computes its step in a 16-bit dtype whatever the weights' (as Muon's "
            "orthogonalization, known by its name, does in bfloat16) leaves a float64 rerun no "
            "more precise than the baseline: record both runs with Recorder(..., compute_dtype="
            f'"bfloat16") and judge with --reference none{_tf32_hint(base) if on_cuda else ""})'
        )
    return (
        f" (the model's dropout ({', '.join(dropout)}) runs on CUDA, where a float64 rerun "
        "draws other masks: draw them on the CPU generator or from the sample, or judge with "
        "--reference none)"
    )


def _dtype_epsilon(settings: dict) -> str:
    """The optimizer's epsilon setting left None, which torch's Adafactor (its `eps[0]`) fills
    with the parameters' dtype's epsilon; '' where there is none."""
    for group in settings.get("groups") or []:
        for key, value in group.items():
            values = value if isinstance(value, list) else [value]
            if key.startswith("eps") and None in values:
                at = f"[{values.index(None)}]" if isinstance(value, list) else ""
                return f"{settings.get('type', 'optimizer')}'s {key}{at}"
    return ""


def check_reference_weights(
    update: int,
    base: Tensors,
    ref: Tensors,
    starts: Tensors | None,
    bound: ReferenceBound,
    drift: Callable[[str], float] | None = None,
) -> None:
    """Refuse the reference if the baseline's weights after `update` stray beyond `bound`, plus
    what its gradient noise lets them stray (`drift`, judge/drift.py `Drift.strayed`): a tensor
    the reference leaves still while Adam walks the baseline's noise, or small gradients whose
    float32 noise Adam turns into the same share of each step, are no sign of another run."""
    for name, value in base.items():
        if name not in ref or not np.isfinite(value).all():
            continue  # a diverged baseline fails on its own; it says nothing of the reference
        start = starts.get(name) if starts is not None else None
        d = diff(name, ref[name], value, rtol=bound.rtol, atol=bound.atol, start=start)
        rounding = bound.rounding(name, update) * float(
            np.linalg.norm(ref[name].astype(np.float64))
        )
        walked = drift(name) if drift is not None else 0.0
        if not d.error <= d.allowed + rounding + walked:
            raise stray(bound, update, name, d.error)


def stray(bound: ReferenceBound, update: int, name: str, error: float) -> BadInput:
    """The refusal of a reference that the baseline strays from."""
    return BadInput(
        f"{bound.where} is not a rerun of the baseline's training: at update {update} the "
        f"baseline's {name} is {error:.3g} away from it, more than {bound.rtol:g} of the "
        f"distance training moved it{bound.hint}"
    )
