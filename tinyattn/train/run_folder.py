"""A run folder held by one process at a time.

Two trainings writing into one folder would delete each other's checkpoints and mix
their samples. `RunLock.acquire(folder)` makes the folder (proving it is writable), takes
an exclusive lock on `folder/.lock.filelock` (the `filelock` library: `flock` on POSIX,
`msvcrt.locking` on Windows), writes the holder's pid into `folder/.lock`, and clears the
temporary files a writer killed mid-write left behind. A second process gets one line
naming the holder's pid. The lock is the kernel's: it ends with the process, however the
process ends, so a `.lock` left by a dead process is simply taken over (and said to be).

Why two files: the pid must stay readable while the lock is held (Windows forbids reading
a locked region) and must survive a refused attempt (older filelock versions truncate the
lock file when they open it). The kernel's lock file stays on disk after release: deleting
it would let a process that opened it just before lock a name nobody else sees.

`unique_run_dir` gives a default run name its own folder even when two runs start in
the same second.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

from tinyattn.errors import StorageError
from tinyattn.system.storage import check_writable, remove_temporaries, storage_errors

LOCK_NAME = ".lock"  # the holder's pid, one line; there while the folder is held
KERNEL_LOCK_NAME = ".lock.filelock"  # what the kernel locks; empty, kept between runs


class RunLock:
    """The exclusive hold of one run folder; `release()` (or process exit) ends it."""

    def __init__(self, folder: Path, kernel_lock: FileLock):
        self.folder = folder
        self._kernel_lock: Optional[FileLock] = kernel_lock

    @classmethod
    def acquire(cls, folder: str | Path) -> "RunLock":
        folder = check_writable(folder)
        pid_file = folder / LOCK_NAME
        # thread_local=False: the hold belongs to the process, whichever thread releases it.
        kernel_lock = FileLock(folder / KERNEL_LOCK_NAME, timeout=0, thread_local=False)
        try:
            with storage_errors(folder / KERNEL_LOCK_NAME):
                kernel_lock.acquire()
        except Timeout:
            holder = _read_pid(pid_file)
            raise StorageError(f"{folder} is in use by pid {holder or '(unknown)'}: another training "
                               "writes there; wait for it to end or choose another --run-name") from None
        previous = _read_pid(pid_file)
        if previous and previous != os.getpid():
            print(f"note: {pid_file} was left by pid {previous}, which is no longer running; taking it over",
                  file=sys.stderr)
        with storage_errors(pid_file):
            pid_file.write_text(f"{os.getpid()}\n", encoding="ascii")
        remove_temporaries(folder)  # ours now: a killed writer's half files can go
        return cls(folder, kernel_lock)

    def release(self) -> None:
        if self._kernel_lock is None:
            return
        try:
            (self.folder / LOCK_NAME).unlink(missing_ok=True)  # before the unlock: no one else's pid
        finally:
            self._kernel_lock.release()
            self._kernel_lock = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(path: Path) -> Optional[int]:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
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
