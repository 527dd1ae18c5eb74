"""runtime: device names checked by one rule, the precision each device gets, seeds and random states
restored whole, the peak measurement leaves the random state alone."""

import contextlib
import io
import random
import re
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tinyattn.config import config_from_dict
from tinyattn.errors import ConfigError
from tinyattn.system.device import Precision, measure_peak_flops, select_device, select_precision
from tinyattn.system.seeding import rank_seed, random_states, seed_everything, set_random_states

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU"])
def test_a_bad_device_name_is_refused_alike_by_select_device_and_the_config(name):
    accepted = "expected auto, cpu, cuda, cuda:N or mps"
    with pytest.raises(ConfigError, match=re.escape(f"device {name!r} is not accepted; {accepted}")):
        select_device(name)
    with pytest.raises(ConfigError, match=re.escape(f"train.device: {name!r} is not accepted; {accepted}")):
        config_from_dict({"data": {"files": ["corpus.txt"]}, "train": {"device": name}})


def auto_device() -> torch.device:
    """What "auto" means: CUDA if present, then Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


@pytest.mark.parametrize("name", ["auto", "cpu", "mps", "cuda", "cuda:0", "cuda:12"])
def test_good_device_names_are_accepted(name):
    config = config_from_dict({"data": {"files": ["corpus.txt"]}, "train": {"device": name}})
    assert config.train.device == name  # kept as written: select_device resolves it when the run starts
    expected = auto_device() if name == "auto" else torch.device(name)
    if name == "mps":
        here = torch.backends.mps.is_available()
    elif name.startswith("cuda"):
        here = torch.cuda.is_available() and int(name.partition(":")[2] or 0) < torch.cuda.device_count()
    else:
        here = True  # auto and cpu: on every machine
    if here:
        assert select_device(name) == expected
    else:  # a device this machine lacks: refused as missing, not as a bad name
        with pytest.raises(ConfigError, match=re.escape(f"device {name!r} was asked for but")):
            select_device(name)


def test_a_cuda_index_past_the_machines_gpus_is_refused_naming_how_many_it_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert select_device("cuda:1") == torch.device("cuda:1")
    refused = "device 'cuda:2' was asked for but this machine has 2 CUDA device(s)"
    with pytest.raises(ConfigError, match=re.escape(refused)):
        select_device("cuda:2")


def test_each_precision_autocasts_to_its_dtype_and_only_fp16_scales_the_loss(monkeypatch):
    assert select_precision("fp32", CPU) == Precision("fp32", None, use_grad_scaler=False)
    assert select_precision("bf16", CPU) == Precision("bf16", torch.bfloat16, use_grad_scaler=False)
    gpu = torch.device("cuda")
    assert select_precision("fp16", gpu) == Precision("fp16", torch.float16, use_grad_scaler=True)
    with pytest.raises(ConfigError, match=r"^precision 'fp16' is not supported on the CPU; use bf16 or fp32"):
        select_precision("fp16", CPU)
    # auto on a GPU: bf16 where it has bf16, else fp16 with its gradient scaler
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert select_precision("auto", gpu).name == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert select_precision("auto", gpu) == Precision("fp16", torch.float16, use_grad_scaler=True)
    # auto on any other device (Apple MPS): plain fp32, no autocast
    assert select_precision("auto", torch.device("mps")) == Precision("fp32", None, use_grad_scaler=False)


def test_the_bf16_context_computes_in_bf16_and_the_fp32_one_in_fp32():
    a = torch.randn(4, 4)
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        with select_precision(name, CPU).autocast(CPU):
            assert (a @ a).dtype == dtype, name


def draws() -> tuple[float, float, float, float]:
    """One number from each global generator: Python's, numpy's and torch's (numpy's normal
    draws in pairs and keeps the second for the next call: an odd count leaves one kept)."""
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(1).item()


def test_seed_everything_seeds_python_numpy_and_torch():
    seed_everything(5)
    first = draws()
    draws()
    seed_everything(5)
    assert draws() == first
    seed_everything(6)
    assert all(a != b for a, b in zip(draws(), first))


def test_training_in_fp16_on_the_cpu_is_refused_naming_train_precision(shakespeare_head, tmp_path):
    from tests.conftest import local_corpus
    from tinyattn.config import load_config
    from tinyattn.train.loop import train

    items = [*local_corpus(shakespeare_head, tmp_path), "train.precision=fp16", "train.device=cpu"]
    config = load_config(Path(__file__).parents[1] / "configs" / "tiny.yaml", items)
    refused = r"^train\.precision 'fp16' is not supported on the CPU; use bf16 or fp32$"
    with pytest.raises(ConfigError, match=refused):
        train(config, run_name="fp16", progress=False)
    assert not (tmp_path / "fp16").exists()


def test_random_states_kept_in_a_checkpoint_put_every_generator_back():
    seed_everything(7)
    draws()  # numpy now holds a normal draw for its next call: the state must carry it
    buffer = io.BytesIO()
    torch.save(random_states(), buffer)  # as a checkpoint keeps them: loaded back with weights_only
    expected = [draws() for _ in range(3)]
    buffer.seek(0)
    set_random_states(torch.load(buffer, weights_only=True))
    assert [draws() for _ in range(3)] == expected


def test_pythons_random_state_is_kept_as_one_tensor_not_625_pickled_numbers():
    """Pickled as a tuple, the Mersenne Twister's words were most of a small checkpoint's save and
    load time (docs/BENCHMARKS.md "The suite's time")."""
    python = random_states()["python"]
    assert isinstance(python["keys"], torch.Tensor) and python["keys"].shape == (625,)


def test_a_checkpoint_that_kept_pythons_random_state_as_a_tuple_still_puts_it_back():
    """Checkpoints written before 2026-12-07 kept random.getstate() as it is."""
    seed_everything(8)
    states = random_states()
    states["python"] = random.getstate()
    buffer = io.BytesIO()
    torch.save(states, buffer)
    expected = [draws() for _ in range(3)]
    buffer.seek(0)
    set_random_states(torch.load(buffer, weights_only=True))
    assert [draws() for _ in range(3)] == expected


def test_the_main_process_is_global_rank_0_not_each_nodes_first():
    """Only one process of a multi-node run writes the run folder: rank 0, not every node's local rank 0."""
    from tinyattn.system.distributed import Distributed

    assert Distributed(rank=0, world_size=8, local_rank=0).is_main
    assert not Distributed(rank=4, world_size=8, local_rank=0).is_main  # the second node's first process
    assert not Distributed().enabled and Distributed(rank=1, world_size=2, local_rank=1).enabled


