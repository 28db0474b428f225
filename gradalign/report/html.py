"""One self-contained HTML report, readable offline: the verdict, the checks, the diagnosis, the
plots embedded as data URIs, and the table of updates. No script, no font, no request: a
Content-Security-Policy forbids anything but the page's own style and its inline images."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from .. import __version__
from ..judge.results import FAIL, NOT_CHECKED, PASS, Comparison
from .output import write_text_atomic
from .summary import evidence_text, failures, headline, update_row

MAX_ROWS = 2000
MAX_FAILURES = 500
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1em;
  color: #222; }
header { padding: .6em 1em; border-radius: 6px; color: #fff; }
header.pass { background: #2e7d32; } header.fail { background: #c62828; }
header h1 { margin: 0; font-size: 1.6em; } header p { margin: .3em 0 0; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.4em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fdecea; } .st-pass { color: #2e7d32; } .st-fail { color: #c62828; }
.st-not-checked { color: #a15c00; } code { background: #f3f3f3; padding: 0 3px; }
.cause { border-left: 4px solid #c62828; padding: .2em .8em; margin: .6em 0; background: #fafafa; }
.cause.info { border-color: #1565c0; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; } footer { color: #777; margin-top: 2em; }
"""
_CLASS = {PASS: "pass", FAIL: "fail", NOT_CHECKED: "not-checked"}


def _table(header: list[str], rows: list[tuple[str, list[str]]], numeric: set[int]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for css, cells in rows:
        tds = "".join(
            f'<td class="n">{escape(v)}</td>' if i in numeric else f"<td>{escape(v)}</td>"
            for i, v in enumerate(cells)
        )
        body.append(f'<tr class="{css}">{tds}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _checks(c: Comparison) -> str:
    rows = []
    for k in c.checks:
        status = f'<span class="st-{_CLASS[k.status]}">{escape(k.status)}</span>'
        rows.append(
            f"<tr><td>{escape(k.name)}</td><td>{status}</td><td>{escape(k.detail)}</td></tr>"
        )
    return (
        "<table><thead><tr><th>check</th><th>result</th><th>detail</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _diagnosis(c: Comparison) -> str:
    parts = []
    if c.first_divergence:
        fd = c.first_divergence
        name = escape(str(fd["parameter"]))
        where = f", parameter <code>{name}</code>" if fd["parameter"] else ""
        parts.append(
            f"<p><b>First divergence:</b> update {fd['update']}{where} "
            f"(in the {escape(fd['in'])})</p>"
        )
    for d in c.diagnosis:
        css = "cause info" if d.severity == "info" else "cause"
        lines = [f"<p><b><code>{escape(d.code)}</code></b>: {escape(d.message)}</p>"]
        if d.severity != "info" and d.evidence:
            lines.append(f"<p>evidence: {escape(evidence_text(d.evidence))}</p>")
        if d.fix:
            lines.append(f"<p>fix: {escape(d.fix)}</p>")
        parts.append(f'<div class="{css}">{"".join(lines)}</div>')
    return "".join(parts)


def _plots(images: dict[str, bytes] | None, captions: dict[str, str]) -> str:
    if images is None:
        return "<p>Plots need matplotlib: <code>pip install 'gradalign[plot]'</code>.</p>"
    figures = []
    for name, data in images.items():
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        caption = escape(captions.get(name, name))
        figures.append(
            f'<figure><img alt="{caption}" src="{uri}"><figcaption>{caption}</figcaption></figure>'
        )
    return "".join(figures)


def _updates(c: Comparison) -> str:
    shown = c.results[:MAX_ROWS]
    header = list(update_row(shown[0]).keys()) if shown else ["update"]
    rows = [("" if r.ok else "fail", list(update_row(r).values())) for r in shown]
    more = f"<p>…{len(c.results) - MAX_ROWS} more updates in the JSON report</p>"
    return _table(header, rows, {0, 1, 2, 3, 5}) + (more if len(c.results) > MAX_ROWS else "")


def _failures(c: Comparison) -> str:
    found = failures(c)
    if not found:
        return ""
    items = "".join(f"<li>{escape(f.text())}</li>" for f in found[:MAX_FAILURES])
    more = f"<li>…{len(found) - MAX_FAILURES} more</li>" if len(found) > MAX_FAILURES else ""
    return f"<h2>Failing quantities ({len(found)})</h2><ul>{items}{more}</ul>"


def to_html(c: Comparison, images: dict[str, bytes] | None, captions: dict[str, str]) -> str:
    """The page; `images` are PNGs by file name (None: matplotlib is not installed)."""
    verdict = c.verdict
    notes = "".join(f"<li>{escape(n)}</li>" for n in c.notes)
    tolerances = ", ".join(f"{k}={v:g}" for k, v in c.tolerances.to_dict().items())
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            f"<title>gradalign: {verdict.upper()}</title><style>{_STYLE}</style></head><body>",
            f'<header class="{_CLASS[verdict]}"><h1>gradalign: {verdict.upper()}</h1>'
            f"<p>{escape(headline(c))}</p></header>",
            f"<h2>Checks</h2>{_checks(c)}",
            f"<h2>Diagnosis</h2>{_diagnosis(c)}",
            f"<h2>Plots</h2>{_plots(images, captions)}",
            f"<h2>Updates</h2>{_updates(c)}",
            _failures(c),
            f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "",
            f"<footer>gradalign {escape(__version__)}; tolerances: {escape(tolerances)}</footer>",
            "</body></html>",
            "",
        ]
    )


def write_html(c: Comparison, path: Path) -> None:
    """Write the report; plots are embedded when matplotlib is installed."""
    from .plots import CAPTIONS, have_matplotlib, render_pngs

    images = render_pngs(c) if have_matplotlib() else None
    write_text_atomic(path, to_html(c, images, CAPTIONS))
