"""The selftest's data-parallel cases: every merged run of W ranks is recorded in one launch
(starting ranks costs seconds), then each is judged against its one-process baseline. Where
this torch cannot run ranks (no torch.distributed, no gloo), the cases are skipped and the
table says why: never silently."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from . import api
from .errors import BadInput
from .selftest import Case, Outcome, baseline_of, judge_case
from .selftest_runs import RunsKept


def ranks_unavailable(case: Case) -> str | None:
    """Why this machine cannot run the case's ranks (None: it can)."""
    from .record.launch import backend_for

    try:
        backend_for(case.config)
    except BadInput as exc:
        return str(exc)
    return None


def run_ranked(
    cases: list[Case], out: Path, log: Console, recorded: set[str], tidy: RunsKept
) -> list[Outcome]:
    """Record the cases' baselines (one process), their merged runs (one launch), judge each."""
    reasons = {case: ranks_unavailable(case) for case in cases}
    runnable = [case for case in cases if reasons[case] is None]
    for case in cases:
        if reasons[case] is not None:
            log.print(f"selftest: {case.name}: skipped ({reasons[case]})", markup=False)
    bases = {case: baseline_of(case, out, recorded) for case in runnable}

    merged = {case: bases[case].parent / case.merged_run for case in runnable}
    api.record_merged_runs([(case.config, merged[case], case.fault) for case in runnable])
    outcomes = {
        case: tidy.judged(judge_case(case, api.compare(bases[case], merged[case]), log))
        for case in runnable
    }
    for case in cases:
        if reasons[case] is not None:
            outcomes[case] = tidy.judged(Outcome(case, "skipped", [], skipped=reasons[case]))
    return [outcomes[case] for case in cases]
