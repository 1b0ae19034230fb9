"""Peak resident memory of this process over one stretch of work, and giving memory back between stretches.

The peak is the kernel's high-water mark (`VmHWM`), reset by writing 5 to
`/proc/self/clear_refs`: sampling RSS from a thread would miss the peak, because the
biggest allocations (pydantic's model_dump, orjson.dumps) hold the GIL from start to end.
Where the reset is not possible the peak is the whole process's, and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from pathlib import Path

import psutil

_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB$", re.MULTILINE)


def reset_peak() -> bool:
    """Start a new peak from the current RSS; False when only the process-lifetime peak is available."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _kernel_peak() is not None


def peak_rss_bytes() -> int:
    """Peak RSS since `reset_peak` (or since the process started, where it could not reset)."""
    peak = _kernel_peak()
    current = psutil.Process().memory_info().rss
    return current if peak is None else max(peak, current)


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def give_memory_back() -> None:
    """Collect garbage and hand freed heap pages back to the OS, so the next measurement starts low."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def _kernel_peak() -> int | None:
    try:
        match = _HWM.search(Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None
