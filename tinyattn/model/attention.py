"""Causal self-attention, the textbook part: scores, the mask, softmax, the mix of values."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.config import ModelConfig
from tinyattn.model.kv_cache import KVCache

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
              mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out step by step.

    q: (B, H, Tq, D) queries; k, v: (B, H, Tk, D) keys and values.
    mask: boolean, broadcastable to (B, H, Tq, Tk), True where a query may attend to a
    key; None allows every pair. Returns the output (B, H, Tq, D) and the attention
    weights (B, H, Tq, Tk), whose rows sum to 1 and are exactly 0 where masked.
    dropout_p (training only) drops weights before the values are mixed, as the fused
    kernel does; the weights returned are the ones before dropout.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0 after softmax
    # softmax accumulates in fp32 whatever the input dtype, so bf16 scores stay accurate.
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk), rows sum to 1
    mixing = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    output = mixing @ v  # (B, H, Tq, D): each query's weighted mix of the values
    return output, weights


# ----------------------------------------------------------------------------- 2. positions


def rotary_tables(head_dim: int, max_positions: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (max_positions, head_dim / 2) for rotary position embedding."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # (D/2,)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # (T, D/2)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[..., i], x[..., i + D/2]) by its position's angle.

    x: (B, H, T, D); cos, sin: (T, D/2) for the positions of those T tokens. The dot
    product of a rotated query and key then depends only on their relative distance.
    The rotation runs in x's dtype: under bf16 the queries and keys are already bf16,
    and rotating them in fp32 would add two conversions per call for no accuracy.
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)  # (B, H, T, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D)


# ----------------------------------------------------------------------------- 3. heads


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with RoPE, optional grouped-query attention, a KV cache."""

    def __init__(self, config: ModelConfig, fused: bool = True):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.head_dim = config.head_dim
        kv_width = self.n_kv_head * self.head_dim
        # The query, key and value projections are three matrices stacked into one, so
        # one larger matmul computes all three (faster than three small ones).
        self.qkv_split = (config.n_embd, kv_width, kv_width)
        self.qkv = nn.Linear(config.n_embd, sum(self.qkv_split), bias=False)
        self.output = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.dropout = config.dropout
        self.fused = fused  # the path used when no weights are asked for (model.attention)
        # QK-norm: each head's queries and keys scaled to unit RMS (with a learned gain),
        # so a score cannot grow just because q or k grew; lets a larger lr train stably.
        self.q_norm = nn.RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, config.norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None,
                start_pos: int = 0, need_weights: bool = False,
                positions: Optional[torch.Tensor] = None, head_mask: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: (B, T, C) at positions start_pos..start_pos+T-1; cos, sin: (T, D/2).

        mask: boolean (Tq, Tk) or broadcastable to (B, H, Tq, Tk), True = allowed;
        None means causal. Returns (B, T, C) and, if need_weights, (B, H, T, Tk).
        head_mask: (H,) or (B, H) factors for each head's output, 0 removes a head
        (ablation); None keeps every head whole.
        positions: a (T,) tensor instead of start_pos: k and v are written into kv_cache
        there (`KVCache.write`) and attention reads every slot, so Tk = the cache's
        max_len and the mask must hide the slots after each query's position.
        """
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.qkv_split, dim=-1)  # (B, T, C), (B, T, Hkv*D) x 2
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # over D, per head and position
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv_cache is not None and positions is not None:
            k, v = kv_cache.write(positions, k, v)  # (B, Hkv, Tk, D) with Tk = max_len
        elif kv_cache is not None:
            k, v = kv_cache.update(start_pos, k, v)  # (B, Hkv, Tk, D) with Tk = start_pos + T
        Tk = k.size(2)
        dropout_p = self.dropout if self.training else 0.0

        # A step over the whole static cache (positions) takes the explicit path too: its two
        # small matmuls, mask and softmax compile into a few fused loops, where the fused
        # kernel stays one opaque call per layer, slower on the CPU for a single query.
        if need_weights or not self.fused or positions is not None:
            # Explicit path: every key/value head serves n_head / n_kv_head query heads.
            group = self.n_head // self.n_kv_head
            if group > 1:
                k = k.repeat_interleave(group, dim=1)  # (B, H, Tk, D)
                v = v.repeat_interleave(group, dim=1)  # (B, H, Tk, D)
            allowed = causal_mask(T, Tk, x.device) if mask is None else mask
            y, weights = attention(q, k, v, allowed, dropout_p)  # (B, H, T, D), (B, H, T, Tk)
            weights = weights if need_weights else None
        else:
            # Fused path: same arithmetic, one kernel, never materialises (T, Tk) weights
            # in memory on the flash/efficient backends. is_causal assumes Tq == Tk, so a
            # cached step with earlier keys passes the explicit causal mask instead.
            is_causal = mask is None and T == Tk and T > 1
            if mask is None and not is_causal and T > 1:
                mask = causal_mask(T, Tk, x.device)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p,
                enable_gqa=self.n_kv_head != self.n_head)  # (B, H, T, D)
            weights = None
        if head_mask is not None:
            # Both paths meet here, so an ablated head is removed the same way in either:
            # its output is scaled before the output projection mixes the heads.
            y = y * head_mask.view(-1, self.n_head, 1, 1).to(y.dtype)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C): heads side by side again
        return self.output(y), weights
