"""A full disk where a run or an export writes what is not a checkpoint (train.log, TensorBoard's
events file, a GGUF file, a Hugging Face folder): one line naming the path, exit 2, and nothing
half-written left (docs/RELIABILITY.md)."""

import errno
import re
from pathlib import Path

import pytest

from tests.conftest import CORPUS, ROOT, local_corpus

from tinyattn.errors import StorageError

TINY = ROOT / "configs" / "tiny.yaml"


def train_args(tmp_path: Path, out_dir: Path, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    sets = [*local_corpus(corpus, out_dir), f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=4",
            "train.eval_interval=2", "train.batch_size=4", "train.sample_tokens=0", "model.n_embd=16",
            "model.n_layer=1", *extra]
    return ["train", "--config", str(TINY), "--run-name", "r", "--no-progress",
            *[arg for item in sets for arg in ("--set", item)]]


def fill(disk: Path, pages_left: int = 0) -> None:
    """Take every free byte of `disk` but `pages_left` pages of 4 KiB."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        f.truncate(max(0, f.tell() - 4096 * pages_left))


def test_a_full_disk_at_config_yaml_is_its_one_line_not_train_logs_close(tmp_path, small_tmpfs, capsys):
    # train.log holds the first line unwritten (the disk took none of it); closing it must not
    # raise over the error that ends the run
    from tinyattn.cli.main import main

    fill(small_tmpfs, pages_left=1)  # the lock file's pid takes it
    code = main(train_args(tmp_path, small_tmpfs))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"error: cannot write {small_tmpfs / 'r' / 'config.yaml'}: No space left "
                                    "on device; free some space there or choose another folder")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]  # a failed start: no folder left


@pytest.mark.parametrize("pages_left", [0, 4])  # 0: the header's flush fails; 4: numpy writes short
def test_a_full_disk_during_a_gguf_export_is_one_line_and_leaves_no_temporary_file(small_tmpfs, pages_left):
    pytest.importorskip("gguf")
    from tests.test_gguf import random_model, tokenizer_of
    from tinyattn.gguf.writer import write_gguf

    tokenizer = tokenizer_of("char")
    model = random_model(tokenizer)
    fill(small_tmpfs, pages_left)
    path = small_tmpfs / "m.gguf"
    with pytest.raises(StorageError) as raised:
        write_gguf(model.state_dict(), model.config, tokenizer, path)
    message = str(raised.value)
    assert message.startswith(f"cannot write {path}: ") and "\n" not in message
    assert "No space left on device" in message or "the disk took only" in message, message
    assert message.endswith("; free some space there or choose another folder")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]  # no hidden .m.gguf.*.tmp


def test_a_full_disk_during_a_hugging_face_export_names_the_out_folder_not_its_staging_copy(small_tmpfs):
    pytest.importorskip("safetensors")
    from tests.test_hf import random_model, tokenizer_of
    from tinyattn.hf.folder import export_folder

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 4)
    fill(small_tmpfs)
    out = small_tmpfs / "exp"
    with pytest.raises(StorageError) as raised:
        export_folder(model.state_dict(), config, tokenizer, out)
    assert str(raised.value) == (f"cannot write {out} (writing config.json): No space left on device; free "
                                 "some space there or choose another folder")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]


def refusing_tensorboard_writes(monkeypatch, refuse: list) -> None:
    """TensorBoard's writer thread is refused every write while `refuse` is not empty, as a full
    disk refuses it."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    write = RecordWriter.write

    def full(self, data):
        if refuse:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(RecordWriter, "write", full)


def test_a_full_disk_as_tensorboard_starts_is_one_line_and_takes_back_the_new_runs_folder(
        tmp_path, monkeypatch, capsys):
    from tinyattn.cli.main import main

    refusing_tensorboard_writes(monkeypatch, [True])
    code = main(train_args(tmp_path, tmp_path / "runs"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert err.splitlines()[-1] == (f"error: cannot write {tmp_path / 'runs' / 'r'}: No space left on device; "
                                    "free some space there or choose another folder")
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_full_disk_at_an_evaluations_tensorboard_write_is_one_line_naming_the_events_file(
        tmp_path, monkeypatch, capsys):
    from tinyattn import checkpoint as ckpt
    from tinyattn.cli.main import main
    from tinyattn.train.log import Logger

    refuse = []
    refusing_tensorboard_writes(monkeypatch, refuse)
    evaluation = Logger.evaluation

    def filled(self, result, best, evaluator):  # the disk fills at the second evaluation
        if result.step == 4:
            refuse.append(True)
        evaluation(self, result, best, evaluator)

    monkeypatch.setattr(Logger, "evaluation", filled)
    code = main(train_args(tmp_path, tmp_path / "runs"))
    err = capsys.readouterr().err
    run = tmp_path / "runs" / "r"
    assert code == 2, err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    [events] = run.glob("events.out.tfevents.*")
    assert err.splitlines()[-1] == (f"error: cannot write {events}: No space left on device; "
                                    "free some space there or choose another folder")
    assert [ckpt.step_of(p) for p in ckpt.step_checkpoints(run)] == [2]  # what was saved stays


def refusing_the_events_files_close(monkeypatch) -> None:
    """The events file's close is refused, as a full disk refuses the last of its buffer."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    close = RecordWriter.close

    def full(self):
        close(self)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "close", full)


def test_a_refused_close_of_the_events_file_is_the_runs_error_after_its_done_line(
        tmp_path, monkeypatch, capsys):
    from tinyattn import checkpoint as ckpt
    from tinyattn.cli.main import main

    refusing_the_events_files_close(monkeypatch)
    code = main(train_args(tmp_path, tmp_path / "runs"))
    err = capsys.readouterr().err
    run = tmp_path / "runs" / "r"
    assert code == 2, err
    assert "Traceback" not in err, err
    [events] = run.glob("events.out.tfevents.*")
    assert err.splitlines()[-1] == (f"error: cannot write {events}: No space left on device; "
                                    "free some space there or choose another folder")
    assert err.splitlines()[-2].startswith("done: 4 steps in ")  # said first: the run is done and saved
    assert ckpt.latest_checkpoint(run).name == ckpt.step_filename(4)


def test_the_error_that_ends_a_run_is_its_line_though_the_events_files_close_is_refused_too(
        tmp_path, monkeypatch, capsys):
    from tinyattn.cli.main import main
    from tinyattn.train.trainer import Trainer

    refusing_the_events_files_close(monkeypatch)
    step = Trainer.train_step

    def poisoned(self):
        loss, norm = step(self)
        return (loss * float("nan") if self.step >= 3 else loss), norm

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    code = main(train_args(tmp_path, tmp_path / "runs"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[-1].startswith("error: the loss became nan at step 3; training stopped"), err


def started_logger(run_dir: Path):
    """A Logger whose TensorBoard writer is open in `run_dir`."""
    from types import SimpleNamespace

    from tinyattn.config import load_config
    from tinyattn.train.log import Logger

    trainer = SimpleNamespace(model=SimpleNamespace(flops_per_token=lambda: 1.0),
                              dist=SimpleNamespace(world_size=1), step=0)
    (run_dir / "config.yaml").write_text("model:\n  n_layer: 1\n", encoding="utf-8")
    log = Logger(run_dir, load_config(TINY), trainer, peak_flops=1.0, enabled=True, progress=False)
    log.start(None)
    return log


def test_a_second_stop_as_tensorboard_starts_is_what_the_start_raises_not_a_refused_close_after_it(
        tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    from tinyattn.train.owners import StoppedAtOnce

    refusing_the_events_files_close(monkeypatch)

    def stopped(self, *args, **kwargs):  # a second Ctrl-C as the config goes to TensorBoard
        raise StoppedAtOnce("SIGINT")

    monkeypatch.setattr(SummaryWriter, "add_text", stopped)
    with pytest.raises(StoppedAtOnce, match="stopped at once by a second SIGINT"):
        started_logger(tmp_path)


def fail_in_a_tensorboard_writer_thread(error: Exception) -> None:
    """A TensorBoard writer thread (as the run's writer runs) that meets `error` at its first write."""
    import queue
    from types import SimpleNamespace

    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    def write(data):
        raise error

    records = queue.Queue()
    records.put(b"a record")
    thread = _AsyncWriterThread(records, SimpleNamespace(write=write, flush=lambda: None), 120)
    thread.start()
    thread.join()


def test_while_tensorboard_writes_only_its_threads_refused_writes_are_kept_from_the_console(
        tmp_path, monkeypatch):
    import threading

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    def full_disk_in_a_thread_of_ones_own():  # a notebook's own writer, say
        raise OSError(errno.ENOSPC, "No space left on device")

    log = started_logger(tmp_path)
    try:
        fail_in_a_tensorboard_writer_thread(OSError(errno.ENOSPC, "No space left on device"))
        fail_in_a_tensorboard_writer_thread(ValueError("a bug in the writer"))
        own = threading.Thread(target=full_disk_in_a_thread_of_ones_own)
        own.start()
        own.join()
    finally:
        log.close()
    # the full disk is the writer's next call's one line; a bug is shown, as is another thread's error
    assert seen == [ValueError, OSError]


def test_closing_tensorboard_gives_back_the_thread_hook_it_found(tmp_path, monkeypatch):
    # After a run (a notebook's), a refused write in a writer thread of the user's own is shown again
    import threading

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    started_logger(tmp_path).close()
    fail_in_a_tensorboard_writer_thread(OSError(errno.ENOSPC, "No space left on device"))
    assert seen == [OSError]


def test_a_train_log_write_the_full_disk_refuses_neither_ends_the_run_nor_prints_a_traceback(
        small_tmpfs, capsys):
    from tinyattn.train.log import RunLog, say

    # The file's write fails where a line is more than its buffer holds (a shorter one fails in the flush)
    lines = ["step 1: loss 1.0000", "warning: " + "a long warning " * 1000, "step 2: loss 0.5000"]
    fill(small_tmpfs)
    with RunLog(small_tmpfs, enabled=True):
        for line in lines:
            say(line)
    assert capsys.readouterr().err.splitlines() == lines  # every line on the console, nothing else


def token_cache_config(tmp_path: Path, disk: Path, characters: int):
    from tinyattn.config import config_from_dict

    corpus = tmp_path / "corpus.txt"
    corpus.write_text((CORPUS * (characters // len(CORPUS) + 1))[:characters], encoding="utf-8")
    return config_from_dict({"model": {"context_length": 8}, "tokenizer": {"kind": "char"},
                             "data": {"files": [str(corpus)], "cache_dir": str(disk),
                                      "validation_fraction": 0.3}})


def test_a_token_cache_build_that_fills_the_disk_leaves_none_of_its_files(tmp_path, small_tmpfs):
    # train.bin fitted, validation.bin did not: the whole train.bin (never to be trusted) stayed, taking
    # the room the next build needs (a 300 MB corpus: 600 MB left on a full disk)
    from tinyattn.data.batches import prepare_data

    config = token_cache_config(tmp_path, small_tmpfs, 150_000)  # 210 KB of train.bin, 90 KB validation
    with pytest.raises(StorageError, match="validation.bin: No space left on device"):
        prepare_data(config, progress=False)
    assert [p for p in small_tmpfs.rglob("*") if p.is_file()] == []


def test_a_damaged_token_cache_is_rebuilt_in_the_room_its_files_took(tmp_path, small_tmpfs, capsys):
    # the damaged files stayed while the new ones were written: a rebuild needed twice the room
    from tinyattn.data.batches import prepare_data

    config = token_cache_config(tmp_path, small_tmpfs, 80_000)  # 160 KB of the disk's 256 KB
    first = prepare_data(config, progress=False)
    train_bin = first.cache_dir / "train.bin"
    expected = train_bin.read_bytes()
    del first
    with open(train_bin, "r+b") as f:
        f.write(b"\0" * 4096)  # changed in place
    again = prepare_data(config, progress=False)
    assert "does not match its checksum in meta.json" in capsys.readouterr().err
    assert again.train.tobytes() == expected


def test_a_write_through_a_link_goes_to_its_target_and_removing_a_leftover_link_keeps_the_target(tmp_path):
    from tinyattn.system.storage import remove_leftover, through_link

    target, link = tmp_path / "real.gguf", tmp_path / "link.gguf"
    target.write_bytes(b"x")
    link.symlink_to(target)
    assert through_link(link, "a .gguf file") == target.resolve()
    assert through_link(target, "a .gguf file") == target
    folder, folder_link = tmp_path / "kept", tmp_path / "leftover"
    (folder / "inside").mkdir(parents=True)
    folder_link.symlink_to(folder)
    remove_leftover(folder_link)
    assert not folder_link.is_symlink() and (folder / "inside").is_dir()


def test_removing_the_temporaries_of_one_name_leaves_every_other_file(tmp_path):
    from tinyattn.system.storage import remove_temporaries

    ours = tmp_path / ".model.gguf.ab_12xyz.tmp"  # mkstemp's eight characters
    others = [tmp_path / ".other.gguf.ab_12xyz.tmp", tmp_path / ".model.gguf.a-user's.tmp"]
    for path in (ours, *others):
        path.write_bytes(b"")
    assert remove_temporaries(tmp_path, of="model.gguf") == [ours]
    assert all(path.exists() for path in others)


@pytest.mark.parametrize("data, at", [(b"\0abc", "byte 0 (line 1)"), (b"a\nb\nc\0", "byte 5 (line 3)")])
def test_a_text_holding_a_nul_is_refused_naming_its_byte_and_line(tmp_path, data, at):
    from tinyattn.errors import DataError
    from tinyattn.system.storage import read_text

    path = tmp_path / "prompt.txt"
    path.write_bytes(data)
    with pytest.raises(DataError, match=rf"prompt\.txt: the prompt file holds a NUL at {re.escape(at)}, "):
        read_text(path, "prompt file")


def test_a_new_folder_gets_the_mode_mkdir_gives_not_mkdtemps_owner_only_one(tmp_path):
    import os

    from tinyattn.system.storage import new_folder_mode

    made = tmp_path / "made"
    made.mkdir()
    assert new_folder_mode(tmp_path / "not-yet") == made.stat().st_mode & 0o777
    os.chmod(made, 0o750)
    assert new_folder_mode(made) == 0o750  # a folder it replaces keeps its own


FULL = "free some space there or choose another folder"
WRITABLE = "make it writable or choose another folder"


@pytest.mark.parametrize("number, reason, advice", [(errno.EDQUOT, "Disk quota exceeded", FULL),
                                                    (errno.EFBIG, "File too large", FULL),
                                                    (errno.EACCES, "Permission denied", WRITABLE),
                                                    (errno.EPERM, "Operation not permitted", WRITABLE)])
def test_a_quota_a_size_limit_or_a_permission_refused_at_a_write_is_one_line_with_its_advice(
        tmp_path, number, reason, advice):
    # A quota or a file size limit is a full disk to the user. Root is never refused by a folder's
    # mode, so a permission refusal is raised as the file system gives it.
    from tinyattn.system.storage import atomic_write

    path = tmp_path / "step.pt"
    with pytest.raises(StorageError) as refused:
        with atomic_write(path):
            raise OSError(number, reason)
    assert str(refused.value) == f"cannot write {path}: {reason}; {advice}"
    assert list(tmp_path.iterdir()) == []


def test_a_link_that_leads_nowhere_is_refused_naming_it_and_nothing_is_made_where_it_points(tmp_path):
    from tinyattn.system.storage import through_link

    target, link = tmp_path / "gone" / "model.gguf", tmp_path / "model.gguf"
    link.symlink_to(target)
    with pytest.raises(StorageError, match=rf"^{re.escape(str(link))}: a symbolic link to "
                                           rf"{re.escape(str(target))}, which does not exist; point it at "
                                           r"a \.gguf file, or choose another --out$"):
        through_link(link, "a .gguf file")
    assert not (tmp_path / "gone").exists()


def test_a_short_write_names_what_the_disk_took_of_what_it_was_given(tmp_path):
    from tinyattn.system.storage import storage_errors

    with pytest.raises(StorageError) as refused:
        with storage_errors(tmp_path / "tokens.bin"):
            raise OSError("1000 requested and 400 written")  # numpy's tofile on a full disk: no errno
    assert "the disk took only part of the write (400 of 1,000 items)" in str(refused.value)


def test_removing_the_temporaries_of_one_name_leaves_a_users_file_of_another_length(tmp_path):
    from tinyattn.system.storage import remove_temporaries

    ours = tmp_path / ".model.gguf.ab_12xyz.tmp"
    users = [tmp_path / ".model.gguf.old.tmp", tmp_path / ".model.gguf.backup_copy.tmp"]
    for path in (ours, *users):
        path.write_bytes(b"")
    assert remove_temporaries(tmp_path, of="model.gguf") == [ours]
    assert all(path.exists() for path in users)


@pytest.mark.parametrize("written", ["config.edited-step4.yaml", "data.json"])
def test_a_full_disk_at_a_resumes_kept_config_or_data_json_is_one_line_and_leaves_no_half_file(
        small_tmpfs, written):
    # A resume writes the user's edited config.yaml aside (`keep_user_config`) and the data's
    # fingerprint (data.json) before its first step: a disk full there is one line, as at config.yaml.
    from tinyattn.config import config_text, load_config
    from tinyattn.train.resume import ResumePoint, keep_user_config, save_data_fingerprint

    config = load_config(TINY)
    run = small_tmpfs / "r"
    run.mkdir()
    (run / "config.yaml").write_text(config_text(config) + "# the user's note\n", encoding="utf-8")
    fill(small_tmpfs)
    with pytest.raises(StorageError) as raised:
        if written == "data.json":
            save_data_fingerprint({"train": {"tokens": 1, "checksum": "0" * 64}}, run)
        else:
            keep_user_config(run, ResumePoint(run / "step_0000004.pt", {}, config, 4))
    assert str(raised.value) == (f"cannot write {run / written}: No space left on device; free some space "
                                 "there or choose another folder")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
