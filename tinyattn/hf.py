"""Hugging Face model folders, both ways: tinyattn's model is the Llama architecture.

RMSNorm, rotary embeddings that rotate the two halves of each head, SwiGLU, grouped-query
attention, no biases, an optionally tied head: `transformers.LlamaForCausalLM` computes
the same function, so a model moves between the two by renaming its weights. With
`model.qk_norm` the model is Qwen3's instead (`Qwen3ForCausalLM`: Llama plus an RMSNorm on
each head's queries and keys before RoPE, with the same epsilon), and maps the same way.
`model.logit_softcap` has no standard architecture that holds it exactly (Gemma 2
soft-caps but differs elsewhere) and is refused.

- `read_folder(folder)`: a Llama-architecture folder (`config.json`, safetensors weights,
  `tokenizer.json`) as a tinyattn `ModelConfig`, tinyattn-named weights, a tokenizer and
  the folder's sampling defaults. What a tinyattn model would compute differently is
  refused with one line naming it (`CheckpointError`), never loaded approximately.
- `export_folder(...)`: the reverse, a folder that `AutoModelForCausalLM` and
  `AutoTokenizer` load with no custom code, with a model card.

The mapping (i = layer; tinyattn stacks what Llama keeps apart, so one matmul does both):

    token_embedding.weight              model.embed_tokens.weight
    blocks.i.attention_norm.weight      model.layers.i.input_layernorm.weight
    blocks.i.attention.qkv.weight       model.layers.i.self_attn.{q,k,v}_proj.weight (rows stacked)
    blocks.i.attention.output.weight    model.layers.i.self_attn.o_proj.weight
    blocks.i.attention.{q,k}_norm.weight  model.layers.i.self_attn.{q,k}_norm.weight (Qwen3 only)
    blocks.i.mlp_norm.weight            model.layers.i.post_attention_layernorm.weight
    blocks.i.mlp.gate_up.weight         model.layers.i.mlp.{gate,up}_proj.weight (rows stacked)
    blocks.i.mlp.down.weight            model.layers.i.mlp.down_proj.weight
    final_norm.weight                   model.norm.weight
    head.weight                         lm_head.weight (absent when tied)

No permutation of the query and key rows is needed: Hugging Face's Llama already uses
the rotate-halves layout (Meta's original checkpoints pair adjacent dimensions instead,
and are permuted once by Hugging Face's converter).

Only the `safetensors` package is needed here (never `transformers`), imported when a
folder is read or written, so the core works without either. Pickled weights
(`pytorch_model.bin`) are refused: loading a pickle can run code.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from tinyattn.config import Config, ModelConfig, SampleConfig, TokenizerConfig
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.files import TEMPORARY_SUFFIX, atomic_write, storage_errors
from tinyattn.tokenizer import END_OF_TEXT, UNKNOWN, Tokenizer

INSTALL_HINT = 'pip install -e ".[hf]"'
ARCHITECTURE = "LlamaForCausalLM"
QK_NORM_ARCHITECTURE = "Qwen3ForCausalLM"  # Llama + QK-norm
MODEL_TYPES = {ARCHITECTURE: "llama", QK_NORM_ARCHITECTURE: "qwen3"}
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
# Files an export writes; an existing folder holding only these may be replaced with --force.
EXPORTED_FILES = ("config.json", WEIGHTS, "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "README.md")


def safetensors_torch():
    """`safetensors.torch`, or a one-line error saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise TinyattnError("reading or writing Hugging Face model folders needs the safetensors "
                            f"package (and transformers to use them there): {INSTALL_HINT}") from None
    return safetensors.torch


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a Hugging Face `config.json` (a tinyattn run folder has config.yaml)."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file()


def norm_eps(config: ModelConfig) -> float:
    """The RMSNorm epsilon the model uses: None means torch's default for the residual
    stream's dtype, which stays fp32 under autocast."""
    return config.norm_eps if config.norm_eps is not None else torch.finfo(torch.float32).eps


# ----------------------------------------------------------------------------- weight names


