"""`tiny-lm`: a small causal transformer on variable-length, padded token sequences.

Micro-batches carry different numbers of real tokens, which is what makes the loss normalization
of gradient accumulation matter. Its dropout is batch-invariant: each mask is a hash of the
sample's own tokens, the layer and the element, so a sample gets the same mask whether it sits in
a batch of B or in a micro-batch of B/K (and in a float64 rerun).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 64
CONTEXT = 32
MIN_LENGTH = 4
IGNORE_INDEX = -100
_MASK_BITS = 24


def token_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences from a fixed random Markov chain, each of a random length in [4, 32].

    Returns inputs [samples, 32] (padded with token 0) and next-token targets, IGNORE_INDEX past
    each sequence's end.
    """
    rng = np.random.default_rng(seed)
    transition = rng.dirichlet(np.full(VOCAB, 0.1), size=VOCAB)
    cumulative = np.cumsum(transition, axis=1)
    lengths = rng.integers(MIN_LENGTH, CONTEXT + 1, size=samples)
    tokens = np.zeros((samples, CONTEXT + 1), dtype=np.int64)
    tokens[:, 0] = rng.integers(1, VOCAB, size=samples)
    draws = rng.random((samples, CONTEXT))
    for t in range(CONTEXT):
        nxt = (draws[:, t, None] > cumulative[tokens[:, t]]).sum(axis=1)
        tokens[:, t + 1] = np.minimum(nxt, VOCAB - 1)
    inputs = tokens[:, :-1].copy()
    targets = tokens[:, 1:].copy()
    positions = np.arange(CONTEXT)
    inputs[positions[None, :] >= lengths[:, None]] = 0
    targets[positions[None, :] >= lengths[:, None]] = IGNORE_INDEX
    return inputs, targets


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A 64-bit integer mixer (splitmix-style, wrapping multiplication)."""
    h = h ^ (h >> 31)
    h = h * 0x5DEECE66D
    h = h ^ (h >> 29)
    h = h * 0x2545F491
    return h ^ (h >> 32)


class BatchInvariantDropout(nn.Module):
    """Dropout whose mask depends on (sample key, layer, element), not on a generator's state."""

    def __init__(self, p: float, layer: int) -> None:
        super().__init__()
        self.p, self.layer = p, layer

    def forward(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        elements = torch.arange(x[0].numel(), device=x.device).view(x.shape[1:])
        h = _mix(keys.view(-1, *[1] * (x.dim() - 1)) * 1_000_003 + self.layer * 7919 + elements)
        uniform = (h & ((1 << _MASK_BITS) - 1)).to(x.dtype) / (1 << _MASK_BITS)
        return x * (uniform >= self.p).to(x.dtype) / (1 - self.p)


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and MLP, each followed by dropout on the residual."""

    def __init__(self, width: int, heads: int, dropout: float, index: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.drop1 = BatchInvariantDropout(dropout, 2 * index)
        self.drop2 = BatchInvariantDropout(dropout, 2 * index + 1)

    def forward(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attention = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        mixed = (attention @ v).transpose(1, 2).reshape(b, t, w)
        x = x + self.drop1(self.proj(mixed), keys)
        return x + self.drop2(self.mlp(self.norm2(x)), keys)


class TinyLM(nn.Module):
    """Token and position embeddings, `layers` blocks, a final LayerNorm and a linear head."""

    def __init__(self, width: int, layers: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(CONTEXT, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, i) for i in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)
        weights = np.random.default_rng(12345).integers(1, 1 << 20, size=CONTEXT)
        self.register_buffer("key_weights", torch.from_numpy(weights), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        keys = (tokens * self.key_weights).sum(dim=1)  # one key per sample, from its tokens
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x, keys)
        return self.head(self.norm(x))


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross entropy over the real tokens, and how many real tokens there are."""
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total, int((targets != IGNORE_INDEX).sum())
