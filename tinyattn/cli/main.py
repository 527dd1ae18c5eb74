"""`tinyattn`: one command whose subcommands are the modules beside this one.

`tinyattn SUBCOMMAND ARGS...` (or `python -m tinyattn ...`) imports `tinyattn.cli.SUBCOMMAND`
only when it is asked for and hands it the rest of the arguments, so `tinyattn --help` answers
at once and each subcommand keeps its own `--help`. The old console scripts
(`tinyattn-train`, ...) and `scripts/<name>.py` call the same `main` functions.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional

from tinyattn.cli import run_command, write_text

SUBCOMMANDS = {  # name: what it does (tinyattn.cli.<name>.main runs it)
    "train": "train a model from a YAML config, or resume a run",
    "generate": "sample text from a checkpoint, streamed as it is produced",
    "eval": "loss, perplexity, bits per character or byte, and loss by position of a checkpoint",
    "attention": "attention maps, relevance and the explorer page of a text",
    "export": "write a checkpoint as a Hugging Face folder (Llama or Qwen3) or a GGUF file",
    "lab": "the attention chapter's claims, each measured on a model (docs/LAB.md)",
    "serve": "an OpenAI-compatible endpoint and a playground page for a checkpoint",
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in SUBCOMMANDS.items()]
    return "\n".join(["usage: tinyattn SUBCOMMAND [ARGS...]   (tinyattn SUBCOMMAND --help for its options)",
                      "", "subcommands:", *lines])


def print_usage(*, asked: bool) -> int:
    """The usage: on stdout when --help asked for it, else on stderr as a usage error; the exit status."""
    write_text(usage() + "\n", sys.stdout if asked else sys.stderr)
    return 0 if asked else 2


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        # through run_command, as a subcommand's output goes: a reader that went away
        # (`tinyattn --help | head`) ends the command quietly, not in a BrokenPipeError traceback,
        # and a stdout that cannot take it (`> /dev/full`) in one error line
        return run_command(lambda: print_usage(asked=bool(argv)))
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"error: unknown subcommand {name!r}; expected one of {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)
        return 2
    return importlib.import_module(f"tinyattn.cli.{name}").main(rest)
