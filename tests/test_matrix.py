"""The held-out-style matrix (bench/matrix.py) runs in the suite: loops of 35 other shapes over
3 seeds pass with no cause named, and every injected bug is named first by its own code."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT


def test_the_matrix_has_no_false_alarm_and_misses_no_bug(tmp_path):
    report = tmp_path / "matrix.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "matrix.py"), "--seeds", "3", "--json", report],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(report.read_text())["summary"]
    assert summary["clean_configurations"] >= 25 and summary["seeds"] >= 3
    assert summary["false_alarms"] == 0 and summary["bugs_missed_or_misnamed"] == 0
    assert summary["worst_clean_over_allowed"] < 1 and summary["worst_clean_loss_over_allowed"] < 1
    assert summary["mildest_bug_over_allowed"] > 100
