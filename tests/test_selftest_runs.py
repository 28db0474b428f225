"""What `gradalign selftest` leaves on disk: the runs of the cases that did not go as expected
(with the baselines they were judged against), or every run with `--keep-runs`."""

from __future__ import annotations

import pytest
from rich.console import Console

from gradalign import selftest

SHORT = {"updates": 2}


@pytest.fixture
def short_setups(monkeypatch):
    """Two setups of two updates each: the test records three cases, not the selftest's 71."""
    setups = {"sgd": SHORT, "adam": {**SHORT, "optimizer": "adam"}}
    monkeypatch.setattr(selftest, "SETUPS", {**selftest.SETUPS, **setups})


# sgd clean (as expected), sgd clean expected to fail (goes otherwise), adam clean (as expected)
CASES = [selftest.Case("sgd"), selftest.Case("sgd", None, "loss-scale"), selftest.Case("adam")]


def test_only_the_runs_of_a_case_that_went_otherwise_stay(tmp_path, short_setups):
    out = tmp_path / "st"
    outcomes = selftest.run_selftest(out, Console(quiet=True), CASES)
    assert [o.ok for o in outcomes] == [True, False, True]
    # both sgd cases wrote merged-clean; the one that went otherwise was judged last there
    kept = sorted(p.name for p in (out / "sgd").iterdir())
    assert kept == ["baseline", "baseline-fp64", "merged-clean"], kept
    assert not (out / "adam").exists()  # every case of the setup went as expected
    assert not any(p.name.startswith(".") for p in out.rglob("*"))  # no staging or lock left


def test_keep_runs_keeps_every_case(tmp_path, short_setups):
    out = tmp_path / "st"
    outcomes = selftest.run_selftest(out, Console(quiet=True), CASES[::2], keep_runs=True)
    assert all(o.ok for o in outcomes)
    for setup in ("sgd", "adam"):
        names = sorted(p.name for p in (out / setup).iterdir())
        assert names == ["baseline", "baseline-fp64", "merged-clean"], names


def test_a_selftest_that_went_as_expected_leaves_no_folder_and_says_nothing_kept(
    tmp_path, short_setups, monkeypatch
):
    out = tmp_path / "new" / "st"  # two folders the selftest makes
    seen = {}

    def run_case(case, out, recorded):
        seen[case.setup] = sorted(p.name for p in out.iterdir()) if out.exists() else []
        return real(case, out, recorded)

    real = selftest._run_case
    monkeypatch.setattr(selftest, "_run_case", run_case)
    console = Console(record=True, width=200)
    outcomes = selftest.run_selftest(out, console, [CASES[2], CASES[0]])
    assert all(o.ok for o in outcomes)
    assert seen == {"adam": [], "sgd": []}  # adam's runs went once its one case was judged
    assert not (tmp_path / "new").exists()
    assert "kept" not in console.export_text()


def test_a_folder_of_the_users_beside_the_runs_is_not_touched(tmp_path, short_setups):
    out = tmp_path / "st"
    mine = out / "adam" / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    selftest.run_selftest(out, Console(quiet=True), CASES[2:])
    assert mine.read_text() == "mine"
    assert sorted(p.name for p in (out / "adam").iterdir()) == ["notes.txt"]


def test_a_run_being_written_is_not_discarded_from_under_its_writer(tmp_path):
    from gradalign.errors import BadInput
    from gradalign.runs.locks import RunLock
    from gradalign.runs.writer import discard_run

    run = tmp_path / "merged-clean"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    with RunLock(run), pytest.raises(BadInput, match="being written"):
        discard_run(run)
    assert (run / "manifest.json").exists()
    discard_run(run)  # its writer done: removed, and nothing left beside it
    assert list(tmp_path.iterdir()) == []
