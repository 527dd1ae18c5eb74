"""Hugging Face model folders, both ways: reading one (import) and writing one (export).

- `read_folder(folder)`: a Llama-architecture folder (`config.json`, safetensors weights,
  `tokenizer.json`) as a tinyattn `Config`, tinyattn-named weights, a tokenizer and the
  folder's sampling defaults (`generation_config.json`); `load_any_model` is what every
  `--checkpoint` accepts, this or a tinyattn checkpoint. The names and config.json fields
  are translated in `tinyattn.hf.convert`.
- `export_folder(...)`: the reverse, a folder that `AutoModelForCausalLM` and
  `AutoTokenizer` load with no custom code, with a model card. It is staged beside the
  target and swapped in as one step, so a failed or killed export leaves the folder as it
  was; what a killed one left beside it is cleaned up by the next export.

Only the `safetensors` package is needed here (never `transformers`), imported when a
folder is read or written, so the core works without either. Pickled weights
(`pytorch_model.bin`) are refused: loading a pickle can run code.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from tinyattn.checkpoint import LoadedModel, is_hf_folder, load_model, load_weights, missing_model
from tinyattn.config import Config, SampleConfig, TokenizerConfig
from tinyattn.data.tokenizer import Tokenizer
from tinyattn.errors import CheckpointError, counted, first_line, parameter_count_text
from tinyattn.hf.convert import (
    GATED_ARCHITECTURE,
    QK_NORM_ARCHITECTURE,
    from_hf_weights,
    head_differs_from_embedding,
    hf_architecture,
    hf_config,
    model_config_from_hf,
    safetensors_torch,
    to_hf_weights,
)
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.storage import (TEMPORARY_SUFFIX, atomic_write, new_folder_mode, read_text,
                                     remove_leftover, storage_errors, sync_folder, through_link)

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")
ASIDE_SUFFIX = ".old" + TEMPORARY_SUFFIX  # the replaced export, for the moment between two renames
# Files an export writes; an existing folder holding only these, its README.md tinyattn's model
# card (CARD_TAGS), is an earlier export that --force may replace.
EXPORTED_FILES = ("config.json", WEIGHTS, "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "README.md")
CARD_TAGS = "tags: [tinyattn, "  # the model card's front matter: tags: [tinyattn, llama] (or qwen3)


# ----------------------------------------------------------------------------- reading


def load_any_model(path: Optional[str | Path] = None, device: str | torch.device = "cpu",
                   out_dir: str | Path = "checkpoints") -> LoadedModel:
    """What every `--checkpoint` accepts: a Hugging Face Llama folder, read here, or else a
    tinyattn checkpoint file or run folder (None: the latest run under out_dir), read by
    `tinyattn.checkpoint.load_model`. The model comes back ready for inference (eval mode)."""
    if path is not None and _not_there(path):  # perhaps a hub id, as transformers takes one
        raise missing_model(path)
    if path is None or not is_hf_folder(path):
        return load_model(path, device, out_dir)
    imported = read_folder(path)
    model = LanguageModel(imported.config.model)
    load_weights(model, {"model": imported.weights}, imported.weights_file)
    model.to(device).eval()
    return LoadedModel(model, imported.tokenizer, imported.config, imported.weights_file, 0, hf_folder=True)


def _not_there(path: str | Path) -> bool:
    """Whether nothing is at `path` (a dangling link is something); a path that cannot be looked
    up (a name too long) is left to `load_model`, which names why."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


@dataclass
class ImportedModel:
    config: Config  # model from config.json, tokenizer pretrained, sample from generation_config.json
    weights: dict[str, torch.Tensor]  # tinyattn names, fp32
    tokenizer: Tokenizer
    weights_file: Path


