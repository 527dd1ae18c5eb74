"""Data preparation: every source kind, splits, the token cache (reuse, invalidation, interrupted
builds), downloads, batch sampling, and each bad input with its one-line message."""

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
import torch

import tinyattn.data.download as download_module
import tinyattn.data.token_cache as token_cache
from tinyattn.config import config_from_dict
from tinyattn.data.batches import BatchSampler, eval_batches, prepare_data, tail_window
from tinyattn.data.tokenizer import END_OF_TEXT, Tokenizer
from tinyattn.errors import DataError

# The token caches, downloads and runs written here in process go to the page cache alone
# (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")

DOCUMENTS = [f"Document {i}: " + "lorem ipsum dolor sit amet 0123456789, " * (i % 3 + 1)
             + f"the end of {i}.\n" for i in range(20)]
HELD_OUT = [9, 19]  # floor((i+1)/10) > floor(i/10): every tenth document


def make_config(tmp_path, data, tokenizer=None, context_length=8):
    return config_from_dict({
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "context_length": context_length},
        "data": {"cache_dir": str(tmp_path / "cache"), **data},
        "tokenizer": tokenizer or {"kind": "char"},
    })


def split_documents(tokens, tokenizer):
    return tokenizer.decode(tokens).split(END_OF_TEXT)


def trusted_caches(tmp_path):
    return sorted((tmp_path / "cache").glob("*/meta.json"))


def leftovers(tmp_path):
    return [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".download"))]


@pytest.fixture
def builds(monkeypatch):
    """Counts splits tokenized; a cache hit tokenizes none."""
    calls = []
    original = token_cache.write_tokens

    def counting(*args, **kwargs):
        calls.append(kwargs.get("desc"))
        return original(*args, **kwargs)

    monkeypatch.setattr(token_cache, "write_tokens", counting)
    return calls


@pytest.fixture
def hf_cache(monkeypatch, tmp_path):
    """A non-streaming datasets load writes Arrow files: keep them in tmp_path."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))


def write_text_folder(folder, documents=DOCUMENTS):
    folder.mkdir(parents=True)
    for i, text in enumerate(documents):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


def write_jsonl(path, documents=DOCUMENTS, field="text", extra=True):
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(documents):
            record = {field: text, "id": i} if extra else {field: text}
            f.write(json.dumps(record) + "\n")
    return path


# ----------------------------------------------------------------------------- sources


def test_single_text_file_holds_out_its_last_tenth(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # config paths are relative to the working directory
    text = "".join(DOCUMENTS) * 3
    os.mkdir("data")
    (tmp_path / "data" / "book.txt").write_text(text, encoding="utf-8")
    config = make_config(tmp_path, {"files": ["data/book.txt"], "cache_dir": "cache"})
    result = prepare_data(config, progress=False)
    cut = int(len(text) * 0.9)
    assert result.tokenizer.decode(result.train) == text[:cut]
    assert result.tokenizer.decode(result.validation) == text[cut:]
    assert result.train.dtype == np.uint16 and isinstance(result.train, np.memmap)
    assert result.cache_dir.parent == tmp_path / "cache" and result.cache_dir.name.startswith("book-char-")
    assert {p.name for p in result.cache_dir.iterdir()} == {"train.bin", "validation.bin",
                                                             "tokenizer.json", "meta.json"}


def test_tiny_shakespeare_split_matches_published_results(tmp_path, shakespeare_path):
    config = make_config(tmp_path, {"files": [str(shakespeare_path)]})
    result = prepare_data(config, progress=False)
    text = shakespeare_path.read_text(encoding="utf-8")
    assert (len(result.train), len(result.validation)) == (1_003_854, 111_540)  # int(n * 0.9)
    assert result.tokenizer.decode(result.validation) == text[-111_540:]
    # The vocabulary comes from the training split only; + [UNK] and <|endoftext|>.
    assert result.tokenizer.vocab_size == len(set(text[:1_003_854])) + 2


def test_folder_of_text_files_is_one_document_per_file(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    (folder / "notes.xml").write_text("ignored")  # not a format we read
    (folder / ".hidden.txt").write_text("ignored too")
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    expected_train = [d for i, d in enumerate(DOCUMENTS) if i not in HELD_OUT]
    assert split_documents(result.train, result.tokenizer) == expected_train
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]
    eot = result.tokenizer.eot_id
    assert int((result.train == eot).sum()) == len(expected_train) - 1  # between documents only
    assert result.train[0] != eot and result.train[-1] != eot


def test_glob_of_text_files(tmp_path):
    write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(tmp_path / "books" / "doc1*.txt")]})
    result = prepare_data(config, progress=False)
    documents = DOCUMENTS[10:]  # doc10 .. doc19: ten documents, the tenth held out
    assert split_documents(result.train, result.tokenizer) == documents[:9]
    assert split_documents(result.validation, result.tokenizer) == documents[9:]


@pytest.mark.parametrize("entry", ["data[1].txt", "books[v2]"])
def test_a_file_or_folder_whose_name_holds_glob_characters_is_read_as_named(tmp_path, entry):
    # read as a glob, data[1].txt matched nothing, or data1.txt beside it: another corpus, silently
    write_text_folder(tmp_path / "books[v2]", DOCUMENTS[:10])
    (tmp_path / "data[1].txt").write_text("".join(DOCUMENTS[:10]), encoding="utf-8")
    (tmp_path / "data1.txt").write_text("not this text\n" * 100, encoding="utf-8")
    (tmp_path / "booksv").mkdir()
    (tmp_path / "booksv" / "other.txt").write_text("nor this text\n" * 100, encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(tmp_path / entry)]}), progress=False)
    text = result.tokenizer.decode(np.concatenate([result.train, result.validation]))
    assert text.replace(END_OF_TEXT, "") == "".join(DOCUMENTS[:10])
    # with no file of that name, the entry is a pattern still
    result = prepare_data(make_config(tmp_path, {"files": [str(tmp_path / "data[0-1].txt")]}), progress=False)
    text = result.tokenizer.decode(np.concatenate([result.train, result.validation]))
    assert text == "not this text\n" * 100


def test_a_file_named_and_matched_by_a_glob_is_read_once(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder / "doc05.txt"), str(folder / "*.txt")]})
    result = prepare_data(config, progress=False)
    documents = (split_documents(result.train, result.tokenizer)
                 + split_documents(result.validation, result.tokenizer))
    assert documents[0] == DOCUMENTS[5] and sorted(documents) == sorted(DOCUMENTS)  # in its first place only


def test_a_file_named_through_a_linked_folder_and_by_its_own_path_is_read_once(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    (tmp_path / "shelf").symlink_to(folder, target_is_directory=True)
    config = make_config(tmp_path, {"files": [str(tmp_path / "shelf" / "doc05.txt"), str(folder)]})
    result = prepare_data(config, progress=False)
    documents = (split_documents(result.train, result.tokenizer)
                 + split_documents(result.validation, result.tokenizer))
    assert documents[0] == DOCUMENTS[5] and sorted(documents) == sorted(DOCUMENTS)  # not twice


def test_json_lines_with_a_custom_text_field(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", field="content")
    config = make_config(tmp_path, {"files": [str(path)], "text_field": "content"})
    result = prepare_data(config, progress=False)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]
    assert len(split_documents(result.train, result.tokenizer)) == 18


def test_json_array_file(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([{"text": d} for d in DOCUMENTS]), encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


def test_parquet_files(tmp_path):
    for part in range(2):
        rows = DOCUMENTS[part * 10:(part + 1) * 10]
        table = pa.table({"id": list(range(len(rows))), "text": rows})
        pq.write_table(table, tmp_path / f"part-{part}.parquet")
    config = make_config(tmp_path, {"files": [str(tmp_path / "*.parquet")]},
                         tokenizer={"kind": "bpe", "vocab_size": 300})
    result = prepare_data(config, progress=False)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]
    assert split_documents(result.train, result.tokenizer)[0] == DOCUMENTS[0]


def test_max_documents_keeps_the_first_ones(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl")
    config = make_config(tmp_path, {"files": [str(path)], "max_documents": 12})
    result = prepare_data(config, progress=False)
    assert split_documents(result.train, result.tokenizer) == DOCUMENTS[:9] + DOCUMENTS[10:12]
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[9]]


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_dataset_from_a_local_folder_with_its_own_splits(tmp_path, hf_cache, streaming):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation",
                                    "streaming": streaming})
    result = prepare_data(config, progress=False)
    assert split_documents(result.train, result.tokenizer) == DOCUMENTS[:15]
    assert split_documents(result.validation, result.tokenizer) == DOCUMENTS[15:]
    assert result.cache_dir.name.startswith("my_dataset-char-")


@pytest.mark.parametrize("name", [".", "./", "corpus/.."])
def test_the_folder_run_from_is_a_dataset_folder_too(tmp_path, hf_cache, monkeypatch, name):
    # datasets names a folder's dataset after its path's last part, none for "." or "./": data.dataset: .
    # ended in "data.dataset '.': dataset_name should be specified but got None"
    folder = tmp_path / "my_dataset"
    (folder / "corpus").mkdir(parents=True)
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    monkeypatch.chdir(folder)
    config = make_config(tmp_path, {"dataset": name, "validation_split": "validation"})
    result = prepare_data(config, progress=False)
    assert split_documents(result.train, result.tokenizer) == DOCUMENTS[:15]
    assert split_documents(result.validation, result.tokenizer) == DOCUMENTS[15:]


def test_max_documents_keeps_the_first_ones_of_each_split_of_a_dataset_with_its_own(tmp_path, hf_cache):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[5:])
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation",
                                    "max_documents": 3})
    result = prepare_data(config, progress=False)
    assert split_documents(result.train, result.tokenizer) == DOCUMENTS[:3]
    assert split_documents(result.validation, result.tokenizer) == DOCUMENTS[5:8]


def test_a_local_dataset_folder_edited_with_its_old_file_times_is_read_anew(tmp_path, hf_cache):
    # datasets' Arrow cache of a folder is keyed by its files' times: cp -p or touch -r kept the old text
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    path = write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation"})
    prepare_data(config, progress=False)
    times = os.stat(path)
    edited = [d.replace("Document", "Dokument") for d in DOCUMENTS[:15]]
    write_jsonl(path, edited)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    result = prepare_data(config, progress=False)
    assert split_documents(result.train, result.tokenizer) == edited


@pytest.mark.parametrize("shards", ["other fields differ", "an empty shard"])
def test_a_local_dataset_folder_reads_each_shard_as_its_own_dataset_in_file_order(tmp_path, hf_cache, shards):
    # one dataset of all its files cast each to the first one's columns: a CastError traceback
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", DOCUMENTS[:7])  # {text, id}
    if shards == "an empty shard":
        (folder / "b.jsonl").write_bytes(b"")
    with open(folder / "c.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text, "label": ["x"]}) + "\n" for text in DOCUMENTS[7:])
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    train, validation = (split_documents(r, result.tokenizer) for r in (result.train, result.validation))
    assert (train, validation) == ([d for i, d in enumerate(DOCUMENTS) if i not in HELD_OUT],
                                   [DOCUMENTS[i] for i in HELD_OUT])


def test_hub_dataset_without_validation_split_holds_out_documents(tmp_path, hf_cache):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl")
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_validation_split_that_is_the_train_split_is_refused_not_validated_on_training_text(
        tmp_path, hf_cache, split):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / f"{split}.jsonl")
    config = make_config(tmp_path, {"dataset": str(folder), "train_split": split, "validation_split": split})
    assert_one_line_error(tmp_path, config, rf"^data\.validation_split: '{split}' is data\.train_split too, "
                          r"so validation would be training text; leave it null to hold out "
                          r"data\.validation_fraction of data\.train_split$")
    assert not (tmp_path / "cache").exists()  # refused before anything was read or written


def test_unreachable_hub_dataset_is_one_line_error(tmp_path):
    config = make_config(tmp_path, {"dataset": "nobody/no-such-dataset"})
    with pytest.raises(DataError) as error:
        prepare_data(config, progress=False)
    message = str(error.value)
    assert "nobody/no-such-dataset" in message and "Hugging Face Hub" in message
    assert "data.files" in message and "\n" not in message
    assert not (tmp_path / "cache").exists()


def test_an_unreachable_hub_shows_no_retry_warnings_before_its_one_line(tmp_path, monkeypatch, caplog):
    import logging

    import datasets

    def no_network(*args, **kwargs):  # what the hub's client does without a network, shortened
        for attempt in range(1, 6):
            logging.getLogger("huggingface_hub.utils._http").warning(
                f"'[Errno -2] Name or service not known' thrown while requesting HEAD ... "
                f"[Retry {attempt}/5].")
        raise ConnectionError("Couldn't reach 'nobody/no-such-dataset' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    level = logging.getLogger("huggingface_hub").level
    with caplog.at_level(logging.WARNING), pytest.raises(DataError, match="cannot reach 'nobody/no-such"):
        prepare_data(make_config(tmp_path, {"dataset": "nobody/no-such-dataset"}), progress=False)
    assert not [record for record in caplog.records if "Retry" in record.getMessage()]
    assert logging.getLogger("huggingface_hub").level == level  # put back afterwards


@pytest.mark.parametrize("builder", ["json", "csv", "text", "parquet"])
def test_a_reader_of_datasets_named_as_the_dataset_is_refused(tmp_path, monkeypatch, hf_cache, builder):
    """load_dataset("json") reads the folder run from, into a token cache keyed by the name alone: a
    second folder's files (or these edited) trained the first ones' tokens. Refused, pointing to
    data.files."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "notes.jsonl")
    config = make_config(tmp_path, {"dataset": builder})
    message = assert_one_line_error(tmp_path, config, rf"^data\.dataset: '{builder}' is the name of "
                                    rf"datasets' own {builder} reader, not a dataset: give your files as "
                                    r"data\.files")
    assert "data.format" in message


