"""What the CPU is: its name, its feature flags, and whether its bf16 matmuls are fast.

Whether a CPU's bf16 is fast is read from what the CPU has, without timing anything:
an x86 CPU with AMX or AVX512-BF16 units runs bf16 matmuls in hardware; one without
them emulates bf16, many times slower than fp32. Only where the CPU's flags cannot
answer (ARM, Apple silicon) is a small matmul timed, for a fraction of a second, and
the verdict kept in `$TINYATTN_CACHE_DIR/cpu_bf16.json` (default
`~/.cache/tinyattn/`) per CPU and torch version, so it is measured once per machine;
delete that file or call `clear_cpu_cache()` to measure again. `TINYATTN_CPU_BF16=1`
(or `0`) sets the verdict and skips both. `tinyattn.system.device.select_precision` asks
`cpu_bf16_is_fast` when the precision is `auto` on a CPU.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
import warnings
from pathlib import Path
from typing import AbstractSet, Optional

import torch

from tinyattn.errors import ConfigError, StorageError
from tinyattn.system.storage import atomic_write
from tinyattn.system.timing import seconds_of

CPU_BF16_ENV = "TINYATTN_CPU_BF16"  # 1 or 0: bf16 is (is not) fast on this CPU, no detection
CACHE_DIR_ENV = "TINYATTN_CACHE_DIR"  # where the measured verdict is kept
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})  # x86 units that run bf16 matmuls
X86_CAPABILITIES = frozenset({"AVX2", "AVX512"})  # get_cpu_capability names only x86 builds give
# oneDNN runs the matmuls; ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA) set to one of these
# keeps it off the bf16 units the flags list, and bf16 is then emulated (50x slower than fp32 on the
# AMX Xeon at AVX2).
ONEDNN_ISA_ENVS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ONEDNN_ISAS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                      "AVX512_CORE_VNNI"})
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
    line = _cpuinfo_value("flags", cpuinfo)
    if line is not None:
        return frozenset(line.split())
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

    In order: the `TINYATTN_CPU_BF16` override, oneDNN held below its bf16 units
    (`ONEDNN_MAX_CPU_ISA=AVX2`, as when emulating an AVX2 CPU), the CPU's flags (no timing), and only
    when those cannot tell, a short measurement cached on disk (`measured_cpu_bf16_is_fast`).
    """
    forced = os.environ.get(CPU_BF16_ENV, "")
    if forced:
        if forced not in ("0", "1"):
            raise ConfigError(f"{CPU_BF16_ENV}={forced!r} is not accepted; expected 1 (bf16 is fast), "
                              "0 (it is not) or unset (detect it)")
        return forced == "1"
    if any(os.environ.get(name, "").strip().upper() in ONEDNN_ISAS_WITHOUT_BF16 for name in ONEDNN_ISA_ENVS):
        return False
    verdict = bf16_verdict_from_flags(cpu_flags(), torch.backends.cpu.get_cpu_capability())
    if verdict is not None:
        return verdict
    return measured_cpu_bf16_is_fast()


def keep_compiled_code_per_capability() -> None:
    """Give a lowered `ATEN_CPU_CAPABILITY` its own torch.compile cache folder.

    Inductor writes C++ for the capability torch runs at (vectors of 8 floats at AVX2, 16
    at AVX-512) and keeps it on disk, in a folder not keyed on that capability: code
    written at AVX-512 and read back under `ATEN_CPU_CAPABILITY=avx2` gave wrong logits,
    and the other way round corrupted the heap. Emulating an AVX2 CPU on an AVX-512 one
    (as docs/BENCHMARKS.md does) then needs its own folder, which this picks beside the
    default one (`<default>_avx2`) unless `TORCHINDUCTOR_CACHE_DIR` names another folder.
    Torch's own default there counts as none named: importing torch._dynamo (building an
    optimizer does) sets the variable to it. Called before each torch.compile; a no-op
    without `ATEN_CPU_CAPABILITY`.
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # read first: the import below sets it
    if capability:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        if named is None or os.path.abspath(named) == os.path.abspath(default_cache_dir()):
            safe = "".join(c if c.isalnum() else "_" for c in capability)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{safe}"


def cpu_fp16_rows_are_fast() -> bool:
    """Whether one fp16 row times an fp16 matrix runs a vectorised kernel here (fp32 accumulation).

    torch's x86 builds at AVX2 or above convert fp16 with vector instructions (F16C), so such a
    product reads half the bytes of fp32's at about the same speed a byte: measured on AVX2
    (docs/BENCHMARKS.md), assumed for AVX-512, which has the same instructions. Elsewhere (ARM,
    x86 below AVX2) it is not measured, and the answer is no.
    """
    return torch.backends.cpu.get_cpu_capability() in X86_CAPABILITIES


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
            best[dtype] = min(best[dtype], seconds_of(lambda: x @ y))
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
    except (OSError, StorageError) as e:  # StorageError: a folder that refuses the file, named
        warnings.warn(f"{path}: cannot keep the CPU bf16 measurement ({e}); set {CACHE_DIR_ENV} "
                      "to a writable folder", stacklevel=2)
    return verdict


def cpu_name() -> str:
    """The CPU's model name, as precise as this platform tells it ("unknown" when it does not)."""
    name = _cpuinfo_value("model name")
    if name is not None:
        return name.strip()
    if platform.system() == "Darwin":  # platform.processor() only says "arm" or "i386" there
        try:
            result = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                    text=True, timeout=5)
            if result.returncode == 0 and result.stdout.strip():
                return result.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or "unknown"


def _cpuinfo_value(key: str, cpuinfo: str | Path = "/proc/cpuinfo") -> Optional[str]:
    """What follows the colon on the first line of /proc/cpuinfo starting with `key`; None when
    there is no such line or no such file (not Linux)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1]
    except OSError:
        pass
    return None