def read_json(path: Path) -> dict:
    text = read_text(path, "JSON file", CheckpointError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
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
    if model_config.tie_embeddings and head_differs_from_embedding(tensors, raw):
        # Loaded as transformers loads it: the embedding as the head would be another model.
        model_config = dataclasses.replace(model_config, tie_embeddings=False)
        print(f"note: {folder / 'config.json'}: tie_word_embeddings is true, but the weights hold an "
              "lm_head.weight that differs from the embedding; it is loaded untied, as transformers "
              "loads it", file=sys.stderr)
    weights = from_hf_weights(tensors, model_config, str(weights_file))
    tokenizer_file = folder / "tokenizer.json"
    tokenizer = Tokenizer.from_file(tokenizer_file)
    if tokenizer.vocab_size > model_config.vocab_size:  # a padded vocab_size (larger) is fine
        # Refused here, once, for every --checkpoint and train.init_from: the embedding has no
        # row for the tokenizer's last ids, and the first prompt holding one would crash.
        raise CheckpointError(f"{folder / 'config.json'}: vocab_size {model_config.vocab_size} is smaller "
                              f"than its tokenizer.json's {tokenizer.vocab_size} tokens; a model cannot "
                              "read tokens it has no embedding for")
    eos_ids, bos_ids = (_folder_tokens(folder, raw, tokenizer, key)
                        for key in ("eos_token_id", "bos_token_id"))
    eos = tokenizer.token(eos_ids[0]) if eos_ids else None  # of a list, the first ends texts
    # no bos_token_id: what the tokenizer puts first, as transformers
    bos = tokenizer.token(bos_ids[0]) if bos_ids else tokenizer.template_start()
    end_of_text = None if eos == tokenizer.end_of_text else eos  # <|endoftext|> ends texts anyway
    # Generation stops at every eos id of a list (Qwen3's names <|im_end|> and <|endoftext|>), as
    # transformers' generate() does; the section names them, so a fine-tune's run keeps them.
    stops = [token for token in dict.fromkeys(map(tokenizer.token, eos_ids[1:])) if token not in (None, eos)]
    tokenizer_config = TokenizerConfig(kind="pretrained", path=str(tokenizer_file), end_of_text=end_of_text,
                                       stop_tokens=stops)
    if eos is not None or bos is not None:  # the folder's own eos ends texts, its bos starts them
        tokenizer = Tokenizer.from_file(tokenizer_file, end_of_text, bos, stops)
    sample = _sample_config(folder / "generation_config.json")
    config = Config(model=model_config, sample=sample, tokenizer=tokenizer_config)
    return ImportedModel(config, weights, tokenizer, weights_file)


def _folder_tokens(folder: Path, raw: dict, tokenizer: Tokenizer, key: str) -> list[int]:
    """The folder's eos or bos ids (`key`: generation_config.json's, else config.json's; one, or a
    list), each checked against the vocabulary; [] where neither gives one."""
    generation = folder / "generation_config.json"
    sources = [(generation, read_json(generation))] if generation.is_file() else []
    for path, values in (*sources, (folder / "config.json", raw)):
        given = values.get(key)
        if given is None:
            continue
        ids = given if isinstance(given, list) and given else [given]
        bad = [i for i in ids
               if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < tokenizer.vocab_size]
        if bad:  # of a list, the id that is not one named
            which = f" holds {bad[0]!r}, which" if ids is given else ""
            raise CheckpointError(f"{path}: {key} {given!r}{which} is not a token id of "
                                  f"its tokenizer.json (0 to {tokenizer.vocab_size - 1})")
        return ids
    return []


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
            reason = first_line(e)
            raise CheckpointError(f"{file}: not a readable safetensors file ({reason[:200]})") from None
    return index, tensors


def _sample_config(path: Path) -> SampleConfig:
    """generation_config.json's sampling defaults; transformers' own defaults where it is silent
    (greedy unless do_sample), tinyattn's when there is no such file."""
    sample = SampleConfig()
    if not path.is_file():
        return sample
    raw = read_json(path)

    def fail(key, value, accepted):  # the file's own key, not the config's (sample.top_p) it fills
        raise CheckpointError(f"{path}: gives {key.removeprefix('sample.')}={value!r}: {accepted}")

    def number(key, default, kind=float):  # null: not given, as transformers reads it
        value = raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(key, value, "expected a number or null")
        return kind(value)

    if raw.get("do_sample"):
        sample.temperature = number("temperature", 1.0)
        # Absent or null: transformers' default, 50; 0 switches top-k off (what an export writes for off).
        sample.top_k = number("top_k", 50, int) or None
        sample.top_p = number("top_p", 1.0)
    else:
        sample.temperature = 0.0
    sample.repetition_penalty = number("repetition_penalty", 1.0)
    sample.max_new_tokens = number("max_new_tokens", None, int) or sample.max_new_tokens

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
                  card: Optional[ModelCard] = None, force: bool = False,
                  earlier: Sequence[str] = ()) -> list[Path]:
    """Write a Hugging Face Llama folder for a tinyattn model; returns the files written.

    weights: the model's state dict (tinyattn names). card: the run exported (None: a Hugging
    Face folder); earlier: the training rows of that folder's card (`training_rows`), where tinyattn
    exported it. An existing `out` is refused unless
    it is empty or (with force) holds only files an export writes. Every file is made
    before any is written, and written beside `out` first: a failed export leaves `out`
    as it was (absent, empty, or the earlier export), never half of one.
    """
    st = safetensors_torch()
    bos, eos = tokenizer.start_id, tokenizer.eot_id  # one token, <|endoftext|>, for tinyattn's own
    hf = hf_config(config.model, bos, eos, dtype)  # refuses what Llama cannot hold, before any write
    # First: an export killed mid-swap may have moved `out` (or the folder a link --out leads to) aside.
    clean_interrupted_export(Path(os.path.realpath(out)))
    out = through_link(Path(out), "a folder")  # a symlinked --out: its folder is written, the link kept
    _check_out_folder(out, force)
    tensors = {name: t.to(dtype) for name, t in to_hf_weights(weights, config.model).items()}
    special = {}
    if eos is not None:
        special.update(bos_token=tokenizer.start_of_text, eos_token=tokenizer.end_of_text)
    if tokenizer.unknown_id is not None:  # a char run's [UNK], an imported folder's <unk>
        special["unk_token"] = tokenizer.token(tokenizer.unknown_id)
    files = {
        "config.json": _json_bytes(hf),
        WEIGHTS: st.save(tensors, metadata={"format": "pt"}),
        "generation_config.json": _json_bytes(_generation_config(config.sample, bos, _stop_ids(tokenizer))),
        "tokenizer.json": tokenizer.export_json().encode("utf-8"),
        "tokenizer_config.json": _json_bytes({
            "tokenizer_class": "PreTrainedTokenizerFast", **special,
            "model_max_length": config.model.context_length,
            # tinyattn adds no token to a text, but an imported folder's bos where its tokenizer.json does
            "add_bos_token": tokenizer.adds_start, "add_eos_token": False,
            "clean_up_tokenization_spaces": False}),  # decode must give the text back unchanged
        "special_tokens_map.json": _json_bytes(special),
        "README.md": model_card(config, card, tokenizer, weights, earlier).encode("utf-8"),
    }
    _write_folder(out, files)
    return [out / name for name in files]


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Write `files` into a staging folder beside `out`, then put it in `out`'s place as one
    step (`_swap_in`): a write that fails, or a kill at any moment, never leaves half of one."""
    with storage_errors(out, creating=True):  # the --out the user gave
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=TEMPORARY_SUFFIX))
        os.chmod(staging, new_folder_mode(out))  # mkdtemp's 0700 would keep a class or a container out
    try:
        for name, data in files.items():
            with atomic_write(staging / name, named=f"{out} (writing {name})", durable_rename=False) as f:
                f.write(data)
        with storage_errors(out):
            sync_folder(staging)  # once for every file: the folder is whole on disk before it is swapped in
            _swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: Path, out: Path) -> None:
    """Put the complete `staging` folder at `out`. An existing `out` (empty, or the earlier
    export --force replaces) is moved aside first and deleted last: at every moment `out`
    is the old export or the new one, and a kill between the two renames leaves the old one
    aside, where the next export's `clean_interrupted_export` puts it back."""
    if out.is_dir():
        aside = staging.with_name(staging.name.removesuffix(TEMPORARY_SUFFIX) + ASIDE_SUFFIX)
        try:
            os.replace(out, aside)
        except OSError as e:  # a mount point (a container's volume) cannot be moved
            if e.errno not in (errno.EBUSY, errno.EXDEV, errno.EINVAL):
                raise
            raise CheckpointError(f"{out}: cannot be moved aside to replace it ({e.strerror}; a mount "
                                  f"point?); export into a folder inside it, such as --out {out / 'model'}"
                                  ) from None
        if appeared := sorted(p.name for p in aside.iterdir() if p.name not in EXPORTED_FILES):
            os.replace(aside, out)  # checked before the export was made, the folder has gained files since
            raise CheckpointError(f"{out}: files appeared in it during the export ({', '.join(appeared)}); "
                                  "nothing was replaced; export again, or choose another --out")
        os.replace(staging, out)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staging, out)


