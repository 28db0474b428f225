"""What the judge found: per-update results, named checks, diagnoses and the whole comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..runs.model import Run
from .metrics import TensorDiff
from .tolerances import Tolerances

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
GRAD_NORM = "gradient norm"  # the whole model's gradient norm: a check and its findings' key


@dataclass
class UpdateResult:
    """Everything judged at one optimizer update."""

    update: int
    base_loss: float
    merged_loss: float
    loss_diff: float  # |merged - baseline|
    loss_error: float  # the judged error: loss_diff, or |merged - reference| with a reference
    loss_allowed: float
    loss_noise: float | None = None  # the baseline's distance from the reference, if any
    weights: list[TensorDiff] = field(default_factory=list)
    grads: list[TensorDiff] = field(default_factory=list)
    grad_ratio: float | None = None  # least-squares merged/baseline over all gradients
    grad_cosine: float | None = None
    # the whole model's gradient norm in the baseline, merged run and reference (with one)
    grad_norms: tuple[float, float, float] | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (check key, message)
    # the whole model's gradient norm beyond what the baseline's allows (judge/grad_norm.py):
    # a finding of the gradient, kept apart from the bookkeeping's problems
    grad_norm_beyond: str | None = None
    loss_judged: bool = True  # False: both runs skipped the update and a loss went unprinted
    # without a reference: the runs entered this update with weights apart (apart.entered_apart)
    entered_apart: bool = False
    # the share of its norm each gradient may differ by in a divergence followed through this
    # update (judge/kink_divergence.py); 0 outside one
    followed_share: float = 0.0

    @property
    def loss_ok(self) -> bool:
        # False for NaN, and for an infinite error even under an infinite bound (metrics.py)
        return bool(self.loss_error <= self.loss_allowed and self.loss_error < math.inf)

    @property
    def loss_ratio(self) -> float:
        """loss_error / loss_allowed: below 1 passes (as `TensorDiff.ratio`)."""
        if self.loss_allowed > 0:
            return self.loss_error / self.loss_allowed
        return 0.0 if self.loss_error == 0 else math.inf

    @property
    def grad_failed(self) -> bool:
        """A gradient that failed: a tensor's, or the whole model's norm (judge/grad_norm.py)."""
        return any(not d.ok for d in self.grads) or self.grad_norm_beyond is not None

    @property
    def tensors_ok(self) -> bool:
        return all(t.ok for t in self.weights) and all(t.ok for t in self.grads)

    @property
    def ok(self) -> bool:
        return self.loss_ok and self.tensors_ok and not self.findings

    @property
    def findings(self) -> list[tuple[str, str]]:
        """What failed beside the losses and tensors, as (check key, message): the problems,
        then the whole model's gradient norm."""
        beyond = [(GRAD_NORM, self.grad_norm_beyond)] if self.grad_norm_beyond else []
        return [*self.problems, *beyond]

    @property
    def worst(self) -> tuple[TensorDiff, str] | None:
        """The tensor judged worst (err/allowed, NaN worst of all), weights and gradients
        alike, with its kind ("weights" or "gradient"); None where neither was judged."""
        judged = [(d, "weights") for d in self.weights] + [(d, "gradient") for d in self.grads]
        return max(
            judged, key=lambda e: math.inf if math.isnan(e[0].ratio) else e[0].ratio, default=None
        )


@dataclass
class Check:
    name: str
    status: str  # pass | fail | not checked
    detail: str


@dataclass
class Diagnosis:
    """A named cause (or, with severity "info", an explanation) with its evidence and fix."""

    code: str
    message: str
    evidence: dict[str, Any]
    fix: str | None
    severity: str = "error"  # "error": a cause of failure; "info": context, not a failure

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass
class Comparison:
    baseline: Run
    merged: Run
    tolerances: Tolerances
    dtype: str
    results: list[UpdateResult]
    checks: list[Check]
    notes: list[str]
    first_divergence: dict | None
    reference: Run | None = None
    diagnosis: list[Diagnosis] = field(default_factory=list)
    ranks: Any = None  # distributed.RankFacts of a data-parallel merged run

    @property
    def verdict(self) -> str:
        return FAIL if any(c.status == FAIL for c in self.checks) else PASS

    @property
    def accum_steps(self) -> int:
        return self.merged.accum_steps

    @property
    def updates(self) -> int:
        return self.merged.updates
