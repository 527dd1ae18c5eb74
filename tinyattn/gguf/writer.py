"""A tinyattn model as one GGUF file, the format llama.cpp (and ollama, LM Studio) loads.

llama.cpp's own `convert_hf_to_gguf.py` refuses an exported Hugging Face folder (it knows
pre-tokenizers by a hash of their vocabulary, and every trained vocabulary hashes anew), so
the file is written here with `gguf`, the format's own Python package. The weights take
the route llama.cpp's converter takes: tinyattn's names become Llama's
(`tinyattn.hf.convert.to_hf_weights`, which splits the stacked q/k/v and gate/up
matrices), and Llama's become llama.cpp's:

    model.embed_tokens.weight                 token_embd.weight
    model.layers.i.input_layernorm.weight     blk.i.attn_norm.weight
    model.layers.i.self_attn.{q,k,v}_proj     blk.i.attn_{q,k,v}.weight
    model.layers.i.self_attn.o_proj           blk.i.attn_output.weight
    model.layers.i.self_attn.{q,k}_norm       blk.i.attn_{q,k}_norm.weight (Qwen3 only)
    model.layers.i.post_attention_layernorm   blk.i.ffn_norm.weight
    model.layers.i.mlp.{gate,up,down}_proj    blk.i.ffn_{gate,up,down}.weight
    model.norm.weight                         output_norm.weight
    lm_head.weight                            output.weight (absent when tied: llama.cpp reuses
                                                             token_embd, as tinyattn does)

A model with `model.attention_gate` goes out as llama.cpp's `qwen35`, with one layer appended
that adds nothing (`tinyattn.gguf.qwen35` says why and how).

RoPE: tinyattn (like Hugging Face) rotates the two halves of each head, dimension i with
i + D/2. llama.cpp's `llama` architecture rotates adjacent pairs (2i with 2i + 1), Meta's
original layout, so the query and key rows of each head are reordered into it
(`interleaved_rope_rows`): first half's row i goes to 2i, second half's to 2i + 1. The
scores q.k are unchanged by a permutation applied to both. A QK-norm model goes out as
llama.cpp's `qwen3`, whose RoPE rotates halves ("neox" style): no reordering there (the
per-head norm weights would have to follow one, and need not).

Norm gains stay float32 at every dtype (llama.cpp's converters keep 1-D tensors so);
matrices are float32, float16 or bfloat16 (`GGUF_DTYPES`), rounded by torch. Logit
soft-capping has no place in any of the three architectures and is refused. The file is written
beside its target and renamed into place, so a failed export leaves no partial file; the
temporary file of one killed mid-write (SIGKILL) is deleted by the next export to that path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tinyattn.checkpoint import file_format
from tinyattn.config import ModelConfig
from tinyattn.data.tokenizer import Tokenizer
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.gguf import qwen35
from tinyattn.gguf.vocab import PRE_TOKENIZER, TOKENIZER_MODEL, gguf_vocab, padded
from tinyattn.hf.convert import norm_eps, refuse_what_neither_computes, to_hf_weights
from tinyattn.system.storage import (TEMPORARY_SUFFIX, new_file_mode, remove_temporaries, storage_errors,
                                     through_link)
from tinyattn.system.choices import GGUF_PRECISIONS

INSTALL_HINT = "pip install 'tinyattn[gguf]'"
ARCHITECTURE, QK_NORM_ARCHITECTURE, GATED_ARCHITECTURE = "llama", "qwen3", "qwen35"
GGUF_DTYPES = GGUF_PRECISIONS  # export --dtype for a GGUF file (system.choices: named without torch)
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Hugging Face Llama names (per layer after "model.layers.i.") -> llama.cpp's, from gguf's tables.
GLOBAL_NAMES = {"model.embed_tokens.weight": "TOKEN_EMBD", "model.norm.weight": "OUTPUT_NORM",
                "lm_head.weight": "OUTPUT"}
LAYER_NAMES = {
    "input_layernorm.weight": "ATTN_NORM", "self_attn.q_proj.weight": "ATTN_Q",
    "self_attn.k_proj.weight": "ATTN_K", "self_attn.v_proj.weight": "ATTN_V",
    "self_attn.o_proj.weight": "ATTN_OUT", "self_attn.q_norm.weight": "ATTN_Q_NORM",
    "self_attn.k_norm.weight": "ATTN_K_NORM", "post_attention_layernorm.weight": "FFN_NORM",
    "mlp.gate_proj.weight": "FFN_GATE", "mlp.up_proj.weight": "FFN_UP", "mlp.down_proj.weight": "FFN_DOWN",
}
# qwen35 names the norm before the MLP for what it follows. Its q_proj rows, each head's query then its
# gate, go out as attn_q in the order transformers holds them: llama.cpp splits them so.
GATED_LAYER_NAMES = {"post_attention_layernorm.weight": "ATTN_POST_NORM"}


def gguf_package():
    """The `gguf` package, or a one-line error saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise TinyattnError(f"writing a GGUF file needs the gguf package: {INSTALL_HINT}") from None
    return gguf


