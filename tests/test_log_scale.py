"""Big logs: what a run of many updates costs to judge. A log of 50k updates (200k micro-step
lines) must not cost a pass over every window for each window."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.runs.model import Run


def _run(updates: int, k: int, sizes: list[int] | None = None) -> Run:
    micro = sum(sizes) if sizes else updates * k
    return Run(
        source="big.log",
        kind="log",
        accum_steps=k,
        updates=updates,
        micro_loss=np.arange(micro, dtype=np.float64),
        tensors=[],
        window_sizes=None if sizes is None else np.array(sizes, dtype=np.int64),
    )


@pytest.fixture
def starts_computed(monkeypatch) -> list[int]:
    """How often a run's window starts (a cumulative sum over every window) are computed."""
    calls: list[int] = []
    original = Run.starts.fget

    def counting(self: Run) -> np.ndarray:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(Run, "starts", property(counting))
    return calls


def test_window_means_take_one_pass(starts_computed):
    run = _run(1000, 4)
    losses = run.window_losses()
    assert losses.tolist() == [4 * i + 1.5 for i in range(1000)]
    assert [run.window(i) for i in (0, 999)] == [range(0, 4), range(3996, 4000)]
    assert len(starts_computed) == 0  # K micro-steps each: no cumulative sum at all
    with pytest.raises(IndexError):
        run.window(1000)


def test_irregular_windows_compute_their_starts_once(starts_computed):
    run = _run(3, 2, sizes=[2, 3, 1])
    assert run.window_losses().tolist() == [0.5, 3.0, 5.0]
    assert run.window_sums(np.array([1, 2, 3, 4, 5, 6])).tolist() == [3, 12, 6]
    assert len(starts_computed) == 2
    assert [run.window(i) for i in range(3)] == [range(0, 2), range(2, 5), range(5, 6)]


def test_trainer_dicts_are_read_as_json_where_their_quotes_allow(tmp_path, monkeypatch):
    """`print(logs)` dicts (200k of them in a long run) are read by json after swapping quotes,
    ten times faster than `ast.literal_eval`, which stays for what json cannot read."""
    from gradalign.runs.logs import read_log, records

    plain = "{'loss': 2.5, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.5}"
    python_only = [  # None, a tuple, nan, a string holding a quote: literal_eval's
        "{'loss': 2.25, 'grad_norm': None, 'learning_rate': 5e-05}",
        "{'loss': 2.125, 'betas': (0.9, 0.999), 'learning_rate': 5e-05}",
        "{'loss': 2.0, 'grad_norm': nan, 'learning_rate': 5e-05}",
        "{'loss': 1.875, 'note': \"it's\", 'learning_rate': 5e-05}",
    ]
    path = tmp_path / "trainer.log"
    path.write_text("\n".join([plain, *python_only]) + "\n")
    evaluated: list[str] = []
    literal_eval = records.ast.literal_eval

    def counting(text: str) -> object:
        if isinstance(text, str):  # a module imported meanwhile evaluates its own ast nodes
            evaluated.append(text)
        return literal_eval(text)

    monkeypatch.setattr(records.ast, "literal_eval", counting)
    run = read_log(path)
    assert run.micro_loss.tolist() == [2.5, 2.25, 2.125, 2.0, 1.875]
    assert run.lr.tolist() == [5e-05] * 5
    assert len(evaluated) == len(python_only)


def test_the_loss_resolutions_of_many_steps_match_one_by_one():
    from gradalign.runs.logs.build import number_quantum, numbers_quantum
    from gradalign.runs.logs.grammar import number

    printed = [number(t) for t in ["2.3", "1.2345E+00", "-7.0300000e-05", "1.", "nan", "1e99999"]]
    for precision in (0, 4, 8):
        for bracketed in (False, True):
            many = numbers_quantum(printed, [bracketed] * len(printed), precision)
            one = [number_quantum(p, precision if bracketed else None) for p in printed]
            assert many.tolist() == one  # to the bit: 10.0**-5 in numpy is not Python's
