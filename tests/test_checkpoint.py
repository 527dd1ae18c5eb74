"""Checkpoint files without training: which file a run folder gives, which run is the most
recent, and files or weights that are not this tinyattn's refused by name."""

import os
import re
from pathlib import Path

import pytest
import torch

from tinyattn import checkpoint as ckpt
from tinyattn.errors import CheckpointError


def saved(path, step: int):
    """A small checkpoint at `path` recording only its step."""
    ckpt.save_checkpoint({"step": step}, path)
    return path


def test_a_run_folder_gives_best_pt_to_sample_from_and_its_latest_step_to_resume_from(tmp_path):
    best = saved(tmp_path / ckpt.BEST, 6)
    for step in (3, 6, 9):
        saved(tmp_path / ckpt.step_filename(step), step)
    latest = tmp_path / ckpt.step_filename(9)
    assert ckpt.resolve_checkpoint(tmp_path, prefer="best") == best
    assert ckpt.resolve_checkpoint(tmp_path, prefer="latest") == latest
    best.unlink()  # no best.pt yet: the latest step for both
    assert ckpt.resolve_checkpoint(tmp_path, prefer="best") == latest


def test_a_run_folder_without_best_pt_whose_latest_step_is_damaged_gives_the_newest_that_verifies(
        tmp_path, capsys):
    older, newest = saved(tmp_path / ckpt.step_filename(10), 10), saved(tmp_path / ckpt.step_filename(20), 20)
    newest.write_bytes(newest.read_bytes()[:100])  # cut short: it fails verification
    capsys.readouterr()
    assert ckpt.resolve_checkpoint(tmp_path, prefer="best") == older  # the run's model was asked for
    assert capsys.readouterr().err == (f"note: {newest} is damaged (not a torch.save archive); using "
                                       f"{older.name}, the newest checkpoint that verifies (an earlier step)\n")
    assert ckpt.resolve_checkpoint(tmp_path, prefer="latest") == newest  # a resume names what to use itself
    older.unlink()
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(newest))}: not a readable checkpoint "
                                              rf"\(truncated or corrupt\?\): not a torch\.save archive; no "
                                              rf"other checkpoint in {re.escape(str(tmp_path))} verifies either$"):
        ckpt.resolve_checkpoint(tmp_path, prefer="best")


def test_a_run_folder_whose_best_pt_and_latest_step_are_damaged_gives_the_newest_step_that_verifies(
        tmp_path, capsys):
    good, newer = saved(tmp_path / ckpt.step_filename(10), 10), saved(tmp_path / ckpt.step_filename(20), 20)
    best = saved(tmp_path / ckpt.BEST, 20)
    for damaged in (newer, best):
        damaged.write_bytes(damaged.read_bytes()[:100])  # cut short: fails verification
    capsys.readouterr()
    assert ckpt.resolve_checkpoint(tmp_path, prefer="best") == good  # past the damaged newer step too
    assert capsys.readouterr().err == (f"note: {best} is damaged (not a torch.save archive); using "
                                       f"{good.name}, the newest checkpoint that verifies (its validation "
                                       "loss may be above best's)\n")


def test_the_most_recent_run_is_the_one_whose_newest_checkpoint_was_written_last(tmp_path):
    older, newer = tmp_path / "b-older", tmp_path / "a-newer"  # names that sort the other way
    saved(older / ckpt.step_filename(500), 500)
    saved(newer / ckpt.step_filename(10), 10)
    os.utime(older / ckpt.step_filename(500), (1_000_000, 1_000_000))
    os.utime(newer / ckpt.step_filename(10), (2_000_000, 2_000_000))
    assert ckpt.latest_run(tmp_path) == newer
    assert ckpt.resolve_checkpoint(None, tmp_path) == newer / ckpt.step_filename(10)


def test_steps_are_ordered_by_their_number_past_seven_digits_too(tmp_path):
    for step in (9_999_999, 123, 10_000_000):  # step_filename pads to 7 digits: the last is longer
        saved(tmp_path / ckpt.step_filename(step), step)
    assert [ckpt.step_of(p) for p in ckpt.step_checkpoints(tmp_path)] == [123, 9_999_999, 10_000_000]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / ckpt.step_filename(10_000_000)
    ckpt.prune_checkpoints(tmp_path, keep_last=1)
    assert [p.name for p in tmp_path.iterdir()] == [ckpt.step_filename(10_000_000)]


def test_a_best_pt_of_a_newer_format_is_refused_without_advice_to_load_itself(tmp_path):
    best = tmp_path / ckpt.BEST  # it verifies (a whole archive): no step checkpoint to suggest instead
    torch.save({"format": ckpt.FORMAT, "format_version": 99, "step": 3}, best)
    with pytest.raises(CheckpointError) as error:
        ckpt.load_model(best)
    assert str(error.value).endswith(f"(it reads version {ckpt.FORMAT_VERSION})")


