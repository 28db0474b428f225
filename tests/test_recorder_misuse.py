"""Misuse of the Recorder's Python API: one `RecorderError` sentence saying what was wrong, raised
before anything is staged or as the call is made; never a torch, numpy or json error from inside
gradalign, never a run left behind, never a run that records something else than the loop ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gradalign.errors import BadInput
from gradalign.record.facts import RecorderError
from gradalign.record.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(rec: Recorder, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    rec.micro(loss, batch=(x, y))
    optimizer.step()
    rec.update()
    optimizer.zero_grad()


def _meta_model() -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Linear(4, 2)


def _holding(name: str, tensor: torch.Tensor, kind: str = "buffer") -> torch.nn.Module:
    model = torch.nn.Linear(4, 2)
    if kind == "param":
        model.register_parameter(name, torch.nn.Parameter(tensor))
    else:
        model.register_buffer(name, tensor)
    return model


@pytest.mark.parametrize(
    "change, said",
    [
        (dict(out_dir=5), "out_dir must be a path"),
        (dict(out_dir=None), "out_dir must be a path"),
        (dict(model="model"), "model must be a torch.nn.Module, got 'model'"),
        (dict(model=None), "model must be a torch.nn.Module"),
        (dict(model=_meta_model()), "weight is on the meta device"),
        (dict(model=torch.nn.BatchNorm1d(4, affine=False)), "no parameters to record"),
        (
            dict(model=_holding("c", torch.zeros(2, dtype=torch.complex64), "param")),
            "parameter c is complex",
        ),
        (dict(model=_holding("u", torch.zeros(2, dtype=torch.uint16))), "buffer u is uint16"),
        (dict(optimizer="other"), "updates none of the model's parameters"),
        (dict(optimizer="both"), "got list of optimizers: give the Recorder one of them"),
        (dict(config=[1, 2]), "config must be a dict"),
        (dict(config="lr=0.1"), "config must be a dict"),
        (dict(config={"model": torch.nn.Linear(1, 1)}), r"config\['model'\] must be a JSON"),
        (dict(config={(1, 2): 3}), "config keys must be strings, got tuple"),
        (dict(config={"lr": float("nan")}), r"config\['lr'\] must be a JSON value"),
        (dict(reference=object()), "reference must be a non-empty string"),
        (dict(fault=3), "fault must be a non-empty string"),
        (dict(compute_dtype=torch.float16), "compute_dtype must be a non-empty string"),
        (dict(compute_dtype="fp16"), "compute_dtype must be one of float64, float32, tf32"),
        (dict(scaler="yes"), "scaler must be the loop's GradScaler"),
        (dict(snapshot_every=True), "snapshot_every must be an integer"),
        (dict(record="sketch", updates="3"), "updates must be a positive integer"),
        (
            dict(record="sketch", sketch_width=100),
            "sketch_width must be an integer >= 2 and a prime",
        ),
    ],
)
def test_a_wrong_recorder_argument_is_one_sentence_before_anything_is_written(
    tmp_path, change, said
):
    model, optimizer = _model()
    if change.get("optimizer") == "other":  # another model's optimizer
        change["optimizer"] = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1)
    if change.get("optimizer") == "both":  # two optimizers, as a list
        change["optimizer"] = [optimizer, torch.optim.Adam(model.parameters())]
    args = {"out_dir": tmp_path / "run", "model": model, "optimizer": optimizer, **change}
    with pytest.raises(RecorderError, match=said), Recorder(**args) as rec:
        _step(rec, model, optimizer)
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize(
    "kwargs, said",
    [
        (dict(loss="1.5"), "micro\\(loss\\) must be one number; got str"),
        (dict(loss=True), "micro\\(loss\\) must be one number; got bool"),
        (dict(loss=torch.tensor(1 + 2j)), "must be one real number"),
        (dict(loss=1.0, items=-3), "micro\\(items\\) must be a count >= 0"),
        (dict(loss=1.0, items=float("nan")), "micro\\(items\\) must be a count >= 0"),
        (dict(loss=1.0, items="abc"), "micro\\(items\\) must be a number"),
        (dict(loss=1.0, items=torch.tensor([1, 2])), "micro\\(items\\) must be one number"),
        (dict(loss_sum=1.0, items="abc"), "micro\\(items\\) must be a number"),
        (dict(loss=1.0, mask=torch.ones(3, 5)), "give the batch"),
        (dict(loss=1.0, pad=0), "give the batch"),
        (dict(loss=1.0, batch=torch.ones(3, 5, dtype=torch.long), mask=np.ones((3, 5))), "mask"),
        (dict(loss=1.0, batch=torch.ones(3, 5), mask=torch.ones(2, 7)), "fits no tensor"),
        (dict(loss=1.0, batch=torch.ones(3, 5, dtype=torch.long), pad="x"), "pad must be"),
        (dict(loss=1.0, batch=torch.ones(3, 5, dtype=torch.long), pad=(0, None)), "pad must be"),
        (dict(loss=1.0, batch=torch.ones(3, device="meta")), "batch is on the meta device"),
    ],
)
def test_a_wrong_micro_argument_is_one_sentence_and_leaves_no_run(tmp_path, kwargs, said):
    model, optimizer = _model()
    with (
        pytest.raises(RecorderError, match=said),
        Recorder(tmp_path / "run", model, optimizer) as rec,
    ):
        model(torch.randn(3, 4)).sum().backward()
        rec.micro(**kwargs)
        optimizer.step()
        rec.update()
    assert list(tmp_path.iterdir()) == []


def test_numbers_in_the_config_are_stored_as_numbers_even_when_added_later(tmp_path):
    model, optimizer = _model()
    config = {"lr": np.float32(0.5), "k": np.int64(4), "decay": torch.tensor(0.25)}
    with Recorder(tmp_path / "run", model, optimizer, config=config) as rec:
        _step(rec, model, optimizer)
        rec.config["final"] = torch.tensor(2.0)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"] == {"lr": 0.5, "k": 4, "decay": 0.25, "final": 2.0}


def test_a_tensor_pad_is_read_as_its_values(tmp_path):
    model, optimizer = _model()
    batch = torch.tensor([[1, 2, 0], [3, -100, 0]])
    with Recorder(tmp_path / "run", model, optimizer) as rec:
        rec.micro(1.0, batch=batch, pad=torch.tensor([0, -100]))
        rec.micro(1.0, batch=batch, pad=(0, -100))
        optimizer.step()
        rec.update()
    assert rec._data.all[0] == rec._data.all[1]


@pytest.mark.parametrize(
    "scale, said",
    [
        ("x", "must be a number"),
        (torch.tensor([1.0, 2.0]), "must be one number"),
        (-1.0, "must be a positive number"),
        ("loss", "got a tensor that requires grad \\(the loss\\?\\)"),
    ],
)
def test_a_wrong_loss_scale_is_one_sentence(tmp_path, scale, said):
    model, optimizer = _model()
    with (
        pytest.raises(RecorderError, match=f"update\\(loss_scale\\) {said}"),
        Recorder(tmp_path / "run", model, optimizer) as rec,
    ):
        loss = model(torch.randn(3, 4)).sum()
        loss.backward()
        rec.micro(loss)
        optimizer.step()
        rec.update(loss if isinstance(scale, str) and scale == "loss" else scale)
    assert list(tmp_path.iterdir()) == []


def _add(model):
    model.register_parameter("extra", torch.nn.Parameter(torch.zeros(2)))


def _replace(model):
    model.weight = torch.nn.Parameter(torch.zeros(2, 4))


def _resize(model):
    model.weight.data = torch.zeros(3, 4)


def _remove(model):
    del model.bias
    model.bias = None


@pytest.mark.parametrize(
    "change, said",
    [
        (_add, "parameter extra was added during the run"),
        (_replace, "parameter weight was replaced by a new tensor during the run"),
        (_resize, r"parameter weight changed shape from \(2, 4\) to \(3, 4\)"),
        (_remove, "parameter bias was removed from the model during the run"),
    ],
)
def test_parameters_changed_during_the_run_are_refused_not_recorded_stale(tmp_path, change, said):
    model, optimizer = _model()
    with (
        pytest.raises(RecorderError, match=said),
        Recorder(tmp_path / "run", model, optimizer) as rec,
    ):
        _step(rec, model, optimizer)
        change(model)
        rec.micro(1.0, batch=(torch.zeros(3, 4), torch.zeros(3, 2)))
        optimizer.step()
        rec.update()
    assert list(tmp_path.iterdir()) == []


def test_an_out_dir_that_cannot_be_written_is_a_recorder_error(tmp_path):
    (tmp_path / "file").write_text("mine")
    model, optimizer = _model()
    for out in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(RecorderError, match="file"):
            Recorder(out, model, optimizer)
    assert (tmp_path / "file").read_text() == "mine"


def test_two_open_recorders_on_one_path_name_this_process(tmp_path):
    model, optimizer = _model()
    with Recorder(tmp_path / "run", model, optimizer) as rec:
        with pytest.raises(RecorderError, match="being written already by this process"):
            Recorder(tmp_path / "run", *_model())
        _step(rec, model, optimizer)
    assert (tmp_path / "run" / "manifest.json").is_file()


def test_a_recorder_never_closed_leaves_nothing_when_the_process_exits(tmp_path):
    script = (
        "import torch, gradalign\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "rec = gradalign.Recorder('run', m, o)\n"
        "rec.micro(1.0); o.step(); rec.update()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True)
    assert list(tmp_path.iterdir()) == []


def test_integrations_refuse_wrong_arguments_in_one_sentence(tmp_path):
    pytest.importorskip("lightning")
    from gradalign.record.integrations.lightning import GradalignCallback

    with pytest.raises(BadInput, match="accum_steps must be a positive integer, got '2'"):
        GradalignCallback(tmp_path / "run", accum_steps="2")
    with pytest.raises(RecorderError, match="config must be a dict"):
        GradalignCallback(tmp_path / "run", config=[1])
    from gradalign.record.integrations.batches import count_items

    with pytest.raises(RecorderError, match="the items function's result must be a number"):
        count_items({}, lambda batch: "many")


def test_accelerate_recording_refuses_a_missing_model_or_optimizer(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from gradalign.record.integrations.accelerate import AccelerateRecording

    accelerator = Accelerator(cpu=True)
    model, optimizer = _model()
    with pytest.raises(BadInput, match="needs the model"):
        AccelerateRecording(accelerator, None, optimizer, tmp_path / "run")
    with pytest.raises(BadInput, match=r"optimizer must be a torch\.optim\.Optimizer"):
        AccelerateRecording(accelerator, model, tmp_path / "run", optimizer)
    with pytest.raises(RecorderError, match="config must be a dict"):
        AccelerateRecording(accelerator, model, optimizer, tmp_path / "run", config=[1])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::DeprecationWarning", "ignore:.*treespec, LeafSpec"
)
def test_a_lightning_fit_without_an_optimizer_is_refused_in_one_sentence(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from gradalign.record.integrations.lightning import GradalignCallback

    class NoOptimizer(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return None

    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[GradalignCallback(tmp_path / "run")],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    with pytest.raises(BadInput, match=r"configure_optimizers\(\) returned no optimizer"):
        trainer.fit(NoOptimizer(), torch.utils.data.DataLoader(data, batch_size=4))
    assert not (tmp_path / "run").exists()


def test_items_or_batch_given_on_some_ranks_only_is_refused_at_close():
    """Rank 1 gave items= and rank 0 did not: the run was written, and compare refused it
    naming the series (`micro/items`, `micro/data`), not what the loop gave. The ranks' parts
    are checked before anything is written (record/distributed.py)."""
    from gradalign.record.distributed import _mismatch

    def part(rank: int, **extra: np.ndarray) -> dict:
        series = {"micro/loss": np.ones(4), "update/state": np.ones((2, 1)), **extra}
        return {"info": {"rank": rank}, "series": series}

    assert _mismatch([part(0), part(1)]) is None
    both = {"micro/items": np.ones(4)}
    assert _mismatch([part(0, **both), part(1, **both)]) is None
    said = _mismatch([part(0), part(1, **both)])
    assert said is not None and "items= on rank(s) 1 and not on the others" in said
    said = _mismatch([part(0, **{"micro/data": np.ones(4)}), part(1)])
    assert said is not None and "batch= on rank(s) 0" in said


def test_ranks_that_recorded_other_numbers_of_micro_steps_are_refused_saying_why():
    """Ranks whose loaders gave them unequal numbers of batches record the same updates in other
    numbers of micro-steps (accelerate's even_batches=False: 12 and 11 micro-steps in 6 updates
    on 2 processes); the refusal says so. Other numbers of updates are refused plainly."""
    from gradalign.record.distributed import _mismatch

    def part(rank: int, micro: int, updates: int) -> dict:
        series = {"micro/loss": np.ones(micro), "update/state": np.ones((updates, 1))}
        return {"info": {"rank": rank}, "series": series}

    said = _mismatch([part(0, 12, 6), part(1, 11, 6)])
    assert said is not None and said.startswith("rank 1 recorded 11 micro-steps and 6 updates")
    assert "unequal numbers of batches" in said and "even_batches=False" in said
    said = _mismatch([part(0, 12, 6), part(1, 10, 5)])
    assert said is not None and "unequal" not in said


def test_a_reference_given_as_a_path_is_taken_as_out_dir_is(tmp_path):
    """`Recorder(..., reference=Path("../ref"))` was refused ("must be a non-empty string, got
    PosixPath") where out_dir takes a Path; the manifest names it as given."""
    model, optimizer = _model()
    with Recorder(tmp_path / "run", model, optimizer, reference=Path("../ref")) as rec:
        _step(rec, model, optimizer)
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["reference"] == "../ref"


@pytest.mark.parametrize("layer", ["linear", "batchnorm"])
def test_a_lazy_module_not_yet_initialized_is_refused_in_a_sentence(tmp_path, layer):
    """Lazy layers shape their tensors at the first forward: before it the Recorder raised
    torch's own error pointing at load_state_dict. One sentence, nothing written; after one
    forward the same model records."""
    lazy = torch.nn.LazyLinear(3) if layer == "linear" else torch.nn.LazyBatchNorm1d()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), lazy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RecorderError, match=r"lazy module not yet initialized .* run one forward"):
        Recorder(tmp_path / "run", model, opt, accum_steps=1)
    assert not (tmp_path / "run").exists()
    model(torch.randn(2, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model, opt, accum_steps=1) as rec:
        x = torch.randn(3, 4)
        loss = model(x).square().mean()
        loss.backward()
        rec.micro(loss, batch=x)
        opt.step()
        rec.update()
    assert (tmp_path / "run" / "manifest.json").exists()
