"""Between tinyattn and transformers: weight names and config.json. tinyattn's model is Llama.

RMSNorm, rotary embeddings that rotate the two halves of each head, SwiGLU, grouped-query
attention, no biases, an optionally tied head: `transformers.LlamaForCausalLM` computes
the same function, so a model moves between the two by renaming its weights. With
`model.qk_norm` the model is Qwen3's instead (`Qwen3ForCausalLM`: Llama plus an RMSNorm on
each head's queries and keys before RoPE, with the same epsilon), and maps the same way. With
`model.attention_gate` too it is Qwen3.5's text model with every layer full attention
(`Qwen3_5ForCausalLM`): its q_proj holds each head's query rows and then its gate rows, and
its RMSNorms scale by 1 + weight, so every gain is stored less 1 (`GAINS_LESS_ONE`).
`model.logit_softcap` has no standard architecture that holds it exactly (Gemma 2
soft-caps but differs elsewhere) and is refused. Reading a `config.json`
(`model_config_from_hf`), whatever a tinyattn model would compute differently is refused
with one line naming it (`CheckpointError`), never loaded approximately.

The mapping (i = layer; tinyattn stacks what Llama keeps apart, so one matmul does both):

    token_embedding.weight              model.embed_tokens.weight
    blocks.i.attention_norm.weight      model.layers.i.input_layernorm.weight
    blocks.i.attention.qkv.weight       model.layers.i.self_attn.{q,k,v}_proj.weight (rows stacked)
    blocks.i.attention.output.weight    model.layers.i.self_attn.o_proj.weight
    blocks.i.attention.{q,k}_norm.weight  model.layers.i.self_attn.{q,k}_norm.weight (Qwen3 only)
    blocks.i.attention.qkv.weight       (gate rows, Qwen3.5 only) q_proj: head h's D query rows,
                                        then its D gate rows, for h = 0 .. H-1
    blocks.i.mlp_norm.weight            model.layers.i.post_attention_layernorm.weight
    blocks.i.mlp.gate_up.weight         model.layers.i.mlp.{gate,up}_proj.weight (rows stacked)
    blocks.i.mlp.down.weight            model.layers.i.mlp.down_proj.weight
    final_norm.weight                   model.norm.weight
    head.weight                         lm_head.weight (absent when tied)

No permutation of the query and key rows is needed: Hugging Face's Llama already uses
the rotate-halves layout (Meta's original checkpoints pair adjacent dimensions instead,
and are permuted once by Hugging Face's converter). `DTYPES` names the dtypes an export
may write its weights in.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from tinyattn.config import ModelConfig, show_value
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.model.attention import gate_matrix
from tinyattn.system.choices import EXPORT_PRECISIONS
from tinyattn.system.device import DTYPES as DEVICE_DTYPES

INSTALL_HINT = "pip install 'tinyattn[hf]'"
ARCHITECTURE = "LlamaForCausalLM"
QK_NORM_ARCHITECTURE = "Qwen3ForCausalLM"  # Llama + QK-norm
GATED_ARCHITECTURE = "Qwen3_5ForCausalLM"  # Qwen3 + the attention gate (with every layer full attention)
MODEL_TYPES = {ARCHITECTURE: "llama", QK_NORM_ARCHITECTURE: "qwen3", GATED_ARCHITECTURE: "qwen3_5_text"}
ARCHITECTURES = f"{ARCHITECTURE}, {QK_NORM_ARCHITECTURE} and {GATED_ARCHITECTURE}"
# What transformers assumes where config.json omits max_position_embeddings (LlamaConfig, Qwen3Config, ...).
DEFAULT_CONTEXT = {ARCHITECTURE: 2048, QK_NORM_ARCHITECTURE: 32768, GATED_ARCHITECTURE: 32768}
# ... and head_dim (LlamaConfig's is hidden_size / num_attention_heads)
DEFAULT_HEAD_DIM = {QK_NORM_ARCHITECTURE: 128, GATED_ARCHITECTURE: 256}
# ... and tie_word_embeddings (the transformers 4 default, which Qwen3_5TextConfig does not share)
DEFAULT_TIED = {ARCHITECTURE: True, QK_NORM_ARCHITECTURE: True, GATED_ARCHITECTURE: False}
GAINS_LESS_ONE = {GATED_ARCHITECTURE}  # RMSNorm scales by 1 + weight there: a gain g is stored as g - 1
DTYPES = {name: DEVICE_DTYPES[name] for name in EXPORT_PRECISIONS}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def safetensors_torch():
    """`safetensors.torch`, or a one-line error saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise TinyattnError("reading or writing Hugging Face model folders needs the safetensors "
                            f"package (and transformers to use them there): {INSTALL_HINT}") from None
    return safetensors.torch