@pytest.mark.parametrize("best_pt", ["newer format", "not tinyattn's"])
def test_a_whole_best_pt_it_cannot_read_gets_no_advice_to_take_a_step_checkpoint_with_a_note(tmp_path,
                                                                                             best_pt):
    """A run folder a newer tinyattn wrote (best.pt and its steps of format 99), or whose best.pt is another
    program's torch.save file: the folder is read as asked, and `--checkpoint <folder> to take it with a
    note` (the command just refused) and a step checkpoint of the same format are no advice. The advice
    is for a best.pt that fails its CRC check, which a folder given does step past."""
    best = tmp_path / ckpt.BEST
    for step, path in ((3, tmp_path / ckpt.step_filename(3)), (3, best)):
        torch.save({"format": ckpt.FORMAT, "format_version": 99, "step": step}, path)
    if best_pt == "not tinyattn's":
        torch.save({"step": 3}, best)
    for given in (tmp_path, best):
        with pytest.raises(CheckpointError) as refused:
            ckpt.load_model(given)
        assert str(refused.value).startswith(f"{best}: ") and "verifies" not in str(refused.value)
        assert "take it with a note" not in str(refused.value)


def test_a_file_that_is_not_a_tinyattn_checkpoint_or_of_a_newer_format_is_refused_naming_it(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": {"weight": torch.zeros(2)}, "step": 3}, foreign)  # plain data, no format
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(foreign))}: not a tinyattn checkpoint$"):
        ckpt.load_checkpoint(foreign)
    newer = tmp_path / "newer.pt"
    torch.save({"format": ckpt.FORMAT, "format_version": 99, "step": 3}, newer)  # a later tinyattn's
    refused = rf"{re.escape(str(newer))}: checkpoint format version 99 is not supported by this tinyattn \(it reads version "
    with pytest.raises(CheckpointError, match=refused + rf"{ckpt.FORMAT_VERSION}\)"):
        ckpt.load_checkpoint(newer)
    assert ckpt.load_checkpoint(saved(tmp_path / "ours.pt", 3))["step"] == 3


def test_weights_of_another_shape_are_refused_naming_the_keys_not_a_traceback():
    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    def model(n_embd):
        return LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=n_embd, context_length=8))

    wider = {"model": model(32).state_dict()}  # the same names, other shapes
    with pytest.raises(CheckpointError, match=r"^x\.pt: weights do not fit the model its config describes "
                                              r"\(written by another version of tinyattn\?\): wrong shape: "
                                              r"blocks\.0\.\S+, .* and \d+ more$"):
        ckpt.load_weights(model(16), wider, Path("x.pt"))


def test_weights_missing_a_key_or_holding_an_extra_one_are_refused_naming_them_not_a_traceback():
    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8))
    weights = dict(model.state_dict())
    dropped = sorted(weights)[0]
    del weights[dropped]
    with pytest.raises(CheckpointError, match=rf"^x\.pt: weights do not fit .*: missing: {re.escape(dropped)}$"):
        ckpt.load_weights(model, {"model": weights}, Path("x.pt"))
    extra = {**model.state_dict(), "blocks.9.extra": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"^x\.pt: weights do not fit .*: unexpected: blocks\.9\.extra$"):
        ckpt.load_weights(model, {"model": extra}, Path("x.pt"))


def test_a_run_is_dated_by_its_newest_checkpoint_not_its_first(tmp_path):
    long_running, other = tmp_path / "long", tmp_path / "other"
    saved(long_running / ckpt.step_filename(100), 100)
    saved(long_running / ckpt.step_filename(200), 200)
    saved(other / ckpt.step_filename(10), 10)
    os.utime(long_running / ckpt.step_filename(100), (1_000_000, 1_000_000))  # its start: before other's
    os.utime(other / ckpt.step_filename(10), (2_000_000, 2_000_000))
    os.utime(long_running / ckpt.step_filename(200), (3_000_000, 3_000_000))  # its last save: after
    assert ckpt.latest_run(tmp_path) == long_running


def test_a_run_folder_holding_only_best_pt_holds_checkpoints(tmp_path):
    # A folder whose step files were deleted to save space still holds a model: a new run named
    # there must be refused, not write over its best.pt.
    assert not ckpt.has_checkpoints(tmp_path)
    saved(tmp_path / ckpt.BEST, 40)
    assert ckpt.has_checkpoints(tmp_path)


def test_a_copy_that_fails_midway_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    source, target = saved(tmp_path / "a.pt", 3), tmp_path / "fork" / ckpt.step_filename(3)
    saved(target, 1)  # what the target held before
    before = target.read_bytes()

    def half_then_fail(src, out, length=0):
        out.write(src.read(10))
        raise OSError("the disk went away")

    monkeypatch.setattr(ckpt.shutil, "copyfileobj", half_then_fail)
    with pytest.raises(OSError, match="went away"):
        ckpt.copy_checkpoint(source, target)
    assert target.read_bytes() == before
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary left either


def test_a_loaded_model_is_ready_for_inference_in_eval_mode(tmp_path, char_tokenizer):
    from tinyattn.config import Config, DataConfig, ModelConfig, config_to_dict
    from tinyattn.model.transformer import LanguageModel

    config = Config(model=ModelConfig(vocab_size=char_tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=8, dropout=0.5),  # dropout: train mode would show
                    data=DataConfig(files=["a.txt"]))
    model = LanguageModel(config.model)
    ckpt.save_checkpoint({"config": config_to_dict(config), "model": model.state_dict(),
                          "tokenizer": char_tokenizer.to_json(), "step": 7}, tmp_path / ckpt.BEST)
    loaded = ckpt.load_model(tmp_path)
    assert loaded.step == 7 and not any(module.training for module in loaded.model.modules())


