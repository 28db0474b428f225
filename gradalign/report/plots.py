"""Plots of a comparison, for people who would rather look than read (the optional extra
`gradalign[plot]`: matplotlib's object API on the Agg backend, never pyplot, no global state):

- `loss.png`: the baseline loss and the merged run's window means per update (and the merged
  micro-step losses, faint; the float64 reference's loss, dashed);
- `error.png`: |error| per update on a log scale, for the loss, the worst weight and the worst
  gradient, against the baseline's own noise (a band) and the allowed bound;
- `heatmap.png`: err/allowed per tensor and update (weights and gradients), 1 is the bound.

PNG files carry no timestamp or version: the same comparison gives the same bytes.
"""

from __future__ import annotations

import io
import logging
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadInput
from ..judge.results import Comparison, UpdateResult
from .output import write_bytes_atomic

PLOTS = ("loss.png", "error.png", "heatmap.png")
CAPTIONS = {
    "loss.png": "baseline loss and merged window means per update",
    "error.png": "|error| per update against the noise band and the allowed bound (log scale)",
    "heatmap.png": "err/allowed per tensor and update (1 is the bound; above fails)",
}
_MAX_HEATMAP_ROWS = 60


def require_matplotlib() -> None:
    """Plots need the optional extra; say so in one line before any work. Matplotlib's own
    warnings as it imports (a config folder it cannot write, so it made a temporary one) are
    kept off stderr, which holds gradalign's one line, unless its logger was set otherwise."""
    log = logging.getLogger("matplotlib")
    if log.level == logging.NOTSET and "matplotlib" not in sys.modules:
        log.setLevel(logging.ERROR)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInput(
            "plots need matplotlib: pip install 'gradalign[plot]' (or leave out --plot)"
        ) from None


def have_matplotlib() -> bool:
    try:
        require_matplotlib()
    except BadInput:
        return False
    return True


def _figure(height: float = 3.6, rows: int = 1) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, height), dpi=100, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, axes


def loss_figure(c: Comparison) -> Any:
    fig, (ax,) = _figure()
    updates = np.arange(c.updates)
    k = c.merged.accum_steps // max(1, c.baseline.accum_steps)
    micro = c.merged.micro_loss[: c.updates * c.merged.accum_steps]
    if k > 1 and micro.size:
        x = (
            np.repeat(updates, c.merged.accum_steps)
            + (np.tile(np.arange(c.merged.accum_steps), c.updates) + 0.5) / c.merged.accum_steps
            - 0.5
        )
        ax.plot(x, micro, ".", color="tab:orange", alpha=0.25, ms=3, label="merged micro-steps")
    judged = updates[: len(c.results)]  # a run whose windows stop lining up is cut there
    ax.plot(judged, [r.base_loss for r in c.results], "-o", ms=4, label="baseline (K=1)")
    ax.plot(
        judged,
        [r.merged_loss for r in c.results],
        "x",
        ms=7,
        color="tab:orange",
        label=f"merged window mean (K={c.merged.accum_steps})",
    )
    if c.reference is not None:
        ax.plot(
            updates,
            c.reference.window_losses(),
            "--",
            color="gray",
            lw=1,
            label=f"reference ({c.reference.dtype})",
        )
    _integer_updates(ax)
    ax.set_ylabel("loss")
    ax.set_title("loss per update")
    ax.legend(fontsize=8)
    return fig


def _worst(diffs: list) -> Any:
    return max(diffs, key=lambda d: d.ratio if not math.isnan(d.ratio) else math.inf, default=None)


def _series(results: list[UpdateResult], kind: str) -> dict[str, np.ndarray]:
    """Per update: the judged error, the allowed bound and the noise of the loss or of the worst
    tensor of `kind` (NaN where unknown)."""
    rows = []
    for r in results:
        if kind == "loss":
            rows.append((r.loss_error, r.loss_allowed, r.loss_noise))
            continue
        d = _worst(r.weights if kind == "weights" else r.grads)
        rows.append((math.nan, math.nan, None) if d is None else (d.error, d.allowed, d.noise))
    columns = list(zip(*rows, strict=True)) or [(), (), ()]  # no update judged: empty
    error, allowed, noise = (
        np.array([math.nan if v is None else v for v in column], dtype=np.float64)
        for column in columns
    )
    return {"error": error, "allowed": allowed, "noise": noise}


def _positive(values: np.ndarray, floor: float) -> np.ndarray:
    """Values for a log axis: zeros drawn at `floor`, infinities and NaN left out."""
    out = np.where(np.isfinite(values), values, np.nan)
    return np.where(out > 0, out, floor)


