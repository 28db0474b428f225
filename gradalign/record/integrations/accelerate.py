"""Record an `accelerator.accumulate(model)` loop: wrap it in `record(...)`.

    with record(accelerator, model, optimizer, "runs/k4", items="causal-lm"):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step(); scheduler.step(); optimizer.zero_grad()

Nothing inside the loop changes. A micro-step is one `accelerator.accumulate(model)` block: it
is recorded when the block calls `optimizer.step()` or ends, whichever comes first, from what
its `accelerator.backward(loss)` calls received (one or several: their losses add up) and the
samples the model's forwards received with gradients on (one forward, or several chunks of the
micro-batch, put back together; keyword arguments such as `input_ids`, `attention_mask`,
`labels`; padding left out by the attention mask), with their items by the `items` rule. Each
`loss` is taken as its share of the micro-batch's own mean (accelerate divides it by K). A loop
that backpropagates something else (a summed loss divided by the window's token count, times K)
states each micro-batch's loss with `rec.record_loss(loss_sum=..., items=...)` before its
backward. The window that accelerate synchronizes (`accelerator.sync_gradients`) closes after its
optimizer step, as the model's next forward begins (or when recording ends). A block without a
backward is no micro-step (its window holds one fewer, and the judge names the micro-batch left
out); its forwards' samples are left out with it.

A loop without `accumulate` blocks: each backward is a micro-step, and a window closes at the
optimizer step that follows its K-th micro-step, or at a step at the end of the data (a prepared
dataloader's last batch, or the recording's end): a step before that is a step inside the
window. K is the accelerator's `gradient_accumulation_steps`, or `accum_steps=K` where the
Accelerator does not accumulate (the loop divides its loss by K itself: the loss given to
`accelerator.backward` is read as the micro-batch's mean divided by K, as accelerate's own is).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import torch
from accelerate import Accelerator

from ...errors import BadInput, shown
from .. import checks, watched
from ..recorder import Recorder
from ..window import unwrap_optimizer
from . import batches
from .micro_loss import MicroLoss, record_micro, summed

__all__ = ["AccelerateRecording", "record"]


class AccelerateRecording:
    """Records the accumulation loop that follows into `out_dir`; a context manager (or call
    `close()`), also named `record`.

    `items`: what each micro-batch's loss averages over ("causal-lm", "labels", "samples" or a
    function of the model's inputs: a dict of its keyword arguments, and `arg0`, `arg1`... for
    positional ones); with items the judge weighs micro-batches by them and can name
    `token-normalization`. `reference`: a float64 rerun of the baseline, relative to `out_dir`.
    `pad`: integer values left out of the sample digest. `accum_steps`: K, for a loop without
    `accumulate` blocks whose Accelerator does not accumulate (`gradient_accumulation_steps=1`)."""

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: Any,
        out_dir: str | os.PathLike[str],
        *,
        items: batches.ItemsRule = None,
        accum_steps: int | None = None,
        reference: str | None = None,
        config: dict[str, Any] | None = None,
        pad: Any = batches.PAD,
    ) -> None:
        if not isinstance(accelerator, Accelerator):
            raise BadInput(
                f"record() needs an accelerate.Accelerator, got {type(accelerator).__name__}"
            )
        batches.check_items_rule(items)
        if not isinstance(model, torch.nn.Module):
            raise BadInput(
                f"record() needs the model (a torch.nn.Module), got {type(model).__name__}"
            )
        try:
            unwrap_optimizer(optimizer)
        except TypeError as exc:
            raise BadInput(f"record(): {exc}") from None
        config = checks.config_of(config)
        k = _accum_steps(accelerator, accum_steps)
        self.accelerator = accelerator
        self.model = accelerator.unwrap_model(model)
        self.items = items
        self.pad = pad
        self.pending: MicroLoss | None = None
        self._losses: list[MicroLoss] = []  # the open micro-step's backward calls
        self._inputs: list[dict[str, Any]] = []  # its forwards with gradients on
        self._sync = False  # whether its backward synchronized (the window's last)
        self._blocks = 0  # accumulate() blocks open
        self._window_ended = False
        self._loss_scale: float | None = None
        self._k = k
        self._factor = k // accelerator.gradient_accumulation_steps  # K the loop divides by
        self._in_window = 0  # micro-steps recorded in the open window
        self._accumulating = False  # the loop uses accumulate(): accelerate's sync ends windows
        self._stepped = False  # the optimizer stepped after the open window's last micro-step
        self.recorder = Recorder(
            out_dir,
            model,  # as prepared: on several processes, its DistributedDataParallel
            optimizer,
            accum_steps=k,
            config={**_run_config(accelerator, self.model, optimizer, k), **config},
            reference=reference,
        )
        self._backward, self._accumulate = accelerator.backward, accelerator.accumulate
        accelerator.backward = self._recording_backward  # type: ignore[method-assign]
        accelerator.accumulate = self._recording_accumulate  # type: ignore[method-assign]
        self._hook = self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        inner = unwrap_optimizer(optimizer)
        stops = [watched.before_step(inner, self._on_step)]
        if optimizer is not inner:  # its step call, also when a GradScaler skips the step
            stops.append(watched.watch(type(optimizer), "step", optimizer, self._on_wrapper_step))
        self._stops = stops

    def record_loss(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        loss_sum: torch.Tensor | float | None = None,
        items: int | float | torch.Tensor | None = None,
    ) -> None:
        """State the next backward's micro-batch loss: its own mean `loss`, or `loss_sum` with
        `items`, when what you pass to `accelerator.backward` is not the micro-batch's mean."""
        self.pending = MicroLoss.of(loss, loss_sum, items)

    def close(self) -> None:
        """Close the last window and write the run."""
        self._unhook()
        self._flush()
        if not self._accumulating and self._stepped:  # the data ended in a short window
            self._window_ended = True
        self._close_window()
        self.recorder.close()

    def abort(self) -> None:
        """Discard the run (an earlier run at the path stays)."""
        self._unhook()
        self.recorder.abort()

    def __enter__(self) -> AccelerateRecording:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- hooks -------------------------------------------------------------------------------------

    def _before_forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._close_window()
        if torch.is_grad_enabled():  # not an evaluation under no_grad
            if not self._losses and self._blocks == 0:
                self._inputs = []  # outside a block: the last forward before a backward counts
            self._inputs.append({**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs})

    def _recording_backward(self, loss: torch.Tensor, **kwargs: Any) -> Any:
        self._close_window()
        result = self._backward(loss, **kwargs)
        given, self.pending = self.pending, None
        self._losses.append(given or MicroLoss.scaled_mean(loss, self._factor))
        scaler = self.accelerator.scaler
        self._loss_scale = None if scaler is None else float(scaler.get_scale())
        self._sync = bool(self.accelerator.sync_gradients)
        if self._blocks == 0:
            self._flush()
        return result

    @contextlib.contextmanager
    def _recording_accumulate(self, *models: Any) -> Iterator[None]:
        if self._factor != 1:
            raise BadInput(
                f"record(..., accum_steps={self._k}) is for a loop without accelerator."
                "accumulate(): this Accelerator accumulates 1 batch; give it "
                f"gradient_accumulation_steps={self._k} and leave accum_steps out"
            )
        self._accumulating = True
        self._blocks += 1
        try:
            with self._accumulate(*models):
                yield
        finally:
            self._blocks -= 1
        if not self._losses:  # forwarded without a backward: its samples train nothing
            self._inputs = []
        self._flush()  # not when the block raised: the recording is aborted then

    def _flush(self) -> None:
        """Record the open micro-step, if a backward made one."""
        if not self._losses:
            return
        losses, self._losses = self._losses, []
        inputs, self._inputs = self._inputs, []
        record_micro(self.recorder, summed(losses), _joined(inputs), self.items, self.pad)
        self._in_window += 1
        self._stepped = False
        if self._accumulating:
            self._window_ended = self._sync

    def _on_step(self) -> None:
        """The optimizer starts a step: the open micro-step comes first; without accumulate
        blocks, the window ends here once it holds K micro-steps or the data ends."""
        self._flush()
        if not self._in_window:
            raise BadInput(
                "the optimizer stepped with no accelerator.backward(loss) since its last step: "
                "call accelerator.backward(loss), not loss.backward()"
            )
        if self._accumulating:
            return
        self._stepped = True
        if self._k == 1 and self._in_window > 1:
            raise BadInput(
                f"the loop made {self._in_window} backward calls before its optimizer step, but "
                "the Accelerator accumulates 1 batch: give record(..., accum_steps=K) for a loop "
                "that accumulates K batches dividing its loss by K itself (or "
                "Accelerator(gradient_accumulation_steps=K)); several backward calls of one batch "
                "go in one accelerator.accumulate(model) block"
            )
        end_of_data = self.accelerator.gradient_state.end_of_dataloader
        if self._in_window >= self._k or end_of_data:
            self._window_ended = True

    def _on_wrapper_step(self) -> None:
        if not self._accumulating:  # in a block, accelerate's wrapper steps only on sync
            self._on_step()

    def _close_window(self) -> None:
        if self._window_ended:
            self._window_ended = False
            self._in_window = 0
            self._stepped = False
            self.recorder.update(loss_scale=self._loss_scale)

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
            for stop in self._stops:
                stop()
            self.accelerator.backward = self._backward  # type: ignore[method-assign]
            self.accelerator.accumulate = self._accumulate  # type: ignore[method-assign]


