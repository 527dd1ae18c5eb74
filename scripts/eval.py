"""`tinyattn eval` as a script, for a checkout without installing: the same options (see --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's tinyattn, installed or not

from tinyattn.cli.eval import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
