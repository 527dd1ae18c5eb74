"""Causal self-attention, the textbook part: scores, the mask, softmax, the mix of values.

Read top to bottom, this file is the explanation:

1. `attention`: scores every query against every key, divides by sqrt(d_k), sets
   excluded positions to -inf, takes the softmax (each row sums to 1) and mixes the
   values with those weights.
2. `apply_rotary`: rotary position embedding (RoPE), which tells attention where each
   token sits by rotating query and key vectors by an angle that grows with position.
3. `CausalSelfAttention`: learned query/key/value projections, several heads (with
   optionally fewer key/value heads: grouped-query attention), the causal mask, an
   output projection, optionally after a gate on each output element (`gated`, from the
   block's input: `model.attention_gate`). Two paths compute the same numbers (tested): the fused kernel
   (`F.scaled_dot_product_attention`), which never stores the (T, T) weights, and the
   explicit one above, used wherever `model.attention` chooses it (on some CPUs its
   plain matmuls train faster), for a decode step over a static cache, and while the
   weights are recorded.
4. `recording_attention_weights`: a context manager that hands out every layer's
   weights (the attention maps, relevance); the layer only calls a hook that is unset
   the rest of the time, so a training forward pays nothing for it.

Departures from the original 2017 transformer's attention, all standard in current small
models: RoPE, which rotates queries and keys inside attention, instead of the fixed sinusoidal
position encodings the 2017 transformer added to the embeddings (GPT-2 learned its own), no
biases, optionally QK-norm (`model.qk_norm`, RMSNorm on queries and keys, as in Qwen3) and
optionally the output gate (`model.attention_gate`, as in Qwen3.5).

Shapes: B batch, T sequence length (Tq queries, Tk keys where they differ), C model width
(n_embd), H query heads, Hkv key/value heads, D head width (C / H).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.config import ModelConfig
from tinyattn.model.kv_cache import CacheWrite

# ----------------------------------------------------------------------------- 1. attention


def causal_mask(num_queries: int, num_keys: int, device=None) -> torch.Tensor:
    """Boolean (Tq, Tk) mask of allowed positions: True where the key is not in the future.

    The queries are the last `num_queries` positions of the `num_keys` keys (they differ
    when earlier keys come from a KV cache), so query i sits at position
    num_keys - num_queries + i and may look at keys 0..that position.
    """
    offset = num_keys - num_queries
    query_pos = torch.arange(num_queries, device=device).unsqueeze(1) + offset  # (Tq, 1)
    key_pos = torch.arange(num_keys, device=device).unsqueeze(0)  # (1, Tk)
    return key_pos <= query_pos  # (Tq, Tk)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, *, scaled: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out step by step.

    q: (B, H, Tq, D) queries; k, v: (B, H, Tk, D) keys and values.
    mask: boolean, broadcastable to (B, H, Tq, Tk), True where a query may attend to a
    key; None allows every pair. Returns the output (B, H, Tq, D) and the attention
    weights (B, H, Tq, Tk), whose rows sum to 1 and are exactly 0 where masked.
    dropout_p (training only) drops weights before the values are mixed, as the fused
    kernel does; the weights returned are the ones before dropout.
    scaled: False leaves the scores undivided (model.scale_scores, tinyattn lab scaling's experiment).
    """
    d_k = q.size(-1)
    divisor = math.sqrt(d_k) if scaled else 1.0
    scores = q @ k.transpose(-2, -1) / divisor  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0 after softmax
    # softmax accumulates in fp32 whatever the input dtype, so bf16 scores stay accurate.
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk), rows sum to 1
    mixing = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    output = mixing @ v  # (B, H, Tq, D): each query's weighted mix of the values
    return output, weights


# ----------------------------------------------------------------------------- 2. positions


def rotary_tables(head_dim: int, max_positions: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (max_positions, head_dim / 2) for rotary position embedding.

    Computed in fp32 as transformers computes its own, so that an exported model's logits match
    transformers' at every position (float64 angles drift from them as positions grow; llama.cpp
    builds its angles step by step in fp32, within fp32's rounding of both)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (D/2,)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) by its position's angle.

    x: (B, H, T, D); cos, sin: (T, D/2) for the positions of those T tokens. The dot
    product of a rotated query and key then depends on the two vectors and, of their positions,
    only on the offset between them (m - n), not on where they stand.
    The rotation runs in x's dtype: under bf16 the queries and keys are already bf16,
    and rotating them in fp32 would add two conversions per call for no accuracy.
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D)


