"""Keyed step lines as other frameworks print them, rule by rule (`grammar`, `cleaned`):
`key=value`, counters, a running mean in parentheses, torch's tensor repr, two step keys, a
counter striding by samples, a gradient norm beside the loss read and judged; and the counters
that are no step."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradalign.errors import BadInput
from gradalign.runs.logs import read_log
from gradalign.runs.logs.cleaned import clean
from gradalign.runs.logs.grammar import step_line
from gradalign.runs.logs.records import Records

from .printed_norms import TRAINER_LOSSES, TRAINER_NORMS
from .small_logs import LOSSES, write


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


def test_losses_alone_that_part_after_the_first_step_say_what_would_name_it(tmp_path):
    """Logs of losses alone that agree at update 0 (the initial weights) and part from update 1
    (a merge that summed its gradients, under SGD): `unexplained`, saying that the steps
    differed, that losses cannot tell a K-times gradient from another lr (the printed ones
    agree), and what to print; the same logs with the gradient's norm are `loss-scale`."""
    from gradalign import api

    line = "loss: {loss:.8f}, learning_rate: 0.1, global_step: {u}{norm}"
    parted = [TRAINER_LOSSES[0]] + [v - 0.3 for v in TRAINER_LOSSES[1:]]

    def log(name: str, losses: list[float], norms: list[float] | None = None) -> Path:
        rows = [
            line.format(u=u + 1, loss=v, norm="" if norms is None else f", grad_norm: {norms[u]}")
            for u, v in enumerate(losses)
        ]
        return write(tmp_path, "\n".join(rows) + "\n", f"{name}.log")

    c = api.compare(log("base", TRAINER_LOSSES), log("sum", parted), accum_steps=1)
    (d,) = c.diagnosis
    assert d.code == "unexplained", d.message
    assert "agree at update 0, before any step, and part at update 1" in d.message
    assert "the printed learning rates agree; a gradient K times too large" in d.message
    assert d.fix.startswith("print each update's gradient norm before clipping")
    early = [TRAINER_LOSSES[0] + 0.2, *TRAINER_LOSSES[1:]]  # apart before any step: not this
    c = api.compare(log("base", TRAINER_LOSSES), log("early", early), accum_steps=1)
    assert "losses alone cannot say" not in c.diagnosis[0].message
    base = log("base", TRAINER_LOSSES, TRAINER_NORMS)
    normed = [4 * TRAINER_NORMS[0]] + [3 * n for n in TRAINER_NORMS[1:]]
    c = api.compare(base, log("sum", parted, normed), accum_steps=1)
    assert c.diagnosis[0].code == "loss-scale", c.diagnosis[0].message