@pytest.mark.parametrize("name", ["auto", "cuda", "cuda:0"])
def test_a_torchrun_process_on_a_gpu_joins_over_nccl_and_takes_the_gpu_of_its_local_rank(monkeypatch, name):
    """train.loop trains a torchrun process on cuda:LOCAL_RANK whichever CUDA device it names: the
    process group must be NCCL's and the current GPU its own (gloo stays for the CPU)."""
    from tinyattn.system import distributed

    joined, current = [], []
    for key, value in (("WORLD_SIZE", "4"), ("RANK", "3"), ("LOCAL_RANK", "1")):  # node 2's second process
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the node's two GPUs
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: joined.append(backend))
    assert distributed.init_distributed(name) == distributed.Distributed(rank=3, world_size=4, local_rank=1)
    assert joined == ["nccl"] and current == [1]
    assert distributed.init_distributed("cpu").enabled and joined[-1] == "gloo"


def test_a_torchrun_process_without_a_gpu_of_its_own_is_refused_in_one_line(monkeypatch):
    """torchrun --nproc_per_node=4 (the README's line) on a 2-GPU machine: LOCAL_RANK 2 and 3 have no
    GPU, and torch.cuda.set_device(2) ended in a traceback ("invalid device ordinal")."""
    from tinyattn.errors import ConfigError
    from tinyattn.system import distributed

    current = []
    for key, value in (("WORLD_SIZE", "4"), ("RANK", "2"), ("LOCAL_RANK", "2")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: None)
    refusal = ("LOCAL_RANK=2: this machine has 2 CUDA device(s), one per process; start at most 2 "
               "processes a machine (torchrun --nproc_per_node=2), or train on the CPU (--device cpu)")
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        distributed.init_distributed("auto")
    assert current == []