def gguf_file(path: Path) -> Path:
    """The start of a GGUF file (magic, version 3, zero tensors, zero keys): enough to be told by."""
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    return path


def safetensors_file(path: Path) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": torch.zeros(2)}, str(path))
    return path


def other_formats(tmp_path: Path) -> dict[Path, str]:
    """A GGUF file, a Hugging Face folder's weights and a safetensors file in no such folder, each
    with the line a command reading Hugging Face folders too says for it."""
    gguf = gguf_file(tmp_path / "b60.gguf")
    folder = tmp_path / "b60"
    weights = safetensors_file(folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    loose = safetensors_file(tmp_path / "loose" / "weights.safetensors")
    safetensors = "a safetensors file (weights alone), not a tinyattn checkpoint"
    return {
        gguf: f"{gguf}: a GGUF file, which tinyattn writes but does not read; give a run folder, a .pt "
              "checkpoint or a Hugging Face folder",
        weights: f"{weights}: {safetensors}; give the Hugging Face folder that holds it ({folder}), a run "
                 "folder or a .pt checkpoint",
        loose: f"{loose}: {safetensors}; a Hugging Face folder holding it is read (config.json, safetensors, "
               f"tokenizer.json: {loose.parent} has no config.json), as is a run folder or a .pt checkpoint",
    }


@pytest.mark.parametrize("command, argv", [("generate", ["--prompt", "x"]),
                                           ("eval", ["--split", "validation"]),
                                           ("export", ["--out", "exported"])])
def test_a_gguf_or_safetensors_file_as_checkpoint_is_named_for_what_it_is_not_called_damaged(
        command, argv, tmp_path, capsys):
    import importlib

    module = importlib.import_module(f"tinyattn.cli.{command}")
    for file, message in other_formats(tmp_path).items():
        assert module.main(["--checkpoint", str(file), *argv]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "exported").exists()


def test_a_gguf_or_safetensors_file_to_fine_tune_from_or_resume_is_named_for_what_it_is(tmp_path):
    from tinyattn.train.finetune import InitSource
    from tinyattn.train.resume import ResumePoint

    for file, message in other_formats(tmp_path).items():
        with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
            InitSource.load(str(file), tmp_path)  # train.init_from reads a Hugging Face folder too
        what = message.partition(";")[0]  # --resume takes no Hugging Face folder: only tinyattn's own
        with pytest.raises(CheckpointError, match=f"^{re.escape(what)}; --resume takes a run folder or one "
                                                  r"of its checkpoints \(step_\*\.pt, best\.pt\)$"):
            ResumePoint.find(file, None, tmp_path)


def test_a_damaged_best_pt_to_fine_tune_from_names_the_newest_checkpoint_that_verifies(tmp_path):
    from tinyattn.train.finetune import InitSource

    good = saved(tmp_path / ckpt.step_filename(20), 20)
    best = saved(tmp_path / ckpt.BEST, 20)
    best.write_bytes(best.read_bytes()[:100])  # cut short
    message = (f"{best}: not a readable checkpoint (truncated or corrupt?): not a torch.save archive; the "
               f"newest checkpoint in {tmp_path} that verifies is {good.name}: use --set train.init_from={good}, "
               f"or --set train.init_from={tmp_path} to take it with a note")
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        InitSource.load(str(best), tmp_path)


def test_an_empty_or_foreign_file_is_named_for_what_it_is_not_called_truncated_or_corrupt(tmp_path):
    from tinyattn.hf.folder import load_any_model

    empty, notes = tmp_path / "empty.pt", tmp_path / "notes.txt"
    empty.write_bytes(b"")
    notes.write_text("not a model\n")
    folder = tmp_path / "hf"
    (folder / "README.md").parent.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "README.md").write_text("# a model\n")
    foreign = "not a tinyattn checkpoint (a torch.save archive): another kind of file"
    expected = {empty: f"{empty}: an empty file, not a tinyattn checkpoint", notes: f"{notes}: {foreign}",
                folder / "README.md": f"{folder / 'README.md'}: {foreign}; give the Hugging Face folder "
                                      f"that holds it ({folder}), a run folder or a .pt checkpoint"}
    for file, message in expected.items():
        with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
            load_any_model(file)
        with pytest.raises(CheckpointError, match=f"^{re.escape(message.partition(';')[0])}$"):
            ckpt.load_checkpoint(file)  # a resume reads no Hugging Face folder: no advice to give one


