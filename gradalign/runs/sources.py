"""Open a run from whatever the user points at: a run directory, a framework's log file, or the
logs of several cards of one data-parallel run."""

from __future__ import annotations

import codecs
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import BadInput
from ..paths import nonempty, resolved
from .golden import looks_golden
from .layout import is_run_dir
from .logs import (
    CARD_LOSSES,
    has_progress_bars,
    looks_like_log,
    missing_cards,
    read_card_logs,
    read_log,
    unread_in,
)
from .logs.lines import SNIFF_BYTES
from .logs.names import EVERY_STEP_ADVICE
from .logs.smooth import STEP_LOSS_ADVICE
from .logs.unread import BARS
from .model import Run
from .reader import read_run_dir

_NOT_A_RUN = (
    "neither a gradalign run directory nor a recognised training log: no step line in its "
    "first MiB holds a step number and a loss as the reader knows them ('0   0.2957', "
    "'step 3, loss: 0.2957', 'Step[3/48] loss: [0.2957]', a JSON or dict line or a table row "
    "with a loss field)"
)


_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_UNPACK = {"gzip": "gunzip -k", "bzip2": "bunzip2 -k", "xz": "unxz -k", "zstd": "unzstd"}


def _first_bytes(path: Path) -> bytes:
    """The first MiB of a file (as the log reader sniffs it), or nothing where it cannot be read."""
    try:
        with path.open("rb") as handle:
            return handle.read(SNIFF_BYTES)
    except OSError:
        return b""


def _compressed(head: bytes) -> str | None:
    """The compression a file's first bytes name (gzip, bzip2, xz, zstd), else None."""
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)


