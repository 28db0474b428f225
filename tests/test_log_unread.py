"""A file with no step line the reader knows is refused naming what its lines print: the
loss-like fields and the step key (runs/logs/unread.py), not only what the reader expected."""

from __future__ import annotations

import pytest

from .conftest import one_line_error

D2 = (
    "[11/30 01:00:0{i} d2.utils.events]:  eta: 0:00:59  iter: {i}  total_loss: 2.1{i}  "
    "loss_cls: 1.4{i}  loss_box_reg: 0.63  time: 0.1000  lr: 0.04  max_mem: 120M"
)
ESPNET = (
    "[host] 2026-11-30 01:00:00,000 (trainer:762) INFO: 1epoch:train:{i}-{i}batch: "
    "iter_time=0.001, loss_ctc=2.75{i}, loss_att=1.91{i}, acc=0.400, loss=2.12{i}, optim0_lr0=0.040"
)
ONMT = (
    "[2026-11-30 01:00:00,000 INFO] Step {i}/   60; acc:  40.00; ppl:  8.35; xent: 2.1{i}; lr: 0.04"
)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (D2, "its lines print `total_loss`, `loss_cls`, `loss_box_reg` beside a step (`iter`)"),
        (ESPNET, "print `loss_ctc`, `loss_att`, `loss` but no step number the reader knows"),
        (ONMT, "its lines print `xent` beside a step (`step`)"),
    ],
)
def test_an_unread_log_is_refused_naming_its_fields(tmp_path, cli, line, said):
    logs = []
    for name in ("base", "merged"):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(line.format(i=i) for i in range(1, 9)) + "\n", encoding="utf-8")
        logs.append(path)
    one_line_error(cli("compare", *logs), "recognised training log", said)


def test_a_file_without_loss_like_fields_gets_the_plain_refusal(tmp_path, cli):
    base, merged = tmp_path / "a.log", tmp_path / "b.log"
    for path in (base, merged):
        path.write_text("hello\nepoch 1 done\n", encoding="utf-8")
    result = cli("compare", base, merged)
    one_line_error(result, "print each step's loss")
    assert "its lines print" not in result.err
