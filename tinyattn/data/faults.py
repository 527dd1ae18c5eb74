"""Finding the fault in a file that does not read, so that its one-line message names the file and where.

Called once reading has failed, or before `datasets` would read a file wrong: the first byte that
is not UTF-8, with its line (`find_invalid_utf8`); a NUL, which no text holds (`refuse_nul`: UTF-16
saved without a byte-order mark); the first JSON line that does not parse or is no record
(`find_invalid_json`); a JSON text field of another type (`json_text_of_another_type`); a
compressed file that does not decompress to its end (`raise_if_undecompressible`).
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Iterator, Optional

from tinyattn.data.local_files import compression_of, open_binary
from tinyattn.errors import DataError, first_line
from tinyattn.system.storage import nul_found, unicode_mark

READ_BYTES = 1 << 22  # a JSON lines file searched for its fault is read this many bytes at a time
CSV_NUL_BYTES = 1 << 16  # the start of a CSV or TSV file looked at for a NUL (UTF-16: its first two bytes)


def refuse_nul(path: Path, chunk: str) -> None:
    """A NUL character, which no text holds: ASCII text saved as UTF-16 without a byte-order mark (as
    some Windows tools write it) is valid UTF-8 with a NUL after every character, and was trained on
    as that text without a word. Named at its byte and line, as a byte that is not UTF-8 is."""
    if "\0" not in chunk:
        return
    offset, lines = 0, 0  # bytes and newlines before the current chunk
    with open_binary(path) as f:
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
    with open_binary(path) as f:
        return unicode_mark(f.read(4))


def refuse_nul_at_start(path: Path) -> None:
    """A CSV or TSV file whose start holds a NUL, named as a text file's is (`refuse_nul`): datasets
    read the header of one saved as UTF-16 without a byte-order mark as names with a NUL after each
    character, and the text field was said to be missing among them (a terminal, showing no NUL,
    printed "has no field 'text'; its fields are: id, text")."""
    with open_binary(path) as f:
        start = f.read(CSV_NUL_BYTES)
    if b"\0" in start:
        refuse_nul(path, "\0")  # it finds the NUL's byte and line


def find_invalid_utf8(files: list[Path]) -> Optional[str]:
    """The first file that is not valid UTF-8, with the byte offset and line of the fault."""
    for path in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, lines = 0, 0  # bytes and newlines before the current chunk
        with open_binary(path) as f:
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


def raise_if_undecompressible(files: list[Path]) -> None:
    """A DataError naming the first compressed file that does not decompress to its end.

    Called when reading failed: each decompressor fails in its own way (gzip an OSError,
    xz an LZMAError, zstandard a ZstdError, any of them cut short an EOFError), so the
    files are tried again here; when they all decompress the caller re-raises the
    original error, a bug with its traceback.
    """
    for path in files:
        compression = compression_of(path)
        if compression is None:
            continue
        try:
            with open_binary(path) as f:
                while f.read(1 << 20):
                    pass
        except Exception as e:
            raise DataError(f"{path}: cannot decompress it as {compression} ({first_line(e)}); the "
                            f"file is damaged or not {compression}-compressed") from None


def find_invalid_json(files: list[Path]) -> Optional[str]:
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
        with open_binary(path) as f:
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
    with open_binary(path) as f:
        try:
            json.loads(f.read().decode("utf-8-sig", errors="replace"))
            return True
        except ValueError:
            return False


def _byte_lines(f, size: int = READ_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream (any decompressor's: not all of them iterate by line)."""
    rest = b""
    while chunk := f.read(size):
        *lines, rest = (rest + chunk).split(b"\n")
        yield from lines
    if rest:
        yield rest


JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


def json_text_of_another_type(files: list[Path], text_field: str) -> Optional[str]:
    """The first JSON line whose text field holds a number, a list or an object, or whose nested
    text field (`body.text`) passes through something other than an object, and that line.

    datasets would read it, then re-read that field of every later record as JSON source text
    (quotes and backslashes put into the texts, silently); other fields may mix types freely.
    A file that is one JSON document, not JSON lines, is left to datasets."""
    keys = text_field.split(".")
    for path in files:
        with open_binary(path) as f:
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
