"""Run folders: one holder at a time, stale locks taken over, default names never shared,
and refused writes (read-only, disk full) as one line."""

import os
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
from filelock import FileLock

from tinyattn.errors import ConfigError, DataError, StorageError
from tinyattn.system.storage import atomic_write, check_writable, read_text, remove_temporaries
from tinyattn.train import run_folder
from tinyattn.train.run_folder import KERNEL_LOCK_NAME, LOCK_NAME, RunLock, check_run_name, unique_run_dir


def test_a_second_holder_is_told_the_pid_and_the_folder_frees_on_release(tmp_path):
    lock = RunLock.acquire(tmp_path / "run")
    assert (tmp_path / "run" / LOCK_NAME).read_text().strip() == str(os.getpid())
    with pytest.raises(StorageError, match=rf"run is in use by pid {os.getpid()}: .*--run-name"):
        RunLock.acquire(tmp_path / "run")
    lock.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    # A pid file that is not this process's (another holder's, after this one's folder was taken
    # back) stays at release.
    lock = RunLock.acquire(tmp_path / "run")
    (tmp_path / "run" / LOCK_NAME).write_text("4194304\n")
    lock.release()
    assert (tmp_path / "run" / LOCK_NAME).read_text() == "4194304\n"
    RunLock.acquire(tmp_path / "run").release()


def test_a_pid_file_holding_this_process_is_no_takeover_and_a_takeover_note_is_said_once(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(f"{os.getpid()}\n")  # left by this process (a start that never released)
    lock = RunLock.acquire(folder)
    assert lock.note is None
    lock.release()
    (folder / LOCK_NAME).write_text("4194304\n")  # a pid past the kernel's limit: no longer running
    lock = RunLock.acquire(folder)
    lock.say_note()
    lock.say_note()
    lock.release()
    assert capsys.readouterr().err.count("left by pid 4194304, which is no longer running") == 1


def test_the_holder_of_a_folder_is_its_pid_zero_where_its_pid_file_is_unreadable_and_none_when_free(tmp_path):
    folder = tmp_path / "run"
    assert RunLock.holder(folder) is None  # no lock file at all
    lock = RunLock.acquire(folder)
    assert RunLock.holder(folder) == os.getpid()
    (folder / LOCK_NAME).unlink()  # held, but its pid cannot be read: held all the same
    assert RunLock.holder(folder) == 0
    lock.release()
    assert RunLock.holder(folder) is None


def test_a_lock_held_by_another_process_refuses_and_a_dead_ones_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tinyattn.train.run_folder import RunLock; "
         f"lock = RunLock.acquire({str(folder)!r}); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StorageError, match=rf"in use by pid {holder.pid}"):
            RunLock.acquire(folder)
    finally:
        holder.kill()  # SIGKILL: no release runs, the lock file stays with the dead pid in it
        holder.wait()
    assert (folder / LOCK_NAME).read_text().strip() == str(holder.pid)
    with RunLock.acquire(folder) as lock:
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())
    # the run says it (console and train.log: tests/test_train.py), not the lock
    assert f"left by pid {holder.pid}, which is no longer running; taking it over" in lock.note


def test_a_training_starting_while_another_process_probes_the_folder_waits_the_probe_out(tmp_path, monkeypatch):
    # RunLock.holder (a resume asking whether the folder is in use) takes the kernel lock for an
    # instant; a training that starts in that instant must not be refused as if the run were held.
    folder = tmp_path / "run"
    RunLock.acquire(folder).release()  # the folder and its lock file exist, as a resume finds them
    probe = FileLock(folder / KERNEL_LOCK_NAME, timeout=0, thread_local=False)  # another open file: conflicts
    probe.acquire()

    class ProbedLock(FileLock):  # the probe lets go 0.1 s after the training starts asking
        def acquire(self, *args, **kwargs):
            threading.Timer(0.1, probe.release).start()
            return super().acquire(*args, **kwargs)

    monkeypatch.setattr(run_folder, "FileLock", ProbedLock)
    with RunLock.acquire(folder):
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_a_folder_its_holder_removes_while_a_training_waits_for_it_is_in_use_in_one_line(tmp_path, monkeypatch):
    # The holder's start failed (no data, say): it removes the folder it made, lock file and all,
    # and lets go while the second training waits for the lock, whose file is then gone.
    folder = tmp_path / "run"
    RunLock.acquire(folder).release()
    holder = FileLock(folder / KERNEL_LOCK_NAME, timeout=0, thread_local=False)
    holder.acquire()

    def remove_failed_start():
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
        holder.release()

    class WaitingLock(FileLock):
        def acquire(self, *args, **kwargs):
            threading.Timer(0.1, remove_failed_start).start()
            return super().acquire(*args, **kwargs)

    monkeypatch.setattr(run_folder, "FileLock", WaitingLock)
    with pytest.raises(StorageError, match=r"run is in use by pid \(unknown\): another training writes there"):
        RunLock.acquire(folder)


