"""Train a model: python scripts/train.py --config configs/shakespeare_char.yaml (see --help)."""

from tinyattn.cli.train import main

if __name__ == "__main__":
    raise SystemExit(main())
