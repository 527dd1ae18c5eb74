"""From a prompt to a stream of text: detokenizing, stop strings, samples in order.

Steps 4 and 5 of generation (1 is `tinyattn.generate.sampling`, 2, 3 and 6
`tinyattn.generate.decoder`, whose token loop this file turns into text):

4. Text: `IncrementalDetokenizer` turns ids into text one token at a time (a character may
   span several byte-level tokens), `StopStringFilter` holds back text that could be the
   start of a stop string until it is resolved, so a stop string is never shown.
5. `generate` (one sample, yields str) and `generate_samples` (several, decoded together as
   one batch, yields `SamplePiece`; `SampleStreams` lets their text out in sample order).
"""

from __future__ import annotations

import os
import warnings
from typing import Iterator, NamedTuple, Optional, Sequence

import torch

from tinyattn.data.tokenizer import unknown_characters
from tinyattn.errors import DataError, counted
from tinyattn.generate.decoder import cache_positions, check_caches_fit, generate_tokens
from tinyattn.generate.sampling import SamplingOptions, sample_seed


class PromptWarning(UserWarning):
    """The prompt was used, but not exactly as given (too long, unknown characters)."""


# ----------------------------------------------------------------------------- 4. text


class IncrementalDetokenizer:
    """One sequence's token ids in, its new text out, one token at a time.

    Decoding each token alone is wrong when a character spans several tokens (byte-level
    BPE) and for decoders whose output depends on the neighbours, so each push decodes a
    short window of recent ids with and without the newest and returns the difference. Text
    ending in U+FFFD (an incomplete UTF-8 character) is held until the next token completes
    it; a character-level [UNK], which decodes to U+FFFD, is therefore shown one token late.

    context: the ids just before the first one pushed (the prompt's last few, from a character
    boundary: `detokenizer_context`), decoded with it and never shown. A decoder that treats the
    start of a text differently (SentencePiece's `Strip` drops the space a first "▁word" carries)
    then gives the first new token the text it has in the middle of one.
    """

    def __init__(self, tokenizer, context: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context)
        self.prefix = 0  # ids[prefix:read] are decoded for context only
        self.read = len(self.ids)  # ids[read:] have not been shown yet

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

    An empty prompt starts from the start token: the end-of-text token (a document boundary,
    what the model saw before every document), or an imported folder's bos; from a newline when
    the tokenizer has neither. A prompt gets the bos in front where the folder's tokenizer adds
    it (`text_start`), as transformers' `tokenizer(prompt)` does. Characters the tokenizer cannot
    represent (never seen by a character-level one) become [UNK]; a prompt longer than the
    context keeps only its last `context_length` tokens.
    """
    if not prompt:
        if tokenizer.start_id is not None:
            return [tokenizer.start_id]
        prompt = "\n"
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8, escaped by Python
        raise DataError(f"the prompt is not valid UTF-8 text (after {counted(e.start, 'character')}: "
                        f"{prompt[e.start:e.end]!r})") from None
    ids = tokenizer.encode(prompt)
    unknown = unknown_characters(tokenizer, prompt, ids)
    if unknown:
        names = ", ".join(repr(c) for c in unknown)
        warnings.warn(f"the prompt has characters the tokenizer has never seen, read as [UNK]: "
                      f"{names}", PromptWarning, stacklevel=3)
    if not ids:
        raise DataError(f"the prompt {prompt!r} encodes to no tokens")
    ids = tokenizer.text_start + ids
    if len(ids) > context_length:
        warnings.warn(f"the prompt is {len(ids)} tokens, longer than the model's context of "
                      f"{context_length}; only its last {context_length} tokens are used",
                      PromptWarning, stacklevel=3)
    return ids


# ----------------------------------------------------------------------------- 5. prompt to text


DETOKENIZER_CONTEXT = 4  # prompt ids each sample's detokenizer starts from (`IncrementalDetokenizer`)
DETOKENIZER_CONTEXT_REACH = 32  # how much further back `detokenizer_context` looks for a character boundary


def detokenizer_context(tokenizer, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's last few ids for `IncrementalDetokenizer`'s context, from a character boundary.

    SentencePiece's `ByteFallback` decodes a run of byte tokens as one group ("<0xE6><0x97><0xA5>"
    is "日"), every byte U+FFFD if the group is not UTF-8: a context starting inside a character
    would make the generated byte tokens that join its run U+FFFD too. So the context moves back
    from the last DETOKENIZER_CONTEXT ids until its text is the end of the whole prompt's text,
    at most DETOKENIZER_CONTEXT_REACH ids further (else the last DETOKENIZER_CONTEXT, as found).
    Special tokens that open it (an empty prompt's `<s>` or `</s>`) are left out: a decoder's
    `Strip` would take its one leading space from their text instead of the first word's, which
    then began with a space transformers' decoding does not have.
    """
    whole = tokenizer.decode(prompt_ids)
    last = max(0, len(prompt_ids) - DETOKENIZER_CONTEXT)
    context = list(prompt_ids[last:])
    for start in range(last, max(-1, last - DETOKENIZER_CONTEXT_REACH - 1), -1):
        if whole.endswith(tokenizer.decode(prompt_ids[start:])):
            context = list(prompt_ids[start:])
            break
    special = getattr(tokenizer, "special_ids", frozenset())
    while context and context[0] in special:
        context.pop(0)
    return context


