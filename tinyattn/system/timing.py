"""Wall time: one timed call, repeated calls, the process's age.

Every measurement in tinyattn times its calls here (the CPU's bf16 check, the peak-FLOPs
matmul, the benchmarks, the training loop's throughput), so each waits for the device the
same way: a call on a GPU returns before its kernels finish, and `synchronize` makes the
clock read the end of the work, not the end of the launch.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch


def synchronize(device: torch.device) -> None:
    """Wait until the device has finished the work queued on it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def seconds_of(fn: Callable[[], object], device: Optional[torch.device] = None) -> float:
    """Wall seconds of one call of fn(), waiting for `device` (if given) before the clock stops."""
    start = time.perf_counter()
    fn()
    if device is not None:
        synchronize(device)
    return time.perf_counter() - start


def call_times(fn: Callable[[], object], repeats: int, *, warmup: int = 0, budget_s: float = math.inf,
               device: Optional[torch.device] = None) -> list[float]:
    """Seconds of each of up to `repeats` calls, after `warmup` untimed ones.

    At least one call is timed; the next is made only while the time taken so far and one
    more call of the fastest kind seen fit in `budget_s`.
    """
    for _ in range(warmup):
        fn()
    if device is not None:
        synchronize(device)
    times = [seconds_of(fn, device)]
    while len(times) < repeats and sum(times) + min(times) <= budget_s:
        times.append(seconds_of(fn, device))
    return times


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1,
                device: Optional[torch.device] = None) -> float:
    """Median wall time of fn() in seconds, after `warmup` untimed calls."""
    return statistics.median(call_times(fn, repeats, warmup=warmup, device=device))


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED_AT  # no /proc: since tinyattn's timing was imported


_IMPORTED_AT = time.perf_counter()
