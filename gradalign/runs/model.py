"""The judge's view of one recorded run, whatever wrote it (our trainer, a user's loop, a log).

A `Run` holds the per-micro-step series in memory and loads per-update tensors on demand.
Fields a source did not record are ``None``; the judge reports those checks as "not checked".
This module is numpy-only: the judging side never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Tensors = dict[str, np.ndarray]


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

    Micro-step ``m`` belongs to update ``m // accum_steps``. State fingerprints are int64 per
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
    full_weights: bool = True  # False when only printed (truncated) values are known
    init_state: np.ndarray | None = None  # int64 [P]
    micro_state: np.ndarray | None = None  # int64 [M, P]
    micro_state_known: np.ndarray | None = None  # bool [M]
    update_state: np.ndarray | None = None  # int64 [N, P]
    update_state_known: np.ndarray | None = None  # bool [N]; None: every row is known
    lr: np.ndarray | None = None  # float64 [N], the lr in effect at each optimizer step
    optimizer_steps: np.ndarray | None = None  # int64 [N], optimizer.step() calls during update i
    state_step: np.ndarray | None = None  # int64 [N], the optimizer's own step counter after i
    grad_norm_pre_clip: np.ndarray | None = None  # float64 [N], total norm before clipping
    loss_scale: np.ndarray | None = None  # float64 [N], a GradScaler's scale in window i
    printed_window_loss: np.ndarray | None = None  # float64 [N], a mean the source printed itself
    printed_window_quantum: np.ndarray | None = None  # float64 [N], how precisely it was printed
    loss_quantum: np.ndarray | None = None  # float64 [M], print resolution of each loss (logs)
    config: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    fault: str | None = None  # a label for readers; the judge never looks at it
    model_facts: dict = field(default_factory=dict)  # {"batchnorm": [...], "dropout": [...]}
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

    @property
    def dtype(self) -> str:
        """The run's working precision: environment.dtype, else the first parameter's dtype."""
        params = [t.dtype for t in self.tensors if t.kind == "param"]
        return self.environment.get("dtype") or (params[0] if params else "float32")

    @property
    def compute_dtype(self) -> str:
        """The precision the run computed in (autocast), else its parameter dtype."""
        return self.environment.get("compute_dtype") or self.dtype

    def window_sums(self, series: np.ndarray) -> np.ndarray:
        """A per-micro-step int64 series summed over each window (wrapping like the digests)."""
        k, n = self.accum_steps, self.updates
        return series[: n * k].reshape(n, k).sum(axis=1, dtype=np.int64)

    def window_loss_quantum(self) -> np.ndarray:
        """Per update, how far the window mean of printed losses may be off (0 when exact)."""
        k, n = self.accum_steps, self.updates
        if self.loss_quantum is None:
            return np.zeros(n)
        return self.loss_quantum[: n * k].reshape(n, k).mean(axis=1)

    def window_losses(self) -> np.ndarray:
        """Loss per update: each window's mean micro loss, weighted by items if recorded."""
        k, n = self.accum_steps, self.updates
        losses = self.micro_loss[: n * k].reshape(n, k)
        if self.micro_items is None:
            return losses.mean(axis=1)
        items = self.micro_items[: n * k].reshape(n, k)
        totals = items.sum(axis=1)
        safe = np.where(totals > 0, totals, 1.0)
        return np.where(totals > 0, (losses * items).sum(axis=1) / safe, losses.mean(axis=1))
