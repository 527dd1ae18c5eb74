"""Real-world data files: byte-order marks, CSV and TSV, compressed files, nested JSON fields,
a large text file read in pieces, and where a download may go."""

import bz2
import codecs
import contextlib
import gzip
import json
import lzma

import fsspec.compression
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tinyattn.data.faults as faults
import tinyattn.data.local_files as local_files
import tinyattn.data.records as records
import tinyattn.data.sources as sources
import tinyattn.data.text_files as text_files
from tinyattn.config import config_from_dict
from tinyattn.data.batches import prepare_data
from tinyattn.data.sources import resolve_source
from tinyattn.data.tokenizer import END_OF_TEXT
from tinyattn.errors import ConfigError, DataError

# The token caches written here in process go to the page cache alone
# (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")

DOCUMENTS = [f"Document {i}: " + "lorem ipsum, dolor \"sit\" amet 0123456789\n" * (i % 3 + 1)
             + f"the end of {i}." for i in range(20)]
HELD_OUT = [9, 19]  # every tenth document
BOM = "\ufeff"
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def make_config(tmp_path, data, tokenizer=None, context_length=8):
    return config_from_dict({
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": context_length},
        "data": {"cache_dir": str(tmp_path / "cache"), **data},
        "tokenizer": tokenizer or {"kind": "char"},
    })


def documents_of(result):
    """(training documents, validation documents) of a prepared corpus."""
    return tuple(result.tokenizer.decode(tokens).split(END_OF_TEXT)
                 for tokens in (result.train, result.validation))


def expected_split(documents):
    return ([d for i, d in enumerate(documents) if i not in HELD_OUT],
            [documents[i] for i in HELD_OUT])


def jsonl_text(documents, make_record=lambda text: {"text": text}):
    return "".join(json.dumps(make_record(text)) + "\n" for text in documents)


# ----------------------------------------------------------------------------- 9. byte-order marks


@pytest.mark.parametrize("layout", ["folder", "single file", "glob"])
def test_byte_order_mark_is_dropped_from_text_files(tmp_path, layout):
    folder = tmp_path / "books"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (folder / f"doc{i:02d}.txt").write_text((BOM if i % 4 == 0 else "") + text, encoding="utf-8")
    (tmp_path / "all.txt").write_text(BOM + "".join(DOCUMENTS), encoding="utf-8")
    entry = {"folder": str(folder), "glob": str(folder / "*.txt"),
             "single file": str(tmp_path / "all.txt")}[layout]
    result = prepare_data(make_config(tmp_path, {"files": [entry]}), progress=False)
    train, validation = documents_of(result)
    if layout == "single file":  # one document: its last tenth of characters validates
        assert train[0] + validation[0] == "".join(DOCUMENTS)
    else:
        assert (train, validation) == expected_split(DOCUMENTS)
    assert result.tokenizer.decode(result.tokenizer.encode(BOM)) != BOM  # not in the vocabulary


@pytest.mark.parametrize("newline", ["\r\n", "\r"], ids=["windows", "old-mac"])
def test_windows_and_old_mac_line_ends_in_text_files_are_read_as_newlines(tmp_path, newline):
    # As datasets' text builder reads them: a Notepad file trains as the same text, no '\r' in the vocabulary.
    folder = tmp_path / "books"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (folder / f"doc{i:02d}.txt").write_bytes(text.replace("\n", newline).encode("utf-8"))
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


# ----------------------------------------------------------------------------- 10. CSV and TSV


@pytest.mark.parametrize("suffix, separator", [(".csv", ","), (".tsv", "\t")])
def test_csv_and_tsv_read_only_the_text_field(tmp_path, suffix, separator):
    path = tmp_path / f"reviews{suffix}"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(separator.join(["id", "text", "label"]) + "\n")
        for i, text in enumerate(DOCUMENTS):
            quoted = '"' + text.replace('"', '""') + '"'  # commas, quotes and newlines inside
            f.write(separator.join([str(i), quoted, "positive"]) + "\n")
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)  # no header, ids or labels


def test_csv_text_that_looks_like_a_number_stays_text(tmp_path):
    path = tmp_path / "scores.csv"
    rows = ["007", "10", "NA", "null", "None", "nan", "N/A"] * 3  # and none of them "missing"
    path.write_text("text,id\n" + "".join(f"{t},{i}\n" for i, t in enumerate(rows)), encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}, context_length=2), progress=False)
    assert documents_of(result) == expected_split(rows)  # "007" keeps its zeros


@pytest.mark.parametrize("at", [12, 290_000], ids=["first-chunk", "after-10-MB"])
def test_a_number_among_json_texts_is_one_line_naming_its_line_not_texts_turned_to_json(tmp_path, at):
    # datasets' default re-reads a field whose type changes as JSON source text from then on:
    # quotes and backslashes written into every later text, silently.
    record = json.dumps({"text": 'He said "hi".\nShe left.'})
    lines = [record] * 300_000
    lines[at - 1] = json.dumps({"text": 7})
    path = tmp_path / "quotes.jsonl"
    path.write_text("\n".join(lines[:at + 20] if at < 100 else lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"quotes\.jsonl: line {at}: 'text' is a number \(7\), not text; "
                                        r"every value of the text field must be a string"):
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)


@pytest.mark.parametrize("layout", ["blank-first-lines", "dataset-folder"])
def test_a_number_among_json_texts_is_found_after_blank_lines_and_in_a_dataset_folder(tmp_path, monkeypatch,
                                                                                       layout):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    lines = [json.dumps({"text": 'He said "hi".'})] * 30
    lines[11] = json.dumps({"text": 7})
    folder = tmp_path / "corpus"
    folder.mkdir()
    path = folder / "train.jsonl"
    blank = "\n\n" if layout == "blank-first-lines" else ""
    path.write_text(blank + "\n".join(lines) + "\n", encoding="utf-8")
    line = 12 + blank.count("\n")
    data = {"files": [str(path)]} if layout == "blank-first-lines" else {"dataset": str(folder)}
    with pytest.raises(DataError, match=rf"train\.jsonl: line {line}: 'text' is a number \(7\), not text"):
        prepare_data(make_config(tmp_path, data), progress=False)


