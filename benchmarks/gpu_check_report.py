"""Helpers of benchmarks/gpu_check.sh: the machine, the matmul peak, a run's curve, the summary.

    python -m benchmarks.gpu_check_report env --json work/json/env.json
    python -m benchmarks.gpu_check_report peak --device cuda --precision bf16 --json work/json/peak.json
    python -m benchmarks.gpu_check_report run work/runs/baby --target-loss 1.47 --json work/json/baby.json
    python -m benchmarks.gpu_check_report summary work --json out/gpu_check.json --text out/summary.txt

`summary` gathers every step's status (work/steps.jsonl, written by the shell script) and
every figure (work/json/*.json) into one JSON file, and prints a short summary of the
figures the GPU issue asks for. It never fails on a missing or broken piece: that piece is
reported as missing, so a summary comes out of a run that was cut short.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# What tinyattn and the check import at run time, and what `datasets` needs (device README).
PACKAGES = ("torch", "numpy", "tokenizers", "tensorboard", "tqdm", "pyyaml", "matplotlib", "datasets", "dill",
            "multiprocess", "xxhash", "pyarrow", "fsspec", "huggingface-hub", "pandas", "pytest", "triton",
            "filelock", "psutil")


# ----------------------------------------------------------------------------- env


def environment() -> dict:
    """Versions, the GPU, and whether `datasets` reads a local file (the wheels' proof)."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    info = {"python": platform.python_version(), "executable": sys.executable, "machine": platform.machine(),
            "cores": os.cpu_count(), "versions": versions,
            "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                    gpu_memory_bytes=properties.total_memory,
                    multiprocessors=properties.multi_processor_count,
                    capability=f"{properties.major}.{properties.minor}", bf16=torch.cuda.is_bf16_supported(),
                    nccl_available=torch.distributed.is_nccl_available())
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                                 "clocks.max.sm,power.limit", "--format=csv,noheader"],
                                                capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = f"unavailable: {e}"
    info["gloo_available"] = torch.distributed.is_gloo_available()
    info["datasets_check"] = _datasets_check()
    info["datasets_from"] = _datasets_origin()
    return info


def _datasets_origin() -> str:
    """'the wheels' when `datasets` is imported from the check's own site folder (installed from
    gpu-wheels/), else the folder it came from: a machine that had it already proves no wheel."""
    spec = importlib.util.find_spec("datasets")
    if spec is None or spec.origin is None:
        return "nowhere (not installed)"
    site = os.environ.get("SITE")
    inside = site and Path(spec.origin).resolve().is_relative_to(Path(site).resolve())
    return "the wheels" if inside else str(Path(spec.origin).parent.parent)


def _datasets_check() -> str:
    """'ok' when datasets streams a two-line JSON file, else the error's last line."""
    import tempfile

    try:
        import datasets

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "two.jsonl"
            path.write_text('{"text": "a"}\n{"text": "b"}\n')
            rows = datasets.load_dataset("json", data_files=[str(path)], split="train", streaming=True,
                                         cache_dir=str(Path(folder) / "cache"))
            texts = [row["text"] for row in rows]
        return "ok" if texts == ["a", "b"] else f"read {texts!r}"
    except Exception as e:  # reported, not raised: nothing the check measures needs datasets
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"


# ----------------------------------------------------------------------------- peak


def peak(device: str, precision: str, sizes: list[int]) -> dict:
    """The matmul's FLOP/s at each of `sizes`: what MFU is measured against, and how it grows.

    On a GPU a 2048 x 2048 matmul is too small to reach the chip's rate, so MFU against it
    reads high; tinyattn measures MFU against 8192 on CUDA (`PEAK_SIZE_LIMIT`), the figure the
    summary judges the target by.
    """
    import torch

    from tinyattn.system.device import measure_peak_flops, select_device, select_precision

    torch_device = select_device(device)
    chosen = select_precision(precision, torch_device)
    rows = {}
    for size in sizes:
        rows[str(size)] = measure_peak_flops(torch_device, chosen, size=size, repeats=10)
    if torch_device.type == "cuda":  # the same matmul timed with CUDA events, ten after three warm-ups
        dtype = chosen.autocast_dtype or torch.float32
        n = max(sizes)
        a = torch.randn(n, n, device=torch_device, dtype=dtype)
        b = torch.randn(n, n, device=torch_device, dtype=dtype)
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ b
        end.record()
        torch.cuda.synchronize()
        rows[f"{n}_events_mean"] = 2 * n ** 3 * 10 / (start.elapsed_time(end) / 1000)
    return {"device": str(torch_device), "precision": chosen.name, "flops": rows}


# ----------------------------------------------------------------------------- a training run


