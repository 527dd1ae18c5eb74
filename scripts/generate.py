"""Generate text from a trained checkpoint: python scripts/generate.py --prompt "ROMEO:" (see --help)."""

from tinyattn.cli.generate import main

if __name__ == "__main__":
    raise SystemExit(main())