@pytest.mark.parametrize("line", [1, 2])
def test_a_bad_json_line_is_found_without_reading_the_rest_of_the_file(tmp_path, monkeypatch, line):
    # a bad first line that opens no array or object cannot start one JSON document over many lines
    record = json.dumps({"text": "lorem ipsum " * 10}) + "\n"
    path = tmp_path / "big.jsonl"
    rest = record * (3 * faults.READ_BYTES // len(record))
    bad = "{not json\n" if line == 2 else "not json\n"
    path.write_text(record * (line - 1) + bad + rest, encoding="utf-8")
    bytes_read = []

    class Counting:  # a file that counts the bytes read from it
        def __init__(self, f):
            self.f = f

        def read(self, size=-1):
            data = self.f.read(size)
            bytes_read.append(len(data))
            return data

    open_binary = local_files.open_binary

    @contextlib.contextmanager
    def counting(p):
        with open_binary(p) as f:
            yield Counting(f)

    monkeypatch.setattr(faults, "open_binary", counting)
    fault = "Expecting property name enclosed in double quotes at column 2" if line == 2 else (
        "Expecting value at column 1")
    assert faults.find_invalid_json([path]) == f"{path}: line {line} is not valid JSON ({fault})"
    assert 0 < sum(bytes_read) <= faults.READ_BYTES < path.stat().st_size // 2


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_json_lines_file_is_named_not_utf8_not_bad_json(tmp_path, encoding):
    """A JSON lines file saved as UTF-16 (Windows PowerShell's `>`) is not UTF-8, as a UTF-16 text
    file is said to be: 'line 1 is not valid JSON' sent the user looking for a syntax error."""
    path = tmp_path / "notes.jsonl"
    path.write_bytes(jsonl_text(DOCUMENTS).encode(encoding))
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    mark = "UTF-32" if encoding == "utf-32" else "UTF-16"  # UTF-32-LE's mark starts with UTF-16-LE's
    assert str(error.value) == (f"{path}: not valid UTF-8 at byte 0 (line 1): it starts with {mark}'s "
                                "byte-order mark; save it as UTF-8"
                                if encoding != "utf-16-be" else  # utf-16-be: no mark, a NUL first
                                f"{path}: line 1 holds a NUL byte (byte 0), which no JSON text does: "
                                "it is UTF-16 or not text; save it as UTF-8")


@pytest.mark.parametrize("name", ["notes.txt", "notes.jsonl"])
def test_a_file_with_utf32_big_endians_byte_order_mark_is_named_utf32(tmp_path, name):
    # Its mark, 00 00 FE FF, is UTF-8 up to its third byte: the first byte that is not is byte 2, and the
    # mark went unnamed there ('not valid UTF-8 at byte 2 (line 1); save it as UTF-8').
    path = tmp_path / name
    path.write_bytes(codecs.BOM_UTF32_BE + jsonl_text(DOCUMENTS).encode("utf-32-be"))
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert str(error.value) == (f"{path}: not valid UTF-8 at byte 2 (line 1): it starts with UTF-32's "
                                "byte-order mark; save it as UTF-8")


def test_a_json_line_after_good_ones_that_is_not_utf8_is_named_at_its_byte(tmp_path):
    good = (json.dumps({"text": "caf\u00e9 ok"}) + "\n").encode()
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(good * 3 + '{"text": "caf\u00e9\n'.encode("latin-1") + good)
    at = 3 * len(good) + len('{"text": "caf')
    expected = f"{path}: not valid UTF-8 at byte {at} (line 4); save it as UTF-8"
    assert faults.find_invalid_json([path]) == expected


def test_a_folder_reads_the_files_of_a_linked_folder_inside_it_once_and_a_link_above_is_no_loop(tmp_path):
    """data.files: [books/] where books/more links to a folder elsewhere: its files are below books/, as
    books/**/*.txt finds them; Path.rglob left them out, unsaid."""
    books, elsewhere = tmp_path / "books", tmp_path / "elsewhere"
    books.mkdir()
    elsewhere.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (books if i < 10 else elsewhere).joinpath(f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    (books / "more").symlink_to(elsewhere, target_is_directory=True)
    by_glob = resolve_source(make_config(tmp_path, {"files": [str(books / "**" / "*.txt")]}).data, False)
    by_folder = resolve_source(make_config(tmp_path, {"files": [str(books)]}).data, False)
    assert len(by_folder.identity["files"]) == len(DOCUMENTS)
    names = [sorted(entry[0] for entry in source.identity["files"]) for source in (by_folder, by_glob)]
    assert names[0] == names[1]
    (books / "twice").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "up").symlink_to(books, target_is_directory=True)  # a loop, which a glob's ** would follow
    found = local_files.folder_files(books)
    assert sorted(path.name for path in found) == [f"doc{i:02d}.txt" for i in range(len(DOCUMENTS))]


def test_other_json_fields_may_mix_types_the_texts_are_read_as_written(tmp_path):
    path = tmp_path / "mixed.jsonl"
    ids = [i if i < 5 else f"x{i}" for i in range(len(DOCUMENTS))]  # an id column of ints, then strings
    path.write_text("".join(json.dumps({"id": i, "text": d, "meta": {"a": 1} if i == 0 else "none"}) + "\n"
                            for i, d in zip(ids, DOCUMENTS)), encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("shards", ["json other fields", "json first shard all null", "csv other fields"])
def test_shards_whose_other_fields_differ_are_read_in_file_order_only_their_text_field_counts(
        tmp_path, shards, capsys):
    # datasets casts every file of one dataset to the first file's columns: a traceback (json) or
    # "Schema at index 1 was different" naming no file (csv), for data that is fine.
    folder = tmp_path / "shards"
    folder.mkdir()
    first, second = DOCUMENTS[:7], DOCUMENTS[7:]
    if shards == "csv other fields":
        for name, header, texts in (("a.csv", "id,text", first), ("b.csv", "text,label", second)):
            rows = [",".join([str(i), '"' + t.replace('"', '""') + '"'] if header == "id,text"
                             else ['"' + t.replace('"', '""') + '"', "1"]) for i, t in enumerate(texts)]
            (folder / name).write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    else:
        if shards == "json first shard all null":
            (folder / "0.jsonl").write_text(jsonl_text([None, None]), encoding="utf-8")
        (folder / "a.jsonl").write_text(jsonl_text(first, lambda t: {"id": 1, "text": t}), encoding="utf-8")
        (folder / "b.jsonl").write_text(jsonl_text(second, lambda t: {"text": t, "label": [1]}),
                                        encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)  # in file order, every tenth held out
    if shards == "json first shard all null":
        assert "skipped 2 of 22 records: 2 with no 'text' (null or missing)" in capsys.readouterr().err
    limited = prepare_data(make_config(tmp_path, {"files": [str(folder)], "max_documents": 15}),
                           progress=False)
    assert documents_of(limited) == (DOCUMENTS[:9] + DOCUMENTS[10:15], [DOCUMENTS[9]])


def test_csv_with_an_unclosed_quote_is_one_line(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text('text,id\n"an unclosed quote,1\n' + "fine,2\n" * 30, encoding="utf-8")
    with pytest.raises(DataError, match=r"reviews\.csv: cannot read it \(Error tokenizing data\..*\)$"):
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)



def test_an_empty_csv_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\nhello there,1\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text("", encoding="utf-8")
    for files in ([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], [str(tmp_path / "b.csv")]):
        with pytest.raises(DataError, match=rf"{tmp_path / 'b.csv'}: an empty CSV file \(not even a header row\)"):
            prepare_data(make_config(tmp_path, {"files": files}), progress=False)

@pytest.mark.parametrize("name", ["train.jsonl", "train.jsonl.gz", "dataset-folder"])
def test_an_empty_json_lines_file_is_one_line_naming_it(tmp_path, monkeypatch, name):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    path = folder / name.replace("dataset-folder", "train.jsonl")
    path.write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    data = {"dataset": str(folder)} if name == "dataset-folder" else {"files": [str(path)]}
    with pytest.raises(DataError, match=rf"{path}: an empty JSON lines file \(no records\); remove it"):
        prepare_data(make_config(tmp_path, data), progress=False)


@pytest.mark.parametrize("empty", ["a.jsonl", "b.jsonl", "b.jsonl.gz"])
def test_an_empty_json_lines_file_among_others_is_zero_records_only_all_empty_is_refused(tmp_path, empty):
    # each file is its own dataset, so an empty one that is not first must not stop the corpus
    folder = tmp_path / "corpus"
    folder.mkdir()
    names = ["a.jsonl", "b.jsonl", "c.jsonl"]
    names[names.index(empty.removesuffix(".gz"))] = empty
    texts = iter([DOCUMENTS[:12], DOCUMENTS[12:]])
    for name in names:
        if name == empty:
            (folder / name).write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
        else:
            (folder / name).write_text(jsonl_text(next(texts)), encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)
    (folder / "a.jsonl").write_bytes(b"")
    (folder / "c.jsonl").write_bytes(b"")
    (folder / "b.jsonl").unlink(missing_ok=True)
    with pytest.raises(DataError, match=rf"^{folder / 'a.jsonl'}: an empty JSON lines file \(no records\)"):
        prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)


@pytest.mark.parametrize("layout", ["files", "dataset-folder"])
def test_parquet_files_with_no_rows_or_an_empty_first_row_group_are_read(tmp_path, monkeypatch, layout):
    # datasets read a file in batches of its first row group's rows: 0 for a shard with no rows (an empty
    # partition a writer left) or one opened with an empty row group, and the run ended in
    # "cannot read it (BatchSize must be greater than 0, got 0)"
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    schema = pa.schema([("text", pa.string())])
    pq.write_table(pa.table({"text": DOCUMENTS[:12]}), folder / "train-0.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), folder / "train-1.parquet")
    with pq.ParquetWriter(folder / "train-2.parquet", schema) as writer:
        writer.write_table(pa.table({"text": pa.array([], pa.string())}, schema=schema))
        writer.write_table(pa.table({"text": DOCUMENTS[12:]}, schema=schema))
    assert pq.ParquetFile(folder / "train-2.parquet").metadata.row_group(0).num_rows == 0
    data = {"dataset": str(folder)} if layout == "dataset-folder" else {"files": [str(folder)]}
    result = prepare_data(make_config(tmp_path, data), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


def test_csv_without_the_text_field_lists_its_columns(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("id,body\n1,hello\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"reviews\.csv has no field 'text'; its fields are: id, body$"):
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)


# ----------------------------------------------------------------------------- 11. compression


def write_compressed(path, text):
    with OPENERS[path.suffix](path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("compression", list(OPENERS))
def test_compressed_text_and_json_lines_by_their_inner_extension(tmp_path, compression):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        write_compressed(folder / f"doc{i:02d}.txt{compression}", text)
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)

    corpus = write_compressed(tmp_path / f"corpus.jsonl{compression}", jsonl_text(DOCUMENTS))
    result = prepare_data(make_config(tmp_path, {"files": [str(corpus)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)
    assert result.cache_dir.name.startswith("corpus-char-")


def test_folder_and_glob_of_gzipped_json_lines(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for part in range(2):
        write_compressed(folder / f"part-{part}.jsonl.gz", jsonl_text(DOCUMENTS[part * 10:(part + 1) * 10]))
    (folder / "README").write_text("not data")
    for entry in (str(folder), str(folder / "*.jsonl.gz")):
        result = prepare_data(make_config(tmp_path, {"files": [entry]}), progress=False)
        assert documents_of(result) == expected_split(DOCUMENTS)



@pytest.mark.parametrize("entry", ["data", "data/**/*"])
def test_a_folder_or_glob_never_reads_the_token_cache_inside_it(tmp_path, monkeypatch, entry):
    # The default data.cache_dir, data/cache, sits inside data/: the second run must read the
    # same corpus as the first, not the first run's cache files too.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for i in range(2):
        (tmp_path / "data" / f"book-{i}.txt").write_text(DOCUMENTS[i] * 50, encoding="utf-8")
    config = config_from_dict({"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8},
                               "data": {"files": [entry], "cache_dir": "data/cache"}})
    first = documents_of(prepare_data(config, progress=False))
    assert (tmp_path / "data" / "cache").is_dir()
    resolved = local_files.resolve_files([entry], "auto", cache_dir=tmp_path / "data" / "cache")
    assert [p.name for p in resolved] == ["book-0.txt", "book-1.txt"]
    assert documents_of(prepare_data(config, progress=False)) == first

def test_zst_without_a_zstd_reader_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delitem(fsspec.compression.compr, "zstd", raising=False)
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd not really zstd")
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert str(error.value) == (f"data.files: {path} is zstd-compressed and reading it needs the "
                                "zstandard package: pip install zstandard")


def test_zst_is_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_text(DOCUMENTS).encode()))
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("name", ["corpus.txt.gz", "corpus.jsonl.gz", "corpus.jsonl.xz"])
@pytest.mark.parametrize("damage", ["not compressed", "cut short"])
def test_damaged_compressed_file_is_named_in_one_line(tmp_path, name, damage):
    path = tmp_path / name
    if damage == "not compressed":
        path.write_text(jsonl_text(DOCUMENTS), encoding="utf-8")
    else:
        whole = write_compressed(tmp_path / f"whole{path.suffix}", jsonl_text(DOCUMENTS * 20)).read_bytes()
        path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    compression = {".gz": "gzip", ".xz": "xz"}[path.suffix]
    assert str(error.value).startswith(f"{path}: cannot decompress it as {compression} (")
    assert str(error.value).endswith(f"the file is damaged or not {compression}-compressed")
    assert "\n" not in str(error.value) and error.value.__suppress_context__


def test_a_cut_short_gzip_file_in_a_dataset_folder_is_named_in_one_line(tmp_path, monkeypatch):
    # a dataset folder reads its files as data.files does: the same one line, not an EOFError traceback
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    whole = write_compressed(tmp_path / "whole.gz", jsonl_text(DOCUMENTS * 20)).read_bytes()
    path = folder / "train.jsonl.gz"
    path.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert str(error.value).startswith(f"{path}: cannot decompress it as gzip (")
    assert "\n" not in str(error.value) and error.value.__suppress_context__


@pytest.mark.parametrize("layout", ["one corpus file", "its own splits"])
def test_a_dataset_folder_holding_the_token_cache_gives_the_same_data_and_key_every_run(tmp_path, monkeypatch,
                                                                                       layout):
    # data.dataset: data with the default data.cache_dir, data/cache: datasets was shown the cache's
    # train.bin and meta.json too (a second run: "No (supported) data files found"), and they keyed it
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    if layout == "one corpus file":
        (tmp_path / "data" / "corpus.jsonl").write_text(jsonl_text(DOCUMENTS, lambda t: {"content": t}))
        data, expected = {"text_field": "content"}, expected_split(DOCUMENTS)
    else:
        (tmp_path / "data" / "train.jsonl").write_text(jsonl_text(DOCUMENTS[:15]))
        (tmp_path / "data" / "validation.jsonl").write_text(jsonl_text(DOCUMENTS[15:]))
        data, expected = {"validation_split": "validation"}, (DOCUMENTS[:15], DOCUMENTS[15:])
    (tmp_path / "data" / ".notes.jsonl").write_text(jsonl_text(["hidden, never read"]))
    config = config_from_dict({"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8},
                               "data": {"dataset": "data", "cache_dir": "data/cache", **data}})
    runs = [prepare_data(config, progress=False) for _ in range(3)]
    assert [documents_of(run) for run in runs] == [expected] * 3
    assert {run.cache_dir for run in runs} == {runs[0].cache_dir}
    assert [p.parent for p in (tmp_path / "data" / "cache").glob("*/meta.json")] == [runs[0].cache_dir]
    for path in (tmp_path / "data").glob("*.jsonl"):
        path.unlink()
    with pytest.raises(DataError) as error:  # left: the cache and a hidden file, neither of them data
        prepare_data(config, progress=False)
    assert str(error.value) == ("data.dataset: the folder data has no data files datasets reads (.jsonl, "
                                ".csv, .parquet, .txt, ...; hidden files and what a token cache writes are "
                                "not read)")


def test_a_dataset_folder_is_refused_in_one_line_where_datasets_lacks_the_private_rules_it_reads(
        tmp_path, monkeypatch):
    # the split rules are two private names of datasets; a release without them must give one line
    import datasets
    import datasets.data_files

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.delattr(datasets.data_files, "_get_data_files_patterns")
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    message = str(error.value)
    assert message.startswith(f"data.dataset: reading the local folder {folder} needs datasets' rules")
    assert "as data.files" in message and "\n" not in message


def test_a_dataset_folder_reads_past_token_files_no_reader_takes(tmp_path, monkeypatch):
    # a train.bin and a val.bin (nanoGPT's, or a token cache's under another data.cache_dir) were the
    # splits train and validation: "Unable to find '.../train.bin' with any supported extension [...]"
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text(jsonl_text(DOCUMENTS))
    for name in ("train.bin", "val.bin"):
        (folder / name).write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


def test_a_dataset_folder_whose_card_names_its_configs_files_reads_the_config_chosen(tmp_path, monkeypatch):
    # a hub dataset's snapshot: README.md's configs name each config's files, which datasets reads
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    for name, documents in (("small", DOCUMENTS[:10]), ("big", DOCUMENTS)):
        (folder / name).mkdir(parents=True)
        (folder / name / "train.jsonl").write_text(jsonl_text(documents))
    (folder / "README.md").write_text("---\nconfigs:\n" + "".join(
        f"- config_name: {name}\n  data_files:\n  - split: train\n    path: {name}/train.jsonl\n"
        for name in ("small", "big")) + "---\n")
    config = make_config(tmp_path, {"dataset": str(folder), "dataset_config": "big"})
    result = prepare_data(config, progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)
    # the other config, beside it in the same cache_dir: its own cache, not the first one's tokens
    small = prepare_data(make_config(tmp_path, {"dataset": str(folder), "dataset_config": "small"}),
                         progress=False)
    assert documents_of(small) == (DOCUMENTS[:9], [DOCUMENTS[9]])


@pytest.mark.parametrize("compression", ["", ".gz"])
def test_a_dataset_folder_of_text_files_reads_one_document_per_file_as_data_files_does(tmp_path, monkeypatch,
                                                                                       compression):
    # datasets' text builder made each line a document and dropped its newline
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "books"
    folder.mkdir()
    write = write_compressed if compression else lambda path, text: path.write_text(text, encoding="utf-8")
    for i, text in enumerate(DOCUMENTS):
        write(folder / f"book-{i:02d}.txt{compression}", text)
    as_dataset = documents_of(prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False))
    as_files = documents_of(prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False))
    assert as_dataset == as_files == expected_split(DOCUMENTS)


@pytest.mark.parametrize("saved", ["Dataset", "DatasetDict"])
def test_a_dataset_folder_written_by_save_to_disk_is_read(tmp_path, monkeypatch, saved):
    # a Dataset's folder: "You are trying to load a dataset that was saved using save_to_disk. Please
    # use load_from_disk instead", advice no setting follows; a DatasetDict's "dev" split was "validation"
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "saved"
    if saved == "Dataset":
        datasets.Dataset.from_dict({"text": DOCUMENTS}).save_to_disk(folder)
        data, expected = {}, expected_split(DOCUMENTS)
    else:
        splits = {"train": DOCUMENTS[:15], "dev": DOCUMENTS[15:]}
        datasets.DatasetDict({name: datasets.Dataset.from_dict({"text": documents})
                              for name, documents in splits.items()}).save_to_disk(folder)
        data, expected = {"validation_split": "dev"}, (DOCUMENTS[:15], DOCUMENTS[15:])
    config = make_config(tmp_path, {"dataset": str(folder), **data})
    assert documents_of(prepare_data(config, progress=False)) == expected
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": str(folder), "validation_split": "test"}),
                     progress=False)
    splits = ["train"] if saved == "Dataset" else ["train", "dev"]
    assert str(error.value) == f"data.dataset {str(folder)!r}: Bad split: test. Available splits: {splits}"


@pytest.mark.parametrize("setting", ["data.revision", "data.train_split", "data.validation_split"])
def test_a_dataset_folder_refuses_a_revision_and_a_sliced_split_in_one_line(tmp_path, monkeypatch, setting):
    # a revision was ignored but changed the cache's key; a slice said only "Bad split: train[:50%]"
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    value = {"data.revision": "v1.0", "data.train_split": "train[:50%]",
             "data.validation_split": "train[90%:]"}[setting]
    config = make_config(tmp_path, {"dataset": str(folder), setting.split(".")[1]: value})
    with pytest.raises(DataError) as error:
        prepare_data(config, progress=False)
    if setting == "data.revision":
        assert str(error.value) == (f"data.revision: 'v1.0' names a revision of a Hugging Face Hub dataset; "
                                    f"data.dataset {str(folder)!r} is a local folder, read as it is now: "
                                    "remove data.revision (or set it to null)")
    else:
        assert str(error.value).startswith(f"{setting}: {value!r} is a slice, which only a hub dataset read "
                                           "whole (data.streaming: false) takes; ")
        assert str(error.value).endswith("name a whole split, and keep its first N documents with "
                                         "data.max_documents")
    assert not (tmp_path / "cache").exists()


def test_compressed_parquet_is_refused_in_one_line(tmp_path):
    path = tmp_path / "t.parquet.gz"
    path.write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(DataError, match=r"t\.parquet\.gz: Parquet compresses its own columns.*decompress"):
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)


# ----------------------------------------------------------------------------- 12. download target


def test_download_target_must_be_one_plain_path(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.files: '.*\*\.txt' is not accepted; .*not a glob"):
        make_config(tmp_path, {"files": [str(tmp_path / "*.txt")], "url": "https://example.org/x.txt"})
    (tmp_path / "books").mkdir()
    config = make_config(tmp_path, {"files": [str(tmp_path / "books")], "url": "https://example.org/x.txt"})
    with pytest.raises(DataError, match=r"books is a folder; data\.url is downloaded to one file"):
        resolve_source(config.data, progress=False)
    # a folder not made yet, said so by its trailing separator: refused too, never downloaded into a file
    config = make_config(tmp_path, {"files": [f"{tmp_path / 'fresh'}/"], "url": "https://example.org/x.txt"})
    with pytest.raises(DataError, match=r"fresh/ is a folder; data\.url is downloaded to one file"):
        resolve_source(config.data, progress=False)
    assert not (tmp_path / "fresh").exists()


# ----------------------------------------------------------------------------- 13. nested fields


def test_dotted_text_field_reads_nested_records(tmp_path):
    make_record = lambda text: {"id": 1, "body": {"title": "t", "content": {"text": text}}}  # noqa: E731
    path = tmp_path / "nested.jsonl"
    path.write_text(jsonl_text(DOCUMENTS, make_record), encoding="utf-8")
    config = make_config(tmp_path, {"files": [str(path)], "text_field": "body.content.text"})
    assert documents_of(prepare_data(config, progress=False)) == expected_split(DOCUMENTS)

    table = pa.table({"body": [{"text": text, "n": i} for i, text in enumerate(DOCUMENTS)]})
    pq.write_table(table, tmp_path / "nested.parquet")
    config = make_config(tmp_path, {"files": [str(tmp_path / "nested.parquet")], "text_field": "body.text"})
    assert documents_of(prepare_data(config, progress=False)) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("holder, other", [("body", "plain text"), ("body.content", ["a", "list"])])
def test_a_nested_text_field_through_another_type_on_one_line_names_that_line(tmp_path, holder, other):
    # datasets read such a "body" as JSON text, and the message said "has no field 'body.text'"
    path = tmp_path / "mixed.jsonl"
    records = [{"body": {"content": {"text": text}}, "other": i} for i, text in enumerate(DOCUMENTS)]
    records[7]["body"] = other if holder == "body" else {"content": other}
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    config = make_config(tmp_path, {"files": [str(path)], "text_field": "body.content.text"})
    with pytest.raises(DataError) as error:
        prepare_data(config, progress=False)
    next_key = "content" if holder == "body" else "text"
    kind = "text" if holder == "body" else "an array"
    assert str(error.value).startswith(f"{path}: line 8: {holder!r} is {kind} ({json.dumps(other)}), not an "
                                       f"object holding {next_key!r}; for data.text_field "
                                       f"'body.content.text' every {holder!r} must be an object (or null)")
    assert error.value.__cause__ is None and "\n" not in str(error.value)


def test_missing_nested_field_lists_the_nested_ones(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text(jsonl_text(DOCUMENTS, lambda text: {"body": {"text": text}}), encoding="utf-8")
    config = make_config(tmp_path, {"files": [str(path)], "text_field": "body.txt"})
    with pytest.raises(DataError, match=r"has no field 'body\.txt'; its fields are: body, body\.text$"):
        prepare_data(config, progress=False)


# ----------------------------------------------------------------------------- 14. large text files


def book(n_lines=2000):
    return "".join(f"Line {i}: to be or not to be, that is the question {i * 7919 % 1000}.\n"
                   + ("\n" if i % 50 == 49 else "") for i in range(n_lines))


def test_a_text_file_is_read_in_pieces_that_leave_the_tokens_unchanged(tmp_path, monkeypatch):
    text = BOM + book()
    path = tmp_path / "book.txt"
    path.write_text(text, encoding="utf-8")
    tokenizer = {"kind": "bpe", "vocab_size": 300}
    whole = prepare_data(make_config(tmp_path / "whole", {"files": [str(path)]}, tokenizer), progress=False)

    monkeypatch.setattr(text_files, "READ_CHARS", 1000)
    config = make_config(tmp_path / "pieces", {"files": [str(path)]}, tokenizer)
    parts = list(resolve_source(config.data, progress=False).reader("train")())
    assert len(parts) > 50 and max(len(part) for part, _ in parts) <= 1000  # never the whole file
    assert [starts for _, starts in parts] == [True] + [False] * (len(parts) - 1)  # one document
    assert "".join(part for part, _ in parts) == text[1:]
    pieces = prepare_data(config, progress=False)
    assert pieces.tokenizer.to_json() == whole.tokenizer.to_json()
    assert np.array_equal(pieces.train, whole.train) and np.array_equal(pieces.validation, whole.validation)


def test_a_cut_in_a_later_piece_of_a_long_file_still_sets_the_next_file_off_with_end_of_text(tmp_path,
                                                                                            monkeypatch):
    """Two files hold out the last tenth of their characters: here the end of the long one, read in
    pieces, and the whole short one, which starts a document of its own in the validation split."""
    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text(book(), encoding="utf-8")
    short.write_text("that is the question.\n", encoding="utf-8")
    monkeypatch.setattr(text_files, "READ_CHARS", 1000)  # the cut falls in about the 100th piece
    result = prepare_data(make_config(tmp_path, {"files": [str(long), str(short)]}), progress=False)
    cut = int((len(book()) + len("that is the question.\n")) * 0.9)
    assert documents_of(result) == ([book()[:cut]], [book()[cut:], "that is the question.\n"])


@pytest.mark.parametrize("progress", [False, True])
def test_reading_a_large_file_reports_how_far_it_got(tmp_path, monkeypatch, capsys, progress):
    path = tmp_path / "book.txt"
    path.write_text(book(), encoding="utf-8")
    monkeypatch.setattr(text_files, "READ_CHARS", 1000)
    monkeypatch.setattr(text_files, "REPORT_BYTES", path.stat().st_size)  # files at least this large report
    config = make_config(tmp_path, {"files": [str(path)]})
    read = resolve_source(config.data, progress=progress).reader("train")
    list(read())
    list(read())
    err = capsys.readouterr().err
    if progress:
        assert "reading book.txt (pass 2)" in err and "B/s" in err  # a progress bar
    else:
        megabytes = f"{path.stat().st_size / 1e6:,.0f} MB"
        assert [line for line in err.splitlines() if "pass 2" in line] == [
            f"reading book.txt (pass 2): {p}% of {megabytes}" for p in (25, 50, 75, 100)]


def test_one_long_text_is_read_once_per_use(tmp_path, monkeypatch):
    """Counting documents and characters (to cut the last tenth), training the tokenizer,
    tokenizing train, tokenizing validation: four readings, the counts sharing one."""
    path = tmp_path / "book.txt"
    path.write_text(book(), encoding="utf-8")
    readings = []
    original = text_files._text_parts
    monkeypatch.setattr(text_files, "_text_parts", lambda *args: readings.append(args) or original(*args))
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert len(readings) == 4
    train, validation = documents_of(result)
    assert len(validation[0]) == len(book()) - int(len(book()) * 0.9)  # the last tenth of the characters


def test_records_without_text_are_skipped_and_counted_once(tmp_path, capsys):
    records = [{"text": text} for text in DOCUMENTS]
    records += [{"text": None}, {"id": 7}, {"id": 8}, {"text": ""}]  # null, missing twice, empty
    path = tmp_path / "sparse.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1, err  # the corpus is read several times; said once
    assert (f"warning: {path}: skipped 4 of 24 records: 3 with no 'text' (null or missing) and 1 whose "
            "'text' is empty") in err


@pytest.mark.parametrize("name", ["train.jsonl", "book.txt.gz"])
def test_a_file_linked_to_a_blob_without_an_extension_is_read_by_its_links_name(tmp_path, name):
    # The Hugging Face cache's layout: snapshots/<rev>/<name> -> ../../blobs/<hash>.
    blob = tmp_path / "blobs" / "3f2a9c"
    blob.parent.mkdir()
    if name.endswith(".jsonl"):
        blob.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS), encoding="utf-8")
    else:
        blob.write_bytes(gzip.compress("".join(DOCUMENTS).encode("utf-8")))
    link = tmp_path / "snapshots" / "abc" / name
    link.parent.mkdir(parents=True)
    link.symlink_to("../../blobs/3f2a9c")
    both = {"files": [str(link), str(link.parent / "*")]}  # the link, and a glob that finds it again
    result = prepare_data(make_config(tmp_path, both), progress=False)
    text = result.tokenizer.decode(np.concatenate([result.train, result.validation]).tolist())
    # Every character of the documents once (in the splits' order), decompressed, not doubled:
    assert sorted(text.replace(END_OF_TEXT, "")) == sorted("".join(DOCUMENTS))


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "stopped before meta.json"])
@pytest.mark.parametrize("entry", ["folder", "glob", "dataset folder"])
def test_a_token_cache_left_in_a_data_folder_under_another_cache_dir_is_not_read_as_data(
        tmp_path, monkeypatch, entry, finished):
    # data/cache left from a run whose data.cache_dir was data/cache: its meta.json and tokenizer.json
    # were read as JSON records (a ValueError traceback); a build whose splits were too short leaves
    # train.bin, validation.bin and tokenizer.json without meta.json
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text(jsonl_text(DOCUMENTS))
    source = {"folder": {"files": [str(folder)]}, "glob": {"files": [str(folder / "**" / "*.json*")]},
              "dataset folder": {"dataset": str(folder)}}[entry]
    model = {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8}
    beside = {**source, "cache_dir": str(folder / "cache")}
    first = prepare_data(config_from_dict({"model": model, "data": beside}), progress=False)
    assert first.cache_dir.parent == folder / "cache" and (first.cache_dir / "meta.json").is_file()
    if not finished:
        (first.cache_dir / "meta.json").unlink()
    again = prepare_data(make_config(tmp_path, source), progress=False)  # data.cache_dir elsewhere now
    assert documents_of(again) == documents_of(first) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("cache_dir", [".", "data"])
