"""`batch-size`: K set and the batch per micro-step left at the baseline's B, so each window
holds K·B rows (the commonest mistake with `gradient_accumulation_steps`), is named first, with
the rows each run held and the batch to give; what follows from it (uneven windows as the data
runs out, other samples) is not named beside it. A batch whose leading dimension is not its rows
(time first) counts alike in both runs: another bug is named as itself."""

from __future__ import annotations

import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

from .conftest import one_line_error
from .recorded_loop import train

BATCH, FEATURES, K = 16, 6, 4


def _data(rows: int = 12 * BATCH):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, FEATURES, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 12), nn.Tanh(), nn.Linear(12, 3))


def _run(out, k: int, batch: int):
    """12 updates of `batch` rows (the data as long as they need: a Trainer's max_steps)."""
    model = _model()
    x, y = _data(12 * batch)
    train(out, model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, k, batch=batch)
    return read_run_dir(out)


def test_micro_batches_of_the_whole_batch_are_named(tmp_path):
    base = _run(tmp_path / "base", 1, BATCH)
    assert compare(base, _run(tmp_path / "clean", K, BATCH)).verdict == "pass"
    c = compare(base, _run(tmp_path / "bug", K, K * BATCH))  # B rows per micro-step
    assert c.verdict == "fail"
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    assert codes == ["batch-size"], [(d.code, d.message) for d in c.diagnosis]
    first = c.diagnosis[0]
    assert first.evidence["merged_window_rows"] == K * BATCH
    assert first.evidence["merged_micro_rows"] == BATCH == first.evidence["baseline_rows"]
    assert "not divided by K=4" in first.message
    assert f"give each micro-step {BATCH // K} rows" in first.fix


def test_where_the_data_ran_out_sooner_the_refusal_says_why(cli, tmp_path):
    model, (x, y) = _model(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(tmp_path / "bug", model, opt, x, y, K, batch=K * BATCH)  # 3 windows of 4B rows
    _run(tmp_path / "base", 1, BATCH)
    result = cli("compare", tmp_path / "base", tmp_path / "bug")
    one_line_error(result, "holds 16 rows, the baseline's whole batch", "not divided by K=4")


def _time_first(out, k: int, scale: float):
    """The batch given to the Recorder as (features, rows): its leading size is not the rows."""
    model = _model()
    x, y = _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(x.shape[0] // BATCH):
            for j in range(k):
                rows = slice(u * BATCH + j * n, u * BATCH + (j + 1) * n)
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss * scale / k).backward()
                rec.micro(loss, batch=(x[rows].T.contiguous(),))
            opt.step()
            rec.update()
            opt.zero_grad()
    return read_run_dir(out)


def test_a_leading_size_that_is_not_the_rows_names_the_other_bug(tmp_path):
    base = _time_first(tmp_path / "base", 1, 1.0)
    c = compare(base, _time_first(tmp_path / "bug", K, float(K)))  # the loss not divided by K
    assert c.verdict == "fail"
    assert c.diagnosis[0].code == "loss-scale", [(d.code, d.message) for d in c.diagnosis]
    assert "batch-size" not in [d.code for d in c.diagnosis]


def test_a_log_of_one_line_per_update_read_with_k_is_told_both_ways(cli, tmp_path):
    """A log whose lines count the whole batch, as many lines as the baseline's updates, read
    with -k 4: one line per update read per micro-step, or micro-batches of the whole batch
    printed per micro-step; the counts cannot tell which, so both are said, -k 1 first."""

    def log(path, losses):
        lines = [
            f"train_inner | epoch 001: {i + 1:6d} / 16 loss={value:.3f}, bsz=64, "
            f"num_updates={i + 1}, lr=0.1"
            for i, value in enumerate(losses)
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    losses = [3.3 - 0.05 * i for i in range(16)]
    base, merged = log(tmp_path / "base.log", losses), log(tmp_path / "merged.log", losses)
    assert cli("compare", base, merged, "-k", "1").code == 0
    result = cli("compare", base, merged, "-k", "4")
    one_line_error(result, "give it -k 1", "not divided by K=4")
