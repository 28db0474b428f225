"""Reading a run directory for the judge: the manifest checked, each data file checksummed as it
is read (streamed, so memory stays bounded by one file's tensors). See docs/FORMAT.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import BadInput, shown, stated_version
from ..paths import is_stream
from . import jsonfile
from .checksums import declared as declared_checksum
from .discarded import drop_discarded
from .layout import FORMAT, FORMAT_VERSION, JOURNAL, MANIFEST, SERIES, grads_file, weights_file
from .model import Run, TensorInfo, Tensors
from .ranks import rank_counts, read_ranks
from .schema import check_manifest
from .sketched import attach_sketches
from .store import FINGERPRINTS, Store

MAX_MANIFEST = 64 << 20


def read_manifest(path: Path) -> dict:
    """Load and sanity-check a run's manifest."""
    if not path.exists():
        raise BadInput(f"{path}: no such run directory")
    if not path.is_dir():
        raise BadInput(f"{path}: not a run directory")
    try:
        if (path / MANIFEST).stat().st_size > MAX_MANIFEST:
            raise BadInput(f"{path}: {MANIFEST} is over 64 MiB; not a manifest")
        if is_stream(path / MANIFEST):  # a pipe would block the read forever
            raise BadInput(f"{path}: {MANIFEST} is not a regular file (a device or a pipe)")
        manifest = jsonfile.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: not a gradalign run (no {MANIFEST})") from None
    except RecursionError:
        raise BadInput(f"{path}: {MANIFEST} is nested too deeply") from None
    except jsonfile.DuplicateKey as exc:  # a hand edit: which value counts is anyone's guess
        raise BadInput(f"{path}: {MANIFEST}: {exc}; keep one") from None
    except jsonfile.NotStrict as exc:  # what allow_nan=False never writes
        raise BadInput(f"{path}: {MANIFEST}: {exc} (docs/FORMAT.md: finite numbers only)") from None
    except (OSError, ValueError):  # not JSON, not UTF-8, a number of 5000 digits
        raise BadInput(f"{path}: {MANIFEST} is unreadable or not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInput(f"{path}: {MANIFEST} does not describe a {FORMAT}")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # True == 1 in Python
        raise BadInput(
            f"{path}: {MANIFEST} {stated_version(version)}; this gradalign reads {FORMAT_VERSION}"
        )
    check_manifest(manifest, str(path))
    return manifest


def _reference(value: str | None, path: Path) -> str | None:
    """The manifest's reference, relative to the run where it really is: a run reached through
    a link (`runs/base -> /data/base`) names `../base-fp64` beside /data/base, not beside the
    link (`..` resolved beside the link lost the reference, and the runs were judged without
    it)."""
    if value is None:
        return None
    real = os.path.realpath(path)
    return os.path.normpath(os.path.join(real if real != os.path.abspath(path) else path, value))


def _finish_interrupted_commits(parent: Path) -> None:
    """A set of runs whose commit a kill cut short is finished before any member is read.

    A reader rolls it forward rather than refusing or reading around it: the journal is the
    killed writer's commit point, every new run it names is complete, and reading on would judge
    a mix of old and new members. It is safe for a read-only command because recovery acts only
    on a journal gradalign wrote (its own area, with gradalign's marker; plain member names),
    moves runs only by renames between that area and the members' paths, deletes only the area
    (the runs the commit replaced), and leaves any other journal alone (runs/runset.py)."""
    if not any(parent.glob(JOURNAL.format(pid="*"))):
        return
    from .runset import recover_commits

    try:
        recover_commits(parent)
    except OSError as exc:
        raise BadInput(
            f"{parent}: a gradalign process was killed while putting runs in place and this "
            f"process cannot finish it ({exc.strerror}); run any gradalign command there with "
            "write access"
        ) from None


# series of one int64 column per tensor: fingerprints, and the Recorder's counter of writes
PER_TENSOR = (
    *("init/state", "micro/state", "update/state", "micro/grad_state"),
    *("micro/grad_writes", "update/grad_state"),
)


def read_run_dir(path: str | os.PathLike[str]) -> Run:
    """Open a run directory for judging; each file's checksum is verified when it is read."""
    path = Path(path)
    _finish_interrupted_commits(path.parent)
    manifest = read_manifest(path)
    where = str(path)
    checksums = manifest["files"]
    for relpath in checksums:
        parts = Path(relpath).parts
        if Path(relpath).is_absolute() or ".." in parts or not parts:
            raise BadInput(f"{where}: manifest lists a file outside the run: {shown(relpath)}")
    missing = sorted(rel for rel in checksums if not (path / rel).is_file())
    if missing:
        first = path / missing[0]
        what = "missing" if not os.path.lexists(first) else "not regular files"
        if what != "missing" and first.is_symlink():
            what = "links to nowhere or to no regular file"
        raise BadInput(f"{where}: {len(missing)} data file(s) {what}, first {missing[0]}")
    k, updates = manifest["accum_steps"], manifest["updates"]
    tensors = [
        TensorInfo(t["name"], tuple(t["shape"]), t["dtype"], t.get("kind", "param"))
        for t in manifest["tensors"]
    ]
    declared = {t.name: t.dtype for t in tensors}
    fingerprinted = manifest.get("integrity") == FINGERPRINTS
    store = Store(path, checksums, declared, fingerprinted, declared_checksum(manifest))
    series = store.read_all(SERIES)

    def optional(name: str, rows: int) -> np.ndarray | None:
        value = series.get(name)
        if value is not None:
            _check_shape(where, name, value, _series_shape(name, rows, len(tensors), value))
        return value

    sizes = optional("update/micro_steps", updates)
    if sizes is not None and (sizes.ndim != 1 or (sizes < 0).any()):
        raise BadInput(f"{where}: series update/micro_steps must hold counts >= 0")
    unclosed = manifest.get("unclosed_micro_steps", 0)
    micro = (updates * k if sizes is None else int(sizes.sum())) + unclosed
    loss = series.get("micro/loss")
    if loss is None or loss.shape != (micro,) or loss.dtype.kind != "f":
        raise BadInput(f"{where}: series holds no micro/loss of {micro} floating values")

    expected = {t.name: t.shape for t in tensors}

    def loader(fn, names: dict[str, tuple[int, ...]]):
        def load(update=None) -> Tensors | None:
            """An update's tensors; None where the run keeps none (a skipped step, a sketch)."""
            relpath = fn(update)
            return store.tensors(relpath, names) if relpath in checksums else None

        return load

    params = {t.name: t.shape for t in tensors if t.kind == "param"}
    load_grads = loader(grads_file, params)
    p = len(tensors)
    for key in PER_TENSOR:
        value = series.get(key)
        if value is not None and value.shape[-1:] != (p,):
            raise BadInput(f"{where}: series {key} has shape {value.shape}, expected {p} columns")
    for key in (*PER_TENSOR, "micro/data", "micro/pairs"):  # 64-bit sums: fewer bits differ
        value = series.get(key)
        if value is not None and value.dtype != np.int64:
            raise BadInput(
                f"{where}: series {key} is {value.dtype}; the format keeps it as I64 "
                "(64-bit wrapping sums, docs/FORMAT.md)"
            )

    if manifest.get("record", "full") == "full":
        unlisted = [f for f in map(weights_file, [None, *range(updates)]) if f not in checksums]
        if unlisted:
            raise BadInput(f"{where}: {unlisted[0]} is not listed in the manifest")
    stray = [f for f in map(grads_file, range(updates)) if f not in checksums]
    stray = [f for f in stray if (store.path / f).exists()]
    if stray:  # a gradient the run wrote and the manifest disowns: never judged, so refused
        raise BadInput(f"{where}: {stray[0]} is in the run but not listed in the manifest")
    has_grads = any(grads_file(i) in checksums for i in range(updates))
    load_rank = store.read_all  # each rank's series, its checksum checked
    ranks, distributed = read_ranks(manifest, where, load_rank, series, micro, updates, p)
    series = {**series, **rank_counts(ranks, series)}  # any rank's bookkeeping counts
    micro_state = optional("micro/state", micro)
    items = optional("micro/items", micro)
    if items is not None and not (np.isfinite(items).all() and (items >= 0).all()):
        raise BadInput(f"{where}: series micro/items holds a count that is negative or not finite")
    if store.fingerprinted:
        _expect_fingerprints(store, series, tensors, updates)
    run = Run(
        source=where,
        kind="run-dir",
        accum_steps=k,
        updates=updates,
        micro_loss=loss.astype(np.float64),
        tensors=tensors,
        micro_items=optional("micro/items", micro),
        micro_data=optional("micro/data", micro),
        micro_pairs=optional("micro/pairs", micro),
        micro_grad_state=optional("micro/grad_state", micro),
        micro_grad_writes=optional("micro/grad_writes", micro),
        micro_samples=optional("micro/samples", micro),
        micro_step_counts=optional("micro/steps", micro),
        micro_draws=optional("micro/draws", micro),
        scaler_calls=optional("update/scaler_calls", updates),
        clip_calls=optional("update/clip_calls", updates),
        clip_value=optional("update/clip_value", updates),
        clip_max_norm=optional("update/clip_max_norm", updates),
        clips_before_unscale=optional("update/clips_before_unscale", updates),
        zero_grads_inside=optional("update/zero_grads_inside", updates),
        zero_grads_before_step=optional("update/zero_grads_before_step", updates),
        bypassed_forwards=optional("update/bypassed_forwards", updates),
        window_sizes=sizes,
        unclosed_micro_steps=unclosed,
        unclosed_steps=manifest.get("unclosed_steps", 0),
        grads_calls=optional("update/grads_calls", updates),
        full_weights=True,
        init_state=series.get("init/state"),
        micro_state=micro_state,
        micro_state_known=None if micro_state is None else np.ones(micro, dtype=bool),
        update_state=optional("update/state", updates),
        lr=optional("update/lr", updates),
        lr_groups=optional("update/lr_groups", updates),
        optimizer_steps=optional("update/optimizer_steps", updates),
        state_step=optional("update/state_step", updates),
        grad_norm_pre_clip=optional("update/grad_norm_pre_clip", updates),
        loss_scale=optional("update/loss_scale", updates),
        config=manifest.get("config") or {},
        environment=manifest.get("environment") or {},
        fault=manifest.get("fault"),
        model_facts=manifest.get("model") or {},
        optimizer_settings=manifest.get("optimizer"),
        reference=_reference(manifest.get("reference"), path),
        grad_dtype=manifest.get("grad_dtype"),
        load_init_weights=loader(lambda _: weights_file(None), expected),
        load_weights=loader(weights_file, expected),
        load_grads=load_grads if has_grads else None,
        store=store,
        ranks=ranks,
        distributed=distributed,
    )
    discarded = optional("update/discarded_micro_steps", updates)
    if discarded is not None and ((discarded < 0) | (discarded > run.sizes)).any():
        raise BadInput(
            f"{where}: series update/discarded_micro_steps holds a count below 0 or above "
            "its window's micro-steps"
        )
    run = drop_discarded(run, discarded)
    store.loaders = (run.load_init_weights, run.load_weights, run.load_grads)
    attach_sketches(run, manifest, store)
    return run


_PER_TENSOR = {
    *("micro/state", "micro/grad_state", "micro/grad_writes", "update/state", "update/grad_state"),
}


def _series_shape(name: str, rows: int, tensors: int, value: np.ndarray) -> tuple[int, ...]:
    """The shape docs/FORMAT.md gives a series: [rows], [rows, P] per tensor, [rows, 2] for the
    scaler's calls, [rows, G >= 1] for the learning rate of each param group."""
    if name in _PER_TENSOR:
        return rows, tensors
    if name == "update/scaler_calls":
        return rows, 2
    if name == "update/lr_groups":
        return rows, (max(1, value.shape[-1]) if value.ndim else 1)
    return (rows,)


def _check_shape(where: object, name: str, value: np.ndarray, shape: tuple[int, ...]) -> None:
    if value.shape != shape:
        raise BadInput(f"{where}: series {name} has shape {value.shape}, expected {list(shape)}")


def _expect_fingerprints(store: Store, series: Tensors, tensors: list, updates: int) -> None:
    """What each tensor file's tensors must sum to, from the series (docs/FORMAT.md)."""
    names = [t.name for t in tensors]
    params = {t.name for t in tensors if t.kind == "param"}
    rows = {key: series.get(key) for key in ("init/state", "update/state", "update/grad_state")}
    missing = [key for key, value in rows.items() if value is None]
    if missing:
        raise BadInput(
            f"{store.path}: the manifest declares fingerprint integrity, but the series holds "
            f"no {missing[0]}"
        )
    for key, value in rows.items():
        if key == "init/state":
            _check_shape(store.path, key, value, (len(names),))  # type: ignore[arg-type]
        else:
            _check_shape(store.path, key, value, _series_shape(key, updates, len(names), value))  # type: ignore[arg-type]
    store.expected[weights_file(None)] = dict(zip(names, map(int, rows["init/state"]), strict=True))
    for i in range(updates):  # both state series hold `updates` rows: checked above
        store.expected[weights_file(i)] = dict(
            zip(names, map(int, rows["update/state"][i]), strict=True)
        )
        grads = rows["update/grad_state"][i]
        store.expected[grads_file(i)] = {
            n: int(v) for n, v in zip(names, grads, strict=True) if n in params
        }
