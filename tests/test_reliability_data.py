"""Issue 23, "silently wrong": repeated --set flags, duplicate YAML keys, data that changed under a
run (the token cache's key, the data a run records, resume and eval on changed data) and a
config.yaml edited before a resume."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tinyattn import checkpoint as ckpt
from tinyattn.cli.train import main as train_main
from tinyattn.cli.train import parser as train_parser
from tinyattn.config import load_config
from tinyattn.data.batches import prepare_data
from tinyattn.errors import CheckpointError
from tinyattn.train.loop import train
from tinyattn.train.resume import ResumePoint

# The runs and token caches written here in process go to the page cache alone
# (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def test_repeated_set_flags_accumulate():
    args = train_parser().parse_args(["--config", "c.yaml", "--set", "model.n_layer=3", "--set",
                                      "train.max_steps=4", "train.lr=0.1"])
    assert args.overrides == ["model.n_layer=3", "train.max_steps=4", "train.lr=0.1"]


# ----------------------------------------------------------------------------- the data changed under a run


@pytest.fixture
def corpus(tmp_path, shakespeare_path) -> Path:
    """60 kB of Tiny Shakespeare in a file of the test's own (the tests edit it)."""
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare_path.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


def reorder_keeping_size_and_time(path: Path) -> None:
    """Swap the two halves of the text (same characters, same size) and set the modification
    time back, as `cp -p`, `rsync -a` or `touch -r` would."""
    stat = path.stat()
    text = path.read_text(encoding="utf-8")
    half = len(text) // 2
    path.write_text(text[half:] + text[:half], encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def tiny(corpus: Path, out_dir: Path, *extra: str):
    return load_config(TINY, [f"data.files={corpus}", "data.url=null", "data.sha256=null",
                              f"data.cache_dir={out_dir / 'cache'}", f"train.out_dir={out_dir}",
                              "train.max_steps=4", "train.eval_interval=2", *extra])


@pytest.mark.parametrize("fraction", [5e-324, 1e-300, 1e-17, 1e-12, 1e-7, 0.1, 0.3])
def test_the_first_held_out_document_is_found_at_once_for_any_fraction(fraction):
    import itertools
    import time

    from tinyattn.data.splits import _first_held_out, _held_out

    started = time.perf_counter()
    first = _first_held_out(fraction)  # counting up to it took hours at 1e-12
    assert time.perf_counter() - started < 0.1
    if first > 2**1023:  # no index can be held out at this fraction
        assert not _held_out(2**1023, fraction)
        return
    assert _held_out(first, fraction)
    assert not any(_held_out(i, fraction) for i in range(max(0, first - 1000), first))
    if fraction > 1e-6:
        assert first == next(i for i in itertools.count() if _held_out(i, fraction))


def test_the_token_cache_is_keyed_by_the_text_not_its_size_and_time(corpus, tmp_path):
    before = np.array(prepare_data(tiny(corpus, tmp_path), progress=False).validation)
    reorder_keeping_size_and_time(corpus)
    after = prepare_data(tiny(corpus, tmp_path), progress=False)
    assert not np.array_equal(before, np.array(after.validation))  # the old cache would give the old tokens
    text = corpus.read_text(encoding="utf-8")
    assert after.tokenizer.decode(np.array(after.validation).tolist()) == text[int(len(text) * 0.9):]


def test_a_file_only_touched_keeps_its_token_cache(corpus, tmp_path):
    first = prepare_data(tiny(corpus, tmp_path), progress=False)
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    assert prepare_data(tiny(corpus, tmp_path), progress=False).cache_dir == first.cache_dir


def test_a_run_records_the_data_it_trained_on(corpus, tmp_path):
    result = train(tiny(corpus, tmp_path), run_name="rec", progress=False)
    fingerprint = json.loads((result.run_dir / "data.json").read_text(encoding="utf-8"))
    digest = hashlib.blake2b(corpus.read_bytes()).hexdigest()
    source_files = fingerprint["inputs"]["source"]["files"]
    assert source_files == [[str(corpus.resolve()), corpus.stat().st_size, digest]]
    assert ckpt.load_checkpoint(result.run_dir / "best.pt")["data"] == fingerprint
    assert fingerprint["train"]["tokens"] > fingerprint["validation"]["tokens"] > 0
    assert fingerprint["validation_rule"] == "the last 0.1 of the characters (6000 of 60000)"


def test_a_resume_on_changed_data_is_refused_unless_allowed_and_logged(corpus, tmp_path, capsys):
    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    reorder_keeping_size_and_time(corpus)
    with pytest.raises(CheckpointError) as e:
        train(tiny(corpus, tmp_path), resume=run, progress=False)
    message = str(e.value)
    assert f"{corpus.resolve()} changed" in message and "the validation split differs (" in message
    assert "--allow-data-change" in message and "\n" not in message
    assert not (run / ckpt.step_filename(4)).exists()  # nothing trained
    code = train_main(["--resume", str(run), "--allow-data-change", "--no-progress", "--set",
                       f"train.out_dir={tmp_path}"])
    assert code == 0, capsys.readouterr().err
    log = (run / "train.log").read_text(encoding="utf-8")
    assert "warning: --allow-data-change: the data differs from what the run trained on up to step 2" in log
    assert f"{corpus.resolve()} changed" in log
    assert (run / ckpt.step_filename(4)).exists()
    assert not list(run.glob("config.edited-*"))  # config.yaml was the run's own: nothing to keep


def test_allowing_changed_training_tokens_alone_says_the_validation_losses_stay_comparable():
    """Only the training split changed: the validation windows are the same, so the warning of
    --allow-data-change must not call the losses before and after the resume incomparable (it did,
    right after the refusal had said the validation split is the same)."""
    saved = {"key": "k1", "train": {"checksum": "t1", "tokens": 100},
             "validation": {"checksum": "v", "tokens": 9}}
    point = ResumePoint(file=Path("run/step_0000002.pt"), state={"data": saved}, config=None, step=2)
    same_validation = {**saved, "key": "k2", "train": {"checksum": "t2", "tokens": 100}}
    line = point.check_data(same_validation, allow_change=True)
    assert "not comparable" not in line
    assert ("the validation split is the same: validation losses before and after step 2 stay comparable"
            in line)
    other_validation = {**same_validation, "validation": {"checksum": "w", "tokens": 9}}
    line = point.check_data(other_validation, allow_change=True)
    assert "validation losses before and after step 2 (best.pt's included) are not comparable" in line


def test_a_bpe_run_resumed_on_changed_text_blames_the_text_not_the_unchanged_settings(corpus, tmp_path):
    """A BPE trained again on the text with a line put before it has the same tokens with other ids: the
    refusal said '(the tokenizer settings changed)', which they had not (an edit of them is refused
    earlier, naming the key)."""
    bpe = ("tokenizer.kind=bpe", "tokenizer.vocab_size=300")
    train(tiny(corpus, tmp_path, *bpe), run_name="run", stop_at_step=2, progress=False)
    corpus.write_text("More text put here.\n" + corpus.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        train(tiny(corpus, tmp_path, *bpe), resume=tmp_path / "run", progress=False)
    message = str(e.value)
    assert "settings changed" not in message
    assert "its tokenizer differs from the one the data now builds: the same tokens, with other ids or " \
           "merges (it was trained again on text that changed since the run" in message


def test_a_refused_resume_says_only_what_changed_the_validation_split_kept(tmp_path):
    """A text file among several edited in a training document: the validation split is the same, and
    the refusal said the run would 'validate on another split'."""
    books = tmp_path / "books"
    books.mkdir()
    for i in range(10):  # documents 0-8 train, 9 validates
        (books / f"{i}.txt").write_text(f"Book {i}. " + "Lorem ipsum dolor sit amet. " * 40, encoding="utf-8")
    train(tiny(books, tmp_path), run_name="run", stop_at_step=2, progress=False)
    (books / "3.txt").write_text("Book 3. " + "Lorem ipsum dolor sit amat. " * 40, encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        train(tiny(books, tmp_path), resume=tmp_path / "run", progress=False)
    message = str(e.value)
    assert "the validation split differs" not in message and "validate on another split" not in message
    assert "resuming would go on with other tokens (the validation split is the same): restore" in message


def test_a_resume_from_a_checkpoint_without_a_data_fingerprint_says_the_data_cannot_be_checked(tmp_path):
    from tinyattn.train.resume import ResumePoint

    point = ResumePoint(tmp_path / "step_0000010.pt", {"step": 10}, load_config(TINY), 10)  # an older tinyattn's
    note = point.check_data({"files": []}, allow_change=False)
    assert note == (f"note: {tmp_path / 'step_0000010.pt'} records no data fingerprint (saved by an older "
                    "tinyattn): whether the data changed since cannot be checked")


def test_eval_of_the_validation_split_says_when_the_data_changed(corpus, tmp_path, capsys):
    from tinyattn.cli.eval import main as eval_main

    # A third of the corpus (--split train scores all of its training split): its halves swapped,
    # the training split still holds the same characters, so the char tokenizer is the run's.
    corpus.write_text(corpus.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    train(tiny(corpus, tmp_path), run_name="run", progress=False)
    assert eval_main(["--checkpoint", str(tmp_path / "run"), "--no-plot"]) == 0
    assert "warning" not in capsys.readouterr().err
    reorder_keeping_size_and_time(corpus)
    assert eval_main(["--checkpoint", str(tmp_path / "run"), "--no-plot", "--split", "validation"]) == 0
    err = capsys.readouterr().err
    assert "warning: the validation split is not the one" in err and f"{corpus.resolve()} changed" in err
    assert f"{tmp_path / 'run' / 'best.pt'} was validated on" in err
    assert err.rstrip().endswith("not comparable with the run's and may count text it trained on"), err
    assert eval_main(["--checkpoint", str(tmp_path / "run"), "--no-plot", "--split", "train"]) == 0
    err = capsys.readouterr().err
    assert "warning: the train split is not the one" in err and "best.pt was trained on" in err
    assert err.rstrip().endswith("this loss is not comparable with the run's"), err


# -------------------------------------------------------------------------- config.yaml edited, then resumed


def edit_run_config(run: Path, old: str, new: str) -> str:
    path = run / "config.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    edited = "# my edit\n" + text.replace(old, new)
    path.write_text(edited, encoding="utf-8")
    return edited


def test_an_edited_config_yaml_applies_on_resume_and_the_users_text_is_kept(corpus, tmp_path, capsys):
    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    edited = edit_run_config(run, "  lr: 0.002\n", "  lr: 0.001\n")
    code = train_main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={tmp_path}"])
    assert code == 0, capsys.readouterr().err
    assert load_config(run / "config.yaml").train.lr == 0.001
    assert ckpt.load_checkpoint(run / ckpt.step_filename(4))["config"]["train"]["lr"] == 0.001
    log = (run / "train.log").read_text(encoding="utf-8")
    assert f"{run / 'config.yaml'}: your edits apply after step 2: train.lr 0.002 -> 0.001" in log
    assert (run / "config.edited-step2.yaml").read_text(encoding="utf-8") == edited
    # config.yaml now describes step 4: a fork from step 2 continues step 2's own config.
    from tinyattn.train.resume import ResumePoint

    fork = ResumePoint.find(run / ckpt.step_filename(2), "fork", tmp_path)
    assert fork.edited_config().train.lr == 0.002
    assert fork.notes == []  # the edit was step 4's own setting: nothing in the file is left untaken


def test_a_config_yaml_left_as_the_run_wrote_it_is_not_kept_as_an_edit(corpus, tmp_path, capsys):
    """A long prompt with a newline, which YAML folds: the run wrote config.yaml with libyaml's dumper and
    compared it with the pure-Python one's text, which folds it otherwise, so every resume said
    'config.yaml differed from the run's own copy' and kept an unedited copy as config.edited-stepN.yaml."""
    prompt = "word " * 30 + "\nx"
    train(tiny(corpus, tmp_path, f"sample.prompt={prompt}"), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    capsys.readouterr()
    assert train_main(["--resume", str(run), "--no-progress", "--stop-at-step", "3"]) == 0
    assert "differed" not in capsys.readouterr().err
    assert ckpt.latest_checkpoint(run).name == ckpt.step_filename(3)
    assert not list(run.glob("config.edited-*")) and load_config(run / "config.yaml").sample.prompt == prompt


def test_a_fork_from_an_earlier_step_names_the_config_yaml_edits_it_does_not_take(corpus, tmp_path):
    """config.yaml describes the folder's latest step: a fork from an earlier one keeps its own config
    and says which edits of the file it leaves, but for those the command line gives anyway."""
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path), run_name="run", progress=False)  # step_2 and step_4
    run = tmp_path / "run"
    edit_run_config(run, "  lr: 0.002\n", "  lr: 0.001\n")
    edit_run_config(run, "  ema: null\n", "  ema: 0.9\n")
    fork = ResumePoint.find(run / ckpt.step_filename(2), "fork", tmp_path)
    config = fork.edited_config()
    assert (config.train.lr, config.train.ema) == (0.002, None)
    assert fork.notes == [f"note: {run / 'config.yaml'} describes step 4, not step 2: its edits (train.lr, "
                          "train.ema) do not apply to a fork from step 2; give them with --set"]
    fork = ResumePoint.find(run / ckpt.step_filename(2), "fork", tmp_path)
    fork.edited_config(overruled=("train.lr",))
    assert fork.notes[0].endswith("its edits (train.ema) do not apply to a fork from step 2; give them with --set")
    fork = ResumePoint.find(run / ckpt.step_filename(2), "fork", tmp_path)
    fork.edited_config(overruled=("train.lr", "train.ema"))
    assert fork.notes == []


def test_a_resume_from_a_best_pt_further_on_than_the_step_checkpoints_is_not_called_a_fork(corpus,
                                                                                            tmp_path):
    """A save cut short after best.pt of step 4, before its step's checkpoint: `--resume <run>/best.pt`
    continues the run in place, and the note on config.yaml's edits called it 'a fork from step 4'."""
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path), run_name="run", progress=False)  # step_2 and step_4
    run = tmp_path / "run"
    ckpt.copy_checkpoint(run / ckpt.step_filename(4), run / ckpt.BEST)
    (run / ckpt.step_filename(4)).unlink()
    edit_run_config(run, "  lr: 0.002\n", "  lr: 0.001\n")
    point = ResumePoint.find(run / ckpt.BEST, None, tmp_path)
    assert point.target(None, tmp_path) == run and point.edited_config().train.lr == 0.002
    assert point.notes == [f"note: {run / 'config.yaml'} describes step 2, not step 4: its edits (train.lr) "
                           "do not apply to a resume from best.pt (step 4); give them with --set"]


def test_an_edit_the_command_line_overrules_is_logged_as_overruled(corpus, tmp_path, capsys):
    """config.yaml's edit of a key that --set or --device also gives: the command line's value is the
    one the run takes, and the note says so (it said the edit applied, then ran on the other)."""
    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    text = edit_run_config(run, "  lr: 0.002\n", "  lr: 0.001\n")
    (run / "config.yaml").write_text(text.replace("  device: auto\n", "  device: cuda\n"), encoding="utf-8")
    code = train_main(["--resume", str(run), "--no-progress", "--device", "cpu", "--set",
                       f"train.out_dir={tmp_path}", "--set", "train.lr=0.003"])
    assert code == 0, capsys.readouterr().err
    saved = ckpt.load_checkpoint(run / ckpt.step_filename(4))["config"]["train"]
    assert (saved["lr"], saved["device"]) == (0.003, "cpu")
    log = (run / "train.log").read_text(encoding="utf-8")
    overruled = "(overruled: the command line sets it for this run)"
    assert f"train.lr 0.002 -> 0.001 {overruled}" in log
    assert f"train.device 'auto' -> 'cuda' {overruled}" in log


def test_an_edit_of_the_model_size_in_config_yaml_is_refused_naming_the_key(corpus, tmp_path, capsys):
    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    edited = edit_run_config(run, "  n_layer: 2\n", "  n_layer: 3\n")
    code = train_main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{run / 'config.yaml'}: model.n_layer was edited (2 -> 3), but a resume cannot change" in err
    assert (run / "config.yaml").read_text(encoding="utf-8") == edited  # left as the user wrote it
    assert not (run / ckpt.step_filename(4)).exists()



def test_a_key_deleted_from_config_yaml_goes_back_to_its_default_and_the_run_says_so(corpus, tmp_path,
                                                                                     capsys):
    """config.yaml is read as any config file: a deleted key is an edit back to its default, alone
    or beside another edit (it was ignored alone, and applied unannounced beside one)."""
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path, "train.ema=0.9"), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    edit_run_config(run, "  ema: 0.9\n", "")
    point = ResumePoint.find(run, None, tmp_path)
    assert point.edited_config().train.ema is None
    path = run / "config.yaml"
    assert point.notes == [f"{path}: your edits apply after step 2: "
                           "train.ema 0.9 -> None (deleted: its default)"]
    edit_run_config(run, "  lr: 0.002\n", "  lr: 0.001\n")
    point = ResumePoint.find(run, None, tmp_path)
    config = point.edited_config()
    assert (config.train.lr, config.train.ema) == (0.001, None)
    assert point.notes[0].endswith("train.lr 0.002 -> 0.001, train.ema 0.9 -> None (deleted: its default)")
    code = train_main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={tmp_path}"])
    assert code == 0, capsys.readouterr().err
    assert ckpt.load_checkpoint(run / ckpt.step_filename(4))["config"]["train"]["ema"] is None
    assert "train.ema 0.9 -> None (deleted: its default)" in (run / "train.log").read_text(encoding="utf-8")