@pytest.mark.parametrize("world_size", ["2", "4"])
def test_a_torchrun_process_on_the_cpu_joins_over_gloo_from_two_processes_on(monkeypatch, world_size):
    from tinyattn.system import distributed

    joined = []
    for key, value in (("WORLD_SIZE", world_size), ("RANK", "1")):  # LOCAL_RANK unset: a node's rank 0
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: joined.append(backend))
    dist = distributed.init_distributed("cpu")
    assert dist == distributed.Distributed(rank=1, world_size=int(world_size), local_rank=0)
    assert joined == ["gloo"]


def test_shutdown_leaves_the_process_group_of_a_distributed_run_only(monkeypatch):
    from tinyattn.system import distributed

    left = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: left.append(True))
    distributed.shutdown_distributed(distributed.Distributed())
    assert left == []
    distributed.shutdown_distributed(distributed.Distributed(rank=1, world_size=2, local_rank=1))
    assert left == [True]


def test_leaving_waits_until_gloos_threads_let_go_of_the_tensors_the_ranks_agreed_through(monkeypatch):
    """A gloo worker thread that drops the last reference to a tensor made in Python takes the GIL to
    free it; at interpreter exit that aborted the process ("terminate called without an active
    exception", SIGABRT) after a stop whose checkpoint was saved. So the ranks agree through one kept
    tensor per device, and leaving waits until gloo holds it no more: a bounded wait (a hung
    worker) leaves all the same."""
    import time

    from tinyattn.system import distributed

    handed = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op: handed.append(tensor))
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: handed.append(tensor))
    dist = distributed.Distributed(rank=1, world_size=2, local_rank=1)
    assert distributed.largest_value(dist, 15, CPU) == 15 and distributed.rank0_value(dist, 1, CPU) == 1
    assert handed[0] is handed[1] is dist.handed["cpu"]  # one tensor, which the process keeps

    class HeldByGloo:  # its worker thread lets go after the third look
        looks = 0

        def _use_count(self):
            self.looks += 1
            return 2 if self.looks <= 3 else 1

    left = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: left.append(held.looks))
    dist.handed["cpu"] = held = HeldByGloo()
    distributed.shutdown_distributed(dist)
    assert left == [4]
    held.looks, held._use_count = 0, lambda: 2  # never let go
    started = time.monotonic()
    distributed.shutdown_distributed(dist, wait=0.05)
    assert len(left) == 2 and time.monotonic() - started < 1


def test_every_collective_a_run_agrees_through_hands_over_the_tensor_the_process_keeps(monkeypatch):
    """The tensor of the stopped run's abort was the stop's (`SharedStop`), made for its one
    call: the stop, the time plan's count (`plan_for`) and the calibration's choice to measure on
    hand over `Distributed.handed`'s, which `shutdown_distributed` waits on."""
    from types import SimpleNamespace

    from tinyattn.system.distributed import Distributed
    from tinyattn.train import budget
    from tinyattn.train.owners import SharedStop, StopRequest

    handed = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op: handed.append(tensor))
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: handed.append(tensor))
    dist = Distributed(rank=1, world_size=2, local_rank=1)
    assert SharedStop(StopRequest(), dist, CPU).agreed(reading=True) is None
    config = config_from_dict({"data": {"files": "corpus.txt"}, "train": {"time_budget": "100s"}}).train
    plan = budget.plan_for(config, None, lambda: 0.0, dist=dist, device=CPU)
    assert plan.share(7) == 7
    calibration = budget.Calibration(SimpleNamespace(text=None), lambda: 0.0, None)
    assert calibration._keep_measuring(SimpleNamespace(dist=dist, device=CPU), 1, 0.0, 1.0)
    assert len(handed) == 3 and all(tensor is dist.handed["cpu"] for tensor in handed)


