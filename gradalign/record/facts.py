"""Facts the Recorder takes from live tensors: exact-bit fingerprints, order-free sample digests,
numpy copies, and the model's structure (its tensors, BatchNorm and dropout layers)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..runs.digests import bitsum, wrap
from ..runs.model import working_dtype
from . import samples
from .sharded import whole
from .wrappers import data_parallel

_BITS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
# torch sums int32 bits in int64 through an int64 copy of its input: fingerprints are summed a
# block at a time, so that copy is 32 MiB, not twice the tensor (bench/sketch_memory.py)
_FINGERPRINT_BLOCK = 1 << 22


class RecorderError(RuntimeError):
    """The loop called the Recorder in an order that cannot describe a training run."""


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU numpy copy; bfloat16 (which numpy lacks) is widened to float32 exactly."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy().copy()


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """An int64 digest of a tensor's exact bits (the sum of its bit patterns), on its device."""
    tensor = tensor.detach()
    if tensor.dtype.is_floating_point:
        tensor = tensor.view(_BITS[tensor.element_size()])
    if tensor.numel() <= _FINGERPRINT_BLOCK:
        return tensor.sum(dtype=torch.int64)
    flat = tensor.reshape(-1)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for first in range(0, flat.numel(), _FINGERPRINT_BLOCK):
        total += flat[first : first + _FINGERPRINT_BLOCK].sum(dtype=torch.int64)
    return total


# leaves of a batch that are no samples' data: a text field, a count, an absent value
_LEFT_OUT = (str, bytes, int, float, type(None))


def _tensors(batch: Any) -> list[torch.Tensor]:
    """A batch's tensors: a tensor, or a tuple, list, mapping or dataclass of them (nested), as
    collate functions make them; strings, numbers and None beside them are left out. A batch
    that holds some of those and no tensor is refused (its digest would check nothing)."""
    found, left_out = _leaves(batch)
    if left_out and not found:
        raise RecorderError(
            f"batch holds no tensor ({type(batch).__name__} of strings, numbers or None): give "
            "its samples as tensors"
        )
    return found


def _leaves(batch: Any) -> tuple[list[torch.Tensor], bool]:
    """The tensors in `batch`, and whether leaves were left out (`_LEFT_OUT`)."""
    if isinstance(batch, torch.Tensor):
        if batch.is_meta:
            raise RecorderError("batch is on the meta device (it holds no data): give its samples")
        return [batch], False
    if isinstance(batch, _LEFT_OUT):
        return [], True
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if not isinstance(batch, list | tuple):
        raise RecorderError(
            "batch must be a tensor, or a tuple, list, dict or dataclass of them; got "
            f"{type(batch).__name__}"
        )
    found, left_out = [], False
    for item in batch:
        tensors, skipped = _leaves(item)
        found += tensors
        left_out = left_out or skipped
    return found, left_out


def data_digest(batch: Any, pad: Any = None, mask: torch.Tensor | None = None) -> int:
    """An order-free int64 digest of a batch's samples that adds up over micro-batches.

    Floating tensors are digested as float32 bits, so a float64 rerun of the same data (cast from
    float32) digests alike; the digest of a batch is the sum of its micro-batches' digests.
    Padding must not count, since a batch of B and its micro-batches are padded to different
    lengths: with `mask` (e.g. an attention mask of shape [batch, time]), only the positions it
    marks count in every tensor whose leading dimensions match it; with `pad` (a value, or a
    tuple of values such as `(0, -100)` for pad tokens and ignored labels), elements of integer
    tensors equal to it do not count.
    """
    found = sample_digest(batch, pad, mask)
    samples.resolve([found])  # a device batch's row sums, read now
    return wrap(int(found.data))


def sample_digest(batch: Any, pad: Any = None, mask: torch.Tensor | None = None) -> samples.Digest:
    """`data_digest` and the row-wise `micro/pairs` digest (record/samples.py), as ints on the
    CPU; on other devices kept there (the row sums, or 0-d int64 tensors) and read later
    (`samples.resolve`), so recording a micro-step needs no host sync."""
    keep_mask = None if mask is None else _mask(mask)
    pads = _pads(pad)
    tensors = _tensors(batch)
    sparse = next((t for t in tensors if t.layout != torch.strided), None)
    if sparse is not None:
        raise RecorderError(
            f"batch= holds a {sparse.layout} tensor of shape {tuple(sparse.shape)}, whose samples "
            "are not digested: give its dense form (.to_dense()) or leave it out of batch="
        )
    if keep_mask is not None and not any(
        t.shape[: keep_mask.dim()] == keep_mask.shape for t in tensors
    ):
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors[:3])
        raise RecorderError(
            f"mask of shape {tuple(keep_mask.shape)} fits no tensor of the batch (shapes "
            f"{shapes}): give the mask of this micro-batch, shaped as its leading dimensions"
        )
    keeps: list[torch.Tensor | None] = []
    for tensor in tensors:
        keep = None
        if keep_mask is not None and tensor.shape[: keep_mask.dim()] == keep_mask.shape:
            keep = keep_mask.reshape(keep_mask.shape + (1,) * (tensor.dim() - keep_mask.dim()))
            keep = keep.expand(tensor.shape)
        if pads and not tensor.dtype.is_floating_point:
            real = ~torch.isin(tensor, torch.tensor(pads, device=tensor.device))
            keep = real if keep is None else keep & real
        keeps.append(keep)
    return samples.digest([t.detach() for t in tensors], keeps)


