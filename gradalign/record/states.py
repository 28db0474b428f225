"""The per-micro-step facts about weights and gradients, taken without reading them every time.

Weights (`micro/state`): a tensor that nothing wrote to since its last fingerprint keeps that
fingerprint. torch counts every in-place write to a tensor (its version counter); a tensor whose
counter and storage did not move since the last snapshot still holds that snapshot's bits, so its
row refers to the snapshot's fingerprint (computed in the background from the copy); any other
tensor is fingerprinted now. An optimizer's step may write its parameters without moving their
counters (CPU fused kernels such as `AdamW(fused=True)` do, and any custom kernel may), so every
step of any torch optimizer in the process, watched or not, makes its parameters' cells be
fingerprinted at the next micro-step (`watch_steps`). Other writes that bypass the counter
(through `.data`, or a numpy view) show in the next snapshot, not in the row.

Gradients (`micro/grad_writes`): per parameter, a counter that moves whenever its `.grad` was
written (a new tensor, or an in-place write to it) since the previous micro-step, 0 while it has
none. A micro-step after which no gradient moved is one whose micro-batch was never
backpropagated; reading K gradients per update to learn that cost more than the training itself
at the default size.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

from .facts import host_fingerprint
from .sharded import local, whole

HERE = -2  # a cell fingerprinted at the micro-step itself (its value is in the row)
STALE = (-1, -1)  # a stamp no tensor has (versions count from 0): fingerprint the cell again


def stamp(tensor: torch.Tensor) -> tuple[int, int]:
    """What changes when a tensor is written: its version counter and its storage."""
    part = local(tensor)  # a DTensor's writes land in this rank's part
    return part._version, part.data_ptr()


class WeightStates:
    """`micro/state` rows: each cell refers to a snapshot (its key) or holds a fingerprint."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.known: list[tuple[tuple[int, int], int, int | torch.Tensor]] = []
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.pending: list[tuple[int, int, torch.Tensor]] = []  # (row, column, device value)
        self.columns = {id(t): p for p, t in enumerate(tensors)}  # the tensors are kept alive
        self.stepped: dict[int, torch.optim.Optimizer] = {}  # since the last snapshot or row

    def renew(self, column: int, tensor: torch.Tensor) -> None:
        """Column `column` is held by `tensor` now (a buffer assigned anew), before a snapshot."""
        self.columns.pop(id(self.tensors[column]), None)
        self.tensors[column] = tensor
        self.columns[id(tensor)] = column

    def snapped(self, key: int) -> None:
        """The tensors were just copied for snapshot `key` (-1: initial weights, i: update i)."""
        self.known = [(stamp(t), key, 0) for t in self.tensors]
        self.stepped.clear()  # the copy holds whatever those steps wrote

    def written(self) -> bool:
        """Whether a tensor was written since the last snapshot, as its stamp shows (before any
        row: a row takes the stamps it saw). A step that wrote nothing (every gradient None)
        moves no stamp; a fused kernel that writes without moving the counter is not seen."""
        return any(stamp(t) != known[0] for t, known in zip(self.tensors, self.known, strict=True))

    def step_taken(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer` stepped: its parameters may have changed with their stamps unmoved.

        Only noted here (a step costs one dict write); the parameters are looked up at the next
        row, and not at all when a snapshot comes first, as after the window's own step."""
        self.stepped[id(optimizer)] = optimizer

    def _forget_stepped(self) -> None:
        """Make every recorded parameter of the optimizers that stepped be fingerprinted."""
        for optimizer in self.stepped.values():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    p = self.columns.get(id(param))
                    if p is not None:
                        _, key, value = self.known[p]
                        self.known[p] = (STALE, key, value)
        self.stepped.clear()

    def row(self) -> None:
        """The weights as this micro-step sees them."""
        if self.stepped:
            self._forget_stepped()
        keys = np.empty(len(self.tensors), np.int32)
        values = np.zeros(len(self.tensors), np.int64)
        for p, tensor in enumerate(self.tensors):
            now = stamp(tensor)
            seen, key, value = self.known[p]
            if now != seen:
                key, value = HERE, host_fingerprint(whole(tensor))
                self.known[p] = (now, key, value)
            keys[p] = key
            if key == HERE:
                if isinstance(value, torch.Tensor):
                    self.pending.append((len(self.keys), p, value))
                else:
                    values[p] = value
        self.keys.append(keys)
        self.values.append(values)

    def resolve(self, snapshot: Callable[[int], np.ndarray]) -> np.ndarray:
        """All rows as int64 [M, P]; `snapshot(key)` gives a snapshot's fingerprints."""
        p = len(self.tensors)
        if not self.keys:
            return np.zeros((0, p), np.int64)
        keys, values = np.stack(self.keys), np.stack(self.values)
        if self.pending:
            found = torch.stack([v for _, _, v in self.pending]).cpu().numpy()
            for (m, column, _), value in zip(self.pending, found, strict=True):
                values[m, column] = value
        for key in np.unique(keys[keys != HERE]):
            where = keys == key
            values[where] = np.broadcast_to(snapshot(int(key)), keys.shape)[where]
        return values


def watch_steps(states: WeightStates) -> RemovableHandle:
    """Tell `states` of every step of every torch optimizer in this process (torch's global
    step post-hook: also an optimizer created later, or one the Recorder was not given, whose
    in-window steps are a bug all the same). Remove the returned handle to stop. The hook holds
    `states` weakly: a Recorder dropped without close() is not kept alive by it."""
    found = weakref.ref(states)

    def hook(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        states = found()
        if states is not None:
            states.step_taken(optimizer)

    return register_optimizer_step_post_hook(hook)


class GradWrites:
    """`micro/grad_writes` rows: per parameter, a counter of writes to its `.grad`."""

    def __init__(self, params: list[torch.Tensor | None]) -> None:
        self.params = params  # None for a buffer (no gradient)
        self.last: list[tuple[weakref.ref, int] | None] = [None] * len(params)
        self.counts = [0] * len(params)
        self.rows: list[list[int]] = []

    def row(self) -> bool:
        """One micro-step's row; whether every gradient held at the row before is gone or
        another tensor now (a clear by hand, `p.grad = None`, that no zero_grad() call shows:
        a backward accumulates into the tensor it finds, unless it builds a graph of the sum,
        create_graph=True, whose new tensor requires grad)."""
        values = []
        held = replaced = 0
        for p, param in enumerate(self.params):
            grad = None if param is None else param.grad
            last = self.last[p]
            same = last is not None and grad is not None and last[0]() is grad
            held += last is not None
            replaced += last is not None and (grad is None or not (same or grad.requires_grad))
            if grad is None:
                self.last[p] = None
                values.append(0)
                continue
            if not same or last[1] != grad._version:
                self.counts[p] += 1
                self.last[p] = (weakref.ref(grad), grad._version)
            values.append(self.counts[p])
        self.rows.append(values)
        return 0 < held == replaced

    def array(self) -> np.ndarray:
        return np.asarray(self.rows, dtype=np.int64).reshape(len(self.rows), len(self.params))
