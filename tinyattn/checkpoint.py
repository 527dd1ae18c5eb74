"""Checkpoints: atomic saves, safe loads, and rebuilding a model from a run folder.

A checkpoint is one `torch.save` file holding plain data only (tensors, numbers,
strings, lists, dicts): the model's weights under "model" (with train.ema their moving
average, and the weights the optimizer steps under "trained_model"), optimizer and scaler state, counters,
random-generator and batch-sampler states, the resolved config as a dict, the
tokenizer as its JSON text, and under "data" what the run trained on
(`tinyattn.data.token_cache.data_fingerprint`; absent in checkpoints of older versions), and a
fine-tune's under "init_from_tokenizer" (`SOURCE_TOKENIZER`) the tokenizer section its source
trained with (a resume given the config file compares that file's tokenizer keys with it), and
under "start_folder" (`START_FOLDER`) the folder the run started in, where a resume from elsewhere
reads the run's relative data paths.
It is loaded with `torch.load(weights_only=True)`, so a checkpoint file can never run code.

Writing is atomic: the bytes go to a temporary file in the same folder, are flushed
and fsynced, and the file is renamed over its final name. A process killed at any
moment leaves either the old checkpoint or the new one, never half of one.

A run folder (`checkpoints/<run-name>/`) holds `step_<N>.pt` for the last few steps,
`best.pt` for the lowest validation loss, `config.yaml`, `tokenizer.json`, `data.json`, and the
TensorBoard event files. A run folder named where the best model is wanted whose best.pt (or,
with none, whose latest step checkpoint) is damaged gives its newest step checkpoint that
verifies, with a note; a damaged best.pt named as a file is refused, naming that step
checkpoint. A file named as a checkpoint that is no
torch.save archive (a GGUF or safetensors file, an empty file, a text file) is told by its first
bytes (`file_format`, `unreadable`) and named for what it is, never called damaged.
"""

from __future__ import annotations

import pickle
import re
import shutil
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

import torch

from tinyattn.config import Config, TokenizerConfig, config_from_dict, is_sha256
from tinyattn.data.tokenizer import Tokenizer
from tinyattn.errors import CheckpointError, ConfigError, first_line
from tinyattn.model.transformer import LanguageModel
from tinyattn.system.invocation import command, quoted
from tinyattn.system.storage import atomic_write

FORMAT = "tinyattn-checkpoint"
SOURCE_TOKENIZER = "init_from_tokenizer"  # a fine-tune's: its source's tokenizer section (a dict)
START_FOLDER = "start_folder"  # the folder the run started in, where its relative paths were read (a str)
FORMAT_VERSION = 1
BEST = "best.pt"
STEP_PATTERN = re.compile(r"^step_(\d+)\.pt$")


def step_filename(step: int) -> str:
    return f"step_{step:07d}.pt"


class Snapshot(Mapping):
    """A checkpoint's state that is written to several files (a step's checkpoint and best.pt),
    read-only so that each file holds the same state. Its first `save_checkpoint` pickles it; each
    later one copies the file that one wrote: the same bytes, at a fraction of pickling's cost."""

    def __init__(self, state: Mapping):
        self._state = dict(state)
        self.written: Optional[Path] = None  # the file its first whole save wrote

    def __getitem__(self, key: str) -> Any:
        return self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def save_checkpoint(state: Mapping, path: str | Path) -> None:
    """Write `state` to `path` atomically (temporary file, flush, fsync, rename). A `Snapshot`
    already saved to a file that is still there is copied from it (as atomically), not pickled again."""
    path = Path(path)
    if isinstance(state, Snapshot) and state.written is not None and state.written.is_file():
        copy_checkpoint(state.written, path)
        return
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, **state}
    with atomic_write(path) as f:
        torch.save(payload, f)
    if isinstance(state, Snapshot):
        state.written = path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *,
                    verified: bool = False) -> dict:
    """Load a checkpoint file safely; a missing, truncated or foreign file is a CheckpointError.
    `verified`: the file has just passed `verify_checkpoint` (`locate_checkpoint` says so), which
    reads all of it: not read twice."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    damaged = None if verified else verify_checkpoint(path)
    if damaged:
        raise CheckpointError(other_format(path) or unreadable(path, damaged))
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: not a tinyattn checkpoint: it holds Python objects beyond "
                              "tensors and plain data, which are never loaded (weights_only)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, KeyError,
            AttributeError) as e:
        reason = first_line(e)
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt?): "
                              f"{reason[:200]}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a tinyattn checkpoint")
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version} is not supported by this "
                              f"tinyattn (it reads version {FORMAT_VERSION})")
    return state


def verify_checkpoint(path: Path) -> Optional[str]:
    """None if every member of the checkpoint's zip archive matches its stored CRC-32, else
    what is wrong. torch.load itself does not check them: a file with flipped bytes would load
    and give garbage. Reading the file once costs little next to loading it."""
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one has no directory
        return "an empty file" if path.stat().st_size == 0 else "not a torch.save archive"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"damaged archive ({e})"
    return f"{bad} fails its CRC-32 check (the file was changed after it was written)" if bad else None


ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first four bytes, as every torch.save file's are


def unreadable(path: Path, damage: str) -> str:
    """What a file that fails `verify_checkpoint` is: one that starts as a torch.save archive does is
    truncated or corrupt; an empty file or another kind of file is named for what it is (not damaged)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP_MAGIC))
    except OSError as e:
        return f"{path}: not readable ({e.strerror or type(e).__name__})"
    if head == ZIP_MAGIC:
        return f"{path}: not a readable checkpoint (truncated or corrupt?): {damage}"
    if not head:
        return f"{path}: an empty file, not a tinyattn checkpoint"
    return f"{path}: not a tinyattn checkpoint (a torch.save archive): another kind of file"