@pytest.mark.parametrize("entry", ["glob", "folder", "dataset folder"])
def test_a_cache_dir_that_holds_the_data_hides_only_what_the_token_cache_writes(tmp_path, monkeypatch,
                                                                                entry, cache_dir):
    # data.cache_dir '.' (what the blank cache_dir's refusal advises), or the data's own folder: every
    # file under it was taken for the cache's ("no file matches the pattern", "the folder has no data
    # files"). What the cache writes stays unread: its folders, the build locks, datasets' lock files
    # and train.init_from's copy of a checkpoint's tokenizer, a JSON file a glob of data/ would take.
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.jsonl").write_text(jsonl_text(DOCUMENTS))
    (tmp_path / cache_dir / "init_from-0123456789abcdef-tokenizer.json").write_text('{"model": {}}')
    source = {"glob": {"files": ["data/**/*"]}, "folder": {"files": ["data"]},
              "dataset folder": {"dataset": "data"}}[entry]
    config = config_from_dict({"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8},
                               "data": {**source, "cache_dir": cache_dir}})
    runs = [prepare_data(config, progress=False) for _ in range(2)]
    assert [documents_of(run) for run in runs] == [expected_split(DOCUMENTS)] * 2
    assert runs[0].cache_dir == runs[1].cache_dir and runs[0].cache_dir.parent == (tmp_path / cache_dir)
    if entry == "dataset folder" or cache_dir == ".":
        return
    assert list((tmp_path / "data" / "datasets").glob("*.lock"))  # datasets' lock files are there too
    with pytest.raises(DataError) as error:  # a pattern that finds only the cache's files says so
        resolve_source(config_from_dict({"data": {"files": ["data/**/*.bin"], "cache_dir": cache_dir}}).data,
                       progress=False)
    assert str(error.value).startswith("data.files: the pattern 'data/**/*.bin' matches only files a token "
                                       f"cache writes (data/{runs[0].cache_dir.name}/train.bin, ...), "
                                       "which are never read")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name,written", [
    ("corpus-char-0123456789ab/train.bin", True),  # a build cut short: no tokenizer.json yet
    (".corpus-char-0123456789ab.build.filelock", True),
    ("init_from-0123456789abcdef-tokenizer.json", True),
    ("datasets/_data_json_default-0123_0.0.0_abcd.lock", True),
    ("corpus.jsonl", False),
    ("tokenizer.json", False),
    ("books/train.bin", False),  # nanoGPT's, say: not in a folder named as a cache's
])
def test_what_the_token_cache_writes_in_its_folder_is_told_from_data_there(tmp_path, name, written):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    assert local_files._cache_file(path, tmp_path.resolve()) is written


