"""Writing files so that a crash never leaves half of one.

`atomic_write(path)` is the one way tinyattn writes a file that a later run will trust
(checkpoints, tokenizer.json, token caches, downloads): the bytes go to a temporary file
beside `path`, are flushed and fsynced, and the file is renamed over `path`. A process
killed at any moment leaves the old file or the new one; an exception inside the block
deletes the temporary file and leaves `path` untouched.

A write the file system refuses (disk full, read-only folder, no permission) becomes a
`StorageError` naming the path, so commands end with one line instead of a traceback.
`check_writable(folder)` asks the same question before a command writes anything, and
`remove_temporaries(folder)` clears what a killed writer left behind (`of=name`: only what a
write to that name left). The file gets the permissions a plain `open(path, "w")` would give
it (those of the file it replaces, else 0666 less the umask), not the temporary file's
owner-only 0600: a checkpoint folder shared with a class stays readable.

Reading has its one helper too: `read_text(path, what)` is a UTF-8 file's text without the
byte-order mark a Windows editor puts first, or one line naming the file and what went wrong
(not found, not UTF-8, unreadable).
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from tinyattn.errors import DataError, StorageError, TinyattnError, counted

# What the file system says when a folder cannot take a file: these are the user's to fix.
# ENOTDIR and EEXIST: a name on the way to the file is a file, not a folder (mkdir says EEXIST).
NOT_A_FOLDER_ERRNOS = {errno.ENOTDIR, errno.EEXIST}
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                  errno.ENAMETOOLONG, *NOT_A_FOLDER_ERRNOS}
# Where a block makes the file or folder (mkdir, mkstemp), ENOENT is the file system refusing to
# hold one there (/proc), not a file that went missing: the user's to fix too.
CREATE_ERRNOS = STORAGE_ERRNOS | {errno.ENOENT}
TEMPORARY_SUFFIX = ".tmp"
# numpy's tofile on a full disk: a write that took fewer bytes than it was given, with no errno
SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")
BYTE_ORDER_MARK = "\ufeff"  # a Windows editor puts it first in a UTF-8 file: never text (data files drop it)


def new_file_mode(path: Path) -> int:
    """The permissions `open(path, "w")` leaves `path` with: the replaced file's, else 0666 less the umask."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def new_folder_mode(path: Path) -> int:
    """The permissions `mkdir(path)` leaves a folder with (0777 less the umask), or the replaced
    folder's: for a folder made elsewhere (`tempfile.mkdtemp`'s owner-only 0700) and renamed in."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o777 & ~_umask()


def _umask() -> int:
    """The process's umask: Linux shows it in /proc/self/status; elsewhere it is set and put back."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_a_plain_write(fd: int, path: Path) -> None:
    """Give mkstemp's owner-only file the mode a plain write of `path` would have. A file system
    that keeps no modes (FAT, some network mounts) refuses: the file keeps its own."""
    if hasattr(os, "fchmod"):
        try:
            os.fchmod(fd, new_file_mode(path))
        except OSError:
            pass


