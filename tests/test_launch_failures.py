"""What `gradalign merged --nproc W` says when a rank fails (record/launch.py's `_failure`): a
rank's own bad input as such, a rank killed by a signal as bad input even where a peer reported
the broken connection first, any other error as a bug."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from gradalign.errors import BadInput
from gradalign.record.launch import _failure

PEER = (0, "RuntimeError", "[gloo/transport/tcp/pair.cc:547] Connection closed by peer", False)
SPAWN = SimpleNamespace(error_index=0, exit_code=1)  # what torch raised: rank 0's exception


def test_a_killed_rank_is_the_cause_even_when_its_peer_reported_first():
    error = _failure(SPAWN, [PEER], [1, -signal.SIGKILL])
    assert isinstance(error, BadInput)
    assert str(error).startswith("rank 1 was killed by SIGKILL; the other ranks were stopped")


@pytest.mark.parametrize("codes", [[1, -signal.SIGTERM], [1, None], [1, 0]])
def test_an_error_with_no_rank_killed_by_another_signal_is_a_bug(codes):
    """SIGTERM is how the others are stopped once one rank failed: not a cause."""
    error = _failure(SPAWN, [PEER], codes)
    assert type(error) is RuntimeError and str(error).startswith("rank 0 failed: RuntimeError")


def test_a_ranks_own_bad_input_stays_bad_input():
    bad = (1, "BadInput", "the loss function returned nothing", True)
    error = _failure(SPAWN, [bad], [-signal.SIGKILL, 1])
    assert isinstance(error, BadInput) and str(error) == "the loss function returned nothing"


def test_a_death_with_nothing_reported_names_the_rank_and_signal():
    died = SimpleNamespace(error_index=1, signal_name="SIGKILL")
    error = _failure(died, [], [-signal.SIGTERM, -signal.SIGKILL])
    assert isinstance(error, BadInput) and str(error).startswith("rank 1 was killed by SIGKILL")
