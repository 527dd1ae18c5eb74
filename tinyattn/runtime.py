"""Where and how the computation runs: device, precision, seeds, random states, processes.

Nothing here runs at import time; the training loop and the tools call these
functions explicitly. The precision rule: `auto` uses bf16 autocast on CUDA devices
that support it (fp16 with a gradient scaler on older ones), bf16 autocast on a CPU
whose bf16 matmuls are fast, and fp32 everywhere else.

Whether a CPU's bf16 is fast is read from what the CPU has, without timing anything:
an x86 CPU with AMX or AVX512-BF16 units runs bf16 matmuls in hardware; one without
them emulates bf16, many times slower than fp32. Only where the CPU's flags cannot
answer (ARM, Apple silicon) is a small matmul timed, for a fraction of a second, and
the verdict kept in `$TINYATTN_CACHE_DIR/cpu_bf16.json` (default
`~/.cache/tinyattn/`) per CPU and torch version, so it is measured once per machine;
delete that file or call `clear_cpu_cache()` to measure again. `TINYATTN_CPU_BF16=1`
(or `0`) sets the verdict and skips both.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Optional

import numpy as np
import torch

from tinyattn.config import DEVICE_PATTERN
from tinyattn.errors import ConfigError
from tinyattn.files import atomic_write

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


CPU_BF16_ENV = "TINYATTN_CPU_BF16"  # 1 or 0: bf16 is (is not) fast on this CPU, no detection
CACHE_DIR_ENV = "TINYATTN_CACHE_DIR"  # where the measured verdict is kept
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})  # x86 units that run bf16 matmuls
X86_CAPABILITIES = frozenset({"AVX2", "AVX512"})  # get_cpu_capability names only x86 builds give
BF16_FAST_SPEEDUP = 1.5  # a measured bf16 matmul this many times faster than fp32 counts as fast


def bf16_verdict_from_flags(flags: Optional[AbstractSet[str]], capability: str) -> Optional[bool]:
    """Whether bf16 matmuls are fast on a CPU with these flags; None when they cannot tell.

    `flags` are the CPU's feature flags in Linux's /proc/cpuinfo spelling (None: unknown),
    `capability` is `torch.backends.cpu.get_cpu_capability()`. AMX or AVX512-BF16 means
    yes. An x86 CPU (capability AVX2 or AVX512) without them emulates bf16: no. Anything
    else (ARM, Apple silicon, vector code switched off) cannot be told from flags.
    """
    if flags is None:
        return None
    if flags & BF16_CPU_FLAGS:
        return True
    if capability in X86_CAPABILITIES:
        return False
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> Optional[frozenset[str]]:
    """The CPU's feature flags: the `flags` line of /proc/cpuinfo (x86 Linux), else what torch can tell.

    Elsewhere torch's private `torch.cpu._is_avx512_bf16_supported` and
    `_is_amx_tile_supported` stand in for the two flags that matter (every CPU with AMX
    tiles so far also has AMX-BF16). None when neither source is there.
    """
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    flags = set()
    for flag, check_name in (("avx512_bf16", "_is_avx512_bf16_supported"),
                             ("amx_bf16", "_is_amx_tile_supported")):
        check = getattr(torch.cpu, check_name, None)  # private: may go in any release
        if check is None:
            return None
        if check():
            flags.add(flag)
    return frozenset(flags)


def cpu_bf16_is_fast() -> bool:
    """Whether training and generation on this CPU should run in bf16: the CPU-side `auto` rule.

    In order: the `TINYATTN_CPU_BF16` override, the CPU's flags (no timing), and only
    when those cannot tell, a short measurement cached on disk (`measured_cpu_bf16_is_fast`).
    """
    forced = os.environ.get(CPU_BF16_ENV, "")
    if forced:
        if forced not in ("0", "1"):
            raise ConfigError(f"{CPU_BF16_ENV}={forced!r} is not accepted; expected 1 (bf16 is fast), "
                              "0 (it is not) or unset (detect it)")
        return forced == "1"
    verdict = bf16_verdict_from_flags(cpu_flags(), torch.backends.cpu.get_cpu_capability())
    if verdict is not None:
        return verdict
    return measured_cpu_bf16_is_fast()


def measure_cpu_bf16_speedup(size: int = 256, rounds: int = 7, budget_s: float = 0.25) -> float:
    """How many times faster a bf16 matmul is than fp32 on this CPU, in a fraction of a second.

    For CPUs whose flags cannot say. The matrices are small and fp32 and bf16 calls
    alternate; it stops once the time budget is spent, or early once bf16 is clearly
    slower (emulated bf16 is many times slower, and each of its calls is costly). The
    best time of each is kept, since other processes can only make a call slower.
    """
    generator = torch.Generator().manual_seed(0)  # leaves the global generator alone
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    operands = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = {dtype: math.inf for dtype in operands}
    start = time.perf_counter()
    for x, y in operands.values():
        x @ y  # warm-up: the first call picks kernels
    for round_index in range(rounds):
        for dtype, (x, y) in operands.items():
            call_start = time.perf_counter()
            x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - call_start)
        clearly_slower = round_index >= 2 and best[torch.bfloat16] > 4 * best[torch.float32]
        if clearly_slower or time.perf_counter() - start > budget_s:
            break
    return best[torch.float32] / best[torch.bfloat16]


def cpu_cache_path() -> Path:
    """The file of measured verdicts: `$TINYATTN_CACHE_DIR/cpu_bf16.json`, else in ~/.cache/tinyattn."""
    folder = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "tinyattn"
    return Path(folder) / "cpu_bf16.json"


def clear_cpu_cache() -> None:
    """Forget the measured verdicts, so the next `auto` choice on such a CPU measures again."""
    cpu_cache_path().unlink(missing_ok=True)


def measured_cpu_bf16_is_fast() -> bool:
    """The measured verdict for this CPU and torch version, from the cache or measured now and kept.

    The file maps a machine key to its verdict, so one home folder shared by several
    machines keeps one entry each. An unreadable file counts as empty; one that cannot
    be written is a warning, and the verdict still holds for this process.
    """
    path = cpu_cache_path()
    key = f"{platform.machine()} | {cpu_name()} | torch {torch.__version__}"
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entry = entries.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("bf16_is_fast"), bool):
        return entry["bf16_is_fast"]
    speedup = measure_cpu_bf16_speedup()
    verdict = speedup >= BF16_FAST_SPEEDUP
    entries[key] = {"bf16_is_fast": verdict, "bf16_matmul_speedup": round(speedup, 2)}
    try:
        with atomic_write(path) as f:
            f.write(json.dumps(entries, indent=2, sort_keys=True).encode("utf-8"))
    except OSError as e:
        warnings.warn(f"{path}: cannot keep the CPU bf16 measurement ({e}); set {CACHE_DIR_ENV} "
                      "to a writable folder", stacklevel=2)
    return verdict


def cpu_name() -> str:
    """The CPU's model name, as precise as this platform tells it ("unknown" when it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":  # platform.processor() only says "arm" or "i386" there
        try:
            result = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                    text=True, timeout=5)
            if result.returncode == 0 and result.stdout.strip():
                return result.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or "unknown"


