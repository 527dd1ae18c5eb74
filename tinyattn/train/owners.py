"""The small owners the training loop hands each decision to.

- `LossWindow`: losses stay on the device and are read once per log interval (one host
  sync), checked for NaN/inf there, and turned into throughput.
- `Evaluator`: the validation loss (by position), then the hooks `train.show` lists (a
  sample, loss by position, attention maps, head ablation: `tinyattn.train.hooks`).
- `Checkpointer`: step checkpoints, pruning, `best.pt` (replaced only by a lower loss).
- `Timers`, `StopRequest`: where the wall time went; Ctrl-C/SIGTERM as a flag (before the
  first step, `StoppedBeforeStart`: nothing to finish, the run ends at once).
- `SharedStop`: under DDP, the stop every rank acts on (a signal to one rank stops them all);
  `ignore_stop_signals` once a stopped run's ranks have left together.

`Trainer` (`tinyattn.train.trainer`) owns the step; `tinyattn.train.loop` runs the loop over them.
"""


from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, config_to_dict
from tinyattn.data.batches import eval_batches
from tinyattn.model.transformer import evaluation_mode
from tinyattn.system.distributed import Distributed, largest_value, mean_over_ranks, said_once
from tinyattn.system.timing import synchronize
from tinyattn.train.hooks import Hook, Shown
from tinyattn.train.trainer import Trainer, TrainingError

# ----------------------------------------------------------------------------- the owners


class LossWindow:
    """Per-step losses kept on the device, read once per log interval (the one host sync). Each
    step's own 0-d tensor is kept, not a buffer of `size`: a train.log_interval far past the run
    (1e11) holds only the steps taken. Under data parallel (`dist`) each rank's loss is its own
    windows'; what is read is the ranks' mean, the loss of the step's whole batch (whose gradient
    the step took), where it was rank 0's alone. Every rank reads at the same steps."""

    def __init__(self, size: int, device: torch.device, dist: Optional[Distributed] = None):
        self.size = size
        self.losses: list[torch.Tensor] = []  # a new tensor each step (Trainer.train_step's total)
        self.device = device
        self.ranks = dist if dist is not None and dist.enabled else None  # None: one process
        self.grad_norm: Optional[torch.Tensor] = None
        self.started = time.perf_counter()
        self.untimed = 0  # steps of the window left out of its seconds (`untime_last`)

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.losses.append(loss)
        self.grad_norm = grad_norm

    @property
    def pending(self) -> int:
        return len(self.losses)

    @property
    def full(self) -> bool:
        return self.pending == self.size

    @property
    def timed(self) -> int:
        """The steps its seconds are of: throughput counts these steps' tokens."""
        return self.pending - self.untimed

    def untime_last(self) -> None:
        """The step just added compiled the model: its time is compiling's, not a step's, so the
        window's clock starts after it (its loss stays in the window)."""
        synchronize(self.device)
        self.started = time.perf_counter()
        self.untimed += 1

    def read(self, step: int, run_dir: Path) -> tuple[list[float], float]:
        """The window's losses and its wall seconds; raises TrainingError on a non-finite loss."""
        synchronize(self.device)
        seconds = time.perf_counter() - self.started
        window = self._over_ranks(torch.stack(self.losses)).tolist() if self.losses else []
        bad = [i for i, value in enumerate(window) if not math.isfinite(value)]
        if bad:
            failed_step = step - len(window) + 1 + bad[0]
            last = ckpt.latest_checkpoint(run_dir)
            kept = f"; the last good checkpoint is {last}" if last else ""
            failed = TrainingError(f"the loss became {window[bad[0]]} at step {failed_step}; "
                                   f"training stopped{kept} (try a lower train.lr)")
            raise said_once(failed, self.ranks is not None)  # every rank read the same
        self.losses, self.untimed = [], 0
        return window, seconds

    def restart(self) -> None:
        self.started = time.perf_counter()

    def _over_ranks(self, losses: torch.Tensor) -> torch.Tensor:
        return losses if self.ranks is None else mean_over_ranks(self.ranks, losses)


