"""Tensors as the judge sees them when some run kept sketches (`--record sketch`).

A sketch-mode run keeps, per update and tensor, a count sketch (runs/sketches.py): the tensor
itself when it has at most `width` elements (or is 1-D with at most the manifest's `whole_1d`),
else `width` signed bucket sums. When any run of a comparison is sketched, every run is seen
through sketches of the same width and the same rule for what is kept whole (`Sketching`: the
strictest of the runs'; a full run's sketches are computed from its files, a tensor one run kept
whole and the rule does not is sketched here), so that differences of sketches are sketches of
differences.
`summaries` gives them with exact norms; `vectors` gives the vectors alone, for the diagnoses
whose relations are linear (a gradient carried over, a penalty counted K times), and `exact` only
the tensors kept whole, for diagnoses that read element values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import BadInput
from ..runs.model import Run, Tensors
from ..runs.sketches import kept_whole, summarize
from .fits import distance


@dataclass(frozen=True)
class Kept:
    """One tensor as a sketch: its vector, its exact norm, and whether the vector is the
    tensor itself (flattened)."""

    vector: np.ndarray
    norm: float
    exact: bool
    held: np.ndarray | None = None  # a sketched tensor's infinities (runs.sketches.Summary)


@dataclass(frozen=True)
class Sketching:
    """How a comparison sees tensors: sketches of `width`, a tensor kept whole where it has at
    most `width` elements or is 1-D with at most `whole_1d` (runs.sketches.kept_whole)."""

    width: int
    whole_1d: int = 0

    def whole(self, shape: tuple[int, ...]) -> bool:
        return kept_whole(shape, self.width, self.whole_1d)


def sketch_width(*runs: Run | None) -> Sketching | None:
    """How the comparison sees tensors (None: every run is full). Sketches of two widths cannot
    be subtracted: such runs are refused."""
    sketched = [r for r in runs if r is not None and r.record == "sketch"]
    widths = {r.source: r.sketch_width for r in sketched}
    if len(set(widths.values())) > 1:
        listed = ", ".join(f"{source} {width}" for source, width in widths.items())
        raise BadInput(
            f"the runs were sketched at different widths ({listed}); record them with the "
            "same sketch width"
        )
    if not sketched:
        return None
    return Sketching(sketched[0].sketch_width, min(r.sketch_whole_1d for r in sketched))


def summaries(run: Run, kind: str, update: int | None, seen: Sketching) -> dict[str, Kept] | None:
    """A run's tensors of one update as sketches; None where it recorded none."""
    width = seen.width
    if run.record == "sketch":
        found = run.sketches(update)
        if found is None:
            return None
        norms = found.get(f"norms/{kind}")
        kept = {}
        for p, info in enumerate(run.tensors):
            vector = found.get(f"{kind}/{info.name}")
            if vector is None:
                continue
            norm = float(norms[p]) if norms is not None else math.nan
            whole = seen.whole(info.shape)
            held = found.get(f"held/{kind}/{info.name}")
            if not whole and vector.size > width:  # kept whole by a laxer rule than `seen`'s
                summary = summarize(vector, None, width, whole=False)
                vector, held = summary.sketch, summary.held
                if held is not None:  # the norm of what the sketch holds
                    norm = math.sqrt(summary.sumsq)
            kept[info.name] = Kept(vector, norm, whole, held)
        return kept
    if kind == "grads":
        tensors = run.grads(update) if update is not None else None
    else:
        tensors = run.init_weights() if update is None else run.weights(update)
    if tensors is None:
        return None
    declared = {t.name: t.dtype for t in run.tensors}
    shapes = {t.name: t.shape for t in run.tensors}
    kept = {}
    for name in tensors:
        whole = seen.whole(shapes.get(name, np.shape(tensors[name])))
        summary = summarize(tensors[name], declared.get(name), width, whole)
        kept[name] = Kept(summary.sketch, math.sqrt(summary.sumsq), whole, summary.held)
    return kept


def vectors(run: Run, kind: str, update: int | None, width: Sketching | None) -> Tensors | None:
    """Whole tensors (every run full), else every tensor's sketch vector."""
    if width is None:
        if kind == "grads":
            return run.grads(update) if update is not None else None
        return run.init_weights() if update is None else run.weights(update)
    kept = summaries(run, kind, update, width)
    return None if kept is None else {name: k.vector for name, k in kept.items()}


def exact(
    run: Run, kind: str, update: int | None, width: Sketching | None, files: bool = False
) -> Tensors | None:
    """The tensors whose element values are known: all (full), or those kept whole (`update`
    None: the initial weights); with `files`, all wherever a sketched run kept its full files
    (its snapshot updates) too."""
    if kind == "grads":
        full = run.grads(update) if update is not None else None
    else:
        full = run.init_weights() if update is None else run.weights(update)
    if width is None or (full is not None and (files or run.record == "full")):
        return full
    kept = summaries(run, kind, update, width)
    if kept is None:
        return None
    shapes = {t.name: tuple(t.shape) for t in run.tensors}  # kept whole, flattened: as shaped
    return {n: k.vector.reshape(shapes[n]) for n, k in kept.items() if k.exact}


def norm_of(run: Run, kind: str, update: int, width: Sketching | None) -> float | None:
    """The exact norm of all of a run's tensors of one kind at an update."""
    if width is None:
        tensors = run.grads(update) if kind == "grads" else run.weights(update)
        if tensors is None:
            return None
        return distance(tensors, None, list(tensors))  # a slice at a time
    kept = summaries(run, kind, update, width)
    return None if kept is None else math.sqrt(sum(k.norm**2 for k in kept.values()))


def full_rerun(update: int) -> str:
    """What to do where a diagnosis needs full weights and gradients up to `update` and a
    sketched run kept them at its snapshot updates only: the training is deterministic, so the
    first updates recorded again in full tell (a golden file keeps summaries only)."""
    n = update + 1
    return (
        f"a sketched run keeps them at its snapshot updates only: record the first {n} "
        f"update(s) of both runs again in full (`--record full --updates {n}`, or "
        f'`Recorder(..., record="full")` for {n} updates) and compare those; a golden file '
        "keeps summaries only"
    )
