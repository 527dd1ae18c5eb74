"""Where documents come from: hub datasets, local files (paths, globs, folders), their formats.

`resolve_source(data_config)` turns the `data:` section into a `Source`: what to show in
messages, what to hash into the token cache's key, and how to read each split. A Hugging
Face hub dataset (`data.dataset`, which may also be a local dataset folder), or local
files given as paths, globs or folders (`data.files`), optionally downloaded once from
`data.url` (`tinyattn.download`):

- plain text (.txt .text .md): one document per file, read here in pieces of
  `READ_CHARS` characters cut at newlines (`tokenizer.text_pieces`), where our tokenizers'
  tokens do not change, so a single file of any size is read in flat memory (a tokenizer
  whose tokens change at a cut gets the pieces joined back, `token_cache.write_tokens`); a
  UTF-8 byte-order mark is dropped;
- JSON lines or a JSON array (.jsonl .json .ndjson), CSV (.csv), TSV (.tsv) and Parquet,
  read through `datasets`' builders, streamed, never copied into an Arrow cache; the
  text is the `data.text_field` column, or a nested field named by a dotted path
  (`body.text`);
- any of them but Parquet compressed as .gz, .bz2, .xz or .zst (the format is the inner
  extension: `part-0.jsonl.gz` is JSON lines). `datasets` and this module both decompress
  through fsspec, which reads .zst only with the `zstandard` package installed.

A document stream is a sequence of parts `(text, starts_document)`: a JSON record or a
CSV row is one part, a large text file several. When reading fails, the file at fault is
hunted down so the message can name it: the first byte that is not UTF-8 (with its line),
or the first JSON line that does not parse. Records whose text field is null, missing or
empty are skipped, and how many is said once (`SkippedRecords`).
"""

from __future__ import annotations

import codecs
import csv
import functools
import glob
import io
import itertools
import json
import logging
import os
import re
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

from tqdm import tqdm

from tinyattn.config import Config, DataConfig
from tinyattn.data.download import download
from tinyattn.data.tokenizer import text_pieces
from tinyattn.errors import DataError
from tinyattn.system.console import notice
from tinyattn.system.storage import looked_for_at, nul_found, unicode_mark

EXTENSIONS = {
    "text": (".txt", ".text", ".md"),
    "json": (".jsonl", ".json", ".ndjson"),
    "csv": (".csv",),
    "tsv": (".tsv",),
    "parquet": (".parquet",),
}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}  # fsspec's names
# What a token cache writes in data.cache_dir, never read as data (written here: token_cache sits above
# this module): a folder `<source>-<tokenizer>-<12 hex digits of its key>` of these files (`TokenCache`),
# beside it its build lock, train.init_from's copies of a checkpoint's tokenizer (train/finetune.py),
# and in DATASETS_LOCKS the lock files datasets leaves for each JSON, CSV or Parquet file it reads.
CACHE_FILES = ("train.bin", "validation.bin", "tokenizer.json", "meta.json")
CACHE_FOLDER = re.compile(r".+-[0-9a-f]{12}")
CACHE_SIDE_FILES = re.compile(r"\..+-[0-9a-f]{12}\.build\.filelock|init_from-[0-9a-f]{16}-tokenizer\.json")
DATASETS_LOCKS = "datasets"
READ_CHARS = 1 << 22  # a text file is read this many characters at a time
REPORT_BYTES = 1 << 26  # text files at least this large report how far reading has got
CSV_CHUNK_BYTES = 1 << 24  # CSV and TSV files are parsed about this many bytes of rows at a time
CSV_NUL_BYTES = 1 << 16  # the start of a CSV or TSV file looked at for a NUL (UTF-16: its first two bytes)
CSV_SAMPLE_BYTES = 1 << 22  # the start of a CSV or TSV file read to learn how long its rows are
CSV_CHUNK_ROWS = 10_000  # datasets' csv builder's own chunk, in rows: where rows are short
TABLE_ROWS = 1000  # records read from datasets at a time

DocumentParts = Iterator[tuple[str, bool]]  # (text, whether it starts a new document)


@dataclass
class Source:
    """Where documents come from, resolved: what to show, what to hash, how to read."""

    description: str  # for messages: "data/tinyshakespeare.txt", "hub dataset 'x/y'"
    name: str  # the readable start of the cache folder's name
    identity: dict  # hashed into the cache key
    # split name -> a function that streams that split's documents anew at each call
    reader: Callable[[str], Callable[[], DocumentParts]]
    empty: Optional[str] = None  # what a corpus with no text is said to be; None: no text in data.text_field


def resolve_source(data: DataConfig, progress: bool) -> Source:
    if data.dataset is not None:
        if Path(data.dataset).is_dir():
            return _folder_source(data, progress)
        _refuse_what_no_hub_has(data.dataset)
        return _hub_source(data)
    if data.validation_split is not None:
        raise DataError(f"data.validation_split: {data.validation_split!r} needs a hub dataset "
                        "(data.dataset); local files are split by data.validation_fraction")
    if data.train_split != "train":
        raise DataError(f"data.train_split: {data.train_split!r} needs a hub dataset (data.dataset); "
                        "local files are read whole and split by data.validation_fraction")
    if data.url is not None:
        target = Path(data.files[0])
        if target.is_dir() or data.files[0].endswith(("/", os.sep)):
            raise DataError(f"data.files: {data.files[0]} is a folder; data.url is downloaded to one "
                            "file, so give its path (e.g. data/corpus.txt)")
        if not target.exists():
            download(data.url, target, sha256=data.sha256, size_bytes=data.size_bytes, progress=progress)
    files = _resolve_files(data.files, data.format, cache_dir=Path(data.cache_dir))
    file_format = _common_format(files, data.format)
    return _file_source(data, files, file_format, progress)


def _refuse_what_no_hub_has(name: str) -> None:
    """data.dataset that is no folder here and names what the hub has none of: a file, a path (a
    folder not found), or one of datasets' own readers (json, csv, ...). load_dataset("json") reads
    the files of the folder run from, into a cache keyed by the name alone: other files there, or
    the same ones edited, trained the first reading's tokens (and a resume saw no change)."""
    if Path(name).is_file():
        raise DataError(f"data.dataset: {name} is a file; data.dataset is a hub name or a dataset folder: "
                        f"give the file as data.files: [{name}]")
    if name.startswith((".", "/", "~")) or name.count("/") > 1:  # no hub name starts so or has two
        raise DataError(f"data.dataset: no folder {name} (a dataset folder on disk; a hub name is "
                        "owner/name); check the path, or give the files as data.files")
    if name in _builder_names():
        formats = (f" (data.format: {name} where their extension does not say it)" if name in EXTENSIONS
                   else "")
        raise DataError(f"data.dataset: {name!r} is the name of datasets' own {name} reader, not a dataset: "
                        f"give your files as data.files{formats}")