@pytest.mark.parametrize("name", ["notes.jsonl", "./no_such_folder", "../elsewhere/corpus", "a/b/c",
                                  "~no_such_user/corpus"])  # a ~user the home folder lookup left as written
def test_a_local_file_or_missing_folder_as_the_dataset_is_not_a_hub_name(tmp_path, monkeypatch, name):
    """A file given as data.dataset, or a path whose folder is not there, said as such: not 'cannot
    reach ... on the Hugging Face Hub', which no network would change."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "notes.jsonl")
    message = assert_one_line_error(tmp_path, make_config(tmp_path, {"dataset": name}), "^data\\.dataset: ")
    assert "Hub (offline" not in message and name in message and "data.files" in message
    assert ("is a file" if name == "notes.jsonl" else "no folder") in message


@pytest.mark.parametrize("other", ["LICENSE.txt", "notes.csv"])
def test_a_dataset_folder_reads_only_its_builders_files_as_datasets_does(tmp_path, hf_cache, other):
    """A folder of JSON lines shards and a LICENSE.txt: datasets' load_dataset(folder) reads the shards
    only; tinyattn read the LICENSE too, a training document per line."""
    folder = tmp_path / "shards"
    folder.mkdir()
    write_jsonl(folder / "part-0.jsonl", DOCUMENTS[:10])
    write_jsonl(folder / "part-1.jsonl", DOCUMENTS[10:])
    (folder / other).write_text("text\nLicensed under the Apache License.\nSee the NOTICE file.\n",
                                encoding="utf-8")
    config = make_config(tmp_path, {"dataset": str(folder)})
    result = prepare_data(config, progress=False)
    train, validation = (split_documents(t, result.tokenizer) for t in (result.train, result.validation))
    assert train == [d for i, d in enumerate(DOCUMENTS) if i not in HELD_OUT]
    assert validation == [DOCUMENTS[i] for i in HELD_OUT]
    # a cache built before, which read the other file too, is not this one's
    inputs = json.loads((result.cache_dir / "meta.json").read_text(encoding="utf-8"))["inputs"]
    assert inputs["source"]["other_formats"] == "not read"


def test_a_dataset_folders_card_does_not_change_its_cache_key(tmp_path, hf_cache):
    """A dataset card (README.md, in every clone of a hub dataset) beside the shards, which datasets never
    reads as data: counted as a second format (.md is text's), it gave the folder a new token cache key
    ('other_formats'), so an upgrade tokenized again (a BPE trained again) and left the old cache."""
    folder = tmp_path / "shards"
    folder.mkdir()
    write_jsonl(folder / "part-0.jsonl", DOCUMENTS[:10])
    write_jsonl(folder / "part-1.jsonl", DOCUMENTS[10:])
    (folder / "README.md").write_text("# Shards\n\nA dataset card.\n", encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"dataset": str(folder)}), progress=False)
    train = split_documents(result.train, result.tokenizer)
    assert train == [d for i, d in enumerate(DOCUMENTS) if i not in HELD_OUT]  # nor was it ever read
    inputs = json.loads((result.cache_dir / "meta.json").read_text(encoding="utf-8"))["inputs"]
    assert "other_formats" not in inputs["source"]


def test_unknown_hub_split_names_the_valid_ones(tmp_path, hf_cache):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl")
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "dev"})
    with pytest.raises(DataError, match=r"dev.*train"):
        prepare_data(config, progress=False)


# ----------------------------------------------------------------------------- downloads


def test_url_is_downloaded_once_and_checked(tmp_path, monkeypatch, builds):
    source = tmp_path / "remote.txt"
    source.write_text("".join(DOCUMENTS), encoding="utf-8")
    target = tmp_path / "data" / "corpus.txt"
    config = make_config(tmp_path, {"files": [str(target)], "url": source.as_uri(),
                                    "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
                                    "size_bytes": source.stat().st_size})
    first = prepare_data(config, progress=False)
    assert target.read_bytes() == source.read_bytes()
    decoded = first.tokenizer.decode(first.train) + first.tokenizer.decode(first.validation)
    assert decoded == source.read_text()

    def no_network(*args, **kwargs):
        raise AssertionError("the file is present: nothing should be downloaded")

    monkeypatch.setattr(download_module.urllib.request, "urlopen", no_network)
    prepare_data(config, progress=False)
    assert len(builds) == 2  # train + validation, once


def test_an_upper_case_sha256_is_accepted(tmp_path):
    # as certutil and some download pages print it
    source = tmp_path / "remote.txt"
    source.write_text("".join(DOCUMENTS), encoding="utf-8")
    target = tmp_path / "data" / "corpus.txt"
    config = make_config(tmp_path, {"files": [str(target)], "url": source.as_uri(),
                                    "sha256": hashlib.sha256(source.read_bytes()).hexdigest().upper()})
    prepare_data(config, progress=False)
    assert target.read_bytes() == source.read_bytes()


def test_another_url_for_a_file_already_there_reuses_its_cache(tmp_path, builds):
    target = tmp_path / "data" / "corpus.txt"
    target.parent.mkdir()
    target.write_text("".join(DOCUMENTS), encoding="utf-8")
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    downloads = ({}, {"url": "https://example.org/a.txt", "sha256": digest},
                 {"url": "https://mirror.example.net/b.txt", "sha256": digest})
    caches = [prepare_data(make_config(tmp_path, {"files": [str(target)], **d}), progress=False).cache_dir
              for d in downloads]
    assert builds == ["tokenizing train", "tokenizing validation"]  # the url says where from, not what
    assert caches[0] == caches[1] == caches[2]


@pytest.mark.parametrize("check, message", [
    ({"sha256": "0" * 64}, r"has sha256 [0-9a-f]{64}, not data\.sha256=0{64}; the download was deleted"),
    ({"size_bytes": 3}, r"gave \d+ bytes, not data\.size_bytes=3; the download was deleted"),
])
def test_bad_download_is_deleted(tmp_path, check, message):
    source = tmp_path / "remote.txt"
    source.write_text("".join(DOCUMENTS), encoding="utf-8")
    target = tmp_path / "data" / "corpus.txt"
    config = make_config(tmp_path, {"files": [str(target)], "url": source.as_uri(), **check})
    with pytest.raises(DataError, match=message):
        prepare_data(config, progress=False)
    assert not target.exists() and not leftovers(tmp_path) and not trusted_caches(tmp_path)


SERVER_POLL = 0.01  # seconds between serve_forever's checks for shutdown(), which waits for one


def test_download_over_http_and_a_missing_url(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "corpus.txt").write_text("".join(DOCUMENTS), encoding="utf-8")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(SERVER_POLL,), daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        target = tmp_path / "data" / "corpus.txt"
        config = make_config(tmp_path, {"files": [str(target)], "url": f"{base}/corpus.txt"})
        prepare_data(config, progress=False)
        assert target.read_text() == "".join(DOCUMENTS)

        missing = make_config(tmp_path, {"files": [str(tmp_path / "other.txt")], "url": f"{base}/nope.txt"})
        with pytest.raises(DataError, match=r"cannot download .*nope\.txt \(HTTP Error 404.*other\.txt"):
            prepare_data(missing, progress=False)
        assert not (tmp_path / "other.txt").exists() and not leftovers(tmp_path)
    finally:
        server.shutdown()
        server.server_close()


def test_a_download_cut_short_without_a_checksum_is_deleted(tmp_path):
    class CutShort(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # announces 100000 bytes, sends 130, closes the connection
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 130)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, args=(SERVER_POLL,), daemon=True).start()
    try:
        target = tmp_path / "data" / "corpus.txt"
        url = f"http://127.0.0.1:{server.server_address[1]}/corpus.txt"
        config = make_config(tmp_path, {"files": [str(target)], "url": url})
        with pytest.raises(DataError, match=r"corpus\.txt sent 130 bytes of the 100000 its Content-Length "
                                            r"announced .*the download was deleted"):
            prepare_data(config, progress=False)
        assert not target.exists() and not leftovers(tmp_path)
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_urllib_cannot_open_is_refused_in_one_line_leaving_no_file(tmp_path):
    # No scheme: urllib raises ValueError ("unknown url type"), not an OSError.
    target = tmp_path / "data" / "corpus.txt"
    config = make_config(tmp_path, {"files": [str(target)], "url": "example.org/corpus.txt"})
    assert_one_line_error(tmp_path, config,
                          r"data\.url: cannot download example\.org/corpus\.txt \(unknown url")
    assert not target.exists()


def test_an_unreachable_url_is_refused_with_the_reason_not_urllibs_wrapper(tmp_path):
    config = make_config(tmp_path, {"files": [str(tmp_path / "corpus.txt")],
                                    "url": "http://127.0.0.1:1/x.txt"})
    message = assert_one_line_error(tmp_path, config, r"cannot download http://127\.0\.0\.1:1/x\.txt \(")
    assert "urlopen error" not in message, message


def test_a_download_longer_than_one_read_is_checked_by_all_of_its_bytes(tmp_path):
    source = tmp_path / "remote.txt"
    source.write_bytes(b"to be or not to be\n" * 150_000)  # several of the reads a download makes
    target = tmp_path / "corpus.txt"
    download_module.download(source.as_uri(), target, sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
                             size_bytes=source.stat().st_size, progress=False)
    assert target.read_bytes() == source.read_bytes()


@pytest.mark.parametrize("progress", [False, True])
def test_a_download_shows_a_progress_bar_only_when_asked(tmp_path, capsys, progress):
    source = tmp_path / "remote.txt"
    source.write_text("".join(DOCUMENTS), encoding="utf-8")
    target = tmp_path / "corpus.txt"
    download_module.download(source.as_uri(), target, sha256=None, size_bytes=None, progress=progress)
    assert target.read_bytes() == source.read_bytes()
    assert ("downloading corpus.txt" in capsys.readouterr().err) == progress


# ----------------------------------------------------------------------------- the cache


def test_second_run_reuses_the_cache(tmp_path, builds):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    first = prepare_data(config, progress=False)
    second = prepare_data(config, progress=False)
    assert builds == ["tokenizing train", "tokenizing validation"]
    assert second.cache_dir == first.cache_dir
    assert np.array_equal(first.train, second.train) and np.array_equal(first.validation, second.validation)
    assert second.tokenizer.to_json() == first.tokenizer.to_json()


@pytest.mark.parametrize("change", ["tokenizer", "vocab_size", "fraction", "text_field", "file", "max_documents",
                                    "tokenizers_version", "format"])
def test_any_change_rebuilds(tmp_path, builds, monkeypatch, change):
    path = write_jsonl(tmp_path / "corpus.jsonl")
    if change == "text_field":  # both fields from the start: only the setting changes, not the file
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": text, "body": text.upper()}) + "\n" for text in DOCUMENTS)
    data = {"files": [str(path)]}
    tokenizer = {"kind": "bpe", "vocab_size": 300}
    first = prepare_data(make_config(tmp_path, data, tokenizer), progress=False)
    if change == "tokenizer":
        tokenizer = {"kind": "char"}
    elif change == "vocab_size":
        tokenizer = {"kind": "bpe", "vocab_size": 301}
    elif change == "fraction":
        data["validation_fraction"] = 0.2
    elif change == "text_field":
        data["text_field"] = "body"
    elif change == "file":
        write_jsonl(path, DOCUMENTS + ["one more document, long enough to matter.\n"])
    elif change == "max_documents":
        data["max_documents"] = 15
    elif change == "tokenizers_version":  # BPE training may differ between versions
        monkeypatch.setattr(tokenizers, "__version__", tokenizers.__version__ + ".other")
    elif change == "format":  # the same bytes read another way: the file whole, its JSON as text
        data["format"] = "text"
    second = prepare_data(make_config(tmp_path, data, tokenizer), progress=False)
    assert len(builds) == 4 and second.cache_dir != first.cache_dir
    assert len(trusted_caches(tmp_path)) == 2
    # the key itself, not only the folder's name: a run's data fingerprint records the key
    assert second.fingerprint["key"] != first.fingerprint["key"]
    if change == "text_field":
        assert second.tokenizer.decode(second.train).startswith(DOCUMENTS[0].upper())
    if change == "vocab_size":
        assert token_cache.data_differences(first.fingerprint, second.fingerprint)[0] == (
            "tokenizer was {'kind': 'bpe', 'vocab_size': 300}, now {'kind': 'bpe', 'vocab_size': 301}")


@pytest.mark.parametrize("documents", [9, 10])
def test_ten_documents_hold_the_tenth_out_and_nine_the_last_tenth_of_the_characters(tmp_path, documents):
    folder = write_text_folder(tmp_path / "books", DOCUMENTS[:documents])
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    validation = result.tokenizer.decode(result.validation.tolist())
    if documents == 10:  # document 9 is the first whose floor((i+1) * 0.1) moves
        assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[9]]
    else:  # no document is held out whole: the characters after int(0.9 * n)
        text = "".join(DOCUMENTS[:9])
        assert validation.replace("<|endoftext|>", "") == text[int(len(text) * 0.9):]


def test_a_character_cut_on_a_document_boundary_starts_validation_with_that_document(tmp_path):
    # Three files, too few to hold one out whole: the cut at int(0.9 * 1000) falls where the third begins.
    texts = ["x" * 449 + "\n", "y" * 449 + "\n", "xy" * 49 + "x\n"]
    folder = tmp_path / "books"
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    result = prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    assert result.tokenizer.decode(result.train) == texts[0] + END_OF_TEXT + texts[1]
    assert result.tokenizer.decode(result.validation) == texts[2]  # no <|endoftext|> before it


def test_a_pretrained_tokenizer_file_replaced_in_place_rebuilds_with_the_new_one(tmp_path, builds):
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    path = write_jsonl(tmp_path / "corpus.jsonl")
    text = "".join(DOCUMENTS)
    first_tokenizer = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter([text]))
    first_tokenizer.save(tmp_path / "tokenizer.json")
    config = make_config(tmp_path, {"files": [str(path)]},
                         tokenizer={"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")})
    first = prepare_data(config, progress=False)
    replacement = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=280), lambda: iter([text]))
    replacement.save(tmp_path / "tokenizer.json")  # same path, other tokenizer
    second = prepare_data(config, progress=False)
    assert len(builds) == 4 and second.cache_dir != first.cache_dir
    assert second.tokenizer.to_json() == replacement.to_json() != first.tokenizer.to_json()


def test_another_end_of_text_for_a_pretrained_tokenizer_rebuilds(tmp_path, builds):
    import tokenizers

    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    path = write_jsonl(tmp_path / "corpus.jsonl")
    texts = lambda: iter(["".join(DOCUMENTS)])  # noqa: E731
    spec = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), texts).to_json()
    backend = tokenizers.Tokenizer.from_str(spec)
    backend.add_special_tokens(["</s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    results = []
    for end in (None, "</s>"):
        tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json"), "end_of_text": end}
        results.append(prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False))
    first, second = results
    assert len(builds) == 4 and second.cache_dir != first.cache_dir  # documents are joined with it
    assert second.tokenizer.eot_id != first.tokenizer.eot_id and second.tokenizer.eot_id in second.train


def test_a_pretrained_tokenizers_stop_tokens_end_the_training_samples_and_leave_the_cache_alone(tmp_path,
                                                                                                builds):
    # A fine-tune of a folder with several eos ids names the others in tokenizer.stop_tokens: the data's
    # tokenizer, which the samples shown during training use, stops at them too; the tokens are the same.
    import tokenizers

    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    path = write_jsonl(tmp_path / "corpus.jsonl")
    spec = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter(["".join(DOCUMENTS)]))
    backend = tokenizers.Tokenizer.from_str(spec.to_json())
    backend.add_special_tokens(["<|im_end|>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    results = []
    for stops in ([], ["<|im_end|>"]):
        tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json"), "stop_tokens": stops}
        results.append(prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False))
    plain, stopping = results
    assert plain.tokenizer.stop_ids == {plain.tokenizer.eot_id}
    assert stopping.tokenizer.stop_ids == {plain.tokenizer.eot_id, backend.token_to_id("<|im_end|>")}
    assert stopping.cache_dir == plain.cache_dir and len(builds) == 2  # one cache, built once


def test_a_pretrained_tokenizer_without_an_end_of_text_token_warns_that_documents_run_together(tmp_path,
                                                                                               capsys):
    import tokenizers

    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    path = write_jsonl(tmp_path / "corpus.jsonl")
    texts = lambda: iter(["".join(DOCUMENTS)])  # noqa: E731
    spec = json.loads(build_tokenizer(TokenizerConfig(kind="char"), texts).to_json())
    spec["added_tokens"] = []  # a file with no <|endoftext|> ...
    backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
    backend.add_special_tokens(["</s>"])  # ... but a special token of its own (a Llama file's)
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")}
    capsys.readouterr()
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False)
    assert result.tokenizer.eot_id is None
    assert (f"warning: {tmp_path / 'tokenizer.json'} has no <|endoftext|> token and tokenizer.end_of_text is "
            "not set: the documents run together, with nothing between them; set tokenizer.end_of_text to "
            "one of its special tokens ('</s>')") in capsys.readouterr().err
    tokenizer["end_of_text"] = "</s>"  # named: documents are joined with it, and nothing is said
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False)
    assert result.tokenizer.eot_id in result.train and "warning" not in capsys.readouterr().err


def test_a_pretrained_tokenizer_without_an_end_of_text_token_says_nothing_of_a_single_document(tmp_path,
                                                                                                capsys):
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    path = tmp_path / "book.txt"
    path.write_text("".join(DOCUMENTS), encoding="utf-8")  # one document: nothing to run together
    texts = lambda: iter(["".join(DOCUMENTS)])  # noqa: E731
    spec = json.loads(build_tokenizer(TokenizerConfig(kind="char"), texts).to_json())
    spec["added_tokens"] = []  # a file with no <|endoftext|>
    tokenizers.Tokenizer.from_str(json.dumps(spec)).save(str(tmp_path / "tokenizer.json"))
    capsys.readouterr()
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]},
                                      {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")}),
                          progress=False)
    assert result.tokenizer.eot_id is None and "warning" not in capsys.readouterr().err


def test_a_pretrained_tokenizer_without_an_end_of_text_token_warns_of_a_validation_split_of_documents(
        tmp_path, hf_cache, capsys):
    # one long training document runs into nothing, but the validation split's several do
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ["".join(DOCUMENTS[:15])])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    spec = json.loads(build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(DOCUMENTS)).to_json())
    spec["added_tokens"] = []  # a file with no <|endoftext|>
    tokenizers.Tokenizer.from_str(json.dumps(spec)).save(str(tmp_path / "tokenizer.json"))
    capsys.readouterr()
    config = make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation"},
                         {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")})
    result = prepare_data(config, progress=False)
    assert result.tokenizer.eot_id is None
    assert result.fingerprint["train"]["tokens"] == len("".join(DOCUMENTS[:15]))  # one document, no joins
    assert "the documents run together" in capsys.readouterr().err


def test_the_validation_fraction_does_not_key_a_cache_whose_validation_is_a_split_of_its_own(
        tmp_path, builds, hf_cache):
    # data.validation_fraction is not read when data.validation_split is set: another one is the same data
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    caches = {prepare_data(make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation",
                                                  "validation_fraction": fraction}), progress=False).cache_dir
              for fraction in (0.1, 0.3)}
    assert builds == ["tokenizing train", "tokenizing validation"] and len(caches) == 1


def test_another_train_split_of_a_hub_dataset_rebuilds(tmp_path, builds, hf_cache):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "test.jsonl", DOCUMENTS[5:])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    caches = {prepare_data(make_config(tmp_path, {"dataset": str(folder), "validation_split": "validation",
                                                  "train_split": split}), progress=False).cache_dir
              for split in ("train", "test")}
    assert len(builds) == 4 and len(caches) == 2


def test_another_validation_split_of_a_hub_dataset_rebuilds(tmp_path, builds, hf_cache):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", DOCUMENTS[:15])
    write_jsonl(folder / "validation.jsonl", DOCUMENTS[15:])
    write_jsonl(folder / "test.jsonl", DOCUMENTS[:5])
    first, second = (prepare_data(make_config(tmp_path, {"dataset": str(folder), "validation_split": split}),
                                  progress=False) for split in ("validation", "test"))
    assert len(builds) == 4 and second.cache_dir != first.cache_dir
    assert second.fingerprint["key"] != first.fingerprint["key"]
    assert split_documents(second.validation, second.tokenizer) == DOCUMENTS[:5]


def test_another_revision_or_config_of_a_hub_dataset_keys_another_cache_and_is_named(tmp_path):
    # A hub dataset's cache key holds what names its text (no files here to hash): a cache built
    # from revision v1 was reused for v2. The key is made before anything is downloaded.
    from tinyattn.data.sources import resolve_source

    def inputs(**settings):
        config = make_config(tmp_path, {"dataset": "owner/corpus", **settings})
        return token_cache.TokenCache(resolve_source(config.data, progress=False), config)

    first, revised, other = inputs(), inputs(revision="v2"), inputs(dataset_config="other")
    assert len({first.key, revised.key, other.key}) == 3
    assert token_cache.data_differences({"key": first.key, "inputs": first.inputs},
                                        {"key": revised.key, "inputs": revised.inputs}) == [
        "data.revision was None, now 'v2'"]


@pytest.mark.parametrize("stage", ["validation", "tokenizer"])
def test_interrupted_build_is_not_trusted(tmp_path, monkeypatch, builds, stage):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    original = token_cache.write_tokens

    def interrupt_validation(*args, **kwargs):
        if kwargs.get("desc") == "tokenizing validation":
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    def interrupt_save(self, path):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        if stage == "validation":
            patch.setattr(token_cache, "write_tokens", interrupt_validation)
        else:
            patch.setattr(Tokenizer, "save", interrupt_save)
        with pytest.raises(KeyboardInterrupt):
            prepare_data(config, progress=False)
    assert not trusted_caches(tmp_path) and not leftovers(tmp_path)
    builds.clear()
    result = prepare_data(config, progress=False)
    assert builds == ["tokenizing train", "tokenizing validation"]  # built again, not trusted
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


def test_a_cache_another_process_completes_while_this_one_waits_is_used_not_rebuilt(tmp_path, builds,
                                                                                    monkeypatch):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    expected = np.array(prepare_data(config, progress=False).train)
    builds.clear()
    real, looks = token_cache.TokenCache.trusted_meta, []

    def not_yet_then_done(self, **kwargs):  # the look before the build lock finds the other build unfinished
        looks.append(kwargs)
        return None if len(looks) == 1 else real(self, **kwargs)

    monkeypatch.setattr(token_cache.TokenCache, "trusted_meta", not_yet_then_done)
    result = prepare_data(config, progress=False)
    assert len(looks) == 2 and builds == [] and np.array_equal(result.train, expected)


def test_a_killed_builds_temporary_files_are_deleted_by_the_next_build(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    prepare_data(config, progress=False)
    cache = trusted_caches(tmp_path)[0].parent
    stale = cache / ".train.bin.k1ll3d.tmp"  # atomic_write's name for a file a killed build was writing
    stale.write_bytes(b"half a file")
    (cache / "meta.json").unlink()  # that build never got to meta.json
    result = prepare_data(config, progress=False)
    assert not stale.exists() and not leftovers(tmp_path)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


def remove_the_cache_folder_when(monkeypatch, tmp_path, when):
    """Patch a step of the build to `rm -r` the cache folder first: while train.bin is written (its
    rename finds the folder gone), or before tokenizer.json (whose write makes the folder anew)."""
    def remove():
        shutil.rmtree(next(p for p in (tmp_path / "cache").iterdir() if p.name.startswith("books-")))

    if when == "tokenizing train":
        original = token_cache.write_tokens

        def removing(*args, **kwargs):
            written = original(*args, **kwargs)
            if kwargs.get("desc") == when:
                remove()
            return written

        monkeypatch.setattr(token_cache, "write_tokens", removing)
    else:
        save = Tokenizer.save

        def removing_first(self, path):
            remove()
            save(self, path)

        monkeypatch.setattr(Tokenizer, "save", removing_first)


@pytest.mark.parametrize("when", ["tokenizing train", "saving the tokenizer"])
def test_a_cache_folder_removed_while_it_is_built_is_one_line_and_the_next_run_builds_it(
        tmp_path, monkeypatch, when):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    with monkeypatch.context() as patch:
        remove_the_cache_folder_when(patch, tmp_path, when)
        assert_one_line_error(tmp_path, config, r"^the token cache .*/cache/books-char-[0-9a-f]{12} was "
                                                r"removed while it was being built; run again$")
    result = prepare_data(config, progress=False)
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


def test_a_training_whose_cache_folder_is_removed_while_it_is_built_ends_in_one_line_a_resumes_log_keeps_it(
        tmp_path, monkeypatch, capsys):
    from tinyattn.cli.train import main

    folder = write_text_folder(tmp_path / "books", DOCUMENTS * 3)
    settings = ["--no-progress", "--set", f"data.files={folder}", "data.url=null", "data.sha256=null",
                f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path}", "train.eval_interval=2"]
    tiny = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "tiny.yaml")
    run = ["--config", tiny, "--run-name", "run", *settings, "train.max_steps=2"]
    said = r"error: the token cache \S+/books-char-\w+ was removed while it was being built; run again\n"
    with monkeypatch.context() as patch:
        remove_the_cache_folder_when(patch, tmp_path, "tokenizing train")
        code, err = main(run), capsys.readouterr().err
    assert code == 2 and re.fullmatch(said, err)  # one line, no traceback
    assert not (tmp_path / "run").exists()  # a run that fails before its first step leaves no folder
    assert main(run) == 0
    shutil.rmtree(next((tmp_path / "cache").glob("books-*")))
    with monkeypatch.context() as patch:  # a resume rebuilds the cache: its train.log keeps the line
        remove_the_cache_folder_when(patch, tmp_path, "tokenizing train")
        code = main(["--resume", str(tmp_path / "run"), *settings, "train.max_steps=4"])
        err = capsys.readouterr().err
    assert code == 2 and re.search(f"\n{said}$", err) and "Traceback" not in err
    assert re.search(" " + said + "$", (tmp_path / "run" / "train.log").read_text(encoding="utf-8"))


@pytest.mark.parametrize("damage", ["truncate", "delete_meta", "edit_meta", "meta_without_its_keys",
                                    "meta_not_an_object"])
def test_damaged_cache_is_rebuilt(tmp_path, builds, damage):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    first = prepare_data(config, progress=False)
    expected = np.array(first.train)
    del first
    cache = trusted_caches(tmp_path)[0].parent
    if damage == "truncate":
        with open(cache / "train.bin", "r+b") as f:
            f.truncate(10)
    elif damage == "delete_meta":
        (cache / "meta.json").unlink()
    elif damage == "meta_without_its_keys":  # JSON, but not what a build writes
        (cache / "meta.json").write_text("{}")
    elif damage == "meta_not_an_object":
        (cache / "meta.json").write_text("[]")
    else:
        meta = json.loads((cache / "meta.json").read_text())
        meta["key"] = "0" * 64
        (cache / "meta.json").write_text(json.dumps(meta))
    builds.clear()
    result = prepare_data(config, progress=False)
    assert len(builds) == 2 and np.array_equal(result.train, expected)


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("damage", ["zeros", "ids outside the vocabulary", "the id one past the vocabulary",
                                    "one id outside the vocabulary, in the first of many chunks"])
def test_token_file_changed_in_place_is_rebuilt_with_a_warning(tmp_path, builds, capsys, monkeypatch, damage,
                                                               split):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    first = prepare_data(config, progress=False)
    expected, vocab_size = np.array(getattr(first, split)), first.tokenizer.vocab_size
    del first
    cache = trusted_caches(tmp_path)[0].parent
    path = cache / f"{split}.bin"
    size = path.stat().st_size
    if damage == "zeros":  # same size, other bytes: only the checksum can tell
        with open(path, "r+b") as f:
            f.write(bytes(min(4096, size)))
        reason = rf"{split}\.bin does not match its checksum in meta\.json"
    else:  # ids the model has no embedding for, with a checksum that agrees
        bad_id = vocab_size if damage == "the id one past the vocabulary" else vocab_size + 7
        bad = np.full(size // 2, bad_id, dtype=np.uint16)
        if damage.startswith("one id"):  # checked chunk by chunk: the largest id of them all counts
            monkeypatch.setattr(token_cache, "CHECK_CHUNK_BYTES", 64)
            bad = np.fromfile(path, dtype=np.uint16)
            bad[0] = bad_id
        bad.tofile(path)
        meta = json.loads((cache / "meta.json").read_text())
        meta["checksums"][path.name] = hashlib.blake2b(bad.tobytes()).hexdigest()
        (cache / "meta.json").write_text(json.dumps(meta))
        reason = rf"{split}\.bin holds token id {bad_id}, outside the vocabulary of {vocab_size}"
    builds.clear()
    capsys.readouterr()
    result = prepare_data(config, progress=False)
    warning = capsys.readouterr().err
    assert re.fullmatch(rf"warning: \S+{reason}.*; rebuilding the token cache\n", warning)
    assert len(builds) == 2 and np.array_equal(getattr(result, split), expected)
    builds.clear()
    prepare_data(config, progress=False)  # the rebuilt cache verifies
    assert builds == [] and capsys.readouterr().err == ""


def test_a_cached_tokenizer_edited_in_place_is_not_trusted(tmp_path, builds, capsys):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    first = prepare_data(config, progress=False).tokenizer.to_json()
    path = trusted_caches(tmp_path)[0].parent / "tokenizer.json"
    path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")  # still a valid tokenizer
    builds.clear()
    capsys.readouterr()
    result = prepare_data(config, progress=False)
    warning = capsys.readouterr().err
    assert re.fullmatch(r"warning: \S+tokenizer\.json does not match its checksum in meta\.json"
                        r"; rebuilding the token cache\n", warning)
    assert len(builds) == 2 and result.tokenizer.to_json() == first


@pytest.mark.parametrize("vocab_size, dtype", [(65_536, np.uint16), (65_537, np.uint32)])
def test_uint16_holds_a_vocabulary_of_65536_ids_and_uint32_a_larger_one(tmp_path, vocab_size, dtype):
    text = "".join(DOCUMENTS)
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    for i in range(vocab_size - 1 - len(vocab)):
        vocab[f"<extra{i}>"] = len(vocab)
    vocab[END_OF_TEXT] = len(vocab)  # the highest id: 65535 is uint16's largest, 65536 needs uint32
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<extra0>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.FixedLength(length=1)
    backend.decoder = tokenizers.decoders.Fuse()
    backend.add_special_tokens([END_OF_TEXT])
    Tokenizer(backend).save(tmp_path / "big.json")
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]},
                         tokenizer={"kind": "pretrained", "path": str(tmp_path / "big.json")})
    result = prepare_data(config, progress=False)
    assert result.tokenizer.vocab_size == vocab_size
    assert result.train.dtype == dtype
    assert int(result.train.max()) == result.tokenizer.eot_id == vocab_size - 1
    assert split_documents(result.validation, result.tokenizer) == [DOCUMENTS[i] for i in HELD_OUT]


# ----------------------------------------------------------------------------- bad input


def assert_one_line_error(tmp_path, config, pattern):
    with pytest.raises(DataError, match=pattern) as error:
        prepare_data(config, progress=False)
    assert "\n" not in str(error.value)
    # No chained traceback: raised fresh, or re-raised "from None".
    assert error.value.__cause__ is None
    assert error.value.__context__ is None or error.value.__suppress_context__
    assert not trusted_caches(tmp_path) and not leftovers(tmp_path)
    return str(error.value)


def test_missing_file(tmp_path):
    config = make_config(tmp_path, {"files": [str(tmp_path / "nope.txt")]})
    assert_one_line_error(tmp_path, config, r"data\.files: file not found: .*nope\.txt")


def test_a_missing_relative_path_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    # Run from another folder, "data/nope.txt" is looked for there: the error says where, and that
    # a file, a folder or a glob is what data.files takes. A download's error names that place too.
    monkeypatch.chdir(tmp_path)
    config = make_config(tmp_path, {"files": ["data/nope.txt"]})
    message = assert_one_line_error(tmp_path, config, r"data\.files: file not found: data/nope\.txt")
    assert f"{tmp_path / 'data' / 'nope.txt'}" in message and "the folder run from" in message, message
    assert "a file, a folder or a glob" in message, message
    download = make_config(tmp_path, {"files": ["data/nope.txt"], "url": "http://127.0.0.1:1/nope.txt"})
    message = assert_one_line_error(tmp_path, download, r"cannot download .*put the file at data/nope\.txt")
    assert f"{tmp_path / 'data' / 'nope.txt'}" in message and "the folder run from" in message, message


def test_a_missing_path_under_a_user_with_no_home_folder_is_one_line_naming_where_it_was_looked_for(
        tmp_path, monkeypatch):
    # ~no_such_user is left as written (no such user to expand it for): read from the folder run from,
    # which the error names, where pathlib's expanduser raised a traceback.
    monkeypatch.chdir(tmp_path)
    config = make_config(tmp_path, {"files": ["~no_such_user/nope.txt"]})
    message = assert_one_line_error(tmp_path, config, r"data\.files: file not found: ~no_such_user/nope\.txt")
    assert f"{tmp_path / '~no_such_user' / 'nope.txt'}" in message, message


def test_a_missing_relative_path_run_from_a_removed_folder_is_still_one_line(tmp_path, monkeypatch):
    # The folder run from was removed meanwhile: the error names the path as given, and no more.
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    config = make_config(tmp_path, {"files": ["data/nope.txt"]})
    message = assert_one_line_error(tmp_path, config,
                                    r"data\.files: file not found: data/nope\.txt; each entry")
    assert "the folder run from" not in message, message


def test_empty_glob_names_the_pattern(tmp_path):
    config = make_config(tmp_path, {"files": [str(tmp_path / "books" / "*.txt")]})
    assert_one_line_error(tmp_path, config, r"no file matches the pattern .*books/\*\.txt")


def test_folder_without_text_files(tmp_path):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.csv").write_text("x")
    config = make_config(tmp_path, {"files": [str(tmp_path / "books")], "format": "text"})
    assert_one_line_error(tmp_path, config, r"the folder .*books has no \.txt")


def test_unknown_extension_and_mixed_formats(tmp_path):
    (tmp_path / "a.xml").write_text("x")
    config = make_config(tmp_path, {"files": [str(tmp_path / "a.xml")]})
    assert_one_line_error(tmp_path, config, r"cannot tell the format of .*a\.xml.*set data\.format")
    (tmp_path / "a.txt").write_text("x")
    write_jsonl(tmp_path / "b.jsonl")
    (tmp_path / "c.txt").write_text("y")
    entries = [str(tmp_path / name) for name in ("a.txt", "b.jsonl", "c.txt")]
    config = make_config(tmp_path, {"files": entries})
    # each format named by its first file
    assert_one_line_error(tmp_path, config, r"mixes formats: text \(a\.txt\), json \(b\.jsonl\);")
    # The advice holds: a glob with data.format set takes only the files of that format.
    config = make_config(tmp_path, {"files": [str(tmp_path / "*")], "format": "json"})
    assert prepare_data(config, progress=False).train.size > 0


def test_an_upper_case_extension_names_the_format_too(tmp_path):
    def documents(name):
        result = prepare_data(make_config(tmp_path, {"files": [str(tmp_path / name)]}), progress=False)
        tokenizer = result.tokenizer
        return split_documents(result.train, tokenizer) + split_documents(result.validation, tokenizer)

    (tmp_path / "BOOK.TXT").write_text("".join(DOCUMENTS), encoding="utf-8")
    assert "".join(documents("BOOK.TXT")) == "".join(DOCUMENTS)  # one text: its last tenth validates
    write_jsonl(tmp_path / "notes.JSONL")
    assert sorted(documents("notes.JSONL")) == sorted(DOCUMENTS)  # a document per line


def test_empty_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "empty" / name).write_text("")
    config = make_config(tmp_path, {"files": [str(tmp_path / "empty")]})
    assert_one_line_error(tmp_path, config, r"the corpus is empty \(every file is empty\)$")
    # A text file has no field: its emptiness is said as it is, naming the file
    config = make_config(tmp_path, {"files": [str(tmp_path / "empty" / "a.txt")]})
    message = assert_one_line_error(tmp_path, config, r"the file is empty")
    assert message == f"{tmp_path / 'empty' / 'a.txt'}: the file is empty (no text to train on)"


def test_validation_split_too_short(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("".join(DOCUMENTS[:3]), encoding="utf-8")  # about 300 characters: 30 held out
    config = make_config(tmp_path, {"files": [str(path)]}, context_length=64)
    message = assert_one_line_error(
        tmp_path, config, r"the validation split has \d+ tokens, fewer than model\.context_length \+ 1 = 65")
    assert "data.validation_fraction (now 0.1)" in message and "smaller model.context_length" in message


def test_a_datasets_own_split_too_short_names_data_validation_split_not_the_fraction(tmp_path):
    # Its validation split is the dataset's: data.validation_fraction changes neither split's length.
    config = make_config(tmp_path, {"dataset": "owner/corpus", "validation_split": "test"}, context_length=64)
    for short, named in (("validation", "use a larger split than data.validation_split='test' or a smaller "
                                        "model.context_length"),
                         ("train", "use more text or a smaller model.context_length")):
        meta = {"train_tokens": 1000, "validation_tokens": 1000, f"{short}_tokens": 64}
        with pytest.raises(DataError) as error:
            token_cache.check_split_lengths(meta, config)
        assert str(error.value) == (f"the {'training' if short == 'train' else short} split has 64 tokens, "
                                    f"fewer than model.context_length + 1 = 65; {named}")


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
@pytest.mark.parametrize("fraction, left", [(0.99, 0), (0.95, 2)])
def test_a_validation_fraction_that_leaves_too_little_to_train_on_is_named(tmp_path, tokenizer, fraction, left):
    # a fraction that held out every character said only "the training text is empty: nothing to build
    # a character vocabulary from", and one that left a few "use more text", naming neither the file
    # nor data.validation_fraction
    path = tmp_path / "book.txt"
    path.write_text("abcdefghi\n" * 5, encoding="utf-8")  # one text of 50 characters
    kind = {"kind": tokenizer, "vocab_size": 300} if tokenizer == "bpe" else {"kind": tokenizer}
    config = make_config(tmp_path, {"files": [str(path)], "validation_fraction": fraction}, kind)
    message = assert_one_line_error(tmp_path, config, r"training")
    assert f"a smaller data.validation_fraction (now {fraction})" in message
    if not left:
        assert message.startswith(f"{path}: data.validation_fraction={fraction} holds out all 50 characters")


def test_a_text_of_one_character_held_out_whole_is_named_in_the_singular(tmp_path):
    # "holds out all 1 characters of the text"
    path = tmp_path / "book.txt"
    path.write_text("a", encoding="utf-8")
    config = make_config(tmp_path, {"files": [str(path)]})
    message = assert_one_line_error(tmp_path, config, r"training")
    assert message.startswith(f"{path}: data.validation_fraction=0.1 holds out the only character of the "
                              "text, leaving no training text"), message


def test_a_split_of_exactly_one_window_is_enough_and_one_token_fewer_is_refused(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("abcdefghi\n" * 9, encoding="utf-8")  # 90 characters: 81 train, the last 9 validate
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}, context_length=8), progress=False)
    assert (len(result.train), len(result.validation)) == (81, 9)  # validation: 8 inputs and the target after
    for context, split, tokens in ((9, "validation", 9), (81, "training", 81)):
        with pytest.raises(DataError, match=rf"the {split} split has {tokens} tokens, fewer than "
                                            rf"model\.context_length \+ 1 = {context + 1}"):
            prepare_data(make_config(tmp_path, {"files": [str(path)]}, context_length=context),
                         progress=False)


def test_a_trusted_cache_too_short_for_a_longer_context_length_is_refused_too(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("".join(DOCUMENTS[:3]), encoding="utf-8")  # about 300 characters: 30 held out
    prepare_data(make_config(tmp_path, {"files": [str(path)]}), progress=False)  # built and trusted
    assert trusted_caches(tmp_path)
    with pytest.raises(DataError, match=r"the validation split has \d+ tokens, fewer than model\.context"):
        prepare_data(make_config(tmp_path, {"files": [str(path)]}, context_length=64), progress=False)


def test_missing_text_field_lists_the_fields(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", field="content")
    config = make_config(tmp_path, {"files": [str(path)]})
    assert_one_line_error(tmp_path, config, r"corpus\.jsonl has no field 'text'; its fields are: content, id")
    pq.write_table(pa.table({"body": ["x"], "n": [1]}), tmp_path / "t.parquet")
    config = make_config(tmp_path, {"files": [str(tmp_path / "t.parquet")]})
    assert_one_line_error(tmp_path, config, r"t\.parquet has no field 'text'; its fields are: body, n")


def test_text_field_that_is_not_text(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl")
    config = make_config(tmp_path, {"files": [str(path)], "text_field": "id"})
    assert_one_line_error(tmp_path, config, r"corpus\.jsonl: line 1: 'id' is a number \(0\), not text")


def test_invalid_utf8_names_file_byte_and_line(tmp_path):
    write_text_folder(tmp_path / "books", DOCUMENTS[:12])
    bad = tmp_path / "books" / "doc05.txt"
    bad.write_bytes(b"fine line\nsecond line \xff\xfe broken\n")
    config = make_config(tmp_path, {"files": [str(tmp_path / "books")]})
    assert_one_line_error(tmp_path, config, r"doc05\.txt: not valid UTF-8 at byte 22 \(line 2\)")


def test_invalid_utf8_across_two_reads_names_the_byte_and_line_where_its_character_starts(tmp_path):
    # the fault is looked for a megabyte at a time: a character begun at the end of one read and broken
    # at the start of the next is placed where it begins, on the line counted from the bytes before it
    path = tmp_path / "book.txt"
    head = b"abc\n" * ((1 << 20) // 4 - 1) + b"abc"  # 262,143 lines, then a line that the read cuts
    path.write_bytes(head + b"\xc3" + b"X, not the rest\nof the character\n")  # lines after it don't count
    config = make_config(tmp_path, {"files": [str(path)]})
    fault = rf"book\.txt: not valid UTF-8 at byte {len(head)} \(line 262144\); save it as UTF-8$"
    assert_one_line_error(tmp_path, config, fault)
    path.write_bytes(b"fine line\ncut short \xe2\x82")  # the first two of the three bytes of the euro sign
    assert_one_line_error(tmp_path, config, r"book\.txt: not valid UTF-8: it ends inside a character "
                          r"\(byte 22\)$")


@pytest.mark.parametrize("name", ["corpus.txt", "corpus.txt.gz"])
def test_a_text_file_saved_as_utf16_without_a_byte_order_mark_is_one_line_naming_its_first_nul(
        tmp_path, name):
    # ASCII text in UTF-16 is valid UTF-8 with a NUL after each character: it trained as that text, unsaid.
    import gzip

    path = tmp_path / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write("to be or not\n".encode("utf-16-le"))
    config = make_config(tmp_path, {"files": [str(path)]})
    assert_one_line_error(tmp_path, config, rf"^{re.escape(str(path))}: holds a NUL at byte 1 \(line 1\), "
                          r"which no text does: it is UTF-16 \(without a byte-order mark\) or not text; "
                          r"save it as UTF-8$")
    path.unlink()  # big-endian: the NUL comes first, at byte 0
    with opener(path, "wb") as f:
        f.write("to be or not\n".encode("utf-16-be"))
    assert_one_line_error(tmp_path, config, rf"^{re.escape(str(path))}: holds a NUL at byte 0 \(line 1\), ")
    # One NUL in the second megabyte of a long text: its byte and line, counted over the reads before it.
    head = b"abc\n" * ((1 << 20) // 4 + 10)
    path.unlink()
    with opener(path, "wb") as f:
        f.write(head + b"ab\0c\n")
    line = head.count(b"\n") + 1
    assert_one_line_error(tmp_path, config, rf"NUL at byte {len(head) + 2} \(line {line}\)")
    path.unlink()  # with UTF-16's mark the first byte is no UTF-8: said so, and why
    with opener(path, "wb") as f:
        f.write("to be or not\n".encode("utf-16"))
    assert_one_line_error(tmp_path, config, rf"^{re.escape(str(path))}: not valid UTF-8 at byte 0 "
                          r"\(line 1\): it starts with UTF-16's byte-order mark; save it as UTF-8$")


@pytest.mark.parametrize("name", ["reviews.csv", "reviews.tsv.gz"])
def test_a_csv_or_tsv_file_saved_as_utf16_without_a_byte_order_mark_is_one_line_naming_its_first_nul(
        tmp_path, name):
    # Its header was read as "i\0d\0,\0t\0e\0x\0t\0": "has no field 'text'; its fields are: i\0d\0, ...",
    # which a terminal (showing no NUL) prints as "has no field 'text'; its fields are: id, text".
    import gzip

    separator = "\t" if ".tsv" in name else ","
    path = tmp_path / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(f"id{separator}text\n1{separator}to be or not\n".encode("utf-16-le"))
    config = make_config(tmp_path, {"files": [str(path)]})
    assert_one_line_error(tmp_path, config, rf"^{re.escape(str(path))}: holds a NUL at byte 1 \(line 1\), "
                          r"which no text does: it is UTF-16 \(without a byte-order mark\) or not text; "
                          r"save it as UTF-8$")
    # With the mark (Excel's "Unicode Text"): said so, not "without a byte-order mark".
    path.unlink()
    with opener(path, "wb") as f:
        f.write(f"id{separator}text\n1{separator}to be or not\n".encode("utf-16"))
    assert_one_line_error(tmp_path, config, rf"^{re.escape(str(path))}: holds a NUL at byte 3 \(line 1\), "
                          r"which no text does: it is UTF-16 \(it starts with UTF-16's byte-order mark\); "
                          r"save it as UTF-8$")


def test_invalid_json_line_names_file_and_line(tmp_path):
    import logging.handlers

    path = write_jsonl(tmp_path / "corpus.jsonl")
    with open(path, "a") as f:
        f.write('{"text": "unterminated}\n')
    config = make_config(tmp_path, {"files": [str(path)]})
    logged = logging.handlers.BufferingHandler(100)  # what datasets' own handler would print
    logging.getLogger("datasets").addHandler(logged)
    try:
        # json's own words end in "at" for some faults ("Unterminated string starting at"): said once
        assert_one_line_error(tmp_path, config, r"corpus\.jsonl: line 21 is not valid JSON "
                              r"\(Unterminated string starting at column 10\)$")
    finally:
        logging.getLogger("datasets").removeHandler(logged)
    assert [r.getMessage() for r in logged.buffer] == []  # no "Failed to load JSON ..." before the error


def test_bpe_vocabulary_too_small(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]}, tokenizer={"kind": "bpe", "vocab_size": 100})
    assert_one_line_error(tmp_path, config, r"tokenizer\.vocab_size=100 is too small .* minimum is 257")


def cache_folders(tmp_path):
    return sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir())


@pytest.mark.parametrize("tokenizer, message", [
    ({"kind": "bpe", "vocab_size": 200}, r"tokenizer\.vocab_size=200 is too small"),
    ({"kind": "pretrained", "path": "bad.json"}, r"bad\.json: not a valid tokenizer\.json"),
    ({"kind": "pretrained", "path": "good.json", "end_of_text": "</s>"}, r"'</s>' is not a token of this"),
])
def test_a_tokenizer_that_cannot_be_built_leaves_no_empty_cache_folder(tmp_path, monkeypatch, tokenizer,
                                                                        message):
    monkeypatch.chdir(tmp_path)
    folder = write_text_folder(tmp_path / "books")
    prepare_data(make_config(tmp_path, {"files": [str(folder)]}), progress=False)
    finished = cache_folders(tmp_path)
    (tmp_path / "bad.json").write_text("{bad", encoding="utf-8")
    shutil.copy(tmp_path / "cache" / finished[0] / "tokenizer.json", tmp_path / "good.json")  # char's
    with pytest.raises(DataError, match=message):
        prepare_data(make_config(tmp_path, {"files": [str(folder)]}, tokenizer), progress=False)
    assert cache_folders(tmp_path) == finished  # the folder made for the failed build is gone, no other


def test_a_failed_rebuild_takes_the_unfinished_caches_files_and_keeps_the_folder_that_holds_others(
        tmp_path, monkeypatch):
    # the token files of a cache without meta.json are never trusted, and took the room a rebuild needs
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)]})
    cache = prepare_data(config, progress=False).cache_dir
    (cache / "meta.json").unlink()  # an unfinished cache, rebuilt at the next run
    (cache / "notes.txt").write_text("not the cache's", encoding="utf-8")

    def failing(*args, **kwargs):
        raise DataError("no tokenizer this time")

    monkeypatch.setattr(token_cache, "build_tokenizer", failing)
    with pytest.raises(DataError, match="no tokenizer this time"):
        prepare_data(config, progress=False)
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]


def test_validation_split_needs_a_dataset(tmp_path):
    folder = write_text_folder(tmp_path / "books")
    config = make_config(tmp_path, {"files": [str(folder)], "validation_split": "validation"})
    assert_one_line_error(tmp_path, config, r"data\.validation_split: 'validation' needs a hub dataset")
    config = make_config(tmp_path, {"files": [str(folder)], "train_split": "test"})
    assert_one_line_error(tmp_path, config, r"data\.train_split: 'test' needs a hub dataset")


# ----------------------------------------------------------------------------- batches


def counting_tokens(n=1000):
    return np.arange(n, dtype=np.uint16)  # token i at position i: a window shows where it came from


def test_batches_are_shifted_windows():
    sampler = BatchSampler(counting_tokens(), batch_size=6, context_length=16, seed=0)
    x, y = sampler.next_batch()
    assert x.shape == y.shape == (6, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)  # y is x shifted by one token
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(6, 15, dtype=torch.int64))  # contiguous windows


def test_windows_reach_both_ends_and_never_past_them():
    tokens = counting_tokens(40)
    sampler = BatchSampler(tokens, batch_size=32, context_length=8, seed=1)
    firsts, lasts = set(), set()
    for _ in range(50):
        x, y = sampler.next_batch()
        firsts.update(x[:, 0].tolist())
        lasts.update(y[:, -1].tolist())
    assert min(firsts) == 0 and max(lasts) == 39  # every start 0 .. n - T - 1 is drawn
    assert max(firsts) == 40 - 8 - 1


def test_batches_are_deterministic_and_differ_by_rank():
    draw = lambda sampler: [sampler.next_batch()[0] for _ in range(3)]  # noqa: E731
    a = draw(BatchSampler(counting_tokens(), 4, 8, seed=7))
    b = draw(BatchSampler(counting_tokens(), 4, 8, seed=7))
    other_rank = draw(BatchSampler(counting_tokens(), 4, 8, seed=7, rank=1, world_size=2))
    other_seed = draw(BatchSampler(counting_tokens(), 4, 8, seed=8))
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not any(torch.equal(p, q) for p, q in zip(a, other_rank))
    assert not any(torch.equal(p, q) for p, q in zip(a, other_seed))


@pytest.mark.parametrize("sampling", ["random", "passes"])
def test_restored_sampler_draws_the_same_batches(tmp_path, sampling):
    sampler = BatchSampler(counting_tokens(), 4, 8, seed=3, sampling=sampling)
    for _ in range(30):  # a pass holds 124 windows: the state is taken in the first, restored into the second
        sampler.next_batch()
    torch.save({"sampler": sampler.state_dict()}, tmp_path / "state.pt")
    expected = [sampler.next_batch() for _ in range(5)]
    state = torch.load(tmp_path / "state.pt", weights_only=True)["sampler"]
    fresh = BatchSampler(counting_tokens(), 4, 8, seed=999, sampling=sampling)
    fresh.next_batch()  # its own pass cached: restoring must not keep it
    fresh.load_state_dict(state)
    for x, y in expected:
        x2, y2 = fresh.next_batch()
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_any_rank_resumes_from_rank_zeros_state():
    rank_one = BatchSampler(counting_tokens(), 4, 8, seed=3, rank=1, world_size=2)
    for _ in range(5):
        rank_one.next_batch()
    rank_zero = BatchSampler(counting_tokens(), 4, 8, seed=3, rank=0, world_size=2)
    for _ in range(5):
        rank_zero.next_batch()
    resumed = BatchSampler(counting_tokens(), 4, 8, seed=3, rank=1, world_size=2)
    resumed.load_state_dict(rank_zero.state_dict())
    assert torch.equal(resumed.next_batch()[0], rank_one.next_batch()[0])


def test_passes_show_every_window_of_a_pass_once_before_the_next_pass():
    T, per_pass = 16, (1000 - 16) // 16  # 61 windows a pass
    sampler = BatchSampler(counting_tokens(), batch_size=per_pass, context_length=T, seed=4, sampling="passes")
    passes = []
    for _ in range(3):
        x, y = sampler.next_batch()  # one batch is one whole pass
        starts = x[:, 0].tolist()
        assert torch.equal(y, x + 1) and y.max() <= 999  # shifted windows, inside the text
        offset = min(starts)
        assert offset < T and sorted(starts) == [offset + T * k for k in range(per_pass)]  # no overlap, none left out
        passes.append(starts)
    assert len({tuple(starts) for starts in passes}) == 3  # each pass in its own order
    assert len({min(starts) for starts in passes}) > 1  # and its own offset: the cuts move


def test_passes_are_dealt_between_ranks_without_overlap():
    def starts(sampler, batches=6):
        return {start for _ in range(batches) for start in sampler.next_batch()[0][:, 0].tolist()}
    ours, theirs = (starts(BatchSampler(counting_tokens(), 5, 16, seed=4, rank=rank, world_size=2, sampling="passes"))
                    for rank in (0, 1))
    assert len(ours) == len(theirs) == 30 and not ours & theirs  # 60 distinct windows of the 61 in pass 0
    assert ours | theirs == starts(BatchSampler(counting_tokens(), 10, 16, seed=4, sampling="passes"))


def draw_pass_windows(sampler, batches, end_after=None):
    """Draws `batches` batches, the run planned to end after `end_after` (default: `batches`);
    returns each pass's window starts, in the order drawn."""
    passes = {}
    for _ in range(batches):
        sampler.plan_end((batches if end_after is None else end_after) - sampler.batches_drawn)
        drawn = sampler.windows_drawn
        for k, start in enumerate(sampler.next_batch()[0][:, 0].tolist()):
            number = int(np.searchsorted(sampler.pass_starts, drawn + k, side="right")) - 1
            passes.setdefault(number, []).append(start)
    return [passes[number] for number in sorted(passes)]


@pytest.mark.parametrize("batches", [9, 20, 40, 45, 61])  # 61 windows a pass: 0.6 to 4 passes
def test_the_runs_last_window_ends_a_pass_and_the_passes_share_the_run_equally(batches):
    T, per_pass = 16, (1000 - 16) // 16
    sampler = BatchSampler(counting_tokens(), batch_size=4, context_length=T, seed=4, sampling="passes")
    passes = draw_pass_windows(sampler, batches)
    total = 4 * batches
    assert len(passes) == -(-total // per_pass)  # the fewest passes that hold the run
    assert sum(map(len, passes)) == total and max(map(len, passes)) - min(map(len, passes)) <= 1
    assert sampler.pass_starts[-1] + len(passes[-1]) == total  # the last window drawn ends the last pass
    for starts in passes:  # a cut pass is part of a whole one: no window twice, none overlapping
        offset = min(starts) % T
        assert len(set(starts)) == len(starts) and all(start % T == offset for start in starts)


def test_a_pass_follows_the_plan_until_its_end_is_reached():
    T, per_pass = 16, (1000 - 16) // 16
    sampler = BatchSampler(counting_tokens(), batch_size=4, context_length=T, seed=4, sampling="passes")
    draw_pass_windows(sampler, 20, end_after=20)  # 80 windows planned: two passes of 40
    assert sampler.pass_starts == [0, 40]
    draw_pass_windows(sampler, 10, end_after=40)  # the plan moves to 160 while the second pass runs: ...
    assert sampler.pass_starts == [0, 40, 100]  # ... not cut at 80: it shares the 120 left with a third
    sampler = BatchSampler(counting_tokens(), batch_size=4, context_length=T, seed=4, sampling="passes")
    draw_pass_windows(sampler, 5, end_after=100)  # 400 windows planned: 7 passes of 57 or 58
    passes = draw_pass_windows(sampler, 5, end_after=10)  # the plan shrinks to 40 windows, 20 drawn
    assert sampler.pass_starts == [0] and len(passes[0]) == 20  # the first pass ends with the run, at 40
    without_plan = BatchSampler(counting_tokens(), 4, T, seed=4, sampling="passes")
    for _ in range(30):
        without_plan.next_batch()
    assert without_plan.pass_starts == [0, per_pass]  # no plan: whole passes


def test_a_plan_shrunk_below_the_windows_drawn_keeps_them_in_their_pass_and_shows_the_next_whole():
    T, per_pass = 16, (1000 - 16) // 16
    sampler = BatchSampler(counting_tokens(), batch_size=1, context_length=T, seed=4, sampling="passes")
    for _ in range(20):  # 20 windows of a planned 100
        sampler.plan_end(100 - sampler.batches_drawn)
        sampler.next_batch()
    after = []
    for _ in range(per_pass):  # the plan re-estimated down to 10 windows, before the 20 drawn
        sampler.plan_end(10 - sampler.batches_drawn)
        after.append(int(sampler.next_batch()[0][0, 0]))
    assert sampler.pass_starts[:2] == [0, 20]  # the drawn windows stay in the first pass; the next starts now
    offset = min(after) % T
    assert sorted(after) == [offset + T * k for k in range(per_pass)]  # every window of the next pass once


def test_a_resumed_sampler_keeps_the_passes_cut_before_it_stopped(tmp_path):
    sampler = BatchSampler(counting_tokens(), 4, 16, seed=3, sampling="passes")
    draw_pass_windows(sampler, 14, end_after=20)  # passes of 40 windows: the state is taken in the second
    torch.save({"sampler": sampler.state_dict()}, tmp_path / "state.pt")
    expected = [sampler.next_batch()[0] for _ in range(4)]
    fresh = BatchSampler(counting_tokens(), 4, 16, seed=999, sampling="passes")
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True)["sampler"])
    for x in expected:  # no plan told after the resume: the cut is in the state, not remade
        assert torch.equal(fresh.next_batch()[0], x)


