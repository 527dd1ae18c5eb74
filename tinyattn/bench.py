"""Benchmarks: measured, not assumed. Each function returns a plain dict of figures.

`scripts/bench.py` runs them all and writes JSON; `docs/BENCHMARKS.md` records the
results on the machines we have. Timings are medians over repeats after warm-up.
"""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of fn() in seconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ----------------------------------------------------------------------------- decoding
# (measure_decode goes here)


# ----------------------------------------------------------------------------- attention cost
# (measure_attention_cost goes here)


# ----------------------------------------------------------------------------- training
# (measure_training goes here)
