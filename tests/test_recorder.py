"""A hand-written accumulation loop (not the built-in trainer) records through `Recorder`, and the
judge treats its runs exactly like the built-in ones."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn

import gradalign
from gradalign.judge.compare import compare
from gradalign.record.recorder import RecorderError
from gradalign.runs.reader import read_run_dir


def make_data(batch: int, updates: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch * updates, 12, generator=g)
    y = (x[:, :3].sum(dim=1) > 0).long()
    return x, y


BUGS = {  # the bug a user's loop may have -> the diagnosis code the judge must name
    "no-loss-scale": "loss-scale",
    "double-loss-scale": "loss-scale",
    "loss-plus-scaled": "loss-scale",
    "zero-grad-every-micro": "zero-grad-in-window",
    "step-every-micro": "step-in-window",
    "scheduler-every-micro": "lr-schedule",
    "clip-every-micro": "clip-per-micro",
    "clip-value-every-micro": "clip-per-micro",
    "clip-value-over-k": "clip-threshold",
    "data-order": "data-order",
    "dropout-reseed": "dropout-rng",
    "bf16-accum": "grad-accum-dtype",
    "no-zero-grad": "grad-not-cleared",
    "penalty-every-micro": "penalty-not-scaled",
    "scaler-every-micro": "scaler-per-micro",
    "skip-last-backward": "micro-batch-missing",
    "edit-weights-every-micro": "weights-changed-in-window",
    "lr-times-k": "lr-scaled",
    "log-scaled-loss": "loss-averaging",
    "double-loss-scale-logged": "loss-scale",
    "forget-update": "window-bookkeeping",
}


def user_loop(
    out,
    k: int,
    *,
    bug: str | None = None,
    batch: int = 32,
    updates: int = 5,
    optimizer: str = "sgd",
    schedule: bool = False,
    clip: float | None = None,
    clip_value: float | None = None,
    dropout: float = 0.0,
    dtype: torch.dtype = torch.float32,
    penalty: float = 0.0,
    fp16: bool = False,
    wrap=None,
    plateau: bool = False,
):
    """A user's own loop: their model, data, loss, optimizer and schedule; gradalign records.
    `wrap(model)`: the module the loop calls and gives the Recorder (torch.compile's);
    `plateau`: ReduceLROnPlateau stepped on each window's mean loss, after the step."""
    torch.manual_seed(3)
    layers = [nn.Linear(12, 20), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else [])
    model = nn.Sequential(*layers, nn.Linear(20, 2)).to(dtype)
    lr_scale = k if bug == "lr-times-k" else 1
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.5 * lr_scale, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-2 * lr_scale)
    )
    scaler = torch.amp.GradScaler("cpu") if fp16 and dtype == torch.float32 else None
    # linear decay: stepped per micro-step, it is no constant multiple of the baseline's (an
    # inverse-time schedule 1/(1+u) would be: then lr-scaled and lr-schedule look alike)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: max(0.05, 1 - u / 40))
    on_loss = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    x, y = make_data(batch, updates)
    x = x.to(dtype)
    micro = batch // k
    window_loss = 0.0
    order = torch.randperm(updates * k, generator=torch.Generator().manual_seed(1))
    net = model if wrap is None else wrap(model)
    with gradalign.Recorder(
        out, net, opt, accum_steps=k, config={"user": True}, scaler=scaler
    ) as rec:
        for update in range(updates):
            for j in range(k):
                step = update * k + j
                if bug == "zero-grad-every-micro":
                    opt.zero_grad()
                if bug == "dropout-reseed":
                    torch.manual_seed(100 + step)
                index = int(order[step]) if bug == "data-order" else step
                if bug == "late-repeat-no-loss-scale" and update >= 2:  # no set_epoch
                    index = (update % 2) * k + j
                rows = slice(index * micro, (index + 1) * micro)
                with torch.autocast("cpu", torch.float16, enabled=scaler is not None):
                    logits = net(x[rows])
                loss = nn.functional.cross_entropy(logits.float(), y[rows])
                scaled = {
                    "no-loss-scale": loss,
                    "late-repeat-no-loss-scale": loss,
                    "bf16-accum-no-loss-scale": loss,
                    "double-loss-scale": loss / k / k,
                    "double-loss-scale-logged": loss / k / k,
                    "loss-plus-scaled": loss + loss / k,
                }.get(bug or "", loss / k)
                if penalty:  # an L2 penalty in the loss: its share 1/K per micro-batch
                    share = 1 if bug == "penalty-every-micro" else k
                    scaled = (
                        scaled + penalty * sum(p.pow(2).sum() for p in model.parameters()) / share
                    )
                if not (bug == "skip-last-backward" and j == k - 1):
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                if bug in ("bf16-accum", "bf16-accum-no-loss-scale"):  # a bfloat16 running sum
                    for p in model.parameters():
                        low = p.grad.bfloat16()
                        if getattr(p, "low", None) is not None:
                            low = low + p.low
                        p.low, p.grad = (None, low.float()) if j == k - 1 else (low, None)
                logged = bug in ("log-scaled-loss", "double-loss-scale-logged")
                given = loss * 1.003 if bug == "log-loss-off" else loss
                rec.micro(given / k if logged else given, batch=(x[rows], y[rows]))
                window_loss += float(loss.detach()) / k
                if bug == "scaler-every-micro" and j < k - 1:
                    scaler.unscale_(opt)
                    scaler.update()
                if bug == "edit-weights-every-micro" and j < k - 1:
                    with torch.no_grad():
                        for p in model.parameters():
                            p.mul_(0.999)
                if bug == "clip-every-micro":
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                if bug == "clip-value-every-micro":
                    nn.utils.clip_grad_value_(model.parameters(), clip_value)
                if bug == "step-every-micro" and j < k - 1:
                    opt.step()
                if bug == "scheduler-every-micro" and j < k - 1:
                    sched.step()
            if scaler is not None and bug != "scaler-every-micro":
                scaler.unscale_(opt)
            norm = nn.utils.clip_grad_norm_(model.parameters(), clip) if clip else None
            if clip_value is not None:
                value = clip_value / k if bug == "clip-value-over-k" else clip_value
                nn.utils.clip_grad_value_(model.parameters(), clip_value=value)
            rec.grads(pre_clip_norm=norm)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if schedule:
                sched.step()
            if plateau:
                on_loss.step(window_loss)
            window_loss = 0.0
            if not (bug == "forget-update" and update == 1):
                rec.update()
            if bug != "no-zero-grad":
                opt.zero_grad()
    return read_run_dir(out)


