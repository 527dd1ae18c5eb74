"""Run configuration: typed dataclasses, YAML loading with `extends`, overrides, validation.

One YAML file describes a run. It has five sections, each a dataclass below with
its defaults written next to the fields: `model`, `data`, `tokenizer`, `train`
and `sample`. A file may start with `extends: base.yaml` (a path relative to the
file, or ~/...) to inherit another file and deep-merge its own keys on top, so `configs/`
holds one base and small deltas. Command-line overrides use dotted keys and are
typed like the field they set: `--set model.n_layer=8 train.lr=3e-4`.

Every mistake ends in a `ConfigError` whose one-line message names the file (or
`--set`), the dotted key, the bad value and what would be accepted. The resolved
config is written back with `save_config` and rebuilt with `config_from_dict`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from tinyattn.errors import ConfigError
from tinyattn.system.choices import PRECISIONS, check_device
from tinyattn.system.storage import atomic_write, read_text

Fail = Callable[[str, Any, str], None]  # fail(dotted key, bad value, what is accepted) raises


def _refuse_blank(fail: Fail, key: str, value: Optional[str], accepted: str) -> None:
    """fail() for a path that is empty or only spaces. Path("") is the current folder: an empty
    data.files would read everything below it (run folders included), an empty train.out_dir write
    runs into it. Where the current folder is meant, '.' says so."""
    if value is not None and not value.strip():
        fail(key, value, accepted)


@dataclass
class ModelConfig:
    """Shape of the decoder-only transformer."""

    vocab_size: Optional[int] = None  # None: taken from the tokenizer when the run starts
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: Optional[int] = None  # None: same as n_head; fewer gives grouped-query attention
    n_embd: int = 256
    mlp_hidden: Optional[int] = None  # None: about 8/3 * n_embd rounded up to a multiple of 64 (SwiGLU)
    context_length: int = 256
    dropout: float = 0.0  # on the embedding, each residual branch and the attention weights
    attention_dropout: Optional[float] = None  # on the attention weights alone; None: model.dropout
    tie_embeddings: bool = True  # the output head reuses the token embedding matrix
    rope_base: float = 10000.0
    norm_eps: Optional[float] = None  # RMSNorm epsilon; None: torch's default, the dtype's machine epsilon
    # Options beyond the Llama architecture (qk_norm exports as Qwen3, with attention_gate as Qwen3.5;
    # soft-capping does not export):
    qk_norm: bool = False  # RMSNorm on each head's queries and keys before RoPE (as in Qwen3, OLMo 2)
    attention_gate: bool = False  # each head's output times a sigmoid of the block's input (Qwen3.5)
    # None: the gate's own (C, C) matrix; r: that matrix as the product of a (C, r) and an (r, C) one,
    # 2rC weights instead of C x C (exported as the product: the same Qwen3.5 model)
    attention_gate_rank: Optional[int] = None
    logit_softcap: Optional[float] = None  # logits -> cap * tanh(logits / cap) (Gemma 2); None: off
    # Initialisation only (any architecture holds it):
    zero_init_projections: bool = False  # attention output and MLP down start at zero
    attention: str = "auto"  # auto (chosen for the hardware), fused (one kernel) or explicit (the textbook matmuls)
    # An experiment only (tinyattn lab causal): false lets every position attend to every other,
    # the future too; generate and export refuse such a model.
    causal: bool = True
    # An experiment only (tinyattn lab scaling): false leaves the scores q.k undivided by sqrt(d_k);
    # export refuses such a model (Llama and Qwen3 always divide).
    scale_scores: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def qkv_rows(self) -> tuple[int, ...]:
        """The rows of each matrix the attention's stacked `qkv` weight holds, in order: query (C),
        key and value (Hkv * D each), and with attention_gate the gate (C) unless it is the product of
        two matrices of its own (attention_gate_rank)."""
        kv_width = self.kv_heads * self.head_dim
        stacked_gate = self.attention_gate and self.attention_gate_rank is None
        return (self.n_embd, kv_width, kv_width) + ((self.n_embd,) if stacked_gate else ())

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def weights_dropout(self) -> float:
        """The dropout on the attention weights: attention_dropout, else dropout."""
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden:
            return self.mlp_hidden
        return 64 * math.ceil(8 * self.n_embd / 3 / 64)

    def validate(self, fail: Fail) -> None:
        """Checks that need more than the field's type; `fail(key, value, accepted)` raises."""
        m = self
        for name in ("n_layer", "n_head", "n_embd", "context_length"):
            if getattr(m, name) <= 0:
                fail(f"model.{name}", getattr(m, name), "expected a positive integer")
        for name in ("vocab_size", "n_kv_head", "mlp_hidden"):
            value = getattr(m, name)
            if value is not None and value <= 0:
                fail(f"model.{name}", value, "expected a positive integer or null")
        if m.n_embd % m.n_head:
            fail("model.n_embd", m.n_embd, f"must be divisible by model.n_head={m.n_head}")
        if m.head_dim % 2:
            fail("model.n_embd", m.n_embd,
                 f"n_embd / n_head = {m.head_dim} must be even for rotary position embedding")
        if m.n_head % m.kv_heads:
            fail("model.n_head", m.n_head, f"must be divisible by model.n_kv_head={m.kv_heads}")
        if not 0.0 <= m.dropout < 1.0:
            fail("model.dropout", m.dropout, "expected a number in [0, 1)")
        if m.attention_dropout is not None and not 0.0 <= m.attention_dropout < 1.0:
            fail("model.attention_dropout", m.attention_dropout,
                 "expected a number in [0, 1) or null (model.dropout)")
        if m.rope_base <= 0:
            fail("model.rope_base", m.rope_base, "expected a positive number")
        if m.logit_softcap is not None and m.logit_softcap <= 0:
            fail("model.logit_softcap", m.logit_softcap, "expected a positive number or null (off)")
        if m.norm_eps is not None and not m.norm_eps > 0:
            fail("model.norm_eps", m.norm_eps, "expected a positive number or null (torch's default)")
        if m.attention_gate_rank is not None and not m.attention_gate:
            fail("model.attention_gate_rank", m.attention_gate_rank,
                 "it sets the rank of model.attention_gate's matrix: set model.attention_gate=true too, "
                 "or leave it null")
        if m.attention_gate_rank is not None and not 0 < 2 * m.attention_gate_rank < m.n_embd:
            fail("model.attention_gate_rank", m.attention_gate_rank,
                 f"expected an integer from 1 to {(m.n_embd - 1) // 2} (below half of "
                 f"model.n_embd={m.n_embd}, where the two matrices hold fewer weights than the gate's own), "
                 "or null for its own matrix")


