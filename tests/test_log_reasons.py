"""Logs as they come out of real runs, read or refused with the reason: open_clip's sample
counter from one batch, detectron2's medians (read, with a note), a Python warning glued after a
step line, a step whose loss is no number, per-epoch summary tables, compressed and empty
files, a step count incremented before the window's last line, lines printed twice from
mid-run, interleaved ranks, infinite losses."""

from __future__ import annotations

import gzip
import warnings

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import read_log

from .conftest import one_line_error, refused_pair, write_log

LOSSES = [2.3026 - 0.0123 * i + 0.004 * (-1) ** i for i in range(16)]


def _open_clip(losses: list[float], batch: int = 32, percent: bool = True) -> list[str]:
    """open_clip's `train_one_epoch`: the samples seen after each step, from one batch."""
    total = batch * len(losses)
    share = lambda i: f" ({100 * (i + 1) * batch // total:>2d}%)" if percent else ""  # noqa: E731
    return [
        f"2026-11-30,06:00:0{i % 10} | INFO | Train Epoch: 0 [{(i + 1) * batch:>5d}/{total}"
        f"{share(i)}] Data (t): 0.012 Batch (t): 0.123, 260.2/s LR: 0.060000 Logit Scale: "
        f"14.286 Contrastive_loss: {v:.4f} ({v:.4f}) Loss: {v:.4f} ({v:.4f})"
        for i, v in enumerate(losses)
    ]


