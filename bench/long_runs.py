"""Long runs: the noise model must hold over hundreds of updates, and bugs must stay caught.

A clean `verify` of the built-in default with N updates (default 1000) must pass for SGD, Adam
and AdamW; every fault must still fail with its own code first at N updates. Baselines and
references are recorded once per setup and shared by its faults.

    .venv/bin/python bench/long_runs.py [--updates 1000] [--hidden 256] [--faults-hidden 64]
        [--json long.json]

Faults run on a narrower MLP (`--faults-hidden`) to keep the hour down: a fault fails from its
first update, what must hold is that nothing at N updates hides it or renames it. Runs are
deleted once judged (a clean setup's three runs take about 6 GB at 1000 updates).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from gradalign import api
from gradalign.config import TrainConfig
from gradalign.record.faults import FAULTS
from gradalign.selftest import SETUPS

FAULT_SETUP = {  # fault -> the selftest setup it shows in
    "no-loss-scale": "adam",
    "double-loss-scale": "sgd",
    "loss-plus-scaled": "adamw",
    "zero-grad-every-micro": "sgd-momentum",
    "step-every-micro": "adam",
    "scheduler-every-micro": "sgd+cosine+clip",
    "clip-every-micro": "sgd+cosine+clip",
    "data-order": "sgd",
    "bf16-accum": "adam",
    "no-zero-grad": "sgd",
    "penalty-every-micro": "sgd-l2",
    "scaler-every-micro": "fp16-adamw",
    "skip-last-backward": "sgd",
    "edit-weights-every-micro": "adam",
    "lr-times-k": "sgd",
    "log-scaled-loss": "sgd",
    "forget-update": "sgd",
    "dropout-reseed": "mlp-dropout",
}


def judged(base: Path, merged: Path) -> dict:
    c = api.compare(base, merged)
    diffs = [d for r in c.results for d in (*r.weights, *r.grads) if d.excused is None]
    return {
        "verdict": c.verdict,
        "codes": [d.code for d in c.diagnosis if d.severity == "error"],
        "worst_over_allowed": max((d.ratio for d in diffs), default=0.0),
        "notes": [n for n in c.notes if "jumped" in n],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--faults-hidden", type=int, default=64)
    parser.add_argument("--only-clean", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for optimizer in ("sgd", "adam", "adamw"):
            config = TrainConfig(optimizer=optimizer, updates=args.updates, hidden=args.hidden)
            got = judged(*_pair(root / f"clean-{optimizer}", config, None))
            ok = got["verdict"] == "pass" and not got["codes"]
            rows.append({"setup": optimizer, "fault": None, "ok": ok, **got})
            print(f"{'ok' if ok else 'FALSE ALARM'} clean {optimizer}: {got}", flush=True)
            shutil.rmtree(root / f"clean-{optimizer}")  # about 6 GB each at 1000 updates
        recorded: set[str] = set()
        for fault, setup in ({} if args.only_clean else FAULT_SETUP).items():
            config = TrainConfig(updates=args.updates, hidden=args.faults_hidden).replace(
                **SETUPS[setup]
            )
            where = root / f"fault-{setup.replace('+', '_')}"
            base, merged = _pair(where, config, fault, fresh=setup not in recorded)
            recorded.add(setup)
            got = judged(base, merged)
            shutil.rmtree(merged)
            ok = got["verdict"] == "fail" and got["codes"][:1] == [FAULTS[fault].code]
            rows.append({"setup": setup, "fault": fault, "ok": ok, **got})
            print(f"{'ok' if ok else 'MISSED'} {fault} on {setup}: {got}", flush=True)
    summary = {
        "updates": args.updates,
        "clean_passed": sum(r["ok"] for r in rows if r["fault"] is None),
        "faults_named": sum(r["ok"] for r in rows if r["fault"] is not None),
        "faults": sum(r["fault"] is not None for r in rows),
        "worst_clean_over_allowed": max(r["worst_over_allowed"] for r in rows if not r["fault"]),
        "seconds": round(time.monotonic() - started),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


def _pair(where: Path, config: TrainConfig, fault: str | None, fresh: bool = True):
    base = where / "baseline"
    if fresh:
        api.record_baseline(config, base, checked=True)
    merged = where / f"merged-{fault or 'clean'}"
    api.record_merged(config, merged, fault=fault, checked=True)
    return base, merged


if __name__ == "__main__":
    sys.exit(main())
