"""Issue 23, "silently wrong": repeated --set flags, duplicate YAML keys, data that changed under a
run (the token cache's key, the data a run records, resume and eval on changed data) and a
config.yaml edited before a resume."""

import pytest

from tinyattn.cli.train import parser as train_parser


def test_repeated_set_flags_accumulate():
    args = train_parser().parse_args(["--config", "c.yaml", "--set", "model.n_layer=3", "--set",
                                      "train.max_steps=4", "train.lr=0.1"])
    assert args.overrides == ["model.n_layer=3", "train.max_steps=4", "train.lr=0.1"]
