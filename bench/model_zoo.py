"""False alarms across model families: clean accumulation runs that must all pass.

Each run draws one configuration from model family x optimizer x K (a fixed shuffle of the
grid, run i taking entry i), seeds the model and data with i, records a baseline (K=1), its
float64 reference and a merged run (K micro-batches of equal size, each loss divided by K),
and judges them as `gradalign compare` does. Every run is a correct accumulation, so every one
must pass; a failure is a false alarm, printed with its code and worst err/allowed.

Families: a GPT (pre-norm causal attention, GELU MLPs, tied head), a Transformer encoder (ReLU),
a GRU, a convolutional text model (ReLU, max-pooling), an MLP with LayerNorm and SiLU.
Optimizers: Adam (lr 1e-2 and 1e-3, eps 1e-6), AdamW with weight decay, RMSprop, Adagrad, SGD
with momentum, NAdam, RAdam, Adamax. K in 2, 4, 8; batch 48, 10 updates. `--optimizers` takes
others too: Adafactor (eps[0] unset, or set: adafactor-eps), Rprop, Adadelta, ASGD, SGD with
Nesterov momentum and weight decay, Muon for the matrices with AdamW for the rest (two
optimizers, the Recorder watching Muon), and transformers' Adafactor as the Trainer's
`optim="adafactor"` builds it (hf-adafactor; the transformers extra).

    .venv/bin/python bench/model_zoo.py [--runs 150] [--start 0] [--models gpt,encoder,...]
                                        [--optimizers adam-1e-2,...,muon-adamw]
                                        [--compute-dtype bfloat16]
                                        [--bug NAME] [--bug-from 0] [--updates 10]
                                        [--autocast [float16]] [--init-scale 4096]
                                        [--clip 1.0] [--schedule] [--reference-none]
                                        [--width 1] [--penalty 1e-3] [--ks 2,4,8] [--uneven]
                                        [--device cuda] [--emulate-tf32 [all]] [--seconds S]
                                        [--golden] [--strict]
                                        [--jsonl rows.jsonl]

`--autocast` runs each forward under autocast (bfloat16, or float16 with a GradScaler, which
`--init-scale S` starts at S instead of its own 65536: a penalty sums each loss in float32,
and the K=1 baseline's gradient then overflows at 65536 where the merged run's does not,
named `scaler-skips`);
`--width W` makes every model W times as wide (its `d`, and the widths that follow it; the
GPT's and the encoder's 4 heads stay 4). `--clip` clips the accumulated gradient's norm
before each step; `--schedule` warms the learning rate up over 2 updates and then decays it
on a cosine (a LambdaLR stepped once per update). `--penalty λ` adds λ·Σw² over every
parameter to each micro-batch's loss (an L2 penalty, as loops that write weight decay so do).
`--uneven` splits each window into K micro-batches of unequal sizes drawn anew per window (at
least one sample each), each loss weighted by its share of the batch and recorded with its item
count; `--ks` sets the grid's K values (any divisors of the batch of 48 without `--uneven`; 48
makes micro-batches of one sample).

`--bug` injects one bug into every merged run (no loss scaling, zero_grad or step every
micro-step, gradients never cleared, every learning rate times K, the scheduler stepped every
micro-step, the last micro-batch not backpropagated, the weights decayed between micro-steps,
the optimizer's step count advanced every micro-step, the micro-batches read shuffled, a clip
of every partial sum or at max_norm / K, the penalty not divided by K, the GradScaler unscaled
and updated every micro-step, gradients summed in bfloat16, the loss recorded divided by K);
then every run must fail, named first by that bug's code (bench/zoo_bugs.py, which says what
each needs of the loop).
`--bug-from U` injects it from update U on (a bug that starts late, after the runs may have
parted at kinks).
`--models` takes four more: `moe`, a mixture of experts (top 2 of 4, no balancing loss),
`moe-balance`, the same with a load-balancing loss over each forward's batch, which no merged
run can reproduce: its runs must fail, named `cross-sample-loss`; `resnet`, a residual CNN
(3x3 Conv2d, GroupNorm, ReLU) over the tokens' embeddings laid out as a 3x4 image; `lstm`, two
stacked LSTM layers. And eleven transformers models built from their configs with the library's
own initialization (bench/zoo_hf.py; transformers installed): `hf-gpt2`, `hf-llama` (RMSNorm,
rotary, SwiGLU, grouped-query attention), `hf-gptneox` (parallel residual, partial rotary),
`hf-opt` (ReLU), `hf-bloom` (ALiBi), `hf-gemma2` (soft-capped logits, a sliding window, GeGLU)
and three mixtures of experts with their experts fused in tensors of three axes (`hf-mixtral`,
`hf-qwen2moe` with a gated shared expert, `hf-gptoss` with experts' biases, attention sinks and
a sliding window; top 2 of 4) as causal LMs, `hf-bert` and `hf-deberta` (disentangled relative
attention) as sequence classifiers.

`--emulate-tf32` computes every float32 convolution from inputs rounded to TF32 (10 mantissa
bits), as cuDNN does by default on Ampere and later GPUs (bench/zoo_tf32.py); `--emulate-tf32
all` every linear map too, as cuBLAS does under torch's float32 matmul precision "high"; with
`--compute-dtype tf32` the runs declare it.
`--device cuda` puts the model, the data and the training on the GPU as a user's loop does:
no determinism flags (cuDNN picks its algorithms and may use TF32 for convolutions, atomics
add embedding gradients in any order); the float64 reference trains there too.

Torch runs on one thread (which threads sum what changes the draws, not the verdicts' odds).
A reference the judge refuses (exit 2) counts as a false alarm on a clean run, its message in the
row. A row's `norm` is how near the run came to failing the check "gradient norm" (it fails
beyond 1; null without a reference). Exits 0 either way: a measurement, not a test; `--strict`
exits 1 on any false alarm or bug not named first (a gate, as scripts/gpu_check.sh uses it).
`--seconds S` starts no run after S seconds (the summary counts the runs made). `--golden`
judges each merged run against a golden file of its baseline and reference too
(bench/zoo_golden.py): a golden verdict other than compare's counts as a false alarm or a miss,
its codes stand in the row beside compare's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import gradalign
from gradalign import api
from gradalign.errors import BadInput
from gradalign.judge.grad_norm import norm_excess

try:
    from zoo_bugs import BUGS, round_grads, shuffled_blocks, times_k, unmet
    from zoo_golden import golden_disagrees, golden_row
    from zoo_hf import HF_LANGUAGE_MODELS
    from zoo_models import CLASSES, MODELS, MORE_MODELS, NOT_EQUIVALENT, SEQ, VOCAB, build
    from zoo_optimizers import MORE_OPTIMIZERS, OPTIMIZERS
    from zoo_tf32 import emulate_tf32
except ImportError:  # run as a module of the repository (tests): bench.zoo_hf, ...
    from bench.zoo_bugs import BUGS, round_grads, shuffled_blocks, times_k, unmet
    from bench.zoo_golden import golden_disagrees, golden_row
    from bench.zoo_hf import HF_LANGUAGE_MODELS
    from bench.zoo_models import CLASSES, MODELS, MORE_MODELS, NOT_EQUIVALENT, SEQ, VOCAB, build
    from bench.zoo_optimizers import MORE_OPTIMIZERS, OPTIMIZERS
    from bench.zoo_tf32 import emulate_tf32

BATCH, UPDATES = 48, 10
INIT_SCALE = 2.0**16  # GradScaler's own first scale (`--init-scale`)


def record(out: Path, model: str, optimizer: str, k: int, seed: int, **options) -> None:
    """One run at K=k; `options`: float64=True, reference=PATH, logged_scale=S (each micro loss
    recorded S times too large: a loss that is not the one backpropagated), bug=NAME (BUGS),
    bug_from=U (the bug from update U on; default 0),
    updates=N (default UPDATES), width=W (the model W times as wide, `build`),
    autocast="bfloat16"|"float16" (the forward under autocast,
    float16 with a GradScaler; never for the float64 reference), clip=MAX_NORM, schedule=True,
    skip_updates=[...] (the Recorder's: a float64 reference skips the baseline's skipped steps),
    compute_dtype="bfloat16" (the Recorder's: the dtype the run declares it computed in, as an
    optimizer computing its step in 16 bits, Muon, makes it), sketch=True (the Recorder's
    `record="sketch"`: full files at the first and last update, sketches between), penalty=λ
    (λ·Σw² over every parameter added to each micro-batch's loss), uneven=True (micro-batches
    of unequal sizes, `window_sizes`, each loss weighted by its share of the batch and recorded
    with its item count), device="cuda" (the model, the data and the training there),
    init_scale=S (the GradScaler's first scale; default 65536, its own)."""
    updates = options.get("updates", UPDATES)
    device = torch.device(options.get("device", "cpu"))
    autocast = None if options.get("float64") else options.get("autocast")
    dtype = getattr(torch, autocast or "float32")
    torch.manual_seed(seed)
    net = build(model, options.get("width", 1))
    net = (net.double() if options.get("float64") else net).to(device)
    opt = {**OPTIMIZERS, **MORE_OPTIMIZERS}[optimizer](net.parameters())
    init_scale = options.get("init_scale", INIT_SCALE)
    scaler = torch.amp.GradScaler(device.type, init_scale) if autocast == "float16" else None
    if scaler is not None and not isinstance(opt, torch.optim.Optimizer):
        raise SystemExit(f"{optimizer}: two optimizers, no GradScaler here")
    warm, clip = 2, options.get("clip")
    sched = options.get("schedule") and torch.optim.lr_scheduler.LambdaLR(
        getattr(opt, "optimizer", opt),
        lambda u: (u + 1) / warm if u < warm else 0.5 * (1 + math.cos(math.pi * u / updates)),
    )
    g = torch.Generator().manual_seed(5000 + seed)
    x = torch.randint(0, VOCAB, (BATCH * updates, SEQ), generator=g)
    lm = model == "gpt" or model in HF_LANGUAGE_MODELS
    y = torch.roll(x, -1, 1) if lm else (x[:, 0] + x[:, 3]) % CLASSES
    reference, bug_from = options.get("reference"), options.get("bug_from", 0)
    uneven = options.get("uneven", False)
    if options.get("bug") == "data-order":  # the micro-batches from the bug on, shuffled
        x, y = shuffled_blocks(x, y, BATCH // k, bug_from * k, seed)
    x, y = x.to(device), y.to(device)
    with gradalign.Recorder(
        out, net, opt, accum_steps=k, reference=reference, scaler=scaler,
        skip_updates=options.get("skip_updates"), compute_dtype=options.get("compute_dtype"),
        record="sketch" if options.get("sketch") else "full", updates=updates,
    ) as rec:  # fmt: skip
        for u in range(updates):
            bug = options.get("bug") if u >= bug_from else None
            if bug == "lr-times-k" and u == bug_from:
                times_k(opt, sched, k)
            sizes = window_sizes(k, seed, u) if uneven else [BATCH // k] * k
            for j in range(k):
                first = u * BATCH + sum(sizes[:j])
                rows = slice(first, first + sizes[j])
                with torch.autocast(device.type, dtype=dtype, enabled=autocast is not None):
                    logits = net(x[rows])
                target = y[rows]
                if lm:
                    logits, target = logits.reshape(-1, VOCAB), target.reshape(-1)
                loss = nn.functional.cross_entropy(logits, target)
                loss = loss + getattr(net, "extra_loss", 0.0)
                term = 0.0  # an L2 penalty in the loss, λ·Σw² (--penalty λ)
                if options.get("penalty"):
                    term = options["penalty"] * sum((p**2).sum() for p in net.parameters())
                    loss = loss + term
                weight = sizes[j] / BATCH if uneven else 1 / k  # the micro-batch's share
                weight = 1 / k if bug == "mean-over-k" else weight
                share = loss if bug == "no-loss-scale" else loss * weight
                if bug == "penalty-every-micro":  # the penalty's whole, not its share
                    share = share + term * (1 - weight)
                if not (bug == "skip-last-backward" and j == k - 1):
                    (share if scaler is None else scaler.scale(share)).backward()
                if bug == "bf16-accum":
                    round_grads(net)
                if bug == "clip-every-micro":
                    nn.utils.clip_grad_norm_(net.parameters(), clip)
                if bug == "scaler-every-micro" and j < k - 1:
                    scaler.unscale_(opt)
                    scaler.update()
                logged = loss.detach() * options.get("logged_scale", 1.0)
                logged = logged * weight if bug == "log-scaled-loss" else logged
                items = target.numel() if uneven else None
                rec.micro(logged, batch=(x[rows], y[rows]), items=items)
                if bug == "zero-grad-every-micro" and j < k - 1:
                    opt.zero_grad()
                if bug == "step-every-micro" and j < k - 1:
                    opt.step()
                if bug == "edit-weights-every-micro" and j < k - 1:
                    with torch.no_grad():
                        for param in net.parameters():
                            param.mul_(1 - 1e-3)
            if scaler is not None:
                scaler.unscale_(opt)
            if clip is not None:
                nn.utils.clip_grad_norm_(
                    net.parameters(), clip / k if bug == "clip-norm-over-k" else clip
                )
            scale = None if scaler is None else scaler.get_scale()
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            if bug == "count-every-micro":
                for state in getattr(opt, "optimizer", opt).state.values():
                    state["step"] += k - 1
            for _ in range(k if bug == "scheduler-every-micro" else int(bool(sched))):
                sched.step()
            rec.update(loss_scale=scale)
            if bug != "no-zero-grad":
                opt.zero_grad()


def window_sizes(k: int, seed: int, update: int) -> list[int]:
    """K micro-batch sizes summing to BATCH, each at least 1, drawn anew for every window (as
    a loop that packs variable-length samples or splits a batch by a token budget has)."""
    g = torch.Generator().manual_seed(9000 + 1000 * seed + update)
    cuts = torch.randperm(BATCH - 1, generator=g)[: k - 1] + 1
    edges = [0, *sorted(int(c) for c in cuts), BATCH]
    return [b - a for a, b in itertools.pairwise(edges)]


def judge(
    root: Path,
    model: str,
    optimizer: str,
    k: int,
    seed: int,
    bug: str | None,
    updates: int = UPDATES,
    autocast: str | None = None,
    clip: float | None = None,
    schedule: bool = False,
    reference: bool = True,
    compute_dtype: str | None = None,
    bug_from: int = 0,
    width: int = 1,
    sketch: bool = False,
    penalty: float = 0.0,
    uneven: bool = False,
    device: str = "cpu",
    reference_dtype: str = "float64",
    golden: bool = False,
    init_scale: float = INIT_SCALE,
) -> dict:
    loop = {"updates": updates, "clip": clip, "schedule": schedule, "width": width,
            "sketch": sketch, "penalty": penalty, "uneven": uneven, "device": device}  # fmt: skip
    both = {**loop, "autocast": autocast, "compute_dtype": compute_dtype, "init_scale": init_scale}
    record(root / "base", model, optimizer, 1, seed, reference="../ref", **both)
    skips = gradalign.skipped_updates(root / "base")  # where its GradScaler skipped the step
    float64 = reference_dtype == "float64"  # else float32, without autocast
    record(root / "ref", model, optimizer, 1, seed, float64=float64, skip_updates=skips, **loop)
    record(root / "merged", model, optimizer, k, seed, bug=bug, bug_from=bug_from, **both)
    try:
        c = api.compare(root / "base", root / "merged", reference=None if reference else "none")
    except BadInput as refused:  # exit 2: on a clean run, a false alarm too
        return {"verdict": "refused", "codes": [], "worst": math.inf, "first": None,
                "refused": str(refused)}  # fmt: skip
    judged = [d for r in c.results for d in (*r.weights, *r.grads) if d.excused is None]
    worst = max(d.ratio for d in judged)  # an excused jump (noted) is not judged by its ratio
    codes = [d.code for d in c.diagnosis if d.severity == "error"]
    first = next((r.update for r in c.results if not r.ok), None)
    norm = norm_excess(c.results)  # the whole-model gradient norm's check, over its allowed
    row = {"verdict": c.verdict, "codes": codes, "worst": worst, "first": first, "norm": norm}
    return {**row, **golden_row(root)} if golden else row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"the grid's models (default the {len(MODELS)} above; more: {', '.join(MORE_MODELS)})",
    )
    parser.add_argument(
        "--optimizers",
        default=",".join(OPTIMIZERS),
        help=f"the grid's optimizers (default the {len(OPTIMIZERS)} above; more: "
        f"{', '.join(MORE_OPTIMIZERS)})",
    )
    parser.add_argument("--jsonl", type=Path, default=None, help="append each run's row here")
    parser.add_argument("--bug", choices=sorted(BUGS), help="inject this bug: each run must fail")
    parser.add_argument("--bug-from", type=int, default=0, help="the bug from this update on")
    parser.add_argument("--updates", type=int, default=UPDATES, help="updates per run")
    parser.add_argument(
        "--autocast", nargs="?", const="bfloat16", choices=["bfloat16", "float16"],
        help="forward under autocast (bfloat16 unless named; float16 adds a GradScaler)",
    )  # fmt: skip
    parser.add_argument(
        "--width", type=int, default=1, help="every model this many times as wide (default 1)"
    )
    parser.add_argument("--clip", type=float, default=None, help="clip the gradient's norm")
    parser.add_argument(
        "--penalty", type=float, default=0.0, help="add λ·Σw² (this λ) to every micro loss"
    )
    parser.add_argument(
        "--init-scale", type=float, default=INIT_SCALE,
        help="float16's GradScaler starts at this scale (default 65536, its own; a loss summed "
        "in float32, as a penalty makes it, can overflow at K=1 where K>1 does not)",
    )  # fmt: skip
    parser.add_argument("--schedule", action="store_true", help="warmup and cosine decay")
    parser.add_argument(
        "--reference-none", action="store_true", help="judge by the fixed tolerances alone"
    )
    parser.add_argument(
        "--reference-dtype", choices=["float64", "float32"], default="float64",
        help="the reference's dtype (float32: a rerun without autocast, for 16-bit runs)",
    )  # fmt: skip
    parser.add_argument(
        "--compute-dtype",
        choices=["bfloat16", "float16", "tf32"],
        help="the baseline and merged runs declare this compute dtype (Muon's step is bfloat16; "
        "tf32 with --emulate-tf32)",
    )
    parser.add_argument(
        "--uneven", action="store_true",
        help="micro-batches of unequal sizes drawn per window, each loss weighted by its share",
    )  # fmt: skip
    parser.add_argument(
        "--ks",
        default="2,4,8",
        help=f"the grid's K values (default 2,4,8; each must divide the batch of {BATCH}, "
        "any up to it with --uneven; 48 makes micro-batches of one sample)",
    )
    parser.add_argument(
        "--record", choices=["full", "sketch"], default="full",
        help="what every run records (sketch: full files at the first and last update only)",
    )  # fmt: skip
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu",
        help="train there (cuda: as a user's loop does, no determinism flags set)",
    )  # fmt: skip
    parser.add_argument(
        "--emulate-tf32", nargs="?", const="conv", choices=["conv", "all"],
        help="float32 convolutions (all: and linear maps) computed as a GPU's TF32 tensor cores "
        "do (bench/zoo_tf32.py)",
    )  # fmt: skip
    parser.add_argument(
        "--golden", action="store_true",
        help="judge each merged run against a golden of its baseline too (bench/zoo_golden.py)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=math.inf, help="start no run after this")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a false alarm or miss")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    torch.set_num_threads(1)
    if args.emulate_tf32:
        emulate_tf32(matmuls=args.emulate_tf32 == "all")
    models, optimizers = args.models.split(","), args.optimizers.split(",")
    unknown = set(optimizers) - set(OPTIMIZERS) - set(MORE_OPTIMIZERS)
    if unknown:
        parser.error(f"unknown optimizer(s): {', '.join(sorted(unknown))}")
    if unmet(args.bug, args):
        parser.error(unmet(args.bug, args))
    if args.golden and (args.record == "sketch" or args.reference_none):
        parser.error("--golden keeps full runs with their reference: not with --record sketch "
                     "or --reference-none")  # fmt: skip
    if args.autocast == "float16" and args.device == "cpu" and "lstm" in models:
        parser.error("--autocast float16 on the CPU: oneDNN has no float16 LSTM; leave lstm out")
    ks = [int(k) for k in args.ks.split(",")]
    if any(k < 1 or k > BATCH or (BATCH % k and not args.uneven) for k in ks):
        parser.error(f"--ks: each K must divide the batch of {BATCH} (any K up to it: --uneven)")
    if args.bug == "mean-over-k" and BATCH in ks:
        parser.error(f"--bug mean-over-k: K={BATCH} makes every micro-batch one sample, all equal")
    grid = [(m, o, k) for m in models for o in optimizers for k in ks]
    random.Random(1234).shuffle(grid)
    alarms, worst, mildest, started, made = [], 0.0, math.inf, time.time(), 0
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.start, args.start + args.runs):
            if time.time() - started > args.seconds:
                break
            made += 1
            model, optimizer, k = grid[i % len(grid)]
            row = {"run": i, "model": model, "optimizer": optimizer, "k": k}
            where = Path(scratch) / f"run-{i}"
            loop = {"autocast": args.autocast, "clip": args.clip, "schedule": args.schedule,
                    "reference": not args.reference_none,
                    "compute_dtype": args.compute_dtype, "bug_from": args.bug_from,
                    "width": args.width, "sketch": args.record == "sketch",
                    "penalty": args.penalty, "uneven": args.uneven,
                    "device": args.device, "reference_dtype": args.reference_dtype,
                    "golden": args.golden, "init_scale": args.init_scale}  # fmt: skip
            row.update(judge(where, model, optimizer, k, i, args.bug, args.updates, **loop))
            expected = BUGS[args.bug] if args.bug is not None else NOT_EQUIVALENT.get(model)
            if expected is None and row["verdict"] != "pass":
                alarms.append(row)
            elif expected is not None and row["codes"][:1] != [expected]:
                alarms.append(row)  # missed, or named otherwise
            elif args.bug is not None and row["first"] is not None and row["first"] < args.bug_from:
                alarms.append(row)  # failed before the bug began
            elif golden_disagrees(row):
                alarms.append(row)  # the golden passed what compare failed, or the reverse
            if row["verdict"] == "pass" and expected is None:  # a clean run's, not a miss's
                worst = max(worst, row["worst"])
            else:
                mildest = min(mildest, row["worst"])
            print(json.dumps(row), flush=True)
            if args.jsonl is not None:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    seconds = time.time() - started
    # a clean run of a model no merged run can reproduce must fail: where it does not, a miss
    missed = [r for r in alarms if args.bug is not None or r["model"] in NOT_EQUIVALENT]
    if args.bug is None:
        print(f"{made} clean runs, {len(alarms) - len(missed)} false alarm(s), worst passing "
              f"err/allowed {worst:.3g}, {seconds:.0f} s")  # fmt: skip
    else:
        print(f"{made} runs with {args.bug}, {len(alarms)} not named {BUGS[args.bug]} "
              f"first, mildest failing err/allowed {mildest:.3g}, {seconds:.0f} s")  # fmt: skip
    odd = [m for m in models if m in NOT_EQUIVALENT]
    if args.bug is None and odd:
        print(
            f"{len(missed)} run(s) of {', '.join(odd)} not named "
            f"{', '.join(NOT_EQUIVALENT[m] for m in odd)} first (they must fail so named)"
        )
    for row in alarms:
        print(f"  {'not named' if row in missed else 'false alarm'}: {row}")
    return 1 if args.strict and (alarms or not made) else 0


if __name__ == "__main__":
    raise SystemExit(main())
