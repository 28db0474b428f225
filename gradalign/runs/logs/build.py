"""A parsed log as a Run: micro losses, printed window means, printed weights with the
resolution each number was printed at, fingerprints of what was printed. Numpy-only."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ...errors import BadInput
from ..model import Run, TensorInfo, Tensors
from .arrays import PrintedArray
from .grammar import Printed
from .parsed import ParsedLog
from .skips import attach_scaler
from .smooth import unsmooth

LOG_DTYPE = "float32"  # what a printed weight is taken to be: the dtype frameworks train in


def spacing(values: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """The gap between a float32 value and the next: a printed float32 is never known closer;
    nor a value printed from a 16-bit tensor (`dtype` 'float16' or 'bfloat16') closer than that
    type's gap, whatever digits it prints (the same float32 training, printed as float16, may
    round to neighbours)."""
    finite = np.where(np.isfinite(values), np.abs(values), 0.0)
    if dtype == "float16":
        return np.spacing(np.minimum(finite, 65504.0).astype(np.float16)).astype(np.float64)
    gaps = np.spacing(finite.astype(np.float32)).astype(np.float64)
    return gaps * 65536.0 if dtype == "bfloat16" else gaps  # 7 bits of mantissa, not 23


def array_quantum(array: PrintedArray, precision: int, dtype: str | None = None) -> np.ndarray:
    """How far each printed value may be from the value that was printed.

    numpy prints at most `precision` digits after the (mantissa's) decimal point, fewer when
    fewer identify the value or the rounded digits end in zeros; so every element of an array is
    known to 10**(exponent - precision): an array in fixed notation and one in scientific notation
    in the same log each get their own. Never finer than float32 holds the array: one spacing of
    its largest value (float32 arithmetic errs in absolute terms of a tensor's scale, so a tiny
    weight printed in scientific notation is not known closer than its neighbours).
    """
    printed = 10.0 ** (array.exponents - precision).astype(np.float64)
    values = array.values[np.isfinite(array.values)]
    scale = spacing(np.array([np.abs(values).max(initial=0.0)]), dtype)[0]
    return np.maximum(printed, scale)


REPR_DIGITS = 1e-14  # a printed number's last digit this small beside it: a double's every digit


def number_quantum(printed: Printed, precision: int | None, dtype: str | None = None) -> float:
    """The same for one number: bracketed (an array, `precision` applies) or bare (its own
    digits: a 0-d array or a Python float prints as many as identify it)."""
    digits = printed.digits if precision is None else precision
    try:
        own = 10.0 ** (printed.exponent - digits)
    except OverflowError:  # `1e99999`: a printed inf, whose resolution says nothing
        own = math.inf
    return float(max(own, spacing(np.array([printed.value]), dtype)[0]))


def numbers_quantum(
    printed: list[Printed],
    bracketed: list[bool],
    precision: int,
    dtypes: list[str | None] | None = None,
) -> np.ndarray:
    """`number_quantum` of many numbers at once (a log of 200k steps), to the same bits. Where
    a bare number carries a double's every digit (`repr` of a Python float, JSON: 15 or more
    significant digits, as `2.3009999999999997`), its printer prints each number in the fewest
    digits that identify it, so a short one (`2.3`) is that double exactly, not 2.3 ± 0.1: its
    losses are known to their spacing (a log of such losses 0.0015 apart failed 2 updates of 10,
    the 8 whose prints were short passing by the width of one printed digit)."""
    pairs = zip(printed, bracketed, strict=True)
    shifts = [p.exponent - (precision if b else p.digits) for p, b in pairs]
    powers = {shift: _power_of_ten(shift) for shift in set(shifts)}
    own = np.array([powers[shift] for shift in shifts], dtype=np.float64)
    values = np.array([p.value for p in printed], dtype=np.float64)
    bare = ~np.array(bracketed, dtype=bool)
    with np.errstate(invalid="ignore"):
        whole_double = bare & np.isfinite(values) & (own <= REPR_DIGITS * np.abs(values))
    if whole_double.any():
        own[bare] = 0.0  # each number exact: its spacing (below) is its resolution
    gaps = spacing(values)
    for dtype in set(dtypes or ()) - {None}:
        where = np.array([d == dtype for d in dtypes], dtype=bool)
        gaps[where] = spacing(values[where], dtype)
    return np.maximum(own, gaps)


def _power_of_ten(shift: int) -> float:
    try:
        return 10.0**shift
    except OverflowError:  # `1e99999`: a printed inf, whose resolution says nothing
        return math.inf


def fingerprint(values: np.ndarray) -> int:
    """int64 fingerprint of printed values: equal values give equal fingerprints."""
    data = np.ascontiguousarray(values, dtype="<f8") + 0.0  # -0.0 prints differently, equals 0.0
    digest = hashlib.blake2b(data.tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def build_run(log: ParsedLog, accum_steps: int, paired: bool = False) -> Run:
    """The Run a log describes, with `accum_steps` micro-steps per update (`paired`: its pair's
    other log printed an epoch's running mean, see `smooth.detect`)."""
    path, k, micro = log.path, accum_steps, len(log.losses)
    times = log.printed_times or 1
    if times > 1 and times != k and log.verbatim:
        raise BadInput(
            f"{path}: every step line is printed {_times(times)}, the copies identical to the "
            f"byte (line {log.step_lines[0]} and the next): the log likely prints every line "
            f"{_times(times)} (two logging handlers, e.g. a handler added to a logger whose "
            "records also reach the root logger's); log each line once (one handler, or "
            f"logger.propagate = False), or drop the copies (uniq LOG); unless {times} untagged "
            "processes print the same lines into it (give one log per card)"
        )
    if times > 1 and times != k:
        raise BadInput(
            f"{path}: each step is printed on {times} lines: one per micro-step of its update "
            f"(read it with -k {times}, not -k {k}), {times} processes printing into one log "
            f"(give one log per card), or {times} printers of each step that print other "
            "numbers (lines of other shapes: keep one printer's lines)"
        )
    if micro % k:
        raise BadInput(
            f"{path}: {micro} micro-steps cannot be split into windows of accum_steps={k}: the "
            f"last window holds {micro % k} of {k} (the run stopped early, its log was cut, or "
            "its data ended inside a window; a log prints no step count to tell which)"
        )
    n = micro // k
    if len(log.means) > n:
        raise BadInput(f"{path}: {len(log.means)} avgloss lines for only {n} updates")
    loss_precision, mean_precision, array_precisions = log.precisions()
    quanta = numbers_quantum(log.losses, log.bracketed, loss_precision, log.loss_dtypes)
    printed = np.array([p.value for p in log.losses], dtype=np.float64)
    losses, quanta, smoothed = unsmooth(
        printed, quanta, log.epoch_starts, k, str(path), log.stride, paired, log.running_mean
    )
    window = np.full(n, np.nan)
    window_quanta = np.full(n, np.nan)
    means = zip(log.means, log.mean_bracketed, log.mean_dtypes, strict=True)
    for i, (p, b, dtype) in enumerate(means):
        window[i] = p.value
        window_quanta[i] = number_quantum(p, mean_precision if b else None, dtype)
    tensors = _layout(log)
    run = Run(
        source=str(path),
        kind="log",
        accum_steps=k,
        updates=n,
        micro_loss=losses,
        tensors=tensors,
        full_weights=False,
        loss_quantum=np.array(quanta, dtype=np.float64),
        printed_window_loss=window,
        printed_window_quantum=window_quanta,
        config={"ignored_lines": log.noise, "lines_per_step": times},
        notes=_notes(log, micro),
    )
    if log.stride > 1 and log.counter_total is not None:
        run.config["counter"] = {"stride": log.stride, "total": log.counter_total}
    if log.written_by is not None:
        run.config["written_by"] = log.written_by
    if smoothed is not None:
        run.config["smoothed"] = smoothed.kind
        run.notes.append(
            f"{path}: its losses are an epoch's {smoothed.kind} ({smoothed.evidence}): each "
            "step's loss was recovered as t*L_t - (t-1)*L_(t-1), judged within the print's "
            "rounding times t"
        )
    attach_scaler(run, log)
    if tensors:
        _attach_weights(run, log, tensors, array_precisions)
    # the lr and the gradient's norm (before clipping) its optimizer step took
    run.lr, run.lr_quantum = _per_window(log.lrs, k)
    run.grad_norm_pre_clip, run.grad_norm_quantum = _per_window(log.norms, k)
    run.micro_samples = _sizes(log.sizes)
    return run


def _sizes(sizes: list[int | None]) -> np.ndarray | None:
    """The count each step's loss is a mean over, by which a window's micro losses are weighted
    (micro-batches of 8, 8, 7 and 7 samples, each loss scaled by its share of the batch, is the
    baseline's training; their plain mean is not its loss). None unless every line prints one,
    or where they rise at every line (a count of the run so far, by another name)."""
    if not sizes or any(size is None or size < 0 for size in sizes):
        return None
    counts = np.array(sizes, dtype=np.int64)
    if counts.size >= 3 and bool((np.diff(counts) > 0).all()):
        return None
    return counts


def _per_window(printed: list[Printed | None], k: int) -> tuple[np.ndarray | None, ...]:
    """What each window's last step line prints of a field, and how precisely; None for both
    where some window's last line prints none (MMEngine prints `grad_norm` on the lines of the
    micro-steps that stepped, from the first window's last on)."""
    last = printed[k - 1 :: k]
    if not last or any(value is None for value in last):
        return None, None
    values = np.array([p.value for p in last], dtype=np.float64)
    return values, np.array([number_quantum(p, None) for p in last], dtype=np.float64)


def _times(times: int) -> str:
    return "twice" if times == 2 else f"{times} times"


def _names(labels: list[str]) -> list[str]:
    """Tensor names from the arrays' labels; unlabelled ones by position."""
    names = []
    for j, label in enumerate(labels):
        name = label or f"printed_weight_{j}"
        names.append(name if name not in names else f"{name}#{j}")
    return names


def _layout(log: ParsedLog) -> list[TensorInfo]:
    """Every step that prints arrays prints the same ones (names and shapes); describe them."""
    printing = [m for m, blocks in enumerate(log.blocks) if blocks]
    if not printing:
        return []
    first = log.blocks[printing[0]]
    names = _names([b.label for b in first])
    shapes = [b.array.values.shape for b in first]
    for m in printing:
        blocks = log.blocks[m]
        if (
            _names([b.label for b in blocks]) != names
            or [b.array.values.shape for b in blocks] != shapes
        ):
            found = [
                (n, b.array.values.shape)
                for n, b in zip(_names([b.label for b in blocks]), blocks, strict=True)
            ]
            raise BadInput(
                f"{log.path}:{log.step_lines[m]}: this step printed arrays {found}, step "
                f"{log.first_index + printing[0]} printed {list(zip(names, shapes, strict=True))}"
            )
    return [TensorInfo(name, shape, LOG_DTYPE) for name, shape in zip(names, shapes, strict=True)]


def _attach_weights(
    run: Run, log: ParsedLog, tensors: list[TensorInfo], precisions: list[int]
) -> None:
    """State fingerprints and weight loaders from the arrays printed after each step: what step
    m printed is what step m+1 computed with; what a window's last step printed is the update
    (kept only as the update's row: as micro-step m+1's row it would be the window's start by
    construction, and would prove nothing about the window)."""
    k, n, micro, p = run.accum_steps, run.updates, run.micro_steps, len(tensors)
    printed = {m: blocks for m, blocks in enumerate(log.blocks) if blocks}
    states = {m: [fingerprint(b.array.values) for b in blocks] for m, blocks in printed.items()}
    run.micro_state = np.zeros((micro, p), dtype=np.int64)
    run.micro_state_known = np.zeros(micro, dtype=bool)
    for m, state in states.items():
        if m % k != k - 1:  # after a window's last step: that is the update's row, not a micro's
            run.micro_state[m + 1] = state
            run.micro_state_known[m + 1] = True
    run.update_state = np.zeros((n, p), dtype=np.int64)
    run.update_state_known = np.zeros(n, dtype=bool)
    for i in range(n):
        if (i + 1) * k - 1 in states:
            run.update_state[i] = states[(i + 1) * k - 1]
            run.update_state_known[i] = True
    names = [t.name for t in tensors]

    def blocks_after(update: int):
        if not 0 <= update < n:
            raise IndexError(f"update {update} out of range 0..{n - 1}")
        return printed.get((update + 1) * k - 1)

    def load_weights(update: int) -> Tensors | None:
        blocks = blocks_after(update)
        if blocks is None:
            return None
        return {name: b.array.values.copy() for name, b in zip(names, blocks, strict=True)}

    def load_quantum(update: int) -> Tensors | None:
        blocks = blocks_after(update)
        if blocks is None:
            return None
        return {
            name: array_quantum(b.array, digits, b.dtype)
            for name, b, digits in zip(names, blocks, precisions, strict=True)
        }

    run.load_weights = load_weights
    run.load_weight_quantum = load_quantum


def _notes(log: ParsedLog, micro: int) -> list[str]:
    notes = [f"{log.path}: {note}" for note in log.notes]
    if log.noise:
        shown = "; ".join(f"line {line}: {text!r}" for line, text in log.noise_shown)
        notes.append(
            f"{log.path}: {log.noise} line(s) that are not steps, printed arrays or window "
            f"means were ignored (first: {shown})"
        )
    printing = sum(1 for blocks in log.blocks if blocks)
    if 0 < printing < micro:
        notes.append(f"{log.path}: weights are printed after {printing} of {micro} steps")
    return notes
