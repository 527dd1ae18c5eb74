"""Attention maps: the weights each head gives the earlier tokens of one text.

`compute_attention_maps` runs the model once on the text through its explicit
attention path (`model(idx, need_weights=True)`, the same arithmetic as the fused
kernel) and keeps, for every layer, the (H, T, T) weights: row = query token,
column = key token, each row sums to 1, future keys are exactly 0. From those:

- `save_heatmaps` writes one PNG per layer, every head in a grid, query tokens down
  the side and key tokens along the top; future (masked) cells are grey, so a weight
  of 0 on an allowed key (dark) is not confused with a key the query could not see.
- `query_table` / `format_query_table`: for one query token, the keys each head
  weights most.
- `layer_image` / `attention_heatmap_images` / `log_attention_to_tensorboard`: the same
  heatmaps drawn straight from the weights with numpy (no labels, no matplotlib), for the
  probe text the training loop logs to TensorBoard at each evaluation. Heads tile the
  grid of `head_grid` row by row, TENSORBOARD_GAP white pixels apart; each head is its
  (T, T) weights through the viridis table of `plotting.colormap` (0 dark purple, 1
  yellow, future keys grey), every weight a block of `tensorboard_scale(T)` pixels
  square: query rows top to bottom, key columns left to right.

How to read them: a weight says how much of a key's value vector a head mixes into
the query's output at that layer. It is not a measure of how much that token matters
to the prediction (later layers, the MLPs and the residual stream all intervene), and
a head that could look 100 tokens back may not. See docs/ATTENTION.md.

The PNG files need matplotlib, an optional extra (see `tinyattn.analysis.plotting`); the
TensorBoard images do not.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tinyattn.analysis.plotting import (
    MASKED_RGB,
    colormap,
    new_figure,
    plotting_available,  # noqa: F401  its old home; callers may still import it here
    require_matplotlib,
    scale_up,
    tile,
)
from tinyattn.data.tokenizer import unknown_characters
from tinyattn.errors import TinyattnError, counted
from tinyattn.model.transformer import evaluation_mode
from tinyattn.system.storage import check_writable, storage_errors

# Heatmap layout, in inches. The size of an image depends only on the number of heads
# and tokens (`heatmap_size_pixels`); tick labels sit on the outer panels only, as on
# shared axes: the panels of a row share their query tokens, those of a column their keys.
LABEL_INCHES = 0.09  # room per token label along a panel's side, at LABEL_POINTS
LABEL_POINTS = 5.5
PANEL_INCHES = (3.0, 9.0)  # a head's panel grows with the tokens between these bounds
SINGLE_PANEL_INCHES = (5.0, 12.0)  # one head on its own (--head)
MARGIN_INCHES = 0.55  # left of the grid and above it: the token labels (up to LABEL_CHARS)
GAP_INCHES = 0.15  # between panels
HEAD_TITLE_INCHES = 0.2  # "head h" under each panel
TITLE_INCHES = 0.45  # the figure's title
COLORBAR_INCHES = 0.8  # gap, bar and its labels, right of the grid
DPI = 100  # PNG files
MASKED_COLOR = "#{:02x}{:02x}{:02x}".format(*MASKED_RGB)  # future keys; weight 0 is viridis' darkest
LABEL_CHARS = 10  # longer token labels are cut with an ellipsis
TOP_K = 5
# TensorBoard images: each head's (T, T) map scaled up by a whole factor to at least this
# many pixels a side, so a short probe text is not a speck; heads TENSORBOARD_GAP apart.
TENSORBOARD_HEAD_PIXELS = 128
TENSORBOARD_GAP = 2


# ----------------------------------------------------------------------------- weights


@dataclass
class AttentionMaps:
    token_ids: list[int]  # the T tokens the model saw: the end of the text if it was longer
    labels: list[str]  # readable text of each token, whitespace made visible
    weights: list[np.ndarray]  # per layer, (H, T, T) float32: query rows, key columns, 0 = masked
    dropped_tokens: int  # tokens cut from the start of the text to fit the context

    @property
    def num_layers(self) -> int:
        return len(self.weights)

    @property
    def num_heads(self) -> int:
        return self.weights[0].shape[0]


def visible(text: str) -> str:
    """A token's text with whitespace shown: ' ' -> '␣', newline -> '\\n', tab -> '\\t'."""
    shown = text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    # Other invisible characters (controls, no-break spaces) would draw as nothing: escape them.
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in shown)


