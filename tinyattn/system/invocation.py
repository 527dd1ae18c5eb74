"""How this process was started, for the commands a message tells the user to run next."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def command(name: str) -> str:
    """The command that runs tinyattn's `name` (train, generate, ...) as this process was started:
    `python <its folder>/<name>.py` when it is a script beside tinyattn's (a checkout's scripts/,
    as the user wrote the path), else `tinyattn <name>` (the installed command, which
    `python -m tinyattn` also is). A training started by torchrun (WORLD_SIZE above 1) is
    trained on the same way, `torchrun --nproc_per_node=N ...`: in one process its resume would
    run on with half (a 1/N share) of the batch it trained with."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    sibling = script.parent / f"{name}.py"
    is_script = script.parent.name == "scripts" and script.suffix == ".py" and sibling.is_file()
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if name == "train" and processes > 1:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", processes) or processes)
        nodes = f" --nnodes={processes // per_node}" if processes > per_node else ""
        launcher = f"torchrun{nodes} --nproc_per_node={per_node}"
        return f"{launcher} {quoted(sibling)}" if is_script else f"{launcher} -m tinyattn {name}"
    if is_script:
        return f"python {quoted(sibling)}"
    return f"tinyattn {name}"


def quoted(word: str | Path) -> str:
    """A path (or `key=path` item) as a command a message prints takes it, quoted for the shell
    where it needs to be (a space, a quote); a plain one as it is."""
    return shlex.quote(str(word))
