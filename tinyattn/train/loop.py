"""The training run: `train(config, ...)` and the loop.

`train(config, ...)` runs one training job into `<train.out_dir>/<run-name>/`; it is what
`scripts/train.py` calls. The loop (`_loop`) reads in one screen and hands each per-step
decision to an owner: `trainer.Trainer` steps, `owners` holds `LossWindow`, `Evaluator`
(the validation loss) and `Checkpointer`; `resume` finds what a run continues from and
holds its folder, `budget` fixes the step count for `train.time_budget`, and `log` shows
the run (console, TensorBoard, train.log). What an evaluation shows beyond the validation
loss is a hook that train.show lists (`hooks`), imported only then: importing this module
loads no analysis, generation, plotting or Hugging Face code.

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
- A model whose training step cannot fit in the device's free memory (`model.memory`) is
  refused before the run folder is made, naming both figures.
- Ctrl-C or SIGTERM finishes the current step, saves a checkpoint and says how to resume;
  during the time budget's calibration it stops before step 1, with nothing to save.
  A non-finite loss stops the run naming the step; no checkpoint is written after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from tinyattn.config import Config, TrainConfig, save_config
from tinyattn.data.batches import prepare_data
from tinyattn.errors import TinyattnError
from tinyattn.model.memory import check_training_fits
from tinyattn.system.device import measure_peak_flops, select_device, select_precision
from tinyattn.system.distributed import Distributed, init_distributed, shutdown_distributed
from tinyattn.train.budget import CalibrationStopped, StepBudget, explicit_steps
from tinyattn.train.finetune import InitSource, adopt_model, init_source
from tinyattn.train.hooks import resolve_hooks
from tinyattn.train.log import Logger, RunLog
from tinyattn.train.owners import Checkpointer, Evaluator, LossWindow, StopRequest, Timers
from tinyattn.train.resume import ResumePoint, keep_user_config, open_run_folder, save_data_fingerprint
from tinyattn.train.trainer import Trainer, TrainResult

DEFAULT_OUT_DIR = TrainConfig.out_dir


@dataclass
class _Request:
    """What `train` was asked besides the config."""

    config_path: Optional[str | Path]
    run_name: Optional[str]
    resume: "Optional[ResumePoint | str | Path | bool]"
    device: Optional[str]
    progress: bool
    stop_at_step: Optional[int]
    allow_data_change: bool  # --allow-data-change: a resume may go on with changed data (logged)
    started: float  # perf_counter() at the start of the time budget
    notes: list[str]  # lines the run prints after its first one

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def train(config: Config, *, config_path: Optional[str | Path] = None, run_name: Optional[str] = None,
          resume: "Optional[ResumePoint | str | Path | bool]" = None, device: Optional[str] = None,
          progress: bool = True, stop_at_step: Optional[int] = None, elapsed_before: float = 0.0,
          overrides: Sequence[str] = (), allow_data_change: bool = False) -> TrainResult:
    """Run (or resume) one training job. Returns where it went and the figures it reached.

    resume: a `ResumePoint`, a run folder or checkpoint file, or True (the --run-name
    run, else the most recent one under train.out_dir). stop_at_step ends the run early
    with a checkpoint, as Ctrl-C would, while the schedule still spans train.max_steps.
    elapsed_before: seconds already spent that count against train.time_budget (the
    command line passes the process's age, so the budget covers start-up too).
    overrides: the --set items `config` was loaded with (already applied); a
    train.max_steps among them wins over train.time_budget, which is then off (the run says so).
    allow_data_change: resume even though the data differs from what the checkpoint trained
    on (refused otherwise, naming what changed); train.log says so.
    """
    note = explicit_steps(config, overrides)
    request = _Request(config_path=config_path, run_name=run_name, resume=resume, device=device,
                       progress=progress, stop_at_step=stop_at_step, allow_data_change=allow_data_change,
                       started=time.perf_counter() - elapsed_before, notes=[note] if note else [])
    dist = init_distributed(device or config.train.device)
    try:
        return _train(config, request, dist)
    finally:
        shutdown_distributed(dist)


def _train(config: Config, request: _Request, dist: Distributed) -> TrainResult:
    timers = Timers()
    point = request.resume
    if point is not None and not isinstance(point, ResumePoint):
        point = ResumePoint.find(point, request.run_name, config.train.out_dir)
    if point is not None:
        if config.train.init_from:  # the model and tokenizer its source gave it (not read again)
            adopt_model(config, point.config.model, point.config.tokenizer, f"{point.file} (train.init_from)")
        point.adopt(config)
        request.notes[:0] = point.notes  # what the resume took from config.yaml
    source = init_source(config) if point is None else None  # fine-tuning: train.init_from
    device = select_device(request.device or config.train.device)  # a bad one fails before the folder is made
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    check_training_fits(config.model, config.train, device)  # before the folder; vocab_size may be unknown
    run_dir, lock = open_run_folder(config, request.config_path, request.run_name, point, dist)
    with lock, RunLog(run_dir, enabled=dist.is_main):
        return _train_in(run_dir, config, request, point=point, device=device, dist=dist, timers=timers,
                         source=source)


def _train_in(run_dir: Path, config: Config, request: _Request, *, point: Optional[ResumePoint],
              device: torch.device, dist: Distributed, timers: Timers,
              source: Optional[InitSource]) -> TrainResult:
    trainer, evaluator, data = _build(config, request, point=point, device=device, dist=dist)
    if point is not None:
        point.restore(trainer)
    elif source is not None:
        source.load_into(trainer.model)
    stop_at_step = request.stop_at_step
    if stop_at_step is not None and stop_at_step <= trainer.step:
        raise TinyattnError(f"--stop-at-step {stop_at_step}: the run is already at step {trainer.step}; "
                            "give a later step")
    # MFU's denominator; the measurement draws from its own generator, so exact resume is unaffected.
    peak = config.train.peak_flops or measure_peak_flops(device, trainer.precision)
    log = Logger(run_dir, config, trainer, peak_flops=peak, enabled=dist.is_main, progress=request.progress)
    log.announce(point)
    for line in request.notes:
        log.print(line)
    if point is None and config.train.time_budget is not None:
        stopped = _calibrate(config, trainer, evaluator, run_dir, request=request, log=log, timers=timers)
        if stopped is not None:
            return stopped

    checkpointer = Checkpointer(run_dir, config, data.tokenizer, dist)
    checkpointer.run_state["data"] = data.fingerprint  # what every checkpoint says it trained on
    if dist.is_main:  # written only now that training can start: a failed command changes nothing
        if point is not None and point.forks_into(run_dir):
            point.fork_into(run_dir)
        kept = keep_user_config(run_dir, point)  # the user's edited config.yaml is never lost
        if kept:
            log.print(kept)
        save_config(config, run_dir / "config.yaml")
        data.tokenizer.save(run_dir / "tokenizer.json")
        save_data_fingerprint(data.fingerprint, run_dir)
        log.start()
    timers.seconds["start-up"] = request.elapsed() - timers.seconds.get("calibration", 0.0)
    try:
        last_step = config.train.max_steps
        if stop_at_step is not None:
            last_step = min(last_step, stop_at_step)
        signal_name, last_val = _loop(trainer, evaluator, checkpointer, log, timers=timers,
                                      last_step=last_step, run_dir=run_dir)
        result = TrainResult(run_dir, trainer.step, trainer.tokens_seen, trainer.best_val_loss, last_val,
                             log.tokens_per_second, request.elapsed(), signal_name is not None,
                             dict(timers.seconds))
        stopped_early = signal_name or ("--stop-at-step" if trainer.step < config.train.max_steps else None)
        log.finish(result, stopped_early)
        return result
    finally:
        log.close()  # the TensorBoard writer and the bar, also when training fails


def _build(config: Config, request: _Request, *, point: Optional[ResumePoint], device: torch.device,
           dist: Distributed) -> tuple[Trainer, Evaluator, object]:
    """The data, a seeded Trainer over it and the Evaluator with train.show's hooks."""
    precision = select_precision(config.train.precision, device)
    data = _prepare_data(config, dist, request.progress, point=point)
    if point is not None:
        note = point.check_data(data.fingerprint, allow_change=request.allow_data_change)
        request.notes.extend([note] if note else [])
    check_training_fits(config.model, config.train, device)  # again, now with the vocabulary's size
    trainer = Trainer.build(config.model, config.train, data.train, device=device, precision=precision,
                            dist=dist)
    hooks = resolve_hooks(config.train.show) if dist.is_main else ()
    evaluator = Evaluator(trainer, config, data.validation, data.tokenizer, dist=dist, hooks=hooks)
    return trainer, evaluator, data


def _calibrate(config: Config, trainer: Trainer, evaluator: Evaluator, run_dir: Path, *,
               request: _Request, log: Logger, timers: Timers) -> Optional[TrainResult]:
    """Sets train.max_steps for the time budget; a stop signal meanwhile ends the run before
    step 1 (the result, interrupted), with nothing written but the line in train.log."""
    stopper = StopRequest()
    try:
        with timers("calibration"), stopper.installed():
            config.train.max_steps = _budget_steps(trainer, evaluator, run_dir, request.elapsed, log,
                                                   stop=lambda: stopper.signal_name is not None)
    except CalibrationStopped:
        log.print(f"stopped by {stopper.signal_name} during the time budget's calibration, before step 1: "
                  f"nothing was trained or saved in {run_dir}; run the command again to start over")
        log.close()
        return TrainResult(run_dir, 0, 0, trainer.best_val_loss, float("nan"), 0.0, request.elapsed(), True,
                           dict(timers.seconds))
    return None


def _budget_steps(trainer: Trainer, evaluator: Evaluator, run_dir: Path, elapsed: Callable[[], float],
                  log: "Logger", *, stop: Callable[[], bool]) -> int:
    """train.max_steps for the time budget, the same on every rank; says how it was chosen."""
    steps, why = StepBudget(trainer.config.time_budget).fix_steps(trainer, evaluator, run_dir, elapsed,
                                                                  stop=stop)
    if trainer.dist.enabled:
        chosen = [steps]
        torch.distributed.broadcast_object_list(chosen, src=0)  # rank 0's measurement decides
        steps = chosen[0]
    log.print(why)
    return steps


def _prepare_data(config: Config, dist: Distributed, progress: bool, *, point: Optional[ResumePoint] = None):
    """The token data (rank 0 builds the cache, the others then read it); sets vocab_size."""
    if dist.enabled and not dist.is_main:
        torch.distributed.barrier()
    data = prepare_data(config, progress=progress and dist.is_main)
    if dist.enabled and dist.is_main:
        torch.distributed.barrier()
    if point is not None:  # first: new characters are the cause a vocab_size check would hide
        point.check_tokenizer(data.tokenizer)
    if config.model.vocab_size is None:
        config.model.vocab_size = data.tokenizer.vocab_size
    elif config.model.vocab_size < data.tokenizer.vocab_size:
        raise TinyattnError(f"model.vocab_size={config.model.vocab_size} is smaller than the "
                            f"tokenizer's vocabulary ({data.tokenizer.vocab_size}); leave it unset")
    return data


def _loop(trainer: Trainer, evaluator: Evaluator, checkpointer: Checkpointer, log: "Logger", *,
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
