"""Linear least squares under SGD, written with numpy (gradalign.runs.portable): the runs of the
noise model's and the kinks' tests (tests/test_noise_model.py, tests/test_kink_follow.py,
tests/test_kink_excuses.py; tests/test_cross_sample.py takes them through
tests/test_noise_model.py): the float64 reference and the baseline (`runs`, a fixture), a merged
run with its recorded gradient altered, judged (`merged`), and the checks a comparison failed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gradalign import api
from gradalign.runs.portable import write_run


@dataclass(frozen=True)
class Shape:
    """The weight's rows and columns, the updates and the learning rate (16 samples a batch)."""

    rows: int = 40
    cols: int = 6
    updates: int = 12
    lr: float = 0.1


DEFAULT = Shape()
ROWS, COLS, UPDATES, LR = DEFAULT.rows, DEFAULT.cols, DEFAULT.updates, DEFAULT.lr


def data(seed: int = 0, shape: Shape = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(shape.updates * 16, shape.cols))
    return x, x @ rng.normal(size=(shape.cols, shape.rows)) * 0.1


def train(dtype, *, k: int = 1, spike=None, feed: bool = False, shape: Shape = DEFAULT) -> dict:
    """Linear least squares, SGD. `spike(update, grad)` alters the recorded gradient only (an
    activation crossing its kink in one run changes one unit's gradient at one update), or with
    `feed` the gradient the step is taken with too."""
    x, y = (v.astype(np.float32).astype(dtype) for v in data(shape=shape))
    # float32 initial weights for every run: the float64 reference starts from the same values
    w = np.random.default_rng(1).normal(size=(shape.rows, shape.cols)) * 0.1
    w = w.astype(np.float32).astype(dtype)
    init = {"w": w.copy()}
    snaps, grads, losses = [], [], []
    for u in range(shape.updates):
        g_sum = np.zeros_like(w)
        for j in range(k):
            rows = slice(u * 16 + j * 16 // k, u * 16 + (j + 1) * 16 // k)
            err = x[rows] @ w.T - y[rows]
            losses.append(float((err**2).mean()))
            g_sum += (2 * err.T @ x[rows] / err.size * shape.rows).astype(dtype)
        g = (g_sum / k).astype(dtype)
        recorded = spike(u, g.copy()) if spike else g
        grads.append({"w": recorded})
        w = (w - shape.lr * (recorded if feed else g)).astype(dtype)
        snaps.append({"w": w.copy()})
    return as_run(init, snaps, grads, losses)


def as_run(init: dict, snaps: list, grads: list, losses: list) -> dict:
    """A numpy loop's arrays as `write_run` takes them: one optimizer step per update, never
    inside a window."""
    return {
        "init_weights": init,
        "update_weights": snaps,
        "grads": grads,
        "micro_losses": losses,
        "optimizer_steps": [1] * len(snaps),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("noise")
    ref, base = reference_and_baseline(root, train)
    return {"root": root, "base": base, "ref": ref}


def reference_and_baseline(root, make) -> tuple:
    """The float64 reference and the float32 baseline (K=1) of a numpy loop, written under
    `root` (`ref`, `base`, which names the reference): `make(dtype)` gives a run's arrays."""
    ref = write_run(root / "ref", accum_steps=1, **make(np.float64))
    base = write_run(root / "base", accum_steps=1, reference="../ref", **make(np.float32))
    return ref, base


def merged(runs, name: str, spike, feed: bool = False) -> object:
    run = train(np.float32, k=4, spike=spike, feed=feed)
    path = write_run(runs["root"] / name, accum_steps=4, **run)
    return api.compare(runs["base"], path)


def one_row(update: int):
    def spike(u, g):
        if u == update:
            g[3] += 1e-3 * np.abs(g).max()  # one unit's row, one update
        return g

    return spike


def _failing(result) -> list[str]:
    return [c.name for c in result.checks if c.status == "fail"]