def hf_architecture(config: ModelConfig) -> str:
    """The transformers architecture that computes what `config` does (see the module docstring)."""
    if config.attention_gate:
        return GATED_ARCHITECTURE
    return QK_NORM_ARCHITECTURE if config.qk_norm else ARCHITECTURE


def norm_eps(config: ModelConfig) -> float:
    """The RMSNorm epsilon the model uses: None means torch's default for the residual
    stream's dtype, which stays fp32 under autocast."""
    return config.norm_eps if config.norm_eps is not None else torch.finfo(torch.float32).eps


# ----------------------------------------------------------------------------- weight names


def to_hf_weights(state: dict[str, torch.Tensor], config: ModelConfig, *,
                  plain_gains: bool = False) -> dict[str, torch.Tensor]:
    """tinyattn state dict -> Llama names, fused matrices split (each tensor its own copy).
    `plain_gains`: every norm gain as itself, even where transformers stores it less 1 (as
    llama.cpp's qwen35 holds it)."""
    gain = _gain_to_hf(config) if not plain_gains else (lambda gain: gain)
    out = {"model.embed_tokens.weight": state["token_embedding.weight"],
           "model.norm.weight": gain(state["final_norm.weight"])}
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["head.weight"]
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v, *attention_gate = state[ours + "attention.qkv.weight"].split(config.qkv_rows)
        if config.attention_gate_rank is not None:  # the gate's (C, C) matrix is its two matrices' product
            gate_out, gate_in = (state[f"{ours}attention.gate_{side}.weight"] for side in ("out", "in"))
            attention_gate = [gate_matrix(gate_out, gate_in).to(q.dtype)]  # (C, r) @ (r, C)
        if attention_gate:  # (H, 2, D, C): each head's query rows, then its gate rows
            pairs = torch.stack((q, attention_gate[0])).unflatten(1, (config.n_head, -1)).transpose(0, 1)
            q = pairs.flatten(0, 2)
        gate, up = state[ours + "mlp.gate_up.weight"].chunk(2)
        out.update({
            theirs + "input_layernorm.weight": gain(state[ours + "attention_norm.weight"]),
            theirs + "self_attn.q_proj.weight": q,
            theirs + "self_attn.k_proj.weight": k,
            theirs + "self_attn.v_proj.weight": v,
            theirs + "self_attn.o_proj.weight": state[ours + "attention.output.weight"],
            theirs + "post_attention_layernorm.weight": gain(state[ours + "mlp_norm.weight"]),
            theirs + "mlp.gate_proj.weight": gate,
            theirs + "mlp.up_proj.weight": up,
            theirs + "mlp.down_proj.weight": state[ours + "mlp.down.weight"],
        })
        if config.qk_norm:
            out[theirs + "self_attn.q_norm.weight"] = gain(state[ours + "attention.q_norm.weight"])
            out[theirs + "self_attn.k_norm.weight"] = gain(state[ours + "attention.k_norm.weight"])
    # safetensors refuses views that share storage (the splits above): one copy each.
    return {name: tensor.detach().contiguous().clone() for name, tensor in out.items()}


