"""Export a checkpoint as a Hugging Face Llama folder: python scripts/export.py --checkpoint checkpoints/<run> --out exported/<name> (see --help)."""

from tinyattn.cli.export import main

if __name__ == "__main__":
    raise SystemExit(main())