def test_a_checkpoint_without_a_tokenizer_is_one_line_naming_the_file(tmp_path, capsys):
    from tinyattn.cli import generate
    from tinyattn.config import ModelConfig, config_to_dict, load_config
    from tinyattn.model.transformer import LanguageModel
    from tinyattn.train.finetune import InitSource

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    config.model = ModelConfig(vocab_size=12, n_layer=1, n_head=2, n_embd=16, context_length=8)
    file = tmp_path / "notok.pt"
    ckpt.save_checkpoint({"config": config_to_dict(config), "model": LanguageModel(config.model).state_dict(),
                          "step": 1}, file)
    message = (f"{file}: holds no tokenizer (tinyattn train saves its JSON text under \"tokenizer\" in every "
               "checkpoint); give a checkpoint or run folder it wrote")
    for load in (ckpt.load_model, lambda file: InitSource.load(str(file), tmp_path)):
        with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
            load(file)
    assert generate.main(["--checkpoint", str(file), "--prompt", "x"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def tiny_state(**entries) -> dict:
    """What a checkpoint of configs/tiny.yaml holds besides its weights and tokenizer, with `entries`."""
    from tinyattn.config import config_to_dict, load_config

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")
    return {"config": config_to_dict(config), "step": 1, **entries}


def test_a_checkpoint_without_weights_to_fine_tune_from_is_one_line_naming_the_file(tmp_path):
    from tinyattn.train.finetune import InitSource

    file = tmp_path / "noweights.pt"
    ckpt.save_checkpoint(tiny_state(tokenizer="{}"), file)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(file))}: holds no model weights$"):
        InitSource.load(str(file), tmp_path / "cache")


def test_sources_of_other_tokenizers_fine_tuned_from_with_one_cache_keep_a_tokenizer_file_each(tmp_path):
    # Each checkpoint's tokenizer is written under data.cache_dir (no tokenizer.json beside it): one
    # file for both would give the first fine-tune, resumed, the second source's tokenizer.
    from tinyattn.train.finetune import InitSource

    texts = ['{"source": "a"}', '{"source": "b"}']
    for name, text in zip("ab", texts):
        ckpt.save_checkpoint(tiny_state(model={}, tokenizer=text), tmp_path / name / "model.pt")
    sources = [InitSource.load(str(tmp_path / name / "model.pt"), tmp_path / "cache") for name in "ab"]
    assert [source.tokenizer_path.read_text(encoding="utf-8") for source in sources] == texts


def test_a_truncated_checkpoint_is_still_called_truncated_or_corrupt(tmp_path):
    file = saved(tmp_path / ckpt.step_filename(3), 3)
    file.write_bytes(file.read_bytes()[:100])
    message = f"{file}: not a readable checkpoint (truncated or corrupt?): not a torch.save archive"
    for load in (ckpt.load_checkpoint, ckpt.load_model):
        with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
            load(file)


def test_a_saved_config_with_a_download_check_no_longer_accepted_still_loads_without_it():
    """data.sha256 'see-release-notes' or data.size_bytes 0 were accepted before 2026-12-06 and read only by
    a download: the checkpoints of such a run load (generate, eval, resume), the unread value dropped."""
    from tinyattn.config import config_from_dict, config_to_dict

    saved = config_to_dict(config_from_dict({"data": {"files": ["x.txt"]}}))
    sha = "ab" * 32
    saved["data"].update(sha256="see-release-notes", size_bytes=0)
    config = ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt"))
    assert (config.data.sha256, config.data.size_bytes) == (None, None)
    saved["data"].update(sha256=sha, size_bytes=1000)  # a valid pair is kept as it is
    config = ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt"))
    assert (config.data.sha256, config.data.size_bytes) == (sha, 1000)


@pytest.mark.parametrize("files", [["model.safetensors", "tokenizer.json"], ["model.safetensors.index.json"]],
                         ids=["weights-and-tokenizer", "sharded"])
def test_a_hugging_face_folder_without_config_json_is_named_so_not_called_an_empty_run_folder(
        tmp_path, files):
    # Was "run folder holds no checkpoint (step_*.pt or best.pt)": true, and no help to fix it.
    folder = tmp_path / "SmolLM2"
    folder.mkdir()
    for name in files:
        (folder / name).write_bytes(b"{}")
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(folder)
    assert str(refused.value) == (
        f"{folder}: looks like a Hugging Face folder ({', '.join(files)}) but has no config.json, which "
        "tinyattn needs to read it; copy the model's config.json into it (a run folder holds step_*.pt or "
        "best.pt)")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"run folder holds no checkpoint \(step_\*\.pt or best\.pt\)$"):
        ckpt.resolve_checkpoint(tmp_path / "empty")


def test_a_run_folder_before_its_first_checkpoint_is_called_a_run_folder_not_a_hugging_face_one(tmp_path):
    # A run writes config.yaml and tokenizer.json before its first step: a run killed (or still
    # running) before its first checkpoint was told to copy a Hugging Face config.json into it.
    run = tmp_path / "early"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    (run / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"run folder holds no checkpoint \(step_\*\.pt or best\.pt\)$"):
        ckpt.resolve_checkpoint(run)
    (run / "config.yaml").unlink()  # a tokenizer alone is no Hugging Face model either
    with pytest.raises(CheckpointError, match=r"run folder holds no checkpoint \(step_\*\.pt or best\.pt\)$"):
        ckpt.resolve_checkpoint(run)


def test_a_folder_of_runs_given_as_the_checkpoint_names_its_runs_not_called_an_empty_run_folder(tmp_path):
    # `--checkpoint checkpoints` (train.out_dir, not a run in it) was "checkpoints: run folder holds no
    # checkpoint (step_*.pt or best.pt)": no run folder was named, and none of the runs it holds.
    older, newer = tmp_path / "b-older", tmp_path / "a-newer"
    saved(older / ckpt.step_filename(500), 500)
    saved(newer / ckpt.BEST, 10)
    os.utime(older / ckpt.step_filename(500), (1_000_000, 1_000_000))
    (tmp_path / "lab").mkdir()  # a folder without checkpoints is no run
    for prefer in ("best", "latest"):
        with pytest.raises(CheckpointError) as refused:
            ckpt.resolve_checkpoint(tmp_path, prefer=prefer)
        assert str(refused.value) == (
            f"{tmp_path}: a folder of runs, not a run folder (it holds a-newer, b-older); give one of them, "
            f"e.g. the most recent: {newer}")


