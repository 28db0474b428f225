"""Joining the ranks (record/distributed.py). Waiting for every rank's Recorder
(`_await_every_rank`): a barrier that times out says the Recorder was not created on every rank
within the wait; one that fails sooner (a rank raised before its Recorder, and its connection
closed) says a rank ended, not "within 600 s" (a probe's ranks 2 and 3 raised at once; ranks 0
and 1 said 600 s). Ranks a parent Python process spawned name it as their launcher."""

from __future__ import annotations

import pytest

from gradalign.record import distributed as ranks_mod
from gradalign.record.facts import RecorderError

dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("after, says", [(0.0, "a rank ended"), (1.0, "within 1 s")])
def test_a_failed_wait_says_whether_it_timed_out(monkeypatch, after, says):
    clock = iter([100.0, 100.0 + after])
    monkeypatch.setattr(ranks_mod.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")

    def barrier(**_: object) -> None:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    monkeypatch.setattr(dist, "monitored_barrier", barrier)
    monkeypatch.setenv("GRADALIGN_JOIN_TIMEOUT", "1")
    ranks = ranks_mod.Ranks(0, 4, "gloo", "torchrun", None)
    with pytest.raises(RecorderError, match=says):
        ranks_mod._await_every_rank(ranks)


def test_ranks_a_python_process_spawned_name_their_launcher(monkeypatch):
    """`torch.multiprocessing.spawn`'s ranks recorded `launcher: unknown`."""
    monkeypatch.setattr(ranks_mod, "_LAUNCHER_VARIABLES", ())
    monkeypatch.setattr(ranks_mod, "_JOB_VARIABLES", ())  # no launcher's environment
    assert ranks_mod.launcher() == "unknown"  # this test's own process: no parent
    monkeypatch.setattr(ranks_mod.multiprocessing, "parent_process", lambda: object())
    assert ranks_mod.launcher() == "multiprocessing"