def _gain_to_hf(config: ModelConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gain as `config`'s architecture stores it: itself, or itself less 1 (GAINS_LESS_ONE)."""
    if hf_architecture(config) in GAINS_LESS_ONE:
        return lambda gain: gain - 1
    return lambda gain: gain


def hf_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama (or Qwen3) folder of `config` holds, by name, with its shape."""
    c, kv_width = config, config.kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.n_embd), "model.norm.weight": (c.n_embd,)}
    if not c.tie_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.n_embd)
    for i in range(c.n_layer):
        layer = f"model.layers.{i}."
        shapes.update({
            layer + "input_layernorm.weight": (c.n_embd,),
            layer + "self_attn.q_proj.weight": ((2 if c.attention_gate else 1) * c.n_embd, c.n_embd),
            layer + "self_attn.k_proj.weight": (kv_width, c.n_embd),
            layer + "self_attn.v_proj.weight": (kv_width, c.n_embd),
            layer + "self_attn.o_proj.weight": (c.n_embd, c.n_embd),
            layer + "post_attention_layernorm.weight": (c.n_embd,),
            layer + "mlp.gate_proj.weight": (c.hidden_dim, c.n_embd),
            layer + "mlp.up_proj.weight": (c.hidden_dim, c.n_embd),
            layer + "mlp.down_proj.weight": (c.n_embd, c.hidden_dim),
        })
        if c.qk_norm:
            shapes[layer + "self_attn.q_norm.weight"] = (c.head_dim,)
            shapes[layer + "self_attn.k_norm.weight"] = (c.head_dim,)
    return shapes


def check_hf_weights(tensors: dict[str, torch.Tensor], config: ModelConfig, origin: str) -> None:
    """Every tensor `config` needs is there with its shape, and no other: else one line naming
    the first that is not (checked before anything is built or concatenated)."""
    expected = hf_weight_shapes(config)
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{origin}: weight {name} is missing")
        found = tuple(tensors[name].shape)
        if found != shape:
            raise CheckpointError(f"{origin}: weight {name} has shape {_shape(found)}; config.json "
                                  f"gives {_shape(shape)}")
    if config.tie_embeddings and "lm_head.weight" in tensors:  # a tied head's copy is the embedding
        expected["lm_head.weight"] = expected["model.embed_tokens.weight"]
        if tuple(tensors["lm_head.weight"].shape) != expected["lm_head.weight"]:
            raise CheckpointError(f"{origin}: weight lm_head.weight has shape "
                                  f"{_shape(tuple(tensors['lm_head.weight'].shape))}; config.json gives "
                                  f"{_shape(expected['lm_head.weight'])}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        bias = " (biases are not supported)" if any(k.endswith(".bias") for k in extra) else ""
        raise CheckpointError(f"{origin}: weights a Llama model of this config does not have: "
                              f"{', '.join(extra[:3])}{more}{bias}")


def head_differs_from_embedding(tensors: dict[str, torch.Tensor], raw: dict) -> bool:
    """Whether the weights hold an lm_head.weight of the embedding's shape but other values:
    transformers 5 then leaves a head that config.json calls tied untied (and warns), and so
    must tinyattn. They are compared as transformers loads them, in config.json's dtype (float32
    where it names none or another): a head stored in bf16 beside a float32 embedding differs. A
    copy equal to the embedding is a tied head's; another shape is refused by `check_hf_weights`."""
    head, embedding = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
    if head is None or embedding is None or head.shape != embedding.shape:
        return False
    named = raw.get("dtype") or raw.get("torch_dtype")
    dtype = next((t for t, name in DTYPE_NAMES.items() if name == named), torch.float32)
    return not torch.equal(head.to(dtype), embedding.to(dtype))


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape) or "a scalar"


