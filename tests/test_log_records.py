"""Structured records in other frameworks' logs, rule by rule: field names (`names`), JSON
objects, Python dicts and tables (`records`), a transformers `trainer_state.json`, TensorBoard's
exports, a Trainer's printed gradient norms read and judged; and what stays noise or a one-line
error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import looks_like_log, read_log
from gradalign.runs.logs.names import is_lr_field, is_step_field, loss_rank
from gradalign.runs.logs.records import MAX_RECORD, NOT_A_STEP, Records

from .conftest import one_line_error
from .printed_norms import TRAINER_LOSSES, TRAINER_NORMS
from .small_logs import LOSSES, write


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("loss", 0),
        ("Loss", 0),
        ("train_loss", 1),
        ("train/loss", 1),
        ("train_loss_step", 1),  # Lightning's on_step value
        ("lm loss", 2),
        ("nll_loss", 2),
        ("loss/train/total", 1),  # Composer's step loss, the sum of its parts
        ("loss/train/ce", 2),
        ("loss/val/total", None),
        ("train/CrossEntropyLoss", 2),  # OLMo's: words split at capitals
        ("trainLoss", 1),
        *((n, None) for n in ("valLoss", "train/ZLoss", "lossScale", "TotalLoss")),
        *((n, None) for n in ("eval_loss", "val_loss", "valid_loss", "aux_loss", "avg_loss")),
        *((n, None) for n in ("running_loss", "loss_scale", "train_loss_epoch", "lossy", "acc")),
    ],
)
def test_loss_field_names(name, rank):
    assert loss_rank(name) == rank


def test_step_and_lr_field_names():
    steps = ["step", "Step", "global_step", "micro_step", "iter", "iteration", "num_updates"]
    steps += ["batch_idx", "trainer/global_step", "_step", "current_steps"]  # LLaMA-Factory's
    assert all(is_step_field(n) for n in steps)
    others = ("epoch", "steps_per_second", "update", "stepsize", "total_steps", "current")
    assert not any(is_step_field(n) for n in others)
    assert all(is_lr_field(n) for n in ("lr", "learning_rate", "lr-SGD", "lr-AdamW/pg1"))
    assert not any(is_lr_field(n) for n in ("base_lr", "lr_decay", "lrs"))


def test_json_and_dict_records():
    records = Records()
    step = records.read('{"step": 3, "loss": 2.5, "lr": 1e-3, "epoch": 1}')
    assert (step.index, step.loss.value, step.loss.digits, step.lr.value, step.epoch) == (
        3,
        2.5,
        1,
        1e-3,
        1,
    )
    step = records.read("{'loss': 2.25, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.01}")
    assert (step.index, step.loss.value, step.lr.value, step.epoch) == (None, 2.25, 5e-05, None)
    # the log's loss field is `loss`: an evaluation or summary record holds no step
    assert records.read("{'eval_loss': 2.0, 'epoch': 1.0}") is NOT_A_STEP
    assert records.read("{'train_runtime': 9.0, 'train_loss': 2.0}") is NOT_A_STEP
    # fairseq's JSON: numbers as strings, after the logger's prefix
    step = Records().read('x | INFO | train_inner | {"loss": "2.125", "num_updates": "7"}')
    assert (step.index, step.loss.value, step.loss.digits) == (7, 2.125, 3)


def test_the_first_record_with_a_loss_chooses_the_field():
    records = Records()
    assert records.read("{'train_loss': 2.0, 'step': 0}").loss.value == 2.0
    assert records.read("{'loss': 9.0, 'train_loss': 2.5, 'step': 1}").loss.value == 2.5
    assert Records().read("{'loss': 9.0, 'train_loss': 2.5}").loss.value == 9.0


def test_nan_and_a_record_that_cannot_be_read(tmp_path):
    records = Records()
    step = records.read("{'loss': 2.5, 'grad_norm': nan, 'x': [inf, -inf], 'lr': 0.1}")
    assert (step.loss.value, step.lr.value) == (2.5, 0.1)
    assert records.read("{'loss': nan, 'grad_norm': 1.5}").loss.value != 2.5  # nan
    with pytest.raises(BadInput, match="cannot read this record"):
        records.read("{'loss': 2.5, 'grad_norm': Decimal('1.5')}")
    assert records.read("{'eval_loss': 2.5, 'x': Decimal('1.5')}") is None  # not the log's
    text = "{'loss': 0.5}\n{'loss': 0.25, 'f': foo(1)}\n"
    with pytest.raises(BadInput, match=r"train\.log:2: cannot read this record"):
        read_log(write(tmp_path, text))


def test_no_record_is_evaluated():
    records = Records()
    for text in (
        "{'loss': __import__('os').getcwd()}",
        "{'loss': 1.5, 'f': (lambda: 1)()}",
        "{" * 10000 + "}" * 10000,
        '{"a": ' + "[" * 100000 + "]" * 100000 + "}",
        "{1, 2}",
        "config: {'loss': 'cross_entropy', 'step': 3}",
    ):
        assert records.read(text) in (None, NOT_A_STEP), text
    too_long = "{'loss': 1.5, " + "'x': 1, " * MAX_RECORD + "}"  # not parsed at all: refused
    with pytest.raises(BadInput, match=r"cannot read this record \(JSON cannot read it, and it is"):
        Records().read(too_long)


@pytest.mark.parametrize(
    ("header", "row", "expected"),
    [
        ("step,loss,lr", "3,2.5,0.001", (3, 2.5, 0.001)),
        ("epoch,lr-SGD,step,train_loss,val_loss", "0,0.1,3,2.5,", (3, 2.5, 0.1)),
        ("step\tloss", "3\t2.5", (3, 2.5, None)),
        ("step        lr      loss", "   3  0.100000  2.500000", (3, 2.5, 0.1)),
        ("Wall time,Step,Value", "1763805600.123,3,2.5", (3, 2.5, None)),
        ("train/loss,trainer/global_step", "2.5,3", (3, 2.5, None)),
    ],
)
def test_tables(header, row, expected):
    records = Records()
    assert records.read(header) is NOT_A_STEP
    step = records.read(row)
    assert (step.index, step.loss.value, step.lr and step.lr.value) == expected


def test_table_rows_without_the_loss_and_the_end_of_a_table():
    records = Records()
    records.read("epoch,step,train_loss,val_loss")
    assert records.read("0,19,,2.5") is NOT_A_STEP  # an empty cell is no value
    assert records.read("0,3,2.5,").loss.value == 2.5
    assert records.read("0,4,2.5,2.5,too many cells") is None  # the table ended
    assert records.read("0,4,2.5,") is None
    records = Records()
    records.read("epoch,phase,step,loss")
    assert records.read("0,train,3,2.5").loss.value == 2.5  # text in a delimited row
    assert records.read("0,val,4,") is NOT_A_STEP
    # white space: the header needs a step and a loss; rows as many numbers
    assert Records().read("loss scale") is None
    assert Records().read("step loss acc") is NOT_A_STEP
    assert Records().read("Wall time,Step,Other") is None


def test_records_without_a_step_field_count_in_order(tmp_path):
    text = "".join(f"{{'loss': {v}, 'learning_rate': 0.1, 'epoch': 0.5}}\n" for v in LOSSES)
    path = write(tmp_path, "Some preamble\n" + text + "{'eval_loss': 2.0}\n")
    assert looks_like_log(path)
    run = read_log(path, accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES and run.lr.tolist() == [0.1, 0.1]
    assert run.config["ignored_lines"] == 2


def test_llama_factorys_trainer_log_is_numbered_by_its_current_steps(tmp_path):
    """LLaMA-Factory's trainer_log.jsonl numbers its records `current_steps`: they were read as
    records without a step, consecutive by position, so one printed every 5 steps (each a mean
    over them) was read as every step."""
    record = '{{"current_steps": {i}, "total_steps": 8, "loss": {v}, "lr": 0.1, "epoch": 0.5}}\n'
    path = write(tmp_path, "".join(record.format(i=i + 1, v=v) for i, v in enumerate(LOSSES)))
    run = read_log(path, accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES and not any("numbered" in n for n in run.notes)
    every5 = write(
        tmp_path, "".join(record.format(i=5 * (i + 1), v=v) for i, v in enumerate(LOSSES))
    )
    with pytest.raises(BadInput, match="the first step is 5"):
        read_log(every5)


def test_records_numbered_by_position_do_not_claim_record_0_is_one_update(cli, tmp_path):
    """The Trainer's dicts under logging_steps=5 print no step: each record is a mean over 5
    updates, so a gap at record 0 may come from a step after the first. The message said
    "update 0's losses come from the same initial weights, so this gap is in what each loop
    computed or printed", blaming the print for a training bug."""
    line = "{{'loss': {v:.4f}, 'learning_rate': 0.5, 'epoch': {e:.2f}}}"
    base = [line.format(v=1.5 - 0.1 * i, e=0.1 * i) for i in range(8)]
    merged = [line.format(v=1.3 - 0.13 * i, e=0.1 * i) for i in range(8)]
    paths = [write(tmp_path, "\n".join(lines) + "\n", name) for lines, name in
             ((base, "base.log"), (merged, "merged.log"))]  # fmt: skip
    report = tmp_path / "r.json"
    result = cli("compare", *paths, "-k", "1", "--json", report)
    assert result.code == 1, result.err
    message = json.loads(report.read_text())["diagnosis"][0]["message"]
    assert "numbered one an update" in message and "logging_steps=1" in message
    assert "come from the same initial weights" not in message