def test_a_folder_of_hugging_face_folders_given_as_the_checkpoint_names_them(tmp_path):
    # `--checkpoint models` (where the README puts models/SmolLM2-135M) was "models: run folder holds
    # no checkpoint (step_*.pt or best.pt)": called a run folder, and no model in it was named.
    for name in ("SmolLM2-135M", "exported"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()  # a folder without config.json is no model
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: a folder of Hugging Face model folders, not one (it holds SmolLM2-135M, exported); "
        f"give one of them, e.g. {tmp_path / 'SmolLM2-135M'}")


def test_resuming_a_hugging_face_folder_or_a_folder_of_them_says_to_start_a_run_from_it(tmp_path):
    # `train --resume models` was told "give one of them, e.g. models/SmolLM2-135M", which --resume
    # then refused as "looks like a Hugging Face folder ... but has no config.json": it has one.
    model = tmp_path / "SmolLM2-135M"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    advice = f"to train from its weights, start a run with --set train.init_from={model}"
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(tmp_path, prefer="latest")
    assert str(refused.value) == (
        f"{tmp_path}: a folder of Hugging Face model folders (it holds SmolLM2-135M), none of them a run "
        f"to resume; {advice.replace('its weights', 'one')}")
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(model, prefer="latest")
    assert str(refused.value) == (f"{model}: a Hugging Face folder, not a run folder (step_*.pt or best.pt) "
                                  f"to resume; {advice}")


def test_a_folder_of_runs_holding_a_folder_the_user_may_not_read_is_one_line(tmp_path, monkeypatch):
    # `--checkpoint /mnt/data` (its lost+found is root's, mode 700): looking for runs in it stat()ed
    # lost+found/best.pt, a PermissionError traceback where the line was "run folder holds no checkpoint".
    (tmp_path / "lost+found").mkdir()
    is_file = Path.is_file

    def unreadable(path):  # what a user who is not root meets there (the tests may run as root)
        if path.parent.name == "lost+found":
            raise PermissionError(13, "Permission denied", str(path))
        return is_file(path)

    monkeypatch.setattr(Path, "is_file", unreadable)
    with pytest.raises(CheckpointError, match=r"run folder holds no checkpoint \(step_\*\.pt or best\.pt\)$"):
        ckpt.resolve_checkpoint(tmp_path)
    saved(tmp_path / "run" / ckpt.BEST, 10)
    with pytest.raises(CheckpointError, match=r"\(it holds run\); give one of them, e\.g\. the most recent"):
        ckpt.resolve_checkpoint(tmp_path)
    assert ckpt.latest_run(tmp_path) == tmp_path / "run"


def test_a_link_among_the_runs_into_a_folder_the_user_may_not_enter_is_passed_over(tmp_path, monkeypatch):
    # checkpoints/shared-run -> another user's run (mode 700 above it): is_dir() of the link raised
    # PermissionError before the check for checkpoints that passes over such folders, a traceback for
    # `tinyattn generate` (the most recent run) and for `--checkpoint checkpoints`.
    run = saved(tmp_path / "runs" / "mine" / ckpt.BEST, 10).parent
    (tmp_path / "runs" / "shared-run").mkdir()
    is_dir = Path.is_dir

    def unreachable(path):  # what a user who is not root meets there (the tests may run as root)
        if path.name == "shared-run":
            raise PermissionError(13, "Permission denied", str(path))
        return is_dir(path)

    monkeypatch.setattr(Path, "is_dir", unreachable)
    assert ckpt.resolve_checkpoint(None, out_dir=tmp_path / "runs") == run / ckpt.BEST
    with pytest.raises(CheckpointError, match=r"\(it holds mine\); give one of them"):
        ckpt.resolve_checkpoint(tmp_path / "runs")


def test_a_damaged_best_pt_named_as_a_file_names_the_newest_step_that_verifies_not_a_damaged_newer_one(
        tmp_path):
    good, newer = saved(tmp_path / ckpt.step_filename(10), 10), saved(tmp_path / ckpt.step_filename(20), 20)
    best = saved(tmp_path / ckpt.BEST, 20)
    for damaged in (newer, best):
        damaged.write_bytes(damaged.read_bytes()[:100])  # cut short: fails verification
    assert ckpt.newest_verified(tmp_path) == good
    with pytest.raises(CheckpointError, match=f"the newest checkpoint in {re.escape(str(tmp_path))} that "
                                              f"verifies is {good.name}: use --checkpoint "):
        ckpt.load_model(best)
    # a damaged step checkpoint named as a file is no best.pt: no advice to take another step instead
    with pytest.raises(CheckpointError, match=r"not a torch\.save archive$"):
        ckpt.load_model(newer)


