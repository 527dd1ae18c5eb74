"""What a model costs before it exists: its parameter count and the memory a training step needs.

`parameter_count(config)` is the number `LanguageModel(config).num_parameters()` returns,
computed from the config alone (tests hold the two equal on several tiny models).
`training_memory(model, train)` adds what one training step holds: the fp32 weights,
their gradients and the optimizer's state (train.ema's average and the copy an evaluation
sets aside too), and the activations one micro-batch keeps
for the backward pass. `check_training_fits` compares that with the memory the device
has free (psutil, else Linux's /proc/meminfo; a GPU's own count) and refuses, in one
line naming both figures, a run that cannot fit, so a mistyped
`--set model.n_layer=100000` ends before any tensor or run folder exists.

The estimate is a floor, not a ceiling: it counts the tensors a step cannot do without
(activations in the narrowest precision the run may use, nothing for the allocator's
slack or the framework), so a refused run could never have fitted, while a run that
passes may still be tight.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from tinyattn.config import ModelConfig, TrainConfig
from tinyattn.errors import ConfigError, counted
from tinyattn.model.attention_path import prefer_explicit_attention

FP32 = 4  # bytes


def parameter_count(config: ModelConfig, vocab_size: Optional[int] = None) -> int:
    """Parameters of `LanguageModel(config)` (a tied head counted once), without building it.

    vocab_size: used when config.vocab_size is still None (before the tokenizer is known).
    """
    c, vocab = config, (config.vocab_size if config.vocab_size is not None else vocab_size or 0)
    width, hidden = c.n_embd, c.hidden_dim
    per_layer = (width  # attention_norm
                 + width * sum(c.qkv_rows)  # qkv: (C + 2 Hkv D [+ C], C)
                 + 2 * width * (c.attention_gate_rank or 0)  # a gate of rank r: (r, C) and (C, r)
                 + width * width  # output: (C, C)
                 + (2 * c.head_dim if c.qk_norm else 0)  # q_norm, k_norm
                 + width  # mlp_norm
                 + width * 2 * hidden  # gate_up: (2 hidden, C)
                 + hidden * width)  # down: (C, hidden)
    heads = 1 if c.tie_embeddings else 2  # embedding (V, C), and an untied head (V, C)
    return heads * vocab * width + c.n_layer * per_layer + width  # + final_norm


@dataclass
class MemoryEstimate:
    parameters: int
    state_bytes: int  # weights, gradients, optimizer state
    activation_bytes: int  # what one micro-batch keeps for backward

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def training_memory(model: ModelConfig, train: TrainConfig, *, vocab_size: Optional[int] = None,
                    explicit_attention: Optional[bool] = None) -> MemoryEstimate:
    """The floor of what one training step of this model holds (see the module docstring).

    explicit_attention: whether the run's attention is the explicit path, which keeps each
    layer's (H, T, T) weights for the backward pass; None: model.attention says "explicit".
    """
    params = parameter_count(model, vocab_size)
    vocab = model.vocab_size if model.vocab_size is not None else vocab_size or 0
    # fp32 weights and gradients, and AdamW's two moments; Muon keeps one for the blocks' matrices.
    per_param = 4 * FP32 if train.optimizer == "adamw" else 3 * FP32
    if train.ema is not None:  # the average, and the copy of the weights an evaluation sets aside
        per_param += 2 * FP32
    element = FP32 if train.precision == "fp32" else 2  # auto may pick bf16: count the narrower
    tokens = train.batch_size * model.context_length  # B * T of one micro-batch
    width, kv_width, hidden = model.n_embd, model.kv_heads * model.head_dim, model.hidden_dim
    # Per layer and token: both norms' inputs and outputs (4C), q, k, v (C + 2 Hkv D), the
    # attention's output (C), gate and up (2 hidden) and their product (hidden); with
    # model.attention_gate the gate's logits and the gated output (2C), and with a gate of rank r the r
    # products between its two matrices.
    gate = 2 * width + (model.attention_gate_rank or 0) if model.attention_gate else 0
    per_token = 6 * width + 2 * kv_width + 3 * hidden + gate
    if explicit_attention is None:
        explicit_attention = model.attention == "explicit"
    # The explicit path keeps the softmax's output (H, T per query), and with dropout on the
    # weights also the dropped copy; the fused kernel keeps neither.
    kept = 1 + (model.weights_dropout > 0) if explicit_attention else 0
    scores = kept * model.n_head * model.context_length
    layers = model.n_layer * tokens * (per_token + scores) * element
    logits = 2 * tokens * vocab * FP32  # the logits and their gradient, fp32 for the loss
    return MemoryEstimate(params, params * per_param, layers + logits)


def available_bytes(device: torch.device) -> tuple[Optional[int], str]:
    """Free memory where the run's tensors live (None: unknown here), and a name for it."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free on {device}"
    where = "of memory available on this machine"
    try:
        import psutil  # a dev dependency, not a core one: /proc/meminfo says the same on Linux
    except ImportError:
        return _meminfo_available(), where
    return psutil.virtual_memory().available, where