@dataclass
class DataConfig:
    """Where the text comes from. Set exactly one of `dataset` (a hub name) or `files`."""

    dataset: Optional[str] = None  # Hugging Face hub name, e.g. roneneldan/TinyStories
    dataset_config: Optional[str] = None  # hub config name, e.g. wikitext-103-raw-v1
    revision: Optional[str] = None  # hub revision (branch, tag or commit)
    train_split: str = "train"
    validation_split: Optional[str] = None  # None: hold out validation_fraction of the training split
    streaming: bool = False  # stream a hub dataset instead of downloading it whole
    files: Optional[list[str]] = None  # paths, globs or folders of .txt .jsonl .csv .tsv .parquet (.gz .bz2 .xz .zst)
    format: str = "auto"  # auto (from the file extension), text, json, csv, tsv or parquet
    # Downloaded once to files[0] when that file is missing. A config (or --set) that sets
    # data.files or data.dataset does not inherit url, sha256 or size_bytes through `extends`
    # (see _drop_inherited_source).
    url: Optional[str] = None
    sha256: Optional[str] = None  # checked after a download
    size_bytes: Optional[int] = None  # checked after a download
    text_field: str = "text"  # a column, or a dotted path into nested records: body.text
    validation_fraction: float = 0.1
    max_documents: Optional[int] = None  # use only the first N documents (quick experiments)
    cache_dir: str = "data/cache"

    def validate(self, fail: Fail) -> None:
        """Checks that need more than the field's type; `fail(key, value, accepted)` raises."""
        d = self
        if (d.dataset is None) == (d.files is None):
            fail("data.files", d.files, "set exactly one of data.dataset (a hub name) or data.files")
        if d.files is not None and not d.files:
            fail("data.files", d.files, "expected at least one path, glob or folder")
        for entry in d.files or []:
            _refuse_blank(fail, "data.files", entry, "expected a path, glob or folder")
        _refuse_blank(fail, "data.dataset", d.dataset, "expected a hub name or a dataset folder")
        _refuse_blank(fail, "data.cache_dir", d.cache_dir, "expected a folder ('.' for the current one)")
        if d.url is not None and (d.files is None or len(d.files) != 1):
            fail("data.url", d.url, "needs data.files to be the single path it is downloaded to")
        if d.url is not None and any(c in d.files[0] for c in "*?["):
            fail("data.files", d.files[0], "data.url is downloaded to one file: give its plain path, "
                 "not a glob")
        if not 0.0 < d.validation_fraction < 1.0:
            fail("data.validation_fraction", d.validation_fraction, "expected a number in (0, 1)")
        if d.max_documents is not None and d.max_documents <= 0:
            fail("data.max_documents", d.max_documents, "expected a positive integer or null")
        # a download's checks that no file passes: said now, not after the download
        if d.sha256 is not None and not is_sha256(d.sha256):
            fail("data.sha256", d.sha256, "expected 64 hexadecimal digits (sha256sum's) or null")
        if d.size_bytes is not None and d.size_bytes <= 0:
            fail("data.size_bytes", d.size_bytes, "expected a positive integer or null")


@dataclass
class TokenizerConfig:
    """How text becomes token ids. Every kind is saved as a Hugging Face `tokenizer.json`."""

    kind: str = "char"  # char, bpe or pretrained
    vocab_size: int = 4096  # bpe only
    path: Optional[str] = None  # pretrained only: an existing tokenizer.json
    # pretrained only: the token that ends a text (generation stops at it, documents are joined
    # with it), e.g. a Llama folder's "</s>"; None: <|endoftext|>, where the tokenizer has it
    end_of_text: Optional[str] = None
    # pretrained only: the other tokens generation stops at (an imported folder's eos ids after its
    # first, e.g. Qwen3's "<|endoftext|>" beside "<|im_end|>"); written to config.yaml only when given
    stop_tokens: list[str] = field(default_factory=list)

    def validate(self, fail: Fail) -> None:
        """Checks that need more than the field's type; `fail(key, value, accepted)` raises."""
        t = self
        if t.kind == "pretrained" and not t.path:
            fail("tokenizer.path", t.path, "tokenizer.kind=pretrained needs the path of a tokenizer.json")
        if t.kind != "pretrained" and t.path is not None:
            fail("tokenizer.path", t.path, f"it is read only with tokenizer.kind=pretrained (here {t.kind!r}, "
                 "which builds its own): remove it, or set the kind")
        if t.end_of_text is not None and t.kind != "pretrained":
            fail("tokenizer.end_of_text", t.end_of_text, "a token of a pretrained tokenizer (tokenizer.kind="
                 "pretrained); char and bpe tokenizers end texts with <|endoftext|>")
        if t.end_of_text == "":  # of a pretrained tokenizer: not "(tokenizer.kind=pretrained)", which it is
            fail("tokenizer.end_of_text", t.end_of_text,
                 "expected a token of the tokenizer, e.g. '</s>', or null (its <|endoftext|>)")
        if t.stop_tokens and t.kind != "pretrained":
            fail("tokenizer.stop_tokens", t.stop_tokens, "tokens of a pretrained tokenizer (tokenizer.kind="
                 "pretrained); char and bpe tokenizers stop at <|endoftext|> alone")
        if "" in t.stop_tokens:
            fail("tokenizer.stop_tokens", t.stop_tokens,
                 "expected tokens of the tokenizer as its vocabulary spells them, e.g. ['<|im_end|>'], or []")
        if t.kind == "bpe" and t.vocab_size <= 0:
            fail("tokenizer.vocab_size", t.vocab_size, "expected a positive integer")


# train.show: what an evaluation shows beyond the validation loss, each a hook the loop calls
# (tinyattn.train.hooks maps the names to their implementations). The two that read
# train.probe_text need one.
SHOW_HOOKS = ("sample", "loss_by_position", "attention", "head_ablation")
PROBE_HOOKS = ("attention", "head_ablation")
# The tables read by the passes a new run makes over its training text (passes.entry_for): a
# time budget's calibration counts the passes that fit, a run of train.max_steps the passes its
# steps make. Each with the key its entry sets; that key given with --set wins over the table.
PASS_TABLES = {"dropout_by_passes": "model.dropout", "floor_by_passes": "train.min_lr",
               "decay_by_passes": "train.weight_decay"}


