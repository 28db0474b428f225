"""Losses a log prints smoothed, told from the numbers alone, and undone where that is exact.

Several suites print a statistic of recent losses on their step lines, not the step's own: an
epoch's running mean (PaddleClas's `AverageMeter.avg`), a median or mean over the last N steps
(PaddleDetection's and PaddleOCR's `SmoothedValue`). Each leaves a signature in the printed
sequence L_t (d_t = L_t - L_{t-1}, t counted from the epoch's first step, q_t its print
resolution):

- running mean: d_t = (l_t - L_{t-1}) / t, so its noise shrinks like 1/t within an epoch, where
  a step's own loss keeps its noise at every t: the slope of the log of second differences
  (relative to the loss) on log t is near -1, not near 0; confirmed where the printed t·d_t are
  nearly uncorrelated at lag 1 (a step loss's differences: about -1/2; a loss falling fast,
  then flat, shrinks its second differences too) and the step losses it implies have
  differences correlated about -1/2 at lag 1, as independent noise gives. Exactly
  invertible: l_t = t L_t - (t-1) L_{t-1}; a sum of consecutive recovered losses
  telescopes, so a window's error is at most t_b q_b + (t_a - 1) q_{a-1}, the noise allowance;
- moving median: piecewise constant, a printed value repeats (d_t = 0) on a large share of steps
  while the steps between repeats jump by many print quanta;
- trailing mean over N: d_t = (l_t - l_{t-N}) / N, so the steps d_t are uncorrelated at lag 1
  (a step's own loss: about -1/2, its noise enters two differences) and strongly anti-correlated
  at lag N.

The median and the trailing mean are not undone (the median loses the values; the trailing
mean's inversion carries every rounding error forward without bound): such a log is refused.
Numpy-only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ...errors import BadInput

MIN_DIFFS = 12  # fewer differences than this say nothing about a signature
RUNNING_SLOPE = -0.6  # noise scale on log t: a running mean's is -1, a step loss's about 0
RUNNING_MIN = 48  # fewer steps than this do not show a running mean's shrinking noise
PAIRED_SLOPE = -0.3  # ... where the pair's other log is one (raw logs: 5% below -0.22)
MIN_SPAN = 4.0  # t must span at least this factor within the epochs judged
REPEAT_SHARE = 0.25  # a median repeats its value on ~half the steps; a step loss almost never
REPEAT_JUMP = 10.0  # ... while the other steps move by many quanta (not coarse printing)
LAG1_MAX = -0.2  # a step loss's differences: about -1/2 at lag 1
LAGN_MIN = -0.3  # a trailing mean's differences: about -1/2 at lag N
MAX_LAG = 100
BINS = 6
MIN_BIN = 5  # a bin of fewer steps is one spike's

STEP_LOSS_ADVICE = (
    "print each step's own loss instead: PaddleClas logs `AverageMeter.avg`, log the meter's "
    "`.val`; PaddleDetection smooths over `log_iter` steps (set `log_iter: 1`), PaddleOCR over "
    "`Global.log_smooth_window` (set 1), MMEngine over its LogProcessor's `window_size` (set "
    "`log_processor=dict(window_size=1)`)"
)


@dataclass
class Signature:
    """A smoothing found in a log's losses: its kind and what showed it."""

    kind: str  # "running mean", "moving median", "trailing mean"
    evidence: str


def segments(count: int, starts: list[int]) -> list[tuple[int, int]]:
    """The [begin, end) spans of the epochs (a running mean restarts at each)."""
    edges = sorted({0, count, *(s for s in starts if 0 < s < count)})
    return list(pairwise(edges))


def running_mean_slope(values: np.ndarray, quanta: np.ndarray, spans) -> tuple[float, int, float]:
    """Slope of the noise's log-scale on log t within the epochs (NaN: too few steps to show
    it), how many steps showed it, and t's span. The noise is read from second differences
    relative to the loss (a smooth trend and a loss that shrinks with its noise leave it flat),
    as the median in each of a few log-t bins (a steep start is one bin, not a fit's lever)."""
    xs, ys = [], []
    for begin, end in spans:
        seg = values[begin:end]
        t = np.arange(1, end - begin + 1, dtype=np.float64)
        d2 = seg[2:] - 2 * seg[1:-1] + seg[:-2]
        level = np.abs(seg[2:])
        ok = np.isfinite(d2) & (d2 != 0) & (level > 0)  # a repeat says nothing of the scale
        xs.append(np.log(t[2:][ok]))
        ys.append(np.log(np.abs(d2[ok]) / level[ok]))
    x, y = np.concatenate(xs or [np.zeros(0)]), np.concatenate(ys or [np.zeros(0)])
    span = float(np.exp(np.ptp(x))) if x.size else 1.0
    if x.size < RUNNING_MIN or span < MIN_SPAN:
        return math.nan, int(x.size), span
    edges = np.linspace(x.min(), x.max(), BINS + 1)
    where = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, BINS - 1)
    bins = [b for b in range(BINS) if np.count_nonzero(where == b) >= MIN_BIN]
    if len(bins) < BINS - 2:
        return math.nan, int(x.size), span
    bx = np.array([np.median(x[where == b]) for b in bins])
    by = np.array([np.median(y[where == b]) for b in bins])
    return float(np.polyfit(bx, by, 1)[0]), int(x.size), span


