"""Where a lab experiment puts what it measured: one folder with a table, a figure and TensorBoard.

`experiment_folder(out, name)` is the run folder (`<out>`, or a new `checkpoints/lab/<name>-<date>-<time>`);
`clear_earlier_lab` refuses an `--out` holding an earlier run of the lab (or removes it, with --force),
and `stopped_midway` says what a lab stopped by Ctrl-C left there and how to run it again
(`stopped_before_writing`, that it left nothing);
`refuse_own_settings` refuses a --set of what one of the lab's own options sets;
`save_report` writes the table as `<name>.txt` and prints it; `tensorboard_writer(folder, part)`
gives each trained model its own sub-folder, so `tensorboard --logdir <folder>` shows their
curves side by side; `machine_line` names what the numbers were measured on; `--threads` sets torch's
CPU threads; `command_started` is where a report's wall time of the command counts from.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import torch

from tinyattn.config import override_keys
from tinyattn.errors import TinyattnError
from tinyattn.system.cpu import cpu_name
from tinyattn.system.invocation import quoted
from tinyattn.system.storage import atomic_write, check_writable
from tinyattn.system.timing import process_age
from tinyattn.train.run_folder import unique_run_dir

DEFAULT_ROOT = "checkpoints/lab"


def command_started() -> float:
    """The `time.perf_counter()` reading of this process's start: a wall time of the command counted from
    it holds the interpreter's start-up and the imports, as the shell's `time` of the command does."""
    return time.perf_counter() - process_age()


def refuse_own_settings(lab: str, overrides: Iterable[str], own: dict[str, str]) -> None:
    """A --set of a setting the lab derives from an option of its own (`own`: key -> the option to give)
    refused in one line naming that option: the lab's other settings would describe another run. An
    option written with "{}" takes the value as given ("--steps {}"); one without, a value of its own
    ("--seconds": a step count is not one)."""
    overrides = list(overrides)
    for item, key in zip(overrides, override_keys(overrides)):
        if key in own and "=" in item:  # an item without one is load_config's to refuse
            option = own[key].format(item.split("=", 1)[1].strip())
            raise TinyattnError(f"--set {item}: lab {lab} sets {key} from {option.split()[0]}; "
                                f"give {option} instead")


def experiment_folder(out: Optional[str], name: str) -> Path:
    """`out` (made if missing), or a new `checkpoints/lab/<name>-<date>-<time>`."""
    return check_writable(out) if out else unique_run_dir(DEFAULT_ROOT, name)


def clear_earlier_lab(out: Union[str, Path, None], names: Iterable[str], force: bool) -> None:
    """Refuse an --out holding what a lab writes (`names`: its files, run and TensorBoard folders; an
    earlier run's, or a file of the user's by one of those names), before anything runs: a rerun's
    TensorBoard events beside the earlier ones would draw one curve from both. With --force remove
    them, and nothing else. No --out (a new folder) holds nothing."""
    if out is None:
        return
    earlier = earlier_outputs(out, names)
    if earlier and not force:
        listed = ", ".join(path.name for path in earlier)
        raise TinyattnError(f"{out} holds {listed}, which this lab writes; add --force to replace them "
                            "or choose another --out")
    for path in earlier:  # a link is removed, never what it points to
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def earlier_outputs(out: Union[str, Path], names: Iterable[str]) -> list[Path]:
    """The paths of `names` (a lab's files and run folders) that `out` holds: what a rerun into it
    needs --force for (an empty folder by such a name holds nothing a rerun could mix with)."""
    return [Path(out) / name for name in names if _holds_something(Path(out) / name)]


@contextmanager
def stopped_midway(lab: str, folder: Path, out: Optional[str], holds: str = "what it measured so far"
                   ) -> Iterator[None]:
    """Ctrl-C while the lab measures into `folder`: its last line says what the folder `holds` and that
    it has no table, and how to run the lab again (into that --out only with --force, which
    `clear_earlier_lab` asks for; without --out a new folder), where it said only "interrupted".
    The exit status stays a stop's, 130 (`cli.run_command`)."""
    try:
        yield
    except KeyboardInterrupt:
        again = (f"run it again with --out {quoted(folder)} --force to start over" if out is not None
                 else "run it again to start over in a new folder")
        raise KeyboardInterrupt(f"lab {lab} stopped before its table; {folder} holds {holds}; "
                                f"{again}") from None


@contextmanager
def stopped_before_writing(lab: str) -> Iterator[None]:
    """Ctrl-C (or SIGTERM) while a lab that writes its folder only at the end still measures: its last
    line says that nothing was written, where it said only "interrupted". The exit status stays 130."""
    try:
        yield
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"lab {lab} stopped before its table; nothing was written") from None


def _holds_something(path: Path) -> bool:
    """A file, or a folder that is not empty (an empty one has nothing a rerun could mix with)."""
    return any(path.iterdir()) if path.is_dir() else path.exists()


def save_report(folder: Path, name: str, text: str) -> Path:
    """Write the table to `<folder>/<name>.txt` and print it."""
    path = folder / f"{name}.txt"
    with atomic_write(path) as f:
        f.write((text.rstrip() + "\n").encode("utf-8"))
    print(text.rstrip(), flush=True)
    return path


def tensorboard_writer(folder: Path, part: str):
    """A SummaryWriter into `<folder>/<part>` (imported here: only training experiments need it)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(folder / part))


def add_threads(parser) -> None:
    """--threads: torch's CPU threads for the experiment."""
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core); on a "
                        "machine other jobs share, 1 avoids threads waiting on each other")


def use_threads(threads: Optional[int]) -> None:
    if threads is not None:
        if threads <= 0:
            raise TinyattnError(f"--threads {threads}: expected a positive integer")
        torch.set_num_threads(threads)


def machine_line(device: torch.device, precision: str) -> str:
    """One line naming the hardware: the CPU's model and cores (or the GPU), the precision, torch's threads."""
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{cpu_name()}, {os.cpu_count()} cores"
    return f"measured on {where}, {precision}, torch threads {torch.get_num_threads()}"
