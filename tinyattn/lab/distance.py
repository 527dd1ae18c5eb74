"""`tinyattn lab distance`: access does not ensure use, measured against distance.

Attention lets every position read every earlier one directly, whatever the distance; the
chapter's warning is that the connection being there does not mean the model uses it. Two
measurements of where a model stops using what it can reach:

1. The repeated-sequence probe, on the user's checkpoint (`--checkpoint`): a random string of
   the model's tokens, a gap of d tokens of ordinary text (the validation split, or `--text`),
   and the same string again; its control is the same sequence with a fresh random string in
   the second copy's place. The second copy and the fresh string stand at the same positions
   after the same text, so what the copy saves over the fresh string (the copy benefit) is what
   having seen the string is worth; the first copy's loss is no baseline, as it stands at the
   window's start. `repeat_probe` measures it against d, up to the context length; the first
   token of each string is left out of every mean (nothing before it says a copy begins). With
   some 15 gaps, one in 20 lands beyond 2 standard errors of zero by chance alone: the verdict
   rests on one test, the mean benefit over the gaps (`pooled_benefit`), and a single gap is
   marked only beyond the threshold corrected for the number of gaps (`gap_threshold`).
2. Key-value recall, trained here: 8 pairs (key, value) (`--pairs`), then 4 queries, each a
   different key of the pairs whose target is its value; the queried pair stands d tokens back. A small attention model trains
   for a fixed number of steps (the project's Trainer and optimizer), then its recall accuracy
   against d on fresh sequences. TensorBoard: `<out>/key_value/`. Its memory grows as the square
   of --pairs: one that cannot fit is refused first (`check_recall_fits`).

Writes `distance.txt` and `distance.png` into `--out` (default `checkpoints/lab/distance-<date>-<time>`);
an `--out` holding an earlier run's is refused without `--force` (`outputs.clear_earlier_lab`).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import torch
import torch.nn as nn

from tinyattn.analysis.evaluate import token_losses
from tinyattn.analysis.plotting import require_matplotlib
from tinyattn.checkpoint import require_causal
from tinyattn.config import ModelConfig, TrainConfig, home_path
from tinyattn.data.batches import prepare_data
from tinyattn.data.relative_paths import data_where_started
from tinyattn.data.tokenizer import warn_unknown_characters
from tinyattn.errors import TinyattnError, counted
from tinyattn.hf.folder import load_any_model
from tinyattn.lab.outputs import (
    add_threads,
    clear_earlier_lab,
    command_started,
    experiment_folder,
    machine_line,
    save_report,
    stopped_midway,
    tensorboard_writer,
    use_threads,
)
from tinyattn.model.memory import FP32, available_bytes, gigabytes, training_memory
from tinyattn.model.transformer import IGNORE_INDEX, LanguageModel, evaluation_mode
from tinyattn.system.device import select_device, select_precision
from tinyattn.system.invocation import quoted
from tinyattn.system.seeding import seed_everything
from tinyattn.system.storage import read_text
from tinyattn.train.optim import build_optimizer
from tinyattn.train.trainer import Trainer

PROBE_SAMPLES = 64  # random strings per gap length
RECALL_BATCH = 32
RECALL_EVAL_SEQUENCES = 512
DISTANCE_BIN = 8  # recall accuracy is reported over d in bins this wide
FALSE_ALARM = 0.05  # the chance that noise alone passes the verdict's test, or marks any gap

OUTPUTS = ("distance.txt", "distance.png", "key_value")  # what `run` writes into --out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=home_path, metavar="RUN_DIR|FILE",
                        help="the model the probe reads: a run folder, a checkpoint file or a Hugging Face "
                             "folder (default: the most recent run under checkpoints/)")
    parser.add_argument("--text", type=home_path, metavar="FILE",
                        help="the gap's ordinary text (default: the validation "
                        "split of the checkpoint's data; a Hugging Face folder has none: give one)")
    parser.add_argument("--string-length", type=int, default=8, help="tokens in the repeated string (default: 8)")
    parser.add_argument("--recall-steps", type=int, default=1500,
                        help="training steps of the key-value recall model (default: 1500)")
    parser.add_argument("--pairs", type=int, default=8, help="key-value pairs per recall sequence (default: 8)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: cpu)")
    add_threads(parser)
    parser.add_argument("--out", type=home_path, metavar="DIR",
                        help="folder for the table, figure and TensorBoard "
                        "(default: a new checkpoints/lab/distance-<date>-<time>)")
    parser.add_argument("--force", action="store_true",
                        help="replace what an earlier run of this lab wrote into --out")


def run(args: argparse.Namespace) -> int:
    started = command_started()  # the command's, start-up included
    require_matplotlib()  # before any work: the figure is drawn before the report (one line)
    use_threads(args.threads)
    device = select_device(args.device or "cpu")
    for flag, value, lowest in (("--string-length", args.string_length, 2), ("--pairs", args.pairs, 2),
                                ("--recall-steps", args.recall_steps, 1), ("--seed", args.seed, 0)):
        if not lowest <= value < 2**63:
            raise TinyattnError(f"{flag} {value}: expected an integer >= {lowest}")
    check_recall_fits(args.pairs, device)  # before the probe's minutes: --pairs grows it as its square
    loaded = load_any_model(args.checkpoint, device)
    require_causal(loaded, "tinyattn lab distance (it scores next-token predictions)")
    model, tokenizer = loaded.model, loaded.tokenizer
    text = gap_text(args.text, loaded)
    start = tokenizer.text_start  # an imported folder's bos begins every sequence, as it begins a text
    context = model.config.context_length - len(start)  # what the strings and the gap can fill
    check_string_length(args.string_length, context, after_start=bool(start))
    distances = gap_lengths(context, args.string_length)
    check_gap_text(text, distances[-1] + 1, args.text)
    clear_earlier_lab(args.out, OUTPUTS, args.force)  # after every check: --force never loses a run to a typo
    rng = np.random.default_rng(args.seed)
    probe = repeat_probe(model, string_tokens=ordinary_tokens(tokenizer), text=text,
                         length=args.string_length, distances=distances, rng=rng, start=start)
    folder = experiment_folder(args.out, "distance")
    with stopped_midway("distance", folder, args.out):
        recall = train_recall(pairs=args.pairs, steps=args.recall_steps, seed=args.seed, device=device,
                              writer_folder=folder)
    machine = machine_line(device, "fp32")
    save_figure(probe, recall, folder / "distance.png", length=args.string_length)
    text_report = report(probe, recall, loaded.label, machine, args,
                         wall=time.perf_counter() - started)
    save_report(folder, "distance", text_report)
    print(f"wrote {folder}/distance.txt, distance.png and TensorBoard (tensorboard --logdir {quoted(folder)})",
          flush=True)
    return 0


# ----------------------------------------------------------------------------- the probe


def check_string_length(length: int, context: int, *, after_start: bool) -> None:
    """Both copies of a string of `length` tokens must fit `context` as inputs (the last token is only
    predicted, gap 0); one line otherwise, advising a length --string-length takes (2 or more) or, where
    none fits, saying the context is too short for the probe."""
    if 2 * length <= context + 1:
        return
    fits = (context + 1) // 2
    advice = (f"give at most {fits}" if fits >= 2 else "the probe needs a context of at least 3, and this "
              "model's holds no string of 2 tokens, the fewest --string-length takes")
    after = " after the start token" if after_start else ""
    raise TinyattnError(f"--string-length {length}: two copies must fit the context of {context} "
                        f"tokens{after} (as inputs: the last token is only predicted); {advice}")


def gap_text(path: str | None, loaded) -> np.ndarray:
    """Token ids of ordinary text: `--text` encoded with the model's tokenizer (its characters the
    tokenizer never saw named, as generate names a prompt's), or its validation split."""
    if path is not None:
        text = read_text(path, "--text file")
        ids = loaded.tokenizer.encode(text)
        warn_unknown_characters(loaded.tokenizer, text, ids, f"--text {path}")
        return np.asarray(ids, dtype=np.int64)
    if loaded.config.data.dataset is None and loaded.config.data.files is None:  # a Hugging Face folder
        raise TinyattnError(f"{loaded.label}: records no data to take the gap text from; give --text FILE")
    config = data_where_started(loaded.config, loaded.start_folder)  # the run's files, from anywhere
    try:
        data = prepare_data(config, progress=False)
    except TinyattnError as e:
        raise TinyattnError(f"the gap text comes from the checkpoint's data, which cannot be read ({e}); "
                            "give --text FILE") from None
    if data.tokenizer.to_json() != loaded.tokenizer.to_json():
        raise TinyattnError(f"{data.cache_dir}: the data's tokenizer is not the checkpoint's; give --text FILE")
    return np.asarray(data.validation, dtype=np.int64)


