"""The token cache: each split's tokens in one flat file, built once and trusted only when whole.

Token files `train.bin` and `validation.bin` hold uint16 ids when the vocabulary fits, else
uint32, with `<|endoftext|>` between documents. Documents are encoded in batches and
appended to the file as they come, so memory does not grow with the corpus.

The cache folder's name ends in a hash of everything that produced it (the source and
a BLAKE2b hash of each file's bytes, the text field, the split rule, the tokenizer
settings, a format version), so a second run reuses it and any change builds a new one.
The files are keyed by what they hold, not by their size and modification time, which
`cp -p`, `rsync -a` or `touch -r` carry over to an edited file.
Every file is written under a temporary name and renamed; `meta.json` is written last,
and a folder is trusted only when its `meta.json` matches the hash and the file sizes. A
build that is interrupted, or whose splits turn out too short, leaves no `meta.json` (and
deletes the token files it wrote, as a rebuild deletes a damaged cache's before writing); the
temporary files of one that was killed are deleted by the next build (under the folder's
build lock, so never a live build's). A build that finds another process building the same
folder waits for it, and uses the cache it completed; a build that fails deletes its lock
file (beside the folder) too. A folder removed while it is built (`rm -r` of the cache at
the wrong moment) ends the build in one line: run again.

`data_fingerprint(meta)` is what a run records of the data it trained on (in each checkpoint
and the run folder's `data.json`); `data_differences` names what changed between two of them.

`meta.json` also holds a BLAKE2b checksum of each token file and of `tokenizer.json`,
taken as they are written. Each run reads the files once to check them, and that every
id is below the vocabulary size: a file changed in place (same size, other bytes) is
rebuilt with a warning instead of training on garbage or failing deep in the model.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import tokenizers
from filelock import FileLock, Timeout
from tqdm import tqdm

from tinyattn.config import Config
from tinyattn.data.local_files import DocumentParts
from tinyattn.data.sources import Source
from tinyattn.data.tokenizer import END_OF_TEXT, Tokenizer, build_tokenizer, pretrained_file
from tinyattn.errors import DataError, counted
from tinyattn.system.console import notice
from tinyattn.system.storage import atomic_write, check_writable, remove_temporaries, storage_errors

# Bump when the layout or meaning of the cache files changes, or the reading of the same bytes into
# texts does (2: checksums; 3: CSV/TSV texts 'NA', 'None' and 'null' kept, a file name holding '['
# read as that file and not as a pattern)
FORMAT_VERSION = 3
CHECK_CHUNK_BYTES = 1 << 24  # token files are checked this many bytes at a time
ENCODE_BATCH_CHARS = 1 << 20  # characters handed to the tokenizer at once (encoded in parallel)
BUILD_LOCK_SUFFIX = ".build.filelock"  # `.<folder>` + this, beside it: held while building it
UNKNOWN_NAMED = 10  # the characters read as [UNK] that the training split's warning names
UNKNOWN_SCAN_CHARS = 1 << 24  # the training text searched for them (the count is over every token)
LOCK_NOTE_AFTER = 2.0  # seconds a build waits for another process's build before it says so


class TokenCache:
    """One cache folder: where it is, the key it must match, and how to build it."""

    def __init__(self, source: Source, config: Config):
        self.inputs = cache_inputs(source, config)
        self.key = hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()
        name = f"{source.name}-{_tokenizer_slug(config)}-{self.key[:12]}"
        self.folder = Path(config.data.cache_dir).resolve() / name

    def trusted_meta(self, *, quiet: bool = False) -> Optional[dict]:
        """meta.json of a complete cache built from this key, or None if anything is off (damage
        found in its files is said in a warning, unless `quiet`)."""
        folder = self.folder
        try:
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            if meta["key"] != self.key or meta["format_version"] != FORMAT_VERSION:
                return None
            itemsize = np.dtype(meta["dtype"]).itemsize
            for split in ("train", "validation"):
                if (folder / f"{split}.bin").stat().st_size != meta[f"{split}_tokens"] * itemsize:
                    return None
            if not (folder / "tokenizer.json").is_file():
                return None
            damage = _damage(folder, meta)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if damage:
            if not quiet:
                notice(f"warning: {damage}; rebuilding the token cache")
            return None
        return meta

    @contextmanager
    def sole_builder(self) -> Iterator[Optional[dict]]:
        """Hold the folder's build lock for the block, which builds and commits the cache.

        Another process building there is waited for (a note says so when it takes more than
        `LOCK_NOTE_AFTER` seconds). The block then gets the meta.json of a cache another process
        completed, waited for or not (it may have committed just before this one took the lock),
        to use, or None: build it. Holding the lock, a killed build's temporary files
        (`.train.bin.*.tmp`) are deleted: no other process is writing them. A block that fails
        leaves the folder only if something is in it, and deletes the lock file while it still
        holds it (`_remove_held_lock`).
        """
        folder = self.folder
        check_writable(folder)  # a read-only cache folder is one line, not a traceback
        # Beside the folder, not in it: a cache folder holds only what meta.json describes.
        path = folder.parent / f".{folder.name}{BUILD_LOCK_SUFFIX}"
        lock = FileLock(path, thread_local=False)
        with storage_errors(path):
            try:
                lock.acquire(timeout=LOCK_NOTE_AFTER)
                waited = False
            except Timeout:
                notice(f"note: another process is building the token cache {folder}; waiting for it "
                       f"(its lock: {path})")
                lock.acquire(timeout=-1)
                waited = True
        try:
            # What another process built, if whole; damage the caller's check found is not said twice.
            meta = self.trusted_meta(quiet=not waited)
            if meta is None:
                remove_temporaries(folder)
            yield meta
        except BaseException:
            _remove_untrusted(folder)  # a build that failed after some files (a full disk): none of them
            _remove_if_empty(folder)  # then no folder either
            _remove_held_lock(path)
            raise
        finally:
            lock.release()

    def build(self, train: Callable[[], DocumentParts], validation: Callable[[], DocumentParts],
              rule: str, config: Config, progress: bool) -> dict:
        """Tokenize both splits into the folder; every file but meta.json (see `commit`).
        Only inside `sole_builder`.

        `train()` and `validation()` stream each split's documents anew; `rule` says how
        validation was chosen and is recorded in meta.json.
        """
        folder = self.folder

        def texts() -> Iterator[str]:
            return (text for text, _ in train())

        tokenizer = build_tokenizer(config.tokenizer, texts, progress=progress)
        (folder / "meta.json").unlink(missing_ok=True)  # from here on, nothing in the folder is trusted
        _remove_untrusted(folder)  # a damaged cache's files: the new ones need their room
        with _removal_said(folder):
            meta = self._write(folder, tokenizer, train, validation, rule=rule, progress=progress)
        if tokenizer.eot_id is None and max(meta["train_documents"], meta["validation_documents"]) > 1:
            notice(_run_together_warning(config, tokenizer))
        unknown = _unknown_warning(folder, meta, tokenizer, train, config)
        if unknown:
            notice(unknown)
        return meta

    def _write(self, folder: Path, tokenizer: Tokenizer, train: Callable[[], DocumentParts],
               validation: Callable[[], DocumentParts], *, rule: str, progress: bool) -> dict:
        dtype = token_dtype(tokenizer.vocab_size)
        meta = {"format_version": FORMAT_VERSION, "key": self.key, "dtype": np.dtype(dtype).name,
                "vocab_size": tokenizer.vocab_size, "validation_rule": rule, "inputs": self.inputs,
                "checksums": {}}
        # Each file lands whole or not at all; the folder is trusted only once `commit`
        # writes meta.json after all of them.
        for split, documents in (("train", train), ("validation", validation)):
            with atomic_write(folder / f"{split}.bin") as out:
                checksummed = _Checksummed(out)
                tokens, count = write_tokens(documents(), tokenizer, checksummed, dtype,
                                             progress=progress, desc=f"tokenizing {split}")
            meta[f"{split}_tokens"], meta[f"{split}_documents"] = tokens, count
            meta["checksums"][f"{split}.bin"] = checksummed.digest.hexdigest()
        tokenizer.save(folder / "tokenizer.json")
        meta["checksums"]["tokenizer.json"] = _checksum(folder / "tokenizer.json")
        return meta

    def commit(self, meta: dict) -> None:
        """Write meta.json last, inside `sole_builder`: from now on the folder is trusted. Only when
        every file it describes is there: a folder removed between two of them was made anew by the
        next write, without the files before it."""
        if not all((self.folder / name).is_file() for name in meta["checksums"]):
            raise DataError(_removed_message(self.folder))
        with atomic_write(self.folder / "meta.json") as f:
            f.write(json.dumps(meta, indent=2).encode())


def _remove_untrusted(folder: Path) -> None:
    """Delete the cache files of `folder` when it has no meta.json, so is never trusted: what a build
    that failed wrote (a whole train.bin before the disk filled at validation.bin), or a damaged cache
    being rebuilt, which kept its files while the new ones were written (twice the room). Best effort:
    the caller's error is the one to see."""
    if (folder / "meta.json").exists():
        return
    for name in ("train.bin", "validation.bin", "tokenizer.json"):
        try:
            (folder / name).unlink(missing_ok=True)
        except OSError:
            pass


