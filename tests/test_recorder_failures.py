"""What a Recorder does when the world changes under it while it records: folders removed, a
disk that refuses a write, a model cast or its buffers assigned anew, a file dropped where the
run goes. The run is complete or absent, and every failure is one sentence naming the run."""

from __future__ import annotations

import errno
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gradalign import Recorder, RecorderError  # noqa: E402
from gradalign.errors import BadInput  # noqa: E402
from gradalign.runs import writer as run_writer  # noqa: E402
from gradalign.runs.reader import read_run_dir  # noqa: E402


class Counting(torch.nn.Module):
    """A linear layer and a buffer the forward assigns anew (`self.seen = self.seen + 1`)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = self.seen + 1
        return self.linear(x)


def record(out: Path, updates: int = 3, during=None, batch=None) -> Path | None:
    """A small SGD loop recorded at `out`; `during(update, recorder, model)` runs before each;
    `batch`: what micro() digests (default the inputs)."""
    torch.manual_seed(0)
    model = Counting()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(out, model, optimizer, 1)
    try:
        for update in range(updates):
            if during is not None:
                during(update, rec, model)
            x = torch.randn(8, 4).to(model.linear.weight.dtype)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            rec.micro(loss, batch=(x,) if batch is None else batch)
            optimizer.step()
            rec.update()
            optimizer.zero_grad()
    except BaseException:
        rec.abort()
        raise
    return rec.close()


def test_a_buffer_assigned_anew_is_recorded_as_it_is_now(tmp_path, monkeypatch):
    """The Recorder kept the tensor the buffer held at its start: every snapshot said 0. One
    assigned from a graph (a grad_fn) is recorded by its values, with no warning from torch."""
    run = read_run_dir(record(tmp_path / "run"))
    assert [float(run.weights(i)["seen"][0]) for i in range(3)] == [1.0, 2.0, 3.0]

    def forward(self, x):
        self.seen = self.seen + 1 + 0 * self.linear.weight.sum()  # carries a grad_fn
        return self.linear(x)

    monkeypatch.setattr(Counting, "forward", forward)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = read_run_dir(record(tmp_path / "graph"))
    assert [float(run.weights(i)["seen"][0]) for i in range(3)] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_model_cast_during_the_run_is_refused(tmp_path, dtype):
    """`model.to(dtype)` keeps the parameter objects: float16 made a run compare accepted."""

    def cast(update, rec, model):
        if update == 1:
            model.to(dtype)

    with pytest.raises(RecorderError, match=f"changed dtype from torch.float32 to {dtype}"):
        record(tmp_path / "run", during=cast)
    assert not (tmp_path / "run").exists()


def test_a_staging_folder_removed_while_recording_puts_nothing_in_place(tmp_path):
    """The next write made the folder again, and close() swapped in a run missing its first
    files over a complete earlier run."""
    earlier = record(tmp_path / "run")
    before = sorted(p.relative_to(earlier) for p in earlier.rglob("*"))

    def remove_staging(update, rec, model):
        if update == 2:
            rec._writer.drain()  # the files written so far are on disk
            shutil.rmtree(rec._writer.writer.staging)

    with pytest.raises(BadInput, match="of the run's files vanished while it was recorded"):
        record(tmp_path / "run", updates=4, during=remove_staging)
    assert sorted(p.relative_to(earlier) for p in earlier.rglob("*")) == before
    assert read_run_dir(earlier).updates == 3


def test_a_write_the_system_refuses_names_the_run_and_the_file(tmp_path, monkeypatch):
    """A full disk surfaced as a bare OSError (no run, no file), often from inside step()."""
    real, calls = run_writer._write_atomic, []

    def full_after_two(path, data, durable=False):
        calls.append(path)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, durable)

    monkeypatch.setattr(run_writer, "_write_atomic", full_after_two)
    with pytest.raises(BadInput, match=r"cannot write .*No space left on device.*run is dropped"):
        record(tmp_path / "run")
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_working_directory_is_no_place_for_a_run(tmp_path, monkeypatch):
    """Recorder(".") staged the run inside its own output, then failed at close()."""
    monkeypatch.chdir(tmp_path)
    for out in (".", "", tmp_path.parent):
        with pytest.raises(RecorderError, match=r"the working directory .* is no place for a run"):
            record(out)


def test_a_sparse_batch_is_one_sentence(tmp_path):
    sparse = torch.eye(8, 4).to_sparse()
    with pytest.raises(RecorderError, match=r"sparse_coo tensor of shape \(8, 4\), whose samples"):
        record(tmp_path / "run", batch=(sparse,))


def test_a_file_dropped_at_the_run_path_keeps_the_run_beside_it(tmp_path):
    """A logger writing into the output folder meanwhile: close() refused to replace the user's
    file (right) and threw the complete recording away (not)."""

    def log_there(update, rec, model):
        if update == 1:
            (tmp_path / "run").mkdir()
            (tmp_path / "run" / "train_log.csv").write_text("step,loss\n")

    with pytest.raises(BadInput, match="the recorded run was kept at") as refused:
        record(tmp_path / "run", during=log_there)
    kept = Path(str(refused.value).rsplit(" kept at ", 1)[1])
    assert read_run_dir(kept).updates == 3
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["train_log.csv"]


def test_a_recorder_dropped_unclosed_lets_go_of_the_loop(tmp_path):
    """A Recorder dropped without close() (an exception in a notebook, a rebinding) kept its
    hooks on the optimizer and torch's clip function patched, so it lived on and went on
    writing every later step into a run nobody would close. Now it is discarded: hooks gone, no
    staged files or lock left, and a ResourceWarning says so."""
    import gc

    from gradalign.record import clipping

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "runs" / "dropped"
    out.parent.mkdir()
    rec = Recorder(out, model, optimizer, 1)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    rec.micro(loss)
    optimizer.step()
    rec.update()
    with pytest.warns(ResourceWarning, match="dropped without close"):
        del rec
        gc.collect()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert not clipping._listeners
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # no recorder hears it
    optimizer.step()
    assert list(out.parent.iterdir()) == []
    again = Recorder(out, model, optimizer, 1)  # the path is free again
    again.abort()


def test_a_closed_recorder_is_not_warned_about(tmp_path):
    import gc

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert record(tmp_path / "run", updates=1) is not None
        gc.collect()
