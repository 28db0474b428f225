"""A log's bytes as numbered lines, and what a terminal made of them.

    line numbers   a `\\n` (or `\\r\\n`) ends a line; a `\\r` inside a line (a progress bar
                   redrawing itself) separates segments, each read alone under the line's number;
                   a last line without its `\\n`, shorter than the line before it that begins
                   alike, was cut while written and is left out (`Lines.cut`);
                   no other character ends a line (`str.splitlines` also splits on `\\x0b`,
                   `\\x0c`, `\\x1c`-`\\x1e`, `\\x85`, `\\u2028`, `\\u2029`, and misnumbers)
    tqdm's bar     written after a `\\r` without a newline, so the next line printed shares its
                   segment: ` 26%|##  | 8/30 [00:01<00:10, 29.0it/s]step 7 loss 1.05`; the bar
                   (its description, percent, bar, counts and `[elapsed<remaining, rate]`
                   bracket, or `8it [00:01, 29.0it/s]` without a total) is dropped like a prefix
    Paddle's bar   `Model.fit(verbose=1)`: `step 3/30 [====>....] - loss: 0.98 - 20ms/step`, then
                   backspaces and `\\r`; its loss is the batch's (hapi's progressbar prints the
                   step's logs), so the bar is dropped and the `step i/n` line read; Keras's bar
                   (`3/30 [==>...] - loss: 0.98`, no step key) shows a running mean: never read

This module is numpy-free.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BadInput
from .names import STEP_KEY

MAX_LOG_BYTES = 2 << 30  # a log larger than this is not read whole into memory
SNIFF_BYTES = 1 << 20  # a launcher may print a long preamble before the first step
_TQDM = re.compile(  # a bar leading a segment, with its description (`Epoch 0: `) if any
    r"^\s*(?:[^\s|:][^|:]{0,80}:\s*)?"
    r"(?:\d{1,3}%\|[^|]*\|\s*[\d.]+[kMGTP]?/[\d.?]+[kMGTP]?|[\d.]+[kMGTP]?[A-Za-z/]*)"
    r"\s*\[(?:\d+:)?\d+:\d\d(?:<|,)[^\[\]]*\]"  # `[elapsed<remaining, rate]`, `[elapsed, rate]`
)
_PADDLE_BAR = re.compile(rf"^(?P<key>\s*(?:{STEP_KEY})\s*\d+\s*/\s*\d+\s*)\[[=>.]+\]", re.I)
# a progress bar anywhere: tqdm's `26%|`, Keras's `[===>....]` and `[>....]`, and its first
# frame, `1/60 [.....]`, drawn before the bar has grown; Keras 3's and rich's `━━━━╸━━`. A
# count starts where its digits do (`(?<!\d)`, `\d++`): tried from each digit of a long run of
# them, `\d+/` took time quadratic in the run's length. Likewise, throughout the grammar, white
# space around an optional separator is matched whole (`\s*+[:=]?\s*+`): split every way
# between the two `\s*`, a long run of it took quadratic or cubic time
BAR = r"\d%\||\[=+>?\.*\]|\[>\.+\]|(?<!\d)\d++/\d++\s*\[\.{2,}\]|[━╸╺]{3,}"
_BAR = re.compile(BAR)


@dataclass
class Lines:
    """A log's segments (`texts`) and the line number each is on (`numbers`, from 1); `cut`:
    the number of a last line left out as cut while it was written (`segments`)."""

    texts: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    cut: int | None = None


_HISTORY = '"log_history"'  # transformers' trainer_state.json: its records in one list


def document_records(text: str) -> Lines | None:
    """A JSON document that holds its step records in a list (transformers' trainer_state.json,
    `log_history`, saved in every checkpoint): one JSON line per record, numbered by the line
    the record starts on; None for any other text."""
    if not text.lstrip().startswith("{") or _HISTORY not in text:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    history = document.get("log_history") if isinstance(document, dict) else None
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        return None
    decoder, lines = json.JSONDecoder(), Lines()
    at = text.index("[", text.index(_HISTORY) + len(_HISTORY)) + 1
    for record in history:
        while text[at] in " \t\r\n,":
            at += 1
        _, end = decoder.raw_decode(text, at)
        lines.texts.append(json.dumps(record))
        lines.numbers.append(text.count("\n", 0, at) + 1)
        at = end
    return lines


_SCALARS = "[["  # how TensorBoard's JSON download of a scalar tag begins
SCALARS_HEADER = "Wall time,Step,Value"  # its CSV download's header


def scalar_export(text: str) -> Lines | None:
    """TensorBoard's JSON download of one scalar tag, `[[wall time, step, value], ...]`: its
    entries as the rows of the same tag's CSV download (`Wall time,Step,Value`, which the
    records reader knows), numbered as that file's lines; None for any other text."""
    if not text.lstrip().startswith(_SCALARS):
        return None
    try:
        entries = json.loads(text)
    except ValueError:
        return None
    if not isinstance(entries, list) or not entries or not all(map(_scalar, entries)):
        return None
    rows = [f"{wall!r},{step},{value!r}" for wall, step, value in entries]
    return Lines([SCALARS_HEADER, *rows], list(range(1, len(rows) + 2)))


