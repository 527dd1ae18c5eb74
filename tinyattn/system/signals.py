"""How a command that is not training answers SIGTERM: as Ctrl-C does; native work that a
signal can interrupt; and a SIGTERM for a rank whose launcher is gone.

By default SIGTERM ends a process at once, with status 143 and nothing said; `tinyattn serve`
and `tinyattn generate` stop on it as on Ctrl-C (a KeyboardInterrupt), in one line. Training has
its own answer, a flag the loop checks after each step (`tinyattn.train.owners.StopRequest`).

Python runs a signal's handler in the main thread, between two bytecodes: while that thread is
inside native code that does not return to Python (a `tokenizers` BPE training, minutes on a
large corpus), Ctrl-C waits for it. `interruptible` runs such work in another thread, so the main
thread only waits, and a handler that raises stops the wait at once. The interpreter's exit still
waits for the work (asked to end early, where it can be): a thread inside native code when the
interpreter finalizes is ended in the middle of it (Python 3.11: a segmentation fault or "FATAL:
exception not rethrown", exit 139 or 134; how often is in docs/RELIABILITY.md).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
from contextlib import contextmanager, suppress
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # prctl's option: the signal this process gets when its parent ends (Linux)
EXIT_NOTE_AFTER = 1.0  # seconds the exit waits for interrupted work before it says so


@contextmanager
def sigterm_interrupts(message: str = "") -> Iterator[None]:
    """Inside the block SIGTERM raises KeyboardInterrupt(message), as Ctrl-C raises one; the handler
    before is put back after it. Only the main thread can set a handler; elsewhere the block runs
    as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt(message)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_when_the_parent_ends() -> None:
    """Ask the kernel for a SIGTERM when the process that started this one ends (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). For the ranks torchrun starts: they run in a
    session of their own, so when torchrun itself is killed (`kill -9`, the OOM killer) no signal
    reaches them, and they trained on unseen with no one to stop them. With this they stop as on any
    SIGTERM: at the step the ranks agree on, with a checkpoint and their line. Only under torchrun
    (`init_distributed`): a plain process, or ranks a user's own script started, that `nohup` keeps
    alive past the shell that started them, would be stopped when that shell ends."""
    if not sys.platform.startswith("linux"):
        return
    with suppress(OSError, AttributeError):  # no C library to ask: the ranks go on as before
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def interruptible(work: Callable[[], T], name: str, cancel: Optional[Callable[[], None]] = None) -> T:
    """work()'s result, computed in a daemon thread named `name` while the calling thread waits,
    so that a signal handler that raises (Ctrl-C's KeyboardInterrupt, a training run's stop before
    its first step) raises here at once, not when the work returns. An exception of work is raised
    here as it was raised there. After an interrupted wait `cancel()` (if given) asks the work to end
    early, and the work goes on in the background until it ends, its result dropped: not for work
    with effects. The interpreter's exit waits for it (`_wait_at_exit`), never finalizing under it.
    Outside the main thread, which gets no signals, work() runs in the caller's own thread."""
    if threading.current_thread() is not threading.main_thread():
        return work()
    outcome: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as e:  # handed to the waiting thread, which raises it
            outcome["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    # A signal's handler runs during this wait, and what it raises leaves from here. (Not
    # Thread.join: Python 3.11 takes a join interrupted so for the thread's end, and a later
    # join of the thread still running returns at once.)
    try:
        done.wait()
    except BaseException:
        atexit.register(_wait_at_exit, done, name)  # first: a cancel that fails must not skip it
        if cancel is not None:
            cancel()
        raise
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["result"]


def _wait_at_exit(done: threading.Event, name: str) -> None:
    """At exit, before the interpreter finalizes: the end of work an interrupt left running
    (`interruptible`), said after `EXIT_NOTE_AFTER` seconds (a BPE training still merges the text it
    read before it returns: seconds on a large corpus, docs/RELIABILITY.md). A signal meanwhile (a
    second Ctrl-C) ends the process at once, unfinalized."""
    try:
        if not done.wait(EXIT_NOTE_AFTER):
            with suppress(OSError, ValueError):  # a closed terminal: wait all the same
                print(f"note: waiting for the {name} to end before exiting (its native code first finishes "
                      "with the text it had read: seconds, longer on a large corpus); Ctrl-C again quits "
                      "at once", file=sys.stderr, flush=True)
            done.wait()
    except BaseException:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(130)
