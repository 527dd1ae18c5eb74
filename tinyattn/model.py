"""A decoder-only language model built from causal self-attention, in textbook order.

Read top to bottom, this file is the explanation:

1. `attention`: scores every query against every key, divides by sqrt(d_k), sets
   excluded positions to -inf, takes the softmax (each row sums to 1) and mixes the
   values with those weights.
2. `apply_rotary`: rotary position embedding (RoPE), which tells attention where each
   token sits by rotating query and key vectors by an angle that grows with position.
3. `CausalSelfAttention`: learned query/key/value projections, several heads (with
   optionally fewer key/value heads: grouped-query attention), the causal mask, an
   output projection. Two paths compute the same numbers (tested): the fused kernel
   (`F.scaled_dot_product_attention`), which never stores the (T, T) weights, and the
   explicit one above, used when the attention weights are asked for and wherever
   `model.attention` chooses it (on some CPUs its plain matmuls train faster).
4. `SwiGLU` feed-forward network, `Block` (pre-norm residual), `LanguageModel`.

Departures from the original 2017 transformer, all standard in current small models:
RMSNorm instead of LayerNorm, RoPE instead of learned absolute positions, SwiGLU
instead of a ReLU MLP, no biases, pre-norm residual blocks, and an output head tied to
the token embedding. This is the Llama architecture. Two options go beyond it and are
off by default: QK-norm (`model.qk_norm`, RMSNorm on queries and keys, as in Qwen3)
and logit soft-capping (`model.logit_softcap`, as in Gemma 2).

Shapes: B batch, T sequence length, C model width (n_embd), H query heads, Hkv key/value
heads, D head width (C / H), V vocabulary size.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.config import ModelConfig
from tinyattn.kv_cache import KVCache

IGNORE_INDEX = -100  # targets with this value (padding) do not count in the loss


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (no dropout) inside the block; the model's own mode is restored after,
    so sampling or measuring in the middle of training leaves training as it was."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


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


# ----------------------------------------------------------------------------- 4. the model


class SwiGLU(nn.Module):
    """Feed-forward network: down(silu(gate(x)) * up(x)), applied to each position alone.

    The gate and up projections are stacked into one matrix (one matmul) and split.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.n_embd, 2 * config.hidden_dim, bias=False)
        self.down = nn.Linear(config.hidden_dim, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        return self.down(F.silu(gate) * up)  # (B, T, C)


class Block(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, fused_attention: bool = True):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.n_embd, config.norm_eps)
        self.attention = CausalSelfAttention(config, fused_attention)
        self.mlp_norm = nn.RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = SwiGLU(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, cos, sin, mask=None, kv_cache=None, start_pos=0, need_weights=False,
                positions=None, head_mask=None):
        attended, weights = self.attention(self.attention_norm(x), cos, sin, mask, kv_cache,
                                           start_pos, need_weights, positions, head_mask)
        x = x + self.dropout(attended)  # (B, T, C)
        x = x + self.dropout(self.mlp(self.mlp_norm(x)))  # (B, T, C)
        return x, weights


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # (B, T, V), always
    loss: Optional[torch.Tensor]  # mean cross-entropy when targets were given, else None
    attention_weights: Optional[list[torch.Tensor]]  # per layer (B, H, T, Tk) when asked for