# a session of one step that compiled the model times none: "no tok/s (its one step compiled the model)"
DONE = re.compile(r"done: ([\d,]+) steps?(?: \(steps? [\d-]+\))? in ([\d.]+) s \((.*)\), "
                  r"(?:([\d,]+) tok/s|no tok/s \([^)]*\)), best validation loss ([\d.]+|nan|inf)")
VALIDATION = re.compile(r"step (\d+): validation loss ([\d.]+|nan|inf)")
BUDGET = re.compile(r"time budget (\S+): measured ([\d.]+) s/step, ([\d.]+) s per evaluation, ([\d.]+) s per "
                    r"checkpoint, (\d+) s of start-up and (\d+) s measuring -> about ([\d,]+) steps?")
SPLIT = re.compile(r"([a-z-]+) ([\d.]+) s \(")
PLAN_NOTE = re.compile(r"time budget \S+: (\d+) s spent, about ([\d,]+) more steps at ([\d.]+) s/step, "
                       r"schedule (\d+)% done")


def run_figures(run_dir: Path, target_loss: float | None) -> dict:
    """A run's validation curve, wall time and split, parsed from its train.log and TensorBoard.

    TensorBoard's val/loss events carry wall-clock times, so the seconds from the first
    training step to the first validation loss at or under `target_loss` come from them.
    """
    log = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    figures: dict = {"run_dir": str(run_dir), "first_line": log.splitlines()[0] if log else None,
                     "validation": [[int(s), float(v)] for s, v in VALIDATION.findall(log)]}
    if (match := BUDGET.search(log)):
        figures["budget"] = {"budget": match[1], "step_seconds": float(match[2]),
                             "eval_seconds": float(match[3]), "save_seconds": float(match[4]),
                             "startup_seconds": float(match[5]), "measuring_seconds": float(match[6]),
                             "steps": int(match[7].replace(",", ""))}
    if (match := DONE.search(log)):
        figures["done"] = {"steps": int(match[1].replace(",", "")), "wall_seconds": float(match[2]),
                           "split_seconds": {name: float(s) for name, s in SPLIT.findall(match[3])},
                           "tokens_per_second": float(match[4].replace(",", "")) if match[4] else None,
                           "best_val_loss": float(match[5])}
    if "done" in figures and (notes := PLAN_NOTE.findall(log)):
        figures["plan_check"] = _plan_check(notes, figures["done"])
    curve = figures["validation"]
    if curve:
        figures["best_val_loss"] = min(v for _, v in curve)
        figures["last_val_loss"] = curve[-1][1]
    if target_loss is not None:
        figures["target_loss"] = target_loss
        reached = [step for step, v in curve if v <= target_loss]
        figures["target_reached_at_step"] = reached[0] if reached else None
    figures["tensorboard"] = _tensorboard_curve(run_dir, target_loss)
    return figures


def _plan_check(notes: list[tuple[str, ...]], done: dict) -> dict:
    """A time budget's plan against the run: the s/step it planned with (a median of per-step times
    the host measured) beside the training seconds per step the run took. On a GPU the steps are
    timed without a sync: a host that runs ahead of the device would plan with far too short a step
    (a ratio well under 1) and leave the schedule undone until its last steps."""
    planned = float(notes[-1][2])
    split = done["split_seconds"]
    # a session's first step that compiled the model is timed apart, as "compile"
    train_seconds, steps = split.get("train"), done["steps"] - ("compile" in split)
    taken = train_seconds / steps if train_seconds and steps else None
    return {"planned_step_seconds": planned, "taken_step_seconds": taken,
            "ratio": planned / taken if taken else None,
            "schedule_done_at_notes": [int(note[3]) for note in notes]}


def _tensorboard_curve(run_dir: Path, target_loss: float | None) -> dict:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
        tags = events.Tags()["scalars"]
        val = events.Scalars("val/loss") if "val/loss" in tags else []
        train = events.Scalars("train/loss") if "train/loss" in tags else []
        tokens = events.Scalars("perf/tokens_per_second") if "perf/tokens_per_second" in tags else []
        mfu = events.Scalars("perf/mfu") if "perf/mfu" in tags else []
        start = train[0].wall_time if train else (val[0].wall_time if val else None)
        out = {"val_loss": [[e.step, e.value, e.wall_time - start] for e in val] if start else [],
               "train_loss": [[e.step, e.value] for e in train],
               "tokens_per_second_median": _median([e.value for e in tokens[1:] or tokens]),
               "mfu_median": _median([e.value for e in mfu[1:] or mfu]),
               "note": "seconds are wall time since the first logged training loss"}
        if target_loss is not None and start:
            reached = [e.wall_time - start for e in val if e.value <= target_loss]
            out["seconds_to_target"] = reached[0] if reached else None
        return out
    except Exception as e:  # noqa: BLE001 - reported in the JSON instead
        return {"error": f"{type(e).__name__}: {e}"}