def setup_for(bug: str | None) -> dict:
    """The setup in which a bug can show: a schedule, clipping that engages, dropout."""
    return {
        "scheduler-every-micro": {"schedule": True},
        "clip-every-micro": {"clip": 0.05},
        "clip-value-every-micro": {"clip_value": 0.01},
        "clip-value-over-k": {"clip_value": 0.01},
        # divided by K twice, and the loss given to backward recorded (as accelerate does): a
        # clip under both runs' norms makes the steps agree within float16's noise (in float32,
        # clip_grad_norm_'s 1e-6 beside a 16x smaller norm tells them apart)
        "double-loss-scale-logged": {"clip": 0.02, "fp16": True},
        "dropout-reseed": {"dropout": 0.2},
        "penalty-every-micro": {"penalty": 1e-3},
        "scaler-every-micro": {"fp16": True, "optimizer": "adamw"},
    }.get(bug or "", {})


def judged(tmp_path, bug: str | None, **setup):
    base = user_loop(tmp_path / "b", 1, **setup)
    ref = user_loop(tmp_path / "r", 1, dtype=torch.float64, **setup)
    merged = user_loop(tmp_path / "m", 4, bug=bug, **setup)
    return compare(base, merged, reference=ref)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize(
    "setup",
    [
        *({}, {"schedule": True, "clip": 0.05}, {"clip_value": 0.01}, {"dropout": 0.2}),
        *({"penalty": 1e-3}, {"fp16": True}),
    ],
)
def test_clean_user_loop_passes_within_its_noise(tmp_path, optimizer, setup):
    result = judged(tmp_path, None, optimizer=optimizer, **setup)
    assert result.verdict == "pass", [c for c in result.checks if c.status == "fail"]
    assert {c.name: c.status for c in result.checks}["gradients"] == "pass"
    close = 1e-2 if setup.get("fp16") else 1e-5  # float16 autocast's own gradient noise
    assert all(abs(r.grad_ratio - 1) < close for r in result.results)
    assert [d.severity for d in result.diagnosis].count("error") == 0
    assert result.diagnosis[0].code == "within-noise"


@pytest.mark.filterwarnings("ignore:Detected call of")
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_user_loop_bug_is_named(tmp_path, bug):
    setup = setup_for(bug)
    optimizer = setup.pop("optimizer", "sgd")
    result = judged(tmp_path, bug, optimizer=optimizer, **setup)
    assert result.verdict == "fail"
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert codes[:1] == [BUGS[bug]], [(d.code, d.message) for d in result.diagnosis]