def test_a_dataset_folder_whose_path_holds_a_bracket_is_refused_in_one_line_not_called_empty(tmp_path):
    # datasets finds a folder's files by patterns on its path: [v2] matched nothing, and the error said
    # the folder had no data files
    folder = tmp_path / "ds[v2]"
    folder.mkdir()
    (folder / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert str(error.value).startswith(f"data.dataset: the folder path {str(folder)!r} holds '['")
    assert "as data.files" in str(error.value)
    decoy = tmp_path / "dsv"  # what the pattern ds[v2] matches
    decoy.mkdir()
    (decoy / "train.jsonl").write_text(jsonl_text(["not this one"] * 20))
    for entry in (folder, folder / "train.jsonl"):  # what the message points to reads the file named
        files = prepare_data(make_config(tmp_path, {"files": [str(entry)]}), progress=False)
        assert documents_of(files) == expected_split(DOCUMENTS)


def test_a_file_whose_name_holds_a_bracket_in_a_dataset_folder_is_read_not_its_lookalike(
        tmp_path, monkeypatch):
    # the split lists went to datasets unescaped: train-[1].jsonl was the pattern train-1.jsonl, so
    # it was left out beside train-1.jsonl (a name datasets' rules give no split, such as
    # train[1].jsonl, is left out by datasets itself)
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train-[1].jsonl").write_text(jsonl_text(DOCUMENTS[:10]))
    (folder / "train-1.jsonl").write_text(jsonl_text(DOCUMENTS[10:]))
    both = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    train, validation = documents_of(both)
    assert sorted(train + validation) == sorted(DOCUMENTS)


@pytest.mark.parametrize("header, message", [
    ("configs: [oops", "its YAML header (the dataset card's metadata) does not parse ("),
    ("configs: 5", "configs: expected a list of configs (config_name, data_files), got 5; fix or remove it"),
], ids=["does not parse", "configs not a list"])
def test_a_dataset_folder_whose_card_header_is_bad_names_its_readme_in_one_line(tmp_path, monkeypatch, header,
                                                                                 message):
    # a yaml.ParserError, and a TypeError for a configs that is no list, were tracebacks
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    (folder / "README.md").write_text(f"---\n{header}\n---\n# a corpus\n")
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert str(error.value).startswith(f"{folder / 'README.md'}: {message}") and "\n" not in str(error.value)


@pytest.mark.parametrize("entry", ["folder", "glob", "dataset folder"])
def test_a_fine_tunes_tokenizer_in_a_cache_dir_inside_the_data_folder_is_not_read_as_data(
        tmp_path, monkeypatch, entry):
    # data.cache_dir holds more than token caches: a fine-tune copies its checkpoint's tokenizer there
    # (init_from-<digest>-tokenizer.json), in no cache's folder, so only data.cache_dir itself (given
    # relative, as by default) says it is no data; read as records it would be "has no field 'text'"
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "cache").mkdir(parents=True)
    (tmp_path / "data" / "corpus.jsonl").write_text(jsonl_text(DOCUMENTS))
    (tmp_path / "data" / "cache" / "init_from-0123456789abcdef-tokenizer.json").write_text(
        json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    source = {"folder": {"files": ["data"]}, "glob": {"files": ["data/**/*"]},
              "dataset folder": {"dataset": "data"}}[entry]
    config = config_from_dict({"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": 8},
                               "data": {**source, "cache_dir": "data/cache"}})
    assert documents_of(prepare_data(config, progress=False)) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("entry", ["folder", "dataset folder"])