def validation_loss_by_position(model, tokens: np.ndarray, context_length: int, batch_size: int,
                                max_windows: Optional[int]) -> np.ndarray:
    """The mean loss (nats) at each position over `data.eval_batches`'s windows: (T,) float64.

    The same windows every call, so the same model always gets the same loss; its mean is
    the validation loss. The arithmetic is `analysis.evaluate.loss_by_position`'s (a test
    holds them equal): logits in fp32, per-target cross-entropy summed in float64.
    """
    device = next(model.parameters()).device
    sums, count = torch.zeros(context_length, dtype=torch.float64), 0  # (T,)
    with evaluation_mode(model), torch.no_grad():
        for x, y in eval_batches(np.asarray(tokens), context_length, batch_size, max_windows):
            logits = model(x.to(device)).logits  # (B, T, V)
            losses = F.cross_entropy(logits.float().transpose(1, 2), y.to(device), reduction="none")  # (B, T)
            sums += losses.double().sum(0).cpu()
            count += x.size(0)
    return sums.numpy() / count


@dataclass
class EvalResult:
    step: int
    position_losses: np.ndarray  # (context_length,): validation loss at each position

    @property
    def val_loss(self) -> float:
        return float(self.position_losses.mean())


class Evaluator:
    """At every eval_interval and the last step: the validation loss by position (`run`), then
    on the main process the hooks train.show lists (`show`)."""

    def __init__(self, trainer: Trainer, config: Config, validation: np.ndarray, tokenizer, *,
                 dist: Distributed = Distributed(), hooks: tuple[Hook, ...] = ()):
        self.trainer = trainer
        self.config = config
        self.validation = validation
        self.tokenizer = tokenizer
        self.dist = dist
        self.hooks = tuple(hooks)

    def due(self, step: int, *, last: bool) -> bool:
        """At every eval_interval steps, and at the run's last step (`last`)."""
        return step % self.config.train.eval_interval == 0 or last

    def run(self, step: int) -> EvalResult:
        t, tc = self.trainer, self.config.train
        # The plain module: a compiled one would compile a second graph for evaluation.
        with t.precision.autocast(t.device):
            losses = validation_loss_by_position(t.model, self.validation, self.config.model.context_length,
                                                 tc.batch_size, tc.eval_windows)
        return EvalResult(step, losses)

    def show(self, result: EvalResult, writer, run_dir: Optional[Path]) -> None:
        """Run the hooks (main process only) with `writer` (TensorBoard, or hooks.DISCARD)."""
        if not self.dist.is_main or not self.hooks:
            return
        shown = Shown(step=result.step, model=self.trainer.model, tokenizer=self.tokenizer,
                      config=self.config, position_losses=result.position_losses, writer=writer,
                      run_dir=run_dir)
        for hook in self.hooks:
            hook(shown)


class Checkpointer:
    """Writes step checkpoints (keeping the last `keep_last`) and best.pt, on rank 0."""

    def __init__(self, run_dir: Path, config: Config, tokenizer, dist: Distributed):
        self.run_dir = run_dir
        self.keep_last = config.train.keep_last
        self.dist = dist
        self.run_state = {"config": config_to_dict(config), "tokenizer": tokenizer.to_json()}
        # best.pt is replaced only by a lower validation loss than the one it holds.
        # A damaged one counts as none: the next evaluation replaces it with a model that verifies.
        saved = ckpt.verified_value(run_dir / ckpt.BEST, "best_val_loss") if dist.is_main else None
        self.best_on_disk = float(saved) if saved is not None else math.inf

    def save(self, trainer: Trainer, best: bool) -> None:
        """best.pt first, then the step's checkpoint: a save cut short between them (a full disk, a
        kill, a second Ctrl-C) leaves the best model in best.pt, and the resume from the step before
        trains to it again. The other way round, the resume went on from the new step's checkpoint,
        whose best loss no later evaluation beats, so best.pt kept a worse model for good. The state is
        pickled once: the step's checkpoint is a copy of best.pt's bytes where both are written."""
        if self.dist.is_main:
            state = ckpt.Snapshot({**trainer.state_dict(), **self.run_state})
            if best and trainer.best_val_loss < self.best_on_disk:
                ckpt.save_checkpoint(state, self.run_dir / ckpt.BEST)
                self.best_on_disk = trainer.best_val_loss
            ckpt.save_checkpoint(state, self.run_dir / ckpt.step_filename(trainer.step))
            ckpt.prune_checkpoints(self.run_dir, self.keep_last)
        if self.dist.enabled:
            torch.distributed.barrier()


class Timers:
    """Wall seconds spent per activity: the split the run's last line reports."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock  # the run's (the time budget's) clock
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + self.clock() - start


class StoppedBeforeStart(KeyboardInterrupt):
    """A stop signal before the run's first step: with no step to finish or save, it ends the
    run at once; its message is the run's last line."""

    def __init__(self, signal_name: str):
        super().__init__(f"stopped by {signal_name} before the first step: nothing was trained or saved; "
                         "run the same command again to train")
        self.signal_name = signal_name