def test_a_safetensors_file_of_a_header_alone_is_named_a_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    file = tmp_path / "empty.safetensors"
    save_file({}, str(file), metadata={"format": "pt"})  # no tensors: the file ends where its header does
    assert ckpt.file_format(file) == "safetensors"
    with pytest.raises(CheckpointError, match=r"a safetensors file \(weights alone\), not a tinyattn "
                                              r"checkpoint$"):
        ckpt.load_checkpoint(file)


def test_a_config_saved_before_train_show_shows_what_such_a_run_showed_with_or_without_a_probe_text():
    from tinyattn.config import config_from_dict, config_to_dict

    saved = config_to_dict(config_from_dict({"data": {"files": ["x.txt"]}}))
    del saved["train"]["show"]  # a run saved before train.show existed
    without = ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt"))
    assert (without.train.show, without.train.probe_text) == (["sample", "loss_by_position"], "")
    saved["train"]["probe_text"] = "ROMEO:"
    probed = ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt"))
    assert probed.train.show == ["sample", "loss_by_position", "attention", "head_ablation"]
    del saved["train"]["muon_split_stacked"]  # saved before it existed: each stacked weight whole
    older = ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt"))
    assert older.train.muon_split_stacked is False


def test_a_loaded_model_carries_its_counters_and_writes_beside_itself_named_by_its_run_folder(
        tmp_path, char_tokenizer, monkeypatch):
    from tinyattn.config import Config, DataConfig, ModelConfig, config_to_dict
    from tinyattn.model.transformer import LanguageModel

    config = Config(model=ModelConfig(vocab_size=char_tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=8), data=DataConfig(files=["a.txt"]))
    run = tmp_path / "shakespeare-run"
    state = {"config": config_to_dict(config), "model": LanguageModel(config.model).state_dict(),
             "tokenizer": char_tokenizer.to_json(), "step": 7, "tokens_seen": 896, "best_val_loss": 2.5,
             "data": {"train": {"checksum": "ab"}}}
    for name in (ckpt.BEST, ckpt.step_filename(7)):
        run.mkdir(exist_ok=True)
        ckpt.save_checkpoint(state, run / name)
    monkeypatch.chdir(run)
    loaded = ckpt.load_model(".")  # Path(".").name is ''
    assert (loaded.tokens_seen, loaded.best_val_loss) == (896, 2.5)
    assert loaded.data == {"train": {"checksum": "ab"}}
    assert loaded.name == "shakespeare-run"
    assert loaded.default_output("attention.png") == Path("attention.png")  # in the run folder
    step = ckpt.load_model(run / ckpt.step_filename(7))
    assert step.default_output("attention.png") == run / "attention_step_0000007.png"


@pytest.mark.parametrize("version", [0, None, "1"])
def test_a_checkpoint_of_an_older_or_no_format_version_is_refused_naming_it(tmp_path, version):
    file = tmp_path / "old.pt"
    torch.save({"format": ckpt.FORMAT, "format_version": version, "step": 1}, file)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(file))}: checkpoint format version {version} "
                                              r"is not supported by this tinyattn \(it reads version 1\)$"):
        ckpt.load_checkpoint(file)


def test_a_folder_of_five_runs_names_all_five_and_of_six_names_five_and_one_more(tmp_path):
    for n in range(5):
        saved(tmp_path / f"run{n}" / ckpt.BEST, n)
    with pytest.raises(CheckpointError, match=r"\(it holds run0, run1, run2, run3, run4\); give one"):
        ckpt.resolve_checkpoint(tmp_path)
    saved(tmp_path / "run5" / ckpt.BEST, 5)
    with pytest.raises(CheckpointError, match=r"\(it holds run0, run1, run2, run3, run4 and 1 more\); give"):
        ckpt.resolve_checkpoint(tmp_path)


def test_a_checkpoint_whose_stored_bytes_were_changed_fails_its_crc_check(tmp_path):
    path = tmp_path / "step.pt"
    ckpt.save_checkpoint({"step": 1, "weights": torch.arange(64.0)}, path)
    data = bytearray(path.read_bytes())
    at = data.index(torch.arange(64.0).numpy().tobytes())  # the tensor's bytes, stored uncompressed
    data[at + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    assert re.fullmatch(r".*/data/0 fails its CRC-32 check \(the file was changed after it was written\)",
                        ckpt.verify_checkpoint(path))
    with pytest.raises(CheckpointError, match=r"not a readable checkpoint \(truncated or corrupt\?\): .*CRC"):
        ckpt.load_checkpoint(path)


def test_a_run_folders_best_pt_is_read_for_its_crc_check_once_when_loaded(trained_run, tmp_path, monkeypatch):
    # the folder's best.pt was checked to step past a damaged one, then again by load_checkpoint
    import zipfile

    from tinyattn.train.finetune import InitSource

    checked = []
    testzip = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip", lambda archive: checked.append(archive.filename)
                        or testzip(archive))
    best = str(trained_run.run_dir / ckpt.BEST)
    ckpt.load_model(trained_run.run_dir)
    assert checked == [best]
    checked.clear()
    InitSource.load(str(trained_run.run_dir), tmp_path)  # train.init_from
    assert checked == [best]
    checked.clear()
    ckpt.load_model(best)  # the file named: checked by load_checkpoint
    assert checked == [best]


