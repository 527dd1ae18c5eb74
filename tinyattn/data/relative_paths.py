"""A run's relative data paths, read from the folder the run started in.

A command that reads a run's data again, from another folder than the run started in (a resume,
`eval --split`, `lab distance`), finds `data.files`, a `data.dataset` folder and `data.cache_dir`
where the run found them (`read_from`), and says so in a note.
"""

from __future__ import annotations

import glob
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

from tinyattn.config import Config
from tinyattn.system.console import notice

PATH_KEYS = ("files", "dataset", "cache_dir")  # the data section's keys that may hold relative paths


def read_from(config: Config, folder: Optional[Path],
              keys: tuple[str, ...] = PATH_KEYS) -> tuple[Config, list[str]]:
    """`config` with the relative data paths of `keys` read from `folder` (the one a run started in)
    where the folder run from is another, each where `folder` holds it (a glob: where it matches a name
    there), and the dotted keys moved; `config` itself where none moved. An absolute path, a hub name,
    a path `folder` lacks, and all of them where `folder` is None or gone, stay as given: read from
    the folder run from, whose messages then name it. The config's other sections are the same
    objects (what reading the data sets, the vocabulary's size, is the run's)."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the folder run from was removed meanwhile: it holds nothing to read
        here = None
    if folder is None or not folder.is_dir() or folder.resolve() == here:
        return config, []

    def moved(path: str) -> str:
        if Path(os.path.expanduser(path)).is_absolute():
            return path
        there = folder / path
        found = there.exists() or (any(c in path for c in "*?[")
                                   and bool(glob.glob(path, root_dir=folder, recursive=True)))
        return str(there) if found else path

    data = config.data
    changes: dict = {}
    if "files" in keys and data.files is not None:
        changes["files"] = [moved(f) for f in data.files]
    for key in ("dataset", "cache_dir"):  # a folder each (a hub name is no folder there)
        value = getattr(data, key)
        if key in keys and value is not None and (folder / value).is_dir():
            changes[key] = moved(value)
    changes = {k: v for k, v in changes.items() if v != getattr(data, k)}
    if not changes:
        return config, []
    return replace(config, data=replace(data, **changes)), [f"data.{k}" for k in changes]


def read_from_note(moved: list[str], folder: Path) -> str:
    """The line that says `read_from` moved `moved`."""
    return (f"note: {' and '.join(moved)} read from {folder}, the folder the run started in, not from the "
            "folder run from: the run's relative paths name its files there")


def data_where_started(config: Config, folder: Optional[Path]) -> Config:
    """A run's config as a command that reads its data reads it (`eval --split`, `lab distance`):
    `read_from` the folder the run started in, said in a note where it moved a path."""
    placed, moved = read_from(config, folder)
    if moved:
        notice(read_from_note(moved, folder))
    return placed