def from_hf_weights(tensors: dict[str, torch.Tensor], config: ModelConfig,
                    origin: str) -> dict[str, torch.Tensor]:
    """Llama names -> a tinyattn state dict (fp32); a missing, extra or misshapen tensor is named."""
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}  # old files
    check_hf_weights(tensors, config, origin)

    def take(name: str) -> torch.Tensor:
        return tensors[name].float()

    less_one = hf_architecture(config) in GAINS_LESS_ONE

    def gain(name: str) -> torch.Tensor:
        return take(name) + 1 if less_one else take(name)

    def query_and_gate(name: str) -> list[torch.Tensor]:
        """q_proj's rows: the query's (C, C) (and, with the gate, head by head the gate's after it)."""
        if not config.attention_gate:
            return [take(name)]
        q, attention_gate = take(name).unflatten(0, (config.n_head, 2, -1)).unbind(1)  # (H, D, C) each
        return [q.flatten(0, 1), attention_gate.flatten(0, 1)]

    state = {"token_embedding.weight": take("model.embed_tokens.weight"),
             "final_norm.weight": gain("model.norm.weight")}
    if config.tie_embeddings:
        state["head.weight"] = state["token_embedding.weight"]  # as the tied model's state dict lists it
    else:
        state["head.weight"] = take("lm_head.weight")
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        query, *attention_gate = query_and_gate(theirs + "self_attn.q_proj.weight")
        key, value = (take(theirs + f"self_attn.{p}_proj.weight") for p in "kv")
        state.update({
            ours + "attention_norm.weight": gain(theirs + "input_layernorm.weight"),
            ours + "attention.qkv.weight": torch.cat([query, key, value, *attention_gate]),
            ours + "attention.output.weight": take(theirs + "self_attn.o_proj.weight"),
            ours + "mlp_norm.weight": gain(theirs + "post_attention_layernorm.weight"),
            ours + "mlp.gate_up.weight": torch.cat([take(theirs + "mlp.gate_proj.weight"),
                                                    take(theirs + "mlp.up_proj.weight")]),
            ours + "mlp.down.weight": take(theirs + "mlp.down_proj.weight"),
        })
        if config.qk_norm:
            state[ours + "attention.q_norm.weight"] = gain(theirs + "self_attn.q_norm.weight")
            state[ours + "attention.k_norm.weight"] = gain(theirs + "self_attn.k_norm.weight")
    return state


# ----------------------------------------------------------------------------- config.json


def architecture(raw: dict, origin: str) -> str:
    """The config's architecture if tinyattn reads it, else a CheckpointError naming what was found."""
    found = raw.get("architectures")
    if found is None:  # older files may name only the model type
        by_type = {t: a for a, t in MODEL_TYPES.items()}
        model_type = raw.get("model_type")
        if not isinstance(model_type, str) or model_type not in by_type:
            raise CheckpointError(f"{origin}: no architectures field and model_type {model_type!r}: "
                                  f"tinyattn reads {ARCHITECTURES} folders only")
        found = [by_type[model_type]]
    named = isinstance(found, list) and len(found) == 1 and isinstance(found[0], str)
    if not (named and found[0] in MODEL_TYPES):
        raise CheckpointError(f"{origin}: architectures {found}: tinyattn reads {ARCHITECTURES} only")
    return found[0]


_INTEGER = ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
_NUMBER = ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
_FLAG = ("true or false", lambda v: isinstance(v, bool))
_TEXT = ("a string", lambda v: isinstance(v, str))
_OBJECT = ("an object", lambda v: isinstance(v, dict))
_NAMES = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v))
# config.json's fields tinyattn reads: (what is accepted, its check, whether null is allowed)
HF_FIELDS = {
    "vocab_size": (*_INTEGER, False), "hidden_size": (*_INTEGER, False),
    "num_hidden_layers": (*_INTEGER, False), "num_attention_heads": (*_INTEGER, False),
    "intermediate_size": (*_INTEGER, False), "max_position_embeddings": (*_INTEGER, False),
    "num_key_value_heads": (*_INTEGER, True), "head_dim": (*_INTEGER, True),
    "rope_theta": (*_NUMBER, True), "rms_norm_eps": (*_NUMBER, False),
    "partial_rotary_factor": (*_NUMBER, True), "tie_word_embeddings": (*_FLAG, False),
    "use_sliding_window": (*_FLAG, True), "attention_bias": (*_FLAG, True), "mlp_bias": (*_FLAG, True),
    "hidden_act": (*_TEXT, False), "rope_scaling": (*_OBJECT, True), "rope_parameters": (*_OBJECT, True),
    "layer_types": (*_NAMES, True),
}
ROPE_FIELDS = {"rope_type": (*_TEXT, False), "type": (*_TEXT, False), "rope_theta": (*_NUMBER, False),
               "partial_rotary_factor": (*_NUMBER, False)}


