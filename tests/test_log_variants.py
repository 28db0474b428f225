"""Other ways a Paddle script's log gets printed: dygraph Tensors, launcher and logger prefixes,
keyed step lines, other encodings, cut-off and interleaved logs; and noise that must stay noise."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import looks_like_log, read_log
from gradalign.runs.logs.simulate import HEADER, K, paddle_str, render, steered_probe, train

from .conftest import one_line_error

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


@pytest.fixture(scope="module")
def tensor_logs(tmp_path_factory) -> dict[str, Path]:
    """The simulated seed experiment as a dygraph script prints it: Paddle Tensors throughout,
    framework lines at the top and inside arrays."""
    probe = steered_probe()
    runs = {
        "base": (train(probe=probe)[0], 1),
        "merged": (train(k=K, probe=probe)[0], K),
        "step": (train(k=K, step_every_micro=True, probe=probe)[0], K),
    }
    root = tmp_path_factory.mktemp("tensors")
    paths = {}
    for name, (steps, k) in runs.items():
        paths[name] = root / f"{name}.log"
        text = render(steps, k, header=HEADER, loss_format="tensor", noise_every=5)
        paths[name].write_text(text)
    return paths


def judge(cli, tmp_path: Path, *args: str | Path) -> tuple[int, dict]:
    report = tmp_path / "r.json"
    result = cli("compare", *args, "--json", report)
    assert result.code in (0, 1), result.err
    return result.code, json.loads(report.read_text())


def test_paddle_tensor_logs_are_judged(cli, tmp_path, tensor_logs):
    code, data = judge(cli, tmp_path, tensor_logs["base"], tensor_logs["merged"], "-k", str(K))
    assert code == 0
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["weights (printed values only)"] == "pass"
    assert status["no weight change inside a window"] == "pass"
    assert [w["name"] for w in data["per_update"][0]["weights"]] == [
        "printed_weight_0",
        "printed_weight_1",
    ]
    code, data = judge(cli, tmp_path, tensor_logs["base"], tensor_logs["step"], "-k", str(K))
    assert code == 1
    assert [d["code"] for d in data["diagnosis"] if d["severity"] == "error"] == ["step-in-window"]


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


@pytest.mark.parametrize(("scale", "named"), [(2.0, True), (0.5, True), (1.5, False)])
def test_losses_alone_scaled_by_k_are_named(cli, tmp_path, scale, named):
    """Logs of losses alone: a merged run's window losses K (or 1/K) times the baseline's at
    every update are `loss-averaging`, saying the logs cannot tell it from `loss-scale`; another
    ratio names nothing."""
    losses = [1.75, 1.5, 1.25, 1.0]
    base = "".join(f"step {i}, loss: {v}\n" for i, v in enumerate(losses))
    merged = "".join(
        f"step {2 * i + j}, loss: {v * scale}\n" for i, v in enumerate(losses) for j in (0, 1)
    )
    result = cli(
        "compare",
        write(tmp_path, base, "base.log"),
        write(tmp_path, merged, "merged.log"),
        "-k",
        "2",
        "--json",
        tmp_path / "r.json",
    )
    assert result.code == 1
    first = json.loads((tmp_path / "r.json").read_text())["diagnosis"][0]
    assert (first["code"] == "loss-averaging") == named, first
    if named:
        assert "cannot tell" in first["message"]


@pytest.mark.parametrize(
    ("scale", "named"), [(4.0, "their sum"), (0.25, "divided by K again"), (1.5, None)]
)
def test_per_update_losses_a_whole_number_times_the_baseline_are_named(cli, tmp_path, scale, named):
    """A merged log of one loss per update, read with -k 1 (K unknown to the reader): losses a
    whole number of times the baseline's at every update name the K they would be."""
    losses = [1.75, 1.5, 1.25, 1.0]
    base = "".join(f"step {i}, loss: {v}\n" for i, v in enumerate(losses))
    merged = "".join(f"step {i}, loss: {v * scale}\n" for i, v in enumerate(losses))
    b, m = write(tmp_path, base, "base.log"), write(tmp_path, merged, "merged.log")
    code, data = judge(cli, tmp_path, b, m, "-k", "1")
    assert code == 1
    first = data["diagnosis"][0]
    assert (first["code"] == "loss-averaging") == (named is not None), first
    if named:
        assert "read with -k 1" in first["message"] and "K=4" in first["message"]
        assert named in first["message"]


