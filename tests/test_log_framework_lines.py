"""Step lines as more frameworks print them: timm's epoch before its counter, fairseq's epoch
summary after its steps, GPT-NeoX's `lm_loss`, a `train/learning_rate` column, Keras 3's and
rich's `━━━` bars, records without a step number; and refusals that name what they saw (C++
glog lines, a loss and a step never on one line)."""

from __future__ import annotations

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import read_log

from .conftest import refused_pair, write_log

LOSSES = [2.303, 2.297, 2.289, 2.258, 2.226, 2.18, 2.151, 2.12]


def _timm(losses: list[float], per_epoch: int = 4) -> list[str]:
    """timm's train.py: `Train: EPOCH [ INDEX/UPDATES (PCT%)]  Loss: VAL (AVG)`, INDEX from 0 in
    each epoch."""
    return [
        f"Train: {i // per_epoch} [{i % per_epoch:>4d}/{per_epoch} "
        f"({100 * (i % per_epoch + 1) / per_epoch:>3.0f}%)]  Loss: {v:#.4g} ({v:#.4g})  "
        "Time: 0.105s,  304.76/s  LR: 1.000e-01  Data: 0.010 (0.010)"
        for i, v in enumerate(losses)
    ]


def test_timm_epochs_are_read_from_the_number_before_the_counter(tmp_path):
    run = read_log(write_log(tmp_path, "timm.log", _timm(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)


def test_timm_epochs_shorter_than_the_log_interval(tmp_path, cli):
    """timm at --log-interval 50 over epochs of 8 updates prints `[0/8]` and `[7/8]` of each:
    each line is one step, and the note says which lines those are (it said the counter
    advanced by 7 a line, read as samples)."""
    per_epoch, losses = 8, [2.3 * 0.97**i for i in range(32)]
    printed = [v for i, v in enumerate(losses) if i % per_epoch in (0, per_epoch - 1)]
    lines = [
        line
        for line in _timm(losses, per_epoch)
        if "/8 " in line and (" 0/" in line or " 7/" in line)
    ]
    assert len(lines) == len(printed) == 8
    run = read_log(write_log(tmp_path, "timm.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(printed, rel=1e-3)  # printed #.4g
    assert any("the first and last of each epoch" in note for note in run.notes)
    assert not any("advances by" in note for note in run.notes)
    # a clean pair passes; a merged run off from its third printed line fails
    base = write_log(tmp_path, "base.log", lines)
    same = cli("compare", base, write_log(tmp_path, "same.log", lines))
    assert same.code == 0, same.out
    off = lines[:2] + [line.replace("Loss: ", "Loss: 9") for line in lines[2:]]
    assert cli("compare", base, write_log(tmp_path, "off.log", off)).code == 1


def test_a_restart_without_an_epoch_is_still_refused(tmp_path):
    lines = [line.replace("Train: 1 ", "Train ") for line in _timm(LOSSES)]
    with pytest.raises(BadInput, match="expected step 4, found step 0 again"):
        read_log(write_log(tmp_path, "timm.log", lines))


def _fairseq(losses: list[float], per_epoch: int = 4) -> list[str]:
    """fairseq's simple format: each update's `train_inner` line, then after each epoch its
    `valid` and `train` summaries, the latter repeating the epoch's last `num_updates`."""
    lines = []
    for i, v in enumerate(losses):
        epoch, u = 1 + i // per_epoch, i + 1
        lines.append(
            f"2026-11-30 06:00:0{u % 10} | INFO | train_inner | epoch {epoch:03d}:      "
            f"{u - (epoch - 1) * per_epoch} / {per_epoch} loss={v:.3f}, nll_loss=2.1, ppl=4.5, "
            f"wps=1000.5, ups=8.1, wpb=1024, bsz=32, num_updates={u}, lr=0.0005, gnorm=0.812"
        )
        if u % per_epoch == 0:
            lines.append(
                f"2026-11-30 06:00:09 | INFO | train | epoch {epoch:03d} | loss 2.259 | "
                f"nll_loss 2.1 | ppl 4.5 | wps 1050.2 | ups 8.2 | wpb 1024 | bsz 32 | "
                f"num_updates {u} | lr 0.0005 | gnorm 0.8 | train_wall 1 | wall 9"
            )
    return lines


def test_fairseqs_epoch_summaries_are_read_as_summaries(tmp_path):
    run = read_log(write_log(tmp_path, "fairseq.log", _fairseq(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)
    assert any("lines 5, 10 print a step again in another shape" in n for n in run.notes)


def test_a_step_printed_again_in_its_own_shape_is_still_uneven(tmp_path):
    """Only a line of another shape is a summary: the same line once more is a micro-step or
    a second process, and an uneven count of those is refused as before."""
    lines = _fairseq(LOSSES)
    lines[4] = lines[3]  # the summary replaced by a second copy of the step's own line
    with pytest.raises(BadInput, match="the steps repeat unevenly"):
        read_log(write_log(tmp_path, "fairseq.log", lines))


def test_a_summary_does_not_hide_a_broken_run(cli, tmp_path):
    base = write_log(tmp_path, "base.log", _fairseq(LOSSES))
    merged = write_log(tmp_path, "merged.log", _fairseq(LOSSES))
    broken = write_log(tmp_path, "broken.log", _fairseq([v * 1.03 for v in LOSSES]))
    assert cli("compare", str(base), str(merged)).code == 0
    assert cli("compare", str(base), str(broken)).code == 1


def _neox(losses: list[float], name: str) -> list[str]:
    return [
        f" samples/sec: 266.667 | iteration {i:8d}/{len(losses):8d} | learning rate: 6.000E-05 "
        f"| {name}: {v:.6E} | loss scale: 65536.0 | number of skipped iterations:   0 |"
        for i, v in enumerate(losses, 1)
    ]


def test_a_loss_named_by_joined_words_is_read_where_it_is_the_only_one(tmp_path):
    """GPT-NeoX prints `lm_loss: 2.3E+00`, as Megatron-LM prints `lm loss: 2.3E+00`."""
    run = read_log(write_log(tmp_path, "neox.log", _neox(LOSSES, "lm_loss")))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)


@pytest.mark.parametrize("names", ["ce_loss: {v} | kd_loss: 0.5", "dev_loss: {v}"])
def test_joined_components_or_other_quantities_stay_unread(tmp_path, names):
    lines = [f"step {i} | " + names.format(v=v) for i, v in enumerate(LOSSES)]
    with pytest.raises(BadInput, match=r"no step lines|neither a gradalign run"):
        read_log(write_log(tmp_path, "train.log", lines))


def test_a_train_slash_learning_rate_column_is_the_lr(tmp_path):
    """W&B's and TensorBoard's name for the Trainer's lr; `train/loss` beside it is read."""
    header = "_step,train/loss,train/grad_norm,train/learning_rate,train/global_step"
    rows = [f"{i},{v},0.83,{5e-05 * (1 - i / 10)},{i + 1}" for i, v in enumerate(LOSSES)]
    run = read_log(write_log(tmp_path, "history.csv", [header, *rows]))
    assert run.lr is not None
    assert run.lr.tolist() == pytest.approx([5e-05 * (1 - i / 10) for i in range(len(LOSSES))])


@pytest.mark.parametrize("bar", ["━━━━━━━━━━━━━━━━━━━━", "━━━━━━━━━━╸━━━━━━━━━"])
def test_keras_3s_bar_is_a_progress_bar_not_a_step(cli, tmp_path, bar):
    """Its `loss` is the epoch's running mean: read as each step's, it would be misread."""
    lines = [f"{i}/8 {bar} 0s 10ms/step - loss: {v:.4f}" for i, v in enumerate(LOSSES, 1)]
    refused_pair(cli, tmp_path, ["Epoch 1/1", *lines], "its progress bars are not read")


def test_records_without_a_step_say_how_they_were_numbered(tmp_path):
    lines = [f"{{'loss': {v}, 'learning_rate': 5e-05, 'epoch': {i / 6:.4f}}}" for i, v in
             enumerate(LOSSES)]  # fmt: skip
    run = read_log(write_log(tmp_path, "hf.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)
    assert any("print no step number" in note and "logging_steps" in note for note in run.notes)
    numbered = read_log(write_log(tmp_path, "numbered.log", [f"step {i}, loss: {v}" for i, v in
                                                          enumerate(LOSSES)]))  # fmt: skip
    assert not any("print no step number" in note for note in numbered.notes)


def test_a_log_of_cpp_glog_lines_is_refused_saying_so(cli, tmp_path):
    """Caffe's solver prints its steps through glog from C++: the reader leaves such lines as a
    framework's own messages (Paddle's executor prints them too), and says so."""
    lines = [
        f"I1130 06:00:0{i}.123456 12345 solver.cpp:218] Iteration {i} (8.1 iter/s), loss = {v}"
        for i, v in enumerate(LOSSES)
    ]
    refused_pair(cli, tmp_path, lines, "only on glog lines from C++", "sed -E")


def test_a_loss_and_a_step_never_on_one_line_is_refused_saying_so(cli, tmp_path):
    lines = []
    for i, v in enumerate(LOSSES, 1):
        lines += [f"Training finished iteration {i}", "| Training result |", f"| loss {v} |"]
    refused_pair(cli, tmp_path, lines, "never on one line")


@pytest.mark.parametrize(
    "line",
    [
        "step={i}|loss={v}|lr=0.1",  # fields joined by `|` or `;` without spaces
        "step={i};loss={v};lr=0.1",
        "epoch: 0, step: {i}，loss：{v}，lr：0.1",  # full-width punctuation
        "【Train】epoch：0，step：{i}，loss：{v}",
    ],
)
def test_fields_joined_without_spaces_or_by_full_width_punctuation(tmp_path, line):
    lines = [line.format(i=i, v=v) for i, v in enumerate(LOSSES)]
    run = read_log(write_log(tmp_path, "train.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)


def _two_printers(losses: list[float], megatron_losses: list[float] | None = None) -> list[str]:
    """Megatron-DeepSpeed with pipeline parallelism: DeepSpeed's `steps: N loss: X` line and
    Megatron's `iteration N/ M | ... lm loss: X |` line for each iteration."""
    lines = []
    for it, (v, w) in enumerate(zip(losses, megatron_losses or losses, strict=True), 1):
        lines.append(f"steps: {it} loss: {v:.4f} iter time (s): 0.120 samples/sec: 266.667")
        lines.append(
            f" iteration {it:9d}/{len(losses):9d} | consumed samples: {it * 32:12d} | "
            f"learning rate: 6.000E-05 | global batch size:    32 | lm loss: {w:.6E} | "
            "loss scale: 4096.0 | grad norm: 0.831 |"
        )
    return lines


def test_two_printers_of_each_step_are_read_as_one_step(tmp_path):
    precise = [v + 1.234e-5 for v in LOSSES]
    run = read_log(write_log(tmp_path, "two.log", _two_printers(precise)))
    assert run.micro_loss.tolist() == pytest.approx(precise, abs=6e-7)  # Megatron's 7 digits
    assert run.lr.tolist() == pytest.approx([6e-5] * len(LOSSES))
    assert any("printed by 2 printers" in note for note in run.notes)


def test_two_printers_still_tell_a_broken_run(cli, tmp_path):
    base = write_log(tmp_path, "base.log", _two_printers(LOSSES))
    broken = [v * 1.01 for v in LOSSES]
    merged = write_log(tmp_path, "merged.log", _two_printers(broken))
    assert cli("compare", str(base), str(merged)).code == 1


def test_two_printers_of_other_numbers_are_stillrefused_pair(cli, tmp_path):
    means = [sum(LOSSES[: i + 1]) / (i + 1) for i in range(len(LOSSES))]  # a running mean
    refused_pair(cli, tmp_path, _two_printers(LOSSES, means), "2 printers", "other losses")


@pytest.mark.parametrize("record_first", [False, True])
def test_a_step_line_and_a_record_without_a_step_are_two_printers_of_one_step(
    tmp_path, record_first
):
    """A loop printing `step N loss X` and then the Trainer-style dict of the same step, which
    names no step: the record was read as the next step, one step late (13 steps of 12, each
    step line after it taken for a summary, the losses read at the record's 4 digits)."""
    precise = [v + 1.234e-5 for v in LOSSES]
    lines = []
    for i, v in enumerate(precise):
        pair = [f"step {i} loss {v:.8f}", repr({"loss": round(v, 4), "learning_rate": 1e-3})]
        lines += pair[::-1] if record_first else pair
    run = read_log(write_log(tmp_path, "two.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(precise, abs=1e-8)  # the step lines' digits
    assert any("printed by 2 printers" in note for note in run.notes)
    assert not any("print no step number" in note for note in run.notes)


def _composer(losses: list[float], split: str = "train") -> list[str]:
    """Composer's FileLogger: one metric per line, `[metric][batch=N]: <name>: <value>`, the
    step's loss as `loss/train/total` (the sum of its parts), the lr on a line of its own."""
    lines = []
    for i, v in enumerate(losses):
        lines += [
            f"[metric][batch={i}]: time/batch: {i}",
            f"[metric][batch={i}]: loss/{split}/total: {v:.4f}",
            f"[metric][batch={i}]: lr-DecoupledSGDW/group0: 0.1000",
        ]
    return lines


def test_composers_loss_train_total_is_the_steps_loss(tmp_path):
    """`loss/train/total` is Composer's only name for the step's loss: it was refused as "a
    total beside its parts" where no part was printed. An evaluation's `loss/val/total` is no
    training loss."""
    run = read_log(write_log(tmp_path, "composer.log", _composer(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-5)
    with pytest.raises(BadInput, match="no step line"):
        read_log(write_log(tmp_path, "val.log", _composer(LOSSES, "val")))


def _composer_console(losses: list[float], per_epoch: int = 4, indent: str = "\t ") -> list[str]:
    """Composer's ConsoleLogger: a header `[epoch=E][batch=B/N]:` (the batch counted in its
    epoch), then one indented `Train <name>: <value>` line per metric; an evaluation's progress
    lines between epochs."""
    lines = ["*" * 30, "Config:", "node_name: unknown", "*" * 30]
    for i, v in enumerate(losses):
        epoch, batch = divmod(i, per_epoch)
        lines.append(f"[epoch={epoch + 1}][batch={batch + 1}/{per_epoch}]:")
        for name, value in (("time/batch", i), ("loss/train/total", f"{v:.4f}")):
            lines.append(f"{indent}Train {name}: {value}")
        if batch == per_epoch - 1:
            lines += ["[Eval batch=1/1] Eval on eval data:", f"{indent}Eval metrics/eval/Acc: 0.5"]
    return lines


def test_composers_console_logger_is_read_one_record_per_header(tmp_path):
    """The ConsoleLogger prints a record's fields one per line under its header: refused as "a
    step and a loss never on one line"; read now as the header's record, across epochs. Lines
    that are not indented under a header stay lines of their own."""
    run = read_log(write_log(tmp_path, "console.log", _composer_console(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-5)
    with pytest.raises(BadInput, match="not a training log"):
        read_log(write_log(tmp_path, "flat.log", _composer_console(LOSSES, indent="")))


def _olmo(losses: list[float], core: bool = True, z_loss: bool = False) -> list[str]:
    """OLMo's console: a logger's prefix and a header `[step=S/N,epoch=E,eta=..]` (OLMo-core) or
    `[step=S/N]` (OLMo), then one indented `name=value` line per metric (thousands grouped by
    commas); OLMo names the loss `train/CrossEntropyLoss`, OLMo-core `train/CE loss`."""
    lines = []
    for i, v in enumerate(losses, start=1):
        prefix = "2026-11-29 10:00:00.000\tnode-07:0\tolmo.train:967\tINFO\t"
        if core:
            lines.append(f"{prefix}[step={i}/{len(losses)},epoch=0,eta=1h2m]")
            names = ["train/CE loss", "train/PPL", "throughput/total tokens"]
        else:
            lines.append(f"{prefix}[step={i}/739328]")
            names = ["train/CrossEntropyLoss", "train/Perplexity", "throughput/total_tokens"]
        values = [f"{v:.4f}", f"{10 * v:.2f}", f"{4096 * i:,d}"]
        if z_loss:
            names, values = (
                [*names, "train/ZLoss" if not core else "train/Z loss"],
                [*values, "0.1"],
            )
        lines += [f"    {name}={value}" for name, value in zip(names, values, strict=True)]
        lines.append("    optim/LR (group 0)=1.0E-03" if core else "    optim/learning_rate=0.001")
    return lines


@pytest.mark.parametrize("core", [True, False])
def test_olmos_records_of_one_field_per_line_are_read(tmp_path, core):
    """OLMo prints each step's metrics one `name=value` per indented line under a bracketed
    header without a colon, after its logger's prefix: refused as "a loss and a step never on
    one line" (a step and a loss, whatever its name); read now, a loss named in CamelCase
    (`train/CrossEntropyLoss`) too. A z-loss beside it is another quantity; lines not
    indented stay lines of their own."""
    run = read_log(write_log(tmp_path, "olmo.log", _olmo(LOSSES, core)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-5)
    run = read_log(write_log(tmp_path, "olmo_z.log", _olmo(LOSSES, core, z_loss=True)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-5)
    flat = [line.lstrip() for line in _olmo(LOSSES, core)]
    with pytest.raises(BadInput, match="not a training log"):
        read_log(write_log(tmp_path, "flat.log", flat))


def _tf_guide(losses: list[float], per_epoch: int = 4) -> list[str]:
    """The TensorFlow guide's custom training loop: the loss named before its step, the step
    counted from 0 in each epoch, after a line announcing the epoch."""
    lines = []
    for i, v in enumerate(losses):
        if i % per_epoch == 0:
            lines.append(f"Start of epoch {i // per_epoch}")
        lines.append(f"Training loss (for one batch) at step {i % per_epoch}: {v:.4f}")
        lines.append(f"Seen so far: {(i % per_epoch + 1) * 32} samples")
    return lines


def test_a_loss_named_before_its_step_is_read(tmp_path):
    """`Training loss (for one batch) at step 3: 2.29` was refused as no step line; its steps
    restart after `Start of epoch 1`, as after `Epoch 2/10`. A validation loss so printed is
    no training loss."""
    run = read_log(write_log(tmp_path, "tf.log", _tf_guide(LOSSES)))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-5)
    val = [line.replace("Training", "Validation") for line in _tf_guide(LOSSES)]
    with pytest.raises(BadInput, match="no step line"):
        read_log(write_log(tmp_path, "val.log", val))


def test_a_bracketed_epoch_and_step_before_the_loss_is_read(tmp_path):
    """PyTorch's CIFAR tutorial (and DeepSpeed's copy of it) prints `[1,     3] loss: 2.297`,
    the epoch and the step within it from 1, every step where its interval is 1: it was
    refused as a loss beside no step number."""
    lines = [f"[{1 + i // 4}, {1 + i % 4:5d}] loss: {v:.3f}" for i, v in enumerate(LOSSES)]
    run = read_log(write_log(tmp_path, "cifar.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES, abs=5e-4)


def test_accelerates_completed_steps_is_a_step_key(tmp_path):
    """accelerate's no_trainer examples count updates in `completed_steps`: a line printing it
    beside the loss was refused, "no step number the reader knows" (a cold probe)."""
    lines = [f"completed_steps {i} loss {v}" for i, v in enumerate(LOSSES)]
    run = read_log(write_log(tmp_path, "accelerate.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)


def test_a_chinese_epoch_key_restarts_the_step_count(tmp_path):
    """`轮次：1，step：0，loss：…` (epoch as a Chinese log names it, full-width punctuation): the
    count restarting with the epoch was refused, "expected step 4, found step 0 again"."""
    lines = [f"轮次：{i // 4}，step：{i % 4}，loss：{v}，学习率：0.1" for i, v in enumerate(LOSSES)]
    run = read_log(write_log(tmp_path, "cn.log", lines))
    assert run.micro_loss.tolist() == pytest.approx(LOSSES)
