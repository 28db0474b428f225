"""The held-out-style matrix: loops of many shapes that nobody here tuned the judge on.

Every clean configuration (model, optimizer, K, batch, precision, clipping, schedule, param
groups, frozen/tied/unused parameters, uneven micro-batches, padded tokens) is recorded as a
baseline (K=1), its float64 reference and a merged run (K) over several data/init seeds, then
judged exactly as `gradalign compare` judges: every one must pass with no cause named. Then each
known bug is injected into a few of them and must fail with its own code first. It prints a
table and the margins: the worst err/allowed over clean runs and the mildest over bugs.

    .venv/bin/python bench/matrix.py [--seeds 3] [--json matrix.json] [--only NAME ...]
                                     [--record full|sketch] [--sketch-width D] [--reference-none]

`--reference-none` judges every run by the fixed tolerances alone (the float64 references are
recorded all the same, and not read).

Runs on the CPU in a few minutes (OMP_NUM_THREADS is set to 1 for repeatable timing-free runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from matrix_loops import Setup, run

from gradalign import api

CLEAN: dict[str, Setup] = {
    "mlp-sgd": Setup(),
    "mlp-momentum-nesterov": Setup(optimizer="momentum", lr=0.05),
    "mlp-adam": Setup(optimizer="adam", lr=1e-2),
    "mlp-adamw": Setup(optimizer="adamw", lr=1e-2),
    "mlp-rmsprop": Setup(optimizer="rmsprop", lr=1e-3),
    "mlp-adagrad": Setup(optimizer="adagrad", lr=5e-2),
    "mlp-k2": Setup(k=2),
    "mlp-k3-b45": Setup(k=3, batch=45),
    "mlp-k8": Setup(k=8),
    "mlp-k16": Setup(k=16),
    "mlp-b36-k4": Setup(batch=36),
    "mlp-clip-engaged": Setup(clip=0.05, optimizer="momentum", lr=0.05),
    "mlp-lambdalr": Setup(schedule=True, optimizer="adamw", lr=1e-2),
    "mlp-param-groups": Setup(groups=True, optimizer="adamw", lr=1e-2),
    "mlp-frozen-layer": Setup(freeze=True, optimizer="adam", lr=1e-2),
    "mlp-unused-params": Setup(model="unused", optimizer="adamw", lr=1e-2),
    "mlp-uneven-items": Setup(uneven=True),
    "mlp-l2-penalty": Setup(penalty=1e-3),
    "relu-mlp-adam": Setup(model="relu-mlp", optimizer="adam", lr=1e-2),
    "conv-groupnorm": Setup(model="conv-gn", optimizer="adam", lr=1e-2),
    "embedding-sgd": Setup(model="embed", lr=0.5),
    "embedding-adagrad": Setup(model="embed", optimizer="adagrad", lr=5e-2),
    "embedding-max-norm-sgd": Setup(model="embed-max-norm", lr=0.5),
    "conv-batchnorm-eval-momentum": Setup(model="conv-bn-eval", optimizer="momentum", lr=0.05),
    "gru-adam": Setup(model="gru", optimizer="adam", lr=1e-2),
    "attention-adamw": Setup(model="attention", optimizer="adamw", lr=1e-2),
    "attention-sgd-k8": Setup(model="attention", lr=0.2, k=8),
    "tied-lm-padded-adamw": Setup(model="tied-lm", optimizer="adamw", lr=1e-2),
    "tied-lm-padded-sgd-k3": Setup(model="tied-lm", lr=0.5, k=3, batch=45),
    "tied-lm-padded-clip-adamw": Setup(model="tied-lm", optimizer="adamw", lr=1e-2, clip=0.05),
    "tied-lm-padded-b8-sgd": Setup(model="tied-lm", lr=0.5, batch=8),
    "mlp-bf16-adamw": Setup(autocast="bfloat16", optimizer="adamw", lr=1e-2),
    "mlp-bf16-sgd": Setup(autocast="bfloat16"),
    "mlp-fp16-adamw-scaler": Setup(autocast="float16", optimizer="adamw", lr=1e-2),
    "attention-bf16-adam": Setup(model="attention", autocast="bfloat16", optimizer="adam", lr=1e-2),
}
BUGS: list[tuple[str, str, str]] = [  # (bug, clean setup, the code that must come first)
    ("no-loss-scale", "mlp-sgd", "loss-scale"),
    ("no-loss-scale", "attention-adamw", "loss-scale"),
    ("zero-grad-every-micro", "mlp-momentum-nesterov", "zero-grad-in-window"),
    ("step-every-micro", "mlp-adam", "step-in-window"),
    ("scheduler-every-micro", "mlp-lambdalr", "lr-schedule"),
    ("clip-every-micro", "mlp-clip-engaged", "clip-per-micro"),
    ("clip-norm-over-k", "mlp-clip-engaged", "clip-threshold"),
    ("data-order", "embedding-sgd", "data-order"),
    ("bf16-accum", "mlp-adamw", "grad-accum-dtype"),
    ("mean-per-micro", "tied-lm-padded-adamw", "token-normalization"),
    ("mean-per-micro-over-k", "tied-lm-padded-adamw", "loss-scale"),
    ("mean-per-micro-not-over-k", "tied-lm-padded-b8-sgd", "loss-scale"),
    ("mean-per-micro-not-over-k", "tied-lm-padded-clip-adamw", "loss-scale"),
    ("clip-every-micro", "tied-lm-padded-clip-adamw", "clip-per-micro"),
    ("no-zero-grad", "mlp-sgd", "grad-not-cleared"),
    ("no-zero-grad", "gru-adam", "grad-not-cleared"),
    ("penalty-every-micro", "mlp-l2-penalty", "penalty-not-scaled"),
    ("scaler-every-micro", "mlp-fp16-adamw-scaler", "scaler-per-micro"),
    ("skip-last-backward", "mlp-k2", "micro-batch-missing"),
    ("skip-last-backward", "conv-groupnorm", "micro-batch-missing"),
    ("edit-weights-every-micro", "mlp-adam", "weights-changed-in-window"),
    ("edit-weights-every-micro", "embedding-max-norm-sgd", "weights-changed-in-window"),
    ("no-loss-scale", "embedding-max-norm-sgd", "loss-scale"),
    ("no-loss-scale", "conv-batchnorm-eval-momentum", "loss-scale"),
    ("zero-grad-every-micro", "conv-batchnorm-eval-momentum", "zero-grad-in-window"),
    ("lr-times-k", "mlp-param-groups", "lr-scaled"),
    ("log-scaled-loss", "mlp-rmsprop", "loss-averaging"),
    ("forget-update", "mlp-sgd", "window-bookkeeping"),
]


def judge(
    root: Path,
    setup: Setup,
    seed: int,
    bug: str | None = None,
    record: str = "full",
    width: int | None = None,
    reference: bool = True,
) -> dict:
    base, ref = root / f"base-{seed}", root / f"ref-{seed}"
    how = {"record": record, "sketch_width": width}
    if not base.exists():
        run(base, replace(setup, k=1), 1, seed=seed, **how)
        run(ref, replace(setup, k=1), 1, seed=seed, float64=True, **how)
    merged = root / f"merged-{seed}-{bug or 'clean'}"
    run(merged, setup, setup.k, seed=seed, bug=bug, **how)
    c = api.compare(base, merged, reference=ref if reference else "none")
    diffs = [d for r in c.results for d in (*r.weights, *r.grads)]
    return {
        "verdict": c.verdict,
        "codes": [d.code for d in c.diagnosis if d.severity == "error"],
        "worst_over_allowed": max((d.ratio for d in diffs if d.excused is None), default=0.0),
        "loss_over_allowed": max(
            (r.loss_error / r.loss_allowed for r in c.results if r.loss_allowed), default=0.0
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", nargs="*", help="clean setups to run (default: all)")
    parser.add_argument(
        "--record", choices=["full", "sketch"], default="full", help="how every run is recorded"
    )
    parser.add_argument(
        "--sketch-width",
        type=int,
        default=None,
        help="buckets per sketched tensor (default the Recorder's 1021, wider than every tensor "
        "here, which are then kept whole; 61 sketches all but the smallest)",
    )
    parser.add_argument(
        "--reference-none", action="store_true", help="judge by the fixed tolerances alone"
    )
    args = parser.parse_args()
    names = args.only or list(CLEAN)
    how = (args.record, args.sketch_width, not args.reference_none)
    width = args.sketch_width
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            for seed in range(args.seeds):
                got = judge(Path(folder) / name, CLEAN[name], seed, None, *how)
                ok = got["verdict"] == "pass" and not got["codes"]
                rows.append({"setup": name, "seed": seed, "bug": None, "ok": ok, **got})
                print(f"{'ok ' if ok else 'FALSE ALARM'} {name} seed {seed}: {got}", flush=True)
        for bug, name, code in BUGS:
            if name not in names:
                continue
            for seed in range(args.seeds):
                got = judge(Path(folder) / name, CLEAN[name], seed, bug, *how)
                ok = got["verdict"] == "fail" and got["codes"][:1] == [code]
                rows.append(
                    {"setup": name, "seed": seed, "bug": bug, "expected": code, "ok": ok, **got}
                )
                print(f"{'ok ' if ok else 'MISSED'} {bug} on {name} seed {seed}: {got}", flush=True)
    clean = [r for r in rows if r["bug"] is None]
    bugs = [r for r in rows if r["bug"] is not None]
    summary = {
        "record": args.record,
        "sketch_width": width,
        "reference": not args.reference_none,
        "clean_configurations": len({r["setup"] for r in clean}),
        "seeds": args.seeds,
        "clean_runs": len(clean),
        "false_alarms": sum(not r["ok"] for r in clean),
        "bug_runs": len(bugs),
        "bugs_missed_or_misnamed": sum(not r["ok"] for r in bugs),
        "worst_clean_over_allowed": max((r["worst_over_allowed"] for r in clean), default=0.0),
        "worst_clean_loss_over_allowed": max((r["loss_over_allowed"] for r in clean), default=0.0),
        # a window-bookkeeping bug is named from recorded counts; the updates judged stop
        # before its windows stop lining up, so its numbers are clean by construction
        "mildest_bug_over_allowed": min(
            (
                max(r["worst_over_allowed"], r["loss_over_allowed"])
                for r in bugs
                if r["expected"] != "window-bookkeeping"
            ),
            default=0.0,
        ),
        "seconds": round(time.monotonic() - started),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    return 0 if summary["false_alarms"] == 0 and summary["bugs_missed_or_misnamed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