def _encoding(data: bytes) -> tuple[str, str] | None:
    """Why a file's first bytes are no UTF-8 text a log could be read from, where that is so:
    (what they read as, the name `iconv -f` takes): UTF-16 without a byte-order mark, GBK as a
    Chinese Windows console writes, or bytes that are not UTF-8; ("binary", "") where they hold
    NUL bytes otherwise. None where they are UTF-8 or start with a UTF-16 byte-order mark."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or len(data) < 4:
        return None
    half, even, odd = len(data) // 2, data[0::2].count(0), data[1::2].count(0)
    for name, high, low in (("UTF-16-LE", odd, even), ("UTF-16-BE", even, odd)):
        if high > 0.5 * half and low < 0.05 * half:  # ASCII beside a NUL, the rest not
            return f"it reads as {name} without a byte-order mark", name
    if b"\0" in data:
        return "binary", ""  # a VisualDL or TensorBoard record file, in no text encoding
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data)  # a cut last character is fine
        return None
    except UnicodeDecodeError:
        pass
    try:
        text = data.decode("gb18030")
    except UnicodeDecodeError:
        text = ""
    if any("\u4e00" <= ch <= "\u9fff" for ch in text):
        return "it reads as GBK", "GBK"
    return "its bytes are not UTF-8", "<its encoding>"


def _not_a_run(path: Path) -> BadInput:
    """The refusal of a file that is neither; progress bars named where it holds some, and a
    golden file told what judges against it."""
    if path.exists() and not path.is_file():  # never opened: a pipe without a writer blocks
        return BadInput(
            f"{path}: a pipe or device, not a file: a log is read more than once, so save it "
            "to a file first (`... > run.log`) and give that"
        )
    if path.name == "manifest.json" and is_run_dir(path.parent):
        return BadInput(
            f"{path}: the manifest of the run {path.parent}, not a log: give the run's folder"
        )
    if looks_golden(path):
        return BadInput(
            f"{path}: a golden file, not a run: judge a run against it with `gradalign golden "
            f"check {path} RUN` (gradalign.api.golden_check)"
        )
    head = _first_bytes(path)
    packed = _compressed(head)
    if packed is not None:
        return BadInput(
            f"{path}: a {packed}-compressed file: decompress it first (`{_UNPACK[packed]} {path}`)"
        )
    if path.is_file() and path.stat().st_size == 0:
        return BadInput(f"{path}: the file is empty (was the run's output sent elsewhere?)")
    encoding = _encoding(head)
    if encoding is not None and encoding[0] == "binary":
        return BadInput(
            f"{path}: a binary file (it holds NUL bytes), not a training log: a TensorBoard or "
            "VisualDL event file? Export its loss scalars to a CSV with a step column, or print "
            "each step's loss"
        )
    if encoding is not None:
        what, source = encoding
        return BadInput(
            f"{path}: not a recognised training log: {what}, and logs are read as UTF-8: "
            f"convert it first (`iconv -f {source} -t UTF-8 {path} > {path.stem}.utf8.log`)"
        )
    seen = unread_in(path)
    told = seen is not None and seen.startswith(BARS)
    bars = ":" if told else "; its progress bars are not read:" if has_progress_bars(path) else ";"
    seen = f"; {seen}" if seen else ""
    return BadInput(
        f"{path}: {_NOT_A_RUN}{seen}{bars} print each step's loss, or write the run format "
        "(docs/FORMAT.md)"
    )


def open_run(path: Path, accum_steps: int | None, role: str) -> Run:
    """A Run from a run directory (K from its manifest) or a training log (K given)."""
    if path.is_dir():
        run = read_run_dir(path)
        if accum_steps is not None and accum_steps != run.accum_steps:
            if role == "baseline":  # K=1 unless said: the flag has a default, nobody gave it
                raise BadInput(
                    f"{path}: the baseline was recorded with K={run.accum_steps}, and a "
                    f"baseline is taken as K={accum_steps} (--baseline-accum-steps); to judge "
                    f"against this run, give --baseline-accum-steps {run.accum_steps} (or, if "
                    "the runs were given the other way round: the baseline comes first, then "
                    "the merged run)"
                )
            raise BadInput(
                f"{path}: {role} run was recorded with K={run.accum_steps}, "
                f"but --accum-steps {accum_steps} was given"
            )
        return run
    if not path.exists():
        raise BadInput(f"{path}: no such run directory or log file")
    if looks_like_log(path):
        return read_log(path, 1 if accum_steps is None else accum_steps)
    raise _not_a_run(path)


def open_merged(paths: Sequence[Path], accum_steps: int | None, card_loss: str | None) -> Run:
    """The merged run: one source, or one log per card of a data-parallel run (card 0 first),
    whose losses are combined by `card_loss` (default mean)."""
    if card_loss is not None and card_loss not in CARD_LOSSES:
        raise BadInput(f"--card-loss must be one of {', '.join(CARD_LOSSES)}, got {card_loss!r}")
    if len(paths) == 1:
        if card_loss is not None:
            raise BadInput("--card-loss combines several card logs; only one merged source given")
        run = open_run(paths[0], accum_steps, "merged")
        return _with_missing_cards(run, None if run.kind != "log" else missing_cards(paths))
    for path in paths:
        if path.is_dir():
            raise BadInput(
                f"{path}: several merged sources are read as one training log per card; "
                "a run directory records all cards itself"
            )
        if not path.exists():
            raise BadInput(f"{path}: no such log file")
        if not looks_like_log(path):
            raise _not_a_run(path)
    if len({resolved(p) for p in paths}) != len(paths):  # after: a run directory is no card log
        raise BadInput("a card log is given twice; give each card's log once")
    run = read_card_logs(
        list(paths), 1 if accum_steps is None else accum_steps, card_loss or "mean"
    )
    return _with_missing_cards(run, missing_cards(paths))


def _with_missing_cards(run: Run, note: str | None) -> Run:
    """`run` with the note that its cards' logs are not all given, kept in its config too: a
    failure's diagnosis names it first (judge/hints.py)."""
    if note is None:
        return run
    config = {**run.config, "missing_cards": note}
    return dataclasses.replace(run, notes=[*run.notes, note], config=config)


