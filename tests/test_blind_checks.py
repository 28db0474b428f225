"""Checks that pass without being able to see what they check, said in the report: a gradient
check whose absolute floor dwarfs gradients of a loss scaled far down (a merged run whose
gradients are half the baseline's passed it, and the weights judged by those gradients passed
too), and losses a log printed to so few digits that a 1% lr change passed as float32 noise."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradalign import api
from gradalign.report.summary import headline

from .conftest import one_line_error
from .recorded_loop import classifier, train
from .small_logs import write


def _record(out, k: int, tiny: float, scale: float = 1.0) -> None:
    model, x, y = classifier(32 * 6)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-16)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return tiny * nn.functional.cross_entropy(logits, targets)

    train(out, model, opt, x, y, k, batch=32, loss_fn=loss_fn, scale=scale)


def _warned(c) -> bool:
    return any("the gradient check could not see a gradient a quarter off" in n for n in c.notes)


def test_gradients_too_small_for_the_fixed_floor_are_said_blind(tmp_path):
    torch.set_num_threads(1)
    _record(tmp_path / "k1", 1, 1e-8)
    _record(tmp_path / "half", 4, 1e-8, scale=0.5)  # every gradient half the baseline's
    c = api.compare(tmp_path / "k1", tmp_path / "half", reference="none")
    assert _warned(c), c.notes
    _record(tmp_path / "big1", 1, 1.0)
    _record(tmp_path / "big4", 4, 1.0)
    c = api.compare(tmp_path / "big1", tmp_path / "big4", reference="none")
    assert c.verdict == "pass" and not _warned(c), c.notes


def test_losses_printed_to_few_digits_are_said_judged_to_them(tmp_path):
    losses = [2.0 - 0.01 * i + 0.003 * (-1) ** i for i in range(12)]

    def log(name: str, spec: str, shift: float = 0.0) -> object:
        text = "".join(f"step {i} loss {format(v + shift, spec)}\n" for i, v in enumerate(losses))
        return write(tmp_path, text, f"{name}.log")

    coarse = api.compare(log("b2", ".2f"), log("m2", ".2f", 0.004), accum_steps=1)
    assert coarse.verdict == "pass"
    said = [n for n in coarse.notes if n.startswith("the logs print their losses coarsely")]
    assert said and "differ by up to about 0.02 by their printed digits" in said[0], coarse.notes
    fine = api.compare(log("b8", ".8f"), log("m8", ".8f"), accum_steps=1)
    assert not any("coarsely" in n for n in fine.notes), fine.notes


def _widened(allowed_shares: list[float]) -> list:
    """Results of one gradient of norm 1 judged against a reference, allowed these shares of
    itself at updates 0, 1, ..."""
    from gradalign.judge.metrics import TensorDiff
    from gradalign.judge.results import UpdateResult

    def grad(share: float) -> TensorDiff:
        return TensorDiff("w", 0.0, 0.0, 0.01, 1.0, 0.01, share, noise=share / 4, norm=1.0)

    return [
        UpdateResult(u, 1.0, 1.0, 0.0, 0.0, 1e-3, grads=[grad(share)])
        for u, share in enumerate(allowed_shares)
    ]


@pytest.mark.parametrize(
    ("shares", "start"),
    [
        ([0.05, 0.9, 4.0, 3.0], 1),  # widened from update 1 on (model zoo run 184515)
        ([0.05, 0.3, 0.1, 3.0, 2.0], 3),  # blind again from update 3
        ([0.05, 0.06, 0.07, 0.08], None),  # a noise floor that sees a quarter
        ([0.05, 0.06, 0.07, 3.0], None),  # blind at the last update alone
    ],
)
def test_a_noise_floor_widened_past_a_quarter_of_the_gradient_is_said(shares, start):
    """Against a reference, where from some update on every gradient was allowed a quarter of
    its own size or more (a 16-bit baseline's noise widened by the carry, at most 16 times),
    the report warns from which update the gradient check was blind; a check that saw a
    quarter at some later update, or went blind at the last update alone, says nothing."""
    from gradalign.judge.vacuous import widened_blind_note

    notes = widened_blind_note(_widened(shares))
    if start is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(f"warning: from update {start} on"), notes


def test_strict_fails_what_a_blind_check_passed(tmp_path, cli):
    """`--strict` (`strict=True`): the blind gradient check's warning fails the comparison
    (code `warned`, a failing check listing the warning; exit 1, in the JSON report too), where
    a merged run whose every gradient is half the baseline's passed it; a comparison with no
    warning passes as before, and `merged --strict` without `--against` is refused."""
    torch.set_num_threads(1)
    _record(tmp_path / "k1", 1, 1e-8)
    _record(tmp_path / "half", 4, 1e-8, scale=0.5)
    plain = api.compare(tmp_path / "k1", tmp_path / "half", reference="none")
    assert plain.verdict == "pass" and _warned(plain)
    strict = api.compare(tmp_path / "k1", tmp_path / "half", reference="none", strict=True)
    assert strict.verdict == "fail"
    assert strict.diagnosis[0].code == "warned", strict.diagnosis
    assert any("could not see a gradient" in w for w in strict.diagnosis[0].evidence["warnings"])
    assert [c.name for c in strict.checks if c.status == "fail"] == ["warnings (--strict)"]
    assert "could not be checked as the same training" in headline(strict)
    report = tmp_path / "strict.json"
    args = ("compare", tmp_path / "k1", tmp_path / "half", "--reference", "none")
    assert cli(*args).code == 0
    assert cli(*args, "--strict", "--json", report).code == 1
    assert json.loads(report.read_text())["diagnosis"][0]["code"] == "warned"
    _record(tmp_path / "big1", 1, 1.0)
    _record(tmp_path / "big4", 4, 1.0)
    clean = api.compare(tmp_path / "big1", tmp_path / "big4", reference="none", strict=True)
    assert clean.verdict == "pass", clean.notes
    one_line_error(cli("merged", "--strict", "-o", tmp_path / "alone"), "--strict needs --against")
