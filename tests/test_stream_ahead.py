"""The streamed judge starts the next update's gradient sweeps behind this update's tensors
(judge/update_files.py): every number and message is the same as without, a file found wrong
while swept ahead is refused at its own update with the same words, and one that cannot be
opened ahead is opened again, and refused, in its turn."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gradalign import api
from gradalign.config import TrainConfig
from gradalign.errors import BadInput
from gradalign.judge import stream
from gradalign.judge.compare import compare
from gradalign.runs.reader import read_run_dir

TINY = TrainConfig(hidden=32, updates=4, batch_size=16, accum_steps=4, optimizer="adamw")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ahead")
    api.record_baseline(TINY, root / "baseline")
    api.record_merged(TINY, root / "merged")
    return root


def _compare(root, ahead: bool, monkeypatch, seen: list | None = None):
    base, merged = read_run_dir(root / "baseline"), read_run_dir(root / "merged")
    with monkeypatch.context() as m:
        if not ahead:
            m.setattr(stream.StreamJudge, "_ahead", lambda self, i: None)
        if seen is not None:
            call = stream.StreamJudge.__call__

            def watched(self, result):
                call(self, result)
                nxt = self.next
                seen.append(None if nxt is None else (nxt.update, sorted(nxt.sweeps)))

            m.setattr(stream.StreamJudge, "__call__", watched)
        return compare(base, merged, reference=read_run_dir(base.reference), streaming=True)


def test_the_next_updates_sweeps_start_ahead_and_change_nothing(runs, monkeypatch):
    seen: list = []
    ahead = _compare(runs, True, monkeypatch, seen)
    plain = _compare(runs, False, monkeypatch)
    grads = sorted(t.name for t in read_run_dir(runs / "baseline").tensors if t.kind == "param")
    assert seen == [(u + 1, grads) for u in range(TINY.updates - 1)] + [None]
    assert ahead.verdict == plain.verdict == "pass"
    for a, b in zip(ahead.results, plain.results, strict=True):
        assert [dataclasses.asdict(d) for d in a.weights + a.grads] == [
            dataclasses.asdict(d) for d in b.weights + b.grads
        ]
        assert (a.grad_ratio, a.grad_cosine) == (b.grad_ratio, b.grad_cosine)
    assert ahead.notes == plain.notes


def test_update_0s_sweeps_start_when_the_judge_is_made(runs, monkeypatch):
    """Before the losses and the bookkeeping are judged: the first update waits for none."""
    made = []
    init = stream.StreamJudge.__init__

    def watched(self, inputs):
        init(self, inputs)
        made.append(None if self.next is None else (self.next.update, sorted(self.next.sweeps)))

    monkeypatch.setattr(stream.StreamJudge, "__init__", watched)
    _compare(runs, True, monkeypatch)
    grads = sorted(t.name for t in read_run_dir(runs / "baseline").tensors if t.kind == "param")
    assert made == [(0, grads)]


def _refusal(root, ahead: bool, monkeypatch) -> str:
    with pytest.raises(BadInput) as caught:
        _compare(root, ahead, monkeypatch)
    return str(caught.value)


def _altered(tmp_path, runs, update: int):
    """A copy of the runs whose merged gradient at `update` has one value changed in place."""
    import shutil

    root = tmp_path / "altered"
    shutil.copytree(runs, root)
    file = root / "merged" / "grads" / f"update_{update:06d}.safetensors"
    data = bytearray(file.read_bytes())
    data[-4:] = np.float32(123.0).tobytes()
    file.write_bytes(bytes(data))
    return root


def test_a_gradient_altered_at_a_later_update_is_refused_there_as_before(
    tmp_path, runs, monkeypatch
):
    root = _altered(tmp_path, runs, 2)
    message = _refusal(root, True, monkeypatch)
    assert message == _refusal(root, False, monkeypatch)
    assert "update_000002" in message and "fingerprint" in message


def test_files_that_cannot_be_opened_ahead_are_refused_in_their_turn(tmp_path, runs, monkeypatch):
    import shutil

    root = tmp_path / "missing"
    shutil.copytree(runs, root)
    (root / "merged" / "weights" / "update_000002.safetensors").unlink()
    message = _refusal(root, True, monkeypatch)
    assert message == _refusal(root, False, monkeypatch)


def test_an_updates_files_close_only_after_every_task_reading_them(runs, monkeypatch):
    """Where one tensor's task raises, the update's files close once the others are done (they
    read them; a file closed under a read may hand its number to the next one opened)."""
    import threading
    import time

    from gradalign.judge import update_files

    events, lock = [], threading.Lock()
    tensor, close = stream.StreamJudge._tensor, update_files.UpdateFiles.close

    def slow_or_refused(self, name, f, *args, **kwargs):
        at = self.names.index(name)  # the second refused, those after it still reading
        if f.update == 1 and at == 1:
            raise BadInput("refused")
        out = tensor(self, name, f, *args, **kwargs)
        time.sleep(0.3 if f.update == 1 and at > 1 else 0.0)
        with lock:
            events.append(("done", f.update))
        return out

    def closing(self):
        with lock:
            events.append(("closed", self.update))
        close(self)

    monkeypatch.setattr(stream.StreamJudge, "_tensor", slow_or_refused)
    monkeypatch.setattr(update_files.UpdateFiles, "close", closing)
    with pytest.raises(BadInput, match="refused"):
        _compare(runs, True, monkeypatch)
    closed = events.index(("closed", 1))
    assert ("done", 1) in events and ("done", 1) not in events[closed:], events
