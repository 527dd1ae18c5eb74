"""Command-line faces: each module parses its command's arguments and calls into the library.

What a command computes is in the library; a module here adds only what a terminal needs
(reading prompts from stdin or interactively, streaming text as it comes, printing tables).

`tinyattn <name>` (`main.py`, also `python -m tinyattn`), `scripts/<name>.py` and the old
console scripts (`tinyattn-train`, ..., aliases for one release) all call
`tinyattn.cli.<name>.main`; the options several commands share are in `options.py`.
`run_command` is the one place user mistakes become a single line on stderr and exit
status 2 instead of a traceback (under torchrun, rank 0's line only: every rank ends alike).
"""

from __future__ import annotations

import atexit
import errno
import functools
import gc
import os
import signal
import sys
import time
import warnings
from contextlib import contextmanager, suppress
from typing import Callable, Iterator

from tinyattn.errors import StorageError, TinyattnError

RANK_0_LINE_WAIT = 10.0  # seconds a rank with nothing to say waits for torchrun to end it


def run_command(command: Callable[[], int | None]) -> int:
    """Run `command`; a TinyattnError prints `error: <message>` and returns 2."""
    _end_without_a_final_collection()
    try:
        return command() or 0
    except TinyattnError as e:
        _error_line(e)
        # distributed.PeerGone: leaving would hang. Only in a process torchrun started: an in-process
        # caller (a test faking a second rank) unwinds as usual.
        if getattr(e, "ends_the_process", False) and os.environ.get("WORLD_SIZE", "1") != "1":
            _exit_now(2)
        if getattr(e, "shared", False):
            _let_rank_0_say_it(e)
        return 2
    except KeyboardInterrupt as e:
        _last_line(str(e) or "interrupted")  # a training stopped before its first step says so
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other command-line tools do.
        point_at_null(sys.stdout)
        return 141
    except OSError as e:  # after BrokenPipeError, one of its kind
        if e.errno != errno.ENAMETOOLONG:
            raise
        # A path given with a part over 255 bytes fails wherever it is first looked at.
        _last_line(f"error: {e.filename}: {e.strerror}; a name may have at most 255 bytes")
        return 2


def _let_rank_0_say_it(error: TinyattnError) -> None:
    """A rank of torchrun's other than rank 0 that ends on a mistake every rank met, which rank 0
    alone says (`shared`), waits here for torchrun to end it, which it does once rank 0 has said the
    line and exited. Ending first, it made torchrun send rank 0 its SIGTERM, sometimes before the
    line: `--set train.max_steps=null` under torchrun ended without a word in 1 of 6 tries. At most
    RANK_0_LINE_WAIT seconds; torchrun's SIGTERM ends the wait at once. (Not after a stop: torchrun
    stopping its workers sends its signal once and waits for them. Nor on a machine other than rank
    0's, GROUP_RANK not 0: its torchrun never sees rank 0 exit, and the wait only delayed its end.
    Nor where the rank had its stop signal before the error, `stop_seen`: torchrun sends no other.)
    torchrun stopping on Ctrl-C passes on SIGINT: it ends the wait too, without a traceback."""
    if _rank() == "0" or "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("GROUP_RANK", "0") != "0":
        return
    if getattr(error, "stop_seen", False):
        return
    with suppress(ValueError):  # not the main thread: no handler to set
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a stop's handler may have left it ignored
    with suppress(KeyboardInterrupt):
        time.sleep(RANK_0_LINE_WAIT)


def _exit_now(code: int) -> None:
    """End the process with `code` here, without unwinding the frames or finalizing the interpreter."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code)


def point_at_null(stream) -> None:
    """Point a failed output stream (a closed pipe, a full disk) at the null device, so the text still
    in its buffer does not fail again, with Python's "Exception ignored" lines, when it is flushed at
    exit. A stream without a descriptor (a StringIO) is left as it is."""
    with suppress(AttributeError, OSError, ValueError):
        descriptor = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, descriptor)
        os.close(null)


def write_text(text: str, stream) -> None:
    """Write a text the command prints itself (a usage, a help) and flush it at once, so a stream
    that cannot take it fails here (buffered, a write alone goes into the buffer and fails only in
    the interpreter's flush at exit: "Exception ignored", status 120). A closed pipe raises its
    BrokenPipeError (`run_command` ends quietly), any other failure (a full disk, an I/O error)
    a StorageError naming the stream; either way the stream is pointed at the null device first.
    A stream the process was started without (`>&-`: Python's sys.stdout is None) takes nothing, as
    print() and argparse write nothing there."""
    if stream is None:
        return
    try:
        stream.write(text)
        stream.flush()
    except OSError as e:
        point_at_null(stream)
        if isinstance(e, BrokenPipeError):
            raise
        name = "standard error" if stream is sys.stderr else "standard output"
        raise StorageError(f"cannot write to {name}: {e.strerror or e}") from None


def _error_line(error: TinyattnError) -> None:
    """`error: <message>`. Under torchrun an error every rank shares (rank 0's refusal passed on,
    `distributed.refusal_shared`, which marks it `shared`) is printed by rank 0 alone; one a rank
    met by itself (its GPU's free memory) by that rank, named, where it would
    otherwise be seen nowhere (train.log is rank 0's)."""
    rank = _rank()
    if rank == "0" or getattr(error, "shared", False):
        _last_line(f"error: {error}")
    else:
        _to_stderr(f"rank {rank}: error: {error}")


def _last_line(line: str) -> None:
    """The line a command ends with. Under torchrun every rank ends with the same one (each saw
    the same mistake or stop): rank 0 alone prints it (RANK, torchrun's; the exit status stays
    every rank's), rather than one copy per process."""
    if _rank() == "0":
        _to_stderr(line)


def _rank() -> str:
    """This process's rank under torchrun (its RANK), "0" for a plain process."""
    return os.environ.get("RANK", "0")


def _to_stderr(line: str) -> None:
    """A last line for the console, which may be gone (a closed terminal): then it is dropped."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


@contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Inside the block a warning prints as one `warning: <message>` line on stderr, as the
    commands' own warnings do, without Python's file-and-line header and source line."""
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        yield


def _show_warning(message, *args, **kwargs) -> None:
    """warnings.showwarning's replacement (the other arguments unused)."""
    _to_stderr(f"warning: {message}")


@functools.cache  # registered once per process, however many commands it runs
def _end_without_a_final_collection() -> None:
    """At exit, freeze what is still alive (`gc.freeze`), so the teardown skips collecting it.

    The interpreter's teardown otherwise walks the millions of objects importing torch
    leaves behind, which took longer than a small training run (docs/BENCHMARKS.md,
    "Start-up"). Nothing relies on the collector at exit: files, writers and process groups
    are closed where they are used.
    """
    atexit.register(gc.freeze)