def _median(values: list[float]):
    values = sorted(values)
    return values[len(values) // 2] if values else None


# ----------------------------------------------------------------------------- summary


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"error": f"{path.name}: {type(e).__name__}: {e}"}


def _pytest_counts(xml_path: Path) -> dict:
    try:
        root = ElementTree.parse(xml_path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        kinds = ("tests", "failures", "errors", "skipped")
        counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in kinds}
        failed = [f"{case.get('classname')}::{case.get('name')}" for s in suites
                  for case in s.iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None]
        return {**counts, "passed": counts["tests"] - sum(counts[k] for k in kinds[1:]),
                "failed": failed}
    except (OSError, ElementTree.ParseError) as e:
        return {"error": f"{xml_path.name}: {e}"}


def summary(work: Path) -> tuple[dict, list[str]]:
    steps = []
    steps_file = work / "steps.jsonl"
    if steps_file.exists():
        steps = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    figures = {p.stem: _load(p) for p in sorted((work / "json").glob("*.json"))}
    for xml_path in sorted((work / "json").glob("*.xml")):
        figures[xml_path.stem] = _pytest_counts(xml_path)
    result = {"steps": steps, "figures": figures,
              "not_measured": ["multi-GPU NCCL data parallel: one GPU; the 2-process launch runs on gloo"]}
    try:
        result["targets"] = targets(figures)
    except Exception as e:  # noqa: BLE001 - the figures are kept whatever the targets make of them
        result["targets"] = {"error": f"{type(e).__name__}: {e}"}
    return result, summary_lines(result)


def targets(f: dict) -> dict:
    """Issue 14's targets against the figures: each with its value and whether it is met."""
    out = {}
    for name in sorted(k for k in f if k.startswith("baby") and "best_val_loss" in f[k]):
        baby = f[name]
        seconds = baby.get("tensorboard", {}).get("seconds_to_target")  # from the first logged loss
        out[f"{name}: validation <= 1.47 within 60 s of training"] = {
            "best_val_loss": baby["best_val_loss"], "seconds_to_1.47": seconds,
            "train_seconds": baby.get("done", {}).get("split_seconds", {}).get("train"),
            "met": seconds is not None and seconds <= 60}
    big = _big_matmul_flops(f)
    compiled = [r for r in f.get("train-124m", {}).get("training", []) if r.get("compile")]
    if compiled:
        r = compiled[0]
        against_big = r["flops_per_token"] * r["tokens_per_second"] / big if big else None
        out["124M: MFU >= 45% (bf16, compiled)"] = {
            "mfu_vs_bench_peak": r["mfu"], "bench_peak_flops": r["peak_flops"],
            "mfu_vs_8192_matmul": against_big, "matmul_8192_flops": big,
            "met": (against_big if against_big is not None else r["mfu"]) >= 0.45}
    batch_one = [r for r in f.get("decode-124m", []) if isinstance(r, dict) and r.get("batch_size") == 1]
    if batch_one:
        best = max(batch_one, key=lambda r: r["cached_tokens_per_s"])
        out["124M: decoding >= 1,500 tokens/s at batch 1"] = {
            "tokens_per_s": best["cached_tokens_per_s"], "compile": best["compile"],
            "met": best["cached_tokens_per_s"] >= 1500}
    return out


def _big_matmul_flops(f: dict) -> float | None:
    """FLOP/s of the largest peak matmul over 2048 (peak.json), the fairer MFU denominator."""
    flops = f.get("peak", {}).get("flops", {})
    return max((v for k, v in flops.items() if k.isdigit() and int(k) > 2048), default=None)


def summary_lines(result: dict) -> list[str]:
    """The short summary: one line per figure the issue asks for. A section whose figures are
    missing or malformed says so in one line instead of failing the summary."""
    lines = []
    for section in (_env_lines, _pytest_lines, _run_lines, _training_lines, _decode_lines, _attention_lines):
        try:
            lines += section(result["figures"])
        except Exception as e:  # noqa: BLE001 - one broken section must not hide the others
            name = section.__name__.strip("_").removesuffix("_lines")
            lines.append(f"{name}: cannot summarise ({type(e).__name__}: {e})")
    for name, target in result.get("targets", {}).items():
        if isinstance(target, dict):
            lines.append(f"target {name}: {'met' if target['met'] else 'MISSED'} "
                         f"({', '.join(f'{k} {v}' for k, v in target.items() if k != 'met')})")
    lines.append("steps: " + ", ".join(f"{s['name']} {s['status']} ({s.get('seconds', 0):.0f} s)"
                                       for s in result["steps"]))
    lines.append("not measured: " + "; ".join(result["not_measured"]))
    return lines


