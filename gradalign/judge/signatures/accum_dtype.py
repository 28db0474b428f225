"""Gradients accumulated in a 16-bit buffer (`grad-accum-dtype`): the merged gradient's values
are 16-bit numbers where the baseline's are float32 ones.

Read two ways. Where nothing scaled the sum after it (`_exact_counts`), every merged value
is exactly a bfloat16 (float16) number, where most of the baseline's are not, or where its
tensors computed in float32 hold WIDE_VALUES values that are not (`_wide_values`: under
autocast a linear map's gradient is a bfloat16 number in both runs, and only a LayerNorm's, an
embedding's, summed in float32, tell a 16-bit buffer; model zoo run 201001, an encoder under
bfloat16 autocast with the sum rounded to bfloat16 from update 6, passed within the noise). And
where the baseline's are all 16-bit numbers too (a LayerNorm computed in bfloat16 as well), the
merged run's gradient, declared float32 and summed over more micro-batches or ranks than the
baseline's, is one at two updates in a row (`_summed_narrow`): a float32 sum of two bfloat16
numbers of one binade is one about once in two, of others more rarely (run 201002, an MLP with
LayerNorm under bfloat16 autocast, passed so).
Where one factor per tensor scaled it after (a norm clip that engaged, a division by the
window's item count), each value is fl(c·q) for a 16-bit q: its float32 mantissa is a function
of q's alone, so a tensor holds at most 2^7 (2^10) distinct mantissas, where float32 sums of
many terms hold about as many as values (`_mantissas`; a clip at 0.1 over a bfloat16 sum was
named `clip-threshold`, its norm "0.9998 times the baseline's").
"""

from __future__ import annotations

import numpy as np

from ...runs.model import Tensors
from ...runs.store import slices
from ..results import Comparison, Diagnosis, UpdateResult
from ..tolerances import held_exactly
from ..undeclared import sample_of
from .common import exact_of, finite, lossy_hooks, relative_error, window

STORED_BITS = {"bfloat16": 7, "float16": 10}  # bfloat16 first: its numbers are float16 numbers
SAMPLE = 1 << 16  # nonzero values per tensor whose mantissas are counted
EVIDENT = 8  # a tensor is read where it holds this many times as many values as mantissas allowed
# values of the baseline's wide tensors (most of their values no 16-bit number) that must stand
# exactly 16-bit in the merged run: a float32 sum of many terms is a bfloat16 number about once
# in 2^16 values, a sum of two such numbers of one binade once in two; 2^-64 at the least
WIDE_VALUES = 64


def _exact_counts(grads: Tensors, narrow: str) -> list[tuple[int, int]]:
    """Per tensor: how many of its nonzero values `narrow` (float16 or bfloat16) holds exactly,
    and how many nonzero values it holds."""
    counts = []
    for name in grads:
        exact = held = 0
        for part in slices(grads, name):  # a slice at a time
            values = np.asarray(part, dtype=np.float32)
            values = values[values != 0]
            exact += int(np.count_nonzero(held_exactly(values, narrow)))
            held += int(values.size)
        counts.append((exact, held))
    return counts


def _share(counts: list[tuple[int, int]]) -> float:
    """The share of the nonzero values held exactly (`_exact_counts`)."""
    exact, total = sum(e for e, _ in counts), sum(n for _, n in counts)
    return exact / total if total else 0.0


def _wide_values(counts: list[tuple[int, int]]) -> int:
    """How many nonzero values the tensors hold of which the 16-bit type holds fewer than half
    exactly (`_exact_counts` of the baseline's: its tensors computed in float32)."""
    return sum(n for e, n in counts if n and 2 * e < n)


def _all_narrow(counts: list[tuple[int, int]]) -> bool:
    """Whether every nonzero value is held exactly, WIDE_VALUES of them at least."""
    return sum(n for _, n in counts) >= WIDE_VALUES and all(e == n for e, n in counts)


