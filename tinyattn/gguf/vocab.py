"""A tinyattn tokenizer as llama.cpp's vocabulary: tokens, their types, BPE merges.

llama.cpp rebuilds the tokenizer from the GGUF file's `tokenizer.ggml.*` keys, so what is
written here decides whether it tokenizes a text as tinyattn does. Both of tinyattn's kinds
go out as llama.cpp's byte-level BPE (`tokenizer.ggml.model = "gpt2"`), whose tokens are
spelled in the GPT-2 byte alphabet (each byte one printable character):

- `bpe`: the vocabulary and merges as trained, with the pre-tokenizer `gpt-2`. tinyattn's
  is the `tokenizers` ByteLevel one (GPT-2's regular expression, no prefix space) and
  llama.cpp's `gpt-2` is a hand-written splitter for the same expression; tests/test_gguf.py
  checks them equal on thousands of random strings.
- `char`: each character of the vocabulary becomes the byte-level spelling of its UTF-8
  bytes, and a multi-byte character gets the merges that join its bytes again (byte 1 with
  byte 2, that with byte 3, ...). A merge always starts at a UTF-8 lead byte and extends it
  by its own continuation bytes, so no merge can cross from one character into the next:
  every character of the vocabulary comes out as its one token, whatever the pre-tokenizer.
  The known difference: llama.cpp's BPE has no unknown token, so a character the model
  never saw is dropped where tinyattn encodes it as `[UNK]` (pinned by a test; the README
  says so). `[UNK]` itself is written spelled as U+FFFD, the character tinyattn decodes it
  to, so decoding agrees.

`<|endoftext|>` is a control token (llama.cpp matches it in text it tokenizes with special
tokens parsed, as tinyattn always does, and stops generating at it); no BOS or EOS is added
automatically. A token added to a bpe tokenizer without being special (an imported folder's)
is user-defined, which llama.cpp matches in any text as `tokenizers` does. Any other tokenizer
(a pretrained one of another design) is refused in one line rather than written approximately.
A model whose vocab_size is above its tokenizer's has its list padded with unused `[PAD<id>]`
tokens (`padded`), as llama.cpp's converter pads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import pre_tokenizers

from tinyattn.data.tokenizer import END_OF_TEXT, UNKNOWN, Tokenizer
from tinyattn.errors import CheckpointError

# llama.cpp's token types (gguf.TokenType; kept here so this module needs no gguf import).
NORMAL, UNKNOWN_TYPE, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5
TOKENIZER_MODEL = "gpt2"  # llama.cpp's name for byte-level BPE
PRE_TOKENIZER = "gpt-2"  # llama.cpp's GPT-2 splitter: the regex tinyattn's ByteLevel uses
REPLACEMENT = "\ufffd"  # what tinyattn decodes [UNK] to
# llama.cpp refuses a BPE vocabulary without merges and gguf writes no empty list, so one with
# none (a char vocabulary of ASCII only) gets this one, which no text reaches: its left side is
# two NUL bytes joined, and no merge makes that.
UNREACHABLE_MERGE = "\u0100\u0100 \u0100"


@dataclass
class GGUFVocab:
    tokens: list[str]  # by id, spelled in the byte alphabet (control tokens as they are)
    types: list[int]  # NORMAL, CONTROL, ... per token
    merges: list[str]  # "left right", highest priority first
    end_of_text: int  # <|endoftext|>: llama.cpp's end-of-generation token


def gguf_vocab(tokenizer: Tokenizer) -> GGUFVocab:
    """The vocabulary llama.cpp needs to tokenize exactly as `tokenizer` does, or a
    CheckpointError naming what llama.cpp could not reproduce."""
    spec = json.loads(tokenizer.to_json())
    model, added = spec.get("model") or {}, spec.get("added_tokens") or []
    if not (_is_char(spec) or _is_byte_level_bpe(spec)):  # before the end-of-text token: no retraining helps
        pre = (spec.get("pre_tokenizer") or {}).get("type")
        raise CheckpointError(f"tokenizer: a {model.get('type', '?')} tokenizer with pre-tokenizer {pre}: "
                              "GGUF export writes tinyattn's char and byte-level bpe tokenizers only")
    if tokenizer.eot_id is None:
        raise CheckpointError(f"tokenizer: no end-of-text token ({END_OF_TEXT}, or the one "
                              "tokenizer.end_of_text names): GGUF export needs it as the end-of-generation "
                              "token; train with tokenizer.end_of_text set to one of the tokenizer's own")
    vocab = dict(model.get("vocab") or {})
    for token in added:  # <|endoftext|>: in a BPE model's vocabulary already, not in WordLevel's
        vocab.setdefault(token["content"], token["id"])
    if len(vocab) != tokenizer.vocab_size or set(vocab.values()) != set(range(len(vocab))):
        raise CheckpointError(f"tokenizer: its ids are not 0..{tokenizer.vocab_size - 1} once each")
    if _is_char(spec):
        return _char_vocab(vocab, tokenizer.eot_id)
    return _bpe_vocab(vocab, model.get("merges", []), added, tokenizer.eot_id)


def padded(vocab: GGUFVocab, size: int) -> GGUFVocab:
    """`vocab` with unused tokens `[PAD<id>]` up to `size` (a model.vocab_size set above the
    tokenizer's, rows it never predicts): llama.cpp reads its vocabulary size from the token
    list, which must match the embedding's rows. Its own converter pads so."""
    names = [f"[PAD{id}]" for id in range(len(vocab.tokens), size)]
    taken = sorted(set(names) & set(vocab.tokens))
    if taken:  # llama.cpp would find the padding where the tokenizer's own token is
        raise CheckpointError(f"tokenizer: its token {taken[0]!r} is the name of a padding token GGUF "
                              "export needs for model.vocab_size; train with model.vocab_size unset")
    return GGUFVocab(vocab.tokens + names, vocab.types + [UNUSED] * len(names), vocab.merges,
                     vocab.end_of_text)


def _is_char(spec: dict) -> bool:
    pre = spec.get("pre_tokenizer") or {}
    return ((spec.get("model") or {}).get("type") == "WordLevel" and spec.get("normalizer") is None
            and pre.get("type") == "FixedLength" and pre.get("length") == 1)


def _is_byte_level_bpe(spec: dict) -> bool:
    """GPT-2's design, as tinyattn trains it: no normalizer, ByteLevel splitting with the
    regex and no prefix space, a BPE model without byte fallback or word suffixes."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    return (model.get("type") == "BPE" and spec.get("normalizer") is None
            and pre.get("type") == "ByteLevel" and pre.get("add_prefix_space") is False
            and pre.get("use_regex", True) is True and not model.get("byte_fallback")
            and not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix"))


def _tokens_by_id(vocab: dict[str, int]) -> list[str]:
    tokens = [""] * len(vocab)
    for token, id in vocab.items():
        tokens[id] = token
    return tokens


def _bpe_vocab(vocab: dict[str, int], merges: list, added: list[dict], eot_id: int) -> GGUFVocab:
    tokens = _tokens_by_id(vocab)
    # An added token is matched in a text before BPE runs: llama.cpp does so for a CONTROL token
    # (with special tokens parsed) and a USER_DEFINED one (always); a NORMAL one only merges reach.
    added_types = {token["content"]: CONTROL if token.get("special") else USER_DEFINED for token in added}
    types = [added_types.get(token, NORMAL) for token in tokens]
    # tokenizers writes a merge as [left, right] (0.20 and later) or as "left right" (older).
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return GGUFVocab(tokens, types, merges or [UNREACHABLE_MERGE], eot_id)


def byte_spelling(text: str) -> str:
    """`text`'s UTF-8 bytes in the GPT-2 byte alphabet, as byte-level BPE tokens are spelled."""
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return "".join(piece for piece, _ in splitter.pre_tokenize_str(text))


def _char_vocab(vocab: dict[str, int], eot_id: int) -> GGUFVocab:
    tokens, types, merges = [], [], {}
    for id, character in enumerate(_tokens_by_id(vocab)):
        if id == eot_id:
            tokens.append(character)
            types.append(CONTROL)
        elif character == UNKNOWN:
            # Spelled as U+FFFD so llama.cpp decodes it as tinyattn does; should the training
            # text hold U+FFFD itself, the name is taken and [UNK] decodes to nothing instead.
            taken = REPLACEMENT in vocab
            tokens.append(UNKNOWN if taken else byte_spelling(REPLACEMENT))
            types.append(UNUSED if taken else NORMAL)
        else:
            spelled = byte_spelling(character)  # (bytes,) one alphabet character per byte
            tokens.append(spelled)
            types.append(NORMAL)
            for end in range(1, len(spelled)):  # join byte 1 with 2, then that with 3, ...
                merges.setdefault(f"{spelled[:end]} {spelled[end]}", None)
    return GGUFVocab(tokens, types, list(merges) or [UNREACHABLE_MERGE], eot_id)