GGUF_MAGIC = b"GGUF"  # a GGUF file's first four bytes


def file_format(path: Path) -> Optional[str]:
    """"gguf" or "safetensors" by a file's first bytes, else None. A safetensors file starts with
    its header's length, 8 bytes little-endian, then the header: JSON, "{" first."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError:
        return None
    if head[:4] == GGUF_MAGIC:
        return "gguf"
    if len(head) == 9 and head[8:] == b"{" and 8 + int.from_bytes(head[:8], "little") <= size:
        return "safetensors"
    return None


def other_format(path: Path) -> Optional[str]:
    """What a file that is no torch.save archive is, where its first bytes tell (a GGUF or a
    safetensors file: not damaged, only not a checkpoint); None where they do not."""
    kind = file_format(path)
    if kind == "gguf":
        return f"{path}: a GGUF file, which tinyattn writes but does not read"
    if kind == "safetensors":
        return f"{path}: a safetensors file (weights alone), not a tinyattn checkpoint"
    return None


def readable_instead(file: Path) -> str:
    """'; give ...' for a GGUF or safetensors file, or any file of a Hugging Face folder, named where
    such a folder is read too (`tinyattn.hf.folder.load_any_model`, train.init_from); "" for any other."""
    kind = file_format(file)
    if kind == "gguf":
        return "; give a run folder, a .pt checkpoint or a Hugging Face folder"
    if is_hf_folder(file.parent):  # its weights, its config.json or any other file of it
        return (f"; give the Hugging Face folder that holds it ({file.parent}), a run folder or a .pt "
                "checkpoint")
    if kind != "safetensors":
        return ""
    return (f"; a Hugging Face folder holding it is read (config.json, safetensors, tokenizer.json: "
            f"{file.parent} has no config.json), as is a run folder or a .pt checkpoint")


def step_of(path: Path) -> Optional[int]:
    """The step in a `step_<N>.pt` file name, else None."""
    match = STEP_PATTERN.match(path.name)
    return int(match.group(1)) if match else None


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's step checkpoints, lowest step first (by the name, never the file time)."""
    run_dir = Path(run_dir)
    found = []
    for path in run_dir.glob("step_*.pt"):
        match = STEP_PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The step checkpoint with the highest step: where a resume continues. A run folder's
    steps only grow (resuming an earlier checkpoint forks into a new folder), so `touch` or
    a copy that changes file times cannot make an older step look newer."""
    steps = step_checkpoints(run_dir)
    return steps[-1] if steps else None


def newest_verified(run_dir: str | Path) -> Optional[Path]:
    """The highest-step checkpoint whose archive passes its CRC check (best.pt as a last resort)."""
    candidates = step_checkpoints(run_dir)[::-1] + [Path(run_dir) / BEST]
    return next((p for p in candidates if p.is_file() and verify_checkpoint(p) is None), None)


def copy_checkpoint(source: Path, target: Path) -> None:
    """Copy a checkpoint file atomically (a kill mid-copy leaves no half file)."""
    with open(source, "rb") as src, atomic_write(target) as out:
        shutil.copyfileobj(src, out, 1 << 22)


def saved_value(path: Path, key: str):
    """One plain value from a checkpoint, without reading its tensors (None if unreadable)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True).get(key)
    except Exception:  # a damaged file has no value worth keeping
        return None