@dataclass
class TrainConfig:
    """The optimization loop, evaluation, checkpoints and hardware."""

    batch_size: int = 16
    grad_accum_steps: int = 1
    max_steps: int = 2000  # the schedule's length; with time_budget, the run's first estimate (recorded)
    time_budget: Optional[str] = None  # e.g. 90s, 10m, 2h: the whole process ends within it
    lr: float = 1e-3  # peak rate of AdamW (and of Muon unless muon_lr is set)
    min_lr: float = 1e-4  # the floor the schedule decays to (every group in proportion)
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine, linear, constant or wsd (after warmup); see tinyattn/train/optim.py
    decay_fraction: float = 0.3  # wsd: the final share of the run (with a budget: of its time) to decay
    optimizer: str = "adamw"  # adamw, or muon (Muon for the blocks' matrices, AdamW for the rest)
    muon_lr: Optional[float] = None  # None: train.lr
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton-Schulz iterations per Muon update (fewer: cheaper, rougher)
    # Orthogonalise each matrix a stacked weight holds (query, key, value; gate, up) on its own,
    # as if they were separate weights, instead of the stacked one as a whole.
    muon_split_stacked: bool = True
    # Split the query and key projections further, into one matrix per head: each head's rows
    # orthogonalised on their own (without the split above, the value and MLP stay whole).
    muon_split_heads: bool = False
    embedding_lr: Optional[float] = None  # token embedding (and a tied head); None: train.lr
    head_lr: Optional[float] = None  # an untied output head; None: train.lr
    weight_decay: float = 0.1  # matrices only; norms, biases and the embedding are not decayed
    # Passes over the training text -> model.dropout. A new run counts the passes it makes (under
    # time_budget, those its plan expects; else max_steps') and the entry with the most passes at
    # or below that count sets the dropout on the embedding and residual branches
    # (passes.entry_for); under a budget, if the passes the model makes with that dropout
    # (measured again) still reach an entry giving one; {}: never.
    dropout_by_passes: dict[float, float] = field(default_factory=dict)
    # Passes over the training text -> the floor the schedule decays to, as a
    # share of the peak rate (train.min_lr = share * train.lr), by the same rule from the passes
    # of the model chosen: where many passes fit, the schedule can stop decaying higher. Where a
    # dropout fell short, only the entries below the one it fell short of count; {}: never.
    floor_by_passes: dict[float, float] = field(default_factory=dict)
    # Passes over the training text -> train.weight_decay (the matrices' and the head's), by the
    # floor's rule; {}: never.
    decay_by_passes: dict[float, float] = field(default_factory=dict)
    # How training windows are drawn: random (at random starts; they may overlap and repeat) or
    # passes (each pass over the text in non-overlapping windows, in a shuffled order).
    sampling: str = "random"
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    # Evaluate and save a moving average of the weights (tinyattn.train.averaging): each step it
    # moves (1 - ema) of the way to the weights. None: the weights themselves.
    ema: Optional[float] = None
    eval_interval: int = 250
    eval_windows: Optional[int] = 200  # None: every window of the validation split
    log_interval: int = 10
    keep_last: int = 2  # step checkpoints kept besides the best one
    seed: int = 1337
    init_from: Optional[str] = None  # start from these weights: a run folder, a checkpoint or a Hugging Face folder
    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps
    precision: str = "auto"  # auto, fp32, bf16 or fp16
    compile: bool = False
    peak_flops: Optional[float] = None  # for MFU; None: measured by a matmul at start-up
    out_dir: str = "checkpoints"
    sample_tokens: int = 200  # length of the `sample` hook's text at each evaluation
    show: list[str] = field(default_factory=list)  # hooks each evaluation runs: SHOW_HOOKS; none by default
    probe_text: str = ""  # the text the attention and head_ablation hooks look at (empty: none)

    def validate(self, fail: Fail) -> None:
        """Checks that need more than the field's type; `fail(key, value, accepted)` raises."""
        tr = self
        for name in ("batch_size", "grad_accum_steps", "max_steps", "eval_interval", "log_interval"):
            if getattr(tr, name) <= 0:
                fail(f"train.{name}", getattr(tr, name), "expected a positive integer")
        if tr.keep_last < 1:
            fail("train.keep_last", tr.keep_last, "expected an integer >= 1 (step checkpoints kept)")
        for name in ("warmup_steps", "sample_tokens"):
            if getattr(tr, name) < 0:
                fail(f"train.{name}", getattr(tr, name), "expected a non-negative integer")
        if tr.lr <= 0:
            fail("train.lr", tr.lr, "expected a positive number")
        for name in ("muon_lr", "embedding_lr", "head_lr"):
            value = getattr(tr, name)
            if value is not None and value <= 0:
                fail(f"train.{name}", value, "expected a positive number or null (train.lr)")
        if not 0.0 < tr.decay_fraction <= 1.0:
            fail("train.decay_fraction", tr.decay_fraction, "expected a number in (0, 1]")
        if tr.muon_ns_steps < 1:
            fail("train.muon_ns_steps", tr.muon_ns_steps, "expected a positive integer")
        if not 0.0 <= tr.muon_momentum < 1.0:
            fail("train.muon_momentum", tr.muon_momentum, "expected a number in [0, 1)")
        if tr.time_budget is not None:
            try:
                parse_duration(tr.time_budget)
            except ValueError as e:
                fail("train.time_budget", tr.time_budget, str(e))
        if not 0 <= tr.min_lr <= tr.lr:
            fail("train.min_lr", tr.min_lr, f"expected a number in [0, train.lr={tr.lr}] (lower both)")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(tr, name) < 1.0:
                fail(f"train.{name}", getattr(tr, name), "expected a number in [0, 1)")
        if tr.weight_decay < 0 or tr.grad_clip < 0:
            key = "train.weight_decay" if tr.weight_decay < 0 else "train.grad_clip"
            fail(key, getattr(tr, key.split(".")[1]), "expected a non-negative number")
        if tr.ema is not None and not 0.0 < tr.ema < 1.0:
            fail("train.ema", tr.ema, "expected a number in (0, 1), e.g. 0.98, or null (no average)")
        _refuse_blank(fail, "train.out_dir", tr.out_dir, "expected a folder ('.' for the current one)")
        tr._validate_pass_tables(fail)
        tr._validate_run_numbers(fail)
        check_device(tr.device, fail, "train.device")
        for name in tr.show:
            if name not in SHOW_HOOKS:
                close = difflib.get_close_matches(name, SHOW_HOOKS, n=1, cutoff=0.5)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                fail("train.show", name, f"expected a list of {', '.join(SHOW_HOOKS)}{hint}")
        probing = [name for name in tr.show if name in PROBE_HOOKS]
        if probing and not tr.probe_text:
            fail("train.probe_text", tr.probe_text, f"expected a text for train.show's {', '.join(probing)}")

    def _validate_run_numbers(self, fail: Fail) -> None:
        """The evaluation's windows, the seed and the peak FLOP/s."""
        if self.eval_windows is not None and self.eval_windows <= 0:
            fail("train.eval_windows", self.eval_windows,
                 "expected a positive integer or null (all windows)")
        if not 0 <= self.seed < 2**63:  # what torch.manual_seed takes
            fail("train.seed", self.seed, "expected an integer in [0, 2**63)")
        if self.peak_flops is not None and not self.peak_flops > 0:
            fail("train.peak_flops", self.peak_flops, "expected a positive number (FLOP/s), or null (measured)")

    def _validate_pass_tables(self, fail: Fail) -> None:
        examples = {"dropout_by_passes": "{6: 0.075, 10: 0.1}", "floor_by_passes": "{10: 0.3}",
                    "decay_by_passes": "{3.5: 0.2}"}
        for name in PASS_TABLES:
            for passes in getattr(self, name):
                if passes < 0:
                    fail(f"train.{name}", passes, f"expected passes >= 0 as keys, e.g. {examples[name]}")
        for passes, dropout in self.dropout_by_passes.items():
            if not 0.0 <= dropout < 1.0:
                fail(f"train.dropout_by_passes.{passes:g}", dropout, "expected a dropout in [0, 1)")
        for passes, share in self.floor_by_passes.items():
            if not 0.0 <= share <= 1.0:
                fail(f"train.floor_by_passes.{passes:g}", share, "expected a share of train.lr in [0, 1]")
        for passes, decay in self.decay_by_passes.items():
            if decay < 0:
                fail(f"train.decay_by_passes.{passes:g}", decay, "expected a weight decay >= 0")


