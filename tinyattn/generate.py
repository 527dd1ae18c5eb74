"""Sampling and the decode loop: from a prompt to a stream of text, one token at a time.

Read top to bottom:

1. Sampling, small pure functions on logits of shape (B, V). The order is the usual one:
   repetition penalty -> temperature -> top-k -> top-p -> draw. Temperature 0 means greedy
   (argmax; top-k and top-p then change nothing). Every draw takes an explicit
   `torch.Generator`, so a seed fixes the text.
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
4. Text: `IncrementalDetokenizer` turns ids into text one token at a time (a character may
   span several byte-level tokens), `StopStringFilter` holds back text that could be the
   start of a stop string until it is resolved, so a stop string is never shown.
5. `generate` (one sample, yields str) and `generate_samples` (several, decoded together as
   one batch, yields `SamplePiece`; `SampleStreams` lets their text out in sample order).
6. Speed on the CPU: the dtype to decode in (`tinyattn.packing` stores weights for fast
   CPU matmuls).

Departures from a textbook loop, all for the decode hot path: the loop runs under
`torch.inference_mode()`, writes each new token into a preallocated id buffer and feeds the
model a view of it, can compile the one-token step with its position given as a tensor so
that its shapes never change (gpt-fast; `compile_decode_step`), and keeps the set of tokens
seen for the repetition penalty as a (B, V) mask updated in place instead of scanning the
history every step.
"""

from __future__ import annotations

import os
import warnings
from typing import Iterator, NamedTuple, Optional, Sequence, Union

import torch

from tinyattn.config import check_sampling
from tinyattn.errors import ConfigError, DataError
from tinyattn.model import evaluation_mode
from tinyattn.runtime import select_precision

Generators = Union[torch.Generator, Sequence[torch.Generator], None]


class PromptWarning(UserWarning):
    """The prompt was used, but not exactly as given (too long, unknown characters)."""


# ----------------------------------------------------------------------------- 1. sampling


def check_sampling_options(**options) -> None:
    """Raise ConfigError naming the first unusable option, as the command line spells it.

    The rules are `tinyattn.config.check_sampling`'s, the same for `sample.*` in a config:
    temperature, top_k, top_p, repetition_penalty, max_new_tokens, num_samples, seed, stop.
    None means "not given" (top_k: off).
    """
    def fail(name, value, accepted):
        shown = {"repetition_penalty": "repetition penalty", "stop": "stop string"}.get(name, name.replace("_", "-"))
        raise ConfigError(f"{shown} {value!r} is not accepted: expected {accepted}")

    check_sampling(fail, **options)


def apply_repetition_penalty(logits: torch.Tensor, present: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty: tokens already present get less likely, whatever their logit's sign.

    logits: (B, V); present: (B, V) bool, True for tokens already in the row's sequence.
    Positive logits of present tokens are divided by `penalty`, negative ones multiplied by it
    (dividing a negative logit would make the token more likely). Returns a new (B, V) tensor.
    """
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)  # (B, V)
    return torch.where(present, penalized, logits)


def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V) bool: the smallest set of most likely tokens whose probability reaches top_p.

    A token is kept when the tokens ranked above it hold less than top_p in total, so the
    most likely token is always kept, and the set stops at the first token that makes the
    total reach top_p. probs: (B, V), each row summing to 1.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V) each
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V): probability ranked above
    keep_sorted = mass_above < top_p  # (B, V) in sorted order
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)  # back to vocabulary order


def sample_next_token(logits: torch.Tensor, generator: Generators = None, temperature: float = 1.0,
                      top_k: Optional[int] = None, top_p: float = 1.0) -> torch.Tensor:
    """Draw one token per row. logits: (B, V) -> token ids (B,), int64.

    temperature 0: argmax (greedy), nothing is drawn. Otherwise logits are divided by the
    temperature, top_k (None or 0: off) keeps the k largest (ties with the k-th are kept),
    top_p (1: off) keeps the nucleus (see `nucleus_mask`), and one token is drawn per row.

    generator: one `torch.Generator` for the whole batch, or a sequence of one per row. With
    one per row, a row's draw depends on its own logits and generator only, so a row of a
    batch gets exactly the token it would get decoded alone. None uses torch's global one.
    Does not modify `logits`. Options are assumed valid (see `check_sampling_options`).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    logits = logits.float() / temperature  # (B, V), a new tensor
    if top_k and top_k < logits.size(-1):
        kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p < 1.0:
        probs = probs * nucleus_mask(probs, top_p)  # multinomial needs no renormalising
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    if len(generator) != probs.size(0):
        raise ValueError(f"{len(generator)} generators for a batch of {probs.size(0)} rows")
    draws = [torch.multinomial(probs[i:i + 1], 1, generator=g) for i, g in enumerate(generator)]
    return torch.cat(draws).squeeze(-1)  # (B,)


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
    check_sampling_options(temperature=temperature, top_k=top_k, top_p=top_p,
                           repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens)
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


# ----------------------------------------------------------------------------- 4. text


class IncrementalDetokenizer:
    """One sequence's token ids in, its new text out, one token at a time.

    Decoding each token alone is wrong when a character spans several tokens (byte-level
    BPE) and for decoders whose output depends on the neighbours, so each push decodes a
    short window of recent ids with and without the newest and returns the difference. Text
    ending in U+FFFD (an incomplete UTF-8 character) is held until the next token completes
    it; a character-level [UNK], which decodes to U+FFFD, is therefore shown one token late.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] are decoded for context only
        self.read = 0  # ids[read:] have not been shown yet

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        shown = self.tokenizer.decode(self.ids[self.prefix:self.read])
        text = self.tokenizer.decode(self.ids[self.prefix:])
        if len(text) > len(shown) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(shown):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back, incomplete characters included."""
        shown = self.tokenizer.decode(self.ids[self.prefix:self.read])
        text = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(shown):]


