"""Where documents come from: the `data:` section resolved to a `Source`.

`resolve_source(data_config)` turns the `data:` section into a `Source`: what to show in
messages, what to hash into the token cache's key, and how to read each split. The data is one of:

- a Hugging Face hub dataset (`data.dataset`), read through `datasets`;
- a dataset folder on disk (`data.dataset: <folder>`): a folder of data files, split by datasets'
  rules for a folder, or a folder that save_to_disk wrote;
- local files given as paths, globs or folders (`data.files`, `local_files`), optionally
  downloaded once from `data.url` (`download`).

Plain text (.txt .text .md) is read by `text_files`, one document per file; JSON lines or a
JSON array, CSV, TSV and Parquet by `records`, through `datasets`, one document per record. Any
of them but Parquet may be compressed as .gz, .bz2, .xz or .zst (the format is the inner
extension). A document stream is a sequence of parts `(text, starts_document)`: a record is one
part, a large text file several. When reading fails, the message names the file at fault
(`faults`).
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from tinyattn.config import DataConfig
from tinyattn.data.download import download
from tinyattn.data.local_files import (EXTENSIONS, DocumentParts, bare_name, common_format, file_identity,
                                       folder_files, format_suffix, resolve_files, walk_once)
from tinyattn.data.records import (SkippedRecords, arrow_tables, dataset_parts, library_logs_quiet,
                                   per_file_parts, reading_options, records_reader)
from tinyattn.data.text_files import text_reader
from tinyattn.errors import DataError, first_line

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
    files = resolve_files(data.files, data.format, cache_dir=Path(data.cache_dir))
    file_format = common_format(files, data.format)
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
        return lambda: dataset_parts(arrow_tables(dataset, description), data.text_field, description, [],
                                     "hub", skipped=skipped)

    return Source(description=description, name=_slug(name.rstrip("/").rsplit("/", 1)[-1]),
                  identity=identity, reader=reader)


def _folder_source(data: DataConfig, progress: bool) -> Source:
    """A dataset folder on disk (data.dataset: <folder>), read as it is now: a folder of data files
    (`_folder_reader`), or one written by save_to_disk (`_saved_reader`). Its files are those
    `folder_files` keeps: the same folder gives the same data and the same key, even with
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
    files = folder_files(local, Path(data.cache_dir))
    identity: dict = {"dataset": name, "config": data.dataset_config, "revision": None}  # a folder has none
    identity["files"] = [file_identity(p) for p in files]  # its files decide whether the cache is current
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
    its own streamed dataset as data.files reads them (`per_file_parts`): one dataset of them all
    would cast every file to the first one's columns while it is read, a CastError traceback for
    shards whose other fields differ. Always streamed: without streaming datasets reuses an Arrow
    cache it keyed by the files' times, which cp -p or touch -r carry over to new contents (the old
    text trained, filed under the new text's key). Its .txt files are read here as data.files reads
    them (`text_reader`: one document per file, newlines kept), not by datasets' text builder (a
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
                return text_reader(found[split], progress)(split)
            return per_file_parts(
                found[split], builder.name, data.text_field, description,
                lambda file: datasets.load_dataset(path, data.dataset_config, split=split, streaming=True,
                                                   data_files={split: [glob.escape(str(file))]},
                                                   **reading_options(builder.name, file)),
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
        return lambda: dataset_parts(arrow_tables(splits[split], description), data.text_field, description,
                                     [], "arrow", skipped=skipped)

    return reader


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
    folder once, `walk_once`), one a line and case-folded: where `_may_match` looks."""
    names = set()
    for _, folders, files in walk_once(folder):
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
                        f"({first_line(e)}); fix or remove it") from None
    if not isinstance(configs, list):
        raise DataError(f"{readme}: configs: expected a list of configs (config_name, data_files), got "
                        f"{configs!r}; fix or remove it")
    return any(isinstance(c, dict) and "data_files" in c for c in configs)


@contextmanager
def _dataset_errors(name: str) -> Iterator[None]:
    """What loading `data.dataset` raises, from the hub or a dataset folder, as one line."""
    import datasets

    try:
        with library_logs_quiet():
            yield
    except ConnectionError:
        raise DataError(f"data.dataset: cannot reach {name!r} on the Hugging Face Hub (offline or "
                        "no network); download it while online, or point data.files at local files"
                        ) from None
    except datasets.exceptions.DatasetNotFoundError as e:
        raise DataError(f"data.dataset: {first_line(e)}; check the name, or point data.files at "
                        "local files") from None
    except datasets.exceptions.DatasetGenerationError as e:
        reason = first_line(e.__cause__ or e)
        raise DataError(f"data.dataset: cannot read {name!r}: {reason}") from None
    except FileNotFoundError as e:
        raise DataError(f"data.dataset: {first_line(e)}") from None
    except StopIteration:  # a hub dataset's JSON builder found no record in the split's first file to
        # learn the columns from (a dataset folder's files are each their own dataset: `_per_file_datasets`)
        raise DataError(f"data.dataset: {name}: an empty JSON lines file (no records); "
                        "remove it, or give it records") from None
    except ValueError as e:  # an unknown split or config name; the message lists the valid ones
        raise DataError(f"data.dataset {name!r}: {first_line(e)}") from None


def _file_source(data: DataConfig, files: list[Path], file_format: str, progress: bool) -> Source:
    stem = bare_name(files[0]) if len(files) == 1 else Path(os.path.commonpath(files)).name
    description = str(files[0]) if len(files) == 1 else f"{len(files)} files ({', '.join(data.files)})"
    # data.url only says where a missing file is downloaded from: the files' bytes key the cache (the
    # token cache hashes them), so another url for the same file keeps it. "url": None stays in
    # the identity so that caches keyed before, without a url, keep their keys.
    identity = {"files": [file_identity(p) for p in files], "format": file_format, "url": None}
    empty = None
    if file_format == "text":  # no field to name: the files themselves hold no text
        reader = text_reader(files, progress)
        empty = ("the file is empty (no text to train on)" if len(files) == 1
                 else "the corpus is empty (every file is empty)")
    else:
        reader = records_reader(data, files, file_format, description)
    return Source(description=description, name=_slug(stem), identity=identity, reader=reader, empty=empty)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "data"