# --- logs that cannot be read: one line, exit 2 ------------------------------------------------


def test_interleaved_processes(cli, tmp_path):
    lines = small_log().splitlines()
    tagged = [f"[rank{r}]: {line}" for line in lines for r in (0, 1)]
    base = write(tmp_path, small_log(), "base.log")
    result = cli("compare", base, write(tmp_path, "\n".join(tagged) + "\n", "both.log"), "-k", "1")
    one_line_error(result, "both.log:2:", "rank0 and rank1 are interleaved")
    doubled = "".join(f"{i}   [{loss}]\n{i}   [{loss / 2}]\n" for i, loss in enumerate(LOSSES))
    result = cli("compare", base, write(tmp_path, doubled, "twice.log"), "-k", "1")
    one_line_error(result, "twice.log: each step is printed on 2 lines", "-k 2", "processes")


def test_a_log_cut_off_inside_an_array(cli, tmp_path):
    text = small_log(weights="------------>{grid}").rstrip("\n")[:-12]
    base = write(tmp_path, small_log(), "base.log")
    result = cli("compare", base, write(tmp_path, text, "killed.log"), "-k", "1")
    one_line_error(result, "killed.log:11:", "not closed before the end of the file", "cut off")
    tensor = "0 " + paddle_str(np.float32(0.5)) + "\n------------>" + paddle_str(GRID)
    result = cli("compare", base, write(tmp_path, tensor[:-20], "killed_tensor.log"), "-k", "1")
    one_line_error(result, "killed_tensor.log:3:", "cut off")


def test_a_merged_log_of_one_line_per_update_is_told_to_use_k_1(cli, tmp_path):
    """A merged log printing one line per update (the window's mean), read with -k K, has 1/K
    of the baseline's updates: refused with the hint, and read with -k 1 it passes."""
    base = write(tmp_path, small_log(step="step {i}, loss: {loss}", weights=""), "base.log")
    merged = write(tmp_path, small_log(step="step {i}, loss: {loss}", weights=""), "merged.log")
    result = cli("compare", base, merged, "-k", "2")
    one_line_error(result, "baseline has 4 updates, merged has 2", "give it -k 1")
    assert cli("compare", base, merged, "-k", "1").code == 0
    other = write(tmp_path, "".join(f"step {i}, loss: 0.5\n" for i in range(6)), "six.log")
    assert "-k 1" not in cli("compare", base, other, "-k", "2").err  # 6 lines: no such hint


@pytest.mark.parametrize(
    ("merged_lr", "code"),
    [
        ("{lr:.6f}", None),  # printed as the baseline prints it
        ("{lr:.3e}", None),  # with fewer digits: equal within the printing
        ("{fast:.6f}", "lr-schedule"),  # the schedule stepped at every micro-step
    ],
)
@pytest.mark.parametrize("key", ["lr: ", "lr(LinearWarmup): "])  # PaddleClas names the schedule
def test_a_printed_learning_rate_is_judged(cli, tmp_path, merged_lr, code, key):
    """Keyed step lines that print the lr beside the loss: the lr of each window's last line is
    the update's, compared within the printing's resolution."""
    lrs = [0.1 * (t + 1) / 8 for t in range(8)]  # warmup over the micro-steps of 4 updates
    losses = [1.75, 1.5, 1.25, 1.0]
    base = "".join(f"step {i}, loss: {v}, {key}{lrs[i]:.6f}\n" for i, v in enumerate(losses))
    merged = "".join(
        f"step {2 * i + j}, loss: {v}, {key}"
        + merged_lr.format(lr=lrs[i], fast=lrs[2 * i + j])
        + "\n"
        for i, v in enumerate(losses)
        for j in (0, 1)
    )
    b, m = write(tmp_path, base, "base.log"), write(tmp_path, merged, "merged.log")
    expected = 0 if code is None else 1
    found, data = judge(cli, tmp_path, b, m, "-k", "2")
    assert found == expected
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["learning rate"] == ("pass" if code is None else "fail")
    if code is not None:
        assert data["diagnosis"][0]["code"] == code


