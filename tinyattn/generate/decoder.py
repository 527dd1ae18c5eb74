"""The cached model: prefill, one position per token, the refill rule, the token loop.

Steps 2, 3 and 6 of generation (1 is `tinyattn.generate.sampling`, 4 and 5
`tinyattn.generate.text`):

2. `CachedDecoder`: the prompt goes through the model in one parallel forward pass (prefill)
   and fills a preallocated KV cache per layer (the head computes the last position's logits
   only, `LanguageModel.next_token_logits`); after that each new token costs one position,
   eagerly through `DecodeStep` (the model's arithmetic for one token without its nn.Module
   calls) or through `decode_one_token`, whose shapes are the same at every position so
   that torch.compile compiles it once (`compile=True`). On the CPU the caches hold fp32
   (`cache_dtype`).
   The context rule: when the caches hold `context_length` positions and one more token
   comes, the last `max(1, context_length // 2)` tokens of the sequence (the new one
   included) are fed again, from position 0, in one forward pass (a refill), and decoding
   goes on from there. RoPE positions therefore restart at 0 after a refill, and once the
   sequence is longer than the context, every token is predicted from at least
   `context_length // 2` and at most `context_length` tokens. A refill costs one prefill of
   `context_length // 2` tokens every `context_length // 2` tokens: half of what sliding the
   window by one token would save, at a cost per token that never grows.
3. `generate_tokens`: the batched token loop (sample, feed back, repeat).
6. Speed on the CPU: the dtype to decode in (`inference_dtype`, `row_weight_dtype`;
   `tinyattn.generate.cpu_weights` stores weights for fast CPU matmuls), and the model
   prepared with both (`prepare_for_generation`).

Departures from a textbook loop, all for the decode hot path: the loop runs under
`torch.inference_mode()`, writes each new token into a preallocated id buffer and feeds the
model a view of it, can compile the one-token step with its position given as a tensor so
that its shapes never change (gpt-fast; `compile_decode_step`, the model's static cache path
`tinyattn.model.kv_cache.CacheWrite`), and keeps the set of tokens seen for the repetition
penalty as a (B, V) mask updated in place instead of scanning the history every step.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Callable, Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.generate.cpu_weights import (PackedLinear, aten_kernels, drop_row_weights, has_row_weights,
                                           one_row_weight, pack_linear_weights)
from tinyattn.generate.sampling import Generators, apply_repetition_penalty, sample_next_token
from tinyattn.model.attention import attention, gated
from tinyattn.model.memory import check_decoding_fits
from tinyattn.model.transformer import Block, LanguageModel, SwiGLU, evaluation_mode
from tinyattn.system.cpu import cpu_fp16_rows_are_fast, keep_compiled_code_per_capability
from tinyattn.system.device import select_precision

# ----------------------------------------------------------------------------- 2. the cached model


def decode_one_token(model, token: torch.Tensor, position: torch.Tensor, caches: list) -> torch.Tensor:
    """Feed token (B, 1) at position (1,) through the caches; logits after it, (B, V).

    The compile target. The position is a tensor, so every shape is the same at every
    position: keys and values are written by index and attention reads every cache slot
    under a mask (`LanguageModel.forward(positions=...)`).
    """
    return model(token, kv_caches=caches, positions=position).logits[:, -1]


class LayerWeights(NamedTuple):
    """One block's tensors as `DecodeStep` reads them; each linear is a function of x (`_linear`),
    taking and giving the step's product dtype."""

    attention_norm: torch.Tensor  # (C,)
    qkv: Callable  # (C,) -> (H*D + 2*Hkv*D [+ H*D],): queries, keys, values side by side [, the gate]
    q_norm: Optional[torch.Tensor]  # (D,), with model.qk_norm
    k_norm: Optional[torch.Tensor]  # (D,)
    qk_gains: Optional[torch.Tensor]  # on the CPU, (H + Hkv, 1, D) fp32: each query head's gain, then each key head's
    fused: bool  # the layer's attention path: the fused kernel, or `attention` written out
    output: Callable  # (C,) -> (C,)
    mlp_norm: torch.Tensor  # (C,)
    gate_up: Callable  # (C,) -> (2 * hidden,)
    down: Callable  # (hidden,) -> (C,)


