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

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator

from tinyattn.config import DataConfig
from tinyattn.errors import DataError
from tinyattn.sources import Source, documents

@dataclass
class Splits:
    train: Callable[[], Iterator[str]]  # each call streams the training documents again
    validation: Callable[[], Iterator[str]]
    rule: str  # how validation was chosen, recorded in meta.json


def split(source: Source, data: DataConfig) -> Splits:
    limit = data.max_documents

    def stream(dataset) -> Callable[[], Iterator[str]]:
        return lambda: itertools.islice(documents(dataset, source, data.text_field), limit)

    train_set = source.load(data.train_split)
    if data.validation_split is not None:
        validation_set = source.load(data.validation_split)
        return Splits(stream(train_set), stream(validation_set),
                       f"dataset split {data.validation_split!r}")

    everything = stream(train_set)
    f = data.validation_fraction
    first_held = next(i for i in itertools.count() if _held_out(i, f))
    count = sum(1 for _ in itertools.islice(everything(), first_held + 1))
    if count == 0:
        raise DataError(f"{source.description}: the corpus is empty (no text in field "
                        f"{data.text_field!r})")
    if count > first_held:
        return Splits(lambda: (d for i, d in enumerate(everything()) if not _held_out(i, f)),
                       lambda: (d for i, d in enumerate(everything()) if _held_out(i, f)),
                       f"every document i with floor((i+1)*{f}) > floor(i*{f})")
    # Too few documents to hold whole ones out: the last fraction of the characters.
    total = sum(len(d) for d in everything())
    cut = int(total * (1 - f))  # int(n * 0.9): the split published Tiny Shakespeare results use
    return Splits(lambda: _characters_before(everything(), cut),
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