@dataclass
class SampleConfig:
    """Defaults for generation; the command line overrides each of them."""

    max_new_tokens: int = 500
    temperature: float = 0.8
    top_k: Optional[int] = None
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    prompt: str = ""  # empty: start from <|endoftext|> (a document boundary) or an imported folder's bos

    def validate(self, fail: Fail) -> None:
        """The rules every generation call checks too (`check_sampling`); `fail(key, value, accepted)` raises."""
        check_sampling(lambda name, value, accepted: fail(f"sample.{name}", value, f"expected {accepted}"),
                       max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                       top_p=self.top_p, repetition_penalty=self.repetition_penalty)


SAMPLING_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {  # option: (accepts a value?, what is accepted)
    "max_new_tokens": (lambda v: v >= 0, "an integer >= 0"),
    "temperature": (lambda v: 0 <= v < math.inf, "a number >= 0 (0 means greedy)"),
    "top_k": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "an integer >= 0 (0 or null: no top-k)"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1] (1 means no top-p)"),
    "repetition_penalty": (lambda v: 0 < v < math.inf, "a positive number (1 means none)"),
    "num_samples": (lambda v: v >= 1, "an integer >= 1"),
    "seed": (lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"),
    "stop": (lambda v: v != "", "a non-empty string"),  # each of the stop strings
}


def check_sampling(fail: Fail, **options: Any) -> None:
    """The one check of sampling options: `fail(option, value, accepted)` for the first refused.

    Options are named as in SAMPLING_RULES; None means "not given" (top_k: off) and `stop`
    is a list whose strings are checked one by one. `sample.*` in a config and every
    generation call (`tinyattn.generate.sampling.check_sampling_options`) go through it.
    """
    for name, value in options.items():
        accepts, accepted = SAMPLING_RULES[name]
        for item in (value if name == "stop" else [value]):
            if item is not None and not accepts(item):
                fail(name, item, accepted)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    # What changes with the precision a training run resolves to (train.precision auto picks
    # bf16 where the hardware has fast bf16, and so trains more steps in the same minutes):
    # {precision: {section: {key: value}}}, applied when a new run starts (`for_precision`);
    # a value given with --set wins. A run's saved config holds the result, with this empty.
    by_precision: dict = field(default_factory=dict)


ATTENTION_PATHS = ("auto", "fused", "explicit")  # model.attention; "auto" picks per hardware
TOKENIZER_KINDS = ("char", "bpe", "pretrained")  # tokenizer.kind (see tinyattn.data.tokenizer)
SAMPLINGS = ("random", "passes")  # train.sampling (see tinyattn.data.batches.BatchSampler)

CHOICES = {
    "model.attention": ATTENTION_PATHS,
    "data.format": ("auto", "text", "json", "csv", "tsv", "parquet"),
    "tokenizer.kind": TOKENIZER_KINDS,
    "train.schedule": ("cosine", "linear", "constant", "wsd"),
    "train.optimizer": ("adamw", "muon"),
    "train.sampling": SAMPLINGS,
    "train.precision": PRECISIONS,  # tinyattn.system.device names them
}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|min)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as "90s", "10m", "1.5h" or "600" (seconds)."""
    match = _DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError("expected a positive duration such as 90s, 10m (or 10min), 2h or 600 (seconds)")
    unit = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * unit


def duration_text(text) -> str:
    """A duration as given, its unit said: "10" (seconds) is "10s", "10m" stays "10m"."""
    match = _DURATION.match(str(text))
    return f"{match.group(1)}s" if match and match.group(2) is None else str(text).strip()


# ----------------------------------------------------------------------------- values in errors

SHOWN_CHARS = 120  # the most of one value an error message shows
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxtuple, _SHOWN.maxset = 2, 6, 6, 6, 6
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 80, 80, 40


def show_value(value: Any) -> str:
    """`value` as an error message shows it: its repr, cut to a readable length.

    The one place that formats a user's value for an error. reprlib stops at a few items
    and levels, so a huge value costs what its first items cost, not what it holds.
    """
    text = _SHOWN.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


MAX_CONFIG_VALUES = 10_000  # values a config may expand to (a real one holds about a hundred)
MAX_CONFIG_DEPTH = 50  # levels of lists and mappings a config value may nest (a real one: three at most)


class _TooDeep(Exception):
    """Raised inside `_check_expansion`'s count past MAX_CONFIG_DEPTH levels."""


def _check_expansion(raw: dict, where) -> None:
    """Refuse a config whose YAML aliases repeat a value past MAX_CONFIG_VALUES, or whose value
    nests past MAX_CONFIG_DEPTH levels.

    An alias (*name) repeats the anchored value, and aliases of aliases multiply: a few
    hundred bytes can stand for billions of items, which every later step (a type check,
    a copy, an error message) would walk. Aliases are allowed (`lr: &lr 3e-4` reused is
    fine); only the expanded size is limited. Counted per distinct object, so the count
    itself costs what the file holds, not what it expands to. The depth is counted, not left
    to Python's recursion limit, which torch's compiler raises while it runs.
    """
    sizes: dict[int, int] = {}

    def size(value: Any, depth: int) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        if depth > MAX_CONFIG_DEPTH:
            raise _TooDeep
        if id(value) not in sizes:
            sizes[id(value)] = 0  # a cycle counts once
            items = value.values() if isinstance(value, dict) else value
            sizes[id(value)] = min(1 + sum(size(item, depth + 1) for item in items), MAX_CONFIG_VALUES + 1)
        return sizes[id(value)]

    for name, section in raw.items():
        entries = section.items() if isinstance(section, dict) else [(None, section)]
        for key, value in entries:
            dotted = name if key is None else f"{name}.{key}"
            try:
                too_big = size(value, 1) > MAX_CONFIG_VALUES
            except _TooDeep:
                raise ConfigError(f"{where(dotted)}: {dotted}: nests lists or mappings more than "
                                  f"{MAX_CONFIG_DEPTH} levels deep; no config value nests more than a few "
                                  "levels") from None
            if too_big:
                raise ConfigError(f"{where(dotted)}: {dotted}: expands to more than {MAX_CONFIG_VALUES:,} "
                                  "values (YAML aliases repeating aliases); write the value out, or "
                                  "repeat it fewer times")


