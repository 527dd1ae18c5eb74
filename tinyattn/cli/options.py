"""The options several subcommands share, each written once: --checkpoint, --device, --config/--set.

A subcommand builds its parser with `command_parser(name, ...)` (its usage line reads
`tinyattn <name>`, whichever launcher started it) and adds the shared options with the
helpers below, so their spelling and help cannot drift apart. The accepted values come from
where the library defines them (`tinyattn.system.device.DEVICE_NAMES`, ...).
"""

from __future__ import annotations

import argparse
import sys

from tinyattn.cli import write_text
from tinyattn.config import ATTENTION_PATHS, home_path
from tinyattn.errors import StorageError
from tinyattn.system.choices import DEVICE_NAMES

CHECKPOINT_HELP = ("a run folder (its best.pt, else its latest step), a checkpoint file or a Hugging Face "
                   "folder (Llama or Qwen3: config.json, safetensors, tokenizer.json); default: the best "
                   "checkpoint of the most recent run under {where}")


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, whose --help fails as the commands' own output does (`write_text`):
    argparse ignores a failed write and exits 0, or, buffered, fails in the flush at exit."""

    def print_help(self, file=None) -> None:
        try:
            write_text(self.format_help(), file or sys.stdout)
        except BrokenPipeError:  # the reader went away (`| head`): quietly, as `run_command` ends
            self.exit(141)
        except StorageError as e:
            self.exit(2, f"error: {e}\n")


def command_parser(name: str, description: str, epilog: str, **options) -> argparse.ArgumentParser:
    """The parser of `tinyattn <name>` (its subparsers are CommandParsers too)."""
    return CommandParser(prog=f"tinyattn {name}", description=description, epilog=epilog, **options)


def add_checkpoint(parser: argparse.ArgumentParser, where: str = "checkpoints/") -> None:
    """--checkpoint: what `tinyattn.hf.folder.load_any_model` accepts."""
    parser.add_argument("--checkpoint", type=home_path, metavar="RUN_DIR|FILE",
                        help=CHECKPOINT_HELP.format(where=where))


def add_out_dir(parser: argparse.ArgumentParser) -> None:
    """--out-dir: where runs are looked for when --checkpoint is not given."""
    parser.add_argument("--out-dir", type=home_path, default="checkpoints", metavar="DIR",
                        help="where runs are looked for when --checkpoint is not given "
                             "(default: checkpoints)")


def add_inference_dtype(parser: argparse.ArgumentParser) -> None:
    """--dtype of a model loaded to generate with (`generate.decoder.inference_dtype`)."""
    from tinyattn.system.choices import PRECISIONS

    parser.add_argument("--dtype", default="auto", choices=PRECISIONS,
                        help="weights' dtype; auto: bf16 on CUDA and on CPUs with fast bf16 "
                             "(read from the CPU's flags; timed once and cached only where they cannot tell), "
                             "else fp32, with fp16 copies of the weights for one-token "
                             "steps on an x86 CPU (faster; --dtype fp32 keeps fp32's numbers exactly)")


def add_device(parser: argparse.ArgumentParser, default: str | None = "auto", overrides: str = "") -> None:
    """--device; `overrides` names the config key it replaces (train.device), default then None."""
    if overrides:
        help = f"overrides {overrides}: {DEVICE_NAMES}"
    else:
        help = f"{DEVICE_NAMES} (default: {default})"
    parser.add_argument("--device", default=default, help=help)


def add_config(parser: argparse.ArgumentParser, required_unless: str = "") -> None:
    """--config FILE and --set KEY=VALUE ... (dotted keys, typed like the field they set)."""
    optional = f" (optional with {required_unless}: the run's saved config)" if required_unless else ""
    parser.add_argument("--config", type=home_path, metavar="FILE", help=f"YAML config file{optional}")
    # action="extend": `--set a=1 --set b=2` keeps both (argparse's default keeps only the last).
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="override config values with dotted keys, e.g. train.lr=3e-4 or "
                             f"model.attention={'|'.join(ATTENTION_PATHS)}; may be repeated")
