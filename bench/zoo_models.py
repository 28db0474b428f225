"""The model zoo's families (bench/model_zoo.py): small token models of a GPT, a Transformer
encoder, a GRU, a convolutional text model, a LayerNorm MLP, and outside the default grid a
mixture of experts (with or without a load-balancing loss), a residual CNN, an LSTM and the
transformers models of bench/zoo_hf.py; `build` makes one by name, `width` times as wide."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from torch import nn

try:
    from zoo_hf import HF_MODELS
except ImportError:  # run as a module of the repository (tests): bench.zoo_hf
    from bench.zoo_hf import HF_MODELS

VOCAB, SEQ, CLASSES = 32, 12, 6


class TinyGPT(nn.Module):
    def __init__(self, d: int = 24, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(SEQ, d) * 0.02)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "attn": nn.MultiheadAttention(d, heads, batch_first=True),
                    "ln2": nn.LayerNorm(d),
                    "mlp": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                }
            )
            for _ in range(layers)
        )
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos[: x.shape[1]]
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), 1)
        for b in self.blocks:
            a = b["ln1"](h)
            h = h + b["attn"](a, a, a, attn_mask=mask, need_weights=False)[0]
            h = h + b["mlp"](b["ln2"](h))
        return self.head(self.lnf(h))


class Encoder(nn.Module):
    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.emb(x)).mean(1))


class Recurrent(nn.Module):
    def __init__(self, d: int = 20) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(x))[0][:, -1])


class ConvText(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.conv = nn.Conv1d(d, 2 * d, 3, padding=1)
        self.out = nn.Linear(2 * d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.conv(self.emb(x).transpose(1, 2))).amax(2))


class NormedMLP(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(SEQ, d), nn.LayerNorm(d), nn.SiLU(), nn.Linear(d, d), nn.LayerNorm(d),
            nn.SiLU(), nn.Linear(d, CLASSES),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(self.net[0].weight.dtype) / VOCAB)


class MixtureText(nn.Module):
    """A mixture of experts: each position is routed to the top 2 of 4 GELU experts by a
    softmax router, weighted by its gates, then averaged. `balance`: the weight of a
    Switch-style load-balancing loss, E·Σ_e f_e·P_e over the positions of the batch each
    forward sees (f_e its share routed to expert e, P_e the mean router probability), which
    the loop adds to the loss (`extra_loss`); 0: none."""

    def __init__(self, d: int = 24, experts: int = 4, balance: float = 0.0) -> None:
        super().__init__()
        self.balance = balance
        self.extra_loss: torch.Tensor | float = 0.0
        self.emb = nn.Embedding(VOCAB, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            for _ in range(experts)
        )
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        probs = self.router(h).softmax(-1)
        gates, chosen = probs.topk(2, dim=-1)
        routed = torch.zeros(*h.shape[:-1], len(self.experts), dtype=gates.dtype, device=h.device)
        routed = routed.scatter(-1, chosen, gates)
        if self.balance:
            share = (routed > 0).to(h.dtype).mean((0, 1))
            self.extra_loss = self.balance * len(self.experts) * (share * probs.mean((0, 1))).sum()
        mixed = sum(routed[..., e : e + 1] * expert(h) for e, expert in enumerate(self.experts))
        return self.out((h + mixed).mean(1))


class ResNetGrid(nn.Module):
    """A small residual CNN: the 12 tokens' embeddings laid out as a 3x4 image of d channels,
    two residual blocks of 3x3 convolutions with GroupNorm and ReLU, global average pooling."""

    def __init__(self, d: int = 16, blocks: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(nn.Sequential(*self._block(d)) for _ in range(blocks))
        self.out = nn.Linear(d, CLASSES)

    @staticmethod
    def _block(d: int) -> list[nn.Module]:
        conv = [nn.Conv2d(d, d, 3, padding=1, bias=False) for _ in range(2)]
        return [conv[0], nn.GroupNorm(4, d), nn.ReLU(), conv[1], nn.GroupNorm(4, d)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x).transpose(1, 2).reshape(x.shape[0], -1, 3, SEQ // 3)
        for block in self.blocks:
            h = torch.relu(h + block(h))
        return self.out(h.mean((2, 3)))


class LSTMText(nn.Module):
    """Two stacked LSTM layers over the embeddings, the last step's state classified."""

    def __init__(self, d: int = 20) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.out = nn.Linear(d, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(x))[0][:, -1])


MODELS: dict[str, Callable[[], nn.Module]] = {
    "gpt": TinyGPT, "encoder": Encoder, "gru": Recurrent, "convtext": ConvText, "lnmlp": NormedMLP,
}  # fmt: skip
# Models outside the default grid (`--models` picks any of both), so the runs docs/NOISE.md
# names keep their draws.
MORE_MODELS: dict[str, Callable[[], nn.Module]] = {
    "moe": MixtureText,
    "moe-balance": functools.partial(MixtureText, balance=0.01),
    "resnet": ResNetGrid,
    "lstm": LSTMText,
    **HF_MODELS,  # transformers models built from configs (bench/zoo_hf.py)
}
# Models whose accumulation is not the large batch's training, and the code that must name it:
# the load-balancing loss is computed over each forward's batch, B/K positions in the merged run.
NOT_EQUIVALENT = {"moe-balance": "cross-sample-loss"}


def build(model: str, width: int = 1) -> nn.Module:
    """The family's model, its width `d` (and the widths that follow it) `width` times its
    default."""
    make = {**MODELS, **MORE_MODELS}[model]
    if width == 1:
        return make()
    return make(d=width * inspect.signature(make).parameters["d"].default)
