"""Measure data preparation: Tiny Shakespeare with a 4096-token BPE, then a large corpus.

    python -m benchmarks.data [--sizes-mb 25 100] [--shakespeare data/tinyshakespeare.txt]

1. Tiny Shakespeare through `prepare_data` with a freshly trained 4096-token byte-level BPE
   (reading, training, tokenizing both splits, writing the cache): target under 5 seconds.
2. Corpora of copies of Tiny Shakespeare (one ~1 MB .txt file per copy, in a temporary
   folder) through `prepare_data`, with the BPE from step 1 as a pretrained tokenizer and
   with the char tokenizer: tokens per second and peak resident memory. Each run is a fresh
   process, so its peak memory is its own; memory that stays flat as the corpus grows shows
   the corpus is streamed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import check_counts
from tinyattn.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def make_config(files: list[str], cache_dir: Path, tokenizer: dict):
    from tinyattn.config import config_from_dict

    return config_from_dict({"data": {"files": files, "cache_dir": str(cache_dir)}, "tokenizer": tokenizer})


def bench_shakespeare(path: Path, workdir: Path) -> dict:
    from tinyattn.config import TokenizerConfig
    from tinyattn.data.batches import prepare_data
    from tinyattn.data.tokenizer import build_tokenizer

    text = path.read_text(encoding="utf-8")
    start = time.perf_counter()
    training_text = text[:int(len(text) * 0.9)]
    built = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=4096), lambda: iter([training_text]))
    trained = time.perf_counter()
    built.encode(text)
    encoded = time.perf_counter()

    config = make_config([str(path)], workdir / "cache-shakespeare", {"kind": "bpe", "vocab_size": 4096})
    begin = time.perf_counter()
    result = prepare_data(config, progress=False)
    total = time.perf_counter() - begin
    begin = time.perf_counter()
    prepare_data(config, progress=False)
    reuse = time.perf_counter() - begin
    result.tokenizer.save(workdir / "bpe4096.json")
    return {"train_s": trained - start, "encode_s": encoded - trained, "prepare_s": total, "reuse_s": reuse,
            "tokens": len(result.train) + len(result.validation)}


def shakespeare_summary(s: dict) -> str:
    """bench_shakespeare's figures as one line (a .txt corpus: prepare_data imports no datasets)."""
    return (f"Tiny Shakespeare, 4096-token BPE: prepare_data {s['prepare_s']:.2f} s "
            f"({s['tokens']:,} tokens; cache reuse {s['reuse_s'] * 1000:.0f} ms); "
            f"alone: training {s['train_s']:.2f} s, encoding all {s['encode_s']:.2f} s")


def bench_corpus(folder: str, cache_dir: str, tokenizer: dict) -> dict:
    """Runs in a fresh process: ru_maxrss is then this run's peak alone."""
    from tinyattn.data.batches import prepare_data

    config = make_config([folder], Path(cache_dir), tokenizer)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    begin = time.perf_counter()
    result = prepare_data(config, progress=False)
    seconds = time.perf_counter() - begin
    tokens = len(result.train) + len(result.validation)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "tokens": tokens,
            "rss_after_imports_mb": before / 1024, "peak_rss_mb": peak / 1024}  # ru_maxrss is in KiB


def write_corpus(shakespeare: Path, folder: Path, size_mb: int) -> None:
    folder.mkdir(parents=True)
    data = shakespeare.read_bytes()
    copies = max(1, round(size_mb * 1e6 / len(data)))
    for i in range(copies):
        (folder / f"copy{i:04d}.txt").write_bytes(data)


DEFAULT_SHAKESPEARE = ROOT / "data" / "tinyshakespeare.txt"


def check_shakespeare(path: Path) -> None:
    """The default file is copied from ../shared/data when missing (as CI does); a path the user
    gave must be a file already: a typo is refused, not filled with another file's text."""
    shared = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    if path == DEFAULT_SHAKESPEARE and not path.exists() and shared.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared, path)
    if path.is_dir():
        raise ConfigError(f"--shakespeare {path}: a folder; expected Tiny Shakespeare's text file")
    if not path.is_file():
        raise ConfigError(f"--shakespeare {path}: no such file; expected Tiny Shakespeare's text file "
                          f"(the default, {DEFAULT_SHAKESPEARE}, is copied from {shared} when that exists)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shakespeare", type=Path, default=DEFAULT_SHAKESPEARE)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[25, 100])
    args = parser.parse_args()
    check_counts(args, {"sizes_mb": (1, "each corpus is whole copies of a file of about 1 MB")})
    check_shakespeare(args.shakespeare)

    from tinyattn.system.cpu import cpu_name

    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores")
    with tempfile.TemporaryDirectory(prefix="bench_data_") as temp:
        workdir = Path(temp)
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            s = pool.submit(bench_shakespeare, args.shakespeare, workdir).result()
        print(shakespeare_summary(s))

        runs = [(size, "bpe4096 (pretrained)", {"kind": "pretrained", "path": str(workdir / "bpe4096.json")})
                for size in args.sizes_mb]
        runs.append((max(args.sizes_mb), "char", {"kind": "char"}))
        for size, name, tokenizer in runs:
            folder = workdir / f"corpus{size}"
            if not folder.exists():
                write_corpus(args.shakespeare, folder, size)
            size_bytes = sum(p.stat().st_size for p in folder.iterdir())
            cache = workdir / f"cache-{size}-{tokenizer['kind']}"
            # A fresh process per run, so each peak memory figure belongs to that run alone.
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                r = pool.submit(bench_corpus, str(folder), str(cache), tokenizer).result()
            shutil.rmtree(cache)
            print(f"{size_bytes / 1e6:.0f} MB corpus, {name}: {r['seconds']:.1f} s, {r['tokens']:,} tokens, "
                  f"{r['tokens'] / r['seconds'] / 1e6:.2f} M tokens/s, "
                  f"{size_bytes / r['seconds'] / 1e6:.1f} MB/s; "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB (after imports {r['rss_after_imports_mb']:.0f} MB)")


if __name__ == "__main__":
    from tinyattn.cli import run_command

    raise SystemExit(run_command(main))
