"""On a GPU: the Recorder's per-step calls never make the host wait for the device.

Trains bench/user_loop.py's loop (clipping its gradient) on CUDA under
`torch.cuda.set_sync_debug_mode("warn")`, plain, then recorded in full and sketch mode, and
notes each synchronizing operation torch reports: on which thread, and inside which Recorder
call. Any inside `micro()`, `grads()` or `update()` on the training thread fails the check
(exit 1), and so does one made by gradalign's code while the loop itself runs (a hook of the
Recorder's, called from the user's forward, backward, clipping or optimizer). Those at
`Recorder(...)` and `close()` (which waits for the run to be written), on the background writer
thread, and the plain loop's own are counted and printed. Before that, a deliberate `.item()`
must be reported, or the check says it cannot see syncs here (exit 2). `--inject-sync` reads
each micro-step's loss on the host inside `micro()`, and `--inject-hook-sync` reads each
clipped norm on the host when the Recorder hears of it, as a Recorder that synced would: the
check must then fail.

    python scripts/gpu_sync_check.py [--size mlp-1m] [--updates 6] [--inject-sync]
        [--inject-hook-sync] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from user_loop import SIZES, train

import gradalign
from gradalign.record.recorder import Recorder

PACKAGE = str(Path(gradalign.__file__).resolve().parent)
PER_STEP = ("micro", "grads", "update")
IN_LOOP = "gradalign in the loop"
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


def _inject_hook_sync() -> None:
    original = Recorder._on_clip

    def on_clip(self, params, total):
        float(total)  # a host read of the clipped norm, inside clip_grad_norm_: waits
        return original(self, params, total)

    Recorder._on_clip = on_clip


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    if "synchroniz" in str(message).lower():
        thread = threading.current_thread()
        side = "training" if thread is threading.main_thread() else thread.name
        seen[(side, getattr(_where, "call", None) or _loop_caller())] += 1


def _loop_caller() -> str:
    """Outside the Recorder's calls: gradalign's innermost function on the stack (a hook of
    the Recorder's), else the user's loop itself."""
    for frame in reversed(traceback.extract_stack()):
        if str(Path(frame.filename).resolve()).startswith(PACKAGE):
            return f"{IN_LOOP}: {frame.name}"
    return "the loop"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mlp-1m", choices=list(SIZES))
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--inject-sync", action="store_true", help="sync inside micro()")
    parser.add_argument(
        "--inject-hook-sync", action="store_true", help="sync when the Recorder hears of a clip"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_sync_check: no CUDA device here", file=sys.stderr)
        return 2
    if args.inject_sync:
        _inject_sync()
    if args.inject_hook_sync:
        _inject_hook_sync()
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
    for record in ("plain", "full", "sketch"):
        seen.clear()
        with tempfile.TemporaryDirectory(prefix="gradalign-sync-") as tmp:
            out = None if record == "plain" else Path(tmp) / "run"
            options = {} if record == "plain" else {"record": record}
            train(args.size, out, updates=args.updates, device="cuda", clip=1.0, **options)
        failed |= any(
            side == "training" and (call in PER_STEP or call.startswith(IN_LOOP))
            for side, call in seen
        )
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
