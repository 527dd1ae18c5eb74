"""The training run: `train(config, ...)` and the loop.

`train(config, ...)` runs one training job into `<train.out_dir>/<run-name>/`; it is what
`scripts/train.py` calls. The loop (`_loop`) reads in one screen and hands each per-step
decision to an owner: `trainer.Trainer` steps, `owners` holds `LossWindow`, `Evaluator`
(the validation loss) and `Checkpointer`; `resume` finds what a run continues from and
holds its folder, `budget` plans a `train.time_budget` run by the time left, and `log` shows
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
- Ctrl-C or SIGTERM finishes the current step, saves a checkpoint and says how to resume (a
  second one stops at once, naming the checkpoint the folder keeps, and says how to resume);
  before the run's first write (the time budget's calibration included) it ends the run at
  once (`owners.StoppedBeforeStart`), and a new run takes back its folder; from the first write
  on a stop before step 1 saves the weights the run starts from, so its folder resumes. Under
  DDP a signal to one rank stops every rank after the same step (`owners.SharedStop`).
  A non-finite loss stops the run naming the step; no checkpoint is written after it.
- Under train.time_budget the whole process ends within the budget, however the machine's
  speed changes during the run (`budget.TimePlan`): the schedule follows the time left and
  the run ends when no further step fits, with its last evaluation and checkpoint. Before
  step 1 its calibration may set the dropout, the schedule's floor and the weight decay from
  the passes that fit (train.dropout_by_passes, train.floor_by_passes, train.decay_by_passes),
  and config.yaml records what it chose. A new run of train.max_steps takes the same tables'
  entries for the passes its steps make.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from tinyattn import checkpoint as ckpt
from tinyattn.config import (PASS_TABLES, Config, TrainConfig, for_precision, given_keys, override_keys,
                             save_config)
from tinyattn.data.batches import prepare_data
from tinyattn.data.tokenizer import unused_tokenizer_options
from tinyattn.errors import StorageError, TinyattnError
from tinyattn.model.memory import check_training_fits
from tinyattn.system.device import measure_peak_flops, select_device, select_precision
from tinyattn.system.distributed import (Distributed, PeerGone, departure_said, init_distributed,
                                         leave_together, mistake_alike, refusal_shared, said_once,
                                         shutdown_distributed)
from tinyattn.train.budget import Calibration, Measured, TimePlan, explicit_steps, plan_for
from tinyattn.train.finetune import InitSource, adopt_model, init_source
from tinyattn.train.hooks import resolve_hooks
from tinyattn.train.optim import unused_options, warmup_warning
from tinyattn.train.log import Logger, RunLog, stopped_at_once
from tinyattn.train.owners import (Checkpointer, Evaluator, LossWindow, SharedStop, StopRequest,
                                   StoppedAtOnce, StoppedBeforeStart, Timers, ignore_stop_signals)
from tinyattn.train.passes import PassChoices, PassTables, choose_by_steps, entry_for, shown_passes
from tinyattn.train.resume import ResumePoint, keep_user_config, open_run_folder, save_data_fingerprint
from tinyattn.train.run_folder import RunLock, remove_failed_start
from tinyattn.train.trainer import Trainer, TrainResult

DEFAULT_OUT_DIR = TrainConfig.out_dir


@dataclass
class _Request:
    """What `train` was asked besides the config."""

    config_path: Optional[str | Path]
    run_name: Optional[str]
    resume: "Optional[ResumePoint | str | Path | bool]"
    progress: bool
    stop_at_step: Optional[int]
    allow_data_change: bool  # --allow-data-change: a resume may go on with changed data (logged)
    started: float  # clock() at the start of the time budget
    notes: list[str]  # lines the run prints after its first one
    clock: Callable[[], float] = time.perf_counter  # the time budget's clock (a test's fake one)
    given: tuple[str, ...] = ()  # the dotted keys --set gave: by_precision does not change them
    # The keys the user gave the config (config.written_keys): a fine-tune compares these with its source
    written: frozenset[str] = frozenset()
    # The keys --config's own file and --set gave, not the files it extends (a parent's options
    # are the defaults of its family): a new run notes those of them nothing reads (`unused_options`)
    own: frozenset[str] = frozenset()
    resume_advice: bool = True  # a stopped run's last line says how to resume it

    def elapsed(self) -> float:
        return self.clock() - self.started


def train(config: Config, *, config_path: Optional[str | Path] = None, run_name: Optional[str] = None,
          resume: "Optional[ResumePoint | str | Path | bool]" = None, device: Optional[str] = None,
          progress: bool = True, stop_at_step: Optional[int] = None, elapsed_before: float = 0.0,
          overrides: Sequence[str] = (), allow_data_change: bool = False,
          clock: Callable[[], float] = time.perf_counter, resume_advice: bool = True) -> TrainResult:
    """Run (or resume) one training job. Returns where it went and the figures it reached.

    config_path: the YAML file `config` was loaded from (with `overrides`), or None (a Config
    built in Python, or --resume's own): names a new run folder, and tells a fine-tune which
    model and tokenizer keys the user gave (`config.written_keys`).
    resume: a `ResumePoint`, a run folder or checkpoint file, or True (the --run-name
    run, else the most recent one under train.out_dir). stop_at_step ends the run early
    with a checkpoint, as Ctrl-C would, while the schedule still spans train.max_steps (or
    the time budget).
    device (--device): overrides train.device; config.yaml records it, so a resume runs where
    the run ran (and in its precision, where train.precision is auto).
    elapsed_before: seconds already spent that count against train.time_budget (the
    command line passes the process's age, so the budget covers start-up too).
    overrides: the --set items `config` was loaded with (already applied); a
    train.max_steps among them wins over train.time_budget, which is then off (the run says so).
    allow_data_change: resume even though the data differs from what the checkpoint trained
    on (refused otherwise, naming what changed); train.log says so.
    clock: seconds, for the time budget and the wall-time split (tests give a fake one).
    resume_advice: a stopped run's last line says how to resume it; False for a caller that says what
    to do next itself (a lab, which would not read a resumed run).
    """
    note = explicit_steps(config, overrides)
    written, own = given_keys(config, config_path, overrides)
    if device is not None:
        config.train.device = device
    request = _Request(config_path=config_path, run_name=run_name, resume=resume, progress=progress,
                       stop_at_step=stop_at_step, allow_data_change=allow_data_change,
                       started=clock() - elapsed_before, notes=[note] if note else [], clock=clock,
                       given=override_keys(overrides), written=written, own=own, resume_advice=resume_advice)
    # Until the first step a stop has no step to finish: it ends the run at once (the loop's turn
    # comes with the first step), and a new run's folder goes with it.
    stopper = StopRequest(at_once=True)
    dist = init_distributed(config.train.device)
    try:
        with stopper.installed(), _said_by_rank_0(dist, stopper):
            result = _train(config, request, dist, stopper)
        leave_together(dist)
        if dist.enabled and result.interrupted:
            # each rank exits with a stop's 130, and torchrun's SIGTERM to the ranks left follows the
            # first: it killed a rank still ending (exit -15, not 130). The process ends next.
            ignore_stop_signals()
        return result
    finally:
        shutdown_distributed(dist)


@contextmanager
def _said_by_rank_0(dist: Distributed, stopper: StopRequest):
    """An error every rank meets alike (`said_once`: a NaN in the ranks' mean loss, a refusal) is said
    by rank 0 alone, once the run has unwound; the other ranks, with nothing to say, exit first, and
    torchrun's SIGTERM to the ranks left, which follows, killed rank 0 before its line (the console
    said nothing). From such an error on rank 0 ignores it (`StopRequest.end_deaf`). The other ranks
    keep their handlers: torchrun's SIGTERM, once rank 0 has exited, ends their wait for it
    (`cli._let_rank_0_say_it`); ignored, it was lost, and each waited the whole wait. A rank that had
    its stop signal already (torchrun stopping its workers, which signals each once, the error then
    met as the stop read the losses) is marked `stop_seen`: no second signal would end its wait."""
    try:
        yield
    except TinyattnError as error:
        if dist.enabled and getattr(error, "shared", False):
            if dist.is_main:
                stopper.end_deaf()
            else:
                error.stop_seen = stopper.signal_name is not None
        raise


def _train(config: Config, request: _Request, dist: Distributed, stopper: StopRequest) -> TrainResult:
    timers = Timers(request.clock)
    # a rank that left alone: one line from each rank left, where each waiting for it failed in gloo
    with departure_said(dist, then=stopper.end_deaf):
        with mistake_alike(dist):  # a mistake every rank meets here is one line, rank 0's
            config, point, device, source = _checked_start(config, request, dist)
        run_dir, lock, made = open_run_folder(config, request.config_path, request.run_name, point, dist)
    with lock:
        try:
            with RunLog(run_dir, enabled=dist.is_main) as run_log, _said_what_is_kept(run_dir, stopper), \
                    departure_said(dist, then=stopper.end_deaf):
                if isinstance(lock, RunLock):  # rank 0's; a killed session's note: train.log keeps it too
                    lock.say_note()
                return _train_in(run_dir, config, request, point=point, device=device, dist=dist,
                                 timers=timers, source=source, stopper=stopper)
        except (TinyattnError, StoppedBeforeStart):  # a mistake or a stop before step 1 leaves no folder
            if made:
                remove_failed_start(run_dir, run_log.path.name)
            raise


def _checked_start(config: Config, request: _Request, dist: Distributed
                   ) -> tuple[Config, Optional[ResumePoint], torch.device, Optional[InitSource]]:
    """What a run checks before its folder is made, alike on every rank: the resume point, the
    device, the config a resume or by_precision makes, the fine-tune's source and what fits."""
    point = request.resume
    if point is not None and not isinstance(point, ResumePoint):
        point = ResumePoint.find(point, request.run_name, config.train.out_dir)
    device = select_device(config.train.device)  # a bad one fails before the folder is made
    if dist.enabled and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    if point is not None:
        # A --config file's by_precision: what the run's start chose (the run's own config.yaml
        # holds the result, by_precision emptied), before the model is checked against the weights.
        config = _for_precision(config, device, request, keep=point.edited)
        point.keep_init_from(config, request.given)  # first: the source it names is never read
        if config.train.init_from:  # the model and tokenizer its source gave it (not read again)
            # A fine-tune saved before its checkpoints recorded the source's tokenizer: the keys
            # at other than their default count as given, as they did when it was saved
            written = request.written if point.source_tokenizer is not None else None
            adopt_model(config, point.config.model, point.take_run_tokenizer(config),
                        f"{point.file} (train.init_from)", written=written,
                        trained_with=(point.source_tokenizer,))
        point.adopt(config, request.given)
        point.keep_out_dir(config, request.run_name, request.given)
        request.notes[:0] = point.notes  # what the resume took from config.yaml
    if point is None:  # before the source is adopted: a model key by_precision gives is compared with it
        config = _for_precision(config, device, request)
    source = init_source(config, request.written) if point is None else None  # fine-tuning: train.init_from
    request.notes.extend(source.notes() if source is not None else [])
    if point is None:
        request.notes.extend(unused_options(config.train, config.model.tie_embeddings, request.own))
    if point is None and source is None:  # a fine-tune's tokenizer is its source's: adopt_model compared them
        request.notes.extend(unused_tokenizer_options(config.tokenizer, request.own))
    check_training_fits(config.model, config.train, device)  # before the folder; vocab_size may be unknown
    return config, point, device, source


@contextmanager
def _said_what_is_kept(run_dir: Path, stopper: StopRequest):
    """A second stop signal (`StoppedAtOnce`) ends the run with a line saying which checkpoint
    its folder keeps and how to resume, as the first one's last line does (train.log has it too);
    so does another rank's departure (`PeerGone`) once training started (a new run's folder
    goes before it: its one line is enough)."""
    try:
        yield
    except StoppedAtOnce as stop:
        raise KeyboardInterrupt(stopped_at_once(stop, run_dir)) from None
    except PeerGone as gone:
        if stopper.at_once:
            raise
        raise PeerGone(stopped_at_once(gone, run_dir)) from None  # each rank's: rank 0 may be gone


def _for_precision(config: Config, device: torch.device, request: _Request,
                   keep: Sequence[str] = ()) -> Config:
    """`config` with its by_precision entry for the precision this run trains in applied (keys given
    with --set, and `keep`, win over it), saying what changed and adding the keys it set to
    `request.written`; as it is without by_precision."""
    if not config.by_precision:
        return config
    precision = select_precision(config.train.precision, device, "train.precision").name
    config, changed = for_precision(config, precision, keep=(*request.given, *keep))
    request.notes.extend([f"precision {precision}: {' '.join(changed)} (the config's by_precision)"]
                         if changed else [])
    # Given by the config as much as its sections' keys: a fine-tune compares them with its source
    request.written = request.written | {item.split("=", 1)[0] for item in changed}
    return config


def _steps_left_or_refuse(trainer: Trainer, train: TrainConfig, stop_at_step: Optional[int], *,
                          resumed: Optional[Path]) -> Optional[int]:
    """--stop-at-step, after refusing (before anything is written) a run with no step to train.
    `resumed`: what a resume continues, named first in its refusals (a bare --resume picked it);
    None for a new run."""
    refusal = None
    if resumed is not None and (trainer.plan.done(trainer.step) or trainer.plan.no_step_fits(trainer.step)):
        refusal = TinyattnError(f"{resumed}: {_nothing_left(trainer.plan, train, trainer.step)}")
    elif stop_at_step is not None and stop_at_step <= trainer.step:
        run = "the run" if resumed is None else str(resumed)
        refusal = TinyattnError(f"--stop-at-step {stop_at_step}: {run} is already at step {trainer.step}; "
                                "give a later step")
    if refusal is not None:  # every rank decides alike (the plan's counts are rank 0's)
        raise said_once(refusal, trainer.dist.enabled)
    return stop_at_step


def _nothing_left(plan, train: TrainConfig, step: int) -> str:
    """Why a resumed run has no step left to train (before it writes anything), and what trains on."""
    if isinstance(plan, TimePlan) and not plan.finished:
        return (f"the run is at step {step}, and its time budget {plan.text} is spent ({plan.spent():.0f} s "
                f"over its sessions, this one's start-up included): no step fits; --set train.max_steps=N "
                f"with N above {step} trains on (the budget is then off), as does a longer --set "
                "train.time_budget")
    if isinstance(plan, TimePlan):  # the plan the run recorded, whatever this config's budget
        return (f"the run ended at step {step}: its time budget planned no further step (a longer "
                "train.time_budget does not reopen a run that ended); --set train.max_steps=N with N above "
                f"{step} trains on (the budget is then off)")
    return (f"the run is at step {step}, and train.max_steps is {train.max_steps}: nothing is left to "
            f"train; --set train.max_steps=N with N above {step} trains on")


def _train_in(run_dir: Path, config: Config, request: _Request, *, point: Optional[ResumePoint],
              device: torch.device, dist: Distributed, timers: Timers,
              source: Optional[InitSource], stopper: StopRequest) -> TrainResult:
    trainer, evaluator, data = _build(config, request, point=point, device=device, dist=dist)
    trainer.plan = plan_for(config.train, point.state if point is not None else None, request.elapsed,
                            dist=dist, device=device)
    if point is not None:
        point.restore(trainer, run_dir)  # the plan's recorded state too
    elif source is not None:
        source.load_into(trainer.model)
        trainer.weights_loaded()  # train.ema's average starts from them, not from the random init
    # A resume in place is named by its folder, a fork by the checkpoint it starts from
    resumed = None if point is None else point.file if point.forks_into(run_dir) else run_dir
    stop_at_step = _steps_left_or_refuse(trainer, config.train, request.stop_at_step, resumed=resumed)
    # MFU's denominator; the measurement draws from its own generator, so exact resume is unaffected.
    peak = config.train.peak_flops or measure_peak_flops(device, trainer.precision)
    log = Logger(run_dir, config, trainer, peak_flops=peak, enabled=dist.is_main, progress=request.progress,
                 resume_advice=request.resume_advice)
    log.announce(point)
    for line in request.notes:
        log.print(line)
    _choose_at_start(config, trainer, evaluator, run_dir, point=point, request=request, log=log,
                     timers=timers)

    checkpointer = Checkpointer(run_dir, config, data.tokenizer, dist)
    checkpointer.run_state.update(_checkpoint_record(data.fingerprint, source, point))
    stopper.at_once = False  # from the first write a stop saves a checkpoint: the folder resumes
    if dist.is_main:  # written only now that training can start: a failed command changes nothing
        _write_start(run_dir, config, data, point, log)
    timers.seconds["start-up"] = request.elapsed() - timers.seconds.get("calibration", 0.0)
    try:
        signal_name, last_val = _loop(trainer, evaluator, checkpointer, log, timers=timers,
                                      stop_at=stop_at_step or math.inf, run_dir=run_dir, stopper=stopper)
        # A stop that came during the last step (or its evaluation) left nothing undone: the run ended.
        done = trainer.plan.done(trainer.step)
        result = TrainResult(run_dir, trainer.step, trainer.tokens_seen, trainer.best_val_loss, last_val,
                             log.tokens_per_second, request.elapsed(), signal_name is not None and not done,
                             dict(timers.seconds))
        stopped_early = None if done else signal_name or "--stop-at-step"
        log.finish(result, stopped_early)
        return result
    except BaseException:
        log.close(failing=True)  # the error that ended the run is the one to tell
        raise
    finally:
        log.close()  # the TensorBoard writer and the bar, also when training fails


def _write_start(run_dir: Path, config: Config, data, point: Optional[ResumePoint], log: Logger) -> None:
    """What a run writes before its first step: config.yaml, tokenizer.json, data.json, TensorBoard's
    events file. A new run whose disk refuses one takes back those it wrote, so its folder goes as
    any failed start's does (`remove_failed_start`); a resumed run's folder keeps every file."""
    before = set(run_dir.iterdir())
    try:
        if point is not None and point.forks_into(run_dir):
            point.fork_into(run_dir)
        kept = keep_user_config(run_dir, point)  # the user's edited config.yaml is never lost
        if kept:
            log.print(kept)
        save_config(config, run_dir / "config.yaml")
        data.tokenizer.save(run_dir / "tokenizer.json")
        save_data_fingerprint(data.fingerprint, run_dir)
        log.start(point)
    except StorageError:
        if point is None:
            for written in set(run_dir.iterdir()) - before:
                if written.is_file():
                    written.unlink(missing_ok=True)
        raise


def _checkpoint_record(fingerprint: dict, source: Optional[InitSource], point: Optional[ResumePoint]) -> dict:
    """What every checkpoint says beside the weights: the data it trained on, the folder the run
    started in (a resume from elsewhere reads the run's relative data paths there), and a fine-tune's
    source's tokenizer section as the source trained with it (its InitSource's, or the resumed
    checkpoint's record), which a resume given the config file compares that file's keys with."""
    record: dict = {"data": fingerprint}
    start = point.start_folder if point is not None else None
    with suppress(OSError):  # the folder the relative paths are read from: where the run started, while there
        record[ckpt.START_FOLDER] = str(start if start is not None and start.is_dir() else Path.cwd())
    trained_with = (source.tokenizer_config if source is not None
                    else point.source_tokenizer if point is not None else None)
    if trained_with is not None:
        record[ckpt.SOURCE_TOKENIZER] = asdict(trained_with)
    return record


def _build(config: Config, request: _Request, *, point: Optional[ResumePoint], device: torch.device,
           dist: Distributed) -> tuple[Trainer, Evaluator, object]:
    """The data, a seeded Trainer over it and the Evaluator with train.show's hooks."""
    precision = select_precision(config.train.precision, device, "train.precision")
    with mistake_alike(dist):  # the data's checks, alike on every rank: a mistake is rank 0's one line
        data = _checked_data(config, request, point=point, device=device, dist=dist)
    trainer = Trainer.build(config.model, config.train, data.train, device=device, precision=precision,
                            dist=dist)
    hooks = resolve_hooks(config.train.show) if dist.is_main else ()
    evaluator = Evaluator(trainer, config, data.validation, data.tokenizer, dist=dist, hooks=hooks)
    return trainer, evaluator, data


def _choose_at_start(config: Config, trainer: Trainer, evaluator: Evaluator, run_dir: Path, *,
                     point: Optional[ResumePoint], request: _Request, log: Logger,
                     timers: Timers) -> None:
    """A new run's choices before step 1: under a time budget the calibration's (the steps that
    fit, and what the tables by passes give their passes), else what the tables give the passes
    train.max_steps makes. A resume keeps what its start chose (config.yaml and the checkpoint
    hold it)."""
    if point is not None:
        return
    if config.train.time_budget is not None:
        _calibrate(config, trainer, evaluator, run_dir, request=request, log=log, timers=timers)
    else:
        _take_tables_by_steps(config, trainer, request, log)
    # max_steps: under a budget, its first estimate
    warning = warmup_warning(config.train, config.train.max_steps, config.train.time_budget)
    if warning:
        log.print(warning)


def _calibrate(config: Config, trainer: Trainer, evaluator: Evaluator, run_dir: Path, *,
               request: _Request, log: Logger, timers: Timers) -> None:
    """Gives the time plan its first measurements (and train.max_steps its first estimate); a
    stop signal meanwhile ends the run at once, as any stop before the run's first write does."""
    with timers("calibration"):
        calibration = Calibration(trainer.plan, request.clock, _pass_tables(config, request))
        steps, measured = _first_plan(calibration, trainer, evaluator, run_dir, log)
    config.train.max_steps = steps  # recorded in config.yaml: the first estimate, not a limit
    if measured.choices is not None:
        _take_choices(config, trainer, measured.choices)


def _pass_tables(config: Config, request: _Request) -> PassTables:
    """The config's tables by passes; --set model.dropout=... wins over train.dropout_by_passes,
    and so on (that table is left out)."""
    return PassTables(config.train, **{name: {} if key in request.given else getattr(config.train, name)
                                       for name, key in PASS_TABLES.items()})


def _take_tables_by_steps(config: Config, trainer: Trainer, request: _Request, log: Logger) -> None:
    """A new run of train.max_steps takes what the tables by passes give the passes its steps make."""
    tables = _pass_tables(config, request)
    if not tables:
        return
    choices = choose_by_steps(trainer, tables)
    log.print(f"train.max_steps {config.train.max_steps:,}: {shown_passes(choices.passes, 2, tables)} passes "
              f"over the training text -> {', '.join(_pass_choices(tables, choices, trainer))}")
    _take_choices(config, trainer, choices)


def _take_choices(config: Config, trainer: Trainer, choices: PassChoices) -> None:
    """What the tables by passes chose, into the config (config.yaml records it, so a resume
    builds this model and these optimizers), the model and the optimizers."""
    if choices.dropout is not None:
        # A calibration has set it already; a run of train.max_steps takes it only here
        # (`choose_by_steps` sets nothing).
        trainer.model.set_dropout(choices.dropout)
        config.model.attention_dropout = config.model.weights_dropout  # as the model was built
        config.model.dropout = choices.dropout
    if choices.min_lr is not None:  # the plan's schedule reads it from here
        config.train.min_lr = choices.min_lr
    if choices.weight_decay is not None:
        config.train.weight_decay = choices.weight_decay
        trainer.optimizers.set_weight_decay(choices.weight_decay)


def _first_plan(calibration: Calibration, trainer: Trainer, evaluator: Evaluator, run_dir: Path,
                log: "Logger") -> tuple[int, Measured]:
    """Seeds the time plan with rank 0's measurements; returns the steps it first expects and them."""
    plan = trainer.plan
    measured = calibration.measure(trainer, evaluator, run_dir)
    if trainer.dist.enabled:
        chosen = [measured]
        torch.distributed.broadcast_object_list(chosen, src=0)  # rank 0's measurement decides
        measured = chosen[0]
    steps = plan.seed(measured.step, measured.evaluation, measured.save)
    if steps < 1:
        refusal = TinyattnError(
            f"train.time_budget {plan.text}: {plan.spent():.0f} s are gone before training and a "
            f"step takes {measured.step:.2f} s; no step fits."
            f"{calibration.compile_note(trainer, measured.step)} "
            + calibration.advice(calibration.advised_budget(measured.start_up, measured)))
        raise said_once(refusal, trainer.dist.enabled)  # every rank has rank 0's count: one line, rank 0's
    choices = measured.choices
    if choices is not None:  # after the refusal: a run no step fits has no passes to speak of
        tables = calibration.tables
        with_dropout = "" if choices.tried is None else \
            f", {shown_passes(choices.tried[1], 1, tables)} with model.dropout={choices.tried[0]:g}"
        log.print(f"time budget {plan.text}: about {shown_passes(choices.passes, 1, tables)} passes over the "
                  f"training text fit{with_dropout} -> {', '.join(_pass_choices(tables, choices, trainer))}")
    # start-up and measuring apart, as the run's last line splits them (a first compile is measuring)
    log.print(f"time budget {plan.text}: measured {measured.step:.3f} s/step, {measured.evaluation:.2f} s "
              f"per evaluation, {measured.save / 2:.2f} s per checkpoint, {measured.start_up:.0f} s of "
              f"start-up and {measured.calibration:.0f} s measuring -> about {steps:,} "
              f"step{'s' if steps > 1 else ''}; the schedule follows the time left")
    return steps, measured


def _pass_choices(tables: PassTables, choices: PassChoices, trainer: Trainer) -> list[str]:
    """What each table by passes in play made of the count: "model.dropout=0.1
    (train.dropout_by_passes)", or, where the count is below its first entry, the value kept
    and where the table starts (a slow machine's run says why it has no dropout)."""
    now = {"model.dropout": (choices.dropout, trainer.model.dropout.p),
           "train.min_lr": (choices.min_lr, trainer.plan.config.min_lr),
           "train.weight_decay": (choices.weight_decay, trainer.plan.config.weight_decay)}
    lines, passes, below = [], choices.passes_chosen, choices.below
    for table_name, key in PASS_TABLES.items():
        table = tables.by_name[table_name]
        if not table:
            continue  # none in the config, or its key given with --set
        chosen, current = now[key]
        if table_name == "dropout_by_passes" and below is not None:
            lines.append(f"{key}={current:g} kept (the dearer step leaves it short of the {below:g} "
                         f"passes of its entry in train.{table_name})")
        elif entry_for(table, passes) is None:
            lines.append(f"{key}={current:g} kept (train.{table_name} starts at {min(table):g})")
        elif entry_for(table, passes, below=below) is None:
            lines.append(f"{key}={current:g} kept (train.{table_name} from {below:g} passes: with dropout)")
        else:  # the table's entry (None from the calibration where it equals the value already set)
            lines.append(f"{key}={current if chosen is None else chosen:g} (train.{table_name})")
    return lines


def _checked_data(config: Config, request: _Request, *, point: Optional[ResumePoint], device: torch.device,
                  dist: Distributed):
    """The token data, checked against a resumed run's and against what fits in memory."""
    read, where = point.placed_data(config) if point is not None else (config, None)  # resumed elsewhere
    request.notes.extend([where] if where else [])
    data = _prepare_data(read, dist, request.progress, point=point)
    asked, got = config.tokenizer.vocab_size, data.tokenizer.vocab_size
    if config.tokenizer.kind == "bpe" and got < asked:  # a small text: the model is built with the smaller
        request.notes.append(f"note: tokenizer.vocab_size asked for {asked:,} tokens; BPE training on this "
                             f"text ran out of pairs to merge at {got:,}, so the vocabulary has {got:,}")
    if point is not None:
        note = point.check_data(data.fingerprint, allow_change=request.allow_data_change)
        request.notes.extend([note] if note else [])
    check_training_fits(config.model, config.train, device)  # again, now with the vocabulary's size
    return data


def _prepare_data(config: Config, dist: Distributed, progress: bool, *, point: Optional[ResumePoint] = None):
    """The token data (rank 0 builds the cache, the others then read it); sets vocab_size."""
    with refusal_shared(dist):  # a missing data file: every rank ends with rank 0's line
        data = prepare_data(config, progress=progress) if dist.is_main else None
    if data is None:
        data = prepare_data(config, progress=False)
    if point is not None:  # first: new characters are the cause a vocab_size check would hide
        point.check_tokenizer(data.tokenizer)
    if config.model.vocab_size is None:
        config.model.vocab_size = data.tokenizer.vocab_size
    elif config.model.vocab_size < data.tokenizer.vocab_size:
        raise TinyattnError(f"model.vocab_size={config.model.vocab_size} is smaller than the "
                            f"tokenizer's vocabulary ({data.tokenizer.vocab_size}); leave it unset")
    return data


def _loop(trainer: Trainer, evaluator: Evaluator, checkpointer: Checkpointer, log: "Logger", *,
          timers: Timers, stop_at: float, run_dir: Path,
          stopper: StopRequest) -> tuple[Optional[str], float]:
    """Step until the plan is done, step stop_at or a stop signal (`stopper`, installed); returns
    (the signal's name or None, the last validation loss). The plan times steps, evaluations and
    writes apart."""
    plan = trainer.plan
    window = LossWindow(trainer.config.log_interval, trainer.device, trainer.dist)
    last_val, at_eval = float("nan"), False
    shared_stop = SharedStop(stopper, trainer.dist, trainer.device)
    stop = shared_stop.agreed(reading=True)  # one before step 1 saves the weights the run starts from
    plan.start()
    while not (plan.done(trainer.step) or trainer.step >= stop_at) and stop is None:
        compiling = not trainer.compiled  # train.compile: this process's first step compiles the model
        with timers("compile" if compiling else "train"):
            loss, grad_norm = trainer.train_step()
            window.add(loss, grad_norm)
            if compiling:  # not a step's time: the throughput leaves it and its tokens out
                window.untime_last()
            plan.after_step(trainer.step)
            at_eval = evaluator.due(trainer.step, last=plan.done(trainer.step) or trainer.step >= stop_at)
            stop = shared_stop.agreed(reading=window.full or at_eval)  # every rank's, under DDP
            # Every checkpoint follows a read of the losses, whose NaN check keeps bad weights out.
            if window.full or at_eval or stop is not None:
                timed = window.timed
                losses, seconds = window.read(trainer.step, run_dir)
                log.train(trainer.step, losses, seconds, window.grad_norm, timed=timed)
        if at_eval:
            last_val = _evaluate(trainer, evaluator, checkpointer, log, timers)
            stop = stop or shared_stop.local()  # one process: a signal during the evaluation stops here
        if window.pending == 0:
            window.restart()
    if stop is not None and not at_eval:
        with timers("save"), plan.measuring("save"):
            checkpointer.save(trainer, best=False)
    return stop, last_val


def _evaluate(trainer: Trainer, evaluator: Evaluator, checkpointer: Checkpointer, log: "Logger",
              timers: Timers) -> float:
    """The validation loss and what train.show shows, then the checkpoint (last: it records the
    time the evaluation took); returns the loss."""
    plan = trainer.plan
    with timers("eval"), plan.measuring("eval"), trainer.evaluated_weights():
        result = evaluator.run(trainer.step)
        best = result.val_loss < trainer.best_val_loss
        trainer.best_val_loss = min(trainer.best_val_loss, result.val_loss)
        log.evaluation(result, best, evaluator)
    line = plan.note(trainer.step)
    if line:
        log.print(line)
    with timers("save"), plan.measuring("save"):
        checkpointer.save(trainer, best)
    return result.val_loss
