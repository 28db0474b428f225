"""Tiny models and generated token data for the framework examples: nothing is downloaded.

Sequences of 4 to 24 tokens (or all 24, `padded=False`) over a vocabulary of 64, padded per
batch to its longest sequence, as a tokenizer's collator pads them: a batch of B and its K
micro-batches are padded to different lengths and hold different numbers of real tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, PAD_ID, MAX_LENGTH = 64, 0, 24


def processes() -> int:
    """How many processes train together: torchrun's WORLD_SIZE, else 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def token_rows(samples: int, *, padded: bool = True, seed: int = 0) -> list[dict[str, list[int]]]:
    """`samples` token sequences, each `{"input_ids": [...]}` as a tokenized dataset holds them."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(samples):
        length = int(torch.randint(4, MAX_LENGTH + 1, (1,), generator=g)) if padded else MAX_LENGTH
        rows.append({"input_ids": torch.randint(1, VOCAB, (length,), generator=g).tolist()})
    return rows


def collate(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Pad to the longest row: `input_ids`, `attention_mask`, and `labels` (-100 on padding)."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row["input_ids"])] = torch.tensor(row["input_ids"])
        mask[i, : len(row["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def collate_pairs(rows: list[dict[str, list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, next-token targets) of each row, padded with 0 and -100: what a plain torch LM
    reads. Each row is shifted before padding, so a row reads alike in any batch."""
    shifted = [{"input_ids": r["input_ids"][:-1], "targets": r["input_ids"][1:]} for r in rows]
    batch = collate([{"input_ids": r["input_ids"]} for r in shifted])
    targets = collate([{"input_ids": r["targets"]} for r in shifted])["labels"]
    return batch["input_ids"], targets


def tiny_gpt2(dtype: torch.dtype = torch.float32) -> Any:
    """A one-layer GPT-2 built from a config, seeded, without dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=MAX_LENGTH,
        n_embd=32,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=PAD_ID,
    )
    return GPT2LMHeadModel(config).to(dtype)


def tiny_llama(dtype: torch.dtype = torch.float32) -> Any:
    """A one-layer Llama built from a config, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LENGTH,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        pad_token_id=PAD_ID,
    )
    return LlamaForCausalLM(config).to(dtype)


class TinyGRULM(nn.Module):
    """Embedding, one GRU layer and a linear head: a causal LM whose real tokens never see the
    padding after them."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, width)
        self.gru = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.gru(self.embed(tokens))
        return self.head(hidden)


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed cross entropy over the real targets, and how many there are."""
    total = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return total, int((targets != -100).sum())


def record_all(
    root: Path,
    train: Callable[..., Path],
    merged: str,
    *,
    data: dict[str, Any],
    reference: dict[str, Any],
    changes: dict[str, Any],
    k: int = 4,
) -> dict[str, Path]:
    """The baseline (K=1, naming its float64 reference), that reference (trained with `data`
    updated by `reference`, e.g. float64), once each, and the merged run `merged` (K, with
    `changes`)."""
    runs = {"k1": root / "k1", "k1-fp64": root / "k1-fp64"}
    if not runs["k1"].exists():
        train(runs["k1"], 1, reference="../k1-fp64", **data)
    if not runs["k1-fp64"].exists():
        train(runs["k1-fp64"], 1, **{**data, **reference})
    runs[merged] = train(root / merged, k, **data, **changes)
    return runs