def compute_attention_maps(model, tokenizer, text: str) -> AttentionMaps:
    """Run `model` once on `text` and keep every layer's attention weights.

    Pass the plain LanguageModel (not a torch.compile or DDP wrapper). A text longer
    than the context keeps its last context_length tokens (`dropped_tokens` says how
    many went). The model is put in eval mode for the forward and left as it was.
    """
    return attention_maps_of_tokens(model, tokenizer, tokenizer.encode(text))


@torch.no_grad()
def attention_maps_of_tokens(model, tokenizer, token_ids: list[int]) -> AttentionMaps:
    """`compute_attention_maps` of a text already encoded (a caller that needs its ids too)."""
    if not token_ids:
        raise TinyattnError("the text is empty: attention maps need at least one token")
    context = model.config.context_length
    dropped = max(len(token_ids) - context, 0)
    token_ids = token_ids[dropped:]
    device = next(model.parameters()).device
    idx = torch.tensor([token_ids], dtype=torch.long, device=device)  # (1, T)
    with evaluation_mode(model):
        output = model(idx, need_weights=True)
    weights = [w[0].float().cpu().numpy() for w in output.attention_weights]  # per layer (H, T, T)
    labels = [visible(tokenizer.token_text(i)) for i in token_ids]
    return AttentionMaps(token_ids, labels, weights, dropped)


# ----------------------------------------------------------------------------- the query table