def architecture_of(config: ModelConfig) -> str:
    """llama.cpp's architecture for `config`, or a CheckpointError for what none of them holds."""
    names = f"llama.cpp's {ARCHITECTURE}, {QK_NORM_ARCHITECTURE} and {GATED_ARCHITECTURE}"
    refuse_what_neither_computes(config, " to GGUF", names)
    if config.attention_gate and not config.qk_norm:
        raise CheckpointError("model.attention_gate: true without model.qk_norm cannot be exported to GGUF: "
                              f"llama.cpp's {GATED_ARCHITECTURE}, which gates, always norms the queries and "
                              "keys; a run trained with --set model.qk_norm=true as well exports to GGUF")
    if config.attention_gate:
        return GATED_ARCHITECTURE
    return QK_NORM_ARCHITECTURE if config.qk_norm else ARCHITECTURE


def interleaved_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Query or key rows (heads * D, C) from rotate-halves order to adjacent pairs: in each
    head, row i of the first half goes to 2i and row i of the second half to 2i + 1."""
    rows, width = weight.shape
    halves = weight.reshape(heads, 2, rows // heads // 2, width)  # (H, 2, D/2, C)
    return halves.transpose(1, 2).reshape(rows, width)  # (H, D/2, 2, C) -> (H*D, C)


def gguf_tensors(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """tinyattn's state dict under llama.cpp's tensor names (float32, in file order)."""
    gguf = gguf_package()
    architecture = architecture_of(config)
    permute = architecture == ARCHITECTURE
    layer_names = {**LAYER_NAMES, **GATED_LAYER_NAMES} if architecture == GATED_ARCHITECTURE else LAYER_NAMES
    out = {}
    for hf_name, tensor in to_hf_weights(state, config, plain_gains=True).items():
        if hf_name in GLOBAL_NAMES:
            name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[GLOBAL_NAMES[hf_name]]]
        else:
            layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
            name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[layer_names[rest]]].format(bid=int(layer))
            if permute and rest == "self_attn.q_proj.weight":
                tensor = interleaved_rope_rows(tensor, config.n_head)
            elif permute and rest == "self_attn.k_proj.weight":
                tensor = interleaved_rope_rows(tensor, config.kv_heads)
        out[name + ".weight"] = tensor.float()
    if architecture == GATED_ARCHITECTURE:
        out.update(qwen35.pass_through_layer(config.n_layer, config))
    return out


def tensor_data(tensor: torch.Tensor, dtype: str) -> tuple[np.ndarray, Optional[object]]:
    """(array, gguf raw type or None) for one tensor; 1-D tensors (norm gains) stay float32.
    `dtype` is one of GGUF_DTYPES, or "q4_0" (only for a gated file's zeros: `qwen35.stored_dtype`)."""
    gguf = gguf_package()
    if tensor.dim() == 1 or dtype == "fp32":
        return tensor.float().numpy(), None
    if dtype == "fp16":
        return tensor.half().numpy(), None
    if dtype == "q4_0":
        return gguf.quants.quantize(tensor.float().numpy(), gguf.GGMLQuantizationType.Q4_0), \
            gguf.GGMLQuantizationType.Q4_0
    # numpy has no bfloat16: torch rounds, and the bytes go out as GGML's BF16.
    raw = tensor.bfloat16().view(torch.int16).numpy().view(np.uint8)  # (rows, 2 * cols) bytes
    return raw, gguf.GGMLQuantizationType.BF16


def add_metadata(writer, config: ModelConfig, *, dtype: str, name: str) -> None:
    """The hyperparameters llama.cpp reads for `llama`, `qwen3` and `qwen35` (`general.*`, `<arch>.*`)."""
    gguf = gguf_package()
    gated = architecture_of(config) == GATED_ARCHITECTURE
    file_types = {"fp32": gguf.LlamaFileType.ALL_F32, "fp16": gguf.LlamaFileType.MOSTLY_F16,
                  "bf16": gguf.LlamaFileType.MOSTLY_BF16}
    writer.add_name(name)
    writer.add_file_type(file_types[dtype])
    writer.add_context_length(config.context_length)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer + (qwen35.APPENDED_LAYERS if gated else 0))
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)  # every dimension of a head rotates
    writer.add_rope_freq_base(config.rope_base)
    writer.add_layer_norm_rms_eps(norm_eps(config))
    writer.add_vocab_size(config.vocab_size)
    if gated:
        qwen35.add_metadata(writer, config)


