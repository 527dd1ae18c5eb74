"""Tokenizers: exact round trips for every kind, stable ids, [UNK], <|endoftext|>, saving and
loading, safe cut points for long texts, and the errors a user can hit."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np
import pytest
import tokenizers
import torch

from tests.conftest import ROOT, llama_like_byte_fallback_tokenizer
from tinyattn.config import TokenizerConfig
from tinyattn.data.tokenizer import (END_OF_TEXT, Tokenizer, build_tokenizer, text_pieces,
                                     unused_tokenizer_options)
from tinyattn.errors import DataError

TRAINING = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
            "All:\nSpeak, speak.\n\tIndented line;  two  spaces.\n"
            "The quick brown fox jumps over the lazy dog! 0123456789?\n") * 20
HARD = ("naïve café, 東京 and 北京, emoji 😀👍🏽 and a family 👨‍👩‍👧, combining e\u0301 a\u0308,"
        " arabic مرحبا, tabs\tand\r\nwindows lines, NUL \x00, private use \ue000, [UNK] written out.\n")


def texts_of(*texts):
    return lambda: iter(texts)


@pytest.fixture(scope="module")
def char_tokenizer():
    return build_tokenizer(TokenizerConfig(kind="char"), texts_of(TRAINING))


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts_of(TRAINING))


# ----------------------------------------------------------------------------- char


def test_char_ids_follow_sorted_characters_then_specials(char_tokenizer):
    characters = sorted(set(TRAINING))
    assert char_tokenizer.vocab_size == len(characters) + 2  # + [UNK] + <|endoftext|>
    assert char_tokenizer.encode("".join(characters)) == list(range(len(characters)))
    assert char_tokenizer.eot_id == len(characters) + 1
    again = build_tokenizer(TokenizerConfig(kind="char"), texts_of(TRAINING[::-1]))
    assert again.to_json() == char_tokenizer.to_json()  # order of the text does not matter


def test_char_round_trip_keeps_every_space_and_newline(char_tokenizer):
    for text in (TRAINING, " leading", "trailing  \n\n", "\n", "", "a  b\t\tc\n \n"):
        ids = char_tokenizer.encode(text)
        assert len(ids) == len(text)  # one token per character
        assert char_tokenizer.decode(ids) == text


def test_char_unknown_character_is_unk_and_decodes_to_replacement(char_tokenizer):
    ids = char_tokenizer.encode("hé!")
    unk = ids[1]
    assert unk not in char_tokenizer.encode(TRAINING)
    assert char_tokenizer.encode("😀") == [unk]  # one unknown code point, one [UNK]
    assert char_tokenizer.decode(ids) == "h\ufffd!"
    assert char_tokenizer.token_text(unk) == "\ufffd"


def test_the_unknown_characters_note_names_the_first_ten_in_order_and_marks_the_rest(char_tokenizer):
    from tinyattn.data.tokenizer import unknown_characters_note

    unseen = "éàáâãäåæçèêë"  # none in TRAINING; é is met again below, and named once
    for count in (10, 12):
        text = "hé " + unseen[:count] + " é"
        note = unknown_characters_note(char_tokenizer, text, char_tokenizer.encode(text), "scored")
        named = ", ".join(repr(c) for c in unseen[:10])
        assert note == (f"{count} characters the tokenizer has never seen, scored as [UNK]: {named}"
                        + (", ..." if count > 10 else ""))
    assert unknown_characters_note(char_tokenizer, "hi", char_tokenizer.encode("hi")) is None


def test_unk_written_in_the_text_stays_text():
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), texts_of("[UNK] <|endoftext|> x"))
    text = "x [UNK] x"
    assert tokenizer.decode(tokenizer.encode(text)) == text


# ----------------------------------------------------------------------------- bpe


def test_bpe_round_trips_any_unicode(bpe_tokenizer):
    for text in (TRAINING, HARD, HARD * 3, "", " ", "\n\n\n", "x" * 1000):
        assert bpe_tokenizer.decode(bpe_tokenizer.encode(text)) == text


def test_bpe_learns_merges_up_to_the_vocab_size(bpe_tokenizer):
    assert 257 < bpe_tokenizer.vocab_size <= 300
    assert len(bpe_tokenizer.encode(TRAINING)) < 0.7 * len(TRAINING.encode())  # merges happened
    assert bpe_tokenizer.eot_id == 0


@pytest.mark.parametrize("vocab_size", [1, 200, 256])
def test_bpe_vocab_too_small_is_one_line_error(vocab_size):
    with pytest.raises(DataError) as error:
        build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=vocab_size), texts_of(TRAINING))
    message = str(error.value)
    assert f"tokenizer.vocab_size={vocab_size}" in message and "257" in message
    assert "\n" not in message


@pytest.mark.parametrize("kind, noted", [("bpe", False), ("char", True), ("pretrained", True)])
def test_a_vocabulary_size_is_noted_as_without_effect_only_for_a_kind_that_builds_no_bpe(kind, noted):
    notes = unused_tokenizer_options(TokenizerConfig(kind=kind, vocab_size=300), ["tokenizer.vocab_size"])
    assert bool(notes) == noted, notes


def test_bpe_on_empty_text_is_an_error():
    with pytest.raises(DataError, match="empty"):
        build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts_of("", ""))
    with pytest.raises(DataError, match="empty"):
        build_tokenizer(TokenizerConfig(kind="char"), texts_of())


# ----------------------------------------------------------------------------- end of text


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_end_of_text_is_one_token_and_decodes_back(kind, char_tokenizer, bpe_tokenizer):
    tokenizer = char_tokenizer if kind == "char" else bpe_tokenizer
    ids = tokenizer.encode(f"Speak.{END_OF_TEXT}All:")
    assert ids.count(tokenizer.eot_id) == 1
    assert tokenizer.decode(ids) == f"Speak.{END_OF_TEXT}All:"
    assert tokenizer.token_text(tokenizer.eot_id) == END_OF_TEXT


def test_char_end_of_text_is_a_special_token_in_the_saved_file(char_tokenizer, tmp_path):
    # transformers reads an exported tokenizer.json: skip_special_tokens and stopping need the flag
    char_tokenizer.save(tmp_path / "tokenizer.json")
    spec = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert {t["content"]: t["special"] for t in spec["added_tokens"]}[END_OF_TEXT] is True
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = char_tokenizer.encode(f"Speak.{END_OF_TEXT}All:")
    assert backend.decode(ids, skip_special_tokens=True) == "Speak.All:"


# ----------------------------------------------------------------------------- saving, loading


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_json_and_file_round_trip(kind, tmp_path, char_tokenizer, bpe_tokenizer):
    tokenizer = char_tokenizer if kind == "char" else bpe_tokenizer
    rebuilt = Tokenizer.from_json(tokenizer.to_json())
    assert rebuilt.encode(HARD) == tokenizer.encode(HARD)
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.encode(HARD) == tokenizer.encode(HARD) and loaded.vocab_size == tokenizer.vocab_size
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temporary file left
    folder = tmp_path / "run"
    folder.mkdir()
    tokenizer.save(folder)  # a folder gets tokenizer.json inside it
    assert Tokenizer.from_file(folder / "tokenizer.json").to_json() == tokenizer.to_json()


def test_pretrained_loads_the_file_and_reads_no_text(tmp_path, bpe_tokenizer):
    bpe_tokenizer.save(tmp_path / "tokenizer.json")

    def no_texts():
        raise AssertionError("a pretrained tokenizer must not read the corpus")

    config = TokenizerConfig(kind="pretrained", path=str(tmp_path / "tokenizer.json"))
    loaded = build_tokenizer(config, no_texts)
    assert loaded.encode(HARD) == bpe_tokenizer.encode(HARD)


def test_special_ids_are_end_of_text_the_unknown_token_and_added_specials(char_tokenizer, bpe_tokenizer):
    unknown = char_tokenizer.encode("é")[0]  # a character the corpus never held: [UNK]
    assert char_tokenizer.special_ids == {char_tokenizer.eot_id, unknown}
    assert bpe_tokenizer.special_ids == {bpe_tokenizer.eot_id}  # byte-level: no unknown token
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1, "?": 2}, unk_token="?"))
    backend.add_special_tokens(["<s>"])  # id 3; "[UNK]" is an ordinary word here
    assert Tokenizer(backend).special_ids == {2, 3}


def test_pretrained_without_end_of_text_has_no_eot_id():
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "?": 2}, unk_token="?"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.FixedLength(length=1)
    tokenizer = Tokenizer(backend)
    assert tokenizer.eot_id is None and tokenizer.vocab_size == 3


def test_bad_tokenizer_files_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match=r"missing\.json: tokenizer file not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(DataError, match=r"bad\.json: not a valid tokenizer\.json") as error:
        Tokenizer.from_file(tmp_path / "bad.json")
    assert "\n" not in str(error.value)


def test_a_tokenizer_file_that_panics_the_rust_parser_is_a_one_line_error(tmp_path, monkeypatch, capfd):
    """tokenizers panics on some files (here a BPE whose continuing_subword_prefix its merges lack):
    pyo3's PanicException is no Exception, so it ended in a traceback; and Rust's panic hook writes
    its message (with RUST_BACKTRACE=1 a whole stack) to the terminal before Python sees it."""
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "##",
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {"a": 0, "b": 1, "ab": 2, END_OF_TEXT: 3}, "merges": [["a", "b"]]}
    path = tmp_path / "panics.json"
    path.write_text(json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                                "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
                                "post_processor": None, "decoder": None, "model": model}))
    with pytest.raises(DataError, match=r"panics\.json: not a valid tokenizer\.json \(.+\)$") as error:
        Tokenizer.from_file(path)
    assert "\n" not in str(error.value)
    assert capfd.readouterr().err == ""  # nothing but the one-line error reaches the terminal


def test_what_native_code_writes_while_a_tokenizer_loads_still_reaches_the_terminal(capfd):
    """The panic's output is held back only when loading fails: a warning written to descriptor 2
    by a load that succeeds is given back, after the lines written before it."""
    from tinyattn.data.tokenizer import _native_stderr_held
    os.write(2, b"before\n")
    with _native_stderr_held():
        os.write(2, b"a native warning\n")
    assert capfd.readouterr().err == "before\na native warning\n"


# ----------------------------------------------------------------------------- decode, labels


def test_decode_accepts_lists_arrays_and_tensors(char_tokenizer):
    ids = char_tokenizer.encode("Speak, speak.")
    expected = "Speak, speak."
    assert char_tokenizer.decode(ids) == expected
    assert char_tokenizer.decode(np.array(ids, dtype=np.uint16)) == expected
    assert char_tokenizer.decode(torch.tensor(ids)) == expected


def test_token_text_is_readable(char_tokenizer, bpe_tokenizer):
    newline = char_tokenizer.encode("\n")[0]
    assert char_tokenizer.token_text(newline) == "\\n"
    assert char_tokenizer.token_text(char_tokenizer.encode("S")[0]) == "S"
    # "é" is two bytes never merged in this training text: each token is half a character.
    halves = bpe_tokenizer.encode("é")
    assert [bpe_tokenizer.token_text(i) for i in halves] == ["\\xc3", "\\xa9"]
    word = bpe_tokenizer.encode(" speak")
    assert "".join(bpe_tokenizer.token_text(i) for i in word) == " speak"
    for control, shown in (("\x01", "\\x01"), ("\x7f", "\\x7f"), ("\t", "\\t")):  # DEL is a control too
        assert [bpe_tokenizer.token_text(i) for i in bpe_tokenizer.encode(control)] == [shown]
    with pytest.raises(ValueError):
        bpe_tokenizer.token_text(10 ** 6)


def test_sentencepiece_token_text_keeps_its_spaces_and_shows_byte_tokens_as_bytes():
    # Decoded alone, a Llama-style token lost its leading "▁" to the decoder's Strip (" a" showed
    # as "a", a lone "▁" as ""), and ByteFallback turned each <0x..> token into U+FFFD.
    tokenizer = llama_like_byte_fallback_tokenizer()
    ids = tokenizer.encode("ab  b 日\n")
    assert [tokenizer.token(i) for i in ids] == ["▁a", "b", "▁", "▁b", "▁", "<0xE6>", "<0x97>", "<0xA5>",
                                                 "<0x0A>"]
    assert [tokenizer.token_text(i) for i in ids] == [" a", "b", " ", " b", " ", "\\xe6", "\\x97", "\\xa5",
                                                      "\\n"]
    specials = [tokenizer.start_id, tokenizer.eot_id, tokenizer.unknown_id]
    assert [tokenizer.token_text(i) for i in specials] == ["<s>", "</s>", "<unk>"]


def test_char_token_text_is_the_token_decoded_alone(char_tokenizer):
    # The SentencePiece labels above read a token after another one: a character's stays its own.
    decoded = [char_tokenizer.decode([i]).replace("\n", "\\n").replace("\t", "\\t")
               for i in range(char_tokenizer.vocab_size)]
    assert [char_tokenizer.token_text(i) for i in range(char_tokenizer.vocab_size)] == decoded


# ----------------------------------------------------------------------------- long texts


def test_text_pieces_cover_the_text_and_respect_the_limit():
    text = TRAINING * 5
    pieces = list(text_pieces(text, 300))
    assert "".join(pieces) == text
    assert len(pieces) > 10 and all(len(p) <= 300 for p in pieces)
    for left, right in zip(pieces, pieces[1:]):  # each cut is just after a lone newline
        assert left.endswith("\n") and not left[-2].isspace() and not right[0].isspace()


@pytest.mark.parametrize("before", range(100 - len(END_OF_TEXT) + 1, 100))  # each start that straddles 100
def test_text_pieces_never_split_end_of_text(before):
    text = "a" * before + END_OF_TEXT + "b" * 200  # no newline: the cut falls back to the limit (100)
    pieces = list(text_pieces(text, 100))
    assert "".join(pieces) == text
    assert sum(p.count(END_OF_TEXT) for p in pieces) == 1


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_long_texts_encode_as_if_whole(kind, shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:140_000]  # three 64K pieces
    config = TokenizerConfig(kind=kind, vocab_size=512)
    tokenizer = build_tokenizer(config, texts_of(text))
    whole = tokenizers.Tokenizer.from_str(tokenizer.to_json()).encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == whole  # cut into 64K pieces and encoded in parallel
    small = [i for piece in tokenizer.text_pieces(text, 2_000) for i in tokenizer.encode(piece)]
    assert small == whole  # hundreds of cuts, still the same tokens
    assert tokenizer.decode(whole) == text


def test_text_pieces_are_cut_only_at_newlines_with_no_space_before_them():
    # A cut after a blank line ("...\n\n|Next") would end a piece in "\n\n", which byte-level BPE
    # keeps as one split (one token, here) at a text's end but splits as "\n", "\n" within it.
    rng = random.Random(0)
    words = ["the", "king", "said", "and", "lord", "of", "my", "good", "sir"]
    verses = ["\n".join(" ".join(rng.choice(words) for _ in range(8)) + "." for _ in range(3)) for _ in range(60)]
    text = "\n\n".join(verses)
    tokenizer = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts_of(*(v + "\n\n" for v in verses)))
    assert len(tokenizer.encode("\n\n")) == 1  # the tokenizer knows "\n\n"
    whole = tokenizers.Tokenizer.from_str(tokenizer.to_json()).encode(text, add_special_tokens=False).ids
    pieces = list(tokenizer.text_pieces(text, 400))
    assert len(pieces) > 10 and not any(piece.endswith("\n\n") for piece in pieces)
    assert [i for piece in pieces for i in tokenizer.encode(piece)] == whole


def test_text_pieces_are_cut_only_at_newlines_with_no_space_after_them():
    # An indented line read from a cut ("    return x") splits its indent as "   ", " return"; within
    # the text the newline takes some of it ("\n   ", " return"): code and verse change tokens at such cuts.
    rng = random.Random(0)
    words = ["return", "value", "self", "item", "count", "name"]
    lines = [" " * rng.choice([0, 0, 4, 8]) + " ".join(rng.choice(words) for _ in range(5))
             for _ in range(600)]
    text = "\n".join(lines) + "\n"
    tokenizer = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts_of(text))
    whole = tokenizers.Tokenizer.from_str(tokenizer.to_json()).encode(text, add_special_tokens=False).ids
    pieces = list(tokenizer.text_pieces(text, 1000))
    assert len(pieces) > 10 and not any(piece[0].isspace() for piece in pieces[1:])
    assert [i for piece in pieces for i in tokenizer.encode(piece)] == whole


def test_encode_batch_matches_encode(bpe_tokenizer):
    texts = [TRAINING, "", HARD, "x"]
    assert bpe_tokenizer.encode_batch(texts) == [bpe_tokenizer.encode(t) for t in texts]


def test_unsplittable_pretrained_tokenizer_encodes_whole():
    spec = json.loads(build_tokenizer(TokenizerConfig(kind="char"), texts_of("ab\n")).to_json())
    spec["normalizer"] = {"type": "Lowercase"}  # cuts are only proven safe without normalizers
    tokenizer = Tokenizer.from_json(json.dumps(spec))
    text = "ab\nab\n" * 100
    assert list(tokenizer.text_pieces(text, 10)) == [text]


def test_a_tokenizer_reading_characters_in_pairs_is_never_cut():
    # FixedLength(2) pairs characters from the text's start: a cut after an odd number of them
    # would pair every later one differently. Only FixedLength(1), ours, is cut.
    from tokenizers import models, pre_tokenizers

    backend = tokenizers.Tokenizer(models.WordLevel({"ab": 0, "\na": 1, "b\n": 2, "?": 3}, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.FixedLength(length=2)
    tokenizer = Tokenizer(backend)
    text = "ab\n" * 100
    assert not tokenizer.cuts_are_exact and list(tokenizer.text_pieces(text, 10)) == [text]


def test_a_pretrained_files_truncation_and_padding_are_off_texts_are_encoded_whole(tmp_path):
    text = "hello world\nab\n" * 50
    plain = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts_of(text))
    backend = tokenizers.Tokenizer.from_str(plain.to_json())
    backend.enable_truncation(max_length=8)  # as a sentence encoder's tokenizer.json may ship
    backend.enable_padding(length=64)
    backend.save(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert loaded.encode(text) == plain.encode(text) and len(plain.encode(text)) > 64
    assert loaded.encode("ab") == plain.encode("ab")  # nothing padded on


@pytest.mark.parametrize("change, cut", [({}, True), ({"add_prefix_space": True}, False),
                                         ({"use_regex": False}, False)],
                         ids=["gpt2-style", "prefix-space", "no-regex"])
def test_a_byte_level_tokenizer_is_cut_only_where_cuts_leave_its_tokens_alone(change, cut):
    # A prefix space is added to every piece; without the regex, words run across the cut.
    spec = json.loads(build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300),
                                      texts_of("hello world\nab\n" * 50)).to_json())
    spec["pre_tokenizer"].update(change)
    tokenizer = Tokenizer.from_json(json.dumps(spec))
    text = "hello world\nab\n" * 100
    pieces = list(tokenizer.text_pieces(text, 40))
    assert (len(pieces) > 1) == cut and "".join(pieces) == text
    whole = tokenizers.Tokenizer.from_str(json.dumps(spec)).encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == whole


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tinyattns_own_tokenizers_start_texts_with_their_end_of_text_and_add_nothing(kind):
    tokenizer = build_tokenizer(TokenizerConfig(kind=kind, vocab_size=300), lambda: iter(["ab\ncd"]))
    assert tokenizer.start_id == tokenizer.eot_id is not None and tokenizer.start_of_text == "<|endoftext|>"
    assert (tokenizer.adds_start, tokenizer.text_start) == (False, [])


def test_unknown_pieces_are_found_a_piece_of_the_text_at_a_time_in_order(monkeypatch):
    # An encoding with offsets costs hundreds of bytes a character: a long text (eval --text-file)
    # is searched a piece at a time, and what every piece holds is found, in order.
    from tinyattn.data.tokenizer import PIECE_CHARS

    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["ab\nca\n"]))
    text = "ab\n\u2603a\n" + "ab\nca\n" * (PIECE_CHARS // 2) + "c\u2605\n" + "ab\u2603\n"
    lengths = []
    backend = tokenizer._backend

    class Recording:  # the backend, noting the length of each text it encodes
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode(self, text, **kwargs):
            lengths.append(len(text))
            return backend.encode(text, **kwargs)

    monkeypatch.setattr(tokenizer, "_backend", Recording())
    assert tokenizer.unknown_pieces(text) == ["\u2603", "\u2605"]
    assert len(lengths) > 1 and max(lengths) <= 2 * PIECE_CHARS < len(text)


def test_an_end_of_text_the_vocabulary_lacks_is_a_one_line_error_naming_it():
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "</s>": 1, "?": 2}, unk_token="?"))
    tokenizer = Tokenizer(backend, end_of_text="</s>")
    assert (tokenizer.eot_id, tokenizer.start_id) == (1, 1)  # a text starts from the end of the one before
    with pytest.raises(DataError, match=r"^tokenizer\.end_of_text: '<eos>' is not a token of this tokenizer"):
        Tokenizer(backend, end_of_text="<eos>")


def test_an_end_of_text_a_tokenizer_file_lacks_names_the_file(tmp_path):
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "</s>": 1, "?": 2}, unk_token="?"))
    path = tmp_path / "models" / "llama" / "tokenizer.json"
    path.parent.mkdir(parents=True)
    Tokenizer(backend).save(path)
    with pytest.raises(DataError) as caught:
        Tokenizer.from_file(path, end_of_text="<eos>")
    assert str(caught.value) == f"{path}: tokenizer.end_of_text: '<eos>' is not a token of this tokenizer"


def test_a_start_of_text_the_vocabulary_lacks_is_a_one_line_error():
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<s>": 1, "?": 2}, unk_token="?"))
    assert Tokenizer(backend, start_of_text="<s>").start_id == 1
    with pytest.raises(DataError, match=r"start of text: '<bos>' is not a token of this tokenizer"):
        Tokenizer(backend, start_of_text="<bos>")


def test_a_unigram_tokenizers_unknown_token_is_its_unk_id_and_its_pieces_are_named():
    # Unigram gives its unknown token by id (unk_id), not by name as WordLevel, WordPiece and BPE do.
    from tinyattn.data.tokenizer import unknown_characters

    backend = tokenizers.Tokenizer(tokenizers.models.Unigram([("a", -1.0), ("<unk>", 0.0), ("b", -1.0)],
                                                             unk_id=1))
    tokenizer = Tokenizer(backend)
    assert tokenizer.unknown_id == 1 and tokenizer.encode("abc") == [0, 2, 1]
    assert unknown_characters(tokenizer, "abcab\u2603") == ["c", "\u2603"]


def test_stop_tokens_stop_generation_beside_the_end_of_text_and_one_the_file_lacks_names_the_file(tmp_path):
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "</s>": 1, "?": 2}, unk_token="?"))
    path = tmp_path / "tokenizer.json"
    Tokenizer(backend).save(path)
    assert Tokenizer.from_file(path, end_of_text="</s>", stop_tokens=["a"]).stop_ids == {1, 0}
    with pytest.raises(DataError) as caught:
        Tokenizer.from_file(path, end_of_text="</s>", stop_tokens=["a", "<|im_end|>"])
    assert str(caught.value) == (f"{path}: tokenizer.stop_tokens: '<|im_end|>' is not a token of this "
                                 "tokenizer")


def test_a_start_or_end_of_text_outside_the_added_specials_is_special_all_the_same():
    # A folder's bos or eos may be a plain vocabulary word: it still stands for no text (labels, skipping).
    vocab = {"a": 0, "<s>": 1, "?": 2, "</s>": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="?"))
    assert Tokenizer(backend, start_of_text="<s>").special_ids == {1, 2}
    assert Tokenizer(backend, end_of_text="</s>", start_of_text="<s>").special_ids == {1, 2, 3}  # and its eos


def test_a_text_of_more_than_n_times_max_token_chars_characters_is_more_than_n_tokens(char_tokenizer,
                                                                                       bpe_tokenizer):
    # The server refuses a prompt longer than its context can read without encoding it (`serve`): the
    # bound must hold for every text, or a prompt that fits would be refused.
    longest = max(len(bpe_tokenizer.token(i)) for i in range(bpe_tokenizer.vocab_size))
    assert (char_tokenizer.max_token_chars, bpe_tokenizer.max_token_chars) == (len(END_OF_TEXT), longest)
    for tokenizer in (char_tokenizer, bpe_tokenizer):
        for text in (TRAINING, HARD, END_OF_TEXT * 3, TRAINING * 7 + END_OF_TEXT):
            assert len(tokenizer.encode(text)) * tokenizer.max_token_chars >= len(text)
        assert len(tokenizer.encode(END_OF_TEXT * 3)) * tokenizer.max_token_chars == len(END_OF_TEXT * 3)


def test_a_tokenizer_that_can_read_any_number_of_characters_in_one_token_has_no_max_token_chars(
        bpe_tokenizer):
    spec = json.loads(bpe_tokenizer.to_json())
    normalised = {**spec, "normalizer": {"type": "NFC"}}  # "e\u0301" (two characters) becomes one
    missing_a_byte = {**spec, "model": {**spec["model"], "vocab": {  # BPE drops a byte it lacks: byte 0's
        token: i for token, i in spec["model"]["vocab"].items() if token != "\u0100"}}}
    stripping = {**spec, "added_tokens": [{**spec["added_tokens"][0], "lstrip": True}]}  # takes the spaces
    for changed in (normalised, missing_a_byte, stripping):
        assert Tokenizer.from_json(json.dumps(changed)).max_token_chars is None
    word_piece = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    word_piece.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = Tokenizer(word_piece)
    assert tokenizer.encode("bbbbbbbb   bbbbbb") == [0, 0] and tokenizer.max_token_chars is None


def test_ctrl_c_stops_a_bpe_training_at_once_not_when_it_ends(shakespeare_path):
    """tokenizers trains BPE in native code that returns to Python only at its end, where Ctrl-C
    used to wait (37-79 s on a 300 MB corpus); now the wait is what the signal stops."""
    text = shakespeare_path.read_text(encoding="utf-8")  # a fraction of a second of native training
    config = TokenizerConfig(kind="bpe", vocab_size=4000)
    sent = []

    def ctrl_c() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    def texts():
        yield text
        # All of it read: tokenizers asks for more from the training's own thread, so the wait for it has
        # begun, and what is left is native counting and merging. A timer started with the call could fire
        # before that (on a loaded machine), where a Ctrl-C ends the call as soon, with no training left
        # to outlast it.
        threading.Timer(0.05, ctrl_c).start()

    with pytest.raises(KeyboardInterrupt):
        build_tokenizer(config, texts)
    returned = time.perf_counter()
    join_the_bpe_training()  # its native work goes on after the interrupt: not into the next test
    ended = time.perf_counter()  # where Ctrl-C used to return: the training's end
    # From when the signal was sent, and against the training's own time left, not a fixed bound: a
    # loaded machine slows the timer, the training and the wait alike.
    waited, left = returned - sent[0], ended - sent[0]
    assert waited < left / 2, \
        f"Ctrl-C took {waited:.2f} s to stop the BPE training; it ended {left:.2f} s after"


def join_the_bpe_training() -> None:
    for thread in threading.enumerate():
        if thread.name == "BPE tokenizer training":
            thread.join()  # not into the next test


def test_an_interrupted_bpe_training_stops_reading_the_text():
    """After Ctrl-C the training went on in the background, reading the corpus to its end (minutes on a
    large one, all cores busy: a notebook's next cell, or the exit that waits for it); now it stops
    reading at the next piece, and tokenizers returns within a second."""
    pulled, resumed = 0, threading.Event()

    def texts():
        nonlocal pulled
        for i in range(2000):
            if i == 300:  # the training thread is reading: Ctrl-C now
                os.kill(os.getpid(), signal.SIGINT)
                resumed.wait(30)
            pulled += 1
            yield f"document {i}: " + "words of a document " * 20

    try:
        with pytest.raises(KeyboardInterrupt):
            build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts)
    finally:
        resumed.set()
        join_the_bpe_training()
    assert pulled <= 301, f"the interrupted training read {pulled} texts of 2000"


def test_the_exit_after_an_interrupted_wait_waits_for_the_work_it_left_running(tmp_path):
    """An interrupt leaves the work running (tokenizers' native BPE training); a process that exits then
    finalized the interpreter under it, which ends such a thread mid-call: `tinyattn train` stopped by
    Ctrl-C while a BPE tokenizer trained died by a segmentation fault (exit 139) or 'FATAL: exception not
    rethrown' (134) in 5 of 11 tries. The exit now waits for the work's end."""
    code, err = run_interrupted(tmp_path, 1.0, note_after=0)  # the work ends once the exit waits for it
    assert code == 130, err
    assert (tmp_path / "ended").exists(), "the interpreter finalized while the interrupted work still ran"


def test_interruptible_work_gives_its_result_and_its_error_to_the_waiting_thread():
    # A BPE training that fails in its thread must fail the command, not hand back None as a tokenizer.
    from tinyattn.system.signals import interruptible

    def work():
        raise ValueError("the merges could not be learnt")

    assert interruptible(lambda: 7, "work") == 7
    with pytest.raises(ValueError, match="the merges could not be learnt"):
        interruptible(work, "work")


def run_interrupted(tmp_path, seconds: float, cancel: str = "None",
                    note_after: Optional[float] = None) -> tuple[int, str]:
    """The exit status and standard error of `interrupted_script`'s process, whose work ends when the exit
    has said that it waits for it (its first line of standard error), else `seconds` after it began."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = interrupted_script(tmp_path, seconds, cancel, note_after)
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        note = process.stderr.readline()  # the exit's note, or the end of a process that did not wait
        process.stdin.close()  # the work ends now
        return process.wait(timeout=60), note + process.stderr.read()
    finally:
        process.kill()


def interrupted_script(tmp_path, seconds: float, cancel: str = "None",
                       note_after: Optional[float] = None) -> str:
    """A process whose `interruptible(work)` Ctrl-C interrupts after 0.2 s; the work ends `seconds` after it
    began, or sooner when its standard input closes, then writes tmp_path/ended. The process exits 130 on the
    interrupt. note_after: the seconds its exit waits before it says so (signals.EXIT_NOTE_AFTER, unchanged
    if None)."""
    return (
        "import os, select, signal, sys, threading\n"
        "import tinyattn.system.signals as signals\n"
        "from tinyattn.system.signals import interruptible\n"
        + ("" if note_after is None else f"signals.EXIT_NOTE_AFTER = {note_after}\n") +
        "def work():\n"
        f"    select.select([sys.stdin], [], [], {seconds})  # native work that goes on after the interrupt\n"
        f"    open({str(tmp_path / 'ended')!r}, 'w').close()\n"
        "def broken():\n"
        "    raise RuntimeError('cancel failed')\n"
        "threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        f"    interruptible(work, 'BPE tokenizer training', cancel={cancel})\n"
        "except BaseException:\n"
        "    sys.exit(130)\n")


def test_an_exit_that_waits_long_for_interrupted_work_says_so(tmp_path):
    """The exit waits for the work's end (a BPE training merges what it read after Ctrl-C: seconds on
    a large corpus), which looked like a hang after the run's last line: now a note says what it waits
    for, and that a second Ctrl-C quits at once."""
    code, err = run_interrupted(tmp_path, 2.5)  # the note must come before the work would end
    assert code == 130 and (tmp_path / "ended").exists(), err
    assert err == ("note: waiting for the BPE tokenizer training to end before exiting (its native "
                   "code first finishes with the text it had read: seconds, longer on a large "
                   "corpus); Ctrl-C again quits at once\n"), err


def test_a_second_ctrl_c_while_the_exit_waits_quits_at_once_with_status_130(tmp_path):
    """The note's promise: a second Ctrl-C while the exit waits for interrupted work ends the process
    at once, unfinalized, with the interrupt's status 130 and no traceback from the wait."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = interrupted_script(tmp_path, 30, note_after=0)
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        note = process.stderr.readline()  # the exit waits for the work now (the work waits on stdin)
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130 and time.monotonic() - start < 10
    finally:
        process.kill()
    assert note.startswith("note: waiting for") and process.stderr.read() == ""
    assert not (tmp_path / "ended").exists()


def test_the_exit_waits_for_interrupted_work_whose_cancel_fails(tmp_path):
    # The wait at exit was registered after cancel(): a cancel that raised left the work running
    # under an interpreter that finalized.
    code, err = run_interrupted(tmp_path, 0.8, cancel="broken", note_after=0)
    assert code == 130 and (tmp_path / "ended").exists(), err


def test_training_a_bpe_tokenizer_with_progress_writes_no_blank_lines_where_stdout_is_no_terminal(capfd):
    # tokenizers' bars, drawn where nobody sees them, left three blank lines atop a piped run's output
    build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter(["to be or not to be " * 50]),
                    progress=True)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
