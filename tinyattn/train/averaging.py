"""An exponential moving average of the weights: what a run evaluates and saves when train.ema is set.

After every optimizer step each averaged tensor moves a fraction (1 - decay) of the way to
its weight:

    average_t = decay * average_(t-1) + (1 - decay) * weight_t,    average_0 = weight_0

so it weighs the last ~1 / (1 - decay) steps most (decay 0.98: about 50). The optimizer
keeps stepping the weights themselves; the average only reads them. Each step's weights carry
the noise of its batch; their average over the last few dozen steps carries less of it, which
is what the decay of the learning rate buys too, more slowly (what it gains is measured in
docs/BENCHMARKS.md, "Learning more per token").

`WeightAverage` holds one fp32 tensor per trainable parameter. `evaluated()` puts the
averages into the model for the length of a block (copies, so a compiled or DDP-wrapped
module keeps its own tensors) and the trained weights back after it; a checkpoint saves the
averages as "model", which every reader of checkpoints (generate, export, eval) loads, and the
trained weights beside them for resuming (`tinyattn.train.trainer`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn


class WeightAverage:
    """The moving average of `model`'s trainable parameters, started at their current values.

    It holds the parameters themselves (loading a checkpoint copies into them, so they stay
    the model's), and their names for the checkpoint's keys."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the average's decay must be between 0 and 1, got {decay}")
        self.model = model
        self.decay = decay
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.restart()

    def restart(self) -> None:
        """Start again from the model's weights now (after weights were loaded into it)."""
        self.averages = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average toward the model's weights now."""
        torch._foreach_lerp_(self.averages, [p.detach().float() for p in self.params], 1.0 - self.decay)

    @contextmanager
    def evaluated(self) -> Iterator[None]:
        """Inside the block the model holds the averages; after it, its own weights again."""
        with torch.no_grad():
            trained = [p.detach().clone() for p in self.params]
            torch._foreach_copy_(self.params, self.averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, trained)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """`model.state_dict()` as it is with the averages in: every name of a shared weight (a
        tied head's too) holds the average, in the parameter's dtype."""
        with self.evaluated():
            return {name: tensor.clone() for name, tensor in self.model.state_dict().items()}

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take the averages back from what `model_state_dict` returned."""
        missing = [name for name in self.names if name not in state]
        if missing:
            raise KeyError(f"the saved average has no {missing[0]!r}")
        self.averages = [state[name].detach().float().clone().to(average.device)
                         for name, average in zip(self.names, self.averages)]