def check_gap_text(text: np.ndarray, needed: int, path: str | None) -> None:
    """The gap text (`gap_text`) must hold `needed` tokens, the longest gap and one more (what
    `repeat_probe` draws from): one line naming --text FILE, or the validation split, otherwise."""
    if len(text) >= needed:
        return
    where, advice = ((f"--text {path}", "give a longer text") if path is not None else
                     ("the validation split of the checkpoint's data", "give a longer text with --text FILE"))
    raise TinyattnError(f"{where}: {counted(len(text), 'token')}; the probe needs at least {needed} "
                        f"({advice})")


def ordinary_tokens(tokenizer) -> np.ndarray:
    """Every token id but the special ones (`Tokenizer.special_ids`: <|endoftext|>, [UNK], a
    pretrained tokenizer's added specials): what the random string draws from."""
    special = tokenizer.special_ids
    return np.array([i for i in range(tokenizer.vocab_size) if i not in special], dtype=np.int64)


def gap_lengths(context: int, length: int) -> list[int]:
    """d = 0, 1, 2, 4, ... and every eighth of the way to the largest gap that fits: 2 * length + d - 1 inputs."""
    largest = context + 1 - 2 * length
    grid = {0, largest} | {2 ** i for i in range(largest.bit_length()) if 2 ** i <= largest}
    grid |= {round(largest * i / 8) for i in range(1, 8)}
    return sorted(grid)


