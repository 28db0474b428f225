"""What a printed number is known to: each stream of prints at its own printer's digits, and a
value printed from a 16-bit tensor no closer than that type's spacing."""

from __future__ import annotations

import json

import numpy as np

UPDATES = 6


def _training() -> tuple[list[float], list[np.ndarray]]:
    """A float32 least-squares SGD run: each update's loss and the weights it left."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal(16)
    w = (0.1 * rng.standard_normal((4, 3))).astype(np.float32)
    losses, weights = [], []
    for _ in range(UPDATES):
        err = x @ w - y[:, None].astype(np.float32)
        losses.append(float(np.mean(err * err)))
        w = (w - np.float32(0.05) * (x.T @ err) / np.float32(16)).astype(np.float32)
        weights.append(w.copy())
    return losses, weights


def _tensor(values: np.ndarray, dtype: str) -> str:
    """A Paddle dygraph print of a 2-D tensor (8 digits, as Paddle prints)."""
    rows = ",\n        ".join("[" + ", ".join(f"{v: .8f}" for v in row) + "]" for row in values)
    return (
        f"Tensor(shape={list(values.shape)}, dtype={dtype}, place=Place(gpu:0), "
        f"stop_gradient=False,\n       [{rows}])"
    )


def _paddle_log(path, losses, weights, dtype: str) -> None:
    lines = []
    for i, (loss, w) in enumerate(zip(losses, weights, strict=True)):
        lines.append(f"{i}   [{loss:.8f}]")
        lines.append("Parameter containing:")
        lines.append(_tensor(w.astype(np.float16).astype(np.float64), dtype))
    path.write_text("\n".join(lines) + "\n")


def _flip(weights: list[np.ndarray]) -> list[np.ndarray]:
    """The same weights, one element of the last update one float16 step away: what float32
    noise of one ulp does to a float16 print across a rounding boundary."""
    flipped = [w.copy() for w in weights]
    last = flipped[-1].astype(np.float16)
    last[1, 2] = np.nextafter(last[1, 2], np.float16(np.inf))
    flipped[-1] = last.astype(np.float32)
    return flipped


def _verdict(cli, tmp_path, base, merged) -> tuple[int, dict]:
    report = tmp_path / "r.json"
    result = cli("compare", base, merged, "-k", "1", "--json", report)
    assert result.code in (0, 1), result.out + result.err
    return result.code, json.loads(report.read_text())


def test_float16_prints_are_known_to_their_spacing(cli, tmp_path):
    losses, weights = _training()
    base, merged = tmp_path / "base.log", tmp_path / "merged.log"
    _paddle_log(base, losses, weights, "float16")
    _paddle_log(merged, losses, _flip(weights), "float16")
    code, data = _verdict(cli, tmp_path, base, merged)
    assert code == 0, data["diagnosis"]
    # the same digits said to be float32 are known to 1e-8: the flip is beyond that
    _paddle_log(base, losses, weights, "float32")
    _paddle_log(merged, losses, _flip(weights), "float32")
    assert _verdict(cli, tmp_path, base, merged)[0] == 1
    # a real difference in float16 prints still fails
    _paddle_log(base, losses, weights, "paddle.float16")
    _paddle_log(merged, losses, [w * np.float32(1.01) for w in weights], "paddle.float16")
    assert _verdict(cli, tmp_path, base, merged)[0] == 1


def test_bfloat16_losses_are_known_to_their_spacing(cli, tmp_path):
    losses, _ = _training()

    def log(path, shift: int) -> None:  # torch's repr of a bfloat16 loss, 4 digits or more
        lines = []
        for i, loss in enumerate(losses):
            bits = np.float32(loss).view(np.uint32) >> 16 << 16  # bfloat16 by truncation
            value = float((bits + (shift << 16 if i == 3 else 0)).view(np.float32))
            lines.append(f"step {i} loss: tensor({value:.8f}, dtype=torch.bfloat16)")
        path.write_text("\n".join(lines) + "\n")

    base, merged = tmp_path / "base.log", tmp_path / "merged.log"
    log(base, 0)
    log(merged, 1)  # one bfloat16 step apart at update 3
    assert _verdict(cli, tmp_path, base, merged)[0] == 0
    log(merged, 8)  # eight
    assert _verdict(cli, tmp_path, base, merged)[0] == 1


def test_each_stream_has_its_printers_digits(cli, tmp_path):
    """Losses printed by numpy at precision 4 beside weights at 8 digits: the losses are known
    to 1e-4, not to the weights' 1e-8."""
    losses, weights = _training()

    def log(path, losses, digits: int) -> None:
        lines = []
        for i, (loss, w) in enumerate(zip(losses, weights, strict=True)):
            lines.append(f"{i}   [{loss:.{digits}f}]")
            rows = " ".join("[" + " ".join(f"{v: .8f}" for v in row) + "]" for row in w)
            lines.append(f"------------>[{rows}]")
        path.write_text("\n".join(lines) + "\n")

    base, merged = tmp_path / "base.log", tmp_path / "merged.log"
    nudged = [loss + 1e-4 * (i == 2) for i, loss in enumerate(losses)]  # one 4-digit step
    log(base, losses, 4)
    log(merged, nudged, 4)
    assert _verdict(cli, tmp_path, base, merged)[0] == 0
    log(base, losses, 8)
    log(merged, nudged, 8)  # printed at 8 digits, 1e-4 is a difference
    assert _verdict(cli, tmp_path, base, merged)[0] == 1


def test_a_plain_array_line_is_cleaned_as_before():
    from gradalign.runs.logs.cleaned import clean

    assert clean("  [ 0.5 -0.25 1e-05 nan]  ") == "[ 0.5 -0.25 1e-05 nan]"
    assert clean("- [0.5]") == "[0.5]"  # a logger's lone `-` prefix is still dropped
    assert clean("[rank1]: [0.5]") == "[0.5]"
    assert clean("\x1b[32m[0.5]\x1b[0m") == "[0.5]"


def test_exact_short_values_keep_the_logs_precision(cli, tmp_path):
    """A frozen tensor printed as `[1. 1. 1. 1.]` shows no printer's precision (any printer
    shows 1.0 so): it is known to the log's 8 digits, and a merged run that moves it fails."""
    losses, weights = _training()

    def log(path, frozen: float) -> None:
        lines = []
        for i, (loss, w) in enumerate(zip(losses, weights, strict=True)):
            lines.append(f"{i}   [{loss:.8f}]")
            lines.append("------------>[" + " ".join(f"{v:.8f}" for v in w.ravel()) + "]")
            gamma = np.full(4, 1.0 if i < 3 else frozen)
            lines.append("------------>" + np.array2string(gamma, precision=8))
        path.write_text("\n".join(lines) + "\n")

    base, merged = tmp_path / "base.log", tmp_path / "merged.log"
    log(base, 1.0)
    log(merged, 1.0)
    assert _verdict(cli, tmp_path, base, merged)[0] == 0
    log(merged, 1.0001)
    assert _verdict(cli, tmp_path, base, merged)[0] == 1
