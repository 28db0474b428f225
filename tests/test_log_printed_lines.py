"""Other ways a Paddle script's log gets printed, each read as the same steps: dygraph Tensors,
launcher and logger prefixes, byte order marks and UTF-16, keyed step lines and epochs that
restart the count, other frameworks' scalars, a last line cut while written; and noise that must
stay noise."""

from __future__ import annotations

import codecs

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import looks_like_log, read_log
from gradalign.runs.logs.simulate import paddle_str

from .small_logs import GRID, LOSSES, assert_read, small_log, write

# --- Paddle dygraph Tensors -------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (1,)])
@pytest.mark.parametrize(
    "weights",
    ["------------>{w}", "------------> {w}", "------------> Parameter containing:\n{w}"],
)
def test_paddle_tensor_losses_and_weights(tmp_path, shape, weights):
    """`print(step, loss)` and `print("------------>", weight)` on Paddle Tensors."""
    text = ""
    for i, loss in enumerate(LOSSES):
        text += f"{i} {paddle_str(np.float32(loss).reshape(shape))}\n"
        text += weights.format(w=paddle_str(GRID, place="Place(cpu)", stop_gradient=False)) + "\n"
        if i % 2:
            mean = np.float32(np.mean(LOSSES[i - 1 : i + 1])).reshape(shape)
            text += f"avgloss -------->{paddle_str(mean)}\n"
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert_read(run)
    assert [t.shape for t in run.tensors] == [(2, 3)]
    assert run.printed_window_loss.tolist() == [0.375, 0.25]
    assert run.config["ignored_lines"] == 0
    assert looks_like_log(tmp_path / "train.log")


@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_paddle_tensor_loss_with_fields_after_it(tmp_path, shape):
    """`print(f"epoch: 0, step: {i}, loss: {loss}, lr: {lr:.6f}")` on a Paddle Tensor: its
    closing `)` stands before the fields that follow it; the lines were refused as holding no
    step (a 0-d loss) or misread."""
    text = "".join(
        f"epoch: 0, step: {i}, loss: {paddle_str(np.float32(loss).reshape(shape))}, "
        f"lr: {0.01 * (i + 1):.6f}\n"
        for i, loss in enumerate(LOSSES)
    )
    run = read_log(write(tmp_path, text))
    assert_read(run)
    assert run.lr.tolist() == pytest.approx([0.01, 0.02, 0.03, 0.04])


def test_a_named_paddle_parameter(tmp_path):
    """`print("fc1.weight", weight)`: the name labels the array; a name and one number is a
    metric (`acc [0.5]`), not weights."""
    text = "".join(
        f"{i} {paddle_str(np.float32(loss))}\n"
        f"fc1.weight {paddle_str(GRID, stop_gradient=False)}\nacc [0.5]\n"
        for i, loss in enumerate(LOSSES)
    )
    run = read_log(write(tmp_path, text))
    assert [(t.name, t.shape) for t in run.tensors] == [("fc1.weight", (2, 3))]
    assert_read(run)
    assert run.config["ignored_lines"] == 4


def test_paddle_prints_infinity_with_a_point(tmp_path):
    """Paddle formats a whole float as `2.`: infinity comes out as `inf.`."""
    row = np.array([np.inf, np.nan, -2.0, 0.5], dtype=np.float32)
    text = "".join(
        f"{i} {paddle_str(np.float32(x))}\n------------>{paddle_str(row)}\n"
        for i, x in enumerate([np.inf, 0.5])
    )
    run = read_log(write(tmp_path, text))
    assert run.micro_loss[0] == np.inf and run.micro_loss[1] == 0.5
    weights = run.weights(0)["printed_weight_0"]
    assert weights[0] == np.inf and np.isnan(weights[1]) and weights[2:].tolist() == [-2.0, 0.5]


# --- how the lines reach the file --------------------------------------------------------------