def test_losses_recorded_off_by_a_ratio_not_k_are_loss_averaging_alone(tmp_path):
    """The same training, its losses recorded 1.003 times as large: weights and gradients
    agree, so no training difference is named beside `loss-averaging` (`cross-sample-loss`
    was, its own evidence a gradient cosine of 1)."""
    result = judged(tmp_path, "log-loss-off")
    status = {c.name: c.status for c in result.checks}
    assert (status["losses"], status["weights"], status["gradients"]) == ("fail", "pass", "pass")
    assert [d.code for d in result.diagnosis] == ["loss-averaging"], result.diagnosis


def test_a_bug_from_update_0_is_named_before_other_samples_from_a_later_window(tmp_path):
    """Losses not divided by K, and from update 2 the windows of updates 0 and 1 again (a
    sampler without set_epoch): `data-order` (first: update 2) was named alone, though the
    gradient fails from update 0, where the windows held their baseline batches."""
    result = judged(tmp_path, "late-repeat-no-loss-scale")
    assert result.first_divergence["update"] == 0
    assert errors_of(result) == ["loss-scale", "data-order"], result.diagnosis
    assert result.diagnosis[1].evidence["first_update"] == 2
    # the windows of updates 2, 3 hold the batches of 0, 1: set_epoch is said
    assert result.diagnosis[1].evidence["batches_of_earlier_updates"] == {2: 0, 3: 1, 4: 0}
    assert "without set_epoch(epoch)" in result.diagnosis[1].message
    shuffled = judged(tmp_path / "shuffled", "data-order").diagnosis[0]  # other mixtures
    assert shuffled.code == "data-order" and "set_epoch" not in shuffled.message


def test_a_loss_not_divided_by_k_beside_a_16_bit_buffer_is_named_with_it(tmp_path):
    """The gradient on bfloat16's grid and 4 times too large: `grad-accum-dtype` was named
    alone, its 'gradient 3 off' far beyond any rounding (so was a DDP fp16 hook beside it)."""
    result = judged(tmp_path, "bf16-accum-no-loss-scale")
    assert errors_of(result) == ["loss-scale", "grad-accum-dtype"], result.diagnosis
    alone = judged(tmp_path / "alone", "bf16-accum")
    assert errors_of(alone) == ["grad-accum-dtype"], alone.diagnosis


def errors_of(result) -> list[str]:
    return [d.code for d in result.diagnosis if d.severity == "error"]


@pytest.mark.parametrize("bug", ["no-loss-scale", "clip-every-micro"])
def test_a_gradient_bug_in_a_model_with_dropout_is_named_by_its_own_code(tmp_path, bug):
    """Dropout whose masks match: the loss at update 0 agrees, so the masks did not differ,
    and the gradient's own shape names the bug (not `dropout-rng`)."""
    setup = {**setup_for(bug), "dropout": 0.2}
    result = judged(tmp_path, bug, **setup)
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert result.results[0].loss_ok and codes[:1] == [BUGS[bug]], codes


@pytest.mark.parametrize(("bug", "expected"), [("no-loss-scale", 4), ("double-loss-scale", 0.25)])
def test_a_loss_scale_where_one_run_alone_clips_is_read_before_the_clip(tmp_path, bug, expected):
    """The baseline's norms are 0.32-0.41: a clip at 0.5 engages only on the gradient K times
    too large, a clip at 0.2 only on the correct one. The gradients stepped with are then some
    other multiple; the norms before clipping keep K (or 1/K)."""
    clip = 0.5 if expected > 1 else 0.2
    result = judged(tmp_path, bug, clip=clip)
    found = result.diagnosis[0]
    assert found.code == "loss-scale", [(d.code, d.message) for d in result.diagnosis]
    assert found.evidence["expected_ratio"] == expected
    assert found.evidence["pre_clip_ratio"] == pytest.approx(expected, rel=1e-3)
    assert abs(found.evidence["grad_ratio"] / expected - 1) > 0.05
    assert "before clipping" in found.message


def test_a_clip_by_value_inside_the_window_is_counted_and_named(tmp_path):
    """clip_grad_value_ is seen like clip_grad_norm_: its calls are counted and its value kept.
    Applied to each partial sum, with elements at the clip value, it is `clip-per-micro`."""
    result = judged(tmp_path, "clip-value-every-micro", clip_value=0.01)
    base, merged = read_run_dir(tmp_path / "b"), read_run_dir(tmp_path / "m")
    assert list(base.clip_calls) == [1] * 5 and list(merged.clip_calls) == [5] * 5
    assert list(merged.clip_value) == [0.01] * 5 and base.grad_norm_pre_clip is None
    found = result.diagnosis[0]
    assert found.code == "clip-per-micro" and "clip_grad_value_ called 5 times" in found.message
    assert found.evidence["elements_at_clip_value"]["baseline"] > 0