def test_a_model_key_deleted_from_config_yaml_is_refused_saying_it_was_deleted(corpus, tmp_path):
    from tinyattn.errors import CheckpointError
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    edit_run_config(run, "  n_layer: 2\n", "")
    with pytest.raises(CheckpointError, match=r"config\.yaml: model\.n_layer was deleted \(2 -> \d+\), but a "
                                              "resume cannot change the model's shape"):
        ResumePoint.find(run, None, tmp_path).edited_config()


def test_a_key_an_older_tinyattn_did_not_write_in_config_yaml_is_not_a_deletion(corpus, tmp_path):
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    edit_run_config(run, "  show: []\n", "")  # as a run saved before train.show existed wrote it
    point = ResumePoint.find(run, None, tmp_path)
    del point.state["config"]["train"]["show"]
    point.config = ckpt.config_from_checkpoint(point.state, point.file)
    shown = ["sample", "loss_by_position", "attention", "head_ablation"]  # what such a run showed
    assert point.edited_config().train.show == shown
    assert point.notes == []


def test_an_edit_of_a_table_by_passes_in_config_yaml_is_found_and_said(corpus, tmp_path):
    from tinyattn.train.resume import ResumePoint

    train(tiny(corpus, tmp_path, "train.decay_by_passes={3.5: 0.2}"), run_name="run", stop_at_step=2,
          progress=False)
    run = tmp_path / "run"
    edit_run_config(run, "    3.5: 0.2\n", "    3.5: 0.1\n")
    point = ResumePoint.find(run, None, tmp_path)
    assert point.edited_config().train.decay_by_passes == {3.5: 0.1}
    assert point.notes[0].endswith("train.decay_by_passes {3.5: 0.2} -> {3.5: 0.1} (a run reads it at its "
                                   "start: this one keeps its train.weight_decay)")


