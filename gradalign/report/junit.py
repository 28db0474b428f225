"""JUnit XML for CI systems (GitLab, Jenkins, GitHub test reporters), in the structure pytest's
own `--junitxml` writes: `<testsuites>`, one `<testsuite>` per comparison, one `<testcase>` per
check. A failing check carries the first failure, the diagnosis, its evidence and fix; a check
that could not be made is `<skipped>`, never a pass. No timestamps or host names: the same
comparison gives the same bytes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from ..judge.results import FAIL, NOT_CHECKED, Check, Comparison
from .output import write_text_atomic
from .summary import diagnosis_lines, failures_of, headline

# not allowed in XML 1.0: C0 controls but tab and line ends, U+FFFE and U+FFFF (a lone surrogate,
# a name's undecodable byte, is written as its escape: output.printable)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
MAX_FAILURES_LISTED = 10


def _clean(text: str) -> str:
    return _CONTROL.sub("?", text)


def class_name(name: str) -> str:
    """`gradalign.<name>` with the name's own dots made `_`: Jenkins and GitLab read a
    classname's last dot as package.class, and a path such as `runs/k4.v2` would split there."""
    return _clean("gradalign." + name.replace(".", "_"))


def _failure_text(c: Comparison, check: Check) -> str:
    lines = [f"{check.name}: {check.detail}", headline(c)]
    found = failures_of(c, check.name)
    if found:
        shown = min(len(found), MAX_FAILURES_LISTED)
        lines.append(f"failing quantities: {len(found)}, the first {shown}:")
        lines += [f"  {f.text()}" for f in found[:MAX_FAILURES_LISTED]]
    for d in c.diagnosis:
        lines += diagnosis_lines(d)
    return "\n".join(lines)


def suite(name: str, c: Comparison) -> ET.Element:
    """One comparison as a `<testsuite>`: a uniquely named `<testcase>` per check."""
    failed = sum(check.status == FAIL for check in c.checks)
    skipped = sum(check.status == NOT_CHECKED for check in c.checks)
    element = ET.Element(
        "testsuite",
        {
            "name": _clean(name),
            "errors": "0",
            "failures": str(failed),
            "skipped": str(skipped),
            "tests": str(len(c.checks)),
            "time": "0.000",
        },
    )
    properties = ET.SubElement(element, "properties")
    for key, value in (
        ("verdict", c.verdict),
        ("baseline", c.baseline.source),
        ("merged", c.merged.source),
        ("accum_steps", str(c.accum_steps)),
        ("updates", str(c.updates)),
        ("dtype", c.dtype),
        ("reference", c.reference.source if c.reference is not None else "none"),
        ("diagnosis", ", ".join(d.code for d in c.diagnosis)),
    ):
        ET.SubElement(properties, "property", {"name": key, "value": _clean(value)})
    seen: dict[str, int] = {}
    for check in c.checks:
        seen[check.name] = seen.get(check.name, 0) + 1
        case_name = check.name if seen[check.name] == 1 else f"{check.name} ({seen[check.name]})"
        case = ET.SubElement(
            element,
            "testcase",
            {"classname": class_name(name), "name": case_name, "time": "0.000"},
        )
        if check.status == FAIL:
            kind = c.diagnosis[0].code if c.diagnosis else "not aligned"  # the named cause
            failure = ET.SubElement(
                case, "failure", {"message": _clean(check.detail), "type": _clean(kind)}
            )
            failure.text = _clean(_failure_text(c, check))
        elif check.status == NOT_CHECKED:
            skipped_element = ET.SubElement(
                case, "skipped", {"type": "not checked", "message": _clean(check.detail)}
            )
            skipped_element.text = _clean(f"not checked: {check.detail}")
    return element


def to_junit(comparisons: Sequence[tuple[str, Comparison]]) -> str:
    """The JUnit XML document for one or more named comparisons."""
    suites = [suite(name, comparison) for name, comparison in comparisons]
    totals = {
        key: str(sum(int(s.get(key, "0")) for s in suites))
        for key in ("tests", "failures", "errors", "skipped")
    }  # the totals Jenkins and JUnit 5 put on the root (pytest leaves them out)
    root = ET.Element("testsuites", {"name": "gradalign", **totals, "time": "0.000"})
    root.extend(suites)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def suite_name(c: Comparison) -> str:
    """A comparison's suite name: what was judged against what."""
    return f"{c.merged.source} vs {c.baseline.source}"


def write_junit(comparison: Comparison, path: Path) -> None:
    write_text_atomic(path, to_junit([(suite_name(comparison), comparison)]))