def _meminfo_available() -> Optional[int]:
    """Linux's MemAvailable (free memory plus the caches it can drop), None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_training_fits(model: ModelConfig, train: TrainConfig, device: torch.device, *,
                        vocab_size: Optional[int] = None) -> MemoryEstimate:
    """The estimate, or a ConfigError naming it and the limit when it cannot fit on `device`.

    model.attention "auto" counts the explicit path's weights only where it is sure to take it
    (`attention_path.prefer_explicit_attention` with train.precision bf16 as given)."""
    explicit = model.attention == "explicit" or (
        model.attention == "auto" and train.precision == "bf16"
        and prefer_explicit_attention(device, "bf16", model.context_length, model.weights_dropout))
    estimate = training_memory(model, train, vocab_size=vocab_size, explicit_attention=explicit)
    limit, where = available_bytes(device)
    if limit is not None and estimate.total_bytes > limit:
        # Before the tokenizer (the loop's first check) the embedding's and head's size is unknown
        unsized = ("" if (model.vocab_size or vocab_size)
                   else " besides the token embedding and head, which the tokenizer sizes")
        raise ConfigError(
            f"model and train settings need at least {gigabytes(estimate.total_bytes)} to train "
            f"({estimate.parameters:,} parameters{unsized}: {gigabytes(estimate.state_bytes)} of weights, "
            f"gradients and optimizer state; {gigabytes(estimate.activation_bytes)} of activations), "
            f"more than the {gigabytes(limit)} {where}; make model.n_layer, model.n_embd, train.batch_size or"
            " model.context_length smaller")
    return estimate


class KVCachesTooLarge(ConfigError):
    """`check_decoding_fits`' refusal; `shortage` is what does not fit, without the advice (a
    server answers with its own)."""

    def __init__(self, shortage: str, advice: str):
        super().__init__(f"{shortage}; {advice}")
        self.shortage = shortage


def check_decoding_fits(model: ModelConfig, batch_size: int, device: torch.device, dtype: torch.dtype,
                        positions: Optional[int] = None, *, advice: Optional[str] = None) -> None:
    """A ConfigError, before they are made, when the KV caches of `batch_size` sequences decoded
    together (2 * n_layer tensors of (B, kv_heads, positions, head_dim)) cannot fit. positions:
    what the caches hold (`tinyattn.generate.decoder.cache_positions`); None: the whole context.
    advice: what would shrink them, after the shortage (`tinyattn.generate.decoder.caches_advice`;
    None: fewer samples where there are several)."""
    element = torch.empty((), dtype=dtype).element_size()
    positions = positions or model.context_length
    need = 2 * model.n_layer * batch_size * model.kv_heads * positions * model.head_dim * element
    limit, where = available_bytes(device)
    if limit is not None and device.type == "cuda":  # blocks torch keeps reserved are free to it
        limit += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if limit is not None and need > limit:
        if advice is None:
            advice = "ask for fewer samples" if batch_size > 1 else "free some memory first"
        raise KVCachesTooLarge(f"decoding {counted(batch_size, 'sequence')} at once needs {gigabytes(need)} for their KV "
                               f"caches alone, more than the {gigabytes(limit)} {where}", advice)


def gigabytes(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"