def test_dropout_edited_in_config_yaml_or_given_with_set_applies_on_resume(corpus, tmp_path, capsys):
    """The dropouts change how the weights are used, not their shape: an edit of either in
    config.yaml applies, and a --set of either wins over what train.dropout_by_passes chose."""
    table = "train.dropout_by_passes={0: 0.1}"
    train(tiny(corpus, tmp_path, table), run_name="run", stop_at_step=2, progress=False)
    run = tmp_path / "run"
    assert load_config(run / "config.yaml").model.attention_dropout == 0.0
    edit_run_config(run, "  attention_dropout: 0.0\n", "  attention_dropout: 0.05\n")
    code = train_main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={tmp_path}",
                       "train.max_steps=6", "--stop-at-step", "4"])
    assert code == 0, capsys.readouterr().err
    assert load_config(run / "config.yaml").model.attention_dropout == 0.05
    code = train_main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={tmp_path}",
                       "train.max_steps=6", "model.attention_dropout=0.2", "model.dropout=0.15"])
    assert code == 0, capsys.readouterr().err
    saved = load_config(run / "config.yaml").model
    assert (saved.dropout, saved.attention_dropout) == (0.15, 0.2)

def test_data_with_the_same_tokens_is_the_same_data():
    from tinyattn.data.token_cache import data_differences

    saved = {"key": "a", "inputs": {"tokenizers_version": "0.20"}, "train": {"tokens": 9, "checksum": "t"},
             "validation": {"tokens": 1, "checksum": "v"}}
    assert data_differences(saved, {**saved, "key": "b", "inputs": {"tokenizers_version": "0.21"}}) == []
    changed = {**saved, "key": "b", "validation": {"tokens": 2, "checksum": "w"}}
    assert data_differences(saved, changed) == ["the validation split differs (1 token then, 2 now)"]
    # Under one key the tokens decide too (a hub dataset rebuilt after it changed upstream, a reading
    # of the same bytes that changed with tinyattn): the key alone said "the same data".
    assert data_differences(saved, {**changed, "key": "a"}) == [
        "the validation split differs (1 token then, 2 now)"]
    older = {key: value for key, value in saved.items() if key not in ("train", "validation")}
    assert data_differences(older, {**changed, "key": "a"}) == []  # no checksums recorded: the key decides
    large = {**saved, "train": {"tokens": 1003854, "checksum": "t"}}  # counts as the run's lines write them
    assert data_differences(large, {**large, "train": {"tokens": 1003855, "checksum": "u"}}) == [
        "the training tokens differ (1,003,854 tokens then, 1,003,855 now)"]
    assert data_differences(older, changed) == ["the data's cache key differs"]


