"""Writing files so that a crash never leaves half of one.

`atomic_write(path)` is the one way tinyattn writes a file that a later run will trust
(checkpoints, tokenizer.json, token caches, downloads): the bytes go to a temporary file
beside `path`, are flushed and fsynced, and the file is renamed over `path`. A process
killed at any moment leaves the old file or the new one; an exception inside the block
deletes the temporary file and leaves `path` untouched.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def atomic_write(path: str | Path) -> Iterator[BinaryIO]:
    """Yield a binary file whose contents replace `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # make the rename itself durable


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
