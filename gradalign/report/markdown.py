"""A Markdown report, for a GitHub job summary or a merge-request comment: the verdict first, the
checks, the named cause with its evidence and fix, a capped table of updates, and the rest folded
into `<details>`. Capped well under GitHub's 1 MiB limit for a step summary."""

from __future__ import annotations

from pathlib import Path

from ..judge.results import FAIL, NOT_CHECKED, PASS, Comparison
from .output import printable, visible, write_text_atomic
from .summary import evidence_text, failures, headline, rows_to_show, update_row

SHOWN_ROWS = 20  # updates in the visible table
DETAIL_ROWS = 500  # updates inside <details>; longer runs point to the JSON report
DETAIL_FAILURES = 200
MAX_BYTES = 256 * 1024  # GitHub refuses step summaries over 1 MiB
_MARK = {PASS: "✅", FAIL: "❌", NOT_CHECKED: "⚠️"}


# What Markdown (or the HTML inside it) would read as markup in a path, a tensor's name or a
# message: escaped, so a run called `runs/<b>x*` shows as typed and cannot open a tag or a span.
# A message's own code spans (`micro(loss, items=n)`) stay code where the backticks pair up.
_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", **{ch: "\\" + ch for ch in "\\`*_[]|"}}
)


def _cell(text: str) -> str:
    flat = visible(" ".join(str(text).split()))  # control characters left after the fold
    parts = flat.split("`")
    if len(parts) % 2 == 0:  # an odd backtick: no span is meant
        return flat.translate(_ESCAPES)
    return "`".join(
        part.translate(_ESCAPES) if i % 2 == 0 else part.replace("|", "\\|")
        for i, part in enumerate(parts)
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _update_table(c: Comparison, indices: list[int | None]) -> list[str]:
    header = list(update_row(c.results[0]).keys()) if c.results else ["update"]
    rows = []
    for i in indices:
        if i is None:
            rows.append(["…"] + [""] * (len(header) - 1))
        else:
            rows.append(list(update_row(c.results[i]).values()))
    return _table(header, rows)


def to_markdown(c: Comparison, title: str = "gradalign") -> str:
    """The Markdown summary of one comparison."""
    lines = [f"### {_MARK[c.verdict]} {title}: {c.verdict.upper()}", "", _cell(headline(c)), ""]
    lines += _table(
        ["check", "result", "detail"],
        [[k.name, f"{_MARK[k.status]} {k.status}", k.detail] for k in c.checks],
    )
    lines.append("")
    if c.first_divergence:
        fd = c.first_divergence
        where = f", parameter `{fd['parameter']}`" if fd["parameter"] else ""
        lines += [f"**First divergence:** update {fd['update']}{where} (in the {fd['in']})", ""]
    for d in c.diagnosis:
        label = "Cause" if d.severity != "info" else "Why it passes"
        lines.append(f"**{label}: `{d.code}`** — {_cell(d.message)}")
        if d.severity != "info" and d.evidence:
            lines.append(f"- evidence: {_cell(evidence_text(d.evidence))}")
        if d.fix:
            lines.append(f"- fix: {_cell(d.fix)}")
        lines.append("")
    lines += _update_table(c, rows_to_show(c, SHOWN_ROWS))
    lines += ["", *_details(c), ""]
    text = printable("\n".join(lines))
    if len(text.encode()) > MAX_BYTES:
        text = text.encode()[: MAX_BYTES - 200].decode(errors="ignore")
        text += "\n\n…cut at 256 kB; the JSON report (`--json`) has every update.\n\n</details>\n"
    return text


def _details(c: Comparison) -> list[str]:
    """Every update (up to DETAIL_ROWS), every failing quantity and the notes, folded."""
    lines = ["<details><summary>All updates, failing quantities and notes</summary>", ""]
    lines += _update_table(c, list(range(min(len(c.results), DETAIL_ROWS))))
    if len(c.results) > DETAIL_ROWS:
        lines.append(f"\n…{len(c.results) - DETAIL_ROWS} more updates in the JSON report")
    found = failures(c)
    if found:
        lines += ["", f"Failing quantities ({len(found)}):", ""]
        lines += [f"- {_cell(f.text())}" for f in found[:DETAIL_FAILURES]]
        if len(found) > DETAIL_FAILURES:
            lines.append(f"- …{len(found) - DETAIL_FAILURES} more")
    if c.notes:
        lines += ["", "Notes:", ""] + [f"- {_cell(note)}" for note in c.notes]
    lines += ["", "</details>"]
    return lines


def write_markdown(comparison: Comparison, path: Path) -> None:
    write_text_atomic(path, to_markdown(comparison))
