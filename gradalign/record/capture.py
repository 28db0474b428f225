"""What the Recorder takes from the live model at each call, and hands to the background writer.

Per update, `full` mode snapshots the weights and the gradient (one copy each, written, hashed
and fingerprinted in the background); `sketch` mode keeps summaries instead (record/sketcher.py)
and full snapshots only at the updates `snapshot_at` names: the first, every `every`-th and the
last when the number of updates is known. Per micro-step it keeps the weights' fingerprints and
the gradients' write counters (record/states.py). `series` and `manifest` give what the run's
series file and manifest say about all of it (docs/FORMAT.md). A sparse gradient is taken as
its dense equivalent: the run format stores dense tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runs.background import BackgroundWriter
from ..runs.layout import grads_file, weights_file
from ..runs.sketches import WIDTH
from .facts import dtype_name
from .sharded import any_sharded, whole
from .sketcher import Sketcher
from .snapshots import Snapshots, host_dtype
from .states import GradWrites, WeightStates, watch_steps

MODES = ("full", "sketch")


def dense_grad(grad: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient as the run stores it: a sparse one (`nn.Embedding(sparse=True)`) becomes its
    dense equivalent, duplicate indices summed as the optimizer applies them. `to_dense()` adds
    the values into zeros on the gradient's device, with no host sync (`coalesce()` would wait
    for the device to count the indices); a dense gradient is kept as it is, uncopied."""
    if grad is None or grad.layout == torch.strided:
        return grad
    return grad.to_dense()


