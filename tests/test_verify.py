"""End to end: `gradalign verify` on the built-in default passes, as the seed experiment did."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_verify_default_passes(cli, tmp_path, optimizer):
    report = tmp_path / "r.json"
    result = cli("verify", "--optimizer", optimizer, "--out", tmp_path / "runs", "--json", report)
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass"
    assert data["updates"] == 12
    assert data["accum_steps"] == 4
    assert data["baseline_accum_steps"] == 1
    assert 0 <= data["loss"]["max_abs_diff"] < 1e-5
    assert data["first_divergence"] is None
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    for name in (
        "losses",
        "weights",
        "gradients",
        "no weight change inside a window",
        "learning rate",
        "optimizer steps",
        "initial weights",
    ):
        assert statuses[name] == "pass", (name, data["checks"])
    assert "PASS" in result.out and "baseline loss" in result.out


def test_verify_is_deterministic(cli, tmp_path):
    """The same command gives the same bytes: run files and the JSON report."""
    reports = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert cli("verify", "--updates", "3", "--out", out, "--json", out / "r.json").code == 0
        reports.append(out)
    a, b = reports
    for rel in (
        "baseline/manifest.json",
        "merged/manifest.json",
        "merged/series.safetensors",
        "merged/weights/update_000002.safetensors",
    ):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    ja = json.loads((a / "r.json").read_text())
    jb = json.loads((b / "r.json").read_text())
    for report in (ja, jb):  # the run paths differ by design; everything else must not
        report.pop("baseline")
        report.pop("merged")
        report.pop("reference")
    assert ja == jb


def test_yaml_config_and_overrides(cli, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("batch_size: 24\nupdates: 2\naccum_steps: 3\nhidden: 16\n")
    report = tmp_path / "r.json"
    result = cli(
        "verify", "-c", config, "--updates", "3", "--out", tmp_path / "v", "--json", report
    )
    assert result.code == 0, result.err
    data = json.loads(report.read_text())
    assert (data["updates"], data["accum_steps"]) == (3, 3)  # the CLI wins over the file


def test_merged_against_baseline_reuses_its_config(cli, tmp_path):
    base = tmp_path / "base"
    assert cli("baseline", "--updates", "3", "--hidden", "16", "--out", base).code == 0
    report = tmp_path / "r.json"
    result = cli("merged", "--against", base, "-k", "2", "--out", tmp_path / "m", "--json", report)
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert (data["verdict"], data["updates"], data["accum_steps"]) == ("pass", 3, 2)
    # Without -k the merged run takes the default K=4, never the baseline's recorded K=1.
    assert cli("merged", "--against", base, "--out", tmp_path / "m4", "--json", report).code == 0
    assert json.loads(report.read_text())["accum_steps"] == 4
