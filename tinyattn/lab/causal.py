"""`tinyattn lab causal`: the causal mask keeps the future out of a next-token predictor, measured.

The chapter's claim: a position attends only to itself and earlier ones, which keeps a model
trained to predict the next token from reading it. The experiment trains the same model twice on
the same batches (same seed, so the same initial weights and windows) with
`tinyattn.train.loop.train`: once causal and once bidirectional (`model.causal: false`, an
experiment-only setting that generate and export refuse), into <out>/causal and
<out>/bidirectional, so `tensorboard --logdir <out>` shows the two curves side by side. Then:

- training loss: the bidirectional one collapses, since at position t it can read token t+1,
  which is the answer;
- validation loss as trained (each model under its own mask, the run's own evaluation) and on
  the causal task (`prefix_losses`): every target predicted from the tokens before it alone,
  by running the model on that prefix, the only use a next-token predictor has;
- a sample from each, decoded the same way (the whole prefix at every step, no KV cache);
- the leak test (`leak_test`): change the token at position t+1 and see how far every
  position's logits move. Under the mask those at positions <= t move by exactly 0.
  `--checkpoint` runs it on a model of yours as well.

It writes <out>/causal.md (the table and the samples) and <out>/causal.png, and prints the table.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tinyattn.config import home_path
from tinyattn.errors import TinyattnError
from tinyattn.lab.runs import (
    DEFAULT_CONFIG,
    check_steps,
    check_tokenizer,
    lab_overrides,
    train_runs,
    training_curve,
)
from tinyattn.system.invocation import quoted

DEFAULT_STEPS = 200  # each run; both together stay within 3 minutes on 2 CPU cores in fp32
SAMPLE_TOKENS = 120
PROMPT_TOKENS = 24  # the default prompt: the first tokens of the validation split
RUNS = ("causal", "bidirectional")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, type=home_path, metavar="FILE",
                        help=f"the model and data both runs train (default: {DEFAULT_CONFIG})")
    # action="extend": `--set a=1 --set b=2` keeps both (argparse's default keeps only the last).
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="override config values (dotted keys), after the lab's own: 2 layers of "
                             "width 64, batch 16, fp32, no compile, no time budget, no tables by passes "
                             "(the same weight decay at any --steps), one evaluation at the end; the "
                             "steps and the folder are --steps and --out")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps of each run (default: {DEFAULT_STEPS})")
    parser.add_argument("--out", type=home_path, metavar="DIR",
                        help="the lab's folder: two run folders, causal.md, causal.png "
                             "(default: a new checkpoints/lab/causal-<date>-<time>)")
    parser.add_argument("--force", action="store_true", help="replace the runs of an earlier lab in --out")
    parser.add_argument("--checkpoint", type=home_path, metavar="RUN_DIR|FILE",
                        help="also run the leak test on this trained model (a run folder, checkpoint file or "
                             "Hugging Face folder) of the runs' context length")
    parser.add_argument("--position", type=int, default=None, metavar="T",
                        help="the leak test changes the token at T+1 (default: the middle of the context)")
    parser.add_argument("--prompt", default=None,
                        help=f"the samples' prompt (default: the first {PROMPT_TOKENS} tokens of the "
                             "validation split; '' starts from the end-of-text token, as generate's does)")


@dataclass
class Row:
    """One model's line of the table."""

    name: str
    train_loss: float  # the last logged training loss (nan for a --checkpoint)
    val_loss: float  # under its own mask, the run's evaluation (nan for a --checkpoint)
    causal_task_loss: float  # each target from its prefix alone (`prefix_losses`)
    leak: "object"  # (T,) numpy: the largest |logit change| at each position (`leak_test`)
    position: int  # the leak test changed the token at position + 1
    sample: str


# ----------------------------------------------------------------------------- measurements


def prefix_losses(model, x, y):
    """Cross-entropy (B, T) of each target y[:, t] predicted from x[:, :t+1] alone, in fp32.

    Running the model on each prefix gives a bidirectional model nothing after position t to
    read, so this is the loss on the causal task for any model; for a causal model it equals
    the ordinary loss (its mask already hides the rest)."""
    import torch
    import torch.nn.functional as F

    from tinyattn.model.transformer import evaluation_mode

    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    losses = []
    with evaluation_mode(model), torch.no_grad():
        for t in range(x.size(1)):
            logits = model.next_token_logits(x[:, :t + 1])  # (B, V): the prediction at position t
            losses.append(F.cross_entropy(logits.float(), y[:, t], reduction="none"))  # (B,)
    return torch.stack(losses, dim=1)  # (B, T)


