"""The training step: the model, its optimizers, the batches and the counters.

- `Trainer`: the model, optimizers, batches and counters of one run; `train_step()` is one
  update (gradient accumulation, loss scaling, clipping to train.grad_clip, the learning
  rate of the schedule set on every group first). `plan` says that rate and when the run
  ends: `optim.StepPlan` (train.max_steps) unless the loop gives it a time budget's
  `budget.TimePlan`. `state_dict`/`load_state_dict` are what a checkpoint holds of it (the
  plan's state included), and what the time budget puts back after measuring. With train.ema it
  also keeps the moving average of the weights that evaluations and checkpoints see
  (`evaluated_weights`; `tinyattn.train.averaging`).
- `TrainResult`: where a run went and the figures it reached.

The small owners the loop hands each other decision to are in `tinyattn.train.owners`
(`LossWindow`, `Evaluator`, `Checkpointer`, `Timers`, `StopRequest`); `tinyattn.train.loop`
runs the loop over them.
"""


from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from tinyattn.config import TrainConfig
from tinyattn.data.batches import BatchSampler
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.model.attention_path import attention_path
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.cpu import keep_compiled_code_per_capability
from tinyattn.system.device import Precision
from tinyattn.system.distributed import Distributed
from tinyattn.system.seeding import rank_seed, random_states, seed_everything, set_random_states
from tinyattn.train.averaging import WeightAverage
from tinyattn.train.optim import Optimizers, StepPlan, build_optimizer, ns_dtype_for, set_learning_rates


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


def _sampler_state(state: dict) -> dict:
    """A checkpoint's sampler state; one saved before it held its batch size is given the checkpoint
    config's, so that a resume at another batch size goes on from the window the passes stood at."""
    sampler, saved = state["sampler"], (state.get("config") or {}).get("train", {}).get("batch_size")
    return sampler if "batch_size" in sampler or saved is None else {**sampler, "batch_size": saved}


class Trainer:
    """Owns the model, optimizers, batches and counters of one run, and steps them.

    Built from what it needs, so a benchmark or a test can drive it without a whole run.
    """

    def __init__(self, model: LanguageModel, optimizers: Optimizers, batches: BatchSampler,
                 config: TrainConfig, *, device: torch.device, precision: Precision,
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
        self.plan = StepPlan(config)  # the rate and the end; a time budget's loop replaces it
        self.forward_model: nn.Module = model
        if dist.enabled:
            self.forward_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        if config.compile:
            keep_compiled_code_per_capability()
            self.forward_model = torch.compile(self.forward_model)
        self.compiled = not config.compile  # whether a step has run (and compiled) in this process
        self.tokens_per_step = (batches.batch_size * batches.context_length
                                * config.grad_accum_steps * dist.world_size)
        # train.ema: what evaluations and checkpoints see (`evaluated_weights`, `state_dict`)
        self.average = WeightAverage(model, config.ema) if config.ema is not None else None

    @classmethod
    def build(cls, model_config, train_config: TrainConfig, train_tokens: np.ndarray, *,
              device: torch.device, precision: Precision, dist: Distributed = Distributed()) -> "Trainer":
        """A seeded model, its optimizers and a batch sampler over `train_tokens`."""
        seed_everything(train_config.seed)
        attention = attention_path(model_config.attention, device, precision, model_config)
        model = LanguageModel(model_config, attention).to(device)
        optimizers = build_optimizer(model, train_config, device, ns_dtype_for(precision.autocast_dtype))
        batches = BatchSampler(train_tokens, train_config.batch_size, model_config.context_length,
                               seed=train_config.seed, rank=dist.rank, world_size=dist.world_size,
                               sampling=train_config.sampling)
        return cls(model, optimizers, batches, train_config, device=device, precision=precision, dist=dist)

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
        if self.dist.rank > 0:  # dropout masks of its own, not rank 0's (`rank_seed`)
            torch.manual_seed(rank_seed(self.config.seed, self.dist.rank, self.step))
        set_learning_rates(self.optimizers.optimizers, self.plan.factor(self.step))
        # passes end with the run: the batches it is to draw yet, at this accumulation
        self.batches.plan_end((self.plan.total_steps(self.step) - self.step) * accum)
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
        if not self._overflowed(grad_norm):
            for optimizer in self.optimizers.optimizers:
                self.scaler.step(optimizer)
        self.scaler.update()  # an overflow halves the scale
        self.optimizers.zero_grad()
        if self.average is not None:
            self.average.update()
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        self.compiled = True
        return total_loss, grad_norm

    def _overflowed(self, grad_norm: torch.Tensor) -> bool:
        """Under loss scaling (fp16), whether some gradient is inf or NaN: then no optimizer steps.
        The scaler skips only the step of the optimizer that holds it, while the clipping over
        every parameter has made the others' gradients 0, or NaN (0 x inf) without train.grad_clip.
        One host sync, where the scaler's steps take one per optimizer anyway; none in fp32 or bf16."""
        return self.scaler.is_enabled() and not bool(torch.isfinite(grad_norm))

    def weights_loaded(self) -> None:
        """Weights were loaded into the model from elsewhere (train.init_from): the average, if
        any, restarts from them."""
        if self.average is not None:
            self.average.restart()

    def evaluated_weights(self):
        """A context in which the model holds the weights an evaluation judges: the moving
        average with train.ema, else its own (then it changes nothing)."""
        return self.average.evaluated() if self.average is not None else nullcontext()

    def state_dict(self) -> dict:
        # "model" is what every reader of a checkpoint loads (generate, export, eval): with
        # train.ema the average, and the weights the optimizer steps beside it, for resuming.
        if self.average is not None:
            weights = {"model": self.average.model_state_dict(),
                       "trained_model": self.model.state_dict()}
        else:
            weights = {"model": self.model.state_dict()}
        return {
            **weights,
            "optimizer": self.optimizers.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "best_val_loss": self.best_val_loss,
            "random_states": random_states(self.device),
            # Batch k of rank r is a function of (seed, r, k): rank 0's count serves every rank.
            "sampler": self.batches.state_dict(),
            "world_size": self.dist.world_size,
            "plan": self.plan.state_dict(),  # a time budget's progress and measurements
        }

    def load_state_dict(self, state: dict, path: Path) -> None:
        try:
            self.model.load_state_dict(state.get("trained_model", state["model"]))
            if "trained_model" in state and self.average is not None:
                self.average.load_model_state_dict(state["model"])
            else:  # no average saved (train.ema added on resume): it starts from these weights
                self.weights_loaded()
            self.optimizers.load_state_dict(state["optimizer"])
            if state["scaler"]:  # empty: saved without loss scaling (fp32, bf16); an fp16 run starts its own
                self.scaler.load_state_dict(state["scaler"])
            self.step = int(state["step"])
            self.tokens_seen = int(state["tokens_seen"])
            self.best_val_loss = float(state["best_val_loss"])
            self.batches.load_state_dict(_sampler_state(state))  # keeps this process's own rank
            if "plan" in state:  # absent: written before plans were saved (the loop chose for it)
                self.plan.load_state_dict(state["plan"])
            if state["world_size"] != self.dist.world_size and self.dist.is_main:
                warnings.warn(f"{path} was written by {state['world_size']} process(es), this run has "
                              f"{self.dist.world_size}: the batches and tokens per step differ from the "
                              "original run from here on", stacklevel=2)
            set_random_states(state["random_states"], self.device)
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot resume from it: {str(e).splitlines()[0]}") from None
