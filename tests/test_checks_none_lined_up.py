"""A merged run whose every window holds fewer micro-steps than K (the loop drew K micro-batches
and used K−1) lines up no update with the baseline's: every check that compares updates says
so, not a vacuous pass ("every window saw exactly its baseline batch's samples", though a
quarter of each batch was never seen) or "no weights recorded" beside recorded weights."""

from __future__ import annotations

import torch

from gradalign.judge.checks import NONE_LINED_UP
from gradalign.judge.compare import compare
from gradalign.judge.results import FAIL, NOT_CHECKED, PASS
from gradalign.runs.reader import read_run_dir

from .recorded_loop import classifier, train

BATCH, K, UPDATES = 32, 4, 3


def loop(out, k: int, used: int):
    model, x, y = classifier(UPDATES * BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(out, model, opt, x, y, k, batch=BATCH, used=used)
    return read_run_dir(out)


def test_no_update_lined_up_is_no_pass_of_the_checks_that_compare_updates(tmp_path):
    base = loop(tmp_path / "base", 1, 1)
    short = compare(base, loop(tmp_path / "short", K, K - 1))
    status = {c.name: (c.status, c.detail) for c in short.checks}
    assert short.verdict == FAIL and short.diagnosis[0].code == "micro-batch-missing"
    assert status["window bookkeeping"][0] == FAIL
    for name in ("losses", "same samples per update", "weights", "gradients", "learning rate"):
        assert status[name] == (NOT_CHECKED, NONE_LINED_UP), (name, status[name])
    clean = compare(base, loop(tmp_path / "clean", K, K))
    status = {c.name: c.status for c in clean.checks}
    assert clean.verdict == PASS
    assert all(status[n] == PASS for n in ("same samples per update", "weights", "gradients"))
