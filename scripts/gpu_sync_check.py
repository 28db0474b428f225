"""On a GPU: the Recorder's per-step calls never make the host wait for the device.

Trains bench/user_loop.py's loop on CUDA under `torch.cuda.set_sync_debug_mode("warn")`, full and
sketch mode, and notes each synchronizing operation torch reports: on which thread, and inside
which Recorder call. Any inside `micro()`, `grads()` or `update()` on the training thread fails
the check (exit 1). Those at `Recorder(...)` and `close()` (which waits for the run to be written)
and on the background writer thread are counted and printed. Before that, a deliberate `.item()`
must be reported, or the check says it cannot see syncs here (exit 2). `--inject-sync` reads
each micro-step's loss on the host inside `micro()`, as a Recorder that synced would: the check
must then fail.

    python scripts/gpu_sync_check.py [--size mlp-1m] [--updates 6] [--inject-sync] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from user_loop import SIZES, train

from gradalign.record.recorder import Recorder

PER_STEP = ("micro", "grads", "update")
WATCHED = ("__init__", *PER_STEP, "close")
_where = threading.local()
seen: Counter[tuple[str, str]] = Counter()


def _watch(name: str) -> None:
    original = getattr(Recorder, name)

    def watched(self, *args, **kwargs):
        _where.call = name
        try:
            return original(self, *args, **kwargs)
        finally:
            _where.call = None

    setattr(Recorder, name, watched)


def _inject_sync() -> None:
    original = Recorder.micro

    def micro(self, loss=None, *args, **kwargs):
        float(loss)  # a host read of a device value: waits for the device
        return original(self, loss, *args, **kwargs)

    Recorder.micro = micro


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    if "synchroniz" in str(message).lower():
        thread = threading.current_thread()
        side = "training" if thread is threading.main_thread() else thread.name
        seen[(side, getattr(_where, "call", None) or "the loop")] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mlp-1m", choices=list(SIZES))
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--inject-sync", action="store_true", help="sync inside micro()")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_sync_check: no CUDA device here", file=sys.stderr)
        return 2
    if args.inject_sync:
        _inject_sync()
    for name in WATCHED:
        _watch(name)
    warnings.simplefilter("always")
    warnings.showwarning = _note
    torch.cuda.set_sync_debug_mode("warn")

    _where.call = "selfcheck"
    torch.ones(1, device="cuda").item()
    _where.call = None
    if not seen.pop(("training", "selfcheck"), 0):
        print("gpu_sync_check: a deliberate .item() went unreported; cannot check", file=sys.stderr)
        return 2

    found: dict[str, dict[str, int]] = {}
    failed = False
    for record in ("full", "sketch"):
        seen.clear()
        with tempfile.TemporaryDirectory(prefix="gradalign-sync-") as tmp:
            train(args.size, Path(tmp) / "run", updates=args.updates, device="cuda", record=record)
        failed |= any(side == "training" and call in PER_STEP for side, call in seen)
        found[record] = {f"{side}: {call}": n for (side, call), n in sorted(seen.items())}
        listed = ", ".join(f"{k} {n}" for k, n in found[record].items()) or "none"
        print(f"{args.size} {record}, {args.updates} updates: syncs {listed}")
    torch.cuda.set_sync_debug_mode("default")
    print("per-step Recorder calls: " + ("host syncs found" if failed else "no host sync"))
    if args.json is not None:
        args.json.write_text(json.dumps({"syncs": found, "per_step_ok": not failed}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