def verified_value(path: Path, key: str):
    """`saved_value` of a checkpoint that passes its CRC check; None for a missing or damaged one: bit
    rot in its weights leaves its plain values readable, but the step and loss they give are no model's."""
    if not path.is_file() or verify_checkpoint(path) is not None:
        return None
    return saved_value(path, key)


def start_folder(state: dict) -> Optional[Path]:
    """The folder the checkpoint's run started in (`START_FOLDER`), where its config's relative paths
    were read; None for one saved before checkpoints recorded it."""
    saved = state.get(START_FOLDER)
    return Path(saved) if isinstance(saved, str) and saved else None


def source_tokenizer(state: dict) -> Optional[TokenizerConfig]:
    """A fine-tune checkpoint's record of the tokenizer section its source trained with
    (`SOURCE_TOKENIZER`; a fine-tune of a fine-tune passes on the first source's); None where
    there is none (not a fine-tune, or saved before checkpoints recorded it)."""
    saved = state.get(SOURCE_TOKENIZER)
    if not isinstance(saved, dict):
        return None
    known = {field.name for field in fields(TokenizerConfig)}
    return TokenizerConfig(**{key: value for key, value in saved.items() if key in known})


def has_checkpoints(run_dir: str | Path) -> bool:
    return bool(step_checkpoints(run_dir)) or (Path(run_dir) / BEST).is_file()


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the `keep_last` (>= 1) highest-step checkpoints (best.pt is separate).

    The one just written has the highest step, so a save is never undone by its own pruning.
    """
    steps = step_checkpoints(run_dir)
    for path in steps[:max(len(steps) - max(keep_last, 1), 0)]:
        path.unlink(missing_ok=True)


def latest_run(out_dir: str | Path) -> Optional[Path]:
    """The run folder under out_dir whose newest checkpoint was written last."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return None
    runs = []
    for run_dir in out_dir.iterdir():
        if _holds_checkpoints(run_dir):
            files = step_checkpoints(run_dir) + ([run_dir / BEST] if (run_dir / BEST).is_file() else [])
            runs.append((max(f.stat().st_mtime for f in files), run_dir))
    return max(runs)[1] if runs else None


def _holds_checkpoints(folder: Path) -> bool:
    """A folder with checkpoints (`has_checkpoints`); False for anything else beside the runs, also
    a folder this user may not look into (a disk's lost+found, another user's folder, a link into
    one, whose is_dir() raises): not a traceback."""
    try:
        return folder.is_dir() and has_checkpoints(folder)
    except OSError:
        return False


def resolve_checkpoint(path: Optional[str | Path], out_dir: str | Path = "checkpoints",
                       prefer: str = "best") -> Path:
    """A checkpoint file from a file, a run folder, or (None) the most recent run.

    prefer="best" picks best.pt, falling back to the latest step (for sampling and
    evaluation); prefer="latest" picks the latest step (for resuming).
    """
    return locate_checkpoint(path, out_dir, prefer)[0]


def locate_checkpoint(path: Optional[str | Path], out_dir: str | Path = "checkpoints",
                      prefer: str = "best") -> tuple[Path, bool]:
    """`resolve_checkpoint`'s file, and whether it passed its CRC check on the way (a folder's best
    model, checked to step past a damaged one), so `load_checkpoint(file, verified=...)` reads it once."""
    if path is None:
        run_dir = latest_run(out_dir)
        if run_dir is None:
            raise CheckpointError(f"no checkpoints under {out_dir}/; train a model first: "
                                  f"{command('train')} --config configs/shakespeare_char.yaml")
        path = run_dir
    path = Path(path)
    if path.is_file():
        return path, False
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint file or run folder{_held_beside(path)}")
    best, latest = path / BEST, latest_checkpoint(path)
    order = [best, latest] if prefer == "best" else [latest, best]
    chosen = next((candidate for candidate in order if candidate is not None and candidate.is_file()), None)
    if chosen is None:
        if is_hf_folder(path):  # only --resume gets here with one (loading and init_from read it first)
            raise CheckpointError(f"{path}: a Hugging Face folder, not a run folder (step_*.pt or best.pt) "
                                  f"to resume; {_train_from(path, 'its weights')}")
        found = [name for name in HF_FOLDER_FILES if (path / name).is_file()]
        # A run folder writes tokenizer.json (and config.yaml) before its first checkpoint: only weights
        # without a run's config.yaml make a folder look like a Hugging Face one.
        if set(found) - {"tokenizer.json"} and not (path / "config.yaml").is_file():
            raise CheckpointError(f"{path}: looks like a Hugging Face folder ({', '.join(found)}) but has "
                                  "no config.json, which tinyattn needs to read it; copy the model's "
                                  "config.json into it (a run folder holds step_*.pt or best.pt)")
        _refuse_a_folder_of_runs(path, resuming=prefer == "latest")
        raise CheckpointError(f"{path}: run folder holds no checkpoint (step_*.pt or best.pt)")
    if prefer != "best":
        return chosen, False
    damage = verify_checkpoint(chosen)
    return (_instead_of_damaged(chosen, damage) if damage else chosen), True  # either one verified


