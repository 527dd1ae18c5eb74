"""How a command that is not training answers SIGTERM: as Ctrl-C does; and native work that a
signal can interrupt.

By default SIGTERM ends a process at once, with status 143 and nothing said; `tinyattn serve`
and `tinyattn generate` stop on it as on Ctrl-C (a KeyboardInterrupt), in one line. Training has
its own answer, a flag the loop checks after each step (`tinyattn.train.owners.StopRequest`).

Python runs a signal's handler in the main thread, between two bytecodes: while that thread is
inside native code that does not return to Python (a `tokenizers` BPE training, minutes on a
large corpus), Ctrl-C waits for it. `interruptible` runs such work in another thread, so the main
thread only waits, and a handler that raises stops the wait at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


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


def interruptible(work: Callable[[], T], name: str) -> T:
    """work()'s result, computed in a daemon thread named `name` while the calling thread waits,
    so that a signal handler that raises (Ctrl-C's KeyboardInterrupt, a training run's stop before
    its first step) raises here at once, not when the work returns. An exception of work is raised
    here as it was raised there. After an interrupted wait the work goes on in the background until
    it ends, and its result is dropped: for a process about to exit, not for work with effects.
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
    done.wait()
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["result"]
