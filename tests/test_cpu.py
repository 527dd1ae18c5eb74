"""cpu: whether bf16 is fast here (flags first, a cached measurement only where they cannot tell),
the precision `auto` picks from it, and the bounded measurements on a CPU that emulates bf16."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tinyattn.errors import ConfigError
from tinyattn.system import cpu
from tinyattn.system.cpu import bf16_verdict_from_flags, clear_cpu_cache, cpu_cache_path, cpu_flags
from tinyattn.system.device import select_precision

CPU = torch.device("cpu")
AVX2_ONLY = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512_bf16"}
AMX = AVX2_ONLY | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}  # AMX without listing avx512_bf16


@pytest.fixture
def fake_cpu(monkeypatch, tmp_path):
    """A CPU whose flags and capability a test sets; no override, and a cache folder of its own."""
    monkeypatch.delenv(cpu.CPU_BF16_ENV, raising=False)
    for name in cpu.ONEDNN_ISA_ENVS:  # an emulation's environment (docs/BENCHMARKS.md) must not leak in
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(cpu.CACHE_DIR_ENV, str(tmp_path / "cache"))

    def set_cpu(flags, capability):
        monkeypatch.setattr(cpu, "cpu_flags", lambda *args: flags)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    return set_cpu


@pytest.fixture
def no_timing(monkeypatch):
    """Any timing or matmul measurement from here on fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the precision choice timed something")
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", forbidden)
    monkeypatch.setattr(time, "perf_counter", forbidden)


class CountingMeasurement:
    def __init__(self, speedup):
        self.speedup = speedup
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.speedup


@pytest.mark.parametrize("flags, capability, expected", [
    (AVX2_ONLY, "AVX2", "fp32"),
    (AVX512_BF16, "AVX512", "bf16"),
    (AMX, "AVX512", "bf16"),
])
def test_auto_precision_on_x86_reads_the_flags_without_timing(fake_cpu, no_timing, flags, capability,
                                                              expected):
    fake_cpu(flags, capability)
    assert select_precision("auto", CPU).name == expected
    assert not cpu_cache_path().exists()  # nothing measured, nothing kept


@pytest.mark.parametrize("flags, capability, expected", [
    (AVX2_ONLY, "AVX2", False),
    (frozenset(), "AVX2", False),  # x86 off Linux: torch says neither bf16 unit is there
    (AVX2_ONLY | {"avx512f"}, "AVX512", False),
    (AVX512_BF16, "AVX2", True),  # ATEN_CPU_CAPABILITY lowered: the matmul units are still there
    (frozenset({"amx_bf16"}), "NO AVX", True),
    (frozenset(), "NO AVX", None),  # what an ARM build may also report: cannot tell
    (frozenset({"fp", "asimd", "bf16"}), "SVE256", None),  # ARM: flags cannot tell
    (None, "AVX512", None),  # flags unknown
])
def test_bf16_verdict_from_flags(flags, capability, expected):
    assert bf16_verdict_from_flags(flags, capability) is expected


def test_cpu_flags_reads_the_flags_line_of_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 avx512_bf16\n"
                       "vmx flags\t: ept vpid\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "sse2", "avx2", "avx512_bf16"})


def test_cpu_flags_without_cpuinfo_asks_torch_and_is_none_when_torch_cannot_say(tmp_path, monkeypatch):
    arm_cpuinfo = tmp_path / "cpuinfo"
    arm_cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert cpu_flags(arm_cpuinfo) == frozenset({"avx512_bf16"})
    assert cpu_flags(tmp_path / "missing") == frozenset({"avx512_bf16"})
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_flags(tmp_path / "missing") is None