def _remove_if_empty(folder: Path) -> None:
    """Remove `folder` if it is empty: never one that holds a cache, whole or not (rmdir refuses)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _remove_held_lock(path: Path) -> None:
    """Delete the build lock file `path`, which this process holds, after its build failed: a
    failed build leaves nothing beside the cache folder. A process that opens the name afterwards
    makes a lock file of its own; one that opened the old file just before (between its open and
    its lock) finds it deleted once it has locked it and tries again (filelock 4.2.1 and later, the
    lower bound in pyproject.toml).
    A successful build keeps the file, as run folders keep theirs. Best effort: a file system
    that refuses (Windows, while it is held) leaves it."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


@contextmanager
def _removal_said(folder: Path) -> Iterator[None]:
    """A cache folder removed while it is built (an `rm -r` of the cache at the wrong moment) ends the
    build in one line, not in the FileNotFoundError of the rename that found the folder gone."""
    try:
        yield
    except FileNotFoundError as e:
        if e.filename is None or Path(e.filename).parent != folder:
            raise  # not the cache's own file: a bug, with its traceback
        if folder.is_dir():
            raise DataError(f"{e.filename} was removed while the token cache was being built; "
                            "run again") from None
        raise DataError(_removed_message(folder)) from None


def _removed_message(folder: Path) -> str:
    return f"the token cache {folder} was removed while it was being built; run again"