def check_field_types(raw: dict, origin: str) -> None:
    """Each config.json field tinyattn reads has the JSON type it needs; else one line naming
    the field, what was found and what is accepted (before any value is used)."""
    def check(fields: dict, values: dict, prefix: str) -> None:
        for key, (accepted, accepts, nullable) in fields.items():
            if key in values and not (values[key] is None and nullable) and not accepts(values[key]):
                null = " or null" if nullable else ""
                raise CheckpointError(f"{origin}: {prefix}{key} is {show_value(values[key])}; "
                                      f"expected {accepted}{null}")

    check(HF_FIELDS, raw, "")
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(raw.get(key), dict):
            check(ROPE_FIELDS, raw[key], f"{key}.")


def plain_rope(raw: dict, origin: str, rotated: float = 1.0) -> dict:
    """config.json's RoPE settings, or a CheckpointError for a kind tinyattn does not compute.
    rotated: the share of each head's dimensions the architecture rotates where the file says none
    (partial_rotary_factor: 1 in transformers' Llama and Qwen3, 0.25 in Qwen3.5)."""
    # As transformers 5: rope_scaling replaces rope_parameters; what it omits is the top level's
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{origin}: rope scaling {rope_type!r}: only plain RoPE (rope_type default, "
                              "no rope_scaling) is supported")
    if rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", rotated)) != 1.0:
        raise CheckpointError(f"{origin}: partial_rotary_factor: tinyattn rotates every dimension of a head")
    return rope


def refuse_other_layers(raw: dict, refuse: Callable[[str], None], name: str = ARCHITECTURE) -> None:
    """refuse(what) for a config.json whose layers compute what tinyattn's do not."""
    others = sorted({t for t in raw.get("layer_types") or [] if t != "full_attention"})
    if raw.get("use_sliding_window") or others:
        kinds = f" ({', '.join(map(show_value, others))})" if others else ""
        refuse(f"layers other than full attention{kinds} (use_sliding_window, layer_types): tinyattn's "
               "layers all attend to the whole context")
    if name == GATED_ARCHITECTURE and raw.get("layer_types") is None:  # from full_attention_interval
        if "full_attention_interval" not in raw:
            refuse("layer_types is missing: Qwen3.5 then makes three layers in four linear attention, and "
                   "tinyattn's layers all attend to the whole context")
        interval = raw["full_attention_interval"]
        if not _INTEGER[1](interval) or interval < 1:
            refuse(f"full_attention_interval is {show_value(interval)}; expected a positive integer")
        if interval != 1:
            refuse(f"layer_types is missing and full_attention_interval is {interval}: Qwen3.5 then makes "
                   f"every layer but each {interval}th linear attention, and tinyattn's layers all attend to "
                   "the whole context (expected full_attention_interval 1, or layer_types all "
                   "full_attention)")
    quantized = raw.get("quantization_config")
    if quantized is not None:  # before the weights, whose names would say it less plainly
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        named = "" if method is None else f" (quant_method {method!r})"
        refuse(f"quantization_config{named}: tinyattn reads unquantized weights only "
               "(float32, float16 or bfloat16): use the model's unquantized release")
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        refuse(f"hidden_act {activation!r}: tinyattn's MLP is SwiGLU (silu) only")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            refuse(f"{key} true: tinyattn's projections have no biases")


