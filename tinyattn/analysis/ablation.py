"""Relevance: what a prediction actually depends on, measured beside the attention weights.

An attention weight says how much of a key's value a head mixes in; it does not say
whether the prediction needs that token (docs/ATTENTION.md). This module measures that
directly, by removing something and watching the loss:

- **Token ablation**: for every query position t (which predicts token t + 1) and every
  earlier token j, the rise in t's loss when token j is removed from attention: its key
  is masked out of every later query's attention in every layer (the model's `mask`
  argument, one (T, T) mask per ablated token, a batch of them per forward). Masking
  rather than swapping in a "neutral" token: no token is neutral to a model, and a
  substitute brings its own information; a masked key contributes exactly nothing, and
  the other weights of each row are renormalised by the softmax. Token j itself still
  sits at its own position in the residual stream, so only strictly earlier tokens are
  measured (a query's own token cannot be removed from its own prediction this way).
- **Head ablation**: the rise in the text's mean loss when one head's output is zeroed
  (`scaled_heads`, hooks on each layer's output projection), for every layer and head,
  one batch per window.

Both are differences of losses in nats: positive means the prediction got worse without
it (the token or head mattered), negative that it got better, 0 that it did not matter.

A text longer than the context is read in **windows** of context_length tokens, starting
every context_length // 2 tokens (`window_stride`, `window_starts`). Each query is measured in the first
window that holds it, so it reads between half a context and a whole context of earlier
tokens (every earlier token in the first window); tokens before its window's start are out
of its reach (`Relevance.reach`): no weight, no relevance. The attention maps of
`tinyattn.analysis.attention_maps` keep only the last context_length tokens instead; windows let
every token of a long text be a query.

Everything runs without gradients, in eval mode, in the model's precision; the ablated
variants of a window run as batches of at most `CHUNK_ELEMENTS` logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from tinyattn.analysis.attention_maps import visible
from tinyattn.analysis.evaluate import token_losses
from tinyattn.analysis.plotting import colormap, scale_up, tile
from tinyattn.errors import TinyattnError, counted
from tinyattn.model.attention import CausalSelfAttention, causal_mask
from tinyattn.model.transformer import IGNORE_INDEX, evaluation_mode

CHUNK_ELEMENTS = 1 << 22  # logits and attention scores one batch of ablated variants may hold
# TensorBoard's head-ablation grid: a cell per head, blue (loss fell) - white - red (rose),
# full colour at HEAD_ABLATION_FULL_SCALE nats so the grids of successive steps compare.
HEAD_ABLATION_COLORS = ((33, 102, 172), (255, 255, 255), (178, 24, 43))
HEAD_ABLATION_FULL_SCALE = 0.5
HEAD_ABLATION_CELL = 24  # pixels a side
HEAD_ABLATION_GAP = 2


# ----------------------------------------------------------------------------- windows


def window_stride(context_length: int) -> int:
    """Tokens between the starts of successive windows: half a context."""
    return max(context_length // 2, 1)


def window_starts(num_tokens: int, context_length: int) -> list[int]:
    """Starts of the windows a text is read in: 0, C // 2, C, ... until one reaches the end."""
    stride = window_stride(context_length)
    starts = [0]
    while starts[-1] + context_length < num_tokens:
        starts.append(starts[-1] + stride)
    return starts


def reading_starts(num_tokens: int, context_length: int) -> np.ndarray:
    """(T,) int: for each position, the start of the first window that holds it, its first readable key."""
    starts = np.asarray(window_starts(num_tokens, context_length))
    positions = np.arange(num_tokens)
    first = np.searchsorted(starts + context_length, positions, side="right")  # first window ending after t
    return starts[first]


# ----------------------------------------------------------------------------- measurements


