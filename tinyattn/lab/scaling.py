"""`tinyattn lab scaling`: why attention divides its scores by sqrt(d_k), measured.

The chapter's claim: a query and a key of d_k entries, each of unit variance, have a dot product
of variance d_k; undivided, the scores spread further as heads widen, and softmax turns widely
spread scores into nearly one-hot rows, whose gradient is nearly zero. Dividing by sqrt(d_k) keeps
the spread near 1 at any head width. Three measurements:

1. the arithmetic, no model (`softmax_rows`): random queries and keys of unit-variance entries at
   head widths 8 to 256, scores divided and undivided: their spread, the softmax rows' entropy as
   a share of a uniform row's, their largest weight, and the size of softmax's gradient (the
   Frobenius norm of its Jacobian, diag(p) - p p^T, zero for a one-hot row);
2. training, with `tinyattn.train.loop.train`: the same small model (the config's, at 2 layers of
   width 128) at each head width of --head-dims (default 16 and 64: 8 heads and 2), each trained
   twice on the same batches from the same weights, scores divided (every model's) and undivided
   (`model.scale_scores: false`, an experiment-only setting that export refuses). Each run's losses,
   and its attention rows on the validation windows (`attention_rows`) as it started and as trained;
3. with --checkpoint, a model of yours: each layer's rows as trained and with its scores' spread
   multiplied by sqrt(d_k), the division removed (`rows_rescaled`; for an undivided model, divided).

It writes <out>/scaling.txt (the tables) and <out>/scaling.png and prints the tables; each run
trains into <out>/<name>, so `tensorboard --logdir <out>` shows the curves side by side.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tinyattn.config import home_path
from tinyattn.errors import TinyattnError
from tinyattn.lab.runs import DEFAULT_CONFIG, lab_overrides
from tinyattn.system.invocation import quoted

DEFAULT_STEPS = 300  # each run; the four together stay within 3 minutes on 2 CPU cores in fp32
DEFAULT_HEAD_DIMS = "16,64"
WIDTH = 128  # the runs' width, after the labs' small model (`runs.SMALL_MODEL`: 2 layers, batch 16)
# The runs' model beyond the labs' small one: that width, and keys and values for every head (before --set).
LAB_MODEL = [f"model.n_embd={WIDTH}", "model.n_kv_head=null"]
ARITHMETIC_DIMS = (8, 16, 32, 64, 128, 256)
ARITHMETIC_ROWS = 1024  # random rows of keys at each head width, at 64 keys a row (`arithmetic_rows`)
ARITHMETIC_KEYS = 1024  # the most keys a random row has (the runs' context, up to this)
ONE_HOT = 0.99  # a row with more than this weight on one key is counted as one-hot
MEASURED_WINDOWS = 16  # the validation windows each model's attention rows are read on
OUTPUTS = ("scaling.txt", "scaling.png")  # what `run` writes into --out beside the run folders
RUN_NAME = re.compile(r"(un)?divided_d\d+")  # a run folder's name (`run_names`), of any head width
# Settings the lab derives from its own options: a --set of one would describe another run.
OWN_SETTINGS = {"train.max_steps": "--steps {}", "train.out_dir": "--out {}", "model.n_head": "--head-dims"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, type=home_path, metavar="FILE",
                        help=f"the model and data the runs train (default: {DEFAULT_CONFIG})")
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help=f"override config values (dotted keys), after the lab's own: 2 layers of width "
                             f"{WIDTH}, keys and values for every head, batch 16, fp32, no compile, no time "
                             "budget, no tables by passes, one evaluation at the end; the heads come from "
                             "--head-dims, the steps from --steps and the folder from --out")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps of each run (default: {DEFAULT_STEPS})")
    parser.add_argument("--head-dims", default=DEFAULT_HEAD_DIMS, metavar="D[,D...]",
                        help=f"the head widths d_k trained, each divided and undivided; the heads are the "
                             f"width over d_k (default: {DEFAULT_HEAD_DIMS})")
    parser.add_argument("--out", type=home_path, metavar="DIR",
                        help="the lab's folder: a run folder each, scaling.txt, scaling.png "
                             "(default: a new checkpoints/lab/scaling-<date>-<time>)")
    parser.add_argument("--force", action="store_true", help="replace the runs of an earlier lab in --out")
    parser.add_argument("--checkpoint", type=home_path, metavar="RUN_DIR|FILE",
                        help="also read the attention rows of this trained model (a run folder, checkpoint "
                             "file or Hugging Face folder), as trained and with the division removed (for a "
                             "model trained undivided, with it)")


# ----------------------------------------------------------------------------- the arithmetic


@dataclass
class Rows:
    """Softmax rows, each a mean over the rows measured."""

    spread: float  # the standard deviation of a row's scores over its keys
    entropy_share: float  # the row's entropy over that of a uniform row of its keys: 1 uniform, 0 one-hot
    largest: float  # the row's largest weight
    one_hot: float  # the share of rows with more than ONE_HOT of their weight on one key
    gradient: float  # the Frobenius norm of softmax's Jacobian at the row


ROWS_FIELDS = ("spread", "entropy_share", "largest", "one_hot", "gradient")


def softmax_rows(scores, keys=None) -> Rows:
    """`Rows` of scores (..., N): each row's softmax over the keys where `keys` (a boolean (..., N),
    None: every key) is True; rows with fewer than two such keys are left out (a single key is
    one-hot whatever its score). A key's score may be -inf (its weight 0, its score unknown: see
    `rows_rescaled`): it counts as a key and is left out of the spread alone. The Jacobian of
    p = softmax(s) is diag(p) - p p^T, whose squared Frobenius norm is
    sum p_i^2 - 2 sum p_i^3 + (sum p_i^2)^2: about 1/N for a uniform row, 0 one-hot."""
    import torch

    scores = scores.double()
    keys = torch.ones_like(scores, dtype=torch.bool) if keys is None else keys
    counted = keys.sum(-1)  # (...,) keys a row weighs
    rows = counted >= 2
    p = torch.softmax(scores.masked_fill(~keys, float("-inf")), dim=-1)
    p_log_p = torch.where(p > 0, p * p.log(), torch.zeros_like(p))
    entropy = -p_log_p.sum(-1)  # (...,)
    known = keys & scores.isfinite()  # the keys whose scores the spread reads
    n = known.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(known, scores, 0.0).sum(-1, keepdim=True) / n
    spread = (torch.where(known, scores - mean, 0.0) ** 2).sum(-1, keepdim=True).div(n).sqrt().squeeze(-1)
    squares, cubes = (p ** 2).sum(-1), (p ** 3).sum(-1)
    gradient = (squares - 2 * cubes + squares ** 2).clamp(min=0).sqrt()
    share = entropy / counted.clamp(min=2).double().log()
    largest = p.amax(-1)
    measured = (spread, share, largest, largest > ONE_HOT, gradient)
    return Rows(*(float(x[rows].double().mean()) for x in measured))


def arithmetic_rows(keys: int) -> int:
    """The random queries the arithmetic draws against `keys` keys: ARITHMETIC_ROWS at 64 keys, fewer at
    more (at least 64), so that the keys drawn at d_k 256 stay near 64 MB whatever the context."""
    return max(64, ARITHMETIC_ROWS * 64 // keys)


def arithmetic(keys: int, dims=ARITHMETIC_DIMS, rows: Optional[int] = None, seed: int = 0
               ) -> list[tuple[int, Rows, Rows]]:
    """(d_k, divided, undivided) for each head width: `rows` random queries (`arithmetic_rows`), each
    against `keys` random keys, every entry drawn from N(0, 1)."""
    import torch

    rows = rows or arithmetic_rows(keys)
    generator = torch.Generator().manual_seed(seed)
    table = []
    for d in dims:
        q = torch.randn(rows, 1, d, generator=generator)  # (R, 1, d)
        k = torch.randn(rows, keys, d, generator=generator)  # (R, N, d)
        scores = (k @ q.transpose(1, 2)).squeeze(-1)  # (R, N): q.k, of variance d (softmax_rows: float64)
        table.append((d, softmax_rows(scores / math.sqrt(d)), softmax_rows(scores)))
    return table


# ----------------------------------------------------------------------------- a model's attention rows


def recorded_weights(model, x) -> list:
    """Each layer's attention weights (B, H, T, T) for windows x (B, T), in eval, without gradients."""
    import torch

    from tinyattn.model.attention import recording_attention_weights
    from tinyattn.model.transformer import evaluation_mode

    with evaluation_mode(model), torch.no_grad(), recording_attention_weights(model) as weights:
        model(x.to(next(model.parameters()).device))
    return [w.double().cpu() for w in weights]


