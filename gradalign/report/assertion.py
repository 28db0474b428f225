"""The message of a failing `gradalign.testing.assert_aligned`, in the manner of pytest-regressions:
what failed and how much (counts), the first failing update and tensor with its error against the
allowed bound, the named cause and its fix, and a capped table of the failing quantities."""

from __future__ import annotations

import dataclasses
import math
import shlex

from ..errors import cut
from ..judge.results import Comparison
from ..judge.tolerances import for_dtype
from .summary import Failure, causes, diagnosis_lines, failed_checks, failures, num

MAX_ROWS = 10


def assertion_message(c: Comparison, max_rows: int = MAX_ROWS) -> str:
    """Plain text, no colour: it lands in a pytest failure report or a CI log."""
    found = failures(c)
    bad_updates = len({f.update for f in found})
    failed = failed_checks(c)
    lines = [
        f"{c.merged.source} (K={c.merged.accum_steps}) is not the same training as "
        f"{c.baseline.source} (K={c.baseline.accum_steps}): {len(failed)} of {len(c.checks)} "
        f"checks failed ({', '.join(failed)}); {len(found)} failing quantities in "
        f"{bad_updates} of {c.updates} updates",
    ]
    if found:
        lines.append(f"first failure: {found[0].text()}")
        lines += _per_kind(found)
    named = causes(c)
    for d in named:
        first, *more = diagnosis_lines(d)
        lines += [f"cause {first}", *(f"  {line}" for line in more)]
    if not named:
        lines.append("cause: none named")
    if found:
        lines += ["", *_table(found[:max_rows])]
        if len(found) > max_rows:
            lines.append(
                f"(showing {max_rows} of {len(found)}; every one: "
                f"{compare_command(c, '--json', 'report.json')})"
            )
    return "\n".join(lines)


def compare_command(c: Comparison, *extra: str) -> str:
    """The `gradalign compare` command that judges as `c` was judged: the same runs, the same
    reference (or none) and every tolerance that differs from the dtype's default. Without them
    it judged another way (no noise floor, other bounds) and listed other failures."""
    reference = c.reference.source if c.reference is not None else "none"
    words = ["gradalign", "compare", c.baseline.source, c.merged.source, "--reference", reference]
    default = for_dtype(c.dtype)
    for field in dataclasses.fields(c.tolerances):
        value = getattr(c.tolerances, field.name)
        if value != getattr(default, field.name):
            words += [f"--{field.name.replace('_', '-')}", repr(float(value))]
    return shlex.join([str(word) for word in (*words, *extra)])


def _per_kind(found: list[Failure]) -> list[str]:
    """Per kind of quantity: how many failed, and their error over what is allowed, largest (with
    where) and mean, in the manner of pytest-regressions' max and mean differences."""
    lines = []
    for kind in dict.fromkeys(f.kind for f in found):
        rows = [f for f in found if f.kind == kind and f.ratio is not None]
        if not rows:  # a finding in words (the gradient norm's): counted, no ratio to show
            count = sum(f.kind == kind for f in found)
            lines.append(f"{kind}: {count} failing")
            continue
        worst = max(rows, key=lambda f: f.ratio if not math.isnan(f.ratio) else math.inf)
        mean = math.fsum(f.ratio for f in rows) / len(rows)
        where = f"update {worst.update}" + ("" if kind == "loss" else f", {worst.name}")
        lines.append(
            f"{kind}: {len(rows)} failing, error/allowed max {num(worst.ratio, 2)}x ({where}), "
            f"mean {num(mean, 2)}x"
        )
    return lines


FINDING_WIDTH = 48  # a finding's words in the table's error column, cut to this many


def _table(rows: list) -> list[str]:
    header = ("update", "quantity", "tensor", "error", "allowed", "err/allowed")
    cells = [
        (
            str(f.update),
            f.kind,
            "" if f.kind == "loss" or f.error is None else f.name,
            num(f.error) if f.error is not None else cut(f.name, FINDING_WIDTH),
            num(f.allowed),
            num(f.ratio, 2),
        )
        for f in rows
    ]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    return [
        "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *cells]
    ]