@dataclass
class ProbeRow:
    gap: int  # d
    first: float  # mean loss (nats) on the first copy, tokens 2..n
    second: float  # the same on the second copy
    fresh: float  # the same on the control: a fresh random string where the second copy stands
    benefit: float  # fresh - second, the copy benefit: the mean of each string's own difference
    benefit_se: float  # its standard error over the strings (paired)


def repeat_probe(model: nn.Module, *, string_tokens: np.ndarray, text: np.ndarray, length: int,
                 distances: list[int], rng: np.random.Generator, samples: int = PROBE_SAMPLES,
                 start: Sequence[int] = ()) -> list[ProbeRow]:
    """Loss on each copy of a random string repeated after a gap of d text tokens, and on a fresh
    string of the same length in the second copy's place (the control), for each d. `start` (the
    tokenizer's `text_start`: an imported folder's bos) goes before every sequence."""
    b = len(start)
    lead = np.broadcast_to(np.asarray(start, dtype=np.int64), (samples, b))  # (S, b)
    rows = []
    for d in distances:
        if len(text) < d + 1:
            raise TinyattnError(f"the gap text has {counted(len(text), 'token')}; the probe needs at least "
                                f"{d + 1}")
        strings = rng.choice(string_tokens, size=(samples, length))  # (S, n)
        starts = rng.integers(0, len(text) - d + 1, size=samples)  # (S,)
        fresh = rng.choice(string_tokens, size=(samples, length))  # (S, n) the control's second string
        gaps = text[starts[:, None] + np.arange(d)] if d else np.zeros((samples, 0), dtype=np.int64)  # (S, d)
        copies = np.concatenate([lead, strings, gaps, strings], axis=1)  # (S, b + 2n + d)
        controls = np.concatenate([lead, strings, gaps, fresh], axis=1)  # (S, b + 2n + d)
        sequences = torch.from_numpy(np.concatenate([copies, controls]))  # (2S, b + 2n + d)
        with evaluation_mode(model), torch.no_grad():
            losses = token_losses(model, sequences[:, :-1], sequences[:, 1:]).cpu().double()  # (2S, b+2n+d-1)
        # Target j is token j + 1: the first string (it starts at b) has its tokens 1..n-1 at targets
        # b..b+n-2, the second (at b + n + d) at b+n+d..b+2n+d-2. Means per string: (S,) each.
        first = losses[:samples, b:b + length - 1].mean(1)
        second, control = losses[:, b + length + d:].mean(1).split(samples)
        rows.append(probe_row(d, first.numpy(), second.numpy(), control.numpy()))
    return rows


