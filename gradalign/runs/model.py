"""The judge's view of one recorded run, whatever wrote it (our trainer, a user's loop, a log).

A `Run` holds the per-micro-step series in memory and loads per-update tensors on demand.
Fields a source did not record are ``None``; the judge reports those checks as "not checked".
This module is numpy-only: the judging side never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .ranks import RankSeries

Tensors = dict[str, np.ndarray]


# the float dtypes a run may hold, most precise first (the judge ranks precisions by it)
PRECISION_ORDER = ("float64", "float32", "float16", "bfloat16")
# the precisions a run may compute in, most precise first: float32 math on a GPU's tensor cores
# (TF32) keeps float16's 10 mantissa bits and float32's range
COMPUTE_ORDER = ("float64", "float32", "tf32", "float16", "bfloat16")
# environment "tf32" (record/tf32.py, `tf32_uses`): where, and so in what, float32 math computed
TENSOR_CORE_DTYPES = {"cudnn": "tf32", "cublas": "tf32", "cublas-bfloat16": "bfloat16"}
# optimizers (by a part of their class's name) that compute each step in a 16-bit dtype whatever
# the weights': Muon's Newton-Schulz orthogonalization runs in bfloat16 (torch.optim.Muon, and
# the implementations it follows), so its float32 runs step with bfloat16's rounding
STEP_DTYPES = {"Muon": "bfloat16"}


def step_dtype(optimizer_settings: dict | None) -> str | None:
    """The 16-bit dtype the recorded optimizer computes its steps in (`STEP_DTYPES`), or None."""
    kind = (optimizer_settings or {}).get("type")
    if not isinstance(kind, str):
        return None
    return next((dtype for part, dtype in STEP_DTYPES.items() if part in kind), None)


def working_dtype(params: list[tuple[str, int]]) -> str | None:
    """A run's working precision from its parameters' (dtype, elements): the floating dtype
    holding the most elements (the first of equals); None where none is floating. The first
    parameter's dtype was taken: a frozen int8 parameter listed first (QLoRA's) made the run
    "int8", and a float64 scalar made a float32 model float64."""
    held: dict[str, int] = {}
    for dtype, size in params:
        if dtype in PRECISION_ORDER:
            held[dtype] = held.get(dtype, 0) + size
    return max(held, key=lambda d: held[d]) if held else None


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one recorded tensor (a parameter or a floating buffer)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "param"  # "param" | "buffer"


@dataclass
class Run:
    """Everything the judge may look at in one run.

    Window ``i`` holds micro-steps ``window(i)``: ``accum_steps`` of them each, unless the
    source recorded other counts (``window_sizes``: a loop that called micro() more or fewer
    times in some window, or forgot update()). State fingerprints are int64 per
    tensor: ``micro_state[m]`` is the weights as seen when micro-step ``m`` was recorded (before
    any optimizer step at that micro-step), ``update_state[i]`` the weights after update ``i``;
    rows that a source could not observe are marked ``False`` in ``micro_state_known``.
    """

    source: str
    kind: str  # "run-dir" | "log" | ...
    accum_steps: int
    updates: int
    micro_loss: np.ndarray  # float64 [M]
    tensors: list[TensorInfo]
    micro_items: np.ndarray | None = None  # float64 [M]
    micro_data: np.ndarray | None = None  # int64 [M], digests of the samples (sum over a window)
    micro_pairs: np.ndarray | None = None  # int64 [M], row-wise sample digests (evidence)
    full_weights: bool = True  # False when only printed (truncated) values are known
    init_state: np.ndarray | None = None  # int64 [P]
    micro_state: np.ndarray | None = None  # int64 [M, P]
    micro_state_known: np.ndarray | None = None  # bool [M]
    micro_grad_state: np.ndarray | None = None  # int64 [M, P], the accumulated .grad at micro m
    micro_grad_writes: np.ndarray | None = None  # int64 [M, P], writes to each .grad by micro m
    micro_samples: np.ndarray | None = None  # int64 [M], rows of each micro-batch
    micro_step_counts: np.ndarray | None = None  # int64 [M], optimizer steps since micro m-1
    micro_draws: np.ndarray | None = None  # int64 [M], 1: torch's generators advanced since m-1
    scaler_calls: np.ndarray | None = None  # int64 [N, 2], GradScaler unscale_/update calls
    clip_calls: np.ndarray | None = None  # int64 [N], clip_grad_norm_/_value_ calls in window i
    clip_value: np.ndarray | None = None  # float64 [N], clip_grad_value_'s value (NaN: none)
    clip_max_norm: np.ndarray | None = None  # float64 [N], clip_grad_norm_'s max_norm (NaN: none)
    clips_before_unscale: np.ndarray | None = None  # int64 [N], clips of the scaled gradients
    zero_grads_inside: np.ndarray | None = None  # int64 [N], zero_grad() inside window i
    # int64 [N], zero_grad() after window i's last micro-step and before any step in it
    zero_grads_before_step: np.ndarray | None = None
    bypassed_forwards: np.ndarray | None = None  # int64 [N], forwards around DDP in window i
    window_sizes: np.ndarray | None = None  # int64 [N], micro-steps per window (None: K each)
    unclosed_micro_steps: int = 0  # micro-steps recorded after the last update()
    unclosed_steps: int = 0  # optimizer steps after the last update(), never recorded
    # int64 [N], micro-steps of window i whose gradient a clear between micro-steps (zero_grad(),
    # or by hand: `p.grad = None`) discarded before it stepped, in windows not read as leftovers
    # (discarded.py); None: none recorded
    cleared_inside: np.ndarray | None = None
    # updates whose window began with discarded micro-steps that drew random numbers (discarded.py)
    discarded_draws: tuple[int, ...] = ()
    grads_calls: np.ndarray | None = None  # int64 [N], Recorder.grads() calls in window i
    update_state: np.ndarray | None = None  # int64 [N, P]
    update_state_known: np.ndarray | None = None  # bool [N]; None: every row is known
    lr: np.ndarray | None = None  # float64 [N], the lr of the first param group at each step
    lr_quantum: np.ndarray | None = None  # float64 [N], a printed lr's resolution (logs)
    lr_groups: np.ndarray | None = None  # float64 [N, G], every param group's lr (G > 1)
    optimizer_steps: np.ndarray | None = None  # int64 [N], optimizer.step() calls during update i
    state_step: np.ndarray | None = None  # int64 [N], the optimizer's own step counter after i
    grad_norm_pre_clip: np.ndarray | None = None  # float64 [N], total norm before clipping
    grad_norm_quantum: np.ndarray | None = None  # float64 [N], a printed norm's resolution
    loss_scale: np.ndarray | None = None  # float64 [N], a GradScaler's scale in window i
    printed_window_loss: np.ndarray | None = None  # float64 [N], a mean the source printed itself
    printed_window_quantum: np.ndarray | None = None  # float64 [N], how precisely it was printed
    loss_quantum: np.ndarray | None = None  # float64 [M], print resolution of each loss (logs)
    loss_known: np.ndarray | None = None  # bool [M]; False: not printed (a skipped iteration's)
    config: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    fault: str | None = None  # a label for readers; the judge never looks at it
    model_facts: dict = field(default_factory=dict)  # {"batchnorm": [...], "dropout": [...]}
    # {"type", "groups": [settings], "tensor_groups": [group per tensor, -1: none]} (manifest)
    optimizer_settings: dict | None = None
    reference: str | None = None  # path of a more precise rerun of this training, if recorded
    grad_dtype: str | None = None  # dtype of the gradients handed to the optimizer
    load_init_weights: Callable[[], Tensors] | None = None
    load_weights: Callable[[int], Tensors] | None = None
    load_grads: Callable[[int], Tensors] | None = None
    load_weight_quantum: Callable[[int], Tensors | None] | None = (
        None  # printed weights' resolution
    )
    notes: list[str] = field(default_factory=list)  # what the source's reader wants said
    cards: list[str] = field(default_factory=list)  # the card logs a run was combined from
    card_loss: str | None = None  # how the cards' losses were combined: "mean" or "sum"
    replicas: list[Run] = field(default_factory=list)  # cards 1.. beside this run (card 0)
    store: Any = None  # a run directory's checked file access (runs/store.py), for streaming
    record: str = "full"  # "sketch": per-update summaries, full tensors only at `snapshots`
    sketch_width: int | None = None
    sketch_whole_1d: int = 0  # 1-D tensors of at most this many elements kept whole too
    snapshots: frozenset[int] | None = None  # updates with full files in a sketch-mode run
    load_sketches: Callable[[int | None], Tensors | None] | None = None
    ranks: list[RankSeries] = field(default_factory=list)  # a data-parallel run's ranks (ranks.py)
    distributed: dict | None = None  # {world_size, backend, launcher, ranks} of such a run

    @property
    def world_size(self) -> int:
        """Ranks that recorded this run (1 for one process)."""
        return len(self.ranks) or 1

    @property
    def micro_steps(self) -> int:
        return int(self.micro_loss.shape[0])

    @property
    def has_grads(self) -> bool:
        return self.load_grads is not None

    def init_weights(self) -> Tensors | None:
        return self.load_init_weights() if self.load_init_weights else None

    def weights(self, update: int) -> Tensors | None:
        return self.load_weights(update) if self.load_weights else None

    def weight_quantum(self, update: int) -> Tensors | None:
        """Per element, how far each printed weight may be from the true one (None: exact)."""
        return self.load_weight_quantum(update) if self.load_weight_quantum else None

    def grads(self, update: int) -> Tensors | None:
        return self.load_grads(update) if self.load_grads else None

    def sketches(self, update: int | None) -> Tensors | None:
        """A sketch-mode run's summaries of an update (None: the initial weights's)."""
        return self.load_sketches(update) if self.load_sketches else None

    @property
    def dtype(self) -> str:
        """The run's working precision: environment.dtype where it is a floating dtype, else
        `working_dtype` of its parameters (float32 where none is floating)."""
        recorded = self.environment.get("dtype")
        if recorded in PRECISION_ORDER:
            return recorded
        params = [(t.dtype, math.prod(t.shape)) for t in self.tensors if t.kind == "param"]
        return working_dtype(params) or "float32"

    @property
    def compute_dtype(self) -> str:
        """The precision the run computed in (autocast), else its parameter dtype; a parameter
        of a less precise dtype (a bfloat16 layer beside float32 ones) computes its layer in
        it, and every gradient that flows through that layer carries its rounding. float32
        math a GPU ran on tensor cores (environment "tf32": cuDNN's convolutions by default)
        computed in "tf32" (or bfloat16, where matmuls were allowed it). An optimizer that
        steps in a 16-bit dtype (`step_dtype`: Muon) makes the run's steps that dtype's."""
        declared = self.environment.get("compute_dtype") or self.dtype
        order = COMPUTE_ORDER
        params = [t.dtype for t in self.tensors if t.kind == "param" and t.dtype in order]
        stepped = [d for d in [step_dtype(self.optimizer_settings)] if d is not None]
        found = max(
            [declared, *params, *stepped], key=lambda d: order.index(d) if d in order else -1
        )
        if found != "float32":
            return found
        uses = self.environment.get("tf32") or []
        cores = [TENSOR_CORE_DTYPES.get(use, "tf32") for use in uses if isinstance(use, str)]
        return max([found, *cores], key=order.index)

    @property
    def sizes(self) -> np.ndarray:
        """Micro-steps per window (K each when the source recorded no other counts)."""
        if self.window_sizes is not None:
            return self.window_sizes
        return np.full(self.updates, self.accum_steps, dtype=np.int64)

    @property
    def starts(self) -> np.ndarray:
        """Index of each window's first micro-step."""
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def window(self, update: int) -> range:
        """The micro-steps of window `update` (O(1) where every window holds K)."""
        if self.window_sizes is None:
            if not 0 <= update < self.updates:
                raise IndexError(f"update {update} out of range 0..{self.updates - 1}")
            return range(update * self.accum_steps, (update + 1) * self.accum_steps)
        start = int(self.starts[update])
        return range(start, start + int(self.sizes[update]))

    @property
    def irregular_windows(self) -> np.ndarray:
        """Windows whose micro-step count is not K (a bookkeeping fact, judged as a bug)."""
        return np.flatnonzero(self.sizes != self.accum_steps)

    def _sum(self, series: np.ndarray) -> np.ndarray:
        """A per-micro-step series summed over each window (int64 sums wrap, like digests)."""
        k = self.accum_steps
        if self.window_sizes is None and len(series) == self.updates * k:
            return series.reshape(self.updates, k).sum(axis=1, dtype=series.dtype)
        starts, sizes = self.starts.tolist(), self.sizes.tolist()
        return np.array(
            [series[s : s + n].sum(dtype=series.dtype) for s, n in zip(starts, sizes, strict=True)],
            dtype=series.dtype,
        ).reshape(self.updates)

    def window_totals(self, series: np.ndarray) -> np.ndarray:
        """A per-micro-step float series (items, samples) summed over each window, in float64."""
        return self._sum(np.asarray(series, dtype=np.float64))

    def window_sums(self, series: np.ndarray) -> np.ndarray:
        """A per-micro-step int64 series summed over each window (wrapping like the digests)."""
        return self._sum(np.asarray(series, dtype=np.int64))

    def window_loss_quantum(self) -> np.ndarray:
        """Per update, how far the window mean of printed losses may be off (0 when exact)."""
        if self.loss_quantum is None:
            return np.zeros(self.updates)
        return self._sum(self.loss_quantum) / np.maximum(self.sizes, 1)

    def draws_each_micro_step(self) -> bool:
        """Whether the loop drew random numbers from torch's default generators at most of its
        micro-steps (noise in its forward), not once in a while (a data loader's epoch seed)."""
        if self.micro_draws is None or len(self.micro_draws) < 2:
            return False
        return bool(np.mean(np.asarray(self.micro_draws[1:]) > 0) >= 0.5)

    def window_loss_known(self) -> np.ndarray:
        """bool [N]: whether the source gave every micro loss of the window (a log prints none
        for an iteration its loss scaler skipped; that window's loss is NaN, and unknown)."""
        if self.loss_known is None:
            return np.ones(self.updates, dtype=bool)
        return self.window_sums(~np.asarray(self.loss_known, dtype=bool)) == 0

    def non_finite_losses(self) -> np.ndarray:
        """The micro-steps whose loss is not finite, leaving out those of no items (a mean over
        no tokens is NaN and weighs nothing)."""
        bad = ~np.isfinite(self.micro_loss)
        if self.loss_known is not None:
            bad &= self.loss_known
        if self.micro_items is not None:
            bad &= np.asarray(self.micro_items) != 0
        return np.flatnonzero(bad)

    def window_losses(self) -> np.ndarray:
        """Loss per update: each window's mean micro loss, weighted by items if recorded, else
        by the micro-batches' sample counts if recorded (a mean over unequal micro-batches).
        A mean whose sum overflows (losses near 1e308) is taken again over the losses scaled
        down by an exact power of two: it is finite wherever every loss of its window is."""
        with np.errstate(over="ignore"):
            losses = self._window_means(self.micro_loss)
        if np.isinf(losses).any():
            scale = 2.0**64
            again = self._window_means(self.micro_loss / scale) * scale
            losses = np.where(np.isinf(losses) & np.isfinite(again), again, losses)
        return losses

    def _window_means(self, micro_loss: np.ndarray) -> np.ndarray:
        sizes = np.maximum(self.sizes, 1)
        losses = self._sum(micro_loss) / sizes
        weights = self.micro_items if self.micro_items is not None else self.micro_samples
        if weights is None:
            return losses
        weights = np.asarray(weights, dtype=np.float64)
        totals = self._sum(weights)
        # a micro-batch of no items weighs nothing, whatever its mean (NaN: a mean over none)
        weighted = self._sum(np.where(weights > 0, micro_loss * weights, 0.0))
        safe = np.where(totals > 0, totals, 1.0)
        return np.where(totals > 0, weighted / safe, losses)
