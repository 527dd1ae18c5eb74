"""What the benchmark scripts share about their command lines: counts checked before any work."""

from __future__ import annotations

import argparse
from pathlib import Path

from tinyattn.errors import ConfigError


def check_counts(args: argparse.Namespace, least: dict[str, tuple[int, str]]) -> None:
    """Each count in `least` ({dest: (the least accepted, why)}) as typed, a single value or a list;
    one below its least is a ConfigError naming the option as typed (one line, exit 2 by run_command)."""
    for name, (lowest, why) in least.items():
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value < lowest:
                raise ConfigError(f"--{name.replace('_', '-')} {value} is not accepted: expected at least "
                                  f"{lowest}" + (f" ({why})" if why else ""))


def check_output(path: Path | None, option: str = "--json") -> None:
    """The file the figures will be written to, checked before any work: a folder or a place that
    cannot be written is a ConfigError naming it, not a traceback after every figure was measured.
    Its folder is made now if need be, as the suite's always was."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{option} {path}: a folder; expected the name of a file to write the figures to")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot make its folder ({e.strerror}); expected a file in a "
                          "folder that can be written") from None
    existed = path.exists()
    try:  # opened as the writer will open it (os.access says yes to root, even in /proc)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot be written ({e.strerror}); expected a file in a folder "
                          "that can be written") from None
    if not existed:
        path.unlink()  # made only to try: a run that fails later leaves no empty file behind
