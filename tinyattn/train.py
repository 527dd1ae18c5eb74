"""The training loop and the small owners it hands each decision to.

`train(config, ...)` runs one training job into `<train.out_dir>/<run-name>/`; it is what
`scripts/train.py` calls. The loop (`_loop`) reads in one screen; each per-step decision
belongs to one object:

- `Trainer`: the model, optimizers, batches and counters; `train_step()` is one update.
- `LossWindow`: losses stay on the device and are read once per log interval (one host
  sync), checked for NaN/inf there, and turned into throughput.
- `Evaluator`: validation loss (and loss by position), a sample, attention maps.
- `Checkpointer`: step checkpoints, pruning, `best.pt`.
- `ResumePoint`: the checkpoint a run continues from, loaded once, checked against the
  config's model shape and the data's tokenizer.
- `StepBudget`: with `train.time_budget`, measures the step and evaluation cost on
  throwaway steps, then fixes `max_steps` so the whole process ends within the budget.

What a run guarantees:
- One process holds a run folder at a time (`run_folder.RunLock`), taken before anything
  is written there; a folder that already holds checkpoints is never trained into without
  --resume, and resuming an earlier checkpoint under another --run-name forks into a new
  folder. `config.yaml` (with the resolved step count) and `tokenizer.json` are written
  only once training can start, before step 1. Everything printed goes to `train.log` too.
- Resume continues with the weights, optimizer and scaler state, every random generator
  and the batch sampler of the checkpoint, so a resumed run sees the batches an
  uninterrupted one would. Tested: a stopped-and-resumed run ends with the weights of an
  uninterrupted one within 1e-6 on the CPU in fp32 (a CPU backward kernel sums in a
  thread-dependent order, so two fresh runs differ at that level too).
- Ctrl-C or SIGTERM finishes the current step, saves a checkpoint and says how to resume.
  A non-finite loss stops the run naming the step; no checkpoint is written after it.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from tinyattn import checkpoint as ckpt
from tinyattn.config import (Config, TrainConfig, config_to_dict, parse_duration, save_config)
from tinyattn.data import BatchSampler, prepare_data
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.evaluate import loss_by_position
from tinyattn.files import storage_errors
from tinyattn.finetune import InitSource, init_source, resumed_source
from tinyattn.model import LanguageModel
from tinyattn.optim import (Optimizers, build_optimizer, learning_rate, lr_factor, ns_dtype_for,
                            optimizer_description, set_learning_rates)
from tinyattn.run_folder import RunLock, unique_run_dir
from tinyattn.distributed import Distributed, init_distributed, shutdown_distributed
from tinyattn.runtime import (Precision, measure_peak_flops, prefer_explicit_attention, select_device,
                              select_precision)
from tinyattn.seeding import random_states, seed_everything, set_random_states
from tinyattn.timing import synchronize

DEFAULT_OUT_DIR = TrainConfig.out_dir
HPARAM_METRICS = ("hparam/best_val_loss", "hparam/last_val_loss")


class TrainingError(TinyattnError):
    """The run cannot go on (a non-finite loss); the last good checkpoint is kept."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    tokens_seen: int
    best_val_loss: float
    last_val_loss: float
    tokens_per_second: float  # training throughput over the whole run, evaluation excluded
    wall_seconds: float  # the whole process, start-up included
    interrupted: bool
    seconds: dict = field(default_factory=dict)  # start-up, calibration, train, eval, save


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """Owns the model, optimizers, batches and counters of one run, and steps them.

    Built from what it needs, so a benchmark or a test can drive it without a whole run.
    """

    def __init__(self, model: LanguageModel, optimizers: Optimizers, batches: BatchSampler,
                 config: TrainConfig, device: torch.device, precision: Precision,
                 dist: Distributed = Distributed()):
        self.model = model
        self.optimizers = optimizers
        self.batches = batches
        self.config = config
        self.device = device
        self.precision = precision
        self.dist = dist
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.use_grad_scaler)
        self.step = 0
        self.tokens_seen = 0
        self.best_val_loss = float("inf")
        self.forward_model: nn.Module = model
        if dist.enabled:
            self.forward_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        if config.compile:
            self.forward_model = torch.compile(self.forward_model)
        self.tokens_per_step = (batches.batch_size * batches.context_length
                                * config.grad_accum_steps * dist.world_size)

    @classmethod
    def build(cls, model_config, train_config: TrainConfig, train_tokens: np.ndarray,
              device: torch.device, precision: Precision, dist: Distributed = Distributed()) -> "Trainer":
        """A seeded model, its optimizers and a batch sampler over `train_tokens`."""
        seed_everything(train_config.seed)
        attention = attention_path(model_config.attention, device, precision, model_config)
        model = LanguageModel(model_config, attention).to(device)
        optimizers = build_optimizer(model, train_config, device, ns_dtype_for(precision.autocast_dtype))
        batches = BatchSampler(train_tokens, train_config.batch_size, model_config.context_length,
                               seed=train_config.seed, rank=dist.rank, world_size=dist.world_size)
        return cls(model, optimizers, batches, train_config, device, precision, dist)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.batches.next_batch()
        if self.device.type == "cuda":  # pinned memory lets the copy overlap the running step
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over grad_accum_steps micro-batches; returns (loss, grad norm) on device.

        Each micro-batch loss is divided by the number of micro-batches, so the summed
        gradients are those of the mean loss over one large batch.
        """
        accum = self.config.grad_accum_steps
        set_learning_rates(self.optimizers.optimizers, lr_factor(self.step, self.config))
        total_loss = torch.zeros((), device=self.device)
        for micro in range(accum):
            x, y = self.next_batch()
            # DDP averages gradients across processes on backward; only the last
            # micro-batch needs to do it.
            sync = nullcontext()
            if self.dist.enabled and micro < accum - 1:
                sync = self.forward_model.no_sync()
            with sync:
                with self.precision.autocast(self.device):
                    loss = self.forward_model(x, y).loss / accum
                self.scaler.scale(loss).backward()
            total_loss += loss.detach()
        for optimizer in self.optimizers.optimizers:
            self.scaler.unscale_(optimizer)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        for optimizer in self.optimizers.optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()
        self.optimizers.zero_grad()
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return total_loss, grad_norm

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizers.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "best_val_loss": self.best_val_loss,
            "random_states": random_states(),
            # Batch k of rank r is a function of (seed, r, k): rank 0's count serves every rank.
            "sampler": self.batches.state_dict(),
            "world_size": self.dist.world_size,
        }

    def load_state_dict(self, state: dict, path: Path) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizers.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.step = int(state["step"])
            self.tokens_seen = int(state["tokens_seen"])
            self.best_val_loss = float(state["best_val_loss"])
            self.batches.load_state_dict(state["sampler"])  # keeps this process's own rank
            if state["world_size"] != self.dist.world_size and self.dist.is_main:
                say(f"warning: {path} was written by {state['world_size']} process(es), this run has "
                    f"{self.dist.world_size}: the batches and tokens per step differ from the "
                    "original run from here on")
            set_random_states(state["random_states"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot resume from it: {str(e).splitlines()[0]}") from None


def attention_path(setting: str, device: torch.device, precision: Precision, model_config) -> str:
    """`model.attention` resolved for this hardware: "fused" or "explicit"."""
    if setting != "auto":
        return setting
    explicit = prefer_explicit_attention(device, precision, model_config.context_length,
                                         model_config.dropout)
    return "explicit" if explicit else "fused"


# ----------------------------------------------------------------------------- the owners


class LossWindow:
    """Per-step losses kept on the device, read once per log interval (the one host sync)."""

    def __init__(self, size: int, device: torch.device):
        self.losses = torch.zeros(size, device=device)
        self.device = device
        self.pending = 0
        self.grad_norm: Optional[torch.Tensor] = None
        self.started = time.perf_counter()

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.losses[self.pending] = loss
        self.grad_norm = grad_norm
        self.pending += 1

    @property
    def full(self) -> bool:
        return self.pending == self.losses.numel()

    def read(self, step: int, run_dir: Path) -> tuple[list[float], float]:
        """The window's losses and its wall seconds; raises TrainingError on a non-finite loss."""
        synchronize(self.device)
        seconds = time.perf_counter() - self.started
        window = self.losses[:self.pending].tolist()
        bad = [i for i, value in enumerate(window) if not math.isfinite(value)]
        if bad:
            failed_step = step - len(window) + 1 + bad[0]
            last = ckpt.latest_checkpoint(run_dir)
            kept = f"; the last good checkpoint is {last}" if last else ""
            raise TrainingError(f"the loss became {window[bad[0]]} at step {failed_step}; "
                                f"training stopped{kept} (try a lower train.lr)")
        self.pending = 0
        return window, seconds

    def restart(self) -> None:
        self.started = time.perf_counter()


