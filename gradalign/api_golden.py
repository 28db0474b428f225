"""Golden files through the API: keep a recorded baseline as a small JSON file, judge runs against
it, and accept a run as the new golden (`gradalign golden write|check`, `merged --against`).

    from gradalign import api

    golden = api.golden_write("runs/verify/baseline", "ci/golden/")   # ci/golden/<env key>.json
    outcome = api.golden_check("ci/golden/", "runs/verify/merged")
    print(outcome.comparison.verdict)
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput
from .feedback import Feedback, Silent
from .judge.results import FAIL, Comparison
from .judge.strict import fail_on_warnings
from .paths import is_stream, resolved
from .runs.golden import CANDIDATE, dumps, environment_key, find, load, looks_golden, not_a_run
from .runs.layout import is_run_dir
from .runs.locks import RunLock
from .runs.outputs import check_outputs

PathLike = str | Path


@dataclass
class GoldenCheck:
    """What `golden_check` did: the comparison (None when there was no golden to judge by), the
    golden used, the file written (`--update`) or proposed (a failing check's candidate), and the
    command that accepts the run as the golden."""

    comparison: Comparison | None
    golden: Path
    accept: str
    written: Path | None = None
    candidate: Path | None = None


def is_golden(path: PathLike) -> bool:
    """A golden file, or a directory of them (a run directory is neither)."""
    from .runs.layout import MANIFEST

    p = Path(path)
    if p.is_file():
        return p.suffix == ".json"
    return p.is_dir() and not (p / MANIFEST).exists() and any(p.glob("*.json"))


def _reference(run: Any, reference: PathLike | None, strict: bool) -> Any:
    from .runs.sources import open_reference

    ref, note = open_reference(None if reference is None else str(reference), run)
    if note and strict:
        raise BadInput(f"{note.split(';')[0]}; record it, or pass --reference none")
    return ref


def _target(out: PathLike | None, key: str) -> Path:
    """`out` as a file when it ends in .json or is a file already (written over only where it
    is a golden: `_refuse_to_replace`), else `<out>/<key>.json` (default `golden/`)."""
    out_path = Path("golden" if out is None else out)
    is_file = out_path.suffix == ".json" or (out_path.exists() and not out_path.is_dir())
    return out_path if is_file else out_path / f"{key}.json"


def _write(run: Any, reference: Any, target: Path, inputs: Sequence[Path]) -> Path:
    from .judge.golden import build
    from .report.files import kept_whole
    from .report.output import write_text_atomic
    from .runs.writer import deferred_interrupts

    data = build(run, reference)
    data["source"] = {role: _named(path) for role, path in data["source"].items()}
    check_outputs([], inputs, [target], kind="golden file")
    _refuse_to_replace(target)
    with deferred_interrupts():  # an interrupt after the rename says the golden was replaced
        write_text_atomic(target, dumps(data))
        kept_whole(target)
    return target


def _named(path: str | None) -> str | None:
    """A run as the golden file names it: by its folder's name alone, so the same run gives the
    same bytes however it was named (`base`, `/tmp/x/base`, `sub/../base`) and wherever the
    golden is written, and a committed golden holds no machine's folders."""
    if path is None:
        return None
    return Path(os.path.normpath(path)).name or Path(path).resolve().name


def golden_write(
    run: PathLike, out: PathLike | None = None, *, reference: PathLike | None = None
) -> Path:
    """Keep the recorded `run` (normally a K=1 baseline) and its float64 reference (the one its
    manifest names, or `reference`; "none" for the fixed tolerances) as a golden file at `out`
    (a file ending in .json, else a directory: `<out>/<environment key>.json`; default
    `golden/`)."""
    from .runs.reader import read_run_dir

    base = read_run_dir(Path(run))
    ref = _reference(base, reference, strict=True)
    key = environment_key(base.environment)
    target = _target(out, key)
    _refuse_another_experiment(base, target.parent, key, target)
    inputs = [Path(run), *([Path(ref.source)] if ref is not None else [])]
    return _write(base, ref, target, inputs)


def accept_command(golden: PathLike, run: PathLike) -> str:
    """The exact command that accepts `run` as the golden."""
    return f"gradalign golden check {shlex.quote(str(golden))} {shlex.quote(str(run))} --update"


def candidate_path(golden: Path, run: Path, reports: Sequence[PathLike]) -> Path:
    """Where a failing check proposes the run as the golden: beside the first report, else beside
    the run under test (never inside a run)."""
    name = golden.stem if golden.suffix == ".json" else golden.name
    files = [Path(p) for p in reports if not is_stream(p)]  # /dev/stdout's folder is /dev
    where = files[0].parent if files else resolved(run).parent
    return where / f"{name}{CANDIDATE}"


def _writable(
    candidate: Path | None, inputs: list[Path], reports: Sequence[PathLike] = ()
) -> tuple[Path | None, str]:
    """The candidate where it can be written, else None and why: a convenience a read-only
    workspace goes without (a passing check there exited 2), never written over a report."""
    if candidate is None:
        return None, ""
    if any(resolved(candidate) == resolved(r) for r in reports if not is_stream(r)):
        return None, f"{candidate} is a report's path"
    try:
        check_outputs([], inputs, [candidate], kind="golden file")
    except BadInput as exc:
        return None, str(exc)
    return candidate, ""


def _stale(candidate: Path | None) -> str:
    """Remove a candidate an earlier failing check left where this passing one would put its
    own: copied over the golden, as the note of that check said, it would accept that failing
    run. Says what it removed ('' for nothing)."""
    if candidate is None or candidate.is_symlink() or not looks_golden(candidate):
        return ""
    try:
        candidate.unlink()
    except OSError:
        return ""
    return f"removed the candidate golden {candidate} an earlier failing check proposed"


def golden_check(
    golden: PathLike,
    run: PathLike,
    *,
    tolerances: Mapping[str, Any] | None = None,
    update: bool = False,
    reports: Sequence[PathLike] = (),
    feedback: Feedback | None = None,
    strict: bool = False,
) -> GoldenCheck:
    """Judge the recorded `run` against the golden for its environment (`golden`: a file or a
    directory of them); `strict`: its warnings fail it, as `compare`'s. A golden for another
    environment is refused ("no golden for this environment"), never passed. With `update`, the
    run (and its own reference, if it has one) becomes the golden afterwards, or the first one
    for its environment (refused where goldens of another experiment already lie, such as a
    float64 run beside float32 goldens). On failure the run is written beside the reports as a
    candidate, and `accept` is the command that accepts it."""
    from .api import check_tolerances
    from .runs.reader import read_run_dir

    checked = check_tolerances(tolerances)
    run_path, golden_path = Path(run), Path(golden)
    merged = read_run_dir(run_path)
    if not update:
        outcome = _check(golden, run, merged, checked, update, reports, feedback)
        if strict and outcome.comparison is not None:
            fail_on_warnings(outcome.comparison)
        return outcome
    # one update at a time: a second job judges against the golden the first accepted, never
    # against the one both read (two accepting jobs each said "accepted", and one was lost)
    with RunLock(golden_path.absolute()).wait():
        return _check(golden, run, merged, checked, update, reports, feedback)


def _check(
    golden: PathLike,
    run: PathLike,
    merged: Any,
    checked: dict,
    update: bool,
    reports: Sequence[PathLike],
    feedback: Feedback | None,
) -> GoldenCheck:
    """golden_check's judging, its candidate and its update, with the run read."""
    run_path, golden_path = Path(run), Path(golden)
    key = environment_key(merged.environment)
    accept = accept_command(golden, run)
    try:
        golden_file, data = find(golden_path, key)
    except BadInput:
        if not update:
            raise
        written = _accept(merged, _reference(merged, None, False), golden_path, key)
        return GoldenCheck(None, golden_path, accept, written=written)
    check_outputs([], [run_path, golden_path], reports)
    proposed = None if update else candidate_path(golden_file, run_path, reports)
    candidate, unwritable = _writable(proposed, [run_path, golden_path], reports)
    comparison = _judge(data, golden_file, merged, checked, feedback)
    outcome = GoldenCheck(comparison, golden_file, accept)
    if comparison.verdict != FAIL and (removed := _stale(candidate)):
        comparison.notes.append(removed)
    if comparison.verdict == FAIL and unwritable:
        comparison.notes.append(f"no candidate golden written: {unwritable}; to accept: {accept}")
    kept = update or (comparison.verdict == FAIL and candidate is not None)  # a golden written
    reference = _reference(merged, None, False) if kept else None  # read once, where needed
    lost = (
        "; it names no float64 reference, so the golden loses its noise floor and later checks "
        "use the fixed tolerances (to keep it, accept a baseline recorded with its reference: "
        "`gradalign golden write BASELINE --out DIR`)"
        if kept and data.get("reference_dtype") and reference is None
        else ""
    )
    if update:
        outcome.written = _accept(merged, reference, golden_file, key)
        named = [d.code for d in comparison.diagnosis if d.severity == "error"]
        named = [code for code in named if code != "unexplained"]
        bug = (
            f", though it failed against the golden it replaced with {', '.join(named[:3])} "
            "named: the golden now holds that training, and a run without the bug will fail "
            "against it"
            if comparison.verdict == FAIL and named
            else ""
        )
        comparison.notes.append(f"accepted {run} as the golden: wrote {outcome.written}{bug}{lost}")
    elif comparison.verdict == FAIL and candidate is not None:
        try:
            outcome.candidate = _write(merged, reference, candidate, [run_path])
        except BadInput as exc:  # a run that diverged holds no golden: the verdict stands
            comparison.notes.append(f"no candidate golden written: {exc}")
            return outcome
        comparison.notes.append(
            f"to accept this run as the golden: {accept} (or copy the candidate {candidate} "
            f"over {golden_file}){lost}"
        )
    return outcome


def _judge(data: dict, golden_file: Path, merged: Any, checked: dict, feedback: Any) -> Comparison:
    from .judge.golden import judge

    with (feedback or Silent()).progress("golden check", merged.updates) as advance:
        return judge(data, str(golden_file), merged, checked, on_update=lambda _: advance())


def _accept(merged: Any, reference: Any, golden: Path, key: str) -> Path:
    """Write the run as the golden: over `golden` when it is a file for this environment (or a
    broken one), else as `<key>.json` beside it or inside a directory; a path that does not exist
    yet is a file if it ends in .json, else a directory (as for `golden write --out`)."""
    if golden.is_dir():
        target = golden / f"{key}.json"
    elif golden.exists() and _key_of(golden) not in (None, key):
        target = golden.parent / f"{key}.json"
    elif golden.exists():
        target = golden
    else:  # the first golden: as `golden write --out` reads a path (a directory unless .json)
        target = _target(golden, key)
    _refuse_another_experiment(merged, target.parent, key, target)
    inputs = [Path(merged.source), *([Path(reference.source)] if reference else [])]
    return _write(merged, reference, target, inputs)


def _refuse_to_replace(target: Path) -> None:
    """A golden is written over a golden file, a damaged one (a merge conflict) included, and
    nothing else: given a run's manifest.json (or any other file), `golden write --out` and
    `golden check --update` wrote the golden over it, and that run was gone."""
    if any(is_run_dir(folder) for folder in resolved(target).parents):
        raise BadInput(f"{target} lies inside a gradalign run; write the golden elsewhere")
    if not target.exists() or target.is_dir():
        return
    if is_stream(target):  # reading its head would wait on a pipe forever
        raise BadInput(f"{target} is not a regular file (a device or a pipe); not a golden file")
    try:
        with open(target, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError as exc:
        raise BadInput(f"{target}: cannot read it ({exc.strerror})") from None
    if b'"gradalign-golden"' not in head:
        raise BadInput(f"{target} exists and is not a golden file; refusing to overwrite it")


def _refuse_another_experiment(run: Any, folder: Path, key: str, besides: Path) -> None:
    """Goldens side by side are one experiment in several environments (`golden_config`, read by
    `merged --against DIR`): a new environment's golden (`besides`: the file it will be) must not
    make them two. A float64 run is refused beside other goldens: it is a baseline's reference.
    A file the user named (not `<key>.json`) is theirs to place beside anything."""
    if besides.name != f"{key}.json":
        return
    others = [p for p in _golden_files(folder) if resolved(p) != resolved(besides)]
    if not others:
        return  # no other golden there: nothing to keep consistent
    held, mine = golden_config(others), run.config
    hint = "accept a run of the same experiment"
    dtypes = {_dtype_of(p) for p in others} - {"float64"}
    if (mine.get("dtype") or run.dtype) == "float64" and dtypes:
        changed = ["dtype"]  # the run's own dtype: a loop's config need not name it
        held, mine = {**held, "dtype": sorted(dtypes)[0]}, {**mine, "dtype": "float64"}
        hint = (
            "a float64 run is a baseline's noise-floor reference, not a golden for its runs: "
            "pass the baseline itself (the golden keeps the reference its manifest names)"
        )
    else:
        changed = sorted(k for k in set(held) & set(mine) - ENVIRONMENT if held[k] != mine[k])
    if not changed:
        return
    differs = ", ".join(f"{k} {mine[k]!r} (goldens {held[k]!r})" for k in changed[:3])
    raise BadInput(
        f"{besides.name} would join {folder}, whose goldens record another experiment "
        f"({differs}); {hint}, or give this one a directory of its own "
        "(`gradalign golden write RUN --out DIR`)"
    )


def _dtype_of(path: Path) -> str:
    """The dtype a golden's run trained in: its config's, else its environment's."""
    golden = load(path)
    return golden["config"].get("dtype") or golden.get("environment", {}).get("dtype", "float32")


def _key_of(path: Path) -> str | None:
    try:
        return load(path)["environment_key"]
    except BadInput:
        return None


# What may differ between the goldens of one directory: the environment (the file's key), and
# K, which the merged run chooses. What is not named stays as the command line says.
ENVIRONMENT = frozenset({"device", "dtype", "precision", "amp_level", "nproc", "accum_steps"})


def _golden_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return [p for p in sorted(path.glob("*.json")) if not p.name.endswith(CANDIDATE)]


def golden_config(golden: PathLike | Sequence[Path]) -> dict[str, Any]:
    """The experiment a golden file (or a directory of them, or a list) recorded. Goldens of one
    directory may differ in their environment (ENVIRONMENT: device, dtypes, precision, cards);
    a setting is kept where they all agree, and left to the command line where they differ."""
    path = None if isinstance(golden, (list, tuple)) else Path(golden)
    files = _golden_files(path) if path is not None else list(golden)
    configs = []
    for file in files:
        try:
            configs.append(load(file)["config"])
        except BadInput:
            if path is not None and path.is_file():
                raise
    where = golden if path is not None else files[0].parent
    if not configs:
        not_a_run(Path(where))
        raise BadInput(f"{where}: holds no golden file")
    varying = {k for k in ENVIRONMENT if len({repr(c.get(k)) for c in configs}) > 1}
    kept = [{k: v for k, v in c.items() if k not in varying | {"accum_steps"}} for c in configs]
    for other in kept[1:]:
        differs = sorted(k for k in set(other) | set(kept[0]) if other.get(k) != kept[0].get(k))
        if differs:
            shown = ", ".join(f"{k} {kept[0].get(k)!r} and {other.get(k)!r}" for k in differs[:3])
            raise BadInput(f"{where}: its golden files record different experiments ({shown})")
    return kept[0]
