"""Dropout on the embedding and the residual branches, at a fraction of its CPU cost.

`nn.Dropout` draws one random number per element. On a CPU that draw is most of its cost,
and under torch.compile inductor's own generator is slower still: on the main job in bf16,
dropout 0.1 on the embedding and the eight residual branches made a step markedly slower
(the figures: docs/BENCHMARKS.md, "Dropout on a CPU"). `Dropout` here keeps or zeroes each element with
the same probabilities and scales the kept ones by 1 / (1 - p), as `nn.Dropout` does, but on
the CPU it draws the mask from 32-bit random integers, two elements per draw:

    each 32-bit draw -> two 15-bit numbers u, uniform on [0, 32768)
    keep = u >= round(p * 32768)           (p to within 1/65536)

The draw is one custom operator (`tinyattn::keep_mask`), so torch.compile calls it as it is
(no graph break, no inductor generator) and fuses the multiplication around it. It takes
its numbers from torch's default generator, which a checkpoint saves and a resume restores.
On a GPU the kernel's own dropout is already cheap, and `Dropout` is `F.dropout` there.
One caveat of an operator that compile sees as a function of its input: two masks of the very
same tensor in one compiled graph may be merged into one (common-subexpression elimination);
the model drops each tensor once, so this never arises there.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVELS = 1 << 15  # the numbers each draw is split into are uniform on [0, LEVELS)


@torch.library.custom_op("tinyattn::keep_mask", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def keep_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """A bool tensor shaped like `like`: True (keep) with probability 1 - round(p * 2^15) / 2^15."""
    n = like.numel()
    draws = torch.empty((n + 1) // 2, dtype=torch.int32, device=like.device).random_()  # [0, 2^31)
    numbers = draws.view(torch.int16)[:n].view(like.shape) & (LEVELS - 1)  # two 15-bit numbers each
    threshold = round(p * LEVELS)
    if threshold >= LEVELS:  # p within 1/65536 of 1: no 15-bit number reaches it, none is kept (int16
        return torch.zeros_like(numbers, dtype=torch.bool)  # holds no LEVELS: -LEVELS would keep all)
    return numbers >= threshold


@keep_mask.register_fake
def _(like: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.bool, device=like.device)


class Dropout(nn.Module):
    """In training, each element zeroed with probability p and the rest scaled by 1 / (1 - p);
    in evaluation, the identity. `p` may be changed between calls."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return x * keep_mask(x, self.p).to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"