def clean_interrupted_export(out: Path) -> None:
    """Undo what an export into `out` killed part-way left beside it: its staging folders are
    deleted; a folder it had moved aside goes back to `out` when `out` is missing (else deleted)."""
    if not out.parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.[a-z0-9_]{{8}}(\.old)?{re.escape(TEMPORARY_SUFFIX)}$")
    for path in sorted(out.parent.iterdir(), key=lambda p: not p.name.endswith(ASIDE_SUFFIX)):
        if not (pattern.match(path.name) and path.is_dir()):
            continue
        with storage_errors(path):
            if path.name.endswith(ASIDE_SUFFIX) and not out.exists():
                os.replace(path, out)
                print(f"note: {out}: an earlier export was interrupted while replacing it; put the "
                      "folder it replaced back", file=sys.stderr)
            else:
                remove_leftover(path)  # a link (an older export's --out) is removed, not followed


def _check_out_folder(out: Path, force: bool) -> None:
    """Refuse an `out` that is not a folder, holds files an export does not write, or is not an
    earlier tinyattn export (a downloaded model holds the same file names: its model card tells
    them apart); an earlier export is replaced only with `force`."""
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a folder; choose another --out")
    if _is_current_folder(out):  # "." cannot be renamed; a full path would leave the shell in a deleted one
        raise CheckpointError(f"{out}: the folder you are in ({Path.cwd()}); an export puts a new folder in "
                              "its place, which cannot be done to the current folder: export into a folder "
                              "inside it, such as --out model, or from its parent folder")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not present:
        return
    foreign = [name for name in present if name not in EXPORTED_FILES]
    if foreign:
        raise CheckpointError(f"{out}: the folder holds other files ({', '.join(foreign[:3])}); "
                              "choose another --out")
    if not is_tinyattn_export(out):
        more = ", ..." if len(present) > 3 else ""
        raise CheckpointError(f"{out}: not empty and not an earlier tinyattn export (no README.md with "
                              f"tinyattn's model card; it holds {', '.join(present[:3])}{more}); choose "
                              "another --out (--force replaces only an earlier tinyattn export)")
    if not force:
        raise CheckpointError(f"{out}: holds an earlier export; add --force to replace it")


