"""How the smoothed-loss detector (gradalign/runs/logs/smooth.py) reads generated logs: step
losses taken for smoothed ones (false), and epoch running means found as such.

240 logs of each: three curves (an exponential fall over the run, a slow power law, and a fall
over the first few steps, then flat), Gaussian noise of 0.3%, 2%, 10% and 50% of the loss, 1-3
epochs of 30-600 steps, printed at 4, 5, 6 or 8 decimals.

    .venv/bin/python bench/smoothing_rates.py
"""

from __future__ import annotations

import json

import numpy as np

from gradalign.runs.logs.smooth import detect

CURVES = (
    lambda t: 0.5 + 2.0 * np.exp(-t / (0.2 * t.size)),
    lambda t: 1.5 * (1 + t) ** -0.3,
    lambda t: 1.4 + 0.7 * np.exp(-t / 4),
)
NOISES = (0.003, 0.02, 0.1, 0.5)


def main() -> None:
    rng = np.random.default_rng(0)
    rows = {
        noise: {"logs": 0, "raw_taken_for_smoothed": 0, "running_mean_found": 0} for noise in NOISES
    }
    for rep in range(240):
        noise, epochs = NOISES[rep % 4], 1 + rep % 3
        per, digits = (30, 60, 120, 300, 600)[rep % 5], (4, 5, 6, 8)[(rep // 4) % 4]
        t = np.arange(per * epochs, dtype=np.float64)
        step = np.abs(CURVES[rep % 3](t) * (1 + noise * rng.standard_normal(t.size)))
        starts = [e * per for e in range(epochs)]
        running = np.concatenate(
            [np.cumsum(step[s : s + per]) / np.arange(1, per + 1) for s in starts]
        )
        quanta = np.full(t.size, 0.5 * 10.0**-digits)
        raw = detect(np.round(step, digits), quanta, starts, 1)
        mean = detect(np.round(running, digits), quanta, starts, 1)
        row = rows[noise]
        row["logs"] += 1
        row["raw_taken_for_smoothed"] += raw is not None
        row["running_mean_found"] += mean is not None and mean.kind == "running mean"
    print(json.dumps({f"noise {n:g}": r for n, r in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
