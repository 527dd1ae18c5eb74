"""Evaluation: loss, perplexity and bits per character or byte over a whole text; loss by position.

`evaluate_tokens` scores every token of a token array exactly once, deterministically:
the array is cut into non-overlapping windows of context_length tokens, each predicting
the next token at every position (x = tokens[s:s+T], y = tokens[s+1:s+T+1]), and the
tokens left over at the end form one shorter tail window. So each token but the first
is a target once, and the first position of each window predicts with no context at
all. (A sliding window would give every target more context and a lower loss; this is
the standard, cheaper number that the training loop's validation loss estimates.)

- loss: mean cross-entropy in nats per predicted token; perplexity = exp(loss).
- bits per character (character tokenizer) or per byte (any other): total nats / ln 2
  divided by the characters, or the UTF-8 bytes, of the predicted text (`<|endoftext|>`
  separators count as no text). Given the text itself, its bytes are counted there, so an
  unknown token counts the bytes it stands for; else in the decoded tokens (`text_units`).
  Unlike the loss, these compare across tokenizers.
- loss by position: the mean loss at each position 0..T-1 over the full windows. It
  shows how much prediction improves as context accumulates, and where more context
  stops helping. Its mean equals the loss over those same full windows. The table
  averages it over positions 0, 1, 2-3, 4-7, ...: each row doubles the context read.

`loss_by_position` and `log_loss_by_position_to_tensorboard` are what the training loop
calls at each evaluation; `save_loss_by_position_plot` draws the PNG line plot (matplotlib),
`loss_by_position_image` the same curve without text for TensorBoard (numpy alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from tinyattn.analysis.plotting import line_chart, new_figure
from tinyattn.data.batches import eval_batches, full_window_count, tail_window
from tinyattn.data.tokenizer import END_OF_TEXT
from tinyattn.errors import DataError, counted
from tinyattn.model.transformer import evaluation_mode
from tinyattn.system.storage import check_writable, storage_errors

DECODE_CHUNK = 1 << 20  # tokens decoded at once when counting the bytes of a text
LOSS_CHUNK_ELEMENTS = 1 << 22  # logits `token_losses` holds at once (16 MiB in fp32)
PLOT_INCHES = (7.0, 4.0)
PLOT_DPI = 100
TENSORBOARD_PLOT_PIXELS = (420, 240)  # (width, height) of loss_by_position_image


@dataclass
class Evaluation:
    loss: float  # mean nats per predicted token
    perplexity: float  # exp(loss)
    bits_per_unit: float  # total nats / ln 2 / units
    unit: str  # "character" (character tokenizer) or "byte" (UTF-8 bytes of the text)
    units: int  # characters or bytes of the predicted text (after the first token; see text_units)
    predicted_tokens: int
    full_windows: int  # windows of context_length tokens
    tail_tokens: int  # targets in the final shorter window (0: none)
    loss_by_position: np.ndarray  # (context_length,) mean over the full windows; NaN if there are none


# ----------------------------------------------------------------------------- losses


def token_losses(model, x: torch.Tensor, y: torch.Tensor, **forward_options) -> torch.Tensor:
    """Cross-entropy of every target in nats, (B, T) float32, computed in fp32; 0 where the
    target is model.IGNORE_INDEX (cross_entropy's default). forward_options (mask) go to the model.

    A LanguageModel's head and the cross-entropy run on its hidden states a block of at most
    LOSS_CHUNK_ELEMENTS logits at a time: the (B, T, V) logits of a large vocabulary and a long
    context (49152 x 8192 is 1.6 GB a window in fp32) never exist at once. Blocks of whole windows
    give the losses of the logits computed whole; blocks within a window differ in the last bit
    or so. A model with `forward` alone (the lab's hand-built ones) gives its logits whole.
    """
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    if not hasattr(model, "head_logits"):
        return _cross_entropy(model(x, **forward_options).logits, y)
    hidden = model.hidden_states(x, **forward_options)  # (B, T, C)
    (B, T), V = y.shape, model.config.vocab_size
    positions = min(T, max(1, LOSS_CHUNK_ELEMENTS // V))  # of one window, per block
    windows = max(1, LOSS_CHUNK_ELEMENTS // (positions * V))  # per block
    losses = torch.empty(B, T, device=device)
    for b in range(0, B, windows):
        for t in range(0, T, positions):
            block = (slice(b, b + windows), slice(t, t + positions))
            losses[block] = _cross_entropy(model.head_logits(hidden[block]), y[block])  # (b, t, V) logits
    return losses


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits, (B, T) targets -> (B, T) nats, in fp32."""
    return F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")


# ----------------------------------------------------------------------------- evaluation


def loss_by_position(model, tokens, context_length: int, batch_size: int,
                     max_windows: Optional[int] = None) -> np.ndarray:
    """Mean loss (nats) at each position 0..T-1 over full windows: (context_length,) float64.

    The windows are `data.eval_batches`'s: all non-overlapping ones, or max_windows spread
    evenly over the tokens, the same every call. With the training loop's eval_windows
    the mean of the result is its validation loss over the same windows (in the same
    precision). Pass the plain LanguageModel; it runs in eval mode without gradients,
    under whatever autocast the caller has entered.
    """
    sums, count = _position_sums(model, tokens, context_length, batch_size, max_windows)
    if count == 0:
        raise DataError(f"loss by position needs at least one full window: {counted(len(tokens), 'token')}, "
                        f"fewer than context_length + 1 = {context_length + 1}")
    return sums / count


def _position_sums(model, tokens, context_length, batch_size, max_windows=None) -> tuple[np.ndarray, int]:
    """Summed loss at each position over the full windows (`eval_batches`), and their count."""
    tokens = np.asarray(tokens)  # a list, an array or a memmap (no copy)
    sums = torch.zeros(context_length, dtype=torch.float64)
    count = 0
    if full_window_count(len(tokens), context_length) == 0:
        return sums.numpy(), 0
    with evaluation_mode(model), torch.no_grad():
        for x, y in eval_batches(tokens, context_length, batch_size, max_windows):
            sums += token_losses(model, x, y).double().sum(0).cpu()  # (T,)
            count += x.size(0)
    return sums.numpy(), count


def evaluate_tokens(model, tokenizer, tokens, batch_size: int, char_level: bool, *,
                    text: Optional[str] = None, source: str = "the text") -> Evaluation:
    """Loss, perplexity, bits per character (char_level) or byte, loss by position: all windows.

    tokens: a list, array or memmap of token ids; text: the text they encode (after the
    tokenizer's `text_start`), whose bytes are then counted (`predicted_text_bytes`); source:
    what they are (a file's path) for the error when there is nothing to predict. Pass the
    plain LanguageModel; it runs in eval mode without gradients, in its own precision (the CLI
    loads it in fp32).
    """
    tokens = np.asarray(tokens)
    if len(tokens) < 2:
        raise DataError(f"{source} has {counted(len(tokens), 'token')}; evaluation needs at least 2 "
                        "(one to read, one to predict)")
    context_length = model.config.context_length
    sums, windows = _position_sums(model, tokens, context_length, batch_size)
    total = float(sums.sum())
    tail = tail_window(tokens, context_length)
    if tail is not None:
        with evaluation_mode(model), torch.no_grad():
            total += float(token_losses(model, *tail).double().sum())
    predicted = len(tokens) - 1
    if text is None or char_level:
        units = text_units(tokenizer, tokens[1:], char_level)
    else:
        units = predicted_text_bytes(tokenizer, text, tokens)
    loss = total / predicted
    by_position = sums / windows if windows else np.full(context_length, np.nan)
    return Evaluation(loss=loss, perplexity=math.exp(loss), bits_per_unit=total / math.log(2) / max(units, 1),
                      unit="character" if char_level else "byte", units=units,
                      predicted_tokens=predicted, full_windows=windows,
                      tail_tokens=0 if tail is None else tail[1].size(1), loss_by_position=by_position)


def text_units(tokenizer, tokens: np.ndarray, char_level: bool) -> int:
    """Characters (char_level: one per token) or UTF-8 bytes of the text `tokens` spell.

    End-of-text separators (`<|endoftext|>`, or the tokenizer's own) count as no text (their
    prediction still counts in the loss). Bytes come from decoding DECODE_CHUNK tokens at a time, so a split of any size
    fits in memory; a chunk boundary inside a multi-byte character miscounts it by a few
    bytes, a relative error below 1e-5.
    """
    eot = tokenizer.eot_id
    separators = int(np.count_nonzero(tokens == eot)) if eot is not None else 0
    if char_level:
        return len(tokens) - separators
    size = sum(len(tokenizer.decode(tokens[start:start + DECODE_CHUNK]).encode("utf-8"))
               for start in range(0, len(tokens), DECODE_CHUNK))
    return size - _separator_bytes(tokenizer, separators)


def predicted_text_bytes(tokenizer, text: str, tokens: np.ndarray) -> int:
    """UTF-8 bytes of `text` that `tokens`, its encoding after the tokenizer's `text_start`,
    predict: the text less what the first token reads, end-of-text separators counting as no
    text. Counted in the text: an unknown token ([UNK]) counts the bytes of what it stands for,
    where decoded it would count U+FFFD's 3. A first token holding part of a character
    (byte-level BPE) counts the whole character as read: a few bytes too few, once."""
    eot = tokenizer.eot_id
    separators = int(np.count_nonzero(tokens[1:] == eot)) if eot is not None else 0
    read_first = 0 if tokenizer.text_start else tokenizer.first_token_chars(text)
    return (len(text.encode("utf-8")) - len(text[:read_first].encode("utf-8"))
            - _separator_bytes(tokenizer, separators))


def _separator_bytes(tokenizer, separators: int) -> int:
    """UTF-8 bytes of `separators` end-of-text tokens as text (`<|endoftext|>`, or the tokenizer's
    own): what the byte counts above leave out."""
    return separators * len(getattr(tokenizer, "end_of_text", END_OF_TEXT).encode("utf-8"))


# ----------------------------------------------------------------------------- reporting


def position_ranges(context_length: int) -> list[tuple[int, int]]:
    """Rows of the loss-by-position table, (first, last) inclusive: 0, 1, 2-3, 4-7, ... to the end.

    Each row doubles the context read, and averaging over a row's positions keeps the
    table steady where single positions are noisy.
    """
    ranges, first = [(0, 0)], 1
    while first < context_length:
        ranges.append((first, min(2 * first - 1, context_length - 1)))
        first *= 2
    return ranges


def range_name(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def format_loss_by_position(losses: np.ndarray) -> str:
    """A short table: mean loss over positions 0, 1, 2-3, 4-7, ..., and the gain between rows."""
    lines = [f"{'positions':>9} {'loss':>7} {'gain':>7}   (position p has read p+1 tokens; "
             "gain = fall in loss since the row above)"]
    previous = None
    for first, last in position_ranges(len(losses)):
        loss = float(np.mean(losses[first:last + 1]))
        gain = "" if previous is None else f"{previous - loss:+7.3f}"
        lines.append(f"{range_name(first, last):>9} {loss:7.3f} {gain:>7}".rstrip())
        previous = loss
    return "\n".join(lines)


def loss_by_position_figure(losses: np.ndarray, title: str = "", dpi: int = PLOT_DPI):
    """A line plot of loss against tokens of context read (log scale)."""
    figure = new_figure(*PLOT_INCHES, dpi=dpi, layout="constrained")
    ax = figure.subplots()
    seen = np.arange(1, len(losses) + 1)  # position p has read p + 1 tokens
    ax.plot(seen, losses, linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens of context read (position + 1)")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title(title or "loss by position in the window", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    return figure


def save_loss_by_position_plot(losses: np.ndarray, path: str | Path, title: str = "") -> Path:
    path = Path(path)
    check_writable(path.parent)
    with storage_errors(path):
        loss_by_position_figure(losses, title).savefig(path, dpi=PLOT_DPI)
    return path


def loss_by_position_image(losses: np.ndarray) -> np.ndarray:
    """The curve of `loss_by_position_figure` as (240, 420, 3) uint8, drawn with numpy, no text.

    x: tokens of context read, log scale, with a grey line at 1, 2, 4, 8, ... tokens
    (the left edge is 1, the right edge the context length). y: 0 nats at the bottom,
    a grey line every nat, the top the largest loss rounded up to a whole nat, so the
    scale stays put from one evaluation to the next while the loss falls.
    """
    losses = np.asarray(losses, dtype=np.float64)
    seen = np.log2(np.arange(1, len(losses) + 1))  # position p has read p + 1 tokens
    finite = losses[np.isfinite(losses)]
    top = max(math.ceil(float(finite.max())), 1) if finite.size else 1
    width, height = TENSORBOARD_PLOT_PIXELS
    return line_chart(seen, losses, width, height, (0.0, float(top)),
                      x_grid=range(math.floor(seen[-1]) + 1), y_grid=range(top + 1))


def log_loss_by_position_to_tensorboard(writer, losses: np.ndarray, step: int,
                                        tag: str = "loss_by_position", image: bool = True) -> None:
    """Scalars `<tag>/positions_<range>`, the table's rows (0, 1, 2-3, 4-7, ...), and the curve.

    image=True also adds `loss_by_position_image` as `<tag>/plot`; it needs no matplotlib.
    """
    for first, last in position_ranges(len(losses)):
        writer.add_scalar(f"{tag}/positions_{range_name(first, last)}",
                          float(np.mean(losses[first:last + 1])), step)
    if image:
        writer.add_image(f"{tag}/plot", loss_by_position_image(losses), step, dataformats="HWC")
