"""Sketch mode without a reference: a kink crossed in one run is followed as in full mode.

The kink diagnoses read a sketched gradient's units from its unit sums (judge/kink_evidence.py),
and chose the kinked tensor by its error over its noise, which no tensor has without a
reference: no kink was ever found there, and a clean run that crossed one failed `unexplained`
where full mode followed it (the sketch hunt's case 8, a CNN under AdamW, at update 7). A kink
is made here by hand: one row of a layer's gradient moves at one update, fed to the step.
"""

from __future__ import annotations

import pytest
import torch

from gradalign import Recorder, api

UPDATES, BATCH = 8, 32


def _run(out, k: int, record: str, kink: bool = False, bug_from: int | None = None) -> None:
    """Adam, a Tanh MLP, K micro-batches; `kink`: row 3 of the first layer's gradient moves by
    0.2 of its largest element at update 3, and the step is taken with it; from `bug_from` on,
    every gradient is 1.5 times itself."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.Tanh(), torch.nn.Linear(64, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 24, generator=generator)
    y = torch.randint(0, 5, (UPDATES * BATCH,), generator=generator)
    options = {"record": record, **({"sketch_width": 31} if record == "sketch" else {})}
    with Recorder(out, model, optimizer, k, updates=UPDATES, **options) as rec:
        for update in range(UPDATES):
            for rows in torch.arange(update * BATCH, (update + 1) * BATCH).chunk(k):
                loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            grad = model[0].weight.grad
            if kink and update == 3:
                grad[3] += 0.2 * grad.abs().max()
            if bug_from is not None and update >= bug_from:
                for p in model.parameters():
                    p.grad *= 1.5
            optimizer.step()
            rec.update()
            optimizer.zero_grad()


@pytest.mark.parametrize("record", ["sketch", "full"])
def test_without_a_reference_a_sketched_kink_is_followed_and_a_later_bug_fails(tmp_path, record):
    _run(tmp_path / "base", 1, record)
    _run(tmp_path / "kink", 4, record, kink=True)
    _run(tmp_path / "bug", 4, record, kink=True, bug_from=6)
    kink = api.compare(tmp_path / "base", tmp_path / "kink", reference="none")
    assert kink.verdict == "pass", [(d.code, d.message[:200]) for d in kink.diagnosis]
    (note,) = [n for n in kink.notes if "crossed its kink" in n]
    assert note.startswith("update 3: the gradient of 0.weight jumped")
    assert "its allowed error" in note  # no noise floor without a reference
    bug = api.compare(tmp_path / "base", tmp_path / "bug", reference="none")
    assert bug.verdict == "fail" and not bug.results[6].ok and bug.results[5].ok