def test_a_folder_removed_while_it_is_checked_is_not_refused_with_a_traceback(tmp_path, monkeypatch):
    # Another run's failed start can remove the folder between check_run_folder's is_dir and its
    # listing; what is gone holds nothing to refuse, and the lock then makes the folder anew.
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("1\n")
    listing = Path.iterdir

    def removed_meanwhile(path):
        if path == folder:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return listing(path)

    monkeypatch.setattr(Path, "iterdir", removed_meanwhile)
    run_folder.check_run_folder(folder)


def test_a_failed_start_whose_folder_holds_a_folder_under_a_run_files_name_removes_nothing(tmp_path):
    """remove_failed_start takes only plain files: a folder named like the log (the user's, say)
    keeps the run folder and every file in it, the lock files included."""
    folder = tmp_path / "run"
    lock = RunLock.acquire(folder)
    (folder / "train.log").mkdir()
    (folder / "train.log" / "notes.txt").write_text("mine")
    before = sorted(p.name for p in folder.iterdir())
    assert run_folder.remove_failed_start(folder, "train.log") is False
    assert sorted(p.name for p in folder.iterdir()) == before
    lock.release()


@pytest.mark.parametrize("kept", ["config.yaml", "tokenizer.json", "data.json", "notes.txt"])
def test_a_failed_start_removes_a_folder_of_its_log_and_locks_alone_and_keeps_one_with_any_other_file(
        tmp_path, kept):
    """What a run writes before its first step (config.yaml, tokenizer.json, data.json) or a file of
    the user's keeps the folder whole; the log, the lock files and the marker alone go with it."""
    folder = tmp_path / "run"
    lock = RunLock.acquire(folder)
    (folder / "train.log").write_text("error: ...\n")
    (folder / kept).write_text("mine")
    before = sorted(p.name for p in folder.iterdir())
    assert run_folder.remove_failed_start(folder, "train.log") is False
    assert sorted(p.name for p in folder.iterdir()) == before
    (folder / kept).unlink()
    assert run_folder.remove_failed_start(folder, "train.log") is True
    assert not folder.exists()
    lock.release()


def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    now = datetime(2026, 11, 30, 12, 0, 0)
    first = unique_run_dir(tmp_path, "shakespeare_char", now)
    second = unique_run_dir(tmp_path, "shakespeare_char", now)
    assert first.name == "shakespeare_char-20261130-120000"
    assert second.name == "shakespeare_char-20261130-120000-2"
    assert first.is_dir() and second.is_dir()


@pytest.mark.parametrize("name", [".", "..", "a/b", "", "/abs"])
def test_a_run_name_that_is_not_one_folder_name_inside_out_dir_is_refused(name):
    with pytest.raises(ConfigError, match=r"--run-name .*: a run name is one folder name inside"):
        check_run_name(name)


@pytest.mark.parametrize("left", [[KERNEL_LOCK_NAME], [KERNEL_LOCK_NAME, LOCK_NAME]],
                         ids=["kernel lock", "both"])
