"""Golden files: a recorded run kept as a small, reviewable JSON file instead of a run directory.

Per update a golden holds the window loss, per tensor the summaries of the weights and gradients
(`summaries`: norm, distance moved, sketch), the run's own noise against its float64 reference
(and the reference's loss and summaries), the learning rate, step counts, sample digests, the
initial weights' fingerprints, the config and the environment. Its `environment_key` (device
kind, dtype, world size, torch major.minor) names the environment whose bits it holds: a run from
another environment is refused. Non-finite numbers are refused, when writing and when reading.
This module reads and writes the format; `judge.golden` makes goldens and judges against them.
See docs/FORMAT.md, "Golden files".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadInput, shown, stated_version
from ..paths import is_stream
from . import jsonfile
from .golden_schema import THRESHOLDS, check_golden
from .layout import is_run_dir
from .model import Run, TensorInfo

# version 2 keeps each weight's drift and the clips' series; a version 1 file reads as it was
FORMAT, VERSION, READ = "gradalign-golden", 2, (1, 2)
MAX_BYTES = 64 << 20  # a golden is kilobytes; anything this large is not one
CANDIDATE = ".candidate.json"  # a golden proposed by a failing check, beside its reports
SERIES = ("lr", "optimizer_steps", "state_step", "loss_scale", "grad_norm_pre_clip", "clip_calls")


def looks_golden(path: Path) -> bool:
    """Whether `path` is a regular file whose head names this format (never a pipe, which
    would be waited on forever)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as handle:
            return f'"{FORMAT}"'.encode() in handle.read(1 << 16)
    except OSError:
        return False


def environment_key(env: dict[str, Any]) -> str:
    """The environment that decides a run's bits: device kind, dtype (and autocast's), world
    size, torch major.minor; e.g. 'cpu-float32-ws1-torch2.13'. It names golden files, so it
    holds only letters, digits, '.', '_' and '-', whatever a (hand-edited) manifest says."""
    device = str(env.get("device") or "cpu").split(":")[0]
    if device != "cpu" and env.get("gpu"):
        device += "-" + re.sub(r"[^a-z0-9]+", "-", str(env["gpu"]).lower()).strip("-")
    dtype = str(env.get("dtype") or "float32")
    compute = str(env.get("compute_dtype") or dtype)
    version = re.match(r"(\d+)\.(\d+)", str(env.get("torch") or ""))
    torch = f"{version[1]}.{version[2]}" if version else "none"
    precision = dtype if compute == dtype else f"{dtype}-{compute}"
    world = env.get("world_size")
    world = world if isinstance(world, int) and not isinstance(world, bool) and world else 1
    key = f"{device}-{precision}-ws{world}-torch{torch}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key)  # a file name: a manifest's "../" names no dir


