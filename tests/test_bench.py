"""The recording benchmark runs (a broken benchmark would silently rot the performance figures)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_recording_benchmark_runs_and_reports_a_ratio(tmp_path):
    out = tmp_path / "bench.json"
    args = ["--updates", "1", "--batch-size", "8", "--accum-steps", "2", "--reps", "1"]
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recording_overhead.py"), *args, "--json", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    data = json.loads(out.read_text())
    assert isinstance(data["target_met"], bool)
    assert data["summary"] and data["times_s"]