@pytest.mark.parametrize("world_size, passes", [(1, [0, 61]), (2, [0, 61, 122])])
def test_a_sampler_state_saved_before_passes_were_cut_resumes_in_whole_passes(world_size, passes):
    sampler = BatchSampler(counting_tokens(), 4, 16, seed=3, world_size=world_size, sampling="passes")
    for _ in range(20):  # 80 windows a rank, no plan: whole passes of 61
        sampler.next_batch()
    state = sampler.state_dict()
    for key in ("pass_starts", "windows_drawn", "batch_size"):  # as checkpoints written before it held them
        del state[key]
    expected = [sampler.next_batch()[0] for _ in range(4)]
    fresh = BatchSampler(counting_tokens(), 4, 16, seed=3, world_size=world_size, sampling="passes")
    fresh.load_state_dict(state)
    assert fresh.pass_starts == passes and all(torch.equal(fresh.next_batch()[0], x) for x in expected)


def test_a_sampler_state_saved_before_pass_starts_past_the_passes_kept_resumes_their_numbering():
    # Passes of two windows, whole (no plan): 40 batches of 64 begin 1,280 passes, each shuffled by its
    # number. A state saved before pass_starts keeps the last PASSES_KEPT, numbered after those before.
    from tinyattn.data.batches import PASSES_KEPT

    sampler = BatchSampler(counting_tokens(50), 64, 16, seed=3, sampling="passes")
    for _ in range(40):
        sampler.next_batch()
    state = sampler.state_dict()
    for key in ("pass_starts", "passes_before", "windows_drawn", "batch_size"):  # as saved before them
        del state[key]
    expected = [sampler.next_batch()[0] for _ in range(3)]
    fresh = BatchSampler(counting_tokens(50), 64, 16, seed=3, sampling="passes")
    fresh.load_state_dict(state)
    assert (fresh.passes_before, len(fresh.pass_starts)) == (1280 - PASSES_KEPT, PASSES_KEPT)
    assert all(torch.equal(fresh.next_batch()[0], x) for x in expected)