def _mask(mask: Any) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise RecorderError(
            f"mask must be a tensor (e.g. the attention mask), got {type(mask).__name__}"
        )
    return mask.detach().bool()


def _pads(pad: Any) -> tuple[int | float, ...]:
    """`pad` as a tuple of numbers: one value, or a list, tuple, set or tensor of them."""
    if pad is None:
        return ()
    if isinstance(pad, torch.Tensor):
        pad = pad.tolist()
    values = tuple(pad) if isinstance(pad, list | tuple | set) else (pad,)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecorderError(
                f"pad must be a number or a tuple of numbers such as (0, -100), got {pad!r}"[:200]
            )
    return values


def host_fingerprint(tensor: torch.Tensor) -> int | torch.Tensor:
    """A fingerprint now: an int on the CPU (numpy reads memory ~10x faster than torch's int64
    sum on one thread), a 0-d int64 tensor on other devices (no host sync)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        return fingerprint(tensor)
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return bitsum(tensor.contiguous().numpy())


def sample_count(batch: Any) -> int:
    """Rows in a micro-batch: the leading size of its first tensor (0 if it has none)."""
    tensors = _tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 0


def model_facts(
    model: torch.nn.Module,
    wrapper: Any = None,
    outside: dict[str, int] | None = None,
    accum_steps: int = 1,
) -> dict[str, Any]:
    """Layers that make a sample's result depend on its batch or on a random generator
    (BatchNorm, dropout, embeddings whose gradient is divided by each index's count in the
    batch); the comm hooks registered on `wrapper` (DistributedDataParallel) when there are
    any; what the optimizer steps outside the model (`outside`, never recorded: the judge says
    so). A Recorder of `accum_steps` > 1 over BatchNorm in training mode warns, as the commands
    do before training (the judge names it `batchnorm` after)."""
    batchnorm, dropout, by_frequency = [], [], []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            batchnorm.append(name)
        elif _drops(module):
            dropout.append(name)
        elif getattr(module, "scale_grad_by_freq", False) is True:
            by_frequency.append(name)  # Embedding, EmbeddingBag: divided by counts in the batch
    facts = {"batchnorm": batchnorm, "dropout": dropout, "training": model.training}
    if accum_steps > 1 and model.training and batchnorm:
        from .preflight import warnings_for

        warnings.warn(warnings_for({"batchnorm": batchnorm})[0], UserWarning, stacklevel=3)
    if by_frequency:
        facts["grad_by_frequency"] = by_frequency
    hooks = comm_hooks(wrapper)
    if hooks:
        facts["comm_hooks"] = hooks
    facts = with_grad_hooks(facts, model)
    if outside:
        facts["optimizer_outside_model"] = outside
    return facts


def comm_hooks(wrapper: Any) -> list[str]:
    """The names of the comm hooks registered on a DistributedDataParallel wrapper (its
    `register_comm_hook` list; a partial by its function's name), in registration order."""
    wrapper = data_parallel(wrapper)  # inside torch.compile's or Fabric's wrapper too
    hooks = getattr(wrapper, "_comm_hooks", None)
    if wrapper is None or not hooks:
        return []
    names = []
    for hook, _state in hooks:
        function = getattr(hook, "func", hook)
        names.append(str(getattr(function, "__qualname__", type(function).__name__)))
    return names


def with_grad_hooks(facts: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """`facts` with `grad_hooks`: the parameters that carry a hook on their gradient
    (`register_hook`, `register_post_accumulate_grad_hook`), now or as `facts` found before (a
    hook registered after the Recorder opened counts too). Each runs at every backward, on a
    micro-batch's gradient in a merged run: one that is not linear in it (a clamp, a clip, a
    normalization, noise) changes the window's sum."""
    before = set(facts.get("grad_hooks", ()))
    names = [
        name
        for name, param in model.named_parameters()
        if name in before
        or param._backward_hooks
        or getattr(param, "_post_accumulate_grad_hooks", None)
    ]
    return {**facts, "grad_hooks": names} if names else facts


def _drops(module: torch.nn.Module) -> bool:
    if isinstance(module, torch.nn.modules.dropout._DropoutNd):
        return module.p > 0
    return isinstance(module, torch.nn.MultiheadAttention) and module.dropout > 0


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def named_tensors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, str, tuple[int, ...]]]:
    """Parameters, then buffers (BatchNorm statistics and counters), in model order. A lazy
    module's parameter not yet shaped (`nn.LazyLinear` before its first forward) is refused:
    the Recorder snapshots the weights training starts from."""
    named: dict[str, tuple[torch.Tensor, str, tuple[int, ...]]] = {}
    for name, param in model.named_parameters():
        named[name] = (_shaped(name, param), "param", tuple(param.shape))
    for name, buffer in model.named_buffers():
        named[name] = (_shaped(name, buffer), "buffer", tuple(buffer.shape))
    return named


