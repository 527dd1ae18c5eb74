"""Behaviour of the data layer that a mutation sweep found no test pinning: batch sampling's seeds
and ranks, the token cache's failed builds and empty documents, the tokenizer's start token, its
bound on the characters a token reads and its cuts, and how data.files are named."""

from pathlib import Path

import numpy as np
import pytest
import torch

import tinyattn.data.token_cache as token_cache
from tinyattn.config import TokenizerConfig, config_from_dict
from tinyattn.data.batches import BatchSampler, prepare_data
from tinyattn.data.local_files import format_suffix, resolve_files
from tinyattn.data.tokenizer import END_OF_TEXT, Tokenizer, build_tokenizer
from tinyattn.errors import DataError

DOCUMENTS = [f"Document {i}: lorem ipsum dolor sit amet, the end of {i}.\n" for i in range(20)]


def text_folder(folder):
    folder.mkdir(parents=True)
    for i, text in enumerate(DOCUMENTS):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


def folder_config(tmp_path, tokenizer=None):
    return config_from_dict({
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8},
        "data": {"cache_dir": str(tmp_path / "cache"), "files": [str(tmp_path / "books")]},
        "tokenizer": tokenizer or {"kind": "char"},
    })


def counting_tokens(n=1000):
    return np.arange(n, dtype=np.uint16)  # token i at position i: a window shows where it came from


@pytest.mark.parametrize("rank", [2, -1])
def test_a_rank_outside_the_world_is_refused(rank):
    with pytest.raises(ValueError, match=f"rank {rank} is outside 0..1"):
        BatchSampler(counting_tokens(), 4, 8, seed=0, rank=rank, world_size=2)


@pytest.mark.parametrize("sampling", ["random", "passes"])
def test_a_negative_seed_draws_other_windows_than_its_positive_twin(sampling):
    def draw(seed):
        sampler = BatchSampler(counting_tokens(), 4, 8, seed=seed, sampling=sampling)
        return [sampler.next_batch()[0] for _ in range(3)]

    assert not all(torch.equal(a, b) for a, b in zip(draw(-1), draw(1)))


def test_a_failed_build_deletes_its_lock_file_beside_the_cache_folder(tmp_path):
    text_folder(tmp_path / "books")
    with pytest.raises(DataError, match="too small"):
        prepare_data(folder_config(tmp_path, {"kind": "bpe", "vocab_size": 200}), progress=False)
    assert list((tmp_path / "cache").iterdir()) == []  # no folder, no .<folder>.build.filelock


def test_a_failed_rebuild_of_a_damaged_cache_leaves_none_of_its_files(tmp_path, monkeypatch):
    text_folder(tmp_path / "books")
    config = folder_config(tmp_path)
    cache = prepare_data(config, progress=False).cache_dir
    size = (cache / "train.bin").stat().st_size
    (cache / "train.bin").write_bytes(bytes(size))  # changed in place: meta.json is there, the checksum fails

    def failing(*args, **kwargs):
        raise DataError("the disk filled")

    monkeypatch.setattr(token_cache, "write_tokens", failing)
    with pytest.raises(DataError, match="the disk filled"):
        prepare_data(config, progress=False)
    assert not cache.exists()  # meta.json went first, then the damaged files, then the empty folder


def test_a_template_that_puts_the_end_of_text_first_adds_nothing_unless_a_start_of_text_is_given():
    # Training encodes documents without the file's template; a prompt read with no start_of_text
    # named (tokenizer.kind: pretrained) must get no token before it either.
    from tokenizers import processors

    char = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abc"]))
    backend = char._backend
    backend.post_processor = processors.TemplateProcessing(
        single=f"{END_OF_TEXT} $A", special_tokens=[(END_OF_TEXT, char.eot_id)])
    plain = Tokenizer.from_json(backend.to_str())
    assert plain.template_start() == END_OF_TEXT
    assert (plain.adds_start, plain.text_start) == (False, [])
    named = Tokenizer.from_json(backend.to_str(), start_of_text=END_OF_TEXT)
    assert (named.adds_start, named.text_start) == (True, [char.eot_id])


def test_an_empty_document_is_counted_and_set_off_by_its_end_of_text():
    import io

    char = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["ab"]))
    out = io.BytesIO()
    tokens, documents = token_cache.write_tokens(iter([("a", True), ("", True), ("b", True)]), char, out,
                                                 np.uint16)
    eot, a, b = char.eot_id, *char.encode("ab")
    assert (tokens, documents) == (4, 3)
    assert np.frombuffer(out.getvalue(), dtype=np.uint16).tolist() == [a, eot, eot, b]


def test_a_bpe_token_longer_than_the_end_of_text_bounds_the_characters_a_token_reads():
    word = "abcdefghijklmnopqrstuvwxyz"  # merged into one token of 26 characters
    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter([f"{word}\n" * 50]))
    assert len(bpe.encode(word)) == 1
    assert bpe.max_token_chars >= len(word)  # a 26-character text can be one token: the bound must allow it


def test_a_newline_just_at_the_middle_of_a_piece_is_a_safe_cut():
    # `_safe_cut` looks in (low, high]: a newline at low puts the cut at low + 1, inside that range, and
    # a cut inside the word after it could change its tokens.
    from tinyattn.data.tokenizer import text_pieces

    assert list(text_pieces("aaaaa\n" + "b" * 20, max_chars=10)) == ["aaaaa\n", "b" * 10, "b" * 10]


def test_a_file_given_twice_keeps_the_name_it_was_first_given(tmp_path):
    # The Hugging Face cache's snapshots/<rev>/train.jsonl links to blobs/<hash>, a name with no extension.
    blob = tmp_path / "blobs" / "0a1b2c"
    blob.parent.mkdir()
    blob.write_text('{"text": "a"}\n', encoding="utf-8")
    link = tmp_path / "snapshots" / "train.jsonl"
    link.parent.mkdir()
    link.symlink_to(blob)
    assert resolve_files([str(link), str(blob)], "auto") == [link.absolute()]


def test_a_compressed_files_format_is_named_by_its_inner_extension_in_any_case():
    assert format_suffix(Path("shard.JSONL.GZ")) == format_suffix(Path("shard.jsonl.gz")) == ".jsonl"


def test_the_unknown_characters_warning_names_the_first_ten_and_says_there_are_more(tmp_path, capsys):
    char = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["".join(DOCUMENTS)]))
    char.save(tmp_path / "tokenizer.json")
    unseen = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # capitals but the D its corpus has: 25 never seen
    text_folder(tmp_path / "books")
    (tmp_path / "books" / "doc00.txt").write_text(f"{unseen}\n{DOCUMENTS[0]}", encoding="utf-8")
    config = folder_config(tmp_path, {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")})
    prepare_data(config, progress=False)
    warning = capsys.readouterr().err
    named = ", ".join(repr(c) for c in unseen.replace("D", "")[:10])
    assert f"has never seen {named}, ...; the model trains on [UNK]" in warning, warning


def test_an_unknown_share_below_a_tenth_of_a_percent_is_said_so_not_rounded_to_nothing(tmp_path, capsys):
    char = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["".join(DOCUMENTS)]))
    char.save(tmp_path / "tokenizer.json")
    text_folder(tmp_path / "books")
    (tmp_path / "books" / "doc00.txt").write_text("Z" + DOCUMENTS[0] * 40, encoding="utf-8")  # Z: never seen
    config = folder_config(tmp_path, {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")})
    prepare_data(config, progress=False)
    warning = capsys.readouterr().err
    assert warning.startswith("warning: under 0.1% of the training split's tokens are [UNK] (1 of "), warning
