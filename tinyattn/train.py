"""The training loop: optimizer, schedule, evaluation, logging, checkpoints, exact resume.

`train(config, ...)` runs one training job into `checkpoints/<run-name>/`. It is what
`scripts/train.py` calls, so a run can be started from Python the same way.

What a run guarantees:
- The resolved config (`config.yaml`) and `tokenizer.json` are written before step 1;
  a folder that already holds checkpoints is never trained into without `--resume`.
- Resume is exact: the checkpoint holds the weights, the optimizer and scaler state,
  every random generator and the batch sampler, so N steps + stop + resume + N steps
  gives the same weights as 2N steps (tested on CPU in fp32).
- Ctrl-C or SIGTERM finishes the current step, saves a checkpoint and says how to
  resume. A non-finite loss stops the run naming the step; no checkpoint is written
  after it, so the last good one stays.
- The hot loop never waits for the device except at log intervals: losses stay on the
  device in a small buffer and are read (and checked for NaN) every `log_interval` steps.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, TrainConfig, apply_overrides, config_to_dict, save_config
from tinyattn.attention_maps import log_attention_to_tensorboard, plotting_available
from tinyattn.data import BatchSampler, TokenData, prepare_data
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.evaluate import log_loss_by_position_to_tensorboard, loss_by_position
from tinyattn.model import LanguageModel
from tinyattn.runtime import (Distributed, Precision, init_distributed, measure_peak_flops,
                              prefer_explicit_attention, random_states, seed_everything,
                              select_device, select_precision, set_random_states,
                              shutdown_distributed, synchronize)


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
    wall_seconds: float
    interrupted: bool


# ----------------------------------------------------------------------------- pieces


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup from 0 to lr over warmup_steps, then decay to min_lr at max_steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return config.lr
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    progress = min(progress, 1.0)
    if config.schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear
        decay = 1.0 - progress
    return config.min_lr + decay * (config.lr - config.min_lr)


def make_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norm gains), fused where possible."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel exists for CUDA and (since torch 2.4) the CPU; it does the whole
    # update in one pass over the parameters instead of a chain of foreach ops.
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2),
                             fused=fused, foreach=None if fused else True)


def default_run_name(config_path: Optional[str | Path]) -> str:
    stem = Path(config_path).stem if config_path else "run"
    return f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"


def model_shape_differences(saved: dict, current: dict) -> list[str]:
    """The model keys whose values differ between a checkpoint's config and this one."""
    keys = sorted(set(saved) | set(current))
    return [f"model.{k}: checkpoint {saved.get(k)!r}, config {current.get(k)!r}"
            for k in keys if saved.get(k) != current.get(k) and k != "dropout"]


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


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """Owns the model, optimizer, sampler and counters of one run, and steps them."""

    def __init__(self, config: Config, data: TokenData, device: torch.device,
                 precision: Precision, dist: Distributed = Distributed()):
        self.config = config
        self.train_config = config.train
        self.data = data
        self.device = device
        self.precision = precision
        self.dist = dist
        seed_everything(config.train.seed)
        self.model = LanguageModel(config.model).to(device)
        self.model.use_fused_attention(
            not prefer_explicit_attention(device, precision, config.model.context_length,
                                          config.model.dropout))
        self.optimizer = make_optimizer(self.model, config.train, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision.use_grad_scaler)
        self.sampler = BatchSampler(data.train, config.train.batch_size, config.model.context_length,
                                    seed=config.train.seed, rank=dist.rank, world_size=dist.world_size)
        self.step = 0
        self.tokens_seen = 0
        self.best_val_loss = float("inf")
        self.forward_model: nn.Module = self.model
        if dist.enabled:
            self.forward_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None)
        if config.train.compile:
            self.forward_model = torch.compile(self.forward_model)
        self.tokens_per_step = (config.train.batch_size * config.model.context_length
                                * config.train.grad_accum_steps * dist.world_size)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.sampler.next_batch()
        if self.device.type == "cuda":  # pinned memory lets the copy overlap the running step
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over grad_accum_steps micro-batches; returns (loss, grad norm) on device.

        Each micro-batch loss is divided by the number of micro-batches, so the summed
        gradients are those of the mean loss over one large batch.
        """
        accum = self.train_config.grad_accum_steps
        lr = learning_rate(self.step, self.train_config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
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
        self.scaler.unscale_(self.optimizer)
        max_norm = self.train_config.grad_clip if self.train_config.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += self.tokens_per_step
        return total_loss, grad_norm

    def evaluate(self) -> np.ndarray:
        """Validation loss at each position of the window, (context_length,); its mean is
        the validation loss. The same windows every time, so the number is comparable."""
        # The plain module: a compiled one would compile a second graph for evaluation.
        with self.precision.autocast(self.device):
            return loss_by_position(self.model, self.data.validation, self.config.model.context_length,
                                    self.train_config.batch_size, self.train_config.eval_windows)

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "best_val_loss": self.best_val_loss,
            "random_states": random_states(),
            # Batch k of rank r is a function of (seed, r, k): rank 0's count serves every rank.
            "sampler": self.sampler.state_dict(),
            "world_size": self.dist.world_size,
            "config": config_to_dict(self.config),
            "tokenizer": self.data.tokenizer.to_json(),
        }

    def load_state_dict(self, state: dict, path: Path) -> None:
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.step = int(state["step"])
            self.tokens_seen = int(state["tokens_seen"])
            self.best_val_loss = float(state["best_val_loss"])
            self.sampler.load_state_dict(state["sampler"])  # keeps this process's own rank
            if state["world_size"] != self.dist.world_size and self.dist.is_main:
                print(f"warning: {path} was written by {state['world_size']} process(es), this run has "
                      f"{self.dist.world_size}: the batches and tokens per step differ from the "
                      "original run from here on", file=sys.stderr)
            set_random_states(state["random_states"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{path}: cannot resume from it: {str(e).splitlines()[0]}") from None


# ----------------------------------------------------------------------------- the run


def _find_resume_checkpoint(resume: str | Path | bool, run_dir: Optional[Path],
                            out_dir: Path) -> Path:
    if resume is True:
        if run_dir is not None:  # --run-name NAME --resume: that run and no other
            if not run_dir.is_dir():
                raise CheckpointError(f"{run_dir}: no such run to resume (check --run-name)")
            return ckpt.resolve_checkpoint(run_dir, out_dir, prefer="latest")
        return ckpt.resolve_checkpoint(None, out_dir, prefer="latest")
    return ckpt.resolve_checkpoint(resume, out_dir, prefer="latest")


def run_config(resume: str | Path | bool, run_name: Optional[str], overrides: list[str],
               out_dir: str = "checkpoints") -> tuple[Config, Path]:
    """The saved config of the run to resume (with overrides), and its checkpoint file.

    Used when --resume is given without --config: a run continues as it was started.
    """
    for item in overrides:
        if item.startswith("train.out_dir="):
            out_dir = item.split("=", 1)[1]
    named = Path(out_dir) / run_name if run_name else None
    file = _find_resume_checkpoint(resume, named, Path(out_dir))
    state = ckpt.load_checkpoint(file)
    config = apply_overrides(ckpt.config_from_checkpoint(state, file), overrides, origin=str(file))
    return config, file


def prepare_run(config: Config, *, config_path=None, run_name=None, resume=None):
    """Decide the run folder and, when resuming, the checkpoint to continue from."""
    out_dir = Path(config.train.out_dir)
    resume_file = None
    if resume:
        named = out_dir / run_name if run_name else None
        resume_file = _find_resume_checkpoint(resume, named, out_dir)
        run_dir = resume_file.parent
    else:
        run_dir = out_dir / (run_name or default_run_name(config_path))
        if ckpt.has_checkpoints(run_dir):
            raise CheckpointError(f"{run_dir} already holds checkpoints; continue it with --resume "
                                  f"{run_dir}, or choose another --run-name")
    return run_dir, resume_file


def train(config: Config, *, config_path: Optional[str | Path] = None, run_name: Optional[str] = None,
          resume: Optional[str | Path | bool] = None, device: Optional[str] = None,
          progress: bool = True, stop_at_step: Optional[int] = None) -> TrainResult:
    """Run (or resume) one training job. Returns where it went and the figures it reached.

    stop_at_step ends the run early with a checkpoint, as Ctrl-C would, while the
    schedule still spans train.max_steps: a long run can be split across sessions.
    """
    dist = init_distributed(device or config.train.device)
    try:
        return _train(config, config_path, run_name, resume, device, progress, stop_at_step, dist)
    finally:
        shutdown_distributed(dist)


def _train(config, config_path, run_name, resume, device_name, progress, stop_at_step,
           dist: Distributed) -> TrainResult:
    run_dir, resume_file = prepare_run(config, config_path=config_path, run_name=run_name, resume=resume)
    resume_state = None
    if resume_file is not None:
        resume_state = ckpt.load_checkpoint(resume_file)
        saved = ckpt.config_from_checkpoint(resume_state, resume_file)
        current = config_to_dict(config)["model"]
        if current.get("vocab_size") is None:
            current["vocab_size"] = saved.model.vocab_size
        differences = model_shape_differences(config_to_dict(saved)["model"], current)
        if differences:
            raise CheckpointError(f"{resume_file}: the config's model differs from the checkpoint's: "
                                  + "; ".join(differences))
        config.model.vocab_size = saved.model.vocab_size

    device = select_device(device_name or config.train.device)
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    precision = select_precision(config.train.precision, device)
    if dist.enabled and not dist.is_main:
        torch.distributed.barrier()  # rank 0 builds the token cache; the others then read it
    data = prepare_data(config, progress=progress and dist.is_main)
    if dist.enabled and dist.is_main:
        torch.distributed.barrier()
    if config.model.vocab_size is None:
        config.model.vocab_size = data.tokenizer.vocab_size
    elif config.model.vocab_size < data.tokenizer.vocab_size:
        raise TinyattnError(f"model.vocab_size={config.model.vocab_size} is smaller than the "
                            f"tokenizer's vocabulary ({data.tokenizer.vocab_size}); leave it unset")

    if resume_state is not None and resume_state.get("tokenizer") != data.tokenizer.to_json():
        raise CheckpointError(f"{resume_file}: its tokenizer differs from the one the data now "
                              "builds (the corpus or tokenizer settings changed); token ids would "
                              "no longer mean what the model learned")
    # Measured before the random states are seeded or restored: it draws its own numbers.
    peak = config.train.peak_flops or measure_peak_flops(device, precision)
    trainer = Trainer(config, data, device, precision, dist)
    if resume_state is not None:
        trainer.load_state_dict(resume_state, resume_file)
        del resume_state
    if stop_at_step is not None and stop_at_step <= trainer.step:
        raise TinyattnError(f"--stop-at-step {stop_at_step}: the run is already at step {trainer.step}; "
                            "give a later step")
    log = Logger(run_dir, config, trainer, enabled=dist.is_main, progress=progress)
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / "config.yaml")
        data.tokenizer.save(run_dir / "tokenizer.json")
        log.start(resume_file)

    try:
        flops_per_token = trainer.model.flops_per_token()
        tc = config.train
        stopper = StopRequest()
        losses = torch.zeros(tc.log_interval, device=device)  # read once per log interval
        pending = 0  # steps whose losses wait in `losses`
        train_time, train_tokens = 0.0, 0
        interval_start, interval_tokens = time.perf_counter(), 0
        last_val = float("nan")
        at_eval = False
        started = time.perf_counter()

        def save(best: bool) -> None:
            if dist.is_main:
                state = trainer.state_dict()
                ckpt.save_checkpoint(state, run_dir / ckpt.step_filename(trainer.step))
                ckpt.prune_checkpoints(run_dir, tc.keep_last)
                if best:
                    ckpt.save_checkpoint(state, run_dir / ckpt.BEST)
            if dist.enabled:
                torch.distributed.barrier()

        with stopper.installed():
            last_step = tc.max_steps if stop_at_step is None else min(tc.max_steps, stop_at_step)
            while trainer.step < last_step and stopper.signal_name is None:
                loss, grad_norm = trainer.train_step()
                losses[pending] = loss
                pending += 1
                interval_tokens += trainer.tokens_per_step
                at_eval = trainer.step % tc.eval_interval == 0 or trainer.step == last_step
                # Every checkpoint is preceded by a log, whose loss check keeps NaN weights out.
                stopping = stopper.signal_name is not None
                at_log = pending == tc.log_interval or at_eval or stopping
                if at_log:
                    synchronize(device)
                    now = time.perf_counter()
                    window = losses[:pending].tolist()  # the one host sync of the interval
                    pending = 0
                    bad = [i for i, value in enumerate(window) if not math.isfinite(value)]
                    if bad:
                        failed_step = trainer.step - len(window) + 1 + bad[0]
                        last = ckpt.latest_checkpoint(run_dir)
                        kept = f"; the last good checkpoint is {last}" if last else ""
                        raise TrainingError(f"the loss became {window[bad[0]]} at step {failed_step}; "
                                            f"training stopped{kept} (try a lower train.lr)")
                    elapsed = now - interval_start
                    train_time += elapsed
                    train_tokens += interval_tokens
                    tokens_per_second = interval_tokens / elapsed
                    mfu = flops_per_token * tokens_per_second / (peak * dist.world_size)
                    log.train(trainer.step, sum(window) / len(window), learning_rate(trainer.step - 1, tc),
                              grad_norm.item(), tokens_per_second, mfu, len(window))
                if at_eval:
                    position_losses = trainer.evaluate()
                    last_val = float(position_losses.mean())
                    best = last_val < trainer.best_val_loss
                    if best:
                        trainer.best_val_loss = last_val
                    save(best)
                    log.evaluation(trainer.step, last_val, position_losses, best)
                if at_log:
                    interval_start, interval_tokens = time.perf_counter(), 0
            interrupted = stopper.signal_name is not None
            if interrupted and not at_eval:
                save(best=False)
        stopped_early = interrupted or trainer.step < tc.max_steps
        wall = time.perf_counter() - started
        result = TrainResult(run_dir, trainer.step, trainer.tokens_seen, trainer.best_val_loss, last_val,
                             train_tokens / train_time if train_time else float("nan"), wall, interrupted)
        log.finish(result, stopper.signal_name or ("--stop-at-step" if stopped_early else None))
        return result
    finally:
        log.close()  # the TensorBoard writer and the bar, also when training fails


# ----------------------------------------------------------------------------- logging


class Logger:
    """The progress bar, the plain log lines and TensorBoard, on the main process only."""

    def __init__(self, run_dir: Path, config: Config, trainer: Trainer, enabled: bool, progress: bool):
        self.run_dir = run_dir
        self.config = config
        self.trainer = trainer
        self.enabled = enabled
        self.writer = None
        self.bar = None
        self.progress = progress and enabled

    def start(self, resume_file: Optional[Path]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.run_dir))
        t = self.trainer
        what = f"resuming from {resume_file} at step {t.step}" if resume_file else "starting"
        self.print(f"run {self.run_dir} ({what}): {t.model.num_parameters():,} parameters, "
                   f"device {t.device}, precision {t.precision.name}, "
                   f"{len(t.data.train):,} train / {len(t.data.validation):,} validation tokens")
        self.writer.add_text("config", "```\n" + (self.run_dir / "config.yaml").read_text() + "\n```", t.step)
        if self.progress:
            self.bar = tqdm(total=self.config.train.max_steps, initial=t.step, unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def train(self, step, loss, lr, grad_norm, tokens_per_second, mfu, steps_done) -> None:
        if not self.enabled:
            return
        w = self.writer
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/learning_rate", lr, step)
        w.add_scalar("train/grad_norm", grad_norm, step)
        w.add_scalar("train/tokens_seen", self.trainer.tokens_seen, step)
        w.add_scalar("perf/tokens_per_second", tokens_per_second, step)
        w.add_scalar("perf/mfu", mfu, step)
        if self.bar is not None:
            self.bar.update(steps_done)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:,.0f}",
                                 refresh=False)
        else:
            self.print(f"step {step}: loss {loss:.4f}, lr {lr:.2e}, {tokens_per_second:,.0f} tok/s, "
                       f"mfu {mfu:.1%}")

    def evaluation(self, step: int, val_loss: float, position_losses: np.ndarray, best: bool) -> None:
        if not self.enabled:
            return
        self.writer.add_scalar("val/loss", val_loss, step)
        self.print(f"step {step}: validation loss {val_loss:.4f}{' (best)' if best else ''}")
        self.log_sample(step)
        # The pictures need matplotlib (the plot extra); the numbers are logged without it.
        plots = plotting_available()
        log_loss_by_position_to_tensorboard(self.writer, position_losses, step, image=plots)
        if plots and self.config.train.probe_text:
            t = self.trainer
            log_attention_to_tensorboard(self.writer, t.model, t.data.tokenizer,
                                         self.config.train.probe_text, step)
        self.writer.flush()

    def log_sample(self, step: int) -> None:
        from tinyattn.generate import generate

        t, s = self.trainer, self.config.sample
        if self.config.train.sample_tokens == 0:
            return
        generator = torch.Generator(device=t.device).manual_seed(self.config.train.seed)
        text = "".join(generate(t.model, t.data.tokenizer, s.prompt,
                                max_new_tokens=self.config.train.sample_tokens,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                generator=generator))
        with open(self.run_dir / "samples.txt", "a", encoding="utf-8") as f:
            f.write(f"--- step {step} ---\n{text}\n")
        self.writer.add_text("sample", "```\n" + text + "\n```", step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def finish(self, result: TrainResult, signal_name: Optional[str]) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        hparams = {f"{section}.{k}": v for section, values in config_to_dict(self.config).items()
                   if section in ("model", "train") for k, v in values.items()
                   if isinstance(v, (int, float, str, bool))}
        self.writer.add_hparams(hparams, {"hparam/best_val_loss": result.best_val_loss,
                                          "hparam/last_val_loss": result.last_val_loss}, run_name=".")
        self.close()
        if signal_name:
            print(f"stopped by {signal_name} at step {result.step}; checkpoint saved in {result.run_dir}. "
                  f"Resume with: python scripts/train.py --resume {result.run_dir}", file=sys.stderr)
        else:
            print(f"done: {result.step} steps in {result.wall_seconds:.0f} s, "
                  f"{result.tokens_per_second:,.0f} tok/s, best validation loss "
                  f"{result.best_val_loss:.4f}; checkpoints in {result.run_dir}", file=sys.stderr)
