"""What a run shows and keeps of itself: the console lines, TensorBoard and train.log.

`Logger` owns the progress bar, the plain log lines and the TensorBoard writer (the loss,
learning-rate, gradient-norm and throughput curves, the validation loss, one HParams
session per run); at each evaluation it hands the writer to the hooks train.show lists
(samples, loss by position, attention maps, head ablation: `tinyattn.train.hooks`).
The learning rates logged are read from the optimizers' parameter groups.
`RunLog` copies every line, warning and the error that ends a run into `<run>/train.log`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
from tqdm import tqdm

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, config_to_dict, duration_text
from tinyattn.errors import TinyattnError, counted
from tinyattn.system.console import RUN_LOG_NAME
from tinyattn.system.invocation import command, quoted
from tinyattn.system.storage import storage_errors
from tinyattn.train.optim import optimizer_description

if TYPE_CHECKING:
    from tinyattn.train.owners import EvalResult, Evaluator
    from tinyattn.train.resume import ResumePoint
    from tinyattn.train.trainer import Trainer, TrainResult

HPARAM_METRICS = ("hparam/best_val_loss", "hparam/last_val_loss")


RUN_LOG = logging.getLogger(RUN_LOG_NAME)  # also what `system.console.notice` writes to


class _LogFile(logging.FileHandler):
    """train.log's handler. A full disk must not end a run over a log line, nor hide the error
    that ends it: a refused write, flush or close is dropped (the console has had the line)."""

    def handleError(self, record):
        pass

    def flush(self):
        try:
            super().flush()
        except OSError:
            pass

    def close(self):
        try:
            super().close()
        except OSError:
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

        def show_and_log(message, category, filename, lineno, *file_and_line):
            show(message, category, filename, lineno, *file_and_line)
            RUN_LOG.warning(f"warning: {message}")

        warnings.showwarning = show_and_log
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self.handler is None:
            return
        if isinstance(error, TinyattnError):
            RUN_LOG.error(f"error: {error}")
        elif isinstance(error, KeyboardInterrupt):
            RUN_LOG.error(str(error) or "interrupted")
        elif error is not None:
            RUN_LOG.error(f"failed: {type(error).__name__}: {error}")
        self.caught.__exit__(None, None, None)
        RUN_LOG.removeHandler(self.handler)
        self.handler.close()
        self.handler = None


def stopped_at_once(stop: BaseException, run_dir: Path) -> str:
    """A run's last line after a second stop signal (`owners.StoppedAtOnce`, `stop`), or another
    rank's departure mid-training: the checkpoint its folder keeps (what was trained after it is
    lost) and how to resume."""
    kept, best = ckpt.latest_checkpoint(run_dir), run_dir / ckpt.BEST
    if kept is None and best.is_file():  # cut short after best.pt, before the first step's file
        kept = best
    if kept is None:
        return f"{stop} before any checkpoint was saved in {run_dir}: run the same command again to train"
    step = ckpt.step_of(kept) if kept != best else ckpt.saved_value(best, "step")
    return (f"{stop}; the last checkpoint saved is step {step}'s ({kept.name}) in {run_dir}, "
            f"what was trained after it is lost. Resume with: {command('train')} --resume {quoted(run_dir)}")


def say(line: str) -> None:
    """A line for the console and the run's train.log."""
    to_console(lambda: print(line, file=sys.stderr, flush=True))
    RUN_LOG.info(line)


def to_console(write) -> None:
    """Runs `write()`, a write to the console. A console that went away (a closed terminal: EIO;
    a reader gone, `... 2>&1 | head`: EPIPE) does not end the run: from then on the console
    writes go to /dev/null, and train.log keeps every line."""
    try:
        write()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        os.close(devnull)


