"""Logs as other frameworks print them, judged end to end: a softmax regression trained in numpy
(a baseline of B=32 per update against K=4 micro-batches of 8), printed as JSON lines, Python
dicts (the transformers Trainer's), CSV and white-space tables (Lightning's metrics.csv, a
TensorBoard export), fairseq, mmengine, timm, the PyTorch MNIST example and
torch's tensor repr. A clean pair passes; a merged loss printed K times too large and an lr
schedule stepped at every micro-step fail with the codes the keyed Paddle-style lines get."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import one_line_error
from .softmax_losses import train

K, B, N, D, C = 4, 32, 8, 6, 4


def _lr(t: int) -> float:  # warmup over 3 steps, then linear decay to 0 at N
    return float(np.float32(0.5) * min(1.0, (t + 1) / 3) * max(0.0, (N - t) / (N - 2)))


def _train(k: int, fast: bool = False) -> tuple[list[float], list[float]]:
    """Each micro-step's loss and the lr in force at it; `fast` steps the schedule per micro."""
    return train(k, updates=N, batch=B, features=D, classes=C, lr=_lr, fast=fast)


def _rows(losses: list[float], lrs: list[float], epochs: int = 1) -> list[dict]:
    per_epoch = len(losses) // epochs
    return [
        {"i": i, "loss": v, "lr": lr, "ep": i // per_epoch, "se": i % per_epoch, "n": per_epoch}
        for i, (v, lr) in enumerate(zip(losses, lrs, strict=True))
    ]


def _fmt(r: dict, spec: str) -> str:
    return format(r["loss"], spec)


def _jsonl(rows):  # an evaluation record lacks the loss: no step
    lines = [json.dumps({"step": r["i"], "loss": r["loss"], "lr": r["lr"]}) for r in rows]
    return [*lines, '{"step": 3, "eval_loss": 9.5}']


def _dicts(rows):
    return [f"{{'step': {r['i']}, 'loss': {r['loss']!r}, 'lr': {r['lr']!r}}}" for r in rows]


def _hf(rows):  # the Trainer's `print(logs)`: no step; eval and summary dicts are no steps
    lines = [
        f"{{'loss': {round(r['loss'], 4)}, 'grad_norm': 1.25, 'learning_rate': {r['lr']!r}, "
        f"'epoch': {(r['i'] + 1) / len(rows)}}}"
        for r in rows
    ]
    summary = "{'train_runtime': 2.5, 'train_steps_per_second': 9.9, 'train_loss': 9.5}"
    return [*lines, "{'eval_loss': 9.5, 'eval_runtime': 0.5, 'epoch': 1.0}", summary]


def _fairseq_json(rows):  # fairseq --log-format json: strings, after the logger's prefix
    fields = [
        {"epoch": 1, "loss": _fmt(r, ".3f"), "num_updates": str(r["i"] + 1), "lr": f"{r['lr']:g}"}
        for r in rows
    ]
    prefix = "2026-11-22 10:00:00 | INFO | train_inner | "
    valid = '2026-11-22 10:00:09 | INFO | valid | {"epoch": 1, "valid_loss": "2.9"}'
    return [prefix + json.dumps(f) for f in fields] + [valid]


def _csv(rows):
    return ["step,loss,lr"] + [f"{r['i']},{r['loss']!r},{r['lr']!r}" for r in rows]


def _lightning(rows):  # CSVLogger's metrics.csv: sorted columns, a validation row
    lines = [f"{r['ep']},{r['lr']!r},{r['i']},{r['loss']!r}," for r in rows]
    return ["epoch,lr-SGD,step,train_loss,val_loss", *lines, f"0,,{len(rows) - 1},,2.5"]


def _tsv(rows):
    return ["step\tloss\tlr"] + [f"{r['i']}\t{_fmt(r, '.6f')}\t{r['lr']:.6f}" for r in rows]


def _table(rows):
    lines = [f"{r['i']:4d}  {r['lr']:.6f}  {_fmt(r, '.6f')}" for r in rows]
    return ["step        lr      loss", *lines]


def _tensorboard(rows):  # a TensorBoard CSV export of the loss tag
    lines = [f"{1763805600.5 + r['i']},{r['i']},{r['loss']!r}" for r in rows]
    return ["Wall time,Step,Value", *lines]


def _tensorboard_json(rows):  # its JSON export: one line, [[wall time, step, value], ...]
    return [json.dumps([[1763805600.5 + r["i"], r["i"], r["loss"]] for r in rows])]


def _fairseq(rows):  # --log-format simple; the validation line is no step
    lines = [
        f"2026-11-22 10:00:00 | INFO | train_inner | epoch 001:    {r['i'] + 1:3d} / "
        f"{len(rows)} loss={_fmt(r, '.3f')}, ppl=3.46, wps=1234.5, ups=8.1, bsz=64, "
        f"num_updates={r['i'] + 1}, lr={r['lr']:.6g}, gnorm=1.234, train_wall=0, wall=0"
        for r in rows
    ]
    valid = "2026-11-22 10:01:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 2.9"
    return [*lines, valid]


def _fairseq_legacy(rows):
    return [
        f"| epoch 001 | loss {_fmt(r, '.3f')} | ppl 3.46 | wps 1234 | num_updates {r['i'] + 1} "
        f"| lr {r['lr']:.6g} | gnorm 1.234 | clip 0.000"
        for r in rows
    ]


def _mmengine_iter(rows):
    return [
        f"11/22 10:00:{r['i'] % 60:02d} - mmengine - INFO - Iter(train) [{r['i'] + 1:2d}/"
        f"{len(rows)}]  base_lr: {r['lr']:.4e} lr: {r['lr']:.4e}  eta: 0:00:10  time: 0.1000  "
        f"memory: 100  loss: {_fmt(r, '.4f')}"
        for r in rows
    ]


def _mmengine_epochs(rows):
    return [
        f"11/22 10:00:{r['i'] % 60:02d} - mmengine - INFO - Epoch(train) [{r['ep'] + 1}]"
        f"[{r['se'] + 1:2d}/{r['n']}]  lr: {r['lr']:.4e}  eta: 0:00:10  time: 0.1000  "
        f"loss: {_fmt(r, '.4f')}"
        for r in rows
    ]


def _timm(rows):  # the step's loss, then the running mean in parentheses
    means = np.cumsum([r["loss"] for r in rows]) / np.arange(1, len(rows) + 1)
    return [
        f"Train: 0 [{r['i']:4d}/{len(rows)} ({100 * r['i'] // len(rows):3d}%)]  Loss: "
        f"{r['loss']:>9.6f} ({mean:>6.4f})  Time: 0.100s,  640.00/s  (0.100s,  640.00/s)  "
        f"LR: {r['lr']:.3e}  Data: 0.010 (0.010)"
        for r, mean in zip(rows, means, strict=True)
    ]


def _pytorch_example(rows):  # the counter counts samples: batch_idx * len(data)
    samples = N * B // 2  # per epoch
    return [
        f"Train Epoch: {r['ep'] + 1} [{r['se'] * (samples // r['n'])}/{samples} "
        f"({100 * r['se'] // r['n']}%)]\tLoss: {_fmt(r, '.6f')}"
        for r in rows
    ]


def _torch_tensor(rows):
    return [
        f"epoch 0 step {r['i']} loss: tensor({_fmt(r, '.4f')}, device='cuda:0', "
        "grad_fn=<NllLossBackward0>)"
        for r in rows
    ]


def _global_and_micro(rows):  # the update's step repeated beside the micro-step's
    return [
        f"epoch 0, global_step {r['i'] * N // len(rows)}, micro_step {r['i']}, loss "
        f"{_fmt(r, '.6f')}, lr {r['lr']:.6f}"
        for r in rows
    ]


def _update_step_each_micro(rows):  # a loop printing its optimizer-step count per micro-batch
    return [f"step {r['i'] * N // len(rows)}, loss: {_fmt(r, '.6f')}" for r in rows]


def _step_logged_per_micro(rows):  # a logger called per micro-batch with step=global_step
    lines = [f"{r['ep']},{r['lr']!r},{r['i'] * N // len(rows)},{r['loss']!r}," for r in rows]
    return ["epoch,lr-SGD,step,train_loss,val_loss", *lines]


def _thousands(rows):  # `{:,}`: a counter of samples and a loss grouped (`1,386.294`)
    return [  # samples of the same data: one total in every log (logs/ check_log_counters)
        f"[{r['i'] * 1000:,}/{1000 * 1000:,}]  loss: {r['loss'] * 1000:,.3f}  lr: {r['lr']:.4e}"
        for r in rows
    ]


# name -> (lines from rows, epochs, what the merged log prints: each micro-step or each update,
# whether it prints the lr)
FORMATS = {
    "jsonl": (_jsonl, 1, "micro", True),
    "python dicts": (_dicts, 1, "micro", True),
    "trainer dicts": (_hf, 1, "update", True),
    "trainer dicts per micro": (_hf, 1, "micro", True),
    "fairseq json": (_fairseq_json, 1, "update", True),
    "csv": (_csv, 1, "micro", True),
    "lightning metrics.csv": (_lightning, 1, "micro", True),
    "tsv": (_tsv, 1, "micro", True),
    "white-space table": (_table, 1, "micro", True),
    "tensorboard csv": (_tensorboard, 1, "micro", False),
    "tensorboard json": (_tensorboard_json, 1, "micro", False),
    "fairseq": (_fairseq, 1, "update", True),
    "fairseq legacy": (_fairseq_legacy, 1, "update", True),
    "mmengine iter": (_mmengine_iter, 1, "micro", True),
    "mmengine epochs": (_mmengine_epochs, 2, "micro", True),
    "timm": (_timm, 1, "micro", True),
    "pytorch example": (_pytorch_example, 2, "micro", False),
    "torch tensor": (_torch_tensor, 1, "micro", False),
    "global step beside micro step": (_global_and_micro, 1, "micro", True),
    "update's step at each micro-step": (_update_step_each_micro, 1, "micro", False),
    "a table's step logged at each micro-step": (_step_logged_per_micro, 1, "micro", True),
    "grouped by thousands": (_thousands, 1, "micro", True),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[float], list[float]]]:
    base = _train(1)
    merged, fast = _train(K), _train(K, fast=True)
    return {
        "base": base,
        "clean": merged,
        "loss x K": ([v * K for v in merged[0]], merged[1]),
        "lr per micro": fast,
    }


