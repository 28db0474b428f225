"""Sketch mode (`--record sketch`, `Recorder(record="sketch")`): what a run keeps, the estimator's
bound, and verdicts and codes equal to full recording (bench/sketch_agreement.py runs the whole
selftest both ways)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gradalign import Recorder, api
from gradalign.record import facts
from gradalign.record.facts import RecorderError, fingerprint
from gradalign.record.sketcher import Sketcher, negative_signs, packed_signs, unpacked_signs
from gradalign.runs import sketches
from gradalign.runs.digests import bitsum
from gradalign.runs.reader import read_run_dir
from gradalign.runs.sketches import WHOLE_1D, WIDTH, estimate, summarize
from gradalign.runs.summaries import _signs
from tests.conftest import SMALL
from tests.devices import DEVICES

# hidden=64 makes the first layer 784x64 = 50176 elements: far more than the sketch width
CONFIG = SMALL.replace(hidden=64, updates=5, record="sketch")


@pytest.fixture(scope="module")
def sketched(tmp_path_factory):
    root = tmp_path_factory.mktemp("sketched")
    base = api.record_baseline(CONFIG, root / "baseline")
    return {
        "root": root,
        "baseline": base,
        "clean": api.record_merged(CONFIG, root / "clean"),
        "no-loss-scale": api.record_merged(CONFIG, root / "bug", fault="no-loss-scale"),
    }


def test_a_sketch_run_keeps_full_files_at_the_first_and_last_update_only(sketched):
    run = sketched["clean"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["record"] == "sketch"
    snapshots = [0, CONFIG.updates - 1]
    assert manifest["sketch"] == {"width": WIDTH, "whole_1d": WHOLE_1D, "snapshots": snapshots}
    weights = sorted(p.name for p in (run / "weights").iterdir())
    assert weights == ["init.safetensors", "update_000000.safetensors", "update_000004.safetensors"]
    assert len(list((run / "sketches").iterdir())) == CONFIG.updates + 1
    loaded = read_run_dir(run)
    assert loaded.record == "sketch" and loaded.snapshots == {0, 4}
    kept = loaded.sketches(2)
    assert kept["weights/0.weight"].shape == (WIDTH,)
    assert kept["norms/weights"].shape == (len(loaded.tensors),)


def test_sketch_norms_are_exact_and_sketches_subtract():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 70)).astype(np.float32), rng.normal(size=(300, 70))
    sa, sb = summarize(a), summarize(b.astype(np.float32))
    assert math.isclose(sa.sumsq, float(np.sum(a.astype(np.float64) ** 2)), rel_tol=1e-12)
    both = summarize(a.astype(np.float64) - b.astype(np.float32))
    assert np.allclose(sa.sketch - sb.sketch, both.sketch, rtol=0, atol=1e-9)
    small = summarize(np.arange(5, dtype=np.float32))
    assert small.sketch.tolist() == [0, 1, 2, 3, 4] and estimate(small.sketch, True).exact


@pytest.mark.parametrize("device", DEVICES)
def test_device_signs_are_the_formats_signs_one_bit_each(device):
    for first, count in [(0, 1000), (2**33 + 5, 777), (2**62, 64)]:
        found = negative_signs(first, count, device).cpu().numpy()
        assert (found == (_signs(first, count) < 0)).all()
    n = 100_003
    packed = packed_signs(n, device)
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8
    for first, count in [(0, n), (8 * 1000, 5000), (8 * 12500, 3)]:
        want = np.where(_signs(first, count) < 0, -1, 1)
        assert (unpacked_signs(packed, first, count).cpu().numpy() == want).all()


def test_host_signs_from_bits_or_made_per_block_are_the_same(monkeypatch):
    n = 100_003
    monkeypatch.setattr(sketches, "_bits", {})
    cached = sketches.flips(n)
    assert sketches._bits[n].nbytes == (n + 7) // 8  # one bit per element
    monkeypatch.setattr(sketches, "_BITS_BYTES", 0)  # no room: made for each block
    made = sketches.flips(2 * n)
    for first, count in [(0, n), (8 * 1000 + 3, 5000), (n - 5, 5)]:
        want = _signs(first, count)
        assert (cached(first, count) == want).all() and (made(first, count) == want).all()
    x = np.random.default_rng(3).normal(size=2 * n).astype(np.float32)
    without = summarize(x)
    monkeypatch.setattr(sketches, "_BITS_BYTES", 1 << 28)
    with_bits = summarize(x)
    assert np.array_equal(without.sketch, with_bits.sketch) and without.sumsq == with_bits.sumsq


@pytest.mark.parametrize("device", DEVICES)
def test_a_fingerprint_summed_by_blocks_is_the_whole_sum(monkeypatch, device):
    """Large tensors are fingerprinted a block at a time (torch sums through an int64 copy)."""
    monkeypatch.setattr(facts, "_FINGERPRINT_BLOCK", 1000)
    rng = torch.Generator().manual_seed(0)
    for n in (999, 1000, 1001, 30_011):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            x = (torch.randn(n, generator=rng) * 1e30).to(dtype)  # bits that wrap an int64 sum
            host = (x.view(torch.int16) if dtype == torch.bfloat16 else x).numpy()
            assert int(fingerprint(x.to(device))) == bitsum(host)
        square = torch.randn(200, 151, generator=rng).T.to(device)  # not contiguous
        assert int(fingerprint(square)) == bitsum(square.cpu().numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_device_summary_equals_the_host_summary(dtype, device):
    """Sketcher's torch path (the path of a recording on CUDA) against numpy's."""
    sketcher = Sketcher(None, [], {}, 61)  # type: ignore[arg-type]
    for n, whole in (
        (10, True),
        (61, True),
        (62, False),
        (62, True),
        (8 * 61 * 3 + 5, False),
        (30_011, False),
    ):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
        for infinite in (False, True):
            if infinite:  # an attention mask's infinities, held apart in a sketched tensor
                x[::7], x[3::11] = float("-inf"), float("inf")
            live = x.to(device)
            on = sketcher._on_device(live, whole)
            assert {t.device.type for t in on} == {device}  # summarized where the tensor lives
            sums, sumsq, fp, held, count = (t.cpu() for t in on)
            assert torch.equal(live.cpu(), x)  # the live tensor is never written
            bf16 = dtype == torch.bfloat16  # numpy has no bfloat16: widened exactly
            values = (x.float() if bf16 else x).numpy()
            host = summarize(values, "bfloat16" if bf16 else None, 61, whole)
            assert int(fp) == host.fingerprint
            assert sums.numel() == (n if whole else 61)
            if infinite and whole:  # kept whole, the tensor is its own sketch
                assert host.held is None and int(count) == 0
                assert np.array_equal(sums.numpy(), host.sketch)
                continue
            assert np.allclose(sums.numpy(), host.sketch, rtol=1e-12, atol=1e-12)
            assert math.isclose(float(sumsq), host.sumsq, rel_tol=1e-12)
            assert int(count) == int(np.isinf(values).sum()) == (0 if host.held is None else count)
            if infinite:
                assert np.array_equal(held.numpy(), host.held) and np.any(host.held)


@pytest.mark.parametrize("seed", range(5))
def test_the_estimate_holds_within_its_bound(seed):
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=200_000)
    sparse = np.zeros(200_000)
    sparse[rng.integers(0, 200_000, 30)] = rng.normal(size=30) * 100
    for v in (dense, sparse):
        e = estimate(summarize(v).sketch, False)
        true = float(np.linalg.norm(v))
        assert e.low <= true <= e.high, (e, true)
    e = estimate(summarize(dense).sketch, False)
    assert e.high - e.low < 0.5 * e.value  # spread errors: a bound that says something


@pytest.mark.parametrize("seed", range(5))
def test_inner_product_bounds_hold(seed):
    """`inner_bounds` (a loss's slope along the weights' difference, from sketches) holds the
    true inner product, of a gradient with a small random step and with a step along it, and
    stays within Cauchy–Schwarz's reach of it."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=50_000)
    for step in (rng.normal(size=50_000) * 1e-6, 3e-7 * g + rng.normal(size=50_000) * 1e-7):
        low, high = sketches.inner_bounds(summarize(g).sketch, summarize(step).sketch)
        assert low <= float(g @ step) <= high
        assert high - low < np.linalg.norm(g) * np.linalg.norm(step)