def test_a_tensorboard_export_says_what_it_read(tmp_path):
    text = "Wall time,Step,Value\n" + "".join(f"1.5,{i},{v}\n" for i, v in enumerate(LOSSES))
    run = read_log(write(tmp_path, text, "loss.csv"))
    assert run.micro_loss.tolist() == LOSSES
    assert any("TensorBoard" in note for note in run.notes)


UNREADABLE = {
    "records without a loss": "".join(f'{{"step": {i}, "acc": 0.5}}\n' for i in range(4)),
    "a table without a loss": "step,acc\n0,0.5\n1,0.5\n",
    "validation rows only": "epoch,step,val_loss\n0,0,2.5\n0,1,2.5\n",
    "a progress bar": "".join(f" {i}/4 [==>..] 1s {i}%|## loss=0.5\n" for i in range(4)),
    "a keras bar": "Epoch 1/1\n" + "".join(f" {i}/4 [==>..] - loss: 0.5\n" for i in range(4)),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_what_is_no_log_is_one_line(cli, tmp_path, case):
    base = write(tmp_path, "".join(f"step {i}, loss: {v}\n" for i, v in enumerate(LOSSES)), "b")
    result = cli("compare", base, write(tmp_path, UNREADABLE[case], "m.log"), "-k", "1")
    one_line_error(result, "m.log")


def test_steps_that_restart_in_records_are_one_line(cli, tmp_path):
    text = "".join(f'{{"step": {i % 2}, "loss": {v}}}\n' for i, v in enumerate(LOSSES))
    base = write(tmp_path, text.replace('"step": 0', '"step": 9'), "b.log")
    result = cli("compare", write(tmp_path, text, "a.log"), base, "-k", "1")
    one_line_error(result, "a.log:3: expected step 2, found step 0 again")


def _trainer_state(tmp_path: Path, name: str, losses: list[float]) -> Path:
    """transformers' trainer_state.json (indent 2, as the Trainer saves it in a checkpoint):
    one record per logged step, an evaluation's record, and the closing summary."""
    history = [
        {"epoch": (i + 1) / 4, "grad_norm": 0.5, "learning_rate": 0.1, "loss": v, "step": i + 1}
        for i, v in enumerate(losses)
    ]
    history.insert(2, {"epoch": 0.5, "eval_loss": 9.0, "step": 2})
    history.append({"epoch": 1.0, "step": len(losses), "train_loss": 0.3, "total_flos": 1.0})
    state = {"best_metric": None, "global_step": len(losses), "log_history": history}
    return write(tmp_path, json.dumps(state, indent=2), name)


def test_a_trainer_state_json_is_read_as_its_log_history(tmp_path):
    """A checkpoint's trainer_state.json holds the Trainer's log as one JSON document: each
    record of `log_history` is a step (the evaluation's and the summary are not), numbered by
    the line it starts on; it was refused as no log."""
    path = _trainer_state(tmp_path, "trainer_state.json", LOSSES)
    assert looks_like_log(path)
    run = read_log(path)
    assert run.updates == 4 and run.micro_loss.tolist() == LOSSES
    (note,) = run.notes  # the evaluation's record and the summary, by the lines they start on
    assert "2 line(s)" in note and 'line 38: \'{"epoch": 1.0' in note, note


def _trainer_log(path: Path, losses, norms) -> Path:
    """The Trainer's printed dicts (transformers 5 prints its floats as 4-digit strings)."""
    lines = [
        f"{{'loss': '{loss:.4g}', 'grad_norm': '{norm:.4g}', 'learning_rate': '0.001', "
        f"'epoch': '{0.1 * (i + 1):.4g}'}}"
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trainer_logs_grad_norm_is_read_and_judged(tmp_path):
    """The Trainer prints each update's gradient norm before clipping (`grad_norm`); it was
    not read. A model that ignores num_items_in_batch steps on a gradient K times too large:
    its loss K times too (`loss-averaging`, "the logs print no weights or gradients": a matter
    of the print), though the log prints the norm K times too."""
    from gradalign import api

    base = _trainer_log(tmp_path / "base.log", TRAINER_LOSSES, TRAINER_NORMS)
    run = read_log(base)
    assert run.grad_norm_pre_clip.tolist() == pytest.approx(TRAINER_NORMS)
    clean = _trainer_log(
        tmp_path / "clean.log", TRAINER_LOSSES, [n * (1 + 2e-5) for n in TRAINER_NORMS]
    )
    assert api.compare(base, clean, accum_steps=1).verdict == "pass"
    scaled = _trainer_log(
        tmp_path / "k.log", [v * 4 for v in TRAINER_LOSSES], [n * 4 for n in TRAINER_NORMS]
    )
    c = api.compare(base, scaled, accum_steps=1)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", c.diagnosis[0].message
    assert c.diagnosis[0].evidence["norm_ratio"] == pytest.approx(4, rel=1e-3)
    adam = _trainer_log(
        tmp_path / "a.log", TRAINER_LOSSES, [n * 4 for n in TRAINER_NORMS]
    )  # losses alike
    c = api.compare(base, adam, accum_steps=1)  # Adam steps alike on K times the gradient
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", c.diagnosis[0].message
    assert "(K = 4)" in c.diagnosis[0].message  # read with -k 1: K from the ratio
    hidden = _trainer_log(tmp_path / "n.log", TRAINER_LOSSES, [n * 1.01 for n in TRAINER_NORMS])
    c = api.compare(base, hidden, accum_steps=1)  # only the norm shows it
    norms = next(check for check in c.checks if check.name == "norms before clipping")
    assert c.verdict == "fail" and norms.status == "fail", norms.detail


def test_printed_norms_say_a_scale_only_where_the_first_losses_allow_one(tmp_path):
    """One line per update (-k 1), each a window's mean loss and its gradient's norm. A loop
    that stepped at every micro-step (the loss divided by K) printed norms 0.48x and an update-0
    loss 1% below: it was `loss-scale` (K=2), whose fix breaks a correct scale; update 0's
    losses come from the same weights, so only a scaled print or none leaves them so. A loss
    not divided by K (norms 4x, the first losses alike, the later ones apart) was said to
    leave "the losses, weights and clipped gradients" agreeing, behind a clip: a log prints
    no weights, and its losses part."""
    from gradalign import api

    base = _trainer_log(tmp_path / "base.log", TRAINER_LOSSES, TRAINER_NORMS)
    stepped = [v * (0.99 if i == 0 else 0.9) for i, v in enumerate(TRAINER_LOSSES)]
    inside = _trainer_log(tmp_path / "s.log", stepped, [n * 0.48 for n in TRAINER_NORMS])
    c = api.compare(base, inside, accum_steps=1)
    assert c.verdict == "fail" and "loss-scale" not in [d.code for d in c.diagnosis]
    assert "an optimizer step inside the window" in c.diagnosis[0].message
    assert "one micro-batch's loss, not the window's mean (nanoGPT" in c.diagnosis[0].message
    apart = [v * (1 if i == 0 else 0.95) for i, v in enumerate(TRAINER_LOSSES)]
    scaled = _trainer_log(tmp_path / "k.log", apart, [n * 4 for n in TRAINER_NORMS])
    found = api.compare(base, scaled, accum_steps=1).diagnosis[0]
    assert found.code == "loss-scale" and "(K = 4)" in found.message, found.message
    assert "the losses part from update 1" in found.message
    assert "weights and clipped gradients agree" not in found.message


def test_a_tensorboard_json_export_is_read_as_its_csv_export_whatever_its_size(tmp_path):
    """TensorBoard's "download JSON" of the loss tag, one line: it was refused as no log while
    the same tag's CSV download was read. Past the first MiB it is read whole to be parsed."""
    many = [0.5 + (i % 97) / 1000 for i in range(40_000)]  # 1.6 MB
    for losses in (LOSSES, many):
        entries = [[1763805600.5 + i, i, v] for i, v in enumerate(losses)]
        path = write(tmp_path, json.dumps(entries))
        assert looks_like_log(path)
        run = read_log(path)
        assert run.micro_loss.tolist() == losses
        assert any("TensorBoard export (CSV or JSON" in note for note in run.notes)
    for other in ("[[1, 2], [3, 4]]", "[[1.5, 0.5, 2.3]]", "[[1, true, 2.3]]", "[[1, 0, 2.3]"):
        assert not looks_like_log(write(tmp_path, other + "\n"))


def test_a_step_printed_before_a_record_numbers_it(tmp_path):
    """`step 3: {'train_loss': 2.29}`: the record holds no step field, and the step before it
    was ignored: records were numbered by position (with a note), so a log that printed its
    steps twice from some step on was read as a longer run."""
    lines = [f"step {i}: {{'train_loss': {v}}}" for i, v in enumerate(TRAINER_LOSSES)]
    run = read_log(write(tmp_path, "\n".join(lines) + "\n", "steps.log"))
    assert run.micro_loss.tolist() == pytest.approx(TRAINER_LOSSES)
    assert not [n for n in run.notes if "print no step number" in n], run.notes
    again = lines + lines[3:]  # steps 3 to 5 printed again: refused, no longer read as 9 steps
    with pytest.raises(BadInput, match="step 3"):
        read_log(write(tmp_path, "\n".join(again) + "\n", "again.log"))
