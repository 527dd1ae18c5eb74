"""`train.time_budget`: a run that ends within the time given, whatever the machine does meanwhile.

- `TimePlan`: the trainer's plan under a budget. The learning rate follows a recorded
  progress p in [0, 1] (`optim.progress_lr_factor`) instead of a step count. After
  every step the plan counts the steps that still fit in the time left and moves p by
  (1 - p) / (that count), so the rest of the schedule always spans the steps that fit:
  a machine that slows down makes the schedule move faster per step, never jump, the
  last step that fits trains at p = 1, and the run ends (with its last evaluation) when
  no further step fits.
- `Calibration`: before step 1 of a new budget run, throwaway steps (they compile, if asked,
  and warm the caches), one timed evaluation (with its train.show hooks) and one checkpoint
  write give the plan its first measurements; the trainer is then put back as it was
  before the first step, through the same `Trainer.state_dict`/`load_state_dict` a
  checkpoint goes through.
  With tables by passes (`passes`), it counts the passes that fit and takes their entries. The
  tables read the passes the run makes with the dropout they give: a model given a dropout is
  measured again with it, and keeps its own where the dearer step leaves it short of the
  dropout's entry.
- `plan_for`: which plan a run gets. An explicit `--set train.max_steps=N` wins over a
  config's time budget (`explicit_steps`): the budget is off for that run, the schedule is
  `optim.StepPlan`'s, and the run says so.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import torch

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, TrainConfig, duration_text, override_value, parse_duration
from tinyattn.errors import TinyattnError
from tinyattn.system.distributed import rank0_value
from tinyattn.system.timing import synchronize
from tinyattn.train.hooks import DISCARD
from tinyattn.train.optim import StepPlan, progress_lr_factor
from tinyattn.train.passes import PassChoices, PassTables, entry_for

if TYPE_CHECKING:
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.owners import Evaluator
    from tinyattn.train.trainer import Trainer

Clock = Callable[[], float]


class TimePlan:
    """The rate and the end of a run under train.time_budget, from a progress p the time left moves.

    The steps that fit: the budget, less a margin, the exit, the seconds spent (earlier
    sessions' included: the checkpoint holds them) and the last evaluation with its
    checkpoint, with each evaluation due on the way counted at its measured cost, divided
    by the median of the last WINDOW step times. Steps, evaluations (hooks included) and
    checkpoint writes are timed apart (`measuring`), so an evaluation never passes for a
    slow step. Everything a decision reads is in `state_dict`: a resumed run counts the
    time already spent, and given the same clock readings makes the decisions an
    uninterrupted run makes.

    elapsed(): seconds of the budget this process has spent (the CLI counts from its start).
    replan_every: steps between counts (1; a distributed run's rank 0 counts every
    log_interval steps and `share` sends its count to every rank, which count down between).
    """

    kind = "time"
    WINDOW = 31  # step times the median is taken over: a recompile or a stall is outvoted
    RECENT = 3  # evaluations and checkpoint writes: the slowest of the last few is planned for
    MARGIN = 0.015  # of the budget kept for timing noise ...
    EXIT_SECONDS = 1.0  # ... and for the process's exit after the last line (torch's teardown)

    def __init__(self, budget_text: str, config: TrainConfig, elapsed: Clock, *, replan_every: int = 1,
                 share: Callable[[int], int] = lambda count: count):
        self.text = duration_text(budget_text)
        self.seconds = parse_duration(budget_text)
        self.config = config
        self.elapsed = elapsed
        self.replan_every = replan_every
        self.share = share
        self.spent_before = 0.0  # seconds earlier sessions of the run spent (from the checkpoint)
        self.progress = 0.0
        self.steps_left: Optional[int] = None  # the last count of the steps that fit
        self.finished = False
        self.times: dict[str, list[float]] = {"step": [], "eval": [], "save": []}
        self.history: list[tuple] = []  # (step, spent, s/step, steps that fit, progress) per evaluation
        self._mark = 0.0  # elapsed() at the end of the last step
        self._overhead = 0.0  # seconds of evaluations and writes since then

    def spent(self) -> float:
        return self.spent_before + self.elapsed()

    def seed(self, step_seconds: float, eval_seconds: float, save_seconds: float) -> int:
        """The calibration's measurements; returns the steps that fit (0: none)."""
        self.times = {"step": [step_seconds], "eval": [eval_seconds], "save": [save_seconds]}
        self.steps_left = self.share(self.steps_that_fit(0))
        return self.steps_left

    def factor(self, step: int) -> float:
        # The last step that fits trains at p = 1: after_step has moved p there, unless it is also
        # the first after warmup (p has not moved yet), as in a step count's schedule (`lr_factor`).
        last = self.steps_left == 1 and step >= self.config.warmup_steps
        return progress_lr_factor(step, 1.0 if last else self.progress, self.config)

    def done(self, step: int) -> bool:
        return self.finished

    def no_step_fits(self, step: int) -> bool:
        """Whether a resumed plan has no time left for a step: its earlier sessions and this
        one's start-up spent the budget (a run stopped near its end), as the loop would find
        after training one step beyond it. Every rank gets rank 0's answer (`share`). Where this
        session's start-up spent time (rank 0's clock says), the count replaces the checkpoint's,
        which that time had left: a first step that is now the last trains at the floor (`factor`),
        as it would have in one session. Where it spent none (the same clock readings), the
        checkpoint's count stands, as in a run that never stopped (a distributed one counts down
        between its counts), so the decisions are that run's."""
        if not self.times["step"]:
            return False
        fits = self.share(self.steps_that_fit(step))
        if fits == 0 or self.share(int(self.elapsed() > 0)):
            self.steps_left = fits
        return fits == 0

    def total_steps(self, step: int) -> int:
        """The run's length as now planned (the progress bar's total)."""
        return step + (self.steps_left or 0)

    def start(self) -> None:
        """The loop starts: the first step is timed from here."""
        self._mark, self._overhead = self.elapsed(), 0.0

    def after_step(self, step: int) -> None:
        """`step` steps are done: time the last one, count the steps that fit, move p."""
        now = self.elapsed()
        self._record("step", now - self._mark - self._overhead, self.WINDOW)
        self._mark, self._overhead = now, 0.0
        if self.steps_left is None or step % self.replan_every == 0:
            self.steps_left = self.share(self.steps_that_fit(step))
        else:
            self.steps_left = max(0, self.steps_left - 1)
        if self.steps_left == 0:
            self.progress, self.finished = 1.0, True
        elif step > self.config.warmup_steps:  # the step just done was past warmup
            # Spreads what is left of p evenly over the steps left: the last one trains at p = 1.
            self.progress += (1.0 - self.progress) / self.steps_left

    @contextmanager
    def measuring(self, kind: str) -> Iterator[None]:
        """Times an evaluation ("eval", hooks included) or a checkpoint write ("save")."""
        start = self.elapsed()
        try:
            yield
        finally:
            seconds = self.elapsed() - start
            self._overhead += seconds
            self._record(kind, seconds, self.RECENT)

    def steps_that_fit(self, step: int) -> int:
        """How many more steps fit after `step`, evaluations due on the way and the last one counted."""
        step_seconds = max(statistics.median(self.times["step"]), 1e-9)
        evaluation = max(self.times["eval"], default=0.0) + max(self.times["save"], default=0.0)
        left = self.seconds * (1 - self.MARGIN) - self.EXIT_SECONDS - self.spent() - evaluation
        if left < step_seconds:
            return 0
        interval = self.config.eval_interval

        def cost(more: int) -> float:  # the last step's evaluation is in `evaluation` already
            return more * step_seconds + ((step + more - 1) // interval - step // interval) * evaluation

        low, high = 0, int(left / step_seconds)  # cost(high) ignores evaluations: an upper bound
        while low < high:  # the largest count whose cost fits
            middle = (low + high + 1) // 2
            low, high = (middle, high) if cost(middle) <= left else (low, middle - 1)
        return low

    def note(self, step: int) -> str:
        """Records the plan at an evaluation; returns the line that says it."""
        step_seconds = statistics.median(self.times["step"])
        spent = self.spent()
        self.history.append((step, spent, step_seconds, self.steps_left, self.progress))
        return (f"time budget {self.text}: {spent:.0f} s spent, about {self.steps_left:,} more steps at "
                f"{step_seconds:.3f} s/step, schedule {self.progress:.0%} done")

    def describe(self) -> Optional[str]:
        """The run's last line's word on the budget."""
        return f"{self.spent():.0f} s of the {self.text} budget spent"

    def state_dict(self) -> dict:
        return {"kind": self.kind, "ends_at_floor": True, "budget": self.text, "progress": self.progress,
                "spent": self.spent(),
                "steps_left": self.steps_left, "finished": self.finished,
                "times": {kind: list(values) for kind, values in self.times.items()},
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run continues the recorded plan; the budget is this run's config's."""
        self.spent_before = float(state["spent"])
        self.progress = float(state["progress"])
        self.steps_left = state["steps_left"]
        self.finished = bool(state["finished"])
        self.times = {kind: list(values) for kind, values in state["times"].items()}
        self.history = list(state["history"])

    def _record(self, kind: str, seconds: float, keep: int) -> None:
        self.times[kind] = (self.times[kind] + [seconds])[-keep:]


def plan_for(config: TrainConfig, saved: Optional[dict], elapsed: Clock, *, dist: Distributed,
             device: torch.device) -> "StepPlan | TimePlan":
    """The plan of a run. `saved`: the checkpoint a resume continues from, None for a new run.

    A TimePlan for train.time_budget, unless the run resumed recorded no time plan: one
    saved before plans were (its config.yaml holds the step count it chose, which the resume
    took) or one that trained a step count. Otherwise StepPlan (train.max_steps).
    """
    if config.time_budget is None:
        return StepPlan(config)
    if saved is not None and (saved.get("plan") or {}).get("kind") != TimePlan.kind:
        return StepPlan(config)
    if not dist.enabled:
        return TimePlan(config.time_budget, config, elapsed)
    return TimePlan(config.time_budget, config, elapsed, replan_every=config.log_interval,
                    share=partial(rank0_value, dist, device=device))


@dataclass
class Measured:
    """What the calibration measured: seconds per step (of the model chosen), per evaluation, per
    checkpoint write; with a table by passes, what the tables chose for the passes that fit; the
    seconds of the budget spent before the measuring (start-up) and by it (calibration)."""

    step: float
    evaluation: float
    save: float
    choices: Optional[PassChoices] = None
    start_up: float = 0.0
    calibration: float = 0.0


class Calibration:
    """The first measurements of a new budget run, taken before step 1 and then undone.

    Throwaway steps first (they compile, if asked, and warm the caches), then timed steps,
    one evaluation and one checkpoint write; then the model, optimizers, scaler, random
    generators and sampler go back to their state before the first step.
    """

    WARM_STEPS = 3  # the first compiles; the next settle the allocator and thread pool
    # Timed: MIN_SHARE of the budget (1.5 s to 3 s), and at least one step: a first estimate
    # only, which the plan's own step times replace (a slow machine loses no more to it).
    MIN_SHARE = 0.005
    # The advice when no step fits: start-up (imports, data, model) varies between runs of the
    # same command by up to this share of it; and before anything is measured, the untimed
    # steps, the evaluation and the checkpoint write of the measuring are allowed this much.
    START_VARIATION = 0.25
    UNMEASURED_SECONDS = 1.0
    COMPILE_NOTED = 5.0  # seconds of compiling (the warm steps beyond their step time) worth a note

    def __init__(self, plan: TimePlan, clock: Clock, tables: PassTables):
        self.plan = plan
        self.text = plan.text
        self.clock = clock
        self.tables = tables
        self.warm_seconds, self.warm_steps = 0.0, 0  # the untimed steps' (with train.compile: compiling)

    def measure(self, trainer: Trainer, evaluator: Evaluator, run_dir: Path) -> Measured:
        """The measurements; refuses a budget already spent before anything is measured. A stop
        signal meanwhile ends the run at once (`owners.StoppedBeforeStart`), as before it."""
        plan = self.plan
        spent = plan.spent()
        if plan.seconds * (1 - plan.MARGIN) - plan.EXIT_SECONDS - spent <= 0 and not trainer.dist.enabled:
            advice = self.advice(self.advised_budget(spent))
            raise TinyattnError(f"train.time_budget {self.text}: {spent:.0f} s are gone before training, "
                                f"all the budget leaves; no step fits. {advice}")
        # A copy, not the live tensors state_dict() refers to: the measuring steps move those.
        # Without the plan: it measures nothing here, and its clock must not be put back.
        snapshot = copy.deepcopy({k: v for k, v in trainer.state_dict().items() if k != "plan"})
        measured = Measured(self._time_steps(trainer), math.nan, math.nan)
        if self.tables:
            measured = self._choose(trainer, measured.step)
        start = self.clock()
        evaluator.show(evaluator.run(trainer.step), DISCARD, run_dir=None)  # the hooks log nothing here
        eval_seconds = self.clock() - start
        save_seconds = _time_a_save(trainer, run_dir, self.clock)
        trainer.load_state_dict(snapshot, Path("the time budget's snapshot"))
        # An evaluation writes its step checkpoint and, when it is the best so far, best.pt.
        return dataclasses.replace(measured, evaluation=eval_seconds, save=2 * save_seconds,
                                   start_up=spent, calibration=plan.spent() - spent)

    def _choose(self, trainer: Trainer, step_seconds: float) -> Measured:
        """What the tables give the passes the run makes with what they give, from the step
        measured at the config's dropout; the dropout chosen is set on the model.

        A dropout from the table makes every step dearer, so the model is measured again with it
        (and compiled), and takes the entry those passes reach (its cost hardly depends on its
        rate). Where they reach none but the model's own, it keeps its own, and the other tables
        read only their entries below the passes of the dropout entry it fell short of: those are
        for runs with that dropout.
        """
        passes = own_passes = self._expected_passes(trainer, step_seconds)
        own = trainer.model.dropout.p
        by_passes = self.tables.dropout_by_passes
        dropout = entry_for(by_passes, passes)
        tried = below = None
        if dropout is not None and dropout != own:
            trainer.model.set_dropout(dropout)
            with_it = self._time_steps(trainer)
            tried = (dropout, self._expected_passes(trainer, with_it))
            dropout = entry_for(by_passes, tried[1])
            if dropout is None or dropout == own:  # short of every entry giving one at its cost
                trainer.model.set_dropout(own)
                below = min((key for key in by_passes if key > tried[1]), default=None)
            else:  # taken (a lower entry where the cost moved the run below the one tried)
                trainer.model.set_dropout(dropout)
                step_seconds, passes = with_it, tried[1]
        dropout = None if dropout == own else dropout  # None: the model keeps its own
        return Measured(step_seconds, math.nan, math.nan,
                        self.tables.choose(passes, dropout, own_passes=own_passes, tried=tried, below=below))

    def _expected_passes(self, trainer: Trainer, step_seconds: float) -> float:
        """The passes over the text the plan expects at this step time (evaluations aside; in a
        distributed run rank 0's count, so every rank chooses alike)."""
        steps = self.plan.seed(step_seconds, 0.0, 0.0)  # seeded again with every measurement after
        return steps * trainer.tokens_per_step / len(trainer.batches.tokens)

    def advised_budget(self, start_up: float, measured: Optional[Measured] = None) -> int:
        """The least budget (whole seconds) in which the next run of this command fits a step:
        `start_up` seconds (and START_VARIATION more), the measuring (as `measured` took it, or
        before it, its timed part and UNMEASURED_SECONDS), then one step with its evaluation and
        checkpoint writes (`measured`'s), the exit and the plan's margin."""
        plan = self.plan
        needed = start_up * (1 + self.START_VARIATION) + plan.EXIT_SECONDS
        if measured is not None:
            needed += measured.calibration + measured.step + measured.evaluation + measured.save
            return math.ceil(needed / (1 - plan.MARGIN))
        needed += self.UNMEASURED_SECONDS
        at_least = needed / (1 - plan.MARGIN)  # the timed part is longer for a longer budget
        measuring = self._measure_for(at_least + self._measure_for(at_least))
        return math.ceil((needed + measuring) / (1 - plan.MARGIN))

    def advice(self, at_least: int) -> str:
        """What helps when no step fits: a budget of `at_least` seconds (`advised_budget`), or no
        budget (train.max_steps counts only once the budget is off)."""
        return (f"Give a budget of at least {at_least}s (--set train.time_budget={at_least}s), or train "
                "a fixed number of steps: --set train.time_budget=null train.max_steps=N")

    def compile_note(self, trainer: Trainer, step_seconds: float) -> str:
        """Where compiling took much of the budget, says so: a first compile on a machine (an empty
        inductor cache) can take a minute and more, the same command again starts from the cache."""
        compiling = self.warm_seconds - self.warm_steps * step_seconds  # twice with a dropout table
        if not trainer.config.compile or not compiling >= self.COMPILE_NOTED:
            return ""
        return (f" {compiling:.0f} s of them compiled the model (train.compile; inductor keeps what it "
                "compiled on disk, so the same command again may start sooner); --set train.compile=false "
                "trains without compiling.")

    def _measure_for(self, budget_seconds: float) -> float:
        """Seconds of timed steps the measuring takes under a budget of `budget_seconds`."""
        return min(3.0, max(1.5, self.MIN_SHARE * budget_seconds))

    def _time_steps(self, trainer: Trainer) -> float:
        """Seconds per step, after WARM_STEPS untimed ones."""
        start = self.clock()
        for _ in range(self.WARM_STEPS):
            trainer.train_step()
        synchronize(trainer.device)
        self.warm_seconds += self.clock() - start
        self.warm_steps += self.WARM_STEPS
        start, timed = self.clock(), 0
        measure_for = self._measure_for(self.plan.seconds)
        while self._keep_measuring(trainer, timed, self.clock() - start, measure_for):
            trainer.train_step()
            timed += 1
            if timed % 5 == 0:
                synchronize(trainer.device)
        synchronize(trainer.device)
        return (self.clock() - start) / timed if timed else math.nan

    def _keep_measuring(self, trainer: Trainer, timed: int, seconds: float, measure_for: float) -> bool:
        more = timed < 1 or seconds < measure_for
        if trainer.dist.enabled:  # rank 0 decides, so every rank runs the same steps
            more = bool(rank0_value(trainer.dist, int(more), trainer.device))
        return more


def _time_a_save(trainer: Trainer, run_dir: Path, clock: Clock) -> float:
    """Seconds to write one checkpoint of this run, measured into a file deleted after."""
    path = run_dir / f".budget_probe.rank{trainer.dist.rank}.tmp"
    start = clock()
    try:
        ckpt.save_checkpoint(trainer.state_dict(), path)
        return clock() - start
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
    return (f"train.max_steps={config.train.max_steps} given with --set: the time budget "
            f"{duration_text(budget)} is off for this run")
