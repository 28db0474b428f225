"""The data files of one run directory, read with their integrity checked (docs/FORMAT.md,
"Integrity").

A run whose manifest says `"integrity": "fingerprints"` is checked tensor by tensor: each
tensor of a weights or gradient file is summed as it is read (the fingerprint of docs/FORMAT.md,
a pass the judge's own arithmetic hides) and must equal the fingerprint its series recorded, or
the file "fails its checksum". Its small files (the series, the sketches) and the files of any
other run are checked by their checksum from the manifest (XXH3-128 or SHA-256,
runs/checksums.py), streamed, before they are read. Every file's checksum stays checkable with
`verify_files` (`--verify-files`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ..errors import BadInput
from ..paths import resolved
from . import tensors as tensorfiles
from .checksums import SHA256, of_file
from .digests import bitsum
from .tensorfile import Layout, TensorFile

FINGERPRINTS = "fingerprints"
_FLOAT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}  # what a weight or gradient is stored as
_DECLARED = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _holds(code: str, declared: str) -> bool:
    """Whether values stored as `code` can be the manifest's `declared` dtype: a float type as
    wide or wider (a bfloat16 tensor widened to float32 where a writer has no bfloat16), never
    narrower (float32 data declared float64 would be judged to float64's tolerances), and no
    float for an integer tensor or the reverse."""
    exact = _DECLARED.get(declared)
    if exact is None or code not in _FLOAT_BYTES:
        return (exact is None) == (code not in _FLOAT_BYTES)
    return code == exact or _FLOAT_BYTES[code] > _FLOAT_BYTES[exact]


class Store:
    """Checked access to a run's data files. `expected(relpath)`: per tensor name, the
    fingerprint its series recorded for that file (None: the file is checked by its checksum,
    of the manifest's `algorithm`)."""

    def __init__(
        self,
        path: Path,
        checksums: dict[str, str],
        declared: dict[str, str],
        fingerprinted: bool,
        algorithm: str = SHA256,
    ) -> None:
        self.path, self.checksums, self.declared = path, checksums, declared
        self.algorithm = algorithm
        self.fingerprinted = fingerprinted
        self.expected: dict[str, dict[str, int]] = {}
        self.loaders: tuple = ()  # the Run's own loaders (a Run with others is not read here)
        self._hashed: set[str] = set()

    def file(self, relpath: str, known: Layout | None = None) -> Path:
        """A listed data file, refused if it is not a regular file inside the run. `known`: the
        layout of a file this check passed before; a path that still names that very file is
        not resolved again (a lookup of one tensor costs one `lstat`, not two `realpath`s)."""
        path = self.path
        if relpath not in self.checksums:
            raise BadInput(f"{path}: {relpath} is not listed in the manifest")
        file = path / relpath
        if known is not None and _still(file, known):
            return file
        try:
            if not resolved(file).is_relative_to(resolved(path)):
                raise BadInput(f"{path}: {relpath} leads outside the run directory")
            info = os.lstat(file)
        except FileNotFoundError:
            raise BadInput(f"{path}: {relpath} is missing") from None
        except OSError as exc:
            raise BadInput(f"{path}: {relpath} cannot be read ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise BadInput(f"{path}: {relpath} is {kind}; a run holds regular files only")
        return file

    def hashed(self, relpath: str, known: Layout | None = None) -> Path:
        """A data file after its checksum matched the manifest's (once per file)."""
        file = self.file(relpath, known)
        if relpath not in self._hashed:
            try:
                actual = of_file(file, self.algorithm)
            except OSError as exc:
                raise BadInput(f"{self.path}: {relpath} cannot be read ({exc.strerror})") from None
            if actual != self.checksums[relpath]:
                raise BadInput(f"{self.path}: {relpath} fails its checksum (truncated or altered)")
            self._hashed.add(relpath)
        return file

    def read_all(self, relpath: str) -> dict[str, np.ndarray]:
        """A small file (series, sketches): its checksum checked, then read whole."""
        file = self.hashed(relpath)
        return tensorfiles.read(file, str(file))

    def open(self, relpath: str, known: Layout | None = None) -> CheckedFile:
        """A tensor file, each of its tensors checked as it is read; `known`: its layout as an
        earlier open validated it (used again while the file is unchanged)."""
        prints = self.expected.get(relpath) if self.fingerprinted else None
        file = self.file(relpath, known) if prints is not None else self.hashed(relpath, known)
        try:
            handle = TensorFile(file, str(file), known)
        except BadInput as exc:
            if prints is None:
                raise
            raise BadInput(  # its checksum may match: a file written so (it was "fails its
                # checksum", also where --verify-files had just matched it)
                f"{self.path}: {relpath} is no readable tensor file (truncated or altered: "
                f"{str(exc).split(': ', 1)[-1]})"
            ) from None
        return CheckedFile(handle, f"{self.path}: {relpath}", prints, self.declared)

    def tensors(self, relpath: str, shapes: dict[str, tuple[int, ...]]) -> LazyTensors:
        """A tensor file as a mapping that reads (and checks) one tensor per lookup; every name
        in `shapes` must be in it with that shape."""
        with self.checked(relpath, shapes) as checked:
            layout = checked.file.layout
        return LazyTensors(self, relpath, layout)

    def checked(self, relpath: str, shapes: dict[str, tuple[int, ...]]) -> CheckedFile:
        """`open`, after checking that every name in `shapes` is there with that shape."""
        checked = self.open(relpath)
        names = checked.file.entries
        for name, shape in shapes.items():
            if name not in names or checked.file.shape(name) != shape:
                checked.close()
                found = "missing" if name not in names else f"shape {checked.file.shape(name)}"
                raise BadInput(f"{self.path}: {relpath}: tensor {name} {list(shape)} is {found}")
            code, declared = names[name]["dtype"], self.declared.get(name)
            if declared is not None and not _holds(code, declared):
                checked.close()  # an int view of float bits keeps their fingerprint: look first
                raise BadInput(
                    f"{self.path}: {relpath}: tensor {name} is stored as {code}; the manifest "
                    f"declares it {declared}"
                )
        return checked


def _still(file: Path, known: Layout) -> bool:
    """Whether `file` is, itself and not through a link, the file `known` was read from (the
    same device and inode): a file whose place in the run was checked when it was opened."""
    try:
        info = os.lstat(file)
    except OSError:
        return False  # the full check says what is wrong
    return stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == known.inode


class CheckedFile:
    """A `TensorFile` whose tensors are checked against recorded fingerprints as they are read.

    `stream(name)` reads a tensor in consecutive slices and checks it after the last one;
    `array(name)` reads and checks a whole tensor. Without recorded fingerprints (a file
    already checked by its checksum) nothing is summed.
    """

    def __init__(
        self,
        file: TensorFile,
        where: str,
        prints: dict[str, int] | None,
        declared: dict[str, str],
    ) -> None:
        self.file, self.where, self.prints, self.declared = file, where, prints, declared

    def __enter__(self) -> CheckedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def close(self) -> None:
        self.file.close()

    def stream(self, name: str, checked: bool = False) -> TensorStream:
        """A tensor read slice by slice, in order; `finish` checks its fingerprint, unless this
        process `checked` it already (a second pass over the same file)."""
        check = not checked and self.prints is not None and name in self.prints
        expected = self.prints[name] if check and self.prints is not None else None
        return TensorStream(self, name, expected)

    def array(self, name: str) -> np.ndarray:
        value = self.file.array(name)
        if self.prints is not None and name in self.prints:
            self._compare(name, bitsum(value, self.declared.get(name)))
        return value

    def _compare(self, name: str, total: int) -> None:
        expected = self.prints[name] if self.prints is not None else 0
        if (total - expected) % 2**64:
            stored, declared = str(self.file.stored_dtype(name)), self.declared.get(name)
            other = (
                f"; or its writer took the fingerprint of the stored {stored} values, not of "
                f"the {declared} ones the manifest declares (docs/FORMAT.md, Fingerprints)"
                if declared is not None and declared != stored
                else ""
            )
            raise BadInput(
                f"{self.where} fails its checksum (tensor {name} does not match its recorded "
                f"fingerprint: truncated or altered{other})"
            )


class TensorStream:
    """One tensor of a `CheckedFile`, read in consecutive slices."""

    def __init__(self, owner: CheckedFile, name: str, expected: int | None) -> None:
        self.owner, self.name, self.expected = owner, name, expected
        self.count = owner.file.count(name)
        self.done = 0
        self.total = 0

    def read(self, size: int) -> np.ndarray:
        """The next `size` elements (fewer at the end)."""
        stop = min(self.done + size, self.count)
        part = self.owner.file.read(self.name, self.done, stop)
        self.done = stop
        if self.expected is not None:
            self.total += bitsum(part, self.owner.declared.get(self.name))
        return part

    def finish(self) -> None:
        """Raise if the tensor was read whole and its fingerprint differs."""
        if self.expected is not None and self.done == self.count:
            self.owner._compare(self.name, self.total)


class LazyTensors(Mapping[str, np.ndarray]):
    """The tensors of one file, each read and checked when looked up (never kept).

    The file's validated layout is kept (a header's worth of memory, for as long as the mapping
    lives): a lookup opens the file and reads one tensor, and parses the header again only if
    the file changed, so reading every tensor costs time linear in their number. The names are
    those of the file when the mapping was made."""

    def __init__(self, store: Store, relpath: str, layout: Layout) -> None:
        self.store, self.relpath, self.layout = store, relpath, layout
        self.names = layout.entries  # a dict: file order, and lookups that do not scan

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        with self.store.open(self.relpath, self.layout) as checked:
            self.layout = checked.file.layout  # a changed file: validated once, not per lookup
            return checked.array(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.names[name]["shape"])

    def slices(self, name: str, size: int) -> Iterator[np.ndarray]:
        """One tensor read `size` elements at a time, checked after its last slice."""
        if name not in self.names:
            raise KeyError(name)
        with self.store.open(self.relpath, self.layout) as checked:
            self.layout = checked.file.layout
            stream = checked.stream(name)
            while True:
                part = stream.read(size)
                yield part
                if stream.done >= stream.count:
                    break
            stream.finish()


SLICE = 1 << 17  # elements a slice (the streamed judge's too: judge/update_files.CHUNK)


def shape_of(tensors: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    """A tensor's shape, without reading a file's tensor."""
    if isinstance(tensors, LazyTensors):
        return tensors.shape(name)
    return tuple(np.shape(tensors[name]))


def slices(tensors: Mapping[str, np.ndarray], name: str, size: int = SLICE) -> Iterator[np.ndarray]:
    """A tensor's values, flattened, `size` at a time (at least one slice, empty for an empty
    tensor): read slice by slice from a run directory's file, its fingerprint checked after the
    last; views of an array held in memory. A file's tensor never stands whole in memory."""
    if isinstance(tensors, LazyTensors):
        yield from tensors.slices(name, size)
        return
    flat = np.asarray(tensors[name]).ravel()
    for first in range(0, max(flat.size, 1), size):
        yield flat[first : first + size]


def verify_files(store: Store, threads: int = 2) -> int:
    """Check every listed file's checksum against the manifest (the `--verify-files` pass), a
    few files at a time (hashlib and xxhash release the GIL); returns the bytes read."""
    from concurrent.futures import ThreadPoolExecutor

    paths = sorted(store.checksums)
    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(store.hashed, paths))
    return sum(path.stat().st_size for path in found)
