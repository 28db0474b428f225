"""The `gradalign` command keeps the memory it frees in its heap (gradalign/allocator.py): a
block of a slice's size or a whole tensor's, freed, is not handed back to the kernel to be
faulted in again by the next one. Seen from glibc itself: a fresh block of 24 MiB comes from the
heap, not from a mapping of its own (the IS_MMAPPED bit of its chunk header)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

WHERE = r"""
import ctypes
def where():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(24 << 20)
    header = ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value
    libc.free(block)
    print("mapped" if header & 2 else "heap", flush=True)
"""


def _where(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WHERE + code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_the_command_takes_a_large_block_from_its_heap():
    run = "import atexit, sys\natexit.register(where)\nsys.argv = ['gradalign', '--version']\n"
    assert _where(run + "from gradalign.__main__ import run\nrun()") == "heap"


def test_a_process_that_only_imports_gradalign_maps_it_apart():
    """The check above can fail: without the command's setting the same block is mapped."""
    assert _where("import gradalign.cli\nwhere()") == "mapped"


def test_keep_freed_memory_says_it_set_both_thresholds():
    assert (
        _where(
            "from gradalign.allocator import keep_freed_memory\nassert keep_freed_memory()\nwhere()"
        )
        == "heap"
    )