# ----------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (following `extends`), apply `key=value` overrides, validate."""
    raw, origins = _read_with_extends(Path(path), seen=())
    _apply_sets(raw, overrides or [], origins)
    return config_from_dict(raw, origins=origins, default_origin=str(path))


def apply_overrides(config: Config, overrides: list[str], origin: str = "saved config") -> Config:
    """A copy of `config` with `key=value` overrides applied and validated again."""
    raw = config_to_dict(config)
    origins: dict[str, str] = {}
    _apply_sets(raw, overrides, origins)
    return config_from_dict(raw, origins=origins, default_origin=origin)


def _apply_sets(raw: dict, overrides: list[str], origins: dict[str, str]) -> None:
    """The `key=value` items into raw, each key (and the section it made or the value it replaced)
    recorded as from --set. A --set data.files=mine.txt drops the download the config's url
    described, as a child config's data.files does (`_drop_inherited_source`)."""
    given: dict = {}  # the overrides alone, as nested sections
    for item in overrides:
        key, value = _parse_override(item)
        origins[key] = origins[_set_dotted(raw, key, value)] = "--set"
        _set_dotted(given, key, value)
    _drop_inherited_source(raw, given, origins)


def override_keys(overrides: Sequence[str]) -> tuple[str, ...]:
    """The dotted keys `key=value` overrides set, in order (an item's text before its first '=')."""
    return tuple(item.split("=", 1)[0].strip() for item in overrides)


def written_keys(config: Config, path: str | Path | None = None,
                 overrides: Sequence[str] = (), *, inherited: bool = True) -> frozenset[str]:
    """The settings (dotted, as `settings` names them) the user gave `config`: those the YAML file
    `path` it was loaded from writes (the files it extends included, less a download a child's data
    source drops; with inherited=False, `path`'s own only), and the keys of the `key=value`
    overrides. A key written at its default is given all the same. Without a file (a Config built
    in Python, or a run's saved config) nothing records what was written: the keys `config` holds
    at other than their default stand for it."""
    if path is None:
        defaults = settings(config_to_dict(Config()))
        written = {key for key, value in settings(config_to_dict(config)).items() if value != defaults[key]}
        return frozenset(written | set(override_keys(overrides)))
    every, own = _file_keys(path, overrides)
    return every if inherited else own


def given_keys(config: Config, path: str | Path | None = None,
               overrides: Sequence[str] = ()) -> tuple[frozenset[str], frozenset[str]]:
    """`written_keys` both ways from one reading of the files: (every key given; those of `path`'s
    own file and the overrides). Without a file nothing tells the user's keys from inherited ones:
    the second is the overrides' alone."""
    if path is None:
        return written_keys(config, None, overrides), frozenset(override_keys(overrides))
    return _file_keys(path, overrides)