def test_measured_verdict_is_cached_on_disk_and_reused(fake_cpu, monkeypatch):
    fake_cpu(None, "SVE256")  # flags cannot tell: the fallback measures
    fast = CountingMeasurement(speedup=3.0)
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", fast)
    assert select_precision("auto", CPU).name == "bf16"
    assert fast.calls == 1
    entries = json.loads(cpu_cache_path().read_text())
    assert [entry["bf16_is_fast"] for entry in entries.values()] == [True]
    assert all(f"torch {torch.__version__}" in key for key in entries)

    assert select_precision("auto", CPU).name == "bf16"  # a second process would read the same file
    assert fast.calls == 1

    clear_cpu_cache()
    assert not cpu_cache_path().exists()
    slow = CountingMeasurement(speedup=0.05)
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", slow)
    assert select_precision("auto", CPU).name == "fp32"
    assert slow.calls == 1
    assert [e["bf16_is_fast"] for e in json.loads(cpu_cache_path().read_text()).values()] == [False]


def test_cache_of_another_machine_or_a_corrupt_file_is_measured_again(fake_cpu, monkeypatch):
    fake_cpu(None, "SVE256")
    measure = CountingMeasurement(speedup=3.0)
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", measure)
    path = cpu_cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"other-machine | torch 0.0": {"bf16_is_fast": False}}))
    assert cpu.cpu_bf16_is_fast() is True
    assert measure.calls == 1
    assert len(json.loads(path.read_text())) == 2  # the other machine's entry is kept

    path.write_text('{"cut off')
    assert cpu.cpu_bf16_is_fast() is True
    assert measure.calls == 2
    assert len(json.loads(path.read_text())) == 1

    path.write_text(json.dumps({key: {"bf16_is_fast": "false"} for key in json.loads(path.read_text())}))
    assert cpu.cpu_bf16_is_fast() is True  # a verdict that is not true or false: measured again
    assert measure.calls == 3

    path.write_text("[]")  # JSON, but not a table of machines: measured again, not a traceback
    assert cpu.cpu_bf16_is_fast() is True
    assert measure.calls == 4


def test_a_measured_speedup_of_exactly_the_threshold_counts_as_fast_and_one_just_under_it_does_not(
        fake_cpu, monkeypatch):
    fake_cpu(None, "SVE256")
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", CountingMeasurement(speedup=cpu.BF16_FAST_SPEEDUP))
    assert cpu.cpu_bf16_is_fast() is True
    clear_cpu_cache()
    under = cpu.BF16_FAST_SPEEDUP * 0.9  # bf16 a little faster than fp32: not worth its rounding
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", CountingMeasurement(speedup=under))
    assert cpu.cpu_bf16_is_fast() is False


def test_machines_with_other_cpus_sharing_a_home_folder_keep_a_measured_verdict_each(fake_cpu, monkeypatch):
    fake_cpu(None, "SVE256")
    monkeypatch.setattr(cpu, "cpu_name", lambda: "CPU A")
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", CountingMeasurement(speedup=3.0))
    assert cpu.cpu_bf16_is_fast() is True
    monkeypatch.setattr(cpu, "cpu_name", lambda: "CPU B")  # the same architecture and torch, another CPU
    other = CountingMeasurement(speedup=0.5)
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", other)
    assert cpu.cpu_bf16_is_fast() is False and other.calls == 1
    monkeypatch.setattr(cpu, "cpu_name", lambda: "CPU A")
    assert cpu.cpu_bf16_is_fast() is True and other.calls == 1  # its own entry, not measured again
    assert len(json.loads(cpu_cache_path().read_text())) == 2


def test_unwritable_cache_warns_and_still_answers(fake_cpu, monkeypatch, tmp_path):
    fake_cpu(None, "SVE256")
    monkeypatch.setattr(cpu, "measure_cpu_bf16_speedup", CountingMeasurement(speedup=3.0))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cpu.CACHE_DIR_ENV, str(blocker))  # the cache folder would be a file
    with pytest.warns(UserWarning, match="cannot keep the CPU bf16 measurement"):
        assert cpu.cpu_bf16_is_fast() is True


