"""Fine-tuning: a run that starts from another model's weights (`train.init_from`).

The source is a tinyattn run folder or checkpoint file, or a Hugging Face Llama folder
(`tinyattn.hf`). It decides what the weights mean, so the run takes from it:

- the model section: every key that shapes the weights or the function they compute
  (sizes, heads, RoPE base, norm epsilon, tying, the non-Llama options). A key the config
  gives (its file, a file it extends, or --set: `config.written_keys`; at the default or
  not) with another value is a conflict, and all conflicts are named in one line. The
  config keeps the keys that only change how the weights are trained or run:
  `context_length` (when given: fine-tune on shorter windows than the source's, say),
  `dropout`, `attention`, `zero_init_projections`;
- the tokenizer, as a `pretrained` tokenizer: the source's `tokenizer.json`. A tokenizer key
  the config gives must be the source's, as a model key must: the source's as it trained with
  it (a tinyattn run's own section, `kind: char` say, which every shipped config writes), or
  the pretrained form the fine-tune takes. A fine-tune as the source: the section its own source
  trained with, which its checkpoints record, so a chain of fine-tunes takes one config throughout.

A resumed fine-tune continues from its own checkpoint; the source's weights are not read
again (the checkpoint's saved config holds the model section taken from it). Its tokenizer is
the checkpoint's: a `--set tokenizer.path=...` given for the resume is read instead of the
file it names, else that file (the source's tokenizer.json) while it is there, else the run
folder's own copy; the given file or the copy is checked against the checkpoint's tokenizer
(`resume.ResumePoint.take_run_tokenizer`). Its checkpoints record the tokenizer section the
source trained with (`checkpoint.SOURCE_TOKENIZER`), which a resume's written tokenizer keys are
compared with, as at the start.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Optional, Sequence

import torch

from tinyattn import checkpoint as ckpt
from tinyattn.config import Config, ModelConfig, TokenizerConfig, written_keys
from tinyattn.errors import CheckpointError, ConfigError
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.storage import atomic_write

# Model keys the fine-tuning config keeps: they change how the weights are trained or used, not
# what they are (the dropouts are the fine-tune's regularisation, whatever the source trained with).
CONFIG_KEEPS = ("context_length", "dropout", "attention_dropout", "attention", "zero_init_projections")


@dataclass
class InitSource:
    """The weights, model section and tokenizer a fine-tune starts from, loaded once."""

    location: str  # train.init_from as given
    file: Path  # the checkpoint or weights file read
    model_config: ModelConfig
    # The tokenizer section the source trained with: a tinyattn run's own (char, bpe or pretrained),
    # or for a fine-tune the section its chain started from (`ckpt.source_tokenizer`); a Hugging
    # Face folder's pretrained one (its tokenizer.json and eos)
    tokenizer_config: TokenizerConfig
    tokenizer_path: Path  # the source's tokenizer.json, or the token cache's copy of a checkpoint's
    weights: dict[str, torch.Tensor]
    # A fine-tune's own section where it is not tokenizer_config: the pretrained form it read its
    # source's tokenizer through, which its config.yaml writes (given as the config, it is the source's)
    own_tokenizer: Optional[TokenizerConfig] = None

    @classmethod
    def load(cls, location: str, tokenizer_dir: str | Path) -> "InitSource":
        """Read the source. A tinyattn checkpoint's embedded tokenizer is used as its run
        folder's tokenizer.json when that matches, else written under tokenizer_dir."""
        if ckpt.is_hf_folder(location):
            from tinyattn.hf.folder import read_folder  # only here: training never loads hf otherwise

            imported = read_folder(location)
            tokenizer = imported.config.tokenizer
            return cls(location, imported.weights_file, imported.config.model, tokenizer,
                       Path(tokenizer.path), imported.weights)
        if not Path(location).exists():  # a Hugging Face model not yet downloaded, as often as a run
            raise ckpt.missing_model(location)
        file, verified = ckpt.locate_checkpoint(location, prefer="best")
        try:
            state = ckpt.load_checkpoint(file, verified=verified)
        except CheckpointError as e:  # a damaged best.pt, a GGUF or safetensors file: what to give instead
            advice = ckpt.damaged_best_advice(file, "--set train.init_from=")
            raise CheckpointError(f"{e}{advice}{ckpt.readable_instead(file)}") from None
        config = ckpt.config_from_checkpoint(state, file)
        text = ckpt.saved_tokenizer(state, file)
        tokenizer_path = file.parent / "tokenizer.json"
        if not (tokenizer_path.is_file() and tokenizer_path.read_text(encoding="utf-8") == text):
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
            tokenizer_path = Path(tokenizer_dir) / f"init_from-{digest}-tokenizer.json"
            with atomic_write(tokenizer_path) as f:
                f.write(text.encode("utf-8"))
        weights = state.get("model")
        if not isinstance(weights, dict):
            raise CheckpointError(f"{file}: holds no model weights")
        # A fine-tune's own section is the pretrained form it read its source's tokenizer through: the
        # section its chain started from is the one it records, compared with and passed on
        trained_with = ckpt.source_tokenizer(state)
        if trained_with is None:
            return cls(location, file, config.model, config.tokenizer, tokenizer_path, weights)
        return cls(location, file, config.model, trained_with, tokenizer_path, weights, config.tokenizer)

    def adopt(self, config: Config, written: Optional[Collection[str]] = None) -> None:
        """Give `config` the source's model section and tokenizer; conflicts in one line
        (`written`: as `adopt_model` takes it). A bidirectional source (model.causal false, from
        `tinyattn lab causal`) is refused unless the config writes model.causal itself: its fine-tune
        would be one too, which every inference command refuses (`checkpoint.require_causal`)."""
        written = written_keys(config) if written is None else written
        if not self.model_config.causal and "model.causal" not in written:
            raise ConfigError(f"train.init_from {self.location}: model.causal is false in {self.file} (a "
                              "bidirectional model, trained by tinyattn lab causal to show the mask's "
                              "effect): a fine-tune of it is bidirectional too, which generate, eval, "
                              "attention and export refuse (they need a causal model); start from a causal "
                              "model, or write model.causal: false in the config to train one all the same")
        tokenizer = TokenizerConfig(kind="pretrained", path=str(self.tokenizer_path),
                                    end_of_text=self.tokenizer_config.end_of_text,
                                    stop_tokens=list(self.tokenizer_config.stop_tokens))
        adopt_model(config, self.model_config, tokenizer, f"train.init_from {self.location}", written=written,
                    trained_with=(self.tokenizer_config, self.own_tokenizer))

    def notes(self) -> list[str]:
        """What train.log keeps of the source: the checkpoint read where a run folder was named and
        it is not its best.pt (one damaged, or none: `checkpoint.resolve_checkpoint` said so on the
        console only, before the log was open)."""
        folder = Path(self.location)
        if self.file.name == ckpt.BEST or not folder.is_dir() or ckpt.is_hf_folder(folder):
            return []
        return [f"note: train.init_from {self.location}: the weights come from {self.file}"]

    def load_into(self, model: LanguageModel) -> None:
        ckpt.load_weights(model, {"model": self.weights}, self.file)
        self.weights = {}  # the tensors are in the model now; free the copy