def test_the_ranks_of_a_finished_run_leave_together_and_a_rank_that_failed_ends_the_wait(monkeypatch):
    """torchrun ends every rank once one exits other than 0 (a stop's 130): a rank that left first cut
    rank 0 off while it wrote its last lines. A peer that failed meanwhile ends the wait in gloo's
    plain RuntimeError, which its own error already explains: no second traceback."""
    from tinyattn.system import distributed

    waited = []

    def barrier():
        waited.append(True)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:13724")

    monkeypatch.setattr(torch.distributed, "barrier", barrier)
    distributed.leave_together(distributed.Distributed())
    assert waited == []  # one process: no one to wait for
    distributed.leave_together(distributed.Distributed(rank=1, world_size=2, local_rank=1))
    assert waited == [True]


def test_a_failure_at_the_leaving_barrier_other_than_a_peer_gone_keeps_its_traceback(monkeypatch):
    """Only gloo's words for a peer gone end the wait quietly: any other error there (a bug's, a
    timeout's) is raised, not taken for a rank that failed and said so."""
    from tinyattn.system import distributed

    def barrier():
        raise RuntimeError("[Rank 1] Watchdog caught collective operation timeout")

    monkeypatch.setattr(torch.distributed, "barrier", barrier)
    with pytest.raises(RuntimeError, match="Watchdog caught collective operation timeout"):
        distributed.leave_together(distributed.Distributed(rank=1, world_size=2, local_rank=1))


def test_train_leaves_together_after_a_run_that_ended_alike_and_not_after_a_failure(monkeypatch):
    from tinyattn.system.distributed import Distributed
    from tinyattn.train import loop

    said = []
    done = SimpleNamespace(interrupted=False)
    monkeypatch.setattr(loop, "init_distributed", lambda device: Distributed(rank=0, world_size=2))
    monkeypatch.setattr(loop, "leave_together", lambda dist: said.append("leave"))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: said.append("shutdown"))
    monkeypatch.setattr(loop, "_train", lambda config, request, dist, stopper: said.append("run") or done)
    config = config_from_dict({"data": {"files": "corpus.txt"}})
    assert loop.train(config) is done and said == ["run", "leave", "shutdown"]

    def failing(config, request, dist, stopper):
        raise RuntimeError("a step failed")

    said.clear()
    monkeypatch.setattr(loop, "_train", failing)
    with pytest.raises(RuntimeError, match="a step failed"):
        loop.train(config)
    assert said == ["shutdown"]


