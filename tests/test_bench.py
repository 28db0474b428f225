"""The benchmarks run (a broken benchmark would silently rot the performance figures)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _bench(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_recording_benchmark_runs_and_reports_a_ratio_two_floors_and_cpu(tmp_path):
    out = tmp_path / "bench.json"
    args = ["--updates", "1", "--batch-size", "8", "--accum-steps", "2", "--reps", "1"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = _bench(
        "recording_overhead.py", *args, "--floor", "--json", str(out), "--dir", str(scratch)
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["info"]["scratch_dir"] == str(scratch) and not any(scratch.iterdir())
    assert isinstance(data["target_met"], bool)
    both = data["summary"]["both"]
    assert both["ratio"] > 0 and both["floor_ratio"] > 0 and both["written_ratio"] > 0
    assert both["recorded_process_cpu_median_s"] >= both["recorded_thread_cpu_median_s"] > 0
    assert "training thread" in done.stdout


def test_recording_benchmark_fixes_mallocs_thresholds_when_asked(tmp_path):
    out = tmp_path / "bench.json"
    args = ["--updates", "1", "--batch-size", "8", "--accum-steps", "2", "--reps", "1"]
    done = _bench("recording_overhead.py", *args, "--malloc", "keep", "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["info"]["malloc"] == "keep"
    if sys.platform.startswith("linux"):  # the training thread's page faults, per variant
        both = data["summary"]["both"]
        assert both["plain_faults_median"] >= 0 and both["recorded_faults_median"] >= 0
        assert "Page faults of the training thread" in done.stdout
    assert "malloc thresholds fixed" in done.stdout


def test_recorder_calls_benchmark_times_each_call_on_the_training_thread(tmp_path):
    out = tmp_path / "calls.json"
    args = ["--updates", "2", "--batch-size", "8", "--accum-steps", "2", "--reps", "1"]
    done = _bench("recorder_calls.py", *args, "--json", str(out), "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    medians = json.loads(out.read_text())["medians"]
    calls = ["Recorder(...)", "micro()", "grads()", "update()", "close()"]
    assert all(medians[call]["cpu_ms"] > 0 for call in calls), medians
    assert 0 < medians["of which the digest"]["cpu_ms"] <= medians["micro()"]["cpu_ms"]
    total = sum(medians[call]["cpu_ms"] for call in calls)
    assert abs(medians["all calls"]["cpu_ms"] - total) <= 1e-6 * total  # one repetition
    assert [p.name for p in tmp_path.iterdir()] == ["calls.json"]  # its runs removed


def test_sketch_memory_follows_the_block_not_the_tensor(tmp_path):
    """The device summary's temporaries (a float64 block, the fingerprint's int64 copy) are one
    block's, whatever the tensor's size: 2M elements in blocks of 64Ki take under 1 byte each."""
    out = tmp_path / "memory.json"
    args = ["--elements", str(2_000_000), "--block", str(1 << 16), "--json", str(out)]
    done = _bench("sketch_memory.py", *args)
    assert done.returncode == 0, done.stderr
    peak = json.loads(out.read_text())["peak_bytes"]
    assert 0 < peak < 2_000_000, peak


def test_rank_reading_benchmark_reads_by_values_then_grid_sums(tmp_path):
    out = tmp_path / "rank.json"
    done = _bench("rank_reading.py", "--sizes", "4x64x48", "--reps", "1", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    assert [row["read"] for row in rows] == ["values", "grid sums"], rows
    assert all(row["seconds"] > 0 and row["peak_tensors"] > 0 for row in rows), rows


@pytest.mark.parametrize("mode", ["full", "sketch"])
def test_failing_memory_benchmark_names_each_bug_and_reports_its_peak(tmp_path, mode):
    out = tmp_path / "failing.json"
    args = ["--size", "mlp-1m", "--updates", "2", "--reps", "1", "--json", str(out)]
    args += ["--record", mode]
    done = _bench("failing_memory.py", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    firsts = {name: (row["exit_codes"], row["first_code"]) for name, row in rows.items()}
    assert firsts == {
        "clean": ([0], "within-noise"),
        "no-zero-grad": ([1], "grad-not-cleared"),
        "no-loss-scale": ([1], "loss-scale"),
        "penalty-every-micro": ([1], "penalty-not-scaled"),
    }
    assert all(row["peak_rss_bytes"] > 0 for row in rows.values())


def test_compiled_loop_check_compiles_each_run_once_and_judges_it():
    done = _bench("compiled_loop.py", "--backend", "eager")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("[1, 1, 1, 1]") == 2 and "bug fail (loss-scale)" in done.stdout


def test_checksum_benchmark_reports_each_rate(tmp_path):
    out = tmp_path / "rates.json"
    done = _bench("checksum_speed.py", "--mib", "1", "--reps", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    rates = json.loads(out.read_text())["gb_per_s"]
    assert set(rates) == {"sha256", "xxh3-128", "fingerprint"} and min(rates.values()) > 0


def test_matrix_agreement_compares_rows_and_fails_on_a_disagreement(tmp_path):
    rows = [
        {"setup": "mlp", "seed": 0, "bug": None, "verdict": "pass", "codes": [], "ok": True},
        {"setup": "mlp", "seed": 0, "bug": "x", "verdict": "fail", "codes": ["a", "b"], "ok": True},
    ]
    files = {}
    for mode in ("full", "sketch"):
        files[mode] = tmp_path / f"{mode}.json"
        files[mode].write_text(json.dumps({"summary": {"record": mode}, "rows": rows}))
    agree = _bench("sketch_agreement.py", "--matrix", str(files["full"]), str(files["sketch"]))
    assert agree.returncode == 0, agree.stdout + agree.stderr
    assert '"agree": 2' in agree.stdout
    rows[1] = {**rows[1], "codes": ["b"]}
    files["sketch"].write_text(json.dumps({"summary": {"record": "sketch"}, "rows": rows}))
    differ = _bench("sketch_agreement.py", "--matrix", str(files["full"]), str(files["sketch"]))
    assert differ.returncode == 1 and "DISAGREE" in differ.stdout


def test_many_tensors_benchmark_reports_each_size_and_the_growth(tmp_path):
    out = tmp_path / "many.json"
    args = ["--tensors", "3", "6", "--updates", "1", "--reps", "1", "--json", str(out)]
    done = _bench("many_tensors.py", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    # at 3 and 6 tensors and one repetition the time past start-up is within its noise (below 0
    # on a loaded machine): the growth is reported, its size says nothing here
    assert set(data["rows"]) == {"3", "6"} and math.isfinite(data["growth"])
    assert all(row["exit_codes"] == [0] and row["cpu_seconds"] > 0 for row in data["rows"].values())


def test_command_exit_benchmark_reports_both_ways_and_their_ratio():
    done = _bench("command_exit.py", "--reps", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("entry point") and lines[1].startswith("Python's exit")
    assert float(lines[2].split()[1]) > 0


def test_startup_benchmark_times_both_copies_of_the_package(tmp_path):
    out = tmp_path / "startup.json"
    done = _bench("startup.py", "--reps", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr
    seconds = json.loads(out.read_text())["seconds"]
    kinds = {"--help", "compare two logs"}
    assert set(seconds) == {"python -c pass"} | {
        f"{what}, {kind}" for what in kinds for kind in ("source", "compiled")
    }
    assert all(s > 0 for s in seconds.values())
    assert "bytecode ahead saves" in done.stdout


def test_startup_benchmark_times_another_typer(tmp_path):
    """`--typer DIR` times the compiled copy with DIR's typer first on the path (the child
    asserts it imported that one); a folder without typer is refused."""
    import typer

    other = tmp_path / "other"
    shutil.copytree(Path(typer.__file__).parent, other / "typer")
    out = tmp_path / "startup.json"
    done = _bench("startup.py", "--reps", "1", "--json", str(out), "--typer", str(other))
    assert done.returncode == 0, done.stderr
    seconds = json.loads(out.read_text())["seconds"]
    assert seconds["compare two logs, other typer"] > 0 and seconds["--help, other typer"] > 0
    assert "x the time with the typer in" in done.stdout
    refused = _bench("startup.py", "--reps", "1", "--typer", str(tmp_path))
    assert refused.returncode == 2 and "no typer package" in refused.stderr
