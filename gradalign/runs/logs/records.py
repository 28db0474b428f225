"""Structured records in a training log: a JSON object or a Python dict per line, and tables
with a header row (CSV, TSV, or columns apart by white space). Numpy-free.

    {"step": 3, "loss": 2.29, "lr": 0.001}           a JSON object (after any prefix: fairseq's
                                                      `| INFO | train_inner | {...}`)
    {'loss': 2.29, 'learning_rate': 5e-05, ...}      a Python dict literal (`print(logs)`, as the
                                                      transformers Trainer prints), read with
                                                      `ast.literal_eval`, never evaluated
    epoch,lr-SGD,step,train_loss  then  0,0.1,3,2.29  a table: a header row, then rows of as many
    step  lr  loss                then  3  0.1  2.29  cells (an empty cell is no value; apart by
                                                      white space, numbers only)

Field names are read by the rules of `names` (the keyed lines' rules): the step, the loss (the
field plainly named `loss`, else a named training loss; the first record that holds one, or the
table's header, chooses it for the whole log) and the lr. A record with no step field is the next
step (the Trainer prints none); a record without the log's loss field is not a step (evaluation
and summary dicts, Lightning's validation rows). A TensorBoard CSV export (`Wall time,Step,Value`;
its JSON export comes as those rows, lines.scalar_export) holds one scalar, the tag the user
exported: its `Value` is read as the loss, and a note says so.
"""

from __future__ import annotations

import ast
import csv
import json
import re

from ...errors import BadInput
from .grammar import Printed, StepLine, number
from .lines import SCALARS_HEADER
from .names import (
    LINE_STEP_KEY,
    choose_loss,
    is_lr_field,
    is_norm_field,
    is_size_field,
    is_step_field,
    whole,
)

MAX_RECORD = 1 << 16  # a longer line is no Python literal: literal_eval's cost grows with it
_QUOTED_KEY = re.compile(r"['\"]([A-Za-z_][\w./-]{0,63})['\"]\s*+:")  # a record's field name
_NAME = re.compile(r"[A-Za-z_][\w .()/\-]*")
# a step the text before a record names (`step 3: {'train_loss': 2.29}`), where the record has none
_PREFIX_STEP = re.compile(rf"(?<![\w.])(?:{LINE_STEP_KEY})\s*+[:=#]?\s*+(?P<index>\d+)", re.I)
_INTEGER = re.compile(r"[-+]?\d+")
_TENSORBOARD = tuple(SCALARS_HEADER.lower().split(","))  # `Wall time,Step,Value`
_SPECIAL = re.compile(r"(?<![\w'\"])(-?(?:nan|inf))(?![\w'\"])")  # `'grad_norm': nan,`


_JSON = json.JSONDecoder(parse_float=str, parse_int=str)  # numbers kept as printed
_DIGITS = 40  # the longest integer read as a step (int64 holds 19 digits)


# Lightning's CSVLogger (metrics.csv): comma-separated, `epoch` and `step` beside what was logged.
# Under accumulate_grad_batches it writes a row per optimizer step only, holding each on_step
# value of the window's last micro-batch (its logger skips the batches it accumulates).
LIGHTNING_CSV = "lightning-csv"
_LIGHTNING_COLUMNS = {"epoch", "step"}
LIGHTNING_LAST_MICRO = (
    "Lightning's metrics.csv under accumulate_grad_batches holds one row per optimizer step, "
    "each logged value its window's last micro-batch's (Lightning's logger skips the batches it "
    "accumulates), not the window's mean: it cannot show whether the merged run trains as the "
    "baseline; record both runs with gradalign's Lightning callback (GradalignCallback), or "
    "print each batch's loss from training_step and compare those logs"
)


class NotAStep:
    """A record (or a table's header) that is not a step: noise."""


NOT_A_STEP = NotAStep()
Read = StepLine | NotAStep | None


