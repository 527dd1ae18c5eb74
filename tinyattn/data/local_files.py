"""Local data files: what a `data.files` entry names, each file's format and compression, opening it.

An entry is a path, a glob or a folder (`resolve_files`); a folder or a glob never gives what a
token cache writes (`folder_files`; data/ holds data.cache_dir by default). A file's format is its
extension behind any compression (`format_suffix`: part-0.jsonl.gz is JSON lines), and a compressed
file is opened decompressed (`open_binary`, through fsspec, which reads .zst only with the
`zstandard` package installed). `DocumentParts` is what every reader of documents yields
(`text_files`, `records`).
"""

from __future__ import annotations

import glob
import io
import itertools
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from tinyattn.errors import DataError
from tinyattn.system.storage import looked_for_at

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

# What every reader of documents yields: a JSON record or a CSV row is one part, a large text file several.
DocumentParts = Iterator[tuple[str, bool]]  # (text, whether it starts a new document)


def folder_files(folder: Path, cache_dir: Optional[Path] = None) -> list[Path]:
    """What a folder gives as data, to data.files and to a data.dataset folder alike: its files at
    any depth but hidden files and folders and what a token cache writes (`_cache_file`; data/
    holds data.cache_dir by default)."""
    cache_dir = cache_dir.resolve() if cache_dir is not None else None
    return sorted(p for p in _files_below(folder) if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts)
                  and not _cache_file(p, cache_dir))


def _files_below(folder: Path) -> Iterator[Path]:
    """Every name below `folder`, in linked folders too, as a glob's `**` finds them (Path.rglob skipped
    a linked folder's files, unsaid); each real folder once (`walk_once`)."""
    for root, _, names in walk_once(folder):
        yield from (Path(root) / name for name in names)


def walk_once(folder: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
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


def _in_token_cache(path: Path) -> bool:
    """Whether `path` is a file of a token cache, under data.cache_dir or not: one left from a run
    with another data.cache_dir is no data either (its meta.json and tokenizer.json, read as JSON
    records, ended in a traceback). A build writes train.bin, validation.bin, tokenizer.json and
    meta.json in that order, so a folder holding train.bin and either JSON file is a cache's,
    finished or not (a build whose splits were too short stops before meta.json)."""
    folder = path.parent
    return (folder / "train.bin").is_file() and any((folder / name).is_file()
                                                     for name in ("tokenizer.json", "meta.json"))


def resolve_files(entries: list[str], file_format: str, cache_dir: Optional[Path] = None) -> list[Path]:
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
            matches = [p for p in folder_files(path, cache_dir) if format_suffix(p) in accepted]
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


def compression_of(path: Path) -> Optional[str]:
    return COMPRESSIONS.get(path.suffix.lower())


def bare_name(path: Path) -> str:
    """A file's name without its format and compression extensions: a.jsonl.gz -> a."""
    name = path.stem if compression_of(path) is None else Path(path.stem).stem
    return name if format_suffix(path) else path.name


def _check_decompressor(path: Path) -> None:
    compression = compression_of(path)
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


def common_format(files: list[Path], file_format: str) -> str:
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


def file_identity(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


@contextmanager
def open_binary(path: Path) -> Iterator[io.RawIOBase]:
    """`path` opened for reading bytes, decompressed when its name says it is compressed."""
    with open(path, "rb") as raw, decompressed(raw, path) as f:  # closing a decompressor leaves raw open
        yield f


def decompressed(raw, path: Path):
    compression = compression_of(path)
    if compression is None:
        return raw
    import fsspec.compression

    return fsspec.compression.compr[compression](raw, mode="rb")
