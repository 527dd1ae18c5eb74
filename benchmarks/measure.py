"""Benchmarks: measured, not assumed. Each function returns a plain dict of figures.

`benchmarks/suite.py` runs them all and writes JSON; `docs/BENCHMARKS.md` records the
results on the machines we have. Timings are medians over repeats after warm-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from tinyattn.config import ModelConfig, TrainConfig, load_config
from tinyattn.data.token_cache import token_dtype
from tinyattn.generate.cpu_weights import pack_linear_weights
from tinyattn.generate.decoder import CachedDecoder, row_weight_dtype
from tinyattn.generate.sampling import sample_next_token
from tinyattn.model.attention import attention, causal_mask
from tinyattn.model.memory import available_bytes
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.cpu import cpu_bf16_is_fast, cpu_name
from tinyattn.system.device import DTYPES, measure_peak_flops, select_device, select_precision
from tinyattn.system.timing import call_times, median_time, seconds_of, synchronize
from tinyattn.train.trainer import Trainer

# ----------------------------------------------------------------------------- decoding


# The decoding benchmarks' default model: nanoGPT's "baby GPT" size, the nanoGPT comparison's.
DECODE_MODEL = ModelConfig(vocab_size=65, n_layer=6, n_head=6, n_embd=384, context_length=256)


def random_tokens(vocab_size: int, count: int = 1_000_000) -> np.ndarray:
    """`count` ids drawn uniformly from the vocabulary (seeded), in the type a token cache stores them in."""
    return np.random.default_rng(0).integers(0, vocab_size, count).astype(token_dtype(vocab_size))


def measure_decode(*, model_config: ModelConfig = DECODE_MODEL, new_tokens: int = 500,
                   prompt_tokens: int = 200, uncached_tokens: int | None = None, dtype: str = "fp32",
                   threads: int | None = None, pack: bool = False, row_dtype: str | None = None,
                   compile: bool = False, temperature: float = 0.8, repeats: int = 3, device: str = "cpu",
                   seed: int = 0, batch_size: int = 1) -> dict:
    """Decoding speed with the KV cache (the loop of `generate_tokens`) and without it.

    The model is built from the whole `model_config` (every field: qk_norm, an untied head, ...)
    with random weights (its own initialisation, seeded); speed does not depend on them. Both
    loops sample with the same `sample_next_token` at `temperature`. The cached loop is
    `generate_tokens`' own: a `CachedDecoder` prefilled, then stepped and sampled.

    - ttft_ms: time to first token for a `prompt_tokens` prompt (prefill, then one draw).
    - cached_tokens_per_s: the `new_tokens - 1` tokens after the first, over the time from the
      first to the last; past the context this includes the refills (the context rule of
      `tinyattn.generate`; `refills` is the decoder's count), as a real run does.
    - first_run_s: the whole warm-up run of min(new_tokens, 50) tokens, which with `compile`
      includes compiling the decode step (from inductor's on-disk cache when it holds it).
    - uncached_tokens_per_s: the same prompt, each step recomputing the full forward pass over
      the last <= context_length tokens (a sliding window), for `uncached_tokens` tokens
      (default `new_tokens`); timed once, it is slow.
    Cached figures are medians of `repeats` runs after one warm-up run. `dtype` is "fp32" or "bf16" (the
    weights are cast); `threads` sets torch.set_num_threads for the measurement; `pack` stores the
    weights in oneDNN's layout (`generate.cpu_weights.pack_linear_weights`) for both loops, with
    `row_dtype` ("fp16") copies for one-row products; `compile` compiles the cached loop's step.
    `batch_size` sequences are decoded together (one random prompt each): tokens/s count every
    sequence's tokens, cached_ms_per_step and uncached_ms_per_step are one step of the whole batch
    (a token of each sequence), ttft_ms its prefill and first draw.
    """
    torch_device = select_device(device)
    with _num_threads(threads):
        model, packed, prompt = _model_and_prompt(
            model_config, device=torch_device, dtype=dtype, pack=pack, row_dtype=row_dtype,
            batch_size=batch_size, prompt_tokens=prompt_tokens, seed=seed)
        uncached_tokens = new_tokens if uncached_tokens is None else uncached_tokens
        first_run_seconds, runs, uncached_seconds = _decode_runs(
            model, prompt, new_tokens=new_tokens, uncached_tokens=uncached_tokens, repeats=repeats,
            compile=compile, temperature=temperature, seed=seed)
        speeds = _decode_speeds(runs, uncached_seconds, batch_size=batch_size, new_tokens=new_tokens,
                                uncached_tokens=uncached_tokens)
        shape = {**dataclasses.asdict(model_config), "parameters": model.num_parameters()}
        return {
            "device": str(torch_device), "cpu": cpu_name(), "machine": platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "dtype": dtype, "packed": packed,
            "row_dtype": row_dtype if packed else None, "compile": compile, "batch_size": batch_size, "model": shape,
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "uncached_tokens": uncached_tokens,
            "temperature": temperature, "repeats": repeats, "refills": runs[0].refills,
            "first_run_s": first_run_seconds, **speeds}


def _decode_runs(model, prompt: torch.Tensor, *, new_tokens: int, uncached_tokens: int, repeats: int,
                 compile: bool, temperature: float, seed: int) -> tuple[float, list["CachedRun"], float]:
    """The warm-up run's seconds, `repeats` timed cached runs, and the uncached run's seconds."""
    sampling = dict(compile=compile, temperature=temperature, seed=seed)
    start = time.perf_counter()
    _cached_run(model, prompt, min(new_tokens, 50), **sampling)  # warm-up: compile, kernels
    first_run_seconds = time.perf_counter() - start
    runs = [_cached_run(model, prompt, new_tokens, **sampling) for _ in range(repeats)]
    uncached_seconds = _uncached_seconds(model, prompt, uncached_tokens, temperature=temperature, seed=seed)
    return first_run_seconds, runs, uncached_seconds


def _decode_speeds(runs: list["CachedRun"], uncached_seconds: float, *, batch_size: int, new_tokens: int,
                   uncached_tokens: int) -> dict:
    """Tokens/s count every sequence of the batch; ms per step is one step of the whole batch."""
    cached_seconds = statistics.median(run.rest_s for run in runs)
    cached = batch_size * (new_tokens - 1) / cached_seconds
    uncached = batch_size * uncached_tokens / uncached_seconds
    return {"ttft_ms": 1000 * statistics.median(run.first_s for run in runs),
            "cached_tokens_per_s": cached, "cached_ms_per_step": 1000 * cached_seconds / (new_tokens - 1),
            "uncached_tokens_per_s": uncached,
            "uncached_ms_per_step": 1000 * uncached_seconds / uncached_tokens,
            "speedup": cached / uncached}


def _model_and_prompt(config: ModelConfig, *, device: torch.device, dtype: str, pack: bool,
                      row_dtype: str | None, batch_size: int, prompt_tokens: int,
                      seed: int) -> tuple[LanguageModel, bool, torch.Tensor]:
    """A seeded random model in `dtype` (packed if asked and possible) and random prompts (B, T)."""
    torch.manual_seed(seed)
    model = LanguageModel(config).to(device, DTYPES[dtype]).eval()
    packed = pack and pack_linear_weights(model, row_dtype=row_dtype and DTYPES[row_dtype])
    prompt = torch.randint(0, config.vocab_size, (batch_size, prompt_tokens),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    return model, packed, prompt


@contextlib.contextmanager
def _num_threads(threads: int | None):
    """torch.set_num_threads(threads) inside the block (None: unchanged), restored after."""
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class CachedRun(NamedTuple):
    first_s: float  # prefill and the first draw
    rest_s: float  # every later token: steps, refills and draws
    refills: int  # the decoder's own count (the context rule of tinyattn.generate)


@torch.inference_mode()
def _cached_run(model, prompt: torch.Tensor, n: int, *, compile: bool, temperature: float,
                seed: int) -> CachedRun:
    """n tokens through `generate_tokens`' loop: a CachedDecoder prefilled, then stepped and sampled."""
    device = prompt.device
    generator = torch.Generator(device).manual_seed(seed)
    start = time.perf_counter()
    decoder = CachedDecoder(model, batch_size=prompt.size(0), compile=compile)
    token = sample_next_token(decoder.prefill(prompt), generator, temperature)  # (B,)
    synchronize(device)
    first = time.perf_counter()
    for _ in range(n - 1):
        token = sample_next_token(decoder.step(token), generator, temperature)
    synchronize(device)
    return CachedRun(first - start, time.perf_counter() - first, decoder.refills)


@torch.inference_mode()
def _uncached_seconds(model, prompt: torch.Tensor, n: int, *, temperature: float, seed: int) -> float:
    """Seconds for n tokens, each from a full forward pass over the last <= context_length tokens."""
    context_length = model.config.context_length
    generator = torch.Generator(prompt.device).manual_seed(seed)
    sequence = prompt.clone()  # (B, T), grows by one token a step
    model(sequence[:, -context_length:])  # warm-up

    def run() -> None:
        nonlocal sequence
        for _ in range(n):
            logits = model.next_token_logits(sequence[:, -context_length:])  # (B, V), as nanoGPT's generate()
            token = sample_next_token(logits, generator, temperature)  # (B,)
            sequence = torch.cat([sequence, token.unsqueeze(1)], dim=1)

    return call_times(run, 1, device=prompt.device)[0]  # timed once: it is slow


# ----------------------------------------------------------------------------- attention cost


def measure_attention_cost(context_lengths=(64, 128, 256, 512, 1024, 2048), *, batch_size: int = 4,
                           n_head: int = 6, head_dim: int = 64, repeats: int = 5,
                           device: str = "cpu", measure_memory: bool = True) -> dict:
    """Forward time and peak memory of one causal attention: fused (SDPA) against explicit.

    Both paths get the same fp32 q, k, v of shape (B, H, T, D) and no projections, so the
    figures are the cost of attention alone: `F.scaled_dot_product_attention(is_causal=True)`
    against `tinyattn.model.attention.attention` with `causal_mask`, which materialises the (B, H, T, T)
    scores and weights. Times are medians after one warm-up call, without gradients.

    Peak memory is what one forward adds on top of its inputs. On CUDA it is
    `torch.cuda.max_memory_allocated` above the allocation before the call. On the CPU torch's
    allocations are invisible to tracemalloc, so each point runs in a fresh Python process
    that resets the kernel's peak-RSS mark (/proc/self/clear_refs) after building its inputs
    and a warm-up, runs one forward, and reports the peak RSS (VmHWM) above the RSS before;
    this counts every page touched, thread-pool scratch included (glibc is told to map
    every allocation over 16 KiB afresh, so reused free heap pages hide none of it).
    Lengths whose explicit path would need more than half the memory available are
    skipped and listed.
    """
    torch_device = select_device(device)
    shape = dict(batch_size=batch_size, n_head=n_head, head_dim=head_dim)
    rows, skipped = [], []
    for T in context_lengths:
        weights_bytes = batch_size * n_head * T * T * 4  # (B, H, T, T) fp32, what explicit keeps
        if 3 * weights_bytes > _available_memory_bytes(torch_device) / 2:  # scores, masked, weights
            skipped.append(T)
            continue
        row = {"context_length": T, "weights_bytes": weights_bytes,
               **_attention_times(T, repeats=repeats, device=torch_device, **shape)}
        for path in ("fused", "explicit"):
            row[f"{path}_peak_bytes"] = None
            if measure_memory:
                row[f"{path}_peak_bytes"] = _attention_peak_bytes(path, T, device=torch_device, **shape)
        rows.append(row)
    return {"device": str(torch_device), "threads": torch.get_num_threads(),
            "batch_size": batch_size, "n_head": n_head, "head_dim": head_dim, "dtype": "fp32",
            "repeats": repeats, "memory_method": _memory_method(torch_device, measure_memory),
            "rows": rows, "skipped_context_lengths": skipped}


@torch.no_grad()
def _attention_times(T: int, *, batch_size: int, n_head: int, head_dim: int, repeats: int, device) -> dict:
    """Median ms of each path on the same seeded q, k, v, and how far apart their outputs are."""
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(3, batch_size, n_head, T, head_dim, generator=generator)  # (3, B, H, T, D)
    q, k, v = qkv.to(device).unbind(0)
    fused = _attention_forward("fused", q, k, v)
    explicit = _attention_forward("explicit", q, k, v)
    times = {"max_abs_difference": (fused - explicit).abs().max().item()}
    del fused, explicit
    for path in ("fused", "explicit"):
        forward = functools.partial(_attention_forward, path, q, k, v)
        times[f"{path}_ms"] = 1000 * median_time(forward, repeats, warmup=1, device=device)
    return times


def _memory_method(device, measure_memory: bool) -> str:
    if not measure_memory:
        return "not measured"
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated above the allocation before the call"
    if device.type == "cpu" and _can_reset_peak_rss():
        return "peak RSS (VmHWM) above RSS before the call, one fresh process per point"
    return "not measured (needs CUDA, or a CPU under Linux with /proc/self/clear_refs)"


def _attention_forward(path: str, q, k, v):
    """One causal attention forward; q, k, v: (B, H, T, D). Returns (B, H, T, D)."""

    if path == "fused":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(2)
    return attention(q, k, v, causal_mask(T, T, q.device))[0]


def _attention_peak_bytes(path: str, T: int, *, batch_size: int, n_head: int, head_dim: int,
                          device) -> int | None:
    """Bytes one forward adds at its peak (see measure_attention_cost for the method)."""

    if device.type == "cuda":
        q, k, v = torch.randn(3, batch_size, n_head, T, head_dim, device=device).unbind(0)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            _attention_forward(path, q, k, v)  # freed at once: the peak mark keeps its size
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu" or not _can_reset_peak_rss():
        return None
    # A fresh process: memory freed by earlier points stays mapped in this one and
    # would hide part of the next point's peak. A low mmap threshold makes glibc map
    # every allocation over 16 KiB afresh instead of reusing free heap pages unseen.
    package_root = str(Path(__file__).resolve().parents[1])
    code = ("import json, sys; from benchmarks.measure import _peak_rss_child; "
            "print(json.dumps(_peak_rss_child(*json.loads(sys.argv[1]))))")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "16384",
           "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    arguments = json.dumps([path, T, batch_size, n_head, head_dim])
    result = subprocess.run([sys.executable, "-c", code, arguments], capture_output=True, text=True,
                            env=env, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _peak_rss_child(path: str, T: int, batch_size: int, n_head: int, head_dim: int) -> int:
    """Runs in its own process: peak RSS above the RSS before one attention forward."""

    q, k, v = torch.randn(3, batch_size, n_head, T, head_dim).unbind(0)
    with torch.no_grad():
        _attention_forward(path, q[:, :, :8], k[:, :, :8], v[:, :, :8])  # load kernels, start threads
        before = _proc_status_bytes("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
        out = _attention_forward(path, q, k, v)
        peak = _peak_rss_since_reset()
    del out
    return peak - before


def _peak_rss_since_reset() -> int:
    """Bytes of VmHWM, the mark /proc/self/clear_refs resets: psutil reports no peak RSS on Linux."""
    return _proc_status_bytes("VmHWM")


def _proc_status_bytes(field: str) -> int:
    """A memory figure of this process from Linux's /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _can_reset_peak_rss() -> bool:
    """Whether this kernel lets a process reset its peak-RSS mark (tried on this process)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _available_memory_bytes(device) -> float:
    """Free memory on `device` as a run's check reads it (psutil, else /proc/meminfo); unknown: no limit."""
    free, _where = available_bytes(device)
    return float("inf") if free is None else free


def attention_cost_table(result: dict) -> str:
    """`measure_attention_cost`'s result (as saved in JSON) as a Markdown table, one row per T.

    docs/ATTENTION.md holds this table of docs/bench-cpu.json's "attention" section
    (`python -m benchmarks.attention --table-from docs/bench-cpu.json`), and a test
    checks that it still is.
    """
    def mib(n):
        return "n/a" if n is None else f"{n / 2**20:,.1f}"

    lines = ["| T | fused ms | explicit ms | explicit / fused | fused peak MiB | explicit peak MiB "
             "| weights tensor MiB | max abs diff |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['context_length']} | {row['fused_ms']:.2f} | {row['explicit_ms']:.2f} "
                     f"| {row['explicit_ms'] / row['fused_ms']:.1f}x | {mib(row['fused_peak_bytes'])} "
                     f"| {mib(row['explicit_peak_bytes'])} | {mib(row['weights_bytes'])} "
                     f"| {row['max_abs_difference']:.1e} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- training


def measure_training(model_config, *, batch_size: int = 16, device: str = "auto",
                     precision: str = "auto", compile: bool = False, steps: int = 10,
                     warmup: int = 3, peak_flops: float | None = None) -> dict:
    """Training throughput of full optimizer steps on random tokens, and MFU.

    Each timed step is forward, backward, gradient clipping and a fused AdamW update,
    exactly as `tinyattn.train.trainer.Trainer.train_step` does them (it is the same code). The
    FLOPs per token are 6N plus attention (`LanguageModel.flops_per_token`); the peak
    is a large matmul in the same precision on the same device, measured now.

    Peak memory is this row's: CUDA's allocation peak, or on a Linux CPU the peak RSS since the
    mark is reset after the trainer is built (/proc/self/clear_refs). Where the mark cannot be
    reset (another OS) it is the process's peak so far, earlier rows included;
    `peak_memory_scope` says which ("this row" or "the process so far").
    """
    torch_device = select_device(device)
    chosen = select_precision(precision, torch_device)
    train_config = TrainConfig(batch_size=batch_size, compile=compile)
    tokens = random_tokens(model_config.vocab_size)
    trainer = Trainer.build(model_config, train_config, tokens, device=torch_device, precision=chosen)
    # Measured before the memory mark is reset: its matrices (8192 x 8192 on CUDA) are not the model's.
    peak = peak_flops or measure_peak_flops(torch_device, chosen)
    scope = "this row" if _reset_peak_memory(torch_device) else "the process so far"

    # The first step compiles (when asked) and allocates optimizer state.
    first_step = seconds_of(trainer.train_step, torch_device)
    seconds = median_time(trainer.train_step, steps, warmup=warmup - 1, device=torch_device)
    tokens_per_step = batch_size * model_config.context_length
    tokens_per_second = tokens_per_step / seconds
    flops_per_token = trainer.model.flops_per_token()
    return {
        "device": str(torch_device),
        "precision": chosen.name,
        "compile": compile,
        "parameters": trainer.model.num_parameters(),
        "batch_size": batch_size,
        "context_length": model_config.context_length,
        "step_seconds_median": seconds,
        "first_step_seconds": first_step,
        "tokens_per_second": tokens_per_second,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "mfu": flops_per_token * tokens_per_second / peak,
        "peak_memory_bytes": _peak_memory_bytes(torch_device, since_reset=scope == "this row"),
        "peak_memory_scope": scope,
    }


def _reset_peak_memory(device) -> bool:
    """Resets the peak-memory mark where it can (CUDA's; the peak RSS on Linux); whether it did."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    return device.type == "cpu" and _can_reset_peak_rss()  # trying resets the mark


def _peak_memory_bytes(device, since_reset: bool) -> int:
    """Peak memory: allocated on CUDA, the peak resident set size on the CPU (since the mark was
    reset, else the process's peak so far)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if since_reset:
        return _peak_rss_since_reset()
    if sys.platform == "win32":  # psutil's peak working set (a dev dependency: only here is it needed)
        import psutil

        return int(psutil.Process().memory_info().peak_wset)
    import resource  # POSIX; psutil has no peak RSS there

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


# ----------------------------------------------------------------------------- the suite

SECTIONS = ("training", "decode", "attention")


def machine_description() -> dict:
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "machine": platform.machine(),
            "torch": torch.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16_fast": cpu_bf16_is_fast()}


def context_lengths(first: int, last: int) -> list[int]:
    """The context lengths an attention-cost table measures: `first` doubled while below `last`,
    then `last` itself, which a doubling may not reach (64, 100 -> [64, 100])."""
    lengths = []
    T = first
    while T < last:
        lengths.append(T)
        T *= 2
    return lengths + [last]


def run_suite(config_path: str, *, overrides=(), device: str = "auto", precision: str = "auto",
              batch_size: int = 16, vocab_size: int = 65, compile: bool = False, steps: int = 10,
              max_context: int = 2048, skip=(), report=print) -> dict:
    """Every benchmark for the model shape of `config_path`; prints a summary as it goes."""
    model_config = load_config(config_path, list(overrides)).model
    model_config.vocab_size = model_config.vocab_size or vocab_size
    m = model_config
    results = {"machine": machine_description(), "config": str(config_path),
               "model": {"n_layer": m.n_layer, "n_head": m.n_head, "n_kv_head": m.kv_heads,
                         "n_embd": m.n_embd, "context_length": m.context_length,
                         "vocab_size": m.vocab_size}}
    report(f"{results['machine']['cpu']} ({results['machine']['cores']} cores), torch "
           f"{results['machine']['torch']}, cuda: {results['machine']['cuda']}")
    if "training" not in skip:
        runs = []
        for use_compile in ([False, True] if compile else [False]):
            r = measure_training(model_config, batch_size=batch_size, device=device, precision=precision,
                                 compile=use_compile, steps=steps, warmup=min(3, steps))
            runs.append(r)
            report(f"training ({r['precision']}, compile={use_compile}, batch {batch_size}): "
                   f"{r['tokens_per_second']:,.0f} tok/s, MFU {r['mfu']:.1%} of "
                   f"{r['peak_flops'] / 1e12:.2f} TFLOP/s measured, {r['flops_per_token'] / 1e6:.1f} "
                   f"MFLOP/token, peak memory {r['peak_memory_bytes'] / 2**20:,.0f} MiB"
                   + ("" if r["peak_memory_scope"] == "this row" else " (the process's peak so far)"))
        results["training"] = runs
    if "decode" not in skip:
        torch_device = select_device(device)
        dtype = "bf16" if select_precision(precision, torch_device).name == "bf16" else "fp32"
        # fp16 row copies where `tinyattn generate --dtype <precision>` keeps them
        rows = row_weight_dtype(precision, DTYPES[dtype], torch_device) == torch.float16
        r = measure_decode(model_config=model_config, dtype=dtype,
                           pack=torch_device.type == "cpu", row_dtype="fp16" if rows else None,
                           device=str(torch_device),
                           new_tokens=500, prompt_tokens=min(200, m.context_length))
        report(f"decode ({dtype}, batch 1): cached {r['cached_tokens_per_s']:,.0f} tok/s, uncached "
               f"{r['uncached_tokens_per_s']:,.1f} tok/s ({r['speedup']:.1f}x), time to first token "
               f"{r['ttft_ms']:.1f} ms")
        results["decode"] = r
    if "attention" not in skip:
        lengths = context_lengths(64, max_context)
        r = measure_attention_cost(lengths, device=device, measure_memory=True)
        for row in r["rows"]:
            report(f"attention T={row['context_length']}: fused {row['fused_ms']:.2f} ms, explicit "
                   f"{row['explicit_ms']:.2f} ms")
        results["attention"] = r
    return results