def test_a_clip_by_value_that_never_engages_changes_nothing_and_passes(tmp_path):
    """Clipping each partial sum at a value no element reaches is harmless: it passes."""
    base = user_loop(tmp_path / "b", 1, clip_value=10.0)
    merged = user_loop(tmp_path / "m", 4, bug="clip-value-every-micro", clip_value=10.0)
    assert list(merged.clip_calls) == [5] * 5
    assert compare(base, merged).verdict == "pass"


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


def test_a_loss_scale_a_clip_hides_is_named_alone(tmp_path):
    """The loss K times too large under a clip that engages in both runs: the stepped gradients
    nearly agree, the norms before clipping are K apart. `loss-scale` alone: what is left once
    K is divided out is within the gradient's noise, so no second cause is named."""
    result = judged(tmp_path, "no-loss-scale", clip=0.05)
    codes = [d.code for d in result.diagnosis if d.severity == "error"]
    assert codes == ["loss-scale"], [(d.code, d.message) for d in result.diagnosis]
    assert "before clipping" in result.diagnosis[0].message


def test_user_loop_missing_loss_scale_fails_at_update_0(tmp_path):
    result = compare(
        user_loop(tmp_path / "b", 1), user_loop(tmp_path / "m", 4, bug="no-loss-scale")
    )
    assert result.verdict == "fail"
    assert result.first_divergence == {"update": 0, "parameter": "0.weight", "in": "gradient"}
    assert result.results[0].grad_ratio == pytest.approx(4.0, rel=1e-5)
    assert result.diagnosis[0].evidence["expected_ratio"] == 4


def test_user_loop_stepping_inside_the_window_fails(tmp_path):
    base = user_loop(tmp_path / "b", 1)
    merged = user_loop(tmp_path / "m", 4, bug="step-every-micro")
    result = compare(base, merged)
    checks = {c.name: c for c in result.checks}
    assert checks["no weight change inside a window"].status == "fail"
    # micro-step 1 computed with other weights: the step was taken at micro-step 0
    detail = checks["no weight change inside a window"].detail
    assert "changed at micro-step 0 (position 1 of 4), before micro-step 1" in detail
    assert checks["optimizer steps"].status == "fail"
    assert "4 optimizer step(s) in merged, 1 in baseline" in checks["optimizer steps"].detail
    assert result.first_divergence["update"] == 0


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


@pytest.mark.parametrize("bug", ["zero-grad-every-micro", "no-loss-scale"])
def test_a_learning_rate_that_follows_the_divergence_does_not_hide_its_cause(tmp_path, bug):
    """ReduceLROnPlateau stepped on each window's loss: a bug that diverges the loss at update 0
    makes the merged run cut its learning rate at other updates. That difference came after the
    gradients failed and fits no schedule, so it is a consequence: the bug is named, not
    `lr-schedule` (it was, and alone). The clean loop passes with the same scheduler."""
    setup = {"updates": 10, "plateau": True}
    base = user_loop(tmp_path / "base", 1, **setup)
    assert compare(base, user_loop(tmp_path / "clean", 4, **setup)).verdict == "pass"
    merged = user_loop(tmp_path / "merged", 4, bug=bug, **setup)
    assert not np.array_equal(base.lr, merged.lr)  # the bug's loss made it cut the lr
    codes = [d.code for d in compare(base, merged).diagnosis]
    assert codes[0] == BUGS[bug] and "lr-schedule" not in codes, codes


@pytest.mark.parametrize("bug", ["no-loss-scale", "double-loss-scale"])
def test_a_loss_scale_clip_grad_value_turned_is_read_below_the_clip_value(tmp_path, bug):
    """clip_grad_value_ at 0.02 clips most of a gradient 4 times too large to the value, so the
    gradient stepped with points elsewhere (cosine 0.90) and was `cross-sample-loss`. The
    elements both runs left below the value hold the scale whole: named `loss-scale`."""
    setup = {"clip_value": 0.02, "optimizer": "adamw"}
    c = compare(
        user_loop(tmp_path / "b", 1, **setup), user_loop(tmp_path / "m", 4, bug=bug, **setup)
    )
    assert c.results[0].grad_cosine < 0.95
    (found,) = [d for d in c.diagnosis if d.severity == "error"][:1]
    assert found.code == "loss-scale" and "below the clip value" in found.message
    assert found.evidence["below_clip_value"] is True
