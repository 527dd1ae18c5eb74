"""`tinyattn lab recurrence`: the attention model beside an LSTM of the same size, measured.

The claim (the attention chapter): an RNN reads a sequence step by step, so what it read
early reaches a late position only through every step between, and attention connects
positions directly and computes them all at once. Four measurements, on the config's data
and tokenizer, the attention model as the config describes it and a `torch.nn.LSTM`
language model (`tinyattn.lab.lstm`) whose parameter count is within a few percent of it:

1. Speed: training tokens per second at contexts 64, 256 and 1024, the same tokens per step
   (a context longer than a training step's tokens steps one window: the table says so).
2. Validation loss after the same wall time of training each (the config's optimizer and
   schedule, the schedule's length fixed by the step time measured in 1).
3. Loss by position for both (what each makes of more context).
4. The path length itself: the norm of the gradient of the loss at the last position with
   respect to the input embedding k positions back, against k, at initialisation and trained
   (an untied head starts at zero and passes back nothing: at initialisation it is measured as
   a tied one, `at_initialisation`).

Reused: `train.trainer.Trainer` steps both models (the LSTM has the training interface of a
`LanguageModel`), `train.optim.build_optimizer` builds their optimizers,
`data.batches.prepare_data` and `BatchSampler` give the batches, `train.owners.
validation_loss_by_position` measures the loss by position. torch.compile is off for both.
Writes `recurrence.txt`, `recurrence.png` and TensorBoard runs `attention/` and `lstm/` into
one folder (`--out`, default `checkpoints/lab/recurrence-<date>-<time>`); an `--out` holding an
earlier run's is refused without `--force` (`outputs.clear_earlier_lab`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.analysis.evaluate import format_loss_by_position, log_loss_by_position_to_tensorboard
from tinyattn.analysis.plotting import require_matplotlib
from tinyattn.config import Config, TrainConfig, home_path, load_config
from tinyattn.data.batches import BatchSampler, eval_batches, prepare_data
from tinyattn.errors import TinyattnError, counted
from tinyattn.lab.lstm import LSTMConfig, LSTMLanguageModel, lstm_width_for
from tinyattn.lab.outputs import (
    add_threads,
    clear_earlier_lab,
    command_started,
    experiment_folder,
    machine_line,
    refuse_own_settings,
    save_report,
    stopped_midway,
    tensorboard_writer,
    use_threads,
)
from tinyattn.model.attention_path import attention_path
from tinyattn.model.transformer import LanguageModel, evaluation_mode
from tinyattn.system.choices import PRECISIONS
from tinyattn.system.device import Precision, select_device, select_precision
from tinyattn.system.invocation import quoted
from tinyattn.system.seeding import seed_everything
from tinyattn.system.timing import call_times
from tinyattn.train.optim import build_optimizer, ns_dtype_for
from tinyattn.train.owners import validation_loss_by_position
from tinyattn.train.trainer import Trainer

DEFAULT_CONFIG = "configs/shakespeare_char.yaml"
CONTEXTS = (64, 256, 1024)
GRADIENT_WINDOWS = 32  # validation windows the gradient norms are averaged over
LOG_EVERY = 10  # steps between the train-loss points logged

OUTPUTS = ("recurrence.txt", "recurrence.png", "attention", "lstm")  # what `run` writes into --out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, type=home_path, metavar="FILE",
                        help=f"the attention model, data and training to compare (default: {DEFAULT_CONFIG})")
    # action="extend": `--set a=1 --set b=2` keeps both (argparse's default keeps only the last).
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="override config values, e.g. model.n_layer=2 train.batch_size=16")
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="wall seconds each model trains (default: 40)")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS),
                        help="context lengths of the speed table (default: 64 256 1024)")
    parser.add_argument("--lstm-layers", type=int, default=2, help="LSTM layers (default: 2)")
    parser.add_argument("--device", help="overrides train.device: auto, cpu, cuda, cuda:N or mps")
    add_threads(parser)
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="overrides train.precision (default: fp32, so every machine does the same arithmetic)")
    parser.add_argument("--out", type=home_path, metavar="DIR",
                        help="folder for the table, figure and TensorBoard "
                        "(default: a new checkpoints/lab/recurrence-<date>-<time>)")
    parser.add_argument("--force", action="store_true",
                        help="replace what an earlier run of this lab wrote into --out")


@dataclass
class Contender:
    """One of the two models: how to build it (seeded) at a context length, and what it measured."""

    name: str
    shape: str  # layers and width, for the report
    build: Callable[[int], nn.Module]  # context length -> a fresh model, the same weights every call
    speed: dict[int, float] = field(default_factory=dict)  # context -> training tokens/s
    gradient_at_init: Optional[np.ndarray] = None  # (T,) gradient norm k positions back
    gradient_trained: Optional[np.ndarray] = None
    position_losses: Optional[np.ndarray] = None  # (T,) validation loss by position
    curve: list[tuple[float, float]] = field(default_factory=list)  # (seconds, train loss)
    steps: int = 0
    seconds: float = 0.0
    parameters: int = 0

    @property
    def val_loss(self) -> float:
        return float(self.position_losses.mean())


# Settings the lab sets from its own options: each model's steps from what --seconds fits at its
# measured speed, the folder from --out, the arithmetic from --precision (a --set of one was ignored).
OWN_SETTINGS = {"train.max_steps": "--seconds", "train.time_budget": "--seconds", "train.out_dir": "--out {}",
                "train.precision": "--precision {}"}


def run(args: argparse.Namespace) -> int:
    started = command_started()  # the command's, start-up included
    require_matplotlib()  # before any work: the figure is drawn before the report (one line)
    use_threads(args.threads)
    refuse_own_settings("recurrence", args.overrides, OWN_SETTINGS)
    config = load_config(args.config, args.overrides)
    check_positive(args)
    check_causal(config)
    device = select_device(args.device or config.train.device)
    precision = select_precision(args.precision, device, "--precision")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = config.model.vocab_size or data.tokenizer.vocab_size
    contenders = contenders_for(config, args.lstm_layers, device, precision)
    clear_earlier_lab(args.out, OUTPUTS, args.force)  # before the speed and the training
    folder = experiment_folder(args.out, "recurrence")
    tokens_per_step = training_step_tokens(config)
    with stopped_midway("recurrence", folder, args.out):
        for c in contenders:
            # The training context too, where the table does not ask for it: its speed sets the
            # schedule of the loss comparison (`train_and_measure`).
            for context in dict.fromkeys([*args.contexts, config.model.context_length]):
                c.speed[context] = tokens_per_second(c, config.train, data.train, context=context,
                                                     tokens_per_step=tokens_per_step, device=device,
                                                     precision=precision)
        for c in contenders:
            train_and_measure(c, config, data, seconds=args.seconds, folder=folder, device=device,
                              precision=precision)
    save_figure(contenders, folder / "recurrence.png", contexts=args.contexts)
    text = report(contenders, config, args, machine_line(device, precision.name),
                  wall=time.perf_counter() - started)
    save_report(folder, "recurrence", text)
    print(f"wrote {folder}/recurrence.txt, recurrence.png and TensorBoard runs "
          f"(tensorboard --logdir {quoted(folder)})", flush=True)
    return 0


def check_positive(args: argparse.Namespace) -> None:
    """--seconds, each of --contexts and --lstm-layers: one line naming the first that is out of
    range. Seconds must be finite too: the schedule is int(seconds * speed ...), nan or inf a traceback."""
    if not 0 < args.seconds < math.inf:
        raise TinyattnError(f"--seconds {args.seconds:g}: expected a positive, finite number of seconds")
    for flag, values in (("--contexts", args.contexts), ("--lstm-layers", [args.lstm_layers])):
        for value in values:
            if value <= 0:
                raise TinyattnError(f"{flag} {value}: expected a positive integer")


def check_causal(config: Config) -> None:
    """A bidirectional attention model (model.causal false, `tinyattn lab causal`'s experiment) reads the
    token it predicts: its loss beside the LSTM's would be of the leaked answer. One line, before anything."""
    if not config.model.causal:
        raise TinyattnError("model.causal false: a bidirectional attention model reads the token it "
                            "predicts, so its loss and speed beside an LSTM's next-token predictions would "
                            "compare nothing; expected true (remove it from --set or the config)")


def contenders_for(config: Config, lstm_layers: int, device: torch.device,
                   precision: Precision) -> list[Contender]:
    """The attention model of the config and the LSTM whose parameter count matches it."""
    seed = config.train.seed

    def attention(context: int) -> nn.Module:
        model_config = dataclasses.replace(config.model, context_length=context)
        seed_everything(seed)
        path = attention_path(model_config.attention, device, precision, model_config)
        return LanguageModel(model_config, path).to(device)

    target = attention(config.model.context_length).num_parameters()
    width = lstm_width_for(target, config.model.vocab_size, lstm_layers)

    def lstm(context: int) -> nn.Module:
        seed_everything(seed)
        return LSTMLanguageModel(LSTMConfig(config.model.vocab_size, width, lstm_layers, context,
                                            config.model.dropout)).to(device)

    return [Contender("attention", f"{config.model.n_layer} layers, width {config.model.n_embd}", attention),
            Contender("lstm", f"{lstm_layers} layers, width {width}", lstm)]


def make_trainer(model: nn.Module, train_config: TrainConfig, tokens, *, batch_size: int, context: int,
                 device: torch.device, precision: Precision) -> Trainer:
    """The project's Trainer over either model (compile off: both run eagerly)."""
    # No moving average: the lab compares the two models' own weights, step for step.
    train_config = dataclasses.replace(train_config, compile=False, grad_accum_steps=1, ema=None)
    optimizers = build_optimizer(model, train_config, device, ns_dtype_for(precision.autocast_dtype))
    batches = BatchSampler(tokens, batch_size, context, seed=train_config.seed)
    return Trainer(model, optimizers, batches, train_config, device=device, precision=precision)


def tokens_per_second(contender: Contender, train_config: TrainConfig, tokens, *, context: int,
                      tokens_per_step: int, device: torch.device, precision: Precision) -> float:
    """Training tokens/s at `context`: the median of 3 timed steps after one untimed, of
    `speed_batch` windows."""
    model = contender.build(context)
    trainer = make_trainer(model, train_config, tokens, batch_size=speed_batch(tokens_per_step, context),
                           context=context, device=device, precision=precision)
    times = call_times(trainer.train_step, repeats=3, warmup=1, device=device)
    return trainer.tokens_per_step / statistics.median(times)


def training_step_tokens(config: Config) -> int:
    """The tokens of one training step, batch_size x context_length: what the speed table's every
    context aims to step (`speed_batch`)."""
    return config.train.batch_size * config.model.context_length


def speed_batch(tokens_per_step: int, context: int) -> int:
    """Windows per step of the speed table at `context`: as many as fit the training step's
    `tokens_per_step`, at least one (a context longer than that steps one whole window)."""
    return max(1, tokens_per_step // context)


def speed_header(tokens_per_step: int, contexts: list[int]) -> tuple[str, bool]:
    """The speed table's title, and whether its rows need a tokens/step column: the tokens each
    context really steps (`speed_batch` x context), one number when every context steps the same."""
    stepped = {speed_batch(tokens_per_step, context) * context for context in contexts}
    if len(stepped) == 1:
        return f"training tokens/s ({stepped.pop()} tokens per step, median of 3 steps)", False
    return (f"training tokens/s (median of 3 steps; each context steps as many whole windows as fit the "
            f"training step's {tokens_per_step} tokens, at least one: tokens/step)"), True


def gradient_by_distance(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """(T,) float64: at index k, the mean over the windows of |d loss_last / d e_(T-1-k)|.

    loss_last is the cross-entropy of each window's last target; e_t the input embedding
    (the token embedding's output) at position t. Read with a forward hook on
    `model.token_embedding`, so any model with one (LanguageModel, LSTMLanguageModel) is measured
    as it is. x, y: (B, T).

    cuDNN is off for the forward and backward: its RNN kernels refuse a backward in eval mode
    ("cudnn RNN backward can only be called in training mode"), and the measurement wants eval
    (no dropout). Without cuDNN the LSTM runs torch's own kernels, the same maths.
    """
    captured: list[torch.Tensor] = []
    handle = model.token_embedding.register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        with evaluation_mode(model), torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            logits = model(x).logits  # (B, T, V)
            # Summed, not averaged: each window's gradient is that of its own loss.
            loss = F.cross_entropy(logits[:, -1].float(), y[:, -1], reduction="sum")
            (grad,) = torch.autograd.grad(loss, captured[0])  # (B, T, C)
    finally:
        handle.remove()
    norms = grad.float().norm(dim=-1).mean(0)  # (T,) by position
    return norms.flip(0).double().cpu().numpy()  # (T,) by distance back from the last position


def at_initialisation(model: nn.Module) -> nn.Module:
    """The model whose gradients by distance stand for its initialisation.

    An untied output head starts at zero (`LanguageModel.init_weights`), and a zero head passes
    no gradient back to any position: every distance would read 0. For such a model this is a
    copy whose head starts as a tied one would, as a copy of the token embedding; any other
    model (the LSTM, a tied head, a head already trained) is returned as it is.
    """
    head = getattr(model, "head", None)
    if head is None or head.weight is model.token_embedding.weight or head.weight.count_nonzero():
        return model
    tied = copy.deepcopy(model)
    with torch.no_grad():
        tied.head.weight.copy_(tied.token_embedding.weight)
    return tied


def train_and_measure(contender: Contender, config: Config, data, *, seconds: float, folder,
                      device: torch.device, precision: Precision) -> None:
    """Gradient norms at initialisation, `seconds` of training, then the loss by position and the
    trained gradient norms; the curves go to TensorBoard under `<folder>/<name>`."""
    context, tc = config.model.context_length, config.train
    x, y = next(iter_validation(data.validation, context, GRADIENT_WINDOWS))
    model = contender.build(context)
    contender.parameters = sum(p.numel() for p in model.parameters())
    contender.gradient_at_init = gradient_by_distance(at_initialisation(model), x.to(device), y.to(device))
    # The schedule spans the steps the measured speed fits in `seconds`; the clock alone stops the
    # run (past the schedule's end the rate stays at its floor), so both train the same wall time.
    steps = max(10, int(seconds * contender.speed.get(context, 0) / (tc.batch_size * context)))
    train_config = dataclasses.replace(tc, max_steps=steps, warmup_steps=min(tc.warmup_steps, steps // 5))
    trainer = make_trainer(model, train_config, data.train, batch_size=tc.batch_size, context=context,
                           device=device, precision=precision)
    writer = tensorboard_writer(folder, contender.name)
    try:
        train_for(trainer, contender, seconds, writer)
        with precision.autocast(device):
            contender.position_losses = validation_loss_by_position(
                model, data.validation, context, tc.batch_size, tc.eval_windows)
        contender.gradient_trained = gradient_by_distance(model, x.to(device), y.to(device))
        writer.add_scalar("val/loss", contender.val_loss, trainer.step)
        writer.add_scalar("val/loss_after_seconds", contender.val_loss, round(contender.seconds))
        log_loss_by_position_to_tensorboard(writer, contender.position_losses, trainer.step)
        for k, norm in enumerate(contender.gradient_trained):
            writer.add_scalar("gradient_norm_by_distance/trained", norm, k)
            writer.add_scalar("gradient_norm_by_distance/at_init", contender.gradient_at_init[k], k)
    finally:
        writer.close()


def train_for(trainer: Trainer, contender: Contender, seconds: float, writer) -> None:
    """Step until `seconds` of wall time pass; log the train loss at the first step, every LOG_EVERY
    steps and at the last step, so the curve spans the run however few steps fit (a point is no line)."""
    def log(loss) -> None:
        value, at = float(loss), time.perf_counter() - start
        contender.curve.append((at, value))
        writer.add_scalar("train/loss", value, trainer.step)

    def logs_at(step: int) -> bool:
        return step % LOG_EVERY == 0 or step == 1

    start, loss = time.perf_counter(), None
    while time.perf_counter() - start < seconds:
        loss, _ = trainer.train_step()
        if logs_at(trainer.step):
            log(loss)
    if loss is not None and not logs_at(trainer.step):  # the last step's, so the curve ends with the run
        log(loss)
    contender.steps, contender.seconds = trainer.step, time.perf_counter() - start
    writer.add_scalar("train/tokens_per_second", trainer.tokens_seen / contender.seconds, trainer.step)


def iter_validation(tokens, context: int, windows: int):
    """`windows` evaluation windows spread over the validation split, one batch (x, y): (B, T)."""
    return eval_batches(np.asarray(tokens), context, windows, max_windows=windows)


# ----------------------------------------------------------------------------- reporting


def report(contenders: list[Contender], config: Config, args: argparse.Namespace, machine: str, *,
           wall: float) -> str:
    """The table: speed by context, loss after the same wall time, loss by position, gradient by distance."""
    attn, lstm = contenders
    tokens_per_step = training_step_tokens(config)
    title, per_context = speed_header(tokens_per_step, args.contexts)
    data = ", ".join(config.data.files) if config.data.files else config.data.dataset
    lines = [f"tinyattn lab recurrence: {args.config} ({data}); {machine}",
             f"attention: {attn.parameters:,} parameters ({attn.shape}); lstm: {lstm.parameters:,} "
             f"parameters ({lstm.shape}); ratio {lstm.parameters / attn.parameters:.3f}", "",
             title,
             f"{'context':>8}" + (f" {'tokens/step':>11}" if per_context else "")
             + f" {'attention':>10} {'lstm':>10} {'lstm/attn':>10}"]
    for context in args.contexts:
        a, b = attn.speed[context], lstm.speed[context]
        stepped = f" {speed_batch(tokens_per_step, context) * context:>11}" if per_context else ""
        lines.append(f"{context:>8}{stepped} {a:>10,.0f} {b:>10,.0f} {b / a:>10.2f}")
    lines += ["", f"validation loss after {args.seconds:g} s of training each (context "
              f"{config.model.context_length}, {config.train.eval_windows or 'all'} windows)"]
    for c in contenders:
        lines.append(f"{c.name:>10}: {c.val_loss:.3f} after {counted(c.steps, 'step')} in {c.seconds:.1f} s")
    for c in contenders:
        lines += ["", f"loss by position, {c.name}", format_loss_by_position(c.position_losses)]
    lines += ["", "gradient norm of the last position's loss w.r.t. the input embedding k tokens back "
              f"(mean over {GRADIENT_WINDOWS} validation windows; an untied head, which starts at zero, "
              "is measured at init as a tied one: `at_initialisation`)",
              f"{'k':>5} {'attn init':>10} {'lstm init':>10} {'attn':>10} {'lstm':>10}"]
    for k in distance_rows(config.model.context_length):
        row = [c.gradient_at_init[k] for c in contenders] + [c.gradient_trained[k] for c in contenders]
        lines.append(f"{k:>5} " + " ".join(f"{v:>10.2e}" for v in row))
    lines += ["", f"wall time of the command: {wall:.0f} s"]
    return "\n".join(lines)


def distance_rows(context: int) -> list[int]:
    """k = 0, 1, 2, 4, 8, ... and the farthest, context - 1."""
    rows, k = [0], 1
    while k < context - 1:
        rows.append(k)
        k *= 2
    return rows + [context - 1] if context > 1 else rows  # a context of 1 has only k = 0


def save_figure(contenders: list[Contender], path, *, contexts: list[int]) -> None:
    """Four panels: speed by context, train loss against wall time, loss by position, gradient by distance.
    The speed panel shows the table's `contexts` (--contexts), not the training context timed beside
    them for the schedule alone."""
    from tinyattn.analysis.plotting import new_figure

    figure = new_figure(11.0, 7.5, dpi=100, layout="constrained")
    speed, curve, position, gradient = figure.subplots(2, 2).flat
    for c in contenders:
        shown = sorted(set(contexts))
        speed.plot(shown, [c.speed[t] for t in shown], marker="o", label=c.name)
        curve.plot(*zip(*c.curve), label=f"{c.name} (val {c.val_loss:.3f})")
        position.plot(np.arange(1, len(c.position_losses) + 1), c.position_losses, label=c.name)
        k = np.arange(len(c.gradient_trained))
        line, = gradient.plot(k, c.gradient_trained, label=f"{c.name}, trained")
        gradient.plot(k, c.gradient_at_init, linestyle="--", color=line.get_color(), label=f"{c.name}, at init")
    speed.set(xscale="log", yscale="log", xlabel="context length", ylabel="training tokens/s",
              title="speed by context")
    curve.set(xlabel="wall seconds of training", ylabel="train loss", title="loss against wall time")
    position.set(xscale="log", xlabel="tokens of context read (position + 1)", ylabel="validation loss",
                 title="loss by position")
    gradient.set(yscale="log", xlabel="k (tokens back from the last position)",
                 ylabel="|d loss_last / d embedding|", title="gradient path: loss at the end, input k back")
    for ax in (speed, curve, position, gradient):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.savefig(path, dpi=100)