def _run_together_warning(config: Config, tokenizer: Tokenizer) -> str:
    """A pretrained file with no `<|endoftext|>` and no tokenizer.end_of_text: nothing joins documents."""
    specials = [tokenizer.token(i) for i in sorted(tokenizer.special_ids - {tokenizer.unknown_id})]
    candidates = (f"one of its special tokens ({', '.join(repr(t) for t in specials)})" if specials
                  else "a token it has (it has no special tokens)")
    return (f"warning: {pretrained_file(config.tokenizer.path)} has no {END_OF_TEXT} token and "
            "tokenizer.end_of_text is not set: the documents run together, with nothing between them; "
            f"set tokenizer.end_of_text to {candidates}")


def _unknown_warning(folder: Path, meta: dict, tokenizer: Tokenizer, train: Callable[[], DocumentParts],
                     config: Config) -> Optional[str]:
    """A pretrained tokenizer that reads some of the training split as its unknown token (a fine-tune
    of a character model on text of characters its corpus lacked): how many tokens, and the first
    such characters of the text (`_unknown_in_text`). None where there are none (a char or bpe
    tokenizer is built from the training split itself), and where the text only writes the token
    itself (WikiText's '<unk>', read so by a tokenizer that has it as an added token)."""
    unknown = tokenizer.unknown_id
    if unknown is None or config.tokenizer.kind != "pretrained" or not meta["train_tokens"]:
        return None
    count = sum(int(np.count_nonzero(np.frombuffer(chunk, dtype=meta["dtype"]) == unknown))
                for chunk in _chunks(folder / "train.bin"))
    if not count:
        return None
    found, written = _unknown_in_text(tokenizer, train)
    count -= written
    if count <= 0:
        return None
    token = tokenizer.token(unknown)
    named = ", ".join(repr(c) for c in found[:UNKNOWN_NAMED])
    total = meta["train_tokens"]
    share = f"{count / total:.1%}" if count / total >= 0.001 else "under 0.1%"
    return (f"warning: {share} of the training split's tokens are {token} ({count:,} of {total:,}): "
            f"{pretrained_file(config.tokenizer.path)} has never seen {named or 'some of its characters'}"
            f"{', ...' if len(found) > UNKNOWN_NAMED else ''}; the model trains on {token} in their place "
            "(a tokenizer made for other text, such as a character model's given new characters)")


