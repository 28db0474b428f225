"""The report for people: a rich table of updates, the checks, the diagnosis and the verdict."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..judge.metrics import TensorDiff
from ..judge.results import FAIL, NOT_CHECKED, PASS, Comparison, UpdateResult
from .output import visible
from .summary import evidence_text, num, rows_to_show, shape

_STYLE = {PASS: "green", FAIL: "bold red", NOT_CHECKED: "yellow"}


def _max_abs(worst: TensorDiff | None) -> str:
    """The worst tensor's max |m - b|; '-' where only summaries were compared (a golden)."""
    if worst is None or (math.isnan(worst.max_abs) and math.isfinite(worst.error)):
        return "-"
    return num(worst.max_abs)


def _update_row(r: UpdateResult, calibrated: bool) -> list[str]:
    worst, kind = r.worst or (None, "")
    name = "-" if worst is None else worst.name + (" (grad)" if kind == "gradient" else "")
    status = "[green]ok[/]" if r.ok else "[bold red]FAIL[/]"
    problems = "; ".join(text for _, text in r.findings)
    noise: list[str] = []
    if calibrated:
        known = worst is not None and worst.noise is not None
        noise = [
            num(worst.noise) if known else "-",
            f"{worst.error / worst.noise:.2g}x" if known and worst.noise else "-",
        ]
    if not r.loss_judged:  # both runs' loss scalers skipped it and a log printed no loss
        status += " [dim]skipped by both[/]"
    judged = r.loss_judged
    return [
        str(r.update),
        f"{r.base_loss:.8g}" if judged else "-",
        f"{r.merged_loss:.8g}" if judged else "-",
        num(r.loss_diff) if judged else "-",
        name,
        _max_abs(worst),
        *noise,
        f"{worst.ratio:.2g}x" if worst else "-",
        num(r.grad_ratio, 6) if r.grad_ratio is not None else "-",
        status + (f" [red]{problems}[/]" if problems else ""),
    ]


# A narrow console leaves out columns, in this order, until no number has to split; the status,
# the update, the worst tensor, its error against what is allowed and the loss difference stay.
_DROP_ORDER = ("noise", "max |m-b|", "grad ratio", "merged loss", "baseline loss", "x noise")
_TEXT = ("worst tensor", "status")  # fold where needed, down to _TEXT_MIN
_TEXT_MIN = 10


def _cell_width(cell: str) -> int:
    return Text.from_markup(cell).cell_len


def _column_width(name: str, cells: list[str], least: bool) -> int:
    """A column's width with its header and cells on one line, or (`least`) the narrowest it
    can be without splitting a number or a header's word (a text column folds, to _TEXT_MIN)."""
    widths = [_cell_width(cell) for cell in cells]
    if not least:
        return max([len(name), *widths])
    widest = max([*(len(word) for word in name.split()), *widths])
    return min(widest, _TEXT_MIN) if name in _TEXT else widest


def _table_width(names: list[str], rows: list[list[str]], kept: list[int], least: bool) -> int:
    """The table's width over the `kept` columns: each column's width plus a border and a space
    either side (rich's default box)."""
    widths = [_column_width(names[i], [row[i] for row in rows], least) for i in kept]
    return sum(widths) + 3 * len(kept) + 1


def _fitting(names: list[str], rows: list[list[str]], width: int) -> list[int]:
    """Indices of the columns kept at `width`: all where they fit, else leaving out _DROP_ORDER's
    one by one until no number has to split onto two lines."""
    kept = list(range(len(names)))
    for name in _DROP_ORDER:
        if _table_width(names, rows, kept, least=True) <= width:
            break
        if name in names:
            kept.remove(names.index(name))
    return kept


def render(comparison: Comparison, console: Console) -> None:
    """Print the per-update table, the checks, notes and the verdict."""
    c = comparison
    calibrated = c.reference is not None
    title = (
        f"gradalign compare: {visible(c.baseline.source)} ({shape(c.baseline)}) vs "
        f"{visible(c.merged.source)} ({shape(c.merged)}), {c.updates} updates, {c.dtype}"
    )
    if calibrated:
        title += f"; noise floor from {visible(c.reference.source)} ({c.reference.dtype})"
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
    rows = [
        ["…", *[""] * (len(columns) - 1)]
        if index is None
        else _update_row(c.results[index], calibrated)
        for index in rows_to_show(c)
    ]
    names = [name for name, _ in columns]
    kept = _fitting(names, rows, console.width)
    narrow = _table_width(names, rows, kept, least=False) > console.width  # two-line headers
    for i in kept:
        name, justify = columns[i]
        if name in _TEXT:  # a tensor's name or the problems fold; a number never splits
            table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
        else:
            header = name.replace(" ", "\n") if narrow else name
            table.add_column(header, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    console.print(table)
    left_out = [name for i, name in enumerate(names) if i not in kept]
    if left_out:
        console.print(
            f"[yellow]note:[/] left out at this width ({console.width} columns): "
            f"{', '.join(left_out)}; a wider terminal or --json shows them",
            markup=True,
        )
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