def model_config_from_hf(raw: dict, origin: str, *, tied: Optional[bool] = None) -> ModelConfig:
    """A Llama `config.json` as a ModelConfig; anything tinyattn would compute differently
    is a CheckpointError naming the field. tied: the head's tying when the file omits it."""
    def refuse(what: str) -> None:
        raise CheckpointError(f"{origin}: {what}")

    name = architecture(raw, origin)
    qk_norm, gated = name in (QK_NORM_ARCHITECTURE, GATED_ARCHITECTURE), name == GATED_ARCHITECTURE
    check_field_types(raw, origin)
    refuse_other_layers(raw, refuse, name)
    rope = plain_rope(raw, origin, rotated=0.25 if gated else 1.0)
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = raw.get("head_dim")
        if head_dim is None and name in DEFAULT_HEAD_DIM and DEFAULT_HEAD_DIM[name] * heads != hidden:
            refuse(f"head_dim is missing: {name} then takes {DEFAULT_HEAD_DIM[name]}, not hidden_size / "
                   f"num_attention_heads = {hidden} / {heads} (tinyattn's heads split the width evenly)")
        if head_dim is not None and int(head_dim) * heads != hidden:
            refuse(f"head_dim {head_dim} is not hidden_size / num_attention_heads = {hidden} / {heads}: "
                   "tinyattn's heads split the width evenly")
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        if theta is None:  # a top-level null: transformers 5 builds a model only if rope_parameters has one
            given = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
            refuse(f"rope_theta is None and {given} gives none; expected a number")
        if tied is None or "tie_word_embeddings" in raw:
            tied = bool(raw.get("tie_word_embeddings", DEFAULT_TIED[name]))
        config = ModelConfig(
            vocab_size=int(raw["vocab_size"]), n_layer=int(raw["num_hidden_layers"]), n_head=heads,
            n_kv_head=kv_heads, n_embd=hidden, mlp_hidden=int(raw["intermediate_size"]),
            context_length=int(raw.get("max_position_embeddings", DEFAULT_CONTEXT[name])),
            tie_embeddings=tied,
            rope_base=float(theta), norm_eps=float(raw.get("rms_norm_eps", 1e-6)), qk_norm=qk_norm,
            attention_gate=gated)
    except KeyError as e:
        refuse(f"field {e.args[0]} is missing")
    except (TypeError, ValueError) as e:
        refuse(f"a field has an unusable value ({e})")

    def fail(key, value, accepted):
        refuse(f"gives {key}={value!r}, which tinyattn cannot build: {accepted}")

    config.validate(fail)
    return config


def refuse_what_neither_computes(config: ModelConfig, where: str, architectures: str) -> None:
    """A CheckpointError for a model option that none of `architectures` (Llama, Qwen3 and Qwen3.5 as
    transformers or llama.cpp names them) can hold; `where`: " to GGUF" or ""."""
    if config.logit_softcap is not None:
        raise CheckpointError(f"model.logit_softcap: {config.logit_softcap} cannot be exported{where}: "
                              f"{architectures} do not soft-cap logits")
    if not config.causal:
        raise CheckpointError(f"model.causal: false (a bidirectional model) cannot be exported{where}: "
                              f"{architectures} mask every later position")
    if not config.scale_scores:
        raise CheckpointError(f"model.scale_scores: false (tinyattn lab scaling's experiment) cannot be "
                              f"exported{where}: {architectures} divide every score by sqrt(d_k)")


def hf_config(config: ModelConfig, bos_id: Optional[int], eos_id: Optional[int], dtype: torch.dtype) -> dict:
    """config.json for `config` (Llama, Qwen3 with QK-norm, Qwen3.5 with the attention gate too); an
    option none can hold is refused, never dropped."""
    refuse_what_neither_computes(config, "", ARCHITECTURES)
    if config.attention_gate and not config.qk_norm:
        raise CheckpointError("model.attention_gate: true without model.qk_norm cannot be exported: "
                              f"{GATED_ARCHITECTURE}, which gates, always norms the queries and keys")
    architecture = hf_architecture(config)
    rope = {"rope_type": "default", "rope_theta": config.rope_base}
    layers = {"layer_types": ["full_attention"] * config.n_layer}
    extra = {
        ARCHITECTURE: {"mlp_bias": False},
        QK_NORM_ARCHITECTURE: {"use_sliding_window": False, "sliding_window": None,
                               "max_window_layers": config.n_layer, **layers},
        GATED_ARCHITECTURE: layers,
    }[architecture]
    if architecture == GATED_ARCHITECTURE:
        rope["partial_rotary_factor"] = 1.0  # Qwen3.5's default rotates a quarter of each head
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
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": None,
        "initializer_range": 0.02, "use_cache": True, "dtype": DTYPE_NAMES[dtype],
    }
