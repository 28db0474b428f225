"""Padding in the Recorder's view of a batch: a sample's digest whatever the padding around it,
and a micro-batch of padding alone recorded (its mean over no item is NaN, weighing nothing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradalign
from gradalign.record.facts import data_digest
from gradalign.runs.reader import read_run_dir


def test_padding_never_changes_a_sample_digest():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 50, (4, 9), generator=g)
    lengths = torch.tensor([9, 4, 6, 2])
    mask = torch.arange(9).view(1, -1) < lengths.view(-1, 1)
    labels = tokens.masked_fill(~mask, -100)
    whole = data_digest({"input_ids": tokens * mask, "labels": labels}, mask=mask)
    halves = 0
    for rows in (slice(0, 2), slice(2, 4)):
        width = int(lengths[rows].max())  # dynamic padding: each micro-batch to its own length
        part = {"input_ids": (tokens * mask)[rows, :width], "labels": labels[rows, :width]}
        halves += data_digest(part, mask=mask[rows, :width])
    assert halves == whole
    by_pad = data_digest({"input_ids": tokens * mask, "labels": labels}, pad=(0, -100))
    assert by_pad == sum(
        data_digest({"input_ids": (tokens * mask)[r], "labels": labels[r]}, pad=(0, -100))
        for r in (slice(0, 2), slice(2, 4))
    )


def test_a_micro_batch_of_padding_alone_is_recorded(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradalign.Recorder(tmp_path / "r", model, opt, accum_steps=2) as rec:
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()
        rec.micro(loss_sum=loss, items=2)
        rec.micro(loss_sum=torch.tensor(0.0), items=0)  # every label was padding
        opt.step()
        rec.update()
    run = read_run_dir(tmp_path / "r")
    assert list(run.micro_items) == [2.0, 0.0]
    assert run.window_losses()[0] == pytest.approx(float(loss.detach()) / 2)