def rows_rescaled(weights, factor: float = 1.0) -> Rows:
    """`Rows` of a layer's causal weights (B, H, T, T) with their scores multiplied by `factor`.

    A row's weights are softmax(s), so log w = s - logsumexp(s): the scores up to a constant of the
    row, which neither softmax nor the spread sees, and softmax(factor * log w) is the row the
    scores times `factor` give. Row t weighs keys 0..t (the causal mask). A key whose fp32 weight
    underflowed to 0 (a score about 100 or more below the row's largest) keeps weight 0 and counts
    as a key; its score is unknown, so the spread leaves it out and reads a little low there."""
    import torch

    T = weights.size(-1)
    keys = torch.ones(T, T, dtype=torch.bool).tril().expand_as(weights)  # (B, H, T, T)
    scores = torch.where(weights > 0, weights.clamp(min=1e-300).log() * factor, float("-inf"))
    return softmax_rows(scores, keys)


def attention_rows(model, x) -> Rows:
    """The mean `Rows` over a model's layers for windows x (B, T) (no gradient: a model's rows)."""
    per_layer = [rows_rescaled(w) for w in recorded_weights(model, x)]
    return Rows(*(sum(getattr(r, f) for r in per_layer) / len(per_layer) for f in ROWS_FIELDS))