def probe_row(gap: int, first: np.ndarray, second: np.ndarray, fresh: np.ndarray) -> ProbeRow:
    """One d's row from each string's mean loss (S,) on its first copy, its second copy and the
    fresh string: the copy benefit is the mean of fresh - second over the strings, and its standard
    error the sample standard deviation of those differences over sqrt(S) (paired: a string and its
    control share the first copy and the gap)."""
    benefit = fresh - second  # (S,)
    se = benefit.std(ddof=1) / np.sqrt(len(benefit)) if len(benefit) > 1 else float("nan")
    return ProbeRow(gap, float(first.mean()), float(second.mean()), float(fresh.mean()),
                    float(benefit.mean()), float(se))


@dataclass
class PooledBenefit:
    gaps: int
    mean: float  # the copy benefit averaged over the gaps, each d weighted equally
    se: float  # its standard error

    @property
    def z(self) -> float:
        return z_score(self.mean, self.se)


def z_score(benefit: float, se: float) -> float:
    """benefit / se; a benefit of exactly 0 with no spread is 0 (no sign of use), not NaN."""
    if se > 0 or math.isnan(se):
        return benefit / se
    return 0.0 if benefit == 0 else math.copysign(math.inf, benefit)


def pooled_benefit(rows: list[ProbeRow]) -> PooledBenefit:
    """The mean of the gaps' copy benefits and its standard error, sqrt(sum of SE_d^2) / G: the
    gaps' estimates are independent (each d draws its own strings, gap texts and fresh strings from
    the generator, and the model in evaluation mode scores them deterministically), so their
    variances add. One test of use over all the gaps, where a test per gap would find some by chance."""
    benefits = np.array([row.benefit for row in rows])
    errors = np.array([row.benefit_se for row in rows])
    return PooledBenefit(len(rows), float(benefits.mean()), float(np.sqrt((errors ** 2).sum()) / len(rows)))


def gap_threshold(gaps: int) -> float:
    """|benefit| / SE beyond which one of `gaps` gaps is marked: the normal quantile at
    1 - FALSE_ALARM / (2 * gaps) (two-sided, Bonferroni), so that noise alone marks any gap at all
    with a chance of at most FALSE_ALARM: 1.96 for one gap, 2.94 for 15."""
    return NormalDist().inv_cdf(1 - FALSE_ALARM / (2 * gaps))


