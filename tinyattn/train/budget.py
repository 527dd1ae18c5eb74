"""`train.time_budget`: a step count that makes the whole process fit the time given.

`StepBudget` runs throwaway steps (they compile, if asked, and warm the caches), times the
steps after them, one evaluation (with its train.show hooks) and one checkpoint write, and
then puts the trainer back as it was before the first step, through the same
`Trainer.state_dict`/`load_state_dict` a checkpoint goes through. The run then trains
exactly as a run with that `max_steps` would.

An explicit `--set train.max_steps=N` wins over a config's time budget: the budget is off
for that run, and the run says so (`explicit_steps`).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, override_value, parse_duration
from tinyattn.errors import TinyattnError
from tinyattn.system.timing import synchronize
from tinyattn.train.hooks import DISCARD

if TYPE_CHECKING:
    from tinyattn.train.owners import Evaluator
    from tinyattn.train.trainer import Trainer


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
                  elapsed: Callable[[], float], *,
                  stop: Callable[[], bool] = lambda: False) -> tuple[int, str]:
        """The step count for the budget, and one line saying how it was chosen.

        elapsed(): seconds of the budget already spent (the CLI counts from process start).
        stop(): True once a stop was asked for (Ctrl-C, SIGTERM); checked after each
        measuring step, it ends the measurement with `CalibrationStopped`, the trainer
        put back as it was and nothing left in run_dir.
        """
        tc = trainer.config
        left = self.seconds * (1 - self.MARGIN) - self.EXIT_SECONDS - elapsed()
        if left <= 0 and not trainer.dist.enabled:  # spent already: refuse before measuring anything
            advice = self._advice(elapsed() + 1.5)  # the measuring alone takes 1.5 s or more
            raise TinyattnError(f"train.time_budget {self.text}: {elapsed():.0f} s are gone before training, "
                                f"all the budget leaves; no step fits. {advice}")
        # A copy, not the live tensors state_dict() refers to: the measuring steps move those.
        snapshot = copy.deepcopy(trainer.state_dict())
        step_seconds = self._time_steps(trainer, stop)
        eval_seconds = save_seconds = math.nan
        if not stop():
            start = time.perf_counter()
            evaluator.show(evaluator.run(trainer.step), DISCARD, run_dir=None)  # the hooks log nothing here
            eval_seconds = time.perf_counter() - start
            save_seconds = _time_a_save(trainer, run_dir)
        trainer.load_state_dict(snapshot, Path("the time budget's snapshot"))
        if stop():  # at any point of the measurement: the trainer is as it was, run_dir untouched
            raise CalibrationStopped()

        spent = elapsed()
        available = self.seconds * (1 - self.MARGIN) - self.EXIT_SECONDS - spent
        per_step = step_seconds + (eval_seconds + 2 * save_seconds) / tc.eval_interval
        steps = int((available - eval_seconds - 2 * save_seconds) / per_step)
        if steps < 1:
            raise TinyattnError(
                f"train.time_budget {self.text}: {spent:.0f} s are gone before training and a "
                f"step takes {step_seconds:.2f} s; no step fits. "
                + self._advice(spent + eval_seconds + 2 * save_seconds + per_step))
        why = (f"time budget {self.text}: measured {step_seconds:.3f} s/step, {eval_seconds:.2f} s per "
               f"evaluation, {save_seconds:.2f} s per checkpoint, {spent:.0f} s of start-up "
               f"-> {steps:,} steps")
        return steps, why


    def _advice(self, seconds_needed: float) -> str:
        """What helps when no step fits: a budget that holds `seconds_needed` of the run's own
        time, or no budget (train.max_steps counts only once the budget is off)."""
        at_least = math.ceil((seconds_needed + self.EXIT_SECONDS) / (1 - self.MARGIN))
        return (f"Give a budget of at least {at_least}s (--set train.time_budget={at_least}s), or train "
                "a fixed number of steps: --set train.time_budget=null train.max_steps=N")

    def _time_steps(self, trainer: Trainer, stop: Callable[[], bool]) -> float:
        """Seconds per step, after WARM_STEPS untimed ones; ends early (any value) once stop()."""
        for _ in range(self.WARM_STEPS):
            trainer.train_step()
            if stop():
                return math.nan
        synchronize(trainer.device)
        start, timed = time.perf_counter(), 0
        measure_for = min(3.0, max(1.5, self.MIN_SHARE * self.seconds))
        while self._keep_measuring(trainer, timed, time.perf_counter() - start, measure_for, stop=stop):
            trainer.train_step()
            timed += 1
            if timed % 5 == 0:
                synchronize(trainer.device)
        synchronize(trainer.device)
        return (time.perf_counter() - start) / timed if timed else math.nan

    def _keep_measuring(self, trainer: Trainer, timed: int, seconds: float, measure_for: float, *,
                        stop: Callable[[], bool]) -> bool:
        more = (timed < self.MIN_STEPS or seconds < measure_for) and not stop()
        if trainer.dist.enabled:  # rank 0 decides, so every rank runs the same steps
            flag = torch.tensor([int(more)], device=trainer.device)
            torch.distributed.broadcast(flag, src=0)
            more = bool(flag.item())
        return more


class CalibrationStopped(Exception):
    """A stop (Ctrl-C, SIGTERM) arrived while the time budget was measured; nothing was trained."""


def _time_a_save(trainer: Trainer, run_dir: Path) -> float:
    """Seconds to write one checkpoint of this run, measured into a file deleted after."""
    path = run_dir / f".budget_probe.rank{trainer.dist.rank}.tmp"
    start = time.perf_counter()
    try:
        ckpt.save_checkpoint(trainer.state_dict(), path)
        return time.perf_counter() - start
    finally:
        path.unlink(missing_ok=True)


def explicit_steps(config: Config, overrides: Sequence[str]) -> Optional[str]:
    """Turn train.time_budget off when `overrides` (the --set items) give train.max_steps.

    The step count the user typed wins over the budget of the config file (or of the run
    being resumed). Returns the line the run prints about it, None when nothing changed.
    """
    if config.train.time_budget is None or override_value(list(overrides), "train.max_steps", None) is None:
        return None
    budget, config.train.time_budget = config.train.time_budget, None
    return (f"train.max_steps={config.train.max_steps} given with --set: the time budget {budget} is off "
            "for this run")
