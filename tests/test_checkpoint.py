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


def test_the_most_recent_run_is_the_one_whose_newest_checkpoint_was_written_last(tmp_path):
    older, newer = tmp_path / "b-older", tmp_path / "a-newer"  # names that sort the other way
    saved(older / ckpt.step_filename(500), 500)
    saved(newer / ckpt.step_filename(10), 10)
    os.utime(older / ckpt.step_filename(500), (1_000_000, 1_000_000))
    os.utime(newer / ckpt.step_filename(10), (2_000_000, 2_000_000))
    assert ckpt.latest_run(tmp_path) == newer
    assert ckpt.resolve_checkpoint(None, tmp_path) == newer / ckpt.step_filename(10)


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