def _joined(forwards: list[dict[str, Any]]) -> dict[str, Any]:
    """One micro-batch from the forwards of its chunks: each tensor argument concatenated along
    its rows, chunks padded to one width with 0 where they were padded to their own (the
    attention mask then leaves the padding out); other arguments as the last chunk had them."""
    if len(forwards) <= 1:
        return forwards[0] if forwards else {}
    joined = dict(forwards[-1])
    for key, value in forwards[-1].items():
        parts = [f.get(key) for f in forwards]
        if isinstance(value, torch.Tensor) and all(isinstance(t, torch.Tensor) for t in parts):
            joined[key] = _rows(parts)  # type: ignore[arg-type]
    return joined


def _rows(parts: list[torch.Tensor]) -> torch.Tensor:
    shapes = {t.shape[2:] for t in parts}
    if any(t.dim() < 2 for t in parts) or len(shapes) > 1:
        return torch.cat(parts)
    width = max(t.shape[1] for t in parts)
    padded = [
        torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in parts
    ]
    return torch.cat(padded)


record = AccelerateRecording  # record(accelerator, model, optimizer, out_dir, items=...)


def _accum_steps(accelerator: Accelerator, accum_steps: int | None) -> int:
    """K: the accelerator's, or `accum_steps` where it does not accumulate."""
    own = accelerator.gradient_accumulation_steps
    if accum_steps is None:
        return own
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise BadInput(f"accum_steps must be a positive integer, got {shown(accum_steps)}")
    if own not in (1, accum_steps):
        raise BadInput(
            f"accum_steps={accum_steps} but the Accelerator accumulates {own} batches; leave "
            "accum_steps out"
        )
    return accum_steps


def _run_config(
    accelerator: Accelerator, model: torch.nn.Module, optimizer: Any, k: int
) -> dict[str, Any]:
    """The training settings a reference run must share (dtype, K and device may differ)."""
    group = optimizer.param_groups[0]
    first = next(model.parameters())
    return {
        "framework": "accelerate",
        "accum_steps": k,
        "optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "lr": group.get("initial_lr", group["lr"]),
        "weight_decay": group.get("weight_decay", 0.0),
        "mixed_precision": str(accelerator.mixed_precision),
        "dtype": str(first.dtype).removeprefix("torch."),
    }
