"""TF32 emulated on the CPU (`bench/model_zoo.py --emulate-tf32`, tests/test_tf32.py): on an
Ampere or later GPU, cuDNN computes a float32 convolution from its input, weight and (backward)
incoming gradient rounded to TF32's 10 mantissa bits, summing in float32, unless its TF32
setting is off; cuBLAS does the same for matmuls where torch's float32 matmul precision is
"high" or "medium". Rounded here to nearest (the hardware may truncate: either errs by one unit
of the 10th bit), in every convolution, and with `matmuls` in every `torch.nn.functional.linear`
(linear layers and attention's projections; not attention's own products); float64 math (the
reference) is left alone."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def to_tf32(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to 10 mantissa bits (to nearest) where it is float32, else `t`."""
    if t.dtype != torch.float32:
        return t
    return ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


class _Inputs(torch.autograd.Function):
    """The forward's inputs rounded; their gradients passed on as they come."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return to_tf32(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        return g


class _IncomingGradient(torch.autograd.Function):
    """The output as it is; the gradient the backward receives for it rounded."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        return to_tf32(g)


def _rounded_call(plain: Callable, x, weight, *rest):
    """`plain(x, weight, *rest)` from float32 inputs rounded, its incoming gradient rounded."""
    if x.dtype != torch.float32:
        return plain(x, weight, *rest)
    return _IncomingGradient.apply(plain(_Inputs.apply(x), _Inputs.apply(weight), *rest))


def tf32_forward(plain: Callable) -> Callable:
    """A convolution's `_conv_forward` computing float32 as TF32 tensor cores do."""
    return lambda self, x, weight, bias: _rounded_call(partial(plain, self), x, weight, bias)


def tf32_linear(plain: Callable) -> Callable:
    """`torch.nn.functional.linear` computing float32 as TF32 tensor cores do."""
    return lambda x, weight, bias=None: _rounded_call(plain, x, weight, bias)


def emulate_tf32(matmuls: bool = False) -> None:
    """Every convolution in this process (and with `matmuls` every linear map) computes float32
    as TF32 from now on."""
    for kind in CONVOLUTIONS:
        kind._conv_forward = tf32_forward(kind._conv_forward)
    if matmuls:
        nn.functional.linear = tf32_linear(nn.functional.linear)
