"""bench/model_zoo.py's loops, recorded and judged for the tests of zoo runs
(tests/test_zoo_kinks.py, tests/test_zoo_noise.py, tests/test_zoo_sketched.py): the float64
reference, the baseline and the merged run of one zoo model, on one thread as the bench, and
whether a rule of the judge is what passes a run (`_followed`)."""

from __future__ import annotations

import contextlib
import importlib.util
import re
from collections.abc import Iterator

import pytest
import torch

from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir
from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("model_zoo", ROOT / "bench" / "model_zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)


def _runs(root, model: str, optimizer: str, k: int, seed: int, **merged_options):
    """The float64 reference, the baseline (K=1) and the merged run (K=k), judged; `updates`,
    `width`, `sketch` and `uneven` (among the options) for all three."""
    shared = ("updates", "width", "sketch", "uneven")
    length = {o: merged_options[o] for o in shared if o in merged_options}
    zoo.record(root / "ref", model, optimizer, 1, seed, float64=True, **length)
    zoo.record(root / "base", model, optimizer, 1, seed, reference="../ref", **length)
    zoo.record(root / "merged", model, optimizer, k, seed, **merged_options)
    return root


def _compare(root, streaming: bool = False):
    base, merged = read_run_dir(root / "base"), read_run_dir(root / "merged")
    return compare(base, merged, reference=read_run_dir(base.reference), streaming=streaming)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, as the bench, and back to the suite's own after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _one_thread_runs(root, *args, **options):
    """`_runs` on one thread, as the bench: which kink a run crosses, and where a gain turns
    gradient noise into a weight's step, depend on the order of the sums."""
    with one_thread():
        return _runs(root, *args, **options)


def _followed(
    root,
    monkeypatch,
    follow: str,
    update: int,
    note: str = "",
    without=lambda *a: [],
    judges: tuple[bool, ...] = (False, True),
    within: str = "",
) -> None:
    """Without the judge's `follow` (a name in judge/honest.py, or a dotted path; replaced by
    `without`) the run first fails at `update`, there in tensors whose names hold `within`
    alone (else this machine's rounding took another path: skipped, the numpy tests hold the
    logic on any machine); with it, both judges (`judges`: streaming or not) pass it, with a
    note `note` matches (`_passed`)."""
    first = _first_failing_without(root, monkeypatch, follow, without)
    if first is None or first.update != update:
        at = None if first is None else first.update
        pytest.skip(f"this machine's rounding took another path here (first failure: {at})")
    others = sorted(
        d.name for d in (*first.weights, *first.grads) if not d.ok and within not in d.name
    )
    if others:  # the event moved more than the rule reads, as it did not where it was seen
        pytest.skip(f"this machine's rounding failed {others[:3]} at update {update} too")
    _passed(root, note, judges)


def _followed_on_one_of(
    tmp_path,
    monkeypatch,
    seen: list[tuple[tuple, int, str]],
    follow: str,
    without=lambda *a: [],
    judges: tuple[bool, ...] = (False, True),
    **options,
):
    """`_followed` on the first of `seen` ((model, optimizer, k, seed), the update it first
    failed at without `follow`, the note) whose run fails there on this machine: where a kink
    or a gain shows depends on the machine's rounding (its CPU's kernels), so each case lists
    the seeds it was seen on, on each machine it was searched on. Skipped where none shows."""
    for args, update, note in seen:
        root = _one_thread_runs(tmp_path / "-".join(map(str, args)), *args, **options)
        if _first_failure_without(root, monkeypatch, follow, without) == update:
            _passed(root, note, judges)
            return root
    pytest.skip(f"this machine's rounding took another path on each of {[s[0] for s in seen]}")


def _first_failure_without(root, monkeypatch, follow: str, without) -> int | None:
    """The first failing update without `follow` (None: none)."""
    first = _first_failing_without(root, monkeypatch, follow, without)
    return None if first is None else first.update


def _first_failing_without(root, monkeypatch, follow: str, without):
    """The first failing update's result without `follow` (None: none)."""
    target = follow if "." in follow else f"gradalign.judge.honest.{follow}"
    with monkeypatch.context() as m:
        m.setattr(target, without)
        c = _compare(root)
    return next((r for r in c.results if not r.ok), None)


def _passed(root, note: str, judges: tuple[bool, ...]) -> None:
    """Each judge passes the run with a note that `note` (a regular expression) matches at its
    start: the rule's words and the update, where a tensor or a count is the machine's."""
    for streaming in judges:
        c = _compare(root, streaming)
        assert c.verdict == "pass", (streaming, [d.code for d in c.diagnosis])
        assert not note or any(re.match(note, n) for n in c.notes), c.notes


def _one_thread_judge(root, *args, **options) -> dict:
    """`zoo.judge` on one thread, as the bench."""
    with one_thread():
        return zoo.judge(root, *args, **options)