class StoppedAtOnce(KeyboardInterrupt):
    """A second stop signal after the first one's (a second Ctrl-C): the run ends mid-step or
    mid-save, without the checkpoint the first one asked for; `train` says what the folder keeps."""

    def __init__(self, signal_name: str):
        super().__init__(f"stopped at once by a second {signal_name}")
        self.signal_name = signal_name


def ignore_stop_signals() -> None:
    """From now on this process ignores SIGINT, SIGTERM and SIGHUP: it is ending on its own (a stopped
    run's ranks under torchrun, which sends SIGTERM to the ranks left once the first has exited; the
    processes it starts inherit this)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # no SIGHUP on Windows
        if hasattr(signal, name):
            try:
                signal.signal(getattr(signal, name), signal.SIG_IGN)
            except ValueError:  # not the main thread: leave signals alone
                pass


class StopRequest:
    """Turns SIGINT/SIGTERM, and SIGHUP (a closed terminal) unless the run ignores it (`nohup`),
    into a flag the loop checks after each step; a second one raises StoppedAtOnce. While
    `at_once` (before the first step: data preparation, building, the time budget's calibration,
    up to the first write) a signal raises StoppedBeforeStart instead."""

    def __init__(self, *, at_once: bool = False):
        self.signal_name: Optional[str] = None
        self.at_once = at_once
        self.ending = False  # `end_deaf`: the run ends on its own; a signal now is ignored

    def end_deaf(self) -> None:
        """The run ends on its own, another rank having left (`distributed.departure_said`) or on an
        error every rank met (`loop._said_by_rank_0`): torchrun's SIGTERM to the ranks left follows, and
        cut rank 0's clean-up (the folder of a new run stayed) or killed it before its line. A signal
        from now on, also after `installed`, is ignored (`ignore_stop_signals`)."""
        self.ending = True

    @contextmanager
    def installed(self):
        previous = {}
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows

        def handler(signum, frame):
            if self.ending:
                return
            if self.signal_name is not None:
                # a closed terminal hangs up twice: its shell, then the kernel; before the first
                # step the run is already ending at once, and a second signal would cut its clean-up
                if signum == hangup or self.at_once:
                    return
                raise StoppedAtOnce(signal.Signals(signum).name)  # a second Ctrl-C: stop now
            self.signal_name = signal.Signals(signum).name
            if self.at_once:
                raise StoppedBeforeStart(self.signal_name)

        stops = [signal.SIGINT, signal.SIGTERM]
        if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
            stops.append(hangup)
        for sig in stops:
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: leave signals alone
                pass
        try:
            yield self
        finally:
            if self.ending:
                ignore_stop_signals()
            else:
                # After a hangup the terminal is gone: a late one must not kill the run's last lines.
                hung_up = self.signal_name == "SIGHUP"
                for sig, old in previous.items():
                    signal.signal(sig, signal.SIG_IGN if sig == hangup and hung_up else old)


class SharedStop:
    """The stop the loop acts on. Under DDP a signal may reach one rank only (`kill -TERM <pid>`)
    or the ranks at different steps; a rank that left the loop alone would wait in the
    checkpoint's barrier while the others wait in the next step's all-reduce, for ever. So the
    ranks agree: an all-reduce MAX of each one's signal number, after every step on the CPU; on a
    GPU only where the loop reads its loss window anyway (`reading`), which keeps the one host
    sync per log interval (a stop then waits for the window's end). A rank that got no signal
    stops with the name of the one another rank got; its own `StopRequest` stays unset, so a
    signal that reaches it late (torchrun forwards one to every rank) is a first one, not a second.
    A single process reads its own flag: no collective."""

    def __init__(self, stopper: StopRequest, dist: Distributed, device: torch.device):
        self.stopper = stopper
        self.dist = dist
        self.device = device
        self.every_step = device.type != "cuda"

    def local(self) -> Optional[str]:
        """A single process's own signal, read again (after an evaluation, which takes seconds, as the
        loop read it before each step); under DDP None: the ranks act on what they agreed."""
        return None if self.dist.enabled else self.stopper.signal_name

    def agreed(self, reading: bool) -> Optional[str]:
        """The signal's name once the ranks agree the run stops, else None. `reading`: the loop
        reads its losses now (waits for the device): a GPU's ranks agree only then."""
        own = self.stopper.signal_name
        if not self.dist.enabled:
            return own
        if not (self.every_step or reading):
            return None
        number = largest_value(self.dist, signal.Signals[own].value if own else 0, self.device)
        return own or (signal.Signals(number).name if number else None)
