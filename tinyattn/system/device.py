"""Where and how the computation runs: the device, the precision, the device's peak speed.

Nothing here runs at import time; the training loop and the tools call these functions
explicitly. The names a user may give are written once, in `tinyattn.system.choices`
(torch-free, so config and --help never wait for torch). The precision rule: `auto` uses bf16 autocast on CUDA devices that
support it (fp16 with a gradient scaler on older ones), bf16 autocast on a CPU whose bf16
matmuls are fast (`tinyattn.system.cpu.cpu_bf16_is_fast`), and fp32 everywhere else. Seeds
and random states are in `tinyattn.system.seeding`, the process group in
`tinyattn.system.distributed`, timing in `tinyattn.system.timing`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from tinyattn.errors import ConfigError
from tinyattn.system.choices import PRECISION_NAMES, PRECISIONS, check_device
from tinyattn.system.cpu import cpu_bf16_is_fast
from tinyattn.system.timing import call_times, seconds_of

DTYPES = dict(zip(PRECISION_NAMES, (torch.float32, torch.bfloat16, torch.float16)))


def select_device(name: str = "auto", option: str = "--device ") -> torch.device:
    """auto: CUDA if present, then Apple MPS, else the CPU. An explicit device must exist; its refusal
    says how to ask for another with `option` (a lab, which has no --device: "--set train.device=")."""
    def fail(key, value, accepted):
        raise ConfigError(f"{key} {value!r} is not accepted; {accepted}")

    check_device(name, fail)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but CUDA is not available here; "
                          f"use {option}cpu or auto")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r} was asked for but this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' was asked for but Apple MPS is not available here; "
                          f"use {option}cpu or auto")
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


def select_precision(name: str, device: torch.device, setting: str = "precision") -> Precision:
    """`name` ("auto", "fp32", "bf16" or "fp16") on `device`; `setting`: what the user set it with
    (train.precision, --dtype), which a refusal names."""
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif device.type == "cpu":
            name = "bf16" if cpu_bf16_is_fast() else "fp32"
        else:
            name = "fp32"
    if name not in DTYPES:
        raise ConfigError(f"{setting} {name!r} is not accepted; expected one of {', '.join(PRECISIONS)}")
    if name == "fp16" and device.type == "cpu":
        raise ConfigError(f"{setting} 'fp16' is not supported on the CPU; use bf16 or fp32")
    dtype = None if name == "fp32" else DTYPES[name]
    return Precision(name, dtype, use_grad_scaler=(name == "fp16"))


PEAK_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144)  # each under 3.4x the time of the last
# The largest matmul each device type measures (others: 2048). A GPU's 2048 matmul runs far under
# its peak, which made MFU read over 100% on an H200 (docs/BENCHMARKS.md, "GPU check on an H200").
PEAK_SIZE_LIMIT = {"cpu": 2048, "cuda": 8192}
PEAK_CALL_SECONDS = 0.05  # a matmul slower than this is big enough: the ladder stops there
PEAK_FINAL_SECONDS = 0.25  # time for the repeats at the last size


def measure_peak_flops(device: torch.device, precision: Precision, size: int | None = None,
                       repeats: int = 5) -> float:
    """FLOP/s of a large square matmul in the training precision: the MFU denominator.

    The matrix grows from 256 towards `size` (by default the device type's
    `PEAK_SIZE_LIMIT`) and stops at the first size whose matmul
    takes longer than PEAK_CALL_SECONDS; the best of up to `repeats` calls there (as
    many as fit in PEAK_FINAL_SECONDS) counts. Growing from small sizes keeps the
    measurement well under a second on a small CPU, even in a precision it emulates
    (bf16 forced on a CPU without bf16 units, where one 2048 matmul takes many seconds);
    deciding on measured times, not on times extrapolated from small sizes, keeps a
    busy machine, where every call carries a fixed delay, from stopping the ladder early.
    """
    dtype = precision.autocast_dtype or torch.float32
    size = PEAK_SIZE_LIMIT.get(device.type, 2048) if size is None else size
    # An own generator: measuring must not move the global one (exact resume relies on it).
    # Drawn on the device that multiplies them: no host draw and copy of an 8192 x 8192 pair.
    generator = torch.Generator(device=device).manual_seed(0)
    ladder = sorted({n for n in PEAK_SIZES if n < size} | {size})
    for n in ladder:
        a = torch.randn(n, n, generator=generator, device=device).to(dtype)
        b = torch.randn(n, n, generator=generator, device=device).to(dtype)
        first = call_times(lambda: a @ b, 1, warmup=1, device=device)[0]  # the warm-up picks kernels
        if first > PEAK_CALL_SECONDS:
            break
    times = [first]
    while len(times) < repeats and sum(times) + min(times) <= PEAK_FINAL_SECONDS:
        times.append(seconds_of(lambda: a @ b, device))
    return 2 * n ** 3 / min(times)