def _printed_lag1(values: np.ndarray, spans) -> float:
    """The lag-1 correlation of the printed differences, each times its step's t in the epoch:
    a running mean's are t·d_t = l_t − L_{t−1}, nearly uncorrelated (−1/t); a step loss's own
    differences about −1/2 at every t. A loss that falls fast over its first steps, then stays
    flat and noisy, shrinks its second differences like a running mean's (t^-0.89 over 58
    steps): the printed differences tell them apart (+0.33 against −0.5 in the logs here)."""
    scaled = []
    for begin, end in spans:
        t = np.arange(2, end - begin + 1, dtype=np.float64)
        d = np.diff(values[begin:end]) * t
        scaled.append(d[np.isfinite(d)])
        scaled.append(np.array([np.nan]))  # no pair across an epoch's start
    joined = np.concatenate(scaled or [np.zeros(0)])
    a, b = joined[1:], joined[:-1]
    both = np.isfinite(a) & np.isfinite(b)
    return _corr(a[both], b[both])


@np.errstate(invalid="ignore", over="ignore")  # an inf loss's differences: nan, left out
def difference_lag1(values: np.ndarray) -> float | None:
    """The lag-1 correlation of a printed loss's differences (None: fewer than MIN_DIFFS): about
    −1/2 for a step's own loss, whose batch noise enters two differences; above LAG1_MAX for a
    smoothed one (an exponential moving average: +0.3 to +0.8 in the logs here)."""
    d = np.diff(np.asarray(values, dtype=np.float64))
    d = d[np.isfinite(d)]
    return _lag_corr(d, 1) if d.size >= MIN_DIFFS else None


