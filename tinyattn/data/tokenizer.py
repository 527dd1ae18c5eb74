"""Text to token ids and back: character-level, byte-level BPE and pretrained tokenizers.

Every kind is a Hugging Face `tokenizers` pipeline, saved and embedded in checkpoints as the
same `tokenizer.json`, so one class (`Tokenizer`) serves all three:

- `char`: one token per character (Unicode code point). The vocabulary is every character of
  the training text, sorted by code point so ids are stable, then `[UNK]` and `<|endoftext|>`.
  A character never seen in training encodes to `[UNK]`, which decodes to U+FFFD (the
  Unicode replacement character "�"). Built as a WordLevel model over a pre-tokenizer that
  cuts every character apart (`FixedLength(1)`), with a decoder that joins them again.
- `bpe`: byte-level BPE (GPT-2 style) trained on the training text, with the 256 byte values
  always in the vocabulary, so any Unicode text encodes without `[UNK]` and round-trips
  exactly. No normalizer, no prefix space: `decode(encode(text)) == text` for every kind we
  build, including spaces, newlines, emoji, CJK and combining marks.
- `pretrained`: an existing `tokenizer.json`, used as it is.

`<|endoftext|>` separates documents in the token stream. It is matched when it occurs
literally in the text and decodes back to that literal, so round trips hold there too.

Long texts are cut into pieces at newlines and encoded in parallel; `text_pieces` explains
why the cut points leave the tokens unchanged for the kinds built here.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from tinyattn.config import TOKENIZER_KINDS, TokenizerConfig
from tinyattn.errors import DataError, counted
from tinyattn.system.signals import interruptible
from tinyattn.system.storage import atomic_write, read_text

END_OF_TEXT = "<|endoftext|>"
UNKNOWN = "[UNK]"
BYTE_ALPHABET_SIZE = 256
PIECE_CHARS = 1 << 16  # long texts are encoded in pieces of about this many characters


@contextmanager
def _native_stderr_held() -> Iterator[None]:
    """Hold what is written to file descriptor 2 inside the block, and give it back unless the
    block raises. A Rust panic in `tokenizers` writes its message (with RUST_BACKTRACE=1 a whole
    stack) there before Python sees the PanicException; the one-line error that follows says it.
    Where descriptor 2 cannot be duplicated (closed), the block runs as it is."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        saved = None
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)  # the block did not raise: what it wrote goes where it was going
        written = held.read()
        while written:
            written = written[os.write(2, written):]


