"""The grammar of the other frameworks' logs, rule by rule: field names (`names`), structured
records (`records`: JSON objects, Python dicts, tables) and the keyed lines' new forms
(`key=value`, counters, a running mean in parentheses, torch's tensor repr, two step keys, a
counter striding by samples); and what stays noise or a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import looks_like_log, read_log
from gradalign.runs.logs.cleaned import clean
from gradalign.runs.logs.grammar import step_line
from gradalign.runs.logs.names import is_lr_field, is_step_field, loss_rank
from gradalign.runs.logs.records import MAX_RECORD, NOT_A_STEP, Records

from .conftest import one_line_error

LOSSES = [0.5, 0.25, 0.125, 0.375]


def write(tmp_path: Path, text: str, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


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
        *((n, None) for n in ("eval_loss", "val_loss", "valid_loss", "aux_loss", "avg_loss")),
        *((n, None) for n in ("running_loss", "loss_scale", "train_loss_epoch", "lossy", "acc")),
    ],
)
def test_loss_field_names(name, rank):
    assert loss_rank(name) == rank


def test_step_and_lr_field_names():
    steps = ["step", "Step", "global_step", "micro_step", "iter", "iteration", "num_updates"]
    steps += ["batch_idx", "trainer/global_step", "_step"]
    assert all(is_step_field(n) for n in steps)
    assert not any(is_step_field(n) for n in ("epoch", "steps_per_second", "update", "stepsize"))
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
        "{'loss': 1.5, " + "'x': 1, " * MAX_RECORD + "}",  # too long: not parsed at all
        "{" * 10000 + "}" * 10000,
        '{"a": ' + "[" * 100000 + "]" * 100000 + "}",
        "{1, 2}",
        "config: {'loss': 'cross_entropy', 'step': 3}",
    ):
        assert records.read(text) in (None, NOT_A_STEP), text


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


@pytest.mark.parametrize(
    ("line", "index", "loss", "lr"),
    [
        ("epoch 001:   3 / 20 loss=2.125, ppl=4.36, num_updates=3, lr=0.0005, w", 3, 2.125, 5e-4),
        ("| epoch 001 | loss 2.125 | ppl 4.36 | num_updates 3 | lr 0.0005 | clip", 3, 2.125, 5e-4),
        ("Iter(train) [ 3/20]  base_lr: 1e-2 lr: 1e-2  eta: 0:00:10  loss: 2.125", 3, 2.125, 0.01),
        ("Epoch(train) [2][ 3/10]  lr: 1.0000e-02  time: 0.1000  loss: 2.1250", 3, 2.125, 0.01),
        ("Train: 0 [   3/20 ( 15%)]  Loss:  2.125000 (2.9000)  LR: 1.000e-02", 3, 2.125, 0.01),
        ("Train Epoch: 1 [192/60000 (0%)]\tLoss: 2.125000", 192, 2.125, None),
        ("epoch 0, global_step 0, micro_step 3, loss 2.125, lr 0", 0, 2.125, 0.0),
    ],
)  # fmt: skip
def test_keyed_lines_of_other_frameworks(line, index, loss, lr):
    step = step_line(clean(line))
    assert (step.index, step.loss.value) == (index, loss)
    assert (step.lr and step.lr.value) == lr


def test_what_the_new_forms_also_carry():
    assert step_line("Epoch(train) [2][ 3/10]  loss: 2.1250").epoch == 2
    assert step_line("Train Epoch: 1 [192/60000 (0%)]\tLoss: 2.125").counter
    assert step_line("epoch 0, global_step 0, micro_step 3, loss 2.125").others == (3,)
    text = clean("11/22 10:00:00 - mmengine - INFO - step 3 loss: tensor(2.1250, device='cuda:0')")
    assert text.endswith("loss: 2.1250")
    assert clean("loss: tensor([2.1250], grad_fn=<MeanBackward0>)") == "loss: [2.1250]"
    text = clean("{'loss': np.float32(2.125), 'grad_norm': tensor(1.5, device='cuda:0')}")
    assert Records().read(text).loss.value == 2.125


@pytest.mark.parametrize(
    "line",
    [
        "Epoch [2/10] loss: 2.5",  # an epoch's counter, not a step's
        "11/22 10:00:00 loss: 2.5",  # a date (mmengine's prefix), then no step
        "[Eval] [ 3/20] loss: 2.5",
        " 15%|###   | 3/20 [00:01<00:02, loss=2.5]",
        "samples 3/20 acc: 0.5",
        "step loss: 0.5, acc: 3/4",  # a counter after the loss is another field's
        # Keras's bar: the loss it shows is the epoch's running mean, not the step's
        " 3/20 [======>.......] - ETA: 0s - loss: 2.1250 - lr: 1.0000e-02",
        "20/20 [==============================] - 1s 5ms/step - loss: 2.1250",
        " 1/20 [>.............................] - ETA: 9s - loss: 2.1250",
    ],
)
def test_counters_that_are_no_step(line):
    assert step_line(clean(line)) is None


def test_two_step_keys_read_the_one_that_counts(tmp_path):
    text = "".join(
        f"epoch 0, global_step {i // 2}, micro_step {i}, loss {v}\n" for i, v in enumerate(LOSSES)
    )
    assert read_log(write(tmp_path, text), accum_steps=2).micro_loss.tolist() == LOSSES
    # the other way round too: the global step counts, a batch index does not
    text = "".join(f"global step {i}, batch: 7, loss: {v}\n" for i, v in enumerate(LOSSES))
    assert read_log(write(tmp_path, text)).micro_loss.tolist() == LOSSES


@pytest.mark.parametrize(
    "keys",
    [
        lambda i: (i // 2 + 1, i),  # the update counted from 1, the micro-steps from 0
        lambda i: (i // 2, i % 2),  # a micro-step count within the window: no step
        lambda i: (i // 2 + 1, i % 2),
        lambda i: (i // 2 + 1, i % 2 + 1),
    ],
)
def test_two_step_keys_where_matching_line_by_line_misleads(tmp_path, keys):
    """The first lines of `global_step: 1, micro_step: 0` fit either key; where reading both
    line by line fails, the key that reads the whole log is the step."""
    text = "".join(
        "global_step: {}, micro_step: {}, loss: {}\n".format(*keys(i), v)
        for i, v in enumerate(LOSSES)
    )
    assert read_log(write(tmp_path, text), accum_steps=2).micro_loss.tolist() == LOSSES


def test_one_step_printed_on_every_line_needs_its_k(tmp_path):
    """A log of one step printed on four lines is one update of four micro-steps, never two."""
    lines = [f"global_step: 0, micro_step: {i % 2}, loss: {v}" for i, v in enumerate(LOSSES)]
    text = "\n".join(lines) + "\n"
    with pytest.raises(BadInput, match=r"printed on 4 lines.*-k 4, not -k 2"):
        read_log(write(tmp_path, text), accum_steps=2)
    assert read_log(write(tmp_path, text), accum_steps=4).micro_loss.tolist() == LOSSES
    with pytest.raises(BadInput, match=r"printed on 2 lines.*-k 2, not -k 1"):
        read_log(write(tmp_path, "step 0 loss 0.5\nstep 0 loss 0.25\n"))


def test_a_counter_striding_by_samples(tmp_path):
    lines = [
        f"Train Epoch: {1 + i // 2} [{(i % 2) * 64}/128 ({(i % 2) * 50}%)]\tLoss: {v}"
        for i, v in enumerate(LOSSES)
    ]
    run = read_log(write(tmp_path, "\n".join(lines) + "\n"), accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES
    assert any("advances by 64" in note for note in run.notes)
    bad = [*lines[:3], "Train Epoch: 2 [96/128 (75%)]\tLoss: 0.5"]
    with pytest.raises(BadInput, match=r"train\.log:4: the counter 96 is not a multiple of 64"):
        read_log(write(tmp_path, "\n".join(bad) + "\n"))
    # timm's default --log-interval 50: batches 0, 50, 100, 150 and the last, 199 (was refused
    # without a word on printing every step)
    batches = zip((0, 50, 100), LOSSES[:3], strict=True)
    timm = [f"Train: 0 [{b:4d}/200 ({b // 2:3d}%)]  Loss: {v}" for b, v in batches]
    with pytest.raises(BadInput, match=r"199 is not a multiple of 50.*timm's --log-interval 1"):
        read_log(write(tmp_path, "\n".join([*timm, "Train: 0 [ 199/200 (100%)]  Loss: 0.5"])))


def test_records_without_a_step_field_count_in_order(tmp_path):
    text = "".join(f"{{'loss': {v}, 'learning_rate': 0.1, 'epoch': 0.5}}\n" for v in LOSSES)
    path = write(tmp_path, "Some preamble\n" + text + "{'eval_loss': 2.0}\n")
    assert looks_like_log(path)
    run = read_log(path, accum_steps=2)
    assert run.micro_loss.tolist() == LOSSES and run.lr.tolist() == [0.1, 0.1]
    assert run.config["ignored_lines"] == 2


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


TRAINER_LOSSES = [2.31 - 0.05 * i for i in range(6)]
TRAINER_NORMS = [1.52 - 0.03 * i for i in range(6)]


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


KEYED_NORM_LINES = {  # a line's format, and whether it is printed per micro-step (K = 4)
    "megatron": (
        " iteration {u:>8}/      60 | consumed samples: {s:>8} | learning rate: 1.000000E-03 |"
        " lm loss: {loss:.6E} | loss scale: 1.0 |{norm} |",
        False,
    ),
    "fairseq": ("epoch 001:  {u:>3} / 60 loss={loss:.3f},{norm}, lr=0.001", False),
    "torchtitan": ("step: {u:2}  loss: {loss:7.4f} {norm}  memory: 1.2GiB", False),
    "mmengine": ("Iter(train) [{u:>3}/240]  lr: 1.0000e-03 {norm}  loss: {loss:.4f}", True),
}
NORM_FIELD = {
    "megatron": " grad norm: {:.3f}",
    "fairseq": " gnorm={:.3f}",
    "torchtitan": " grad_norm: {:7.4f}",
    "mmengine": " grad_norm: {:.4f}",
}


@pytest.mark.parametrize("form", sorted(KEYED_NORM_LINES))
def test_a_norm_on_keyed_step_lines_is_read_as_a_records(tmp_path, form):
    """`grad norm:` (Megatron), `gnorm=` (fairseq), `grad_norm:` (torchtitan, MMEngine): a K
    times larger gradient that Adam steps alike passed on these lines, though the same run's
    JSON records failed `loss-scale` by their norms. MMEngine prints a line per micro-step,
    the norm from the first step on (stale on the lines between steps)."""
    from gradalign import api

    line, per_micro = KEYED_NORM_LINES[form]
    k = 4 if per_micro else 1

    def log(name: str, norms: list[float]) -> Path:
        rows, last, window = [], None, 1 if name == "base" else k
        for loss, norm in zip(TRAINER_LOSSES, norms, strict=True):
            for j in range(window):
                last = norm if j == window - 1 else last  # printed once the window stepped
                field = "" if last is None else NORM_FIELD[form].format(last)
                n = len(rows) + 1
                rows.append(line.format(u=n, s=32 * n, loss=loss, norm=field))
        return write(tmp_path, "\n".join(rows) + "\n", f"{name}.log")

    base = log("base", TRAINER_NORMS)
    assert api.compare(base, log("clean", TRAINER_NORMS), accum_steps=k).verdict == "pass"
    scaled = log("scaled", [n * 4 for n in TRAINER_NORMS])
    c = api.compare(base, scaled, accum_steps=k)
    assert c.verdict == "fail" and c.diagnosis[0].code == "loss-scale", c.diagnosis[0].message


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
