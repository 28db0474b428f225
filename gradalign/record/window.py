"""The Recorder's bookkeeping of accumulation windows, as facts rather than assertions.

A loop with an accumulation bug calls the Recorder in the wrong order: micro() more or fewer
times than K in a window, grads() twice, update() forgotten. The Recorder must record such a
run, not refuse it mid-training: the judge names the bug from these facts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import watched
from .draws import Draws
from .facts import device_scalar
from .optimizer_settings import group_places
from .wrappers import chain, data_parallel


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """The torch optimizer inside a wrapper (accelerate's AcceleratedOptimizer, a Lightning or
    Trainer wrapper: anything exposing `.optimizer`), whose step hooks and state are real."""
    seen = 0
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and seen < 8:
        optimizer = optimizer.optimizer  # type: ignore[attr-defined]
        seen += 1
    if not isinstance(optimizer, torch.optim.Optimizer):
        several = isinstance(optimizer, (list, tuple)) and all(
            isinstance(o, torch.optim.Optimizer) for o in optimizer
        )
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer (or wrap one as .optimizer), got "
            f"{type(optimizer).__name__}"
            + (
                " of optimizers: give the Recorder one of them, the one whose steps stand "
                "for all (its zero_grad() calls are the ones counted)"
                if several and optimizer
                else ""
            )
        )
    return optimizer


def group_lrs(optimizer: torch.optim.Optimizer, places: dict[int, int]) -> dict[int, float]:
    """Every param group's learning rate (a tensor lr is read as a number; None, as an
    optimizer that computes its own from the step count keeps it, as NaN: unknown, as a skipped
    step's), keyed by the group's place in the model (`optimizer_settings.group_places`): a group
    added later keeps its column, whether it sits before the others in the model or after."""
    groups, last = optimizer.param_groups, len(places)
    found = {}
    for place, i in group_places(optimizer, places):
        lr = groups[i].get("lr")
        found[place if place < last else last + i] = math.nan if lr is None else float(lr)
    return found


def after_closure(args: Any, kwargs: Any, then: Callable[[], None]) -> Any:
    """optimizer.step()'s arguments with its closure followed by `then` (None without a closure),
    for a step pre-hook to return. args[0] is the optimizer itself (the hook sees step's own
    arguments, self included)."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if closure is None:
        return None

    def closure_then() -> Any:
        loss = closure()
        then()
        return loss

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure_then}
    return (args[0], closure_then, *args[2:]), kwargs


def watch_scaler(scaler: Any, windows: Windows) -> Callable[[], None]:
    """Count a GradScaler's unscale_() and update() calls into the open window (an unscale or an
    update per micro-step breaks accumulation); returns the function that stops counting."""
    windows.watched_scaler = True
    windows.scaler = scaler

    def unscaled() -> None:
        windows.open.unscales += 1

    def updated() -> None:
        windows.open.scaler_updates += 1

    stops = [
        watched.watch(type(scaler), "unscale_", scaler, unscaled),
        watched.watch(type(scaler), "update", scaler, updated),
    ]
    return _together(stops)


def watch_loop(windows: Windows, optimizer: Any, model: Any, wrapper: Any) -> Callable[[], None]:
    """Count into the open window the optimizer's and the model's zero_grad() calls, the
    model's wrappers' too (DDP's, Fabric's: one between two of its micro-steps discards the
    gradient accumulated so far; the base classes are watched, so every optimizer and module
    class is seen) and, where `wrapper` holds the model in DistributedDataParallel, the
    training forwards that went around it."""
    modules = chain(wrapper)  # the model last: it is what the wrappers hold
    stops = [
        watched.watch(torch.optim.Optimizer, "zero_grad", optimizer, windows.zero_grad),
        *(watched.watch(torch.nn.Module, "zero_grad", m, windows.zero_grad) for m in modules),
    ]
    ddp = data_parallel(wrapper)
    if ddp is not None and ddp is not model:
        stops.append(_watch_forwards(windows, ddp, model))
    return _together(stops)


