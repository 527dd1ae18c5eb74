"""An LSTM language model to set beside the attention model (`tinyattn lab recurrence`).

`LSTMLanguageModel`: token embedding -> `torch.nn.LSTM` (n_layer layers, width C) -> final
RMSNorm -> a head over the vocabulary, tied to the embedding as in `LanguageModel`. Its
forward takes and returns what `LanguageModel.forward` does for training and evaluation
(`idx`, `targets` -> `ModelOutput`), and its parts carry the same names (`token_embedding`,
`head`), so the trainer, the optimizer's parameter groups and the evaluation code take it
unchanged. It has no attention, no KV cache and no position encoding: the recurrence is
the order. `lstm_width_for` picks the width whose parameter count matches a given model's.

Shapes: B batch, T sequence length, C width, V vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyattn.model.transformer import IGNORE_INDEX, ModelOutput


@dataclass
class LSTMConfig:
    vocab_size: int
    n_embd: int  # the LSTM's width (hidden and cell state), and the embedding's
    n_layer: int = 2
    context_length: int = 64  # only what evaluation reads; an LSTM takes any length
    dropout: float = 0.0


class LSTMLanguageModel(nn.Module):
    """Token embedding -> LSTM -> final norm -> tied head; the `LanguageModel` training interface."""

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.lstm = nn.LSTM(config.n_embd, config.n_embd, num_layers=config.n_layer, batch_first=True,
                            dropout=config.dropout if config.n_layer > 1 else 0.0)
        self.final_norm = nn.RMSNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight
        with torch.no_grad():
            # As LanguageModel.init_weights: with a tied head, std 1 / C starts every logit near 0
            # (the loss near ln V). The LSTM keeps torch's uniform(+-1/sqrt(C)) initialisation.
            self.token_embedding.weight.copy_(torch.randn(self.token_embedding.weight.shape) / config.n_embd)

    def num_parameters(self) -> int:
        """Parameter count; the tied head is counted once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None) -> ModelOutput:
        """idx: (B, T) token ids; targets: (B, T) next-token ids (IGNORE_INDEX: not counted)."""
        B, T = idx.shape
        x = self.token_embedding(idx)  # (B, T, C)
        hidden, _ = self.lstm(x)  # (B, T, C): each position has read only itself and earlier ones
        # In fp32, as LanguageModel's final norm reads its residual stream: under bf16 autocast the LSTM
        # gives bf16, which the fp32 gain would meet in torch's slower unfused path (with a warning).
        logits = self.head(self.final_norm(hidden.float()))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T),
                                   ignore_index=IGNORE_INDEX)
        return ModelOutput(logits, loss, None)


def lstm_parameters(vocab_size: int, width: int, n_layer: int) -> int:
    """What `LSTMLanguageModel.num_parameters` gives, without building it."""
    per_layer = 4 * width * (width + width) + 2 * 4 * width  # input and hidden matrices, two biases
    return vocab_size * width + n_layer * per_layer + width  # + tied embedding, + final norm gain


def lstm_width_for(parameters: int, vocab_size: int, n_layer: int) -> int:
    """The width whose LSTMLanguageModel has the parameter count nearest `parameters`."""
    # 8 L C^2 + (V + 8 L + 1) C = parameters, solved for C, then the nearer whole width either side.
    a, b = 8 * n_layer, vocab_size + 8 * n_layer + 1
    width = (-b + math.sqrt(b * b + 4 * a * parameters)) / (2 * a)
    candidates = [max(1, math.floor(width)), max(1, math.ceil(width))]
    return min(candidates, key=lambda c: abs(lstm_parameters(vocab_size, c, n_layer) - parameters))