def test_the_bf16_measurement_leaves_the_global_generator_alone():
    """It runs at a run's start on a CPU whose flags cannot tell: drawing from the global generator
    would move every dropout mask and batch after it (exact resume relies on that generator)."""
    state = torch.get_rng_state()
    assert cpu.measure_cpu_bf16_speedup(size=32, rounds=1) > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_one_slow_first_bf16_call_does_not_end_the_measurement_as_emulated(monkeypatch):
    """Only a bf16 clearly slower after a few rounds ends it early: a first call slowed by another
    process would otherwise leave a fast bf16 measured (and cached) as slow."""
    bf16_times = iter([0.005, 0.0005, 0.0005])  # the first call stalls, the next are twice as fast

    def seconds_of(fn, device=None):
        return next(bf16_times) if fn().dtype == torch.bfloat16 else 0.001

    monkeypatch.setattr(cpu, "seconds_of", seconds_of)
    assert cpu.measure_cpu_bf16_speedup(size=16, rounds=3, budget_s=60) == pytest.approx(2.0)


def test_a_bf16_clearly_slower_after_a_few_rounds_ends_the_measurement_early(monkeypatch):
    """Emulated bf16 is many times slower and each call costly: the measurement stops after the few
    rounds that tell, not at its time budget or its last round."""
    bf16_calls = []

    def seconds_of(fn, device=None):
        if fn().dtype == torch.bfloat16:
            bf16_calls.append(1)
            return 0.01  # ten times the fp32 call's time
        return 0.001

    monkeypatch.setattr(cpu, "seconds_of", seconds_of)
    assert cpu.measure_cpu_bf16_speedup(size=16, rounds=7, budget_s=60) == pytest.approx(0.1)
    assert len(bf16_calls) == 3