def test_a_data_folder_inside_a_hidden_folder_is_read(tmp_path, monkeypatch, entry):
    # hidden files and folders are left out below the folder given, not above it: the Hugging Face
    # cache, ~/.cache/huggingface, is a hidden folder
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / ".cache" / "corpus"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    (folder / ".notes.jsonl").write_text(jsonl_text(["hidden, never read"]))
    source = {"files": [str(folder)]} if entry == "folder" else {"dataset": str(folder)}
    result = prepare_data(make_config(tmp_path, source), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("name", ["tokenizer.json", "meta.json"])
def test_a_tokenizer_json_or_meta_json_beside_the_data_without_a_train_bin_leaves_the_data_read(
        tmp_path, name):
    # a folder is a token cache's only with a train.bin too: a pretrained tokenizer.json kept beside
    # the books (or a meta.json describing them) must not make the books themselves no data
    folder = tmp_path / "books"
    folder.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (folder / f"book-{i:02d}.txt").write_text(text, encoding="utf-8")
    (folder / name).write_text(json.dumps({"version": "1.0"}))
    for entry in (str(folder / "*.txt"), str(folder)):
        config = make_config(tmp_path, {"files": [entry], "format": "text"})
        assert documents_of(prepare_data(config, progress=False)) == expected_split(DOCUMENTS)


def test_a_file_two_of_a_splits_patterns_match_in_a_dataset_folder_is_read_once(tmp_path, monkeypatch):
    # wiki-train/train/part-0.jsonl is in train/ and in *-train/: two of datasets' patterns for the split
    # train match it, and it must still be read once (not every document twice)
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "corpus"
    (folder / "wiki-train" / "train").mkdir(parents=True)
    (folder / "wiki-train" / "train" / "part-0.jsonl").write_text(jsonl_text(DOCUMENTS))
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


@pytest.mark.parametrize("layout", ["plain", "a split named by a link alone"])
def test_a_dataset_folders_splits_are_found_globbing_only_the_patterns_some_name_below_could_match(
        tmp_path, monkeypatch, layout):
    # datasets tries dozens of split patterns on a folder, each a glob of all of it (most of the time a
    # small dataset folder took to read): a pattern holding a word that no name below holds is no glob.
    # The splits found are the ones globbing every pattern finds.
    import datasets.data_files

    folder = tmp_path / "corpus"
    (folder / "shards").mkdir(parents=True)
    (folder / "shards" / "part-0.jsonl").write_text(jsonl_text(DOCUMENTS[:10]))
    (folder / "shards" / "part-1.jsonl").write_text(jsonl_text(DOCUMENTS[10:]))
    if layout == "a split named by a link alone":
        (folder / "validation").symlink_to("shards")
    data = make_config(tmp_path, {"dataset": str(folder)}).data
    files = local_files.folder_files(folder)
    globbed, resolve = [], datasets.data_files.resolve_pattern
    monkeypatch.setattr(datasets.data_files, "resolve_pattern", lambda pattern, *args, **kwargs: (
        globbed.append(pattern) or resolve(pattern, *args, **kwargs)))
    found, first = sources._inferred_splits(data, files), len(globbed)
    monkeypatch.setattr(sources, "_may_match", lambda pattern, names: True)  # every pattern globbed
    assert sources._inferred_splits(data, files) == found and found
    assert 0 < first < (len(globbed) - first) / 2, globbed


def test_a_dataset_folder_of_text_files_with_its_own_splits_reads_each_splits_files_only(
        tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "books"
    for split, documents in (("train", DOCUMENTS[:15]), ("validation", DOCUMENTS[15:])):
        (folder / split).mkdir(parents=True)
        for i, text in enumerate(documents):
            (folder / split / f"book-{i:02d}.txt").write_text(text, encoding="utf-8")
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation"})
    assert documents_of(prepare_data(config, progress=False)) == (DOCUMENTS[:15], DOCUMENTS[15:])


def test_a_save_to_disk_folder_whose_path_holds_a_bracket_is_read(tmp_path, monkeypatch):
    # only a folder of data files is found by patterns on its path; load_from_disk opens the path as named
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    folder = tmp_path / "saved[v2]"
    datasets.Dataset.from_dict({"text": DOCUMENTS}).save_to_disk(folder)
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert documents_of(result) == expected_split(DOCUMENTS)


def test_a_relative_dataset_folder_under_a_working_folder_whose_path_holds_a_bracket_is_refused(
        tmp_path, monkeypatch):
    # datasets builds its patterns on the folder's absolute path: data.dataset: corpus, run in runs[1]/,
    # would match nothing, and the folder be called empty
    here = tmp_path / "runs[1]"
    (here / "corpus").mkdir(parents=True)
    (here / "corpus" / "train.jsonl").write_text(jsonl_text(DOCUMENTS))
    monkeypatch.chdir(here)
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"dataset": "corpus"}), progress=False)
    assert str(error.value).startswith(f"data.dataset: the folder path {str(here / 'corpus')!r} holds '['")


