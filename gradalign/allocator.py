"""Memory the `gradalign` command frees is kept for its next allocation (glibc's malloc).

The judge reads runs a slice at a time: thousands of arrays of about 1 MiB a second are made and
dropped, on several threads. By default glibc hands such blocks back to the kernel (each one
mapped on its own while the adaptive mmap threshold is low; a thread's heap shrunk once its top
is free) and every next array faults its pages in again, zeroed: a compare of the ~4 GB bench
set took 535,000 page faults, 17% of its CPU time (perf), against about 28,000 with the
thresholds fixed here (docs/PERFORMANCE.md, "Memory the judge frees"). The process
then holds what it used at its peak until it ends, as a command may. Only the command's own
process is set (`__main__`); a program that calls `gradalign.compare` keeps its own settings
(the same effect there: GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:
glibc.malloc.trim_threshold=268435456). Elsewhere than glibc nothing is done."""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap
TRIM_THRESHOLD = 256 << 20  # free memory at a heap's top is handed back above this only


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; whether both were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library of that name in this process
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    wanted = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return [mallopt(option, value) for option, value in wanted] == [1, 1]