def to_hf_weights(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """tinyattn state dict -> Llama names, fused matrices split (each tensor its own copy)."""
    kv_width = config.kv_heads * config.head_dim
    out = {"model.embed_tokens.weight": state["token_embedding.weight"],
           "model.norm.weight": state["final_norm.weight"]}
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["head.weight"]
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = state[ours + "attention.qkv.weight"].split((config.n_embd, kv_width, kv_width))
        gate, up = state[ours + "mlp.gate_up.weight"].chunk(2)
        out.update({
            theirs + "input_layernorm.weight": state[ours + "attention_norm.weight"],
            theirs + "self_attn.q_proj.weight": q,
            theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": state[ours + "attention.output.weight"],
            theirs + "post_attention_layernorm.weight": state[ours + "mlp_norm.weight"],
            theirs + "mlp.gate_proj.weight": gate,
            theirs + "mlp.up_proj.weight": up,
            theirs + "mlp.down_proj.weight": state[ours + "mlp.down.weight"],
        })
        if config.qk_norm:
            out[theirs + "self_attn.q_norm.weight"] = state[ours + "attention.q_norm.weight"]
            out[theirs + "self_attn.k_norm.weight"] = state[ours + "attention.k_norm.weight"]
    # safetensors refuses views that share storage (the splits above): one copy each.
    return {name: tensor.detach().contiguous().clone() for name, tensor in out.items()}


def from_hf_weights(tensors: dict[str, torch.Tensor], config: ModelConfig,
                    origin: str) -> dict[str, torch.Tensor]:
    """Llama names -> a tinyattn state dict (fp32); a missing or extra tensor is named."""
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}  # old files
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CheckpointError(f"{origin}: weight {name} is missing")
        used.add(name)
        return tensors[name].float()

    state = {"token_embedding.weight": take("model.embed_tokens.weight"),
             "final_norm.weight": take("model.norm.weight")}
    if config.tie_embeddings:
        used.add("lm_head.weight")  # a tied head's copy, if the file holds one, is the embedding
        state["head.weight"] = state["token_embedding.weight"]  # as the tied model's state dict lists it
    else:
        state["head.weight"] = take("lm_head.weight")
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        state.update({
            ours + "attention_norm.weight": take(theirs + "input_layernorm.weight"),
            ours + "attention.qkv.weight": torch.cat([take(theirs + f"self_attn.{p}_proj.weight")
                                                      for p in "qkv"]),
            ours + "attention.output.weight": take(theirs + "self_attn.o_proj.weight"),
            ours + "mlp_norm.weight": take(theirs + "post_attention_layernorm.weight"),
            ours + "mlp.gate_up.weight": torch.cat([take(theirs + "mlp.gate_proj.weight"),
                                                    take(theirs + "mlp.up_proj.weight")]),
            ours + "mlp.down.weight": take(theirs + "mlp.down_proj.weight"),
        })
        if config.qk_norm:
            state[ours + "attention.q_norm.weight"] = take(theirs + "self_attn.q_norm.weight")
            state[ours + "attention.k_norm.weight"] = take(theirs + "self_attn.k_norm.weight")
    extra = sorted(set(tensors) - used)
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        bias = " (biases are not supported)" if any(k.endswith(".bias") for k in extra) else ""
        raise CheckpointError(f"{origin}: weights a Llama model of this config does not have: "
                              f"{', '.join(extra[:3])}{more}{bias}")
    return state


# ----------------------------------------------------------------------------- config.json


def architecture(raw: dict, origin: str) -> str:
    """The config's architecture if tinyattn reads it, else a CheckpointError naming what was found."""
    found = raw.get("architectures")
    if found is None:  # older files may name only the model type
        by_type = {t: a for a, t in MODEL_TYPES.items()}
        if raw.get("model_type") not in by_type:
            raise CheckpointError(f"{origin}: no architectures field and model_type {raw.get('model_type')!r}: "
                                  f"tinyattn reads {ARCHITECTURE} (and {QK_NORM_ARCHITECTURE}) folders only")
        found = [by_type[raw["model_type"]]]
    if not (isinstance(found, list) and len(found) == 1 and found[0] in MODEL_TYPES):
        raise CheckpointError(f"{origin}: architectures {found}: tinyattn reads {ARCHITECTURE} "
                              f"(and {QK_NORM_ARCHITECTURE}) only")
    return found[0]


