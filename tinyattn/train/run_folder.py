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

Only a folder tinyattn made as a run folder is ever written or cleaned: one it creates gets
a marker file (`.tinyattn-run`), and an existing folder is taken only when it has that
marker, holds a run's checkpoints (runs from before the marker), or is empty. Any other
folder (a project of the user's) is refused before anything in it is touched, since the
lock's clean-up deletes its `.*.tmp` files and the run overwrites `config.yaml`.
`check_run_name` keeps a --run-name a name: no separators, no `..`, not absolute, so a
run cannot land outside `train.out_dir`.

`unique_run_dir` gives a default run name its own folder even when two runs start in
the same second. `remove_failed_start` takes back a folder a command made and then failed in
before its first step (a missing data file, a budget no step fits): a failed command leaves
nothing behind, as it writes no config.yaml.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

from tinyattn.errors import ConfigError, StorageError
from tinyattn.system.console import notice
from tinyattn.system.storage import check_writable, remove_temporaries, storage_errors

LOCK_NAME = ".lock"  # the holder's pid, one line; there while the folder is held
KERNEL_LOCK_NAME = ".lock.filelock"  # what the kernel locks; empty, kept between runs
MARKER_NAME = ".tinyattn-run"  # written into every folder tinyattn makes a run folder
# Seconds a training waits for the folder's lock: enough to outlast another process's
# `RunLock.holder` probe, which takes the lock for an instant; a training never lets it go that soon.
ACQUIRE_WAIT = 0.5


class RunLock:
    """The exclusive hold of one run folder; `release()` (or process exit) ends it."""

    def __init__(self, folder: Path, kernel_lock: FileLock, note: Optional[str] = None):
        self.folder = folder
        self._kernel_lock: Optional[FileLock] = kernel_lock
        self.note = note  # a killed session's lock taken over: `say_note` says it once its train.log is open

    @classmethod
    def acquire(cls, folder: str | Path) -> "RunLock":
        check_run_folder(Path(folder))  # before anything is written there
        folder = check_writable(folder)
        pid_file = folder / LOCK_NAME
        # thread_local=False: the hold belongs to the process, whichever thread releases it.
        kernel_lock = FileLock(folder / KERNEL_LOCK_NAME, timeout=ACQUIRE_WAIT, thread_local=False)
        try:
            with storage_errors(folder / KERNEL_LOCK_NAME):
                kernel_lock.acquire()
        except (Timeout, FileNotFoundError):  # held; or removed meanwhile by its holder's failed start
            raise StorageError(in_use_message(folder, _read_pid(pid_file))) from None
        previous = _read_pid(pid_file)
        note = None
        if previous and previous != os.getpid():
            note = f"note: {pid_file} was left by pid {previous}, which is no longer running; taking it over"
        with storage_errors(pid_file):
            pid_file.write_text(f"{os.getpid()}\n", encoding="ascii")
            (folder / MARKER_NAME).touch()
        remove_temporaries(folder)  # ours now: a killed writer's half files can go
        return cls(folder, kernel_lock, note)

    def say_note(self) -> None:
        """The note that a killed session's lock was taken over, once: on the console and in the
        run's train.log where one is open (it opens after the lock; a start refused before it has none)."""
        if self.note:
            notice(self.note)
            self.note = None

    @staticmethod
    def holder(folder: str | Path) -> Optional[int]:
        """Whether a process holds `folder` now: its pid (0 where unknown), else None. A resume
        asks before it compares the folder's checkpoints, which a training that holds it is
        still writing. The probe takes the lock for an instant (a lock of this kind cannot be
        queried otherwise); a training starting then waits it out (`ACQUIRE_WAIT`)."""
        lock_file = Path(folder) / KERNEL_LOCK_NAME
        if not lock_file.is_file():
            return None
        probe = FileLock(lock_file, timeout=0, thread_local=False)
        try:
            probe.acquire()
        except Timeout:
            return _read_pid(Path(folder) / LOCK_NAME) or 0
        except OSError:  # a folder that cannot be locked here is not held by a training either
            return None
        probe.release()
        return None

    def release(self) -> None:
        if self._kernel_lock is None:
            return
        try:
            pid_file = self.folder / LOCK_NAME
            if _read_pid(pid_file) == os.getpid():  # before the unlock; never another holder's pid
                pid_file.unlink(missing_ok=True)
        finally:
            self._kernel_lock.release()
            self._kernel_lock = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def in_use_message(folder: Path, pid: Optional[int]) -> str:
    return (f"{folder} is in use by pid {pid or '(unknown)'}: another training writes there; wait for it "
            "to end or choose another --run-name")


def check_run_name(name: str) -> str:
    """`name` if it names one folder inside train.out_dir, else a ConfigError saying what is accepted."""
    separators = {"/", "\\", os.sep, os.altsep} - {None}
    if (not name or name in (".", "..") or any(s in name for s in separators)
            or Path(name).is_absolute() or Path(name).drive):
        raise ConfigError(f"--run-name {name!r}: a run name is one folder name inside train.out_dir "
                          "(no '/', '\\', '..' or absolute path); to write elsewhere, set train.out_dir")
    return name


def is_run_folder(folder: Path) -> bool:
    """Whether tinyattn made `folder` a run folder: its marker, or (older runs) its checkpoints."""
    from tinyattn.checkpoint import has_checkpoints  # here: the lock itself needs no torch

    return (folder / MARKER_NAME).is_file() or has_checkpoints(folder)


def check_run_folder(folder: Path) -> None:
    """Refuse an existing folder that tinyattn did not make a run folder and that is not empty."""
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"{folder}: exists and is not a folder; choose another --run-name")
    lock_files = {LOCK_NAME, KERNEL_LOCK_NAME}  # all a run that died before its first save left
    try:
        foreign = (folder.is_dir() and not is_run_folder(folder)
                   and any(p.name not in lock_files for p in folder.iterdir()))
    except FileNotFoundError:  # removed meanwhile by another run's failed start: nothing to refuse
        foreign = False
    if foreign:
        raise StorageError(f"{folder}: an existing folder that is not a tinyattn run folder (no "
                           f"{MARKER_NAME}, no checkpoints); nothing was written there. Choose another "
                           "--run-name or train.out_dir")


def remove_failed_start(folder: Path, log_name: str) -> bool:
    """Delete `folder` if it holds only what a run that failed before its first step leaves: its
    log (`log_name`), the lock files and the marker. Call it holding the lock, on a folder this
    command made. True if it went; anything else in it (config.yaml, a checkpoint, a file of the
    user's), or a file system that refuses, leaves it as it is."""
    failed_start = {log_name, LOCK_NAME, KERNEL_LOCK_NAME, MARKER_NAME}
    try:
        entries = list(folder.iterdir())
        if any(p.name not in failed_start or not p.is_file() for p in entries):
            return False
        # The held lock file first: where it cannot go while held (Windows), nothing else goes.
        # A process that opens the name after it is gone makes a lock file of its own, which the
        # rmdir then finds: the folder stays, with that process's files.
        for p in sorted(entries, key=lambda p: p.name != KERNEL_LOCK_NAME):
            p.unlink()
        folder.rmdir()
    except OSError:
        return False
    return True


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
