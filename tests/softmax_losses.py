"""The numpy training behind the log tests: a softmax regression whose every micro-step's loss
and lr are printed into logs of any format."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def train(
    k: int,
    *,
    updates: int,
    batch: int,
    features: int,
    classes: int,
    lr: Callable[[int], float],
    fast: bool = False,
    seed: int = 0,
    learnable: bool = False,
) -> tuple[list[float], list[float]]:
    """Batch `batch` per update in `k` micro-batches (gradients averaged): each micro-step's loss
    and the lr in force at it. `fast`: the schedule steps per micro-step. `learnable`: labels
    follow a hidden linear rule (the loss falls), else they are random."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(updates * batch, features)).astype(np.float32)
    if learnable:
        truth = rng.normal(size=(features, classes)).astype(np.float32)
        y = np.argmax(x @ truth + rng.gumbel(size=(updates * batch, classes)) * 2, axis=1)
    else:
        y = rng.integers(0, classes, updates * batch)
    w = np.zeros((features, classes), np.float32)
    losses, lrs, t = [], [], 0
    for u in range(updates):
        grad = np.zeros_like(w)
        for m in range(k):
            rows = slice(u * batch + m * batch // k, u * batch + (m + 1) * batch // k)
            z = x[rows] @ w
            p = np.exp(z - z.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            at = np.arange(len(p)), y[rows]
            losses.append(float(np.float32(-np.log(p[at]).mean())))
            p[at] -= 1
            grad += (x[rows].T @ p / np.float32(len(p) * k)).astype(np.float32)
            lrs.append(lr(t if fast else u))
            t += 1
        w -= np.float32(lrs[-1]) * grad
    return losses, lrs
