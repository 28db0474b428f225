"""Do runs recorded with sketches get the verdicts and codes of runs recorded in full?

Runs every `gradalign selftest` case twice, once with every run recorded in full and once with
`--record sketch` (per update a count sketch of each tensor, exact norms and fingerprints; full
snapshots only at the first and last update), and compares each case's verdict and first code.

    .venv/bin/python bench/sketch_agreement.py [--json FILE] [--only SETUP ...]

Exit 0 when every case agrees. Takes about twice the selftest's time.

`--matrix FULL SKETCH` compares instead two results of `bench/matrix.py --json` (one run with
`--record full`, one with `--record sketch`) row by row: setup, seed and bug, verdict and first
code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rich.console import Console

from gradalign.selftest import CASES, run_selftest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", nargs="*", help="setups to run (default: every case)")
    parser.add_argument(
        "--matrix", nargs=2, type=Path, metavar=("FULL", "SKETCH"), help="matrix.py results"
    )
    args = parser.parse_args()
    if args.matrix is not None:
        return matrix_agreement(*args.matrix, args.json)
    cases = [c for c in CASES if not args.only or c.setup in args.only]
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    started = time.monotonic()
    found = {}
    with tempfile.TemporaryDirectory(prefix="gradalign-sketch-agreement-") as folder:
        for record in ("full", "sketch"):
            found[record] = run_selftest(Path(folder) / record, quiet, cases, record=record)
    rows = []
    for full, sketch in zip(found["full"], found["sketch"], strict=True):
        row = {
            "case": full.case.name,
            "full": [full.verdict, full.codes[:1]],
            "sketch": [sketch.verdict, sketch.codes[:1]],
            "agree": agree(full.verdict, full.codes, sketch.verdict, sketch.codes),
            "full_ok": full.ok,
            "sketch_ok": sketch.ok,
            "full_worst_over_allowed": full.worst_over_allowed,
            "sketch_worst_over_allowed": sketch.worst_over_allowed,
        }
        rows.append(row)
        mark = "agree" if row["agree"] else "DISAGREE"
        print(
            f"{mark:9} {row['case']:45} full {full.verdict} {full.codes[:1]}  "
            f"sketch {sketch.verdict} {sketch.codes[:1]}"
        )
    summary = {
        "cases": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "full_as_expected": sum(r["full_ok"] for r in rows),
        "sketch_as_expected": sum(r["sketch_ok"] for r in rows),
        "worst_clean_over_allowed": {
            mode: max(
                (r[f"{mode}_worst_over_allowed"] for r in rows if r["full"][0] == "pass"),
                default=0.0,
            )
            for mode in ("full", "sketch")
        },
        "seconds": round(time.monotonic() - started),
    }
    return report(summary, rows, args.json, summary["cases"])


def agree(verdict: str, codes: list[str], other_verdict: str, other_codes: list[str]) -> bool:
    """Two judgements agree: the same verdict and the same first code."""
    return verdict == other_verdict and codes[:1] == other_codes[:1]


def report(summary: dict, rows: list[dict], out: Path | None, total: int) -> int:
    """Print the summary, write it with the rows to `out`; exit 0 when all `total` agree."""
    print(json.dumps(summary, indent=2))
    if out is not None:
        out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    return 0 if summary["agree"] == total else 1


def matrix_agreement(full_file: Path, sketch_file: Path, out: Path | None) -> int:
    """Rows of two `bench/matrix.py --json` results, full and sketch, compared one by one."""
    found = {}
    for mode, file in (("full", full_file), ("sketch", sketch_file)):
        data = json.loads(file.read_text())
        if data["summary"].get("record", "full") != mode:
            raise SystemExit(f"{file} was not recorded with --record {mode}")
        found[mode] = {(r["setup"], r["seed"], r["bug"]): r for r in data["rows"]}
    if found["full"].keys() != found["sketch"].keys():
        raise SystemExit("the two results hold different rows (--seeds or --only differ)")
    rows = []
    for key, full in found["full"].items():
        sketch = found["sketch"][key]
        same = agree(full["verdict"], full["codes"], sketch["verdict"], sketch["codes"])
        rows.append({"setup": key[0], "seed": key[1], "bug": key[2], "agree": same})
        if not same:
            print(
                f"DISAGREE {key}: full {full['verdict']} {full['codes'][:1]}, "
                f"sketch {sketch['verdict']} {sketch['codes'][:1]}"
            )
    summary = {
        "rows": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "as_expected": {m: sum(r["ok"] for r in found[m].values()) for m in found},
    }
    return report(summary, rows, out, summary["rows"])


if __name__ == "__main__":
    sys.exit(main())
