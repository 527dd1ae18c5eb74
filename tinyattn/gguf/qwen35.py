"""A gated model in GGUF: what llama.cpp's `qwen35` needs besides qwen3's keys and tensors.

A model trained with `model.attention_gate` (and `model.qk_norm`) is Qwen3.5's text model with
every layer full attention (`tinyattn.hf.convert`). llama.cpp holds it as `qwen35`: each
head's query rows and then its gate rows in `attn_q` (the order transformers keeps), the norm
before the MLP named `post_attention_norm`, and every gain as itself (transformers stores
Qwen3.5's less 1; llama.cpp's converter adds the 1 back).

**One layer more than the model.** Qwen3.5 interleaves linear-attention (gated delta net)
layers with its full-attention ones, and llama.cpp runs qwen35 only as such a hybrid: a file
with no linear-attention layer loads but stops at its first token (`GGML_ASSERT(buffer)` in
`llm_graph_input_mem_hybrid::set_input`, llama-cpp-python 0.3.36: the recurrent state's input
has no layer to read it). So after the model's layers the file holds one linear-attention
layer whose two output projections, `ssm_out` and `ffn_down`, are zero (`pass_through_layer`).
A layer that adds exactly 0 to the residual stream changes no logit; the tests compare
llama.cpp's logits with tinyattn's. Its recurrent state is as small as the format allows (one
head of one dimension); its MLP has the model's width, since llama.cpp reads one width for
every layer: 3 x C x hidden zeros more, stored as Q4_0 blocks of scale 0 (`stored_dtype`).

**RoPE.** qwen35 rotates each head's two halves, as tinyattn does, in sections meant for
images: the first three take a text token's position and the fourth takes 0
(`rope_sections`).
"""

from __future__ import annotations

import torch

from tinyattn.config import ModelConfig

APPENDED_LAYERS = 1  # the pass-through layer after the model's
CONV_KERNEL = 4  # Qwen3.5's; the appended layer's convolution has zero weights whatever its width
Q4_0_BLOCK = 32  # values a Q4_0 block holds (one scale, 32 four-bit numbers)


def add_metadata(writer, config: ModelConfig) -> None:
    """qwen35's keys besides qwen3's (the block count, which counts the appended layer, is the
    caller's): which layers are linear attention, the RoPE sections, and the linear-attention
    sizes (one head of one dimension: only the appended layer has any)."""
    writer.add_array(f"{writer.arch}.attention.recurrent_layers",
                     [False] * config.n_layer + [True] * APPENDED_LAYERS)
    writer.add_rope_dimension_sections(rope_sections(config.head_dim))
    writer.add_ssm_conv_kernel(CONV_KERNEL)
    writer.add_ssm_state_size(1)
    writer.add_ssm_group_count(1)
    writer.add_ssm_time_step_rank(1)
    writer.add_ssm_inner_size(1)


def stored_dtype(name: str, config: ModelConfig, dtype: str) -> str:
    """The dtype tensor `name` is written in: the file's `dtype`, but float32 for the convolution
    (llama.cpp convolves only with float32 weights, as its converter writes them) and "q4_0" for
    the appended layer's zero MLP matrices where their rows split into Q4_0's blocks of 32: a
    block with scale 0 holds 0 exactly, in under a seventh of float32's bytes."""
    if name.endswith(".ssm_conv1d.weight"):
        return "fp32"
    appended = tuple(f"blk.{config.n_layer}.ffn_{part}.weight" for part in ("gate", "up", "down"))
    row = config.hidden_dim if name.endswith(".ffn_down.weight") else config.n_embd
    return "q4_0" if name in appended and row % Q4_0_BLOCK == 0 else dtype


def rope_sections(head_dim: int) -> list[int]:
    """The four sections of a head's D/2 rotated pairs. llama.cpp gives pair i the position of
    section i % 3 (Qwen3.5's interleaved layout) while i < 3 x that section's size, else the
    fourth's: sizing the first three to the pairs of each residue puts every pair on the token's
    position, and none on the fourth (0 for text)."""
    pairs = head_dim // 2
    return [len(range(residue, pairs, 3)) for residue in range(3)] + [0]


def pass_through_layer(index: int, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The appended linear-attention layer's tensors, by llama.cpp's names (see the module
    docstring): zero projections, unit gains, shaped as torch holds a (out, in) matrix."""
    width, hidden = config.n_embd, config.hidden_dim
    channels = 3  # the convolution's: query, key and value of one dimension each
    layer = f"blk.{index}."
    return {
        layer + "attn_norm.weight": torch.ones(width),
        layer + "post_attention_norm.weight": torch.ones(width),
        layer + "attn_qkv.weight": torch.zeros(channels, width),
        layer + "attn_gate.weight": torch.zeros(1, width),
        layer + "ssm_conv1d.weight": torch.zeros(channels, CONV_KERNEL),
        layer + "ssm_dt.bias": torch.zeros(1),
        layer + "ssm_a": torch.zeros(1),
        layer + "ssm_beta.weight": torch.zeros(1, width),
        layer + "ssm_alpha.weight": torch.zeros(1, width),
        layer + "ssm_norm.weight": torch.ones(1),
        layer + "ssm_out.weight": torch.zeros(width, 1),  # nothing from the linear attention
        layer + "ffn_gate.weight": torch.zeros(hidden, width),
        layer + "ffn_up.weight": torch.zeros(hidden, width),
        layer + "ffn_down.weight": torch.zeros(width, hidden),  # nothing from the MLP
    }
