"""A full disk where a run or an export writes what is not a checkpoint (train.log, TensorBoard's
events file, a GGUF file, a Hugging Face folder): one line naming the path, exit 2, and nothing
half-written left (docs/RELIABILITY.md)."""

import errno
from pathlib import Path

from tests.conftest import CORPUS, ROOT, local_corpus

TINY = ROOT / "configs" / "tiny.yaml"


def train_args(tmp_path: Path, out_dir: Path, *extra: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    sets = [*local_corpus(corpus, out_dir), f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=4",
            "train.eval_interval=2", "train.batch_size=4", "train.sample_tokens=0", "model.n_embd=16",
            "model.n_layer=1", *extra]
    return ["train", "--config", str(TINY), "--run-name", "r", "--no-progress",
            *[arg for item in sets for arg in ("--set", item)]]


def fill(disk: Path, pages_left: int = 0) -> None:
    """Take every free byte of `disk` but `pages_left` pages of 4 KiB."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        f.truncate(max(0, f.tell() - 4096 * pages_left))


def test_a_full_disk_at_config_yaml_is_its_one_line_not_train_logs_close(tmp_path, small_tmpfs, capsys):
    # train.log holds the first line unwritten (the disk took none of it); closing it must not
    # raise over the error that ends the run
    from tinyattn.cli.main import main

    fill(small_tmpfs, pages_left=1)  # the lock file's pid takes it
    code = main(train_args(tmp_path, small_tmpfs))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (f"error: cannot write {small_tmpfs / 'r' / 'config.yaml'}: No space left "
                                    "on device; free some space there or choose another folder")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]  # a failed start: no folder left