class LanguageModel(nn.Module):
    """Token embedding -> n_layer blocks -> final norm -> head over the vocabulary.

    attention: the path the blocks use when no weights are asked for, "fused" or
    "explicit"; None takes `config.attention`, where "auto" means fused (the training
    loop resolves "auto" for its hardware with `train.attention_path`).
    """

    def __init__(self, config: ModelConfig, attention: Optional[str] = None):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer) before building")
        self.config = config
        attention = attention or config.attention
        if attention not in ("auto", "fused", "explicit"):
            raise ValueError(f"attention {attention!r}: expected auto, fused or explicit")
        self.attention_path = "explicit" if attention == "explicit" else "fused"
        fused = self.attention_path == "fused"
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, fused) for _ in range(config.n_layer))
        self.final_norm = nn.RMSNorm(config.n_embd, config.norm_eps)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.token_embedding.weight  # one matrix reads and writes tokens
        cos, sin = rotary_tables(config.head_dim, config.context_length, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)  # (context_length, D/2)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """The one place parameters get their initial values.

        Linear matrices are drawn from N(0, 0.02²) (GPT-2); the two projections that
        write into the residual stream (attention output, MLP down) get std
        0.02 / sqrt(2 * n_layer), so the residual's variance does not grow with depth.
        Norm gains start at 1. The token embedding gets std 1 / n_embd: with a tied
        head, a token's logit for itself starts at about n_embd * std (the final norm
        scales its embedding to unit size), which GPT-2's 0.02 would make 7.7 at width
        384. At 1 / n_embd it is 1, every logit starts near 0 and the loss at
        initialisation is close to ln(V), the loss of a uniform guess. Adam moves the
        embedding by about lr per step whatever its scale, so training is not slowed.
        An untied head starts at zero for the same reason: every logit 0, loss ln(V).

        With `zero_init_projections` the two residual-writing projections start at zero
        instead (modded-nanogpt, nanochat): every block starts as the identity and the
        residual stream is the embedding alone, so depth is added as it proves useful.
        Their gradients are not zero (the inputs are not), so they train from step 1.
        """
        c = self.config
        residual_std = 0.0 if c.zero_init_projections else 0.02 / math.sqrt(2 * c.n_layer)
        for name, param in self.named_parameters():
            if param.dim() < 2:
                param.fill_(1.0)  # RMSNorm gains
            elif name == "token_embedding.weight":
                param.copy_(torch.randn(param.shape) / c.n_embd)
            elif name == "head.weight":  # only listed when untied
                param.zero_()
            elif name.endswith(("attention.output.weight", "mlp.down.weight")):
                param.copy_(torch.randn(param.shape) * residual_std)
            else:
                param.copy_(torch.randn(param.shape) * 0.02)

    def num_parameters(self, exclude_embedding: bool = False) -> int:
        """Parameter count; a tied head is counted once."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            total -= self.token_embedding.weight.numel()
        return total

    def new_kv_caches(self, batch_size: int, max_len: Optional[int] = None,
                      dtype: Optional[torch.dtype] = None) -> list[KVCache]:
        """One preallocated cache per layer, on the model's device."""
        c = self.config
        weight = self.token_embedding.weight
        return [KVCache(batch_size, c.kv_heads, max_len or c.context_length, c.head_dim,
                        dtype=dtype or weight.dtype, device=weight.device)
                for _ in range(c.n_layer)]

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, *,
                mask: Optional[torch.Tensor] = None, kv_caches: Optional[list[KVCache]] = None,
                start_pos: int = 0, positions: Optional[torch.Tensor] = None,
                need_weights: bool = False, head_mask: Optional[torch.Tensor] = None) -> ModelOutput:
        """idx: (B, T) token ids at positions start_pos..start_pos+T-1.

        targets: (B, T) next-token ids (IGNORE_INDEX where no loss should count).
        mask: boolean attention mask of allowed positions (see `attention`); None is causal.
        A (B, 1, T, T) mask gives each sequence its own: causal with one key's column
        False removes that token from every later token's attention, in every layer
        (token ablation, `tinyattn.relevance`).
        kv_caches: per-layer caches to read earlier keys/values from and write these to.
        positions: with kv_caches, a (T,) int64 tensor of the tokens' positions in place of
        start_pos, for decoding with shapes that never change (gpt-fast): RoPE rows are
        gathered at these positions, keys and values are written into the caches there, and
        each query attends over every cache slot up to its own position. A decode step
        compiled for one token then serves every position. Positions are not checked.
        need_weights: use the explicit attention path and return its weights.
        head_mask: (n_layer, H) or (B, n_layer, H) factors for each head's output, 0 zeroes
        that head (head ablation); None keeps every head.
        """
        B, T = idx.shape
        if positions is not None:
            if kv_caches is None or mask is not None:
                raise ValueError("positions needs kv_caches and builds its own mask")
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, D/2)
            slots = torch.arange(kv_caches[0].max_len, device=idx.device)  # (Tk,)
            mask = slots <= positions.unsqueeze(1)  # (T, Tk): causal, written slots only
        elif start_pos + T > self.config.context_length:
            raise ValueError(f"positions {start_pos}..{start_pos + T - 1} exceed the context "
                             f"length {self.config.context_length}")
        else:
            cos = self.rope_cos[start_pos:start_pos + T]  # (T, D/2)
            sin = self.rope_sin[start_pos:start_pos + T]
        x = self.dropout(self.token_embedding(idx))  # (B, T, C)
        all_weights = [] if need_weights else None
        for i, block in enumerate(self.blocks):
            cache = kv_caches[i] if kv_caches is not None else None
            heads = head_mask[..., i, :] if head_mask is not None else None  # (H,) or (B, H)
            x, weights = block(x, cos, sin, mask, cache, start_pos, need_weights, positions, heads)
            if need_weights:
                all_weights.append(weights)
        logits = self.head(self.final_norm(x))  # (B, T, V)
        if self.config.logit_softcap is not None:
            # Soft-capping squashes logits smoothly into (-cap, cap): no single logit can
            # run away, which steadies training at high learning rates.
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T),
                                   ignore_index=IGNORE_INDEX)
        return ModelOutput(logits, loss, all_weights)

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 per parameter (forward + backward) plus attention.

        Attention scores and the weighted sum cost 2 * T * C multiply-adds, 4 * T * C
        FLOPs, per token per layer in the forward pass, three times that with the
        backward (PaLM appendix B; T the full context, as is usual for this estimate).
        The embedding lookup costs nothing, but a tied head still does its matmul.
        """
        c = self.config
        n = self.num_parameters()
        if not c.tie_embeddings:
            n -= self.token_embedding.weight.numel()
        return 6 * n + 12 * c.n_layer * c.context_length * c.n_embd
