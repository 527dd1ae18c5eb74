"""Text in, token batches out: sources, the token cache, splits and batch sampling.

`prepare_data(config)` turns the `data:` and `tokenizer:` sections of a config into two flat
token files, one per split, memory-mapped for training:

1. Source. A Hugging Face hub dataset (`data.dataset`, which may also be a local dataset
   folder), or local files: plain text, JSON lines or Parquet, given as paths, globs or
   folders (`data.files`), optionally downloaded once from `data.url`. All of it is read
   through `datasets`; local files are streamed, never copied into an Arrow cache. A plain
   text file is one document (a folder of .txt files: one document per file), so a single
   file must fit in memory; corpora larger than memory come as many files, JSON lines,
   Parquet or a (streamed) hub dataset.
2. Split. The dataset's own validation split when `data.validation_split` is set.
   Otherwise every document whose index i has floor((i+1)f) > floor(i f), f =
   `data.validation_fraction` (for f = 0.1: documents 9, 19, 29, ...): deterministic,
   evenly spread, exactly floor(N f) documents, and it needs no count of N, so streams
   work. A corpus with too few documents for that (one long text, a handful of files)
   holds out the last fraction of its characters instead: Tiny Shakespeare's validation
   split is its last 10%, the split behind published results. `data.max_documents` keeps
   the first N non-empty documents (of each split, when the dataset has its own).
3. Tokenizer, trained on the training split only (`tinyattn.tokenizer`).
4. Token files `train.bin` and `validation.bin`: uint16 when the vocabulary fits, else
   uint32, with `<|endoftext|>` between documents. Documents are encoded in batches and
   appended to the file as they come, so memory does not grow with the corpus.

The cache folder's name ends in a hash of everything that produced it (the source and
each file's size and modification time, the text field, the split rule, the tokenizer
settings, a format version), so a second run reuses it and any change builds a new one.
Every file is written under a temporary name and renamed; `meta.json` is written last,
and a folder is trusted only when its `meta.json` matches the hash and the file sizes. A
build that is interrupted, or whose splits turn out too short, leaves no `meta.json`.

`BatchSampler` draws random training windows; `eval_batches` walks fixed ones.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import json
import math
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
import tokenizers
from tqdm import tqdm

from tinyattn.config import Config, DataConfig
from tinyattn.errors import DataError
from tinyattn.files import atomic_write
from tinyattn.tokenizer import Tokenizer, build_tokenizer

FORMAT_VERSION = 1  # bump when the layout or meaning of the cache files changes
EXTENSIONS = {
    "text": (".txt", ".text", ".md"),
    "json": (".jsonl", ".json", ".ndjson"),
    "parquet": (".parquet",),
}
ENCODE_BATCH_CHARS = 1 << 20  # characters handed to the tokenizer at once (encoded in parallel)


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # memmap, uint16 or uint32, flat tokens
    validation: np.ndarray
    cache_dir: Path


def prepare_data(config: Config, *, progress: bool = True) -> TokenData:
    """Tokenize the configured corpus once into a cache folder and memory-map it.

    Uses `config.data`, `config.tokenizer`, and `config.model.context_length` (each split
    must hold at least one window of context_length + 1 tokens).
    """
    data = config.data
    source = _resolve_source(data, progress)
    inputs = _cache_inputs(source, config)
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    folder = Path(data.cache_dir).resolve() / f"{source.name}-{_tokenizer_slug(config)}-{key[:12]}"
    meta = _trusted_meta(folder, key)
    if meta is None:
        meta = _build_cache(folder, key, inputs, source, config, progress)
        _check_split_lengths(meta, config)  # before meta.json: short splits are never trusted
        with atomic_write(folder / "meta.json") as f:
            f.write(json.dumps(meta, indent=2).encode())
    else:
        _check_split_lengths(meta, config)
    return TokenData(
        tokenizer=Tokenizer.from_file(folder / "tokenizer.json"),
        train=np.memmap(folder / "train.bin", dtype=meta["dtype"], mode="r"),
        validation=np.memmap(folder / "validation.bin", dtype=meta["dtype"], mode="r"),
        cache_dir=folder,
    )


# ----------------------------------------------------------------------------- sources


@dataclass
class _Source:
    """Where documents come from, resolved: what to show, what to hash, how to load."""

    description: str  # for messages: "data/tinyshakespeare.txt", "hub dataset 'x/y'"
    name: str  # the readable start of the cache folder's name
    identity: dict  # hashed into the cache key
    load: Callable[[str], Any]  # split name -> datasets.Dataset or IterableDataset
    files: list[Path] = field(default_factory=list)  # local files, to locate read errors
    format: Optional[str] = None  # text, json or parquet for local files
    rows_per_batch: int = 1000


def _resolve_source(data: DataConfig, progress: bool) -> _Source:
    if data.dataset is not None:
        return _hub_source(data)
    if data.validation_split is not None:
        raise DataError(f"data.validation_split: {data.validation_split!r} needs a hub dataset "
                        "(data.dataset); local files are split by data.validation_fraction")
    if data.url is not None and not Path(data.files[0]).exists():
        _download(data.url, Path(data.files[0]), sha256=data.sha256, size_bytes=data.size_bytes,
                 progress=progress)
    files = _resolve_files(data.files, data.format)
    file_format = _common_format(files, data.format)
    return _file_source(data, files, file_format)


def _hub_source(data: DataConfig) -> _Source:
    name = data.dataset
    identity: dict = {"dataset": name, "config": data.dataset_config, "revision": data.revision}
    local = Path(name)
    if local.is_dir():  # a dataset folder on disk: its files decide whether the cache is current
        identity["files"] = [_file_identity(p) for p in sorted(local.rglob("*")) if p.is_file()
                             and not any(part.startswith(".") for part in p.relative_to(local).parts)]

    def load(split: str):
        import datasets  # imported here: it is slow to import and only data preparation needs it

        try:
            return datasets.load_dataset(name, data.dataset_config, split=split, revision=data.revision,
                                         streaming=data.streaming)
        except ConnectionError:
            raise DataError(f"data.dataset: cannot reach {name!r} on the Hugging Face Hub (offline or "
                            "no network); download it while online, or point data.files at local files"
                            ) from None
        except datasets.exceptions.DatasetNotFoundError as e:
            raise DataError(f"data.dataset: {_first_line(e)}; check the name, or point data.files at "
                            "local files") from None
        except datasets.exceptions.DatasetGenerationError as e:
            reason = _first_line(e.__cause__ or e)
            raise DataError(f"data.dataset: cannot read {name!r}: {reason}") from None
        except FileNotFoundError as e:
            raise DataError(f"data.dataset: {_first_line(e)}") from None
        except ValueError as e:  # an unknown split or config name; the message lists the valid ones
            raise DataError(f"data.dataset {name!r}: {_first_line(e)}") from None

    slug = name.rstrip("/").rsplit("/", 1)[-1]
    return _Source(description=f"dataset {name!r}", name=_slug(slug), identity=identity, load=load)


def _file_source(data: DataConfig, files: list[Path], file_format: str) -> _Source:
    builder_options: dict = {}
    rows_per_batch = 1000
    if file_format == "text":
        builder_options = {"sample_by": "document"}  # the whole file is one row, not each line
        rows_per_batch = 8  # each row is a whole file
    elif file_format == "parquet":
        _check_parquet_field(files, data.text_field)
        builder_options = {"columns": [data.text_field]}  # read only that column

    lock_folder = Path(data.cache_dir).resolve() / "datasets"

    def load(split: str):
        import datasets

        # Streaming reads the files lazily, so nothing is copied into an Arrow cache; datasets
        # still leaves a lock file per corpus in cache_dir, which is kept beside our caches.
        return datasets.load_dataset(file_format, data_files=[str(p) for p in files], split="train",
                                     streaming=True, cache_dir=str(lock_folder), **builder_options)

    stem = files[0].stem if len(files) == 1 else Path(os.path.commonpath(files)).name
    description = str(files[0]) if len(files) == 1 else f"{len(files)} files ({', '.join(data.files)})"
    identity = {"files": [_file_identity(p) for p in files], "format": file_format, "url": data.url}
    return _Source(description=description, name=_slug(stem), identity=identity, load=load,
                   files=files, format=file_format, rows_per_batch=rows_per_batch)


def _resolve_files(entries: list[str], file_format: str) -> list[Path]:
    """Paths, globs and folders -> the files they name, in order, each once."""
    accepted = _extensions(file_format)
    files: list[Path] = []
    for entry in entries:
        path = Path(entry)
        if any(c in entry for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(entry, recursive=True) if Path(p).is_file())
            if not matches:
                raise DataError(f"data.files: no file matches the pattern {entry!r}")
            files.extend(matches)
        elif path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in accepted
                             and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not matches:
                raise DataError(f"data.files: the folder {entry} has no {', '.join(accepted)} files")
            files.extend(matches)
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"data.files: file not found: {entry}")
    return list(dict.fromkeys(p.resolve() for p in files))


def _extensions(file_format: str) -> tuple[str, ...]:
    if file_format == "auto":
        return tuple(itertools.chain(*EXTENSIONS.values()))
    return EXTENSIONS[file_format]


def _common_format(files: list[Path], file_format: str) -> str:
    if file_format != "auto":
        return file_format
    by_format: dict[str, Path] = {}
    for path in files:
        found = [name for name, suffixes in EXTENSIONS.items() if path.suffix.lower() in suffixes]
        if not found:
            raise DataError(f"data.files: cannot tell the format of {path} from its extension; set "
                            f"data.format to text, json or parquet")
        by_format.setdefault(found[0], path)
    if len(by_format) > 1:
        mixed = ", ".join(f"{name} ({path.name})" for name, path in by_format.items())
        raise DataError(f"data.files: mixes formats: {mixed}; use files of one format")
    return next(iter(by_format))


def _check_parquet_field(files: list[Path], text_field: str) -> None:
    import pyarrow
    import pyarrow.parquet

    for path in files:
        try:
            names = pyarrow.parquet.read_schema(path).names
        except (pyarrow.ArrowException, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
        if text_field not in names:
            raise DataError(_missing_field_message(text_field, str(path), names))


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _download(url: str, path: Path, *, sha256: Optional[str], size_bytes: Optional[int],
              progress: bool) -> None:
    """Fetch `url` into `path` through a temporary file, checking its size and hash.

    A download that fails or fails a check is deleted, so the next run downloads again
    instead of trusting it.
    """
    digest = hashlib.sha256()
    received = 0
    with atomic_write(path) as out:  # a failed download or check leaves no file behind
        try:
            with urllib.request.urlopen(url, timeout=60) as response, \
                    tqdm(total=int(response.headers.get("Content-Length") or 0) or None, unit="B",
                         unit_scale=True, disable=not progress, desc=f"downloading {path.name}") as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        except (OSError, ValueError) as e:  # URLError, HTTPError are OSErrors; ValueError: bad URL
            reason = e.reason if type(e) is urllib.error.URLError else e
            raise DataError(f"data.url: cannot download {url} ({reason}); put the file at {path} "
                            "yourself (data.files)") from None
        if size_bytes is not None and received != size_bytes:
            raise DataError(f"data.url: {url} gave {received} bytes, not data.size_bytes={size_bytes}; "
                            "the download was deleted")
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise DataError(f"data.url: {url} has sha256 {digest.hexdigest()}, not data.sha256={sha256}; "
                            "the download was deleted")


# ----------------------------------------------------------------------------- documents


def _documents(dataset, source: _Source, text_field: str) -> Iterator[str]:
    """The non-empty texts of `dataset`, in order, read a batch of rows at a time."""
    import pyarrow

    try:
        for table in dataset.with_format("arrow").iter(batch_size=source.rows_per_batch):
            if text_field not in table.column_names:
                names = table.column_names
                raise DataError(_missing_field_message(text_field, source.description, names))
            column = table.column(text_field)
            if not (pyarrow.types.is_string(column.type) or pyarrow.types.is_large_string(column.type)
                    or pyarrow.types.is_string_view(column.type)):
                raise DataError(f"data.text_field: {text_field!r} of {source.description} holds "
                                f"{column.type} values, not text")
            for text in column.to_pylist():
                if text:
                    yield text
    except UnicodeDecodeError as e:
        found = _find_invalid_utf8(source.files)
        raise DataError(found or f"{source.description}: not valid UTF-8 ({e})") from None
    except pyarrow.ArrowInvalid as e:
        found = _find_invalid_json(source.files) if source.format == "json" else None
        raise DataError(found or f"{source.description}: cannot read it ({_first_line(e)})") from None


def _missing_field_message(text_field: str, where: str, names: list[str]) -> str:
    return (f"data.text_field: {where} has no field {text_field!r}; its fields are: "
            f"{', '.join(names) or '(none)'}")


def _find_invalid_utf8(files: list[Path]) -> Optional[str]:
    """The first file that is not valid UTF-8, with the byte offset and line of the fault."""
    for path in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, lines = 0, 0  # bytes and newlines before the current chunk
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                pending = len(decoder.getstate()[0])  # an incomplete character carried over
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as e:
                    position = offset - pending + e.start
                    line = lines + chunk[:max(0, position - offset)].count(b"\n") + 1
                    return (f"{path}: not valid UTF-8 at byte {position} (line {line}); "
                            "save it as UTF-8")
                offset += len(chunk)
                lines += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return f"{path}: not valid UTF-8: it ends inside a character (byte {offset})"
    return None


def _find_invalid_json(files: list[Path]) -> Optional[str]:
    """The first JSON lines file with a line that does not parse, and that line."""
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            json.loads(text)
            continue  # one JSON document (an array of records): fine
        except ValueError:
            pass
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    json.loads(line)
                except ValueError as e:
                    return f"{path}: line {number} is not valid JSON ({e.msg} at column {e.colno})"
    return None


# ----------------------------------------------------------------------------- splits


@dataclass
class _Splits:
    train: Callable[[], Iterator[str]]  # each call streams the training documents again
    validation: Callable[[], Iterator[str]]
    rule: str  # how validation was chosen, recorded in meta.json


def _split(source: _Source, data: DataConfig) -> _Splits:
    limit = data.max_documents

    def stream(dataset) -> Callable[[], Iterator[str]]:
        return lambda: itertools.islice(_documents(dataset, source, data.text_field), limit)

    train_set = source.load(data.train_split)
    if data.validation_split is not None:
        validation_set = source.load(data.validation_split)
        return _Splits(stream(train_set), stream(validation_set),
                       f"dataset split {data.validation_split!r}")

    everything = stream(train_set)
    f = data.validation_fraction
    first_held = next(i for i in itertools.count() if _held_out(i, f))
    count = sum(1 for _ in itertools.islice(everything(), first_held + 1))
    if count == 0:
        raise DataError(f"{source.description}: the corpus is empty (no text in field "
                        f"{data.text_field!r})")
    if count > first_held:
        return _Splits(lambda: (d for i, d in enumerate(everything()) if not _held_out(i, f)),
                       lambda: (d for i, d in enumerate(everything()) if _held_out(i, f)),
                       f"every document i with floor((i+1)*{f}) > floor(i*{f})")
    # Too few documents to hold whole ones out: the last fraction of the characters.
    total = sum(len(d) for d in everything())
    cut = int(total * (1 - f))  # int(n * 0.9): the split published Tiny Shakespeare results use
    return _Splits(lambda: _characters_before(everything(), cut),
                   lambda: _characters_from(everything(), cut),
                   f"the last {f} of the characters ({total - cut} of {total})")


def _held_out(index: int, fraction: float) -> bool:
    return math.floor((index + 1) * fraction) > math.floor(index * fraction)


def _characters_before(documents: Iterator[str], cut: int) -> Iterator[str]:
    position = 0
    for text in documents:
        if position + len(text) >= cut:
            if cut > position:
                yield text[:cut - position]
            return
        yield text
        position += len(text)


def _characters_from(documents: Iterator[str], cut: int) -> Iterator[str]:
    position = 0
    for text in documents:
        if position + len(text) > cut:
            yield text[max(0, cut - position):]
        position += len(text)


# ----------------------------------------------------------------------------- the cache


def _cache_inputs(source: _Source, config: Config) -> dict:
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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "data"


def _trusted_meta(folder: Path, key: str) -> Optional[dict]:
    """meta.json of a complete cache built from `key`, or None if anything is off."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta["key"] != key or meta["format_version"] != FORMAT_VERSION:
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