def _env_lines(f: dict) -> list[str]:
    if "env" not in f:  # the follow-up plan (GPU_CHECK_PLAN=runs) measures no environment
        return []
    env = f["env"]
    return [f"machine: {env.get('gpu') or 'no GPU'}, torch {env.get('versions', {}).get('torch')}, "
            f"python {env.get('python')}, datasets from {env.get('datasets_from')}: {env.get('datasets_check')}"]


def _pytest_lines(f: dict) -> list[str]:
    lines = []
    for name in ("pytest-cuda", "pytest-gloo"):
        if name in f:
            p = f[name]
            failed = f"; failed: {', '.join(p['failed'])}" if p.get("failed") else ""
            lines.append(f"{name}: {p.get('passed')} passed, {p.get('failures')} failed, {p.get('errors')} "
                         f"errors, {p.get('skipped')} skipped{failed}")
    return lines


def _run_lines(f: dict) -> list[str]:
    lines = []
    for name in sorted(k for k in f if k.startswith(("baby", "main"))):
        r = f[name]
        done, tensorboard = r.get("done", {}), r.get("tensorboard", {})
        step = r.get("target_reached_at_step")
        reached = (f"reached at step {step}, {tensorboard.get('seconds_to_target', 0):.0f} s into training"
                   if step else "not reached")
        lines.append(f"{name}: best validation loss {r.get('best_val_loss')} (target {r.get('target_loss')}: "
                     f"{reached}); {done.get('steps')} steps, {done.get('wall_seconds')} s wall "
                     f"({done.get('split_seconds')}), {done.get('tokens_per_second')} tok/s")
        if (plan := r.get("plan_check")) and plan["ratio"] is not None:
            planned, taken = plan["planned_step_seconds"], plan["taken_step_seconds"]
            lines.append(f"{name}: the time plan's step {planned:.4f} s against {taken:.4f} s taken "
                         f"(ratio {plan['ratio']:.2f}; well under 1: unsynced step times); schedule done "
                         f"at its notes {plan['schedule_done_at_notes']}%")
    return lines


def _training_lines(f: dict) -> list[str]:
    lines = []
    big = _big_matmul_flops(f)
    for r in f.get("train-124m", {}).get("training", []):
        achieved = r["flops_per_token"] * r["tokens_per_second"]
        against_big = f", {achieved / big:.1%} of an 8192 matmul's {big / 1e12:.0f} TFLOP/s" if big else ""
        lines.append(f"124M training ({r['precision']}, compile={r['compile']}, batch {r['batch_size']}): "
                     f"{r['tokens_per_second']:,.0f} tok/s, MFU {r['mfu']:.1%} of "
                     f"{r['peak_flops'] / 1e12:.2f} "
                     f"TFLOP/s measured{against_big}; peak memory {r['peak_memory_bytes'] / 2**30:.1f} GiB")
    return lines


def _decode_lines(f: dict) -> list[str]:
    lines = []
    for name in ("decode-baby", "decode-124m"):
        for r in f.get(name) if isinstance(f.get(name), list) else []:
            lines.append(f"{name} ({r['dtype']}, batch {r['batch_size']}, compile={r['compile']}): "
                         f"{r['cached_tokens_per_s']:,.0f} tok/s cached, "
                         f"{r['cached_ms_per_step']:.2f} ms/step, "
                         f"TTFT {r['ttft_ms']:.1f} ms, first run {r['first_run_s']:.1f} s, "
                         f"uncached {r['uncached_tokens_per_s']:,.0f} tok/s")
    return lines


def _attention_lines(f: dict) -> list[str]:
    rows = f.get("attention", {}).get("attention", {}).get("rows", [])
    return ["attention ms, fused/explicit: " + ", ".join(
        f"T={r['context_length']} {r['fused_ms']:.2f}/{r['explicit_ms']:.2f}" for r in rows)] if rows else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("env")
    p.add_argument("--json", type=Path, required=True)
    p = commands.add_parser("peak")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--sizes", nargs="+", type=int, default=[2048, 8192])
    p.add_argument("--json", type=Path, required=True)
    p = commands.add_parser("run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--target-loss", type=float)
    p.add_argument("--json", type=Path, required=True)
    p = commands.add_parser("summary")
    p.add_argument("work", type=Path)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--text", type=Path)
    args = parser.parse_args()

    if args.command == "env":
        result = environment()
    elif args.command == "peak":
        result = peak(args.device, args.precision, args.sizes)
    elif args.command == "run":
        result = run_figures(args.run_dir, args.target_loss)
    else:
        result, lines = summary(args.work)
        if args.text:
            args.text.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.command != "summary":
        print(json.dumps(result)[:2000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
