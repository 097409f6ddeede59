"""Peak resident memory of a block of code, the same way on every Keras backend.

TensorFlow, JAX (XLA) and PyTorch on CPU each have their own allocator and
their own (partial) statistics, so the benchmark measures what the operating
system sees instead: the process's resident set size (RSS).

`PeakMemory` reports the highest RSS reached inside its block minus the RSS
at the block's start. On Linux it resets the kernel's high-water mark
(`echo 5 > /proc/self/clear_refs`) at the start and reads `VmHWM` from
`/proc/self/status` at the end - exact, nothing is missed between samples.
Where that reset is not allowed it samples `/proc/self/statm` from a
background thread every half millisecond instead (a short-lived peak can
then be missed). Without `/proc` it reports nothing.

Freed memory only leaves the RSS when the allocator hands it back to the
operating system, and allocators keep freed blocks for reuse: glibc keeps
them in its heap, TensorFlow's oneDNN build keeps them in its own
best-fit-with-coalescing pool. A peak measured after the warm-up would then
miss every buffer that the warm-up already allocated. So the memory
measurement runs where freed memory goes back:

- `ALLOCATOR_ENVIRONMENT`, for a process started with it: glibc maps every
  block over 64 KiB separately and unmaps it on free; TensorFlow uses the
  system allocator (`TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1`) instead of its pool.
- `return_freed_memory_to_os()`, for a process already running: the same
  glibc settings through `mallopt`, and `malloc_trim`. It cannot change
  TensorFlow's pool.

Timings are taken without these settings, in a process of their own.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

# glibc reads the first two at start-up (fixed thresholds also switch off its dynamic
# threshold, which would otherwise keep freed buffers of a few MiB in the heap);
# TensorFlow reads the third when it creates its CPU allocator.
ALLOCATOR_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1",
}
_MALLOPT_TRIM_THRESHOLD = -1
_MALLOPT_MMAP_THRESHOLD = -3

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SAMPLE_INTERVAL_S = 0.0005


def current_rss_bytes() -> int | None:
    """Resident set size of this process in bytes, or None without `/proc`.

    Example:
        >>> current_rss_bytes() > 0
        True
    """
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def return_freed_memory_to_os() -> bool:
    """Make glibc return freed blocks over 64 KiB to the OS from now on, and trim its heap.

    Returns False where the C library is not glibc (nothing changed).

    Example:
        >>> return_freed_memory_to_os() in (True, False)
        True
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_MALLOPT_MMAP_THRESHOLD, int(ALLOCATOR_ENVIRONMENT["MALLOC_MMAP_THRESHOLD_"]))
        libc.mallopt(_MALLOPT_TRIM_THRESHOLD, int(ALLOCATOR_ENVIRONMENT["MALLOC_TRIM_THRESHOLD_"]))
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def _read_high_water_mark_bytes() -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return _read_high_water_mark_bytes() is not None


class _RssSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak = current_rss_bytes() or 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            rss = current_rss_bytes()
            if rss is not None and rss > self.peak:
                self.peak = rss
            time.sleep(_SAMPLE_INTERVAL_S)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        rss = current_rss_bytes()
        return max(self.peak, rss or 0)


class PeakMemory:
    """Context manager: peak RSS inside the block above the RSS at its start.

    Attributes (after the block):
        peak_bytes: the increase, in bytes (0 when the block allocated nothing
            that reached the RSS); None when RSS cannot be read here.
        baseline_bytes: the RSS at the start of the block.
        method: `"kernel high-water mark"`, `"sampled every 0.5 ms"` or
            `"unavailable"`.

    Example:
        >>> import numpy as np
        >>> with PeakMemory() as peak:
        ...     block = np.ones(50_000_000 // 8)
        ...     del block
        >>> peak.peak_bytes > 40_000_000
        True
    """

    def __init__(self):
        self.peak_bytes: int | None = None
        self.baseline_bytes: int | None = None
        self.method = "unavailable"
        self._sampler: _RssSampler | None = None

    def __enter__(self) -> PeakMemory:
        self.baseline_bytes = current_rss_bytes()
        if self.baseline_bytes is None:
            return self
        if _reset_high_water_mark():
            self.method = "kernel high-water mark"
            # The reset sets the mark to the current RSS, which is the baseline
            # up to pages touched in between.
            self.baseline_bytes = current_rss_bytes()
        else:
            self.method = "sampled every 0.5 ms"
            self._sampler = _RssSampler()
            self._sampler.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.baseline_bytes is None:
            return
        if self._sampler is not None:
            peak = self._sampler.stop()
        else:
            peak = _read_high_water_mark_bytes() or self.baseline_bytes
        self.peak_bytes = max(0, peak - self.baseline_bytes)