@pytest.mark.parametrize("saved_before", [False, True])
def test_passes_of_one_window_keep_a_state_that_stops_growing_and_resume_exactly(tmp_path, monkeypatch,
                                                                                 saved_before):
    # 40 tokens, windows of 16: a pass begins with every window drawn. The state held every pass's
    # start (128,000 after 2,000 batches of 64), in every checkpoint, and each batch searched them all.
    import tinyattn.data.batches as batches

    def sampler():
        return BatchSampler(counting_tokens(40), 64, 16, seed=3, sampling="passes")

    def draw(source, count):
        drawn = []
        for _ in range(count):
            source.plan_end(100 - source.batches_drawn)
            drawn.append(source.next_batch()[0])
        return drawn

    straight = sampler()
    drawn = draw(straight, 20)
    kept = len(straight.state_dict()["pass_starts"])
    drawn += draw(straight, 20)  # 2,560 windows, as many passes
    state = straight.state_dict()
    assert len(state["pass_starts"]) == kept < 1280
    assert state.get("passes_before", 0) + kept == 2560 and state["pass_starts"][-1] == 2559
    if saved_before:  # as a state saved before the sampler forgot passes: every pass's start
        state = {**state, "pass_starts": list(range(2560))}
        del state["passes_before"]
    torch.save({"sampler": state}, tmp_path / "state.pt")
    drawn += draw(straight, 3)
    resumed = sampler()
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True)["sampler"])
    assert len(resumed.state_dict()["pass_starts"]) == kept
    assert all(torch.equal(x, y) for x, y in zip(draw(resumed, 3), drawn[-3:]))
    monkeypatch.setattr(batches, "PASSES_KEPT", 10**9, raising=False)  # a sampler that forgets none
    assert all(torch.equal(x, y) for x, y in zip(draw(sampler(), 43), drawn))  # the windows it draws


