"""Logs whose step lines print a smoothed loss: PaddleClas's epoch running mean is told from the
numbers and undone (a clean pair passes, real bugs still fail); a moving median or trailing mean
(PaddleDetection's and PaddleOCR's `SmoothedValue`) is refused, naming what to print; unsmoothed
noisy losses are never taken for smoothed ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradalign.api import compare
from gradalign.runs.logs import read_log
from gradalign.runs.logs.smooth import detect, invert_running_mean

from .conftest import one_line_error
from .softmax_losses import train

K, B, D, C, PER_EPOCH, EPOCHS = 4, 64, 16, 6, 120, 2
N = PER_EPOCH * EPOCHS


def _lr(t: int) -> float:
    return 0.5 * min(1.0, (t + 1) / 10) * (1 - t / (N * K + 1))


def _train(k: int, fast: bool = False, seed: int = 1) -> tuple[np.ndarray, list[float]]:
    """Softmax regression, B=64 per update in k micro-batches (gradients averaged): each
    micro-step's loss and the lr it printed; `fast` steps the schedule per micro-step."""
    losses, lrs = train(
        k, updates=N, batch=B, features=D, classes=C, lr=_lr, fast=fast, seed=seed, learnable=True
    )
    return np.array(losses), lrs


def _smoothed(losses: np.ndarray, per: int, kind: str) -> np.ndarray:
    out = np.empty_like(losses)
    for i in range(losses.size):
        if kind == "running":  # an AverageMeter reset each epoch
            out[i] = losses[(i // per) * per : i + 1].mean()
        elif kind == "median":  # SmoothedValue over the last 20
            out[i] = np.median(losses[max(0, i - 19) : i + 1])
        else:
            out[i] = losses[max(0, i - 19) : i + 1].mean()
    return out


def _clas(
    path: Path, losses: np.ndarray, lrs: list[float], k: int, kind: str, form: str = ""
) -> Path:
    """PaddleClas's (kind running, or form "ppcls") or PaddleOCR's step lines (form "ppocr"),
    every step printed; kind "val": each step's own loss."""
    per = PER_EPOCH * k
    lines = []
    shown = losses if kind == "val" else _smoothed(losses, per, kind)
    for i, (v, lr) in enumerate(zip(shown, lrs, strict=True)):
        ep, it = i // per + 1, i % per
        if form == "ppcls" or (kind == "running" and form != "ppocr"):
            lines.append(
                f"[2026/11/23 00:00:00] ppcls INFO: [Train][Epoch {ep}/{EPOCHS}][Iter: {it}/"
                f"{per}]lr(LinearWarmup): {lr:.8f}, CELoss: {v:.5f}, loss: {v:.5f}, "
                "batch_cost: 0.1s"
            )
        else:
            lines.append(
                f"[2026/11/23 00:00:00] ppocr INFO: epoch: [{ep}/{EPOCHS}], global_step: {i + 1}, "
                f"lr: {lr:.6f}, loss: {v:.6f}, avg_reader_cost: 0.01 s"
            )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[np.ndarray, list[float]]]:
    clean = _train(K)
    return {
        "base": _train(1),
        "clean": clean,
        "loss x K": (clean[0] * K, clean[1]),
        "lr per micro": _train(K, fast=True),
    }


def _pair(tmp_path: Path, runs: dict, merged: str, kind: str) -> tuple[Path, Path]:
    base = _clas(tmp_path / "base.log", *runs["base"], 1, kind)
    return base, _clas(tmp_path / "merged.log", *runs[merged], K, kind)


def test_a_running_mean_is_undone_and_a_clean_pair_passes(cli, tmp_path, runs):
    """PaddleClas prints the epoch's mean loss: read as step losses the clean pair failed
    `unexplained`; recovered, it passes, saying so, and the steps' losses are the true ones to
    within the print's rounding times t."""
    base, merged = _pair(tmp_path, runs, "clean", "running")
    run = read_log(merged, K)
    assert run.config["smoothed"] == "running mean"
    truth = runs["clean"][0]
    count = np.tile(np.arange(1, PER_EPOCH * K + 1), EPOCHS)
    assert np.all(np.abs(run.micro_loss - truth) <= 2 * count * 1e-5)
    result = cli("compare", base, merged, "-k", str(K), "--json", tmp_path / "r.json")
    assert result.code == 0, result.out + result.err
    notes = " ".join(result.json(tmp_path / "r.json")["notes"])
    assert "running mean" in notes and "recovered" in notes


@pytest.mark.parametrize(("merged", "cause"), [("loss x K", ""), ("lr per micro", "lr-schedule")])
def test_bugs_still_fail_on_a_running_mean(cli, tmp_path, runs, merged, cause):
    base, merged_log = _pair(tmp_path, runs, merged, "running")
    result = cli("compare", base, merged_log, "-k", str(K))
    assert result.code == 1, result.out + result.err
    assert cause in result.out


@pytest.mark.parametrize(
    ("kind", "shown"),
    [("median", "moving median"), ("mean", "trailing mean")],
)
@pytest.mark.parametrize("merged", ["clean", "loss x K", "lr per micro"])
def test_a_window_smoothing_is_refused(cli, tmp_path, runs, kind, shown, merged):
    """A median or mean over the last 20 steps is not undone: refused in one line naming it and
    the options that print each step's loss; never passed, bug or not."""
    base, merged_log = _pair(tmp_path, runs, merged, kind)
    result = cli("compare", base, merged_log, "-k", str(K))
    one_line_error(result, shown, "log_iter: 1", "Global.log_smooth_window", "`.val`")


def test_a_weaker_running_mean_is_taken_where_its_pair_shows_one(cli, tmp_path):
    """Seed 3's baseline alone does not show a running mean clearly enough (its noise shrinks
    like t^-0.35); its merged log does, so the baseline is read again as one: the clean pair
    passes, the lr bug still fails. Lines of a form that does not say it prints a mean."""
    base = _clas(tmp_path / "base.log", *_train(1, seed=3), 1, "running", "ppocr")
    assert "smoothed" not in read_log(base, 1).config
    assert read_log(base, 1, paired=True).config["smoothed"] == "running mean"
    clean = _clas(tmp_path / "clean.log", *_train(K, seed=3), K, "running", "ppocr")
    assert cli("compare", base, clean, "-k", str(K)).code == 0
    fast = _clas(tmp_path / "fast.log", *_train(K, fast=True, seed=3), K, "running", "ppocr")
    result = cli("compare", base, fast, "-k", str(K))
    assert result.code == 1 and "lr-schedule" in result.out


def _first(run: tuple[np.ndarray, list[float]], updates: int, k: int):
    return run[0][: updates * k], run[1][: updates * k]


@pytest.mark.parametrize("updates", [10, 30])
def test_a_paddleclas_log_too_short_to_show_its_running_mean_is_read_as_one(
    cli, tmp_path, runs, updates
):
    """PaddleClas's step lines print `AverageMeter.avg`: a log of fewer steps than show a
    running mean in the numbers (10 and 30 updates, under `RUNNING_MIN`) is read as one by its
    form, so the clean pair passes (read as printed it failed); the bugs still fail. The same
    numbers in a form that says nothing of a mean are read as printed."""
    base = _clas(tmp_path / "base.log", *_first(runs["base"], updates, 1), 1, "running")
    clean = _clas(tmp_path / "clean.log", *_first(runs["clean"], updates, K), K, "running")
    run = read_log(clean, K)
    assert run.config["smoothed"] == "running mean"
    assert "PaddleClas" in " ".join(run.notes)
    result = cli("compare", base, clean, "-k", str(K))
    assert result.code == 0, result.out + result.err
    for bug, cause in (("loss x K", ""), ("lr per micro", "lr-schedule")):
        merged = _first(runs[bug], updates, K)
        bugged = _clas(tmp_path / "bug.log", *merged, K, "running")
        result = cli("compare", base, bugged, "-k", str(K))
        assert result.code == 1 and cause in result.out, result.out + result.err
    other = _clas(tmp_path / "other.log", *_first(runs["base"], updates, 1), 1, "running", "ppocr")
    assert "smoothed" not in read_log(other, 1).config


def test_a_paddleclas_form_whose_numbers_are_step_losses_is_read_as_printed(cli, tmp_path, runs):
    """A PaddleClas fork that prints each step's own loss (the meter's `.val`): its numbers, of
    enough steps to tell, vary as step losses do, and they decide over the form."""
    base = _clas(tmp_path / "base.log", *runs["base"], 1, "val", "ppcls")
    clean = _clas(tmp_path / "clean.log", *runs["clean"], K, "val", "ppcls")
    assert "[Train][Epoch 1/2][Iter: 0/480]" in clean.read_text()
    assert "smoothed" not in read_log(clean, K).config
    assert "smoothed" not in read_log(base, 1).config
    result = cli("compare", base, clean, "-k", str(K))
    assert result.code == 0, result.out + result.err


def test_one_smoothed_log_against_one_as_printed_is_refused(cli, tmp_path, runs):
    base = _clas(tmp_path / "base.log", *runs["base"], 1, "running")
    losses = runs["clean"][0]
    merged = tmp_path / "merged.log"
    merged.write_text("".join(f"step {i}, loss {v:.6f}\n" for i, v in enumerate(losses)))
    result = cli("compare", base, merged, "-k", str(K))
    one_line_error(result, "base.log: its losses were read as a running mean", "merged.log")


@pytest.mark.parametrize("seed", range(12))
def test_noisy_unsmoothed_losses_show_no_smoothing(seed):
    """Step losses over a decaying curve, noise from 0.3% to 50% (Gaussian or heavy-tailed),
    printed with 4 to 8 digits, 1 to 3 epochs: none is taken for smoothed."""
    rng = np.random.default_rng(seed)
    per, epochs = int(rng.integers(48, 400)), int(rng.integers(1, 4))
    t = np.arange(per * epochs, dtype=np.float64)
    curve = 0.3 + rng.uniform(0.5, 4) * np.exp(-t / rng.uniform(5, per))
    noise = rng.standard_t(3, t.size) if seed % 2 else rng.standard_normal(t.size)
    sigma = [0.003, 0.02, 0.1, 0.5][seed % 4]
    digits = 4 + seed % 5
    values = np.round(np.abs(curve * (1 + sigma * noise)), digits)
    starts = [per * e for e in range(1, epochs)]
    assert detect(values, np.full(t.size, 10.0**-digits), starts, 1) is None


def test_a_running_mean_inverts_exactly_and_windows_telescope():
    """l_t = t L_t - (t-1) L_(t-1) within each epoch; a window's allowance is its telescoped
    rounding bound, not the sum of each step's."""
    losses = np.array([3.0, 1.0, 2.0, 6.0, 5.0, 1.0])
    printed = np.array([3.0, 2.0, 2.0, 3.0, 5.0, 3.0])  # epochs of 4 and 2 steps
    q = np.full(6, 0.01)
    got, bound = invert_running_mean(printed, q, [4], 2)
    assert got.tolist() == losses.tolist()
    # windows [0,1] (2*q), [2,3] (4*q + 2*q), [4,5] (2*q): spread over each window's steps
    assert np.allclose(bound, [0.01, 0.01, 0.03, 0.03, 0.01, 0.01])


def test_a_loss_falling_fast_then_flat_is_not_taken_for_a_running_mean():
    """A step loss's printed differences are anti-correlated at lag 1 (about -1/2), a running
    mean's nearly not: its shrinking second differences were the fall's curvature
    (fixtures/logs/fast_fall: 7 of 12 such clean pairs failed or were refused)."""
    from gradalign import api

    from .conftest import FIXTURES

    logs = FIXTURES / "logs" / "fast_fall"
    for name in ("base.log", "merged.log"):
        values = np.array(
            [float(line.split()[-1]) for line in (logs / name).read_text().split("\n") if line]
        )
        assert detect(values, np.full(values.size, 5e-7), [], 1) is None
    result = api.compare(logs / "base.log", logs / "merged.log", accum_steps=K)
    assert result.verdict == "pass", [d.message for d in result.diagnosis]
    assert not any("running mean" in note for note in result.notes)


def _ema(path: Path, losses: np.ndarray, per: int) -> Path:
    """Ignite's RunningAverage (alpha 0.98) over the step losses, as its examples print it."""
    lines, value = [], None
    for i, loss in enumerate(losses):
        value = loss if value is None else 0.98 * value + 0.02 * loss
        lines.append(f"Epoch[{i // per + 1}] Iteration[{i % per + 1}/{per}] Loss: {value:.4f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_exponential_moving_average_fails_saying_the_losses_look_smoothed(tmp_path, runs):
    """An EMA is not undone (its alpha is not printed); the clean pair fails on its losses, and
    `unexplained` says the printed losses move in correlated steps, as a smoothed loss's do. A
    pair of step losses apart is not said to be smoothed."""
    base = _ema(tmp_path / "base.log", runs["base"][0], PER_EPOCH)
    merged = _ema(tmp_path / "merged.log", runs["clean"][0], PER_EPOCH * K)
    c = compare(base, merged, accum_steps=K)
    assert c.verdict == "fail" and c.first_divergence["in"] == "loss"
    assert c.diagnosis[0].code == "unexplained"
    assert "move in correlated steps, as a smoothed loss does" in c.diagnosis[0].message
    raw = tmp_path / "raw.log"
    raw.write_text("".join(f"step {i} loss {v:.6f}\n" for i, v in enumerate(runs["clean"][0])))
    shifted = tmp_path / "shifted.log"
    shifted.write_text(
        "".join(f"step {i} loss {v + 0.01:.6f}\n" for i, v in enumerate(runs["base"][0]))
    )
    c = compare(shifted, raw, accum_steps=K)
    assert c.first_divergence["update"] == 0
    assert "correlated steps" not in c.diagnosis[0].message
