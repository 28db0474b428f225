"""What stays of `gradalign selftest`'s runs, and where each case's runs lie: by default only
the runs of the cases that did not go as expected, with the baselines they were judged against;
every run with `--keep-runs`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from .selftest import Case, LogCase, Outcome


class RunsKept:
    """What stays of the selftest's runs: by default only those of the cases that did not go as
    expected, with the baselines they were judged against, for a look at what went wrong. The
    rest go as soon as no case left needs them: a merged run once judged, a setup's baseline and
    reference once its last case is (the disk holds a few setups at a time, not 71 cases)."""

    def __init__(self, out: Path, keep: bool, cases: list[Case | LogCase]) -> None:
        self.out, self.keep = out, keep
        self.logs: list[Path] = []
        self.pending = Counter(case.folder for case in cases)
        self.wanted: set[str] = set()  # folders of cases that went otherwise
        self.otherwise = 0

    def logs_written(self, files: list[Path]) -> Path:
        """Note the simulated logs written (removed with their folder); their folder."""
        self.logs = files
        return files[0].parent

    def judged(self, outcome: Outcome) -> Outcome:
        """Note the outcome; remove what went as expected and no case left needs."""
        from .runs.writer import discard_run

        folder = outcome.case.folder
        self.pending[folder] -= 1
        if not outcome.ok:
            self.wanted.add(folder)
            self.otherwise += 1
        if self.keep:
            return outcome
        merged = merged_of(outcome.case, self.out)
        if outcome.ok and merged is not None:
            discard_run(merged)
        if self.pending[folder] == 0 and folder not in self.wanted:
            self._discard_folder(self.out / folder)
        return outcome

    def _discard_folder(self, folder: Path) -> None:
        from .record.trainer import reference_path
        from .runs.writer import discard_run, remove_if_empty

        ours = [p for p in self.logs if p.parent == folder] or [folder / "baseline"]
        for path in ours + [reference_path(p) for p in ours if p.name == "baseline"]:
            discard_run(path)  # each whole or gone; nothing else in the folder is touched
        remove_if_empty([folder])

    def finish(self, made: list[Path], log: Console) -> None:
        """Remove the folders the selftest made, where nothing stayed in them; say what stays."""
        from .runs.writer import remove_if_empty

        if self.keep:
            if self.out.exists():
                log.print(f"selftest: every case's runs kept in {self.out}", markup=False)
            return
        remove_if_empty(made)
        if self.otherwise:
            log.print(
                f"selftest: the runs of the {self.otherwise} cases that went otherwise are kept "
                f"in {self.out} (--keep-runs keeps every case's)",
                markup=False,
            )


def merged_of(case: Case | LogCase, out: Path) -> Path | None:
    """The case's merged run (None for logs, which its setup's cases share)."""
    return None if case.merged_run is None else out / case.folder / case.merged_run
