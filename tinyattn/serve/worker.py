"""The one thread that runs the model: requests take turns on it, token by token.

torch modules are not safe to drive from several threads at once, and a small model on a
CPU gains nothing from trying, so every model call of the server happens on this thread.
A request becomes a `Job`: an iterator whose every `next()` is one turn on the model (for a
completion, `stream_samples`' generator: one token, or a few while text is held back for a
stop string). The worker keeps up to `max_active` jobs and gives each one turn in order, round
robin, so concurrent clients stream side by side at a share of the speed each, and a new
request waits at most one round for its first token instead of for whole generations; jobs
beyond `max_active` wait in arrival order, and beyond `max_waiting` a request is refused
(429). Each job decodes alone, with its own KV caches and generators, so its text is what
`generate()` gives for the same seed whatever else is being served.

What a job yields goes back to the event loop through an asyncio queue
(`loop.call_soon_threadsafe`). A job that is cancelled (its client went away) is closed
before its next turn: its generator's `finally` runs and its caches are freed; a waiting one
leaves the queue as soon as the worker next looks at it (a submit, /health, an admission). An `ApiError` a
turn raises is the job's answer, in one line (a completion whose KV caches cannot fit in the memory
free now: a 400 naming n, or a 503 for one sequence); any other exception is a bug: logged with its
traceback and answered with a 500.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import torch

from tinyattn.serve.schemas import ApiError

log = logging.getLogger("tinyattn.serve")

END = object()  # what a job's queue receives after its last item


class Job:
    """One request's work for the worker, and the queue its results come back on."""

    def __init__(self, steps: Iterator, loop: asyncio.AbstractEventLoop, name: str = ""):
        self.steps = steps
        self.loop = loop
        self.name = name
        self.results: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.turns = 0  # turns it had on the model
        self.first_turn: Optional[int] = None  # the worker's turn counter at its first and last turn
        self.last_turn: Optional[int] = None
        self.ended: Optional[str] = None  # "done", "cancelled" or "error", once it has ended

    def cancel(self) -> None:
        """Stop before the next turn (a no-op once it has ended)."""
        self.cancelled.set()

    def send(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.results.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            self.cancel()

    async def items(self) -> AsyncIterator[Any]:
        """What the job yields, as it comes; an exception raised in a turn is raised here."""
        while True:
            item = await self.results.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def one_call(function) -> Iterator[Any]:
    """A job of one turn: `function()` on the worker thread (the explorer's measurements)."""
    yield function()


@dataclass
class WorkerStats:
    turns: int = 0  # turns given, over every job
    jobs: int = 0  # jobs that ended
    cancelled: int = 0
    errors: int = 0
    most_active: int = 0  # the most jobs decoding at once so far
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=100))  # ended jobs


STOP_WAIT = 10.0  # seconds a shutdown waits for the model call in progress
STOP_NOTICE = 1.0  # seconds of that wait after which it is said, once, on stderr