def hparams_of(config: Config) -> dict:
    """The config as TensorBoard hparams: every section, lists and None as text."""
    flat = {}
    for section, values in config_to_dict(config).items():
        for key, value in values.items():
            if isinstance(value, (list, tuple)):
                value = ", ".join(map(str, value))
            flat[f"{section}.{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


class _Events:
    """TensorBoard's SummaryWriter whose every call turns a refused write into a StorageError
    naming its events file. A full disk fails the writer's own thread; the thread keeps the error
    and the writer's next call (a scalar, the flush, the close) raises it."""

    def __init__(self, writer, path: Path):
        self.writer = writer
        self.path = path

    def __getattr__(self, name):
        attribute = getattr(self.writer, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            with storage_errors(self.path):
                return attribute(*args, **kwargs)

        return call


def _quiet_writer_thread(previous):
    """A threading.excepthook that prints no traceback for TensorBoard's writer thread refused a
    write: the thread keeps the error, and `_Events` turns it into the run's one line."""

    def hook(args):
        writer_thread = type(args.thread).__module__.startswith("tensorboard.")
        if not (writer_thread and issubclass(args.exc_type, OSError)):
            previous(args)

    return hook


SAMPLES_FILE = "samples.txt"  # the training samples, one "--- step N ---" header each (train.show)
_SAMPLE_HEADER = re.compile(rb"^--- step (\S+) ---$", re.MULTILINE)


def cut_samples_after(path: Path, step: int) -> None:
    """Drops from samples.txt the samples of steps after `step`: a run resumed in its folder trains
    again the steps a killed session sampled past its checkpoint (perhaps at other steps, under
    another train.eval_interval), as TensorBoard's view of the run drops them (`purge_step`).
    Read from the end: the cut is at the first of the last headers that are all past `step`, so a
    line of a sample's text that reads like a header of a later step, in an earlier sample, is text."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    cut = None
    for header in reversed(list(_SAMPLE_HEADER.finditer(data))):
        try:
            if float(header.group(1)) <= step:
                break
        except ValueError:  # a line of a sample's text that reads like a header
            continue
        cut = header.start()
    if cut is not None:
        with storage_errors(path):
            os.truncate(path, cut)


class Logger:
    """The progress bar, the plain log lines and TensorBoard, on the main process only."""

    def __init__(self, run_dir: Path, config: Config, trainer: Trainer, *, peak_flops: float,
                 enabled: bool, progress: bool, resume_advice: bool = True):
        self.run_dir = run_dir
        self.resume_advice = resume_advice  # a stopped run's last line says how to resume it
        self.config = config
        self.trainer = trainer
        self.flops_per_token = trainer.model.flops_per_token()
        self.peak_flops = peak_flops * trainer.dist.world_size
        self.enabled = enabled
        self.writer: Optional[_Events] = None
        self.thread_hook = None  # threading.excepthook, while TensorBoard's writer runs
        self.bar = None
        self.progress = progress and enabled
        self.train_seconds, self.train_tokens = 0.0, 0
        self.first_step = trainer.step  # a resumed run's: the figures of the last line are this session's
        if enabled:
            # TensorBoard's import (a good part of a second) here, before the run writes its first
            # files: a stop during it still finds a new run's folder empty, and takes it back
            import torch.utils.tensorboard  # noqa: F401

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / self.train_seconds if self.train_seconds else float("nan")

    def announce(self, point: Optional[ResumePoint]) -> None:
        """The run's first line, printed before any step (or the budget's measuring steps)."""
        t, tc = self.trainer, self.config.train
        what = "starting"
        if point is not None:
            what = f"{'forked from' if point.forks_into(self.run_dir) else 'resuming from'} {point.file} at step {t.step}"
        if t.plan.kind == "steps":
            steps = counted(tc.max_steps, "step")
        elif point is None:
            steps = f"measuring a few steps to fit the {duration_text(tc.time_budget)} budget"
        else:  # a time plan resumed: it goes on from the seconds its earlier sessions spent
            steps = f"the {duration_text(tc.time_budget)} budget's plan, {t.plan.spent():.0f} s of it spent"
        self.print(f"run {self.run_dir} ({what}): {t.model.num_parameters():,} parameters, "
                   f"device {t.device}, precision {t.precision.name}, {optimizer_description(tc)}, "
                   f"{len(t.batches.tokens):,} train tokens, {steps}")

    def start(self, point: Optional[ResumePoint]) -> None:
        """Opens TensorBoard (after config.yaml is written) and the progress bar; `point`: the
        checkpoint a resumed or forked run continues from."""
        try:
            self._open_tensorboard(point)
        except BaseException:
            self.close(failing=True)
            raise
        if self.progress:
            self.bar = tqdm(total=self.config.train.max_steps, initial=self.trainer.step, unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def _open_tensorboard(self, point: Optional[ResumePoint]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        t = self.trainer
        # A run resumed in its own folder trains again the steps a killed session logged past its
        # checkpoint: purge_step hides them (every step after the checkpoint's) from TensorBoard, and
        # keeps what that session logged at the checkpoint's step, which the checkpoint holds. A new run
        # or a fork starts its folder's curves: purge_step 0 hides whatever is there from before.
        resumed_in_place = point is not None and not point.forks_into(self.run_dir)
        if resumed_in_place:
            cut_samples_after(self.run_dir / SAMPLES_FILE, t.step)
        else:
            self._set_aside_an_earlier_attempt()
        self.thread_hook = threading.excepthook
        threading.excepthook = _quiet_writer_thread(self.thread_hook)
        with storage_errors(self.run_dir):  # its events file is not named yet
            writer = SummaryWriter(str(self.run_dir), purge_step=t.step + 1 if resumed_in_place else 0)
        events = getattr(writer.file_writer.event_writer, "_file_name", self.run_dir)  # the file it writes
        self.writer = _Events(writer, Path(events))
        self.writer.add_text("config", "```\n" + (self.run_dir / "config.yaml").read_text() + "\n```", t.step)
        # One HParams session per run: a new run's, or a fork's (a new run in a new folder, from a step
        # past 0); a run resumed in its own folder continues the one it has.
        if point is None or point.forks_into(self.run_dir):
            from torch.utils.tensorboard.summary import hparams

            with storage_errors(self.writer.path):
                for summary in hparams(hparams_of(self.config), dict.fromkeys(HPARAM_METRICS, math.nan)):
                    self.writer.file_writer.add_summary(summary)

    def _set_aside_an_earlier_attempt(self) -> None:
        """A new run or a fork trains from its start in a folder that holds no checkpoint of its own,
        where an attempt that died before its first checkpoint (a second Ctrl-C, a kill), or a run whose
        checkpoints were deleted, may have left event files and samples.txt: its curves would show
        beside this run's, zigzagging back, and its HParams session in place of this run's. They move
        to a folder of their own inside (TensorBoard shows it as a run of its own), said in one line;
        one that cannot move stays, its curves purged (purge_step 0)."""
        found = sorted(self.run_dir.glob("events.out.tfevents.*")) + [
            path for path in [self.run_dir / SAMPLES_FILE] if path.exists()]
        if not found:
            return
        aside = next(self.run_dir / f"earlier_attempt_{n}" for n in range(1, 10_000)
                     if not (self.run_dir / f"earlier_attempt_{n}").exists())
        with storage_errors(aside, creating=True):
            aside.mkdir()
        moved = []
        for path in found:
            try:
                path.rename(aside / path.name)
                moved.append(path.name)
            except OSError:
                pass
        if not moved:
            aside.rmdir()
            return
        files = f"{len(moved)} file{'s' if len(moved) > 1 else ''}"
        self.print(f"note: {self.run_dir} held the TensorBoard events or samples of an earlier attempt "
                   f"without a checkpoint here ({files}); moved them to {aside} (TensorBoard shows it "
                   "as a run of its own)")

    def print(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            to_console(lambda: self.bar.write(line, file=sys.stderr))
            RUN_LOG.info(line)
        else:
            say(line)

    def train(self, step: int, losses: list[float], seconds: float, grad_norm: torch.Tensor, *,
              timed: Optional[int] = None) -> None:
        """The window's losses; `seconds` are of its last `timed` steps (None: all of them; fewer where
        its first step compiled the model, whose time is not a step's)."""
        timed = len(losses) if timed is None else timed
        tokens = timed * self.trainer.tokens_per_step
        self.train_seconds += seconds if timed else 0.0
        self.train_tokens += tokens
        if not self.enabled:
            return
        loss = sum(losses) / len(losses)
        rates = self.trainer.optimizers.rates()  # what the last step used
        lr = self._peak_rate(rates)
        w = self.writer
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/learning_rate", lr, step)
        for name, rate in rates.items():
            w.add_scalar(f"lr/{name}", rate, step)
        w.add_scalar("train/grad_norm", grad_norm.item(), step)
        w.add_scalar("train/tokens_seen", self.trainer.tokens_seen, step)
        speed = {"tok_s": "compiling"}  # a window of the compiling step alone: no step's speed
        if timed:
            tokens_per_second = tokens / seconds
            mfu = self.flops_per_token * tokens_per_second / self.peak_flops
            w.add_scalar("perf/tokens_per_second", tokens_per_second, step)
            w.add_scalar("perf/mfu", mfu, step)
            speed = {"tok_s": f"{tokens_per_second:,.0f}", "mfu": f"{mfu:.1%}"}
        if self.bar is not None:
            bar = self.bar
            bar.total = self.trainer.plan.total_steps(step)  # a time budget's plan moves it
            # The figures first: the update draws the bar, with this step's figures beside its count
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=speed["tok_s"], refresh=False)
            to_console(lambda: bar.update(len(losses)))
        elif timed:
            self.print(f"step {step}: loss {loss:.4f}, lr {lr:.2e}, {speed['tok_s']} tok/s, "
                       f"mfu {speed['mfu']}")
        else:
            self.print(f"step {step}: loss {loss:.4f}, lr {lr:.2e}, the step that compiled the model")

    @staticmethod
    def _peak_rate(rates: dict[str, float]) -> float:
        """train/learning_rate: the rate of the norm gains' group, the one train.lr sets."""
        gains = [rate for name, rate in rates.items() if name.endswith("/gains")]
        return gains[0] if gains else next(iter(rates.values()))

    def evaluation(self, result: EvalResult, best: bool, evaluator: Evaluator) -> None:
        """The validation loss (console, TensorBoard), then train.show's hooks with the writer."""
        if not self.enabled:
            return
        step = result.step
        self.writer.add_scalar("val/loss", result.val_loss, step)
        self.writer.add_scalar("hparam/best_val_loss", self.trainer.best_val_loss, step)
        self.writer.add_scalar("hparam/last_val_loss", result.val_loss, step)
        self.print(f"step {step}: validation loss {result.val_loss:.4f}{' (best)' if best else ''}")
        evaluator.show(result, self.writer, self.run_dir)
        self.writer.flush()

    def close(self, *, failing: bool = False) -> None:
        """Closes the bar and TensorBoard's writer; `failing`: the run ends on an error of its own,
        which a refused write of the events file here must not replace."""
        if self.bar is not None:
            to_console(self.bar.close)
            self.bar = None
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                writer.close()
        except (OSError, TinyattnError):
            if not failing:
                raise
        finally:
            if self.thread_hook is not None:  # after the close: the writer's thread has ended
                threading.excepthook, self.thread_hook = self.thread_hook, None

    def finish(self, result: TrainResult, stopped_by: Optional[str]) -> None:
        if not self.enabled:
            return
        try:
            self.close()
        finally:  # a refused close of the events file (a full disk) is the run's error, said after this
            say(self._last_line(result, stopped_by))  # line: its steps are done and saved all the same

    def _last_line(self, result: TrainResult, stopped_by: Optional[str]) -> str:
        if stopped_by:
            saved = f"stopped by {stopped_by} at step {result.step}; checkpoint saved in {result.run_dir}."
            if not self.resume_advice:
                return saved
            return f"{saved} Resume with: {command('train')} --resume {quoted(result.run_dir)}"
        s = result.seconds
        split = ", ".join(f"{name} {s[name]:.1f} s ({s[name] / result.wall_seconds:.1%})"
                          for name in ("start-up", "calibration", "compile", "train", "eval", "save")
                          if name in s)
        budget = self.trainer.plan.describe()  # a time budget's: the seconds spent over every session
        split += f"; {budget}" if budget else ""
        trained = result.step - self.first_step
        steps = f"{trained:,} step{'s' if trained != 1 else ''}"
        if self.first_step and trained == 1:  # a resumed run's session says which steps it trained
            steps += f" (step {result.step})"  # named as every line names a step, its count aside
        elif self.first_step:
            steps += f" (steps {self.first_step + 1}-{result.step})"
        rate = result.tokens_per_second  # NaN where the one step trained compiled the model: none timed
        speed = f"{rate:,.0f} tok/s" if math.isfinite(rate) else "no tok/s (its one step compiled the model)"
        return (f"done: {steps} in {result.wall_seconds:.1f} s ({split}), {speed}, best validation loss "
                f"{result.best_val_loss:.4f}; checkpoints in {result.run_dir}")