@pytest.mark.parametrize("last, fault", [
    ('{"text": }', "line 21 is not valid JSON (Expecting value at column 10)"),
    ('{"text": 7}', "line 21: 'text' is a number (7), not text; every value of the text field must be a "
                    "string (or null)"),
], ids=["bad JSON", "a number"])
def test_a_bad_last_json_line_without_a_newline_after_it_is_named(tmp_path, last, fault):
    # the lines are read in chunks and split at newlines: the last line has none after it
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl_text(DOCUMENTS) + last, encoding="utf-8")
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert str(error.value) == f"{path}: {fault}"


@pytest.mark.parametrize("line, value, kind", [
    (6, '"just a string"', 'a string ("just a string")'), (6, "42", "a number (42)"),
    (1, "[1, 2]", "an array ([1, 2])"), (21, '["the", "last"]', 'an array (["the", "last"])'),
], ids=["a string", "a number", "an array first", "an array last"])
def test_a_json_line_that_is_no_record_is_named(tmp_path, line, value, kind):
    # datasets said "cannot read it (JSON parse error: Column() changed from object to string in row 0)",
    # naming no line; an array on the first line ended in a ValueError traceback ("Trailing data")
    lines = jsonl_text(DOCUMENTS).splitlines()
    lines.insert(line - 1, value)
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert str(error.value) == (f"{path}: line {line} is {kind}, not a record; each line of a JSON lines "
                                'file is one object, such as {"text": "..."}')