PREFIXED = {
    "torchrun rank tag": "[rank0]: {line}",
    "torchrun role tag": "[default0]:{line}",
    "mpirun --tag-output": "[1,0]<stdout>:{line}",
    "timestamp": "2026-11-22 08:15:00,101 {line}",
    "ISO timestamp": "2026-11-22T08:15:00.123456789Z {line}",
    "paddle logger": "[2026-11-22 08:15:01,234] [    INFO] train.py:42 - {line}",
    "python logging": "INFO:root:{line}",
    "launcher": "LAUNCH INFO 2026-11-22 08:15:00,101 {line}",
    "absl logging from a Python file": "I1122 08:15:01.123456 140123 train.py:88] {line}",
}


@pytest.mark.parametrize("case", sorted(PREFIXED))
def test_launcher_and_logger_prefixes_on_every_line(tmp_path, case):
    prefix = PREFIXED[case]
    lines = small_log().splitlines()
    text = "".join(prefix.format(line=line) + "\r\n" for line in lines)
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert_read(run)
    assert run.config["ignored_lines"] == 0


@pytest.mark.parametrize("case", sorted(PREFIXED))
def test_prefixes_on_step_lines_only(tmp_path, case):
    step = PREFIXED[case].replace("{line}", "{i}   {loss}")
    run = read_log(write(tmp_path, small_log(step=step)), accum_steps=2)
    assert_read(run)


def test_byte_order_marks_and_utf16(tmp_path):
    """A BOM before the first step line must not hide step 0 (the log was read from step 1 on);
    PowerShell's `>` writes UTF-16 with a BOM (the log was refused as binary)."""
    text = small_log().replace("\n", "\r\n")
    path = tmp_path / "bom.log"
    path.write_bytes(codecs.BOM_UTF8 + text.encode())
    assert_read(read_log(path))
    for encoding in ("utf-16", "utf-16-be"):
        path = tmp_path / f"{encoding}.log"
        bom = codecs.BOM_UTF16_BE if encoding.endswith("be") else b""
        path.write_bytes(bom + text.encode(encoding))
        assert looks_like_log(path)
        assert_read(read_log(path))


# --- step lines --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        "Step[{i}/4] loss: {loss}",
        "[Train] step: {i}, loss: {loss}, lr: 0.001",
        "epoch 0 step {i} loss {loss}",
        "Epoch [1/1], Step [{i}/4], Loss: {loss}",
        "epoch: 0, batch_id: {i}, loss is: [{loss}]",
        "step {i}/4 - loss: {loss} - acc: 0.1000 - 12ms/step",
        "global step {i}, epoch: 0, batch: 7, loss: {loss}, speed: 1.23 step/s",
        "epoch 0 | iter {i} | train_loss={loss} | grad_norm 1.5 | error_rate 0.1",
        "loss: {loss}, step: {i}",
        # other losses before the training loss: the field plainly named `loss` is read
        "step {i}, aux loss: 0.0123, loss: {loss}, lr: 0.1",
        "step {i} | running loss 9.25 | loss {loss} | lr 1.67e-01",
        "step {i} | loss scale: 65536.0 | loss: {loss}",
        # Megatron-LM: `lm loss` is the only loss; `skipped iterations: 0` is a counter
        " iteration {i}/ 4 | learning rate: 1.0E-04 | lm loss: {loss} | loss scale: 1.0 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |",
    ],
)
def test_keyed_step_lines(tmp_path, step):
    run = read_log(write(tmp_path, small_log(step=step)), accum_steps=2)
    assert_read(run)


def test_step_count_restarting_each_epoch_continues(tmp_path):
    text = "".join(
        f"epoch: {e}, batch_id: {b}, loss is: [{LOSSES[2 * e + b]}]\n"
        for e in range(2)
        for b in range(2)
    )
    assert_read(read_log(write(tmp_path, text), accum_steps=2))
    with pytest.raises(BadInput, match="expected step 2, found step 0 again"):
        read_log(write(tmp_path, text.replace("epoch: 1", "epoch: 0")))


