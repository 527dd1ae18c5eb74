"""The benchmark suite: training throughput and MFU, peak memory, decoding, attention cost.

    python -m benchmarks.suite                                   # the 6-layer, width-384 model on this machine
    python -m benchmarks.suite --config configs/tiny.yaml --steps 3 --max-context 128 --json out.json
    python -m benchmarks.suite --device cuda --config configs/shakespeare_char_gpu.yaml --compile

Every figure is measured after warm-up, as the median of repeated runs; see the functions
in `benchmarks.measure` for exactly what each one times. Prints a summary and, with --json,
writes every figure (with the machine, CPU model and torch version) to a file.
"""

import argparse
import json
from pathlib import Path

from benchmarks.arguments import check_counts, check_output, write_figures
from benchmarks.measure import SECTIONS, run_suite
from tinyattn.cli import run_command
from tinyattn.errors import ConfigError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/shakespeare_char_gpu.yaml",
                        help="model shape to measure (default: the 6-layer, width-384, context-256 model)")
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="model.KEY=VALUE: change the config's model (its other sections are not used)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=65, help="vocabulary of the random-token model")
    parser.add_argument("--compile", action="store_true", help="also measure training with torch.compile")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps")
    parser.add_argument("--max-context", type=int, default=2048,
                        help="longest context in the attention-cost table (doubling from 64, then it)")
    parser.add_argument("--skip", nargs="+", default=[], choices=SECTIONS, help="sections to leave out")
    parser.add_argument("--json", type=Path, help="write every figure to this JSON file")
    args = parser.parse_args()
    check_counts(args, LEAST)
    _refuse_unused_overrides(args.overrides)
    check_output(args.json)
    results = run_suite(args.config, overrides=args.overrides, device=args.device, precision=args.precision,
                        batch_size=args.batch_size, vocab_size=args.vocab_size, compile=args.compile,
                        steps=args.steps, max_context=args.max_context, skip=args.skip)
    if args.json:
        write_figures(args.json, json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


# The fewest each count accepts (as benchmarks.decode's --vocab-size).
LEAST = {"batch_size": (1, ""), "steps": (1, ""), "vocab_size": (2, ""),
         "max_context": (64, "the attention-cost table starts at 64")}


def _refuse_unused_overrides(overrides: list[str]) -> None:
    """The suite reads only the config's model: a --set of another section would change nothing."""
    for item in overrides:
        if not item.split("=", 1)[0].strip().startswith("model."):
            raise ConfigError(f"--set {item}: the suite uses only the config's model section (training runs "
                              "random tokens with its own --batch-size, --precision, --compile and --steps); "
                              "expected model.KEY=VALUE")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