class Capture:
    """The Recorder's snapshots, summaries and per-micro-step states of one run."""

    def __init__(
        self,
        named: dict[str, tuple[torch.Tensor, str, tuple[int, ...]]],
        files: BackgroundWriter,
        mode: str = "full",
        every: int = 0,
        updates: int | None = None,
        width: int = WIDTH,
    ) -> None:
        self.files, self.mode, self.every, self.updates = files, mode, every, updates
        self.names = list(named)
        self.tensors = {name: t for name, (t, _, _) in named.items()}
        self.params = {name: t for name, (t, kind, _) in named.items() if kind == "param"}
        self.declared = {name: dtype_name(t) for name, t in self.tensors.items()}
        self.shapes = {name: (shape, host_dtype(t)) for name, (t, _, shape) in named.items()}
        self.snapshots = Snapshots()
        self.states = WeightStates(list(self.tensors.values()))
        self.writes = GradWrites([self.params.get(name) for name in self.names])
        # a sharded gradient is written at the window's last micro-step alone where the loop
        # defers its reduction (set_requires_gradient_sync): its writes say nothing per micro-step
        self.sharded = any_sharded(self.params.values())
        first = next(iter(self.tensors.values()))
        sketching = mode == "sketch"
        shapes = {name: shape for name, (shape, _) in self.shapes.items()}
        self.sketcher = (
            Sketcher(files, self.names, self.declared, width, shapes) if sketching else None
        )
        self.on_device = self.sketcher is not None and first.device.type == "cuda"
        self.full_updates: list[int] = []
        self.stepped = False  # the weights moved at some update: a step was taken
        # a process-wide hook, made last so no failure here can leak it; the Recorder removes it
        self.step_hook = watch_steps(self.states)

    def renew(self, name: str, tensor: torch.Tensor) -> None:
        """A buffer the model assigned anew: recorded from now on as `tensor`."""
        self.tensors[name] = tensor
        self.states.renew(self.names.index(name), tensor)

    def snapshot_at(self, update: int) -> bool:
        """Whether `update` gets full weight and gradient files: in sketch mode the first update,
        and each until one that stepped (a GradScaler skips the step where the scaled gradients
        overflow, as float16's first updates often do; the optimizer's first step is where a
        gradient of pure noise moves an adaptive optimizer's element furthest, and the judge
        reads it element by element: model zoo runs under float16 autocast with sketches failed
        12 of 150 where their first step came at update 1, sketched), every `every`-th, and the
        last."""
        if self.mode == "full" or update == 0 or not self.stepped:
            return True
        if self.every > 0 and update % self.every == 0:
            return True
        return self.updates is not None and update == self.updates - 1

    def weights(self, update: int | None) -> None:
        """The weights after `update` (None: the initial weights), before anything changes them."""
        full = update is None or self.snapshot_at(update)
        if not self.stepped and update is not None:  # read until a step is seen, then no more
            self.stepped = bool(self.states.stepped) or self.states.written()
        self._take("weights", update, self.tensors, weights_file(update) if full else None)
        self.states.snapped(-1 if update is None else update)
        if full and update is not None and update not in self.full_updates:
            self.full_updates.append(update)

    def grads(self, update: int) -> None:
        """The accumulated gradient the optimizer is about to step with."""
        grads = {name: dense_grad(t.grad) for name, t in self.params.items()}
        relpath = grads_file(update) if self.snapshot_at(update) else None
        self._take("grads", update, grads, relpath)

    def micro(self) -> bool:
        """One micro-step's rows; whether its gradients were cleared by hand (`GradWrites`)."""
        self.states.row()
        return not self.sharded and self.writes.row()  # a sharded model's writes: not written

    def _take(self, kind: str, update: int | None, tensors: dict, relpath: str | None) -> None:
        tensors = {n: None if t is None else whole(t) for n, t in tensors.items()}
        sketch = self.sketcher
        if sketch is not None and self.on_device:
            shapes = self.shapes
            live = {
                n: t if t is not None else torch.zeros(shapes[n][0], device="cuda")
                for n, t in tensors.items()
            }
            sketch.device(kind, update, live)
        if relpath is None and (sketch is None or self.on_device):
            return
        snap = self.snapshots.take(tensors, self.shapes)
        host = sketch is not None and not self.on_device
        if relpath is not None:
            declared = {name: self.declared[name] for name in tensors}
            release = None if host else snap.release
            self.files.write(
                relpath, snap.arrays, declared=declared, ready=snap.ready, release=release
            )
        if host:
            sketch.host(kind, update, snap.arrays, None if relpath else snap.ready, snap.release)

    def fingerprints(self, kind: str, update: int | None) -> np.ndarray | None:
        """Per tensor (manifest order), the fingerprints of a snapshot or a summary."""
        relpath = weights_file(update) if kind == "weights" else grads_file(update)  # type: ignore[arg-type]
        found = self.files.fingerprints.get(relpath)
        if found is not None:
            return np.asarray([found.get(name, 0) for name in self.names], dtype=np.int64)
        return self.sketcher.fingerprints(kind, update) if self.sketcher is not None else None

    def series(self, updates: int) -> dict[str, np.ndarray]:
        """The states for the series file (call after the background work is done)."""
        p = len(self.names)
        init = self.fingerprints("weights", None)
        rows = [self.fingerprints("weights", i) for i in range(updates)]
        grads = [self.fingerprints("grads", i) for i in range(updates)]

        def snapshot(key: int) -> np.ndarray:
            found = init if key == -1 else rows[key] if key < updates else None
            return np.zeros(p, np.int64) if found is None else found

        return {
            "init/state": snapshot(-1),
            "micro/state": self.states.resolve(snapshot),
            **({} if self.sharded else {"micro/grad_writes": self.writes.array()}),
            "update/state": np.stack([snapshot(i) for i in range(updates)]).reshape(updates, p),
            "update/grad_state": np.stack(
                [np.zeros(p, np.int64) if g is None else g for g in grads]
            ).reshape(updates, p),
        }

    def manifest(self) -> dict:
        """What the manifest says about integrity and, in sketch mode, what was kept."""
        found: dict = {"integrity": "fingerprints"}
        if self.sketcher is not None:
            found["record"] = "sketch"
            found["sketch"] = {
                "width": self.sketcher.width,
                "whole_1d": self.sketcher.whole_1d,
                "snapshots": sorted(self.full_updates),
            }
        return found