def _summed_narrow(
    c: Comparison, r: UpdateResult, merged: list[tuple[int, int]], narrow: str
) -> bool:
    """Whether the merged gradient at update `r` (`merged`: its `_exact_counts`) and at the
    next update too is all `narrow` numbers (`_all_narrow`), declared float32 or wider, and
    sums more micro-batches or ranks than the baseline's: each value a float32 sum of 16-bit
    numbers that came out 16-bit. Two updates in a row: a window whose other micro-batches added
    nothing (all padding) leaves one micro-batch's 16-bit gradient, once."""
    more = window(c) > 1 or c.merged.world_size > c.baseline.world_size
    if not (more and c.merged.grad_dtype in ("float32", "float64") and _all_narrow(merged)):
        return False
    later = next((x for x in c.results if x.update > r.update), None)
    after = exact_of(c, c.merged, "grads", later.update) if later is not None else None
    return after is not None and _all_narrow(_exact_counts(after, narrow))


def _terms(c: Comparison) -> str:
    """What the merged gradient sums more of than the baseline's, said."""
    k = window(c)
    ranks = c.merged.world_size // max(1, c.baseline.world_size)
    said = [f"K={k} micro-batches'"] if k > 1 else []
    return " and ".join(said + ([f"{ranks} ranks'"] if ranks > 1 else []))


def _counts(grads: Tensors) -> dict[str, tuple[int, int]]:
    """Per tensor: how many distinct float32 mantissas its first SAMPLE nonzero finite values
    hold, and how many values those are."""
    counts = {}
    for name in grads:
        values = sample_of(grads, name, SAMPLE)  # read a slice at a time
        counts[name] = (_mantissa_count(values), int(values.size))
    return counts


def _mantissa_count(values: np.ndarray) -> int:
    """How many distinct float32 mantissas `values` (float32) hold."""
    return int(np.unique(values.view(np.uint32) & np.uint32(0x7FFFFF)).size)


def few_mantissas(values: list[np.ndarray], narrow: str = "bfloat16") -> bool:
    """Whether each of `values` (a sample of each tensor's nonzero float32 values) that is
    readable (EVIDENT·2^bits values at least; one at least) holds at most 2^bits distinct
    mantissas: `narrow` numbers times one factor per tensor."""
    readable = [v for v in values if v.size >= EVIDENT << STORED_BITS[narrow]]
    return bool(readable) and not any(many_mantissas(v, narrow) for v in readable)


def many_mantissas(values: np.ndarray, narrow: str = "bfloat16") -> bool:
    """Whether a sample of one tensor's nonzero float32 values, readable (EVIDENT·2^bits values
    at least), holds more than 2^bits distinct mantissas: no `narrow` sum times one factor."""
    bits = STORED_BITS[narrow]
    return values.size >= EVIDENT << bits and _mantissa_count(values) > 1 << bits


def _readable(counts: dict[str, tuple[int, int]], bits: int) -> dict[str, int]:
    """The mantissa counts of the tensors with at least EVIDENT·2^bits values (`_counts`)."""
    return {name: n for name, (n, size) in counts.items() if size >= EVIDENT << bits}


def _mantissas(grads: Tensors, bits: int) -> dict[str, int]:
    """Per tensor with at least EVIDENT·2^bits nonzero finite values (of its first SAMPLE), how
    many distinct float32 mantissas they hold."""
    return _readable(_counts(grads), bits)


def _scaled_narrow(
    gb: Tensors, merged_counts: dict[str, tuple[int, int]], bits: int
) -> tuple[int, dict[str, int]] | None:
    """Where every readable merged tensor (`_counts` of the merged gradients) holds at most
    2^bits mantissas and some the baseline holds more in: the merged tensors' largest count,
    and the baseline's counts above 2^bits. The baseline is read only where the merged run is."""
    merged = _readable(merged_counts, bits)
    if not merged or max(merged.values()) > 1 << bits:
        return None
    base = _mantissas({name: g for name, g in gb.items() if name in merged}, bits)
    wide = {name: n for name, n in base.items() if n > 1 << bits}
    return (max(merged.values()), wide) if wide else None