def model_config_from_hf(raw: dict, origin: str, *, tied: Optional[bool] = None) -> ModelConfig:
    """A Llama `config.json` as a ModelConfig; anything tinyattn would compute differently
    is a CheckpointError naming the field. tied: the head's tying when the file omits it."""
    def refuse(what: str) -> None:
        raise CheckpointError(f"{origin}: {what}")

    qk_norm = architecture(raw, origin) == QK_NORM_ARCHITECTURE
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in raw.get("layer_types") or []):
        refuse("sliding-window attention (use_sliding_window, layer_types): tinyattn's layers all "
               "attend to the whole context")
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        refuse(f"hidden_act {activation!r}: tinyattn's MLP is SwiGLU (silu) only")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            refuse(f"{key} true: tinyattn's projections have no biases")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        refuse(f"rope scaling {rope_type!r}: only plain RoPE (rope_type default, no rope_scaling) "
               "is supported")
    if rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        refuse("partial_rotary_factor: tinyattn rotates every dimension of a head")
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = raw.get("head_dim")
        if head_dim is not None and int(head_dim) * heads != hidden:
            refuse(f"head_dim {head_dim} is not hidden_size / num_attention_heads = {hidden} / {heads}: "
                   "tinyattn's heads split the width evenly")
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        if tied is None or "tie_word_embeddings" in raw:
            tied = bool(raw.get("tie_word_embeddings", True))  # the transformers 4 default
        config = ModelConfig(
            vocab_size=int(raw["vocab_size"]), n_layer=int(raw["num_hidden_layers"]), n_head=heads,
            n_kv_head=kv_heads, n_embd=hidden, mlp_hidden=int(raw["intermediate_size"]),
            context_length=int(raw.get("max_position_embeddings", 2048)), tie_embeddings=tied,
            rope_base=float(theta), norm_eps=float(raw.get("rms_norm_eps", 1e-6)), qk_norm=qk_norm)
    except KeyError as e:
        refuse(f"field {e.args[0]} is missing")
    except (TypeError, ValueError) as e:
        refuse(f"a field has an unusable value ({e})")

    def fail(key, value, accepted):
        refuse(f"gives {key}={value!r}, which tinyattn cannot build: {accepted}")

    config.validate(fail)
    return config


def hf_config(config: ModelConfig, eot_id: Optional[int], dtype: torch.dtype) -> dict:
    """config.json for `config` (Llama, or Qwen3 with QK-norm); an option neither can hold
    is refused, never dropped."""
    if config.logit_softcap is not None:
        raise CheckpointError(f"model.logit_softcap: {config.logit_softcap} cannot be exported: "
                              f"neither {ARCHITECTURE} nor {QK_NORM_ARCHITECTURE} soft-caps its logits")
    architecture = QK_NORM_ARCHITECTURE if config.qk_norm else ARCHITECTURE
    rope = {"rope_type": "default", "rope_theta": config.rope_base}
    extra = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": config.n_layer,
             "layer_types": ["full_attention"] * config.n_layer} if config.qk_norm else {"mlp_bias": False}
    return {
        "architectures": [architecture], "model_type": MODEL_TYPES[architecture], **extra,
        "vocab_size": config.vocab_size, "hidden_size": config.n_embd,
        "intermediate_size": config.hidden_dim, "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head, "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.context_length, "rms_norm_eps": norm_eps(config),
        "rope_parameters": rope, "rope_theta": config.rope_base,  # the second for transformers 4
        "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": None,
        "initializer_range": 0.02, "use_cache": True, "dtype": DTYPE_NAMES[dtype],
    }


# ----------------------------------------------------------------------------- reading


@dataclass
class ImportedModel:
    config: Config  # model from config.json, tokenizer pretrained, sample from generation_config.json
    weights: dict[str, torch.Tensor]  # tinyattn names, fp32
    tokenizer: Tokenizer
    weights_file: Path


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_folder(folder: str | Path) -> ImportedModel:
    """A Hugging Face Llama folder as tinyattn config, weights and tokenizer."""
    folder = Path(folder)
    raw = read_json(folder / "config.json")
    # Settle the architecture before anything else, so a foreign folder gets that one line.
    model_config_from_hf(raw, f"{folder / 'config.json'}", tied=True)
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json (a tokenizers-library tokenizer); "
                              "tokenizer.model or vocab files alone are not read")
    weights_file, tensors = _read_weights(folder)
    model_config = model_config_from_hf(raw, f"{folder / 'config.json'}",
                                        tied="lm_head.weight" not in tensors)
    weights = from_hf_weights(tensors, model_config, str(weights_file))
    tokenizer_file = folder / "tokenizer.json"
    tokenizer = Tokenizer.from_file(tokenizer_file)
    sample = _sample_config(folder / "generation_config.json")
    config = Config(model=model_config, sample=sample,
                    tokenizer=TokenizerConfig(kind="pretrained", path=str(tokenizer_file)))
    return ImportedModel(config, weights, tokenizer, weights_file)