@pytest.mark.parametrize("value, kind", [
    ('"just a string"', 'a string ("just a string")'), ("42", "a number (42)"), ("true", "a boolean (true)")])
def test_a_json_lines_file_of_one_line_that_is_no_record_is_named(tmp_path, value, kind):
    # Alone in its file it is no array of records either: datasets said "cannot read it (JSON parse
    # error: Column() changed from object to string in row 0)", naming no line
    path = tmp_path / "corpus.jsonl"
    path.write_text(value + "\n", encoding="utf-8")
    with pytest.raises(DataError) as error:
        prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert str(error.value) == (f"{path}: line 1 is {kind}, not a record; each line of a JSON lines "
                                'file is one object, such as {"text": "..."}')


def test_a_json_file_of_one_array_on_one_line_is_still_read(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([{"text": text} for text in DOCUMENTS]), encoding="utf-8")
    assert faults.find_invalid_json([path]) is None
    assert documents_of(prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)) == (
        expected_split(DOCUMENTS))


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_reading_local_files_sends_no_download_count_to_the_hub(tmp_path, monkeypatch, suffix):
    # datasets counts each load of its json, csv and parquet builders with a HEAD request to the hub's
    # bucket (timeout 3 s), and each file here is its own load: 1,000 local shards took 122 s of
    # requests where the network is unreachable, before a word was read
    import datasets.config
    import datasets.load

    requests = []

    class Session:
        def head(self, url, **kwargs):
            requests.append(url)

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as on a user's machine
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    monkeypatch.setattr(datasets.load, "get_session", lambda: Session())
    for shard in range(3):
        table = pa.table({"text": DOCUMENTS[shard::3]})
        path = tmp_path / f"part{shard}{suffix}"
        {".jsonl": lambda: path.write_text(jsonl_text(DOCUMENTS[shard::3]), encoding="utf-8"),
         ".csv": lambda: table.to_pandas().to_csv(path, index=False),
         ".parquet": lambda: pq.write_table(table, path)}[suffix]()
    prepare_data(make_config(tmp_path, {"files": [str(tmp_path / f"part*{suffix}")]}), progress=False)
    assert requests == []