@dataclass
class EvalResult:
    step: int
    position_losses: np.ndarray  # (context_length,): validation loss at each position
    sample: Optional[str]

    @property
    def val_loss(self) -> float:
        return float(self.position_losses.mean())


class Evaluator:
    """At every eval_interval and the last step: validation loss by position and a sample;
    logged with the attention maps of a fixed probe text."""

    def __init__(self, trainer: Trainer, config: Config, validation: np.ndarray, tokenizer,
                 dist: Distributed = Distributed()):
        self.trainer = trainer
        self.config = config
        self.validation = validation
        self.tokenizer = tokenizer
        self.dist = dist

    def due(self, step: int, last_step: int) -> bool:
        return step % self.config.train.eval_interval == 0 or step == last_step

    def run(self, step: int) -> EvalResult:
        t, tc = self.trainer, self.config.train
        # The plain module: a compiled one would compile a second graph for evaluation.
        with t.precision.autocast(t.device):
            losses = loss_by_position(t.model, self.validation, self.config.model.context_length,
                                      tc.batch_size, tc.eval_windows)
        return EvalResult(step, losses, self.sample() if self.dist.is_main else None)

    def sample(self) -> Optional[str]:
        from tinyattn.generate import generate

        t, s, tc = self.trainer, self.config.sample, self.config.train
        if tc.sample_tokens == 0:
            return None
        generator = torch.Generator(device=t.device).manual_seed(tc.seed)
        return "".join(generate(t.model, self.tokenizer, s.prompt, max_new_tokens=tc.sample_tokens,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                generator=generator))