class Tokenizer:
    """A `tokenizers.Tokenizer` with the small API the rest of tinyattn uses."""

    def __init__(self, backend: tokenizers.Tokenizer, end_of_text: Optional[str] = None,
                 start_of_text: Optional[str] = None, stop_tokens: Sequence[str] = ()):
        """end_of_text: the token that ends a text (`eot_id`); None: <|endoftext|>.
        start_of_text: the token that starts one (`start_id`, an imported folder's bos); None: the
        same token, which is all tinyattn's own tokenizers have.
        stop_tokens: the other tokens at which generation stops (`stop_ids`; tokenizer.stop_tokens).

        A pretrained file's truncation and padding (a sentence encoder's max_length: 128, say)
        are turned off: a document or a prompt is encoded whole, and nothing is added to it
        (but `text_start`, where a start_of_text is given)."""
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        spec = json.loads(backend.to_str())
        self.end_of_text = end_of_text or END_OF_TEXT
        self._eot_id = backend.token_to_id(self.end_of_text)
        if end_of_text is not None and self._eot_id is None:
            raise DataError(f"tokenizer.end_of_text: {end_of_text!r} is not a token of this tokenizer")
        # The tokens that end a generation: eot_id, and the stop tokens (an imported folder's other
        # eos ids: a list in its generation_config.json, at any of which transformers' generate() stops).
        stops = {token: backend.token_to_id(token) for token in stop_tokens}
        lacking = [token for token, id in stops.items() if id is None]
        if lacking:
            raise DataError(f"tokenizer.stop_tokens: {lacking[0]!r} is not a token of this tokenizer")
        self.stop_ids: frozenset[int] = frozenset({self._eot_id, *stops.values()} - {None})
        self.start_of_text = start_of_text or self.end_of_text
        self._start_id = backend.token_to_id(self.start_of_text)
        if start_of_text is not None and self._start_id is None:
            raise DataError(f"start of text: {start_of_text!r} is not a token of this tokenizer")
        # Whether the file's own post-processor puts the start token before a text, as a Llama
        # tokenizer.json's TemplateProcessing puts <s>: transformers' tokenizer(text) adds it then.
        self.adds_start = start_of_text is not None and self.template_start() == start_of_text
        self._byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"
        self._splittable = _cuts_at_newlines_are_exact(spec)
        self._max_token_chars = _longest_token_chars(spec)
        model = spec.get("model") or {}
        self._model_type = model.get("type", "?")
        # The unknown token: WordLevel, WordPiece and BPE name it, Unigram gives its id.
        unknown = model.get("unk_token")
        self._unknown_id = backend.token_to_id(unknown) if unknown else model.get("unk_id")
        # A SentencePiece-style model's <0x..> tokens, which ByteFallback decodes only in runs.
        self._byte_fallback = bool(model.get("byte_fallback"))
        self._labels_after_an_anchor = not self._byte_level and bool(spec.get("decoder"))

    # ------------------------------------------------------------------ loading and saving

    @classmethod
    def from_file(cls, path: str | Path, end_of_text: Optional[str] = None,
                  start_of_text: Optional[str] = None, stop_tokens: Sequence[str] = ()) -> "Tokenizer":
        return cls.from_json(read_text(path, "tokenizer file"), origin=str(path), end_of_text=end_of_text,
                             start_of_text=start_of_text, stop_tokens=stop_tokens)

    @classmethod
    def from_json(cls, text: str, *, origin: str = "tokenizer JSON", end_of_text: Optional[str] = None,
                  start_of_text: Optional[str] = None, stop_tokens: Sequence[str] = ()) -> "Tokenizer":
        try:
            with _native_stderr_held():
                backend = tokenizers.Tokenizer.from_str(text)
        except BaseException as e:  # serde's message as an Exception; a Rust panic as PanicException
            if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                raise  # KeyboardInterrupt, SystemExit
            raise DataError(f"{origin}: not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
        try:
            return cls(backend, end_of_text, start_of_text, stop_tokens)
        except DataError as e:  # an end_of_text or stop token the file lacks: name the file looked in
            raise DataError(f"{origin}: {e}") from None

    def to_json(self) -> str:
        return self._backend.to_str()

    def template_start(self) -> Optional[str]:
        """The token this file's post-processor puts before every text (a Llama tokenizer.json's
        TemplateProcessing: <s>), as the vocabulary spells it; None where it puts none there."""
        plain = self._backend.encode("a", add_special_tokens=False).ids
        full = self._backend.encode("a", add_special_tokens=True).ids
        return self.token(full[0]) if len(full) > len(plain) and full[1:1 + len(plain)] == plain else None

    def export_json(self) -> str:
        """The tokenizer.json an export writes: this one, without a post-processor that puts tokens
        around a text where tinyattn puts none (a fine-tune of an imported Llama folder, trained
        without its <s>), so that transformers' `tokenizer(text)` gives the ids tinyattn reads."""
        if self.adds_start or not self._backend.encode("", add_special_tokens=True).ids:
            return self.to_json()
        spec = json.loads(self.to_json())
        spec["post_processor"] = None
        return json.dumps(spec, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json atomically; a folder gets `tokenizer.json` inside it."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        with atomic_write(path) as f:
            f.write(self.to_json().encode("utf-8"))

    # ------------------------------------------------------------------ vocabulary

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eot_id(self) -> Optional[int]:
        """Id of the token that ends a text: `<|endoftext|>`, or a pretrained tokenizer's own
        (`tokenizer.end_of_text`, an imported folder's eos token); None without either."""
        return self._eot_id

    @property
    def start_id(self) -> Optional[int]:
        """Id of the token a text starts from: an imported folder's bos (`start_of_text`), else the
        end-of-text token, which also starts texts (a document boundary); None without either."""
        return self._start_id

    @property
    def text_start(self) -> list[int]:
        """The ids put before a text read on its own (a prompt, a text scored): the start token where
        the tokenizer file adds it (`adds_start`, as transformers' `tokenizer(text)` does), else none."""
        return [self._start_id] if self.adds_start else []

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the tokens that stand for no text: `<|endoftext|>`, the model's unknown token
        (the character tokenizer's `[UNK]`, for a character its corpus lacks) and every added
        token marked special (a pretrained tokenizer's `<s>`, `<|im_start|>`, ...)."""
        ids = {i for i, token in self._backend.get_added_tokens_decoder().items() if token.special}
        unknown = getattr(self._backend.model, "unk_token", None)
        ids |= {self._eot_id, self._start_id, self._backend.token_to_id(unknown) if unknown else None}
        return frozenset(ids - {None})

    @property
    def max_token_chars(self) -> Optional[int]:
        """The most characters of a text one token can read, where that is bounded (so a text of more
        than n times as many characters is sure to be more than n tokens, without encoding it); None
        where a tokenizer can read any number in one token (one that normalises text, which may delete
        characters; a WordPiece [UNK] for a whole word). See `_longest_token_chars`."""
        return self._max_token_chars

    @property
    def unknown_id(self) -> Optional[int]:
        """Id of the model's unknown token (the character tokenizer's `[UNK]`, a WordPiece
        vocabulary's); None where every text has tokens (byte-level BPE)."""
        return self._unknown_id

    @property
    def unknown_written(self) -> Optional[str]:
        """The unknown token's text where a text that writes it is read as the token itself (an added
        token: a Llama file's '<unk>', which WikiText writes for its rare words); else None."""
        added = self._backend.get_added_tokens_decoder()
        return added[self._unknown_id].content if self._unknown_id in added else None

    def unknown_pieces(self, text: str) -> list[str]:
        """The pieces of `text` read as the unknown token (a character, or a word a WordPiece
        vocabulary cannot spell), each once, in order of first appearance. A piece of the text
        (`text_pieces`) at a time: an encoding with offsets takes hundreds of bytes a character."""
        found: dict[str, None] = {}
        for piece in self.text_pieces(text):
            encoding = self._backend.encode(piece, add_special_tokens=False)  # with offsets into `piece`
            found.update((piece[start:end], None) for id, (start, end) in zip(encoding.ids, encoding.offsets)
                         if id == self._unknown_id)
        return list(found)

    def first_token_chars(self, text: str) -> int:
        """How many characters of `text` its first token reads (0 for an empty text), from the
        offsets of an encoding of its start; a token holding some bytes of a character counts it."""
        encoding = self._backend.encode(text[:PIECE_CHARS], add_special_tokens=False)
        return encoding.offsets[0][1] if encoding.ids else 0

    def token(self, id: int) -> Optional[str]:
        """The token `id` stands for, as the vocabulary spells it ("</s>", "▁the"); None outside it."""
        return self._backend.id_to_token(int(id))

    @functools.cached_property
    def _label_anchor(self) -> Optional[tuple[int, str]]:
        """The token `token_text` decodes another after, and its own text (`_label_anchor_id`): found
        once, when a label is first asked for; None for byte-level and decoder-less tokenizers."""
        if not self._labels_after_an_anchor:
            return None
        anchor = _label_anchor_id(self._backend)
        return None if anchor is None else (anchor, self._backend.decode([anchor], skip_special_tokens=False))

    def token_text(self, id: int) -> str:
        """Readable text of one token, for plot labels.

        Control characters are escaped (a newline shows as `\\n`); a byte-level token that
        is only part of a UTF-8 character, or a byte-fallback token (`<0xE4>`), shows its bytes
        (`\\xe4`). Any other token is read as it decodes after a plain token (`_label_anchor_id`):
        decoded alone, a SentencePiece-style decoder's Strip would take its leading space.
        """
        token = self._backend.id_to_token(int(id))
        if token is None:
            raise ValueError(f"token id {id} is outside the vocabulary of {self.vocab_size}")
        if self._byte_level and token != END_OF_TEXT:
            inverse = _byte_level_inverse()
            if all(c in inverse for c in token):
                text = bytes(inverse[c] for c in token).decode("utf-8", errors="backslashreplace")
                return _escape_controls(text)
        if self._byte_fallback and _FALLBACK_BYTE.fullmatch(token):
            return _escape_controls(bytes([int(token[3:5], 16)]).decode("utf-8", errors="backslashreplace"))
        if self._label_anchor is not None:
            anchor, before = self._label_anchor
            after = self._backend.decode([anchor, int(id)], skip_special_tokens=False)
            if after.startswith(before):
                return _escape_controls(after[len(before):])
        return _escape_controls(self._backend.decode([int(id)], skip_special_tokens=False))

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text. Long texts are cut into pieces first (see `text_pieces`)
        so that all pieces of the batch are encoded in parallel."""
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            before = len(pieces)
            pieces.extend(self.text_pieces(text))
            counts.append(len(pieces) - before)
        # encode_batch_fast skips the character offsets, which we never use.
        encodings = self._backend.encode_batch_fast(pieces, add_special_tokens=False)
        result, position = [], 0
        for count in counts:
            ids: list[int] = []
            for encoding in encodings[position:position + count]:
                ids.extend(encoding.ids)
            result.append(ids)
            position += count
        return result

    @property
    def cuts_are_exact(self) -> bool:
        """Whether a text cut at newlines (`text_pieces`) encodes, piece by piece, to the ids of
        the whole (ours, and pretrained byte-level GPT-2-style tokenizers); else a text must be
        encoded whole."""
        return self._splittable

    def text_pieces(self, text: str, max_chars: int = PIECE_CHARS) -> Iterator[str]:
        """Cut `text` into pieces whose encodings, joined, equal the encoding of `text`.

        Only for tokenizers where that is known to hold (ours, and pretrained byte-level
        GPT-2-style ones); any other yields `text` whole.
        """
        if not self._splittable:
            yield text
            return
        yield from text_pieces(text, max_chars)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a sequence of ids (a list, numpy array or tensor); special tokens are kept."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"Tokenizer({self._model_type}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


# ----------------------------------------------------------------------------- building


def unknown_characters(tokenizer, text: str, ids: Optional[list[int]] = None) -> list[str]:
    """The characters of `text` that `tokenizer` reads as its unknown token ([UNK]; for a WordPiece
    vocabulary the word it cannot spell), in order of first appearance; [] when the ids (`ids`,
    else encoded here) hold no unknown token, or the tokenizer has none. The decoded ids are not
    compared with `text`: a normalising tokenizer (lowercase, accents stripped) gives back other
    text without reading any of it as unknown."""
    unknown = getattr(tokenizer, "unknown_id", None)
    if unknown is None or unknown not in (tokenizer.encode(text) if ids is None else ids):
        return []
    return tokenizer.unknown_pieces(text)


def unknown_characters_note(tokenizer, text: str, ids: list[int], verb: str = "read") -> Optional[str]:
    """`N characters the tokenizer has never seen, <verb> as [UNK]: 'é', ...` (the first ten named)
    where `ids`, the encoding of `text`, hold the unknown token; else None."""
    unknown = unknown_characters(tokenizer, text, ids)
    if not unknown:
        return None
    shown = ", ".join(repr(c) for c in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
    return f"{counted(len(unknown), 'character')} the tokenizer has never seen, {verb} as [UNK]: {shown}"


def warn_unknown_characters(tokenizer, text: str, ids: list[int], where: str, verb: str = "read") -> None:
    """`warning: <where>: <unknown_characters_note>` on stderr where `ids`, the encoding of `text`,
    hold the unknown token: the one warning of the commands that read a user's text (generate's
    prompt, eval --text-file, attention --text, lab context --context, lab causal --prompt, lab
    distance --text); `tinyattn serve` answers the same note to the client."""
    note = unknown_characters_note(tokenizer, text, ids, verb)
    if note:
        print(f"warning: {where}: {note}", file=sys.stderr)


def pretrained_file(path: str | Path) -> Path:
    """tokenizer.path as a file to read, or a one-line DataError for a missing path or a folder."""
    path = Path(path)
    if path.is_dir():
        inside = path / "tokenizer.json"
        hint = f"; did you mean {inside}?" if inside.is_file() else ""
        raise DataError(f"tokenizer.path: {path} is a folder; expected the path of a tokenizer.json "
                        f"file{hint}")
    if not path.exists():
        raise DataError(f"tokenizer.path: tokenizer file not found: {path}")
    return path


def unused_tokenizer_options(config: TokenizerConfig, given: Iterable[str]) -> list[str]:
    """A note when `given` (the dotted keys the user wrote) holds tokenizer.vocab_size and the kind
    builds no vocabulary of that size: char's is the text's characters, pretrained's its file's."""
    if "tokenizer.vocab_size" not in set(given) or config.kind == "bpe":
        return []
    made = "the text's characters" if config.kind == "char" else "its tokenizer.json's"
    return [f"note: tokenizer.vocab_size has no effect: tokenizer.kind is {config.kind}, whose vocabulary is "
            f"{made} (tokenizer.vocab_size sizes a bpe tokenizer)"]


def build_tokenizer(config: TokenizerConfig, texts: Callable[[], Iterator[str]], *,
                    progress: bool = False) -> Tokenizer:
    """Make the tokenizer `config` asks for; `texts()` yields the training documents.

    `texts` is a callable so a caller can stream a corpus larger than memory: it is called
    once for char and bpe, and not at all for pretrained.
    """
    if config.kind == "pretrained":
        if not config.path:
            raise DataError("tokenizer.path: tokenizer.kind=pretrained needs the path of a tokenizer.json")
        return Tokenizer.from_file(pretrained_file(config.path), config.end_of_text,
                                   stop_tokens=config.stop_tokens)
    if config.kind == "char":
        return _build_char(texts())
    if config.kind == "bpe":
        return _build_bpe(config.vocab_size, texts(), progress)
    raise DataError(f"tokenizer.kind: {config.kind!r} is not accepted; "
                    f"expected one of {', '.join(TOKENIZER_KINDS)}")


def _build_char(texts: Iterator[str]) -> Tokenizer:
    characters: set[str] = set()
    for text in texts:
        characters.update(text)  # C-level loop: about 100 MB of text a second
    if not characters:
        raise DataError("the training text is empty: nothing to build a character vocabulary from")
    vocab = {c: i for i, c in enumerate(sorted(characters))}
    vocab[UNKNOWN] = len(vocab)  # never produced by the pre-tokenizer, which yields single characters
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    backend.pre_tokenizer = pre_tokenizers.FixedLength(length=1)
    # Replace works on each token before Fuse joins them, so only the [UNK] token itself
    # becomes U+FFFD, never the five characters "[UNK]" written in a text.
    backend.decoder = decoders.Sequence([decoders.Replace(UNKNOWN, "\ufffd"), decoders.Fuse()])
    backend.add_special_tokens([END_OF_TEXT])
    return Tokenizer(backend)


def _is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class _Stopped(Exception):
    """Ends tokenizers' reading of the text after an interrupt (`_build_bpe`); nobody sees it."""


def _build_bpe(vocab_size: int, texts: Iterator[str], progress: bool) -> Tokenizer:
    minimum = BYTE_ALPHABET_SIZE + 1
    if vocab_size < minimum:
        raise DataError(f"tokenizer.vocab_size={vocab_size} is too small for byte-level BPE: the minimum "
                        f"is {minimum} (256 byte values + {END_OF_TEXT})")
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    # tokenizers draws its bars on standard output; where that is no terminal (a pipe, a log file)
    # it wrote only their blank lines
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
        show_progress=progress and _is_terminal(sys.stdout),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # every byte, seen or not

    seen_text = False
    stopped = threading.Event()  # set on an interrupt: the text read so far is the last

    def pieces() -> Iterator[str]:
        nonlocal seen_text
        for text in texts:
            if text:
                seen_text = True
                for piece in text_pieces(text, PIECE_CHARS):
                    if stopped.is_set():  # tokenizers stops reading (and returns once it merged what it read)
                        raise _Stopped("the BPE training was interrupted")
                    yield piece

    # tokenizers trains in native code that returns to Python only at its end: in a thread of its
    # own, so that Ctrl-C (or a run's stop before its first step) is not kept waiting meanwhile.
    interruptible(lambda: backend.train_from_iterator(pieces(), trainer), "BPE tokenizer training",
                  cancel=stopped.set)
    if not seen_text:
        raise DataError("the training text is empty: nothing to train the BPE tokenizer on")
    return Tokenizer(backend)


# ----------------------------------------------------------------------------- helpers


def text_pieces(text: str, max_chars: int = PIECE_CHARS) -> Iterator[str]:
    """Cut `text` into pieces of at most about `max_chars` characters, at safe points.

    A safe point is just after a newline that has a non-space character on each side
    ("...end.\\nNext"). Character-level tokenization is unchanged by any cut. Byte-level
    BPE first splits text with the GPT-2 pattern, whose matches never look behind and
    never join a lone newline to its neighbours, and merges only within those splits, so
    a lone newline ends a split whether or not the text goes on. Where no safe point
    exists within a piece (a very long line), the cut is made at `max_chars`, outside any
    `<|endoftext|>`; that may change a token or two at the cut and nothing else.
    """
    start, n = 0, len(text)
    while n - start > max_chars:
        limit = start + max_chars
        cut = _safe_cut(text, start + max_chars // 2, limit)
        if cut is None:
            cut = limit
            # An <|endoftext|> that starts before the cut and ends after it: cut before it.
            straddling = text.rfind(END_OF_TEXT, cut - len(END_OF_TEXT) + 1, cut + len(END_OF_TEXT) - 1)
            if straddling > start:
                cut = straddling
        yield text[start:cut]
        start = cut
    if start < n or n == 0:
        yield text[start:]


def _safe_cut(text: str, low: int, high: int) -> Optional[int]:
    """The largest position p in (low, high] just after a newline with non-space on both sides."""
    position = high
    while True:
        newline = text.rfind("\n", low, position)
        if newline < low:  # -1: none; one at low itself puts p at low + 1, inside the range
            return None
        if (newline + 1 < len(text) and not text[newline - 1].isspace()
                and not text[newline + 1].isspace()):
            return newline + 1
        position = newline


def _cuts_at_newlines_are_exact(spec: dict) -> bool:
    """Whether `text_pieces` cuts leave this tokenizer's output unchanged (see there)."""
    if spec.get("normalizer") is not None:
        return False
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "FixedLength":
        return pre.get("length") == 1
    if pre.get("type") == "ByteLevel":
        return pre.get("add_prefix_space") is False and pre.get("use_regex", True) is True
    return False


def _longest_token_chars(spec: dict) -> Optional[int]:
    """The most characters one token reads, for the tokenizers where a bound is known, else None.

    With no normalizer (NFC, say, joins characters; BERT's deletes some), known for two kinds: one
    character a token (`FixedLength(1)` into a WordLevel model: `char`), and byte-level BPE whose
    vocabulary holds every byte (a token spells one vocabulary character per byte it reads, and a
    text's character is at least one byte; missing a byte, BPE would drop it, or fuse a run into one
    unknown token). An added token reads its own content, unless it also takes the spaces beside it
    (`lstrip`, `rstrip`)."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    added = spec.get("added_tokens") or []
    if spec.get("normalizer") is not None or any(t.get("lstrip") or t.get("rstrip") for t in added):
        return None
    vocab = model.get("vocab")
    if kinds == ["FixedLength"] and pre.get("length") == 1 and model.get("type") == "WordLevel":
        longest = 1
    elif ("ByteLevel" in kinds and model.get("type") == "BPE" and isinstance(vocab, dict)
          and all(k == "ByteLevel" or (k == "Split" and step.get("behavior") != "Removed")
                  for k, step in zip(kinds, steps))
          and all(c in vocab for c in pre_tokenizers.ByteLevel.alphabet())):
        longest = max(map(len, vocab), default=1)
    else:
        return None
    return max([longest, *(len(t["content"]) for t in added)])


_BYTE_LEVEL_INVERSE: dict[str, int] = {}


def _byte_level_inverse() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, character -> byte: printable bytes stand for
    themselves, the other 68 are shifted to U+0100 and up so every token is printable."""
    if not _BYTE_LEVEL_INVERSE:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                     *range(ord("®"), ord("ÿ") + 1)]
        shifted = 0
        for byte in range(256):
            if byte in printable:
                _BYTE_LEVEL_INVERSE[chr(byte)] = byte
            else:
                _BYTE_LEVEL_INVERSE[chr(256 + shifted)] = byte
                shifted += 1
    return _BYTE_LEVEL_INVERSE


_FALLBACK_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _label_anchor_id(backend: tokenizers.Tokenizer) -> Optional[int]:
    """A token for `token_text` to decode another after: a plain one-character token (a letter or a
    digit, an ASCII one where the vocabulary has it) that is no added token and decodes to itself,
    so that nothing a decoder does to the start of a text (Strip, Metaspace) reaches the token
    after it; None where the vocabulary has none."""
    added = backend.get_added_tokens_decoder()

    def plain(token: str, id: Optional[int]) -> bool:
        return (id is not None and id not in added and len(token) == 1 and token.isalnum()
                and backend.decode([id], skip_special_tokens=False) == token)

    for token in string.ascii_letters + string.digits:
        if plain(token, backend.token_to_id(token)):
            return backend.token_to_id(token)
    return next((id for token, id in sorted(backend.get_vocab().items(), key=lambda item: item[1])
                 if plain(token, id)), None)


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_controls(text: str) -> str:
    return "".join(_ESCAPES.get(c, f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c)
                   for c in text)
