"""The small log the tests of logs printed in other ways print (tests/test_log_printed_lines.py,
tests/test_log_compared.py, and LOSSES and write for tests/test_log_records.py and
tests/test_log_keyed_lines.py): four steps, each its loss and the same 2x3 grid, written to a file
and checked as read back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VALUES = [[0.5, -0.25, 0.125], [0.75, 0.375, -0.625]]  # float32 prints them exactly


GRID = np.array(VALUES, dtype=np.float32)


LOSSES = [0.5, 0.25, 0.125, 0.375]


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def small_log(step: str = "{i}   {loss}", weights: str = "------------>{grid}") -> str:
    """Four steps, each with its loss and the same 2x3 grid, printed as `step` and `weights`."""
    grid = str(GRID)
    return "".join(
        step.format(i=i, loss=loss) + "\n" + weights.format(grid=grid) + "\n"
        for i, loss in enumerate(LOSSES)
    )


def assert_read(run, losses: list[float] = LOSSES) -> None:
    assert run.micro_loss.tolist() == losses
    if run.tensors:
        assert run.weights(0)[run.tensors[0].name].tolist() == VALUES