def _builder_names() -> frozenset[str]:
    """The names load_dataset takes for its own readers, not for a hub dataset (its registry, a
    private name; a datasets release without it: the formats data.format names, and arrow and pandas)."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return frozenset(EXTENSIONS) | {"arrow", "pandas"}
    return frozenset(_PACKAGED_DATASETS_MODULES)


def _hub_source(data: DataConfig) -> Source:
    name = data.dataset
    identity = {"dataset": name, "config": data.dataset_config, "revision": data.revision}
    description = f"dataset {name!r}"

    def reader(split: str) -> Callable[[], DocumentParts]:
        import datasets  # imported here: it is slow to import and only data preparation needs it

        with _dataset_errors(name):
            dataset = datasets.load_dataset(name, data.dataset_config, split=split, revision=data.revision,
                                            streaming=data.streaming)
        skipped = SkippedRecords(f"{description} split {split!r}", data.text_field)
        return lambda: _dataset_parts(_tables(dataset, description), data.text_field, description, [], "hub",
                                      skipped=skipped)

    return Source(description=description, name=_slug(name.rstrip("/").rsplit("/", 1)[-1]),
                  identity=identity, reader=reader)


def _folder_source(data: DataConfig, progress: bool) -> Source:
    """A dataset folder on disk (data.dataset: <folder>), read as it is now: a folder of data files
    (`_folder_reader`), or one written by save_to_disk (`_saved_reader`). Its files are those
    `_folder_files` keeps: the same folder gives the same data and the same key, even with
    the token cache inside it (data/cache in data/)."""
    name, local = data.dataset, Path(data.dataset)
    _refuse_hub_only_settings(data)
    # what save_to_disk writes at the top of a Dataset's folder, and of a DatasetDict's
    saved = (local / "state.json").is_file() or (local / "dataset_dict.json").is_file()
    pattern = next((c for c in "[*?" if c in str(local.absolute())), None)
    if pattern and not saved:  # datasets finds a folder's files by patterns built on its path
        raise DataError(f"data.dataset: the folder path {str(local.absolute())!r} holds {pattern!r}, which "
                        "datasets reads as a pattern when it looks for the folder's files; rename the "
                        "folder, or give its files as data.files (a name that exists is read as named)")
    files = _folder_files(local, Path(data.cache_dir))
    identity: dict = {"dataset": name, "config": data.dataset_config, "revision": None}  # a folder has none
    identity["files"] = [_file_identity(p) for p in files]  # its files decide whether the cache is current
    if any(format_suffix(p) == ".txt" for p in files):  # caches keyed before read a document per line
        identity["text_files"] = "one document each"
    if len(_data_formats(files)) > 1:
        identity["other_formats"] = "not read"  # caches keyed before read them too (`_read_by`)
    description = f"dataset {name!r}"
    reader = _saved_reader(data, description) if saved else _folder_reader(data, files, progress, description)
    return Source(description=description, name=_slug(name.rstrip("/").rsplit("/", 1)[-1]),
                  identity=identity, reader=reader)


# What datasets never reads as a folder's data (its FILES_TO_IGNORE): a dataset card, metadata files.
DATASETS_IGNORED = frozenset({"README.md", "config.json", "dataset_info.json", "dataset_infos.json",
                              "dataset_dict.json"})


def _data_formats(files: list[Path]) -> set[str]:
    """The formats (EXTENSIONS' names) of a dataset folder's files that datasets may read as data: not
    its card (README.md, whose .md is text's) nor the metadata beside the shards, never read."""
    return {name for p in files if p.name not in DATASETS_IGNORED
            for name, suffixes in EXTENSIONS.items() if format_suffix(p) in suffixes}


def _refuse_hub_only_settings(data: DataConfig) -> None:
    """data.revision and a sliced split name what only the hub has: a folder has no revisions
    (datasets ignored it, and it changed the cache's key), and its splits are read whole."""
    if data.revision is not None:
        raise DataError(f"data.revision: {data.revision!r} names a revision of a Hugging Face Hub dataset; "
                        f"data.dataset {data.dataset!r} is a local folder, read as it is now: remove "
                        "data.revision (or set it to null)")
    for key, split in (("data.train_split", data.train_split),
                       ("data.validation_split", data.validation_split)):
        if split is not None and "[" in split:
            raise DataError(f"{key}: {split!r} is a slice, which only a hub dataset read whole "
                            f"(data.streaming: false) takes; the splits of data.dataset {data.dataset!r}, a "
                            "local folder, are read whole: name a whole split, and keep its first N "
                            "documents with data.max_documents")


def _folder_reader(data: DataConfig, files: list[Path], progress: bool,
                   description: str) -> Callable[[str], Callable[[], DocumentParts]]:
    """A folder of data files: the files of each split, as datasets finds them among `files`, each
    its own streamed dataset as data.files reads them (`_per_file_parts`): one dataset of them all
    would cast every file to the first one's columns while it is read, a CastError traceback for
    shards whose other fields differ. Always streamed: without streaming datasets reuses an Arrow
    cache it keyed by the files' times, which cp -p or touch -r carry over to new contents (the old
    text trained, filed under the new text's key). Its .txt files are read here as data.files reads
    them (`_text_reader`: one document per file, newlines kept), not by datasets' text builder (a
    document per line, its newline dropped)."""
    name, local = data.dataset, Path(data.dataset)
    # datasets names the dataset after the path's last part, and "." or "./" (the folder run from) has
    # none: "dataset_name should be specified but got None"
    path = str(local.absolute())

    def reader(split: str) -> Callable[[], DocumentParts]:
        import datasets

        with _dataset_errors(name):
            # the splits datasets finds among `files` only, unless the folder's card names them
            data_files = None if _card_lists_files(local) else _inferred_splits(data, files)
            builder = datasets.load_dataset_builder(path, data.dataset_config, data_files=data_files)
            kept = {os.path.realpath(p) for p in files}
            found = {str(s): _read_by(builder.name, [Path(f) for f in fs if os.path.realpath(f) in kept])
                     for s, fs in (builder.config.data_files or {}).items()}
            if split not in found:  # datasets' own words for it
                raise ValueError(f"Bad split: {split}. Available splits: {list(found)}")
            if builder.name == "text":
                return _text_reader(found[split], progress)(split)
            return _per_file_parts(
                found[split], builder.name, data.text_field, description,
                lambda file: datasets.load_dataset(path, data.dataset_config, split=split, streaming=True,
                                                   data_files={split: [glob.escape(str(file))]},
                                                   **_reading_options(builder.name, file)),
                skipped=SkippedRecords(f"{description} split {split!r}", data.text_field))

    return reader


BUILDER_FORMATS = {"text": ("text",), "json": ("json",), "csv": ("csv", "tsv"), "parquet": ("parquet",)}


def _read_by(builder_name: str, files: list[Path]) -> list[Path]:
    """The files of a folder's split that its builder reads: those of its format, as datasets keeps
    them when it finds a folder's files itself (load_dataset(folder) reads only the .jsonl files of a
    folder that holds a LICENSE.txt too). Given them as data_files, its builder keeps every one, and the
    LICENSE.txt was read, a document per line, by a text builder of its own. A builder tinyattn does
    not know the formats of keeps them all."""
    formats = BUILDER_FORMATS.get(builder_name)
    if formats is None:
        return files
    suffixes = tuple(itertools.chain(*(EXTENSIONS[name] for name in formats)))
    return [path for path in files if format_suffix(path) in suffixes]


def _saved_reader(data: DataConfig, description: str) -> Callable[[str], Callable[[], DocumentParts]]:
    """A folder written by save_to_disk, opened as datasets opens one, with load_from_disk (its
    load_dataset refuses it): a Dataset, whose one split is called train, or a DatasetDict, with
    the splits it was saved with. Its Arrow files are memory-mapped as they are now, not copied."""

    def reader(split: str) -> Callable[[], DocumentParts]:
        import datasets

        with _dataset_errors(data.dataset):
            saved = datasets.load_from_disk(data.dataset)
            splits = saved if isinstance(saved, datasets.DatasetDict) else {"train": saved}
            if split not in splits:  # in the words datasets uses for a folder of files
                raise ValueError(f"Bad split: {split}. Available splits: {list(splits)}")
        skipped = SkippedRecords(f"{description} split {split!r}", data.text_field)
        return lambda: _dataset_parts(_tables(splits[split], description), data.text_field, description, [],
                                      "arrow", skipped=skipped)

    return reader


def _folder_files(folder: Path, cache_dir: Optional[Path] = None) -> list[Path]:
    """What a folder gives as data, to data.files and to a data.dataset folder alike: its files at
    any depth but hidden files and folders and what a token cache writes (`_cache_file`; data/
    holds data.cache_dir by default)."""
    cache_dir = cache_dir.resolve() if cache_dir is not None else None
    return sorted(p for p in _files_below(folder) if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts)
                  and not _cache_file(p, cache_dir))


def _files_below(folder: Path) -> Iterator[Path]:
    """Every name below `folder`, in linked folders too, as a glob's `**` finds them (Path.rglob skipped
    a linked folder's files, unsaid); each real folder once (`_walk_once`)."""
    for root, _, names in _walk_once(folder):
        yield from (Path(root) / name for name in names)


def _walk_once(folder: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk of `folder` into linked folders too, each real folder once: a link to a folder above is
    no loop, and a folder reached again through a link is not walked again."""
    seen: set[str] = set()
    for root, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        yield root, folders, names


def _cache_file(path: Path, cache_dir: Optional[Path]) -> bool:
    """Whether `path` is no data but what a token cache writes: a cache folder's files, finished or
    not, under any data.cache_dir (`_in_token_cache`), and in `cache_dir` (resolved) those of a
    folder named as a cache's (a build cut short) and the files beside them (`CACHE_SIDE_FILES`,
    datasets' lock files). Nothing else under cache_dir: '.', or the data's own folder, hides no data."""
    if _in_token_cache(path):
        return True
    if cache_dir is None:
        return False
    folder = path.parent.resolve()
    if folder == cache_dir:
        return CACHE_SIDE_FILES.fullmatch(path.name) is not None
    if folder == cache_dir / DATASETS_LOCKS:
        return path.suffix == ".lock"
    return (folder.parent == cache_dir and CACHE_FOLDER.fullmatch(folder.name) is not None
            and path.name in CACHE_FILES)


def _datasets_version() -> str:
    import datasets
    return getattr(datasets, "__version__", "?")


def _inferred_splits(data: DataConfig, files: list[Path]) -> dict[str, list[str]]:
    """Which of `files` belong to which split, by datasets' rules for a folder (train.jsonl,
    validation/, data/test-00000-of-00001.parquet; else all of them train), applied to `files`
    only, and to those of them datasets has a reader for: datasets' own search of the folder would
    see the token cache inside it too, and a train.bin (a cache's, or nanoGPT's) would be the split
    train, which nothing reads.

    The risk, stated once: the rules are two private names of datasets (4.0-5.2 have them). Where a
    release drops them, a local folder is refused in one line pointing to data.files, never read
    by other rules."""
    try:
        from datasets.data_files import _get_data_files_patterns, resolve_pattern  # the rules, on our files
        from datasets.load import _ALL_ALLOWED_EXTENSIONS  # the extensions datasets reads a folder by
    except ImportError:
        raise DataError(f"data.dataset: reading the local folder {data.dataset} needs datasets' rules for "
                        f"a folder's splits, which datasets {_datasets_version()} no longer has; give its "
                        "files as data.files (with data.validation_fraction), or install datasets 4.0-5.2"
                        ) from None

    base, kept = str(Path(data.dataset).absolute()), {os.path.realpath(p) for p in files}
    names = None if any(c in base for c in "*?[") else _names_below(base)

    def resolve(pattern: str) -> list[str]:
        if names is not None and not _may_match(pattern, names):
            raise FileNotFoundError(pattern)  # no name below holds a word it needs: no glob of the folder
        found = [f for f in resolve_pattern(pattern, base, allowed_extensions=_ALL_ALLOWED_EXTENSIONS)
                 if os.path.realpath(f) in kept]
        if not found:
            raise FileNotFoundError(pattern)  # how datasets' resolver says "nothing matches"
        return found

    try:
        patterns = _get_data_files_patterns(resolve)
    except FileNotFoundError:
        raise DataError(f"data.dataset: the folder {data.dataset} has no data files datasets reads (.jsonl, "
                        ".csv, .parquet, .txt, ...; hidden files and what a token cache writes are "
                        "not read)") from None
    splits: dict[str, list[str]] = {}
    for split, split_patterns in patterns.items():
        found: list[str] = []
        for pattern in split_patterns:  # a split's patterns in order, each file once, as datasets does
            with suppress(FileNotFoundError):
                found += [f for f in resolve(pattern) if f not in found]
        # escaped: datasets reads data_files as patterns (train[1].jsonl would be train1.jsonl)
        splits[split] = [glob.escape(f) for f in found]
    return splits


def _names_below(folder: str) -> str:
    """Every name below `folder`, of files and folders, hidden ones too, in linked folders too (each real
    folder once, `_walk_once`), one a line and case-folded: where `_may_match` looks."""
    names = set()
    for _, folders, files in _walk_once(folder):
        names.update(folders, files)
    return "\n".join(sorted(names)).casefold()


def _may_match(pattern: str, names: str) -> bool:
    """False where a glob pattern relative to a folder cannot match anything below it: a run of its literal
    characters (between wildcards, character sets and separators) matches the same characters within
    one name of a path, so each run is in `names` (`_names_below`). datasets tries dozens of patterns of
    split names on a folder, each a glob of the whole folder; most hold a word no name below has."""
    words = [w for w in re.split(r"\[[^\]/]*\]|[*?/]", pattern) if w]
    if any(c in w for w in words for c in "[]\\"):
        return True  # a character set or an escape not read here: left to the glob
    return all(w.casefold() in names for w in words)


def _card_lists_files(folder: Path) -> bool:
    """Whether the folder's dataset card (README.md's YAML header) names each config's files
    (`configs: [{config_name, data_files}]`, as a hub dataset's snapshot does): datasets then reads
    those, and `data.dataset_config` picks one."""
    readme = folder / "README.md"
    if not readme.is_file():
        return False
    import yaml
    from huggingface_hub import DatasetCard

    try:
        configs = DatasetCard.load(readme).data.to_dict().get("configs") or []
    except (yaml.YAMLError, ValueError) as e:
        raise DataError(f"{readme}: its YAML header (the dataset card's metadata) does not parse "
                        f"({_first_line(e)}); fix or remove it") from None
    if not isinstance(configs, list):
        raise DataError(f"{readme}: configs: expected a list of configs (config_name, data_files), got "
                        f"{configs!r}; fix or remove it")
    return any(isinstance(c, dict) and "data_files" in c for c in configs)


@contextmanager
def _dataset_errors(name: str) -> Iterator[None]:
    """What loading `data.dataset` raises, from the hub or a dataset folder, as one line."""
    import datasets

    try:
        with _library_logs_quiet():
            yield
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
    except StopIteration:  # a hub dataset's JSON builder found no record in the split's first file to
        # learn the columns from (a dataset folder's files are each their own dataset: `_per_file_datasets`)
        raise DataError(f"data.dataset: {name}: an empty JSON lines file (no records); "
                        "remove it, or give it records") from None
    except ValueError as e:  # an unknown split or config name; the message lists the valid ones
        raise DataError(f"data.dataset {name!r}: {_first_line(e)}") from None


@contextmanager
def _library_logs_quiet() -> Iterator[None]:
    """The libraries' own log lines kept from the console while they read: without a network the
    hub's client logs a warning at each of five retries ("... Retrying in 1s [Retry 1/5]"), and
    datasets logs "Failed to load JSON from file ..." before it raises. What ends the read is
    raised, and becomes one line (`_dataset_errors`, `_reading_errors`)."""
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _file_source(data: DataConfig, files: list[Path], file_format: str, progress: bool) -> Source:
    stem = _bare_name(files[0]) if len(files) == 1 else Path(os.path.commonpath(files)).name
    description = str(files[0]) if len(files) == 1 else f"{len(files)} files ({', '.join(data.files)})"
    # data.url only says where a missing file is downloaded from: the files' bytes key the cache (the
    # token cache hashes them), so another url for the same file keeps it. "url": None stays in
    # the identity so that caches keyed before, without a url, keep their keys.
    identity = {"files": [_file_identity(p) for p in files], "format": file_format, "url": None}
    empty = None
    if file_format == "text":  # no field to name: the files themselves hold no text
        reader = _text_reader(files, progress)
        empty = ("the file is empty (no text to train on)" if len(files) == 1
                 else "the corpus is empty (every file is empty)")
    else:
        reader = _records_reader(data, files, file_format, description)
    return Source(description=description, name=_slug(stem), identity=identity, reader=reader, empty=empty)


def _text_reader(files: list[Path], progress: bool) -> Callable[[str], Callable[[], DocumentParts]]:
    """Plain text files, read here (see `_read_text_file`): one document per file."""
    passes = itertools.count(1)  # each reading of the corpus, numbered in progress lines

    def reader(split: str) -> Callable[[], DocumentParts]:
        return lambda: _text_parts(files, progress, next(passes))

    return reader


def _records_reader(data: DataConfig, files: list[Path], file_format: str,
                    description: str) -> Callable[[str], Callable[[], DocumentParts]]:
    """How `datasets` reads JSON, CSV, TSV and Parquet files: one document per record."""
    builder, options = file_format, {}
    if file_format == "parquet":
        options = {"columns": [_parquet_column(files, data.text_field)]}  # read only that column
    elif file_format in ("csv", "tsv"):
        # Read the text column as written: a review "10" stays the text "10", not a number.
        # keep_default_na off: a text "NA", "null" or "None" is that text, not a missing value.
        builder, options = "csv", {"sep": "," if file_format == "csv" else "\t",
                                   "converters": {data.text_field: str}, "keep_default_na": False}
    lock_folder = Path(data.cache_dir).resolve() / DATASETS_LOCKS

    def reader(split: str) -> Callable[[], DocumentParts]:
        import datasets

        # Streaming reads the files lazily, so nothing is copied into an Arrow cache; datasets
        # still leaves a lock file per file (each is its own dataset) in cache_dir, kept beside our
        # caches. It does read the start of each file, to learn its columns.
        return _per_file_parts(files, file_format, data.text_field, description, lambda path: (
            # escaped: datasets reads data_files as patterns, and data[1].jsonl would read data1.jsonl
            datasets.load_dataset(builder, data_files=[glob.escape(str(path))], split="train", streaming=True,
                                  cache_dir=str(lock_folder), **options,
                                  **_reading_options(file_format, path))),
            skipped=SkippedRecords(description, data.text_field))

    return reader


def _reading_options(file_format: str, path: Path) -> dict:
    """datasets' builder options for the one file `path`: a CSV or TSV file's chunk (`_csv_chunking`), a
    Parquet file's batch (`_parquet_batching`); nothing for another format."""
    if file_format == "parquet":
        return _parquet_batching(path)
    return _csv_chunking(file_format, path)


def _parquet_batching(path: Path) -> dict:
    """datasets' parquet builder option for `path`: its `batch_size`, the rows of its first row group
    that has any. Left to itself datasets reads batches of the first row group's rows, none in a file
    with no rows (an empty shard a writer left) or one that opens with an empty row group, and pyarrow
    refuses batches of no rows: the run ended in "BatchSize must be greater than 0". A file with no
    rows gets batches of one row, and yields none. A file pyarrow cannot read is left to datasets,
    whose reading of it says so, naming it."""
    import pyarrow
    import pyarrow.parquet

    try:
        metadata = pyarrow.parquet.read_metadata(path)
    except (pyarrow.ArrowException, OSError):
        return {}
    rows = (metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    return {"batch_size": next((count for count in rows if count > 0), 1)}


def _csv_chunking(file_format: str, path: Path) -> dict:
    """datasets' csv builder option for `path`: its `chunksize`, the rows pandas parses at once, so that
    a chunk holds about CSV_CHUNK_BYTES (`_csv_chunk_rows`); nothing for another format."""
    if file_format not in ("csv", "tsv"):
        return {}
    return {"chunksize": _csv_chunk_rows(path, "\t" if format_suffix(path) == ".tsv" else ",")}


def _csv_chunk_rows(path: Path, separator: str) -> int:
    """How many rows of `path` make about CSV_CHUNK_BYTES, judged by the rows in its first
    CSV_SAMPLE_BYTES; at most CSV_CHUNK_ROWS. pandas holds a chunk whole, several times over: 10,000
    documents of 30 KB (a 300 MB file) were parsed at once, 2.1 GB at the peak. Judged once per
    version of the file: its loading and each reading ask."""
    stat = path.stat()
    return _sampled_chunk_rows(path, separator, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _sampled_chunk_rows(path: Path, separator: str, size: int, mtime_ns: int) -> int:
    """`_csv_chunk_rows` of the file as it is at that size and time."""
    try:
        with _open_binary(path) as f:
            sample = f.read(CSV_SAMPLE_BYTES)
    except Exception:  # a damaged compressed file: datasets' reading of it says so, naming it
        return CSV_CHUNK_ROWS
    rows = -1  # the header is no row
    try:
        for _ in csv.reader(io.StringIO(sample.decode("utf-8", errors="ignore"), newline=""),
                            delimiter=separator):
            rows += 1
    except csv.Error:  # a field over the csv module's limit (131,072 characters): long rows
        pass
    if len(sample) == CSV_SAMPLE_BYTES:
        rows -= 1  # the sample's last row may be cut short
    if rows < 1:  # not one whole row in the sample
        return 1
    return max(1, min(CSV_CHUNK_ROWS, CSV_CHUNK_BYTES * rows // len(sample)))


def _per_file_parts(files: list[Path], file_format: str, text_field: str, description: str,
                    load: Callable[[Path], object], *,
                    skipped: SkippedRecords) -> Callable[[], DocumentParts]:
    """How data.files and a dataset folder read their JSON, CSV, TSV and Parquet files: each its own
    dataset (`_per_file_datasets`), a failure named by its file (`_reading_errors`). A JSON text
    field of another type is refused first, before datasets turns every later text into JSON source
    text. Returns a function that streams the documents anew at each call."""
    with _reading_errors(description, files, file_format):
        if file_format == "json":
            problem = _json_text_of_another_type(files, text_field)
            if problem:
                raise DataError(problem)
        elif file_format in ("csv", "tsv"):
            for path in files:
                _refuse_nul_at_start(path)
    per_file = _per_file_datasets(files, file_format, load)
    return lambda: _dataset_parts(_file_tables(per_file, file_format), text_field, description, files,
                                  file_format, skipped=skipped)


def _per_file_datasets(files: list[Path], file_format: str,
                       load: Callable[[Path], object]) -> list[tuple[Path, object]]:
    """Each file as its own streamed dataset (`load(path)`), in the files' order: datasets casts every
    file of a dataset to the first one's columns, and only the text field need agree (other fields may
    differ between shards, or a first shard's texts may all be null). An empty JSON file among others
    is zero records, left out (datasets cannot learn columns from it); only a split of nothing but
    empty JSON files is refused."""
    per_file = []
    for path in files:
        with _reading_errors(str(path), [path], file_format), _no_download_counts():
            try:
                per_file.append((path, load(path)))
            except StopIteration:  # datasets' JSON builder found no record to learn the columns from
                continue
    if files and not per_file:
        raise DataError(f"{files[0]}: an empty JSON lines file (no records); remove it, or give it records")
    return per_file


@contextmanager
def _no_download_counts() -> Iterator[None]:
    """Inside the block, datasets sends no download count to the hub. It counts each load of its json,
    csv and parquet builders with a HEAD request (3 s timeout) unless offline, and each local file is a
    load of its own here: 1,000 shards sent 1,000 requests, 122 s where the network was unreachable.
    A local file is no download. A datasets release without the setting (datasets>=4.0 has no upper
    bound in pyproject.toml) reads the files as it is, and is left without it."""
    import datasets.config

    absent = object()
    before = getattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", absent)
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        if before is absent:
            del datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
        else:
            datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = before


# ----------------------------------------------------------------------------- paths from another folder

PATH_KEYS = ("files", "dataset", "cache_dir")  # the data section's keys that may hold relative paths


def read_from(config: Config, folder: Optional[Path],
              keys: tuple[str, ...] = PATH_KEYS) -> tuple[Config, list[str]]:
    """`config` with the relative data paths of `keys` read from `folder` (the one a run started in)
    where the folder run from is another, each where `folder` holds it (a glob: where it matches a name
    there), and the dotted keys moved; `config` itself where none moved. An absolute path, a hub name,
    a path `folder` lacks, and all of them where `folder` is None or gone, stay as given: read from
    the folder run from, whose messages then name it. The config's other sections are the same
    objects (what reading the data sets, the vocabulary's size, is the run's)."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the folder run from was removed meanwhile: it holds nothing to read
        here = None
    if folder is None or not folder.is_dir() or folder.resolve() == here:
        return config, []

    def moved(path: str) -> str:
        if Path(os.path.expanduser(path)).is_absolute():
            return path
        there = folder / path
        found = there.exists() or (any(c in path for c in "*?[")
                                   and bool(glob.glob(path, root_dir=folder, recursive=True)))
        return str(there) if found else path

    data = config.data
    changes: dict = {}
    if "files" in keys and data.files is not None:
        changes["files"] = [moved(f) for f in data.files]
    for key in ("dataset", "cache_dir"):  # a folder each (a hub name is no folder there)
        value = getattr(data, key)
        if key in keys and value is not None and (folder / value).is_dir():
            changes[key] = moved(value)
    changes = {k: v for k, v in changes.items() if v != getattr(data, k)}
    if not changes:
        return config, []
    return replace(config, data=replace(data, **changes)), [f"data.{k}" for k in changes]


def read_from_note(moved: list[str], folder: Path) -> str:
    """The line that says `read_from` moved `moved`."""
    return (f"note: {' and '.join(moved)} read from {folder}, the folder the run started in, not from the "
            "folder run from: the run's relative paths name its files there")


def data_where_started(config: Config, folder: Optional[Path]) -> Config:
    """A run's config as a command that reads its data reads it (`eval --split`, `lab distance`):
    `read_from` the folder the run started in, said in a note where it moved a path."""
    placed, moved = read_from(config, folder)
    if moved:
        notice(read_from_note(moved, folder))
    return placed


# ----------------------------------------------------------------------------- files and formats


def _in_token_cache(path: Path) -> bool:
    """Whether `path` is a file of a token cache, under data.cache_dir or not: one left from a run
    with another data.cache_dir is no data either (its meta.json and tokenizer.json, read as JSON
    records, ended in a traceback). A build writes train.bin, validation.bin, tokenizer.json and
    meta.json in that order, so a folder holding train.bin and either JSON file is a cache's,
    finished or not (a build whose splits were too short stops before meta.json)."""
    folder = path.parent
    return (folder / "train.bin").is_file() and any((folder / name).is_file()
                                                     for name in ("tokenizer.json", "meta.json"))


def _resolve_files(entries: list[str], file_format: str, cache_dir: Optional[Path] = None) -> list[Path]:
    """Paths, globs and folders -> the files they name, in order, each once. A glob or a folder
    never takes what a token cache writes (`_cache_file`; data/ holds data.cache_dir by default)."""
    accepted = _extensions(file_format)
    files: list[Path] = []
    for entry in entries:
        path = Path(entry)
        # A name that exists is itself, a pattern only when nothing has that name: data[1].txt and
        # books[v2]/ are read, not taken for patterns that match nothing, or another file (data1.txt).
        if any(c in entry for c in "*?[") and not path.exists():
            files.extend(_glob_files(entry, file_format, cache_dir))
        elif path.is_dir():
            matches = [p for p in _folder_files(path, cache_dir) if format_suffix(p) in accepted]
            if not matches:
                compressed = "/".join(COMPRESSIONS)
                raise DataError(f"data.files: the folder {entry} has no {', '.join(accepted)} files "
                                f"(plain or {compressed})")
            files.extend(matches)
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"data.files: file not found: {entry}{looked_for_at(entry)}; "
                            "each entry is a file, a folder or a glob")
    # Each file once (a path and a glob may both name it), by the name it was given: a link's target
    # may have no extension at all (the Hugging Face cache's snapshots/<rev>/train.jsonl -> blobs/<hash>).
    once: dict[Path, Path] = {}
    for p in files:
        once.setdefault(p.resolve(), p.absolute())
    files = list(once.values())
    for path in files:
        _check_decompressor(path)
    return files


def _glob_files(pattern: str, file_format: str, cache_dir: Optional[Path]) -> list[Path]:
    """What a data.files glob takes: the files it matches (with data.format set, only that format's)
    but what a token cache writes; a pattern that matches only those says so."""
    accepted = _extensions(file_format)
    found = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file()
                   and (file_format == "auto" or format_suffix(Path(p)) in accepted))
    cache_dir = cache_dir.resolve() if cache_dir is not None else None
    matches = [p for p in found if not _cache_file(p, cache_dir)]
    if found and not matches:
        raise DataError(f"data.files: the pattern {pattern!r} matches only files a token cache writes "
                        f"({found[0]}{', ...' if len(found) > 1 else ''}), which are never read as data; "
                        "give the corpus's files")
    if not matches:
        raise DataError(f"data.files: no file matches the pattern {pattern!r}")
    return matches


def format_suffix(path: Path) -> str:
    """The extension that names a file's format, behind any compression: a.jsonl.gz -> .jsonl."""
    if path.suffix.lower() in COMPRESSIONS:
        return Path(path.stem).suffix.lower()
    return path.suffix.lower()


def _compression(path: Path) -> Optional[str]:
    return COMPRESSIONS.get(path.suffix.lower())


def _bare_name(path: Path) -> str:
    """A file's name without its format and compression extensions: a.jsonl.gz -> a."""
    name = path.stem if _compression(path) is None else Path(path.stem).stem
    return name if format_suffix(path) else path.name


def _check_decompressor(path: Path) -> None:
    compression = _compression(path)
    if compression is None:
        return
    if format_suffix(path) == ".parquet":
        raise DataError(f"data.files: {path}: Parquet compresses its own columns and cannot be read "
                        "from a compressed copy; decompress it to a .parquet file")
    import fsspec.compression

    if compression not in fsspec.compression.compr:  # fsspec registers zstd only when it can read it
        raise DataError(f"data.files: {path} is {compression}-compressed and reading it needs the "
                        "zstandard package: pip install zstandard")


def _extensions(file_format: str) -> tuple[str, ...]:
    if file_format == "auto":
        return tuple(itertools.chain(*EXTENSIONS.values()))
    return EXTENSIONS[file_format]


def _common_format(files: list[Path], file_format: str) -> str:
    if file_format != "auto":
        return file_format
    by_format: dict[str, Path] = {}
    for path in files:
        found = [name for name, suffixes in EXTENSIONS.items() if format_suffix(path) in suffixes]
        if not found:
            known = " ".join(itertools.chain(*EXTENSIONS.values()))
            raise DataError(f"data.files: cannot tell the format of {path} from its extension (known: "
                            f"{known}, each also as .gz .bz2 .xz .zst); set data.format to one of "
                            f"{', '.join(EXTENSIONS)}")
        by_format.setdefault(found[0], path)
    if len(by_format) > 1:
        mixed = ", ".join(f"{name} ({path.name})" for name, path in by_format.items())
        raise DataError(f"data.files: mixes formats: {mixed}; use files of one format (a folder or a "
                        "glob with data.format set reads only the files of that format)")
    return next(iter(by_format))


def _parquet_column(files: list[Path], text_field: str) -> str:
    """The top-level column that holds `text_field` (itself, or the head of a dotted path),
    checked in every file's schema."""
    import pyarrow
    import pyarrow.parquet

    column = text_field
    for path in files:
        try:
            schema = pyarrow.parquet.read_schema(path)
        except (pyarrow.ArrowException, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
        if text_field not in _field_names(schema):
            raise DataError(_missing_field_message(text_field, str(path), _field_names(schema)))
        if text_field not in schema.names:
            column = text_field.split(".")[0]
    return column


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


@contextmanager
def _open_binary(path: Path) -> Iterator[io.RawIOBase]:
    """`path` opened for reading bytes, decompressed when its name says it is compressed."""
    with open(path, "rb") as raw, _decompressed(raw, path) as f:  # closing a decompressor leaves raw open
        yield f


def _decompressed(raw, path: Path):
    compression = _compression(path)
    if compression is None:
        return raw
    import fsspec.compression

    return fsspec.compression.compr[compression](raw, mode="rb")


# ----------------------------------------------------------------------------- plain text


def _text_parts(files: list[Path], progress: bool, pass_number: int) -> DocumentParts:
    """Each file as one document, in parts of at most READ_CHARS characters. Several files that are
    large together report how far reading has got across them (10,000 small files were read in
    silence for 41 s), one large file by itself."""
    if len(files) == 1:
        yield from _read_text_file(files[0], progress, pass_number)
        return
    sizes = [path.stat().st_size for path in files]
    together = sum(sizes) >= REPORT_BYTES
    report = _ReadingReport(f"{len(files):,} files", sum(sizes), progress, pass_number) if together \
        else None
    done = 0
    try:
        for path, size in zip(files, sizes):
            yield from _read_text_file(path, progress, pass_number, reports=not together)
            done += size
            if report:
                report.update(done)
    finally:
        if report:
            report.close()


def _read_text_file(path: Path, progress: bool, pass_number: int, reports: bool = True) -> DocumentParts:
    """`path` in parts; `reports`: a large file says how far reading has got (not when its folder does)."""
    # utf-8-sig drops a byte-order mark; universal newlines, as datasets' text builder reads.
    size = path.stat().st_size
    large = reports and size >= REPORT_BYTES
    report = _ReadingReport(path.name, size, progress, pass_number) if large else None
    starts = True
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(_decompressed(raw, path), encoding="utf-8-sig")
        pending = ""
        try:
            while chunk := text.read(READ_CHARS):
                _refuse_nul(path, chunk)
                pending += chunk
                # Every piece but the last ends where no token changes; the last one waits
                # for the text after it.
                *done, pending = text_pieces(pending, READ_CHARS)
                for piece in done:
                    yield piece, starts
                    starts = False
                if report:
                    report.update(raw.tell())
        except UnicodeDecodeError as e:
            found = _find_invalid_utf8([path])
            raise DataError(found or f"{path}: not valid UTF-8 ({e})") from None
        except Exception:  # a damaged .gz/.bz2/.xz/.zst: name it; anything else is a bug
            _raise_if_undecompressible([path])
            raise
        finally:
            if report:
                report.close()
        if pending:
            yield pending, starts


def _refuse_nul(path: Path, chunk: str) -> None:
    """A NUL character, which no text holds: ASCII text saved as UTF-16 without a byte-order mark (as
    some Windows tools write it) is valid UTF-8 with a NUL after every character, and was trained on
    as that text without a word. Named at its byte and line, as a byte that is not UTF-8 is."""
    if "\0" not in chunk:
        return
    offset, lines = 0, 0  # bytes and newlines before the current chunk
    with _open_binary(path) as f:
        while (raw := f.read(1 << 20)) and (nul := raw.find(b"\0")) < 0:
            offset, lines = offset + len(raw), lines + raw.count(b"\n")
    line = lines + raw[:nul].count(b"\n") + 1
    mark = _unicode_mark(path)
    kind = {"kind": f"{mark} (it starts with {mark}'s byte-order mark)"} if mark else {}
    found = nul_found(f"{path}:", f"at byte {offset + nul} (line {line})", **kind)
    raise DataError(f"{found}; save it as UTF-8")


def _unicode_mark(path: Path) -> Optional[str]:
    """"UTF-16" or "UTF-32" where the (decompressed) file starts with that encoding's byte-order mark
    (UTF-16's: Excel's "Unicode Text", PowerShell's `>`); else None."""
    with _open_binary(path) as f:
        return unicode_mark(f.read(4))


def _refuse_nul_at_start(path: Path) -> None:
    """A CSV or TSV file whose start holds a NUL, named as a text file's is (`_refuse_nul`): datasets
    read the header of one saved as UTF-16 without a byte-order mark as names with a NUL after each
    character, and the text field was said to be missing among them (a terminal, showing no NUL,
    printed "has no field 'text'; its fields are: id, text")."""
    with _open_binary(path) as f:
        start = f.read(CSV_NUL_BYTES)
    if b"\0" in start:
        _refuse_nul(path, "\0")  # it finds the NUL's byte and line


class _ReadingReport:
    """How far a large file has been read: a progress bar, or with progress off a plain
    line at each quarter (runs without a terminal still show that reading goes on)."""

    def __init__(self, what: str, size: int, progress: bool, pass_number: int):
        self.size, self.quarter = size, 0
        self.label = f"reading {what} (pass {pass_number})"
        self.bar = tqdm(total=size, unit="B", unit_scale=True, desc=self.label) if progress else None

    def update(self, position: int) -> None:
        if self.bar is not None:
            self.bar.update(position - self.bar.n)
            return
        quarter = 4 * position // self.size
        if quarter > self.quarter:
            self.quarter = quarter
            notice(f"{self.label}: {min(100, 25 * quarter)}% of {self.size / 1e6:,.0f} MB")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------- records


class SkippedRecords:
    """Says once, after the first complete reading of a split, how many records had no text."""

    def __init__(self, description: str, text_field: str):
        self.description, self.text_field = description, text_field
        self.said = False

    def report(self, *, records: int, missing: int, empty: int) -> None:
        if self.said or not (missing or empty):
            return
        self.said = True
        parts = [f"{missing} with no {self.text_field!r} (null or missing)"] if missing else []
        parts += [f"{empty} whose {self.text_field!r} is empty"] if empty else []
        notice(f"warning: {self.description}: skipped {missing + empty:,} of {records:,} records: "
               f"{' and '.join(parts)}")


def _tables(dataset, where: str, rows: int = TABLE_ROWS) -> Iterator[tuple[str, object]]:
    """A `datasets` dataset as Arrow tables of up to `rows` rows, each with `where` they come from."""
    for table in dataset.with_format("arrow").iter(batch_size=rows):
        yield where, table


def _file_tables(per_file: list[tuple[Path, object]], file_format: str) -> Iterator[tuple[str, object]]:
    """The tables of each file's dataset in turn, in the files' order; a failure names its file. A CSV
    file's tables hold no more rows than its chunks (`_csv_chunking`): their texts are made Python
    strings a table at a time."""
    for path, dataset in per_file:
        rows = min(TABLE_ROWS, _csv_chunking(file_format, path).get("chunksize", TABLE_ROWS))
        with _reading_errors(str(path), [path], file_format):
            yield from _tables(dataset, str(path), rows)


def _dataset_parts(tables: Iterator[tuple[str, object]], text_field: str, description: str, files: list[Path],
                   file_format: str, *, skipped: SkippedRecords) -> DocumentParts:
    """The non-empty texts of `tables` (`_tables`, `_file_tables`), in order; each is a whole
    document. The records skipped are counted and said (`skipped`)."""
    import pyarrow

    records = missing = empty = 0
    with _reading_errors(description, files, file_format):
        for where, table in tables:
            column = _text_column(table, text_field, where)
            if not (pyarrow.types.is_string(column.type) or pyarrow.types.is_large_string(column.type)
                    or pyarrow.types.is_string_view(column.type) or pyarrow.types.is_null(column.type)):
                raise DataError(f"data.text_field: {text_field!r} of {where} holds "
                                f"{column.type} values, not text")
            records += len(column)
            missing += column.null_count  # a null field, or none at all: Arrow fills both with null
            for text in column.to_pylist():
                if text:
                    yield text, True
                elif text is not None:
                    empty += 1
    skipped.report(records=records, missing=missing, empty=empty)  # only a reading that got to the end


@contextmanager
def _reading_errors(description: str, files: list[Path], file_format: str) -> Iterator[None]:
    """What `datasets` raises when it cannot read the files, as one line naming the file at fault."""
    import pandas.errors
    import pyarrow

    try:
        with _library_logs_quiet():
            yield
    except UnicodeDecodeError as e:
        found = _find_invalid_utf8(files)
        raise DataError(found or f"{description}: not valid UTF-8 ({e})") from None
    except pandas.errors.EmptyDataError:  # a CSV or TSV file without even a header row
        empty = next((p for p in files if p.stat().st_size == 0), None)
        raise DataError(f"{empty or description}: an empty {file_format.upper()} file (not even a header "
                        "row); remove it, or give it a header and records") from None
    except (pyarrow.ArrowInvalid, pandas.errors.ParserError) as e:  # bad JSON; bad CSV quoting
        found = _find_invalid_json(files) if file_format == "json" else None
        raise DataError(found or f"{description}: cannot read it ({_first_line(e)})") from None
    except DataError:
        raise
    except ValueError:  # datasets' JSON reader on a first line that is no record: "Trailing data"
        _raise_if_undecompressible(files)
        found = _find_invalid_json(files) if file_format == "json" else None
        if found is None:
            raise
        raise DataError(found) from None
    except Exception:
        _raise_if_undecompressible(files)
        raise


def _text_column(table, text_field: str, description: str):
    """The column `text_field` names: a top-level column, or a dotted path into nested
    records (`body.text`) when no top-level column has that name."""
    import pyarrow.compute

    if text_field in table.column_names:
        return table.column(text_field)
    head, *rest = text_field.split(".")
    if not rest or head not in table.column_names:
        raise DataError(_missing_field_message(text_field, description, _field_names(table.schema)))
    column = table.column(head)
    for name in rest:
        if not hasattr(column.type, "get_field_index") or column.type.get_field_index(name) < 0:
            raise DataError(_missing_field_message(text_field, description, _field_names(table.schema)))
        column = pyarrow.compute.struct_field(column, name)
    return column


def _field_names(schema) -> list[str]:
    """Every field a dotted text_field can name: top-level columns and nested ones (`body.text`)."""
    names: list[str] = []

    def walk(fields, prefix: str) -> None:
        for f in fields:
            names.append(prefix + f.name)
            if hasattr(f.type, "get_field_index"):  # a struct: its fields are reachable too
                walk([f.type.field(i) for i in range(f.type.num_fields)], f"{prefix}{f.name}.")

    walk(schema, "")
    return names


def _missing_field_message(text_field: str, where: str, names: list[str]) -> str:
    return (f"data.text_field: {where} has no field {text_field!r}; its fields are: "
            f"{', '.join(names) or '(none)'}")


# ----------------------------------------------------------------------------- finding faults


def _find_invalid_utf8(files: list[Path]) -> Optional[str]:
    """The first file that is not valid UTF-8, with the byte offset and line of the fault."""
    for path in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, lines = 0, 0  # bytes and newlines before the current chunk
        with _open_binary(path) as f:
            while chunk := f.read(1 << 20):
                pending = len(decoder.getstate()[0])  # an incomplete character carried over
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as e:
                    position = offset - pending + e.start
                    line = lines + chunk[:max(0, position - offset)].count(b"\n") + 1
                    return _not_utf8(path, position, line)
                offset += len(chunk)
                lines += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return f"{path}: not valid UTF-8: it ends inside a character (byte {offset})"
    return None


def _not_utf8(path: Path, position: int, line: int) -> str:
    # Within the mark: UTF-32-BE's, 00 00 FE FF, is valid UTF-8 up to byte 2.
    mark = _unicode_mark(path) if position < len(codecs.BOM_UTF32) else None
    why = f": it starts with {mark}'s byte-order mark" if mark else ""
    return f"{path}: not valid UTF-8 at byte {position} (line {line}){why}; save it as UTF-8"


def _raise_if_undecompressible(files: list[Path]) -> None:
    """A DataError naming the first compressed file that does not decompress to its end.

    Called when reading failed: each decompressor fails in its own way (gzip an OSError,
    xz an LZMAError, zstandard a ZstdError, any of them cut short an EOFError), so the
    files are tried again here; when they all decompress the caller re-raises the
    original error, a bug with its traceback.
    """
    for path in files:
        compression = _compression(path)
        if compression is None:
            continue
        try:
            with _open_binary(path) as f:
                while f.read(1 << 20):
                    pass
        except Exception as e:
            raise DataError(f"{path}: cannot decompress it as {compression} ({_first_line(e)}); the "
                            f"file is damaged or not {compression}-compressed") from None


def _find_invalid_json(files: list[Path]) -> Optional[str]:
    """The first JSON lines file with a line that does not parse, or parses to no record (a string, a
    number, an array: `_no_record`), and that line. The lines are streamed: a fault on line 2 of a
    corpus of many gigabytes is named without reading the rest, as is a bad first line, unless it
    opens an array or an object: then the file may be one JSON document over many lines, and it is
    read whole to know (as datasets has just read it). A first line that is an array is named only
    once a line follows it (else it is the whole file: an array of records on one line). A line
    that is not UTF-8 (a UTF-16 file, as Windows PowerShell writes one) is named as such, as a text
    file's is."""
    for path in files:
        first = None  # (number, value) of the first line that is not blank, once it parsed
        with _open_binary(path) as f:
            offset = 0  # bytes before the line
            for number, raw in enumerate(_byte_lines(f), 1):
                start, offset = offset, offset + len(raw) + 1
                if not raw.strip():
                    continue
                line = raw.decode("utf-8-sig", errors="replace")
                try:
                    value = json.loads(line)
                except ValueError as e:
                    if first is None and line.lstrip().startswith(("[", "{")) and _one_json_document(path):
                        break  # an array of records, or one record over many lines: fine
                    encoding = _not_utf8_line(path, raw, start, number)
                    if encoding:
                        return encoding
                    fault = e.msg.removesuffix(" at")  # "Unterminated string starting at", at a column
                    return f"{path}: line {number} is not valid JSON ({fault} at column {e.colno})"
                if first is None:  # no record may be the whole file (an array of records on one line)
                    first = (number, value)
                    continue
                for at, parsed in (first, (number, value)):  # with a line after it, it is JSON lines
                    if not isinstance(parsed, dict) and parsed is not None:
                        return _no_record(path, at, parsed)
        if first is not None and not isinstance(first[1], (dict, list)) and first[1] is not None:
            return _no_record(path, *first)  # a string or a number alone is no file of records either
    return None


def _no_record(path: Path, number: int, value) -> str:
    """Line `number` of a JSON lines file, which parses to `value`, a JSON value that is no object.
    datasets said only that a column "changed from object to string", naming no line (or, for an array
    on the first line, raised "Trailing data")."""
    kind = JSON_TYPES.get(type(value), "a string")
    return (f"{path}: line {number} is {kind} ({json.dumps(value)[:40]}), not a record; each line of a "
            'JSON lines file is one object, such as {"text": "..."}')


def _not_utf8_line(path: Path, raw: bytes, start: int, number: int) -> Optional[str]:
    """Line `number` of `path` (`raw`, from byte `start`), which does not parse as JSON, named as not UTF-8
    where it is not, or holds a NUL byte (no JSON text does: UTF-16 without a byte-order mark); else None."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _not_utf8(path, start + e.start, number)
    nul = raw.find(b"\0")
    if nul >= 0:
        return (f"{path}: line {number} holds a NUL byte (byte {start + nul}), which no JSON text does: it "
                "is UTF-16 or not text; save it as UTF-8")
    return None


def _one_json_document(path: Path) -> bool:
    """Whether the file is one JSON document; read whole, as datasets reads such a file."""
    with _open_binary(path) as f:
        try:
            json.loads(f.read().decode("utf-8-sig", errors="replace"))
            return True
        except ValueError:
            return False


def _byte_lines(f, size: int = READ_CHARS) -> Iterator[bytes]:
    """The lines of a binary stream (any decompressor's: not all of them iterate by line)."""
    rest = b""
    while chunk := f.read(size):
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


def _json_text_of_another_type(files: list[Path], text_field: str) -> Optional[str]:
    """The first JSON line whose text field holds a number, a list or an object, or whose nested
    text field (`body.text`) passes through something other than an object, and that line.

    datasets would read it, then re-read that field of every later record as JSON source text
    (quotes and backslashes put into the texts, silently); other fields may mix types freely.
    A file that is one JSON document, not JSON lines, is left to datasets."""
    keys = text_field.split(".")
    for path in files:
        with _open_binary(path) as f:
            parsed = False  # whether a line has parsed yet: blank lines before the first are skipped
            for number, raw in enumerate(_byte_lines(f), 1):
                if not raw.strip():
                    continue
                try:
                    value = json.loads(raw.decode("utf-8-sig", errors="replace"))
                except ValueError:
                    if not parsed:
                        break  # not JSON lines
                    continue  # a bad line: datasets' reading names it
                parsed = True
                if isinstance(value, dict) and text_field in value:
                    value = value[text_field]
                else:
                    for depth, key in enumerate(keys):
                        if depth and value is not None and not isinstance(value, dict):
                            return _not_an_object(path, number, text_field, depth, value)
                        value = value.get(key) if isinstance(value, dict) else None
                kind = JSON_TYPES.get(type(value))
                if kind is not None:
                    return (f"{path}: line {number}: {text_field!r} is {kind} ({json.dumps(value)[:40]}), "
                            "not text; every value of the text field must be a string (or null)")
    return None


def _not_an_object(path: Path, number: int, text_field: str, depth: int, value) -> str:
    """Line `number` of `path`, where the dotted text field passes through `value` (what its first `depth`
    keys name), not an object. datasets would make that whole field JSON text in every record, and say
    only that the file has no field `text_field`."""
    keys = text_field.split(".")
    holder, kind = ".".join(keys[:depth]), JSON_TYPES.get(type(value), "text")
    return (f"{path}: line {number}: {holder!r} is {kind} ({json.dumps(value)[:40]}), not an object "
            f"holding {keys[depth]!r}; for data.text_field {text_field!r} every {holder!r} must be an object "
            "(or null)")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "data"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
