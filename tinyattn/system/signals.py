"""How a command that is not training answers SIGTERM: as Ctrl-C does.

By default SIGTERM ends a process at once, with status 143 and nothing said; `tinyattn serve`
and `tinyattn generate` stop on it as on Ctrl-C (a KeyboardInterrupt), in one line. Training has
its own answer, a flag the loop checks after each step (`tinyattn.train.owners.StopRequest`).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


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