def _printed(value: object) -> Printed | None:
    """A record's value as a printed number: a float by its repr (what `print` showed), an
    integer exactly, a string if it reads as a number (fairseq's JSON prints strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return number(repr(value))
    if isinstance(value, int):
        return Printed(float(value), 0, 0, False)
    if isinstance(value, str):
        text = value.strip()
        if _INTEGER.fullmatch(text):
            return Printed(float(text), 0, 0, False)
        return number(text)
    return None


def _integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        # int() refuses over 4300 digits; any step past _DIGITS is refused as too large anyway
        return int(value) if len(value.strip()) <= _DIGITS else 10**_DIGITS
    return None


def _mapping(text: str) -> dict | None:
    """A JSON object or a Python dict literal (`nan` and `inf` as Python prints them), or None.
    JSON of any length (its decoder takes linear time: a record that logs every layer's norm
    runs past MAX_RECORD), a Python literal up to MAX_RECORD."""
    for attempt in (text, _as_json(text)):
        if attempt is None:
            continue
        try:
            found = _JSON.decode(attempt)
        except (ValueError, RecursionError):
            continue
        return found if isinstance(found, dict) else None
    if len(text) > MAX_RECORD:
        return None
    try:
        found = ast.literal_eval(_SPECIAL.sub(r"'\1'", text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def _as_json(text: str) -> str | None:
    """A Python dict's repr as JSON, where swapping its quotes makes it so: with no `"` in it,
    no string in it holds a `'` (repr quotes those with `"`). A dict json cannot read (`None`,
    tuples, `nan`) is left to `ast.literal_eval`, ten times slower on 200k records."""
    return None if '"' in text or "'" not in text else text.replace("'", '"')


def _cells(text: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return text.split()
    try:
        return [cell.strip() for cell in next(csv.reader([text], delimiter=delimiter))]
    except csv.Error:  # a quoted field over csv's limit (128 KiB): no table's cell
        return []


def _best_loss(names: list[str]) -> str | None:
    at = choose_loss(names)
    return None if at is None else names[at]


UNNUMBERED = (
    "its records print no step number: read as consecutive steps, one per record; a log "
    "printed every N steps (the Trainer's logging_steps) numbers here its records, each a mean "
    "over the steps since the last (print every step to judge each one)"
)


class Records:
    """The records of one log, line by line: the table header in force and the loss field
    the log's first record chose."""

    def __init__(self) -> None:
        self.header: list[str] | None = None
        self.delimiter: str | None = None
        self.loss_key: str | None = None
        self.notes: list[str] = []
        self.epochs: list[int | None] = []  # the first two unnumbered records' epochs
        self.written_by: str | None = None  # LIGHTNING_CSV where its table is that logger's

    def _by_epoch(self, epoch: int | None) -> None:
        """Refuse records without a step whose first two name epochs e and e+1: one record per
        epoch (timm's summary.csv, fastai's history.csv), its loss the epoch's mean."""
        if len(self.epochs) >= 2:
            return
        self.epochs.append(epoch)
        first = self.epochs[0]
        if len(self.epochs) == 2 and first is not None and epoch == first + 1:
            raise BadInput(
                f"its records name epochs {first} and {epoch} and no step: one record per "
                "epoch (a summary such as timm's summary.csv or fastai's history.csv), whose "
                "loss is the epoch's mean, not a step's; log each step's loss (the step "
                "number with it)"
            )

    def read(self, text: str) -> Read:
        """The step a record line holds, NOT_A_STEP for a record that holds none (and for a
        table's header), None for a line that is no record (the line grammar reads it)."""
        if text.endswith("}") and "{" in text:
            fields = _mapping(text[text.index("{") :])
            if fields is not None:
                self.header = None
                named = _PREFIX_STEP.search(text[: text.index("{")])
                return self._record(fields, None if named is None else whole(named["index"]))
            long = len(text) > MAX_RECORD
            if self._names_loss(text, long):
                # a record of this log's steps that cannot be read: skipped, it would shift
                # every later record without a step field
                why = f" (JSON cannot read it, and it is past {MAX_RECORD // 1024} KiB)"
                raise BadInput(f"cannot read this record{why if long else ''}: {text[:60]!r}")
        if self.header is not None:
            cells = _cells(text, self.delimiter)
            # a delimited row may hold text (`phase`: `train`); one apart by white space, numbers
            if len(cells) == len(self.header) and (
                self.delimiter or all(_printed(c) is not None for c in cells)
            ):
                row = zip(self.header, cells, strict=True)
                return self._record({name: cell for name, cell in row if cell != ""})
            self.header = None  # the table ended
        return self._header(text)

    def _names_loss(self, text: str, long: bool) -> bool:
        """Whether a record that cannot be read names this log's loss field, or where the log has
        none yet and the record is too long to be read as a Python literal (`long`), a field
        that would be its loss: one printed per step, dropped silently it shifts the rest."""
        if self.loss_key is not None:
            return re.search(rf"['\"]{re.escape(self.loss_key)}['\"]\s*+:", text) is not None
        return long and _best_loss(_QUOTED_KEY.findall(text)) is not None

    def _header(self, text: str) -> NotAStep | None:
        """A table's header row: two or more names, one of them the loss (with white space
        between them, one the step too); or TensorBoard's `Wall time,Step,Value`."""
        delimiter = "," if "," in text else "\t" if "\t" in text else None
        names = _cells(text, delimiter)
        if len(names) < 2 or not all(_NAME.fullmatch(n) for n in names):
            return None
        loss = _best_loss(names)
        if loss is None and tuple(n.lower() for n in names) == _TENSORBOARD and delimiter:
            loss = names[2]
            note = (
                "the Value column of a TensorBoard export (CSV or JSON: one tag) is read as the "
                "loss"
            )
            if note not in self.notes:
                self.notes.append(note)
        if loss is None or (delimiter is None and not any(is_step_field(n) for n in names)):
            return None
        self.header, self.delimiter, self.loss_key = names, delimiter, loss
        if delimiter == "," and set(names) >= _LIGHTNING_COLUMNS:
            self.written_by = LIGHTNING_CSV
        return NOT_A_STEP

    def _record(self, fields: dict, prefixed: int | None = None) -> Read:
        """A record's step; `prefixed`: the step the text before it names, where it has none."""
        fields = {str(name): value for name, value in fields.items()}
        printed = {name: p for name, value in fields.items() if (p := _printed(value)) is not None}
        names = list(printed)
        if self.loss_key is None:
            self.loss_key = _best_loss(names)
        if self.loss_key not in printed:
            return NOT_A_STEP
        loss = printed[self.loss_key]
        steps = sorted(
            (n for n in names if is_step_field(n) and _integer(fields[n]) is not None),
            key=lambda n: "global" not in n.lower(),
        )
        indices = [_integer(fields[n]) for n in steps]
        lr = next((printed[n] for n in names if is_lr_field(n)), None)
        norm = next((printed[n] for n in names if is_norm_field(n)), None)
        epoch = next((_integer(v) for n, v in fields.items() if str(n).lower() == "epoch"), None)
        size = next((_integer(fields[n]) for n in names if is_size_field(n)), None)
        index = indices[0] if indices else prefixed
        if index is None:
            self._by_epoch(epoch)
        others = tuple(indices[1:])
        return StepLine(index, loss, False, epoch, lr, others, grad_norm=norm, size=size)
