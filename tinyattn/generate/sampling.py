"""Sampling: small pure functions from logits (B, V) to the next token ids.

Generation, from a prompt to a stream of text one token at a time, is told in three files:
this one (1. sampling), `tinyattn.generate.decoder` (2. the cached model, 3. the token loop,
6. speed on the CPU) and `tinyattn.generate.text` (4. text, 5. prompt to text).

1. Sampling. The order is the usual one: repetition penalty -> temperature -> top-k ->
   top-p -> draw. Temperature 0 means greedy (argmax; top-k and top-p then change
   nothing). Every draw takes an explicit `torch.Generator`, so a seed fixes the text.

Departure from a textbook sampler, for the decode hot path: the repetition penalty reads
the tokens already seen as a (B, V) mask, which the token loop updates in place, instead
of scanning the history every step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from tinyattn.config import check_sampling
from tinyattn.errors import ConfigError

Generators = Union[torch.Generator, Sequence[torch.Generator], None]


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


@dataclass(frozen=True)
class SamplingOptions:
    """The options of one generation call, checked once: when made (a ConfigError naming the first refused).

    What takes a SamplingOptions (`tinyattn.generate.text.stream_samples`, and through it the
    token loop and `sample_next_token`) takes the options as valid and checks nothing again.
    The defaults are `SampleConfig`'s.
    """

    max_new_tokens: int = 500
    temperature: float = 0.8  # 0: greedy
    top_k: Optional[int] = None  # None or 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off
    num_samples: int = 1
    seed: Optional[int] = None  # None: a fresh random seed
    stop: tuple[str, ...] = ()  # a str is one stop string, as serve and OpenAI read it

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)  # "ik" is not "i", "k"
        object.__setattr__(self, "stop", stop)
        check_sampling_options(**dataclasses.asdict(self))


SEEDS = 2**63  # a seed is an integer in [0, 2**63): what --seed, sample.seed and torch.manual_seed take


def sample_seed(seed: int, sample: int) -> int:
    """The seed of sample `sample` (from 0) of a call seeded with `seed`: seed + sample, wrapping
    past 2**63 - 1 to 0, so each sample's seed is one a single sample's --seed takes."""
    return (seed + sample) % SEEDS


SHIFT_BELOW = 1e-3  # a temperature below it divides logits shifted to a maximum of 0 (`sample_next_token`)


def apply_repetition_penalty(logits: torch.Tensor, present: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty: tokens already present get less likely, whatever their logit's sign.

    logits: (B, V); present: (B, V) bool, True for tokens already in the row's sequence.
    Positive logits of present tokens are divided by `penalty`, negative ones multiplied by it
    (dividing a negative logit would make the token more likely). Returns a new (B, V) fp32 tensor:
    computed in fp32, as `sample_next_token` samples (fp16's range would hold a logit at 65.5).
    """
    logits = logits.float()  # (B, V)
    penalty = min(penalty, torch.finfo(torch.float32).max)  # 1e39 would be inf, and 0 * inf NaN
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)  # (B, V)
    # A tiny penalty would overflow: held where a temperature of SHIFT_BELOW still divides it finitely.
    limit = torch.finfo(torch.float32).max * SHIFT_BELOW
    return torch.where(present, penalized.clamp(-limit, limit), logits)


def nucleus_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V) bool: the smallest set of most likely tokens whose probability reaches top_p.

    A token is kept when the tokens ranked above it hold less than top_p in total, so the
    most likely token is always kept, and the set stops at the first token that makes the
    total reach top_p. probs: (B, V), each row summing to 1.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V) each
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V): probability ranked above
    keep_sorted = mass_above < top_p  # (B, V) in sorted order
    keep_sorted[:, 0] = True  # the most likely, whatever top_p: one below fp32's smallest compares as 0 here
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
    logits = logits.float()
    if temperature < SHIFT_BELOW:  # shifted so the largest is 0 (the same softmax): no overflow
        logits = logits - logits.amax(dim=-1, keepdim=True)
    # A temperature below fp32's smallest normal (1e-46) would be 0 there: divide by that instead.
    logits = logits / max(temperature, torch.finfo(torch.float32).tiny)  # (B, V), a new tensor
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
