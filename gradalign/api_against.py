"""`merged --against GOLDEN`: before any training, the golden for the environment the run will
record and the model it recorded; after it, the judgement (api_golden.py's golden check)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .api_golden import PathLike, candidate_path, golden_check
from .errors import BadInput
from .feedback import Feedback
from .judge.results import Comparison
from .runs.golden import as_runs, environment_key, find, load
from .runs.outputs import check_outputs


def refuse_other_environment(
    golden: PathLike, env: dict[str, Any], out: Path, reports: Sequence[PathLike]
) -> Path:
    """Before `merged --against GOLDEN` trains: the golden for the environment the run will record
    (`env`), else "no golden for this environment"; the candidate's place is checked too."""
    golden_file, _ = find(Path(golden), environment_key(env))
    check_outputs([out], [Path(golden)], [candidate_path(golden_file, out, reports)])
    return golden_file


def golden_run(golden_file: Path) -> Any:
    """The golden file's run as the judge reads it (its tensors' names and shapes)."""
    return as_runs(load(golden_file), str(golden_file))[0]


def judge_against(
    golden: PathLike,
    run: Path,
    tolerances: dict[str, Any],
    reports: Sequence[PathLike],
    feedback: Feedback,
) -> Comparison:
    """`golden_check` for a run known to have a golden for its environment."""
    outcome = golden_check(golden, run, tolerances=tolerances, reports=reports, feedback=feedback)
    if outcome.comparison is None:  # cannot happen after refuse_other_environment
        raise BadInput(f"no golden for this environment in {golden}")
    return outcome.comparison
