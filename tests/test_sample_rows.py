"""`micro/pairs` (record/samples.py): the sample digest taken per row, which sees how a batch's
tensors are paired, not only which values it holds. It adds up over micro-batches like
`micro/data`, numpy's and torch's computations agree bit for bit, and the judge reads it as
evidence: labels zipped from another micro-batch, or rows cut along time, are `data-order` (they
were `cross-sample-loss`, "over the same samples")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign.api import compare
from gradalign.record import samples
from gradalign.record.facts import sample_digest as _sample_digest
from gradalign.runs.digests import wrap

from .devices import DEVICES

UPDATES, B, K, T = 3, 8, 4, 6


def sample_digest(*args, **kwargs) -> samples.Digest:
    """The digest with its numbers read (a CPU batch's row sums wait to be mixed with others')."""
    found = _sample_digest(*args, **kwargs)
    samples.resolve([found])
    return found


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 3, generator=g)
    y = torch.randint(0, 5, (B,), generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    return x, y, mask


def test_numpy_and_torch_digest_alike_and_add_up_over_micro_batches():
    x, y, mask = _batch()
    whole = sample_digest((x, y), mask=None)
    n = B // K
    parts = [sample_digest((x[i : i + n], y[i : i + n])) for i in range(0, B, n)]
    assert wrap(sum(p.data for p in parts)) == whole.data
    assert wrap(sum(p.pairs for p in parts)) == whole.pairs
    # the device path (row sums by torch, mixed on the host), run here on CPU tensors
    assert _device_path([x, y], [None, None]) == (whole.data, whole.pairs)
    masked = sample_digest((x, y), mask=mask)
    keep = mask.reshape(B, T, 1).expand(x.shape)
    assert _device_path([x, y], [keep, None]) == (masked.data, masked.pairs)


def _device_path(tensors: list[torch.Tensor], keeps: list) -> tuple[int, int]:
    found = samples.device_rows(tensors, keeps, torch.device("cpu"))
    assert (found.data, found.pairs) == (None, None)  # nothing read on the training thread
    samples.resolve([found])
    return found.data, found.pairs


@pytest.mark.parametrize("seed", range(4))
def test_numpy_digest_equals_torch_on_any_rows_dtypes_and_masks(seed):
    """The numpy path (one stacked array, the tensors' weights as a vector, in-place wrapping
    arithmetic) against the device path's (torch's row sums in each tensor's own integer
    type, mixed on the host): 1 to 4 tensors of float32, float64,
    bfloat16, int64 near the wrap and bool, 0 to 40 rows, with and without masks."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(25):
        rows = int(torch.randint(0, 41, (), generator=g))
        tensors, keeps = [], []
        for index in range(int(torch.randint(1, 5, (), generator=g))):
            shape = (rows, *torch.randint(1, 4, (index % 3,), generator=g).tolist())
            kind = int(torch.randint(0, 5, (), generator=g))
            values = torch.randn(shape, generator=g) * 1e30
            tensor = [
                values,
                values.double(),
                values.bfloat16(),
                torch.randint(-(2**62), 2**62, shape, generator=g),
                values > 0,
            ][kind]
            tensors.append(tensor)
            masked = bool(torch.rand((), generator=g) < 0.5)
            keeps.append(torch.rand(shape, generator=g) > 0.3 if masked else None)
        found = samples.digest(tensors, keeps)
        samples.resolve([found])
        assert _device_path(tensors, keeps) == (found.data, found.pairs)


@pytest.mark.parametrize("mix_at", [1, 50, 1 << 16])
def test_cpu_row_sums_mixed_together_equal_each_batch_mixed_alone(monkeypatch, mix_at):
    """A CPU batch's row sums wait in the run's digests and are mixed with others' in one pass
    (at `send()` once `_MIX_AT` values are held, or at `series()`): batches of other row counts
    (none included) and tensor counts give the numbers each gives mixed alone."""
    monkeypatch.setattr(samples, "_MIX_AT", mix_at)
    g = torch.Generator().manual_seed(7)
    digests, alone = samples.Digests(), []
    for micro in range(30):
        rows = [0, 1, 5, 17][micro % 4]
        tensors = [torch.randn(rows, 3, generator=g), torch.randint(0, 9, (rows,), generator=g)]
        tensors = tensors[: 1 + micro % 2] + ([torch.randn(rows, generator=g)] if micro % 3 else [])
        keeps = [torch.rand(t.shape, generator=g) > 0.4 if micro % 5 else None for t in tensors]
        digest = samples.digest(tensors, keeps)
        assert isinstance(digest.rows, tuple) and digest.data is None  # nothing mixed yet
        digests.append(digest)
        stacked = np.stack(digest.rows)
        alone.append((wrap(int(stacked.sum(dtype=np.int64))), samples.np_mixed_rows(stacked)))
        if micro % 4 == 3:
            digests.send()
            held = sum(r.size for d in digests.all if isinstance(d.rows, tuple) for r in d.rows)
            assert held < max(mix_at, 1)  # mixed once that many were held
    found = digests.series()
    assert found["micro/data"].tolist() == [a[0] for a in alone]
    assert found["micro/pairs"].tolist() == [a[1] for a in alone]


