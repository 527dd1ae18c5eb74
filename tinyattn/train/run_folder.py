"""A run folder held by one process at a time.

Two trainings writing into one folder would delete each other's checkpoints and mix
their samples. `RunLock.acquire(folder)` makes the folder (proving it is writable),
takes an exclusive lock on `folder/.lock`, writes the holder's pid into it, and clears
the temporary files a writer killed mid-write left behind. A second process gets one
line naming the holder's pid. The lock is the kernel's (`flock`): it ends with the
process, however the process ends, so a lock file left by a dead process is simply taken
over (and said to be).

`unique_run_dir` gives a default run name its own folder even when two runs start in
the same second.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

from tinyattn.errors import StorageError
from tinyattn.system.storage import check_writable, remove_temporaries, storage_errors

LOCK_NAME = ".lock"

try:
    import fcntl
except ImportError:  # Windows has no flock: there the folder is not locked
    fcntl = None


class RunLock:
    """The exclusive hold of one run folder; `release()` (or process exit) ends it."""

    def __init__(self, folder: Path, fd: int):
        self.folder = folder
        self._fd: Optional[int] = fd

    @classmethod
    def acquire(cls, folder: str | Path) -> "RunLock":
        folder = check_writable(folder)
        path = folder / LOCK_NAME
        while True:
            with storage_errors(path):
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if _try_lock(fd):
                # The holder before us may have deleted the file between our open and our
                # lock: then we hold a lock on a name nobody sees; open it again.
                if _same_file(fd, path):
                    break
            else:
                holder = _read_pid(fd)
                os.close(fd)
                raise StorageError(f"{folder} is in use by pid {holder or '(unknown)'}: another "
                                   "training writes there; wait for it to end or choose another --run-name")
            os.close(fd)
        previous = _read_pid(fd)
        if previous and previous != os.getpid():
            print(f"note: {path} was left by pid {previous}, which is no longer running; taking it over",
                  file=sys.stderr)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        remove_temporaries(folder)  # ours now: a killed writer's half files can go
        return cls(folder, fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            (self.folder / LOCK_NAME).unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_pid(fd: int) -> Optional[int]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def unique_run_dir(out_dir: str | Path, stem: str, now: Optional[datetime] = None) -> Path:
    """A new folder `<out_dir>/<stem>-<date>-<time>`, with `-2`, `-3`... if that one exists.

    The folder is created here (mkdir fails if another process made it first), so two runs
    started in the same second never share one.
    """
    out_dir = check_writable(out_dir)
    base = f"{stem}-{(now or datetime.now()):%Y%m%d-%H%M%S}"
    for n in range(1, 1000):
        folder = out_dir / (base if n == 1 else f"{base}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise StorageError(f"{out_dir}: 999 runs named {base}-* exist; give --run-name")