def test_only_a_file_starting_as_gguf_or_safetensors_does_is_called_one(tmp_path):
    assert ckpt.file_format(gguf_file(tmp_path / "a.gguf")) == "gguf"
    (tmp_path / "ggux").write_bytes(b"GGUX" + bytes(20))
    assert ckpt.file_format(tmp_path / "ggux") is None
    assert ckpt.file_format(safetensors_file(tmp_path / "w.safetensors")) == "safetensors"
    # 8 bytes and "{" as a safetensors header starts, but a header longer than the file: not one
    (tmp_path / "short").write_bytes((1000).to_bytes(8, "little") + b'{"a": 1}')
    assert ckpt.file_format(tmp_path / "short") is None


def test_the_newest_verified_checkpoint_is_the_highest_step_and_best_pt_only_the_last_resort(tmp_path):
    saved(tmp_path / ckpt.BEST, 5)
    step = saved(tmp_path / ckpt.step_filename(10), 10)
    assert ckpt.newest_verified(tmp_path) == step
    step.write_bytes(step.read_bytes()[:100])
    assert ckpt.newest_verified(tmp_path) == tmp_path / ckpt.BEST


def test_pruning_with_keep_last_below_one_still_keeps_the_newest_step(tmp_path):
    for step in (1, 2, 3):
        saved(tmp_path / ckpt.step_filename(step), step)
    ckpt.prune_checkpoints(tmp_path, 0)
    assert ckpt.step_checkpoints(tmp_path) == [tmp_path / ckpt.step_filename(3)]


def test_a_run_whose_best_pt_was_written_last_is_the_most_recent(tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    saved(one / ckpt.step_filename(10), 10)
    saved(one / ckpt.BEST, 10)
    saved(other / ckpt.step_filename(10), 10)
    os.utime(one / ckpt.step_filename(10), (1_000_000, 1_000_000))
    os.utime(other / ckpt.step_filename(10), (2_000_000, 2_000_000))
    os.utime(one / ckpt.BEST, (3_000_000, 3_000_000))  # a later evaluation's best, after other's save
    assert ckpt.latest_run(tmp_path) == one


def test_a_source_tokenizer_record_that_is_not_a_mapping_is_none():
    assert ckpt.source_tokenizer({ckpt.SOURCE_TOKENIZER: "char"}) is None
    assert ckpt.source_tokenizer({ckpt.SOURCE_TOKENIZER: {"kind": "bpe", "vocab_size": 300, "extra": 1}}
                                 ) == ckpt.TokenizerConfig(kind="bpe", vocab_size=300)


def test_no_config_a_tokenizer_not_text_or_weights_not_a_mapping_is_one_line_naming_the_file(tmp_path):
    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    file = tmp_path / "odd.pt"
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(file))}: its saved config cannot be used: "):
        ckpt.config_from_checkpoint({"step": 1}, file)
    with pytest.raises(CheckpointError, match=r"odd\.pt: holds no tokenizer "):
        ckpt.saved_tokenizer({"tokenizer": {"model": "char"}}, file)
    model = LanguageModel(ModelConfig(vocab_size=12, n_layer=1, n_head=2, n_embd=16, context_length=8))
    with pytest.raises(CheckpointError, match=r"^.*odd\.pt: holds no model weights$"):
        ckpt.load_weights(model, {"model": [1, 2]}, file)


def test_load_model_of_a_hugging_face_folder_says_which_loader_reads_it(tmp_path):
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(tmp_path))} is a Hugging Face folder, not a "
                                              r"tinyattn checkpoint: load it with .*load_any_model$"):
        ckpt.load_model(tmp_path)


def test_a_file_whose_header_length_fits_but_whose_header_is_not_json_is_not_called_safetensors(tmp_path):
    (tmp_path / "eight").write_bytes((4).to_bytes(8, "little") + b"[1] " + bytes(8))
    assert ckpt.file_format(tmp_path / "eight") is None
    (tmp_path / "json").write_bytes((4).to_bytes(8, "little") + b"{}  " + bytes(8))
    assert ckpt.file_format(tmp_path / "json") == "safetensors"