def hex64(value: int) -> str:
    """An int64 digest as 16 hex digits (JSON readers that use doubles keep it exact)."""
    return f"{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def int64(text: str) -> int:
    value = int(text, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def _format(value: Any, indent: int) -> str:
    """JSON with one key per line and lists of numbers or strings on one line: reviewable."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {_format(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [f"{inner}{_format(v, indent + 2)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value, allow_nan=False, separators=(", ", ": "))


def dumps(golden: dict[str, Any]) -> str:
    """The file's text: deterministic for the same content."""
    try:
        return _format(golden, 0) + "\n"
    except ValueError:
        raise BadInput("a golden file must hold finite numbers; this one has NaN or Inf") from None


def load(path: Path) -> dict[str, Any]:
    """Read and check a golden file: its format, its shape and that every number is finite."""
    text = ""
    try:
        if path.is_file() and path.stat().st_size > MAX_BYTES:
            raise BadInput(f"{path}: over 64 MiB; not a golden file")
        if is_stream(path):
            raise BadInput(f"{path}: not a regular file (a device or a pipe); not a golden file")
        text = path.read_text(encoding="utf-8")
        data = jsonfile.loads(text)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such golden file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the golden file ({exc})") from None
    except jsonfile.DuplicateKey as exc:  # a merge gone wrong: which value counts is a guess
        raise BadInput(f"{path}: not a valid golden file: {exc}; keep one") from None
    except RecursionError:  # named: the command line's last resort says only what happened
        raise BadInput(f"{path}: not a valid golden file (nested too deeply to read)") from None
    except ValueError as exc:  # JSONDecodeError, NaN, Infinity, a number of 4300+ digits
        if "int_max_str_digits" in str(exc):
            raise BadInput(
                f"{path}: not a valid golden file (a number of thousands of digits)"
            ) from None
        why = "; NaN and Inf are refused" if re.search(r"NaN|Infinity", str(exc)) else ""
        if re.search(r"^(<{7}|>{7}) ", text, re.MULTILINE):
            why = (
                "; it holds a merge's conflict markers (<<<<<<<, >>>>>>>): keep one side, or "
                "write it again with `gradalign golden write`"
            )
        raise BadInput(f"{path}: not a valid golden file ({exc}){why}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput(f'{path}: not a gradalign golden file (no "format": "{FORMAT}")')
    version = data.get("format_version")
    if isinstance(version, bool) or version not in READ:  # `true` equals 1 in Python
        raise BadInput(
            f"{path}: the golden file {stated_version(version)}; this gradalign reads "
            + " and ".join(map(str, READ))
        )
    check_golden(data, str(path))
    bad = first_non_finite(data)
    if bad is not None:
        raise BadInput(
            f"{path}: {shown(bad)} is not a finite number; a golden must hold finite numbers"
        )
    if data["environment_key"] != environment_key(data["environment"]):
        raise BadInput(
            f"{path}: environment_key {shown(data['environment_key'])} does not match its "
            f"environment ({environment_key(data['environment'])!r}): edited by hand? rewrite it "
            "with `gradalign golden write`"
        )
    return data


def first_non_finite(value: Any, where: str = "") -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return where or "a value"
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        found = first_non_finite(item, f"{where}.{key}" if not key.startswith("[") else where + key)
        if found:
            return found
    return None


def _series(data: dict, key: str, dtype: type) -> np.ndarray | None:
    values = data["series"].get(key)
    if values is None:
        return None
    if key in THRESHOLDS:  # null: no clip of that kind at that update
        values = [math.nan if v is None else v for v in values]
    return np.asarray(values, dtype=dtype)


def as_runs(data: dict[str, Any], source: str) -> tuple[Run, Run | None]:
    """The golden as the judge's runs: its own (K=1, window series only, no tensors) and, when it
    recorded one, its float64 reference's losses. Tensors are judged from the summaries."""
    tensors = [
        TensorInfo(t["name"], tuple(t["shape"]), t["dtype"], t.get("kind", "param"))
        for t in data["tensors"]
    ]
    samples = data["series"].get("window_samples")
    prints = data.get("init_fingerprints")
    run = Run(
        source=source,
        kind="golden",
        accum_steps=1,
        updates=data["updates"],
        micro_loss=np.asarray(data["series"]["window_loss"], dtype=np.float64),
        tensors=tensors,
        micro_items=_series(data, "window_items", np.float64),
        micro_samples=_series(data, "window_rows", np.int64),
        micro_data=None if samples is None else np.array([int64(s) for s in samples], np.int64),
        init_state=None if prints is None else np.array([int64(s) for s in prints], np.int64),
        lr=_series(data, "lr", np.float64),
        optimizer_steps=_series(data, "optimizer_steps", np.int64),
        state_step=_series(data, "state_step", np.int64),
        loss_scale=_series(data, "loss_scale", np.float64),
        grad_norm_pre_clip=_series(data, "grad_norm_pre_clip", np.float64),
        clip_calls=_series(data, "clip_calls", np.int64),
        clip_max_norm=_series(data, "clip_max_norm", np.float64),
        clip_value=_series(data, "clip_value", np.float64),
        config=data["config"],
        environment=data["environment"],
        model_facts=data.get("model") or {},
        optimizer_settings=data.get("optimizer"),
        grad_dtype=data.get("grad_dtype"),
    )
    ref_loss = data["series"].get("reference_window_loss")
    if ref_loss is None:
        return run, None
    ref_dtype = data.get("reference_dtype") or "float64"
    reference = Run(
        source=f"{source} (its {ref_dtype} reference)",
        kind="golden",
        accum_steps=1,
        updates=data["updates"],
        micro_loss=np.asarray(ref_loss, dtype=np.float64),
        # a rerun in its own dtype: it computed in it (float64, or float32 without autocast)
        tensors=[TensorInfo(t.name, t.shape, ref_dtype, t.kind) for t in tensors],
        environment={"dtype": ref_dtype},
    )
    return run, reference


def not_a_run(path: Path) -> None:
    """Refuse a run directory given where a golden file (or a folder of them) is expected."""
    if is_run_dir(path):
        raise BadInput(f"{path}: a run directory, not a golden file or a folder of them")


def find(path: Path, key: str) -> tuple[Path, dict[str, Any]]:
    """The golden for environment `key`: `path` itself, or in a directory `<key>.json` or any
    golden file whose key matches. Another environment is refused, never judged."""
    hint = "record one here: `gradalign baseline ...` then `gradalign golden write BASELINE`"
    not_a_run(path)
    if path.is_dir():
        named = path / f"{key}.json"
        others = [p for p in sorted(path.glob("*.json")) if not p.name.endswith(CANDIDATE)]
        held, found = [], []
        for file in [named, *(p for p in others if p != named)]:
            try:
                data = load(file)
            except BadInput:
                if file == named and file.exists():
                    raise  # the golden named for this environment is broken: say so
                continue
            if data["environment_key"] == key:
                found.append((file, data))
            else:
                held.append(shown(data["environment_key"], 40))
        if len(found) > 1:  # which one judges would be the order of their names
            names = ", ".join(file.name for file, _ in found[:4])
            raise BadInput(
                f"{path} holds {len(found)} goldens for this environment ({key}): {names}; "
                "keep one per environment (a directory per experiment), or name the file"
            )
        if found:
            return found[0]
        have = ", ".join(sorted(set(held))) or "none"
        raise BadInput(
            f"no golden for this environment ({key}) in {path} (it holds: {have}); {hint}"
        )
    data = load(path)
    if data["environment_key"] != key:
        raise BadInput(
            f"no golden for this environment: the run is {key}, {path} is for "
            f"{shown(data['environment_key'])}; {hint}"
        )
    return path, data