@contextmanager
def atomic_write(path: str | Path, *, named: str | Path | None = None,
                 durable_rename: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file whose contents replace `path` only if the block succeeds; `named`:
    what a refusal names instead of `path` (the folder a staging copy becomes). `durable_rename`
    False: the caller makes the rename durable, with one `sync_folder` call for many files."""
    path = Path(path)
    named = path if named is None else Path(named)
    with storage_errors(named, creating=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        _as_a_plain_write(fd, path)
        with storage_errors(named):
            with os.fdopen(fd, "wb") as f:
                recorder = _WriteRecorder(f)
                try:
                    yield recorder
                except Exception:
                    # A writer such as torch.save may wrap the file system's refusal in its
                    # own error: the refusal is what the user needs to hear.
                    if recorder.error is not None:
                        raise recorder.error from None
                    raise
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    if durable_rename:
        sync_folder(path.parent)  # make the rename itself durable


class _WriteRecorder:
    """A binary file that remembers the OSError its last failed write raised."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._file.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name):
        return getattr(self._file, name)


def storage_message(path: Path, error: OSError) -> str:
    """One line: the path, what the file system said, and what the user can do."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    short = _short_write(error)
    if short is not None:
        return (f"cannot write {path}: the disk took only part of the write ({short[1]:,} of {short[0]:,} "
                "items); free some space there or choose another folder")
    if error.errno in NOT_A_FOLDER_ERRNOS:
        in_the_way = next((p for p in (*reversed(path.parents), path) if p.exists() and not p.is_dir()), None)
        if in_the_way is not None:
            return f"cannot write {path}: {in_the_way} is a file, not a folder; choose another path"
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        advice = "free some space there or choose another folder"
    elif error.errno == errno.ENAMETOOLONG:
        advice = "a name may have at most 255 bytes; choose a shorter one"
    elif error.errno == errno.ENOENT:  # from a block that makes it (CREATE_ERRNOS)
        advice = "nothing can be made there; choose another folder"
    else:
        advice = "make it writable or choose another folder"
    return f"cannot write {path}: {reason}; {advice}"


@contextmanager
def storage_errors(path: str | Path, *, creating: bool = False) -> Iterator[None]:
    """Turn a refused write (disk full, read-only, permission) into a StorageError naming `path`;
    `creating`: the block makes `path` or its folder, so ENOENT is a refusal too (CREATE_ERRNOS)."""
    try:
        yield
    except OSError as e:
        if e.errno in (CREATE_ERRNOS if creating else STORAGE_ERRNOS) or _short_write(e) is not None:
            raise StorageError(storage_message(Path(path), e)) from None
        raise


def _short_write(error: OSError) -> tuple[int, int] | None:
    """(bytes asked, bytes written) of a write that took fewer bytes than it was given and says
    so without an errno (numpy's tofile): a full disk. None for any other error."""
    match = SHORT_WRITE.fullmatch(str(error)) if error.errno is None else None
    return (int(match[1]), int(match[2])) if match else None


def check_writable(folder: str | Path) -> Path:
    """Create `folder` if needed and prove a file can be written in it; else a StorageError."""
    folder = Path(folder)
    with storage_errors(folder, creating=True):
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".writable.", suffix=TEMPORARY_SUFFIX)
        os.close(fd)
        os.unlink(name)
    return folder


def through_link(path: Path, what: str) -> Path:
    """`path`, or what it points to when it is a symbolic link: a write there replaces the file or
    folder the link leads to and keeps the link (a rename would replace the link itself). A link
    that leads nowhere is a StorageError naming it; `what`: what it should point at ("a folder")."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop of links
        raise StorageError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist; "
                           f"point it at {what}, or choose another --out") from None


def remove_leftover(path: Path) -> None:
    """Delete a file or folder an interrupted write left; a symbolic link is removed, never what
    it points to (shutil.rmtree refuses a link)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def remove_temporaries(folder: str | Path, of: Optional[str] = None) -> list[Path]:
    """Delete the temporary files that writers killed mid-write left in `folder`; with `of`, only
    those of a write to that file name (mkstemp's `.{of}.XXXXXXXX.tmp`, as `atomic_write` names
    them), in a folder that holds other things than ours (an export's).

    Without `of`, only for a folder this process holds (see run_folder.RunLock): another writer's
    temporary file would otherwise be deleted under it.
    """
    pattern = (None if of is None
               else re.compile(rf"\.{re.escape(of)}\.[a-z0-9_]{{8}}{re.escape(TEMPORARY_SUFFIX)}"))
    removed = []
    for path in Path(folder).glob(f".*{TEMPORARY_SUFFIX}"):
        if path.is_file() and (pattern is None or pattern.fullmatch(path.name)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def looked_for_at(path: str | Path) -> str:
    """Where a relative path was looked for, for a message: ' (<absolute path>: relative paths are read
    from the folder run from)'; nothing for an absolute path, which says where itself. os.path's
    expanduser leaves ~no_such_user as written (pathlib's raises), as the config's ~ expansion did."""
    if Path(os.path.expanduser(path)).is_absolute():
        return ""
    try:
        here = Path.cwd()
    except OSError:  # the folder run from was removed meanwhile: nothing to name
        return ""
    return f" ({here / path}: relative paths are read from the folder run from)"


def read_text(path: str | Path, what: str, error: type[TinyattnError] = DataError) -> str:
    """The UTF-8 text of `path`, a leading byte-order mark dropped; else `error` with one line,
    e.g. "x.yaml: config file not found".

    `what` names the file for the user ("config file", "prompt file"); `error` is the
    TinyattnError subclass of the caller's domain (ConfigError for a config, ...).
    """
    try:  # utf-8, not utf-8-sig: a byte that is not UTF-8 is counted from the file's start, the mark included
        text = Path(path).read_text(encoding="utf-8").removeprefix(BYTE_ORDER_MARK)
    except FileNotFoundError:
        raise error(f"{path}: {what} not found") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: the {what} is not UTF-8 text (byte {e.start}){byte_order_advice(e.object)}"
                    ) from None
    except OSError as e:  # a folder, no permission, ...
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    if "\0" in text:
        refuse_nul(Path(path).read_bytes(), str(path), what, error)
    return text


def byte_order_advice(data: bytes) -> str:
    """": it starts with UTF-16's byte-order mark; save it as UTF-8" where `data`, a text that is not
    UTF-8, begins with one (`unicode_mark`); else "": the end of a message saying so."""
    mark = unicode_mark(data[:4])
    return f": it starts with {mark}'s byte-order mark; save it as UTF-8" if mark else ""


def unicode_mark(start: bytes) -> Optional[str]:
    """"UTF-16" or "UTF-32" where `start`, a text's first bytes, begins with that encoding's
    byte-order mark (UTF-16's: Notepad's "Unicode", PowerShell's `>`); else None."""
    if start[:4] in (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE):  # UTF-32-LE's starts with UTF-16-LE's
        return "UTF-32"
    return "UTF-16" if start[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else None


def nul_found(where: str, at: str, kind: str = "UTF-16 (without a byte-order mark) or not text") -> str:
    """What a NUL in a text means, for every message that finds one: `where` holds it ("x.txt:", "x.txt:
    the prompt file"; "" to start with "holds"), `at` says where in it, `kind` what the file is."""
    holds = f"{where} holds" if where else "holds"
    return f"{holds} a NUL {at}, which no text does: it is {kind}"


def refuse_nul(data: bytes | str, where: str, what: str, error: type[TinyattnError] = DataError) -> None:
    """`error` naming the first NUL of `data`, the bytes of a text `where` (a file, "stdin"), if it
    holds one. No text does: ASCII saved as UTF-16 without a byte-order mark (as some Windows tools
    write it) is valid UTF-8 with a NUL after every character, which would be read as that text.
    `data` already decoded (a text stream's, its newlines translated) is counted in characters."""
    decoded = isinstance(data, str)
    nul = data.find("\0" if decoded else b"\0")
    if nul >= 0:
        line = data[:nul].count("\n" if decoded else b"\n") + 1
        at = f"after {counted(nul, 'character')}" if decoded else f"at byte {nul}"  # counted, or an offset
        raise error(nul_found(f"{where}: the {what}", f"{at} (line {line})") + "; save it as UTF-8")


def sync_folder(folder: Path) -> None:
    """Make the renames and new files in `folder` durable (a directory fsync, where possible)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the rename is still atomic
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