RUNS_NAMED = 5  # the runs a folder of runs given as a checkpoint names, the most


def _some(names: list[str], most: int = RUNS_NAMED) -> str:
    """The first `most` names, and how many more: "a, b, c and 4 more"."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{', '.join(names[:most])}{more}"


def _held_beside(path: Path) -> str:
    """For a path that is not there in a run folder (a step file `train.keep_last` pruned, or a
    mistyped name): "; <folder> holds best.pt, <the newest steps first> and N more"; else nothing."""
    folder = path.parent
    if not folder.is_dir():
        return ""
    held = ([BEST] if (folder / BEST).is_file() else []) + [p.name for p in step_checkpoints(folder)[::-1]]
    named = "the folder run from" if folder == Path(".") else folder  # a bare file name: "." says little
    return f"; {named} holds {_some(held)}" if held else ""


def _refuse_a_folder_of_runs(folder: Path, resuming: bool = False) -> None:
    """A folder that holds run folders (train.out_dir, `--checkpoint checkpoints`) is not one: said
    so, naming its runs and the most recent, rather than called a run folder without a checkpoint."""
    runs = sorted(p.name for p in folder.iterdir() if _holds_checkpoints(p))
    if not runs:
        _refuse_a_folder_of_models(folder, resuming)
        return
    raise CheckpointError(f"{folder}: a folder of runs, not a run folder (it holds {_some(runs)}); give one "
                          f"of them, e.g. the most recent: {latest_run(folder)}")


def _refuse_a_folder_of_models(folder: Path, resuming: bool) -> None:
    """A folder that holds Hugging Face folders (`--checkpoint models`, where models/<name> were
    downloaded or exported) is not one: said so, naming them, rather than called a run folder.
    `resuming` (--resume, which reads none of them): how to start a run from one instead."""
    def is_model(path: Path) -> bool:
        try:
            return is_hf_folder(path)
        except OSError:  # a folder this user may not look into is no model to name
            return False

    models = sorted(p.name for p in folder.iterdir() if is_model(p))
    if models:
        if resuming:
            raise CheckpointError(f"{folder}: a folder of Hugging Face model folders (it holds "
                                  f"{_some(models)}), none of them a run to resume; "
                                  f"{_train_from(folder / models[0], 'one')}")
        raise CheckpointError(f"{folder}: a folder of Hugging Face model folders, not one (it holds "
                              f"{_some(models)}); give one of them, e.g. {folder / models[0]}")


def _train_from(model: Path, what: str) -> str:
    return f"to train from {what}, start a run with --set {quoted(f'train.init_from={model}')}"


def _instead_of_damaged(chosen: Path, damage: str) -> Path:
    """The newest other step checkpoint that verifies, said on stderr, for a run folder whose best.pt
    (or, with none, whose latest step checkpoint) is damaged: the folder was named, not the file, so
    the user asked for the run's model. A resume never comes here: it names the one to use."""
    others = [p for p in step_checkpoints(chosen.parent)[::-1] if p != chosen]
    good = next((p for p in others if verify_checkpoint(p) is None), None)
    if good is None:
        raise CheckpointError(f"{unreadable(chosen, damage)}; no other checkpoint in {chosen.parent} "
                              "verifies either")
    why = "its validation loss may be above best's" if chosen.name == BEST else "an earlier step"
    print(f"note: {chosen} is damaged ({damage}); using {good.name}, the newest checkpoint that verifies "
          f"({why})", file=sys.stderr, flush=True)
    return good