def test_a_folder_holding_only_the_lock_files_of_a_run_that_died_at_once_is_taken(tmp_path, left):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in left:  # killed after it locked the folder, before it marked it
        (folder / name).write_bytes(b"")
    with RunLock.acquire(folder):
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_remove_temporaries_takes_files_and_leaves_a_folder_named_like_one(tmp_path):
    (tmp_path / ".step.pt.x1.tmp").write_bytes(b"half")
    (tmp_path / ".keep.tmp").mkdir()
    (tmp_path / ".keep.tmp" / "inside").write_text("mine")
    (tmp_path / "notes.tmp").write_text("mine")  # not hidden: a user's file, never a writer's temporary
    assert remove_temporaries(tmp_path) == [tmp_path / ".step.pt.x1.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep.tmp", "notes.tmp"]
    assert (tmp_path / ".keep.tmp" / "inside").read_text() == "mine"


def test_check_writable_makes_the_folder_and_leaves_nothing_in_it(tmp_path):
    folder = check_writable(tmp_path / "runs" / "new")
    assert folder == tmp_path / "runs" / "new" and list(folder.iterdir()) == []  # its probe file is gone


# ----------------------------------------------------------------------------- atomic writes


def test_a_write_is_fsynced_before_its_rename_and_the_rename_fsynced_after(tmp_path, monkeypatch):
    import stat

    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(source, target):
        calls.append("rename")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic_write(tmp_path / "step.pt") as f:
        f.write(b"weights")
    assert calls == ["fsync file", "rename", "fsync folder"]  # a crash after any of them loses nothing
    assert (tmp_path / "step.pt").read_bytes() == b"weights"


def test_an_error_inside_the_block_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "best.pt"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="the writer failed"):
        with atomic_write(target) as f:
            f.write(b"half of the new")
            raise ValueError("the writer failed")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["best.pt"]


def test_a_keyboard_interrupt_inside_the_block_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "best.pt"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as f:
            f.write(b"half of the new")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["best.pt"]


# ----------------------------------------------------------------------------- refused writes


@pytest.mark.skipif(not hasattr(os, "fchmod") or os.name == "nt", reason="POSIX permissions")
def test_a_written_file_has_the_permissions_a_plain_write_gives(tmp_path, monkeypatch):
    mask = os.umask(0o022)  # the usual umask, whatever the test process was given
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        new = tmp_path / "new.pt"
        with atomic_write(new) as f:
            f.write(b"x")
    finally:
        os.umask(mask)
    assert new.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    new.chmod(0o640)
    with atomic_write(new) as f:  # a replaced file keeps its own
        f.write(b"y")
    assert new.stat().st_mode & 0o777 == 0o640 and new.read_bytes() == b"y"

    def refused(fd, mode):  # a file system that keeps no modes (FAT, some network mounts)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refused)
    with atomic_write(new) as f:  # written all the same, and no temporary left
        f.write(b"z")
    assert new.read_bytes() == b"z" and sorted(p.name for p in tmp_path.iterdir()) == ["new.pt", "plain.txt"]


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_partial_file(small_tmpfs):
    target = small_tmpfs / "big.bin"
    with pytest.raises(StorageError, match=r"cannot write .*big\.bin: No space left on device; free some space"):
        with atomic_write(target) as f:
            f.write(os.urandom(512 * 1024))
    assert list(small_tmpfs.iterdir()) == []


def test_a_full_disk_behind_a_writer_that_wraps_the_error_in_its_own_is_still_one_line(small_tmpfs):
    """A writer such as torch.save may report a failed write as its own RuntimeError ("file write
    failed"): the file system's refusal underneath is what the user is told."""
    target = small_tmpfs / "step.pt"
    with pytest.raises(StorageError, match=r"cannot write .*step\.pt: No space left on device; free some space"):
        with atomic_write(target) as f:
            try:
                f.write(os.urandom(512 * 1024))
            except OSError:
                raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert list(small_tmpfs.iterdir()) == []