def test_the_tokens_a_reading_makes_of_the_same_bytes_belong_to_the_cache_format_version(tmp_path):
    # A cache's key holds token_cache.FORMAT_VERSION, not the reading's code: a change in how the same
    # bytes become texts must bump it, or a cache the earlier reading built is reused without a word
    # (3: CSV texts 'NA', 'None' and 'null' kept, not dropped as missing; a file name holding '[' read
    # as that file, not as a pattern matching another). When a change moves these tokens, bump the
    # version and write the new checksums here.
    from tinyattn.data.token_cache import FORMAT_VERSION

    lines = "".join(f"line {i} of the texts\n" for i in range(30))
    (tmp_path / "texts.csv").write_text(f"text\n{lines}NA\nNone\nnull\n", encoding="utf-8")
    records = "".join(f'{{"text": "record {i} in a bracketed name"}}\n' for i in range(30))
    (tmp_path / "more[1].jsonl").write_text(records, encoding="utf-8")
    (tmp_path / "more1.jsonl").write_text('{"text": "the file a pattern would match"}\n', encoding="utf-8")
    read = {}
    for name in ("texts.csv", "more[1].jsonl"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"extends: {TINY}\ndata:\n  files: '{tmp_path / name}'\n"
                        f"  cache_dir: {tmp_path / 'cache'}\n  validation_fraction: 0.2\n"
                        "model:\n  context_length: 16\n", encoding="utf-8")
        fingerprint = prepare_data(load_config(path), progress=False).fingerprint
        read[name] = [(fingerprint[split]["tokens"], fingerprint[split]["checksum"][:16])
                      for split in ("train", "validation")]
    assert (FORMAT_VERSION, read) == (3, {
        "texts.csv": [(508, "4e555749a82429d7"), (123, "6c1fc0df3052dc82")],
        "more[1].jsonl": [(711, "45536a58fbd842c3"), (177, "f30a6fb11749d5fb")]})


def test_data_differences_name_each_file_changed_added_and_removed_and_the_dataset_settings():
    from tinyattn.data.token_cache import data_differences

    def fingerprint(files, dataset_config, train_checksum):
        source = {"dataset": "corpus", "config": dataset_config, "revision": None, "files": files}
        return {"key": train_checksum, "inputs": {"source": source, "text_field": "text"},
                "train": {"tokens": 9, "checksum": train_checksum},
                "validation": {"tokens": 1, "checksum": "v"}}

    saved = fingerprint([["a.jsonl", 5, "x"], ["b.jsonl", 5, "y"]], None, "t")
    now = fingerprint([["a.jsonl", 5, "z"], ["c.jsonl", 7, "w"]], "en", "u")
    assert data_differences(saved, now) == [
        "a.jsonl changed", "c.jsonl added", "b.jsonl removed", "data.dataset_config was None, now 'en'",
        "the training tokens differ (9 tokens then, 9 now)"]