def _shaped(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if torch.nn.parameter.is_lazy(tensor):
        raise RecorderError(
            f"{name} belongs to a lazy module not yet initialized (its shape comes with the "
            "first forward): run one forward (model(example)) before creating the Recorder, or "
            "give the layer its input size"
        )
    return tensor


def working_torch_dtype(
    named: dict[str, tuple[torch.Tensor, str, tuple[int, ...]]],
) -> torch.dtype | None:
    """The run's working precision (runs/model.py `working_dtype`) as a torch dtype."""
    params = [(dtype_name(t), t.numel()) for t, kind, _ in named.values() if kind == "param"]
    found = working_dtype(params)
    return getattr(torch, found) if found else None


# what the run format stores (runs/tensors.py); bfloat16 is widened to float32 exactly
_STORABLE = {
    *(torch.float64, torch.float32, torch.float16, torch.bfloat16),
    *(torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool),
}


def refuse_unstorable(named: dict[str, tuple[torch.Tensor, str, tuple[int, ...]]]) -> None:
    """A RecorderError, before anything is recorded, for a tensor the run format cannot hold
    (complex, float8): its weights and gradients could be neither stored nor judged."""
    for name, (tensor, kind, _) in named.items():
        if tensor.dtype not in _STORABLE:
            hint = (
                "; keep it as a real parameter of shape (..., 2) and view it as complex in "
                "forward (torch.view_as_complex)"
                if tensor.is_complex()
                else ""
            )
            raise RecorderError(
                f"{'parameter' if kind == 'param' else 'buffer'} {name} is "
                f"{dtype_name(tensor)}: a run holds real tensors only (float64, float32, "
                f"float16, bfloat16, integers, bool){hint}"
            )


def device_scalar(value: torch.Tensor | float, what: str = "the value") -> torch.Tensor:
    """A number (a loss, a norm) as a float64 0-d tensor on its device: no host sync per step.
    Anything else (a batch passed where the loss goes) is a RecorderError naming `what`."""
    if isinstance(value, torch.Tensor):
        value = whole(value)  # a norm over sharded gradients comes as a DTensor
        if value.numel() != 1:
            raise RecorderError(
                f"{what} must be one number; got a tensor of shape {tuple(value.shape)}"
            )
        if value.is_complex() or value.dtype == torch.bool:
            raise RecorderError(f"{what} must be one real number; got a {value.dtype} tensor")
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, str | bytes | bool):
        raise RecorderError(f"{what} must be one number; got {type(value).__name__}")
    try:
        return torch.tensor(float(value), dtype=torch.float64)
    except (TypeError, ValueError):
        raise RecorderError(f"{what} must be one number; got {type(value).__name__}") from None


def micro_mean(
    loss: torch.Tensor | float | None,
    loss_sum: torch.Tensor | float | None,
    items: float | None,
) -> torch.Tensor:
    """A micro-batch's mean loss, from `micro()`'s arguments: `loss` itself, or `loss_sum` over
    `items`, the item count `checks.count_of_items` has read (a micro-batch of padding alone
    holds no items: its mean is 0, weighted by 0)."""
    if (loss is None) == (loss_sum is None):
        raise RecorderError("give micro() either loss (a mean) or loss_sum with items")
    if loss_sum is None:
        return device_scalar(loss, "micro(loss)")  # type: ignore[arg-type]
    if items is None:
        raise RecorderError("micro(loss_sum=...) needs items, the item count (>= 0)")
    total = device_scalar(loss_sum, "micro(loss_sum=...)")
    return total / items if items else device_scalar(0.0)


def optimizer_state_step(optimizer: Any) -> int:
    """The optimizer's own step counter (Adam's `state["step"]`): the largest over its
    parameters (one it began to step late, unfrozen mid-run, counts fewer, wherever the
    optimizer lists it), or -1 if it keeps none. One host read per device."""
    steps = [s.get("step") for s in optimizer.state.values() if isinstance(s, dict)]
    numbers = [float(s) for s in steps if s is not None and not torch.is_tensor(s)]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for s in steps:
        if torch.is_tensor(s):
            by_device.setdefault(s.device, []).append(s.detach().reshape(()).float())
    numbers += [float(torch.stack(t).max()) for t in by_device.values()]
    return int(max(numbers)) if numbers else -1
