"""`tinyattn lab EXPERIMENT`: the attention chapter's claims, each measured by one command.

Each experiment is a module of `tinyattn.lab` with `add_arguments(parser)` (its own options)
and `run(args) -> int`; this file only picks the module, imported when it is asked for.
docs/LAB.md shows every claim with its command, figure and numbers.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Optional

from tinyattn.cli import run_command
from tinyattn.cli.options import command_parser

EXPERIMENTS = {  # name: the claim it measures (tinyattn.lab.<name> runs it)
    "causal": "causal vs bidirectional attention: the mask keeps the future out (and the leak test)",
    "recurrence": "attention vs an LSTM: speed by context, loss, and gradient path length",
    "distance": "access does not ensure use: a repeated string and key-value recall against distance",
    "context": "context-specific representations: one word's hidden state in different contexts",
}


def parser() -> argparse.ArgumentParser:
    p = command_parser("lab", __doc__.splitlines()[0], "docs/LAB.md: what each experiment shows.")
    experiments = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, claim in EXPERIMENTS.items():
        sub = experiments.add_parser(name, help=claim, description=claim)
        importlib.import_module(f"tinyattn.lab.{name}").add_arguments(sub)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: importlib.import_module(f"tinyattn.lab.{args.experiment}").run(args))