def damaged_best_advice(file: Path, option: str = "--checkpoint ") -> str:
    """'; ... use --checkpoint <step file>' when `file` is a damaged best.pt named by the user
    (`option`: how the command is given a checkpoint, "--set train.init_from=" for a fine-tune).
    Only for a best.pt that fails its CRC check, which a run folder given steps past: one that is whole
    but unreadable (a newer format, another program's file) is refused through the folder too, and its
    step checkpoints were most likely written alike."""
    damaged = file.name == BEST and file.is_file() and verify_checkpoint(file) is not None
    good = newest_verified(file.parent) if damaged else None
    if good is None or good == file:
        return ""
    return (f"; the newest checkpoint in {file.parent} that verifies is {good.name}: use {option}"
            f"{quoted(good)}, or {option}{quoted(file.parent)} to take it with a note")


@dataclass
class LoadedModel:
    model: LanguageModel
    tokenizer: Tokenizer
    config: Config
    path: Path  # the checkpoint file, or a Hugging Face folder's weights file
    step: int  # 0 for a Hugging Face folder
    tokens_seen: Optional[int] = None
    best_val_loss: Optional[float] = None
    data: Optional[dict] = None  # the data fingerprint the checkpoint records; None: none recorded
    hf_folder: bool = False  # read from a Hugging Face folder, which records no step
    start_folder: Optional[Path] = None  # the folder its run started in (`START_FOLDER`), where recorded

    @property
    def name(self) -> str:
        """The model's name: its run folder's or Hugging Face folder's, resolved, so `--checkpoint .`
        (whose `Path.name` is '') gives it too; a file given directly, its folder's (the file's
        own stem where that folder has no name, the file system's root)."""
        return self.path.parent.resolve().name or self.path.stem

    @property
    def label(self) -> str:
        """What messages call the model: the file and its step, or the Hugging Face folder."""
        if self.hf_folder:
            return f"{self.path.parent} (a Hugging Face folder)"
        return f"{self.path} (step {self.step})"

    def default_output(self, name: str) -> Path:
        """Where a command writes `name` (a plot, a folder of them) when not told: in the run folder,
        for best.pt as `name`, for another checkpoint with its file's stem added (`attention_step_0000500`,
        `loss_by_position_validation_step_0000500.png`), so one model's plots never replace another's.
        A Hugging Face folder is a model's own (perhaps the hub's cache), and an export into it is
        refused once it holds other files: there `<folder name>_<name>` in the current folder."""
        if self.hf_folder:
            return Path(f"{self.name}_{name}")
        if self.path.name != BEST:
            stem, dot, suffix = name.partition(".")
            name = f"{stem}_{self.path.stem}{dot}{suffix}"
        return self.path.parent / name


def config_from_checkpoint(state: dict, path: Path) -> Config:
    try:
        return config_from_dict(migrated_config(state["config"]), default_origin=f"{path} (saved config)")
    except (ConfigError, KeyError) as e:
        raise CheckpointError(f"{path}: its saved config cannot be used: {e}") from None


def _with_show(saved: dict) -> dict:
    """A config saved before `train.show` existed, with what such a run showed at each evaluation:
    a sample and the loss by position always, the probe text's attention and head ablation when it
    had one. A resumed older run goes on showing what it showed."""
    train = saved.get("train") if isinstance(saved, dict) else None
    if not isinstance(train, dict) or "show" in train:
        return saved
    shown = ["sample", "loss_by_position"] + (["attention", "head_ablation"] if train.get("probe_text") else [])
    return {**saved, "train": {**train, "show": shown}}


def _with_muon_whole(saved: dict) -> dict:
    """A config saved before `train.muon_split_stacked` existed: Muon orthogonalised each stacked
    weight whole then, and a resumed older run goes on doing so."""
    train = saved.get("train") if isinstance(saved, dict) else None
    if not isinstance(train, dict) or "muon_split_stacked" in train:
        return saved
    return {**saved, "train": {**train, "muon_split_stacked": False}}


def _without_unread_download_checks(saved: dict) -> dict:
    """A config saved before data.sha256 had to be 64 hex digits and data.size_bytes positive
    (2026-12-06): either was read only by a download, so a run that trained held a local file, or a
    download its value did not stop. Such a value is dropped (null), not refused: its checkpoints load."""
    data = saved.get("data") if isinstance(saved, dict) else None
    if not isinstance(data, dict):
        return saved
    sha, size = data.get("sha256"), data.get("size_bytes")
    bad_sha = sha is not None and not (isinstance(sha, str) and is_sha256(sha))
    bad_size = isinstance(size, (int, float)) and not isinstance(size, bool) and size <= 0
    if not (bad_sha or bad_size):
        return saved
    return {**saved, "data": {**data, **({"sha256": None} if bad_sha else {}),
                              **({"size_bytes": None} if bad_size else {})}}


