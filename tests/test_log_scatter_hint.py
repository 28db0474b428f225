"""Logs of one line per update whose merged losses scatter about the baseline's, above and below
from the first updates (each merged line one micro-batch's loss: nanoGPT's, timm's `Loss:` under
--grad-accum-steps), are told so, where a cold probe's timm pair, agreeing at update 0 to its 3
printed digits, was told "the steps differed" from update 1. Losses that drift away one way as
training goes on are still read as steps that differed."""

from __future__ import annotations

import numpy as np

from gradalign.api import compare

N = 24


def _log(path, losses) -> None:
    path.write_text("".join(f"step {u}, loss: {v:.4f}\n" for u, v in enumerate(losses)))


def _unexplained(tmp_path, merged):
    base = 2.3 - 0.02 * np.arange(N)
    _log(tmp_path / "base.log", base)
    _log(tmp_path / "merged.log", merged(base))
    c = compare(tmp_path / "base.log", tmp_path / "merged.log", accum_steps=1)
    assert c.verdict == "fail"
    (lead,) = [d for d in c.diagnosis if d.severity == "error"]
    assert lead.code == "unexplained"
    return lead


def test_losses_scattering_about_the_baselines_are_read_as_one_micro_batch_a_line(tmp_path):
    noise = np.random.default_rng(3).standard_normal(N) * 0.08
    noise[0] = 0.0  # update 0 agreeing to the printed digits, as the probe's did

    lead = _unexplained(tmp_path, lambda base: base + noise)
    assert "scatter about the baseline's" in lead.message
    assert "one micro-batch's loss" in lead.message and "timm" in lead.message
    assert "the steps differed" not in lead.message
    assert "window mean on the merged line" in (lead.fix or "")


def test_losses_drifting_one_way_are_still_steps_that_differed(tmp_path):
    lead = _unexplained(tmp_path, lambda base: base - 0.01 * np.arange(N))
    assert "the steps differed" in lead.message and "scatter" not in lead.message


def test_a_merged_loss_a_whole_multiple_of_the_baselines_at_update_0_is_read_as_a_sum(tmp_path):
    """A PaddleNLP-style log whose `tr_loss` added each micro-batch's loss undivided stood 4.00
    times the baseline's at update 0 and was `unexplained` without a word of it."""
    lead = _unexplained(tmp_path, lambda base: 4 * base - 0.05 * np.arange(N))
    assert "the merged loss at update 0 is 4 times the baseline's" in lead.message
    assert "4 micro-batch losses summed" in lead.message
    assert (lead.fix or "").startswith("divide each micro-batch's loss by K")
    lead = _unexplained(tmp_path, lambda base: 1.5 * base)  # no whole multiple: no such clause
    assert "summed" not in lead.message


def test_updates_both_scalers_skipped_are_no_agreement_before_a_step(tmp_path):
    """Megatron-LM's fp16 lines for iterations its scaler skipped print no loss: the first loss
    both print is the first judged, and the clause said "the losses agree at update 0, before
    any step" though update 0 was not judged."""
    skipped = (
        "iteration {i}/ {n} | learning rate: 1.0E-04 | loss scale: {s:.1f} | "
        "number of skipped iterations:   1 | number of nan iterations:   0 |\n"
    )
    stepped = (
        "iteration {i}/ {n} | learning rate: 1.0E-04 | lm loss: {v:.6E} | loss scale: {s:.1f} "
        "| number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )

    def write(path, losses):
        lines = [skipped.format(i=i + 1, n=N, s=2.0 ** (16 - i)) for i in range(2)]
        lines += [stepped.format(i=i + 1, n=N, v=losses[i], s=2.0**14) for i in range(2, N)]
        path.write_text("".join(lines))

    base = 2.3 - 0.02 * np.arange(N)
    write(tmp_path / "base.log", base)
    write(tmp_path / "parted.log", base - 0.01 * np.maximum(0, np.arange(N) - 2))
    c = compare(tmp_path / "base.log", tmp_path / "parted.log", accum_steps=1)
    lead = c.diagnosis[0]
    assert c.verdict == "fail" and lead.code == "unexplained", c.diagnosis
    assert "at update 2, the first both printed" in lead.message
    assert "at update 0, before any step" not in lead.message