class Checkpointer:
    """Writes step checkpoints (keeping the last `keep_last`) and best.pt, on rank 0."""

    def __init__(self, run_dir: Path, config: Config, tokenizer, dist: Distributed):
        self.run_dir = run_dir
        self.keep_last = config.train.keep_last
        self.dist = dist
        self.run_state = {"config": config_to_dict(config), "tokenizer": tokenizer.to_json()}
        # best.pt is replaced only by a lower validation loss than the one it holds.
        saved = ckpt.saved_value(run_dir / ckpt.BEST, "best_val_loss") if dist.is_main else None
        self.best_on_disk = float(saved) if saved is not None else math.inf

    def save(self, trainer: Trainer, best: bool) -> None:
        if self.dist.is_main:
            state = {**trainer.state_dict(), **self.run_state}
            ckpt.save_checkpoint(state, self.run_dir / ckpt.step_filename(trainer.step))
            ckpt.prune_checkpoints(self.run_dir, self.keep_last)
            if best and trainer.best_val_loss < self.best_on_disk:
                ckpt.save_checkpoint(state, self.run_dir / ckpt.BEST)
                self.best_on_disk = trainer.best_val_loss
        if self.dist.enabled:
            torch.distributed.barrier()


class Timers:
    """Wall seconds spent per activity: the split the run's last line reports."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks after each step."""

    def __init__(self):
        self.signal_name: Optional[str] = None

    @contextmanager
    def installed(self):
        previous = {}

        def handler(signum, frame):
            if self.signal_name is not None:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            self.signal_name = signal.Signals(signum).name

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: leave signals alone
                pass
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


# ----------------------------------------------------------------------------- resume


def model_shape_differences(saved: dict, current: dict) -> list[str]:
    """The model keys whose values differ between a checkpoint's config and this one.

    Dropout and the attention path change how the same weights are used, not their shape.
    """
    keys = sorted(set(saved) | set(current))
    return [f"model.{k}: checkpoint {saved.get(k)!r}, config {current.get(k)!r}"
            for k in keys if saved.get(k) != current.get(k) and k not in ("dropout", "attention")]


def _verified_alternative(file: Path) -> str:
    """'; the newest checkpoint that verifies is ...' for a resume whose checkpoint is damaged."""
    good = ckpt.newest_verified(file.parent)
    if good is None or good == file:
        return ""
    return (f"; the newest checkpoint in {file.parent} that verifies is {good.name}: move the damaged "
            f"file away and resume with --resume {file.parent}, or fork from it with --resume {good} "
            "--run-name NEW_NAME")


