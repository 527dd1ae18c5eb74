"""Evaluate a checkpoint: python scripts/eval.py --checkpoint checkpoints/<run> (see --help)."""

from tinyattn.cli.eval import main

if __name__ == "__main__":
    raise SystemExit(main())
