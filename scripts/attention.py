"""Draw attention maps: python scripts/attention.py --checkpoint checkpoints/<run> --text "..." (--help)."""

from tinyattn.cli.attention import main

if __name__ == "__main__":
    raise SystemExit(main())