class ModelWorker:
    """The thread every model call runs on; `submit` a Job, read its `items()`."""

    def __init__(self, *, max_active: int = 4, max_waiting: int = 64, warm_up: Optional[Callable] = None):
        self.max_active, self.max_waiting = max_active, max_waiting
        self.warm_up = warm_up  # run once on the thread before any job: the first model call is slow
        self.active: list[Job] = []
        self.waiting: collections.deque[Job] = collections.deque()
        self.stats = WorkerStats()
        self.changed = threading.Condition()
        self.stopping = False
        self.hurried = threading.Event()  # `hurry`: a forced exit waits for no model call
        self.thread = threading.Thread(target=self._run, name="tinyattn-model", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ends the thread after the turn in progress, waiting for it up to STOP_WAIT seconds; no longer
        once `hurry` is called, before or meanwhile (the thread is a daemon: the process ends without it)."""
        with self.changed:
            self.stopping = True
            self.changed.notify()
        started = time.monotonic()
        deadline, notice = started + STOP_WAIT, started + STOP_NOTICE
        while self.thread.is_alive() and not self.hurried.is_set() and time.monotonic() < deadline:
            self.thread.join(timeout=0.05)  # in slices: a signal's handler may call `hurry` meanwhile
            if notice is not None and time.monotonic() >= notice and self.thread.is_alive():
                notice = None  # a wait that long is a slow call (a compile's warm-up), not a turn's end
                left = deadline - time.monotonic()
                print(f"waiting for the model call in progress to end (at most {left:.0f} s more; "
                      "Ctrl-C again stops now)", file=sys.stderr, flush=True)

    def hurry(self) -> None:
        """A forced exit (a second Ctrl-C): `stop` waits no longer for a model call (a slow warm-up)."""
        self.hurried.set()

    def cancel_all(self) -> None:
        """Cancel every job, decoding or waiting: on shutdown, so that open streams end at once."""
        with self.changed:
            for job in self.active + list(self.waiting):
                job.cancel()
            self.changed.notify()

    def submit(self, job: Job) -> Job:
        with self.changed:
            self._drop_cancelled_waiting()
            if len(self.waiting) >= self.max_waiting:
                raise ApiError(f"the server is busy: {len(self.active)} requests decoding and "
                               f"{len(self.waiting)} waiting; try again shortly", status=429,
                               type="server_busy", code="too_many_requests")
            self.waiting.append(job)
            self.changed.notify()
        return job

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def load(self) -> dict:
        with self.changed:
            self._drop_cancelled_waiting()
            return {"active": len(self.active), "waiting": len(self.waiting), "completed": self.stats.jobs,
                    "cancelled": self.stats.cancelled, "turns": self.stats.turns}

    def _run(self) -> None:
        if self.warm_up is not None:
            try:
                with torch.inference_mode():
                    self.warm_up()
            except Exception:  # only a warm-up: the requests will show what is wrong
                log.exception("warming up the model failed")
        while self._admit():
            for job in list(self.active):
                self._turn(job)

    def _admit(self) -> bool:
        """Move waiting jobs into the active ones (blocking while there are none); False: stop."""
        with self.changed:
            while not (self.active or self.waiting or self.stopping):
                self.changed.wait()
            if self.stopping:
                for job in self.active + list(self.waiting):
                    job.send(END)
                return False
            self._drop_cancelled_waiting()
            while self.waiting and len(self.active) < self.max_active:
                self.active.append(self.waiting.popleft())
            self.stats.most_active = max(self.stats.most_active, len(self.active))
            return True

    def _drop_cancelled_waiting(self) -> None:
        """End the waiting jobs whose client went away (called holding the lock). Left in the queue until
        their turn, they counted in /health's waiting and held places that refused other clients (429)."""
        for job in [job for job in self.waiting if job.cancelled.is_set()]:
            self.waiting.remove(job)
            self._close(job, "cancelled")  # never started: closing it runs none of its code
            self._count_end(job, "cancelled")

    def _turn(self, job: Job) -> None:
        if job.cancelled.is_set():
            self._end(job, "cancelled")
            return
        try:
            with torch.inference_mode():  # the decoder sets it too; the explorer's calls need it
                item = next(job.steps)
        except StopIteration:
            self._end(job, "done")
            return
        except ApiError as e:  # the job's own answer (a completion's KV caches cannot fit: `app._samples`)
            job.send(e)
            self._end(job, "error")
            return
        except Exception as e:  # a bug, never a user's mistake (requests are checked before)
            log.exception("%s failed", job.name or "a request")
            job.send(ApiError(f"the server failed on this request: {type(e).__name__}: {e}", status=500,
                              type="server_error"))
            self._end(job, "error")
            return
        self.stats.turns += 1
        job.turns += 1
        job.last_turn = self.stats.turns
        job.first_turn = job.first_turn or job.last_turn
        job.send(item)

    def _end(self, job: Job, how: str) -> None:
        self._close(job, how)
        with self.changed:
            self.active.remove(job)
            self._count_end(job, how)

    @staticmethod
    def _close(job: Job, how: str) -> None:
        close = getattr(job.steps, "close", None)
        if close is not None:
            close()  # a generator's finally runs now, on this thread
        job.ended = how
        if how != "error":
            job.send(END)

    def _count_end(self, job: Job, how: str) -> None:
        self.stats.jobs += 1
        self.stats.cancelled += how == "cancelled"
        self.stats.errors += how == "error"
        self.stats.recent.append(job)
