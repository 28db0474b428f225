"""Which field of a line or record is the training loss, when a line prints several: the plain
`loss`, then a training loss, then the first other named one; a word of any kind before `loss`
names it (`mtp_1 loss`, `l2 loss`, `aux/loss`), and a component beside a `total` is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import read_log

from .conftest import one_line_error

LOSSES = [2.5, 2.25, 2.125, 2.0]


def _log(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "train.log"
    text = "".join(line.format(i=i, g=i + 1, x=x, y=x + 0.5) + "\n" for i, x in enumerate(LOSSES))
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "line",
    [
        # Megatron-LM with multi-token prediction: `lm loss` first, `mtp_1 loss` after it
        " iteration {g:8d}/       4 | lm loss: {x:.6E} | mtp_1 loss: {y:.6E} | loss scale: 1.0 |",
        "step {i}, l2 loss: 0.0{g}, loss: {x}",  # a regulariser named by a word with a digit
        "step {i} aux/loss 0.0{g} train/loss {x}",  # path-like names
        "step {i} running/loss {y} loss {x}",
        "step {i} | total loss {y} | loss {x}",  # a plain `loss` beside a total
        "step {i}: ce loss {x}, aux loss 0.0{g}",
        # NeMo 2's progress printer: a training loss named with underscores
        "Training epoch 0, iteration {i}/3 | lr: 0.1 | global_step: {i} | reduced_train_loss: {x}",
        "step {i} | ce_loss {y} | train_loss {x}",  # `ce_loss` is no field a line reads
        "step {i}, avg training loss {y}, training loss {x}",  # a word before `training loss`
    ],
)
def test_the_training_loss_among_several(tmp_path, line):
    assert read_log(_log(tmp_path, line)).micro_loss.tolist() == LOSSES


@pytest.mark.parametrize(
    "line",
    [
        "step {i}, total loss {y}, ce loss {x}, aux loss 0.01",
        "{{'step': {i}, 'total_loss': {y}, 'ce_loss': {x}}}",
        '{{"step": {i}, "ce_loss": {x}, "total_loss": {y}}}',
    ],
)
def test_a_component_beside_a_total_is_refused(tmp_path, line):
    with pytest.raises(BadInput, match="not clear; print the loss the optimizer steps on"):
        read_log(_log(tmp_path, line))


def test_the_refusal_is_one_line(cli, tmp_path):
    path = _log(tmp_path, "step {i}, total loss {y}, ce loss {x}")
    other = tmp_path / "other.log"
    other.write_text(path.read_text())
    one_line_error(cli("compare", str(path), str(other)), "'total loss' and 'ce loss'")


@pytest.mark.parametrize(
    "line",
    [
        "step {i} | ce_loss {x} | kd_loss {y}",
        "step {i} avg_train_loss {x}",
        "step {i} dev_loss {x}",
    ],
)
def test_other_names_joined_by_underscores_are_no_loss(tmp_path, line):
    with pytest.raises(BadInput, match="no step lines"):
        read_log(_log(tmp_path, line))


def test_a_summary_with_a_total_and_no_step_stays_noise(tmp_path):
    path = _log(tmp_path, "step {i} loss {x}")
    path.write_text(path.read_text() + "done: total loss 9.5, ce loss 9.0\n")
    assert read_log(path).micro_loss.tolist() == LOSSES


def test_a_loss_printed_as_a_whole_number_by_g(tmp_path):
    """`{loss:.3g}` prints 0.9996 as `1`: a keyed loss field holding a whole number is read (was
    skipped, and the step read as missing), at the resolution of its digits (none)."""
    path = tmp_path / "train.log"
    losses = [1.25, 0.9996, 1.0004, 0.875]
    path.write_text("".join(f"step {i}, loss: {v:.3g}\n" for i, v in enumerate(losses)))
    run = read_log(path)
    assert run.micro_loss.tolist() == [1.25, 1.0, 1.0, 0.875]
    assert run.loss_quantum.tolist()[1:3] == [1.0, 1.0]