def causal_task_loss(model, tokens, context_length: int, *, windows: Optional[int],
                     batch_size: int = 32) -> float:
    """Mean `prefix_losses` over the evaluation windows the training loop's evaluation reads with
    train.eval_windows = `windows` (None: every window)."""
    from tinyattn.data.batches import eval_batches

    total, count = 0.0, 0
    for x, y in eval_batches(tokens, context_length, batch_size, windows):
        losses = prefix_losses(model, x, y)  # (b, T)
        total, count = total + losses.double().sum().item(), count + losses.numel()
    return total / count


def check_position(position: int, context: int) -> None:
    """--position: the token after it must be in the window (a TinyattnError otherwise)."""
    if not 0 <= position < context - 1:
        raise TinyattnError(f"--position {position}: expected 0..{context - 2} (the token at "
                            f"position + 1 is changed, within the context of {context})")


def check_context(context: int) -> None:
    """The runs' context must hold a position and the token after it, which the leak test changes (a
    TinyattnError otherwise, before anything trains: the default position of a context of 1 is -1)."""
    if context < 2:
        raise TinyattnError(f"model.context_length {context}: the leak test changes the token after a "
                            "position, both in the window: expected a context of at least 2")


# Settings the lab derives from its own options (the warm-up and the evaluation from --steps, the
# run folders from --out): a --set of one would leave the rest describing another run.
OWN_SETTINGS = {"train.max_steps": "--steps {}", "train.out_dir": "--out {}"}


def leak_test(model, x, position: int):
    """How far each position's logits move when the token at position + 1 changes.

    x: (1, T) token ids. Returns (T,) float64 numpy: the largest |logit difference| at each
    position. The mask makes positions 0..position read nothing at position + 1, so for a
    causal model those entries are exactly 0, not merely small."""
    import torch

    from tinyattn.model.transformer import evaluation_mode

    check_position(position, x.size(1))
    changed = x.clone()
    vocab = model.config.vocab_size
    changed[0, position + 1] = (changed[0, position + 1] + 1) % vocab  # any other token
    device = next(model.parameters()).device
    with evaluation_mode(model), torch.no_grad():
        before = model(x.to(device)).logits.float()  # (1, T, V)
        after = model(changed.to(device)).logits.float()
    return (after - before).abs().amax(dim=-1)[0].double().cpu().numpy()  # (T,)


def prefix_sample(model, prompt: list[int], *, tokens: int, temperature: float, seed: int) -> list[int]:
    """`tokens` ids drawn after `prompt`, the model run on the whole (cropped) prefix at each step.

    No KV cache: a bidirectional model's cached keys would be those of shorter prefixes, so
    each step recomputes every position, as `prefix_losses` scores them."""
    import torch

    from tinyattn.generate.sampling import sample_next_token
    from tinyattn.model.transformer import evaluation_mode

    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    with evaluation_mode(model), torch.no_grad():
        for _ in range(tokens):
            context = torch.tensor([ids[-model.config.context_length:]], device=device)  # (1, t)
            logits = model.next_token_logits(context).float().cpu()  # (1, V)
            ids.append(int(sample_next_token(logits, generator, temperature)[0]))
    return ids[len(prompt):]


# ----------------------------------------------------------------------------- the two runs


OUTPUTS = ("causal.md", "causal.png")  # what `run` writes into --out beside the two run folders


def train_both(args: argparse.Namespace, out: Path) -> dict:
    """Train the causal and the bidirectional run (`train_runs`); returns {name: TrainResult}."""
    from tinyattn.lab.outputs import clear_earlier_lab, refuse_own_settings

    check_steps(args.steps)
    refuse_own_settings("causal", args.overrides, OWN_SETTINGS)
    clear_earlier_lab(out, RUNS + OUTPUTS, args.force)
    runs = {name: lab_overrides(args.steps, out) + list(args.overrides) + [f"model.causal={name == 'causal'}"]
            for name in RUNS}
    return train_runs("causal", args, out, runs)