def initial_model(config):
    """The model a run of `config` starts from: its seed, then its model drawn as the trainer draws it."""
    from tinyattn.model.transformer import LanguageModel
    from tinyattn.system.seeding import seed_everything

    seed_everything(config.train.seed)
    return LanguageModel(config.model)


# ----------------------------------------------------------------------------- the runs


def head_dims(text: str, width: int) -> list[int]:
    """--head-dims as distinct widths, each even (RoPE rotates pairs) and dividing the model's width."""
    try:
        dims = [int(item) for item in text.split(",")]
    except ValueError:
        raise TinyattnError(f"--head-dims {text!r}: expected head widths separated by commas, "
                            f"such as {DEFAULT_HEAD_DIMS}") from None
    for d in dims:
        if d <= 0:
            raise TinyattnError(f"--head-dims {text}: {d} is no head width; expected positive integers")
        if width % d:
            raise TinyattnError(f"--head-dims {text}: {d} does not divide the model's width {width} "
                                "(model.n_embd) into heads; give head widths that do")
        if d % 2:
            raise TinyattnError(f"--head-dims {text}: {d} is odd; RoPE rotates pairs of a head's dimensions, "
                                "so each head width must be even")
    if len(set(dims)) != len(dims):
        raise TinyattnError(f"--head-dims {text}: a head width given twice")
    return dims


def run_names(dims: list[int]) -> dict[str, tuple[int, bool]]:
    """{run name: (d_k, scores divided)}, in the order they train."""
    return {f"{'divided' if divided else 'undivided'}_d{d}": (d, divided)
            for d in dims for divided in (True, False)}


def run_settings(args: argparse.Namespace, out: Path, names: dict, width: int) -> dict[str, list[str]]:
    """{run name: its --set items}: the lab's, the user's --set, then the run's heads and division. Each
    run's config is loaded, so that one the config refuses (heads that grouped queries cannot share, say)
    is refused before any run trains."""
    from tinyattn.config import load_config
    from tinyattn.errors import ConfigError

    lab = lab_overrides(args.steps, out) + LAB_MODEL + list(args.overrides)
    runs = {name: lab + [f"model.n_head={width // d}", f"model.scale_scores={divided}"]
            for name, (d, divided) in names.items()}
    for name, items in runs.items():
        try:
            load_config(args.config, items)
        except ConfigError as e:
            d = names[name][0]
            raise TinyattnError(f"--head-dims {args.head_dims}: d_k {d} gives the {name} run "
                                f"model.n_head={width // d}, which its config refuses ({e})") from None
    return runs


def refuse_division_setting(overrides) -> None:
    """A --set of model.scale_scores refused in one line: every head width trains both ways."""
    from tinyattn.config import override_keys

    for item, key in zip(overrides, override_keys(overrides)):
        if key == "model.scale_scores":
            raise TinyattnError(f"--set {item}: lab scaling trains each head width both divided and "
                                "undivided; remove it")


