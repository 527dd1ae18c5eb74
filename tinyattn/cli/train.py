"""`tinyattn train` (`scripts/train.py`): parse arguments, then call `tinyattn.train.loop.train`."""

from __future__ import annotations

import argparse

from tinyattn.cli import run_command, warnings_as_lines
from tinyattn.cli.options import add_config, add_device, command_parser
from tinyattn.config import apply_overrides, home_path, load_config, override_keys, override_value
from tinyattn.errors import TinyattnError


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "train", "Train a tinyattn language model.",
        "example: tinyattn train --config configs/shakespeare_char.yaml "
        "--set train.max_steps=500 model.n_layer=2")
    add_config(p, required_unless="--resume")
    p.add_argument("--run-name", help="folder name under train.out_dir (default: config name and time)")
    p.add_argument("--resume", nargs="?", const=True, default=None, type=home_path,
                   metavar="RUN_DIR|CHECKPOINT",
                   help="continue a run: its folder or a checkpoint file; alone, the --run-name "
                        "run or else the most recent one")
    p.add_argument("--allow-data-change", action="store_true",
                   help="with --resume: continue even though the data differs from what the run trained on "
                        "(refused otherwise; train.log records it)")
    add_device(p, default=None, overrides="train.device")
    p.add_argument("--stop-at-step", type=int, metavar="N",
                   help="save and stop at step N (the schedule still spans train.max_steps)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    return p


def _config_and_point(args: argparse.Namespace):
    """The config the run trains with and, for --resume, the checkpoint it continues from."""
    from tinyattn.train.loop import DEFAULT_OUT_DIR
    from tinyattn.train.resume import ResumePoint

    config = load_config(args.config, args.overrides) if args.config else None
    point = None
    if args.resume:
        # the folder the run is looked for in: a --set train.out_dir=~/runs under the home folder too
        out_dir = (config.train.out_dir if config
                   else home_path(override_value(args.overrides, "train.out_dir", DEFAULT_OUT_DIR)))
        point = ResumePoint.find(args.resume, args.run_name, out_dir)  # the one load
        if config is None:  # the run continues as it was, with config.yaml's edits and the overrides
            given = override_keys(args.overrides) + (("train.device",) if args.device is not None else ())
            config = apply_overrides(point.edited_config(overruled=given), args.overrides,
                                     origin=str(point.file))
    return config, point


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    if not args.config and not args.resume:
        parser().error("--config is required (or --resume to continue a run)")
    if args.allow_data_change and not args.resume:
        parser().error("--allow-data-change lets a resumed run go on over changed data: give it with --resume")

    def command() -> int:
        from tinyattn.system.timing import process_age
        from tinyattn.train.loop import train

        try:
            config, point = _config_and_point(args)
        except TinyattnError as mistake:  # the same files on every rank: under torchrun rank 0 says it
            mistake.shared = True
            raise
        result = train(config, config_path=args.config, run_name=args.run_name, resume=point,
                       device=args.device, progress=not args.no_progress,
                       stop_at_step=args.stop_at_step, elapsed_before=process_age(), overrides=args.overrides,
                       allow_data_change=args.allow_data_change)
        return 130 if result.interrupted else 0

    with warnings_as_lines():  # e.g. a resume under another number of processes: one `warning:` line
        return run_command(command)

