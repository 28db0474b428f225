"""`Recorder`: the public API that writes a run directory from any PyTorch training loop.

    with gradalign.Recorder(out_dir, model, optimizer, accum_steps=k, config={...}) as rec:
        for update in range(n):
            for micro in range(k):
                loss = loss_fn(model(x), y)
                (loss / k).backward()
                rec.micro(loss, batch=(x, y))  # its own (unscaled) mean loss, and its samples
            rec.grads()                # optional: the accumulated gradient, just before step()
            optimizer.step()
            rec.update()               # after step()
            optimizer.zero_grad()

The recorder watches `optimizer.step()` through a hook, so it knows the learning rate of every
step and how many steps happened inside each window, without trusting the loop to say so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runs.layout import grads_file, weights_file
from ..runs.writer import RunWriter
from .device import environment
from .facts import (
    RecorderError,
    data_digest,
    dtype_name,
    fingerprint,
    model_facts,
    named_tensors,
    to_numpy,
)

__all__ = ["Recorder", "RecorderError"]


class Recorder:
    """Records one training run (initial weights, micro losses, digests, snapshots) to `out_dir`."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        accum_steps: int = 1,
        config: dict[str, Any] | None = None,
        *,
        fault: str | None = None,
        reference: str | None = None,
        compute_dtype: str | None = None,
    ) -> None:
        if not isinstance(accum_steps, int) or accum_steps < 1:
            raise RecorderError(f"accum_steps must be a positive integer, got {accum_steps!r}")
        self.accum_steps = accum_steps
        self.config = dict(config or {})
        self.fault = fault
        self.reference = reference
        self._optimizer = optimizer
        self._model_facts = model_facts(model)
        self._named = named_tensors(model)
        if not self._named:
            raise RecorderError("the model has no parameters to record")
        first = next(iter(self._named.values()))[0]
        self._env = environment(first.device, first.dtype)
        if compute_dtype is not None:
            self._env["compute_dtype"] = compute_dtype
        self._losses: list[torch.Tensor] = []
        self._items: list[float] = []
        self._data: list[int] = []
        self._micro_state: list[torch.Tensor] = []
        self._update_state: list[np.ndarray] = []
        self._lr: list[float] = []
        self._steps: list[int] = []
        self._state_steps: list[int] = []
        self._loss_scales: list[float] = []
        self._grad_updates: list[int] = []
        self._grad_dtypes: set[str] = set()
        self._pre_clip: list[float] = []
        self._window_lr = float("nan")
        self._window_steps = 0
        self._closed = False
        # Whatever can fail comes before the run's directory is staged; after it, a failure
        # removes the staging directory again: an error never leaves a partial run behind.
        self._hook = optimizer.register_step_pre_hook(self._on_step)
        try:
            self._writer = RunWriter(out_dir)
        except BaseException:
            self._hook.remove()
            raise
        try:
            self._writer.write_tensors(weights_file(None), self._snapshot())
            self._init_state = self._state()
        except BaseException:
            self.abort()
            raise

    # -- calls from the training loop ------------------------------------------------------------

    def micro(
        self, loss: torch.Tensor | float, items: int | float | None = None, batch: Any = None
    ) -> None:
        """Record one micro-batch: its own unscaled mean loss and, optionally, its item count and
        its samples (`batch`: a tensor or a tuple/list/dict of tensors, e.g. `(inputs, targets)`),
        of which only an int64 digest is kept, to check that both runs saw the same samples."""
        self._check_open()
        if len(self._losses) - len(self._update_state) * self.accum_steps >= self.accum_steps:
            raise RecorderError(
                f"micro() called more than accum_steps={self.accum_steps} times before update()"
            )
        if items is None and self._items:
            raise RecorderError("items were given for earlier micro-steps; give them every time")
        if items is not None and len(self._items) != len(self._losses):
            raise RecorderError("items given now but not for earlier micro-steps")
        if batch is None and self._data:
            raise RecorderError("batch was given for earlier micro-steps; give it every time")
        if batch is not None and len(self._data) != len(self._losses):
            raise RecorderError("batch given now but not for earlier micro-steps")
        value = loss.detach().reshape(()) if isinstance(loss, torch.Tensor) else torch.tensor(loss)
        self._losses.append(value.to(torch.float64))
        if items is not None:
            self._items.append(float(items))
        if batch is not None:
            self._data.append(data_digest(batch))
        self._micro_state.append(self._state_tensor())

    def grads(self, pre_clip_norm: torch.Tensor | float | None = None) -> None:
        """Record the accumulated gradient; call just before `optimizer.step()`.

        `pre_clip_norm` is the total norm before clipping, as `clip_grad_norm_` returns it.
        """
        self._check_open()
        update = len(self._update_state)
        if self._grad_updates and self._grad_updates[-1] == update:
            raise RecorderError("grads() called twice for the same update")
        self._grad_dtypes.update(
            dtype_name(tensor.grad)
            for tensor, _, _ in self._named.values()
            if tensor.grad is not None
        )
        grads = {
            name: to_numpy(tensor.grad) if tensor.grad is not None else np.zeros(shape, np.float32)
            for name, (tensor, kind, shape) in self._named.items()
            if kind == "param"
        }
        self._writer.write_tensors(grads_file(update), grads)
        self._grad_updates.append(update)
        if pre_clip_norm is not None:
            self._pre_clip.append(float(pre_clip_norm))

    def update(self, loss_scale: float | None = None) -> None:
        """Record the end of one accumulation window; call after `optimizer.step()`.

        `loss_scale`: the GradScaler's scale used in this window (`scaler.get_scale()` before
        `scaler.update()`), if the loop scales its loss."""
        self._check_open()
        update = len(self._update_state)
        seen = len(self._losses) - update * self.accum_steps
        if seen != self.accum_steps:
            raise RecorderError(
                f"update {update}: {seen} micro() calls, expected accum_steps={self.accum_steps}"
            )
        self._writer.write_tensors(weights_file(update), self._snapshot())
        self._update_state.append(self._state())
        self._lr.append(self._window_lr)
        self._steps.append(self._window_steps)
        self._state_steps.append(self._optimizer_state_step())
        if loss_scale is not None:
            self._loss_scales.append(float(loss_scale))
        self._window_lr, self._window_steps = float("nan"), 0

    def close(self) -> Path | None:
        """Finish the run and move it into place. Returns its path (None if already closed)."""
        if self._closed:
            return None
        self._closed = True
        self._hook.remove()
        try:
            series, manifest = self._finalize()
            return self._writer.finish(manifest, series)
        except BaseException:
            self._writer.abort()
            raise

    def abort(self) -> None:
        """Discard the run: nothing is written at `out_dir`, and an earlier run there is kept."""
        if not self._closed:
            self._closed = True
            self._hook.remove()
            self._writer.abort()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals --------------------------------------------------------------------------------

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._window_lr = float(optimizer.param_groups[0]["lr"])
        self._window_steps += 1

    def _optimizer_state_step(self) -> int:
        """The optimizer's own step counter (Adam's `state["step"]`), or -1 if it keeps none."""
        for group in self._optimizer.param_groups:
            for param in group["params"]:
                step = self._optimizer.state.get(param, {}).get("step")
                if step is not None:
                    return int(step)
        return -1

    def _check_open(self) -> None:
        if self._closed:
            raise RecorderError("the recorder is closed")

    def _snapshot(self) -> dict[str, np.ndarray]:
        return {name: to_numpy(tensor) for name, (tensor, _, _) in self._named.items()}

    def _state_tensor(self) -> torch.Tensor:
        return torch.stack([fingerprint(tensor) for tensor, _, _ in self._named.values()])

    def _state(self) -> np.ndarray:
        return self._state_tensor().cpu().numpy()

    def _finalize(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        updates = len(self._update_state)
        if len(self._losses) != updates * self.accum_steps:
            raise RecorderError(
                f"{len(self._losses) - updates * self.accum_steps} micro() calls after the last "
                "update(); every window must end with update()"
            )
        if self._grad_updates and self._grad_updates != list(range(updates)):
            raise RecorderError("grads() must be called for every update or for none")
        p = len(self._named)
        series: dict[str, np.ndarray] = {
            "micro/loss": torch.stack(self._losses).cpu().numpy() if self._losses else np.zeros(0),
            "micro/state": (
                torch.stack(self._micro_state).cpu().numpy()
                if self._micro_state
                else np.zeros((0, p), np.int64)
            ),
            "init/state": self._init_state,
            "update/state": np.stack(self._update_state) if updates else np.zeros((0, p), np.int64),
            "update/lr": np.asarray(self._lr, dtype=np.float64),
            "update/optimizer_steps": np.asarray(self._steps, dtype=np.int64),
        }
        if self._items:
            series["micro/items"] = np.asarray(self._items, dtype=np.float64)
        if self._data:
            series["micro/data"] = np.asarray(self._data, dtype=np.int64)
        if self._loss_scales and len(self._loss_scales) == updates:
            series["update/loss_scale"] = np.asarray(self._loss_scales, dtype=np.float64)
        if any(step >= 0 for step in self._state_steps):
            series["update/state_step"] = np.asarray(self._state_steps, dtype=np.int64)
        if self._pre_clip and len(self._pre_clip) == updates:
            series["update/grad_norm_pre_clip"] = np.asarray(self._pre_clip, dtype=np.float64)
        manifest = {
            "accum_steps": self.accum_steps,
            "updates": updates,
            "micro_steps": len(self._losses),
            "tensors": [
                {"name": name, "shape": list(shape), "dtype": dtype_name(tensor), "kind": kind}
                for name, (tensor, kind, shape) in self._named.items()
            ],
            "config": self.config,
            "environment": self._env,
            "fault": self.fault,
            "model": self._model_facts,
        }
        if self._grad_dtypes:
            manifest["grad_dtype"] = "+".join(sorted(self._grad_dtypes))
        if self.reference is not None:
            manifest["reference"] = self.reference
        return series, manifest
