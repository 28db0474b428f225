"""Logs as a terminal wrote them: lines numbered by `\\n` alone (a `\\r` splits a line into
segments), tqdm's bar glued before the line printed after it, Paddle's `Model.fit(verbose=1)`
bar (backspaces, `\\r`) read as step lines, and the refusal of a log of progress bars."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import looks_like_log, read_log

from .conftest import one_line_error

LOSSES = [0.5, 0.25, 0.125, 0.375]


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _tqdm(i: int, n: int = 4, desc: str = "") -> str:
    return f"\r{desc}{100 * i // n:3d}%|##  | {i}/{n} [00:01<00:03,  2.00it/s]"


@pytest.mark.parametrize("odd", ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028"])
def test_line_numbers_count_newlines_only(tmp_path, odd):
    """A `\\r` (a bar redrawn) and the characters `str.splitlines` also splits on end no line:
    the step that breaks the count is named at its line in an editor."""
    lines = [f"{_tqdm(1)}", f"page{odd}break", "step 0, loss: 0.5", f"{_tqdm(2)}{_tqdm(3)}"]
    lines += ["step 2, loss: 0.25"]  # line 5: step 1 is missing
    path = write(tmp_path, "\r\n".join(lines) + "\r\n")
    with pytest.raises(BadInput, match=r"train\.log:5: expected step 1, found step 2"):
        read_log(path)


@pytest.mark.parametrize(
    "step",
    [
        "epoch 0 step {i} loss {loss}",
        "[2024-05-01 10:00:00,000] [    INFO] - loss: {loss}, learning_rate: 0.5, global_step: {i}",
    ],
)
@pytest.mark.parametrize("desc", ["", "Epoch 0: "])
def test_a_line_glued_after_a_tqdm_bar_is_read(tmp_path, step, desc):
    """tqdm ends its bar with no newline: the line printed next shares its segment, after the
    bar's `[elapsed<remaining, rate]`. Every other line glued, or only some."""
    glued = "".join(
        _tqdm(i + 1, desc=desc) + step.format(i=i + 1, loss=loss) + "\n"
        for i, loss in enumerate(LOSSES)
    )
    assert looks_like_log(write(tmp_path, glued))
    assert read_log(write(tmp_path, glued)).micro_loss.tolist() == LOSSES
    lines = glued.splitlines(keepends=True)
    some = "".join(line.split("]", 1)[1] if i % 2 else line for i, line in enumerate(lines))
    assert read_log(write(tmp_path, some)).micro_loss.tolist() == LOSSES


def test_a_tqdm_bar_alone_is_noise(tmp_path):
    text = "".join(f"{_tqdm(i + 1)}\nstep {i} loss {v}\n" for i, v in enumerate(LOSSES))
    run = read_log(write(tmp_path, text))
    assert run.micro_loss.tolist() == LOSSES
    assert run.config["ignored_lines"] == len(LOSSES)


def _paddle_bar(epochs: int = 2, eval_bars: bool = False) -> str:
    """Paddle's `Model.fit(verbose=1)` into a file: each step's bar, then as many backspaces and
    a `\\r`; a newline after an epoch's last step (the loss on a bar is the batch's)."""
    out = []
    for e in range(epochs):
        out.append(f"Epoch {e + 1}/{epochs}\n")
        for b in range(2):
            bar = "=" * (10 * b) + ">" + "." * (20 - 10 * b)
            line = f"step {b + 1}/2 [{bar}] - loss: {LOSSES[2 * e + b]:.4f} - 20ms/step"
            out.append("\r" + line + ("\n" if b == 1 else "\b" * len(line)))
        if eval_bars:
            out.append("Eval begin...\n\rstep 1/1 [==============================] - loss: 9.5\n")
            out.append("Eval samples: 32\n")
    return "".join(out)


@pytest.mark.parametrize("eval_bars", [False, True])
def test_paddles_step_bar_is_read(tmp_path, eval_bars):
    """Paddle's bar names the step (`step 3/30 [==>...]`) and prints the batch's loss."""
    run = read_log(write(tmp_path, _paddle_bar(eval_bars=eval_bars)), accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES


def test_a_tqdm_postfix_with_a_step_is_refused_for_being_a_bar(cli, tmp_path):
    """`bar.set_postfix(step=i, loss=...)` at every step: the refusal listed a total beside its
    parts, a loss named for one part and a median, none of which it is."""
    frames = "".join(
        f"\r{i * 25:3d}%|###  | {i + 1}/4 [00:00<00:00, 80.0it/s, loss={v:.6f}, step={i}]"
        for i, v in enumerate(LOSSES)
    )
    base = write(tmp_path, "".join(f"step {i} loss {v}\n" for i, v in enumerate(LOSSES)), "b.log")
    bars = write(tmp_path, frames + "\n", "tqdm.log")
    result = cli("compare", base, bars, "-k", "1")
    one_line_error(result, "its progress bars print `loss` beside `step` in their postfix")
    assert "a total beside its parts" not in result.err and "are not read:" not in result.err


def test_keras_bar_stays_refused(cli, tmp_path):
    """Keras's bar shows the epoch's running mean and names no step: never read; a log of
    nothing else is refused naming its progress bars, one without bars not. Its first frame
    is dots alone (`1/4 [....]`): read as a step, a log of one update passed any bug."""
    keras = "".join(
        f"\r{i + 1}/4 [{'=' * (i - 1)}{'>' if i else ''}{'.' * (4 - i)}] - ETA: 0s - loss: {v:.4f}"
        for i, v in enumerate(LOSSES)
    )
    base = write(tmp_path, "".join(f"step {i} loss {v}\n" for i, v in enumerate(LOSSES)), "b.log")
    bars = write(tmp_path, keras + "\n", "keras.log")
    assert not looks_like_log(bars)
    one_line_error(cli("compare", base, bars, "-k", "1"), "its progress bars are not read")
    plain = write(tmp_path, "Training...\nDone.\n", "plain.log")
    result = cli("compare", base, plain, "-k", "1")
    one_line_error(result, "nor a recognised training log", "print each step's loss")
    assert "progress bar" not in result.err


def test_a_log_of_one_update_is_refused(cli, tmp_path):
    """One update's loss comes before any optimizer step: it shows nothing of the training
    (a bug that scales every step passed as 'max abs diff 0 over 1 updates'). Two are judged."""
    base = write(tmp_path, "step 0 loss 2.5\n", "b.log")
    merged = write(tmp_path, "".join(f"step {i} loss 2.5\n" for i in range(4)), "m.log")
    one_line_error(cli("compare", base, merged, "-k", "4"), "1 update(s) read", "two updates")
    base2 = write(tmp_path, "step 0 loss 2.5\nstep 1 loss 9.0\n", "b2.log")
    merged2 = write(tmp_path, "".join(f"step {i} loss 2.5\n" for i in range(8)), "m2.log")
    assert cli("compare", base2, merged2, "-k", "4").code == 1  # judged: update 1 differs