def gated(y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """y * sigmoid(gate), elementwise; y: (B, T, C), the heads' outputs side by side; gate:
    (B, T, C), computed from the block's input x by a (C, C) matrix (model.attention_gate), or
    by that matrix as the product of two thin ones (model.attention_gate_rank).

    Softmax's weights sum to 1, so a head always passes on some mix of values, even at a
    position where no key matches what its query looks for: it can only park the weight on
    a key that carries little (often the first). The gate, between 0 and 1 for each element,
    lets the position's own input decide how much of each head's output to pass on, down to
    nothing. It is the gated attention of Qiu et al. 2025 ("Gated Attention for Large Language
    Models"), after the attention and before the output projection, as Qwen3.5 computes it.
    """
    return y * torch.sigmoid(gate.to(y.dtype))


# ----------------------------------------------------------------------------- 3. heads


def gate_matrix(gate_out: torch.Tensor, gate_in: torch.Tensor) -> torch.Tensor:
    """The (C, C) matrix of a gate of rank r (model.attention_gate_rank): gate_out (C, r) @ gate_in
    (r, C), computed in fp32 and given in gate_in's dtype: what generation merges and exports write."""
    return (gate_out.float() @ gate_in.float()).to(gate_in.dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with RoPE, optional grouped-query attention, a KV cache."""

    def __init__(self, config: ModelConfig, fused: bool = True):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.head_dim = config.head_dim
        # The query, key and value projections are three matrices stacked into one, so
        # one larger matmul computes all three (faster than three small ones); with
        # model.attention_gate the gate's (C, C) matrix is stacked fourth.
        self.qkv_split = config.qkv_rows
        self.qkv = nn.Linear(config.n_embd, sum(self.qkv_split), bias=False)
        self.output = nn.Linear(config.n_embd, config.n_embd, bias=False)
        # With model.attention_gate_rank r the gate's matrix is instead gate_out @ gate_in, (C, r) @
        # (r, C): 2rC weights and multiply-adds a position, not C x C. The product is a (C, C) matrix
        # of rank r at most (`merge_gate`), which is how generation and export use it.
        rank = config.attention_gate_rank
        self.gate_in = nn.Linear(config.n_embd, rank, bias=False) if rank else None
        self.gate_out = nn.Linear(rank, config.n_embd, bias=False) if rank else None
        # On the attention weights; model.attention_dropout sets it apart from the residual's.
        self.dropout = config.weights_dropout
        self.causal = config.causal  # False (tinyattn lab causal): no mask when none is given
        self.scaled = config.scale_scores  # False (tinyattn lab scaling): scores not divided by sqrt(d_k)
        self.fused = fused  # which path: the kernel, or the explicit matmuls (model.attention)
        # Called with each explicit forward's weights (B, H, Tq, Tk); set only by
        # `recording_attention_weights`, None (nothing to call) the rest of the time.
        self.weights_hook: Optional[Callable[[torch.Tensor], None]] = None
        # QK-norm: each head's queries and keys scaled to unit RMS (with a learned gain),
        # so a score cannot grow just because q or k grew; lets a larger lr train stably.
        self.q_norm = nn.RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor] = None, cache: Optional[CacheWrite] = None) -> torch.Tensor:
        """x: (B, T, C); cos, sin: (T, D/2), the rotary angles of its T positions. Returns (B, T, C).

        mask: boolean (Tq, Tk) or broadcastable to (B, H, Tq, Tk), True = allowed; None is causal
        (or no mask at all for a model.causal false model, tinyattn lab causal's experiment).
        cache: this layer's `CacheWrite`: k and v are stored there, and the queries attend over
        every key it gives back, under its mask when it gives one.
        """
        B, T, C = x.shape
        # A query says what a position looks for, a key what it offers, a value what it passes on
        # when its key matches. q.k sums D products, so for entries of unit variance its variance
        # is D: scores are divided by sqrt(d_k) = sqrt(D) to keep their spread near 1 at any head
        # width, or softmax would saturate into one-hot rows whose gradients vanish (`tinyattn lab
        # scaling` measures both, docs/LAB.md).
        q, k, v, *gate = self.qkv(x).split(self.qkv_split, dim=-1)  # (B, T, C), (B, T, Hkv*D) x 2
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if self.q_norm is not None:
            q, k = norm_heads(self.q_norm, q), norm_heads(self.k_norm, k)  # over D, per head and position
        if cache is not None:  # a cache may keep more precision than the weights (decoder.cache_dtype):
            q, k = q.to(cache.dtype), k.to(cache.dtype)  # RoPE and attention then run in its dtype
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v, cache_mask = cache.store(k, v)  # (B, Hkv, Tk, D) each, in the cache's dtype
            mask = mask if cache_mask is None else cache_mask
        # A caller's mask may leave a query no key (left padding); a cache's never does.
        padded = mask is not None and (cache is None or cache_mask is None)
        dropout_p = self.dropout if self.training else 0.0
        # A step over the whole static cache compiles better explicit (`CacheWrite.reads_every_slot`).
        if self.fused and not (cache is not None and cache.reads_every_slot):
            y = self.fused_attention(q, k, v, mask, dropout_p)  # (B, H, T, D)
        else:
            y = self.explicit_attention(q, k, v, mask, dropout_p, padded=padded)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): heads side by side again
        if cache is not None:
            y = y.to(x.dtype)  # back from the cache's dtype
        if gate:
            y = gated(y, gate[0])
        elif self.gate_in is not None:
            y = gated(y, self.gate_out(self.gate_in(x)))  # (B, T, C) -> (B, T, r) -> (B, T, C)
        return self.output(y)

    def merge_gate(self) -> None:
        """Turn a gate of rank r (gate_in, gate_out) into the gate's own (C, C) matrix, their product,
        stacked fourth in qkv as a model.attention_gate model holds it: the same function in two
        matmul calls fewer a layer, which the eager decode step computes (`DecodeStep`)."""
        if self.gate_in is None:
            return
        with torch.no_grad():
            gate = gate_matrix(self.gate_out.weight, self.gate_in.weight)  # (C, C)
            weight = torch.cat([self.qkv.weight, gate.to(self.qkv.weight.dtype)])
        self.qkv = nn.Linear(weight.size(1), weight.size(0), bias=False, device=weight.device,
                             dtype=weight.dtype)
        self.qkv.weight.data.copy_(weight)
        self.qkv_split = (*self.qkv_split, gate.size(0))
        self.gate_in = self.gate_out = None

    def explicit_attention(self, q, k, v, mask, dropout_p: float, *, padded: bool = False) -> torch.Tensor:
        """`attention` itself. q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D). Returns (B, H, Tq, D).
        padded: `mask` is a caller's, which may leave a query no key at all."""
        group = self.n_head // self.n_kv_head  # query heads served by each key/value head
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, H, Tk, D)
            v = v.repeat_interleave(group, dim=1)  # (B, H, Tk, D)
        allowed = causal_mask(q.size(2), k.size(2), q.device) if mask is None and self.causal else mask
        empty = None
        if padded:  # a query the mask leaves no key (a padded row): softmax over -inf
            empty = ~mask.any(dim=-1, keepdim=True)  # alone is NaN; such a row reads every key, then
            allowed = mask | empty  # its output and weights are zeroed, as the fused kernel gives
        y, weights = attention(q, k, v, allowed, dropout_p, scaled=self.scaled)  # (B,H,Tq,D), (B,H,Tq,Tk)
        if empty is not None:
            y, weights = y.masked_fill(empty, 0.0), weights.masked_fill(empty, 0.0)
        if self.weights_hook is not None:
            self.weights_hook(weights)
        return y

    def fused_attention(self, q, k, v, mask, dropout_p: float) -> torch.Tensor:
        """The same arithmetic in one kernel, which never materialises the (Tq, Tk) weights in
        memory on the flash/efficient backends. Shapes as `explicit_attention`'s."""
        T, Tk = q.size(2), k.size(2)
        # is_causal assumes Tq == Tk, so a cached step with earlier keys passes the
        # explicit causal mask instead.
        is_causal = self.causal and mask is None and T == Tk and T > 1
        if self.causal and mask is None and not is_causal and T > 1:
            mask = causal_mask(T, Tk, q.device)
        scale = None if self.scaled else 1.0  # None: the kernel's own 1 / sqrt(D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              dropout_p=dropout_p, scale=scale,
                                              enable_gqa=self.n_kv_head != self.n_head)


def norm_heads(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """QK-norm of x (B, H, T, D) in x's dtype. Under bf16 autocast the projections give bf16
    while the gain is kept in fp32; the gain is cast to x's dtype so torch's fused kernel
    runs (mixed dtypes fall back to a composite path, with a warning on every call)."""
    return F.rms_norm(x, norm.normalized_shape, norm.weight.to(x.dtype), norm.eps)


# ----------------------------------------------------------------------------- 4. looking inside


@contextmanager
def recording_attention_weights(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Inside the block every attention layer of `model` takes the explicit path and appends
    its weights, (B, H, Tq, Tk), to the list this yields: one entry per layer per forward,
    in the order they ran. Each layer's path and hook are restored after."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    saved = [(layer.fused, layer.weights_hook) for layer in layers]
    recorded: list[torch.Tensor] = []
    for layer in layers:
        layer.fused, layer.weights_hook = False, recorded.append
    try:
        yield recorded
    finally:
        for layer, (fused, hook) in zip(layers, saved):
            layer.fused, layer.weights_hook = fused, hook
