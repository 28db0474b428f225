"""A golden file's schema: every field's type, length and range, checked before anything is read
from it. A golden is data from a repository (a hand edit, a merge): a wrong field must be a
one-line error that names it, never an exception deep inside the judge."""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import BadInput, shown
from .schema import (
    MAX_MICRO_STEPS,
    _check_tensors,
    check_optimizer,
    compute_dtype_error,
    is_int,
)
from .summaries import SKETCH_SIZE

HEX16 = re.compile(r"^[0-9a-f]{16}$")
NUMERIC_SERIES = (
    "window_loss",
    "reference_window_loss",
    "window_items",
    "lr",
    "loss_scale",
    "grad_norm_pre_clip",
)
COUNTS = {
    "optimizer_steps": 0,
    "state_step": -1,
    "clip_calls": 0,
    "window_rows": 0,
}  # whole, and the least each
# per update a clip's threshold, null where the run called none (NaN in a run; a threshold of
# inf, which clips nothing, is kept as null too: the judge compares finite thresholds alone)
THRESHOLDS = ("clip_max_norm", "clip_value")
DRIFTS = ("drift", "explained")  # optional in a weight's summary (judge/golden.py `_keep_drift`)


def _number(value: Any) -> bool:
    """A JSON number the judge's float arrays hold: an integer beyond int64 (2**70) made numpy
    an array of Python objects, and np.isfinite raised TypeError on it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return -(2**63) <= value < 2**63 if isinstance(value, int) else math.isfinite(value)


# Summaries stay below this, so that the judge's sums and multiples of them (a noise times
# noise_factor) stay finite: an allowed bound that overflowed to inf passed anything.
LARGEST = 1e300


def _size(value: Any) -> bool:
    """A norm, a distance moved, a noise: a number from 0 to LARGEST."""
    return _number(value) and 0 <= value <= LARGEST


def _numbers(value: Any, length: int | None = None) -> bool:
    ok = isinstance(value, list) and all(_number(v) for v in value)
    return ok and (length is None or len(value) == length)


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_golden(data: dict, where: str) -> None:
    """Raise BadInput naming the first field that is missing, malformed or out of range."""

    def bad(field: str, what: str) -> BadInput:
        return BadInput(f"{where}: golden field {field!r} {what}")

    for key in ("environment", "config", "series"):
        if not isinstance(data.get(key), dict):
            raise bad(key, "is missing or not an object")
    if not isinstance(data.get("environment_key"), str):
        raise bad("environment_key", "is missing or not a string")
    for field in ("device", "gpu", "dtype", "compute_dtype", "torch"):  # the key reads them
        value = data["environment"].get(field)
        if value is not None and not isinstance(value, str):
            raise bad(f"environment.{field}", f"must be a string, got {shown(value)}")
    if (why := compute_dtype_error(data["environment"].get("compute_dtype"))) is not None:
        raise bad("environment.compute_dtype", why)
    world = data["environment"].get("world_size")
    if world is not None and not (isinstance(world, int) and not isinstance(world, bool)):
        raise bad("environment.world_size", f"must be an integer, got {shown(world)}")
    n = data.get("updates")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_MICRO_STEPS:
        raise bad("updates", f"must be an integer >= 1, got {shown(n)}")
    k = data.get("recorded_accum_steps")  # K of the run it was written from (a merged one: K > 1)
    if not is_int(k) or not 1 <= k <= MAX_MICRO_STEPS:
        raise bad("recorded_accum_steps", f"must be an integer >= 1 (K), got {shown(k)}")
    _check_tensors(data.get("tensors"), bad)
    for field in ("grad_dtype", "reference_dtype"):
        if data.get(field) is not None and not isinstance(data[field], str):
            raise bad(field, "must be a string or null")
    if data.get("reference_dtype") not in (None, *FLOAT_DTYPES):
        raise bad("reference_dtype", f"must be one of {', '.join(FLOAT_DTYPES)}, or null")
    source = data.get("source")
    if not (isinstance(source, dict) and isinstance(source.get("run"), str)):
        raise bad("source", "must be {run: the path it was written from, ...}")
    model = data.get("model")
    if model is not None and not (
        isinstance(model, dict)
        and all(isinstance(model.get(k, []), list) for k in ("batchnorm", "dropout"))
    ):
        raise bad("model", "must be {batchnorm: [names], dropout: [names]}")
    check_optimizer(data.get("optimizer"), len(data["tensors"]), bad)
    _check_series(data["series"], n, bad)
    _check_loss_noise(data["series"], bad)
    names = [t["name"] for t in data["tensors"]]
    prints = data.get("init_fingerprints")
    if prints is not None and not (
        isinstance(prints, list)
        and len(prints) == len(names)
        and all(isinstance(p, str) and HEX16.match(p) for p in prints)
    ):
        raise bad("init_fingerprints", f"must be {len(names)} strings of 16 hex digits, or null")
    per_update = data.get("per_update")
    if not isinstance(per_update, list) or len(per_update) != n:
        raise bad("per_update", f"must be a list of {n} entries")
    sizes = {t["name"]: math.prod(t["shape"]) for t in data["tensors"]}
    params = {t["name"] for t in data["tensors"] if t.get("kind", "param") == "param"}
    calibrated = "reference_window_loss" in data["series"]
    size = data.get("sketch_size", SKETCH_SIZE)
    if not is_int(size) or size != SKETCH_SIZE:  # the judge projects the run onto these d
        raise bad(
            "sketch_size", f"must be {SKETCH_SIZE} (the projections judged), got {shown(size)}"
        )
    for i, entry in enumerate(per_update):
        if not isinstance(entry, dict) or not isinstance(entry.get("weights"), dict):
            raise bad(f"per_update[{i}]", "must be an object with weights")
        if not is_int(entry.get("update")) or entry["update"] != i:
            got = shown(entry.get("update"))
            raise bad(f"per_update[{i}].update", f"must be {i} (updates in order), got {got}")
        if sorted(entry["weights"]) != sorted(names):
            raise bad(f"per_update[{i}].weights", "must summarize every tensor")
        grads = entry.get("grads", {})
        if not isinstance(grads, dict) or not set(grads) <= params:
            raise bad(f"per_update[{i}].grads", "must summarize parameters only")
        for kind, found, moved in (("weights", entry["weights"], True), ("grads", grads, False)):
            for name, item in found.items():
                field = f"per_update[{i}].{kind}.{shown(name)}"
                expected = min(size, sizes[name])
                _check_summary(item, field, expected, moved, calibrated, bad)


def _check_series(series: dict, n: int, bad) -> None:
    if "window_loss" not in series:
        raise bad("series.window_loss", "is missing")
    for key, values in series.items():
        if key == "window_samples":
            ok = isinstance(values, list) and len(values) == n
            if not ok or not all(isinstance(v, str) and HEX16.match(v) for v in values):
                raise bad("series.window_samples", f"must be {n} strings of 16 hex digits")
        elif key in COUNTS:  # read as int64: 1.9 steps was read as 1 and judged identical
            least = COUNTS[key]
            ok = isinstance(values, list) and len(values) == n
            if not ok or not all(is_int(v) and least <= v < 2**63 for v in values):
                raise bad(f"series.{key}", f"must be a list of {n} whole numbers >= {least}")
        elif key == "window_items":  # a count's weight: none below 0
            if not _numbers(values, n) or not all(0 <= v <= LARGEST for v in values):
                raise bad(f"series.{key}", f"must be a list of {n} numbers from 0 to {LARGEST:g}")
        elif key in NUMERIC_SERIES:
            if not _numbers(values, n) or not all(abs(v) <= LARGEST for v in values):
                raise bad(f"series.{key}", f"must be a list of {n} numbers within +-{LARGEST:g}")
        elif key in THRESHOLDS:
            ok = isinstance(values, list) and len(values) == n
            if not ok or not all(v is None or _size(v) for v in values):
                raise bad(f"series.{key}", f"must be a list of {n} numbers from 0 (or null)")
        else:
            raise bad(f"series.{shown(key)}", "is not a series gradalign knows")


# the most a reference's window loss stands from the baseline's, as a share of the largest
# loss either holds: a rerun of the same training, not another (measured: float32 against float64
# 1e-7 of it, bfloat16 autocast against float32 about 1e-2)
LOSS_APART = 0.5


def _check_loss_noise(series: dict, bad) -> None:
    """The baseline's loss noise against its reference, |window_loss - reference_window_loss|,
    widens the losses' allowed error: a series edited by hand (every loss -1, or one 5 higher)
    passed a merged run whose loss was K times too large. Refused where the two stand further
    apart than LOSS_APART of the largest loss either holds."""
    ref = series.get("reference_window_loss")
    if ref is None:
        return
    pairs = list(zip(series["window_loss"], ref, strict=True))
    scale = max(max(abs(b), abs(r)) for b, r in pairs)
    far = next((u for u, (b, r) in enumerate(pairs) if abs(b - r) > LOSS_APART * scale), None)
    if far is not None:
        b, r = pairs[far]
        raise bad(
            "series.window_loss",
            f"stands {abs(b - r):.3g} from the reference's at update {far} ({b:.6g} against "
            f"{r:.6g}), more than a rerun of the same training parts from it{_EDITED}",
        )


def _check_summary(item: Any, field: str, size: int, moved: bool, calibrated: bool, bad) -> None:
    """One tensor's summary: norm, sketch of `size` values, moved (weights), and with a reference
    the reference's summary and the noise."""
    if not isinstance(item, dict) or not _size(item.get("norm")):
        raise bad(field, f"must be an object with a norm (a number from 0 to {LARGEST:g})")
    sketch = item.get("sketch")
    if not _numbers(sketch, size) or not all(abs(v) <= LARGEST for v in sketch):
        raise bad(f"{field}.sketch", f"must be a list of {size} numbers within +-{LARGEST:g}")
    if moved and not _size(item.get("moved")):
        raise bad(f"{field}.moved", f"must be a number from 0 to {LARGEST:g}")
    if calibrated:
        if not _size(item.get("noise")):
            what = f"must be a number from 0 to {LARGEST:g} (the golden has a reference)"
            raise bad(f"{field}.noise", what)
        _check_summary(item.get("reference"), f"{field}.reference", size, moved, False, bad)
        for key in DRIFTS if moved else ():  # a weight's noise-dominated walk, where not 0
            if key in item and not _size(item[key]):
                raise bad(f"{field}.{key}", f"must be a number from 0 to {LARGEST:g}")
    _check_consistent(item, field, calibrated, bad)