def _scalar(entry: object) -> bool:
    """Whether an entry is [wall time, step, value]: numbers, the step a whole one."""
    if not isinstance(entry, list) or len(entry) != 3:
        return False
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in entry)
    return numbers and isinstance(entry[1], int)


def segments(text: str) -> Lines:
    """The text's lines by `\\n` (a `\\r\\n` ends one too), each split at its `\\r`s; a JSON
    document of records (`document_records`) as its records, and a TensorBoard JSON download
    (`scalar_export`) as its CSV download's rows."""
    document = document_records(text) or scalar_export(text)
    if document is not None:
        return document
    lines = Lines()
    parts = text.split("\n")
    if parts[-1] == "":
        parts.pop()
    elif _cut_short(parts):
        lines.cut, parts[-1] = len(parts), ""
    for number, line in enumerate(parts, start=1):
        pieces = line.removesuffix("\r").split("\r")
        lines.texts += pieces
        lines.numbers += [number] * len(pieces)
    return lines


_LEAD = re.compile(r"\D*")  # a line's text before its first digit: `step `, `[Train] epoch `
_COUNT = re.compile(r"(?<![\w.+-])\d+(?![\w.])")  # a whole number of its own: a step, a count
ALIKE = 8  # lines before the last whose widths show a fixed-width print


def _width(line: str) -> int:
    """A line's length with each whole number counted as one character (a step counter widens
    from 9 to 10 in a fixed-width print)."""
    return len(_COUNT.sub("#", line.rstrip("\r")))


def _cut_short(parts: list[str]) -> bool:
    """Whether a last line without a line end is shorter than the lines before it that begin
    alike (up to its first digit), which all have one width: a line cut while it was written,
    as a killed run's buffered output leaves it (`step 59 loss 0.493164 lr 1.630896e-0`, cut
    from `e-04`, read as an lr of 1.63). A whole last line without its line end is as long as
    the lines before it; where their widths differ (a loss printed by `repr`, `0.5` after
    `0.6276211921800001`), a shorter last line says nothing, and it is read."""
    last = parts[-1].rstrip("\r")
    lead = _LEAD.match(last)[0]
    if not last.strip() or not lead.strip():
        return False
    alike = (p for p in reversed(parts[:-1]) if p.startswith(lead))
    before = [_width(p) for p in itertools.islice(alike, ALIKE)]
    return len(before) >= 2 and len(set(before)) == 1 and _width(last) < before[0]


def strip_bars(text: str) -> str:
    """The segment without a leading tqdm bar, and with Paddle's step bar dropped (its `step
    i/n` key kept); any other text as it is."""
    if "[" not in text:
        return text
    bar = _TQDM.match(text)
    if bar is not None:
        text = text[bar.end() :]
    return _PADDLE_BAR.sub(r"\g<key>", text, count=1)


def is_progress_bar(text: str) -> bool:
    """Whether a segment holds a progress bar (tqdm's, Keras's) the grammar does not read as a
    step line (Paddle's `step i/n [==>..]` it does)."""
    if _PADDLE_BAR.match(text):
        return False
    return _TQDM.match(text) is not None or _BAR.search(text) is not None


def decode(data: bytes) -> str | None:
    """A log's text: UTF-16 where a byte-order mark says so (PowerShell's `>`), else UTF-8
    (a BOM dropped) with undecodable bytes replaced (a framework's message in another encoding
    is noise, not a reason to refuse the log); None for a binary file (NUL bytes). NUL bytes
    at the end are no content: a file a crash left with its last blocks zero-filled."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")
    data = data.rstrip(b"\0")
    if b"\0" in data:
        return None
    return data.decode("utf-8-sig", errors="replace")


def head(path: Path) -> Lines | None:
    """The segments of a file's first MiB (the last, maybe cut, left out); None where it is no
    regular text file."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as handle:
            data = handle.read(SNIFF_BYTES)
    except OSError:
        return None
    text = decode(data)
    if text is None:
        return None
    opening = text.lstrip()[: len(_SCALARS)]  # a JSON document of records or of scalars
    document = (opening.startswith("{") and _HISTORY in text) or opening == _SCALARS
    if len(data) == SNIFF_BYTES and document:
        try:  # a document of records larger than the sniff: read it whole to parse it
            return read_lines(path)
        except BadInput:
            return None
    lines = segments(text)
    if len(data) == SNIFF_BYTES and len(lines.texts) > 1:
        del lines.texts[-1], lines.numbers[-1]
    return lines


def read_lines(path: Path) -> Lines:
    """The file's segments and their line numbers (see `decode`, `segments`). Binary files are
    refused."""
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if not path.is_file():
        raise BadInput(f"{path}: not a regular file")
    try:
        if path.stat().st_size > MAX_LOG_BYTES:
            raise BadInput(f"{path}: larger than {MAX_LOG_BYTES >> 30} GiB; not read as a log")
        data = path.read_bytes()
    except OSError as err:
        raise BadInput(f"{path}: cannot read ({err.strerror})") from None
    text = decode(data)
    if text is None:
        raise BadInput(f"{path}: a binary file (it holds NUL bytes), not a training log")
    return segments(text)