def select_precision(name: str, device: torch.device) -> Precision:
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif device.type == "cpu":
            name = "bf16" if cpu_bf16_is_fast() else "fp32"
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


PEAK_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)  # each under 3.4x the time of the last
PEAK_CALL_SECONDS = 0.05  # a matmul slower than this is big enough: the ladder stops there
PEAK_FINAL_SECONDS = 0.25  # time for the repeats at the last size


def measure_peak_flops(device: torch.device, precision: Precision, size: int = 2048,
                       repeats: int = 5) -> float:
    """FLOP/s of a large square matmul in the training precision: the MFU denominator.

    The matrix grows from 256 towards `size` and stops at the first size whose matmul
    takes longer than PEAK_CALL_SECONDS; the best of up to `repeats` calls there (as
    many as fit in PEAK_FINAL_SECONDS) counts. Growing from small sizes keeps the
    measurement well under a second on a small CPU, even in a precision it emulates
    (bf16 forced on a CPU without bf16 units, where one 2048 matmul takes many seconds);
    deciding on measured times, not on times extrapolated from small sizes, keeps a
    busy machine, where every call carries a fixed delay, from stopping the ladder early.
    """
    dtype = precision.autocast_dtype or torch.float32
    # An own generator: measuring must not move the global one (exact resume relies on it).
    generator = torch.Generator().manual_seed(0)
    ladder = sorted({n for n in PEAK_SIZES if n < size} | {size})
    for n in ladder:
        a = torch.randn(n, n, generator=generator).to(device, dtype)
        b = torch.randn(n, n, generator=generator).to(device, dtype)
        synchronize(device)
        a @ b  # warm-up: the first call picks kernels
        synchronize(device)
        times = [_timed_matmul(a, b, device)]
        if times[0] > PEAK_CALL_SECONDS:
            break
    while len(times) < repeats and sum(times) + times[0] <= PEAK_FINAL_SECONDS:
        times.append(_timed_matmul(a, b, device))
    return 2 * n ** 3 / min(times)


def _timed_matmul(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    start = time.perf_counter()
    a @ b
    synchronize(device)
    return time.perf_counter() - start


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