@pytest.mark.parametrize(
    "line",
    [
        "epoch: {e}, batch_id: {b}, loss is: [{loss}]",
        "epoch: {e} step: {b}, loss is {loss}",
        "[Train] epoch {e}, step: {b}, loss: {loss}",
    ],
)
def test_a_step_printed_at_each_micro_step_restarting_each_epoch_continues(tmp_path, line):
    """Each update's step printed on K=2 lines (one per micro-batch), the count restarting
    each epoch (MindSpore's `epoch: 2 step: 1, loss is`): the restart was counted in lines, not
    steps, and the log refused ("expected step -2, found step 0")."""
    text = "".join(
        line.format(e=e, b=b, loss=(LOSSES * 2)[4 * e + 2 * b + j]) + "\n"
        for e in range(2)
        for b in range(2)
        for j in range(2)
    )
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert run.updates == 4 and run.micro_loss.tolist() == LOSSES * 2


@pytest.mark.parametrize("first_epoch", [1, 0])
def test_an_epoch_announced_on_a_line_of_its_own_continues_the_count(tmp_path, first_epoch):
    """Paddle's Model.fit prints `Epoch 2/2` before the epoch's `step 1/2 - loss: ...` lines:
    the count restarts there and continues (epochs counted from 1 or from 0); without the
    header it is refused."""
    text = "".join(
        (f"Epoch {e + first_epoch}/2\n" if b == 0 else "")
        + f"step {b + 1}/2 - loss: {LOSSES[2 * e + b]} - acc: 0.3125 - 3ms/step\n"
        for e in range(2)
        for b in range(2)
    )
    assert_read(read_log(write(tmp_path, text), accum_steps=2))
    with pytest.raises(BadInput, match="expected step 3, found step 1 again"):
        read_log(write(tmp_path, text.replace(f"Epoch {1 + first_epoch}/2\n", "")))


NOISE = [
    "W1122 08:14:05.914411 40211 trainer.cc:84] step 1 loss 9.5",
    "I1122 08:14:05.914411 40211 trainer.cc:84] step 1 loss 9.5",  # glog's, from C++
    "W1122 08:14:05.914411 40211 train.py:84] step 1 loss 9.5",  # absl's warning
    "/x/paddle/amp.py:12: UserWarning: step 1 loss 9.5 overflowed",
    "[2026-11-22 08:15:01,234] [ WARNING] - step 1, loss: 9.5 is large",
    "Found inf or nan at step 1, loss scale 1024.0, skipping update",
    "step 1, loss: 9.5, skipped: step, loss scaler reduced",
    "step 1, aux loss: 9.5, running loss 9.5",
    "[Eval] step: 1, loss: 9.5",
    "eval step 1 loss 9.5",
    "step 1, val_loss 9.5",
    "step 1, avg loss 9.5",
    "Epoch 0:  50%|#####     | 2/4 [00:01<00:01, step=1, loss=9.5]",
    "100%|##########| 4/4 [00:02<00:00, 1.52it/s]",
    "LAUNCH INFO 2026-11-22 08:15:00,101 Run Pod: 1, replicas 2, status ready",
    "Epoch [2/10]",
    "acc [0.5]",
    "lr: 0.001 step 1",
]


def test_noise_with_step_and_loss_words_stays_noise(tmp_path):
    """Framework, warning, evaluation and progress-bar lines that name a step and a loss are
    not training steps, in a log whose own step lines are keyed ones."""
    lines = small_log(step="[Train] step: {i}, loss: {loss}, lr: 0.001").splitlines()
    text = "\n".join(lines[:3] + NOISE + lines[3:]) + "\n"
    run = read_log(write(tmp_path, text), accum_steps=2)
    assert_read(run)
    assert run.config["ignored_lines"] == len(NOISE)