@dataclass
class Run:
    """One trained run's line of the table."""

    name: str
    d: int
    divided: bool
    train_loss: float  # the last logged training loss
    val_loss: float  # its evaluation at the end
    started: Rows  # its attention rows as it started
    trained: Rows  # and as trained


def measure_run(name: str, d: int, divided: bool, result, x) -> Run:
    """A trained run's row: its last logged training loss, its evaluation (`result`, its TrainResult),
    and its attention rows on windows x (B, T) as it started and as trained."""
    from tinyattn.hf.folder import load_any_model
    from tinyattn.lab.runs import training_curve

    loaded = load_any_model(result.run_dir)
    _, losses = training_curve(result.run_dir)
    return Run(name, d, divided, float(losses[-1]), result.last_val_loss,
               attention_rows(initial_model(loaded.config), x), attention_rows(loaded.model, x))


# ----------------------------------------------------------------------------- the report


COLUMNS = (f"{'spread':>7} {'entropy share':>13} {'largest weight':>14} {'one-hot':>8} "
           f"{'softmax gradient':>16}")


def columns(rows: Rows) -> str:
    """`rows` under COLUMNS."""
    return (f"{rows.spread:>7.3f} {rows.entropy_share:>13.3f} {rows.largest:>14.3f} {rows.one_hot:>8.3f} "
            f"{rows.gradient:>16.3f}")


def uniform_gradient(keys: int) -> float:
    """The norm of softmax's Jacobian at a uniform row of `keys` keys: sqrt(1/N - 1/N^2)."""
    return math.sqrt(1 / keys - 1 / keys ** 2)


def format_report(header: str, table, runs: list[Run], *, keys: int, context: int, steps: int,
                  windows: int, layers=None) -> str:
    """The text `run` prints and writes: the arithmetic (rows of `keys` keys), the runs (causal rows of
    2 to `context` keys, read on `windows` validation windows) and, given `layers`, a checkpoint's."""
    causal_uniform = sum(uniform_gradient(n) for n in range(2, context + 1)) / (context - 1)
    arithmetic_uniform = uniform_gradient(keys)
    lines = [header, "",
             f"the arithmetic: {arithmetic_rows(keys):,} random queries, each against {keys} random keys, "
             "every entry drawn from N(0, 1); scores q.k divided by sqrt(d_k) and undivided; means over the "
             "rows",
             "spread: the standard deviation of a row's scores; entropy share: its entropy over a uniform "
             f"row's (1 uniform, 0 one-hot); one-hot: the share of rows with more than {ONE_HOT} on one key; "
             f"softmax gradient: the norm of its Jacobian (a uniform row's {arithmetic_uniform:.3f}, a "
             "one-hot row's 0)",
             f"{'d_k':>5} {'scores':<10} {COLUMNS}"]
    for d, *pair in table:
        lines += [f"{d:>5} {label:<10} {columns(rows)}"
                  for label, rows in zip(("divided", "undivided"), pair)]
    lines += ["", f"training: the same model, the same batches, {steps:,} steps a run; its attention rows on "
              f"{windows} validation windows, as the run started and as trained",
              f"(causal rows of 2 to {context} keys, compared with each other: a uniform one's softmax "
              f"gradient is {causal_uniform:.3f} on average, beside the arithmetic's "
              f"{arithmetic_uniform:.3f})",
              f"{'run':>15} {'train loss':>10} {'val loss':>9} {'rows':<8} {COLUMNS}"]
    for r in runs:
        losses = f"{r.train_loss:>10.3f} {r.val_loss:>9.3f}"
        lines += [f"{r.name:>15} {losses} {'started':<8} {columns(r.started)}",
                  f"{'':>36} {'trained':<8} {columns(r.trained)}"]
    for d in sorted({r.d for r in runs}):
        pair = {r.divided: r for r in runs if r.d == d}
        lines.append(f"d_k {d}: validation loss undivided minus divided "
                     f"{pair[False].val_loss - pair[True].val_loss:+.3f}")
    if layers is not None:
        name, divided, d, layer_windows, per_layer = layers
        other = "undivided" if divided else "divided"
        lines += ["", f"{name}: d_k {d}, scores {'divided' if divided else 'undivided'} by sqrt(d_k) as "
                  f"trained; each layer's rows on {layer_windows} validation windows, as trained and with "
                  f"the same scores {other} (times {'sqrt(d_k)' if divided else '1 / sqrt(d_k)'})",
                  f"{'layer':>5} {'scores':<10} {COLUMNS}"]
        for i, (trained, rescaled) in enumerate(per_layer):
            lines += [f"{i:>5} {'as trained':<10} {columns(trained)}",
                      f"{'':>5} {other:<10} {columns(rescaled)}"]
    return "\n".join(lines)