def test_a_checkpoint_copied_onto_a_full_disk_leaves_no_partial_file(small_tmpfs, tmp_path):
    from tinyattn.checkpoint import copy_checkpoint

    source = tmp_path / "step_0000010.pt"  # a fork copies the checkpoint it starts from
    source.write_bytes(os.urandom(512 * 1024))
    with pytest.raises(StorageError, match=r"cannot write .*step_0000010\.pt: No space left on device"):
        copy_checkpoint(source, small_tmpfs / source.name)
    assert list(small_tmpfs.iterdir()) == []


def test_a_read_only_folder_is_refused_before_anything_is_written(small_tmpfs):
    (small_tmpfs / "run").mkdir()
    small_tmpfs.make_read_only()
    with pytest.raises(StorageError, match=r"cannot write .*run: Read-only file system; make it writable"):
        check_writable(small_tmpfs / "run")
    with pytest.raises(StorageError, match=r"Read-only file system"):
        RunLock.acquire(small_tmpfs / "run")


@pytest.mark.parametrize("below", ["", "run", "run/deeper"])  # "": the folder itself is the file (EEXIST)
def test_a_file_where_a_folder_should_be_is_one_line_naming_it(tmp_path, below):
    (tmp_path / "taken").write_text("a file")
    target = tmp_path / "taken" / below / "model.bin"
    with pytest.raises(StorageError, match=rf"cannot write {target}: {tmp_path / 'taken'} is a file, not a folder"):
        with atomic_write(target) as f:
            f.write(b"x")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        check_writable(tmp_path / "taken" / below)
    assert (tmp_path / "taken").read_text() == "a file"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nothing can be made")
def test_a_folder_the_file_system_cannot_make_is_one_line_naming_it():
    # /proc says ENOENT to mkdir and mkstemp: where a write makes its place, that is a refusal too
    with pytest.raises(StorageError, match=r"^cannot write /proc/runs: No such file or directory; "
                                           r"nothing can be made there; choose another folder$"):
        check_writable("/proc/runs")  # train.out_dir, a token cache's folder
    with pytest.raises(StorageError, match=r"^cannot write /proc/x/model\.bin: No such file or directory"):
        with atomic_write("/proc/x/model.bin") as f:
            f.write(b"x")


def test_a_folder_that_cannot_be_locked_is_held_by_nobody(small_tmpfs):
    RunLock.acquire(small_tmpfs / "run").release()  # leaves its kernel lock file
    small_tmpfs.make_read_only()  # the lock file cannot be opened for writing, even by root
    assert RunLock.holder(small_tmpfs / "run") is None


def test_a_name_over_255_bytes_is_one_line_saying_so(tmp_path):
    target = tmp_path / ("x" * 300)
    with pytest.raises(StorageError, match=r"cannot write .*x{300}: File name too long; a name may have "
                                           r"at most 255 bytes; choose a shorter one$"):
        with atomic_write(target) as f:
            f.write(b"x")
    assert list(tmp_path.iterdir()) == []


def test_read_text_drops_a_leading_byte_order_mark_only(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xef\xbb\xbfa\xef\xbb\xbfb\r\nc")  # as a Windows editor saves UTF-8
    assert read_text(path, "text file") == "a\ufeffb\nc"  # a mark inside is text; newlines as before
    path.write_bytes(b"\xef\xbb\xbfab\xff")
    with pytest.raises(DataError, match=r"notes.txt: the text file is not UTF-8 text \(byte 5\)$"):
        read_text(path, "text file")  # the byte counted in the file, the mark included


def test_asking_who_holds_a_folder_never_held_writes_nothing_there(tmp_path):
    # A resume asks before it compares a folder's checkpoints; the question must leave no lock file
    # in a folder no training ever locked (a user's, or one not made yet).
    folder, missing = tmp_path / "run", tmp_path / "not-yet"
    folder.mkdir()
    assert RunLock.holder(folder) is None and RunLock.holder(missing) is None
    assert list(folder.iterdir()) == [] and not missing.exists()


@pytest.mark.parametrize("text", ["not a pid\n", "12x\n", "-3\n"])
def test_a_lock_file_that_holds_no_pid_is_taken_over_without_a_traceback(tmp_path, text):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(text)  # a half-written or foreign .lock
    assert RunLock.holder(folder) is None
    with RunLock.acquire(folder):
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())
