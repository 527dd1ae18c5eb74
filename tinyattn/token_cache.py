"""The token cache: each split's tokens in one flat file, built once and trusted only when whole.

Token files `train.bin` and `validation.bin` hold uint16 ids when the vocabulary fits, else
uint32, with `<|endoftext|>` between documents. Documents are encoded in batches and
appended to the file as they come, so memory does not grow with the corpus.

The cache folder's name ends in a hash of everything that produced it (the source and
each file's size and modification time, the text field, the split rule, the tokenizer
settings, a format version), so a second run reuses it and any change builds a new one.
Every file is written under a temporary name and renamed; `meta.json` is written last,
and a folder is trusted only when its `meta.json` matches the hash and the file sizes. A
build that is interrupted, or whose splits turn out too short, leaves no `meta.json`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import tokenizers
from tqdm import tqdm

from tinyattn.config import Config
from tinyattn.errors import DataError
from tinyattn.files import atomic_write
from tinyattn.sources import Source
from tinyattn.tokenizer import Tokenizer, build_tokenizer

FORMAT_VERSION = 1  # bump when the layout or meaning of the cache files changes
ENCODE_BATCH_CHARS = 1 << 20  # characters handed to the tokenizer at once (encoded in parallel)


class TokenCache:
    """One cache folder: where it is, the key it must match, and how to build it."""

    def __init__(self, source: Source, config: Config):
        self.inputs = cache_inputs(source, config)
        self.key = hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()
        name = f"{source.name}-{_tokenizer_slug(config)}-{self.key[:12]}"
        self.folder = Path(config.data.cache_dir).resolve() / name

    def trusted_meta(self) -> Optional[dict]:
        """meta.json of a complete cache built from this key, or None if anything is off."""
        folder = self.folder
        try:
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            if meta["key"] != self.key or meta["format_version"] != FORMAT_VERSION:
                return None
            itemsize = np.dtype(meta["dtype"]).itemsize
            for split in ("train", "validation"):
                if (folder / f"{split}.bin").stat().st_size != meta[f"{split}_tokens"] * itemsize:
                    return None
            if not (folder / "tokenizer.json").is_file():
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return meta

    def build(self, train: Callable[[], Iterator[str]], validation: Callable[[], Iterator[str]],
              rule: str, config: Config, progress: bool) -> dict:
        """Tokenize both splits into the folder; every file but meta.json (see `commit`).

        `train()` and `validation()` stream each split's documents anew; `rule` says how
        validation was chosen and is recorded in meta.json.
        """
        folder = self.folder
        tokenizer = build_tokenizer(config.tokenizer, train, progress=progress)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)  # from here on, nothing in the folder is trusted
        dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
        meta = {"format_version": FORMAT_VERSION, "key": self.key, "dtype": np.dtype(dtype).name,
                "vocab_size": tokenizer.vocab_size, "validation_rule": rule, "inputs": self.inputs}
        # Each file lands whole or not at all; the folder is trusted only once `commit`
        # writes meta.json after all of them.
        for split, documents in (("train", train), ("validation", validation)):
            with atomic_write(folder / f"{split}.bin") as out:
                tokens, count = write_tokens(documents(), tokenizer, out, dtype,
                                             progress=progress, desc=f"tokenizing {split}")
            meta[f"{split}_tokens"], meta[f"{split}_documents"] = tokens, count
        tokenizer.save(folder / "tokenizer.json")
        return meta

    def commit(self, meta: dict) -> None:
        """Write meta.json last: from now on the folder is trusted."""
        with atomic_write(self.folder / "meta.json") as f:
            f.write(json.dumps(meta, indent=2).encode())


def cache_inputs(source: Source, config: Config) -> dict:
    """Everything that decides the cache's contents; its hash names the cache folder."""
    data, tok = config.data, config.tokenizer
    tokenizer: dict = {"kind": tok.kind}
    if tok.kind == "bpe":
        tokenizer["vocab_size"] = tok.vocab_size
    if tok.kind == "pretrained":
        path = Path(tok.path)
        try:
            tokenizer["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            raise DataError(f"tokenizer.path: tokenizer file not found: {path}") from None
    return {
        "format_version": FORMAT_VERSION,
        "source": source.identity,
        "text_field": data.text_field,
        "max_documents": data.max_documents,
        "train_split": data.train_split,
        "validation_split": data.validation_split,
        "validation_fraction": None if data.validation_split else data.validation_fraction,
        "tokenizer": tokenizer,
        "tokenizers_version": tokenizers.__version__,  # BPE training may differ between versions
    }


def _tokenizer_slug(config: Config) -> str:
    kind = config.tokenizer.kind
    return f"bpe{config.tokenizer.vocab_size}" if kind == "bpe" else kind


def write_tokens(documents: Iterator[str], tokenizer: Tokenizer, out, dtype, *, progress: bool = False,
                 desc: str = "tokenizing") -> tuple[int, int]:
    """Encode `documents` and append their ids to the binary file `out`, with the tokenizer's
    `<|endoftext|>` between documents. Returns (tokens written, documents).

    Documents are cut into pieces (`Tokenizer.text_pieces`) and encoded about a megabyte at
    a time, in parallel: memory grows with the longest document, never with the corpus.
    """
    eot = tokenizer.eot_id
    tokens = documents_seen = 0

    def batches() -> Iterator[list[tuple[str, bool]]]:
        batch: list[tuple[str, bool]] = []
        size = 0
        for text in documents:
            for number, piece in enumerate(tokenizer.text_pieces(text)):
                batch.append((piece, number == 0))  # (piece, starts a document)
                size += len(piece)
                if size >= ENCODE_BATCH_CHARS:
                    yield batch
                    batch, size = [], 0
        if batch:
            yield batch

    with tqdm(desc=desc, unit="tok", unit_scale=True, disable=not progress) as bar:
        for batch in batches():
            encoded = tokenizer.encode_batch([piece for piece, _ in batch])
            flat: list[int] = []
            for (_, starts_document), ids in zip(batch, encoded):
                if starts_document:
                    if documents_seen and eot is not None:
                        flat.append(eot)
                    documents_seen += 1
                flat.extend(ids)
            np.asarray(flat, dtype=dtype).tofile(out)
            tokens += len(flat)
            bar.update(len(flat))
    return tokens, documents_seen


def check_split_lengths(meta: dict, config: Config) -> None:
    needed = config.model.context_length + 1
    data = config.data
    if meta["train_tokens"] < needed:
        raise DataError(f"the training split has {meta['train_tokens']} tokens, fewer than "
                        f"model.context_length + 1 = {needed}; use more text or a smaller "
                        "model.context_length")
    if meta["validation_tokens"] < needed:
        if data.validation_split:
            more = f"a larger split than data.validation_split={data.validation_split!r}"
        else:
            more = f"a larger data.validation_fraction (now {data.validation_fraction})"
        raise DataError(f"the validation split has {meta['validation_tokens']} tokens, fewer than "
                        f"model.context_length + 1 = {needed}; use {more} or a smaller "
                        "model.context_length")