def test_a_resumed_run_is_named_with_the_steps_to_delete(cli, tmp_path):
    """Steps 0..5, then the run resumed from a checkpoint after step 2: steps 3..5 again."""
    first = [f"step {i} loss {0.5 + i / 8}" for i in range(6)]
    again = [f"step {i} loss {0.5 + i / 8}" for i in range(3, 8)]
    base = write(tmp_path, "\n".join(f"step {i} loss {0.5 + i / 8}" for i in range(8)) + "\n")
    text = "\n".join([*first, "resuming from checkpoint-2", *again]) + "\n"
    resumed = write(tmp_path, text, "resumed.log")
    one_line_error(
        cli("compare", str(base), str(resumed)),
        "resumed.log:8: expected step 6, found step 3 again: a run resumed from a checkpoint?",
        "delete the earlier lines of steps 3 to 5; else an evaluation loop",
    )
    restarted = write(tmp_path, "\n".join([*first[:3], *first]) + "\n", "restarted.log")
    one_line_error(cli("compare", str(base), str(restarted)), "a run restarted from step 0")


def test_a_log_printed_every_n_steps_is_told_to_print_every_step(cli, tmp_path):
    """Megatron's default --log-interval 10: the first line is iteration 10, a mean over ten."""
    lines = [f" iteration {10 * i:8d}/     100 | lm loss: {2.0 - i / 10:.6E} |" for i in (1, 2, 3)]
    log = write(tmp_path, "\n".join(lines) + "\n", "every10.log")
    one_line_error(
        cli("compare", log, write(tmp_path, log.read_text(), "other.log"), "-k", "1"),
        "every10.log:1: the first step is 10; expected 0 or 1 (a log printed every 10 steps?",
        "--log-interval 1",
    )


def test_two_untagged_processes_in_one_log_are_suspected(cli, tmp_path):
    """Two ranks printing untagged into one file: each step on two lines. Read as two micro-steps
    each, the run is twice as long as the baseline: the message says what it may be."""
    base = write(tmp_path, "".join(f"step {i} loss {0.5 + i / 8}\n" for i in range(4)), "b.log")
    lines = [f"step {m} loss {0.5 + m / 16 + r / 64}" for m in range(8) for r in (0, 1)]
    both = write(tmp_path, "\n".join(lines) + "\n", "both.log")
    one_line_error(
        cli("compare", base, both, "-k", "2"),
        "baseline has 4 updates, merged has 8",
        "each step on 2 lines, read as 2 micro-steps each: if 2 processes print into one log",
    )


def test_a_merged_log_of_one_line_per_micro_step_is_told_its_k(cli, tmp_path):
    """A merged log printing every micro-step, read with -k 1, is K times the baseline's length:
    refused with the -k that reads it (the reverse of the -k 1 hint)."""
    base = write(tmp_path, small_log(step="step {i}, loss: {loss}", weights=""), "base.log")
    micro = "".join(f"step {m}, loss: {LOSSES[m // 2]}\n" for m in range(8))
    merged = write(tmp_path, micro, "micro.log")
    one_line_error(
        cli("compare", base, merged, "-k", "1"),
        "baseline has 4 updates, merged has 8",
        "8 step lines, 2 times the baseline's updates: if it prints one line per micro-step, "
        "read it with -k 2",
    )
    six = write(tmp_path, "".join(micro.splitlines(keepends=True)[:6]), "six.log")
    assert "read it with -k" not in cli("compare", base, six, "-k", "1").err  # 1.5 times


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