class SamplePiece(NamedTuple):
    sample: int  # which sample, 0-based
    text: str  # new text of that sample (may be empty on its last piece)
    finish_reason: Optional[str] = None  # on a sample's last piece: "stop", "eot" or "length"
    tokens: int = 0  # on a sample's last piece: the tokens generated for it, the one that ended it included


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
    included) or "length" (max_new_tokens reached). `stop`: one stop string, or a sequence of them.

    Sample i draws from its own generator, seeded with `seed + i` (wrapping past 2**63 - 1 to 0,
    `sampling.sample_seed`; seed None: a fresh random seed), so sample i equals the single sample
    of a run with that seed (exactly in fp32; in bf16 or with fp16 row copies a batch rounds
    differently from one sequence). `generators` (one per sample) replaces the seeding.
    `compile=True` compiles the one-token step (`compile_decode_step`): the same text in fp32 (in bf16, or where the model keeps fp16 row
    copies, rounding can part the texts after some tokens), faster per token, after a compile that
    only long generations repay.
    """
    # The one check of the call's options, before anything is decoded; stream_samples trusts them.
    options = SamplingOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                              top_p=top_p, repetition_penalty=repetition_penalty, num_samples=num_samples,
                              seed=seed, stop=stop)
    return stream_samples(model, tokenizer, prompt, options, generators=generators, compile=compile)


def stream_samples(model, tokenizer, prompt: str, options: SamplingOptions, *,
                   generators: Optional[Sequence[torch.Generator]] = None,
                   compile: bool = False) -> Iterator[SamplePiece]:
    """`generate_samples` with options already checked: the pieces of `options.num_samples` samples."""
    o = options
    device = next(model.parameters()).device
    ids = encode_prompt(tokenizer, prompt, model.config.context_length)
    if o.max_new_tokens > 0:  # before anything is made per sample (a million generators take seconds)
        positions = cache_positions(model, len(ids), o.max_new_tokens, compile)
        eager_whole = cache_positions(model, len(ids), o.max_new_tokens) >= model.config.context_length
        check_caches_fit(model, o.num_samples, positions, compile, eager_whole=eager_whole)
    generators = sample_generators(o.num_samples, o.seed, generators, device)
    prompt_ids = torch.tensor([ids] * o.num_samples, dtype=torch.long, device=device)  # (S, T)
    streams = SampleStreams(tokenizer, o.num_samples, o.stop, prompt_ids=ids)
    tokens = generate_tokens(model, prompt_ids, o.max_new_tokens, temperature=o.temperature, top_k=o.top_k,
                             top_p=o.top_p, repetition_penalty=o.repetition_penalty, generator=generators,
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
    """One generator per sample: sample i seeded with `sample_seed(seed, i)`, seed + i wrapped
    below 2**63 (None: a fresh random seed)."""
    if generators is None:
        if seed is None:
            seed = int.from_bytes(os.urandom(6), "little")
        return [torch.Generator(device=device).manual_seed(sample_seed(seed, i)) for i in range(num_samples)]
    if seed is not None or len(generators) != num_samples:
        raise ValueError("pass either a seed or one generator per sample")
    return generators


class SampleStreams:
    """The text of samples decoded together, let out in sample order (see `generate_samples`).

    Each sample has its own detokenizer and stop-string filter; text of a sample whose turn
    to stream has not come is held until every earlier sample has ended. `prompt_ids`: the ids
    the samples continue; the detokenizers read their end (`detokenizer_context`).
    """

    def __init__(self, tokenizer, num_samples: int, stop: Sequence[str], prompt_ids: Sequence[int] = ()):
        self.stop_ids = getattr(tokenizer, "stop_ids", {tokenizer.eot_id})  # eot_id, a folder's other eos ids
        context = detokenizer_context(tokenizer, prompt_ids)
        self.detokenizers = [IncrementalDetokenizer(tokenizer, context) for _ in range(num_samples)]
        self.filters = [StopStringFilter(stop) for _ in range(num_samples)]
        self.finished: list[Optional[str]] = [None] * num_samples  # finish reason of each sample
        self.held = [""] * num_samples  # text not let out yet
        self.generated = [0] * num_samples  # tokens pushed for each sample until it ended
        self.current = 0  # the sample streaming now; all before it have ended

    @property
    def all_ended(self) -> bool:
        return self.current == len(self.finished)

    def push(self, token_ids: list[int]) -> None:
        """The next token of every sample; a sample that has ended ignores its own."""
        for i, token_id in enumerate(token_ids):
            if self.finished[i] is not None:
                continue  # its row keeps being computed with the batch, but is ignored
            self.generated[i] += 1
            if token_id in self.stop_ids:
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
            yield SamplePiece(i, text, self.finished[i], self.generated[i])
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
