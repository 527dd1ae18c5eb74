"""`tinyattn export` as a script, for a checkout without installing: the same options (see --help)."""

from tinyattn.cli.export import main

if __name__ == "__main__":
    raise SystemExit(main())
