"""Where and how the computation runs: device, precision, seeds, random states, processes.

Nothing here runs at import time; the training loop and the tools call these
functions explicitly. The precision rule: `auto` uses bf16 autocast on CUDA devices
that support it (fp16 with a gradient scaler on older ones), bf16 autocast on a CPU
where a quick matmul measurement shows bf16 to be faster than fp32 (CPUs with AMX
or AVX512-BF16 units), and fp32 everywhere else.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from tinyattn.config import DEVICE_PATTERN
from tinyattn.errors import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select_device(name: str = "auto") -> torch.device:
    """auto: CUDA if present, then Apple MPS, else the CPU. An explicit device must exist."""
    if not DEVICE_PATTERN.match(name):
        raise ConfigError(f"device {name!r} is not accepted; expected auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but CUDA is not available here; "
                          "use --device cpu or auto")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r} was asked for but this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' was asked for but Apple MPS is not available here; "
                          "use --device cpu or auto")
    return torch.device(name)


@dataclass(frozen=True)
class Precision:
    name: str  # fp32, bf16 or fp16
    autocast_dtype: Optional[torch.dtype]  # None: no autocast, plain fp32
    use_grad_scaler: bool  # fp16 needs loss scaling so small gradients do not underflow

    def autocast(self, device: torch.device):
        """The context the forward pass runs in; a no-op for fp32."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)


@functools.lru_cache(maxsize=None)
def cpu_bf16_speedup(size: int = 1024, repeats: int = 5) -> float:
    """How many times faster a bf16 matmul is than fp32 on this CPU (measured, cached)."""
    generator = torch.Generator().manual_seed(0)  # leaves the global generator alone

    def best_time(dtype: torch.dtype) -> float:
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        a @ b  # warm-up: the first call picks kernels
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)
    return best_time(torch.float32) / best_time(torch.bfloat16)


def select_precision(name: str, device: torch.device) -> Precision:
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif device.type == "cpu":
            name = "bf16" if cpu_bf16_speedup() > 1.5 else "fp32"
        else:
            name = "fp32"
    if name not in DTYPES:
        raise ConfigError(f"precision {name!r} is not accepted; expected auto, fp32, bf16 or fp16")
    if name == "fp16" and device.type == "cpu":
        raise ConfigError("precision 'fp16' is not supported on the CPU; use bf16 or fp32")
    dtype = None if name == "fp32" else DTYPES[name]
    return Precision(name, dtype, use_grad_scaler=(name == "fp16"))


def prefer_explicit_attention(device: torch.device, precision: Precision, context_length: int,
                              dropout: float) -> bool:
    """Whether training should use the explicit attention path instead of the fused kernel.

    Measured on a 2-core AVX512-BF16 CPU (docs/BENCHMARKS.md): in bf16, forward plus
    backward of causal attention with plain batched matmuls beats PyTorch's CPU flash
    kernel up to context 512 (23 against 35 ms at 256) and loses beyond (123 against 69
    ms at 1024). With attention dropout the fused kernel wins again (it draws the dropout
    mask inside the kernel; the explicit path materialises it). On GPUs and in fp32 the
    fused kernel wins.
    """
    return (device.type == "cpu" and precision.name == "bf16" and context_length <= 512
            and dropout == 0.0)


def measure_peak_flops(device: torch.device, precision: Precision, size: int = 2048,
                       repeats: int = 5) -> float:
    """FLOP/s of a large square matmul in the training precision: the MFU denominator."""
    dtype = precision.autocast_dtype or torch.float32
    if device.type == "cpu" and dtype == torch.float32:
        size = min(size, 1536)  # fp32 on a small CPU: keep the measurement under a second
    # An own generator: measuring must not move the global one (exact resume relies on it).
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    synchronize(device)
    a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * size ** 3 / min(times)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def random_states() -> dict:
    """Every global random generator's state, in types `torch.load(weights_only=True)` accepts."""
    numpy_state = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": {"name": numpy_state[0], "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
                  "pos": int(numpy_state[2]), "has_gauss": int(numpy_state[3]),
                  "cached_gaussian": float(numpy_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict) -> None:
    random.setstate(_as_tuple(states["python"]))
    n = states["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuple(value):
    """random.setstate wants tuples all the way down; a saved state may come back as lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_name: str) -> Distributed:
    """Join the process group torchrun describes in the environment; one process otherwise.

    NCCL on GPUs, gloo on the CPU. Each process on a GPU machine takes the GPU of its
    local rank.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank, world_size, local_rank)


def shutdown_distributed(dist: Distributed) -> None:
    if dist.enabled and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
