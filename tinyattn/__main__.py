"""`python -m tinyattn SUBCOMMAND ...`: the `tinyattn` command (tinyattn.cli.main)."""

from tinyattn.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
