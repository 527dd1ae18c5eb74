"""Where a lab experiment puts what it measured: one folder with a table, a figure and TensorBoard.

`experiment_folder(out, name)` is the run folder (`<out>`, or a new `checkpoints/lab/<name>-<date>-<time>`);
`save_report` writes the table as `<name>.txt` and prints it; `tensorboard_writer(folder, part)`
gives each trained model its own sub-folder, so `tensorboard --logdir <folder>` shows their
curves side by side; `machine_line` names what the numbers were measured on; `--threads` sets torch's CPU threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from tinyattn.errors import TinyattnError
from tinyattn.system.cpu import cpu_name
from tinyattn.system.storage import atomic_write, check_writable
from tinyattn.train.run_folder import unique_run_dir

DEFAULT_ROOT = "checkpoints/lab"


def experiment_folder(out: Optional[str], name: str) -> Path:
    """`out` (made if missing), or a new `checkpoints/lab/<name>-<date>-<time>`."""
    return check_writable(out) if out else unique_run_dir(DEFAULT_ROOT, name)


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
