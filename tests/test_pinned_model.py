"""Behaviour of the model and of the Hugging Face mapping that a mutation sweep found no test pinning."""

import json

import pytest

from tinyattn.config import Config, SampleConfig, TokenizerConfig
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.errors import CheckpointError
from tinyattn.hf.folder import export_folder, load_any_model
from tinyattn.model.transformer import evaluation_mode


def test_the_parameter_count_without_the_embedding_leaves_out_its_matrix_once(tiny_model):
    for tied in (True, False):
        model = tiny_model(tie_embeddings=tied)
        embedding = model.token_embedding.weight.numel()
        assert model.num_parameters(exclude_embedding=True) == model.num_parameters() - embedding


def test_evaluation_mode_gives_back_the_mode_the_model_was_in(tiny_model):
    model = tiny_model()
    for before in (False, True):
        model.train(before)
        with evaluation_mode(model):
            assert not model.training and not model.blocks[0].training
        assert model.training == model.blocks[0].training == before


def test_a_folder_whose_config_json_omits_tie_word_embeddings_loads_its_own_head_without_a_note(
        tmp_path, tiny_model, capsys):
    # Without the field, a stored lm_head.weight means an untied head: no note that config.json calls it tied.
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["hello, world\n"]))
    model = tiny_model(vocab_size=tokenizer.vocab_size, tie_embeddings=False)
    export_folder(model.state_dict(), Config(model=model.config), tokenizer, tmp_path / "out")
    path = tmp_path / "out" / "config.json"
    raw = json.loads(path.read_text())
    del raw["tie_word_embeddings"]
    path.write_text(json.dumps(raw))
    capsys.readouterr()
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.tie_embeddings is False
    assert capsys.readouterr().err == ""


def test_a_folder_whose_vocab_size_is_one_below_its_tokenizers_is_refused(tmp_path, tiny_model):
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["hello, world\n"]))
    model = tiny_model(vocab_size=tokenizer.vocab_size - 1)  # no embedding row for the last id
    export_folder(model.state_dict(), Config(model=model.config), tokenizer, tmp_path / "out")
    with pytest.raises(CheckpointError, match=f"vocab_size {tokenizer.vocab_size - 1} is smaller than"):
        load_any_model(tmp_path / "out")


def test_an_export_samples_at_a_low_temperature_and_is_greedy_only_at_zero(tmp_path, tiny_model):
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["hello, world\n"]))
    model = tiny_model(vocab_size=tokenizer.vocab_size)
    for temperature, sampled in ((0.3, True), (0.0, False)):
        config = Config(model=model.config, sample=SampleConfig(temperature=temperature))
        export_folder(model.state_dict(), config, tokenizer, tmp_path / "out", force=True)
        written = json.loads((tmp_path / "out" / "generation_config.json").read_text())
        assert written["do_sample"] is sampled
        assert written.get("temperature") == (temperature if sampled else None)