@pytest.mark.parametrize("ranks", [2, 1])
def test_a_distributed_run_that_stopped_ignores_the_sigterm_that_follows_the_first_ranks_exit(
        monkeypatch, ranks):
    """Each rank of a stopped run exits 130; torchrun then sends SIGTERM to the ranks left, and one still
    ending (its checkpoint saved, its line said) died of it: exit -15. Not while the ranks wait for each
    other (no rank has exited yet: a rank stuck there still ends by a signal). One process keeps its
    handlers."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train import loop

    stopped, at_the_barrier = SimpleNamespace(interrupted=True), []
    monkeypatch.setattr(loop, "init_distributed", lambda device: Distributed(rank=0, world_size=ranks))
    monkeypatch.setattr(loop, "leave_together", lambda dist: at_the_barrier.append(
        signal.getsignal(signal.SIGTERM)))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: None)
    monkeypatch.setattr(loop, "_train", lambda config, request, dist, stopper: stopped)
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, signal.SIG_DFL) for sig in stops}
    try:
        assert loop.train(config_from_dict({"data": {"files": "corpus.txt"}})) is stopped
        after = [signal.getsignal(sig) for sig in stops]
    finally:  # this process's own handlers again: the tests after it start processes that inherit them
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert at_the_barrier == [signal.SIG_DFL]
    assert after == [signal.SIG_IGN if ranks > 1 else signal.SIG_DFL] * len(stops)


def test_only_a_peer_gone_from_a_distributed_run_becomes_each_ranks_one_line():
    """departure_said: gloo's words for a peer that closed or reset its connection, under DDP; any other
    RuntimeError (a bug's, or one process's) keeps its traceback."""
    from tinyattn.errors import TinyattnError
    from tinyattn.system.distributed import Distributed, departure_said

    ranks = Distributed(rank=1, world_size=2, local_rank=1)
    for gone in ["[pair.cc:553] Connection closed by peer [127.0.0.1]:13724",
                 "[pair.cc:598] Read error [127.0.0.1]:5: Connection reset by peer"]:
        told = []
        with pytest.raises(TinyattnError, match="^another rank left the run") as raised:
            with departure_said(ranks, then=lambda: told.append(True)):
                raise RuntimeError(gone)
        # not shared: rank 0 may be the one gone, and then this rank's line is the only one
        assert not getattr(raised.value, "shared", False)
        assert raised.value.__cause__ is None and told == [True]
    for dist, message in [(ranks, "mat1 and mat2 shapes cannot be multiplied"),
                          (Distributed(), "[pair.cc:553] Connection closed by peer")]:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            with departure_said(dist):
                raise RuntimeError(message)


def test_auto_takes_cuda_first_then_mps_then_the_cpu(monkeypatch):
    from tinyattn.system.device import select_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert select_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert select_device("auto") == torch.device("cpu")


def test_peak_flops_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    assert measure_peak_flops(CPU, select_precision("fp32", CPU), size=512) > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_peak_flops_on_the_cpu_stops_its_ladder_at_2048_so_cpu_mfu_figures_stay_comparable(monkeypatch):
    from tinyattn.system import device

    # Every matmul "takes" 1 ms: no size is slow enough to stop the ladder, so it climbs to its limit,
    # and the FLOP/s returned give away the size it measured there (2 n^3 / 1 ms).
    monkeypatch.setattr(device, "call_times", lambda fn, n, warmup, device: [1e-3] * n)
    monkeypatch.setattr(device, "seconds_of", lambda fn, device: 1e-3)
    flops = measure_peak_flops(CPU, select_precision("fp32", CPU))
    assert flops == 2 * 2048 ** 3 / 1e-3


def test_peak_flops_stop_at_the_first_slow_size_and_take_the_best_of_its_repeats(monkeypatch):
    from tinyattn.system import device

    sizes = []

    def call_times(fn, n, warmup, device):  # the ladder's first call at each size
        sizes.append(fn().shape[0])
        if not warmup:  # the call that picks the kernels (a GPU's first call sets up cuBLAS) is slow
            return [0.1]  # at any size: timing it stopped the ladder at 256, far under the peak
        return [0.1 if sizes[-1] >= 512 else 1e-3]  # 512 is the first size over PEAK_CALL_SECONDS

    repeats = iter([0.08, 0.06])
    monkeypatch.setattr(device, "call_times", call_times)
    monkeypatch.setattr(device, "seconds_of", lambda fn, device: next(repeats))
    flops = measure_peak_flops(CPU, select_precision("fp32", CPU))
    assert sizes == [256, 384, 512]
    # Times 0.1, then 0.08: one more call (0.18 + 0.08) would pass PEAK_FINAL_SECONDS (0.25).
    assert flops == 2 * 512 ** 3 / 0.08


def test_peak_flops_multiply_in_the_training_precision(monkeypatch):
    # The MFU denominator: a bf16 run's peak is its bf16 matmuls', not fp32's (several times slower on a GPU)
    from tinyattn.system import device

    dtypes = set()

    def call_times(fn, n, warmup, device):
        dtypes.add(fn().dtype)
        return [1e-3] * n

    monkeypatch.setattr(device, "call_times", call_times)
    monkeypatch.setattr(device, "seconds_of", lambda fn, device: dtypes.add(fn().dtype) or 1e-3)
    measure_peak_flops(CPU, select_precision("bf16", CPU), size=256)
    assert dtypes == {torch.bfloat16}


def test_a_precision_name_no_device_has_is_refused_naming_the_setting():
    # config and argparse check the name first; a library caller (inference_dtype's name) meets this refusal
    with pytest.raises(ConfigError, match=r"^--dtype 'fp64' is not accepted; expected one of auto, fp32, "
                                          r"bf16, fp16$"):
        select_precision("fp64", CPU, "--dtype")


class _StandInGenerator:
    """A CUDA generator's state as torch.cuda's own get/set_rng_state reach it (no GPU here)."""

    def __init__(self, index: int):
        self.state = torch.tensor([index], dtype=torch.uint8)

    def get_state(self) -> torch.Tensor:
        return self.state.clone()

    def set_state(self, state: torch.Tensor) -> None:
        self.state = state.clone()


def _gpus(monkeypatch, count: int) -> tuple:
    """A machine with `count` GPUs, as torch.cuda's RNG functions see it (current device 0)."""
    import torch.cuda.random as cuda_random

    generators = tuple(_StandInGenerator(i) for i in range(count))
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name, value in (("device_count", lambda: count), ("current_device", lambda: 0)):
        monkeypatch.setattr(cuda_random, name, value)
    return generators