@dataclass
class ResumePoint:
    """The checkpoint a run continues from: loaded once, then checked against the run."""

    file: Path
    state: dict
    config: Config  # the config saved in the checkpoint
    step: int  # the checkpoint's step

    @classmethod
    def find(cls, resume: str | Path | bool, run_name: Optional[str], out_dir: str | Path) -> "ResumePoint":
        """resume=True: the --run-name run, else the most recent one; else a folder or file."""
        out_dir = Path(out_dir)
        if resume is True and run_name:
            run_dir = out_dir / run_name
            if not run_dir.is_dir():
                raise CheckpointError(f"{run_dir}: no such run to resume (check --run-name)")
            resume = run_dir
        file = ckpt.resolve_checkpoint(None if resume is True else resume, out_dir, prefer="latest")
        try:
            state = ckpt.load_checkpoint(file)
        except CheckpointError as e:
            raise CheckpointError(f"{e}{_verified_alternative(file)}") from None
        return cls(file, state, ckpt.config_from_checkpoint(state, file), int(state.get("step", 0)))

    def target(self, run_name: Optional[str], out_dir: str | Path) -> tuple[Path, bool]:
        """(the folder this run trains into, whether that is a fork into a new folder).

        Without --run-name (or naming the checkpoint's own folder) the run continues in
        place, which only the folder's latest checkpoint may do: an earlier one would
        overwrite the later steps. With another --run-name it forks: the new folder gets a
        copy of the checkpoint (see `fork_into`) and the original is never written.
        """
        own = self.file.parent
        if run_name is None or (Path(out_dir) / run_name).resolve() == own.resolve():
            latest = ckpt.latest_checkpoint(own)
            latest_step = ckpt.step_of(latest) if latest is not None else None
            if latest_step is not None and latest_step > self.step:
                raise CheckpointError(
                    f"{self.file} is step {self.step}, but {own} goes on to step {latest_step}: "
                    f"continuing there would overwrite its later checkpoints. To branch from this "
                    f"checkpoint, fork it into a new folder: --resume {self.file} --run-name NEW_NAME")
            return own, False
        return Path(out_dir) / run_name, True

    def forks_into(self, run_dir: Path) -> bool:
        return self.file.parent.resolve() != Path(run_dir).resolve()

    def fork_into(self, run_dir: Path) -> None:
        """Copy into a new run folder what resuming there needs: the starting checkpoint (and
        the original's best.pt if it is no later than the start, so 'best' keeps its meaning)."""
        ckpt.copy_checkpoint(self.file, run_dir / ckpt.step_filename(self.step))
        best = self.file.parent / ckpt.BEST
        best_step = ckpt.saved_value(best, "step") if best.is_file() else None
        if best_step is not None and best_step <= self.step:
            ckpt.copy_checkpoint(best, run_dir / ckpt.BEST)

    def adopt(self, config: Config) -> None:
        """Check that `config` can continue this checkpoint; take what the run fixed at its start.

        The vocabulary size came from the tokenizer, and a time-budget run's step count
        was measured when it started: both are taken from the checkpoint.
        """
        saved = config_to_dict(self.config)["model"]
        current = config_to_dict(config)["model"]
        if current.get("vocab_size") is None:
            current["vocab_size"] = saved["vocab_size"]
        differences = model_shape_differences(saved, current)
        if differences:
            raise CheckpointError(f"{self.file}: the config's model differs from the checkpoint's: "
                                  + "; ".join(differences))
        config.model.vocab_size = self.config.model.vocab_size
        if config.train.time_budget is not None and self.config.train.time_budget is not None:
            config.train.max_steps = self.config.train.max_steps

    def check_tokenizer(self, tokenizer) -> None:
        if self.state.get("tokenizer") != tokenizer.to_json():
            raise CheckpointError(f"{self.file}: its tokenizer differs from the one the data now "
                                  "builds (the corpus or tokenizer settings changed); token ids would "
                                  "no longer mean what the model learned")

    def restore(self, trainer: Trainer) -> None:
        trainer.load_state_dict(self.state, self.file)
        self.state = {}  # the tensors are in the trainer now; free the copy


