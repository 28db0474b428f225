"""Where a GPU may compute float32 math from inputs rounded to TF32 (10 mantissa bits): torch's
TF32 settings per operator, read without tripping over the two ways torch has to set them."""

from __future__ import annotations

import torch

TENSOR_CORES_ROUND_FLOAT32 = (8, 0)  # Ampere on: float32 math may round its inputs (TF32)
CUBLAS = {"tf32": "cublas", "bf16": "cublas-bfloat16"}  # a matmul precision -> environment.tf32


def _first_set(*levels: object) -> str:
    """The first `fp32_precision` set along `levels` (an operator's, its backend's, torch's):
    "none" passes the choice up; "ieee" where none is set."""
    for level in levels:
        value = getattr(level, "fp32_precision", "none")
        if isinstance(value, str) and value != "none":
            return value
    return "ieee"


def fp32_precisions() -> dict[str, str]:
    """ "matmul" (cuBLAS), "conv" and "rnn" (cuDNN) -> "ieee", "tf32" or "bf16". From torch's
    per-operator settings where it has them (2.9 on: there the legacy flags' getters raise once
    a loop mixed the two APIs, `torch.backends.cuda.matmul.fp32_precision = "tf32"` beside the
    default cuDNN flags), else from the legacy flags (allow_tf32, which
    `set_float32_matmul_precision("high")` and "medium" turn on)."""
    b = torch.backends
    if hasattr(b.cuda.matmul, "fp32_precision") and hasattr(b.cudnn, "conv"):
        return {
            "matmul": _first_set(b.cuda.matmul, b),
            "conv": _first_set(b.cudnn.conv, b.cudnn, b),
            "rnn": _first_set(b.cudnn.rnn, b.cudnn, b),
        }
    cudnn = "tf32" if b.cudnn.allow_tf32 else "ieee"
    return {"matmul": "tf32" if b.cuda.matmul.allow_tf32 else "ieee", "conv": cudnn, "rnn": cudnn}


def tf32_uses(model: torch.nn.Module | None, device: torch.device, dtype: torch.dtype) -> list[str]:
    """Where this GPU may compute the model's float32 math from rounded inputs: "cudnn" where
    the model holds layers cuDNN computes (convolutions, RNNs) and their precision is TF32 (its
    default); "cublas" where matmuls may use TF32 (set_float32_matmul_precision("high") or
    "medium"), "cublas-bfloat16" where bfloat16. Empty off CUDA, before Ampere, and for other
    dtypes. A float64 rerun computes none of it: the run computes in "tf32" for the judge."""
    if device.type != "cuda" or dtype != torch.float32 or model is None:
        return []
    if torch.cuda.get_device_capability(device) < TENSOR_CORES_ROUND_FLOAT32:
        return []
    precisions, uses = fp32_precisions(), []
    conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    rnn = any(isinstance(m, torch.nn.RNNBase) for m in model.modules())
    cudnn = (conv and precisions["conv"] != "ieee") or (rnn and precisions["rnn"] != "ieee")
    if torch.backends.cudnn.enabled and cudnn:
        uses.append("cudnn")
    if precisions["matmul"] in CUBLAS:
        uses.append(CUBLAS[precisions["matmul"]])
    return uses
