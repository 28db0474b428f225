"""Logs of other lengths told why, where their lines say: a merged log read with a K larger than
its lines hold (`-k 8` for 4 micro-steps an update; card logs given the K of all cards), and a
pair given in the other order (the merged log's micro-steps first). A cold probe's Paddle logs
were told "the merged run stopped early? its log was cut" in each case."""

from __future__ import annotations

import numpy as np
import pytest

from gradalign.api import compare
from gradalign.errors import BadInput

N, K = 12, 4


def _log(path, losses) -> None:
    path.write_text("".join(f"step {i}, loss: {v:.6f}\n" for i, v in enumerate(losses)))


@pytest.fixture
def logs(tmp_path):
    base = 2.3 - 0.02 * np.arange(N)
    spread = np.tile([-0.03, -0.01, 0.01, 0.03], N)
    _log(tmp_path / "base.log", base)
    _log(tmp_path / "merged.log", np.repeat(base, K) + spread)
    for card in (0, 1):  # two cards, two micro-steps each an update
        _log(tmp_path / f"card{card}.log", np.repeat(base, 2) + spread.reshape(-1, 2)[:, card])
    return tmp_path


def _refusal(*args, k: int) -> str:
    with pytest.raises(BadInput) as refused:
        compare(*args, accum_steps=k)
    return str(refused.value)


def test_a_k_larger_than_the_lines_hold_is_told_the_k_they_hold(logs):
    said = _refusal(logs / "base.log", logs / "merged.log", k=8)
    assert "4 per baseline update: read it with -k 4" in said and "stopped early" not in said
    assert compare(logs / "base.log", logs / "merged.log", accum_steps=K).verdict == "pass"


def test_card_logs_given_the_k_of_all_cards_are_told_each_cards(logs):
    said = _refusal(logs / "base.log", [logs / "card0.log", logs / "card1.log"], k=4)
    assert "read it with -k 2" in said and "each card's own count" in said


def test_a_pair_given_in_the_other_order_is_told_so(logs):
    said = _refusal(logs / "merged.log", logs / "base.log", k=K)
    assert "given in the other order? the baseline comes first" in said
