"""NaN and inf losses in logs: what the gate says. A baseline that breaks alone is named as the
baseline's fault, not left unexplained; a merged loss that is not finite at one update and
finite again later is an overflow a loss scaler skipped, never 'diverged'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LOSSES = [2.0 - i / 16 for i in range(8)]  # eight updates; K=2 micro-steps of the same loss


def _write(tmp_path: Path, name: str, losses: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"step {i} loss {v}\n" for i, v in enumerate(losses)))
    return path


def _judge(cli, tmp_path: Path, base: list[str], merged: list[str]) -> tuple[int, list[dict]]:
    out = tmp_path / "r.json"
    result = cli(
        "compare",
        str(_write(tmp_path, "base.log", base)),
        str(_write(tmp_path, "merged.log", merged)),
        "-k",
        "2",
        "--json",
        str(out),
    )
    return result.code, json.loads(out.read_text())["diagnosis"]


BASE = [f"{v:.4f}" for v in LOSSES]
MERGED = [f"{v:.4f}" for v in LOSSES for _ in range(2)]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_baseline_that_breaks_alone_is_named(cli, tmp_path, bad):
    base = BASE[:5] + [bad] * 3
    code, diagnosis = _judge(cli, tmp_path, base, MERGED)
    assert code == 1
    assert [d["code"] for d in diagnosis] == ["non-finite"]
    assert "the baseline's losses stop being finite at update 5" in diagnosis[0]["message"]
    assert "the baseline, not the merged run" in diagnosis[0]["message"]


def test_a_merged_loss_finite_again_is_an_overflow_not_a_divergence(cli, tmp_path):
    merged = list(MERGED)
    merged[7] = "nan"  # update 3's second micro-step
    code, diagnosis = _judge(cli, tmp_path, BASE, merged)
    assert code == 1
    message = next(d["message"] for d in diagnosis if d["code"] == "non-finite")
    assert "not finite at update 3 and finite again from update 4" in message
    assert "diverged" not in message


def test_a_merged_run_that_stays_broken_diverged(cli, tmp_path):
    merged = MERGED[:6] + ["inf"] + ["nan"] * 9
    code, diagnosis = _judge(cli, tmp_path, BASE, merged)
    assert code == 1
    message = next(d["message"] for d in diagnosis if d["code"] == "non-finite")
    assert "stop being finite at update 3" in message and "the merged run diverged" in message
