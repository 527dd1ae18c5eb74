"""Issue 23's third sweep, paths and small things: a run stays inside train.out_dir and never
writes into a folder tinyattn did not make, an export replaces a folder as one step and an
interrupted one is cleaned up, and the small refusals and skips say what a user needs."""

from pathlib import Path

import pytest

from tests.conftest import CORPUS, ROOT
from tinyattn.config import load_config
from tinyattn.errors import ConfigError, StorageError, TinyattnError
from tinyattn.train.loop import train
from tinyattn.train.run_folder import RunLock

TINY = ROOT / "configs" / "tiny.yaml"
MARKER_NAME = ".tinyattn-run"  # run_folder.MARKER_NAME


def tiny_config(tmp_path: Path, *extra: str):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(CORPUS, encoding="utf-8")
    return load_config(TINY, [f"data.files={corpus}", "data.url=null", "data.sha256=null",
                              f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path / 'runs'}",
                              "train.max_steps=2", "train.eval_interval=2", "train.batch_size=4",
                              "train.sample_tokens=0", *extra])


# ----------------------------------------------------------------------------- run names and folders


@pytest.mark.parametrize("name", ["../../escape", "../myproject", "a/b", "..", ".", "a\\b", "ABSOLUTE"])
def test_a_run_name_that_is_not_one_folder_name_is_refused_before_anything_is_made(tmp_path, name):
    name = str(tmp_path / "elsewhere") if name == "ABSOLUTE" else name
    config = tiny_config(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=r"--run-name .*: a run name is one folder name inside"):
        train(config, run_name=name, progress=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # not even train.out_dir
    with pytest.raises(ConfigError, match=r"--run-name"):  # the resume path checks it too
        train(tiny_config(tmp_path), run_name=name, resume=True, progress=False)


@pytest.mark.parametrize("command", ["train", "generate", "export", "eval"])
def test_a_path_with_a_name_over_255_bytes_is_one_line(tmp_path, capsys, trained_run, command):
    from tinyattn.cli.main import main

    long = "x" * 300
    run = str(trained_run.run_dir)
    argv = {"train": ["train", "--config", str(TINY), "--run-name", long,
                      "--set", f"train.out_dir={tmp_path}"],
            "generate": ["generate", "--checkpoint", str(tmp_path / long)],
            "export": ["export", "--checkpoint", run, "--out", str(tmp_path / long)],
            "eval": ["eval", "--checkpoint", run, "--plot", str(tmp_path / f"{long}.png")]}
    assert main(argv[command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "File name too long" in err and err.count("\n") == 1, err
    assert "255 bytes" in err and long in err  # the path too long is named


def test_an_existing_folder_of_the_users_is_refused_and_left_untouched(tmp_path):
    project = tmp_path / "runs" / "myproject"
    project.mkdir(parents=True)
    (project / "config.yaml").write_text("mine: true\n")
    (project / ".notes.tmp").write_text("a draft")
    (project / "samples.txt").write_text("my samples\n")
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    with pytest.raises(StorageError, match=r"myproject: an existing folder that is not a tinyattn run"):
        train(tiny_config(tmp_path), run_name="myproject", progress=False)
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before
    with pytest.raises(StorageError, match=r"not a tinyattn run folder"):
        RunLock.acquire(project)  # the lock's clean-up would delete .notes.tmp


def test_a_run_folder_is_marked_and_one_without_the_marker_but_with_checkpoints_is_still_taken(tmp_path):
    with RunLock.acquire(tmp_path / "new") as lock:
        assert (lock.folder / MARKER_NAME).is_file()
    (tmp_path / "new" / "empty").mkdir()
    RunLock.acquire(tmp_path / "new").release()  # marked: whatever it holds is the run's
    old = tmp_path / "old"  # a run folder written before the marker existed
    old.mkdir()
    (old / "step_0000010.pt").write_bytes(b"")
    (old / ".step_0000020.pt.x.tmp").write_bytes(b"half")
    RunLock.acquire(old).release()
    assert (old / MARKER_NAME).is_file() and not (old / ".step_0000020.pt.x.tmp").exists()


def test_a_killed_token_cache_builds_temporary_files_go_with_the_next_build(tmp_path):
    from tinyattn.data.batches import prepare_data

    config = tiny_config(tmp_path)
    folder = prepare_data(config, progress=False).cache_dir
    (folder / "meta.json").unlink()  # as a build killed before its end leaves the folder ...
    (folder / ".train.bin.k1ll3d.tmp").write_bytes(b"\0" * 4096)  # ... with its half-written file
    prepare_data(config, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "tokenizer.json", "train.bin",
                                                        "validation.bin"]


def test_a_token_cache_build_waits_for_another_processs_build_and_leaves_its_files_alone(
        tmp_path, monkeypatch, capfd):
    import threading

    from filelock import FileLock

    import tinyattn.data.token_cache as token_cache
    from tinyattn.data.batches import prepare_data

    config = tiny_config(tmp_path)
    folder = prepare_data(config, progress=False).cache_dir
    meta = (folder / "meta.json").read_bytes()
    (folder / "meta.json").unlink()  # another process is building the folder again ...
    live = folder / ".train.bin.l1ve.tmp"
    live.write_bytes(b"\0" * 4096)  # ... and writing this file now
    other = FileLock(folder.parent / f".{folder.name}{token_cache.BUILD_LOCK_SUFFIX}", timeout=0,
                     thread_local=False)  # another open file: conflicts, as another process's would
    holding = threading.Thread(target=other.acquire)  # in a thread of its own, as filelock wants
    holding.start()
    holding.join()
    seen = []

    def other_finishes():
        seen.append(live.exists())  # untouched while the other process held the lock
        live.unlink()
        (folder / "meta.json").write_bytes(meta)  # its commit, inside its lock
        other.release()

    finishing = threading.Timer(0.3, other_finishes)

    class OtherHolds(FileLock):
        def acquire(self, *args, **kwargs):
            if finishing.ident is None:  # the first try only
                finishing.start()
            return super().acquire(*args, **kwargs)

    def build(*args, **kwargs):
        raise AssertionError("built while another process built the same cache")

    monkeypatch.setattr(token_cache, "FileLock", OtherHolds)
    monkeypatch.setattr(token_cache, "LOCK_NOTE_AFTER", 0.1, raising=False)
    monkeypatch.setattr(token_cache.TokenCache, "build", build)
    capfd.readouterr()
    data = prepare_data(config, progress=False)  # waits, then uses what the other process built
    assert seen == [True] and data.cache_dir == folder and len(data.train) > 0
    note = f"note: another process is building the token cache {folder}; waiting for it"
    assert note in capfd.readouterr().err


def test_a_failed_token_cache_build_takes_its_lock_file_with_it(tmp_path):
    from tinyattn.data.batches import prepare_data
    from tinyattn.errors import DataError

    config = tiny_config(tmp_path, "model.context_length=100000")  # the splits turn out too short
    with pytest.raises(DataError, match="fewer than model.context_length"):
        prepare_data(config, progress=False)
    cache = tmp_path / "cache"
    assert not list(cache.glob(".*.build.filelock"))  # held by nothing: it goes with the failed build
    folder = prepare_data(tiny_config(tmp_path), progress=False).cache_dir  # a build that succeeds keeps it
    assert [p.name for p in cache.glob(".*.build.filelock")] == [f".{folder.name}.build.filelock"]


def test_a_cache_another_process_completed_just_before_the_lock_was_taken_is_used_not_built_again(
        tmp_path, monkeypatch):
    # The other build committed between this process's first look (no cache yet) and its lock,
    # which it then took at once, without waiting: what is there now is used.
    import tinyattn.data.token_cache as token_cache
    from tinyattn.data.batches import prepare_data

    config = tiny_config(tmp_path)
    folder = prepare_data(config, progress=False).cache_dir
    trusted_meta = token_cache.TokenCache.trusted_meta
    looks = []

    def first_look_finds_nothing(self, **kwargs):
        looks.append(kwargs)
        return None if len(looks) == 1 else trusted_meta(self, **kwargs)

    def build(*args, **kwargs):
        raise AssertionError("built again a cache another process had completed")

    monkeypatch.setattr(token_cache.TokenCache, "trusted_meta", first_look_finds_nothing)
    monkeypatch.setattr(token_cache.TokenCache, "build", build)
    data = prepare_data(config, progress=False)
    assert data.cache_dir == folder and len(data.train) > 0 and len(looks) == 2


# ----------------------------------------------------------------------------- small things


def test_a_zero_byte_best_pt_falls_back_to_the_newest_good_step_checkpoint_with_a_note(
        trained_run, tmp_path, capsys):
    import shutil

    from tinyattn import checkpoint as ckpt
    from tinyattn.errors import CheckpointError

    run = shutil.copytree(trained_run.run_dir, tmp_path / "run")
    (run / "best.pt").write_bytes(b"")
    newest = ckpt.step_checkpoints(run)[-1]
    shutil.copy(newest, run / ckpt.step_filename(1))  # an older step that verifies too: not the one taken
    capsys.readouterr()
    loaded = ckpt.load_model(run)  # the run's model was asked for: the newest one that verifies
    assert loaded.path == newest
    assert f"note: {run / 'best.pt'} is damaged (an empty file); using {newest.name}" in (
        capsys.readouterr().err)
    # best.pt named as a file: refused, naming the good checkpoint to use instead.
    with pytest.raises(CheckpointError, match=rf"best\.pt: an empty file, not a tinyattn checkpoint; the newest "
                                              rf"checkpoint in .* that verifies is {newest.name}: use "
                                              rf"--checkpoint .*{newest.name}"):
        ckpt.load_model(run / "best.pt")


def test_a_resume_on_a_corpus_with_new_characters_names_them_not_vocab_size(tmp_path):
    from tinyattn.errors import CheckpointError

    train(tiny_config(tmp_path), run_name="run", progress=False)
    (tmp_path / "corpus.txt").write_text("Ωß é\n" + CORPUS, encoding="utf-8")
    expected = r"the corpus has 3 characters the run's tokenizer does not know \('ß', 'é', 'Ω'\); token ids"
    with pytest.raises(CheckpointError, match=expected) as refused:
        train(tiny_config(tmp_path, "train.max_steps=4"), run_name="run", resume=True, progress=False)
    assert "vocab_size" not in str(refused.value)


def test_a_run_that_fails_before_step_1_takes_back_only_the_folder_it_made(tmp_path):
    from tinyattn.errors import DataError

    missing = f"data.files={tmp_path / 'nope.txt'}"
    with pytest.raises(DataError, match="file not found"):
        train(tiny_config(tmp_path, missing), progress=False)  # a default name: a folder of its own
    assert list((tmp_path / "runs").iterdir()) == []
    kept = tmp_path / "runs" / "mine"
    kept.mkdir()  # the user's (empty) folder, named with --run-name: it was there before
    with pytest.raises(DataError, match="file not found"):
        train(tiny_config(tmp_path, missing), run_name="mine", progress=False)
    assert "file not found" in (kept / "train.log").read_text(encoding="utf-8")
    train(tiny_config(tmp_path), run_name="done", progress=False)
    with pytest.raises(TinyattnError):  # a run that trained keeps its folder, whatever fails later
        train(tiny_config(tmp_path, "train.max_steps=4", missing), run_name="done", resume=True, progress=False)
    assert (tmp_path / "runs" / "done" / "config.yaml").is_file()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_before_the_first_step_is_one_line_and_takes_back_the_new_runs_folder(tmp_path, monkeypatch,
                                                                                     capsys, sig):
    import os
    import signal

    import tinyattn.train.loop as loop
    from tinyattn.cli.main import main

    train(tiny_config(tmp_path), run_name="kept", progress=False)
    kept = tmp_path / "runs" / "kept"
    checkpoints = {p.name: p.read_bytes() for p in kept.glob("*.pt")}
    prepare_data = loop.prepare_data

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, sig))  # Ctrl-C or SIGTERM while the data is prepared
        return prepare_data(*args, **kwargs)

    def no_handler(signum, frame):  # SIGTERM's default would end pytest instead of failing the test
        raise AssertionError(f"{sig} reached no handler of the run's")

    monkeypatch.setattr(loop, "prepare_data", stopped)
    sets = [f"data.files={tmp_path / 'corpus.txt'}", "data.url=null", "data.sha256=null",
            f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path / 'runs'}"]
    line = f"stopped by {sig} before the first step: nothing was trained or saved"
    previous = signal.signal(signal.SIGTERM, no_handler)
    try:
        capsys.readouterr()
        assert main(["train", "--config", str(TINY), "--no-progress", "--run-name", "new",
                     *[arg for item in sets for arg in ("--set", item)]]) == 130
        err = capsys.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1, err  # one line, as a stop in the loop
        assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["kept"]  # no empty "new"
        with pytest.raises(KeyboardInterrupt, match=line):  # a resume stopped so keeps its folder
            train(tiny_config(tmp_path, "train.max_steps=4"), run_name="kept", resume=True, progress=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert line in (kept / "train.log").read_text(encoding="utf-8")
    assert {p.name: p.read_bytes() for p in kept.glob("*.pt")} == checkpoints


def test_a_stop_after_the_first_write_but_before_step_1_saves_a_checkpoint_the_folder_resumes_from(
        tmp_path, monkeypatch):
    # Once config.yaml, tokenizer.json and TensorBoard's files are written, "nothing was saved"
    # would be false and the folder is no longer a failed start: the stop saves the starting weights.
    import os
    import signal

    from tinyattn.train.log import Logger

    start = Logger.start

    def stopped(self, point):
        start(self, point)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Logger, "start", stopped)
    try:
        result = train(tiny_config(tmp_path, "train.max_steps=4"), run_name="early", progress=False)
    except KeyboardInterrupt as e:  # StoppedBeforeStart: "nothing was saved", beside the files written
        pytest.fail(f"ended at once after the first writes: {e}")
    run = tmp_path / "runs" / "early"
    assert result.interrupted and result.step == 0
    assert (run / "step_0000000.pt").is_file()
    monkeypatch.setattr(Logger, "start", start)
    resumed = train(tiny_config(tmp_path, "train.max_steps=4"), run_name="early", resume=True, progress=False)
    assert resumed.step == 4 and not resumed.interrupted


@pytest.mark.parametrize("budget", ["0.5s", "1s"])  # each shorter than the measuring itself, on any machine
def test_a_budget_too_small_for_a_step_advises_what_helps_while_a_budget_is_set(tmp_path, budget):
    from tinyattn.errors import TinyattnError

    with pytest.raises(TinyattnError, match=rf"train.time_budget {budget}: .*no step fits") as refused:
        train(tiny_config(tmp_path, f"train.time_budget={budget}"), run_name="small", progress=False)
    message = str(refused.value)
    assert "or set train.max_steps" not in message  # the budget would still win over a file's max_steps
    assert ("Give a budget of at least " in message and "or train a fixed number of steps: --set "
            "train.time_budget=null train.max_steps=N" in message), message
    at_least = float(message.split("at least ")[1].split("s ")[0])
    assert at_least > float(budget[:-1])
    assert list((tmp_path / "runs").iterdir()) == []  # a failed command leaves no run folder behind
