"""Logs printed in other ways, compared (`gradalign compare`): Paddle Tensor logs judged, losses
alone K times the baseline's named, a printed learning rate judged; and logs that cannot be read
as a pair, one line and exit 2 saying why: processes interleaved or untagged in one file, a log
cut off, a resumed run, a log printed every N steps, one line per update or per micro-step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradalign.runs.logs.simulate import HEADER, K, paddle_str, render, steered_probe, train

from .conftest import one_line_error
from .small_logs import GRID, LOSSES, small_log, write


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
