"""How this process was started, for the commands a message tells the user to run next."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def command(name: str) -> str:
    """The command that runs tinyattn's `name` (train, generate, ...) as this process was started:
    `python <its folder>/<name>.py` when it is a script beside tinyattn's (a checkout's scripts/,
    as the user wrote the path), else `tinyattn <name>` (the installed command, which
    `python -m tinyattn` also is)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    sibling = script.parent / f"{name}.py"
    if script.parent.name == "scripts" and script.suffix == ".py" and sibling.is_file():
        return f"python {quoted(sibling)}"
    return f"tinyattn {name}"


def quoted(word: str | Path) -> str:
    """A path (or `key=path` item) as a command a message prints takes it, quoted for the shell
    where it needs to be (a space, a quote); a plain one as it is."""
    return shlex.quote(str(word))