def measure(name: str, loaded, *, tokens, position: Optional[int], prompt: list[int],
            windows: Optional[int], losses: tuple[float, float] = (float("nan"), float("nan"))) -> Row:
    """One model's row: the causal-task loss, the leak test on the first window, a sample.

    windows: the runs' train.eval_windows, so the causal-task loss reads the windows the runs'
    own evaluation read (every row, a --checkpoint's too, whatever its own config says)."""
    import torch

    T = loaded.config.model.context_length
    t = T // 2 - 1 if position is None else position
    x = torch.from_numpy(tokens[:T].astype("int64")).unsqueeze(0)  # (1, T)
    sample_ids = prefix_sample(loaded.model, prompt, tokens=SAMPLE_TOKENS,
                               temperature=loaded.config.sample.temperature, seed=1337)
    return Row(name, losses[0], losses[1], causal_task_loss(loaded.model, tokens, T, windows=windows),
               leak_test(loaded.model, x, t), t, loaded.tokenizer.decode(sample_ids))


# ----------------------------------------------------------------------------- the report


def format_table(rows: list[Row]) -> str:
    """The markdown table `run` prints and writes."""
    lines = ["| model | train loss | val loss (own mask) | val loss, causal task | "
             "leak: max abs logit change at positions <= t | at positions > t |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        early, late = r.leak[:r.position + 1].max(), r.leak[r.position + 1:].max()
        shown = "0 (exactly)" if early == 0 else f"{early:.3g}"
        losses = " | ".join("" if math.isnan(x) else f"{x:.3f}" for x in (r.train_loss, r.val_loss))
        lines.append(f"| {r.name} | {losses} | {r.causal_task_loss:.3f} | {shown} | {late:.3g} |")
    return "\n".join(lines)  # a --checkpoint's row has no training run of the lab: blank there


def save_figure(rows: list[Row], curves: dict, path: Path) -> Path:
    """Left: the two training losses with each causal-task loss; right: the leak test by position."""
    from tinyattn.analysis.plotting import new_figure

    figure = new_figure(11.0, 4.0, 100, layout="constrained")
    left, right = figure.subplots(1, 2)
    for i, row in enumerate(rows):
        colour = f"C{i}"
        if row.name in curves:
            steps, losses = curves[row.name]
            # one logged loss (a run of fewer steps than train.log_interval) is a point, not a line
            left.plot(steps, losses, color=colour, marker="o" if len(steps) == 1 else None,
                      label=f"{row.name}: training loss")
            left.axhline(row.causal_task_loss, color=colour, linestyle="--",
                         label=f"{row.name}: val loss, causal task ({row.causal_task_loss:.2f})")
        right.plot(range(len(row.leak)), row.leak, color=colour, marker=".", label=row.name)
    t = rows[0].position
    right.axvline(t + 1, color="grey", linestyle=":", label=f"changed token (position {t + 1})")
    left.set(xlabel="step", ylabel="loss (nats)", title="same model, same batches: causal vs bidirectional")
    right.set(xlabel="position", ylabel="max |logit change|", title="leak test: change one token")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    figure.savefig(path)
    return path


def write_report(rows: list[Row], out: Path, seconds: float, *, prompt: str) -> str:
    """causal.md: the table, the leak position, the prompt and each model's sample after it (the
    prompt, by default the validation split's first tokens, is not part of the samples)."""
    table = format_table(rows)
    parts = [f"# tinyattn lab causal\n\n{table}\n\nleak test: the token at position {rows[0].position + 1} "
             f"changed; wall time {seconds:.0f} s\n\nthe samples continue the prompt {prompt!r}\n"]
    for r in rows:
        parts.append(f"\n## sample: {r.name}\n\n```\n{r.sample}\n```\n")
    (out / "causal.md").write_text("".join(parts), encoding="utf-8")
    return table


def _other_checkpoint(args: argparse.Namespace, tokenizer, context: int):
    """--checkpoint, loaded, once its tokenizer is known to be the config's and its context the runs'
    (`context`): its row is measured on the same windows, at the same position, as theirs."""
    from tinyattn.hf.folder import load_any_model

    loaded = load_any_model(args.checkpoint)
    check_tokenizer(args, loaded, tokenizer)
    theirs = loaded.config.model.context_length
    if theirs != context:
        raise TinyattnError(f"--checkpoint {args.checkpoint}: its context is {theirs} tokens and the lab's "
                            f"runs' is {context}; train the runs with --set model.context_length={theirs} so "
                            "every row is measured on the same windows at the same position")
    return loaded


def _prompt_ids(prompt: Optional[str], tokenizer, validation, context: int) -> list[int]:
    """--prompt's ids, its characters the tokenizer never saw named as generate names them, and a
    prompt longer than the runs' `context` said to be read from its end (`prefix_sample` crops it);
    without one, the first PROMPT_TOKENS tokens of the validation split. An empty one starts where
    generate's does: from the start token (<|endoftext|>), or a newline for a tokenizer without one."""
    import sys

    from tinyattn.data.tokenizer import warn_unknown_characters

    if prompt is None:
        return [int(i) for i in validation[:PROMPT_TOKENS]]
    if not prompt:
        return [tokenizer.start_id] if tokenizer.start_id is not None else tokenizer.encode("\n")
    ids = tokenizer.encode(prompt)
    warn_unknown_characters(tokenizer, prompt, ids, "--prompt")
    if len(ids) > context:
        print(f"warning: --prompt: {len(ids)} tokens, longer than the runs' context of {context}; "
              f"the samples read only its last {context}", file=sys.stderr)
    return ids


def run(args: argparse.Namespace) -> int:
    from tinyattn.analysis.plotting import require_matplotlib
    from tinyattn.config import load_config
    from tinyattn.data.batches import prepare_data
    from tinyattn.hf.folder import load_any_model
    from tinyattn.lab.outputs import command_started, experiment_folder, refuse_own_settings, stopped_midway
    from tinyattn.system.device import select_device

    started = command_started()  # the command's, start-up included
    # What the two runs cannot change is checked before they train (minutes): matplotlib (for
    # causal.png), the steps, the runs' context, the position, the checkpoint, its tokenizer and its context.
    # Nothing is written until then.
    require_matplotlib()
    check_steps(args.steps)
    refuse_own_settings("causal", args.overrides, OWN_SETTINGS)
    config = load_config(args.config, lab_overrides(args.steps, Path(args.out or ".")) + list(args.overrides))
    check_context(config.model.context_length)
    select_device(config.train.device, "--set train.device=")  # refused before a run says it trains
    data = prepare_data(config, progress=False)
    if args.position is not None:
        check_position(args.position, config.model.context_length)
    checkpoint = (_other_checkpoint(args, data.tokenizer, config.model.context_length) if args.checkpoint
                  else None)
    tokens = data.validation
    prompt = _prompt_ids(args.prompt, data.tokenizer, tokens,  # its warnings before the runs' minutes
                         config.model.context_length)
    out = experiment_folder(args.out, "causal")
    results = train_both(args, out)
    # A stop while the trained runs are measured leaves both runs and no table in `out`: said as the other
    # labs say it (what the folder holds, how to run it again), where it said only "interrupted".
    with stopped_midway("causal", out, args.out, holds="its two trained runs"):
        rows, curves = [], {}
        for name in RUNS:
            loaded = load_any_model(results[name].run_dir)
            curves[name] = training_curve(results[name].run_dir)
            losses = (float(curves[name][1][-1]), results[name].last_val_loss)
            rows.append(measure(name, loaded, tokens=tokens, position=args.position, prompt=prompt,
                                windows=config.train.eval_windows, losses=losses))
        if checkpoint is not None:
            rows.append(measure(str(args.checkpoint), checkpoint, tokens=tokens, position=args.position,
                                prompt=prompt, windows=config.train.eval_windows))
        figure = save_figure(rows, curves, out / "causal.png")
        table = write_report(rows, out, time.perf_counter() - started, prompt=data.tokenizer.decode(prompt))
    print(table)
    print(f"wrote {out / 'causal.md'} and {figure} in {time.perf_counter() - started:.0f} s; "
          f"tensorboard --logdir {quoted(out)} shows both runs")
    return 0