# A config saved before a key existed, given the value that reproduces what such a run did.
SAVED_CONFIG_MIGRATIONS = (_with_show, _with_muon_whole, _without_unread_download_checks)


def migrated_config(saved: dict) -> dict:
    """A checkpoint's saved config with the keys its older tinyattn did not write, as
    `SAVED_CONFIG_MIGRATIONS` give them."""
    for older in SAVED_CONFIG_MIGRATIONS:
        saved = older(saved)
    return saved


def load_weights(model: LanguageModel, state: dict, path: Path) -> None:
    """Put a checkpoint's weights into `model`, naming what does not fit."""
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise CheckpointError(f"{path}: holds no model weights")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong_shape = sorted(k for k in set(expected) & set(weights) if expected[k].shape != weights[k].shape)
    if missing or unexpected or wrong_shape:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape)):
            if keys:
                parts.append(f"{label}: {_some(keys, most=3)}")
        raise CheckpointError(f"{path}: weights do not fit the model its config describes "
                              f"(written by another version of tinyattn?): {'; '.join(parts)}")
    model.load_state_dict(weights)


def saved_tokenizer(state: dict, path: Path) -> str:
    """The tokenizer's JSON text a checkpoint holds, naming the file where it holds none."""
    text = state.get("tokenizer")
    if not isinstance(text, str):
        raise CheckpointError(f"{path}: holds no tokenizer (tinyattn train saves its JSON text under "
                              "\"tokenizer\" in every checkpoint); give a checkpoint or run folder it wrote")
    return text


def require_causal(loaded: LoadedModel, command: str) -> None:
    """Refuse a bidirectional model (model.causal false, from `tinyattn lab causal`) for a
    command that predicts left to right: each of its positions read the tokens after it."""
    if not loaded.config.model.causal:
        raise CheckpointError(f"{loaded.path}: model.causal is false (a bidirectional model, trained by "
                              f"tinyattn lab causal to show the mask's effect): {command} needs a causal "
                              "model")


# What a Hugging Face model folder holds besides config.json: a folder with one is named as such.
HF_FOLDER_FILES = ("model.safetensors", "model.safetensors.index.json", "tokenizer.json", "pytorch_model.bin")


def missing_model(path: str | Path) -> CheckpointError:
    """The error for a --checkpoint or train.init_from that is not there: a Hugging Face model
    not yet downloaded (a hub id, as transformers takes one) is given as often as a run."""
    return CheckpointError(f"{path}: no such checkpoint file, run folder or Hugging Face folder (a Hugging "
                           "Face model is read from a local folder: download it first, with its "
                           "config.json, model.safetensors and tokenizer.json)")


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a Hugging Face `config.json` (a tinyattn run folder has config.yaml)."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file()


def load_model(path: Optional[str | Path] = None, device: str | torch.device = "cpu",
               out_dir: str | Path = "checkpoints") -> LoadedModel:
    """Rebuild the model and tokenizer of a checkpoint, ready for inference (eval mode).

    path: a checkpoint file, a run folder, or None for the most recent run under out_dir.
    A Hugging Face folder is read by `tinyattn.hf.folder.load_any_model`, which every
    command's --checkpoint goes through.
    """
    if path is not None and is_hf_folder(path):
        raise CheckpointError(f"{path} is a Hugging Face folder, not a tinyattn checkpoint: load it "
                              "with tinyattn.hf.folder.load_any_model")
    file, verified = locate_checkpoint(path, out_dir, prefer="best")
    try:
        # on the CPU: the optimizer state never goes to the device
        state = load_checkpoint(file, verified=verified)
    except CheckpointError as e:
        raise CheckpointError(f"{e}{damaged_best_advice(file)}{readable_instead(file)}") from None
    config = config_from_checkpoint(state, file)
    model = LanguageModel(config.model)
    load_weights(model, state, file)
    model.to(device).eval()
    tokenizer = Tokenizer.from_json(saved_tokenizer(state, file), origin=str(file),
                                    end_of_text=config.tokenizer.end_of_text,
                                    stop_tokens=config.tokenizer.stop_tokens)
    return LoadedModel(model, tokenizer, config, file, int(state.get("step", 0)),
                       state.get("tokens_seen"), state.get("best_val_loss"), state.get("data"),
                       start_folder=start_folder(state))