@pytest.mark.parametrize("device", DEVICES)
def test_a_devices_digests_go_to_the_host_a_window_at_a_time(device):
    """On a device a micro-step keeps its batch's row sums there; each window's start for the
    host at `send()` (one copy, no wait) and are mixed once landed: the series holds the CPU's
    numbers, and no row sums stay on the device after their window."""
    digests, expected = samples.Digests(), samples.Digests()
    for window in range(3):
        for micro in range(4):
            x, y, mask = _batch(seed=10 * window + micro)
            keep = mask.reshape(B, T, 1).expand(x.shape)
            on = [x.to(device), y.to(device)], [keep.to(device), None]
            digests.append(samples.digest(*on))
            expected.append(samples.digest([x, y], [keep, None]))
        digests.send()
        assert not any(isinstance(d.rows, torch.Tensor) and d.rows.is_cuda for d in digests.all)
    found, wanted = digests.series(), expected.series()
    assert found.keys() == wanted.keys() == {"micro/data", "micro/pairs"}
    for key in found:
        assert found[key].tolist() == wanted[key].tolist(), key


def test_a_device_micro_step_takes_an_operation_a_tensor_and_one():
    """The device path's work on the training thread: each tensor's row sums (float32 or
    integer: one operation, the widening to int64 inside the sum) and their stack; mixing the
    rows there took 25 operations for two tensors (counted through torch's dispatcher, here on
    the CPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Kernels(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if not any(free in name for free in ("detach", "view", "reshape", "alias")):
                Kernels.count += 1
            return func(*args, **(kwargs or {}))

    x, y, _ = _batch()
    with Kernels():
        samples.device_rows([x, y], [None, None], torch.device("cpu"))
    assert Kernels.count == 3


def test_pairs_see_how_the_tensors_are_paired_and_data_does_not():
    x, y, _ = _batch()
    rolled = torch.roll(y, 2)  # each input given another row's label
    assert sample_digest((x, rolled)).data == sample_digest((x, y)).data
    assert sample_digest((x, rolled)).pairs != sample_digest((x, y)).pairs
    halves = torch.cat([x[:, : T // 2], x[:, T // 2 :]])  # rows cut along time
    assert sample_digest(halves).data == sample_digest(x).data
    assert sample_digest(halves).pairs != sample_digest(x).pairs
    assert sample_digest((x, torch.tensor(3.0))).pairs is None  # no common rows: none kept


def record(out, k: int, bug: str | None = None, float64: bool = False, reference=None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(T * 3, 5))
    model = model.double() if float64 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(UPDATES * B, T, 3, generator=g),
        torch.randint(0, 5, (UPDATES * B,), generator=g),
    )
    x = x.double() if float64 else x
    n = B // k
    with gradalign.Recorder(out, model, opt, accum_steps=k, reference=reference) as rec:
        for update in range(UPDATES):
            for micro in range(k):
                rows = slice(update * B + micro * n, update * B + (micro + 1) * n)
                xs, ys = x[rows], y[rows]
                if bug == "labels-rolled":  # the next micro-batch's labels (loaders zipped apart)
                    other = update * B + ((micro + 1) % k) * n
                    ys = y[other : other + n]
                loss = nn.functional.cross_entropy(model(xs), ys)
                (loss / k).backward()
                rec.micro(loss.detach(), batch=(xs, ys))
            opt.step()
            rec.update()
            opt.zero_grad()


@pytest.mark.parametrize("reference", [True, False])
def test_labels_zipped_from_another_micro_batch_are_data_order(tmp_path, reference):
    record(tmp_path / "fp64", 1, float64=True)
    record(tmp_path / "base", 1, reference="../fp64")
    record(tmp_path / "merged", K)
    record(tmp_path / "bug", K, bug="labels-rolled")
    ref = None if reference else "none"
    assert compare(tmp_path / "base", tmp_path / "merged", reference=ref).verdict == "pass"
    bug = compare(tmp_path / "base", tmp_path / "bug", reference=ref)
    samples_check = next(c for c in bug.checks if c.name == "same samples per update")
    assert samples_check.status == "pass"  # the same values: the order-free digest agrees
    first = bug.diagnosis[0]
    assert first.code == "data-order", first.message
    assert "values but not its samples" in first.message and "loaders zipped" in first.message


def test_a_micro_batch_of_no_rows_is_recorded(tmp_path):
    """A ragged tail split with tensor_split (rows 1, 1, 1, 0): the empty micro-batch digests
    to nothing (it raised from a reshape to (0, -1))."""
    empty = (torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64))
    assert (sample_digest(empty, mask=None).data, sample_digest(empty, mask=None).pairs) == (0, 0)
    assert samples.row_sums(empty[0], None).shape == (0,)  # the device path too
    assert _device_path(list(empty), [None, None]) == (0, 0)
    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 2), torch.randn(3, 4), torch.randint(0, 2, (3,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=4) as rec:
        for xs, ys in zip(torch.tensor_split(x, 4), torch.tensor_split(y, 4), strict=True):
            loss_sum = nn.functional.cross_entropy(model(xs), ys, reduction="sum")
            (loss_sum / 3).backward()
            rec.micro(loss_sum=loss_sum, items=len(ys), batch=(xs, ys))
        opt.step()
        rec.update()
        opt.zero_grad()
    assert (tmp_path / "run" / "manifest.json").exists()