def draw_rounds(samplers, rounds):
    """The window starts `rounds` rounds of the ranks' batches draw, in the order of the sequence
    they deal from (in each round rank 0's batch, then rank 1's, ...)."""
    return [start for _ in range(rounds) for sampler in samplers
            for start in sampler.next_batch()[0][:, 0].tolist()]


@pytest.mark.parametrize("before, after", [((4, 1), (8, 1)), ((8, 1), (4, 1)), ((4, 1), (3, 2)),
                                           ((3, 2), (4, 1))])  # (batch size, ranks)
def test_a_pass_resumed_at_another_batch_size_or_number_of_ranks_shows_each_of_its_windows_once(before, after):
    T, per_pass = 16, (1000 - 16) // 16  # 61 windows a pass

    def ranks(batch_size, world_size):
        return [BatchSampler(counting_tokens(), batch_size, T, seed=4, rank=rank, world_size=world_size,
                             sampling="passes") for rank in range(world_size)]
    the_pass = BatchSampler(counting_tokens(), per_pass, T, seed=4, sampling="passes").next_batch()[0][:, 0].tolist()
    old = ranks(*before)
    drawn = draw_rounds(old, 2)  # 12 to 16 windows of the first pass
    resumed = ranks(*after)
    for sampler in resumed:
        sampler.load_state_dict(old[0].state_dict())  # rank 0's state
    drawn += draw_rounds(resumed, 16)[:per_pass - len(drawn)]  # the rest of the pass
    assert len(set(drawn)) == per_pass and set(drawn) == set(the_pass)  # every window once, none twice
    assert drawn == the_pass  # in the pass's own order: the resume goes on where the pass stood