def _read_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    if (folder / WEIGHTS).is_file():
        files, index = [folder / WEIGHTS], folder / WEIGHTS
    elif (folder / WEIGHTS_INDEX).is_file():
        index = folder / WEIGHTS_INDEX
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map")
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
    else:
        pickles = [name for name in PICKLES if (folder / name).is_file()]
        if pickles:
            raise CheckpointError(f"{folder}: holds {pickles[0]}, a pickle, which tinyattn never loads "
                                  "(unpickling can run code); it needs model.safetensors: load the "
                                  "model with transformers on a machine you trust and save_pretrained it")
        raise CheckpointError(f"{folder}: no {WEIGHTS} (or {WEIGHTS_INDEX}) beside config.json")
    st = safetensors_torch()
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(st.load_file(file))
        except FileNotFoundError:
            raise CheckpointError(f"{file}: not found (listed in {index.name})") from None
        except Exception as e:  # safetensors raises its own SafetensorError for a bad header
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{file}: not a readable safetensors file ({reason[:200]})") from None
    return index, tensors


def _sample_config(path: Path) -> SampleConfig:
    """generation_config.json's sampling defaults; transformers' own defaults where it is silent
    (greedy unless do_sample), tinyattn's when there is no such file."""
    sample = SampleConfig()
    if not path.is_file():
        return sample
    raw = read_json(path)
    if raw.get("do_sample"):
        sample.temperature = float(raw.get("temperature", 1.0))
        top_k = raw.get("top_k", 50)
        sample.top_k = int(top_k) if top_k else None
        sample.top_p = float(raw.get("top_p", 1.0))
    else:
        sample.temperature = 0.0
    sample.repetition_penalty = float(raw.get("repetition_penalty", 1.0))
    if raw.get("max_new_tokens"):
        sample.max_new_tokens = int(raw["max_new_tokens"])

    def fail(key, value, accepted):
        raise CheckpointError(f"{path}: gives {key}={value!r}: {accepted}")

    sample.validate(fail)
    return sample


# ----------------------------------------------------------------------------- writing


@dataclass
class ModelCard:
    """What the model card says about the training run."""

    source: str  # the checkpoint exported
    step: int
    tokens_seen: Optional[int] = None
    best_val_loss: Optional[float] = None