def test_sketch_verdicts_equal_full_verdicts(sketched):
    clean = api.compare(sketched["baseline"], sketched["clean"])
    bug = api.compare(sketched["baseline"], sketched["no-loss-scale"])
    assert clean.verdict == "pass", [d.code for d in clean.diagnosis]
    assert bug.verdict == "fail" and bug.diagnosis[0].code == "loss-scale"
    sketched_names = {d.name for r in clean.results for d in r.weights if d.sketched}
    assert "0.weight" in sketched_names and "0.bias" not in sketched_names
    assert any(n.startswith("sketched:") for n in clean.notes)


def test_a_full_run_is_judged_against_a_sketched_one(sketched, tmp_path):
    full = api.record_merged(CONFIG.replace(record="full"), tmp_path / "full")
    result = api.compare(sketched["baseline"], full)
    assert result.verdict == "pass"
    assert any(d.sketched for r in result.results for d in r.weights)


def test_cli_records_with_sketches_and_json_says_which_checks_were_sketched(cli, sketched):
    out = sketched["root"] / "report.json"
    result = cli("compare", sketched["baseline"], sketched["clean"], "--json", out)
    assert result.code == 0, result.err
    tensors = json.loads(out.read_text())["per_update"][1]["weights"]
    assert any(t.get("sketched") for t in tensors)
    assert not all(t.get("sketched") for t in tensors)  # biases are kept whole