def test_a_pass_resumed_twice_at_other_batch_sizes_shows_each_of_its_windows_once():
    # The second state's batches were drawn at two sizes: its windows drawn are not its batches times
    # its batch size (4 * 6 = 24 where 2 * 4 + 2 * 6 = 20 were drawn).
    T, per_pass = 16, (1000 - 16) // 16

    def sampler(batch_size):
        return BatchSampler(counting_tokens(), batch_size, T, seed=4, sampling="passes")

    the_pass = sampler(per_pass).next_batch()[0][:, 0].tolist()
    first = sampler(4)
    drawn = draw_rounds([first], 2)
    second = sampler(6)
    second.load_state_dict(first.state_dict())
    drawn += draw_rounds([second], 2)
    third = sampler(5)
    third.load_state_dict(second.state_dict())
    drawn += draw_rounds([third], 10)[:per_pass - len(drawn)]
    assert drawn == the_pass  # every window once, in the pass's order


def test_a_state_saved_before_it_held_the_windows_drawn_resumes_at_another_batch_size_from_its_own():
    T = 16
    old = BatchSampler(counting_tokens(), 4, T, seed=4, sampling="passes")
    draw_rounds([old], 3)
    state = {**old.state_dict(), "batch_size": 4}  # the Trainer gives the checkpoint config's
    state.pop("windows_drawn", None)  # as checkpoints written before it held it
    rest = draw_rounds([old], 3)
    resumed = BatchSampler(counting_tokens(), 6, T, seed=4, sampling="passes")
    resumed.load_state_dict(state)
    assert draw_rounds([resumed], 2) == rest  # windows 12..23, not 18..29


