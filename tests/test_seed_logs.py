"""The seed experiment's own PaddlePaddle logs, judged through the CLI."""

from __future__ import annotations

import json

from .conftest import FIXTURES

BASE = FIXTURES / "paddle" / "run.log"
MERGED = FIXTURES / "paddle" / "run_grad.log"


def test_seed_logs_pass(cli, tmp_path):
    report = tmp_path / "r.json"
    result = cli("compare", BASE, MERGED, "--accum-steps", "4", "--json", report)
    assert result.code == 0, result.out + result.err
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass"
    assert (data["updates"], data["accum_steps"]) == (12, 4)
    assert 1e-9 < data["loss"]["max_abs_diff"] <= 7.1e-8
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["weights (printed values only)"] == "pass"
    assert status["no weight change inside a window"] == "pass"
    for absent in ("gradients", "learning rate", "optimizer steps", "initial weights"):
        assert status[absent] == "not checked", absent  # never reported as passed
    assert "not checked" in result.out


def test_edited_loss_fails_at_that_update(cli, tmp_path):
    """Change micro-step 21 (update 5, position 2) by 1e-4: update 5 must fail, no other."""
    lines = MERGED.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith("21   ["))
    assert lines[index] == "21   [0.40815654]\n"
    lines[index] = "21   [0.40825654]\n"
    edited = tmp_path / "run_grad_edited.log"
    edited.write_text("".join(lines))
    report = tmp_path / "r.json"
    result = cli("compare", BASE, edited, "-k", "4", "--json", report)
    assert result.code == 1, result.out
    data = json.loads(report.read_text())
    assert data["verdict"] == "fail"
    assert data["first_divergence"]["update"] == 5
    assert [u["update"] for u in data["per_update"] if not u["ok"]] == [5]
    # The log's own printed avgloss for window 5 no longer matches its micro losses: reported.
    assert any(note.startswith("update 5: the log's printed window mean") for note in data["notes"])


def test_edited_weight_inside_a_window_fails(cli, tmp_path):
    """A weight printed after micro-step 5 that differs from its window start: a step in-window."""
    text = MERGED.read_text()
    lines = text.splitlines(keepends=True)
    step5 = next(i for i, line in enumerate(lines) if line.startswith("5   ["))
    lines[step5 + 1] = lines[step5 + 1].replace("0.00325679", "0.00325999", 1)
    edited = tmp_path / "stepped.log"
    edited.write_text("".join(lines))
    report = tmp_path / "r.json"
    assert cli("compare", BASE, edited, "-k", "4", "--json", report).code == 1
    data = json.loads(report.read_text())
    window = next(c for c in data["checks"] if c["name"] == "no weight change inside a window")
    assert window["status"] == "fail" and "update 1" in window["detail"]
    assert data["first_divergence"]["update"] == 1


def test_log_with_wrong_k_is_bad_input(cli):
    result = cli("compare", BASE, MERGED, "-k", "5")
    assert result.code == 2
    assert "run_grad.log: 48 micro-steps" in result.err and "accum_steps=5" in result.err