def _build_cache(folder: Path, key: str, inputs: dict, source: _Source, config: Config,
                 progress: bool) -> dict:
    """Tokenize both splits into `folder`; every file but meta.json, which the caller writes."""
    splits = _split(source, config.data)
    tokenizer = build_tokenizer(config.tokenizer, splits.train, progress=progress)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").unlink(missing_ok=True)  # from here on, nothing in the folder is trusted
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    meta = {"format_version": FORMAT_VERSION, "key": key, "dtype": np.dtype(dtype).name,
            "vocab_size": tokenizer.vocab_size, "validation_rule": splits.rule, "inputs": inputs}
    # Each file lands whole or not at all; the folder is trusted only once the caller
    # writes meta.json after all of them.
    for split, documents in (("train", splits.train), ("validation", splits.validation)):
        with atomic_write(folder / f"{split}.bin") as out:
            tokens, count = _write_tokens(documents(), tokenizer, out, dtype,
                                         progress=progress, desc=f"tokenizing {split}")
        meta[f"{split}_tokens"], meta[f"{split}_documents"] = tokens, count
    tokenizer.save(folder / "tokenizer.json")
    return meta


def _write_tokens(documents: Iterator[str], tokenizer: Tokenizer, out, dtype, *, progress: bool = False,
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


def _check_split_lengths(meta: dict, config: Config) -> None:
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


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ----------------------------------------------------------------------------- batches


class BatchSampler:
    """Random windows of context_length + 1 tokens -> (x, y) int64 tensors of shape (B, T),
    y = x shifted by one.

    Batch k of rank r is drawn by a numpy Generator seeded with (seed, r, k), so the whole
    state is the number of batches drawn: `state_dict` saves that count, a resumed run
    draws exactly the batches it would have drawn, and any rank can resume from the state
    rank 0 saved (the rank is not restored from it, so ranks keep drawing different
    windows). Windows may overlap and repeat; with far more windows than draws that costs
    nothing and keeps sampling O(batch) instead of O(corpus).
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, context_length: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if len(tokens) < context_length + 1:
            raise DataError(f"{len(tokens)} tokens cannot fill one window of model.context_length + 1 = "
                            f"{context_length + 1}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.tokens = tokens
        self.batch_size = batch_size
        self.context_length = context_length
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.batches_drawn = 0
        self._offsets = np.arange(context_length + 1)  # (T+1,)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        # SeedSequence needs non-negative entropy; the modulo maps a negative seed into range.
        rng = np.random.default_rng([self.seed % (1 << 64), self.rank, self.batches_drawn])
        self.batches_drawn += 1
        starts = rng.integers(0, len(self.tokens) - self.context_length, size=self.batch_size)  # (B,)
        # One fancy-indexing gather: numpy reads only the pages these windows touch, so the
        # memmap is never loaded whole and no Python loop runs over tokens.
        windows = self.tokens[starts[:, None] + self._offsets].astype(np.int64)  # (B, T+1)
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (B, T)
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (B, T)
        return x, y

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches_drawn": self.batches_drawn, "rank": self.rank,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])


def eval_batches(tokens: np.ndarray, context_length: int, batch_size: int,
                 max_windows: Optional[int] = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed evaluation windows -> (x, y) int64 tensors of shape (b, T), b <= batch_size.

    All non-overlapping windows in order, or `max_windows` of them spread evenly from the
    first token to the last; either way the same tokens every call, so the same model
    always gets the same loss.
    """
    T = context_length
    available = (len(tokens) - 1) // T  # windows of T inputs plus the one target after them
    if available == 0:
        raise DataError(f"{len(tokens)} tokens cannot fill one window of model.context_length + 1 = "
                        f"{T + 1}")
    if max_windows is None or max_windows >= available:
        starts = np.arange(available, dtype=np.int64) * T
    else:
        starts = np.linspace(0, len(tokens) - T - 1, max_windows).round().astype(np.int64)
    offsets = np.arange(T + 1)
    for first in range(0, len(starts), batch_size):
        windows = tokens[starts[first:first + batch_size, None] + offsets].astype(np.int64)  # (b, T+1)
        yield (torch.from_numpy(np.ascontiguousarray(windows[:, :-1])),
               torch.from_numpy(np.ascontiguousarray(windows[:, 1:])))