_SLACK = 1e-6  # float64 rounding of norms and sketches summed over millions of elements
_EDITED = "; edited by hand? rewrite it with `gradalign golden write`"


def _check_consistent(item: dict, field: str, calibrated: bool, bad) -> None:
    """Numbers that cannot come from one tensor: a norm shorter than its own sketch (projections
    onto orthonormal directions), and with a reference a norm or sketch farther from the
    reference's than the noise ||x - ref||, or a noise longer than both norms together."""
    norm = item["norm"]
    sketch = math.hypot(*item["sketch"])
    if sketch > norm + _SLACK * (norm + sketch):
        what = f"is {norm:.6g}, less than the length of its own sketch ({sketch:.6g})"
        raise bad(f"{field}.norm", what + _EDITED)
    if not calibrated:
        return
    ref, noise = item["reference"], item["noise"]
    slack = _SLACK * (norm + ref["norm"])
    apart = abs(norm - ref["norm"])
    if apart > noise + slack:
        what = (
            f"is {norm:.6g}, {apart:.3g} from its reference's ({ref['norm']:.6g}): more than the "
            f"noise between them ({noise:.3g}) allows"
        )
        raise bad(f"{field}.norm", what + _EDITED)
    sketches = math.dist(item["sketch"], ref["sketch"])
    if sketches > noise + slack:
        what = f"is {noise:.3g}, less than its sketch's distance from the reference's "
        what += f"({sketches:.3g})"
        raise bad(f"{field}.noise", what + _EDITED)
    if noise > norm + ref["norm"] + slack:
        what = f"is {noise:.3g}, more than its norm and its reference's together"
        raise bad(f"{field}.noise", what + _EDITED)