def _is_current_folder(out: Path) -> bool:
    try:
        return out.is_dir() and out.resolve() == Path.cwd().resolve()
    except OSError:  # the current folder was deleted: it is no --out
        return False


def is_tinyattn_export(folder: Path) -> bool:
    """Whether `folder`'s README.md is a model card tinyattn wrote: its front matter's tags
    begin with tinyattn (`CARD_TAGS`)."""
    try:
        text = (folder / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    lines = text.splitlines()
    front = lines[1:lines.index("---", 1)] if lines[:1] == ["---"] and "---" in lines[1:] else []
    return any(line.startswith(CARD_TAGS) for line in front)


def _stop_ids(tokenizer: Tokenizer) -> Optional[int] | list[int]:
    """generation_config.json's eos_token_id: the end-of-text id, or where an imported folder's list
    gave more ids that stop generation, that id first and then the others (transformers stops at each)."""
    eos, others = tokenizer.eot_id, sorted(tokenizer.stop_ids - {tokenizer.eot_id})
    return [eos, *others] if others and eos is not None else eos


def _generation_config(sample: SampleConfig, bos: Optional[int], eos: Optional[int] | list[int]) -> dict:
    greedy = sample.temperature == 0
    config = {"do_sample": not greedy, "repetition_penalty": sample.repetition_penalty,
              "bos_token_id": bos, "eos_token_id": eos}
    if sample.max_new_tokens:  # transformers refuses a 0 there (loading the folder fails): left out
        config["max_new_tokens"] = sample.max_new_tokens
    if not greedy:
        # top_k 0 switches top-k off in transformers, whose default would be 50.
        config.update(temperature=sample.temperature, top_k=sample.top_k or 0, top_p=sample.top_p)
    return config


def model_card(config: Config, card: Optional[ModelCard], tokenizer: Tokenizer,
               weights: dict[str, torch.Tensor], earlier: Sequence[str] = ()) -> str:
    """README.md: what was trained on what, for how long, to which validation loss. earlier: for a
    folder tinyattn exported, exported again (card None), its card's training rows (`training_rows`)."""
    m, t = config.model, config.train
    architecture = hf_architecture(m)
    family = {GATED_ARCHITECTURE: "Qwen3.5", QK_NORM_ARCHITECTURE: "Qwen3"}.get(architecture, "Llama")
    seen = set()
    parameters = 0
    for name, tensor in weights.items():
        if tensor.data_ptr() not in seen:  # a tied head counts once
            seen.add(tensor.data_ptr())
            parameters += tensor.numel()
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"{CARD_TAGS}{family.lower()}]", "---", "",
             f"# A {parameter_count_text(parameters)}-parameter {family}-architecture language model", "",
             (f"Trained with tinyattn and exported as `{architecture}`" if card is not None or earlier else
              f"Exported by tinyattn as `{architecture}` from a Hugging Face folder, untrained by tinyattn")
             + "; it loads with `AutoModelForCausalLM` and `AutoTokenizer`, no custom code.", "",
             "| | |", "|---|---|",
             *([f"| data | {_data_source(config)} |"] if card is not None else []),
             f"| tokenizer | {config.tokenizer.kind}, {tokenizer.vocab_size:,} tokens |",
             f"| shape | {counted(m.n_layer, 'layer')}, width {m.n_embd}, {counted(m.n_head, 'head')} "
             f"({m.kv_heads} key/value), context {m.context_length} |", *earlier]
    if t.init_from:
        lines.append(f"| initialised from | `{t.init_from}` |")
    if card is not None:
        lines.append(f"| training | {counted(card.step, 'step')}" + (f", {card.tokens_seen:,} tokens"
                                                           if card.tokens_seen else "") + " |")
        if card.best_val_loss is not None and math.isfinite(card.best_val_loss):
            # a step checkpoint holds the run's best so far, which may be of an earlier step's weights
            lines.append(f"| validation loss | {card.best_val_loss:.4f} nats per token (best) |"
                         if Path(card.source).name == "best.pt" else
                         f"| the run's best validation loss by then | {card.best_val_loss:.4f} nats per "
                         "token, at this step or an earlier one (not measured on these weights) |")
        lines.append(f"| exported from | `{card.source}` |")
    lines += ["", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
              'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
              f'ids = tokenizer({config.sample.prompt or _empty_prompt(tokenizer)!r}, '
              'return_tensors="pt").input_ids',
              "print(tokenizer.decode(model.generate(ids, max_new_tokens=200)[0]))", "```", ""]
    return "\n".join(lines)


def _data_source(config: Config) -> str:
    d = config.data
    if d.dataset:
        named = f" ({d.dataset_config})" if d.dataset_config else ""
        return f"the Hugging Face dataset `{d.dataset}`{named}"
    return ", ".join(f"`{f}`" for f in d.files) if d.files else "unknown data"


# The rows of tinyattn's model card that describe the training run, in the order it writes them.
TRAINING_ROWS = ("| data |", "| initialised from |", "| training |", "| validation loss |",
                 "| the run's best validation loss by then |", "| exported from |")


def training_rows(folder: Path) -> list[str]:
    """The training rows of `folder`'s model card where tinyattn exported the folder
    (`is_tinyattn_export`), else none: an export of that folder keeps them, since the folder
    itself records no run."""
    if not is_tinyattn_export(folder):
        return []
    try:
        lines = (folder / "README.md").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [line for line in lines if line.startswith(TRAINING_ROWS)]


def _empty_prompt(tokenizer: Tokenizer) -> str:
    """What the card's example passes transformers' tokenizer for tinyattn's empty prompt: the
    start token, or nothing where the tokenizer puts it before every text anyway."""
    return "" if tokenizer.adds_start else tokenizer.start_of_text
