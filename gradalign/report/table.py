"""The report for people: a rich table of updates, the checks, the diagnosis and the verdict."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from ..judge.metrics import TensorDiff
from ..judge.results import FAIL, NOT_CHECKED, PASS, Comparison, UpdateResult
from .summary import evidence_text, num, rows_to_show, shape

_STYLE = {PASS: "green", FAIL: "bold red", NOT_CHECKED: "yellow"}


def _max_abs(worst: TensorDiff | None) -> str:
    """The worst tensor's max |m - b|; '-' where only summaries were compared (a golden)."""
    if worst is None or (math.isnan(worst.max_abs) and math.isfinite(worst.error)):
        return "-"
    return num(worst.max_abs)


def _update_row(r: UpdateResult, calibrated: bool) -> list[str]:
    worst = r.worst
    status = "[green]ok[/]" if r.ok else "[bold red]FAIL[/]"
    problems = "; ".join(text for _, text in r.problems)
    noise: list[str] = []
    if calibrated:
        known = worst is not None and worst.noise is not None
        noise = [
            num(worst.noise) if known else "-",
            f"{worst.error / worst.noise:.2g}x" if known and worst.noise else "-",
        ]
    return [
        str(r.update),
        f"{r.base_loss:.8g}",
        f"{r.merged_loss:.8g}",
        num(r.loss_diff),
        worst.name if worst else "-",
        _max_abs(worst),
        *noise,
        f"{worst.ratio:.2g}x" if worst else "-",
        num(r.grad_ratio, 6) if r.grad_ratio is not None else "-",
        status + (f" [red]{problems}[/]" if problems else ""),
    ]


def render(comparison: Comparison, console: Console) -> None:
    """Print the per-update table, the checks, notes and the verdict."""
    c = comparison
    calibrated = c.reference is not None
    title = (
        f"gradalign compare: {c.baseline.source} ({shape(c.baseline)}) vs "
        f"{c.merged.source} ({shape(c.merged)}), {c.updates} updates, {c.dtype}"
    )
    if calibrated:
        title += f"; noise floor from {c.reference.source} ({c.reference.dtype})"
    table = Table(title=title, title_justify="left")
    columns = [
        ("update", "right"),
        ("baseline loss", "right"),
        ("merged loss", "right"),
        ("|diff|", "right"),
        ("worst tensor", "left"),
        ("max |m-b|", "right"),
    ]
    if calibrated:
        columns += [("noise", "right"), ("x noise", "right")]
    columns += [("err/tol", "right"), ("grad ratio", "right"), ("status", "left")]
    for name, justify in columns:
        # a narrow console folds a number onto two lines; it never cuts one short ("…")
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for index in rows_to_show(c):
        if index is None:
            table.add_row("…", *[""] * (len(columns) - 1))
        else:
            table.add_row(*_update_row(c.results[index], calibrated))
    console.print(table)
    checks = Table(show_header=True, title="checks", title_justify="left")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail")
    for check in c.checks:
        checks.add_row(check.name, f"[{_STYLE[check.status]}]{check.status}[/]", check.detail)
    console.print(checks)
    for note in c.notes:
        console.print(f"[yellow]note:[/] {note}")
    if c.first_divergence:
        fd = c.first_divergence
        where = f", parameter {fd['parameter']}" if fd["parameter"] else ""
        console.print(f"first divergence: update {fd['update']}{where} (in the {fd['in']})")
    for d in c.diagnosis:
        style = "cyan" if d.severity == "info" else "bold red"
        console.print(f"[{style}]{d.code}[/]: {d.message}", markup=True)
        if d.severity != "info":
            console.print(f"  evidence: {evidence_text(d.evidence)}", markup=False)
        if d.fix:
            console.print(f"  fix: {d.fix}", markup=False)
    verdict = c.verdict
    style = _STYLE[verdict]
    meaning = (
        "x noise is the merged run's error against the reference over the baseline's own; "
        if calibrated
        else ""
    )
    console.print(
        f"[{style}]verdict: {verdict.upper()}[/] ({meaning}err/tol is the judged error over "
        f"what is allowed; below 1 passes)"
    )
