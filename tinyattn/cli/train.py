"""`scripts/train.py` / `tinyattn-train`: parse arguments, then call `tinyattn.train.train`."""

from __future__ import annotations

import argparse
from tinyattn.cli import run_command
from tinyattn.config import load_config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train.py", description="Train a tinyattn language model.",
        epilog="example: python scripts/train.py --config configs/shakespeare_char.yaml "
               "--set train.max_steps=500 model.n_layer=2")
    p.add_argument("--config", help="YAML config file (optional with --resume: the run's saved config)")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config values with dotted keys, e.g. train.lr=3e-4")
    p.add_argument("--run-name", help="folder name under train.out_dir (default: config name and time)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR|CHECKPOINT",
                   help="continue a run: its folder or a checkpoint file; alone, the --run-name "
                        "run or else the most recent one")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help="overrides train.device")
    p.add_argument("--stop-at-step", type=int, metavar="N",
                   help="save and stop at step N (the schedule still spans train.max_steps)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command() -> int:
        from tinyattn.train import run_config, train

        if args.config:
            config = load_config(args.config, args.overrides)
        elif args.resume:
            config, args.resume = run_config(args.resume, args.run_name, args.overrides)
        else:
            parser().error("--config is required (or --resume to continue a run)")
        result = train(config, config_path=args.config, run_name=args.run_name, resume=args.resume,
                       device=args.device, progress=not args.no_progress,
                       stop_at_step=args.stop_at_step)
        return 130 if result.interrupted else 0

    return run_command(command)

