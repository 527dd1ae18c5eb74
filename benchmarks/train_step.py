"""The training step of a config, with variants side by side: median seconds per step.

    python -m benchmarks.train_step --set train.precision=bf16 \\
        --variant "model.dropout=0.0" --variant "model.dropout=0.1 model.attention_dropout=0.0"

Each variant is the config (default: the main job's) with the --set overrides and then its
own; the step is `Trainer.train_step` exactly as a run takes it (the config's optimizer,
batch, precision, attention path and torch.compile), on random tokens. Every variant runs in
a fresh process, in alternating rounds (--rounds), since this machine's speed drifts within
minutes; each process reports the median of --steps steps after --warmup untimed ones (the
first of which compiles, when the config compiles). `by_precision` is not applied: name what
it would change as a variant.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys

from benchmarks.arguments import check_counts
from tinyattn.cli import run_command
from tinyattn.errors import ConfigError

LEAST = {"rounds": (1, ""), "steps": (1, ""), "warmup": (0, "")}  # the fewest each count accepts


def one_process(config_path: str, overrides: list[str], steps: int, warmup: int) -> dict:
    from benchmarks.measure import random_tokens
    from tinyattn.config import load_config
    from tinyattn.system.device import select_device, select_precision
    from tinyattn.system.timing import call_times
    from tinyattn.train.trainer import Trainer

    config = load_config(config_path, overrides)
    device = select_device(config.train.device)
    precision = select_precision(config.train.precision, device, "train.precision")
    if config.model.vocab_size is None:
        config.model.vocab_size = 65  # the character vocabulary of the main corpus
    tokens = random_tokens(config.model.vocab_size)
    trainer = Trainer.build(config.model, config.train, tokens, device=device, precision=precision)
    # Waiting for the device after the warm-up and after each step: on a GPU a step returns at its launch.
    times = call_times(trainer.train_step, steps, warmup=warmup, device=device)
    return {"precision": precision.name, "attention": trainer.model.attention_path,
            "median_s": statistics.median(times), "min_s": min(times)}


def main() -> int:
    args = _parser().parse_args()
    check_counts(args, LEAST)
    if args.child is not None:
        print(json.dumps(one_process(args.config, json.loads(args.child), args.steps, args.warmup)))
        return 0
    variants = args.variant or [""]
    check_variants(args.config, args.overrides, variants)
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            results[variant].append(_child_result(args, variant))
    print("| variant | precision | attention | median s/step per round |")
    print("| --- | --- | --- | --- |")
    for variant, rounds in results.items():
        medians = ", ".join(f"{r['median_s']:.3f}" for r in rounds)
        print(f"| {variant or '(the config)'} | {rounds[0]['precision']} | {rounds[0]['attention']} | {medians} |")
    return 0


def check_variants(config_path: str, overrides: list[str], variants: list[str]) -> None:
    """Every variant's config loaded here, before any process starts: a bad key or value is one
    line naming the variant, not a child's traceback."""
    from tinyattn.config import load_config

    config = load_config(config_path, overrides)  # the config and --set alone: their errors name them
    _runs_here(config, f"--set {' '.join(overrides)}" if overrides else config_path)
    for variant in variants:
        try:
            config = load_config(config_path, overrides + variant.split())
        except ConfigError as e:
            raise ConfigError(f"--variant {shlex.quote(variant)}: {str(e).removeprefix('--set: ')}") from None
        _runs_here(config, f"--variant {shlex.quote(variant)}")


def _runs_here(config, where: str) -> None:
    """The config's device and precision exist on this machine (a GPU's fp16 not on a CPU): else one
    line naming where they came from, not a child process's failure."""
    from tinyattn.system.device import select_device, select_precision

    try:
        device = select_device(config.train.device)
        if config.train.precision != "auto":  # auto asks the GPU itself: left to the child process
            select_precision(config.train.precision, device, "train.precision")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _child_result(args: argparse.Namespace, variant: str) -> dict:
    """One variant timed in a fresh process; its stderr is shown if it fails."""
    overrides = args.overrides + variant.split()
    out = subprocess.run([sys.executable, "-m", "benchmarks.train_step", "--config", args.config,
                          "--steps", str(args.steps), "--warmup", str(args.warmup),
                          "--child", json.dumps(overrides)], capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"variant {variant or '(the config)'}: its process failed with exit code "
                         f"{out.returncode}:\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/shakespeare_char.yaml")
    parser.add_argument("--set", nargs="*", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--variant", action="append", default=[],
                        help="space-separated KEY=VALUE overrides of one variant (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    raise SystemExit(run_command(main))