def adopt_model(config: Config, source_model: ModelConfig, source_tokenizer: TokenizerConfig,
                origin: str, *, written: Optional[Collection[str]] = None,
                trained_with: Sequence[Optional[TokenizerConfig]] = ()) -> None:
    """Set config.model and config.tokenizer (`source_tokenizer`) from a source, keeping `CONFIG_KEEPS`.

    `written`: the dotted keys the user gave the config (`config.written_keys`: its file's and
    --set's, whatever their value); None: `written_keys(config)`, the keys it holds at other than
    their default. A written model or tokenizer key whose value is not the source's is a
    ConfigError naming every such key; a written context_length is kept, else the source's is taken.
    `trained_with`: the tokenizer sections the source trained with or holds, where they are not
    `source_tokenizer` (a tinyattn run's `kind: char`; a fine-tune's own pretrained one; None for
    none): written tokenizer keys that match any of them agree with the source.
    """
    written = written_keys(config) if written is None else written
    current = dataclasses.asdict(config.model)
    source = dataclasses.asdict(source_model)
    conflicts = [f"model.{key}: config {current[key]!r}, source {source[key]!r}"
                 for key in source if key not in CONFIG_KEEPS
                 and f"model.{key}" in written and current[key] != source[key]]
    forms = [form for form in (*trained_with, source_tokenizer) if form is not None]
    conflicts += min((_tokenizer_conflicts(config.tokenizer, form, written) for form in forms), key=len)
    if conflicts:
        raise ConfigError(f"{origin}: the config conflicts with the model it starts from: "
                          f"{'; '.join(conflicts)} (init_from takes the model and tokenizer from the "
                          "source: remove these keys)")
    keep = {key: current[key] for key in CONFIG_KEEPS}
    if "model.context_length" not in written:
        keep["context_length"] = source["context_length"]
    config.model = dataclasses.replace(source_model, **keep)
    config.tokenizer = dataclasses.replace(source_tokenizer)


def _tokenizer_conflicts(given: TokenizerConfig, source: TokenizerConfig,
                         written: Collection[str]) -> list[str]:
    """The written tokenizer keys whose value in `given` is not `source`'s, as adopt_model names them."""
    ours, theirs = dataclasses.asdict(given), dataclasses.asdict(source)
    shown = {key: repr(value) for key, value in theirs.items()}
    if source.kind != "bpe":  # its vocab_size is the dataclass default, read by no tokenizer of its kind
        shown["vocab_size"] = f"none: a {source.kind} tokenizer's size is its own"
    return [f"tokenizer.{key}: config {ours[key]!r}, source {shown[key]}"
            for key in theirs if f"tokenizer.{key}" in written and ours[key] != theirs[key]]


def init_source(config: Config, written: Optional[Collection[str]] = None) -> Optional[InitSource]:
    """The source named by train.init_from, adopted into `config` (`written`: as `adopt_model`
    takes it); None when not set."""
    if not config.train.init_from:
        return None
    try:
        source = InitSource.load(config.train.init_from, config.data.cache_dir)
    except CheckpointError as e:
        raise CheckpointError(f"train.init_from: {e}") from None
    source.adopt(config, written)
    return source