def test_a_checkpoints_cuda_random_state_goes_back_on_a_machine_with_fewer_gpus(monkeypatch):
    """A process that saw 4 GPUs saved every one's generator; set back on a 1-GPU machine, torch's
    set_rng_state_all raised IndexError (a traceback: `load_state_dict` names KeyError, RuntimeError
    and ValueError only). The generator the run drew from goes back on the device it runs on."""
    trained = _gpus(monkeypatch, 4)
    trained[0].state = torch.tensor([42], dtype=torch.uint8)  # the default GPU's, the run's
    states = random_states()
    resumed = _gpus(monkeypatch, 1)
    set_random_states(states)
    assert resumed[0].state.tolist() == [42]


def test_under_torchrun_every_rank_takes_the_cuda_generator_rank_0_trained_with(monkeypatch):
    """Rank 0 saves the checkpoint. Its process drew on cuda:0 only: its state of cuda:1 is the
    seeded one, which rank 1 took on resume, drawing its dropout masks from the start again. Every
    rank seeds and draws alike, so rank 0's generator is each rank's."""
    generators = _gpus(monkeypatch, 2)
    generators[0].state = torch.tensor([42], dtype=torch.uint8)  # rank 0's, after training on cuda:0
    states = random_states(torch.device("cuda", 0))
    set_random_states(states, torch.device("cuda", 1))  # rank 1's process
    assert generators[1].state.tolist() == [42]
    set_random_states(states, torch.device("cpu"))  # a CPU run leaves the GPUs' generators alone
    generators[0].state = torch.tensor([7], dtype=torch.uint8)
    assert "cuda" not in random_states(torch.device("cpu"))


def test_an_older_checkpoint_with_every_gpus_random_state_gives_the_device_its_own(monkeypatch):
    """Checkpoints before the one-state format kept every GPU's generator: a run resumed on cuda:2
    takes cuda:2's, the one a single-process run there drew from, not cuda:0's."""
    generators = _gpus(monkeypatch, 4)
    states = random_states()
    states["cuda"] = [torch.tensor([40 + i], dtype=torch.uint8) for i in range(4)]
    set_random_states(states, torch.device("cuda", 2))
    assert generators[2].state.tolist() == [42]