def test_a_value_read_from_a_checkpoint_that_fails_its_crc_check_is_none(tmp_path):
    """Bit rot in a checkpoint's weights leaves its plain values readable; the step or loss of
    one that fails its CRC check is no model's, so a resume never takes it (verified_value)."""
    path = tmp_path / ckpt.BEST
    ckpt.save_checkpoint({"step": 7, "weights": torch.arange(64.0)}, path)
    assert ckpt.verified_value(path, "step") == 7
    data = bytearray(path.read_bytes())
    data[data.index(torch.arange(64.0).numpy().tobytes()) + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    assert ckpt.saved_value(path, "step") == 7 and ckpt.verified_value(path, "step") is None
    assert ckpt.verified_value(tmp_path / "missing.pt", "step") is None


def test_a_config_saved_with_train_show_keeps_what_it_chose():
    from tinyattn.config import config_from_dict, config_to_dict

    saved = config_to_dict(config_from_dict({"data": {"files": ["x.txt"]}, "train": {"show": ["sample"]}}))
    assert ckpt.config_from_checkpoint({"config": saved}, Path("run/best.pt")).train.show == ["sample"]


def test_a_run_folder_with_an_export_s_weights_beside_its_config_yaml_is_still_called_a_run_folder(tmp_path):
    """Weights make a folder without checkpoints look like a Hugging Face one only without a run's
    config.yaml: a run folder an export wrote model.safetensors into is told to have no checkpoint."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    (run / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"run folder holds no checkpoint \(step_\*\.pt or best\.pt\)$"):
        ckpt.resolve_checkpoint(run)


def test_a_loaded_model_s_tokenizer_ends_texts_with_the_saved_tokenizer_end_of_text(tmp_path):
    """A run on a pretrained tokenizer whose text ends at "</s>" (tokenizer.end_of_text) samples
    until "</s>" after loading too: the saved config's end_of_text reaches the loaded tokenizer."""
    from tests.conftest import llama_like_byte_fallback_tokenizer
    from tinyattn.config import Config, DataConfig, ModelConfig, TokenizerConfig, config_to_dict
    from tinyattn.model.transformer import LanguageModel

    tokenizer = llama_like_byte_fallback_tokenizer()
    config = Config(model=ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=8),
                    data=DataConfig(files=["a.txt"]),
                    tokenizer=TokenizerConfig(kind="pretrained", path="tokenizer.json", end_of_text="</s>"))
    ckpt.save_checkpoint({"config": config_to_dict(config), "model": LanguageModel(config.model).state_dict(),
                          "tokenizer": tokenizer.to_json(), "step": 1}, tmp_path / ckpt.BEST)
    loaded = ckpt.load_model(tmp_path).tokenizer
    assert loaded.end_of_text == "</s>" and loaded.eot_id == tokenizer.eot_id == 2


@pytest.mark.parametrize("prefer", ["best", "latest"])
def test_a_checkpoint_path_that_does_not_exist_is_one_line_naming_it(tmp_path, prefer):
    """--resume nowhere reaches resolve_checkpoint with the path as given: named, not a traceback
    from looking into a folder that is not there."""
    with pytest.raises(CheckpointError, match=r"nowhere: no such checkpoint file or run folder$"):
        ckpt.resolve_checkpoint(tmp_path / "nowhere", prefer=prefer)


@pytest.mark.parametrize("prefer", ["best", "latest"])
def test_a_step_file_that_is_not_there_names_the_checkpoints_its_folder_holds(tmp_path, prefer):
    """--resume run/step_0000002.pt after train.keep_last pruned it: the error names what the run
    folder holds instead, best.pt and then the newest steps first, without a traceback."""
    for name in (ckpt.BEST, *(ckpt.step_filename(step) for step in range(10, 80, 10))):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(tmp_path / ckpt.step_filename(2), prefer=prefer)
    assert str(refused.value) == (
        f"{tmp_path / ckpt.step_filename(2)}: no such checkpoint file or run folder; {tmp_path} holds "
        f"best.pt, {ckpt.step_filename(70)}, {ckpt.step_filename(60)}, {ckpt.step_filename(50)}, "
        f"{ckpt.step_filename(40)} and 3 more")


def test_a_step_file_not_there_named_from_inside_its_run_folder_names_that_folder_in_words(tmp_path,
                                                                                             monkeypatch):
    (tmp_path / ckpt.BEST).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        ckpt.resolve_checkpoint(Path(ckpt.step_filename(2)))
    assert str(refused.value) == (f"{ckpt.step_filename(2)}: no such checkpoint file or run folder; "
                                  "the folder run from holds best.pt")


def test_loading_a_checkpoint_file_that_is_not_there_is_one_line_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match=r"gone\.pt: checkpoint file not found$"):
        ckpt.load_checkpoint(tmp_path / "gone.pt")


def test_the_most_recent_run_under_an_out_dir_that_is_not_there_is_none_and_said_so(tmp_path):
    assert ckpt.latest_run(tmp_path / "nowhere") is None
    with pytest.raises(CheckpointError, match=r"^no checkpoints under .*nowhere/; train a model first"):
        ckpt.resolve_checkpoint(None, tmp_path / "nowhere")


def test_a_snapshot_saved_to_two_files_is_pickled_once_and_both_hold_the_same_bytes(tmp_path, monkeypatch):
    pickled = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: pickled.append(obj["step"]) or real_save(obj, f))
    state = ckpt.Snapshot({"step": 6, "weights": torch.arange(64.0)})
    ckpt.save_checkpoint(state, tmp_path / ckpt.BEST)
    ckpt.save_checkpoint(state, tmp_path / ckpt.step_filename(6))
    assert pickled == [6]
    assert (tmp_path / ckpt.BEST).read_bytes() == (tmp_path / ckpt.step_filename(6)).read_bytes()
    loaded = ckpt.load_checkpoint(tmp_path / ckpt.step_filename(6))
    assert loaded["step"] == 6 and torch.equal(loaded["weights"], torch.arange(64.0))
    with pytest.raises(TypeError):
        state["step"] = 7  # read-only: every file it is saved to holds the same state


def test_a_snapshot_whose_first_file_is_gone_is_pickled_again(tmp_path):
    state = ckpt.Snapshot({"step": 3})
    ckpt.save_checkpoint(state, tmp_path / ckpt.BEST)
    (tmp_path / ckpt.BEST).unlink()
    ckpt.save_checkpoint(state, tmp_path / ckpt.step_filename(3))
    assert ckpt.load_checkpoint(tmp_path / ckpt.step_filename(3))["step"] == 3