def test_bad_record_mode_is_a_one_line_error(cli, tmp_path):
    result = cli("selftest", "--out", tmp_path / "st", "--record", "tiny")
    assert result.code == 2 and "--record must be one of full, sketch" in result.err


def _user_run(out, k: int, **recorder) -> None:
    """Three updates of a small user loop (8 rows a batch) recorded through the Recorder."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 20, generator=generator), torch.randint(0, 3, (24,), generator=generator)
    _train(out, model, optimizer, k, x, y, 3, **{"record": "sketch", **recorder})


def _train(out, model, optimizer, k: int, x, y, updates: int, before=None, **recorder) -> None:
    """`updates` windows of len(x) / updates rows each, in K micro-batches, recorded;
    `before(update)` is called as each window begins."""
    batch = len(x) // updates
    with Recorder(out, model, optimizer, k, updates=updates, **recorder) as rec:
        for update in range(updates):
            if before is not None:
                before(update)
            for rows in torch.arange(update * batch, (update + 1) * batch).chunk(k):
                loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
                (loss / k).backward()
                rec.micro(loss, batch=(x[rows], y[rows]))
            optimizer.step()
            rec.update()
            optimizer.zero_grad()


def test_a_recorder_sketch_width_is_kept_and_judged(tmp_path):
    _user_run(tmp_path / "base", 1, sketch_width=31)
    _user_run(tmp_path / "merged", 4, sketch_width=31)
    manifest = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    assert manifest["sketch"] == {"width": 31, "whole_1d": WHOLE_1D, "snapshots": [0, 2]}
    result = api.compare(tmp_path / "base", tmp_path / "merged")
    assert result.verdict == "pass", [d.code for d in result.diagnosis]
    sketched = {d.name for r in result.results for d in r.weights if d.sketched}
    assert sketched == {"0.weight", "2.weight"}  # 320 and 48 elements; the biases are kept whole
    with pytest.raises(RecorderError, match="sketch_width must be an integer >= 2"):
        _user_run(tmp_path / "bad", 1, sketch_width=1)
    assert not (tmp_path / "bad").exists()


def test_runs_sketched_at_different_widths_are_refused_in_one_line(cli, tmp_path):
    _user_run(tmp_path / "base", 1, sketch_width=31)
    _user_run(tmp_path / "merged", 4, sketch_width=37)
    result = cli("compare", tmp_path / "base", tmp_path / "merged")
    assert result.code == 2, result.err
    assert "sketched at different widths" in result.err and "31" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_two_causes_are_both_named_in_sketch_mode_as_in_full(tmp_path):
    """tiny-lm+mean with its loss not divided by K: `loss-scale` beside `token-normalization`,
    in both modes. The same-direction bar reads the baseline's noise, not the allowed error a
    sketch's estimate widens (read that way, sketch mode named `loss-scale` alone)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "agreement.json"
    script = ROOT / "bench" / "sketch_agreement.py"
    args = [sys.executable, str(script), "--only", "tiny-lm+mean", "--json", str(out)]
    subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
    summary = json.loads(out.read_text())["summary"]
    assert summary["agree"] == summary["cases"] == summary["sketch_as_expected"] == 2, summary


