"""The cached model: prefill, one position per token, the refill rule, the token loop.

Steps 2, 3 and 6 of generation (1 is `tinyattn.generate.sampling`, 4 and 5
`tinyattn.generate.text`):

2. `CachedDecoder`: the prompt goes through the model in one parallel forward pass (prefill)
   and fills a preallocated KV cache per layer; after that each new token costs one position,
   eagerly or through `decode_one_token`, whose shapes are the same at every position so
   that torch.compile compiles it once (`compile=True`).
   The context rule: when the caches hold `context_length` positions and one more token
   comes, the last `max(1, context_length // 2)` tokens of the sequence (the new one
   included) are fed again, from position 0, in one forward pass (a refill), and decoding
   goes on from there. RoPE positions therefore restart at 0 after a refill, and once the
   sequence is longer than the context, every token is predicted from at least
   `context_length // 2` and at most `context_length` tokens. A refill costs one prefill of
   `context_length // 2` tokens every `context_length // 2` tokens: half of what sliding the
   window by one token would save, at a cost per token that never grows.
3. `generate_tokens`: the batched token loop (sample, feed back, repeat).
6. Speed on the CPU: the dtype to decode in (`inference_dtype`;
   `tinyattn.generate.cpu_weights` stores weights for fast CPU matmuls).

Departures from a textbook loop, all for the decode hot path: the loop runs under
`torch.inference_mode()`, writes each new token into a preallocated id buffer and feeds the
model a view of it, can compile the one-token step with its position given as a tensor so
that its shapes never change (gpt-fast; `compile_decode_step`, the model's static cache path
`tinyattn.model.kv_cache.CacheWrite`), and keeps the set of tokens seen for the repetition
penalty as a (B, V) mask updated in place instead of scanning the history every step.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from tinyattn.generate.sampling import Generators, apply_repetition_penalty, sample_next_token
from tinyattn.model.transformer import evaluation_mode
from tinyattn.system.device import select_precision

# ----------------------------------------------------------------------------- 2. the cached model


def decode_one_token(model, token: torch.Tensor, position: torch.Tensor, caches: list) -> torch.Tensor:
    """Feed token (B, 1) at position (1,) through the caches; logits after it, (B, V).

    The compile target. The position is a tensor, so every shape is the same at every
    position: keys and values are written by index and attention reads every cache slot
    under a mask (`LanguageModel.forward(positions=...)`).
    """
    return model(token, kv_caches=caches, positions=position).logits[:, -1]


def compile_decode_step(model):
    """`decode_one_token` through `torch.compile`, compiled on its first call.

    One token at a time, the eager model spends its time launching about a thousand small
    operators and reading every weight matrix through a general matmul kernel. Compiled for
    the one shape a step has, on the CPU inductor fuses each layer into a few loops and,
    told to by `decompose_mm_pass`, computes each batch-1 matmul as a vector reduction inside
    those loops. On CUDA, mode "reduce-overhead" replays the step as a CUDA graph.

    The compile takes seconds, more the first time on a machine (inductor keeps what it
    compiled on disk, in TORCHINDUCTOR_CACHE_DIR, and reuses it in later processes). Only
    long generations repay it, which is why it is asked for (`compile=True`), never implied.
    """
    if next(model.parameters()).device.type == "cuda":
        return torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True, dynamic=False)
    return torch.compile(decode_one_token, fullgraph=True, dynamic=False,
                         options={"post_grad_fusion_options": {"decompose_mm_pass": {}}})


class CachedDecoder:
    """Feeds a batch of sequences to the model one token at a time through its KV caches.

    Owns one preallocated cache per layer, the position the next token goes to, and the ids
    of the tokens whose keys and values the caches hold (`ids[:, :position]`), which a refill
    needs. `prefill(ids)` and `step(token)` return the logits for the next token, (B, V).
    The refill rule is in the module docstring; `refills` counts them.

    Prefills and refills run eagerly, at positions 0..T-1 in one pass. A step runs eagerly
    with its position as an int, attending to the written keys only; with `compile=True` it
    runs `compile_decode_step` instead, which is built at the first step (so the first token
    never waits for it) and is fed from two small tensors updated in place, so it sees the
    same inputs at every position. Both give the same logits up to float rounding (tested).
    """

    def __init__(self, model, batch_size: int, compile: bool = False):
        self.model = model
        self.context_length = model.config.context_length
        self.keep = max(1, self.context_length // 2)  # tokens kept by a refill, the new one included
        self.caches = model.new_kv_caches(batch_size)
        device = next(model.parameters()).device
        self.ids = torch.zeros(batch_size, self.context_length, dtype=torch.long, device=device)  # (B, ctx)
        self.position = 0
        self.refills = 0
        self.compile = compile
        self.compiled_step = None  # built at the first step when compile is asked for
        self.step_token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # (B, 1)
        self.step_position = torch.zeros(1, dtype=torch.long, device=device)  # (1,)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (B, T) with 1 <= T <= context_length, fed at positions 0..T-1. Returns (B, V)."""
        T = ids.size(1)
        if not 1 <= T <= self.context_length:
            raise ValueError(f"prefill takes 1 to {self.context_length} tokens per row, got {T}")
        self.ids[:, :T] = ids
        self.position = T
        return self._forward(0, T)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """token: (B,), the next token of each row. Returns the logits after it, (B, V)."""
        if self.position == self.context_length:  # full: refill with the most recent tokens
            older = self.keep - 1  # kept besides the new token; never overlaps its source
            self.ids[:, :older] = self.ids[:, self.context_length - older:]
            self.ids[:, older] = token
            self.position = self.keep
            self.refills += 1
            return self._forward(0, self.keep)
        self.ids[:, self.position] = token
        self.position += 1
        if not self.compile:
            return self._forward(self.position - 1, self.position)
        if self.compiled_step is None:
            self.compiled_step = self._compile()
        self.step_token.copy_(token.unsqueeze(1))
        self.step_position.fill_(self.position - 1)
        return self.compiled_step(self.model, self.step_token, self.step_position, self.caches)

    def _forward(self, start: int, end: int) -> torch.Tensor:
        """Feed ids[:, start:end] at positions start..end-1; logits of the last one, (B, V)."""
        logits = self.model(self.ids[:, start:end], kv_caches=self.caches, start_pos=start).logits
        return logits[:, -1]  # (B, V)

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
    compile: compile the one-token step (`compile_decode_step`); the tokens are the same.
    """
    # The options are taken as valid: `SamplingOptions` checked them once (generate_samples).
    if prompt_ids.dim() != 2 or prompt_ids.size(1) == 0:
        raise ValueError(f"prompt_ids must be (B, T) with T >= 1, got shape {tuple(prompt_ids.shape)}")
    if max_new_tokens == 0:
        return
    with evaluation_mode(model):
        decoder = CachedDecoder(model, batch_size=prompt_ids.size(0), compile=compile)
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
    return select_precision(name, device).autocast_dtype or torch.float32