def _file_keys(path: str | Path, overrides: Sequence[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(the keys the YAML file `path`, the files it extends and the overrides write; those of `path`
    itself and the overrides alone)."""
    raw, origins = _read_with_extends(Path(path), seen=())
    _apply_sets(raw, list(overrides), origins)
    sets = set(override_keys(overrides))
    own = (str(Path(path)), "--set")  # as origins name it: ./a.yaml and a.yaml alike
    every = set(settings(raw))
    return (frozenset(every | sets),
            frozenset({key for key in every if _origin_of(key, origins) in own} | sets))


def _origin_of(key: str, origins: dict[str, str]) -> Optional[str]:
    """The most specific origin recorded for a dotted key or a section above it."""
    parts = key.split(".")
    return next((origins[".".join(parts[:i])] for i in range(len(parts), 0, -1)
                 if ".".join(parts[:i]) in origins), None)


def override_value(overrides: list[str], key: str, default: Any) -> Any:
    """The value the last `key=value` override among `overrides` gives `key`, else default."""
    value = default
    for item in overrides:
        name, parsed = _parse_override(item)
        if name == key:
            value = parsed
    return value


def config_from_dict(raw: dict, *, origins: dict[str, str] | None = None,
                     default_origin: str = "config") -> Config:
    """Build and validate a Config from plain nested dicts (a YAML file, a checkpoint)."""
    origins = origins or {}

    def where(key: str) -> str:
        # The most specific origin we recorded for this key or one of its parents.
        parts = key.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in origins:
                return origins[".".join(parts[:i])]
        return default_origin

    if not isinstance(raw, dict):
        raise ConfigError(f"{default_origin}: expected a mapping of sections, got {type(raw).__name__}")
    _check_expansion(raw, where)
    sections = {}
    section_types = {f.name: f.type for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    for name, value in raw.items():
        if name not in section_types:  # str(): YAML reads `1:`, `true:` or `null:` as no text
            raise ConfigError(_unknown_key_message(where(str(name)), str(name), list(section_types)))
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where(name)}: {name}: expected a mapping, got {show_value(value)}")
        if name != "by_precision":  # checked once the config it changes is valid
            sections[name] = _build_section(hints[name], name, value, where)
    config = Config(**sections)
    _expand_home(config)
    _validate(config, where, set_at=lambda key: where(key) if _holds(raw, key) else None)
    if raw.get("by_precision"):
        config.by_precision = _check_by_precision(raw, raw["by_precision"], where)
    return config


def home_path(path: Any) -> Any:
    """A path written ~/... as under the user's home folder, as in a shell: a YAML file and a --set
    value (`data.files=~/x.txt`, after `=`) reach tinyattn with no shell expanding them. Another
    value (None, a number) is returned as it is."""
    return os.path.expanduser(path) if isinstance(path, str) else path


def _expand_home(config: Config) -> None:
    """The config's paths written ~/... under the home folder (`home_path`)."""
    data, train = config.data, config.train
    if isinstance(data.files, list):
        data.files = [home_path(entry) for entry in data.files]
    data.dataset, data.cache_dir = home_path(data.dataset), home_path(data.cache_dir)
    config.tokenizer.path = home_path(config.tokenizer.path)
    train.init_from, train.out_dir = home_path(train.init_from), home_path(train.out_dir)


def _holds(raw: dict, key: str) -> bool:
    """Whether the sections `raw` write the dotted `key` (a file or --set gave it; not its default)."""
    section, _, name = key.partition(".")
    return isinstance(raw.get(section), dict) and name in raw[section]


def _with_origins(rule: str, config: Config, set_at, origin: str) -> str:
    """`rule` with each setting it names at its value now followed by where that came from
    (`set_at(key)`; None for a key at its default), where that is not `origin`: the mistake may be
    the other key's (`--set model.n_kv_head=3` against a file's model.n_head: 4 blamed the file alone)."""
    def said(match: re.Match) -> str:
        section, name, text = match.groups()
        key, now = f"{section}.{name}", getattr(getattr(config, section, None), name, None)
        known = now is not None and str(now) == text and set_at(key) not in (None, origin)
        return f"{match.group(0)} (from {set_at(key)})" if known else match.group(0)

    return NAMED_SETTING.sub(said, rule)


def _check_by_precision(raw: dict, value: dict, where) -> dict:
    """by_precision as given, once each precision's version of the config is itself valid."""
    for precision, changes in value.items():
        key = f"by_precision.{precision}"
        if precision not in PRECISIONS or precision == "auto":
            raise ConfigError(f"{where(key)}: {key}: {show_value(precision)} is not a precision; expected "
                              f"one of {', '.join(p for p in PRECISIONS if p != 'auto')}")
        if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in changes.values()):
            raise ConfigError(f"{where(key)}: {key}: expected sections of keys, e.g. "
                              "{model: {dropout: 0.1}}")
        merged = _copy_sections({name: section for name, section in raw.items() if name != "by_precision"})
        _deep_merge(merged, changes, {}, "", prefix="")
        config_from_dict(merged, default_origin=f"{where(key)}: {key}")
    return value


def _copy_sections(raw: dict) -> dict:
    return {name: dict(section) if isinstance(section, dict) else section for name, section in raw.items()}


def for_precision(config: Config, precision: str, *,
                  keep: typing.Sequence[str] = ()) -> tuple[Config, list[str]]:
    """`config` as a run in `precision` trains it: its by_precision entry applied (but for the
    dotted keys in `keep`, the ones --set gave) and by_precision emptied. Also the changes made,
    as `key=value` items, for the run to say."""
    raw = config_to_dict(config)
    changes = raw.pop("by_precision").get(precision, {})
    items = [f"{section}.{key}={value!r}" for section, keys in changes.items() for key, value in keys.items()
             if f"{section}.{key}" not in keep]
    merged = _copy_sections(raw)
    for item in items:
        dotted, value = item.split("=", 1)
        section, key = dotted.split(".", 1)
        merged[section][key] = changes[section][key]
    return config_from_dict(merged, default_origin=f"by_precision.{precision}"), items


def config_to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def config_text(config: Config) -> str:
    """The YAML text `save_config` writes: what a run's config.yaml holds until the user edits it.
    An empty tokenizer.stop_tokens is left out: a run that stops at its end of text alone (all but a
    fine-tune of a folder with several eos ids) writes the file it wrote before the key existed."""
    raw = config_to_dict(config)
    if not raw["tokenizer"]["stop_tokens"]:
        del raw["tokenizer"]["stop_tokens"]
    return yaml.dump(raw, Dumper=_SAFE_DUMPER, sort_keys=False, allow_unicode=True)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config` on it gives back an equal Config."""
    with atomic_write(path) as f:
        f.write(config_text(config).encode("utf-8"))


# ----------------------------------------------------------------------------- internals


# libyaml's parser where PyYAML was built with it (its wheels are): the same documents and marks,
# several times faster than the pure-Python one, which every --set item and config file goes through.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _UniqueKeyLoader(_SAFE_LOADER):
    """A safe YAML loader that refuses a key given twice in one mapping (at any depth): plain YAML
    keeps the last silently, so a second `train:` section would drop the first one's settings."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_at: dict = {}  # key -> (line, column): two keys of one flow mapping share a line
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *alias` merges on purpose
                key = self.construct_object(key_node, deep=True)
                at = (key_node.start_mark.line + 1, key_node.start_mark.column)
                try:
                    first = first_at.setdefault(key, at)
                except TypeError:
                    continue  # an unhashable key: SafeLoader's own error names it
                if first != at:
                    problem = f"duplicate key {key!r} (first given at line {first[0]})"
                    raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str, *, config_file: bool = False, set_key: str | None = None) -> Any:
    """The YAML document in text. In a config file, a field that holds text keeps a plain scalar
    as typed, as `--set` does: `revision: 1.10` is "1.10", not 1.1 (null still means null). In a
    config file and in the value of a --set of set_key, a number field's plain scalar is read in
    decimal (`_plain_numbers_as_written`)."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if config_file and node is not None:
            _plain_scalars_as_meant(node)
        if set_key is not None and node is not None:
            _plain_numbers_as_written(node, set_key)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


# Plain scalars YAML 1.1 reads in another base than 10: 0100 (octal, 64), 1:30 (base 60, 90),
# 0x10 (hex), 0b101 (binary). Nobody means a step count or a rate in those.
_OTHER_BASE = re.compile(r"[-+]?0[0-9_]+|[-+]?0[xXbB][0-9a-fA-F_]*|[-+]?[0-9][0-9_]*(:[0-9_]*)+(\.[0-9_]*)?")


def _field_of(key: str) -> str:
    """The field a dotted key sets: by_precision.<precision>.section.key sets section.key."""
    parts = key.split(".")
    return ".".join(parts[2:]) if len(parts) == 4 and parts[0] == "by_precision" else key


def _plain_numbers_as_written(node: yaml.Node, key: str) -> None:
    """Tag a plain scalar that YAML 1.1 would read in another base as a string, when `key` is a
    number field (or a table of numbers: its keys and values). The field's type then reads the
    text in decimal, as a person means it (0100 is 100, as YAML 1.2 reads it), or refuses it
    in one line (1:30, 0x10: expected an integer written in decimal, got '1:30'). A key under
    by_precision.<precision> is its field's (by_precision.fp32.train.lr: train.lr)."""
    key = _field_of(key)
    if key in _table_keys() and isinstance(node, yaml.MappingNode):
        scalars = [part for pair in node.value for part in pair]
    elif key in _number_keys():
        scalars = [node]
    else:
        return
    for scalar in scalars:
        if isinstance(scalar, yaml.ScalarNode) and not scalar.style and _OTHER_BASE.fullmatch(scalar.value):
            scalar.tag = "tag:yaml.org,2002:str"


def _plain_scalars_as_meant(root: yaml.Node) -> None:
    """Tag the unquoted values of text fields (section.key in _text_keys()) as strings, so that
    they are read as written instead of as the number, date or boolean YAML would make them; and
    the numbers of number fields YAML 1.1 would read in another base (_plain_numbers_as_written)."""
    for section, body in _mapping_items(root):
        if section.value == "by_precision":  # precision -> section -> key, the same fields
            for _, sections in _mapping_items(body):
                for inner, inner_body in _mapping_items(sections):
                    _tag_fields(inner.value, inner_body)
        else:
            _tag_fields(section.value, body)


