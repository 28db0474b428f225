"""The report for machines: a Comparison as strict JSON (keys sorted, non-finite numbers null)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..judge.distributed import ranks_summary
from ..judge.results import Comparison, UpdateResult
from .output import printable, write_text_atomic


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _norms(norms: tuple[float, float, float] | None) -> dict[str, float | None] | None:
    """An update's whole-model gradient norms, by run (null without a reference's)."""
    if norms is None:
        return None
    return dict(zip(("baseline", "merged", "reference"), map(_finite, norms), strict=True))


def to_dict(comparison: Comparison) -> dict[str, Any]:
    """The JSON report: same facts as the table. Non-finite numbers are null."""
    c = comparison
    diffs = [r.loss_diff for r in c.results if r.loss_judged]
    finite = [d for d in diffs if math.isfinite(d)]
    return {
        "gradalign": __version__,
        "verdict": c.verdict,
        "baseline": c.baseline.source,
        "merged": c.merged.source,
        "merged_cards": (
            {"logs": list(c.merged.cards), "card_loss": c.merged.card_loss}
            if c.merged.cards
            else None
        ),
        "accum_steps": c.accum_steps,
        "merged_ranks": ranks_summary(c.merged, c.ranks),
        "baseline_accum_steps": c.baseline.accum_steps,
        "updates": c.updates,
        "dtype": c.dtype,
        "reference": c.reference.source if c.reference is not None else None,
        "tolerances": c.tolerances.to_dict(),
        "loss": {
            "max_abs_diff": _finite(max(diffs)) if diffs and len(finite) == len(diffs) else None,
            "mean_abs_diff": _finite(sum(finite) / len(finite)) if finite else None,
        },
        "first_divergence": c.first_divergence,
        "checks": [{"name": k.name, "status": k.status, "detail": k.detail} for k in c.checks],
        "notes": list(c.notes),
        "diagnosis": [_clean(d.to_dict()) for d in c.diagnosis],
        "per_update": [_update_dict(r) for r in c.results],
    }


def _update_dict(r: UpdateResult) -> dict[str, Any]:
    def tensors(diffs):
        return [
            {
                **({"sketched": True} if d.sketched else {}),
                "name": d.name,
                "ok": d.ok,
                "max_abs_diff": _finite(d.max_abs),
                "max_rel_diff": _finite(d.max_rel),
                "rel_l2": _finite(d.rel_l2),
                "cosine": _finite(d.cosine),
                "error": _finite(d.error),
                "allowed": _finite(d.allowed),
                "moved": _finite(d.moved),
                "noise": _finite(d.noise),
            }
            for d in diffs
        ]

    return {
        "update": r.update,
        "ok": r.ok,
        "baseline_loss": _finite(r.base_loss),
        "merged_loss": _finite(r.merged_loss),
        "loss_abs_diff": _finite(r.loss_diff) if r.loss_judged else None,
        "loss_error": _finite(r.loss_error) if r.loss_judged else None,
        "loss_allowed": _finite(r.loss_allowed) if r.loss_judged else None,
        "loss_noise": _finite(r.loss_noise),
        "grad_ratio": _finite(r.grad_ratio),
        "grad_cosine": _finite(r.grad_cosine),
        "grad_norms": _norms(r.grad_norms),
        "problems": [text for _, text in r.findings],
        "weights": tensors(r.weights),
        "grads": tensors(r.grads),
    }


def _clean(value: Any) -> Any:
    """Evidence as strict JSON: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    try:
        return _finite(float(value))
    except (TypeError, ValueError):
        return str(value)


def write_json(comparison: Comparison, path: Path) -> None:
    """Write the JSON report atomically (a reader never sees half a file)."""
    text = json.dumps(_clean(to_dict(comparison)), indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_text_atomic(path, text)
