"""A decoder-only language model built from causal self-attention, in textbook order.

Attention itself (scores, the mask, softmax, RoPE, the heads) is `tinyattn.model.attention`;
this file puts it to work, top to bottom:

1. `SwiGLU` feed-forward network, applied to each position alone.
2. `Block`: pre-norm residual, x + attention(norm(x)), then x + mlp(norm(x)).
3. `LanguageModel`: token embedding, n_layer blocks (`hidden_states`), final norm, a head over
   the vocabulary (`head_logits`); the one place for initialisation (`init_weights`); per-layer
   KV caches for decoding (`new_kv_caches`, `tinyattn.model.kv_cache`), and the logits after a
   prompt's last token alone (`next_token_logits`).

Departures from the original 2017 transformer, all standard in current small models:
RMSNorm instead of LayerNorm, RoPE instead of sinusoidal absolute positions, SwiGLU
instead of a ReLU MLP, no biases, and pre-norm residual blocks (the 2017 model normalised
after each residual sum). As there, the output head shares the token embedding's matrix by
default (`model.tie_embeddings`). This is the Llama architecture. Two options go beyond it and are
off by default: QK-norm (`model.qk_norm`, RMSNorm on queries and keys, as in Qwen3)
and logit soft-capping (`model.logit_softcap`, as in Gemma 2).

Shapes: B batch, T sequence length, C model width (n_embd), H query heads, Hkv key/value
heads, D head width (C / H), V vocabulary size.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.config import ATTENTION_PATHS, ModelConfig
from tinyattn.model.attention import CausalSelfAttention, recording_attention_weights, rotary_tables
from tinyattn.model.dropout import Dropout
from tinyattn.model.kv_cache import CacheWrite, KVCache, cache_writes

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


# ----------------------------------------------------------------------------- the model


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
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor] = None, cache: Optional[CacheWrite] = None) -> torch.Tensor:
        """x: (B, T, C) -> (B, T, C); the options are `CausalSelfAttention.forward`'s."""
        attended = self.attention(self.attention_norm(x), cos=cos, sin=sin, mask=mask, cache=cache)
        x = x + self.dropout(attended)  # (B, T, C)
        x = x + self.dropout(self.mlp(self.mlp_norm(x)))  # (B, T, C)
        return x


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # (B, T, V), always
    loss: Optional[torch.Tensor]  # mean cross-entropy when targets were given, else None
    attention_weights: Optional[list[torch.Tensor]]  # per layer (B, H, T, Tk) when need_weights


