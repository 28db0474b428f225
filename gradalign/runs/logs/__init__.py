"""Training logs as runs: a log is another source of a run (PaddlePaddle-style prints, and
other frameworks' keyed lines, JSON/dict records and tables).

`cleaned` (a line without its prefix, colours and wrappers; Paddle Tensor prints joined),
`grammar` (what a step line, a printed array and a printed window mean look like), `names` (which
field is the step, the loss, the lr), `records` (a JSON object or Python dict per line, tables
with a header), `arrays` (a printed array read over its lines), `parse` (one pass over a log;
framework lines anywhere are noise; what it found is `parsed`'s, with each printed stream's
precision), `build` (a parsed log as a `Run`, each printed number with
its own print resolution), `cards` (several card logs of one data-parallel run combined into one
`Run`). Numpy-only.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import BadInput
from ..model import Run
from .build import build_run, fingerprint
from .cards import CARD_LOSSES, combine_cards, missing_cards
from .cleaned import readable
from .grammar import StepLine, step_line
from .lines import head, is_progress_bar
from .parse import parse_log
from .records import Records
from .unread import unread_fields

__all__ = [
    "CARD_LOSSES",
    "fingerprint",
    "has_progress_bars",
    "looks_like_log",
    "missing_cards",
    "read_card_logs",
    "read_log",
    "unread_in",
]


def _check_k(accum_steps: int) -> None:
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise BadInput(f"accum_steps must be a whole number >= 1, got {accum_steps!r}")


def read_log(path: str | Path, accum_steps: int = 1, paired: bool = False) -> Run:
    """Read a training log; `accum_steps` micro-steps make one update; `paired`: the other log
    of its pair printed an epoch's running mean (a weaker sign of one is then taken)."""
    _check_k(accum_steps)
    return build_run(parse_log(Path(path)), accum_steps, paired)


def read_card_logs(paths: list[str | Path], accum_steps: int, card_loss: str = "mean") -> Run:
    """One run from the logs of its cards (one log per card, card 0 first)."""
    _check_k(accum_steps)
    return combine_cards([read_log(p, accum_steps) for p in paths], card_loss)


def looks_like_log(path: str | Path) -> bool:
    """Cheap sniff: a regular text file with a step line ('0   [0.29]', '0   0.29', 'step 0,
    loss 0.29') or a step record (a JSON/dict line or a table row holding a loss) among its
    first MiB; framework lines before it do not matter."""
    lines = head(Path(path))
    if lines is None:
        return False
    records = Records()
    for line in readable(lines.texts):
        try:
            found = records.read(line)
            if isinstance(found, StepLine) or (found is None and step_line(line) is not None):
                return True
        except BadInput:
            return True  # a step line it cannot read: reading the log says why
    return False


def unread_in(path: str | Path) -> str | None:
    """What loss-like fields and step keys the first MiB prints (`unread.unread_fields`)."""
    lines = head(Path(path))
    return None if lines is None else unread_fields(lines.texts)


def has_progress_bars(path: str | Path) -> bool:
    """Whether the file's first MiB holds a progress bar the grammar does not read (tqdm's,
    Keras's): a log that is one is told so when no step line is found."""
    lines = head(Path(path))
    return lines is not None and any(is_progress_bar(line) for line in lines.texts)
