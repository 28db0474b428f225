"""What gradalign promises about reading input: reads are bounded.

Each test is a defect once reproduced by hand, kept as a promise: no YAML alias bombs, no
unbounded messages, no whole-file slurps (a data file is checksummed while streaming), no
symlinks out of a run, no device read forever.
"""

from __future__ import annotations

import subprocess
import sys
import time

from .conftest import one_line_error

ALIAS_BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
batch_size: *g
"""


def test_a_yaml_alias_bomb_is_refused_at_once(cli, tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(ALIAS_BOMB)
    started = time.monotonic()
    result = cli("verify", "-c", config, "--out", tmp_path / "v")
    one_line_error(result, "aliases")
    assert time.monotonic() - started < 5 and len(result.err) < 300


def test_a_huge_value_is_never_printed_whole(cli, tmp_path):
    config = tmp_path / "long.yaml"
    config.write_text("optimizer: " + "x" * 100_000 + "\n")
    result = cli("verify", "-c", config, "--out", tmp_path / "v")
    one_line_error(result, "optimizer")
    assert len(result.err) < 400


READ_ONE = """
import resource, sys
from gradalign.errors import BadInput
from gradalign.runs.reader import read_run_dir
run = read_run_dir(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    run.weights(0)
except BadInput as exc:
    print("refused:", exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_data_file_is_checksummed_while_streaming(small_copy):
    """A 256 MB snapshot whose checksum fails is refused without being read into memory."""
    target = small_copy["merged"] / "weights" / "update_000000.safetensors"
    with open(target, "ab") as handle:
        handle.truncate(256 << 20)
    done = subprocess.run(
        [sys.executable, "-c", READ_ONE, str(small_copy["merged"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "refused:" in done.stdout and "checksum" in done.stdout, done.stdout + done.stderr
    grew_mib = int(done.stdout.strip().splitlines()[-1])
    assert grew_mib < 32, f"reading grew the process by {grew_mib} MiB"


def test_symlinked_data_files_are_refused(cli, small_copy, tmp_path):
    outside = tmp_path / "outside.safetensors"
    target = small_copy["merged"] / "weights" / "update_000001.safetensors"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "symlink")


def test_a_symlinked_folder_inside_a_run_is_refused(cli, small_copy, tmp_path):
    grads = small_copy["merged"] / "grads"
    grads.rename(tmp_path / "grads-elsewhere")
    grads.symlink_to(tmp_path / "grads-elsewhere")
    one_line_error(cli("compare", small_copy["baseline"], small_copy["merged"]), "outside the run")


def test_a_config_or_golden_file_that_is_a_device_is_refused_not_read_forever(cli, small_runs):
    """/dev/zero never ends: reading it as a config or a golden file hung."""
    base, merged = small_runs["baseline"], small_runs["merged"]
    one_line_error(cli("compare", base, merged, "-c", "/dev/zero"), "not a regular file")
    one_line_error(cli("golden", "check", "/dev/zero", base), "not a regular file")
