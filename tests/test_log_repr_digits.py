"""A log whose losses carry a double's every digit somewhere (`repr` of a Python float, JSON:
`2.3009999999999997`) was printed by a printer that writes each number in the fewest digits
that identify it: its short numbers (`2.3`) are exact, not known only to their last digit. A
cold probe's pair of JSON logs, the merged windows 0.0015 off at every update, failed 2 updates
of 10: the 8 whose baseline loss printed short passed within a printed digit's width."""

from __future__ import annotations

import json

import numpy as np

from gradalign.api import compare

K, UPDATES = 4, 10


def _log(path, losses, fmt=None) -> None:
    lines = []
    for step, loss in enumerate(losses):
        value = float(loss) if fmt is None else fmt.format(loss)
        lines.append(json.dumps({"step": step, "loss": value}))
    path.write_text("\n".join(lines) + "\n")


def _pair(tmp_path, offset: float, fmt=None):
    base = 2.3 - 0.01 * np.arange(UPDATES)  # 2.3, 2.29, 2.28, 2.2699999999999996, ...
    spread = np.tile([-0.003, -0.001, 0.001, 0.003], UPDATES)  # each window's mean: 0
    micro = np.repeat(base, K) + spread + offset
    _log(tmp_path / "base.log", base, fmt)
    _log(tmp_path / "merged.log", micro, fmt)
    return compare(tmp_path / "base.log", tmp_path / "merged.log", accum_steps=K)


def test_a_repr_printed_log_is_judged_to_its_doubles_at_every_update(tmp_path):
    assert any(len(repr(v)) > 16 for v in 2.3 - 0.01 * np.arange(UPDATES))  # the repr's mark
    c = _pair(tmp_path, 0.0015)
    assert c.verdict == "fail"
    assert all(not r.loss_ok for r in c.results), [r.loss_ok for r in c.results]
    assert _pair(tmp_path, 0.0).verdict == "pass"


def test_a_log_printed_to_two_decimals_is_still_known_to_them_alone(tmp_path):
    c = _pair(tmp_path, 0.0015, fmt="{:.2f}")  # the difference within one printed digit
    assert c.verdict == "pass"
