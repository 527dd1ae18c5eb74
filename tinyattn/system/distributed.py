"""Several processes: the process group torchrun describes, joined and left explicitly."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from tinyattn.errors import ConfigError, TinyattnError
from tinyattn.system.signals import sigterm_when_the_parent_ends


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # The tensors handed to the collectives (`rank0_value` and `largest_value`: one per device;
    # `mean_over_ranks`: one per device and length), kept until `shutdown_distributed` has seen
    # gloo's threads let go of them.
    handed: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_name: str) -> Distributed:
    """Join the process group torchrun describes in the environment; one process otherwise.

    NCCL on GPUs, gloo on the CPU. Each process on a GPU machine takes the GPU of its
    local rank.
    """
    if torch.distributed.is_torchelastic_launched():  # torchrun's worker(s), not a user's own launcher
        sigterm_when_the_parent_ends()  # torchrun killed: stop with a checkpoint, not train on unseen
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Any CUDA name: the loop trains each process on cuda:LOCAL_RANK whichever index was given.
    use_cuda = torch.cuda.is_available() and (device_name == "auto" or device_name.startswith("cuda"))
    if use_cuda:
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:  # more processes than GPUs: set_device would end in CUDA's traceback
            raise ConfigError(f"LOCAL_RANK={local_rank}: this machine has {gpus} CUDA device(s), one per "
                              f"process; start at most {gpus} processes a machine (torchrun "
                              f"--nproc_per_node={gpus}), or train on the CPU (--device cpu)")
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank, world_size, local_rank)


def rank0_value(dist: Distributed, value: int, device: torch.device) -> int:
    """Rank 0's `value` on every rank (so all of them step, evaluate and stop together)."""
    shared = _handed(dist, value, device)
    torch.distributed.broadcast(shared, src=0)
    return int(shared.item())


def largest_value(dist: Distributed, value: int, device: torch.device) -> int:
    """The largest of the ranks' `value`s, on every rank."""
    shared = _handed(dist, value, device)
    torch.distributed.all_reduce(shared, op=torch.distributed.ReduceOp.MAX)
    return int(shared.item())


def mean_over_ranks(dist: Distributed, values: torch.Tensor) -> torch.Tensor:
    """The ranks' mean of the 1-D `values`, element by element, on every rank (a new tensor)."""
    # one kept tensor per length: the log interval's, or less at an evaluation
    shared = _kept(dist, f"{values.device}:{values.numel()}", lambda: torch.empty_like(values))
    torch.distributed.all_reduce(shared.copy_(values), op=torch.distributed.ReduceOp.SUM)
    return shared / dist.world_size


def _handed(dist: Distributed, value: int, device: torch.device) -> torch.Tensor:
    return _kept(dist, str(device), lambda: torch.zeros(1, dtype=torch.long, device=device)).fill_(value)


