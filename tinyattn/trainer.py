"""The training step and the small owners the loop hands each decision to.

- `Trainer`: the model, optimizers, batches and counters; `train_step()` is one update.
- `LossWindow`: losses stay on the device and are read once per log interval (one host
  sync), checked for NaN/inf there, and turned into throughput.
- `Evaluator`: validation loss (and loss by position), a sample, attention maps.
- `Checkpointer`: step checkpoints, pruning, `best.pt` (replaced only by a lower loss).
- `Timers`, `StopRequest`: where the wall time went; Ctrl-C/SIGTERM as a flag.

`tinyattn.train` runs the loop over them.
"""


from __future__ import annotations

import math
import signal
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, TrainConfig, config_to_dict
from tinyattn.data import BatchSampler
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.evaluate import loss_by_position
from tinyattn.model import LanguageModel
from tinyattn.distributed import Distributed
from tinyattn.optim import Optimizers, build_optimizer, lr_factor, ns_dtype_for, set_learning_rates
from tinyattn.runtime import Precision, prefer_explicit_attention
from tinyattn.seeding import random_states, seed_everything, set_random_states
from tinyattn.timing import synchronize


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
                warnings.warn(f"{path} was written by {state['world_size']} process(es), this run has "
                              f"{self.dist.world_size}: the batches and tokens per step differ from the "
                              "original run from here on", stacklevel=2)
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