def verdict(pooled: PooledBenefit) -> str:
    """The probe's conclusion, from the pooled test alone (two-sided, at FALSE_ALARM)."""
    threshold = gap_threshold(1)
    line = (f"pooled over the {pooled.gaps} gaps: mean benefit {pooled.mean:.3f}, SE {pooled.se:.3f} ("
            f"= sqrt(sum of the gaps' SE^2) / {pooled.gaps}, as each d draws its own strings), "
            f"z {pooled.z:.2f}: ")
    if math.isnan(pooled.z):
        return line + "no verdict (a standard error needs two strings per d)"
    if pooled.z > threshold:
        return line + f"measurable use of the copy, on average over d (beyond {threshold:.2f} SE of 0)"
    if pooled.z < -threshold:
        return line + (f"the second copy costs measurably more than a fresh string, on average over d "
                       f"(beyond {threshold:.2f} SE of 0)")
    return line + f"no measurable use of the copy, on average over d (within {threshold:.2f} SE of 0)"


# ----------------------------------------------------------------------------- key-value recall


class KeyValueRecall:
    """Batches of the recall task for `Trainer`: x, y (B, T) with y = IGNORE_INDEX except at queries.

    Tokens: keys 0..2P-1 (P distinct keys per sequence), values 2P..3P-1. A sequence is P pairs
    (key, value) and then Q = P/2 queries, each a different key of the pairs followed by its
    value; the target at a query is its value, d = the query's position minus its key's.
    """

    def __init__(self, pairs: int, batch_size: int, seed: int):
        self.pairs, self.batch_size, self.seed = pairs, batch_size, seed
        self.queries = max(1, pairs // 2)
        self.context_length = 2 * pairs + 2 * self.queries - 1
        self.vocab_size = 3 * pairs
        self.batches_drawn = 0

    def sample(self, rng: np.random.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """x, y: (count, 2P + 2Q - 1); distance: (count, Q) d of each query, in query order."""
        P, Q = self.pairs, self.queries
        keys = np.argsort(rng.random((count, 2 * P)), axis=1)[:, :P]  # (N, P) distinct keys
        values = rng.integers(2 * P, 3 * P, size=(count, P))  # (N, P)
        # Which pairs the queries ask for: Q = P/2 distinct ones. Distinct, so no answer stands nearer
        # than its pair (after an earlier query of the same key); half of them, so the last query
        # cannot be answered by elimination.
        order = np.argsort(rng.random((count, P)), axis=1)[:, :Q]  # (N, Q)
        pairs = np.stack([keys, values], axis=2).reshape(count, 2 * P)  # k1 v1 k2 v2 ...
        asked = np.stack([np.take_along_axis(keys, order, 1), np.take_along_axis(values, order, 1)], axis=2)
        sequence = np.concatenate([pairs, asked.reshape(count, 2 * Q)], axis=1)  # (N, 2P + 2Q)
        x, y = sequence[:, :-1], sequence[:, 1:].copy()
        query_positions = 2 * P + 2 * np.arange(Q)  # (Q,) where each query key stands in x
        target = np.full_like(y, IGNORE_INDEX)
        target[:, query_positions] = y[:, query_positions]
        distance = query_positions[None, :] - 2 * order  # (N, Q): the queried key stood at 2 * pair index
        return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(target.astype(np.int64)), distance

    def plan_end(self, batches_left: int) -> None:
        """The Trainer says where the run ends; fresh draws have no passes to end there."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, self.batches_drawn])
        self.batches_drawn += 1
        x, y, _ = self.sample(rng, self.batch_size)
        return x, y


@dataclass
class RecallResult:
    distances: np.ndarray  # (bins,) the first d of each bin
    accuracy: np.ndarray  # (bins,) recall accuracy over the queries whose d is in the bin
    counts: np.ndarray  # (bins,) queries in each bin
    steps: int
    seconds: float
    parameters: int
    final_loss: float
    pairs: int  # chance is 1 / pairs


def recall_config(task: KeyValueRecall) -> ModelConfig:
    """The small attention model the recall task trains: 2 layers, width 64, 4 heads."""
    return ModelConfig(vocab_size=task.vocab_size, n_layer=2, n_head=4, n_embd=64,
                       context_length=task.context_length)


def recall_model(task: KeyValueRecall) -> LanguageModel:
    return LanguageModel(recall_config(task), "fused")


def recall_bytes(pairs: int) -> int:
    """A floor of the memory the recall model needs with `pairs` pairs: what a training step holds
    (`model.memory.training_memory`, fp32), or the fp32 logits of the RECALL_EVAL_SEQUENCES sequences
    its evaluation reads at once, whichever is more. Both grow as pairs squared (the context and the
    vocabulary are each about 3 * pairs); the evaluation's logits are the larger."""
    task = KeyValueRecall(pairs, batch_size=RECALL_BATCH, seed=0)
    step = training_memory(recall_config(task), TrainConfig(batch_size=RECALL_BATCH, precision="fp32"),
                           explicit_attention=False)
    return max(step.total_bytes, RECALL_EVAL_SEQUENCES * task.context_length * task.vocab_size * FP32)


def check_recall_fits(pairs: int, device: torch.device) -> None:
    """One line naming --pairs and the largest that fits, when `recall_bytes(pairs)` exceeds the
    memory `device` has free (before anything is loaded or trained)."""
    limit, where = available_bytes(device)
    need = recall_bytes(pairs)
    if limit is None or need <= limit:
        return
    low, high = 1, pairs  # recall_bytes grows with pairs: the largest that fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if recall_bytes(middle) <= limit else (low, middle - 1)
    advice = f"give at most --pairs {low}" if low >= 2 else "free some memory"
    raise TinyattnError(f"--pairs {pairs}: the key-value recall needs at least {gigabytes(need)} (its "
                        f"logits grow as the square of --pairs), more than the {gigabytes(limit)} {where}; "
                        f"{advice}")


def train_recall(*, pairs: int, steps: int, seed: int, device: torch.device, writer_folder: Path) -> RecallResult:
    """Train the recall model for `steps` steps, then its accuracy by distance on fresh sequences."""
    task = KeyValueRecall(pairs, batch_size=RECALL_BATCH, seed=seed)
    seed_everything(seed)
    model = recall_model(task).to(device)
    config = TrainConfig(batch_size=task.batch_size, max_steps=steps, lr=3e-3, min_lr=3e-4,
                         warmup_steps=min(50, steps // 5), weight_decay=0.0, seed=seed)
    trainer = Trainer(model, build_optimizer(model, config, device), task, config, device=device,
                      precision=select_precision("fp32", device))
    writer = tensorboard_writer(writer_folder, "key_value")
    start, loss = time.perf_counter(), torch.zeros(())
    try:
        while trainer.step < steps:
            loss, _ = trainer.train_step()
            if trainer.step % 10 == 0:
                writer.add_scalar("train/loss", float(loss), trainer.step)
        result = recall_accuracy(model, task, seed=seed + 1)
        for d, accuracy in zip(result[0], result[1]):
            writer.add_scalar("recall_accuracy_by_distance", accuracy, int(d))
    finally:
        writer.close()
    return RecallResult(*result, steps=steps, seconds=time.perf_counter() - start,
                        parameters=model.num_parameters(), final_loss=float(loss), pairs=pairs)


def recall_accuracy(model: nn.Module, task: KeyValueRecall, *, seed: int,
                    sequences: int = RECALL_EVAL_SEQUENCES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first d of each bin, accuracy, count) over the queries of `sequences` fresh sequences."""
    x, y, distance = task.sample(np.random.default_rng(seed), sequences)
    device = next(model.parameters()).device
    with evaluation_mode(model), torch.no_grad():
        predicted = model(x.to(device)).logits.argmax(-1).cpu()  # (N, T)
    positions = 2 * task.pairs + 2 * np.arange(task.queries)
    correct = (predicted[:, positions] == y[:, positions]).numpy().ravel()  # (N * P,)
    bins = distance.ravel() // DISTANCE_BIN
    counts = np.bincount(bins)
    hits = np.bincount(bins, weights=correct)
    keep = counts > 0
    return np.flatnonzero(keep) * DISTANCE_BIN, hits[keep] / counts[keep], counts[keep]


# ----------------------------------------------------------------------------- reporting


def report(probe: list[ProbeRow], recall: RecallResult, source: str, machine: str, args, *, wall: float) -> str:
    lines = [f"tinyattn lab distance: {source}; {machine}", "", *probe_lines(probe, args.string_length), "",
             f"key-value recall: {args.pairs} pairs then {max(1, args.pairs // 2)} queries (distinct keys "
             f"of the pairs); a {recall.parameters:,}-parameter attention model (2 layers, width 64) trained "
             f"{counted(recall.steps, 'step')} in {recall.seconds:.0f} s, "
             f"final train loss {recall.final_loss:.3f}; accuracy on {RECALL_EVAL_SEQUENCES} fresh sequences "
             f"(chance {1 / args.pairs:.3f})",
             f"{'d':>9} {'accuracy':>9} {'queries':>8}"]
    for d, accuracy, count in zip(recall.distances, recall.accuracy, recall.counts):
        lines.append(f"{f'{d}-{d + DISTANCE_BIN - 1}':>9} {accuracy:>9.3f} {count:>8}")
    lines += ["", f"wall time of the command: {wall:.0f} s"]
    return "\n".join(lines)


def probe_lines(probe: list[ProbeRow], length: int) -> list[str]:
    """The probe's table: a row per gap, z = benefit / SE, a * where it passes `gap_threshold`,
    then the verdict of the pooled test (`verdict`)."""
    threshold = gap_threshold(len(probe))
    lines = [f"repeated-sequence probe: a random string of {length} tokens, d tokens of text, the string "
             f"again; the control: a fresh random string in the second copy's place ({PROBE_SAMPLES} strings "
             "per d; loss in nats on tokens 2..n of each string)",
             "benefit = fresh string - second copy, what having seen the string is worth, with its standard "
             "error over the strings (paired) and z = benefit / SE. By chance alone about 1 gap in 20 lands "
             f"beyond 2 SE of 0: * marks a gap beyond {threshold:.2f} SE (the {FALSE_ALARM:.0%} threshold "
             f"corrected for {len(probe)} gaps, Bonferroni); the verdict is the pooled test below",
             f"{'d':>5} {'first copy':>11} {'second copy':>12} {'fresh string':>13} {'benefit':>8} {'SE':>6} "
             f"{'z':>6}"]
    for row in probe:
        z = z_score(row.benefit, row.benefit_se)
        mark = " *" if abs(z) > threshold else ""
        lines.append(f"{row.gap:>5} {row.first:>11.3f} {row.second:>12.3f} {row.fresh:>13.3f} "
                     f"{row.benefit:>8.3f} {row.benefit_se:>6.3f} {z:>6.2f}{mark}")
    return lines + [verdict(pooled_benefit(probe))]


def save_figure(probe: list[ProbeRow], recall: RecallResult, path: Path, *, length: int) -> None:
    from tinyattn.analysis.plotting import new_figure

    figure = new_figure(11.0, 4.0, dpi=100, layout="constrained")
    left, right = figure.subplots(1, 2)
    gaps = [row.gap for row in probe]
    left.plot(gaps, [row.first for row in probe], marker="o", label="first copy (random)")
    left.plot(gaps, [row.second for row in probe], marker="o", label="second copy (seen d tokens before)")
    left.plot(gaps, [row.fresh for row in probe], marker="o", label="fresh string there instead (control)")
    left.set(xlabel=f"gap d (tokens of text between the two copies of {length} tokens)",
             ylabel="loss (nats)", title="repeated-sequence probe")
    right.plot(recall.distances + DISTANCE_BIN / 2, recall.accuracy, marker="o", label="trained model")
    right.axhline(1 / recall.pairs, linestyle="--", color="grey", label="chance")
    right.set(xlabel="d (tokens from the query back to its key)", ylabel="recall accuracy", ylim=(0, 1.02),
              title="key-value recall")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.savefig(path, dpi=100)
