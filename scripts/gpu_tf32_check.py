"""On a GPU: the Recorder lists where the model's float32 math may run in TF32 (manifest
`environment.tf32`), read through torch's per-operator settings, and the judge then takes the
run as computed in "tf32". Records a small convolutional loop twice on CUDA: with cuDNN's
default and `torch.backends.cuda.matmul.fp32_precision = "tf32"` (it must list cudnn and
cublas on an Ampere or later GPU), then with both set to "ieee" (it must list nothing). Exit 0
when both hold, 1 when not, 2 without CUDA. `--device cpu` runs the same loop on the CPU,
where nothing may be listed (a check of the script itself).

    python scripts/gpu_tf32_check.py [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gradalign
from gradalign.runs.reader import read_run_dir


def _record(out: Path, device: torch.device) -> tuple[list[str], str]:
    """Two updates of a Conv1d and Linear model; the run's tf32 list and compute dtype."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3), nn.Flatten(), nn.Linear(8 * 6, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4, 8, device=device), torch.randint(0, 3, (16,), device=device)
    with gradalign.Recorder(out, model, opt, accum_steps=1) as rec:
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            rec.micro(loss.detach(), batch=(x, y))
            opt.step()
            rec.update()
            opt.zero_grad()
    run = read_run_dir(out)
    return run.environment.get("tf32", []), run.compute_dtype


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    ampere = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    b = torch.backends
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        b.cuda.matmul.fp32_precision = "tf32"
        found = _record(Path(scratch) / "tf32", device)
        expected = (["cudnn", "cublas"], "tf32") if ampere else ([], "float32")
        print(f"conv default, matmul tf32: listed {found[0]}, computes in {found[1]}")
        failed += found != expected
        b.cuda.matmul.fp32_precision = b.cudnn.conv.fp32_precision = "ieee"
        found = _record(Path(scratch) / "ieee", device)
        print(f"conv and matmul ieee: listed {found[0]}, computes in {found[1]}")
        failed += found != ([], "float32")
    print("as expected" if not failed else f"{failed} of 2 not as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