def _open_run_folder(config: Config, config_path, run_name: Optional[str], point: Optional[ResumePoint],
                     dist: Distributed) -> tuple[Path, "RunLock | nullcontext"]:
    """The folder this run writes, held (locked) by rank 0 until the run ends; the same on every rank.

    A new run gets `--run-name` or a fresh `<config>-<date>-<time>` folder; a resumed one its
    checkpoint's folder, or with another --run-name a fork (a copy of the checkpoint in a
    new folder). Nothing is written before the lock is held.
    """
    run_dir, lock = None, nullcontext()
    if dist.is_main:
        fork = False
        if point is not None:
            run_dir, fork = point.target(run_name, config.train.out_dir)
        elif run_name:
            run_dir = Path(config.train.out_dir) / run_name
        else:
            run_dir = unique_run_dir(config.train.out_dir, Path(config_path).stem if config_path else "run")
        lock = RunLock.acquire(run_dir)
        if (fork or point is None) and ckpt.has_checkpoints(run_dir):
            lock.release()
            raise CheckpointError(f"{run_dir} already holds checkpoints; continue it with --resume "
                                  f"{run_dir}, or choose another --run-name")
    if dist.enabled:  # a default name has the time in it: rank 0's choice is everyone's
        shared = [str(run_dir) if run_dir is not None else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = Path(shared[0])
    return run_dir, lock


# ----------------------------------------------------------------------------- time budget


class StepBudget:
    """Chooses `max_steps` so that the whole process ends within `train.time_budget`.

    It runs throwaway steps first (they compile, if asked, and warm the caches), times
    the steps after them, one evaluation and one checkpoint write, and then restores the
    model, optimizers, scaler, random generators and sampler to their state before the
    first step. The run then trains exactly as a run with `max_steps` set to the chosen
    number would, so the schedule spans the steps that will run and resume stays exact.
    """

    WARM_STEPS = 3  # the first compiles; the next settle the allocator and thread pool
    MIN_STEPS = 10  # timed steps, at least ...
    MIN_SHARE = 0.005  # ... and at least this share of the budget (1.5 s to 3 s)
    MARGIN = 0.015  # of the budget kept for timing noise ...
    EXIT_SECONDS = 1.0  # ... and for the process's exit after the last line (torch's teardown)

    def __init__(self, budget_text: str):
        self.text = budget_text
        self.seconds = parse_duration(budget_text)

    def fix_steps(self, trainer: Trainer, evaluator: Evaluator, run_dir: Path,
                  elapsed: Callable[[], float]) -> tuple[int, str]:
        """The step count for the budget, and one line saying how it was chosen.

        elapsed(): seconds of the budget already spent (the CLI counts from process start).
        """
        tc = trainer.config
        left = self.seconds * (1 - self.MARGIN) - self.EXIT_SECONDS - elapsed()
        if left <= 0 and not trainer.dist.enabled:  # spent already: refuse before measuring anything
            raise TinyattnError(f"train.time_budget {self.text}: {elapsed():.0f} s are gone before training, "
                                "all the budget leaves; no step fits. Give a larger budget or set train.max_steps")
        snapshot = _snapshot(trainer)
        for _ in range(self.WARM_STEPS):
            trainer.train_step()
        synchronize(trainer.device)
        start, timed = time.perf_counter(), 0
        measure_for = min(3.0, max(1.5, self.MIN_SHARE * self.seconds))
        while self._keep_measuring(trainer, timed, time.perf_counter() - start, measure_for):
            trainer.train_step()
            timed += 1
            if timed % 5 == 0:
                synchronize(trainer.device)
        synchronize(trainer.device)
        step_seconds = (time.perf_counter() - start) / timed
        start = time.perf_counter()
        evaluator.run(trainer.step)
        eval_seconds = time.perf_counter() - start
        save_seconds = _time_a_save(trainer, run_dir)
        _restore(trainer, snapshot)

        spent = elapsed()
        available = self.seconds * (1 - self.MARGIN) - self.EXIT_SECONDS - spent
        per_step = step_seconds + (eval_seconds + 2 * save_seconds) / tc.eval_interval
        steps = int((available - eval_seconds - 2 * save_seconds) / per_step)
        if steps < 1:
            raise TinyattnError(
                f"train.time_budget {self.text}: {spent:.0f} s are gone before training and a "
                f"step takes {step_seconds:.2f} s; no step fits. Give a larger budget or set train.max_steps")
        why = (f"time budget {self.text}: measured {step_seconds:.3f} s/step, {eval_seconds:.2f} s per "
               f"evaluation, {save_seconds:.2f} s per checkpoint, {spent:.0f} s of start-up "
               f"-> {steps:,} steps")
        return steps, why


    def _keep_measuring(self, trainer: Trainer, timed: int, seconds: float, measure_for: float) -> bool:
        more = timed < self.MIN_STEPS or seconds < measure_for
        if trainer.dist.enabled:  # rank 0 decides, so every rank runs the same steps
            flag = torch.tensor([int(more)], device=trainer.device)
            torch.distributed.broadcast(flag, src=0)
            more = bool(flag.item())
        return more


def _snapshot(trainer: Trainer) -> dict:
    return {"model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": [o.state_dict() for o in trainer.optimizers.optimizers],
            "scaler": trainer.scaler.state_dict(), "random_states": random_states(),
            "sampler": trainer.batches.state_dict()}


def _restore(trainer: Trainer, snapshot: dict) -> None:
    trainer.model.load_state_dict(snapshot["model"])
    for optimizer, state in zip(trainer.optimizers.optimizers, snapshot["optimizer"]):
        optimizer.load_state_dict(state)
        optimizer.state.clear()  # no moments before step 1
    if snapshot["scaler"]:
        trainer.scaler.load_state_dict(snapshot["scaler"])
    set_random_states(snapshot["random_states"])
    trainer.batches.load_state_dict(snapshot["sampler"])
    trainer.step, trainer.tokens_seen = 0, 0


def _time_a_save(trainer: Trainer, run_dir: Path) -> float:
    """Seconds to write one checkpoint of this run, measured into a file deleted after."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f".budget_probe.rank{trainer.dist.rank}.tmp"
    start = time.perf_counter()
    try:
        ckpt.save_checkpoint(trainer.state_dict(), path)
        return time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the run


def train(config: Config, *, config_path: Optional[str | Path] = None, run_name: Optional[str] = None,
          resume: "Optional[ResumePoint | str | Path | bool]" = None, device: Optional[str] = None,
          progress: bool = True, stop_at_step: Optional[int] = None, elapsed_before: float = 0.0
          ) -> TrainResult:
    """Run (or resume) one training job. Returns where it went and the figures it reached.

    resume: a `ResumePoint`, a run folder or checkpoint file, or True (the --run-name
    run, else the most recent one under train.out_dir). stop_at_step ends the run early
    with a checkpoint, as Ctrl-C would, while the schedule still spans train.max_steps.
    elapsed_before: seconds already spent that count against train.time_budget (the
    command line passes the process's age, so the budget covers start-up too).
    """
    dist = init_distributed(device or config.train.device)
    try:
        return _train(config, config_path, run_name, resume, device, progress, stop_at_step, dist,
                      time.perf_counter() - elapsed_before)
    finally:
        shutdown_distributed(dist)


def _train(config, config_path, run_name, resume, device_name, progress, stop_at_step,
           dist: Distributed, started: float) -> TrainResult:
    timers = Timers()
    point = resume
    if resume is not None and not isinstance(resume, ResumePoint):
        point = ResumePoint.find(resume, run_name, config.train.out_dir)
    if point is not None:
        if config.train.init_from:  # the model and tokenizer it took from its source at the start
            resumed_source(config, point.config, f"{point.file} (train.init_from)")
        point.adopt(config)
    source = init_source(config) if point is None else None  # fine-tuning: train.init_from
    select_device(device_name or config.train.device)  # a bad device fails before the folder is made
    run_dir, lock = _open_run_folder(config, config_path, run_name, point, dist)
    with lock, RunLog(run_dir, enabled=dist.is_main):
        return _train_in(run_dir, config, point, device_name, progress, stop_at_step, dist, started, timers,
                         source)


def _train_in(run_dir: Path, config: Config, point: Optional[ResumePoint], device_name, progress,
              stop_at_step, dist: Distributed, started: float, timers: Timers,
              source: Optional[InitSource] = None) -> TrainResult:
    def elapsed() -> float:
        return time.perf_counter() - started

    device = select_device(device_name or config.train.device)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    precision = select_precision(config.train.precision, device)
    data = _prepare_data(config, dist, progress)
    if point is not None:
        point.check_tokenizer(data.tokenizer)
    # MFU's denominator; the measurement draws from its own generator, so exact resume is unaffected.
    peak = config.train.peak_flops or measure_peak_flops(device, precision)
    trainer = Trainer.build(config.model, config.train, data.train, device, precision, dist)
    evaluator = Evaluator(trainer, config, data.validation, data.tokenizer, dist)
    if point is not None:
        point.restore(trainer)
    elif source is not None:
        source.load_into(trainer.model)
    if stop_at_step is not None and stop_at_step <= trainer.step:
        raise TinyattnError(f"--stop-at-step {stop_at_step}: the run is already at step {trainer.step}; "
                            "give a later step")
    log = Logger(run_dir, config, trainer, peak, enabled=dist.is_main, progress=progress)
    log.announce(point)
    if point is None and config.train.time_budget is not None:
        with timers("calibration"):
            config.train.max_steps = _budget_steps(config, trainer, evaluator, run_dir, elapsed, log)

    checkpointer = Checkpointer(run_dir, config, data.tokenizer, dist)
    if dist.is_main:  # written only now that training can start: a failed command changes nothing
        if point is not None and point.forks_into(run_dir):
            point.fork_into(run_dir)
        save_config(config, run_dir / "config.yaml")
        data.tokenizer.save(run_dir / "tokenizer.json")
        log.start()
    timers.seconds["start-up"] = elapsed() - timers.seconds.get("calibration", 0.0)
    try:
        last_step = config.train.max_steps if stop_at_step is None else min(config.train.max_steps,
                                                                            stop_at_step)
        signal_name, last_val = _loop(trainer, evaluator, checkpointer, log, timers, last_step, run_dir)
        result = TrainResult(run_dir, trainer.step, trainer.tokens_seen, trainer.best_val_loss, last_val,
                             log.tokens_per_second, elapsed(), signal_name is not None,
                             dict(timers.seconds))
        stopped_early = signal_name or ("--stop-at-step" if trainer.step < config.train.max_steps else None)
        log.finish(result, stopped_early)
        return result
    finally:
        log.close()  # the TensorBoard writer and the bar, also when training fails


def _budget_steps(config: Config, trainer: Trainer, evaluator: Evaluator, run_dir: Path,
                  elapsed: Callable[[], float], log: "Logger") -> int:
    """train.max_steps for the time budget, the same on every rank; says how it was chosen."""
    steps, why = StepBudget(config.train.time_budget).fix_steps(trainer, evaluator, run_dir, elapsed)
    if trainer.dist.enabled:
        chosen = [steps]
        torch.distributed.broadcast_object_list(chosen, src=0)  # rank 0's measurement decides
        steps = chosen[0]
    log.print(why)
    return steps


def _prepare_data(config: Config, dist: Distributed, progress: bool):
    """The token data (rank 0 builds the cache, the others then read it); sets vocab_size."""
    if dist.enabled and not dist.is_main:
        torch.distributed.barrier()
    data = prepare_data(config, progress=progress and dist.is_main)
    if dist.enabled and dist.is_main:
        torch.distributed.barrier()
    if config.model.vocab_size is None:
        config.model.vocab_size = data.tokenizer.vocab_size
    elif config.model.vocab_size < data.tokenizer.vocab_size:
        raise TinyattnError(f"model.vocab_size={config.model.vocab_size} is smaller than the "
                            f"tokenizer's vocabulary ({data.tokenizer.vocab_size}); leave it unset")
    return data


def _loop(trainer: Trainer, evaluator: Evaluator, checkpointer: Checkpointer, log: "Logger",
          timers: Timers, last_step: int, run_dir: Path) -> tuple[Optional[str], float]:
    """Step until last_step or a stop signal; returns (the signal's name or None, last val loss)."""
    window = LossWindow(trainer.config.log_interval, trainer.device)
    stopper = StopRequest()
    last_val, at_eval = float("nan"), False
    with stopper.installed():
        while trainer.step < last_step and stopper.signal_name is None:
            with timers("train"):
                loss, grad_norm = trainer.train_step()
                window.add(loss, grad_norm)
                at_eval = evaluator.due(trainer.step, last_step)
                # Every checkpoint follows a read of the losses, whose NaN check keeps bad weights out.
                if window.full or at_eval or stopper.signal_name is not None:
                    losses, seconds = window.read(trainer.step, run_dir)
                    log.train(trainer.step, losses, seconds, window.grad_norm)
            if at_eval:
                with timers("eval"):
                    result = evaluator.run(trainer.step)
                    last_val = result.val_loss
                    best = last_val < trainer.best_val_loss
                    trainer.best_val_loss = min(trainer.best_val_loss, last_val)
                with timers("save"):
                    checkpointer.save(trainer, best)
                with timers("eval"):
                    log.evaluation(result, best, evaluator)
            if window.pending == 0:
                window.restart()
        if stopper.signal_name is not None and not at_eval:
            with timers("save"):
                checkpointer.save(trainer, best=False)
    return stopper.signal_name, last_val


# ----------------------------------------------------------------------------- logging


RUN_LOG = logging.getLogger("tinyattn.run")


class _LogFile(logging.FileHandler):
    def handleError(self, record):  # a full disk must not end a run over a log line
        pass


class RunLog:
    """Copies what the run prints (its lines, warnings, the error that ends it) into
    `<run>/train.log`, so a run's history survives a closed terminal."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.path = run_dir / "train.log"
        self.enabled = enabled
        self.handler: Optional[logging.Handler] = None
        self.caught = warnings.catch_warnings()

    def __enter__(self) -> "RunLog":
        if not self.enabled:
            return self
        self.handler = _LogFile(self.path, encoding="utf-8")
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        RUN_LOG.addHandler(self.handler)
        RUN_LOG.setLevel(logging.INFO)
        RUN_LOG.propagate = False
        self.caught.__enter__()
        show = warnings.showwarning

        def show_and_log(message, category, filename, lineno, file=None, line=None):
            show(message, category, filename, lineno, file, line)
            RUN_LOG.warning(f"warning: {message}")

        warnings.showwarning = show_and_log
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self.handler is None:
            return
        if isinstance(error, TinyattnError):
            RUN_LOG.error(f"error: {error}")
        elif isinstance(error, KeyboardInterrupt):
            RUN_LOG.error("interrupted")
        elif error is not None:
            RUN_LOG.error(f"failed: {type(error).__name__}: {error}")
        self.caught.__exit__(None, None, None)
        RUN_LOG.removeHandler(self.handler)
        self.handler.close()
        self.handler = None


def say(line: str) -> None:
    """A line for the console and the run's train.log."""
    print(line, file=sys.stderr, flush=True)
    RUN_LOG.info(line)


def hparams_of(config: Config) -> dict:
    """The config as TensorBoard hparams: every section, lists and None as text."""
    flat = {}
    for section, values in config_to_dict(config).items():
        for key, value in values.items():
            if isinstance(value, (list, tuple)):
                value = ", ".join(map(str, value))
            flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


class Logger:
    """The progress bar, the plain log lines and TensorBoard, on the main process only."""

    def __init__(self, run_dir: Path, config: Config, trainer: Trainer, peak_flops: float,
                 enabled: bool, progress: bool):
        self.run_dir = run_dir
        self.config = config
        self.trainer = trainer
        self.flops_per_token = trainer.model.flops_per_token()
        self.peak_flops = peak_flops * trainer.dist.world_size
        self.enabled = enabled
        self.writer = None
        self.bar = None
        self.progress = progress and enabled
        self.train_seconds, self.train_tokens = 0.0, 0

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / self.train_seconds if self.train_seconds else float("nan")

    def announce(self, point: Optional[ResumePoint]) -> None:
        """The run's first line, printed before any step (or the budget's measuring steps)."""
        t, tc = self.trainer, self.config.train
        what = "starting"
        if point is not None:
            what = f"{'forked from' if point.forks_into(self.run_dir) else 'resuming from'} {point.file} at step {t.step}"
        steps = (f"{tc.max_steps:,} steps" if point or tc.time_budget is None
                 else f"measuring a few steps to fit the {tc.time_budget} budget")
        self.print(f"run {self.run_dir} ({what}): {t.model.num_parameters():,} parameters, "
                   f"device {t.device}, precision {t.precision.name}, {optimizer_description(tc)}, "
                   f"{len(t.batches.tokens):,} train tokens, {steps}")

    def start(self) -> None:
        """Opens TensorBoard (after config.yaml is written) and the progress bar."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.run_dir))
        t = self.trainer
        self.writer.add_text("config", "```\n" + (self.run_dir / "config.yaml").read_text() + "\n```", t.step)
        if t.step == 0:  # one HParams session per run: a resumed run continues it
            from torch.utils.tensorboard.summary import hparams

            file_writer = self.writer._get_file_writer()
            for summary in hparams(hparams_of(self.config), dict.fromkeys(HPARAM_METRICS, math.nan)):
                file_writer.add_summary(summary)
        if self.progress:
            self.bar = tqdm(total=self.config.train.max_steps, initial=t.step, unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
            RUN_LOG.info(line)
        else:
            say(line)

    def train(self, step: int, losses: list[float], seconds: float, grad_norm: torch.Tensor) -> None:
        tokens = len(losses) * self.trainer.tokens_per_step
        self.train_seconds += seconds
        self.train_tokens += tokens
        if not self.enabled:
            return
        loss = sum(losses) / len(losses)
        lr = learning_rate(step - 1, self.config.train)
        tokens_per_second = tokens / seconds
        mfu = self.flops_per_token * tokens_per_second / self.peak_flops
        w = self.writer
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/learning_rate", lr, step)
        w.add_scalar("train/grad_norm", grad_norm.item(), step)
        w.add_scalar("train/tokens_seen", self.trainer.tokens_seen, step)
        w.add_scalar("perf/tokens_per_second", tokens_per_second, step)
        w.add_scalar("perf/mfu", mfu, step)
        if self.bar is not None:
            self.bar.update(len(losses))
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:,.0f}",
                                 refresh=False)
        else:
            self.print(f"step {step}: loss {loss:.4f}, lr {lr:.2e}, {tokens_per_second:,.0f} tok/s, "
                       f"mfu {mfu:.1%}")

    def evaluation(self, result: EvalResult, best: bool, evaluator: Evaluator) -> None:
        if not self.enabled:
            return
        from tinyattn.attention_maps import log_attention_to_tensorboard
        from tinyattn.evaluate import log_loss_by_position_to_tensorboard
        from tinyattn.relevance import log_head_ablation_to_tensorboard

        step = result.step
        self.writer.add_scalar("val/loss", result.val_loss, step)
        self.writer.add_scalar("hparam/best_val_loss", self.trainer.best_val_loss, step)
        self.writer.add_scalar("hparam/last_val_loss", result.val_loss, step)
        self.print(f"step {step}: validation loss {result.val_loss:.4f}{' (best)' if best else ''}")
        if result.sample is not None:
            with storage_errors(self.run_dir / "samples.txt"), \
                    open(self.run_dir / "samples.txt", "a", encoding="utf-8") as f:
                f.write(f"--- step {step} ---\n{result.sample}\n")
            self.writer.add_text("sample", "```\n" + result.sample + "\n```", step)
        log_loss_by_position_to_tensorboard(self.writer, result.position_losses, step)
        if self.config.train.probe_text:
            log_attention_to_tensorboard(self.writer, self.trainer.model, evaluator.tokenizer,
                                         self.config.train.probe_text, step)
            # Which heads the loss needs, as a layer x head grid: L * H short forwards, batched.
            log_head_ablation_to_tensorboard(self.writer, self.trainer.model, evaluator.tokenizer,
                                             self.config.train.probe_text, step)
        self.writer.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def finish(self, result: TrainResult, stopped_by: Optional[str]) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.close()
        if stopped_by:
            say(f"stopped by {stopped_by} at step {result.step}; checkpoint saved in {result.run_dir}. "
                f"Resume with: python scripts/train.py --resume {result.run_dir}")
            return
        s = result.seconds
        split = ", ".join(f"{name} {s[name]:.1f} s ({s[name] / result.wall_seconds:.1%})"
                          for name in ("start-up", "calibration", "train", "eval", "save") if name in s)
        say(f"done: {result.step} steps in {result.wall_seconds:.0f} s ({split}), "
            f"{result.tokens_per_second:,.0f} tok/s, best validation loss "
            f"{result.best_val_loss:.4f}; checkpoints in {result.run_dir}")