@pytest.mark.parametrize("suffix, separator", [(".csv", ","), (".tsv", "\t")])
def test_a_csv_of_long_rows_is_parsed_a_chunk_at_a_time_not_whole(tmp_path, monkeypatch, suffix, separator):
    # datasets' csv builder parses 10,000 rows at once: a 300 MB file of 10,000 documents was parsed whole
    # (2.1 GB peak, 0.9 GB at 100 MB). Here 200 rows of 30 KB (6 MB) with chunks of about 256 KB.
    import tracemalloc

    from tinyattn.data.splits import split

    monkeypatch.setattr(records, "CSV_CHUNK_BYTES", 1 << 18)
    path = tmp_path / f"long{suffix}"
    rows = [f"row {i}, \"quoted\"\n" + "x" * 30_000 for i in range(200)]
    pa.table({"id": list(range(200)), "text": rows}).to_pandas().to_csv(path, sep=separator, index=False)
    data = make_config(tmp_path, {"files": [str(path)]}).data
    parts = split(resolve_source(data, False), data)
    expected = iter([row for i, row in enumerate(rows) if i % 10 != 9])
    tracemalloc.start()
    try:
        assert all(text == next(expected) for text, _ in parts.train())  # each text let go once compared
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert next(expected, None) is None
    assert peak < 3_000_000  # 6 MB whole


@pytest.mark.parametrize("progress", [False, True])
def test_reading_many_files_that_are_large_together_reports_how_far_it_got_across_them(
        tmp_path, monkeypatch, capsys, progress):
    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(8):  # a folder of small files: 41 s of silence at 100 MB in 10,000 of them
        (folder / f"{i}.txt").write_text(f"part {i}: " + "to be or not to be " * 50, encoding="utf-8")
    total = sum(path.stat().st_size for path in folder.iterdir())
    monkeypatch.setattr(text_files, "REPORT_BYTES", total)  # together they are large; each file is not
    read = resolve_source(make_config(tmp_path, {"files": [str(folder)]}).data, progress=progress).reader("train")
    list(read())
    err = capsys.readouterr().err
    if progress:
        assert "reading 8 files (pass 1)" in err and "B/s" in err
    else:
        assert [line for line in err.splitlines() if line.startswith("reading")] == [
            f"reading 8 files (pass 1): {p}% of {total / 1e6:,.0f} MB" for p in (25, 50, 75, 100)]


def test_reading_local_files_works_with_a_datasets_that_has_no_download_count_setting(tmp_path, monkeypatch):
    # pyproject asks datasets>=4.0 with no upper bound: a release without config.HF_UPDATE_DOWNLOAD_COUNTS
    # made every local JSON, CSV or Parquet file an AttributeError traceback before a word was read
    import datasets.config

    monkeypatch.delattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS")
    path = tmp_path / "part.jsonl"
    path.write_text(jsonl_text(DOCUMENTS), encoding="utf-8")
    prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert not hasattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS")  # nothing left behind