def _kept(dist: Distributed, key: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The tensor `dist.handed` keeps under `key` for the collectives, made by `make` the first time."""
    if key not in dist.handed:
        dist.handed[key] = make()
    return dist.handed[key]


# gloo's words for a collective whose peer process has gone: its socket closed, or reset mid-write
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe")


def _peer_gone(error: RuntimeError) -> bool:
    return any(words in str(error).lower() for words in _PEER_GONE)


def leave_together(dist: Distributed) -> None:
    """After a run every rank ended alike (done, or stopped with its checkpoint): each waits here
    until rank 0 has written its last lines. torchrun ends the other ranks once one exits other
    than 0 (a stop's 130), so a rank that left first cut rank 0 off mid-line. A rank that failed
    meanwhile (its own error says why) ends the wait: the others have nothing to add to it."""
    if not dist.enabled:
        return
    try:
        torch.distributed.barrier()
    except RuntimeError as error:  # gloo's "Connection closed by peer" is a plain RuntimeError
        if not _peer_gone(error):
            raise


def shutdown_distributed(dist: Distributed, wait: float = 2.0) -> None:
    """Leave the process group, once gloo's worker threads have let go of the tensors handed to
    them (`wait` seconds at most). A worker that drops the last reference to a tensor made in
    Python takes the GIL to free it; at interpreter exit that thread is ended inside a C++
    destructor and the whole process aborts ("terminate called without an active exception",
    SIGABRT) after a run that ended well."""
    if not (dist.enabled and torch.distributed.is_initialized()):
        return
    deadline = time.monotonic() + wait
    while any(t._use_count() > 1 for t in dist.handed.values()) and time.monotonic() < deadline:
        time.sleep(0.001)
    torch.distributed.destroy_process_group()


class PeerGone(TinyattnError):
    """Another rank left the run alone (`departure_said`): every rank stops, each saying so.

    The process then ends at once, once its line is said (`tinyattn.cli.run_command`): the failed
    collective's work is freed by a gloo worker thread, which needs the GIL for the Python objects it
    holds, while freeing the DDP wrapper joins that thread holding the GIL: a deadlock that left the
    rank hung after its line, now and then under load, until torchrun killed it. Its files are
    closed by then; nothing else is left to do."""

    ends_the_process = True


@contextmanager
def departure_said(dist: Distributed, then: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Around a distributed run: a rank that left alone (a stop signal to it before the first step,
    which ends it at once; an error of its own, which it says) ends the collective the others wait
    in with gloo's "Connection closed by peer" RuntimeError. They printed its traceback (rank 0's
    cut off by torchrun's SIGTERM, its new run's folder left); here it is one line each, a
    TinyattnError, so a new run's folder goes as any failed start's. Not `shared`: the rank gone may
    be rank 0 (a kill, the OOM killer), and then the others' `rank N: error:` lines are the only
    ones. `then` is called first (the run's stop request stops listening for the SIGTERM torchrun
    sends next)."""
    try:
        yield
    except RuntimeError as error:
        if not (dist.enabled and _peer_gone(error)):
            raise
        then()
        raise PeerGone("another rank left the run (stopped or killed alone, or ended by an error it "
                       "printed; torchrun's summary gives its exit status); every rank stops") from None


@contextmanager
def refusal_shared(dist: Distributed) -> Iterator[None]:
    """Around what rank 0 does alone while the others wait for it (opening the run folder,
    building the token cache): its refusal (a TinyattnError) ends every rank, the others with its
    message (which the command prints on rank 0 only), where they saw gloo's "Connection closed by
    peer" traceback as rank 0 exited. Every rank enters it; one process: no collective."""
    if not dist.enabled:
        yield
        return
    refusal = None
    try:
        yield
    except TinyattnError as error:
        if not dist.is_main:
            raise
        refusal = error
    said = [None if refusal is None else str(refusal)]
    torch.distributed.broadcast_object_list(said, src=0)
    if refusal is not None:
        raise refusal
    if said[0] is not None:
        shared = TinyattnError(said[0])
        shared.shared = True  # rank 0 prints it (`cli.run_command`)
        raise shared


@contextmanager
def mistake_alike(dist: Distributed) -> Iterator[None]:
    """Around a check every rank makes alike and leaves together (the device, a resume's settings, a
    budget no step fits): a mistake every rank meets is said once, by rank 0 (`shared`), where each
    rank printed its copy; one that only some ranks meet ends the others too, naming those ranks,
    where the others went on alone into the next collective. One process: no collective."""
    if not dist.enabled:
        yield
        return
    mistake = None
    try:
        yield
    except TinyattnError as error:
        mistake = error
    met = [False] * dist.world_size
    torch.distributed.all_gather_object(met, mistake is not None)
    if mistake is not None:
        raise said_once(mistake, all(met))
    if any(met):
        ranks = ", ".join(str(rank) for rank, failed in enumerate(met) if failed)
        raise TinyattnError(f"rank {ranks} met a mistake the others did not (its 'rank N: error:' line says "
                            "which); every rank stops")


def said_once(mistake: TinyattnError, alike: bool) -> TinyattnError:
    """`mistake`, marked to be said by rank 0 alone (`shared`, `cli.run_command`) where `alike`:
    every rank of a distributed run meets it, from the same check of the same values."""
    mistake.shared = alike
    return mistake