def grad_accum_dtype(c: Comparison, r: UpdateResult) -> Diagnosis | None:
    """Gradients accumulated in a 16-bit buffer: every merged gradient value fits that format
    exactly (its last mantissa bits are zero), or each tensor's values are such numbers times
    one scale, while the baseline's are not (module docstring)."""
    gb = exact_of(c, c.baseline, "grads", r.update)
    gm = exact_of(c, c.merged, "grads", r.update)
    if not gb or not gm:
        return None
    merged_counts = _counts(gm)  # once for both formats
    for name, bits in STORED_BITS.items():
        merged_exact, base_exact = _exact_counts(gm, name), _exact_counts(gb, name)
        merged_share, base_share = _share(merged_exact), _share(base_exact)
        evidence: dict = {"merged_share_exact": merged_share, "baseline_share_exact": base_share}
        beside = merged_share == 1.0 and base_share >= 0.5  # a baseline mostly 16-bit too
        wide = _wide_values(base_exact) if beside else 0
        summed = beside and wide < WIDE_VALUES and _summed_narrow(c, r, merged_exact, name)
        if merged_share == 1.0 and (base_share < 0.5 or wide >= WIDE_VALUES or summed):
            evidence["baseline_wide_values"] = wide or None
            evidence["summed_declared_float32"] = summed
            seen = (
                f"every merged gradient value is exactly a {name} number (baseline: "
                f"{base_share:.1%} of them"
                + (f"; its tensors summed in float32 hold {wide} values, none such" if wide else "")
                + ")"
                + (
                    f", at this update and the next, though it sums {_terms(c)} 16-bit gradients "
                    f"in {c.merged.grad_dtype}, whose sums are seldom {name} numbers"
                    if summed
                    else ""
                )
            )
        elif (scaled := _scaled_narrow(gb, merged_counts, bits)) is not None:
            most, wide = scaled
            evidence |= {"merged_mantissas_max": most, "baseline_mantissas": wide}
            seen = (
                f"each merged gradient tensor's values are {name} numbers times one factor "
                f"(each tensor holds at most {most} distinct float32 mantissas, {name} has "
                f"{1 << bits}; the baseline's {_largest(wide)}), as a clip or a division after "
                f"the sum leaves a {name} sum"
            )
        else:
            continue
        return _diagnosis(c, r, name, seen, evidence, relative_error(gb, gm))
    return None


def _largest(wide: dict[str, int]) -> str:
    """The baseline's tensor with the most mantissas, said."""
    name = max(wide, key=wide.__getitem__)
    others = f" and {len(wide) - 1} more" if len(wide) > 1 else ""
    return f"{name} holds {wide[name]}{others}"


def _diagnosis(
    c: Comparison, r: UpdateResult, name: str, seen: str, evidence: dict, error: float | None
) -> Diagnosis:
    ranks = c.merged.world_size > 1
    how = f"accumulated or all-reduced in {name}" if ranks else f"accumulated in {name}"
    fix = (
        "accumulate gradients in float32 (keep .grad, or a float32 master copy, in "
        "float32 under mixed precision) and cast only the weights to 16 bits"
    )
    if ranks:
        fix += (
            "; on several ranks, all-reduce them in float32 too (no fp16/bf16 "
            "compression hook on DDP)"
        )
    hooks = lossy_hooks(c)
    if hooks:  # the Recorder saw the hook on the DDP wrapper: say it first
        how = (
            f"all-reduced in {name}: DDP ran the comm hook {', '.join(hooks)} "
            "(reduced-precision gradient communication, a deliberate approximation "
            "of the large batch's float32 mean)"
        )
        fix = (
            f"to check the accumulation, drop the compression hook ({', '.join(hooks)}) "
            "or register DDP's allreduce_hook instead; with it the run is another "
            "training than the large batch's, by the rounding of every all-reduced "
            "gradient"
        )
    off = f", and the gradient is {error:.3g} off (relative L2)" if error is not None else ""
    return Diagnosis(
        "grad-accum-dtype",
        f"at update {r.update} {seen}{off}: the micro-batch gradients were {how}",
        {
            "update": r.update,
            "accumulation_dtype": name,
            **evidence,
            "grad_rel_l2": finite(error),
            "comm_hooks": hooks,
            "recorded_grad_dtype": {
                "merged": c.merged.grad_dtype,
                "baseline": c.baseline.grad_dtype,
            },
        },
        fix,
    )
