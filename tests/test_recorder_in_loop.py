"""What the Recorder does inside a hand-written loop: a run interrupted leaves nothing and keeps
the earlier one; calls and models it cannot record (a loss that is not one number, shards it
cannot gather) are refused; it counts zero_grad() inside a window without touching the instances,
reads the norms before clipping on the host only when the run closes, records a compiled model
under its own names, compiled once, and drops its hooks after the first micro-step."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.record.recorder import RecorderError
from gradalign.runs.reader import read_run_dir

from .user_loop import user_loop


def test_a_loss_that_is_not_one_number_and_a_run_without_updates_are_refused(tmp_path):
    """micro() given the batch where the loss goes: a RecorderError naming the call."""
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=1)
    with pytest.raises(RecorderError, match=r"micro\(loss\) must be one number"):
        rec.micro(torch.ones(4, 3))
    with pytest.raises(RecorderError, match="no update was recorded"):
        rec.close()
    assert not (tmp_path / "run").exists()


def test_interrupted_loop_leaves_no_run_and_keeps_the_old_one(tmp_path):
    out = tmp_path / "run"
    user_loop(out, 2, updates=2)
    before = (out / "manifest.json").read_bytes()
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt), gradalign.Recorder(out, model, opt) as rec:
        rec.micro(model(torch.ones(1, 3)).sum())
        raise KeyboardInterrupt
    assert (out / "manifest.json").read_bytes() == before  # the earlier complete run survives
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging directory left behind
    assert read_run_dir(out).updates == 2


def test_interrupted_first_run_leaves_nothing_readable(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError), gradalign.Recorder(tmp_path / "new", model, opt):
        raise RuntimeError("boom")
    assert not (tmp_path / "new").exists()


def test_recorder_rejects_calls_that_cannot_describe_any_run(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with (
        pytest.raises(RecorderError, match="items"),
        gradalign.Recorder(tmp_path / "r2", model, opt, accum_steps=2) as rec,
    ):
        rec.micro(torch.tensor(1.0), items=3)
        rec.micro(torch.tensor(1.0))
    with (
        pytest.raises(RecorderError, match="either loss"),
        gradalign.Recorder(tmp_path / "r4", model, opt, accum_steps=2) as rec,
    ):
        rec.micro()
    assert not list(tmp_path.iterdir())  # a recording stopped by an error leaves nothing
    with pytest.raises(RecorderError, match="accum_steps must be a positive integer"):
        gradalign.Recorder(tmp_path / "r3", model, opt, accum_steps=0)


def test_items_weight_the_window_mean(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with gradalign.Recorder(tmp_path / "r", model, opt, accum_steps=2) as rec:
        rec.micro(torch.tensor(1.0), items=1)
        rec.micro(torch.tensor(4.0), items=3)
        opt.step()
        rec.update()
    run = read_run_dir(tmp_path / "r")
    assert run.window_losses().tolist() == [pytest.approx((1.0 * 1 + 4.0 * 3) / 4)]


def test_zero_grad_calls_inside_a_window_are_counted_without_touching_the_instances(tmp_path):
    """zero_grad() between two micro-steps of a window is counted (the optimizer's and the
    model's); at a window's start, after its last micro-step or after its step it is not. The
    classes are watched, not the instances (the GradScaler's too): a deep copy of the model is
    not watched, and model, optimizer and scaler pickle."""
    import copy
    import pickle

    scaler = torch.amp.GradScaler("cpu")
    classes = (torch.optim.Optimizer, nn.Module, torch.amp.GradScaler)
    before = [dict(vars(cls)) for cls in classes]
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2, scaler=scaler) as rec:
        for update in range(3):
            opt.zero_grad()  # a window's start: not inside
            for micro in range(2):
                if update == 1 and micro == 1:
                    model.zero_grad()  # inside window 1
                model(x[micro * 4 : micro * 4 + 4]).sum().backward()
                rec.micro(torch.tensor(0.0))
                copy.deepcopy(model).zero_grad()  # a copy: not watched
            pickle.dumps(model), pickle.dumps(opt), pickle.dumps(scaler)
            if update == 2:
                opt.zero_grad()  # after the last micro-step: not inside, stepped or not
                rec.update()  # the step skipped, as a GradScaler skips one on inf
                continue
            opt.step()
            rec.update()
            opt.zero_grad()  # after the step: not inside
    run = read_run_dir(tmp_path / "run")
    assert list(run.zero_grads_inside) == [0, 1, 0]
    assert "zero_grad" not in vars(model) and "zero_grad" not in vars(opt)
    assert not {"unscale_", "update"} & set(vars(scaler))
    assert [dict(vars(cls)) for cls in classes] == before  # the classes as they were


class _ReadsCounted(torch.Tensor):
    """A tensor that notes each time its value is read on the host."""

    reads: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("item", "__float__", "tolist", "numpy", "__bool__", "__int__"):
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


def _clip_norm(model: nn.Module) -> torch.Tensor:
    return nn.utils.clip_grad_norm_(model.parameters(), 0.1).as_subclass(_ReadsCounted)


def _clip_split(model: nn.Module) -> torch.Tensor:  # torch's split API
    grads = [p.grad for p in model.parameters()]
    norm = nn.utils.get_total_norm(grads).as_subclass(_ReadsCounted)
    nn.utils.clip_grads_with_norm_(model.parameters(), 0.1, norm)
    return norm


@pytest.mark.parametrize("clip", [_clip_norm, _clip_split])
def test_norms_before_clipping_are_read_on_the_host_only_when_the_run_closes(tmp_path, clip):
    """On a GPU a host read of a norm waits for the device: the norm that clip_grad_norm_
    returns, or that clip_grads_with_norm_ is given (seen by the Recorder, or given to
    grads()), is kept as a tensor until close()."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    _ReadsCounted.reads, norms = [], []
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2) as rec:
        for update in range(2):
            for micro in range(2):
                model(x[micro * 4 : micro * 4 + 4]).sum().backward()
                rec.micro(torch.tensor(0.0))
            norm = clip(model)
            norms.append(norm)
            if update == 1:
                rec.grads(pre_clip_norm=norm)
            opt.step()
            rec.update()
            opt.zero_grad()
        assert _ReadsCounted.reads == []  # nothing read while training
    assert _ReadsCounted.reads  # read when the run closed: the test sees reads
    recorded = read_run_dir(tmp_path / "run").grad_norm_pre_clip
    assert recorded.tolist() == [float(n) for n in norms]


class FlatParameter(nn.Parameter):
    """Named as FullyShardedDataParallel's flat shard of many parameters."""


@pytest.mark.parametrize(
    ("shard", "said"),
    [("zero3", "weight is a DeepSpeed ZeRO-3 partition"), ("flat", "weight is a flat shard")],
)
def test_a_shard_that_cannot_be_gathered_is_refused_in_one_line(tmp_path, shard, said):
    """DeepSpeed ZeRO-3 marks each partitioned parameter with `ds_id`; FullyShardedDataParallel
    holds flat shards: each rank holds a part, which the Recorder cannot read whole."""
    model = nn.Linear(3, 2)
    if shard == "zero3":
        model.weight.ds_id = 0
    else:
        model.weight = FlatParameter(model.weight.detach().clone())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RecorderError, match=said):
        gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2)
    assert not (tmp_path / "run").exists()