def token_spans(tokenizer, token_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of token_ids and each token's (start, end) character span in it.

    Spans come from decoding growing prefixes, each read as far as it agrees with the whole
    text, so a token that is part of a UTF-8 character (byte-level BPE) gets the characters it
    completes: the U+FFFD a prefix ending inside a character decodes to is not the text's.
    """
    text = tokenizer.decode(token_ids)
    ends = []
    for i in range(len(token_ids)):
        end = len(os.path.commonprefix([tokenizer.decode(token_ids[:i + 1]), text]))
        ends.append(max(end, ends[-1] if ends else 0))
    return text, list(zip([0] + ends[:-1], ends))


def query_position_of_word(tokenizer, token_ids: list[int], word: str, *, text: Optional[str] = None) -> int:
    """The position of the token holding the last character of the first occurrence of `word`.

    `word` is matched case-sensitively as a whole word (not inside a longer word) in the
    text the model saw. For a character-level model this is the word's last character:
    the position that has read the whole word. With subword tokens it is the token that
    completes the word. An imported folder's bos before the text (`tokenizer.text_start`) is no part
    of it: its spelling ("<s>") is not searched. `text`, the text token_ids encode, lets the error
    for a word it holds that the decoded tokens lack (read as [UNK]) say why.
    """
    start = list(getattr(tokenizer, "text_start", []))
    skip = len(start) if start and list(token_ids[:len(start)]) == start else 0
    decoded, spans = token_spans(tokenizer, list(token_ids[skip:]))
    pattern = r"(?<!\w)" + re.escape(word) + r"(?!\w)"
    match = re.search(pattern, decoded) if word.strip() else None
    if match is None:
        if word.strip() and text is not None and re.search(pattern, text):
            raise TinyattnError(f"--query {word!r}: a word of the text, but not of the text the model reads: "
                                f"{_what_the_tokenizer_lacks(tokenizer, word)} (use --query-position N "
                                "for any token)")
        raise TinyattnError(f"--query {word!r}: not a word of the text (matched whole and "
                            "case-sensitive; use --query-position N for any token)")
    last_char = match.end() - 1
    for position, (first, end) in enumerate(spans):
        if first <= last_char < end:
            return skip + position
    return skip + len(spans) - 1  # unreachable unless decode() is not prefix-stable


def _what_the_tokenizer_lacks(tokenizer, word: str) -> str:
    """Why `word` is not in the decoded text: the characters read as [UNK], else how it decodes
    (a normalising tokenizer: lowercased, accents stripped)."""
    unknown = unknown_characters(tokenizer, word)
    if unknown:
        return f"the tokenizer has never seen {', '.join(repr(c) for c in unknown)}, read as [UNK]"
    return f"the tokenizer gives it back as {tokenizer.decode(tokenizer.encode(word))!r}"


def check_query_position(num_tokens: int, position: int) -> int:
    """A position among num_tokens, negative counting from the end; out of range is a TinyattnError."""
    T = num_tokens
    if not -T <= position < T:
        raise TinyattnError(f"--query-position {position}: the text has {counted(T, 'token')} "
                            f"(positions 0..{T - 1}, or -1 for the last)")
    return position % T


@dataclass
class QueryRow:
    layer: int
    head: int
    keys: list[tuple[int, str, float]]  # (position, label, weight), largest weight first


def query_table(maps: AttentionMaps, position: int, top_k: int = TOP_K,
                layers: Optional[list[int]] = None, heads: Optional[list[int]] = None) -> list[QueryRow]:
    """For the query at `position`, the top_k keys (itself included) each head weights most."""
    rows = []
    for layer in layers if layers is not None else range(maps.num_layers):
        for head in heads if heads is not None else range(maps.num_heads):
            row = maps.weights[layer][head, position, :position + 1]  # allowed keys 0..position
            order = np.argsort(-row, kind="stable")[:top_k]  # ties: the earlier key first
            rows.append(QueryRow(layer, head, [(int(k), maps.labels[k], float(row[k])) for k in order]))
    return rows


def format_query_table(maps: AttentionMaps, position: int, rows: list[QueryRow]) -> str:
    """A plain-text table: one line per (layer, head), its top keys as token@position weight."""
    cells = [[f"{label}@{key} {weight:.3f}" for key, label, weight in row.keys] for row in rows]
    width = max(len(c) for line in cells for c in line)
    top_k = max(len(line) for line in cells)
    lines = [f"query {maps.labels[position]} at position {position} (of {len(maps.token_ids)} tokens): "
             f"the keys each head weights most, as token@position weight; the query itself counts",
             ("layer head  " + "  ".join(f"{f'#{i + 1}':<{width}}" for i in range(top_k))).rstrip()]
    for row, line in zip(rows, cells):
        lines.append(f"{row.layer:>5} {row.head:>4}  " + "  ".join(f"{c:<{width}}" for c in line).rstrip())
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures


def head_grid(num_heads: int) -> tuple[int, int]:
    """(rows, columns) of the per-layer grid: as square as possible, filled row by row."""
    columns = math.ceil(math.sqrt(num_heads))
    return math.ceil(num_heads / columns), columns


def heatmap_size_pixels(num_heads: int, num_tokens: int, dpi: int = DPI) -> tuple[int, int]:
    """(width, height) of the heatmap image of `num_heads` panels of `num_tokens` tokens."""
    width, height = _figure_inches(num_heads, num_tokens)
    return round(width * dpi), round(height * dpi)


def _panel_inches(num_heads: int, num_tokens: int) -> float:
    """LABEL_INCHES per token, so short texts are labelled in full, within the bounds."""
    low, high = SINGLE_PANEL_INCHES if num_heads == 1 else PANEL_INCHES
    return min(max(num_tokens * LABEL_INCHES, low), high)


def _figure_inches(num_heads: int, num_tokens: int) -> tuple[float, float]:
    rows, columns = head_grid(num_heads)
    panel = _panel_inches(num_heads, num_tokens)
    width = MARGIN_INCHES + columns * panel + (columns - 1) * GAP_INCHES + COLORBAR_INCHES
    height = TITLE_INCHES + MARGIN_INCHES + rows * (panel + HEAD_TITLE_INCHES) + (rows - 1) * GAP_INCHES
    return width, height


def layer_figure(maps: AttentionMaps, layer: int, heads: Optional[list[int]] = None, dpi: int = DPI):
    """One layer's heatmaps, a panel per head: queries down the side, keys along the top."""
    matplotlib = require_matplotlib()
    heads = list(range(maps.num_heads)) if heads is None else heads
    T = len(maps.token_ids)
    width, height = _figure_inches(len(heads), T)
    figure = new_figure(width, height, dpi)
    rows, columns = head_grid(len(heads))
    panel = _panel_inches(len(heads), T)
    # Label every token if the labels fit along the panel, else every k-th (the last always).
    every = max(1, math.ceil(T / (panel / LABEL_INCHES)))
    ticks = sorted(range(T - 1, -1, -every))
    tick_labels = [_short(maps.labels[t]) for t in ticks]
    colormap = matplotlib.colormaps["viridis"].with_extremes(bad=MASKED_COLOR)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): key after query
    image = None
    for n, head in enumerate(heads):
        row, column = divmod(n, columns)
        left = MARGIN_INCHES + column * (panel + GAP_INCHES)
        top = height - TITLE_INCHES - MARGIN_INCHES - row * (panel + HEAD_TITLE_INCHES + GAP_INCHES)
        ax = figure.add_axes((left / width, (top - panel) / height, panel / width, panel / height))
        shown = np.where(future, np.nan, maps.weights[layer][head])  # NaN draws as MASKED_COLOR
        image = ax.imshow(shown, cmap=colormap, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
        ax.set_xlabel(f"head {head}", fontsize=8, labelpad=2)
        ax.xaxis.tick_top()
        ax.set_xticks(ticks if row == 0 else [], tick_labels if row == 0 else [],
                      rotation=90, fontsize=LABEL_POINTS)
        ax.set_yticks(ticks if column == 0 else [], tick_labels if column == 0 else [],
                      fontsize=LABEL_POINTS)
        ax.tick_params(length=0, pad=1)
    grid_top = height - TITLE_INCHES - MARGIN_INCHES
    grid_bottom = grid_top - rows * (panel + HEAD_TITLE_INCHES) - (rows - 1) * GAP_INCHES + HEAD_TITLE_INCHES
    bar_left = width - COLORBAR_INCHES + GAP_INCHES
    bar = figure.add_axes((bar_left / width, grid_bottom / height, 0.12 / width,
                           (grid_top - grid_bottom) / height))
    figure.colorbar(image, cax=bar).set_label("weight", fontsize=8)
    bar.tick_params(labelsize=7)
    cut = f"; the first {maps.dropped_tokens} cut to fit the context" if maps.dropped_tokens else ""
    figure.suptitle(f"layer {layer}: rows = query token, columns = key token, grey = future (masked)\n"
                    f"{T} tokens{cut}", fontsize=9, y=1 - 0.05 / height, va="top")
    return figure


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"


def save_heatmaps(maps: AttentionMaps, out_dir: str | Path, layers: Optional[list[int]] = None,
                  head: Optional[int] = None, dpi: int = DPI) -> list[Path]:
    """Write `layer_<L>.png` (every head) or `layer_<L>_head_<H>.png` (one head); returns the paths."""
    out_dir = check_writable(out_dir)
    paths = []
    for layer in layers if layers is not None else range(maps.num_layers):
        name = f"layer_{layer}.png" if head is None else f"layer_{layer}_head_{head}.png"
        figure = layer_figure(maps, layer, None if head is None else [head], dpi)
        with storage_errors(out_dir / name):
            figure.savefig(out_dir / name, dpi=dpi)
        paths.append(out_dir / name)
    return paths


# ----------------------------------------------------------------------------- training


def tensorboard_scale(num_tokens: int) -> int:
    """Pixels a side of one weight in `layer_image`: the least whole factor giving a head
    TENSORBOARD_HEAD_PIXELS or more (1 once the context alone is that wide)."""
    return max(1, math.ceil(TENSORBOARD_HEAD_PIXELS / num_tokens))


def tensorboard_image_size(num_heads: int, num_tokens: int) -> tuple[int, int]:
    """(width, height) of `layer_image` for `num_heads` heads of `num_tokens` tokens."""
    rows, columns = head_grid(num_heads)
    side = num_tokens * tensorboard_scale(num_tokens)
    return columns * side + (columns - 1) * TENSORBOARD_GAP, rows * side + (rows - 1) * TENSORBOARD_GAP


def layer_image(maps: AttentionMaps, layer: int) -> np.ndarray:
    """One layer's heatmaps as an (H, W, 3) uint8 array drawn with numpy: no labels, no matplotlib.

    The layout is the module docstring's; the size is `tensorboard_image_size`.
    """
    T = len(maps.token_ids)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): key after query
    shown = np.where(future, np.nan, maps.weights[layer])  # (H, T, T); NaN draws grey
    heads = colormap(shown, 0.0, 1.0)  # (H, T, T, 3)
    scale = tensorboard_scale(T)
    _, columns = head_grid(maps.num_heads)
    return tile([scale_up(head, scale) for head in heads], columns, TENSORBOARD_GAP)


def attention_heatmap_images(model, tokenizer, text: str) -> list[np.ndarray]:
    """One `layer_image` per layer for `text`: one small forward, no files."""
    maps = compute_attention_maps(model, tokenizer, text)
    return [layer_image(maps, layer) for layer in range(maps.num_layers)]


def log_attention_to_tensorboard(writer, model, tokenizer, text: str, *, step: int,
                                 tag: str = "attention") -> None:
    """Add `<tag>/layer_<L>` images of `text`'s attention maps to a SummaryWriter at `step`.

    Needs no matplotlib: the images are `layer_image`s.
    """
    for layer, image in enumerate(attention_heatmap_images(model, tokenizer, text)):
        writer.add_image(f"{tag}/layer_{layer}", image, step, dataformats="HWC")
