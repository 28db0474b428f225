"""What the reader takes from a run recorded with `--record sketch` (docs/FORMAT.md, "Sketches"):
the sketch width, the updates that kept full files, and a loader for each update's sketches."""

from __future__ import annotations

from ..errors import BadInput, shown
from .grid_sums import SLAB_CELLS, grid_shape, has_slabs, slab_grid_shape
from .layout import sketch_file
from .model import Run, Tensors
from .store import Store
from .unit_sums import GROUPS, has_units

UNIT_AXES = {"rows": 0, "columns": 1}  # unit sums' keys (runs/unit_sums.py) and their axis
GRID = "grid"  # grid sums' key (runs/grid_sums.py)
SLABS = "slabs"  # slab grids' key (runs/grid_sums.py), of gradients of three axes or more


def attach_sketches(run: Run, manifest: dict, store: Store) -> None:
    """Fill a Run's sketch fields from its manifest (nothing for a full run)."""
    record = manifest.get("record", "full")
    if record == "full":
        return
    if record != "sketch":
        raise BadInput(f"{run.source}: manifest field 'record' is {shown(record)}")
    spec = manifest.get("sketch")
    width = spec.get("width") if isinstance(spec, dict) else None
    snapshots = spec.get("snapshots") if isinstance(spec, dict) else None
    whole_1d = spec.get("whole_1d", 0) if isinstance(spec, dict) else 0
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise BadInput(f"{run.source}: manifest field 'sketch' needs a width >= 1")
    if not isinstance(whole_1d, int) or isinstance(whole_1d, bool) or whole_1d < 0:
        raise BadInput(f"{run.source}: manifest field 'sketch.whole_1d' must be an integer >= 0")
    if not isinstance(snapshots, list) or not all(
        isinstance(u, int) and not isinstance(u, bool) and 0 <= u < run.updates for u in snapshots
    ):
        raise BadInput(f"{run.source}: manifest field 'sketch' needs its snapshot updates")
    shapes = {t.name: tuple(t.shape) for t in run.tensors}

    def load(update: int | None) -> Tensors | None:
        relpath = sketch_file(update)
        if relpath not in store.checksums:
            return None
        found = store.read_all(relpath)
        for key, values in found.items():
            kind, _, name = key.removeprefix("held/").partition("/")
            if kind in ("weights", "grads") and name not in shapes:
                raise BadInput(f"{run.source}: {relpath} sketches an unknown tensor {name!r}")
            if kind in UNIT_AXES or kind in (GRID, SLABS):
                _check_unit_sums(run.source, relpath, key, values.shape, shapes)
        return found

    run.record, run.sketch_width, run.sketch_whole_1d = "sketch", width, whole_1d
    run.snapshots = frozenset(snapshots)
    run.load_sketches = load


def _check_unit_sums(
    source: str, relpath: str, key: str, shape: tuple[int, ...], shapes: dict
) -> None:
    """A gradient's unit sums must be of a known tensor of two axes or more, shaped [units, G],
    its grid sums [P, Q] (`runs.grid_sums.grid_shape`), and its slab grids, of a tensor of three
    axes or more, [E, P, Q] (`runs.grid_sums.slab_grid_shape`)."""
    axis_name, _, rest = key.partition("/")
    kind, _, name = rest.partition("/")
    tensor = shapes.get(name)
    if kind != "grads" or tensor is None or not has_units(tensor):
        raise BadInput(f"{source}: {relpath} holds {key!r}, which no gradient of two axes has")
    if axis_name == SLABS and not has_slabs(tensor):
        raise BadInput(
            f"{source}: {relpath} holds {key!r}, which no gradient keeps (three axes or more, "
            f"and slab grids of at most {SLAB_CELLS} cells)"
        )
    expected = (
        slab_grid_shape(tensor)
        if axis_name == SLABS
        else grid_shape(tensor)
        if axis_name == GRID
        else (tensor[UNIT_AXES[axis_name]], GROUPS)
    )
    if tuple(shape) != expected:
        raise BadInput(f"{source}: {relpath}: {key!r} is shaped {tuple(shape)}, not {expected}")