def _mapping_items(node: yaml.Node) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
    """The (scalar key, value) pairs of a YAML mapping node; none for anything else."""
    if not isinstance(node, yaml.MappingNode):
        return []
    return [(key, value) for key, value in node.value if isinstance(key, yaml.ScalarNode)]


def _tag_fields(section: str, body: yaml.Node) -> None:
    """`_plain_scalars_as_meant` for one section's mapping."""
    for key, value in _mapping_items(body):
        if (f"{section}.{key.value}" in _text_keys()
                and isinstance(value, yaml.ScalarNode) and not value.style  # plain: unquoted
                and value.value not in YAML_NULLS + ("",)):
            value.tag = "tag:yaml.org,2002:str"
        _plain_numbers_as_written(value, f"{section}.{key.value}")


def _character_at(text: str, line: int, column: int) -> str:
    """The character at a YAML mark's line and column (both counted from the first); empty past the text."""
    lines = text.splitlines()
    return lines[line][column:column + 1] if line < len(lines) else ""


def _read_yaml(path: Path) -> dict:
    text = read_text(path, "config file", ConfigError)
    try:
        data = _load_yaml(text, config_file=True)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if mark and "tab" not in problem and _character_at(text, mark.line, mark.column) == "\t":
            problem += ": a tab; YAML indents with spaces, never tabs"  # libyaml names no character
        raise ConfigError(f"{path}: invalid YAML{at}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top, got {type(data).__name__}")
    return data


def _read_with_extends(path: Path, seen: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in (*seen, resolved))
        raise ConfigError(f"{path}: extends forms a cycle: {chain}")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    merged: dict = {}
    origins: dict[str, str] = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: extends: expected a file path, got {show_value(parent)}")
        wanted = "is not accepted; expected the path of a YAML config file to inherit"
        if not parent.strip():  # '' would name the folder the file is in
            raise ConfigError(f"{path}: extends: {show_value(parent)} {wanted}")
        target = path.parent / home_path(parent)  # ~/base.yaml as under the home folder, as data.files
        # named here, by the file that extends it; other read errors are the target's own
        if not target.exists():
            raise ConfigError(f"{path}: extends: {parent}: config file not found ({target.resolve()})")
        if target.is_dir():
            raise ConfigError(f"{path}: extends: {parent} is a folder, which {wanted}")
        merged, origins = _read_with_extends(target, (*seen, resolved))
        _drop_inherited_source(merged, data, origins)
    _deep_merge(merged, data, origins, str(path), prefix="")
    return merged, origins


def is_sha256(text: str) -> bool:
    """Whether `text` is a SHA-256 digest as sha256sum prints it (64 hexadecimal digits)."""
    return re.fullmatch(r"[0-9a-fA-F]{64}", text) is not None


DOWNLOAD_KEYS = ("url", "sha256", "size_bytes")  # what describes data.files[0]'s download


def _drop_inherited_source(inherited: dict, child: dict, origins: dict[str, str]) -> None:
    """A child that names its own data (data.files or data.dataset) does not inherit the
    parent's download: the url and checksums describe the parent's file, and kept they would
    download it into the child's path. Nor the parent's other source: a child naming a dataset
    reads that, not the parent's files too (and the other way round)."""
    mine, theirs = child.get("data"), inherited.get("data")
    if not (isinstance(mine, dict) and isinstance(theirs, dict)):
        return
    if "files" in mine or "dataset" in mine:
        for key in DOWNLOAD_KEYS:
            if key not in mine:
                theirs.pop(key, None)
                origins.pop(f"data.{key}", None)
    for own, other in (("files", "dataset"), ("dataset", "files")):
        if mine.get(own) is not None and other not in mine:
            theirs.pop(other, None)
            origins.pop(f"data.{other}", None)


@functools.cache
def _sections() -> tuple[tuple[str, type], ...]:
    """The sections of a config whose keys are its settings, (name, dataclass) in order;
    by_precision, a mapping, is not one: it is one setting whole."""
    return tuple((name, section) for name, section in typing.get_type_hints(Config).items()
                 if dataclasses.is_dataclass(section))


@functools.cache
def _table_keys() -> frozenset[str]:
    """The dotted keys of fields whose value is a mapping (train.dropout_by_passes): a child
    config's table replaces its parent's whole instead of merging into it."""
    return frozenset(f"{name}.{key}" for name, section in _sections()
                     for key, tp in typing.get_type_hints(section).items() if typing.get_origin(tp) is dict)


def _deep_merge(base: dict, update: dict, origins: dict[str, str], origin: str, prefix: str) -> None:
    """update's keys into base, section by section; a section with nothing under it (`train:`, its
    keys commented out) gives nothing, as `train: {}` does, instead of replacing the inherited one."""
    for key, value in update.items():
        dotted = f"{prefix}{key}"
        if value is None and not prefix and any(key == name for name, _ in _sections()):
            continue
        if isinstance(value, dict) and isinstance(base.get(key), dict) and dotted not in _table_keys():
            _deep_merge(base[key], value, origins, origin, prefix=f"{dotted}.")
        else:
            base[key] = value
            origins[dotted] = origin


def _keys_holding(*kinds: type) -> frozenset[str]:
    """The dotted keys of fields of one of these types, or of one of them or null."""
    def unless_null(tp: Any) -> Any:
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            return args[0] if len(args) == 1 else tp
        return tp

    return frozenset(f"{name}.{key}" for name, section in _sections()
                     for key, tp in typing.get_type_hints(section).items() if unless_null(tp) in kinds)


def settings(raw: dict) -> dict:
    """A config's settings (a YAML mapping's, or `config_to_dict`'s) by dotted key, section.key: a
    table such as train.decay_by_passes is one setting, its entries compared whole; so is
    by_precision."""
    names = {name for name, _ in _sections()}
    flat = {}
    for name, value in raw.items():
        if name in names and isinstance(value, dict):
            flat.update({f"{name}.{key}": setting for key, setting in value.items()})
        else:
            flat[name] = value
    return flat


def with_settings(raw: dict, values: dict) -> dict:
    """`raw` (`config_to_dict`'s) with `values` (dotted, as `settings` gives them) put in."""
    for key, value in values.items():
        section, _, name = key.partition(".")
        if name:
            raw[section][name] = value
        else:  # by_precision, whole
            raw[section] = value
    return raw


@functools.cache
def _number_keys() -> frozenset[str]:
    """The dotted keys of fields that hold a number (int or float, or null): train.lr, train.seed."""
    return _keys_holding(int, float)


