"""tinyattn's Muon against torch.optim.Muon: one update of the main model's 16 matrices.

    python -m benchmarks.muon_compare
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m benchmarks.muon_compare  # a plain-AVX2 CPU

Prints how far torch's update is from ours (torch always orthogonalises in bf16) and the
median time of a step of each, in alternating rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

from benchmarks.arguments import check_counts
from tinyattn.cli import run_command
from tinyattn.errors import TinyattnError

if TYPE_CHECKING:
    import torch

LEAST = {"rounds": (1, ""), "repeats": (1, "")}

# The main config's matrices, per layer: qkv (576, 192), output (192, 192), gate_up (1024, 192),
# down (192, 512).
SHAPES = [(576, 192), (192, 192), (1024, 192), (192, 512)] * 4


def matrices() -> list[torch.nn.Parameter]:
    import torch

    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g) * 0.02) for shape in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def median_ms(optimizer, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three optimizers")
    parser.add_argument("--repeats", type=int, default=15, help="steps timed per optimizer and round")
    args = parser.parse_args()
    check_counts(args, LEAST)
    import torch  # after the arguments: --help and a refused count answer at once

    from tinyattn.train.optim import Muon

    if not hasattr(torch.optim, "Muon"):  # tinyattn runs on torch 2.5, before it
        raise TinyattnError(f"torch {torch.__version__} has no torch.optim.Muon to compare with; expected a "
                            "newer torch that has it")
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    start, ours, theirs, ours_bf16 = matrices(), matrices(), matrices(), matrices()
    optimizers = {"ours fp32": Muon(ours, lr=6e-3, weight_decay=0.1),
                  "ours bf16": Muon(ours_bf16, lr=6e-3, weight_decay=0.1, ns_dtype=torch.bfloat16),
                  "torch.optim.Muon": torch.optim.Muon(theirs, lr=6e-3, weight_decay=0.1,
                                                       adjust_lr_fn="match_rms_adamw")}
    for optimizer in optimizers.values():
        optimizer.step()

    def gap(a, b):  # max over matrices of |a - b| / |our update|
        return max(((x - y).abs().max() / (y - z).abs().max()).item() for x, y, z in zip(a, b, start))

    print(f"update difference from ours in fp32: torch.optim.Muon {gap(theirs, ours):.3g}, "
          f"ours in bf16 {gap(ours_bf16, ours):.3g}")
    for r in range(args.rounds):
        print(f"round {r}: " + ", ".join(f"{name} {median_ms(o, args.repeats):.0f} ms"
                                         for name, o in optimizers.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