def export_folder(weights: dict[str, torch.Tensor], config: Config, tokenizer: Tokenizer,
                  out: str | Path, *, dtype: torch.dtype = torch.float32,
                  card: Optional[ModelCard] = None, force: bool = False) -> list[Path]:
    """Write a Hugging Face Llama folder for a tinyattn model; returns the files written.

    weights: the model's state dict (tinyattn names). An existing `out` is refused unless
    it is empty or (with force) holds only files an export writes. Every file is made
    before any is written, and written beside `out` first: a failed export leaves `out`
    as it was (absent, empty, or the earlier export), never half of one.
    """
    out = Path(out)
    st = safetensors_torch()
    eot = tokenizer.eot_id
    hf = hf_config(config.model, eot, dtype)  # refuses what Llama cannot hold, before any write
    _check_out_folder(out, force)
    tensors = {name: t.to(dtype) for name, t in to_hf_weights(weights, config.model).items()}
    special = {}
    if eot is not None:
        special.update(bos_token=END_OF_TEXT, eos_token=END_OF_TEXT)
    if config.tokenizer.kind == "char":
        special["unk_token"] = UNKNOWN
    files = {
        "config.json": _json_bytes(hf),
        WEIGHTS: st.save(tensors, metadata={"format": "pt"}),
        "generation_config.json": _json_bytes(_generation_config(config.sample, eot)),
        "tokenizer.json": tokenizer.to_json().encode("utf-8"),
        "tokenizer_config.json": _json_bytes({
            "tokenizer_class": "PreTrainedTokenizerFast", **special,
            "model_max_length": config.model.context_length,
            "add_bos_token": False, "add_eos_token": False,  # tinyattn never adds tokens to a text
            "clean_up_tokenization_spaces": False}),  # decode must give the text back unchanged
        "special_tokens_map.json": _json_bytes(special),
        "README.md": model_card(config, card, tokenizer, weights).encode("utf-8"),
    }
    _write_folder(out, files)
    return [out / name for name in files]


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Write `files` into a staging folder beside `out`, then move them into `out` (the
    whole folder when `out` does not exist yet): a write that fails changes nothing there."""
    with storage_errors(out.parent):
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=TEMPORARY_SUFFIX))
    try:
        for name, data in files.items():
            with atomic_write(staging / name) as f:
                f.write(data)
        with storage_errors(out):
            if out.is_dir():  # empty, or the earlier export --force replaces
                for name in files:
                    os.replace(staging / name, out / name)
            else:
                os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_out_folder(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a folder; choose another --out")
    if out.is_dir():
        present = sorted(p.name for p in out.iterdir())
        foreign = [name for name in present if name not in EXPORTED_FILES]
        if foreign:
            raise CheckpointError(f"{out}: the folder holds other files ({', '.join(foreign[:3])}); "
                                  "choose another --out")
        if present and not force:
            raise CheckpointError(f"{out}: holds an earlier export; add --force to replace it")


def _generation_config(sample: SampleConfig, eot: Optional[int]) -> dict:
    greedy = sample.temperature == 0
    config = {"do_sample": not greedy, "max_new_tokens": sample.max_new_tokens,
              "repetition_penalty": sample.repetition_penalty,
              "bos_token_id": eot, "eos_token_id": eot}
    if not greedy:
        # top_k 0 switches top-k off in transformers, whose default would be 50.
        config.update(temperature=sample.temperature, top_k=sample.top_k or 0, top_p=sample.top_p)
    return config


def model_card(config: Config, card: Optional[ModelCard], tokenizer: Tokenizer,
               weights: dict[str, torch.Tensor]) -> str:
    """README.md: what was trained on what, for how long, to which validation loss."""
    m, d, t = config.model, config.data, config.train
    architecture = QK_NORM_ARCHITECTURE if m.qk_norm else ARCHITECTURE
    family = "Qwen3" if m.qk_norm else "Llama"
    seen = set()
    parameters = 0
    for name, tensor in weights.items():
        if tensor.data_ptr() not in seen:  # a tied head counts once
            seen.add(tensor.data_ptr())
            parameters += tensor.numel()
    if d.dataset:
        data = f"the Hugging Face dataset `{d.dataset}`" + (f" ({d.dataset_config})" if d.dataset_config else "")
    elif d.files:
        data = ", ".join(f"`{f}`" for f in d.files)
    else:
        data = "unknown data"
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags: [tinyattn, llama]", "---", "",
             f"# A {parameters / 1e6:.2f}M-parameter {family}-architecture language model", "",
             f"Trained with tinyattn and exported as `{architecture}`; it "
             "loads with `AutoModelForCausalLM` and `AutoTokenizer`, no custom code.", "",
             "| | |", "|---|---|",
             f"| data | {data} |",
             f"| tokenizer | {config.tokenizer.kind}, {tokenizer.vocab_size:,} tokens |",
             f"| shape | {m.n_layer} layers, width {m.n_embd}, {m.n_head} heads "
             f"({m.kv_heads} key/value), context {m.context_length} |"]
    if t.init_from:
        lines.append(f"| initialised from | `{t.init_from}` |")
    if card is not None:
        lines.append(f"| training | {card.step:,} steps" + (f", {card.tokens_seen:,} tokens"
                                                           if card.tokens_seen else "") + " |")
        if card.best_val_loss is not None and math.isfinite(card.best_val_loss):
            lines.append(f"| validation loss | {card.best_val_loss:.4f} nats per token (best) |")
        lines.append(f"| exported from | `{card.source}` |")
    lines += ["", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
              'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
              f'ids = tokenizer({config.sample.prompt or END_OF_TEXT!r}, return_tensors="pt").input_ids',
              "print(tokenizer.decode(model.generate(ids, max_new_tokens=200)[0]))", "```", ""]
    return "\n".join(lines)