def test_a_compiled_model_is_recorded_under_its_own_names(tmp_path):
    """torch.compile wraps the model (its names gain `_orig_mod.`): the Recorder records the
    module inside, so a compiled baseline and a plain merged run (or a plain float64 rerun) name
    their tensors alike and are judged; before, they were refused as different models."""
    compiled = user_loop(tmp_path / "base", 1, wrap=lambda m: torch.compile(m, backend="eager"))
    assert [t.name for t in compiled.tensors] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    c = compare(compiled, user_loop(tmp_path / "merged", 4))
    assert c.verdict == "pass", [d.message for d in c.diagnosis]


def test_a_data_parallel_model_is_recorded_under_its_own_names(tmp_path):
    """nn.DataParallel wraps the model under `module.` as DDP does (on CPU it calls the module
    itself): its run was refused beside a plain one as "runs of different models"."""
    wrapped = user_loop(tmp_path / "base", 1, wrap=nn.DataParallel)
    assert [t.name for t in wrapped.tensors] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    c = compare(wrapped, user_loop(tmp_path / "merged", 4))
    assert c.verdict == "pass", [d.message for d in c.diagnosis]


def test_a_compiled_model_is_compiled_once_and_its_autocast_is_seen(tmp_path):
    """The hooks that watch the first forward for its compute dtype went after the first
    micro-step, and torch.compile guards a graph by its modules' hooks: the recorded model was
    compiled twice (2 graphs, 1 unrecorded). Hooks it traced now stay until the run closes,
    and still see the loop's float16 autocast."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = lambda m: torch.compile(m, backend="eager")  # noqa: E731
    run = user_loop(tmp_path / "base", 2, fp16=True, wrap=compiled)
    assert run.compute_dtype == "float16"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_uncompiled_hooks_go_after_the_first_micro_step(tmp_path):
    """The first micro-step showed the compute dtype: an eager model's forwards pay no hook
    after it."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    with gradalign.Recorder(tmp_path / "run", model, opt, accum_steps=2) as rec:
        with torch.autocast("cpu", torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        assert any(m._forward_pre_hooks for m in model.modules())
        (loss / 2).backward()
        rec.micro(loss, batch=x)
        assert not any(m._forward_pre_hooks for m in model.modules())
        (model(x).pow(2).mean() / 2).backward()
        rec.micro(loss, batch=x)
        opt.step()
        rec.update()
    assert read_run_dir(tmp_path / "run").compute_dtype == "bfloat16"