def open_reference(option: str | None, base: Run) -> tuple[Run | None, str | None]:
    """The reference run to calibrate by, and a note when a named one is missing.

    `option` is a path, "none", or None for the one the baseline's manifest names.
    """
    if option == "none":
        return None, None
    if option is not None:
        nonempty(option, "reference")
        return open_run(Path(option), None, "reference"), None
    if base.reference is None:
        return None, None
    path = Path(base.reference)
    if os.path.lexists(path) and not path.exists():  # a link to nothing, or a loop: not missing
        raise BadInput(
            f"the baseline names a reference run at {path}, a link that leads to no run (a "
            "broken link, or a loop); point it at the reference, or give --reference"
        )
    if path.exists() and not is_run_dir(path):  # there, but not readable as a run: say so
        return open_run(path, None, "reference"), None
    if not is_run_dir(path):
        return None, (
            f"the baseline names a reference run at {path}, which is missing; judged by the "
            "fixed tolerances instead"
        )
    return read_run_dir(path), None


def check_smoothing(base: Run, merged: Run) -> tuple[Run, Run]:
    """Both runs' losses must be read alike: where one log printed an epoch's running mean, the
    other (one log) is read again taking a weaker sign of one; one log recovered against one
    taken as printed compares different quantities, and is refused."""
    kinds = [run.config.get("smoothed") for run in (base, merged)]
    if kinds[0] == kinds[1]:
        return base, merged
    seen, unseen = (base, merged) if kinds[0] else (merged, base)
    if unseen.kind == "log" and Path(unseen.source).is_file():
        again = read_log(unseen.source, unseen.accum_steps, paired=True)
        if again.config.get("smoothed") == seen.config["smoothed"]:
            return (seen, again) if seen is base else (again, seen)
    raise BadInput(
        f"{seen.source}: its losses were read as a {kinds[0] or kinds[1]} and recovered, "
        f"{unseen.source}'s do not show one (too few steps or too little noise to tell): both "
        f"logs must print the same loss; {STEP_LOSS_ADVICE}"
    )


def check_log_counters(base: Run, merged: Run) -> None:
    """Counters striding by s a line (`[ 20/600]`) are read as samples, as the PyTorch examples
    count them; but samples of the same data count to the same total in both runs. One log's
    total K times the baseline's (600 and 2400: the merged run's K times as many micro-steps)
    counts iterations, so a stride prints every s-th one, not each step (PaddleDetection's
    default log_iter: 20): the windows would pair unrelated lines. Refused. Not card logs, whose
    counters may count each card's share of the samples."""
    counters = [run.config.get("counter") if run.kind == "log" else None for run in (base, merged)]
    if None in counters or len(merged.cards) > 1:
        return
    if counters[1]["total"] != merged.accum_steps * counters[0]["total"] or merged.accum_steps < 2:
        return
    shown = " and ".join(f"{c['stride']} out of {c['total']}" for c in counters)
    raise BadInput(
        f"{merged.source}: the logs' step counters advance by {shown} a line: counters of "
        "samples of the same data would count to the same total, so these count iterations, "
        "and each log prints only every so many (its losses one iteration's, or a mean or "
        f"median over those since its last line); {EVERY_STEP_ADVICE}"
    )


def check_log_updates(base: Run, merged: Run) -> None:
    """A log is judged by its losses, and the first update's loss is computed before any
    optimizer step: a comparison of one update shows nothing of how the runs train (a progress
    bar's first frame read as the only step passed every bug), so it is refused."""
    logs = [run for run in (base, merged) if run.kind == "log"]
    if logs and min(base.updates, merged.updates) < 2:
        short = min(logs, key=lambda run: run.updates)
        raise BadInput(
            f"{short.source}: {short.updates} update(s) read from the log: its first loss is "
            "computed before any optimizer step, so one update shows nothing of the training; "
            "print each step's loss for at least two updates (a progress bar redrawn in place "
            "is not read)"
        )
