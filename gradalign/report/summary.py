"""What every report says first, computed once: the headline, the first failure, the causes, the
per-update rows to show and the failing tensors. The table, Markdown, JUnit, HTML, GitHub
annotations and `assert_aligned` all read these, so they never disagree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..judge.results import FAIL, NOT_CHECKED, Comparison, Diagnosis, UpdateResult
from ..judge.strict import CODE as STRICT_CODE
from ..runs.model import Run

MAX_ROWS = 40  # longer runs show the head, the rows around the first divergence, and the tail


def num(value: float | None, digits: int = 3) -> str:
    """A number for people: '-' when unknown, 'nan'/'inf' as such, else `digits` significant."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def rows_to_show(comparison: Comparison, limit: int = MAX_ROWS) -> list[int | None]:
    """Update indices to print; None marks a gap. At most about `limit` rows: the head, the rows
    around the first divergence and the tail."""
    n = len(comparison.results)
    if n <= limit:
        return list(range(n))
    head, tail = max(1, limit // 4), max(1, limit // 8)
    keep = set(range(head)) | set(range(n - tail, n))
    first = comparison.first_divergence
    if first is not None:
        keep |= set(range(max(0, first["update"] - tail), min(n, first["update"] + limit * 3 // 8)))
    rows: list[int | None] = []
    for i in sorted(keep):
        if rows and rows[-1] is not None and i != rows[-1] + 1:
            rows.append(None)
        rows.append(i)
    return rows


def shape(run: Run) -> str:
    """'K=4, B=128', or 'W=2 x K=4, B=128' for a run recorded on W data-parallel ranks (B: the
    samples of each window, all ranks together; said when recorded and the same in every one)."""
    ranks = f"W={run.world_size} x " if run.world_size > 1 else ""
    batch = ""
    if run.micro_samples is not None and run.updates:
        sums = np.unique(run.window_sums(run.micro_samples))
        batch = f", B={int(sums[0])}" if len(sums) == 1 else ""
    return f"{ranks}K={run.accum_steps}{batch}"


def headline(c: Comparison) -> str:
    """One line: the verdict, what was compared with what, and by which measure."""
    same = "is the same training as" if c.verdict != FAIL else "is NOT the same training as"
    if c.diagnosis and c.diagnosis[0].code == STRICT_CODE:  # not checked, not found different
        same = "could not be checked as the same training as"
    by = (
        f"judged by the noise of {c.reference.source} ({c.reference.dtype})"
        if c.reference is not None
        else f"judged by the fixed {c.dtype} tolerances"
    )
    return (
        f"{c.verdict.upper()}: {c.merged.source} ({shape(c.merged)}) {same} "
        f"{c.baseline.source} ({shape(c.baseline)}); {c.updates} updates, {c.dtype}, {by}"
    )


@dataclass(frozen=True)
class Failure:
    """One judged quantity that failed: a loss, a tensor's weights or gradient, or bookkeeping."""

    update: int
    kind: str  # "loss" | "weights" | "gradient" | a bookkeeping check key ("lr", "window"...)
    name: str  # the tensor, or "loss", or the bookkeeping message
    error: float | None
    allowed: float | None
    noise: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.error is None or self.allowed is None:
            return None
        if self.allowed > 0:
            return self.error / self.allowed
        return 0.0 if self.error == 0 else math.inf

    def text(self) -> str:
        """'update 0, gradient of 0.weight: error 3.1e-2 > allowed 4.5e-7 (6.9e+04x)'."""
        if self.error is None:
            return f"update {self.update}, {self.kind}: {self.name}"
        what = "loss" if self.kind == "loss" else f"{self.kind} of {self.name}"
        return (
            f"update {self.update}, {what}: error {num(self.error)} > allowed "
            f"{num(self.allowed)} ({num(self.ratio, 2)}x)"
        )


def failures(c: Comparison) -> list[Failure]:
    """Every failing quantity, update by update, in model order (gradients before weights: a
    divergence shows in the gradient before the optimizer carries it into the weights)."""
    found: list[Failure] = []
    for r in c.results:
        if not r.loss_ok:
            found.append(
                Failure(r.update, "loss", "loss", r.loss_error, r.loss_allowed, r.loss_noise)
            )
        for kind, diffs in (("gradient", r.grads), ("weights", r.weights)):
            found.extend(
                Failure(r.update, kind, d.name, d.error, d.allowed, d.noise)
                for d in diffs
                if not d.ok
            )
        found.extend(Failure(r.update, key, text, None, None) for key, text in r.findings)
    return found


_CHECK_KINDS = {  # which failing quantities belong to which named check
    "losses": ("loss",),
    "weights": ("weights",),
    "gradients": ("gradient",),
    "gradient norm": ("gradient norm",),
    "learning rate": ("lr",),
    "optimizer steps": ("optimizer_steps", "state_step", "loss_scale"),
    "no weight change inside a window": ("window",),
    "every micro-batch backpropagated": ("backward",),
    "clip threshold": ("clip_max_norm",),
}


def failures_of(c: Comparison, check: str) -> list[Failure]:
    """The failing quantities behind one named check (none for checks of whole runs)."""
    kinds = _CHECK_KINDS.get(check.split(" (")[0], ())
    return [f for f in failures(c) if f.kind in kinds]


def failed_checks(c: Comparison) -> list[str]:
    return [check.name for check in c.checks if check.status == FAIL]


def unchecked(c: Comparison) -> list[str]:
    return [check.name for check in c.checks if check.status == NOT_CHECKED]


def causes(c: Comparison) -> list[Diagnosis]:
    """The named causes of a failure (not the informational entries of a pass)."""
    return [d for d in c.diagnosis if d.severity != "info"]


def evidence_text(evidence: dict[str, Any]) -> str:
    """Evidence on one line: `key=value, ...`, floats to 6 significant digits."""

    def show(value: Any) -> str:
        if isinstance(value, float):
            return num(value, 6)
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
        return str(value)

    return ", ".join(f"{key}={show(value)}" for key, value in evidence.items())


def diagnosis_lines(d: Diagnosis) -> list[str]:
    """A cause as plain lines: code and message, evidence, fix."""
    lines = [f"{d.code}: {d.message}"]
    if d.severity != "info" and d.evidence:
        lines.append(f"evidence: {evidence_text(d.evidence)}")
    if d.fix:
        lines.append(f"fix: {d.fix}")
    return lines


def worst_ratio(r: UpdateResult) -> tuple[str, float]:
    """The update's worst judged quantity (err/allowed): 'loss' or a tensor name, and its ratio."""
    loss = r.loss_error / r.loss_allowed if r.loss_allowed > 0 else float(r.loss_error > 0)
    loss = math.inf if math.isnan(loss) else loss
    best = ("loss", loss)
    for d in (*r.grads, *r.weights):
        ratio = math.inf if math.isnan(d.ratio) else d.ratio
        if ratio > best[1]:
            best = (d.name, ratio)
    return best


def update_row(r: UpdateResult) -> dict[str, str]:
    """One update as text cells: losses, their difference, the worst quantity and its ratio."""
    name, ratio = worst_ratio(r)
    problems = "; ".join(text for _, text in r.findings)
    return {
        "update": str(r.update),
        "baseline loss": f"{r.base_loss:.8g}" if r.loss_judged else "-",
        "merged loss": f"{r.merged_loss:.8g}" if r.loss_judged else "-",
        "|diff|": num(r.loss_diff) if r.loss_judged else "-",
        "worst": name,
        "err/allowed": num(ratio, 2),
        "status": ("ok" if r.ok else "FAIL") + (f" ({problems})" if problems else ""),
    }
