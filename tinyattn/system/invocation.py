"""How this process was started, for the commands a message tells the user to run next."""

from __future__ import annotations

import sys
from pathlib import Path


def command(name: str) -> str:
    """The command that runs tinyattn's `name` (train, generate, ...) as this process was started:
    `python scripts/<name>.py` from a checkout's scripts, else `tinyattn <name>` (the installed
    command, which `python -m tinyattn` also is)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if script.parent.name == "scripts" and script.suffix == ".py":
        return f"python scripts/{name}.py"
    return f"tinyattn {name}"
