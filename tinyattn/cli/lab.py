"""`tinyattn lab EXPERIMENT`: the attention chapter's claims, each measured by one command.

Each experiment is a module of `tinyattn.lab` with `add_arguments(parser)` (its own options)
and `run(args) -> int`; this file only picks the module, imported when it is asked for: its
options when its arguments are parsed (`ExperimentParser`), its run when it runs.
docs/LAB.md shows every claim with its command, figure and numbers.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Optional

from tinyattn.cli import run_command
from tinyattn.cli.options import CommandParser, command_parser
from tinyattn.system.signals import sigterm_interrupts

EXPERIMENTS = {  # name: the claim it measures (tinyattn.lab.<name> runs it)
    "causal": "causal vs bidirectional attention: the mask keeps the future out (and the leak test)",
    "recurrence": "attention vs an LSTM: speed by context, loss, and gradient path length",
    "distance": "access does not ensure use: a repeated string and key-value recall against distance",
    "context": "context-specific representations: one word's hidden state in different contexts",
    "scaling": "why scores are divided by sqrt(d_k): softmax rows and training with and without it",
}


class ExperimentParser(CommandParser):
    """An experiment's parser, given its options by its module's `add_arguments` when it first parses:
    `tinyattn lab --help` and one experiment's usage or run import no other experiment's module
    (recurrence and distance import torch: seconds before a usage line)."""

    experiment: Optional[str] = None  # the module whose options are still to be added

    def add_options(self) -> ExperimentParser:
        """This parser with its experiment's options (added once); for a reader of its actions."""
        if self.experiment is not None:
            name, self.experiment = self.experiment, None
            importlib.import_module(f"tinyattn.lab.{name}").add_arguments(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.add_options()
        return super().parse_known_args(args, namespace)


def parser() -> argparse.ArgumentParser:
    p = command_parser("lab", __doc__.splitlines()[0], "docs/LAB.md: what each experiment shows.")
    experiments = p.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT",
                                   parser_class=ExperimentParser)
    p.experiment_parsers = {}  # name: its parser, whose usage a mistyped option of it shows (`main`)
    for name, claim in EXPERIMENTS.items():
        p.experiment_parsers[name] = experiments.add_parser(name, help=claim, description=claim)
        p.experiment_parsers[name].experiment = name
    return p


def main(argv: Optional[list[str]] = None) -> int:
    lab = parser()
    args, unknown = lab.parse_known_args(argv)
    if unknown:  # argparse says it as the lab's ("usage: tinyattn lab [-h] EXPERIMENT ..."), hiding the
        # experiment's own options: the experiment's usage says it instead
        lab.experiment_parsers[args.experiment].error(f"unrecognized arguments: {' '.join(unknown)}")
    # SIGTERM stops an experiment as Ctrl-C does (its folder named, exit 130): by default it ended the
    # process at once, status 143, nothing said and the lines printed so far lost in stdout's buffer.
    with sigterm_interrupts("stopped by SIGTERM"):
        return run_command(lambda: importlib.import_module(f"tinyattn.lab.{args.experiment}").run(args))
