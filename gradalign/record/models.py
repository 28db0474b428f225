"""Built-in models and their deterministic built-in data (generated, never downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import TrainConfig
from . import entrypoints, tinylm

FEATURES = 784
IMAGE = (1, 28, 28)  # the CNNs read the same 784 features as a 28x28 image
CLASSES = 10


@dataclass
class Batches:
    """A fixed sequence of samples; micro-batch m of size b is rows m*b .. m*b+b-1, in order."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def micro_batch(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slice(index * size, (index + 1) * size)
        return self.inputs[rows], self.targets[rows]


LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed cross entropy over the batch's samples, and the number of samples."""
    return F.cross_entropy(logits, targets, reduction="sum"), int(targets.shape[0])


def build_loss(config: TrainConfig, model: nn.Module) -> LossFn:
    """(summed loss, item count) for a batch: the user's `loss`, else the model's own."""
    if entrypoints.is_entry_point(config.loss):
        return entrypoints.loss_function(config.loss)
    if config.model == "tiny-lm":
        return tinylm.token_loss_sum
    if isinstance(model, Mixture):
        return model.loss
    return classification_loss


def classification_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-sized synthetic classes: a fixed centre per class plus Gaussian noise (PCG64)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    targets = rng.integers(0, CLASSES, size=samples)
    noise = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    inputs = 0.3 * centres[targets] + noise
    return inputs.astype(np.float32), targets.astype(np.int64)


class HostDrawnDropout(nn.Dropout):
    """nn.Dropout whose mask is drawn by the CPU generator in float32, wherever the model runs.

    On the CPU this is nn.Dropout bit for bit. On CUDA, nn.Dropout's masks depend on the dtype
    and on how the batch is split into kernel calls, so neither a float64 reference nor a merged
    run could draw the baseline's masks; drawn on the host, every run of the built-in model sees
    the same masks, and a reseeded generator (the dropout-reseed fault) still changes them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.empty(x.shape, dtype=torch.float32).bernoulli_(1 - self.p)
        noise = keep.to(device=x.device, dtype=x.dtype)
        return x * noise.div_(1 - self.p)


def _mlp(config: TrainConfig, dropout: float) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(FEATURES, config.hidden), nn.ReLU()]
    if dropout > 0:
        layers.append(HostDrawnDropout(dropout))
    layers.append(nn.Linear(config.hidden, CLASSES))
    return nn.Sequential(*layers)


class Mixture(nn.Module):
    """A dense mixture of experts: a shared 784-`hidden` ReLU layer, then every sample's logits
    are its experts' heads weighted by a softmax router. Training adds a load-balancing loss
    over the batch each forward sees, `balance`·E·Σ_e P_e², P_e the batch's mean gate of expert
    e (1 when the experts share the batch evenly): a loss over the batch as a whole, which a
    micro-batch of B/K computes over its own rows (the same holds for a switch transformer's
    f·P loss)."""

    def __init__(self, hidden: int, experts: int = 4, balance: float = 0.1) -> None:
        super().__init__()
        self.balance = balance
        self.shared = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU())
        self.router = nn.Linear(hidden, experts)
        self.heads = nn.Linear(hidden, experts * CLASSES)
        self.gates: torch.Tensor | None = None  # the last forward's, for its loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(x)
        self.gates = self.router(h).softmax(-1)
        heads = self.heads(h).unflatten(-1, (self.gates.shape[-1], CLASSES))
        return (self.gates.unsqueeze(-1) * heads).sum(-2)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Summed cross entropy plus, per sample, the batch's load-balancing loss."""
        loss_sum, items = classification_loss(logits, targets)
        if self.balance and self.gates is not None:
            mean_gate = self.gates.mean(0)
            loss_sum = loss_sum + items * self.balance * len(mean_gate) * mean_gate.square().sum()
        return loss_sum, items


def _cnn(config: TrainConfig, norm: str) -> nn.Module:
    """Two strided 3x3 convolutions, each followed by BatchNorm or GroupNorm, then a linear head."""

    def normalize(channels: int) -> nn.Module:
        return nn.BatchNorm2d(channels) if norm == "bn" else nn.GroupNorm(4, channels)

    width = 8 * max(2, config.hidden // 64)  # 32 channels at the default hidden=256
    return nn.Sequential(
        nn.Unflatten(1, IMAGE),
        nn.Conv2d(1, width // 2, 3, stride=2, padding=1),
        normalize(width // 2),
        nn.ReLU(),
        nn.Conv2d(width // 2, width, 3, stride=2, padding=1),
        normalize(width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, CLASSES),
    )


def build_model(config: TrainConfig) -> nn.Module:
    """The model named by `config.model`, initialised from `config.seed` on the CPU."""
    torch.manual_seed(config.seed)
    if entrypoints.is_entry_point(config.model):
        return entrypoints.build_model(config.model)
    if config.model == "mlp":
        return _mlp(config, 0.0)
    if config.model == "mlp-dropout":
        return _mlp(config, config.dropout)
    if config.model == "mlp-moe":
        return Mixture(config.hidden)
    if config.model == "tiny-lm":
        return tinylm.TinyLM(max(16, config.hidden // 4), 2, 4, config.dropout)
    return _cnn(config, "bn" if config.model == "cnn-bn" else "gn")


def build_data(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> Batches:
    """Exactly the samples the run consumes: `updates` batches of `batch_size` rows."""
    seed = config.seed if config.samples_seed is None else config.samples_seed
    samples = config.batch_size * config.updates
    if entrypoints.is_entry_point(config.data):
        inputs, targets = entrypoints.build_data(config.data, samples, seed)
        if inputs.is_floating_point():
            inputs = inputs.to(dtype)
        return Batches(inputs.to(device), targets.to(device))
    if config.model == "tiny-lm":
        tokens, next_tokens = tinylm.token_data(samples, seed)
        return Batches(
            torch.from_numpy(tokens).to(device), torch.from_numpy(next_tokens).to(device)
        )
    inputs, targets = classification_data(samples, seed)
    return Batches(
        torch.from_numpy(inputs).to(device=device, dtype=dtype),
        torch.from_numpy(targets).to(device),
    )
