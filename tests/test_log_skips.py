"""Iterations a loss scaler skipped, as Megatron-LM's fp16 iteration line says so: no `lm loss`
on it (a skipped iteration adds none to the line's means), `number of skipped iterations: 1`.
Such a line is a step whose optimizer step was skipped and whose loss is unknown: two runs that
skipped the same updates pass, runs that skipped others fail (`scaler-skips`), and a line that
lacks a loss without saying it was skipped is refused as before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gradalign.runs.logs import read_log
from gradalign.runs.logs.grammar import step_line

from .conftest import one_line_error

UPDATES = 16
LOSSES = [2.5 - 0.03 * i + 0.02 * (-1) ** i for i in range(UPDATES)]


def megatron(skipped: set[int], losses: list[float] = LOSSES) -> str:
    """A Megatron-LM log at --log-interval 1 in fp16: each line prints the loss scale after its
    iteration (halved after each skip); a skipped iteration prints no `lm loss`, `grad norm`."""
    lines = [" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 2410"]
    scale = 2.0**32  # Megatron-LM's default --initial-loss-scale
    for i, loss in enumerate(losses):
        head = (
            f" [2026-11-22 08:15:{i:02d}] iteration {i + 1:8d}/{len(losses):8d} | consumed "
            f"samples: {32 * (i + 1):12d} | elapsed time per iteration (ms): {120.3 + i:.1f} | "
            "learning rate: 3.000000E-01 | global batch size:    32 |"
        )
        if i in skipped:
            scale /= 2
            lines.append(
                f"{head} loss scale: {scale:.1f} | number of skipped iterations:   1 | number of "
                "nan iterations:   0 |"
            )
        else:
            lines.append(
                f"{head} lm loss: {loss:.6E} | loss scale: {scale:.1f} | grad norm: 0.512 | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |"
            )
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def report(cli, base: Path, merged: Path, tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    result = cli("compare", base, merged, "-k", "1", "--json", out)
    return result.code, json.loads(out.read_text())


SKIPS = {0, 1, 2, 3, 9}  # the first iterations while the scale comes down, and one mid-run


def test_a_skipped_iteration_line_is_a_step_without_a_loss():
    found = step_line(megatron({0}).splitlines()[1].strip())
    assert found is not None and found.index == 1 and found.loss is None
    assert (found.skipped, found.scale) == (1, 2.0**31)
    stepped = step_line(megatron(set()).splitlines()[1].strip())
    assert stepped is not None and stepped.loss is not None and stepped.skipped == 0


def test_a_log_with_skipped_iterations_reads_their_updates_as_skipped(tmp_path):
    run = read_log(write(tmp_path, "b.log", megatron(SKIPS)), accum_steps=1)
    assert run.updates == UPDATES
    assert [int(i) for i in np.flatnonzero(run.optimizer_steps == 0)] == sorted(SKIPS)
    assert [int(i) for i in np.flatnonzero(~run.loss_known)] == sorted(SKIPS)
    assert all(math.isnan(run.micro_loss[i]) for i in SKIPS)
    assert run.non_finite_losses().size == 0  # unknown, not a NaN the run computed
    # the scale each update ran at: the one printed after the update before it
    assert run.loss_scale[4] == 2.0**28 and run.loss_scale[10] == 2.0**27
    assert run.micro_loss[4] == float(f"{LOSSES[4]:.6E}")


def test_runs_that_skipped_the_same_iterations_pass(cli, tmp_path):
    """Both runs skip the first four iterations and one mid-run: before, the first step line
    (iteration 5) was refused as a log printed every 5 steps, and a mid-run skip as a gap."""
    merged_losses = [x + 1e-6 * (i % 3) for i, x in enumerate(LOSSES)]
    base = write(tmp_path, "base.log", megatron(SKIPS))
    merged = write(tmp_path, "merged.log", megatron(SKIPS, merged_losses))
    code, found = report(cli, base, merged, tmp_path)
    assert code == 0, found["diagnosis"]
    assert found["verdict"] == "pass"
    checks = {c["name"]: c for c in found["checks"]}
    assert checks["losses"]["status"] == "pass"
    assert "not judged at update(s) 0, 1, 2, 3, 9" in checks["losses"]["detail"]
    assert checks["optimizer steps"]["status"] == "pass"
    skipped = found["per_update"][9]
    assert skipped["baseline_loss"] is None and skipped["loss_abs_diff"] is None
    assert found["per_update"][4]["loss_abs_diff"] is not None


def test_runs_that_skipped_other_iterations_fail_as_scaler_skips(cli, tmp_path):
    """The merged run (K micro-batches, each gradient K times smaller) stepped at update 3
    where the baseline's scaler skipped it: named `scaler-skips`, not passed."""
    base = write(tmp_path, "base.log", megatron(SKIPS))
    merged = write(tmp_path, "merged.log", megatron(SKIPS - {3}))
    code, found = report(cli, base, merged, tmp_path)
    assert code == 1 and found["verdict"] == "fail"
    diagnosis = found["diagnosis"][0]
    assert diagnosis["code"] == "scaler-skips", diagnosis
    assert diagnosis["evidence"]["first_update"] == 3
    assert diagnosis["evidence"]["baseline_skipped"] == sorted(SKIPS)
    assert diagnosis["evidence"]["merged_skipped"] == sorted(SKIPS - {3})
    assert "--initial-loss-scale" in diagnosis["fix"]


def test_a_line_without_a_loss_that_says_no_skip_is_still_refused(cli, tmp_path):
    """A line without `lm loss` whose counter says 0 skipped iterations, or with no counter at
    all, is no step line: the step count has a gap, refused as before."""
    other = write(tmp_path, "other.log", megatron(set()))
    text = megatron({6}).replace("skipped iterations:   1", "skipped iterations:   0")
    counted = write(tmp_path, "counted.log", text)
    one_line_error(cli("compare", counted, other, "-k", "1"), "expected step 7, found step 8")
    lines = megatron({6}).splitlines()
    lines[7] = lines[7].split(" loss scale:")[0]
    bare = write(tmp_path, "bare.log", "\n".join(lines) + "\n")
    one_line_error(cli("compare", other, bare, "-k", "1"), "expected step 7, found step 8")
    first = megatron({0}).replace("skipped iterations:   1", "skipped iterations:   0")
    one_line_error(
        cli("compare", write(tmp_path, "first.log", first), other, "-k", "1"),
        "the first step is 2; expected 0 or 1",
    )