def _unknown_in_text(tokenizer: Tokenizer, train: Callable[[], DocumentParts]) -> tuple[list[str], int]:
    """The pieces of the training text read as the unknown token, in order (more than `UNKNOWN_NAMED`
    where there are; found within `UNKNOWN_SCAN_CHARS` characters), but the token's own text; and how
    often the text writes that (`Tokenizer.unknown_written`), counted in the whole split once seen."""
    literal = tokenizer.unknown_written
    found: dict[str, None] = {}
    scanned = written = 0
    for text, _ in train():
        if scanned < UNKNOWN_SCAN_CHARS and len(found) <= UNKNOWN_NAMED:
            pieces = tokenizer.unknown_pieces(text[:UNKNOWN_SCAN_CHARS - scanned])
            found.update(dict.fromkeys(piece for piece in pieces if piece != literal))
        written += text.count(literal) if literal else 0
        scanned += len(text)
        if (len(found) > UNKNOWN_NAMED or scanned >= UNKNOWN_SCAN_CHARS) and not written:
            break  # past the characters to name, and the text writes no unknown token of its own
    return list(found), written


def cache_inputs(source: Source, config: Config) -> dict:
    """Everything that decides the cache's contents; its hash names the cache folder."""
    data, tok = config.data, config.tokenizer
    tokenizer: dict = {"kind": tok.kind}
    if tok.kind == "bpe":
        tokenizer["vocab_size"] = tok.vocab_size
    if tok.kind == "pretrained":
        path = pretrained_file(tok.path)  # a folder or a missing file: one line
        try:
            tokenizer["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            raise DataError(f"tokenizer.path: cannot read {path} ({e.strerror or e})") from None
        if tok.end_of_text is not None:  # documents are joined with it
            tokenizer["end_of_text"] = tok.end_of_text
        tokenizer["whole_texts"] = True  # the file's truncation and padding are off (caches before were cut)
    return {
        "format_version": FORMAT_VERSION,
        "source": _content_identity(source.identity),
        "text_field": data.text_field,
        "max_documents": data.max_documents,
        "train_split": data.train_split,
        "validation_split": data.validation_split,
        "validation_fraction": None if data.validation_split else data.validation_fraction,
        "tokenizer": tokenizer,
        "tokenizers_version": tokenizers.__version__,  # BPE training may differ between versions
    }


def _content_identity(identity: dict) -> dict:
    """The source's identity with each file's modification time replaced by a hash of its bytes:
    an edit that keeps the size and restores the time still changes the key, and a file
    only touched keeps its cache."""
    if "files" not in identity:
        return identity
    files = [[path, size, _checksum(Path(path))] for path, size, _mtime in identity["files"]]
    return {**identity, "files": files}


def data_fingerprint(meta: dict) -> dict:
    """What a run trained on: the cache's inputs (the source files' hashes among them) and its
    token files' checksums. Saved in checkpoints and the run folder, compared on resume and eval."""
    return {"key": meta["key"], "inputs": meta["inputs"], "validation_rule": meta["validation_rule"],
            **{split: {"tokens": meta[f"{split}_tokens"], "checksum": meta["checksums"][f"{split}.bin"]}
               for split in ("train", "validation")}}


def data_differences(saved: dict, current: dict) -> list[str]:
    """What differs between the data a run recorded (`saved`) and the data it would read now;
    nothing when the token files are the same (a new tokenizers version that encodes alike). The
    tokens decide: under one key the tokens can differ too (a hub dataset rebuilt after it changed
    upstream; a reading of the same bytes that changed). A fingerprint without checksums (saved
    before they were kept) is compared by its key."""
    checksums = [(saved.get(split, {}).get("checksum"), current.get(split, {}).get("checksum"))
                 for split in ("train", "validation")]
    if all(then is not None for then, _ in checksums):
        if all(then == now for then, now in checksums):
            return []
    elif saved.get("key") == current.get("key"):
        return []
    old_inputs, new_inputs = saved.get("inputs", {}), current.get("inputs", {})
    changes = _file_changes(old_inputs.get("source", {}), new_inputs.get("source", {}))
    changes += [f"{key} was {old_inputs.get(key)!r}, now {new_inputs.get(key)!r}"
                for key in sorted(set(old_inputs) | set(new_inputs))
                if key != "source" and old_inputs.get(key) != new_inputs.get(key)]
    splits = (("train", "the training tokens differ"), ("validation", "the validation split differs"))
    for (then, now), (split, what) in zip(checksums, splits):
        if then is not None and then != now:
            before, after = (fingerprint.get(split, {}).get("tokens") for fingerprint in (saved, current))
            before = counted(before, "token") if isinstance(before, int) else f"{before} tokens"
            after = f"{after:,}" if isinstance(after, int) else after
            changes.append(f"{what} ({before} then, {after} now)")
    return changes or ["the data's cache key differs"]


def _file_changes(old: dict, new: dict) -> list[str]:
    """'FILE changed', 'FILE added', 'FILE removed' between two sources' identities."""
    before = {entry[0]: entry[1:] for entry in old.get("files", [])}
    after = {entry[0]: entry[1:] for entry in new.get("files", [])}
    changes = [f"{path} changed" for path in before if path in after and before[path] != after[path]]
    changes += [f"{path} added" for path in after if path not in before]
    changes += [f"{path} removed" for path in before if path not in after]
    names = {"config": "dataset_config"}  # the identity's names for data.* settings
    changes += [f"data.{names.get(key, key)} was {old.get(key)!r}, now {new.get(key)!r}"
                for key in sorted(set(old) | set(new)) if key != "files" and old.get(key) != new.get(key)]
    return changes


def _tokenizer_slug(config: Config) -> str:
    kind = config.tokenizer.kind
    return f"bpe{config.tokenizer.vocab_size}" if kind == "bpe" else kind


def token_dtype(vocab_size: int) -> type:
    """The smallest unsigned integer type that holds every id of a vocabulary of `vocab_size`."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def write_tokens(documents: DocumentParts, tokenizer: Tokenizer, out, dtype, *, progress: bool = False,
                 desc: str = "tokenizing") -> tuple[int, int]:
    """Encode `documents` and append their ids to the binary file `out`, with the tokenizer's
    `<|endoftext|>` between documents. Returns (tokens written, documents).

    `documents` yields parts `(text, starts_document)` (`tinyattn.data.local_files.DocumentParts`). They are
    cut into pieces (`Tokenizer.text_pieces`) and encoded about a megabyte at a time, in
    parallel: memory grows with the longest part, never with the corpus. A tokenizer whose
    output changes where a text is cut (`Tokenizer.cuts_are_exact`; SentencePiece's, say) gets
    each document's parts joined back and encodes it whole: memory grows with the longest document.
    """
    eot = tokenizer.eot_id
    tokens = documents_seen = 0
    if not tokenizer.cuts_are_exact:
        documents = _whole_documents(documents)

    def batches() -> Iterator[list[tuple[str, bool]]]:
        batch: list[tuple[str, bool]] = []
        size = 0
        for text, starts in documents:
            for number, piece in enumerate(tokenizer.text_pieces(text)):
                batch.append((piece, starts and number == 0))  # (piece, starts a document)
                size += len(piece)
                if size >= ENCODE_BATCH_CHARS:
                    yield batch
                    batch, size = [], 0
        if batch:
            yield batch

    with tqdm(desc=desc, unit="tok", unit_scale=True, disable=not progress) as bar:
        for batch in batches():
            encoded = tokenizer.encode_batch([piece for piece, _ in batch])
            flat: list[int] = []
            for (_, starts_document), ids in zip(batch, encoded):
                if starts_document:
                    if documents_seen and eot is not None:
                        flat.append(eot)
                    documents_seen += 1
                flat.extend(ids)
            out.write(np.asarray(flat, dtype=dtype).tobytes())
            tokens += len(flat)
            bar.update(len(flat))
    return tokens, documents_seen


def _whole_documents(documents: DocumentParts) -> DocumentParts:
    """The same stream with each document's parts joined into one."""
    parts: list[str] = []
    starts = False
    for text, begins in documents:
        if begins and parts:
            yield "".join(parts), starts
            parts = []
        if not parts:
            starts = begins
        parts.append(text)
    if parts:
        yield "".join(parts), starts


def check_split_lengths(meta: dict, config: Config) -> None:
    needed = config.model.context_length + 1
    data = config.data
    if meta["train_tokens"] < needed:
        # held out by a fraction, the validation split takes what the training split could have had
        fraction = "" if data.validation_split else (
            f", a smaller data.validation_fraction (now {data.validation_fraction})")
        raise DataError(f"the training split has {counted(meta['train_tokens'], 'token')}, fewer than "
                        f"model.context_length + 1 = {needed}; use more text{fraction} or a smaller "
                        "model.context_length")
    if meta["validation_tokens"] < needed:
        if data.validation_split:
            more = f"a larger split than data.validation_split={data.validation_split!r}"
        else:
            more = f"a larger data.validation_fraction (now {data.validation_fraction})"
        raise DataError(f"the validation split has {counted(meta['validation_tokens'], 'token')}, fewer than "
                        f"model.context_length + 1 = {needed}; use {more} or a smaller "
                        "model.context_length")


class _Checksummed:
    """A binary file that hashes what is written to it."""

    def __init__(self, out):
        self.out = out
        self.digest = hashlib.blake2b()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.out.write(data)


def _chunks(path: Path) -> Iterator[bytes]:
    """The bytes of `path`, CHECK_CHUNK_BYTES at a time (a multiple of a token's size)."""
    with open(path, "rb") as f:
        while chunk := f.read(CHECK_CHUNK_BYTES):
            yield chunk


def _checksum(path: Path) -> str:
    digest = hashlib.blake2b()
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def _damage(folder: Path, meta: dict) -> Optional[str]:
    """What is wrong with the cache's files, or None: a checksum that differs from meta.json,
    or a token id the vocabulary does not have. Each file is read once."""
    dtype, vocab_size = np.dtype(meta["dtype"]), meta["vocab_size"]
    for split in ("train", "validation"):
        path = folder / f"{split}.bin"
        digest = hashlib.blake2b()
        largest = -1
        for chunk in _chunks(path):
            digest.update(chunk)
            largest = max(largest, int(np.frombuffer(chunk, dtype=dtype).max()))
        if digest.hexdigest() != meta["checksums"][path.name]:
            return f"{path} does not match its checksum in meta.json (changed after it was written)"
        if largest >= vocab_size:
            return f"{path} holds token id {largest}, outside the vocabulary of {vocab_size}"
    if _checksum(folder / "tokenizer.json") != meta["checksums"]["tokenizer.json"]:
        return f"{folder / 'tokenizer.json'} does not match its checksum in meta.json"
    return None