def add_tokenizer(writer, tokenizer: Tokenizer, vocab_size: int) -> None:
    """`tokenizer.ggml.*`: byte-level BPE, <|endoftext|> as end of text (an imported folder's other
    eos ids as eot and eom), nothing added (but an imported folder's bos, where its tokenizer adds
    it); unused tokens up to `vocab_size`."""
    vocab = padded(gguf_vocab(tokenizer), vocab_size)
    writer.add_tokenizer_model(TOKENIZER_MODEL)
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(tokenizer.start_id)  # as config.json has it: <|endoftext|> for our own
    writer.add_eos_token_id(vocab.end_of_text)
    for add, id in zip((writer.add_eot_token_id, writer.add_eom_token_id), _other_stop_ids(tokenizer)):
        add(id)  # llama.cpp ends a generation at each of eos, eot and eom
    writer.add_add_bos_token(tokenizer.adds_start)
    writer.add_add_eos_token(False)


def _other_stop_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids besides the end of text that end a generation (an imported folder's list of eos ids,
    `Tokenizer.stop_ids`), two at most: a GGUF file has no key for a third; else a CheckpointError.
    In eot, eom order: a token named for the end of a message (Llama 3.1's <|eom_id|>) goes last."""
    def order(id: int) -> tuple[bool, int]:
        return "eom" in (tokenizer.token(id) or ""), id

    others = sorted(tokenizer.stop_ids - {tokenizer.eot_id}, key=order)
    if len(others) > 2:
        ids = ", ".join(str(i) for i in sorted(tokenizer.stop_ids))
        raise CheckpointError(f"tokenizer: {len(others) + 1} tokens end generation (ids {ids}): a GGUF "
                              "file names three at most (tokenizer.ggml.eos_token_id, eot_token_id, "
                              "eom_token_id); list three at most in the folder's generation_config.json "
                              "eos_token_id (a run's: two at most in its config's tokenizer.stop_tokens)")
    return others


def write_gguf(state: dict[str, torch.Tensor], config: ModelConfig, tokenizer: Tokenizer,
               path: str | Path, *, dtype: str = "fp32", name: str = "tinyattn",
               force: bool = False) -> Path:
    """Write `path` (one .gguf file) for the model `state`/`config` and its tokenizer."""
    gguf = gguf_package()
    path = through_link(Path(path), "a .gguf file")  # a symlinked path: its file is replaced, the link kept
    if dtype not in GGUF_DTYPES:
        raise CheckpointError(f"--dtype {dtype}: a GGUF file holds {', '.join(GGUF_DTYPES)}")
    _check_gguf_path(path, force)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(f"tokenizer: {tokenizer.vocab_size} tokens but model.vocab_size is "
                              f"{config.vocab_size}: the model has no row for some of them; a GGUF export "
                              f"needs model.vocab_size >= {tokenizer.vocab_size}, the tokenizer's (is the "
                              "checkpoint's tokenizer.json the one its run trained with?)")
    clean_interrupted_export(path)  # once refusals are behind: a refused export deletes nothing
    writer = gguf.GGUFWriter(None, architecture_of(config))
    add_metadata(writer, config, dtype=dtype, name=name)
    add_tokenizer(writer, tokenizer, config.vocab_size)
    for tensor_name, tensor in gguf_tensors(state, config).items():
        data, raw_dtype = tensor_data(tensor, qwen35.stored_dtype(tensor_name, config, dtype))
        writer.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
    _write_beside_then_rename(writer, path)
    return path


def _check_gguf_path(path: Path, force: bool) -> None:
    """Refuse a folder, and an existing file unless `force` and it is a GGUF file: --force replaces
    an earlier export, never a checkpoint or a user's file that happens to be named."""
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder; expected the path of a new .gguf file")
    if path.exists() and file_format(path) != "gguf":
        raise CheckpointError(f"{path}: exists and is not a GGUF file (--force replaces only an earlier "
                              "GGUF export); expected the path of a new .gguf file")
    if path.exists() and not force:
        raise CheckpointError(f"{path}: exists (--force replaces it); expected the path of a new .gguf file")


def clean_interrupted_export(path: Path) -> None:
    """Delete what an export to `path` killed mid-write (SIGKILL, a power cut) left beside it: its
    temporary file, as large as the export; nothing else (`storage.remove_temporaries`)."""
    if path.parent.is_dir():
        with storage_errors(path):
            remove_temporaries(path.parent, of=path.name)


def _write_beside_then_rename(writer, path: Path) -> None:
    """Write the file under a temporary name in the same folder and rename it into place."""
    with storage_errors(path, creating=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
        os.close(fd)
    try:
        with storage_errors(path):
            writer.write_header_to_file(Path(temporary))
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            for file in writer.fout:  # on disk before the rename makes it the file
                file.flush()
                os.fsync(file.fileno())
            writer.close()
            os.chmod(temporary, new_file_mode(path))  # mkstemp's 0600 would keep ollama's own user out
            os.replace(temporary, path)
    finally:
        try:
            writer.close()  # a second time after a failure: a full disk refuses its flush again
        except OSError:
            pass
        if os.path.exists(temporary):
            os.unlink(temporary)