def test_the_bf16_measurement_stops_once_its_time_budget_is_spent(monkeypatch):
    """A bf16 neither fast nor clearly slower, on a CPU whose calls are slow: the rounds end with the
    budget (a run's start waits for them), not after all of them."""
    from types import SimpleNamespace

    fp32_calls, clock = [], iter(range(100))

    def seconds_of(fn, device=None):
        if fn().dtype == torch.float32:
            fp32_calls.append(1)
        return 0.001  # bf16 as fast as fp32: nothing ends the measurement early

    monkeypatch.setattr(cpu, "seconds_of", seconds_of)
    monkeypatch.setattr(cpu, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # a second a read
    assert cpu.measure_cpu_bf16_speedup(size=16, rounds=7, budget_s=2.5) == pytest.approx(1.0)
    assert len(fp32_calls) == 3  # the third round ends past the budget


def test_the_measured_speedup_is_the_fp32_time_over_the_bf16_time(monkeypatch):
    """A bf16 matmul twice as fast as fp32's reads as a speedup of 2 (fast), not 0.5."""
    def seconds_of(fn, device=None):
        return 0.001 if fn().dtype == torch.bfloat16 else 0.002

    monkeypatch.setattr(cpu, "seconds_of", seconds_of)
    assert cpu.measure_cpu_bf16_speedup(size=16, rounds=3) == pytest.approx(2.0)


@pytest.mark.parametrize("value, flags, capability, expected", [
    ("1", AVX2_ONLY, "AVX2", "bf16"),
    ("0", AVX512_BF16, "AVX512", "fp32"),
    ("1", None, "SVE256", "bf16"),  # where the fallback would otherwise measure
    ("0", None, "SVE256", "fp32"),
])
def test_env_override_sets_the_verdict(fake_cpu, no_timing, monkeypatch, *, value, flags, capability,
                                       expected):
    fake_cpu(flags, capability)
    monkeypatch.setenv(cpu.CPU_BF16_ENV, value)
    assert select_precision("auto", CPU).name == expected
    assert not cpu_cache_path().exists()


@pytest.mark.parametrize("name, isa, expected", [
    ("ONEDNN_MAX_CPU_ISA", "AVX2", "fp32"),  # emulating an AVX2 CPU: bf16 50x slower than fp32
    ("DNNL_MAX_CPU_ISA", "avx512_core", "fp32"),  # the old name; oneDNN reads either case
    ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", "bf16"),  # AMX off, AVX512-BF16 on
    ("ONEDNN_MAX_CPU_ISA", "DEFAULT", "bf16"),
])
def test_onednn_held_below_its_bf16_units_means_fp32(fake_cpu, no_timing, monkeypatch, *, name, isa, expected):
    fake_cpu(AMX, "AVX512")
    monkeypatch.setenv(name, isa)
    assert select_precision("auto", CPU).name == expected


def test_env_override_other_than_0_or_1_is_a_config_error(fake_cpu, monkeypatch):
    fake_cpu(AVX2_ONLY, "AVX2")
    monkeypatch.setenv(cpu.CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError, match="TINYATTN_CPU_BF16='yes' is not accepted; expected 1"):
        select_precision("auto", CPU)


@pytest.mark.bench  # asserts on wall-clock seconds, in a fresh process with oneDNN held to AVX2
def test_measurements_are_short_where_bf16_is_emulated():
    """With oneDNN held to AVX2 (as on a CPU without bf16 units), bf16 matmuls are emulated,
    many times slower than fp32; neither the fallback measurement nor the bf16 peak may stall."""
    script = textwrap.dedent("""
        import json, time, torch
        from tinyattn.system.cpu import measure_cpu_bf16_speedup
        from tinyattn.system.device import measure_peak_flops, select_precision
        cpu = torch.device("cpu")
        start = time.perf_counter()
        speedup = measure_cpu_bf16_speedup()
        fallback = time.perf_counter() - start
        start = time.perf_counter()
        peak = measure_peak_flops(cpu, select_precision("bf16", cpu))
        print(json.dumps({"speedup": speedup, "fallback_s": fallback, "peak": peak,
                          "peak_s": time.perf_counter() - start}))
    """)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["fallback_s"] < 1.5, figures
    assert figures["peak_s"] < 1.5, figures
    assert figures["peak"] > 0


def test_a_lowered_capability_keeps_its_compiled_code_in_a_folder_of_its_own(monkeypatch):
    # Inductor's cache is not keyed on ATEN_CPU_CAPABILITY: AVX-512 code read back at AVX2 gave
    # wrong logits, AVX2 code read back at AVX-512 corrupted the heap (docs/BENCHMARKS.md).
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    cpu.keep_compiled_code_per_capability()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # torch's own default, untouched
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    cpu.keep_compiled_code_per_capability()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir() + "_avx2"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")  # a folder named is kept
    cpu.keep_compiled_code_per_capability()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"


def test_a_lowered_capability_gets_its_folder_where_torch_has_already_set_its_default(monkeypatch):
    # Importing torch._dynamo (building the optimizer does) sets TORCHINDUCTOR_CACHE_DIR to torch's
    # default before the trainer compiles: that folder is torch's, not one the user named.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    cpu.keep_compiled_code_per_capability()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir() + "_avx2"
    cpu.keep_compiled_code_per_capability()  # a second compile (decoding after training) keeps it
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir() + "_avx2"


@pytest.mark.slow  # a subprocess: torch's imports, a few seconds
def test_a_fresh_process_that_builds_a_compiled_trainer_at_a_lowered_capability_uses_its_own_folder():
    """As `tinyattn train` does: no TORCHINDUCTOR_CACHE_DIR given, the optimizer built before the compile."""
    code = textwrap.dedent("""
        import os, numpy as np, torch
        from tinyattn.config import ModelConfig, TrainConfig
        from tinyattn.system.device import select_precision
        from tinyattn.train.trainer import Trainer
        cpu = torch.device("cpu")
        model = ModelConfig(vocab_size=16, n_layer=1, n_head=2, n_embd=16, context_length=8)
        Trainer.build(model, TrainConfig(compile=True, batch_size=2), np.arange(400) % 16, device=cpu,
                      precision=select_precision("fp32", cpu))
        print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    """)
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "ATEN_CPU_CAPABILITY": "avx2"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("_avx2"), done.stdout


@pytest.mark.parametrize("capability, expected", [("AVX2", True), ("AVX512", True), ("DEFAULT", False),
                                                   ("NO AVX", False)])
def test_fp16_rows_are_fast_only_where_torch_runs_x86_vector_code(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert cpu.cpu_fp16_rows_are_fast() is expected