class StopStringFilter:
    """Passes text through until a stop string appears; the stop string is never passed.

    Text that could be the start of a stop string ("\\n" while waiting for "\\n\\n") is held
    back until the next text shows whether it is. Because of that, a stop string can only
    begin in the held-back text, so searching that is enough.
    """

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = list(stop)
        self.pending = ""  # held back, not yet passed
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        starts = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if starts:
            self.stopped = True
            passed, self.pending = self.pending[:min(starts)], ""
            return passed
        cut = len(self.pending) - self._held()
        passed, self.pending = self.pending[:cut], self.pending[cut:]
        return passed

    def flush(self) -> str:
        """The held-back text, at the end of a sample that did not stop on a stop string."""
        passed, self.pending = ("" if self.stopped else self.pending), ""
        return passed

    def _held(self) -> int:
        """Length of the longest end of `pending` that is a proper start of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(s[:n]):
                    longest = n
                    break
        return longest


def encode_prompt(tokenizer, prompt: str, context_length: int) -> list[int]:
    """Token ids of the prompt, with a PromptWarning for what cannot be used as given.

    An empty prompt starts from the end-of-text token (a document boundary, what the model
    saw before every document), or from a newline when the tokenizer has none. Characters
    the tokenizer cannot represent (never seen by a character-level one) become [UNK]; a
    prompt longer than the context keeps only its last `context_length` tokens.
    """
    if not prompt:
        if tokenizer.eot_id is not None:
            return [tokenizer.eot_id]
        prompt = "\n"
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8, escaped by Python
        raise DataError(f"the prompt is not valid UTF-8 text (at character {e.start}: "
                        f"{prompt[e.start:e.end]!r})") from None
    ids = tokenizer.encode(prompt)
    if tokenizer.decode(ids) != prompt:  # only then look for the characters at fault
        unknown = [c for c in dict.fromkeys(prompt) if tokenizer.decode(tokenizer.encode(c)) != c]
        if unknown:
            names = ", ".join(repr(c) for c in unknown)
            warnings.warn(f"the prompt has characters the tokenizer has never seen, read as [UNK]: "
                          f"{names}", PromptWarning, stacklevel=3)
    if not ids:
        raise DataError(f"the prompt {prompt!r} encodes to no tokens")
    if len(ids) > context_length:
        warnings.warn(f"the prompt is {len(ids)} tokens, longer than the model's context of "
                      f"{context_length}; only its last {context_length} tokens are used",
                      PromptWarning, stacklevel=3)
    return ids


# ----------------------------------------------------------------------------- 5. prompt to text


class SamplePiece(NamedTuple):
    sample: int  # which sample, 0-based
    text: str  # new text of that sample (may be empty on its last piece)
    finish_reason: Optional[str] = None  # on a sample's last piece: "stop", "eot" or "length"


def generate_samples(model, tokenizer, prompt: str, num_samples: int = 1, *, max_new_tokens: int = 500,
                     temperature: float = 0.8, top_k: Optional[int] = None, top_p: float = 1.0,
                     repetition_penalty: float = 1.0, stop: Sequence[str] = (), seed: Optional[int] = None,
                     generators: Optional[Sequence[torch.Generator]] = None,
                     compile: bool = False) -> Iterator[SamplePiece]:
    """Continue `prompt` `num_samples` times, decoded together as one batch.

    Pieces come in sample order: sample 0 streams token by token as it is produced; text of
    later samples produced meanwhile is held and comes out as soon as every earlier sample has
    ended, then that sample streams live in turn. Each sample's last piece has its
    `finish_reason`: "stop" (a stop string, not included), "eot" (the end-of-text token, not
    included) or "length" (max_new_tokens reached).

    Sample i draws from its own generator, seeded with `seed + i` (seed None: a fresh random
    seed), so sample i equals the single sample of a run with seed `seed + i`. `generators`
    (one per sample) replaces the seeding. `compile=True` compiles the one-token step
    (`compile_decode_step`): the same text, faster per token, after a compile that only long
    generations repay.
    """
    check_sampling_options(temperature=temperature, top_k=top_k, top_p=top_p,
                           repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens,
                           num_samples=num_samples, seed=seed, stop=stop)
    device = next(model.parameters()).device
    generators = sample_generators(num_samples, seed, generators, device)
    ids = encode_prompt(tokenizer, prompt, model.config.context_length)
    prompt_ids = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # (S, T)
    streams = SampleStreams(tokenizer, num_samples, stop)
    tokens = generate_tokens(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                             top_p=top_p, repetition_penalty=repetition_penalty, generator=generators,
                             compile=compile)
    try:
        for token in tokens:
            streams.push(token.tolist())
            yield from streams.ready()
            if streams.all_ended:
                return
    finally:
        tokens.close()
    streams.end_the_rest("length")
    yield from streams.ready()


def sample_generators(num_samples: int, seed: Optional[int], generators: Optional[Sequence[torch.Generator]],
                      device: torch.device) -> Sequence[torch.Generator]:
    """One generator per sample: sample i seeded with `seed + i` (None: a fresh random seed)."""
    if generators is None:
        if seed is None:
            seed = int.from_bytes(os.urandom(6), "little")
        return [torch.Generator(device=device).manual_seed(seed + i) for i in range(num_samples)]
    if seed is not None or len(generators) != num_samples:
        raise ValueError("pass either a seed or one generator per sample")
    return generators


class SampleStreams:
    """The text of samples decoded together, let out in sample order (see `generate_samples`).

    Each sample has its own detokenizer and stop-string filter; text of a sample whose turn
    to stream has not come is held until every earlier sample has ended.
    """

    def __init__(self, tokenizer, num_samples: int, stop: Sequence[str]):
        self.eot_id = tokenizer.eot_id
        self.detokenizers = [IncrementalDetokenizer(tokenizer) for _ in range(num_samples)]
        self.filters = [StopStringFilter(stop) for _ in range(num_samples)]
        self.finished: list[Optional[str]] = [None] * num_samples  # finish reason of each sample
        self.held = [""] * num_samples  # text not let out yet
        self.current = 0  # the sample streaming now; all before it have ended

    @property
    def all_ended(self) -> bool:
        return self.current == len(self.finished)

    def push(self, token_ids: list[int]) -> None:
        """The next token of every sample; a sample that has ended ignores its own."""
        for i, token_id in enumerate(token_ids):
            if self.finished[i] is not None:
                continue  # its row keeps being computed with the batch, but is ignored
            if token_id == self.eot_id:
                self.end(i, "eot")
                continue
            self.held[i] += self.filters[i].push(self.detokenizers[i].push(token_id))
            if self.filters[i].stopped:
                self.end(i, "stop")

    def end(self, i: int, reason: str) -> None:
        text = self.filters[i].push(self.detokenizers[i].flush())
        self.finished[i] = "stop" if self.filters[i].stopped else reason
        self.held[i] += text + self.filters[i].flush()

    def end_the_rest(self, reason: str) -> None:
        for i, finished in enumerate(self.finished):
            if finished is None:
                self.end(i, reason)

    def ready(self) -> Iterator[SamplePiece]:
        """Pieces that may go out now, in sample order."""
        while not self.all_ended:
            i = self.current
            text, self.held[i] = self.held[i], ""
            if self.finished[i] is None:
                if text:
                    yield SamplePiece(i, text)
                return
            yield SamplePiece(i, text, self.finished[i])
            self.current += 1


def generate(model, tokenizer, prompt: str, *, max_new_tokens: int = 500, temperature: float = 0.8,
             top_k: Optional[int] = None, top_p: float = 1.0, repetition_penalty: float = 1.0,
             stop: Sequence[str] = (), seed: Optional[int] = None,
             generator: Optional[torch.Generator] = None, compile: bool = False) -> Iterator[str]:
    """Continue `prompt` once, yielding the new text piece by piece as it is produced.

    `"".join(generate(...))` is the whole continuation (the prompt not included). Give a
    `seed` or a `generator` (on the model's device) to fix the text; see `generate_samples`
    for the options and for several samples at once.
    """
    pieces = generate_samples(model, tokenizer, prompt, 1, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p,
                              repetition_penalty=repetition_penalty, stop=stop, seed=seed,
                              generators=None if generator is None else [generator], compile=compile)
    for piece in pieces:
        if piece.text:
            yield piece.text


# ----------------------------------------------------------------------------- 6. speed on the CPU


def inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype to run a model in for generation: "auto", "fp32", "bf16" or "fp16".

    auto follows `runtime.select_precision`: bf16 on CUDA (fp16 where bf16 is missing) and
    on a CPU with fast bf16 (`cpu.cpu_bf16_is_fast`: AVX512-BF16 or AMX units, read
    from the CPU's flags without timing anything; only where flags cannot tell, as on ARM,
    a short matmul measurement kept on disk once per machine); fp32 elsewhere. On such a
    CPU bf16 also decodes faster at batch 1, where each token reads every weight once and
    bf16 weights are half the bytes (scripts/bench_decode.py).
    """
    return select_precision(name, device).autocast_dtype or torch.float32