class _KeyBiasAttention(torch.nn.Module):
    """One attention head whose key bias has a true gradient of 0 (the softmax over keys does
    not see a shift every score shares): each run's gradient there is rounding noise."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(1, 2) / 8**0.5
        return self.head((scores.softmax(-1) @ self.v(x)).mean(1))


def _adam_attention_run(out, k: int, record: str, model=None, width: int = 31) -> None:
    """Four updates of an attention head (`model`: another one) under Adam (lr 1e-2)."""
    torch.manual_seed(0)
    model = model() if model is not None else _KeyBiasAttention()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(64, 5, 8, generator=generator),
        torch.randint(0, 3, (64,), generator=generator),
    )
    _train(out, model, optimizer, k, x, y, 4, record=record, sketch_width=width)


@pytest.mark.parametrize("record", ["full", "sketch"])
def test_without_a_reference_a_key_bias_under_adam_is_judged_by_its_gradients(tmp_path, record):
    """Adam steps each element of the key bias by about lr where the noise points, in each run
    its own way: without a reference, such elements are judged by their gradients alone, in a
    tensor kept whole by a sketch as in a full run (sketch mode failed it: no drift there)."""
    _adam_attention_run(tmp_path / "base", 1, record)
    _adam_attention_run(tmp_path / "merged", 4, record)
    result = api.compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert result.verdict == "pass", [d.message for d in result.diagnosis]
    beyond = {d.name for r in result.results for d in r.weights if d.drift and d.drift > d.allowed}
    assert beyond == {"k.bias"}  # where the drift let an element stand beyond the tolerance
    assert "k.bias were judged by their gradients alone" in result.diagnosis[0].message
    assert "unseen there without a float64 reference" in result.diagnosis[0].message


class _FusedBiasAttention(_KeyBiasAttention):
    """The same head with query, key and value from one layer (GPT-2's c_attn): its bias of
    3·8 = 24 elements holds the key bias in its middle third."""

    def __init__(self, d: int = 8) -> None:
        super().__init__(d)
        del self.q, self.k, self.v
        self.qkv = torch.nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / 8**0.5
        return self.head((scores.softmax(-1) @ v).mean(1))


def _fused_run(out, k: int) -> None:
    _adam_attention_run(out, k, "sketch", _FusedBiasAttention, width=19)


def test_a_bias_wider_than_the_sketch_is_kept_whole_and_judged_by_its_gradients(
    tmp_path, monkeypatch
):
    """A 1-D tensor is kept whole up to `whole_1d` elements whatever the width: the fused
    bias (24 elements at width 19) is judged element by element, so without a reference its
    noise-dominated key part is judged by its gradients alone and the clean run passes. A run
    recorded before `whole_1d` (the manifest without it) sketched that bias: compared with it,
    both are seen through the stricter rule, the bias sketched in both."""
    _fused_run(tmp_path / "base", 1)
    _fused_run(tmp_path / "merged", 4)
    result = api.compare(tmp_path / "base", tmp_path / "merged", reference="none")
    assert result.verdict == "pass", [d.message for d in result.diagnosis]
    sketched = {d.name for r in result.results for d in r.weights if d.sketched}
    assert "qkv.bias" not in sketched and "qkv.weight" in sketched
    assert "qkv.bias were judged by their gradients alone" in result.diagnosis[0].message

    from gradalign.record import capture, sketcher

    def before_whole_1d(files, names, declared, width, shapes):
        return sketcher.Sketcher(files, names, declared, width)  # no shapes: whole_1d 0

    monkeypatch.setattr(capture, "Sketcher", before_whole_1d)
    _fused_run(tmp_path / "old", 4)
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    assert manifest["sketch"]["whole_1d"] == 0
    mixed = api.compare(tmp_path / "base", tmp_path / "old", reference="none")
    assert "qkv.bias" in {d.name for r in mixed.results for d in r.weights if d.sketched}
    # the same training: a tensor kept whole in both is judged the same, to the bit
    same = [[d.error for d in r.grads if d.name == "head.bias"] for r in result.results]
    assert [[d.error for d in r.grads if d.name == "head.bias"] for r in mixed.results] == same


def _decayed_run(out, k: int, dtype, decay_from: int | None = None, **recorder) -> None:
    """`_user_run`'s loop (SGD, 4 updates, sketched at width 31) in `dtype`; from update
    `decay_from` on, its first layer's weight decays (another training than the baseline's)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = model.to(dtype)
    first = [model[0].weight]
    rest = [p for p in model.parameters() if p is not model[0].weight]
    optimizer = torch.optim.SGD([{"params": first}, {"params": rest}], lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 20, generator=generator), torch.randint(0, 3, (32,), generator=generator)

    def decay(update: int) -> None:
        if update == decay_from:
            optimizer.param_groups[0]["weight_decay"] = 0.5

    recorder = {"record": "sketch", "sketch_width": 31, **recorder}
    _train(out, model, optimizer, k, x.to(dtype), y, 4, before=decay, **recorder)


@pytest.mark.parametrize("decay_from", [None, 1])
def test_a_reference_parting_at_a_sketched_update_is_refused_there(tmp_path, decay_from):
    """A float64 "rerun" whose sketched first layer decays from update 1 on strays from the
    baseline at an update without full files: the reference is refused there, its sketched
    check allowing only the noise the sketches of the gradients estimate
    (judge/sketch_drift.py). The true float64 rerun is kept."""
    from gradalign.errors import BadInput

    _decayed_run(tmp_path / "ref", 1, torch.float64, decay_from)
    _decayed_run(tmp_path / "base", 1, torch.float32, reference="../ref")
    _decayed_run(tmp_path / "merged", 4, torch.float32)
    if decay_from is None:
        assert api.compare(tmp_path / "base", tmp_path / "merged").verdict == "pass"
        return
    with pytest.raises(
        BadInput,
        match=r"not a rerun of the baseline.s training: at update 1 the baseline.s 0\.weight",
    ) as refused:
        api.compare(tmp_path / "base", tmp_path / "merged")
    # the estimate was a sketch's: the message names the full rerun that reads each element
    assert "estimated from the sketches" in str(refused.value)
    assert "`--record full --updates 2`" in str(refused.value)
