"""How long does a command take before it does any work, with and without the package's bytecode?

pip compiles the modules it installs, but not an editable install's sources, and where
PYTHONDONTWRITEBYTECODE is set (as in many containers, and on the machine the figures in
docs/PERFORMANCE.md come from) Python then compiles every gradalign module again at each start.
scripts/bootstrap.sh writes the bytecode ahead (`python -m compileall`). This times, alternated
in each repetition, from a copy of the package (the repository's own is left as it is):

- `python -c pass`: the interpreter alone;
- `gradalign --help` and `gradalign compare` of two 20-line training logs (a job whose judging
  takes milliseconds), each from the copy without bytecode and from the copy compiled ahead,
  with PYTHONDONTWRITEBYTECODE=1 in both;
- with `--typer DIR`, both again from the compiled copy with another typer first on the path
  (`pip install --no-deps --target DIR typer==0.29.2`: constraints.txt installs 0.28.0, and
  0.29 coerces every parameter through pydantic).

    .venv/bin/python bench/startup.py [--reps 7] [--json FILE] [--typer DIR]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from compare_speed import child  # noqa: E402  (wall seconds of a child, exit 0 or 1 only)

# The copy's code first on sys.path; an editable install's finder would find the repository's.
# Several folders (os.pathsep between): another typer's, then the copy.
RUN = r"""
import os, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
paths = sys.argv.pop(1).split(os.pathsep)
sys.path[0:0] = paths
import gradalign
assert gradalign.__file__.startswith(paths[-1]), gradalign.__file__
if len(paths) > 1:
    import typer
    assert typer.__file__.startswith(paths[0]), typer.__file__
sys.argv[0] = "gradalign"
from gradalign.__main__ import run
run()
"""


def log(path: Path) -> Path:
    path.write_text("".join(f"step {i} loss {2.3 * 0.99**i:.6f}\n" for i in range(20)))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--typer", type=Path, default=None, help="a folder with another typer")
    args = parser.parse_args()
    if args.typer is not None and not (args.typer / "typer" / "__init__.py").is_file():
        parser.error(f"--typer {args.typer}: no typer package in it")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # the children's, through compare_speed.child
    with tempfile.TemporaryDirectory(prefix="gradalign-startup-") as scratch:
        tmp = Path(scratch)
        copies = {}
        for kind in ("source", "compiled"):
            copies[kind] = tmp / kind
            shutil.copytree(
                ROOT / "gradalign",
                copies[kind] / "gradalign",
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        compileall.compile_dir(copies["compiled"] / "gradalign", quiet=1)
        a, b = log(tmp / "a.log"), log(tmp / "b.log")
        py = sys.executable
        jobs = {"python -c pass": [py, "-c", "pass"]}
        for kind, copy in copies.items():
            jobs[f"--help, {kind}"] = [py, "-c", RUN, str(copy), "--help"]
            compare = [py, "-c", RUN, str(copy), "compare", str(a), str(b)]
            jobs[f"compare two logs, {kind}"] = compare
        if args.typer is not None:
            both = os.pathsep.join([str(args.typer.resolve()), str(copies["compiled"])])
            jobs["--help, other typer"] = [py, "-c", RUN, both, "--help"]
            jobs["compare two logs, other typer"] = [py, "-c", RUN, both, "compare", str(a), str(b)]
        times: dict[str, list[float]] = {name: [] for name in jobs}
        for job in jobs.values():  # one uncounted round
            child(job)
        for _ in range(args.reps):
            for name, job in jobs.items():
                times[name].append(child(job)[0])
    median = {name: statistics.median(v) for name, v in times.items()}
    for name, seconds in median.items():
        print(f"{name:32s} {seconds:6.3f} s")
    for what in ("--help", "compare two logs"):
        saved = median[f"{what}, source"] - median[f"{what}, compiled"]
        ratio = median[f"{what}, source"] / median[f"{what}, compiled"]
        print(f"{what}: bytecode ahead saves {saved:.3f} s ({ratio:.2f}x without it)")
        if args.typer is not None:
            other = median[f"{what}, other typer"] / median[f"{what}, compiled"]
            print(f"{what}: {other:.2f}x the time with the typer in {args.typer}")
    print(f"medians of {args.reps} reps, alternated")
    if args.json is not None:
        args.json.write_text(json.dumps({"reps": args.reps, "seconds": median, "times": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
