"""`micro(batch=...)` takes the batch as a collate function makes it: tensors in tuples, lists,
mappings and dataclasses, nested, with strings, numbers and None beside them (a text field, a
count), which the digest leaves out (a dict holding a list of strings, a dataclass, and a
mapping that is no dict, as a tokenizer's BatchEncoding, were refused). A batch with no tensor
in it is refused: its digest would check nothing."""

from __future__ import annotations

import dataclasses
from collections import UserDict, namedtuple

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.record.facts import RecorderError, data_digest
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier


@dataclasses.dataclass
class Graph:
    nodes: torch.Tensor
    labels: torch.Tensor
    name: str = "graph"


Pair = namedtuple("Pair", "x y")
X = torch.arange(24, dtype=torch.float32).reshape(6, 4)
Y = torch.arange(6)


@pytest.mark.parametrize(
    "batch",
    [
        {"input_ids": X, "text": ["a sample"] * 6, "labels": Y, "count": 6, "extra": None},
        Graph(X, Y),
        Pair(X, Y),
        [X, {"labels": Y, "ids": ["a", "b", "c", "d", "e", "f"]}],
        UserDict({"input_ids": X, "labels": Y}),  # as transformers' BatchEncoding, no dict
    ],
    ids=["dict-with-strings", "dataclass", "namedtuple", "nested", "mapping"],
)
def test_a_collated_batch_digests_as_its_tensors(batch):
    assert data_digest(batch) == data_digest((X, Y))


def test_the_left_out_leaves_do_not_move_the_digest():
    assert data_digest({"x": X, "text": ["a"] * 6}) == data_digest({"x": X, "text": ["b"] * 6})
    assert data_digest({"x": X}) != data_digest({"x": X + 1})


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (["a", "b"], "holds no tensor"),
        ({"text": ["a"], "count": 1}, "holds no tensor"),
        (object(), "got object"),
        ({"x": X, "other": object()}, "got object"),
    ],
)
def test_a_batch_without_tensors_or_of_an_unknown_kind_is_refused(batch, message):
    with pytest.raises(RecorderError, match=message):
        data_digest(batch)


def test_runs_recorded_with_dict_batches_of_strings_are_judged(tmp_path):
    """The samples check runs on the tensors: the same rows pass, other rows fail it."""

    def loop(out, k: int, shift: int = 0) -> None:
        model, x, y = classifier(64)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
            for u in range(2):
                for j in range(k):
                    rows = slice(u * 32 + j * (32 // k), u * 32 + (j + 1) * (32 // k))
                    loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                    (loss / k).backward()
                    read = slice(rows.start + shift, rows.stop + shift)  # the rows told
                    text = [f"row {i}" for i in range(read.start, read.stop)]
                    rec.micro(loss.detach(), batch={"x": x[read], "y": y[read], "text": text})
                opt.step()
                opt.zero_grad()
                rec.update()

    loop(tmp_path / "base", 1)
    loop(tmp_path / "merged", 4)
    loop(tmp_path / "shifted", 4, shift=1)
    base = read_run_dir(tmp_path / "base")
    assert compare(base, read_run_dir(tmp_path / "merged")).verdict == "pass"
    checks = {c.name: c.status for c in compare(base, read_run_dir(tmp_path / "shifted")).checks}
    assert checks["same samples per update"] == "fail"