def save_figure(table, runs: list[Run], curves: dict, path: Path) -> Path:
    """Left: entropy share and largest weight against d_k; middle: softmax's gradient against d_k;
    right: each run's training loss (a colour a head width, dashed undivided)."""
    from tinyattn.analysis.plotting import new_figure

    figure = new_figure(15.0, 4.2, 100, layout="constrained")
    rows_axes, gradient_axes, loss_axes = figure.subplots(1, 3)
    dims = [d for d, _, _ in table]
    for index, style in ((1, "-"), (2, "--")):
        label = "divided" if index == 1 else "undivided"
        rows_axes.plot(dims, [row[index].entropy_share for row in table], "C0" + style, marker="o",
                       label=f"entropy share, {label}")
        rows_axes.plot(dims, [row[index].largest for row in table], "C1" + style, marker="o",
                       label=f"largest weight, {label}")
        gradient_axes.plot(dims, [row[index].gradient for row in table], "C2" + style, marker="o",
                           label=f"softmax gradient, {label}")
        gradient_axes.plot(dims, [row[index].one_hot for row in table], "C3" + style, marker="o",
                           label=f"share of rows one-hot, {label}")
    for axes in (rows_axes, gradient_axes):
        axes.set_xscale("log", base=2)
        axes.set_xticks(dims, [str(d) for d in dims])
    rows_axes.set(xlabel="d_k", ylabel="mean over the rows", ylim=(0, 1.02),
                  title="random q, k: softmax rows")
    gradient_axes.set(xlabel="d_k", ylabel="Jacobian norm; share of rows", ylim=(0, None),
                      title="random q, k: softmax's gradient and one-hot rows")
    colours = {d: f"C{4 + i}" for i, d in enumerate(sorted({r.d for r in runs}))}  # not the left's C0-C3
    for r in runs:
        steps, losses = curves[r.name]
        loss_axes.plot(steps, losses, color=colours[r.d], linestyle="-" if r.divided else "--",
                       marker="o" if len(steps) == 1 else None, label=f"{r.name} (val {r.val_loss:.3f})")
    loss_axes.set(xlabel="step", ylabel="training loss (nats)", title="the same model trained both ways")
    for axes in (rows_axes, gradient_axes, loss_axes):
        axes.legend(fontsize=7)
    figure.savefig(path)
    return path


# ----------------------------------------------------------------------------- the command


def checkpoint_layers(args: argparse.Namespace, data, context: int):
    """--checkpoint's (name, divided, d_k, windows read, [(as trained, rescaled) per layer]) on the first
    windows of the config's validation split (`data`), once its tokenizer is known to be the config's."""
    from tinyattn.checkpoint import require_causal
    from tinyattn.hf.folder import load_any_model
    from tinyattn.lab.runs import check_tokenizer

    path = args.checkpoint
    loaded = load_any_model(path)
    require_causal(loaded, "tinyattn lab scaling (its rows are read as causal ones)")
    check_tokenizer(args, loaded, data.tokenizer)
    model_config = loaded.config.model
    length = min(model_config.context_length, context)
    x = validation_windows(data.validation, length)
    if x is None:
        raise TinyattnError(f"--checkpoint {path}: the validation split holds no window of {length} tokens")
    divided, d = model_config.scale_scores, model_config.head_dim
    factor = math.sqrt(d) if divided else 1 / math.sqrt(d)
    return str(path), divided, d, x.size(0), [(rows_rescaled(w), rows_rescaled(w, factor))
                                              for w in recorded_weights(loaded.model, x)]