def test_a_sampler_state_is_a_snapshot_the_draws_after_it_leave_alone():
    sampler = BatchSampler(counting_tokens(), 4, 16, seed=3, sampling="passes")
    for _ in range(10):  # 40 windows: in the first pass of 61
        sampler.next_batch()
    state = sampler.state_dict()
    expected = [sampler.next_batch()[0] for _ in range(20)]  # on into the second pass
    assert state["pass_starts"] == [0] and sampler.pass_starts == [0, 61]
    fresh = BatchSampler(counting_tokens(), 4, 16, seed=3, sampling="passes")
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.next_batch()[0], x) for x in expected)


@pytest.mark.parametrize("batches, passes", [(8, [0, 40]), (16, [0, 54, 107])])  # 80 windows, 160 windows
def test_ranks_cut_their_passes_alike(batches, passes):
    def starts(sampler):
        drawn = []
        for _ in range(batches):
            sampler.plan_end(batches - sampler.batches_drawn)
            drawn += sampler.next_batch()[0][:, 0].tolist()
        return sorted(drawn), sampler.pass_starts
    (ours, our_passes), (theirs, their_passes) = (
        starts(BatchSampler(counting_tokens(), 5, 16, seed=4, rank=rank, world_size=2, sampling="passes"))
        for rank in (0, 1))
    one, one_passes = starts(BatchSampler(counting_tokens(), 10, 16, seed=4, sampling="passes"))
    assert our_passes == their_passes == one_passes == passes  # the plan counts the windows of both ranks
    assert sorted(ours + theirs) == one  # dealt between them: the windows one process would draw