@dataclass
class Relevance:
    token_ids: list[int]
    labels: list[str]  # readable text of each token (`attention_maps.visible`)
    context_length: int
    reach: np.ndarray  # (T,) int: query t reads keys reach[t]..t
    weights: np.ndarray  # (L, H, T, T) float32: query rows, key columns; 0 outside reach[t]..t
    losses: np.ndarray  # (T,) float64: loss of predicting token t + 1 at position t; NaN for the last
    token_relevance: np.ndarray  # (T, T) float64: rise in query t's loss without key j; NaN where unmeasured
    head_relevance: np.ndarray  # (L, H) float64: rise in the mean loss with that head zeroed
    mean_loss: float  # over the T - 1 predictions

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    def measured(self) -> np.ndarray:
        """(T, T) bool: the (query, key) pairs with a relevance: keys in reach, before a query
        that has a next token to predict."""
        return ~np.isnan(self.token_relevance)


def _chunk_size(model, window: int) -> int:
    """Variants per forward: logits (W * V) and one layer's scores (H * W * W) each."""
    c = model.config
    per_variant = window * (c.vocab_size + c.n_head * window)
    return max(1, CHUNK_ELEMENTS // per_variant)


def _windows(model, token_ids: list[int]):
    """Yield (start, x (1, W), y (1, W), owned window offsets) for each window of the text."""
    T, C = len(token_ids), model.config.context_length
    device = next(model.parameters()).device
    reach = reading_starts(T, C)
    ids = torch.tensor(token_ids + [IGNORE_INDEX], dtype=torch.long)  # the last token has no target
    for start in window_starts(T, C):
        end = min(start + C, T)
        owned = np.nonzero(reach[start:end] == start)[0]  # offsets of the queries measured here
        if len(owned):
            yield start, ids[start:end].unsqueeze(0).to(device), ids[start + 1:end + 1].unsqueeze(0).to(device), owned


def check_text(model, token_ids: list[int]) -> None:
    """A TinyattnError unless the text has a prediction to measure and fits the vocabulary."""
    if len(token_ids) < 2:
        raise TinyattnError(f"the text has {counted(len(token_ids), 'token')}: relevance needs at least 2 "
                            "(one to read, one to predict)")
    vocab = model.config.vocab_size
    if max(token_ids) >= vocab or min(token_ids) < 0:
        raise TinyattnError(f"token ids must lie in 0..{vocab - 1}, the model's vocabulary")


@contextmanager
def scaled_heads(model, head_mask: torch.Tensor) -> Iterator[None]:
    """Inside the block each head's output is multiplied by its factor in `head_mask` (0 removes it).

    head_mask: (n_layer, H) or (B, n_layer, H). The factor is applied where the heads meet,
    at the input of each layer's output projection (which mixes them), so a removed head is
    removed the same way on either attention path. Hooks, removed after: outside the block
    the model runs as it always does.
    """
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]

    def scale(factors):  # factors: (H,) or (B, H)
        def hook(projection, inputs):
            (y,) = inputs  # (B, T, C): the heads' outputs side by side, H blocks of D
            B, T, C = y.shape
            heads = y.view(B, T, -1, C // factors.size(-1))  # (B, T, H, D)
            return (heads * factors.view(-1, 1, factors.size(-1), 1).to(y.dtype)).view(B, T, C)
        return hook

    handles = [layer.output.register_forward_pre_hook(scale(head_mask[..., i, :]))
               for i, layer in enumerate(layers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def head_ablation(model, token_ids: list[int]) -> tuple[np.ndarray, float]:
    """(L, H) rise in the text's mean loss with each head zeroed, and the mean loss itself.

    One forward of L * H variants per window (chunked); pass the plain LanguageModel.
    """
    check_text(model, token_ids)
    c = model.config
    L, H = c.n_layer, c.n_head
    rises, total, count = np.zeros(L * H), 0.0, 0
    with evaluation_mode(model):
        for start, x, y, owned in _windows(model, token_ids):
            W = x.size(1)
            scored = torch.zeros(W, dtype=torch.bool, device=x.device)
            scored[torch.as_tensor(owned, device=x.device)] = True
            scored &= y[0] != IGNORE_INDEX  # (W,): the predictions this window measures
            clean = token_losses(model, x, y).double()[0][scored].sum()
            total, count = total + float(clean), count + int(scored.sum())
            chunk = _chunk_size(model, W)
            for first in range(0, L * H, chunk):
                n = min(chunk, L * H - first)
                head_mask = torch.ones(n, L * H, device=x.device)
                head_mask[torch.arange(n), torch.arange(first, first + n)] = 0.0  # variant i drops head first + i
                with scaled_heads(model, head_mask.view(n, L, H)):
                    ablated = token_losses(model, x.expand(n, W), y.expand(n, W)).double()  # (n, W)
                rises[first:first + n] += (ablated[:, scored].sum(1) - clean).cpu().numpy()
    return (rises / count).reshape(L, H), total / count


@torch.no_grad()
def compute_relevance(model, token_ids: list[int], labels: Optional[list[str]] = None) -> Relevance:
    """Weights, per-position losses, token ablation and head ablation of a text's tokens.

    Pass the plain LanguageModel (not a compiled or DDP wrapper); it runs in eval mode
    and is left in the mode it was in. Windows as the module docstring says.
    """
    check_text(model, token_ids)
    c = model.config
    T, L, H = len(token_ids), c.n_layer, c.n_head
    weights = np.zeros((L, H, T, T), dtype=np.float32)
    losses = np.full(T, np.nan)
    relevance = np.full((T, T), np.nan)
    with evaluation_mode(model):
        for start, x, y, owned in _windows(model, token_ids):
            W = x.size(1)
            out = model(x, need_weights=True).attention_weights  # per layer (1, H, W, W)
            window_weights = torch.stack([w[0] for w in out]).float().cpu().numpy()  # (L, H, W, W)
            for q in owned:
                weights[:, :, start + q, start:start + q + 1] = window_weights[:, :, q, :q + 1]
            clean = token_losses(model, x, y).double()[0]  # (W,), the path the ablations take
            has_target = (y[0] != IGNORE_INDEX).cpu().numpy()
            targets = owned[has_target[owned]]  # offsets of measured predictions
            losses[start + targets] = clean.cpu().numpy()[targets]
            if not len(targets):
                continue
            keys = np.arange(0, targets.max())  # the keys some measured query can read
            allowed = causal_mask(W, W, x.device)  # (W, W)
            chunk = _chunk_size(model, W)
            for first in range(0, len(keys), chunk):
                chunk_keys = torch.as_tensor(keys[first:first + chunk], device=x.device)
                n = len(chunk_keys)
                mask = allowed.repeat(n, 1, 1, 1)  # (n, 1, W, W)
                later = torch.arange(W, device=x.device).unsqueeze(0) > chunk_keys.unsqueeze(1)  # (n, W)
                mask[torch.arange(n), 0, :, chunk_keys] &= ~later  # key k hidden from the queries after it
                ablated = token_losses(model, x.expand(n, W), y.expand(n, W), mask=mask).double()  # (n, W)
                rise = (ablated - clean).cpu().numpy()  # (n, W): variant i, query q
                for i, key in enumerate(keys[first:first + chunk]):
                    queries = targets[targets > key]
                    relevance[start + queries, start + key] = rise[i, queries]
    heads, mean_loss = head_ablation(model, token_ids)
    labels = labels if labels is not None else [str(i) for i in token_ids]
    return Relevance(list(token_ids), labels, c.context_length, reading_starts(T, c.context_length),
                     weights, losses, relevance, heads, mean_loss)


def relevance_of_text(model, tokenizer, text: str) -> Relevance:
    """`compute_relevance` of `text`'s tokens, labelled with their visible text."""
    return relevance_of_tokens(model, tokenizer, tokenizer.encode(text))


def relevance_of_tokens(model, tokenizer, token_ids: list[int]) -> Relevance:
    """`relevance_of_text` of a text already encoded (a caller that needs its ids too)."""
    labels = [visible(tokenizer.token_text(i)) for i in token_ids]
    return compute_relevance(model, token_ids, labels)


# ----------------------------------------------------------------------------- weight against relevance


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of `values`, ties given the mean of the ranks they share."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")  # NaNs, each unequal to all, ranked in index order
    sorted_values = values[order]
    new = np.r_[True, sorted_values[1:] != sorted_values[:-1]]  # where each run of equal values starts
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(values)] - 1
    ranked = np.empty(len(values))
    ranked[order] = ((first + last) / 2 + 1)[np.cumsum(new) - 1]  # a run's ranks share their mean
    return ranked


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equal-length arrays; NaN if either is constant or too short."""
    return rank_correlation_with(b)(a)


def rank_correlation_with(b: np.ndarray):
    """rank_correlation(a, b) as a function of a, b ranked once: for one b against many a's."""
    if len(b) < 2:
        return lambda a: float("nan")
    rb = ranks(b)
    rb = rb - rb.mean()
    rb_squares = (rb ** 2).sum()

    def correlation(a: np.ndarray) -> float:
        ra = ranks(a)
        ra = ra - ra.mean()
        scale = np.sqrt((ra ** 2).sum() * rb_squares)
        return float((ra * rb).sum() / scale) if scale > 0 else float("nan")

    return correlation


@dataclass
class Agreement:
    """Spearman correlations between attention weight and relevance over the measured pairs."""
    pairs: int  # (query, earlier key) pairs with a relevance
    mean: float  # weight averaged over every layer and head
    by_layer: np.ndarray  # (L,): weight averaged over that layer's heads
    by_head: np.ndarray  # (L, H)


def agreement(rel: Relevance, query: Optional[int] = None, size: bool = False) -> Agreement:
    """How far weight and relevance rank the (query, key) pairs alike: over the text, or one query's keys.

    size: rank against |relevance|, how much masking the key changes the loss either way. Signed,
    a heavily weighted key whose masking helps the prediction counts against agreement; by size
    it counts for it: whether weight finds the keys that matter, not whether they help."""
    pairs = rel.measured()
    if query is not None:
        pairs = pairs & (np.arange(rel.num_tokens)[:, None] == query)
    relevance = np.abs(rel.token_relevance[pairs]) if size else rel.token_relevance[pairs]
    with_relevance = rank_correlation_with(relevance)  # ranked once for every head, layer and the mean
    by_head = np.array([[with_relevance(rel.weights[layer, head][pairs])
                         for head in range(rel.num_heads)] for layer in range(rel.num_layers)])
    by_layer = np.array([with_relevance(rel.weights[layer].mean(0)[pairs])
                         for layer in range(rel.num_layers)])
    mean = with_relevance(rel.weights.mean((0, 1))[pairs])
    return Agreement(int(pairs.sum()), mean, by_layer, by_head)


# ----------------------------------------------------------------------------- the table


def format_relevance_table(rel: Relevance, query: int, top: Optional[int] = None,
                           layers: Optional[list[int]] = None, heads: Optional[list[int]] = None) -> str:
    """For one query, each earlier token in reach: relevance, mean weight, each layer's and head's weight.

    Rows in text order, or the `top` whose removal changes the loss most (either way) first.
    Ends with the rank correlations of weight with relevance and with its size (`agreement`).
    """
    T = rel.num_tokens
    layers = list(range(rel.num_layers)) if layers is None else layers
    heads = list(range(rel.num_heads)) if heads is None else heads
    if np.isnan(rel.losses[query]):
        raise TinyattnError(f"query position {query} is the last token: it predicts nothing in the text, "
                            f"so nothing can be relevant to it (choose a position 0..{T - 2})")
    keys = np.arange(rel.reach[query], query)
    if top is not None:
        keys = keys[np.argsort(-np.abs(rel.token_relevance[query, keys]), kind="stable")][:top]
    mean = rel.weights.mean((0, 1))[query]  # (T,)
    label_width = max([len(rel.labels[k]) for k in keys] + [5])
    head_columns = [(layer, head) for layer in layers for head in heads]
    lines = [f"query {rel.labels[query]} at position {query} (of {T} tokens) predicts "
             f"{rel.labels[query + 1]} with loss {rel.losses[query]:.3f} nats; it reads keys "
             f"{rel.reach[query]}..{query}",
             "relevance = rise in that loss, in nats, when the key is masked out of attention in every "
             "layer; weights: mean over every head" + (", each layer's mean" if layers else "")
             + (", then each head (LxHy)" if head_columns else ""),
             f"{'pos':>4} {'token':<{label_width}} {'relevance':>9} {'weight':>6}  "
             + " ".join(f"{f'L{layer}':>5}" for layer in layers) + "  "
             + " ".join(f"{f'L{layer}H{head}':>5}" for layer, head in head_columns)]
    for key in keys:
        cells = [f"{rel.weights[layer, :, query, key].mean():5.3f}" for layer in layers]
        head_cells = [f"{rel.weights[layer, head, query, key]:5.3f}" for layer, head in head_columns]
        lines.append(f"{key:>4} {rel.labels[key]:<{label_width}} {rel.token_relevance[query, key]:+9.3f} "
                     f"{mean[key]:6.3f}  " + " ".join(cells) + "  " + " ".join(head_cells))
    for size, what in ((False, "relevance"), (True, "|relevance| (how much the key matters, either way)")):
        here, text = agreement(rel, query, size), agreement(rel, size=size)
        by_layer = " ".join(f"L{layer} {_correlation(value)}" for layer, value in enumerate(text.by_layer))
        lines.append(f"rank correlation (Spearman) of weight with {what}: this query's {here.pairs} keys "
                     f"{_correlation(here.mean)} (mean weight); the whole text's {text.pairs} pairs "
                     f"{_correlation(text.mean)}, by layer {by_layer}")
    return "\n".join(lines)


def _correlation(value: float) -> str:
    """A rank correlation as the table prints it; n/a, as the explorer says, where there is none
    (NaN: fewer than two pairs, or weights or relevances all alike)."""
    return "n/a" if np.isnan(value) else f"{value:+.2f}"


def format_head_ablation(rel: Relevance) -> str:
    """The (L, H) grid of head ablation as text, the largest rise marked."""
    lines = [f"head ablation: rise in the mean loss ({rel.mean_loss:.3f} nats over {rel.num_tokens - 1} "
             "predictions) with one head's output zeroed",
             "layer " + " ".join(f"{f'head {h}':>8}" for h in range(rel.num_heads))]
    for layer in range(rel.num_layers):
        lines.append(f"{layer:>5} " + " ".join(f"{v:+8.3f}" for v in rel.head_relevance[layer]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- training


def head_ablation_image(rises: np.ndarray) -> np.ndarray:
    """The (L, H) grid as an image: a row per layer, a HEAD_ABLATION_CELL-pixel cell per head.

    Red where zeroing the head raised the loss, blue where it lowered it, white for no
    change; full colour at +-HEAD_ABLATION_FULL_SCALE nats, the same at every step.
    """
    full = HEAD_ABLATION_FULL_SCALE
    cells = colormap(np.asarray(rises), -full, full, colors=HEAD_ABLATION_COLORS)  # (L, H, 3)
    rows = [tile([scale_up(cell[None, None], HEAD_ABLATION_CELL) for cell in layer], len(layer),
                 HEAD_ABLATION_GAP, (128, 128, 128)) for layer in cells]
    return tile(rows, 1, HEAD_ABLATION_GAP, (128, 128, 128))


def log_head_ablation_to_tensorboard(writer, model, tokenizer, text: str, *, step: int,
                                     tag: str = "head_ablation") -> None:
    """Add `<tag>/grid`, the head-ablation image of `text`, at `step`: L * H short forwards, batched.

    A text of fewer than 2 tokens predicts nothing: no image.
    """
    token_ids = tokenizer.encode(text)
    if len(token_ids) < 2:
        return
    rises, _ = head_ablation(model, token_ids)
    writer.add_image(f"{tag}/grid", head_ablation_image(rises), step, dataformats="HWC")