def validation_windows(tokens, length: int):
    """The first MEASURED_WINDOWS windows of `length` tokens of `tokens`, (B, length); None if none fits."""
    import torch

    count = min(MEASURED_WINDOWS, len(tokens) // length)
    if count == 0:
        return None
    return torch.from_numpy(tokens[:count * length].astype("int64")).view(count, length)


def train_runs(args: argparse.Namespace, out: Path, names: dict, width: int) -> dict:
    """Train every run of `names` one after another (`runs.train_runs`); returns {name: TrainResult}.
    An --out holding an earlier lab's output is refused (or cleared, with --force) first, its runs of
    other head widths too: they would stand beside these in TensorBoard and the folder."""
    from tinyattn.lab.runs import train_runs as train_each
    from tinyattn.lab.outputs import clear_earlier_lab

    runs = run_settings(args, out, names, width)
    earlier = [path.name for path in sorted(out.glob("*divided_d*")) if RUN_NAME.fullmatch(path.name)]
    clear_earlier_lab(out, tuple(dict.fromkeys([*names, *earlier])) + OUTPUTS, args.force)
    return train_each("scaling", args, out, runs)


def shared_config(args: argparse.Namespace):
    """The config the runs share (their width, data, context, device and precision), once every option
    is checked that the runs cannot change: the steps, --set, the head widths and each run's config.
    Read with one head: every run sets its own, so the config's own (4) need not divide a width the
    --set gives."""
    from tinyattn.config import load_config
    from tinyattn.lab.outputs import refuse_own_settings
    from tinyattn.lab.runs import check_steps

    check_steps(args.steps)
    refuse_own_settings("scaling", args.overrides, OWN_SETTINGS)
    refuse_division_setting(args.overrides)
    config = load_config(args.config, lab_overrides(args.steps, Path(args.out or ".")) + LAB_MODEL
                         + list(args.overrides) + ["model.n_head=1", "model.n_kv_head=null"])
    if not config.model.causal:  # its rows would weigh later keys, its losses read the answer
        raise TinyattnError("model.causal false: lab scaling reads causal attention rows and next-token "
                            "losses, which a bidirectional model has not; expected true (remove it from "
                            "--set or the config)")
    context = config.model.context_length
    if context < 2:
        raise TinyattnError(f"model.context_length {context}: a causal row weighs as many keys as its "
                            "position and one, and the lab reads rows of two or more: expected at least 2")
    return config


def run(args: argparse.Namespace) -> int:
    from tinyattn.analysis.plotting import require_matplotlib
    from tinyattn.data.batches import prepare_data
    from tinyattn.lab.outputs import (command_started, experiment_folder, machine_line, save_report,
                                      stopped_midway)
    from tinyattn.lab.runs import training_curve
    from tinyattn.system.device import select_device, select_precision

    started = command_started()
    # What the runs cannot change is checked before they train (minutes): matplotlib, the options, the
    # device, the data and the checkpoint. Nothing is written until then.
    require_matplotlib()
    config = shared_config(args)
    width, context = config.model.n_embd, config.model.context_length
    names = run_names(head_dims(args.head_dims, width))
    run_settings(args, Path(args.out or "."), names, width)
    device = select_device(config.train.device, "--set train.device=")  # refused before a run says it trains
    precision = select_precision(config.train.precision, device, "train.precision").name
    data = prepare_data(config, progress=False)
    x = validation_windows(data.validation, context)
    if x is None:
        raise TinyattnError(f"the validation split of {args.config} holds no window of {context} tokens "
                            "(model.context_length); give more text or a shorter context")
    layers = checkpoint_layers(args, data, context) if args.checkpoint else None
    keys = min(context, ARITHMETIC_KEYS)
    table = arithmetic(keys)
    out = experiment_folder(args.out, "scaling")
    results = train_runs(args, out, names, width)
    with stopped_midway("scaling", out, args.out, holds=f"its {len(names)} trained runs"):
        runs = [measure_run(name, d, divided, results[name], x) for name, (d, divided) in names.items()]
        curves = {name: training_curve(results[name].run_dir) for name in names}
        data_name = ", ".join(config.data.files) if config.data.files else config.data.dataset
        header = f"tinyattn lab scaling: {args.config} ({data_name}); {machine_line(device, precision)}"
        report = format_report(header, table, runs, keys=keys, context=context, steps=args.steps,
                               windows=x.size(0), layers=layers)
        figure = save_figure(table, runs, curves, out / "scaling.png")
        wall = time.perf_counter() - started
        save_report(out, "scaling", report + f"\n\nwall time of the command: {wall:.0f} s")
    print(f"wrote {out / 'scaling.txt'} and {figure}; tensorboard --logdir {quoted(out)} shows every run")
    return 0
