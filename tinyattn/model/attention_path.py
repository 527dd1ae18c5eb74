"""Which of the two attention paths (equal numbers, tested) is faster on this hardware."""

from __future__ import annotations

import torch

from tinyattn.system.device import Precision


def prefer_explicit_attention(device: torch.device, precision: Precision | str, context_length: int,
                              weights_dropout: float) -> bool:
    """Whether training should use the explicit attention path instead of the fused kernel.

    On a 2-core AVX512-BF16 CPU, in bf16, forward plus backward of causal attention with
    plain batched matmuls beat PyTorch's CPU flash kernel up to context 512 and lost
    beyond (the figures: docs/BENCHMARKS.md). With attention dropout the fused kernel wins
    again (it draws the dropout mask inside the kernel; the explicit path materialises it).
    On GPUs and in fp32 the fused kernel wins. precision: resolved, or its name.
    """
    name = precision if isinstance(precision, str) else precision.name
    return (device.type == "cpu" and name == "bf16" and context_length <= 512
            and weights_dropout == 0.0)


def attention_path(setting: str, device: torch.device, precision: Precision, model_config) -> str:
    """`model.attention` resolved for this hardware: "fused" or "explicit"."""
    if setting != "auto":
        return setting
    # The attention weights' own dropout decides: dropout on the residual branches alone
    # (model.attention_dropout: 0) leaves the explicit path the faster one.
    explicit = prefer_explicit_attention(device, precision, model_config.context_length,
                                         model_config.weights_dropout)
    return "explicit" if explicit else "fused"