def _window(losses: list[float], lrs: list[float]) -> tuple[list[float], list[float]]:
    """What a log printing once per update prints: the window's mean loss, the update's lr."""
    means = [float(np.mean(losses[i : i + K], dtype=np.float32)) for i in range(0, len(losses), K)]
    return means, lrs[K - 1 :: K]


def _write(tmp_path: Path, name: str, fmt: str, run: tuple, per_update: bool) -> Path:
    lines, epochs, _, _ = FORMATS[fmt]
    losses, lrs = _window(*run) if per_update else run
    path = tmp_path / f"{name}.log"
    path.write_text("\n".join(lines(_rows(losses, lrs, epochs))) + "\n", encoding="utf-8")
    return path


def _judge(cli, tmp_path: Path, base: Path, merged: Path, k: int) -> tuple[int, list[str]]:
    report = tmp_path / "r.json"
    result = cli("compare", base, merged, "-k", str(k), "--json", report)
    assert result.code in (0, 1), result.err
    data = json.loads(report.read_text())
    return result.code, [d["code"] for d in data["diagnosis"] if d["severity"] == "error"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_format_is_judged(cli, tmp_path, runs, fmt):
    _, _, mode, prints_lr = FORMATS[fmt]
    per_update = mode == "update"
    k = 1 if per_update else K  # a log of updates is one line per update: read with -k 1
    base = _write(tmp_path, "base", fmt, runs["base"], False)
    merged = {v: _write(tmp_path, v, fmt, runs[v], per_update) for v in runs if v != "base"}
    assert _judge(cli, tmp_path, base, merged["clean"], k) == (0, [])
    code, errors = _judge(cli, tmp_path, base, merged["loss x K"], k)
    # a window printed K times too large: `loss-averaging` where the log shows the K micro-steps
    # (one line per update read with -k 1 cannot say what K was)
    assert code == 1 and (per_update or errors[:1] == ["loss-averaging"]), errors
    code, errors = _judge(cli, tmp_path, base, merged["lr per micro"], k)
    assert code == 1
    if prints_lr:
        assert errors[:1] == ["lr-schedule"], errors


def test_a_step_printed_at_each_micro_step_needs_its_k(cli, tmp_path, runs):
    """Each update's step on K lines is read as its K micro-steps, with -k K alone; steps
    printed on uneven numbers of lines are refused."""
    fmt = "update's step at each micro-step"
    base = _write(tmp_path, "base", fmt, runs["base"], False)
    merged = _write(tmp_path, "clean", fmt, runs["clean"], False)
    result = cli("compare", base, merged, "-k", "2")
    assert result.code == 2 and "printed on 4 lines" in result.err and "-k 4" in result.err
    lines = merged.read_text().splitlines()
    uneven = tmp_path / "uneven.log"
    uneven.write_text("\n".join(lines[:5] + lines[6:]) + "\n", encoding="utf-8")
    result = cli("compare", base, uneven, "-k", "4")
    assert result.code == 2 and "uneven.log:8:" in result.err and "repeat unevenly" in result.err


@pytest.mark.parametrize(
    ("line", "said"),
    [("step 3, loss 1,588130", "'1,588130'"), ("step 3 loss 0.5 lr 1,0e-04", "'1,0e-04'")],
)
def test_a_value_printed_with_a_decimal_comma_is_refused(cli, tmp_path, line, said):
    """`loss 1,588130` was read as the integer 1: every loss equal, every bug passed."""
    base, log = tmp_path / "base.log", tmp_path / "comma.log"
    base.write_text("step 0 loss 0.5 lr 0.1\nstep 1 loss 0.5 lr 0.1\n", encoding="utf-8")
    log.write_text(f"step 0 loss 0.5 lr 0.1\n{line}\n", encoding="utf-8")
    one_line_error(cli("compare", base, log, "-k", "1"), "comma.log:2:", "decimal comma", said)


@pytest.mark.parametrize("spec", [".2e", ".3g", ".1E"])
def test_an_lr_k_times_too_large_printed_to_few_digits_is_lr_scaled(cli, tmp_path, runs, spec):
    """Printed to 2 or 3 digits, the ratio of the two lrs wanders by their rounding: the
    constant K went unseen (SCALE_MATCH is float32's), and the bug was named `lr-schedule`,
    whose fix (step the scheduler once per optimizer step) the loop already follows."""

    def log(name: str, run: tuple, times: float) -> Path:
        lines = [
            f"step {i} loss {v:.6f} lr {lr * times:{spec}}"
            for i, (v, lr) in enumerate(zip(*run, strict=True))
        ]
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    base = log("base", runs["base"], 1)
    assert _judge(cli, tmp_path, base, log("clean", runs["clean"], 1), K) == (0, [])
    code, errors = _judge(cli, tmp_path, base, log("lr", runs["clean"], K), K)
    assert code == 1 and errors[:1] == ["lr-scaled"], errors


def test_lightnings_metrics_csv_of_an_accumulated_run_says_it_holds_last_micro_batches(
    cli, tmp_path, runs
):
    """Lightning 2.6.6 under accumulate_grad_batches (automatic optimization) writes a row per
    optimizer step, its on_step loss the window's last micro-batch's (its logger skips the
    batches it accumulates). Given -k K, its rows were refused with "give it -k 1"; with -k 1
    the right run failed at update 0 naming nanoGPT's print among five causes. Both now say
    that this file cannot show the window's loss, and what to record instead."""

    def csv(name: str, losses: list[float]) -> Path:
        rows = [f"0,{u},{v!r}" for u, v in enumerate(losses)]
        path = tmp_path / f"{name}.csv"
        path.write_text("\n".join(["epoch,step,train_loss", *rows]) + "\n", encoding="utf-8")
        return path

    base = csv("k1", runs["base"][0])
    last = csv("k4", runs["clean"][0][K - 1 :: K])  # each window's last micro-batch's loss
    said = "Lightning's metrics.csv under accumulate_grad_batches holds one row per optimizer step"
    one_line_error(  # another writer's table of the same columns: one row per update, -k 1
        cli("compare", base, last, "-k", str(K)), said, "last micro-batch's", "read with -k 1"
    )
    code, errors = _judge(cli, tmp_path, base, last, 1)
    assert (code, errors) == (1, ["unexplained"])
    message = json.loads((tmp_path / "r.json").read_text())["diagnosis"][0]["message"]
    assert f"if the merged run accumulated, {said}" in message and "GradalignCallback" in message
    other = tmp_path / "k4.log"  # the same rows printed otherwise: no writer named
    other.write_text(
        "".join(f"step {u}, loss {v!r}\n" for u, v in enumerate(runs["clean"][0][K - 1 :: K]))
    )
    result = cli("compare", base, other, "-k", str(K))
    assert result.code == 2 and "give it -k 1" in result.err and "Lightning" not in result.err
