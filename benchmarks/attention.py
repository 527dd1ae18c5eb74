"""The cost of attention against context length: fused (SDPA) and explicit paths.

    python -m benchmarks.attention                       # T = 64 .. 2048 on the CPU
    python -m benchmarks.attention --device cuda --max-context 8192 --json cost.json
    python -m benchmarks.attention --table-from docs/bench-cpu.json   # no measuring

Prints a Markdown table (`benchmarks.measure.attention_cost_table`; docs/ATTENTION.md holds the
one of docs/bench-cpu.json); see `benchmarks.measure.measure_attention_cost` for what is timed
and how memory is measured.
"""

import argparse
import json
from pathlib import Path

from benchmarks.arguments import check_counts, check_output, write_figures
from benchmarks.measure import attention_cost_table, context_lengths, measure_attention_cost
from tinyattn.cli import run_command
from tinyattn.errors import ConfigError, DataError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--min-context", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=2048,
                        help="double T from --min-context while below this, then this itself")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--table-from", type=Path, metavar="JSON",
                        help="measure nothing: print the table of a saved --json file or of the "
                             "'attention' section of a benchmarks/suite.py JSON file")
    args = parser.parse_args()
    check_counts(args, LEAST)
    if args.max_context < args.min_context:
        raise ConfigError(f"--max-context {args.max_context} is below --min-context {args.min_context}: "
                          "no context length to measure; expected a --max-context of at least the minimum")
    if args.table_from:
        print(attention_cost_table(saved_figures(args.table_from)))
        return 0

    check_output(args.json)
    lengths = context_lengths(args.min_context, args.max_context)
    result = measure_attention_cost(lengths, batch_size=args.batch_size, n_head=args.heads,
                                    head_dim=args.head_dim, repeats=args.repeats, device=args.device,
                                    measure_memory=not args.no_memory)
    print(f"device {result['device']} ({result['threads']} threads), B={result['batch_size']} "
          f"H={result['n_head']} D={result['head_dim']} fp32, median of {result['repeats']} after warm-up")
    print(f"peak memory: {result['memory_method']}\n")
    print(attention_cost_table(result))
    if result["skipped_context_lengths"]:
        print(f"\nskipped (would not fit in memory): {result['skipped_context_lengths']}")
    if args.json:
        write_figures(args.json, json.dumps(result, indent=2))
    return 0


# What attention_cost_table reads of each row.
ROW_FIELDS = ("context_length", "fused_ms", "explicit_ms", "fused_peak_bytes", "explicit_peak_bytes",
              "weights_bytes", "max_abs_difference")


def saved_figures(path: Path) -> dict:
    """The figures of a saved --json file, or the 'attention' section of a suite's; any other JSON
    (another benchmark's, a suite file made with --skip attention) is one line naming the file."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read saved figures ({e})") from None
    figures = saved.get("attention", saved) if isinstance(saved, dict) else saved
    rows = figures.get("rows") if isinstance(figures, dict) else None
    if not (isinstance(rows, list) and all(isinstance(row, dict) and set(ROW_FIELDS) <= set(row)
                                           for row in rows)):
        raise DataError(f"{path}: not attention-cost figures (no 'rows' of {', '.join(ROW_FIELDS)}); "
                        "expected the --json of benchmarks.attention, or of benchmarks.suite with its "
                        "attention section")
    return figures


# The fewest each count accepts, and why where it is not plain. --min-context is doubled up to
# --max-context: from 0 or below that would never end.
LEAST = {"min_context": (1, ""), "max_context": (1, ""), "repeats": (1, ""), "batch_size": (1, ""),
         "heads": (1, ""),
         "head_dim": (2, "a model's heads have at least 2: rotary positions pair dimensions")}


if __name__ == "__main__":
    raise SystemExit(run_command(main))
