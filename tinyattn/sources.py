"""Where documents come from: hub datasets, local files (paths, globs, folders), their formats.

`resolve_source(data_config)` turns the `data:` section into a `Source`: what to show in
messages, what to hash into the token cache's key, and how to load each split. A Hugging
Face hub dataset (`data.dataset`, which may also be a local dataset folder), or local
files: plain text, JSON lines or Parquet, given as paths, globs or folders (`data.files`),
optionally downloaded once from `data.url` (`tinyattn.download`). All of it is read through
`datasets`; local files are streamed, never copied into an Arrow cache. A plain text file
is one document (a folder of .txt files: one document per file), so a single file must fit
in memory; corpora larger than memory come as many files, JSON lines, Parquet or a
(streamed) hub dataset.

`documents(dataset, source, text_field)` yields the non-empty texts. When reading fails,
the file at fault is hunted down so the message can name it: the first byte that is not
UTF-8 (with its line), or the first JSON line that does not parse.
"""

from __future__ import annotations

import codecs
import glob
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from tinyattn.config import DataConfig
from tinyattn.download import download
from tinyattn.errors import DataError

EXTENSIONS = {
    "text": (".txt", ".text", ".md"),
    "json": (".jsonl", ".json", ".ndjson"),
    "parquet": (".parquet",),
}


@dataclass
class Source:
    """Where documents come from, resolved: what to show, what to hash, how to load."""

    description: str  # for messages: "data/tinyshakespeare.txt", "hub dataset 'x/y'"
    name: str  # the readable start of the cache folder's name
    identity: dict  # hashed into the cache key
    load: Callable[[str], Any]  # split name -> datasets.Dataset or IterableDataset
    files: list[Path] = field(default_factory=list)  # local files, to locate read errors
    format: Optional[str] = None  # text, json or parquet for local files
    rows_per_batch: int = 1000


def resolve_source(data: DataConfig, progress: bool) -> Source:
    if data.dataset is not None:
        return _hub_source(data)
    if data.validation_split is not None:
        raise DataError(f"data.validation_split: {data.validation_split!r} needs a hub dataset "
                        "(data.dataset); local files are split by data.validation_fraction")
    if data.url is not None and not Path(data.files[0]).exists():
        download(data.url, Path(data.files[0]), sha256=data.sha256, size_bytes=data.size_bytes,
                 progress=progress)
    files = _resolve_files(data.files, data.format)
    file_format = _common_format(files, data.format)
    return _file_source(data, files, file_format)


def _hub_source(data: DataConfig) -> Source:
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
            raise DataError(f"data.dataset: {first_line(e)}; check the name, or point data.files at "
                            "local files") from None
        except datasets.exceptions.DatasetGenerationError as e:
            reason = first_line(e.__cause__ or e)
            raise DataError(f"data.dataset: cannot read {name!r}: {reason}") from None
        except FileNotFoundError as e:
            raise DataError(f"data.dataset: {first_line(e)}") from None
        except ValueError as e:  # an unknown split or config name; the message lists the valid ones
            raise DataError(f"data.dataset {name!r}: {first_line(e)}") from None

    slug = name.rstrip("/").rsplit("/", 1)[-1]
    return Source(description=f"dataset {name!r}", name=_slug(slug), identity=identity, load=load)


def _file_source(data: DataConfig, files: list[Path], file_format: str) -> Source:
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
    return Source(description=description, name=_slug(stem), identity=identity, load=load,
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
            raise DataError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
        if text_field not in names:
            raise DataError(_missing_field_message(text_field, str(path), names))


def _file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]

# ----------------------------------------------------------------------------- documents


def documents(dataset, source: Source, text_field: str) -> Iterator[str]:
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
        raise DataError(found or f"{source.description}: cannot read it ({first_line(e)})") from None


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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "data"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