def error_figure(c: Comparison) -> Any:
    kinds = [("loss", "loss")]
    if any(r.weights for r in c.results):
        kinds.append(("weights", "worst weight tensor"))
    if any(r.grads for r in c.results):
        kinds.append(("gradient", "worst gradient"))
    fig, axes = _figure(2.2 * len(kinds) + 0.6, len(kinds))
    updates = np.arange(len(c.results))
    for ax, (kind, label) in zip(axes, kinds, strict=True):
        s = _series(c.results, "grads" if kind == "gradient" else kind)
        known = np.concatenate([s[k][np.isfinite(s[k]) & (s[k] > 0)] for k in s])
        floor = float(known.min()) / 10 if known.size else 1e-12
        if np.isfinite(s["noise"]).any():
            ax.fill_between(
                updates,
                floor,
                _positive(s["noise"], floor),
                color="tab:blue",
                alpha=0.15,
                label="baseline's own noise",
            )
        ax.plot(updates, _positive(s["allowed"], floor), "-", color="black", lw=1, label="allowed")
        error = _positive(s["error"], floor)
        bad = ~(s["error"] <= s["allowed"])
        ax.plot(updates, error, "-", color="tab:orange", lw=1)
        ax.plot(updates[~bad], error[~bad], "o", color="tab:green", ms=4, label="|error| (pass)")
        if bad.any():
            ax.plot(updates[bad], error[bad], "o", color="tab:red", ms=5, label="|error| (fail)")
        ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=8)
    handles = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, handle)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=4, fontsize=8)
    fig.suptitle("|error| per update (log scale) against the noise band and the allowed bound")
    _integer_updates(axes[-1])
    return fig


def _integer_updates(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("update")


def ratio_matrix(c: Comparison) -> tuple[list[str], np.ndarray]:
    """Rows 'w name' / 'g name', columns updates: err/allowed (NaN where not judged)."""
    names: list[str] = []
    rows: list[list[float]] = []
    for prefix, attr in (("w", "weights"), ("g", "grads")):
        tensors = [d.name for d in getattr(c.results[0], attr)] if c.results else []
        for index, name in enumerate(tensors):
            names.append(f"{prefix} {name}")
            rows.append([_ratio(getattr(r, attr), index) for r in c.results])
    return names, np.array(rows, dtype=np.float64).reshape(len(rows), len(c.results))


def _ratio(diffs: list, index: int) -> float:
    if index >= len(diffs):
        return math.nan
    ratio = diffs[index].ratio
    return 1e6 if math.isnan(ratio) or math.isinf(ratio) else ratio


def heatmap_figure(c: Comparison) -> Any:
    from matplotlib.colors import LogNorm

    names, matrix = ratio_matrix(c)
    if len(names) > _MAX_HEATMAP_ROWS:  # keep the worst rows
        order = np.argsort(-np.nan_to_num(np.nanmax(matrix, axis=1), nan=-1), kind="stable")
        keep = np.sort(order[:_MAX_HEATMAP_ROWS])
        names, matrix = [names[i] for i in keep], matrix[keep]
    fig, (ax,) = _figure(max(2.4, 0.28 * len(names) + 1.4))
    if not names:
        ax.text(0.5, 0.5, "no tensors were recorded", ha="center", va="center")
        ax.set_axis_off()
        return fig
    shown = np.clip(np.where(matrix > 0, matrix, 1e-3), 1e-3, 1e3)
    image = ax.imshow(
        np.ma.masked_invalid(shown),
        aspect="auto",
        interpolation="nearest",
        cmap="RdYlGn_r",
        norm=LogNorm(vmin=1e-3, vmax=1e3),
    )
    ax.set_yticks(range(len(names)), names, fontsize=7)
    _integer_updates(ax)
    ax.set_title("err/allowed per tensor (w: weights, g: gradients); above 1 fails")
    fig.colorbar(image, ax=ax, label="err / allowed")
    return fig


def figures(c: Comparison) -> dict[str, Any]:
    require_matplotlib()
    makers = {"loss.png": loss_figure, "error.png": error_figure, "heatmap.png": heatmap_figure}
    return {name: make(c) for name, make in makers.items()}


def png(fig: Any) -> bytes:
    """A figure as PNG bytes whose only metadata names the tool (no version, no timestamp): the
    mark by which a stale plot is told from a user's own PNG of the same name (`files`)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": "gradalign"})
    return buffer.getvalue()


def render_pngs(c: Comparison) -> dict[str, bytes]:
    """The plots as PNG bytes. A tensor name in a script the default font lacks (编码器.权重) is
    drawn as boxes: matplotlib's warning of each missing glyph is dropped, which filled a CI log
    and, where warnings are errors (PYTHONWARNINGS=error), ended a failing check in exit 3.
    matplotlib's font lookup logs each family it lacks (`findfont: Font family [...] not
    found`: 21 lines under a font cache another matplotlib built), which broke the one-line
    error of a report that then failed: its logger is held at ERROR while the plots draw."""
    fonts = logging.getLogger("matplotlib.font_manager")
    level = fonts.level
    fonts.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"Glyph \d+ .*missing from", category=UserWarning
            )
            return {name: png(fig) for name, fig in figures(c).items()}
    finally:
        fonts.setLevel(level)


def plot_paths(directory: Path) -> list[Path]:
    return [directory / name for name in PLOTS]


def write_plots(c: Comparison, directory: Path) -> list[Path]:
    """Write the three PNGs into `directory` (created), each whole or not at all."""
    images = render_pngs(c)
    for name, data in images.items():
        write_bytes_atomic(directory / name, data)
    return plot_paths(directory)