def test_a_mistake_every_rank_meets_is_said_once_and_one_a_rank_met_alone_by_that_rank(monkeypatch):
    """mistake_alike: rank 0 alone says a mistake every rank met (`shared`); one only rank 1 met stays
    its own (`rank 1: error: ...`, not `shared`: no rank would print it), and the others stop naming it."""
    from tinyattn.errors import TinyattnError
    from tinyattn.system.distributed import Distributed, mistake_alike

    def met_on(ranks, rank):
        """The error `rank` raises when the ranks in `ranks` meet the mistake."""
        def all_gather_object(gathered, mine):
            gathered[:] = [r in ranks for r in (0, 1)]

        monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
        with pytest.raises(TinyattnError) as raised:
            with mistake_alike(Distributed(rank=rank, world_size=2, local_rank=rank)):
                if rank in ranks:
                    raise TinyattnError("--stop-at-step 0: the run is already at step 0")
        return raised.value

    assert met_on({0, 1}, 1).shared is True
    assert met_on({1}, 1).shared is False
    other = met_on({1}, 0)
    assert str(other).startswith("rank 1 met a mistake the others did not")
    assert not getattr(other, "shared", False)


def test_a_ranks_seed_changes_with_the_step_and_the_rank_and_is_one_torch_takes():
    seeds = {(rank, step): rank_seed(2**63 - 1, rank, step) for rank in (1, 2) for step in (0, 1, 2)}
    assert len(set(seeds.values())) == len(seeds)  # no two ranks or steps draw the same masks
    assert all(0 <= seed < 2**63 for seed in seeds.values())  # train.seed's own range
    assert rank_seed(5, 1, 7) == rank_seed(5, 1, 7)  # a function of (seed, rank, step): a resume draws alike


def test_rank_0s_refusal_ends_every_rank_with_its_message_said_once_and_a_ranks_own_at_once(monkeypatch):
    """refusal_shared: the other ranks raise rank 0's refusal, marked for rank 0 alone to say (`shared`);
    a refusal of a rank above 0 is its own, raised without entering the broadcast rank 0 waits in."""
    from tinyattn.errors import TinyattnError
    from tinyattn.system.distributed import Distributed, refusal_shared

    broadcasts = []

    def broadcast_object_list(said, src):
        broadcasts.append(list(said))
        said[:] = ["runs/r: the folder is not empty"]  # rank 0's refusal

    monkeypatch.setattr(torch.distributed, "broadcast_object_list", broadcast_object_list)
    with pytest.raises(TinyattnError) as passed_on:
        with refusal_shared(Distributed(rank=1, world_size=2, local_rank=1)):
            pass
    assert str(passed_on.value) == "runs/r: the folder is not empty" and passed_on.value.shared is True
    assert broadcasts == [[None]]
    with pytest.raises(TinyattnError, match="its own") as own:
        with refusal_shared(Distributed(rank=1, world_size=2, local_rank=1)):
            raise TinyattnError("its own")
    assert not getattr(own.value, "shared", False) and broadcasts == [[None]]


def test_rank_0s_refusal_is_its_own_error_raised_on_rank_0_after_telling_the_others(monkeypatch):
    """Rank 0 raises the refusal it met, its kind kept (a ConfigError, a DataError), once its message
    went out to the ranks waiting for it."""
    from tinyattn.errors import ConfigError
    from tinyattn.system.distributed import Distributed, refusal_shared

    broadcasts = []
    monkeypatch.setattr(torch.distributed, "broadcast_object_list",
                        lambda said, src: broadcasts.append((list(said), src)))
    refusal = ConfigError("train.out_dir: runs/r is not empty")
    with pytest.raises(ConfigError) as raised:
        with refusal_shared(Distributed(rank=0, world_size=2, local_rank=0)):
            raise refusal
    assert raised.value is refusal and broadcasts == [(["train.out_dir: runs/r is not empty"], 0)]


