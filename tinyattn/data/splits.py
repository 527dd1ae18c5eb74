"""Which documents train and which validate.

The dataset's own validation split when `data.validation_split` is set. Otherwise every
document whose index i has floor((i+1)f) > floor(i f), f = `data.validation_fraction` (for
f = 0.1: documents 9, 19, 29, ...): deterministic, evenly spread, exactly floor(N f)
documents, and it needs no count of N, so streams work. A corpus with too few documents
for that (one long text, a handful of files) holds out the last fraction of its characters
instead: Tiny Shakespeare's validation split is its last 10%, the split behind published
results. `data.max_documents` keeps the first N non-empty documents (of each split, when
the dataset has its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tinyattn.config import DataConfig
from tinyattn.data.local_files import DocumentParts
from tinyattn.data.sources import Source
from tinyattn.errors import DataError


@dataclass
class Splits:
    train: Callable[[], DocumentParts]  # each call streams the training documents again
    validation: Callable[[], DocumentParts]
    rule: str  # how validation was chosen, recorded in meta.json


def split(source: Source, data: DataConfig) -> Splits:
    limit = data.max_documents

    def stream(split_name: str) -> Callable[[], DocumentParts]:
        read = source.reader(split_name)
        return read if limit is None else lambda: _first_documents(read(), limit)

    if data.validation_split == data.train_split:  # here, not in the config: old runs' configs still load
        raise DataError(f"data.validation_split: {data.validation_split!r} is data.train_split too, so "
                        "validation would be training text; leave it null to hold out "
                        "data.validation_fraction of data.train_split")
    if data.validation_split is not None:
        return Splits(stream(data.train_split), stream(data.validation_split),
                      f"dataset split {data.validation_split!r}")

    everything = stream(data.train_split)
    f = data.validation_fraction
    first_held = _first_held_out(f)
    count, total = _count_documents(everything(), stop=first_held + 1)
    if count == 0:
        empty = source.empty or f"the corpus is empty (no text in field {data.text_field!r})"
        raise DataError(f"{source.description}: {empty}")
    if count > first_held:
        return Splits(lambda: _documents_where(everything(), lambda i: not _held_out(i, f)),
                      lambda: _documents_where(everything(), lambda i: _held_out(i, f)),
                      f"every document i with floor((i+1)*{f}) > floor(i*{f})")
    # Too few documents to hold whole ones out: the last fraction of the characters.
    cut = int(total * (1 - f))  # int(n * 0.9): the split published Tiny Shakespeare results use
    if cut == 0:  # said here: the tokenizer, built from no text, would only say that it has none
        held = "the only character" if total == 1 else f"all {total:,} characters"
        raise DataError(f"{source.description}: data.validation_fraction={f} holds out {held} of the "
                        "text, leaving no training text; use a smaller data.validation_fraction "
                        f"(now {f}) or more text")
    return Splits(lambda: _characters_before(everything(), cut),
                  lambda: _characters_from(everything(), cut),
                  f"the last {f} of the characters ({total - cut} of {total})")


def _held_out(index: int, fraction: float) -> bool:
    return math.floor((index + 1) * fraction) > math.floor(index * fraction)


def _first_held_out(fraction: float) -> int:
    """The first index `_held_out` holds out: the least i with floor((i + 1) * fraction) >= 1
    (floor(i * fraction) is 0 until then), found by bisection, as that test only turns true once
    (counting up to it took hours for a fraction of 1e-12). Above 2**1023: none is held out."""
    def reaches_one(i: int) -> bool:
        return math.floor((i + 1) * fraction) >= 1

    high = 1
    while not reaches_one(high):
        high *= 2
        if high > 2**1023:
            return high
    low = 0
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches_one(middle) else (middle + 1, high)
    return low


def _numbered(parts: DocumentParts):
    """(document index, text, starts_document) for each part."""
    index = -1
    for text, starts in parts:
        index += starts
        yield index, text, starts


def _first_documents(parts: DocumentParts, limit: int) -> DocumentParts:
    for index, text, starts in _numbered(parts):
        if index >= limit:
            return
        yield text, starts


def _count_documents(parts: DocumentParts, stop: int) -> tuple[int, int]:
    """(documents, characters) in `parts`, counting no further than `stop` documents.

    The characters are all of them only when fewer than `stop` documents were found: the
    one case that needs them, which reads the whole stream anyway (a single large text
    file is then read once for both counts, not twice).
    """
    count = characters = 0
    for text, starts in parts:
        count += starts
        if count == stop:
            break
        characters += len(text)
    return count, characters


def _documents_where(parts: DocumentParts, keep: Callable[[int], bool]) -> DocumentParts:
    for index, text, starts in _numbered(parts):
        if keep(index):
            yield text, starts


def _characters_before(parts: DocumentParts, cut: int) -> DocumentParts:
    position = 0
    for text, starts in parts:
        if position + len(text) >= cut:
            if cut > position:
                yield text[:cut - position], starts
            return
        yield text, starts
        position += len(text)


def _characters_from(parts: DocumentParts, cut: int) -> DocumentParts:
    position, first = 0, True
    for text, starts in parts:
        if position + len(text) > cut:
            yield text[max(0, cut - position):], starts or first  # the split's first part starts a document
            first = False
        position += len(text)