class LanguageModel(nn.Module):
    """Token embedding -> n_layer blocks -> final norm -> head over the vocabulary.

    attention: the path the blocks use when no weights are asked for, "fused" or
    "explicit"; None takes `config.attention`, where "auto" means fused (the
    trainer resolves "auto" for its hardware with `attention_path.attention_path`).
    """

    def __init__(self, config: ModelConfig, attention: Optional[str] = None):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer) before building")
        self.config = config
        attention = attention or config.attention
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention {attention!r}: expected one of {', '.join(ATTENTION_PATHS)}")
        self.attention_path = "explicit" if attention == "explicit" else "fused"
        fused = self.attention_path == "fused"
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = Dropout(config.dropout)
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

    def set_dropout(self, p: float) -> None:
        """Dropout p on the embedding and every residual branch from the next forward on (the
        table by passes chooses it, `train.dropout_by_passes`). The attention weights keep theirs:
        the attention path was chosen for it."""
        for module in (self.dropout, *(block.dropout for block in self.blocks)):
            module.p = p

    def merge_attention_gates(self) -> None:
        """Every layer's gate of rank r (model.attention_gate_rank) as the gate's own (C, C) matrix,
        their product (`CausalSelfAttention.merge_gate`), and the config saying so: the model a
        Qwen3.5 export describes, for generation. Changes the model in place."""
        if self.config.attention_gate_rank is None:
            return
        for block in self.blocks:
            block.attention.merge_gate()
        self.config = dataclasses.replace(self.config, attention_gate_rank=None)

    def stacked_matrices(self, by_matrix: bool = True,
                         query_key_heads: bool = False) -> dict[str, tuple[int, ...]]:
        """Weights that stack several matrices into one (so one matmul computes them all), by
        parameter name, with the row count of each: every layer's query/key/value projection
        (and attention gate, with model.attention_gate) and its MLP's gate and up projections.
        An optimizer that treats a matrix as a whole (Muon) splits these first.

        `by_matrix`: each stacked weight split into the matrices it stacks. `query_key_heads`:
        the query and key projections split further, into one (D, C) matrix per head (the key
        per key/value head): head h's scores read only its own D query rows and the D key rows
        of its key/value head. With `query_key_heads` alone only the query/key/value weight
        splits, its value (and attention gate) whole.
        """
        stacked = {}
        d = self.config.head_dim
        for i, block in enumerate(self.blocks):
            q_rows, k_rows, v_rows, *gate_rows = block.attention.qkv_split
            if query_key_heads:
                rows = (d,) * (q_rows // d) + (d,) * (k_rows // d) + (v_rows, *gate_rows)
                stacked[f"blocks.{i}.attention.qkv.weight"] = rows
            elif by_matrix:
                stacked[f"blocks.{i}.attention.qkv.weight"] = block.attention.qkv_split
            if by_matrix:
                stacked[f"blocks.{i}.mlp.gate_up.weight"] = (self.config.hidden_dim,) * 2
        return stacked

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
                need_weights: bool = False) -> ModelOutput:
        """idx: (B, T) token ids at positions start_pos..start_pos+T-1.

        targets: (B, T) next-token ids (IGNORE_INDEX where no loss should count).
        mask: boolean attention mask of allowed positions (see `attention`); None is causal.
        A (B, 1, T, T) mask gives each sequence its own: causal with one key's column
        False removes that token from every later token's attention, in every layer
        (token ablation, `tinyattn.analysis.ablation`).
        kv_caches: per-layer caches to read earlier keys/values from and write these to.
        positions: with kv_caches, a (T,) int64 tensor of the tokens' positions in place of
        start_pos, for decoding with shapes that never change (gpt-fast): RoPE rows are
        gathered at these positions, keys and values are written into the caches there, and
        each query attends over every cache slot up to its own position (`CacheWrite`). A
        decode step compiled for one token then serves every position. Positions are not checked.
        need_weights: run the explicit attention path and return its weights
        (`recording_attention_weights`).
        """
        if need_weights:
            with recording_attention_weights(self) as weights:
                output = self(idx, targets, mask=mask, kv_caches=kv_caches, start_pos=start_pos,
                              positions=positions)
            return output._replace(attention_weights=weights)
        B, T = idx.shape
        x = self.hidden_states(idx, mask=mask, kv_caches=kv_caches, start_pos=start_pos,
                               positions=positions)  # (B, T, C)
        logits = self.head_logits(x)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T),
                                   ignore_index=IGNORE_INDEX)
        return ModelOutput(logits, loss, None)

    def next_token_logits(self, idx: torch.Tensor, *, kv_caches: Optional[list[KVCache]] = None,
                          start_pos: int = 0) -> torch.Tensor:
        """The logits after the last of idx's (B, T) tokens, (B, V): all that decoding needs from a prompt.

        Every position goes through every block (with kv_caches, their keys and values fill the
        caches), but the final norm and the head over the vocabulary run on the last position
        only, not on all T (transformers calls this logits_to_keep=1): with a large vocabulary
        the head is the largest matrix of a small model.
        """
        x = self.hidden_states(idx, kv_caches=kv_caches, start_pos=start_pos)  # (B, T, C)
        return self.head_logits(x[:, -1])  # (B, V)

    def hidden_states(self, idx: torch.Tensor, *, mask: Optional[torch.Tensor] = None,
                      kv_caches: Optional[list[KVCache]] = None, start_pos: int = 0,
                      positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) -> the last block's output (B, T, C), before the final norm. The options
        are `forward`'s."""
        if positions is not None and (kv_caches is None or mask is not None):
            raise ValueError("positions needs kv_caches and builds its own mask")
        T = idx.size(1)
        cos, sin = self.rotary_angles(T, start_pos=start_pos, positions=positions)  # (T, D/2) each
        writes = (cache_writes(kv_caches, start_pos=start_pos, positions=positions)
                  if kv_caches is not None else [None] * len(self.blocks))
        x = self.dropout(self.token_embedding(idx))  # (B, T, C)
        for block, cache in zip(self.blocks, writes):
            x = block(x, cos=cos, sin=sin, mask=mask, cache=cache)  # (B, T, C)
        return x

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output x (..., C) -> logits (..., V): the final norm, then the head."""
        logits = self.head(self.final_norm(x))  # (..., V)
        if self.config.logit_softcap is not None:
            # Soft-capping squashes logits smoothly into (-cap, cap): no single logit can
            # run away, which steadies training at high learning rates.
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        return logits

    def rotary_angles(self, num_tokens: int, *, start_pos: int = 0,
                      positions: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, D/2) of the RoPE rows at positions start_pos..start_pos+T-1, or at the
        (T,) `positions` tensor (not checked: reading it would stall the device)."""
        if positions is not None:
            return self.rope_cos[positions], self.rope_sin[positions]
        end = start_pos + num_tokens
        if end > self.config.context_length:
            raise ValueError(f"positions {start_pos}..{end - 1} exceed the context "
                             f"length {self.config.context_length}")
        return self.rope_cos[start_pos:end], self.rope_sin[start_pos:end]

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