def test_a_run_that_goes_on_past_its_planned_end_goes_on_in_whole_passes():
    # A plan that says the run ends where it is (a time budget still measuring says the step it is
    # at): the pass that ends there is followed by a whole one, every window of it once.
    T, per_pass = 16, (1000 - 16) // 16
    sampler = BatchSampler(counting_tokens(), batch_size=1, context_length=T, seed=4, sampling="passes")
    drawn = []
    for _ in range(5 + per_pass):
        sampler.plan_end(5 - sampler.batches_drawn)
        drawn.append(int(sampler.next_batch()[0][0, 0]))
    assert sampler.pass_starts == [0, 5]
    offset = min(drawn[5:]) % T
    assert sorted(drawn[5:]) == [offset + T * k for k in range(per_pass)]


def test_passes_need_two_windows_and_name_the_key_that_avoids_them():
    x, _ = BatchSampler(counting_tokens(32), 4, 16, seed=0, sampling="passes").next_batch()  # 32 tokens: passes of one window
    assert (x[:, 0] < 16).all()
    with pytest.raises(DataError, match=r"31 tokens cannot fill a pass .*set train.sampling: random"):
        BatchSampler(counting_tokens(31), 4, 16, seed=0, sampling="passes")


def test_sampler_needs_one_window():
    with pytest.raises(DataError, match="cannot fill one window"):
        BatchSampler(counting_tokens(8), 4, 8, seed=0)


@pytest.mark.parametrize("max_windows", [None, 4])
def test_eval_batches_refuse_tokens_that_cannot_fill_one_window(max_windows):
    refusal = r"^8 tokens cannot fill one window of model\.context_length \+ 1 = 9$"
    with pytest.raises(DataError, match=refusal):
        next(eval_batches(counting_tokens(8), context_length=8, batch_size=4, max_windows=max_windows))


def test_eval_batches_cover_all_windows_without_overlap():
    tokens = counting_tokens(103)
    batches = list(eval_batches(tokens, context_length=10, batch_size=4))
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert [len(b[0]) for b in batches] == [4, 4, 2]  # (103 - 1) // 10 = 10 windows
    assert torch.equal(x[:, 0], torch.arange(0, 100, 10)) and torch.equal(y, x + 1)


@pytest.mark.parametrize("windows, batch_size, sizes", [(9, 4, [4, 4, 1]), (1, 1, [1]), (1, 4, [1])])
def test_eval_batches_walk_every_window_when_the_last_batch_holds_one(windows, batch_size, sizes):
    tokens = counting_tokens(windows * 10 + 1)
    batches = list(eval_batches(tokens, context_length=10, batch_size=batch_size))
    assert [len(x) for x, _ in batches] == sizes
    assert torch.equal(torch.cat([x for x, _ in batches])[:, 0], torch.arange(0, windows * 10, 10))


def test_eval_batches_spread_a_fixed_number_of_windows():
    tokens = counting_tokens(1000)
    first = [b[0] for b in eval_batches(tokens, 10, 8, max_windows=20)]
    again = [b[0] for b in eval_batches(tokens, 10, 8, max_windows=20)]
    assert all(torch.equal(p, q) for p, q in zip(first, again))
    x = torch.cat(first)
    starts = x[:, 0]
    assert len(x) == 20 and starts[0] == 0 and x[-1, -1] == 998  # first window to the last
    assert bool(((starts[1:] - starts[:-1]) >= 10).all())  # evenly spread, no overlap
    assert len(torch.cat([b[0] for b in eval_batches(tokens, 10, 8, max_windows=10_000)])) == 99


def test_eval_batches_with_max_windows_equal_to_the_full_windows_walk_them_all_without_overlap():
    tokens = counting_tokens(103)  # (103 - 1) // 10 = 10 full windows
    every = torch.cat([x for x, _ in eval_batches(tokens, 10, 4)])
    capped = torch.cat([x for x, _ in eval_batches(tokens, 10, 4, max_windows=10)])
    assert torch.equal(capped, every) and torch.equal(capped[:, 0], torch.arange(0, 100, 10))


@pytest.mark.parametrize("extra", [0, 1, 5])
def test_the_tail_holds_the_targets_after_the_last_full_window_and_is_none_without_any(extra):
    tokens = counting_tokens(3 * 10 + 1 + extra)  # three full windows of 10 inputs, then `extra` targets
    tail = tail_window(tokens, 10)
    if extra == 0:
        assert tail is None  # every target is in a full window: no empty (1, 0) tail to score
    else:
        x, y = tail
        assert torch.equal(x, torch.arange(30, 30 + extra).unsqueeze(0)) and torch.equal(y, x + 1)


def test_a_tokenizer_whose_output_changes_at_a_cut_encodes_each_document_whole():
    # SentencePiece's Metaspace puts "▁" before a text's first word only: a document read in
    # parts (a large text file is) would get a "▁" at every cut if the parts were encoded alone.
    import io

    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.decoder = decoders.Metaspace(prepend_scheme="first")
    text = "hello there\nline number two\nand three more words\n"
    backend.train_from_iterator([text * 20], trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>"]))
    tokenizer = Tokenizer(backend)
    assert not tokenizer.cuts_are_exact
    parts = [("hello there\nline numb", True), ("er two\nand three", False), (" more words\n", False),
             (text, True)]
    out = io.BytesIO()
    tokens, documents = token_cache.write_tokens(iter(parts), tokenizer, out, np.uint16)
    assert documents == 2
    assert np.frombuffer(out.getvalue(), dtype=np.uint16).tolist() == tokenizer.encode(text) * 2


def marked_corpus(tmp_path, marker, extra=""):
    """DOCUMENTS with every fifth word replaced by `marker` (WikiText's '<unk>'), `extra` in the first."""
    documents = [" ".join(marker if i % 5 == 2 else word for i, word in enumerate(d.split(" ")))
                 for d in DOCUMENTS]
    documents[0] += extra
    return write_jsonl(tmp_path / "corpus.jsonl", documents), sum(d.count(marker) for d in documents)


def test_a_text_that_writes_the_unknown_token_itself_is_not_said_to_be_unseen(tmp_path, capsys):
    """WikiText writes '<unk>' for its rare words, and a Llama tokenizer.json reads that text as its
    unknown token (an added token): 'has never seen '<unk>'', of a tokenizer that read every character."""
    from tests.conftest import llama_like_byte_fallback_tokenizer

    backend = tokenizers.Tokenizer.from_str(llama_like_byte_fallback_tokenizer().to_json())
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])  # as a Llama tokenizer.json's added tokens
    backend.save(str(tmp_path / "tokenizer.json"))
    path, _ = marked_corpus(tmp_path, "<unk>")
    tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json"), "end_of_text": "</s>"}
    result = prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False)
    assert result.tokenizer.unknown_id in result.train  # the text's own '<unk>'
    assert "warning" not in capsys.readouterr().err


def save_char_tokenizer_reading_unk_written(path):
    """A character tokenizer.json whose unknown token is '<unk>', an added token: a text that writes
    '<unk>' is read as that token."""
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    backend = tokenizers.Tokenizer.from_str(
        build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["".join(DOCUMENTS) + "<>kun"])).to_json())
    backend.add_special_tokens(["<unk>"])  # its unknown token, named so, and read where a text writes it
    spec = json.loads(backend.to_str())
    spec["model"]["vocab"]["<unk>"] = spec["model"]["vocab"].pop("[UNK]")
    spec["model"]["unk_token"] = "<unk>"
    tokenizers.Tokenizer.from_str(json.dumps(spec)).save(str(path))


def test_the_unknown_warning_counts_and_names_what_the_tokenizer_never_saw_not_the_token_written(
        tmp_path, capsys):
    save_char_tokenizer_reading_unk_written(tmp_path / "tokenizer.json")
    path, _ = marked_corpus(tmp_path, "<unk>", extra="é é")
    tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")}
    prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False)
    warning = capsys.readouterr().err
    assert warning.startswith("warning: 0.1% of the training split's tokens are <unk> (2 of 1,5"), warning
    assert "has never seen 'é'; the model trains on <unk> in their place" in warning, warning


def test_the_unknown_token_written_after_the_characters_named_is_still_not_counted_as_unseen(tmp_path,
                                                                                             capsys):
    """Past the first characters it names, the warning still takes every '<unk>' the training split
    writes out of its count, once the text has written one."""
    save_char_tokenizer_reading_unk_written(tmp_path / "tokenizer.json")
    unseen = "ÀÁÂÃÄÅÆÇÈÉÊ"  # more than the warning names, all in the first document
    path, _ = marked_corpus(tmp_path, "<unk>", extra=unseen)  # every document writes '<unk>'
    tokenizer = {"kind": "pretrained", "path": str(tmp_path / "tokenizer.json")}
    prepare_data(make_config(tmp_path, {"files": [str(path)]}, tokenizer), progress=False)
    warning = capsys.readouterr().err
    assert f"are <unk> ({len(unseen)} of " in warning, warning
