"""What the benchmark scripts share about their command lines: counts checked before any work."""

from __future__ import annotations

import argparse
import contextlib
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
    Folders it lacks are made only to try, and removed again: `write_figures` makes them, so a run
    refused or failing later leaves none behind."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{option} {path}: a folder; expected the name of a file to write the figures to")
    made = [folder for folder in path.parents if not folder.exists()]  # the nearest first
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{option} {path}: cannot make its folder ({e.strerror}); expected a file in a "
                              "folder that can be written") from None
        _try_writing(path, option)
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _try_writing(path: Path, option: str) -> None:
    """Opens path as the writer will (os.access says yes to root, even in /proc); a file made only to
    try is removed."""
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot be written ({e.strerror}); expected a file in a folder "
                          "that can be written") from None
    if not existed:
        path.unlink()


def write_figures(path: Path, text: str) -> None:
    """Writes the figures checked by `check_output`, making the folders it lacks, as the suite's
    --json always did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
