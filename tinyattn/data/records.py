"""JSON lines or a JSON array, CSV, TSV and Parquet, read through `datasets`: one document per record.

Each file is its own streamed dataset, never copied into an Arrow cache (`per_file_parts`). The
text is the `data.text_field` column, or a nested field named by a dotted path (`body.text`).
Records whose text is null, missing or empty are skipped, and how many is said once
(`SkippedRecords`). What `datasets` raises becomes one line naming the file at fault (`faults`).
A hub dataset's tables, and a saved dataset's, are read into documents here too (`dataset_parts`).
"""

from __future__ import annotations

import csv
import functools
import glob
import io
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tinyattn.config import DataConfig
from tinyattn.data.faults import (find_invalid_json, find_invalid_utf8, json_text_of_another_type,
                                  raise_if_undecompressible, refuse_nul_at_start)
from tinyattn.data.local_files import DATASETS_LOCKS, DocumentParts, format_suffix, open_binary
from tinyattn.errors import DataError, first_line
from tinyattn.system.console import notice

CSV_CHUNK_BYTES = 1 << 24  # CSV and TSV files are parsed about this many bytes of rows at a time
CSV_SAMPLE_BYTES = 1 << 22  # the start of a CSV or TSV file read to learn how long its rows are
CSV_CHUNK_ROWS = 10_000  # datasets' csv builder's own chunk, in rows: where rows are short
TABLE_ROWS = 1000  # records read from datasets at a time


@contextmanager
def library_logs_quiet() -> Iterator[None]:
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


def records_reader(data: DataConfig, files: list[Path], file_format: str,
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
        return per_file_parts(files, file_format, data.text_field, description, lambda path: (
            # escaped: datasets reads data_files as patterns, and data[1].jsonl would read data1.jsonl
            datasets.load_dataset(builder, data_files=[glob.escape(str(path))], split="train", streaming=True,
                                  cache_dir=str(lock_folder), **options,
                                  **reading_options(file_format, path))),
            skipped=SkippedRecords(description, data.text_field))

    return reader


def reading_options(file_format: str, path: Path) -> dict:
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
        with open_binary(path) as f:
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


def per_file_parts(files: list[Path], file_format: str, text_field: str, description: str,
                   load: Callable[[Path], object], *,
                   skipped: SkippedRecords) -> Callable[[], DocumentParts]:
    """How data.files and a dataset folder read their JSON, CSV, TSV and Parquet files: each its own
    dataset (`_per_file_datasets`), a failure named by its file (`_reading_errors`). A JSON text
    field of another type is refused first, before datasets turns every later text into JSON source
    text. Returns a function that streams the documents anew at each call."""
    with _reading_errors(description, files, file_format):
        if file_format == "json":
            problem = json_text_of_another_type(files, text_field)
            if problem:
                raise DataError(problem)
        elif file_format in ("csv", "tsv"):
            for path in files:
                refuse_nul_at_start(path)
    per_file = _per_file_datasets(files, file_format, load)
    return lambda: dataset_parts(_file_tables(per_file, file_format), text_field, description, files,
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
            raise DataError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
        if text_field not in _field_names(schema):
            raise DataError(_missing_field_message(text_field, str(path), _field_names(schema)))
        if text_field not in schema.names:
            column = text_field.split(".")[0]
    return column


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


def arrow_tables(dataset, where: str, rows: int = TABLE_ROWS) -> Iterator[tuple[str, object]]:
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
            yield from arrow_tables(dataset, str(path), rows)


def dataset_parts(tables: Iterator[tuple[str, object]], text_field: str, description: str, files: list[Path],
                  file_format: str, *, skipped: SkippedRecords) -> DocumentParts:
    """The non-empty texts of `tables` (`arrow_tables`, `_file_tables`), in order; each is a whole
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
        with library_logs_quiet():
            yield
    except UnicodeDecodeError as e:
        found = find_invalid_utf8(files)
        raise DataError(found or f"{description}: not valid UTF-8 ({e})") from None
    except pandas.errors.EmptyDataError:  # a CSV or TSV file without even a header row
        empty = next((p for p in files if p.stat().st_size == 0), None)
        raise DataError(f"{empty or description}: an empty {file_format.upper()} file (not even a header "
                        "row); remove it, or give it a header and records") from None
    except (pyarrow.ArrowInvalid, pandas.errors.ParserError) as e:  # bad JSON; bad CSV quoting
        found = find_invalid_json(files) if file_format == "json" else None
        raise DataError(found or f"{description}: cannot read it ({first_line(e)})") from None
    except DataError:
        raise
    except ValueError:  # datasets' JSON reader on a first line that is no record: "Trailing data"
        raise_if_undecompressible(files)
        found = find_invalid_json(files) if file_format == "json" else None
        if found is None:
            raise
        raise DataError(found) from None
    except Exception:
        raise_if_undecompressible(files)
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
