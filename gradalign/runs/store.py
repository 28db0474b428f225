"""The run directory: the only contract between the recording side and the judging side.

A run is staged in a hidden sibling directory and renamed into place when complete, so an
interrupted run is never readable as a finished one, and a previous run at the same path stays
intact until then.
Every data file's SHA-256 is in the manifest and is checked on read. See docs/FORMAT.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import BadInput
from . import tensorfile
from .model import Run, TensorInfo, Tensors

FORMAT = "gradalign-run"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SERIES = "series.safetensors"


def weights_file(update: int | None) -> str:
    """Relative path of the weight snapshot after `update` (None: the initial weights)."""
    return (
        "weights/init.safetensors" if update is None else f"weights/update_{update:06d}.safetensors"
    )


def grads_file(update: int) -> str:
    """Relative path of the accumulated gradient recorded just before optimizer step `update`."""
    return f"grads/update_{update:06d}.safetensors"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_atomic(path: Path, data: bytes, durable: bool = False) -> None:
    """Write via a temporary name and rename. Data files skip fsync: the manifest's checksums
    already expose a file that a crash left short, so only the manifest itself is synced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


def is_run_dir(path: Path) -> bool:
    """True when `path` holds a manifest that names this format."""
    try:
        return json.loads((path / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def ensure_writable(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse a path that holds something other than a run (or an empty directory)."""
    path = Path(out_dir)
    if path.exists() and not (path.is_dir() and _replaceable(path)):
        raise BadInput(f"{path} exists and is not a gradalign run; refusing to overwrite it")
    return path


class RunWriter:
    """Writes one run directory: data files first, then the manifest, then an atomic rename."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.final = ensure_writable(out_dir)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir()
        self.checksums: dict[str, str] = {}

    def write_tensors(self, relpath: str, tensors: Tensors) -> None:
        data = tensorfile.encode(tensors)
        _write_atomic(self.staging / relpath, data)
        self.checksums[relpath] = _sha256(data)

    def finish(self, manifest: dict, series: Tensors) -> Path:
        """Write the series and the manifest, then move the run into place."""
        self.write_tensors(SERIES, series)
        body = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
        body["files"] = dict(sorted(self.checksums.items()))
        text = json.dumps(body, indent=2, sort_keys=True, allow_nan=False) + "\n"
        _write_atomic(self.staging / MANIFEST, text.encode(), durable=True)
        old = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.staging, self.final)
        if old.exists():
            shutil.rmtree(old)
        return self.final

    def abort(self) -> None:
        """Drop the staged files; whatever stood at the final path stays untouched."""
        shutil.rmtree(self.staging, ignore_errors=True)


def _replaceable(path: Path) -> bool:
    return is_run_dir(path) or not any(path.iterdir())


def _field(manifest: dict, key: str, kind: type, where: str):
    value = manifest.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadInput(f"{where}: manifest field {key!r} is missing or not {kind.__name__}")
    return value


def read_manifest(path: Path) -> dict:
    """Load and sanity-check a run's manifest."""
    if not path.exists():
        raise BadInput(f"{path}: no such run directory")
    if not path.is_dir():
        raise BadInput(f"{path}: not a run directory")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: not a gradalign run (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise BadInput(f"{path}: {MANIFEST} is unreadable or not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInput(f"{path}: {MANIFEST} does not describe a {FORMAT}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BadInput(f"{path}: format version {version!r}; this gradalign reads {FORMAT_VERSION}")
    return manifest


def _verified(path: Path, relpath: str, checksums: dict[str, str]) -> Tensors:
    if relpath not in checksums:
        raise BadInput(f"{path}: {relpath} is not listed in the manifest")
    try:
        blob = (path / relpath).read_bytes()
    except OSError:
        raise BadInput(f"{path}: {relpath} is missing") from None
    if _sha256(blob) != checksums[relpath]:
        raise BadInput(f"{path}: {relpath} fails its checksum (truncated or altered)")
    return tensorfile.decode(blob, f"{path / relpath}")


def _model_facts(value: object, where: str) -> dict:
    if value is None:
        return {}
    lists = isinstance(value, dict) and all(
        isinstance(value.get(key, []), list) for key in ("batchnorm", "dropout")
    )
    if not lists:
        raise BadInput(f"{where}: manifest field 'model' is malformed")
    return value


def _reference(value: object, path: Path, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadInput(f"{where}: manifest field 'reference' must be a path")
    return os.path.normpath(path / value)


def read_run_dir(path: str | os.PathLike[str]) -> Run:
    """Open a run directory for judging; each file's checksum is verified when it is read."""
    path = Path(path)
    manifest = read_manifest(path)
    where = str(path)
    checksums = _field(manifest, "files", dict, where)
    for relpath in checksums:
        parts = Path(relpath).parts
        if Path(relpath).is_absolute() or ".." in parts or not parts:
            raise BadInput(f"{where}: manifest lists a file outside the run: {relpath!r}")
    missing = sorted(rel for rel in checksums if not (path / rel).is_file())
    if missing:
        raise BadInput(f"{where}: {len(missing)} data file(s) missing, first {missing[0]}")
    k = _field(manifest, "accum_steps", int, where)
    updates = _field(manifest, "updates", int, where)
    if k < 1 or updates < 0:
        raise BadInput(f"{where}: manifest has accum_steps={k}, updates={updates}")
    try:
        tensors = [
            TensorInfo(t["name"], tuple(t["shape"]), t["dtype"], t.get("kind", "param"))
            for t in _field(manifest, "tensors", list, where)
        ]
    except (TypeError, KeyError):
        raise BadInput(f"{where}: manifest field 'tensors' is malformed") from None
    series = _verified(path, SERIES, checksums)
    loss = series.get("micro/loss")
    if loss is None or loss.shape != (updates * k,):
        raise BadInput(f"{where}: series holds no micro/loss of {updates * k} values")

    def optional(name: str, rows: int) -> np.ndarray | None:
        value = series.get(name)
        if value is not None and value.shape[:1] != (rows,):
            raise BadInput(f"{where}: series {name} has shape {value.shape}, expected {rows} rows")
        return value

    expected = {t.name: t.shape for t in tensors}

    def loader(fn, names: dict[str, tuple[int, ...]]):
        def load(update=None) -> Tensors:
            relpath = fn(update)
            data = _verified(path, relpath, checksums)
            for name, shape in names.items():
                if name not in data or data[name].shape != shape:
                    found = "missing" if name not in data else f"shape {data[name].shape}"
                    raise BadInput(f"{where}: {relpath}: tensor {name} {list(shape)} is {found}")
            return data

        return load

    params = {t.name: t.shape for t in tensors if t.kind == "param"}
    p = len(tensors)
    for key in ("init/state", "micro/state", "update/state"):
        value = series.get(key)
        if value is not None and value.shape[-1:] != (p,):
            raise BadInput(f"{where}: series {key} has shape {value.shape}, expected {p} columns")

    has_grads = all(grads_file(i) in checksums for i in range(updates)) and updates > 0
    micro_state = optional("micro/state", updates * k)
    return Run(
        source=where,
        kind="run-dir",
        accum_steps=k,
        updates=updates,
        micro_loss=loss.astype(np.float64),
        tensors=tensors,
        micro_items=optional("micro/items", updates * k),
        micro_data=optional("micro/data", updates * k),
        full_weights=True,
        init_state=series.get("init/state"),
        micro_state=micro_state,
        micro_state_known=None if micro_state is None else np.ones(updates * k, dtype=bool),
        update_state=optional("update/state", updates),
        lr=optional("update/lr", updates),
        optimizer_steps=optional("update/optimizer_steps", updates),
        state_step=optional("update/state_step", updates),
        grad_norm_pre_clip=optional("update/grad_norm_pre_clip", updates),
        loss_scale=optional("update/loss_scale", updates),
        config=manifest.get("config") or {},
        environment=manifest.get("environment") or {},
        fault=manifest.get("fault"),
        model_facts=_model_facts(manifest.get("model"), where),
        reference=_reference(manifest.get("reference"), path, where),
        grad_dtype=manifest.get("grad_dtype")
        if isinstance(manifest.get("grad_dtype"), str)
        else None,
        load_init_weights=loader(lambda _: weights_file(None), expected),
        load_weights=loader(weights_file, expected),
        load_grads=loader(grads_file, params) if has_grads else None,
    )