def _lag_corr(d: np.ndarray, lag: int) -> float:
    return _corr(d[lag:], d[:-lag])


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Their correlation; 0 where fewer than 3 pairs or either does not vary."""
    if a.size < 3 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


@np.errstate(invalid="ignore", over="ignore")  # an inf loss's differences: nan, left out
def detect(
    values: np.ndarray,
    quanta: np.ndarray,
    starts: list[int],
    k: int,
    paired: bool = False,
    assumed: str | None = None,
) -> Signature | None:
    """The smoothing the printed losses show, if any (see the module's note). `paired`: the
    other log of the pair was found a running mean, so a weaker shrinking (`PAIRED_SLOPE`) with
    the same confirmation is taken for one too. `assumed`: what says the log's form prints an
    epoch's running mean (`ParsedLog.running_mean`), taken unless its numbers vary as a step's
    own loss does (noise that does not shrink, differences anti-correlated at lag 1)."""
    finite = np.isfinite(values)
    if finite.sum() <= MIN_DIFFS:
        return _assumed(assumed, f"{int(finite.sum())} steps are too few to see it in them")
    spans = segments(values.size, starts)
    slope, count, _ = running_mean_slope(values, quanta, spans)
    step_like = slope > RUNNING_SLOPE and _printed_lag1(values, spans) <= LAG1_MAX
    if assumed is not None and not step_like:
        if math.isnan(slope):
            seen = "too few to see it in them"
        elif slope <= RUNNING_SLOPE:
            seen = f"their noise shrinks like t^{slope:.2f}, as a running mean's does"
        else:
            seen = "their differences do not vary as a step's own loss does"
        return _assumed(assumed, f"{count} steps: {seen}")
    if math.isnan(slope):
        return _window(values, quanta, k)
    shrinks = f"its noise shrinks like t^{slope:.2f} within each epoch over {count} steps"
    shrinking = slope <= (PAIRED_SLOPE if paired else RUNNING_SLOPE)
    if shrinking and _printed_lag1(values, spans) <= LAG1_MAX:
        # a step loss's own differences: a fast early fall's curvature, not a mean, shrank them
        return _window(values, quanta, k)
    if shrinking:
        # confirmed where the losses it implies vary like step losses: independent noise (and
        # the print's rounding) gives their differences a lag-1 correlation near -1/2, where a
        # trailing mean read as a running mean leaves its own near 0
        losses, _ = invert_running_mean(values, quanta, starts, 1)
        steps = np.diff(losses)
        lag1 = _lag_corr(steps[np.isfinite(steps)], 1)
        if lag1 <= LAG1_MAX:
            return Signature(
                "running mean",
                f"{shrinks}; the steps' own losses it implies "
                f"vary like step losses (lag-1 {lag1:+.2f})",
            )
    window = _window(values, quanta, k)
    if window is not None or slope > RUNNING_SLOPE:
        return window
    return Signature("mean of a kind not undone", f"{shrinks}, but not as a running mean does")


def _assumed(assumed: str | None, seen: str) -> Signature | None:
    """The running mean a log's form prints, with what its numbers showed of it."""
    return None if assumed is None else Signature("running mean", f"{assumed}; {seen}")


def _window(values: np.ndarray, quanta: np.ndarray, k: int) -> Signature | None:
    """A moving median's repeats, or a trailing mean's correlations (see the module's note)."""
    d = np.diff(values)
    q = quanta[1:]
    ok = np.isfinite(d) & np.isfinite(q)
    if k > 1 and not np.any(d[ok & (np.arange(1, values.size) % k != 0)]):
        ok &= np.arange(1, values.size) % k == 0  # a window's loss printed at each micro-step
    d, q = d[ok], q[ok]
    if d.size < MIN_DIFFS:
        return None
    moved = d != 0
    share = 1.0 - moved.mean()
    if share >= REPEAT_SHARE and moved.any():
        jump = float(np.median(np.abs(d[moved]) / q[moved]))
        if jump >= REPEAT_JUMP:
            return Signature(
                "moving median",
                f"{share:.0%} of its steps repeat the last value, the others move by "
                f"{jump:.0f} print quanta (median)",
            )
    if d.size >= 4 * MIN_DIFFS:
        lag1 = _lag_corr(d, 1)
        lags = range(2, min(MAX_LAG, d.size // 4) + 1)
        corr = {lag: _lag_corr(d, lag) for lag in lags}
        if corr and lag1 > LAG1_MAX:
            lag, low = min(corr.items(), key=lambda item: item[1])
            if low < min(LAGN_MIN, -4.0 / np.sqrt(d.size)):
                return Signature(
                    "trailing mean",
                    f"its steps correlate {lag1:+.2f} at lag 1 and {low:+.2f} at lag {lag}: a "
                    f"mean over about {lag} steps",
                )
    return None


def invert_running_mean(
    values: np.ndarray, quanta: np.ndarray, starts: list[int], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's loss from an epoch's running mean, and per-step quanta whose window means are
    the bound on each window mean's error (the telescoped sum; a window never sees less)."""
    spans = segments(values.size, starts)
    losses = np.empty_like(values)
    count = np.empty_like(values)
    for begin, end in spans:
        t = np.arange(1, end - begin + 1, dtype=np.float64)
        seg = values[begin:end]
        count[begin:end] = t
        losses[begin] = seg[0]
        losses[begin + 1 : end] = t[1:] * seg[1:] - t[:-1] * seg[:-1]
    first = np.zeros(values.size, dtype=bool)
    first[[b for b, _ in spans]] = True
    out = np.empty_like(values)
    for a in range(0, values.size, k):
        b = min(a + k, values.size)
        bound, piece = 0.0, a
        for m in range(a, b):  # pieces of the window inside one epoch each telescope
            if m + 1 == b or first[m + 1]:
                bound += count[m] * quanta[m]
                if not first[piece]:
                    bound += count[piece - 1] * quanta[piece - 1]
                piece = m + 1
        out[a:b] = bound / (b - a)
    return losses, out


def unsmooth(
    values: np.ndarray,
    quanta: np.ndarray,
    starts: list[int],
    k: int,
    where: str,
    stride: int,
    paired: bool = False,
    assumed: str | None = None,
) -> tuple[np.ndarray, np.ndarray, Signature | None]:
    """The step losses a log's printed losses stand for: as printed, or recovered from an
    epoch's running mean (`assumed`: see `detect`); a smoothing that cannot be undone is refused
    (BadInput)."""
    found = detect(values, quanta, starts, k, paired, assumed)
    if found is None:
        return values, quanta, None
    what = f"{where}: its losses look like a {found.kind} ({found.evidence}), not each step's own"
    if found.kind != "running mean":
        raise BadInput(f"{what}; a {found.kind} cannot be undone: {STEP_LOSS_ADVICE}")
    if stride != 1 or not np.isfinite(values).all():
        why = "steps are missing from the print" if stride != 1 else "a loss is not finite"
        raise BadInput(f"{what}; it cannot be undone ({why}): {STEP_LOSS_ADVICE}")
    losses, bounds = invert_running_mean(values, quanta, starts, k)
    again = detect(losses, bounds, starts, k)
    if again is not None and again.kind == "running mean":
        raise BadInput(f"{what}; undoing it leaves another {again.kind}: {STEP_LOSS_ADVICE}")
    return losses, bounds, found
