"""Plain text files (.txt .text .md), read here: one document per file.

A file is read in pieces of `READ_CHARS` characters cut at newlines (`tokenizer.text_pieces`),
where our tokenizers' tokens do not change, so a single file of any size is read in flat memory (a
tokenizer whose tokens change at a cut gets the pieces joined back, `token_cache.write_tokens`).
A UTF-8 byte-order mark is dropped; newlines are read universally, as datasets' text builder reads
them. A large file, or many files large together, says how far reading has got.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from tinyattn.data.faults import find_invalid_utf8, raise_if_undecompressible, refuse_nul
from tinyattn.data.local_files import DocumentParts, decompressed
from tinyattn.data.tokenizer import text_pieces
from tinyattn.errors import DataError
from tinyattn.system.console import notice

READ_CHARS = 1 << 22  # a text file is read this many characters at a time
REPORT_BYTES = 1 << 26  # text files at least this large report how far reading has got


def text_reader(files: list[Path], progress: bool) -> Callable[[str], Callable[[], DocumentParts]]:
    """Plain text files, read here (see `_read_text_file`): one document per file."""
    passes = itertools.count(1)  # each reading of the corpus, numbered in progress lines

    def reader(split: str) -> Callable[[], DocumentParts]:
        return lambda: _text_parts(files, progress, next(passes))

    return reader


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
        text = io.TextIOWrapper(decompressed(raw, path), encoding="utf-8-sig")
        pending = ""
        try:
            while chunk := text.read(READ_CHARS):
                refuse_nul(path, chunk)
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
            found = find_invalid_utf8([path])
            raise DataError(found or f"{path}: not valid UTF-8 ({e})") from None
        except Exception:  # a damaged .gz/.bz2/.xz/.zst: name it; anything else is a bug
            raise_if_undecompressible([path])
            raise
        finally:
            if report:
                report.close()
        if pending:
            yield pending, starts


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
