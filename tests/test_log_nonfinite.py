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


def test_a_bad_batch_both_runs_met_alike_is_not_judged(cli, tmp_path):
    """Both runs' loss not finite at update 3 (a poisoned sample, the step skipped by both) and
    equal again after: the gate failed, saying both runs diverge."""
    base, merged = list(BASE), list(MERGED)
    base[3], merged[7] = "nan", "nan"
    code, diagnosis = _judge(cli, tmp_path, base, merged)
    assert code == 0, diagnosis
    report = json.loads((tmp_path / "r.json").read_text())
    finite = next(c for c in report["checks"] if c["name"] == "finite losses")
    assert finite["status"] == "pass" and "update(s) 3 alike" in finite["detail"]


def test_a_bug_beside_a_bad_batch_both_runs_met_is_not_hidden_by_it(cli, tmp_path):
    """The losses differ from update 1 on; the shared NaN at update 3 was the only thing
    named ('make the baseline train stably')."""
    base = list(BASE)
    merged = [
        f"{v * 1.5:.4f}" if i >= 2 else f"{v:.4f}"
        for i, v in enumerate(m for m in LOSSES for _ in range(2))
    ]
    base[3], merged[7] = "nan", "nan"
    code, diagnosis = _judge(cli, tmp_path, base, merged)
    assert code == 1 and "non-finite" not in [d["code"] for d in diagnosis], diagnosis


@pytest.mark.parametrize("where", ["other updates", "one never recovers"])
def test_non_finite_losses_unlike_in_the_two_runs_still_fail(cli, tmp_path, where):
    base, merged = list(BASE), list(MERGED)
    base[3], merged[7] = "nan", "nan"
    if where == "other updates":
        merged[9] = "nan"  # update 4 too, in the merged run alone
    else:
        base[3:], merged[7:] = ["nan"] * 5, ["nan"] * 9
    code, diagnosis = _judge(cli, tmp_path, base, merged)
    assert code == 1 and "non-finite" in [d["code"] for d in diagnosis], diagnosis