def test_open_clips_sample_counter_from_one_batch_is_read_as_steps(tmp_path):
    run = read_log(write_log(tmp_path, "clip.log", _open_clip(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=6e-5)
    assert any("starts at 32" in note for note in run.notes)


def test_a_counter_from_its_stride_without_a_share_is_still_an_interval(tmp_path):
    with pytest.raises(BadInput, match="the first step is 32"):
        read_log(write_log(tmp_path, "clip.log", _open_clip(LOSSES, percent=False)))


def test_a_line_per_epoch_at_its_end_is_refused_saying_so(cli, tmp_path):
    lines = []
    for epoch, v in enumerate(LOSSES[:3]):
        lines += [f"Epoch {epoch + 1}/3", f"20/20 - 1s - 12ms/step - loss: {v:.4f}"]
    refused_pair(cli, tmp_path, lines, "the first step is 20 of 20: a line per epoch")


def test_a_logger_interval_longer_than_the_epoch_is_refused_with_its_options(cli, tmp_path):
    """MMEngine at its default interval of 10 over epochs of 8 iterations prints each epoch's
    last one, its loss a window mean: refused naming the logger's options, not Keras's alone."""
    lines = [
        f"05/10 10:00:08 - mmengine - INFO - Epoch(train) [{epoch + 1}][8/8]  lr: 6.3779e-02  "
        f"eta: 0:00:01  time: 0.0123  data_time: 0.0012  memory: 123  loss: {v:.4f}"
        for epoch, v in enumerate(LOSSES[:3])
    ]
    refused_pair(cli, tmp_path, lines, "the first step is 8 of 8", "interval=1 and window_size=1")


def _ppdet(epochs: list[list[int]], total: int) -> list[str]:
    """PaddleDetection's step lines: each epoch's printed iterations."""
    values = iter(LOSSES)
    return [
        f"[05/10 10:00:01] ppdet.engine INFO: Epoch: [{e}] [{i:>2d}/{total}] learning_rate: "
        f"0.100000 loss: {next(values):.6f} eta: 0:00:32 batch_cost: 0.1234 data_cost: 0.0012 "
        "ips: 518.4447 images/s"
        for e, printed in enumerate(epochs)
        for i in printed
    ]


def test_epochs_shorter_than_the_logger_interval_are_refused(cli, tmp_path):
    """PaddleDetection at its default log_iter of 20 over epochs of 8 iterations prints each
    epoch's first only: read as consecutive steps they stood an epoch apart; refused naming
    log_iter. Epochs of one step each, and epochs printed whole, are read."""
    refused_pair(
        cli,
        tmp_path,
        _ppdet([[0]] * 4, 8),
        "epoch 0 printed only its first step ([0/8])",
        "PaddleDetection's log_iter: 1",
    )
    for epochs, total in (([[0]] * 4, 1), ([[0, 1, 2]] * 3, 3)):
        lines = _ppdet(epochs, total)
        base, merged = write_log(tmp_path, "b.log", lines), write_log(tmp_path, "m.log", lines)
        result = cli("compare", base, merged)
        assert result.code == 0, result.out + result.err


def test_a_loss_named_with_a_qualifier_is_named_in_the_refusal(cli, tmp_path):
    """litgpt prints `loss train:`, a running mean over the window's iterations: not read,
    and the refusal names the field it saw."""
    lines = [
        f"Epoch 1 | iter {i + 1} step {i + 1} | loss train: {v:.3f}, val: n/a | iter time: "
        "12.34 ms (step)"
        for i, v in enumerate(LOSSES)
    ]
    refused_pair(cli, tmp_path, lines, "its lines print `loss train` beside a step")


def test_detectron2s_medians_are_read_with_a_note(tmp_path):
    lines = [
        f"[11/30 06:00:00 d2.utils.events]:  eta: 0:00:05  iter: {i}  total_loss: {v:.4g}  "
        f"loss: {v:.4g}    time: 0.0412  data_time: 0.0011   lr: 0.06  max_mem: 1234M"
        for i, v in enumerate(LOSSES)
    ]
    run = read_log(write_log(tmp_path, "d2.log", lines))
    assert any("median over the last window_size" in note for note in run.notes)


@pytest.mark.parametrize(
    "line",
    [
        '{{"step": {i}, "loss": null, "lr": 0.1}}',
        '{{"step": {i}, "loss": "abc"}}',
        "step {i} loss None",
        "step {i} loss 1.#QNAN",
        "step {i} loss -",
    ],
)
@pytest.mark.parametrize("at", [1, 7])
def test_a_step_whose_loss_is_no_number_is_named(cli, tmp_path, line, at):
    """A step line whose loss is no number the reader knows is noise, and the gap it left was
    refused as "step 7 is not in the log (a line lost...)" (at step 1: "printed every 2
    steps"): the refusal names the line that printed it."""
    good = '{{"step": {i}, "loss": {v}}}' if line.startswith("{{") else "step {i} loss {v}"
    lines = [(line if i == at else good).format(i=i, v=v) for i, v in enumerate(LOSSES[:10])]
    refused_pair(cli, tmp_path, lines, f"line {at + 1} names step {at} but no loss was read")


def test_a_log_printed_at_step_1_and_every_10_after_it_is_refused_saying_so(cli, tmp_path):
    """torchtitan's default log_freq of 10 prints steps 1, 10, 20: refused as "printed every 9
    steps", with no word of the option that prints every step."""
    lines = [f"step: {i:2d}  loss: {LOSSES[i % 16]:7.4f}  memory: 1.2GiB" for i in (1, 10, 20)]
    found = "or at step 1 and then every 10 as torchtitan prints"
    refused_pair(cli, tmp_path, lines, found, "torchtitan's --metrics.log_freq 1")


def test_a_warning_glued_after_a_step_line_is_named(cli, tmp_path):
    lines = [f"step {i} loss {v:.6f} lr 2.0e-01" for i, v in enumerate(LOSSES)]
    lines[5] += (
        "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:617: UserWarning: "
        "This DataLoader will create 4 worker processes in total."
    )
    found = "expected step 5, found step 6"
    refused_pair(cli, tmp_path, lines, found, "line 6 has a Python warning")


@pytest.mark.parametrize(
    "header", ["epoch,train_loss,eval_loss,lr", "epoch,train_loss,valid_loss,accuracy"]
)
def test_one_record_per_epoch_is_refused(cli, tmp_path, header):
    rows = [f"{e},{v},{v + 0.05},0.5" for e, v in enumerate(LOSSES[:4])]
    refused_pair(cli, tmp_path, [header, *rows], "epochs 0 and 1 and no step", "epoch's mean")


def test_records_of_steps_within_an_epoch_are_still_read(tmp_path):
    rows = [f"0,{v}" for v in LOSSES]  # the epoch repeats: records are steps
    run = read_log(write_log(tmp_path, "steps.csv", ["epoch,loss", *rows]))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)


def test_a_compressed_or_empty_log_is_refused_saying_so(cli, tmp_path):
    text = "".join(f"step {i} loss {v:.6f}\n" for i, v in enumerate(LOSSES))
    packed = tmp_path / "base.log.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    plain = write_log(tmp_path, "plain.log", text.splitlines())
    one_line_error(cli("compare", str(packed), str(plain)), "gzip-compressed", "gunzip -k")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    one_line_error(cli("compare", str(plain), str(empty)), "empty.log: the file is empty")


def test_a_count_incremented_before_the_last_micro_steps_line_is_named(cli, tmp_path):
    k, step, lines = 4, 0, []
    for micro, v in enumerate(LOSSES):
        if micro % k == k - 1:
            step += 1  # the optimizer step counted before the window's last line
        lines.append(f"step {step} loss {v:.6f}")
    base = write_log(tmp_path, "base.log", [f"step {i} loss {v:.6f}" for i, v in enumerate(LOSSES)])
    merged = write_log(tmp_path, "merged.log", lines)
    result = cli("compare", str(base), str(merged), "-k", str(k))
    one_line_error(result, "first step on 3 lines and the next on 4", "before incrementing it")


def test_lines_printed_twice_from_mid_run_are_named(cli, tmp_path):
    lines = [f"step {i} loss {v:.6f}" for i, v in enumerate(LOSSES)]
    doubled = lines[:6] + [line for line in lines[6:] for _ in range(2)]
    refused_pair(cli, tmp_path, doubled, "from line 7 on each step line is printed 2 times")


def test_interleaved_ranks_say_to_compare_card_by_card(cli, tmp_path):
    lines = [f"[rank{r}]: step {i} loss {v:.6f}" for i, v in enumerate(LOSSES) for r in (0, 1)]
    refused_pair(cli, tmp_path, lines, "interleaved", "compare card by card")


def test_infinite_losses_are_read_without_numpy_warnings(cli, tmp_path):
    values = [*LOSSES[:10], float("inf"), float("inf"), *LOSSES[12:]]
    lines = [
        f'{{"step": {i}, "loss": {"Infinity" if v == float("inf") else v}}}'
        for i, v in enumerate(values)
    ]
    base, merged = write_log(tmp_path, "base.log", lines), write_log(tmp_path, "merged.log", lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert cli("compare", str(base), str(merged)).code == 0


@pytest.mark.parametrize(
    "line",
    [
        "step 1" + "0" * 5000 + ", loss: 1.0",
        "Epoch: [0] [1/2] lr: 1.0e-02 loss: 1.0 bsz " + "9" * 5000,
    ],
)
def test_a_step_or_count_of_thousands_of_digits_is_bad_input(cli, tmp_path, line):
    """Python reads at most 4300 digits into an int: exit 3, internal error, a ValueError."""
    lines = [f"step {i}, loss: {v:.4f}" for i, v in enumerate(LOSSES)] + [line]
    refused_pair(cli, tmp_path, lines, "printed with", "digits cannot be read")


@pytest.mark.parametrize(
    ("encoding", "said"),
    [("gbk", "it reads as GBK"), ("utf-16-le", "UTF-16-LE without a byte-order mark")],
)
def test_a_log_in_another_encoding_is_refused_naming_it(cli, tmp_path, encoding, said):
    """A Chinese Windows console writes GBK, PowerShell's redirection UTF-16: the same text in
    UTF-8 is read (full-width punctuation too); in these it got the generic 'no step line'."""
    text = "".join(f"训练 step: {i}，loss：{v:.4f}\n" for i, v in enumerate(LOSSES))
    for name in ("base.log", "merged.log"):
        (tmp_path / name).write_bytes(text.encode(encoding))
    one_line_error(cli("compare", tmp_path / "base.log", tmp_path / "merged.log"), said, "iconv")
    (tmp_path / "base.log").write_text(text, encoding="utf-8")
    assert read_log(tmp_path / "base.log").micro_loss.size == len(LOSSES)


def test_the_last_micro_batchs_loss_divided_by_k_printed_per_update_is_named(cli, tmp_path):
    """`loss = loss / K; loss.backward(); ... if (step + 1) % K == 0: print(loss)`: each line
    holds the window's last micro-batch's loss over K, a quarter of the window's mean scattered
    as one micro-batch scatters about it. It was `unexplained`."""
    base = write_log(
        tmp_path, "base.log", [f"step {i}, loss: {v:.6f}" for i, v in enumerate(LOSSES)]
    )
    scattered = [v * (1 + 0.15 * (-1) ** i + 0.05 * (i % 3)) / 4 for i, v in enumerate(LOSSES)]
    lines = [f"step {i}, loss: {v:.6f}" for i, v in enumerate(scattered)]
    result = cli("compare", base, write_log(tmp_path, "merged.log", lines))
    assert result.code == 1
    assert "loss-averaging:" in result.out and "one micro-batch's loss divided by K" in result.out


def test_a_binary_record_file_is_refused_as_binary(cli, tmp_path):
    """A VisualDL or TensorBoard event file got the generic 'no step line'."""
    for name in ("base.log", "merged.log"):
        (tmp_path / name).write_bytes(
            b"\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7fbrain.Event:2\x00" * 4
        )
    one_line_error(cli("compare", tmp_path / "base.log", tmp_path / "merged.log"), "a binary file")


def _every_20th(losses: list[float], iterations: int) -> list[str]:
    """PaddleDetection's line at its default log_iter 20: `[ 20/600]` counts iterations."""
    return [
        f"[03/14 10:00:00] ppdet.engine INFO: Epoch: [0] [{20 * i:>4d}/{iterations}] "
        f"learning_rate: 0.010000 loss: {v:.6f} eta: 0:10:00 batch_cost: 0.1234"
        for i, v in enumerate(losses)
    ]


def test_counters_of_iterations_printed_every_20th_are_refused(cli, tmp_path):
    """A counter striding by 20 is read as samples (the PyTorch examples' `[640/60000]`); the
    baseline's counting to 600 and the merged run's to 2400 (K times the micro-steps) count
    iterations, printed every 20th: the windows paired unrelated lines and a right run failed
    `unexplained`. Refused, naming PaddleDetection's log_iter; samples counted to one total in
    both logs are still read as samples."""
    base = write_log(tmp_path, "base.log", _every_20th(LOSSES[:4], 600))
    merged = write_log(tmp_path, "merged.log", _every_20th(LOSSES, 2400))
    one_line_error(
        cli("compare", base, merged, "-k", "4"),
        "step counters advance by 20 out of 600 and 20 out of 2400 a line",
        "count iterations",
        "PaddleDetection's log_iter: 1",
    )
    samples = [line.replace("/2400]", "/600]") for line in _every_20th(LOSSES, 2400)]
    alike = write_log(tmp_path, "alike.log", samples)
    assert cli("compare", base, alike, "-k", "4").code in (0, 1)


def test_paddleseg_printed_every_ten_iterations_is_told_its_own_option(cli, tmp_path):
    """PaddleSeg's train.py prints every --log_iters iterations (10 by default), each line's loss
    a mean over them: refused, naming its option beside the other frameworks'."""
    lines = [
        f"2024-05-10 10:00:{i:02d} [INFO]\t[TRAIN] epoch: 1, iter: {10 * (i + 1)}/160, "
        f"loss: {v:.4f}, lr: 0.010000, batch_cost: 0.1000, reader_cost: 0.01000, "
        "ips: 640.0000 samples/sec | ETA 00:00:15"
        for i, v in enumerate(LOSSES[:6])
    ]
    refused_pair(cli, tmp_path, lines, "the first step is 10", "PaddleSeg's --log_iters 1")