@functools.cache
def _int_keys() -> frozenset[str]:
    """The dotted keys of fields that hold an integer (or null): train.max_steps, model.vocab_size."""
    return _keys_holding(int)


@functools.cache
def _text_keys() -> frozenset[str]:
    """The dotted keys of fields that hold text (str, or str or null): sample.prompt, data.revision."""
    return _keys_holding(str)


YAML_NULLS = ("null", "Null", "NULL", "~")


def _parse_override(item: str) -> tuple[str, Any]:
    """(key, value) of a --set item. The value is read as YAML, but a field that holds text keeps
    the text as typed where YAML would make it something else: sample.prompt=1.10 is "1.10", not 1.1,
    0123 not 83, yes not true, "Q: what" not a mapping, "Act 1 #2" not "Act 1" (a comment), "&a x"
    not "x" (an anchor), ">" not "" (a block); a quoted text is YAML's ('a #b', "x\\ny"), and null still
    means null. A number field reads its number in decimal: train.max_steps=0100 is 100, not octal 64
    (_plain_numbers_as_written). A key under by_precision.<precision> is read as its field's."""
    if "=" not in item:
        raise ConfigError(f"--set: expected key=value (e.g. model.n_layer=8), got {item!r}")
    key, text = item.split("=", 1)
    key = key.strip()
    if "." not in key or not all(key.split(".")):  # lr, .lr, train.
        raise ConfigError(f"--set: expected a dotted key such as train.lr, got {key!r}")
    try:
        value = _load_yaml(text, set_key=key) if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML: keep the string, the field's type decides
    typed = text.strip()
    quoted = typed.startswith(("'", '"')) and isinstance(value, str)
    if _field_of(key) in _text_keys() and not quoted and typed not in YAML_NULLS:
        value = typed
    return key, value


def _set_dotted(raw: dict, key: str, value: Any) -> str:
    """raw[a][b][c] = value for key a.b.c, making or replacing the sections on the way. Returns the
    shortest part of the key that is new or replaced (a section `--set trian.lr=1` made, a value
    `--set train.lr.x=3` turned into a section), so that an error in it names where it came from."""
    node = raw
    *parents, last = key.split(".")
    made = None
    for i, part in enumerate(parents):
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
            made = made or ".".join(parents[:i + 1])
        node = child
    node[last] = value
    return made or key


def _unknown_key_message(origin: str, key: str, valid: list[str]) -> str:
    name = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{origin}: unknown key {key!r}{hint} (valid: {', '.join(valid)})"


def _build_section(cls: type, section: str, values: dict, where) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        dotted = f"{section}.{key}"
        if key not in hints:
            raise ConfigError(_unknown_key_message(where(dotted), dotted, list(hints)))
        kwargs[key] = _coerce(value, hints[key], dotted, where)
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if tp in names:
        return names[tp]
    if typing.get_origin(tp) is list:
        return "a list of strings"
    if typing.get_origin(tp) is dict:
        return "a mapping of numbers to numbers"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return _type_name(args[0]) + " or null"
    return str(tp)


def _coerce(value: Any, tp: Any, key: str, where) -> Any:
    """Check `value` against the annotation `tp`, converting only where it is lossless."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce_plain(value, inner, key, where, _type_name(tp))
    return _coerce_plain(value, tp, key, where, _type_name(tp))


def _type_error(where, key: str, expected: str, value: Any) -> ConfigError:
    if isinstance(value, str) and _OTHER_BASE.fullmatch(value):
        expected += " written in decimal"  # 1:30, 0x10: see _plain_numbers_as_written
    if value is None:  # YAML's null (null, ~ or nothing after the colon): the field has no null
        shown = "null, which this field does not take"
        if expected == "a string":
            name = key.rsplit(".", 1)[-1]
            shown += (f" (an empty text: {key}= ; the word: {key}='null')" if where(key) == "--set"
                      else f' (an empty text: {name}: ""; the word: {name}: "null")')
        return ConfigError(f"{where(key)}: {key}: expected {expected}, got {shown}")
    return ConfigError(f"{where(key)}: {key}: expected {expected}, got {show_value(value)}")


def _coerce_int(value: Any, bad: Callable[[], ConfigError]) -> int:
    if isinstance(value, bool):
        raise bad()
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            number = float(value)  # YAML 1.1 reads 1e6 as a string
        except ValueError:
            raise bad() from None
        if number.is_integer():
            return int(number)
    raise bad()


def _coerce_plain(value: Any, tp: Any, key: str, where, expected: str) -> Any:
    bad = functools.partial(_type_error, where, key, expected, value)  # formatted only when raised
    if typing.get_origin(tp) is list:
        if isinstance(value, str):
            value = [value]  # a single path is a list of one
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad()
        return list(value)
    if typing.get_origin(tp) is dict:  # dict[float, float]: a table such as {6: 0.075, 10: 0.1}
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise bad()
        if any(v is None for v in value.values()):
            # YAML reads {6:0.1} as one key (6:0.1, a number in base 60) with no value
            raise ConfigError(f"{where(key)}: {key}: a key without a value; write a space after "
                              "each colon, as in {6: 0.1, 10: 0.2}")
        return {_coerce_plain(k, float, key, where, expected): _coerce_plain(v, float, key, where, expected)
                for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        return _coerce_int(value, bad)
    if tp is float:
        if isinstance(value, bool):
            raise bad()
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string
            except ValueError:
                raise bad() from None
        if number is None:
            raise bad()
        if not math.isfinite(number):
            raise ConfigError(f"{where(key)}: {key}: {show_value(value)} is not accepted; "
                              "expected a finite number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad()
    raise bad()


# A key and its value named in a rule's text: "must be divisible by model.n_kv_head=3"
NAMED_SETTING = re.compile(r"\b(model|data|tokenizer|train|sample)\.(\w+)=([^\s,;()\[\]]+)")


def _validate(config: Config, where, *, set_at) -> None:
    """The config's rules; `set_at(key)`: where a key a file or --set wrote came from, None for a default."""
    def fail(key: str, value: Any, accepted: str) -> None:
        raise ConfigError(f"{where(key)}: {key}: {show_value(value)} is not accepted; "
                          f"{_with_origins(accepted, config, set_at, where(key))}")

    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if value not in choices:
            close = difflib.get_close_matches(str(value).lower(), choices, n=1, cutoff=0.5)  # BF16: bf16
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            fail(key, value, f"expected one of {', '.join(choices)}{hint}")
    for section in (config.model, config.data, config.tokenizer, config.train, config.sample):
        section.validate(fail)
    for key in sorted(_int_keys()):  # after the sections' own ranges (train.seed names its own)
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if value is not None and not -2**63 <= value < 2**63:  # torch cannot hold it: an OverflowError
            fail(key, value, "expected an integer below 2**63")
