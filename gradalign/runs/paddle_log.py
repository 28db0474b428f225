"""Read a PaddlePaddle training log (step losses, printed weights, printed window means) as a Run.

The format is what a plain training script prints::

    0   [0.29568613]                      <- step line: step index, loss as a 1-element array
    ------------>[[ 0.00325679 ... ]      <- weight block: a numpy-printed 2-D array,
     ...                                     possibly truncated (``...``) in rows and columns
    avgloss -------->[0.29568613]         <- a window mean printed by the script itself

Only the printed (truncated, rounded) values are known, so the Run has ``full_weights=False``
and non-zero resolutions. This module is numpy-only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import BadInput
from .model import Run, TensorInfo, Tensors

STEP_RE = re.compile(r"^(\d+)\s+\[([^\[\]]*)\]$")
BLOCK_RE = re.compile(r"^-{2,}>(.*)$")
AVGLOSS_RE = re.compile(r"^avgloss\s*-+>\s*(.*)$")
NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?(\d*)|\.(\d+))(?:[eE]([-+]?\d+))?$|^[-+]?(?:nan|inf)$")


@dataclass
class _Log:
    """What one pass over the log found; ``blocks[m]`` are the grids printed after step ``m``."""

    losses: list[float] = field(default_factory=list)
    step_lines: list[int] = field(default_factory=list)
    blocks: list[list[np.ndarray]] = field(default_factory=list)
    avglosses: list[float] = field(default_factory=list)
    loss_decimals: int = 0
    weight_decimals: int = 0
    ignored: int = 0


def _number(token: str, where: str) -> tuple[float, int]:
    """Parse one printed number; return it with its count of decimals (exponent included)."""
    match = NUMBER_RE.match(token)
    if not match:
        raise BadInput(f"{where}: cannot parse {token!r} as a number")
    frac = match[1] or match[2] or ""
    decimals = max(0, len(frac) - int(match[3] or 0))
    return float(token), decimals


def _one_number(text: str, where: str) -> tuple[float, int]:
    """Parse a printed one-element array such as ``[0.29568613]`` (brackets optional)."""
    tokens = text.replace("[", " ").replace("]", " ").split()
    if len(tokens) != 1:
        raise BadInput(f"{where}: expected one number, found {text.strip()!r}")
    return _number(tokens[0], where)


def _read_lines(path: Path) -> list[str]:
    """The file's lines, or BadInput if it is missing, not a file or not UTF-8."""
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if not path.is_file():
        raise BadInput(f"{path}: not a regular file")
    try:
        return path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise BadInput(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise BadInput(f"{path}: cannot read ({err.strerror})") from None


def _parse_grid(
    lines: list[str], start: int, first: str, path: Path
) -> tuple[np.ndarray, int, int]:
    """Parse the 2-D array starting with ``first`` on 0-based line ``start``: return the grid of
    printed values (``...`` dropped), the index of the line after it, and its most decimals."""
    rows: list[list[float]] = []
    depth, decimals, index, text = 0, 0, start, first
    while True:
        where = f"{path}:{index + 1}"
        for token in text.replace("[", " [ ").replace("]", " ] ").split():
            if token == "[":
                depth += 1
                if depth > 2:
                    raise BadInput(f"{where}: printed array has more than 2 dimensions")
                if depth == 2:
                    rows.append([])
            elif token == "]":
                if depth == 0:
                    raise BadInput(f"{where}: unbalanced ']' in printed array")
                depth -= 1
                if depth == 0:
                    if len({len(row) for row in rows}) != 1:
                        raise BadInput(f"{where}: printed array is empty or has ragged rows")
                    return np.array(rows, dtype=np.float64), index + 1, decimals
            elif token == "...":
                continue
            elif depth != 2:
                raise BadInput(f"{where}: expected a 2-D array '[[ ... ]]', found {token!r}")
            else:
                value, places = _number(token, where)
                rows[-1].append(value)
                decimals = max(decimals, places)
        index += 1
        if index >= len(lines):
            raise BadInput(f"{path}:{start + 1}: printed array is not closed before end of file")
        text = lines[index]


def _parse(path: Path) -> _Log:
    """One pass over the log: step lines, weight blocks, avgloss lines, everything else."""
    lines, log, index = _read_lines(path), _Log(), 0
    while index < len(lines):
        text, where = lines[index].strip(), f"{path}:{index + 1}"
        index += 1
        if not text:
            continue
        if step := STEP_RE.match(text):
            if int(step[1]) != len(log.losses):
                raise BadInput(f"{where}: expected step {len(log.losses)}, found step {step[1]}")
            loss, places = _one_number(step[2], where)
            log.losses.append(loss)
            log.step_lines.append(index)
            log.blocks.append([])
            log.loss_decimals = max(log.loss_decimals, places)
        elif block := BLOCK_RE.match(text):
            grid, end, places = _parse_grid(lines, index - 1, block[1], path)
            if log.blocks:
                log.blocks[-1].append(grid)
                log.weight_decimals = max(log.weight_decimals, places)
            else:  # printed before the first step: not attributable to any step
                log.ignored += end - index + 1
            index = end
        elif avg := AVGLOSS_RE.match(text):
            log.avglosses.append(_one_number(avg[1], where)[0])
        else:
            log.ignored += 1
    if not log.losses:
        raise BadInput(f"{path}: no step lines like '0   [0.2956]' found; not a Paddle log")
    return log


def _check_blocks(log: _Log, path: Path) -> list[TensorInfo]:
    """Every step must print the same number of grids with the same shapes; describe them."""
    shapes = [grid.shape for grid in log.blocks[0]]
    for line, grids in zip(log.step_lines, log.blocks, strict=True):
        if [grid.shape for grid in grids] != shapes:
            raise BadInput(
                f"{path}:{line}: this step printed weight grids {[g.shape for g in grids]}, "
                f"step 0 printed {shapes}"
            )
    return [TensorInfo(f"printed_weight_{j}", shape, "float32") for j, shape in enumerate(shapes)]


def fingerprint(grid: np.ndarray) -> int:
    """int64 fingerprint of printed values: equal values give equal fingerprints."""
    data = np.ascontiguousarray(grid, dtype="<f8") + 0.0  # -0.0 prints differently, equals 0.0
    digest = hashlib.blake2b(data.tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def read_paddle_log(path: str | Path, accum_steps: int = 1) -> Run:
    """Read a Paddle training log; ``accum_steps`` micro-steps make one update."""
    path = Path(path)
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise BadInput(f"accum_steps must be a whole number >= 1, got {accum_steps!r}")
    log = _parse(path)
    k, micro = accum_steps, len(log.losses)
    if micro % k:
        raise BadInput(
            f"{path}: {micro} micro-steps cannot be split into windows of accum_steps={k}"
        )
    n = micro // k
    if len(log.avglosses) > n:
        raise BadInput(f"{path}: {len(log.avglosses)} avgloss lines for only {n} updates")
    window_loss = np.full(n, np.nan)
    window_loss[: len(log.avglosses)] = log.avglosses
    tensors = _check_blocks(log, path)
    run = Run(
        source=str(path),
        kind="paddle-log",
        accum_steps=k,
        updates=n,
        micro_loss=np.array(log.losses, dtype=np.float64),
        tensors=tensors,
        full_weights=False,
        printed_window_loss=window_loss,
        loss_resolution=10.0**-log.loss_decimals,
        config={"ignored_lines": log.ignored},
    )
    if tensors:
        _attach_weights(run, log.blocks)
        run.weight_resolution = 10.0**-log.weight_decimals
    return run


def _attach_weights(run: Run, blocks: list[list[np.ndarray]]) -> None:
    """Fill state fingerprints and the weight loader from the grids printed after each step."""
    k, n = run.accum_steps, run.updates
    printed = np.array([[fingerprint(grid) for grid in grids] for grids in blocks], dtype=np.int64)
    run.micro_state = np.zeros_like(printed)
    run.micro_state[1:] = printed[:-1]  # micro-step m starts from what step m-1 printed
    run.micro_state_known = np.arange(len(blocks)) > 0
    run.update_state = printed[k - 1 :: k]

    def load_weights(update: int) -> Tensors:
        if not 0 <= update < n:
            raise IndexError(f"update {update} out of range 0..{n - 1}")
        grids = blocks[(update + 1) * k - 1]
        return {f"printed_weight_{j}": grid.copy() for j, grid in enumerate(grids)}

    run.load_weights = load_weights


def looks_like_paddle_log(path: str | Path) -> bool:
    """Cheap sniff: a regular file whose first non-empty line is a step line like '0   [0.29]'
    and whose next non-empty line (if any) is a step, weight-block or avgloss line."""
    path = Path(path)
    try:
        if not path.is_file():
            return False
        with path.open("rb") as handle:
            head = handle.read(8192).decode("utf-8", errors="replace")
    except OSError:
        return False
    lines = [line.strip() for line in head.splitlines() if line.strip()][:2]
    if not lines or not (step := STEP_RE.match(lines[0])):
        return False
    try:
        _one_number(step[2], str(path))
    except BadInput:
        return False
    return len(lines) < 2 or any(r.match(lines[1]) for r in (STEP_RE, BLOCK_RE, AVGLOSS_RE))
