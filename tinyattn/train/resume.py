"""Where a run writes and what it continues from.

`ResumePoint` is the checkpoint a run continues from: found from a folder or file, loaded
once, checked against the config's model shape, the data it trained on (refused when it
changed, unless --allow-data-change) and the data's tokenizer; it keeps the run's
train.init_from, the source it reads no more (`keep_init_from`), and run from another folder
reads the run's relative data paths where the run started (`placed_data`). Without --config a resume
takes its settings from the checkpoint plus the edits made to the folder's config.yaml
(`edited_config`); a rewritten config.yaml keeps the user's edited text beside it
(`keep_user_config`). It decides
whether the run continues in place (only from the folder's latest checkpoint) or forks
into a new folder (an earlier checkpoint under another --run-name); in place, another
train.out_dir given for it is refused (`keep_out_dir`). `open_run_folder`
picks the folder and holds it (`run_folder.RunLock`) before anything is written there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch
import yaml

from tinyattn import checkpoint as ckpt
from tinyattn.config import (PASS_TABLES, Config, TokenizerConfig, config_from_dict, config_text,
                             config_to_dict, duration_text, load_config, settings, with_settings)
from tinyattn.data.relative_paths import PATH_KEYS, read_from, read_from_note
from tinyattn.data.token_cache import data_differences
from tinyattn.data.tokenizer import Tokenizer
from tinyattn.errors import CheckpointError, ConfigError, StorageError, TinyattnError, counted
from tinyattn.system.distributed import Distributed, refusal_shared, said_once
from tinyattn.system.invocation import quoted
from tinyattn.system.storage import atomic_write
from tinyattn.train.run_folder import RunLock, check_run_name, in_use_message, unique_run_dir

if TYPE_CHECKING:
    from tinyattn.train.trainer import Trainer


# Model keys that change how the same weights are used, not their shape: a resume may change them.
USE_NOT_SHAPE = ("model.dropout", "model.attention_dropout", "model.attention")


def model_shape_differences(saved: dict, current: dict) -> list[str]:
    """The model keys whose values differ between a checkpoint's config and this one, but for
    `USE_NOT_SHAPE`."""
    keys = sorted(set(saved) | set(current))
    return [f"model.{k}: checkpoint {saved.get(k)!r}, config {current.get(k)!r}"
            for k in keys if saved.get(k) != current.get(k) and f"model.{k}" not in USE_NOT_SHAPE]


def _verified_alternative(file: Path) -> str:
    """'; the newest checkpoint that verifies is ...' for a resume whose checkpoint is damaged;
    for another file (a run's config.yaml, say), where --resume points instead."""
    if file.name != ckpt.BEST and ckpt.step_of(file) is None:
        such = f", such as --resume {quoted(file.parent)}" if ckpt.has_checkpoints(file.parent) else ""
        return f"; --resume takes a run folder or one of its checkpoints (step_*.pt, best.pt){such}"
    good = ckpt.newest_verified(file.parent)
    if good is None or good == file:
        return ""
    best = file.parent / ckpt.BEST
    furthest = ckpt.verified_value(best, "step") if best not in (good, file) else None
    if isinstance(furthest, int) and furthest > (ckpt.step_of(good) or 0):
        # best.pt holds a whole state (optimizer, generators, sampler) of a later step: resumed in place
        # (`target` allows it unless a step checkpoint after it is left), none of those steps trains again
        latest = ckpt.step_of(ckpt.latest_checkpoint(file.parent) or best) or 0
        move = f"move the damaged checkpoints after step {furthest} away and " if latest > furthest else ""
        return (f"; best.pt (step {furthest}) verifies and is further on than every step checkpoint in "
                f"{file.parent} that does: {move}resume from it with --resume {quoted(best)}, or fork from "
                f"it with --resume {quoted(best)} --run-name NEW_NAME")
    return (f"; the newest checkpoint in {file.parent} that verifies is {good.name}: move the damaged "
            f"file away and resume with --resume {quoted(file.parent)}, or fork from it with --resume "
            f"{quoted(good)} --run-name NEW_NAME")


def _tokenizer_change(saved_json, tokenizer) -> str:
    """What differs between the run's tokenizer and the one the data now builds, in a user's words."""
    differs = "its tokenizer differs from the one the data now builds"
    try:
        saved_spec = json.loads(saved_json)["model"]
        saved, now = set(saved_spec["vocab"]), set(json.loads(tokenizer.to_json())["model"]["vocab"])
    except (TypeError, ValueError, KeyError):  # no tokenizer saved, or one of another shape
        return f"{differs} (the corpus or tokenizer settings changed)"
    unit = "characters" if saved_spec.get("type") == "WordLevel" else "tokens"
    for extra, cause in ((now - saved, f"the corpus has {{n}} {unit} the run's tokenizer does not know"),
                         (saved - now, f"the corpus no longer has {{n}} {unit} the run's tokenizer has")):
        if extra:
            return f"{differs}: {cause.format(n=len(extra))} ({_shown(extra)})"
    # The settings are the run's (an edit of them is refused before the data is read): what changed is
    # what the tokenizer was made from. A BPE trained on changed text learns other merges.
    return (f"{differs}: the same {unit}, with other ids or merges (it was trained again on text that "
            "changed since the run, by another tokenizers version, or read from a changed tokenizer file)")


def _file_change(run: Tokenizer, now: Tokenizer) -> str:
    """What differs between the run's tokenizer and the one a tokenizer file now holds: tokens it
    adds or lacks, tokens whose ids moved, else its other settings."""
    before, after = ({t.token(i): i for i in range(t.vocab_size) if t.token(i) is not None}
                     for t in (run, now))
    moved = {token for token in before.keys() & after.keys() if before[token] != after[token]}
    for tokens, what in ((after.keys() - before.keys(), "it has {n} the run's tokenizer lacks"),
                         (before.keys() - after.keys(), "it lacks {n} of the run's"),
                         (moved, "{n} {have} other ids")):
        if tokens:
            n, have = counted(len(tokens), "token"), "has" if len(tokens) == 1 else "have"
            return f"{what.format(n=n, have=have)} ({_shown(tokens)})"
    return "the same tokens and ids, other settings"


def _changed_splits(saved: dict, now: dict) -> dict[str, bool]:
    """Whether each split's tokens differ; both, where a fingerprint saved before checksums were
    kept cannot tell."""
    then = {split: saved.get(split, {}).get("checksum") for split in ("train", "validation")}
    if None in then.values():
        return {split: True for split in then}
    return {split: then[split] != now.get(split, {}).get("checksum") for split in then}


def _what_resuming_does(saved: dict, now: dict) -> str:
    """What a resume on changed data would do, by the splits whose tokens differ."""
    changed = _changed_splits(saved, now)
    if not all(changed.values()):
        return ("go on with other tokens (the validation split is the same)" if changed["train"]
                else "validate on another split (the training tokens are the same)")
    return "go on with other tokens and validate on another split"


def _what_the_losses_mean(saved: dict, now: dict, step: int) -> str:
    """Whether the validation losses before and after `step` can be compared, after a resume that
    --allow-data-change let go on: only where the validation split is the same."""
    if not _changed_splits(saved, now)["validation"]:
        return (f"the validation split is the same: validation losses before and after step {step} "
                "stay comparable")
    return f"validation losses before and after step {step} (best.pt's included) are not comparable"


def _shown(tokens) -> str:
    """The first five of `tokens`, sorted, as a reader sees them: 'a', 'b', ..."""
    return ", ".join(repr(t) for t in sorted(tokens)[:5]) + (", ..." if len(tokens) > 5 else "")


def same_source(saved: Optional[str], given: Optional[str]) -> bool:
    """Whether two values of train.init_from name the same source: none in both, the same path once
    normalised (a trailing slash, `./`, `a/../`), or two paths that exist and resolve to one."""
    if not saved or not given:
        return not saved and not given
    if os.path.normpath(saved) == os.path.normpath(given):
        return True
    return Path(saved).exists() and Path(given).exists() and Path(saved).resolve() == Path(given).resolve()


@dataclass
class ResumePoint:
    """The checkpoint a run continues from: loaded once, then checked against the run."""

    file: Path
    state: dict
    config: Config  # the config saved in the checkpoint
    step: int  # the checkpoint's step
    notes: list[str] = field(default_factory=list)  # lines the run prints about what it took from where
    edited: tuple[str, ...] = ()  # the dotted keys `edited_config` found edited in config.yaml
    # A fine-tune's: the tokenizer section its source trained with, as the checkpoint records it
    # (`ckpt.SOURCE_TOKENIZER`); None for another run, or one saved before checkpoints recorded it
    source_tokenizer: Optional[TokenizerConfig] = None
    # A resumed fine-tune's: the tokenizer.kind its config gave (`take_run_tokenizer`), before it took
    # the run's section: advice to name a tokenizer file for the resume sets pretrained where it is not
    given_tokenizer_kind: Optional[str] = None
    # The folder the run started in (`ckpt.START_FOLDER`), where its relative paths were read; None for
    # a checkpoint saved before checkpoints recorded it
    start_folder: Optional[Path] = None

    @classmethod
    def find(cls, resume: str | Path | bool, run_name: Optional[str], out_dir: str | Path) -> "ResumePoint":
        """resume=True: the --run-name run, else the most recent one; else a folder or file."""
        out_dir = Path(out_dir)
        if run_name is not None:
            check_run_name(run_name)
        if resume is True and run_name:
            run_dir = out_dir / run_name
            if not run_dir.is_dir():
                raise CheckpointError(f"{run_dir}: no such run to resume (check --run-name)")
            resume = run_dir
        file = ckpt.resolve_checkpoint(None if resume is True else resume, out_dir, prefer="latest")
        try:
            state = ckpt.load_checkpoint(file)
        except CheckpointError as e:
            raise CheckpointError(f"{e}{_verified_alternative(file)}") from None
        return cls(file, state, ckpt.config_from_checkpoint(state, file), int(state.get("step", 0)),
                   source_tokenizer=ckpt.source_tokenizer(state), start_folder=ckpt.start_folder(state))

    def target(self, run_name: Optional[str], out_dir: str | Path) -> Path:
        """The folder this run trains into (`forks_into` says whether it is a new one).

        Without --run-name (or naming the checkpoint's own folder) the run continues in
        place, which only the folder's latest checkpoint may do: an earlier one would
        overwrite the later steps. With another --run-name it forks: the new folder gets a
        copy of the checkpoint (see `fork_into`) and the original is never written.
        """
        own = self.file.parent
        if run_name is None or (Path(out_dir) / run_name).resolve() == own.resolve():
            latest = ckpt.latest_checkpoint(own)
            latest_step = ckpt.step_of(latest) if latest is not None else None
            if latest_step is not None and latest_step > self.step:
                holder = RunLock.holder(own)  # a training still writing there: say so, not "fork"
                if holder is not None:
                    raise StorageError(in_use_message(own, holder))
                raise CheckpointError(
                    f"{self.file} is step {self.step}, but {own} goes on to step {latest_step}: "
                    f"continuing there would overwrite its later checkpoints. To branch from this "
                    f"checkpoint, fork it into a new folder: --resume {quoted(self.file)} "
                    "--run-name NEW_NAME")
            return own
        return Path(out_dir) / run_name

    def keep_out_dir(self, config: Config, run_name: Optional[str], given: Sequence[str] = ()) -> None:
        """A run continued in place (no --run-name: see `target`) lives in its own folder. Another
        train.out_dir given for this resume (a key in `given`, or edited in config.yaml) is refused:
        the run would not go there, yet its config.yaml would say so. One that names the folder's
        parent, through a link or not, is fine; one not given (a --config file's, or a relative one
        read from another working directory) is kept as it is, as the run's config said it."""
        if run_name is not None or "train.out_dir" not in (*given, *self.edited):
            return
        own, out_dir = self.file.parent, Path(config.train.out_dir)
        if out_dir.resolve() in (own.parent.resolve(), own.resolve().parent):  # the link's or the folder's
            return
        source = "--set" if "train.out_dir" in given else f"edited in {own / CONFIG_FILE}"
        raise ConfigError(
            f"train.out_dir {str(out_dir)!r} ({source}): --resume {quoted(own)} continues the run in its own "
            f"folder, under {own.resolve().parent}; to train under {out_dir}, fork it there: --resume "
            f"{quoted(self.file)} --run-name NEW_NAME --set {quoted(f'train.out_dir={out_dir}')}")

    def forks_into(self, run_dir: Path) -> bool:
        return self.file.parent.resolve() != Path(run_dir).resolve()

    def fork_into(self, run_dir: Path) -> None:
        """Copy into a new run folder what resuming there needs: the starting checkpoint (and
        the original's best.pt if it is no later than the start, so 'best' keeps its meaning).
        Without that best.pt the copy's best validation loss is none yet, as `restore` made the
        fork's: a resume of the fork from it goes on as the fork did."""
        target = run_dir / ckpt.step_filename(self.step)
        if self._keeps_best():
            ckpt.copy_checkpoint(self.file, target)
            ckpt.copy_checkpoint(self.file.parent / ckpt.BEST, run_dir / ckpt.BEST)
        else:
            state = ckpt.load_checkpoint(self.file)
            ckpt.save_checkpoint({**state, "best_val_loss": math.inf}, target)

    def _keeps_best(self) -> bool:
        """Whether a fork takes the original's best.pt: it exists and is no later than the start."""
        return self._original_best_step is not None and self._original_best_step <= self.step

    @functools.cached_property
    def _original_best_step(self) -> Optional[int]:
        """The step of the original's best.pt, None without one or with one that fails its CRC check
        (read once: `restore` and `fork_into` ask alike)."""
        return ckpt.verified_value(self.file.parent / ckpt.BEST, "step")

    def adopt(self, config: Config, given: Sequence[str] = ()) -> None:
        """Check that `config` can continue this checkpoint; take what the run fixed at its start.

        The vocabulary size came from the tokenizer: it is taken from the checkpoint. So is a
        time-budget run's step count, which a run saved before time plans (`budget.TimePlan`)
        fixed at its start and continues with; a newer one continues its recorded plan. So are
        the dropout, the schedule's floor and the weight decay that its start chose from the
        passes it makes (where `config` has the table; not a key in `given`, the ones --set
        gives now, nor one edited in the folder's config.yaml, `edited_config`), under a budget
        or not: a `--config FILE` holds the table, not the choice. The floor stays the same share
        of the peak when train.lr changes. The run's length, a time budget or a step count, is kept
        as `_keep_length` says. A model or tokenizer the checkpoint cannot continue is refused
        with a CheckpointError.
        """
        self._keep_length(config, given)
        self._note_older_schedule(config)
        self._note_start_choices(config, given)
        given = (*given, *self.edited)
        saved = config_to_dict(self.config)["model"]
        current = config_to_dict(config)["model"]
        if current.get("vocab_size") is None:
            current["vocab_size"] = saved["vocab_size"]
        differences = model_shape_differences(saved, current)
        if differences:
            raise CheckpointError(f"{self.file}: the config's model differs from the checkpoint's: "
                                  + "; ".join(differences))
        self._check_tokenizer_settings(config)
        self._check_tokenizer_file(config.tokenizer)
        config.model.vocab_size = self.config.model.vocab_size
        if config.train.floor_by_passes and "train.min_lr" not in given:
            config.train.min_lr = self._floor_for(config.train.lr)
        if config.train.decay_by_passes and "train.weight_decay" not in given:
            config.train.weight_decay = self.config.train.weight_decay
        if config.train.dropout_by_passes:
            for key in ("dropout", "attention_dropout"):
                if f"model.{key}" not in given:
                    setattr(config.model, key, getattr(self.config.model, key))

    def keep_init_from(self, config: Config, given: Sequence[str] = ()) -> None:
        """A resume continues its checkpoint's weights and reads no source: train.init_from stays the
        checkpoint's. Another value (--set, or a --config file's; an edit of config.yaml is refused by
        `edited_config`) is refused before anything is written: the run's config.yaml and an export's
        model card would name a source its weights never came from. The same source otherwise spelled
        (`same_source`) is the run's, and keeps the run's spelling."""
        saved, now = self.config.train.init_from or None, config.train.init_from or None
        if same_source(saved, now):  # the run's spelling stays: config.yaml and the card name it so
            config.train.init_from = self.config.train.init_from
            return
        source = "--set" if "train.init_from" in given else "the config's"
        instead = f"fine-tune from {now} in a new run (without --resume)" if now else "start a new run"
        raise CheckpointError(
            f"{self.file}: train.init_from: checkpoint {saved!r}, config {now!r} ({source}); a resume "
            f"continues the run's own weights and reads no source: leave train.init_from as the run has it, "
            f"or {instead}")

    def _note_older_schedule(self, config: Config) -> None:
        """A checkpoint saved before the schedule's last step trained at the floor (2026-12-05: its plan
        state lacks `ends_at_floor`) continues with today's schedule, a share lower per step from here
        on: said in a note, as the rates after the resume differ from what the run would have had."""
        plan = self.state.get("plan")
        if config.train.schedule == "constant" or (isinstance(plan, dict) and plan.get("ends_at_floor")):
            return
        self.notes.append(f"note: {self.file} was saved before 2026-12-05, when a schedule's last step "
                          "stopped one step's share above train.min_lr; the run continues with today's, "
                          "whose last step trains at the floor (the rate of each step from here on differs "
                          "by at most that share)")

    def _note_start_choices(self, config: Config, given: Sequence[str]) -> None:
        """What a run fixed at its start, given again for its resume: said, not silently dropped. The seed
        (a resume continues the checkpoint's random generators, so another train.seed would only be
        recorded) stays the run's; a table by passes given with --set is recorded and read by a new run
        (an edit of config.yaml says so in its own note)."""
        saved = self.config.train
        if config.train.seed != saved.seed:
            if "train.seed" in given or "train.seed" not in self.edited:  # an edit's own note says so
                source = "--set" if "train.seed" in given else "the config's"
                self.notes.append(f"note: train.seed {config.train.seed} ({source}) does not apply: a "
                                  f"resume continues the run's random generators (seed {saved.seed}), which "
                                  "it keeps; another seed starts a new run (train.init_from to begin from "
                                  "these weights)")
            config.train.seed = saved.seed
        for name, chosen in PASS_TABLES.items():
            if f"train.{name}" in given and getattr(config.train, name) != getattr(saved, name):
                self.notes.append(f"note: train.{name} (--set) is read at a run's start: this one keeps its "
                                  f"{chosen}; --set {chosen}=X changes it")

    def _keep_length(self, config: Config, given: Sequence[str]) -> None:
        """A resume keeps its run's length, a time budget's plan or a step count, unless told otherwise.

        - A step count typed for this resume (--set train.max_steps=N, or edited in config.yaml) wins
          over a budget, which is then off (`budget.explicit_steps` for --set).
        - A run of a time budget given a config without one trains the config's train.max_steps from
          here on, with a note; a budget the resume gives (--set, or the file's) is the run's from here on.
        - A run that trained a step count keeps it where the config has a budget, on or turned off by
          --set: the budget is off, and its train.max_steps is that budget's first estimate, not the
          run's (with a note). A budget given for it (--set, or edited in config.yaml) is refused: a
          time plan is measured at a run's start (`budget.plan_for`). Otherwise the config's
          train.max_steps is the run's from here on (the way to train a run further)."""
        typed = (*given, *self.edited)
        if self.config.train.time_budget is not None:
            self._keep_budget(config, typed)
        else:
            self._keep_step_count(config, given)

    def _keep_budget(self, config: Config, typed: Sequence[str]) -> None:
        run, budget = self.file.parent, self.config.train.time_budget
        if "train.max_steps" in typed:
            if config.train.time_budget is not None:  # edited in config.yaml (--set's is off already)
                self.notes.append(f"train.max_steps={config.train.max_steps} edited in {run / CONFIG_FILE}: "
                                  f"the time budget {duration_text(config.train.time_budget)} is off for "
                                  "this run")
                config.train.time_budget = None
            return
        if config.train.time_budget is None:
            if "train.time_budget" not in typed:  # a --config file (or a Config) without one: said
                self.notes.append(
                    f"note: the run {run} trained under a time budget of {duration_text(budget)}, which the "
                    f"config does not have: it trains a step count from here on (train.max_steps "
                    f"{config.train.max_steps:,}; the budget's plan and its rates end); --set "
                    f"train.time_budget={budget} continues the plan")
            return
        config.train.max_steps = self.config.train.max_steps  # the plan's first estimate, recorded

    def _keep_step_count(self, config: Config, given: Sequence[str]) -> None:
        run, steps = self.file.parent, self.config.train.max_steps
        budget = config.train.time_budget
        if budget is not None and "train.time_budget" in (*given, *self.edited):
            source = "--set" if "train.time_budget" in given else f"edited in {run / CONFIG_FILE}"
            raise ConfigError(
                f"train.time_budget {budget} ({source}): the run {run} trains a step count (train.max_steps "
                f"{steps}), which a resume continues: a time budget is planned at a run's start. Resume "
                f"without it (--set train.max_steps=N changes the count), or start a new run from these "
                f"weights with --set {quoted(f'train.init_from={self.file}')}")
        # A config's budget, on or turned off by --set: its train.max_steps is that budget's first estimate
        beside_a_budget = budget is not None or "train.time_budget" in given
        if "train.max_steps" in given:
            return
        if not beside_a_budget:
            if config.train.max_steps != steps and "train.max_steps" not in self.edited:  # the config's: said
                self.notes.append(f"note: train.max_steps {steps:,} -> {config.train.max_steps:,} (the "
                                  "config's): the run's schedule spans that from here on")
            return
        config.train.time_budget = None
        if budget is not None or config.train.max_steps != steps:
            off = f"train.time_budget {budget} (the config's) is off; " if budget is not None else ""
            self.notes.append(f"note: {off}the run {run} trains a step count (train.max_steps {steps:,}), "
                              "which a resume continues; --set train.max_steps=N changes it")
        config.train.max_steps = steps

    def _check_tokenizer_settings(self, config: Config) -> None:
        """Refuse another tokenizer kind (or BPE size) before any data is read: the model learned
        the run's token ids. (A pretrained tokenizer's path may move: its file is checked later.)"""
        saved, now = self.config.tokenizer, config.tokenizer
        keys = ["kind"] + (["vocab_size"] if saved.kind == now.kind == "bpe" else [])
        changed = [f"tokenizer.{key}: checkpoint {getattr(saved, key)!r}, config {getattr(now, key)!r}"
                   for key in keys if getattr(saved, key) != getattr(now, key)]
        if changed:
            raise CheckpointError(f"{self.file}: the config's tokenizer differs from the checkpoint's: "
                                  f"{'; '.join(changed)}; the model learned the run's token ids: set it "
                                  "back to resume, or start a new run")

    def _check_tokenizer_file(self, tokenizer: TokenizerConfig) -> None:
        """A pretrained tokenizer's file is read again by a resume: one that no longer holds the run's
        tokenizer (the source's tokenizer.json changed since the run started: its model folder
        downloaded again, say) is refused before any data is read, naming the file and the run's
        own copy to resume with. It is not swapped for the copy unasked: the config names the file.
        A missing file is named where the data is read."""
        saved = self.state.get("tokenizer")
        path = Path(tokenizer.path) if tokenizer.kind == "pretrained" and tokenizer.path else None
        if not isinstance(saved, str) or path is None or not path.is_file():
            return
        now = Tokenizer.from_file(path)  # not its end_of_text: a file without it differs, said below
        if now.to_json() == saved:
            return
        started, own = self.config.tokenizer.path, self.file.parent / "tokenizer.json"
        how = ("changed since the run started" if started == tokenizer.path
               else f"is not the tokenizer the run started with (from {started})")
        # a config that writes another kind (a fine-tune's, kind: char) reads no tokenizer.path alone
        kind = [] if self.given_tokenizer_kind in (None, "pretrained") else ["tokenizer.kind=pretrained"]
        items = " ".join(quoted(item) for item in [*kind, f"tokenizer.path={own}"])
        fix = (f"Resume with the run's own copy: --set {items}"
               if own.is_file() and own.resolve() != path.resolve()
               else "Restore the file the run started with, or start a new run")
        change = _file_change(Tokenizer.from_json(saved, origin=str(self.file)), now)
        raise CheckpointError(f"{self.file}: tokenizer.path {path} {how}: {change}; token ids would no "
                              f"longer mean what the model learned. {fix}")

    def take_run_tokenizer(self, config: Config) -> TokenizerConfig:
        """The tokenizer section a resumed fine-tune continues with: the checkpoint's. The file it
        names (the source's tokenizer.json, or the token cache's copy of a checkpoint's) may have
        moved or gone: a tokenizer.path given for this resume is read instead, else, where that file
        is gone, the run folder's own tokenizer.json. Taking the copy adds a note to `self.notes`
        and, where `config.tokenizer` names the gone file, points it at the copy. The file taken is
        checked against the checkpoint's tokenizer before any data is read (`adopt`: a source's file
        changed since is refused, naming the copy), and the data's once read (`check_tokenizer`),
        so the run stays exact."""
        saved, given = self.config.tokenizer, config.tokenizer
        self.given_tokenizer_kind = given.kind
        if given.kind == saved.kind and given.path not in (None, saved.path):  # --set for this resume
            return dataclasses.replace(saved, path=given.path)
        own = self.file.parent / "tokenizer.json"
        if saved.path is None or Path(saved.path).is_file() or not own.is_file():
            return saved
        self.notes.append(f"note: tokenizer.path {saved.path} is gone; the run reads its own copy, {own}")
        if given.path == saved.path:
            config.tokenizer = dataclasses.replace(given, path=str(own))
        return dataclasses.replace(saved, path=str(own))

    def _floor_for(self, lr: float) -> float:
        """The checkpoint's schedule floor for a run at peak `lr`: the same floor, or under another
        train.lr the same share of the peak (a table's floor is a share, and a floor above a new,
        lower peak would raise the rate past it)."""
        saved = self.config.train
        return saved.min_lr if lr == saved.lr else saved.min_lr / saved.lr * lr

    def edited_config(self, overruled: Sequence[str] = ()) -> Config:
        """The config a resume without --config continues with: the checkpoint's, with the edits
        made since to its folder's config.yaml (which the run wrote from that same config).
        `overruled`: the keys the command line sets for this resume (--set, --device): their edits
        are noted as overruled, as the command line's value is the one the run takes.

        The file is read as any config file: a key deleted from it is an edit back to its default
        (but for a key the run's older tinyattn did not write: `ckpt.migrated_config`). A table
        such as train.decay_by_passes is one setting. Only for the folder's latest checkpoint
        (config.yaml describes it: a fork from an earlier one notes the edits it does not take); an
        edit of the model or the tokenizer cannot apply to these weights and is refused naming the key.
        """
        path = self.file.parent / CONFIG_FILE
        latest = ckpt.latest_checkpoint(self.file.parent)
        if not path.is_file():
            return self.config
        if latest is not None and ckpt.step_of(latest) != self.step:
            self._note_edits_not_taken(path, latest, overruled)
            return self.config
        if not path.read_text(encoding="utf-8", errors="replace").strip():
            # emptied (a full disk while it was written, say): nothing is edited in it
            self.notes.append(f"note: {path} is empty; the run continues with its checkpoint's config "
                              "and writes config.yaml again")
            return self.config
        # self.state's config: as the run saved it, and wrote config.yaml
        changed, saved, edited = _config_edits(path, self.config, self.state.get("config", {}))
        written = set(settings(yaml.safe_load(path.read_text(encoding="utf-8")) or {}))
        fixed = [key for key in changed if key.startswith("tokenizer.") or key == "train.init_from"
                 or (key.startswith("model.") and key not in USE_NOT_SHAPE)]
        if fixed:
            key = fixed[0]
            what = ("where these weights came from (it reads no source)" if key == "train.init_from"
                    else "the model's shape or the tokenizer of these weights")
            raise CheckpointError(
                f"{path}: {key} was {'edited' if key in written else 'deleted'} ({saved[key]!r} -> "
                f"{edited[key]!r}), but a resume cannot change {what}: undo the edit, or start a new run "
                "(train.init_from to begin from these weights)")
        if not changed:
            return self.config
        self.edited = tuple(changed)  # a table's choice edited by hand: the edit wins (`adopt`)
        what = ", ".join(_edit(key, saved[key], edited[key], deleted=key not in written,
                               overruled=key in overruled) for key in changed)
        self.notes.append(f"{path}: your edits apply after step {self.step}: {what}")
        values = with_settings(config_to_dict(self.config), {key: edited[key] for key in changed})
        return config_from_dict(values, default_origin=str(path))

    def _note_edits_not_taken(self, path: Path, latest: Path, overruled: Sequence[str]) -> None:
        """A fork from an earlier step than the folder's latest does not take config.yaml's edits
        (the file describes the latest step), nor does a resume from a best.pt further on than it:
        a note names those not given on the command line.
        The edits are what the file changes from the latest checkpoint's config (that checkpoint's
        own settings, from a resume with --set, are none); where it cannot be read, from this one's.
        A file that cannot be read as a config is left to a resume from the latest to refuse."""
        stored = ckpt.saved_value(latest, "config")
        try:
            config = (self.config if stored is None
                      else ckpt.config_from_checkpoint({"config": stored}, latest))
            stored = self.state.get("config", {}) if stored is None else stored
            changed = _config_edits(path, config, stored)[0]
        except (ConfigError, CheckpointError, OSError, yaml.YAMLError):  # emptied or broken: no edits to name
            return
        untaken = [key for key in changed if key not in overruled]
        # best.pt further on than every step checkpoint (a save cut short after it) resumes in place too
        run = (f"a fork from step {self.step}" if ckpt.step_of(latest) > self.step
               else f"a resume from {self.file.name} (step {self.step})")
        if untaken:
            self.notes.append(
                f"note: {path} describes step {ckpt.step_of(latest)}, not step {self.step}: its edits "
                f"({', '.join(untaken)}) do not apply to {run}; give them with --set")

    def placed_data(self, config: Config) -> tuple[Config, Optional[str]]:
        """The config the resumed run reads its data with, and a note where that is not as given. Run
        from another folder than the run started in, the run's own relative data paths (data.files,
        a local data.dataset folder, data.cache_dir: those equal to the checkpoint's) are read from the
        folder it started in, where that still holds them (`read_from`): the files it trained on, not
        a download, a missing file or another file of that name here. A path given otherwise (--set,
        another --config's) is the user's, read from the folder run from. `check_data` then compares
        what was read with what the run trained on."""
        own = tuple(key for key in PATH_KEYS if getattr(config.data, key) == getattr(self.config.data, key))
        placed, moved = read_from(config, self.start_folder, own)
        return placed, read_from_note(moved, self.start_folder) if moved else None

    def check_data(self, fingerprint: dict, *, allow_change: bool) -> Optional[str]:
        """Refuse to continue on data other than what the checkpoint trained on, naming what
        changed, unless `allow_change` (--allow-data-change); returns the line the run logs."""
        saved = self.state.get("data")
        if saved is None:
            return (f"note: {self.file} records no data fingerprint (saved by an older tinyattn): "
                    "whether the data changed since cannot be checked")
        changes = data_differences(saved, fingerprint)
        if not changes:
            return None
        what = "; ".join(changes)
        if not allow_change:
            raise CheckpointError(
                f"{self.file}: the data differs from what the run trained on: {what}; resuming would "
                f"{_what_resuming_does(saved, fingerprint)}: restore the data, or resume anyway "
                "with --allow-data-change")
        return (f"warning: --allow-data-change: the data differs from what the run trained on up to step "
                f"{self.step}: {what}; {_what_the_losses_mean(saved, fingerprint, self.step)}")

    def check_tokenizer(self, tokenizer) -> None:
        """Refuse data whose tokenizer is not the run's, naming what changed (before any size check:
        a larger vocabulary is a symptom, the corpus or the tokenizer settings the cause)."""
        saved = self.state.get("tokenizer")
        if saved != tokenizer.to_json():
            raise CheckpointError(f"{self.file}: {_tokenizer_change(saved, tokenizer)}; "
                                  "token ids would no longer mean what the model learned. Resume on the "
                                  "data the run was trained on, or start a new run")

    def restore(self, trainer: Trainer, run_dir: Path) -> None:
        """The checkpoint into `trainer`. A fork into `run_dir` that does not take the original's
        best.pt (it is later than the start, or gone) starts with no best validation loss: the
        checkpoint's was reached by a model the fork never holds, and its first evaluation
        writes the fork's own best.pt. So does a resume in place whose best.pt is gone or
        unreadable: else no evaluation after a rise would write one, and the run would report a
        best whose model is not in its folder. A resume in place whose best.pt is of a later step (a
        save cut short after it, before its step's checkpoint: `owners.Checkpointer.save`) takes its
        loss: else an evaluation before that step was called the best, and reported, above best.pt's."""
        trainer.load_state_dict(self.state, self.file)
        self.state = {}  # the tensors are in the trainer now; free the copy
        if (self.forks_into(run_dir) or self._original_best_step is None) and not self._keeps_best():
            trainer.best_val_loss = math.inf
        elif not self.forks_into(run_dir) and self._original_best_step > self.step:
            saved = ckpt.saved_value(self.file.parent / ckpt.BEST, "best_val_loss")  # it verifies
            if isinstance(saved, (int, float)):
                trainer.best_val_loss = float(saved)


def keep_user_config(run_dir: Path, point: Optional[ResumePoint]) -> Optional[str]:
    """Before a resumed run rewrites config.yaml: a copy of the user's edited file beside it
    (config.yaml differs from what the run wrote from its checkpoint), and the line saying so."""
    path = run_dir / CONFIG_FILE
    if point is None or not path.is_file():
        return None
    written = config_text(point.config)  # as save_config wrote it (libyaml folds long texts otherwise)
    text = path.read_text(encoding="utf-8", errors="replace")
    if text == written:
        return None
    kept = run_dir / f"config.edited-step{point.step}.yaml"
    with atomic_write(kept) as f:
        f.write(text.encode("utf-8"))
    return f"{path} differed from the run's own copy: what you wrote is kept in {kept.name}"


def _config_edits(path: Path, config: Config, stored: dict) -> tuple[list[str], dict, dict]:
    """The dotted keys the config file `path` changes from `config`, the checkpoint's config the run
    wrote it from (`stored`: that config as the checkpoint holds it), and the settings before and
    after. Not an edit: a key the run's older tinyattn did not write (`ckpt.migrated_config` gives
    it), nor another spelling of the same train.init_from source."""
    saved, edited = settings(config_to_dict(config)), settings(config_to_dict(load_config(path)))
    older = set(settings(ckpt.migrated_config(stored))) - set(settings(stored))  # never in the file
    changed = [key for key in saved if key not in older and edited[key] != saved[key]
               and not (key == "train.init_from" and same_source(saved[key], edited[key]))]
    return changed, saved, edited


def _edit(key: str, before, after, *, deleted: bool, overruled: bool = False) -> str:
    """An edit of config.yaml as the run logs it: "train.lr 0.002 -> 0.001"; a key deleted from the
    file goes back to its default; a table by passes is read where a run starts; a key the command
    line sets takes the command line's value."""
    line = f"{key} {before!r} -> {after!r}" + (" (deleted: its default)" if deleted else "")
    if overruled:
        return line + " (overruled: the command line sets it for this run)"
    name = key.partition(".")[2]
    if name in PASS_TABLES:
        line += f" (a run reads it at its start: this one keeps its {PASS_TABLES[name]})"
    elif key == "train.seed":
        line += (" (a run draws from it at its start: this one continues its random generators and keeps "
                 "its seed)")
    return line


CONFIG_FILE = "config.yaml"  # in the run folder: the run's resolved config, as the user may edit it
DATA_FILE = "data.json"  # in the run folder: what the run (last) trained on, as checkpoints record it


def save_data_fingerprint(fingerprint: dict, run_dir: Path) -> None:
    with atomic_write(run_dir / DATA_FILE) as f:
        f.write(json.dumps(fingerprint, indent=2).encode("utf-8"))


def open_run_folder(config: Config, config_path, run_name: Optional[str], point: Optional[ResumePoint],
                     dist: Distributed) -> tuple[Path, "RunLock | nullcontext", bool]:
    """The folder this run writes, held (locked) by rank 0 until the run ends; the same on every rank.
    Also whether this call made it for a new run (rank 0 only), which a failed start may take back.

    A new run gets `--run-name` or a fresh `<config>-<date>-<time>` folder; a resumed one its
    checkpoint's folder, or with another --run-name a fork (a copy of the checkpoint in a
    new folder). Nothing is written before the lock is held.
    """
    run_dir, lock, made = None, nullcontext(), False
    if run_name is not None:
        try:
            check_run_name(run_name)  # on every rank: each fails alike, before any folder is made
        except TinyattnError as mistake:
            raise said_once(mistake, dist.enabled) from None
    with refusal_shared(dist):  # a folder in use, or with checkpoints: every rank ends with its line
        if dist.is_main:
            run_dir, made = _run_folder(config, config_path, run_name, point)
            lock = RunLock.acquire(run_dir)
            if (point is None or point.forks_into(run_dir)) and ckpt.has_checkpoints(run_dir):
                lock.release()
                lock.say_note()  # no train.log opens to say it: the console does
                raise CheckpointError(f"{run_dir} already holds checkpoints; continue it with --resume "
                                      f"{quoted(run_dir)}, or choose another --run-name")
    if dist.enabled:  # a default name has the time in it: rank 0's choice is everyone's
        shared = [str(run_dir) if run_dir is not None else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir = Path(shared[0])
    return run_dir, lock, made


def _run_folder(config: Config, config_path, run_name: Optional[str],
                point: Optional[ResumePoint]) -> tuple[Path, bool]:
    """`open_run_folder`'s folder (rank 0's choice), and whether it is yet to be made."""
    if point is not None:
        run_dir = point.target(run_name, config.train.out_dir)
        return run_dir, point.forks_into(run_dir) and not run_dir.exists()
    if run_name:
        run_dir = Path(config.train.out_dir) / run_name
        return run_dir, not run_dir.exists()
    return unique_run_dir(config.train.out_dir, Path(config_path).stem if config_path else "run"), True
