"""A buffer holding -inf (an attention mask, `register_buffer("mask", triu(full(-inf), 1))`)
is the same in every run: every comparison of such a model failed on it ("infx the noise
floor"), with and without a reference, where no weight differed. In sketch mode a mask wider than
the sketch is summarized with its infinities held apart (runs/sketches.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import gradalign
from gradalign import api
from tests.devices import on_cuda

T, V, D = 8, 16, 16
WIDE = 40  # a 40x40 mask: 1600 elements, sketched at the Recorder's width of 1021


class MaskedLM(nn.Module):
    def __init__(self, t: int = T) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e, self.o = nn.Embedding(V, D), nn.Linear(D, V)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.register_buffer("mask", torch.triu(torch.full((t, t), float("-inf")), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.e(x)
        scores = self.q(h) @ self.k(h).transpose(1, 2) / D**0.5 + self.mask
        return self.o(scores.softmax(-1) @ self.v(h))


def record(
    out,
    k: int,
    dtype=torch.float32,
    reference=None,
    bug=False,
    mode="full",
    t=T,
    edit=None,
    device="cpu",
):
    """A run of MaskedLM(t); `edit(model, update)` is called after each update's step."""
    model = MaskedLM(t).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, V, (48, t + 1), generator=torch.Generator().manual_seed(1))
    data = data.to(device)
    batch, rows = 16, 16 // k
    with gradalign.Recorder(out, model, opt, k, reference=reference, record=mode) as rec:
        for update in range(3):
            for i in range(k):
                x = data[update * batch + i * rows : update * batch + (i + 1) * rows]
                logits = model(x[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))
                (loss if bug else loss / k).backward()
                rec.micro(loss, batch=x)
            opt.step()
            if edit is not None:
                edit(model, update)
            rec.update()
            opt.zero_grad()
    return out


@pytest.mark.parametrize(
    ("mode", "t", "device"),
    [
        ("full", T, "cpu"),
        ("sketch", T, "cpu"),
        ("sketch", WIDE, "cpu"),
        on_cuda("sketch", WIDE, "cuda"),
    ],
)
def test_a_mask_buffer_of_minus_inf_passes_and_a_bug_beside_it_is_named(tmp_path, mode, t, device):
    at = {"mode": mode, "t": t, "device": device}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf in a sketch's bucket warned while recording
        record(tmp_path / "k1-fp64", 1, torch.float64, **at)
        base = record(tmp_path / "k1", 1, reference="../k1-fp64", **at)
        merged = record(tmp_path / "k4", 4, **at)
    for reference in (None, "none"):
        clean = api.compare(base, merged, reference=reference)
        assert clean.verdict == "pass", [c for c in clean.checks if c.status == "fail"]
    broken = api.compare(base, record(tmp_path / "k4-bug", 4, bug=True, **at))
    assert broken.verdict == "fail" and broken.diagnosis[0].code == "loss-scale"


def _masked(model: MaskedLM) -> torch.Tensor:
    return model.mask


@pytest.mark.parametrize(
    "edit",
    [
        lambda mask: mask.fill_(float("-inf")),  # infinities training made
        lambda mask: mask.copy_(mask.T.clone()),  # the same count, other places
        lambda mask: mask.neg_(),  # the same places, +inf instead of -inf
        lambda mask: mask.nan_to_num_(neginf=-1e4),  # lost
    ],
    ids=["more", "moved", "sign", "lost"],
)
def test_infinities_that_changed_in_a_sketched_tensor_fail_it(tmp_path, edit):
    """Held apart from the sketch, infinities still count: any change to them fails the tensor,
    against the reference and without one."""

    def change(model: MaskedLM, update: int) -> None:
        if update == 1:
            edit(_masked(model))

    record(tmp_path / "k1-fp64", 1, torch.float64, mode="sketch", t=WIDE)
    base = record(tmp_path / "k1", 1, reference="../k1-fp64", mode="sketch", t=WIDE)
    merged = record(tmp_path / "k4", 4, mode="sketch", t=WIDE, edit=change)
    for reference in (None, "none"):
        found = api.compare(base, merged, reference=reference)
        failed = {(r.update, d.name) for r in found.results for d in r.weights if not d.ok}
        assert found.verdict == "fail" and (1, "mask") in failed, failed
        assert (0, "mask") not in failed


def test_a_full_run_with_the_mask_is_judged_against_a_sketched_one(tmp_path):
    """A full run's tensors are sketched by the judge with the same rule."""
    record(tmp_path / "k1-fp64", 1, torch.float64, mode="sketch", t=WIDE)
    base = record(tmp_path / "k1", 1, reference="../k1-fp64", mode="sketch", t=WIDE)
    full = record(tmp_path / "k4", 4, mode="full", t=WIDE)
    assert api.compare(base, full).verdict == "pass"
    assert int(torch.isinf(MaskedLM(WIDE).mask).sum()) == WIDE * (WIDE - 1) // 2  # sketched