def _watch_forwards(
    windows: Windows, ddp: torch.nn.Module, model: torch.nn.Module
) -> Callable[[], None]:
    """Count the model's forwards and DDP's own, with gradients on (an evaluation under no_grad
    syncs nothing): DDP all-reduces the gradients of the forwards it ran, and a forward of the
    model inside it (`ddp.module(x)`, or a method of the model) goes around it."""

    def outer(module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            windows.open.wrapped_forwards += 1

    def inner(module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            windows.open.forwards += 1

    hooks = [ddp.register_forward_pre_hook(outer), model.register_forward_pre_hook(inner)]
    return _together([hook.remove for hook in hooks])


def _together(stops: list[Callable[[], None]]) -> Callable[[], None]:
    def stop() -> None:
        for each in stops:
            each()

    return stop


@dataclass
class Window:
    """What happened in the window being recorded."""

    micro_steps: int = 0
    steps: int = 0  # optimizer.step() calls seen by the hook
    lr: dict[int, float] = field(default_factory=dict)  # of the last step, per param group
    grads_calls: int = 0
    grads_written: bool = False
    # given to grads(), else the last clip_grad_norm_ total: a 0-d tensor, read at close
    pre_clip_norm: torch.Tensor | None = None
    clipped_sets: list[frozenset[int]] = field(default_factory=list)  # each norm clip's params
    clipped_norms: list[torch.Tensor] = field(default_factory=list)  # and its norm before it
    # norms read at an infinite threshold before any clip: the latest per parameter set
    read_norms: dict[frozenset[int], torch.Tensor] = field(default_factory=dict)
    unscales: int = 0  # GradScaler.unscale_() calls (when a scaler is watched)
    scaler_updates: int = 0  # GradScaler.update() calls
    clip_calls: int = 0  # clip_grad_norm_ and clip_grad_value_ calls on the model's parameters
    clip_value: float = math.nan  # the last clip_grad_value_'s clip value
    clip_max_norm: float | torch.Tensor = math.nan  # the last clip_grad_norm_'s max_norm
    clips_scaled: int = 0  # clip calls before the watched, enabled GradScaler's unscale_()
    zero_grads_inside: int = 0  # zero_grad() calls between two of its micro-steps
    zero_grads_after: int = 0  # since its last micro-step (inside if another micro-step comes)
    zero_grads_unstepped: int = 0  # of those, the ones before any optimizer step in the window
    discarded: int = 0  # micro-steps before its last zero_grad() inside: their gradient cleared
    forwards: int = 0  # the model's forwards with gradients on (watched under DDP only)
    wrapped_forwards: int = 0  # of them, those DistributedDataParallel ran


@dataclass
class Windows:
    """Per-update series, one entry per closed window."""

    micro_steps: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    lr: list[dict[int, float]] = field(default_factory=list)
    state_steps: list[int] = field(default_factory=list)
    loss_scales: list[float | None] = field(default_factory=list)
    pre_clip: list[torch.Tensor | None] = field(default_factory=list)
    grads_calls: list[int] = field(default_factory=list)
    scaler_calls: list[tuple[int, int]] = field(default_factory=list)
    watched_scaler: bool = False
    clip_calls: list[int] = field(default_factory=list)
    clip_values: list[float] = field(default_factory=list)
    clip_max_norms: list[float | torch.Tensor] = field(default_factory=list)  # on its device
    clips_scaled: list[int] = field(default_factory=list)
    scaler: Any = None  # the watched GradScaler
    zero_grads_inside: list[int] = field(default_factory=list)
    zero_grads_before_step: list[int] = field(default_factory=list)  # after the last micro-step
    discarded: list[int] = field(default_factory=list)
    bypassed_forwards: list[int] = field(default_factory=list)  # forwards around DDP
    zero_grads_seen: bool = False  # a zero_grad() call was seen: the counts above mean something
    draws: Draws = field(default_factory=Draws)  # random numbers drawn per micro-step
    open: Window = field(default_factory=Window)

    @property
    def closed(self) -> int:
        return len(self.micro_steps)

    def close(self, state_step: int, loss_scale: float | None) -> None:
        w = self.open
        self.micro_steps.append(w.micro_steps)
        self.steps.append(w.steps)
        self.lr.append(w.lr)  # none where it did not step
        self.state_steps.append(state_step)
        self.loss_scales.append(loss_scale)
        self.pre_clip.append(w.pre_clip_norm)
        self.grads_calls.append(w.grads_calls)
        self.scaler_calls.append((w.unscales, w.scaler_updates))
        self.clip_calls.append(w.clip_calls)
        self.clip_values.append(w.clip_value)
        self.clip_max_norms.append(w.clip_max_norm)
        self.clips_scaled.append(w.clips_scaled)
        self.zero_grads_inside.append(w.zero_grads_inside)
        self.zero_grads_before_step.append(w.zero_grads_unstepped)
        self.discarded.append(w.discarded)
        self.bypassed_forwards.append(max(0, w.forwards - w.wrapped_forwards))
        self.open = Window()

    def clipped(
        self,
        value: float | None,
        total: torch.Tensor | None,
        params: frozenset[int],
        reads_only: bool = False,
        max_norm: float | torch.Tensor | None = None,
    ) -> None:
        """A clip_grad_norm_ (`total`: the norm before it) or clip_grad_value_ (`value`) call on
        the model's parameters (`params`: their ids); one before the watched GradScaler's
        unscale_() in this window clipped the scaled gradients (GradScaler.step() unscales first
        where the loop did not). The window's norm before clipping is that of every parameter a
        norm clip reached before any other clip did: a later call on parameters clipped already
        (a `clip_grad_norm_(params, inf)` that logs the norm) sees the clipped gradient, and
        clips of disjoint parts (an encoder's, a head's) add up in any order. A call at an
        infinite threshold (`reads_only`: a norm logged) clips nothing and is not counted; in
        a window no clip reaches, the latest such read of each part is its norm (one after the
        last backward reads the whole gradient, one per micro-step a partial sum too)."""
        w = self.open
        if reads_only:  # the latest read before any clip: after the window's last backward
            if total is not None and w.grads_calls == 0 and not w.clipped_sets:
                w.read_norms[params] = device_scalar(total)
                w.pre_clip_norm = _combined(list(w.read_norms.values()))
            return
        w.clip_calls += 1
        if max_norm is not None:  # the threshold of a norm clip (`max_norm`)
            w.clip_max_norm = max_norm
        enabled = self.scaler is not None and bool(getattr(self.scaler, "is_enabled", bool)())
        if enabled and w.unscales == 0:
            w.clips_scaled += 1
        if value is not None:
            w.clip_value = value
        elif total is not None and w.grads_calls == 0:
            if any(params & earlier for earlier in w.clipped_sets):
                return
            w.clipped_sets.append(params)
            w.clipped_norms.append(device_scalar(total))
            w.pre_clip_norm = _combined(w.clipped_norms)

    def zero_grad(self) -> None:
        """A zero_grad() call: inside the window when it falls between two of its micro-steps,
        where it discards the gradient accumulated so far (one after the last micro-step, even
        where a GradScaler skipped the step, is not)."""
        self.zero_grads_seen = True
        if self.open.micro_steps:
            self.open.zero_grads_after += 1
            self.open.zero_grads_unstepped += not self.open.steps

    def micro_step(self, cleared: bool = False) -> None:
        """One more micro-step in the open window; `cleared`: every gradient held at the one
        before was set to None or replaced since (by hand, where no zero_grad() call shows)."""
        w = self.open
        if (w.zero_grads_after or (cleared and w.micro_steps)) and not w.steps:
            w.discarded = w.micro_steps  # cleared before this one, never stepped on
        w.zero_grads_inside += w.zero_grads_after
        w.zero_grads_after = w.zero_grads_unstepped = 0
        w.micro_steps += 1
        self.draws.micro()

    def unclosed(self, written: Callable[[], bool]) -> dict[str, int]:
        """What came after the last update(), for the manifest: micro-steps (the last window
        never ended), or else optimizer steps that moved the weights (`written`), which no
        snapshot holds (a step on no gradient writes nothing)."""
        w = self.open
        if w.micro_steps:
            return {"unclosed_micro_steps": w.micro_steps}
        return {"unclosed_steps": w.steps} if w.steps and written() else {}

    def series(self, accum_steps: int) -> dict[str, np.ndarray]:
        """The per-update series for the run's series file (only what was recorded)."""
        out: dict[str, np.ndarray] = {
            "update/lr": np.asarray(
                [lr[min(lr)] if lr else math.nan for lr in self.lr], dtype=np.float64
            ),
            "update/optimizer_steps": np.asarray(self.steps, dtype=np.int64),
            **self.draws.series(),
        }
        keys = sorted({key for lr in self.lr for key in lr})
        if len(keys) > 1:
            # NaN for a group that does not exist yet (added mid-run by add_param_group)
            rows = [[lr.get(key, math.nan) for key in keys] for lr in self.lr]
            out["update/lr_groups"] = np.asarray(rows, dtype=np.float64)
        if any(n != accum_steps for n in self.micro_steps):
            out["update/micro_steps"] = np.asarray(self.micro_steps, dtype=np.int64)
        if any(n != 1 for n in self.grads_calls) and any(self.grads_calls):
            out["update/grads_calls"] = np.asarray(self.grads_calls, dtype=np.int64)
        if self.watched_scaler:
            out["update/scaler_calls"] = np.asarray(self.scaler_calls, dtype=np.int64).reshape(
                -1, 2
            )
        if any(self.clip_calls):
            out["update/clip_calls"] = np.asarray(self.clip_calls, dtype=np.int64)
        if any(self.clips_scaled):
            out["update/clips_before_unscale"] = np.asarray(self.clips_scaled, dtype=np.int64)
        if not all(math.isnan(v) for v in self.clip_values):
            out["update/clip_value"] = np.asarray(self.clip_values, dtype=np.float64)
        max_norms = [float(v) for v in self.clip_max_norms]  # a device's read once, here
        if not all(math.isnan(v) for v in max_norms):
            out["update/clip_max_norm"] = np.asarray(max_norms, dtype=np.float64)
        if any(self.bypassed_forwards):
            out["update/bypassed_forwards"] = np.asarray(self.bypassed_forwards, dtype=np.int64)
        if self.zero_grads_seen:
            out["update/zero_grads_inside"] = np.asarray(self.zero_grads_inside, dtype=np.int64)
        if any(self.zero_grads_before_step):
            before = np.asarray(self.zero_grads_before_step, dtype=np.int64)
            out["update/zero_grads_before_step"] = before
        if any(self.discarded):
            out["update/discarded_micro_steps"] = np.asarray(self.discarded, dtype=np.int64)
        if self.loss_scales and all(s is not None for s in self.loss_scales):
            out["update/loss_scale"] = np.asarray(self.loss_scales, dtype=np.float64)
        if any(step >= 0 for step in self.state_steps):
            out["update/state_step"] = np.asarray(self.state_steps, dtype=np.int64)
        if self.pre_clip and all(n is not None for n in self.pre_clip):
            # read here, at once: one read per update would make the host wait for a GPU
            norms = torch.stack([n.to(self.pre_clip[0].device) for n in self.pre_clip])
            out["update/grad_norm_pre_clip"] = norms.to("cpu", torch.float64).numpy()
        return out


def _combined(norms: list[torch.Tensor]) -> torch.Tensor:
    """The norm of disjoint parts' gradients from theirs, on the first one's device."""
    if len(norms) == 1:
        return norms[0]
    return torch.stack([n.to(norms[0].device) for n in norms]).square().sum().sqrt()
