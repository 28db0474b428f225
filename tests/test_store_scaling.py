"""Reading a run's tensors one by one costs time linear in their number: each tensor file's
header is parsed and validated once per mapping (runs/store.py `LazyTensors`), not once per
tensor looked up, while every lookup still checks its tensor's fingerprint and a file changed
on disk is validated afresh."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gradalign.errors import BadInput
from gradalign.judge.compare import compare
from gradalign.runs import tensorfile
from gradalign.runs.layout import grads_file
from gradalign.runs.reader import read_run_dir

UPDATES, BATCH, K = 2, 16, 4


def _record(out: Path, n: int, k: int, not_divided: bool = False) -> Path:
    """A model of `n` three-element parameters (and a small head), Adam, `UPDATES` updates;
    `not_divided`: the loss is not divided by K (a failing run the diagnosis reads tensor by
    tensor)."""
    torch = pytest.importorskip("torch")
    import gradalign

    torch.manual_seed(0)

    class Many(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.randn(3) * 0.1) for _ in range(n)]
            )
            self.head = torch.nn.Linear(3, 2)

        def forward(self, x):
            w = torch.stack(list(self.ps))
            return self.head(torch.tanh(x.unsqueeze(1) * w.unsqueeze(0)).mean(1))

    model = Many()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(UPDATES * BATCH, 3, generator=g)
    y = torch.randint(0, 2, (UPDATES * BATCH,), generator=g)
    size = BATCH // k
    with gradalign.Recorder(out, model, opt, accum_steps=k) as rec:
        for u in range(UPDATES):
            for j in range(k):
                part = slice(u * BATCH + j * size, u * BATCH + (j + 1) * size)
                loss = torch.nn.functional.cross_entropy(model(x[part]), y[part])
                (loss if not_divided else loss / k).backward()
                rec.micro(loss.detach(), batch=(x[part], y[part]))
            opt.step()
            rec.update()
            opt.zero_grad()
    return out


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Every tensor-file header read to be validated from here on (its file's path); a header
    of the same bytes as one validated before is then not parsed again (`_VALIDATED`)."""
    seen: list[str] = []
    header_bytes = tensorfile.header_bytes

    def counted(handle, size: int, where: str):
        seen.append(where)
        return header_bytes(handle, size, where)

    monkeypatch.setattr(tensorfile, "header_bytes", counted)
    return seen


def _files(run: Path) -> int:
    return sum(1 for _ in run.glob("*/*.safetensors"))


def test_diagnosing_a_failing_run_parses_headers_independently_of_its_tensors(tmp_path, parses):
    """The diagnosis looks up thousands of tensors one by one; the headers parsed are a few
    per file, the same count for 20 tensors as for 400 (they were one per lookup)."""
    counts = {}
    for n in (20, 400):
        base = _record(tmp_path / f"base{n}", n, 1)
        bug = _record(tmp_path / f"bug{n}", n, K, not_divided=True)
        parses.clear()
        result = compare(read_run_dir(base), read_run_dir(bug))
        assert result.verdict == "fail"
        assert result.diagnosis[0].code == "loss-scale"
        counts[n] = len(parses)
        files = _files(base) + _files(bug)
        assert len(parses) <= 12 * files, (n, len(parses), files)
    assert counts[400] <= counts[20] + 4, counts


def test_reading_every_tensor_of_a_file_parses_its_header_once(tmp_path, parses):
    run = read_run_dir(_record(tmp_path / "run", 50, 1))
    parses.clear()
    grads = run.grads(0)
    values = {name: grads[name] for name in grads}
    assert len(values) == 50 + 2 and len(parses) == 1  # 50 vectors, the head's 2 tensors
    assert all(name in grads for name in values) and "nothing" not in grads


def test_a_file_changed_between_lookups_is_validated_again(tmp_path, parses):
    """A kept layout serves only the file it was made from: a rewritten file is parsed again
    and each tensor still meets its recorded fingerprint."""
    path = _record(tmp_path / "run", 20, 1)
    grads = read_run_dir(path).grads(0)
    first = next(iter(grads))
    before = grads[first]
    with tensorfile.TensorFile(path / grads_file(0)) as opened:
        at = opened.start + opened.entries[first]["data_offsets"][0]
    parses.clear()
    assert np.array_equal(grads[first], before) and parses == []  # the file as it was
    with open(path / grads_file(0), "r+b") as handle:  # its first element, altered in place
        handle.seek(at)
        value = np.frombuffer(handle.read(4), "<f4").copy()
        handle.seek(-4, os.SEEK_CUR)
        handle.write((-value if value[0] else value + 1).tobytes())
    with pytest.raises(BadInput, match="fails its checksum"):
        grads[first]
    assert len(parses) == 1


def test_a_file_swapped_for_a_link_between_lookups_is_refused(tmp_path):
    """A lookup that finds another file than the one it validated checks its place afresh."""
    path = _record(tmp_path / "run", 20, 1)
    grads = read_run_dir(path).grads(0)
    first = next(iter(grads))
    grads[first]
    file = path / grads_file(0)
    outside = tmp_path / "outside.safetensors"
    file.rename(outside)
    file.symlink_to(outside)
    with pytest.raises(BadInput, match="leads outside the run directory"):
        grads[first]


def _tensor_file(path: Path, values: dict[str, np.ndarray]) -> Path:
    tensorfile.write_parts(path, tensorfile.parts(values), hashed=False)
    return path


def test_files_with_one_header_share_its_validation_and_a_changed_size_is_checked(
    tmp_path, monkeypatch
):
    """Each update's files of a run hold the same tensors at the same offsets: a header of the
    same bytes before as many data bytes is parsed once (the entries follow from those two).
    The same header before fewer or more data bytes is validated afresh, and refused."""
    parsed: list[str] = []
    parse_header = tensorfile.parse_header
    monkeypatch.setattr(
        tensorfile,
        "parse_header",
        lambda raw, where: parsed.append(where) or parse_header(raw, where),
    )
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 5), "b": (7,), "c": (2, 2, 2)}
    written = [{k: rng.random(s) for k, s in shapes.items()} for _ in range(3)]
    files = [_tensor_file(tmp_path / f"{i}.safetensors", v) for i, v in enumerate(written)]
    opened = []
    for path, values in zip(files, written, strict=True):
        with tensorfile.TensorFile(path) as f:
            opened.append(f.entries)
            assert f.read("b").tolist() == values["b"].tolist()  # each file's own data
    assert len(parsed) <= 1 and opened[0] is opened[1] is opened[2]
    data = files[0].read_bytes()
    for cut in (data[:-8], data + b"\0" * 8):  # the header of a file of another size
        files[1].write_bytes(cut)
        with pytest.raises(BadInput, match="not a valid tensor file"):
            tensorfile.TensorFile(files[1])
