"""The model zoo's runs judged against a golden file too (`bench/model_zoo.py --golden`): the
baseline and its reference kept with `golden write`, the merged run judged with `golden check`,
as a CI job that keeps goldens instead of run directories does. A golden must pass what
`compare` passes and fail what it fails; it may name fewer causes (those that read the
baseline's gradient values: judge/golden.py `UNNAMED`), so its code is reported beside, not
counted."""

from __future__ import annotations

from pathlib import Path

from gradalign import api
from gradalign.errors import BadInput


def golden_row(root: Path) -> dict:
    """`golden` (the verdict, or "refused" where `golden write` or `golden check` refused: exit
    2) and `golden_codes` of `root`'s baseline kept as a golden, its merged run judged by it."""
    try:
        golden = api.golden_write(root / "base", root / "golden.json")
        c = api.golden_check(golden, root / "merged").comparison
    except BadInput as refused:
        return {"golden": "refused", "golden_codes": [], "golden_refused": str(refused)}
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    return {"golden": c.verdict, "golden_codes": codes}


def golden_disagrees(row: dict) -> bool:
    """Whether the golden's verdict is not compare's (refused counts as failing a clean run)."""
    return "golden" in row and row["golden"] != row["verdict"]