# ModelConfig fields the step computes as the model does (both dropouts act in training only,
# and the step runs in eval); any other field set away from its default (an option added later)
# sends decoding down the model's own forward instead.
_STEP_KNOWS = {"vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "mlp_hidden", "context_length",
               "dropout", "attention_dropout", "tie_embeddings", "rope_base", "norm_eps", "qk_norm",
               "attention_gate", "logit_softcap", "zero_init_projections", "attention", "causal"}


class DecodeStep:
    """One token through every layer into the KV caches: `LanguageModel.forward` for T = 1, in fewer calls.

    The eager decode step. At batch 1 a token's matmuls are a small part of its time; the rest is
    the calls around them, each a trip through Python and torch's dispatcher. This step does
    the model's arithmetic with the same roundings, so its logits are bitwise the model's own
    cached forward's (tested), but it reads the weights from flat per-layer
    tuples instead of calling nn.Modules, has no dropout calls (eval only), applies RoPE to the
    queries and keys of all heads at once from rows of (cos, cos) and (-sin, sin) made once in
    the caches' dtype (x * cos + swap_halves(x) * sin rounds as the textbook's two halves do),
    writes keys and values into the cache slot of the position with one copy each, and runs
    attention for its single query with no mask (every written key is in its past).
    `DecodeStep.for_model` returns None where it cannot promise the same numbers.

    One sequence whose packed layers multiply a single row through aten's kernel (fp16 copies,
    or bf16 weights: `cpu_weights.one_row_weight`) is multiplied by those weights directly, in
    their dtype (`products`), as a vector (C,) by `torch.mv` (`_linear`), under one
    `aten_kernels()` for the whole step: a product's input is
    cast to that dtype once, where the norm or the attention leaves it, and its output is left
    there for the next operator to read (adding an fp16 product to the fp32 residual computes in
    fp32, the sum `PackedLinear.product` would give). The same numbers in fewer calls (counted in
    docs/BENCHMARKS.md, "Fewer calls around the one-row products"). On the CPU, QK-norm
    normalises the query and key heads in one call, each with its own gain (`qk_norm`).
    """

    def __init__(self, model, caches: list):
        c = model.config
        self.caches = caches
        self.heads, self.kv_heads, self.head_dim = c.n_head, c.kv_heads, c.head_dim
        self.width, self.softcap = (c.n_embd,), c.logit_softcap
        self.gqa = c.kv_heads != c.n_head
        self.gated = c.attention_gate  # H more heads of D after the values: the attention gate
        self.eps = model.final_norm.eps
        self.embedding = model.token_embedding.weight  # (V, C)
        self.final_norm = model.final_norm.weight
        linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
        one_row = caches[0].keys.size(0) == 1 and all(one_row_weight(m) is not None for m in linears)
        self.one_row = one_row  # the products by `one_row_weight`s, under `aten_kernels`
        self.products = one_row_weight(model.head).dtype if one_row else self.embedding.dtype
        self.cast = self.products != self.embedding.dtype  # fp16 copies beside fp32 weights
        self.head = _linear(model.head, one_row)
        self.layers = [_layer_weights(block, one_row) for block in model.blocks]
        # Queries and keys are rotated and attended in the caches' dtype (`cache_dtype`), as in the
        # model's cached forward; with rows of that dtype the product casts a bf16 model's up.
        dtype = caches[0].keys.dtype
        self.downcast = dtype != self.products  # attention's output to the products' dtype
        cos, sin = model.rope_cos, model.rope_sin  # (context, D/2), fp32
        # Row p: what multiplies x and swap_halves(x) at position p, (D,) each.
        self.rope_cos = torch.cat((cos, cos), dim=-1).to(dtype).unbind(0)
        self.rope_sin = torch.cat((-sin, sin), dim=-1).to(dtype).unbind(0)

    @classmethod
    def for_model(cls, model, caches: list) -> Optional["DecodeStep"]:
        """The step for a `LanguageModel` in eval mode with the architecture it knows; else None."""
        if type(model) is not LanguageModel or model.training:  # dropout only runs in the model
            return None
        defaults = type(model.config)()
        if any(getattr(model.config, f.name) != getattr(defaults, f.name)
               for f in dataclasses.fields(model.config) if f.name not in _STEP_KNOWS):
            return None
        if any(type(b) is not Block or type(b.mlp) is not SwiGLU or b.attention.weights_hook is not None
               for b in model.blocks):
            return None  # another block, or attention weights being recorded: the model's own path
        return cls(model, caches)

    def __call__(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """token: (B,) at `position` (an int, < the caches' length). Returns the logits after it, (B, V)."""
        if not self.one_row:
            return self.logits(token, position)
        with aten_kernels():
            return self.logits(token, position)

    def logits(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """`__call__`'s arithmetic: the model's `hidden_states` for one position, then its
        `head_logits` (final norm, head, soft-cap) written out."""
        x = F.embedding(token, self.embedding)  # (B, C)
        if self.one_row:
            x = x.view(self.width)  # (C,): the one row, multiplied by `torch.mv`
        cos, sin = self.rope_cos[position], self.rope_sin[position]  # (D,) each
        for layer, cache in zip(self.layers, self.caches):
            x = self.block(x, layer, cache, position=position, rope=(cos, sin))  # (B, C) or (C,)
        logits = self.head(self.norm(x, self.final_norm))  # (B, V) or (V,)
        if self.cast:
            logits = logits.to(x.dtype)
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits.view(1, -1) if self.one_row else logits  # (B, V)

    def block(self, x: torch.Tensor, layer: LayerWeights, cache, *, position: int, rope: tuple) -> torch.Tensor:
        """`Block.forward` for one position: x (B, C) -> (B, C), its keys and values stored in `cache`;
        with `one_row` x is (C,) (B = 1). rope: the (cos, sin) rows of `position`, (D,) each."""
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        cos, sin = rope
        heads = layer.qkv(self.norm(x, layer.attention_norm))  # in the products' dtype
        heads = heads.view(-1, H + 2 * Hkv + H * self.gated, 1, D)  # (B, H + 2Hkv [+ H], 1, D): q, k, v, gate
        qk = heads[:, :H + Hkv]  # (B, H + Hkv, 1, D)
        if layer.q_norm is not None:
            qk = self.qk_norm(qk, layer, x.dtype)
        qk = qk * cos + qk.roll(D // 2, dims=-1) * sin  # (B, H + Hkv, 1, D), rotated, in the caches' dtype
        cache.keys.narrow(2, position, 1).copy_(qk[:, H:])  # (B, Hkv, 1, D) into the slot of `position`
        cache.values.narrow(2, position, 1).copy_(heads[:, H + Hkv:H + 2 * Hkv])
        keys = cache.keys.narrow(2, 0, position + 1)  # (B, Hkv, position + 1, D)
        values = cache.values.narrow(2, 0, position + 1)
        q = qk[:, :H]  # (B, H, 1, D)
        if layer.fused:
            y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=self.gqa)  # (B, H, 1, D)
        else:
            if self.gqa:
                keys, values = keys.repeat_interleave(H // Hkv, 1), values.repeat_interleave(H // Hkv, 1)
            y = attention(q, keys, values)[0]  # (B, H, 1, D)
        y = y.view(x.shape)  # (B, C) or (C,)
        if self.gated:  # the gate's H heads of D follow the values (model.attention_gate); in x's dtype
            y = gated(y.to(x.dtype), heads[:, H + 2 * Hkv:].reshape(y.shape))  # as the model gates
        if self.downcast:
            y = y.to(self.products)
        x = x + layer.output(y)  # (B, C), in x's dtype
        gate_up = layer.gate_up(self.norm(x, layer.mlp_norm))  # (B, 2 * hidden)
        gate, up = (gate_up.to(x.dtype) if self.cast else gate_up).chunk(2, dim=-1)  # in x's dtype
        hidden = F.silu(gate) * up  # (B, hidden)
        return x + layer.down(hidden.to(self.products) if self.cast else hidden)  # (B, C)

    def qk_norm(self, qk: torch.Tensor, layer: LayerWeights, dtype: torch.dtype) -> torch.Tensor:
        """QK-norm of qk (B, H + Hkv, 1, D), queries then keys, in `dtype` (x's) as the model's
        `norm_heads` computes it, from qk in the products' dtype.

        On the CPU every head in one call: torch's CPU `rms_norm` computes in fp32 and rounds the
        product with the gain to the input's dtype, which this does in the same order (bitwise,
        tested). Elsewhere one call for the queries and one for the keys, as the model makes them.
        """
        D = self.head_dim
        if layer.qk_gains is not None:
            normed = F.rms_norm(qk.float(), (D,), None, self.eps) * layer.qk_gains  # fp32
            return normed if dtype == torch.float32 else normed.to(dtype)
        qk = qk.to(dtype)
        return torch.cat((F.rms_norm(qk[:, :self.heads], (D,), layer.q_norm, self.eps),
                          F.rms_norm(qk[:, self.heads:], (D,), layer.k_norm, self.eps)), dim=1)

    def norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """RMSNorm of x (B, C) in x's dtype, given in the products' dtype."""
        normed = F.rms_norm(x, self.width, gain, self.eps)
        return normed.to(self.products) if self.cast else normed


def _linear(module, one_row: bool) -> Callable:
    """x -> what `module(x)` computes, without the nn.Module call: with `one_row`, x (in,) -> (out,) by
    `torch.mv` with the layer's `one_row_weight` (x and the product in that weight's dtype; under
    `aten_kernels`, as `DecodeStep` calls it: `cpu_weights.matrix_vector`'s kernel); else
    `PackedLinear.product` where packed, F.linear where not."""
    if one_row:
        return functools.partial(torch.mv, one_row_weight(module))
    if isinstance(module, PackedLinear):
        return module.product
    return functools.partial(F.linear, weight=module.weight)


def _layer_weights(block, one_row: bool) -> LayerWeights:
    a, mlp = block.attention, block.mlp
    q_norm, k_norm = (None, None) if a.q_norm is None else (a.q_norm.weight, a.k_norm.weight)
    qk_gains = None  # the CPU's one call for every head (`DecodeStep.qk_norm`)
    if q_norm is not None and q_norm.device.type == "cpu":
        qk_gains = torch.cat((q_norm.expand(a.n_head, 1, -1), k_norm.expand(a.n_kv_head, 1, -1))).float()
    return LayerWeights(
        attention_norm=block.attention_norm.weight, qkv=_linear(a.qkv, one_row),
        q_norm=q_norm, k_norm=k_norm, qk_gains=qk_gains, fused=a.fused, output=_linear(a.output, one_row),
        mlp_norm=block.mlp_norm.weight, gate_up=_linear(mlp.gate_up, one_row), down=_linear(mlp.down, one_row))


def cache_dtype(model) -> torch.dtype:
    """The dtype decoding keeps keys and values in: fp32 on the CPU, the weights' own elsewhere.

    On the CPU, torch's fused attention kernel is several times slower for one bf16 query than
    for one fp32 query (docs/BENCHMARKS.md "Decoding"), and fp32 holds every bf16 key and value
    exactly: a bf16 model's queries are cast up and attention computes in fp32 what bf16 would
    have rounded. The cache is small next to the weights (2 * n_layer * context * C values a row).
    """
    weight = next(model.parameters())
    return torch.float32 if weight.device.type == "cpu" else weight.dtype


def check_caches_fit(model, batch_size: int, positions: Optional[int] = None, compile: bool = False, *,
                     eager_whole: bool = False) -> None:
    """A KVCachesTooLarge when the KV caches of `batch_size` sequences, `positions` each (None: the
    whole context), cannot fit beside the model; its advice is `caches_advice`'s (`eager_whole`: an
    eager generation's caches would hold the whole context too).

    A million samples asked for is one line, not a stall; a model that is not a `LanguageModel`
    (a test's stand-in) is not sized.
    """
    if isinstance(model, LanguageModel):
        check_decoding_fits(model.config, batch_size, next(model.parameters()).device, cache_dtype(model),
                            positions, advice=caches_advice(batch_size, positions is not None, compile,
                                                            eager_whole=eager_whole))


def caches_advice(batch_size: int, sized: bool, compile: bool, *, eager_whole: bool = False) -> str:
    """What shrinks KV caches that cannot fit: fewer samples where there are several; with caches
    `sized` to the generation (`cache_positions`), fewer new tokens or a shorter prompt; a compiled
    step's caches hold the whole context whatever the tokens, so there: no compile, and fewer new
    tokens or a shorter prompt too where an eager generation would reach the whole context as well
    (`eager_whole`: without them, decoding without compile needs as much)."""
    samples = "fewer samples" if batch_size > 1 else ""
    if not sized:  # the whole context (a benchmark's decoder)
        return f"ask for {samples}" if samples else "free some memory first"
    if compile:
        eager = ("decode without --compile: a compiled step's caches hold the whole context, an eager one's "
                 "only the positions the prompt and the new tokens reach")
        if eager_whole:
            eager = f"fewer new tokens or a shorter prompt, and {eager}"
            return f"ask for {samples}, or for {eager}" if samples else f"ask for {eager}"
        return f"ask for {samples}, or {eager}" if samples else eager
    return f"ask for {samples + ', ' if samples else ''}fewer new tokens or a shorter prompt"


def cache_positions(model, prompt_length: int, max_new_tokens: int, compile: bool = False) -> int:
    """The positions a generation's KV caches hold: the prompt's (its last context at most) and
    every new token's but the last, which is never fed, up to `context_length`, where the refill
    rule takes over. A Hugging Face folder's context runs to tens of thousands of positions:
    caches for all of them, for a few tokens, would take gigabytes the generation never reaches.
    A compiled step keeps the whole context, so its shapes stay the same from one prompt to the
    next (another length would compile it again)."""
    context = model.config.context_length
    if compile:
        return context
    return max(1, min(context, min(prompt_length, context) + max_new_tokens - 1))


def compile_decode_step(model):
    """`decode_one_token` through `torch.compile`, compiled on its first call.

    One token at a time, the eager model spends its time launching small operators (fewer
    through `DecodeStep`, still hundreds) and reading every weight matrix through a general
    matmul kernel. Compiled for
    the one shape a step has, on the CPU inductor fuses each layer into a few loops and,
    told to by `decompose_mm_pass`, computes each batch-1 matmul as a vector reduction inside
    those loops. On CUDA, mode "reduce-overhead" replays the step as a CUDA graph.

    The compile takes seconds, more the first time on a machine (inductor keeps what it
    compiled on disk, in TORCHINDUCTOR_CACHE_DIR, and reuses it in later processes). Only
    long generations repay it, which is why it is asked for (`compile=True`), never implied.
    """
    keep_compiled_code_per_capability()
    if next(model.parameters()).device.type == "cuda":
        return torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True, dynamic=False)
    return torch.compile(decode_one_token, fullgraph=True, dynamic=False,
                         options={"post_grad_fusion_options": {"decompose_mm_pass": {}}})


class CachedDecoder:
    """Feeds a batch of sequences to the model one token at a time through its KV caches.

    The model is a `LanguageModel`, or anything with its `new_kv_caches`, `next_token_logits`
    (prefills and refills) and `forward` (steps where `DecodeStep` does not apply).

    Owns one preallocated cache per layer, the position the next token goes to, and the ids
    of the tokens whose keys and values the caches hold (`ids[:, :position]`), which a refill
    needs. `prefill(ids)` and `step(token)` return the logits for the next token, (B, V).
    The refill rule is in the module docstring; `refills` counts them.

    Prefills and refills run eagerly, at positions 0..T-1 in one pass. A step runs eagerly
    with its position as an int, attending to the written keys only, through `DecodeStep`
    where the model allows it (`DecodeStep.for_model`; `eager_step` None: the model's own
    forward); with `compile=True` it
    runs `compile_decode_step` instead, which is built at the first step (so the first token
    never waits for it) and is fed from two small tensors updated in place, so it sees the
    same inputs at every position. Both give the same logits up to float rounding (tested).
    With fp16 row copies (`prepare_for_generation`) and one sequence, logits that are not finite
    mean an fp16 product overflowed: the copies are dropped with a warning, and every position
    the caches hold is computed again in fp32 (`_in_fp32_if_overflowed`), which rewrites them.
    """

    def __init__(self, model, batch_size: int, compile: bool = False, positions: Optional[int] = None):
        self.model = model
        self.context_length = model.config.context_length
        self.keep = max(1, self.context_length // 2)  # tokens kept by a refill, the new one included
        device = next(model.parameters()).device
        # positions: what the caches hold (`cache_positions`; None: the context), which a generation
        # that never reaches the context never fills, so the refill rule needs no change
        check_caches_fit(model, batch_size, positions, compile)
        self.caches = model.new_kv_caches(batch_size, max_len=positions, dtype=cache_dtype(model))
        self.ids = torch.zeros(batch_size, self.context_length, dtype=torch.long, device=device)  # (B, ctx)
        self.position = 0
        self.refills = 0
        self.compile = compile
        self.compiled_step = None  # built at the first step when compile is asked for
        self.step_token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # (B, 1)
        self.step_position = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        self.columns = self.ids.unbind(1)  # ids[:, p] for each p, (B,) views: one copy writes a token
        self.eager_step = None if compile else DecodeStep.for_model(model, self.caches)
        self.row_copies = batch_size == 1 and has_row_weights(model)  # fp16 copies for one-row products in play

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (B, T) with 1 <= T <= context_length, fed at positions 0..T-1. Returns (B, V)."""
        T = ids.size(1)
        if not 1 <= T <= self.context_length:
            raise ValueError(f"prefill takes 1 to {self.context_length} tokens per row, got {T}")
        self.ids[:, :T] = ids
        self.position = T
        return self._in_fp32_if_overflowed(self._forward(0, T))

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """token: (B,), the next token of each row. Returns the logits after it, (B, V)."""
        if self.position == self.context_length:  # full: refill with the most recent tokens
            older = self.keep - 1  # kept besides the new token; never overlaps its source
            self.ids[:, :older] = self.ids[:, self.context_length - older:]
            self.ids[:, older] = token
            self.position = self.keep
            self.refills += 1
            return self._in_fp32_if_overflowed(self._forward(0, self.keep))
        self.columns[self.position].copy_(token)
        self.position += 1
        if self.eager_step is not None:
            return self._in_fp32_if_overflowed(self.eager_step(token, self.position - 1))
        if not self.compile:
            return self._in_fp32_if_overflowed(self._forward(self.position - 1, self.position))
        if self.compiled_step is None:  # compiled code multiplies by the fp32 weights, never the row copies
            self.compiled_step = self._compile()
        self.step_token.copy_(token.unsqueeze(1))
        self.step_position.fill_(self.position - 1)
        return self.compiled_step(self.model, self.step_token, self.step_position, self.caches)

    def _in_fp32_if_overflowed(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, V); where fp16 row copies made them not finite, the copies are dropped and every
        position the caches hold is fed again in fp32 (a refill), whose last logits are returned."""
        if not self.row_copies or bool(torch.isfinite(logits).all()):
            return logits
        drop_row_weights(self.model)
        self.row_copies = False
        if self.eager_step is not None:  # it multiplies by the copies it was made with (so does another
            self.eager_step = DecodeStep.for_model(self.model, self.caches)  # decoder's, until it ends)
        warnings.warn("logits with fp16 copies of the weights were not finite (an fp16 product beyond 65,504); "
                      "decoding in fp32 from here on (--dtype fp32 does so from the start)",
                      RuntimeWarning, stacklevel=3)
        return self._forward(0, self.position)

    def _forward(self, start: int, end: int) -> torch.Tensor:
        """Feed ids[:, start:end] at positions start..end-1; logits of the last one, (B, V)
        (the head runs on that one position only: `LanguageModel.next_token_logits`)."""
        return self.model.next_token_logits(self.ids[:, start:end], kv_caches=self.caches,
                                            start_pos=start)  # (B, V)

    def _compile(self):
        step = compile_decode_step(self.model)
        if self.step_token.device.type == "cuda":  # a CUDA graph may only write static memory
            for cache in self.caches:
                torch._dynamo.mark_static_address(cache.keys)
                torch._dynamo.mark_static_address(cache.values)
        return step


# ----------------------------------------------------------------------------- 3. the token loop


@torch.inference_mode()
def generate_tokens(model, prompt_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                    top_k: Optional[int] = None, top_p: float = 1.0, repetition_penalty: float = 1.0,
                    generator: Generators = None, compile: bool = False) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,), `max_new_tokens` times.

    prompt_ids: (B, T), T >= 1, on the model's device; a prompt longer than the context keeps
    its last `context_length` tokens. The repetition penalty counts the prompt's tokens and the
    generated ones. `generator`: see `sample_next_token`. The model runs in eval mode under
    `torch.inference_mode()`; its previous train/eval mode is restored when the loop ends.
    compile: compile the one-token step (`compile_decode_step`); the tokens are the same in fp32
    (in bf16 compiled code fuses and rounds differently, and eager steps may multiply by fp16 row
    copies, which compiled code does not use: the text can part after some tokens).
    """
    # The options are taken as valid: `SamplingOptions` checked them once (generate_samples).
    if prompt_ids.dim() != 2 or prompt_ids.size(1) == 0:
        raise ValueError(f"prompt_ids must be (B, T) with T >= 1, got shape {tuple(prompt_ids.shape)}")
    if max_new_tokens == 0:
        return
    with evaluation_mode(model):
        positions = cache_positions(model, prompt_ids.size(1), max_new_tokens, compile)
        decoder = CachedDecoder(model, batch_size=prompt_ids.size(0), compile=compile, positions=positions)
        logits = decoder.prefill(prompt_ids[:, -decoder.context_length:])  # (B, V)
        present = None
        if repetition_penalty != 1.0:
            present = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, prompt_ids, True)  # (B, V)
        for step in range(max_new_tokens):
            if present is not None:
                logits = apply_repetition_penalty(logits, present, repetition_penalty)
            token = sample_next_token(logits, generator, temperature, top_k, top_p)  # (B,)
            yield token
            if step == max_new_tokens - 1:
                break  # the last token needs no forward pass
            if present is not None:
                present.scatter_(1, token.unsqueeze(1), True)
            logits = decoder.step(token)


# ----------------------------------------------------------------------------- 6. speed on the CPU


def inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype to run a model in for generation: "auto", "fp32", "bf16" or "fp16".

    auto follows `runtime.select_precision`: bf16 on CUDA (fp16 where bf16 is missing) and
    on a CPU with fast bf16 (`cpu.cpu_bf16_is_fast`: AVX512-BF16 or AMX units, read
    from the CPU's flags without timing anything; only where flags cannot tell, as on ARM,
    a short matmul measurement kept on disk once per machine); fp32 elsewhere. On such a
    CPU bf16 also decodes faster at batch 1, where each token reads every weight once and
    bf16 weights are half the bytes (benchmarks/decode.py).
    """
    return select_precision(name, device, "--dtype").autocast_dtype or torch.float32


def row_weight_dtype(name: str, dtype: torch.dtype, device: torch.device) -> Optional[torch.dtype]:
    """The dtype of a second copy of the weights for one-row products (`pack_linear_weights`), or None.

    name: the precision asked for; dtype: what `inference_dtype` made of it. fp16 where "auto"
    decodes in fp32 on a CPU whose fp16 matrix-vector products are fast
    (`cpu.cpu_fp16_rows_are_fast`): a CPU without bf16 units, where reading the fp32 weights
    is most of a token's time and fp16 halves it (`tinyattn.generate.cpu_weights`). A
    precision asked for by name ("fp32") gets no copy: its numbers exactly.
    """
    if name != "auto" or device.type != "cpu" or dtype != torch.float32:
        return None
    return torch.float16 if cpu_fp16_rows_are_fast() else None


class PreparedModel(NamedTuple):
    """A model ready to generate with (`prepare_for_generation`) and what was done to it."""

    model: LanguageModel
    dtype: torch.dtype  # its weights'
    packed: bool  # its linear weights are `PackedLinear`s
    row_dtype: Optional[torch.dtype]  # one-row products' weight copies (`row_weight_dtype`); None: none

    def describe(self, device: torch.device) -> str:
        """What was done, for a log line: "float32 on cpu, packed weights, float16 copies for one-row steps"."""
        parts = [f"{str(self.dtype).removeprefix('torch.')} on {device}"]
        if self.packed:
            parts.append("packed weights")
        if self.row_dtype is not None:
            parts.append(f"{str(self.row_dtype).removeprefix('torch.')} copies for one-row steps")
        return ", ".join(parts)


def prepare_for_generation(model: LanguageModel, dtype_name: str, device: torch.device,
                           compile: bool = False) -> PreparedModel:
    """The model as `tinyattn generate` and `tinyattn serve` run it: cast to `inference_dtype`, its
    weights packed for fast CPU matmuls with `row_weight_dtype`'s copies (none with `compile`, whose
    steps multiply by the fp32 weights). It is only ever used to generate afterwards: the model is
    changed in place (a gate of rank r merged into its own matrix, `nn.Module.to`, the packing) and
    returned."""
    dtype = inference_dtype(dtype_name, device)
    model.merge_attention_gates()  # in the weights' dtype before the cast: the product rounds once
    model = model.to(dtype)
    row_dtype = None if compile else row_weight_dtype(dtype_name, dtype, device)
    packed = pack_linear_weights(model, row_dtype=row_dtype)
    return PreparedModel(model, dtype, packed, row_dtype if packed else None)