def test_the_largest_value_is_the_largest_of_every_ranks(monkeypatch):
    from tinyattn.system.distributed import Distributed, largest_value

    def all_reduce(tensor, op):  # rank 1's value is 40
        reduce = {torch.distributed.ReduceOp.MAX: max, torch.distributed.ReduceOp.MIN: min}[op]
        tensor.fill_(reduce(int(tensor.item()), 40))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    assert largest_value(Distributed(rank=0, world_size=2), 15, torch.device("cpu")) == 40


def test_the_mean_over_ranks_divides_by_every_rank_into_a_tensor_of_its_own(monkeypatch):
    """`torchrun --nproc_per_node=4`: the logged loss is the sum over the four ranks divided by four, in
    the losses' own precision, not by the two ranks every other test runs. The mean is a new tensor: the
    kept one, which gloo is handed, is overwritten by the next call."""
    from tinyattn.system.distributed import Distributed, mean_over_ranks

    # float64, not the default dtype: a kept tensor made in float32 would round them
    others = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64).view(3, 2).sum(0)  # ranks 1-3

    def all_reduce(tensor, op):
        assert op == torch.distributed.ReduceOp.SUM
        tensor += others

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    dist, losses = Distributed(rank=0, world_size=4), torch.tensor([0.7, 0.8], dtype=torch.float64)
    mean = mean_over_ranks(dist, losses)
    assert mean.dtype == torch.float64 and torch.equal(mean, (losses + others) / 4)
    assert all(mean is not kept for kept in dist.handed.values())


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_only_a_process_torchrun_started_asks_for_a_sigterm_when_its_launcher_ends(monkeypatch, world_size):
    """`sigterm_when_the_parent_ends` is for torchrun's workers (TORCHELASTIC_RUN_ID, which torchrun
    sets), one or several: a `kill -9` to torchrun then stops them with a checkpoint. Ranks a user's
    own script started (`RANK=1 WORLD_SIZE=2 nohup python scripts/train.py &`) were stopped by a
    SIGTERM when that shell ended (a logout), and torchrun's single worker trained on unseen."""
    from tinyattn.system import distributed

    asked = []
    monkeypatch.setattr(distributed, "sigterm_when_the_parent_ends", lambda: asked.append(True) or True)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: None)
    for key, value in (("WORLD_SIZE", world_size), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    distributed.init_distributed("cpu")
    assert asked == []  # a user's own launcher, or a single process
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's worker
    distributed.init_distributed("cpu")
    assert asked == [True]


CHILD_ASKING_FOR_SIGTERM = """\
import signal, sys, time
from tinyattn.system.signals import sigterm_when_the_parent_ends
signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1], "w").write("SIGTERM"), sys.exit(0)))
sigterm_when_the_parent_ends()
print("asked", flush=True)
time.sleep(30)
"""

PARENT_OF_IT = """\
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), child.pid, flush=True)
time.sleep(30)
"""


@pytest.mark.slow  # processes started and one killed, as the slow marker says
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_that_asked_for_it_gets_a_sigterm_when_its_launcher_is_killed(tmp_path):
    # torchrun killed with `kill -9` (or by the OOM killer) sends its workers nothing: they asked the
    # kernel for a SIGTERM then, and stop on it as on any stop.
    import os
    import subprocess
    import time

    from tests.conftest import ROOT

    got = tmp_path / "got"
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_IT, CHILD_ASKING_FOR_SIGTERM, str(got)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = None
    try:
        said, child = parent.stdout.readline().split()
        assert said == "asked"
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        # its text, not the file alone: the child's open() makes the file before its write fills it
        while not (got.exists() and got.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got.exists() and got.read_text() == "SIGTERM"
    finally:
        parent.kill()
        with contextlib.suppress(ProcessLookupError, TypeError):  # TypeError: it never said its pid
            os.kill(int(child), signal.SIGKILL)