@pytest.mark.parametrize(
    "line",
    [
        "step {i} loss: Array({loss}, dtype=float32)",  # JAX
        "{{'step': {i}, 'loss': Array({loss}, dtype=float32), 'lr': Array(0.1, dtype=float32, "
        "weak_type=True)}}",
        "Step {i} loss tf.Tensor({loss}, shape=(), dtype=float32)",  # TF 2 eager, str()
        "Step {i} loss <tf.Tensor: shape=(), dtype=float32, numpy={loss}>",  # repr()
        "step={i} loss.item()={loss} lr=0.1",  # an f-string's `{loss.item()=}`
        "[{i}] learning_rate=0.1, loss={loss}",  # CLU's text writer (Flax's examples)
        "I1130 01:00:00.000000 140123 logging_writer.py:48] [{i}] learning_rate=0.1, loss={loss}",
    ],
)
def test_other_frameworks_scalars_are_read_as_their_value(tmp_path, line):
    """JAX's `Array(...)`, TF's `tf.Tensor(...)` and `<tf.Tensor: ... numpy=...>`, an
    f-string's `loss.item()=`, and CLU's `[step] key=value` lines (absl's prefix or none) were
    refused as holding no step line."""
    text = "".join(line.format(i=i, loss=loss) + "\n" for i, loss in enumerate(LOSSES))
    assert_read(read_log(write(tmp_path, text)))


def test_a_last_line_cut_while_written_is_left_out(tmp_path):
    """A killed run's buffered output ends mid-number: `lr 1.630896e-0` (of `e-04`) was read
    as an lr of 1.63, and a clean pair failed `lr-schedule`. A last line without a line end that
    is shorter than the line before it that begins alike is left out, with a note; a whole last
    line without its line end is read."""
    lines = [f"step {i} loss {loss:.6f} lr {1.6e-4 * (i + 1):.6e}" for i, loss in enumerate(LOSSES)]
    cut = write(tmp_path, "\n".join(lines)[:-2], "cut.log")
    run = read_log(cut)
    assert run.micro_loss.tolist() == LOSSES[:3]
    assert any("its last line (4) has no line end" in note for note in run.notes)
    whole = read_log(write(tmp_path, "\n".join(lines), "whole.log"))
    assert_read(whole)


def test_micro_steps_that_fill_no_last_window_say_how_many_it_holds(tmp_path):
    """A merged log of micro-steps killed inside a window: the refusal said only that the
    micro-steps cannot be split, not what the last window holds."""
    text = "".join(f"step {i} loss {0.5 - 0.01 * i:.4f}\n" for i in range(7))
    with pytest.raises(BadInput, match="the last window holds 3 of 4"):
        read_log(write(tmp_path, text), accum_steps=4)


def test_a_shorter_last_line_is_read_where_the_widths_vary(tmp_path):
    """Losses printed by `repr` vary in width: a whole last line without its line end that is
    shorter than the one before (`0.5` after `0.6276211921800001`) is read, not left out as cut
    (it was, and a log written by `"\\n".join(lines)` lost its last step)."""
    losses = [0.6276211921800001, 1.25, 0.3333333333333333, 0.5]
    text = "\n".join(f"step {i} loss {loss!r}" for i, loss in enumerate(losses))
    run = read_log(write(tmp_path, text))
    assert run.micro_loss.tolist() == losses
    assert not any("no line end" in note for note in run.notes)


def test_a_summarized_paddle_print_formats_only_the_elements_it_shows(monkeypatch):
    """Above 1000 elements Paddle prints three items at each edge of every axis: the simulated
    print formats those alone (formatting every element, three simulated logs took 50 s)."""
    from gradalign.runs.logs import simulate

    calls = []
    real = simulate._paddle_item
    monkeypatch.setattr(simulate, "_paddle_item", lambda *a: calls.append(a) or real(*a))
    text = paddle_str(np.arange(2000, dtype=np.float32) / 8)
    assert text.splitlines()[1:] == [
        "       [0.          , 0.12500000  , 0.25000000  , ..., 249.62500000,",
        "        249.75000000, 249.87500000])",
    ]
    assert len(calls) == 12  # 6 shown, measured for the width, then formatted
    calls.clear()
    grid = paddle_str((np.arange(1600, dtype=np.float32) - 800).reshape(40, 40) / 4)
    assert grid.count("...") == 7 and len(calls) == 2 * 36  # 6 rows x 6 items
    assert "[ 190.        ,  190.25000000,  190.50000000, ...," in grid
