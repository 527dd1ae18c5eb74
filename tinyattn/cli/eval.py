"""`tinyattn eval` (`scripts/eval.py`): loss, perplexity, bits per character or byte, and loss by position."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tinyattn.cli import run_command
from tinyattn.cli.options import add_checkpoint, add_device, command_parser
from tinyattn.config import home_path
from tinyattn.errors import DataError, TinyattnError, counted

EVAL_BATCH_TOKENS = 1 << 14  # tokens per forward pass for an imported folder (`_batch_size`)


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "eval",
        "Score a checkpoint on every token of a text: non-overlapping windows of the "
        "context length plus the tail, deterministically. Prints the loss, perplexity "
        "and bits per character (character tokenizer) or per UTF-8 byte, and the loss at "
        "each position of the window, which it also plots.",
        "example: tinyattn eval --checkpoint checkpoints/<run> --split validation")
    add_checkpoint(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--text-file", type=lambda text: Path(home_path(text)), metavar="FILE",
                        help="a UTF-8 text file to score")
    source.add_argument("--split", choices=["validation", "train"],
                        help="a split of the run's data, from its saved config (default: validation)")
    p.add_argument("--batch-size", type=int, metavar="N", help="windows per forward pass (default: the "
                   "run's train.batch_size; for a Hugging Face folder, which records no run, as many "
                   f"windows as hold {EVAL_BATCH_TOKENS:,} tokens, at least one)")
    add_device(p)
    # A string, not a Path: Path("plots/") drops the slash that says it is a folder
    p.add_argument("--plot", type=home_path, metavar="PNG",
                   help="where to save the loss-by-position plot, or a folder to save it in (an existing "
                        "one, or a path ending in /); default: loss_by_position_<split or file name>.png "
                        "in the run folder (_step_N added for a step checkpoint; for a Hugging Face "
                        "folder, <its name>_loss_by_position_<file name>.png in the current folder)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: command(args))


def command(args: argparse.Namespace) -> int:
    from tinyattn.analysis.evaluate import evaluate_tokens
    from tinyattn.checkpoint import require_causal
    from tinyattn.hf.folder import load_any_model
    from tinyattn.system.device import select_device

    if args.batch_size is not None and args.batch_size <= 0:
        raise TinyattnError(f"--batch-size {args.batch_size}: expected a positive integer")
    if args.plot is not None and not args.no_plot:
        _check_plot_format(args.plot)  # before the scoring, which can take a while
    loaded = load_any_model(args.checkpoint, select_device(args.device))
    require_causal(loaded, "tinyattn eval (a bidirectional model reads the token it predicts; "
                           "tinyattn lab causal reports its losses)")
    tokens, text, source, name = _tokens(args, loaded)
    if not args.no_plot:  # a plot that cannot be written is said before the scoring, not after
        _check_plot_folder(_plot_file(args.plot, loaded.default_output(f"loss_by_position_{name}.png")))
    batch_size = _batch_size(args.batch_size, loaded)
    char_level = loaded.config.tokenizer.kind == "char"
    result = evaluate_tokens(loaded.model, loaded.tokenizer, tokens, batch_size, char_level, text=text,
                             source=source)
    _print_scores(loaded, result, len(tokens), source)
    if result.full_windows and not args.no_plot:
        _plot(args, loaded, result, source, name)
    return 0


def _batch_size(given: int | None, loaded) -> int:
    """--batch-size, else the run's train.batch_size (what its training fitted). An imported
    folder's train section is only the defaults, blind to its context: windows of its context
    holding EVAL_BATCH_TOKENS tokens, so a long context is scored a window or two at a time."""
    if given is not None:
        return given
    if loaded.hf_folder:
        return max(1, EVAL_BATCH_TOKENS // loaded.config.model.context_length)
    return loaded.config.train.batch_size


def _tokens(args: argparse.Namespace, loaded):
    """(token ids, the text they encode or None (a split), what they are for the report, the
    name of the plot's file)."""
    import numpy as np

    from tinyattn.data.tokenizer import warn_unknown_characters
    from tinyattn.system.storage import read_text

    if args.text_file is not None:
        text = read_text(args.text_file, "text file")
        ids = loaded.tokenizer.encode(text)
        warn_unknown_characters(loaded.tokenizer, text, ids, str(args.text_file), "scored")
        # An imported folder's bos first where its tokenizer adds it: the text scored as transformers would
        ids = loaded.tokenizer.text_start + ids
        return np.asarray(ids, dtype=np.int64), text, str(args.text_file), args.text_file.stem
    name = args.split or "validation"
    return _split_tokens(loaded, name), None, f"the {name} split", name


def _print_scores(loaded, result, num_tokens: int, source: str) -> None:
    from tinyattn.analysis.evaluate import format_loss_by_position

    T = loaded.config.model.context_length
    tail = f" + a tail of {result.tail_tokens}" if result.tail_tokens else ""
    print(f"{loaded.label} on {source}: {num_tokens:,} tokens, "
          f"{counted(result.full_windows, 'window')} of {T}{tail}")
    bits = f"bits per {result.unit}"
    print(f"{'loss':<19} {result.loss:.4f} nats per token")
    print(f"{'perplexity':<19} {result.perplexity:.3f}")
    print(f"{bits:<19} {result.bits_per_unit:.4f} ({result.units:,} {result.unit}s)")
    if result.full_windows == 0:
        print(f"loss by position: no full window ({counted(num_tokens, 'token')} < context_length + 1 = "
              f"{T + 1})")
        return
    print(f"\nloss by position, mean over {counted(result.full_windows, 'full window')}:")
    print(format_loss_by_position(result.loss_by_position))


PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what --plot writes, by its extension


def _check_plot_format(given: str) -> None:
    """A --plot path whose extension names no format the plot is written in: one line."""
    path = Path(given)
    if not _names_a_folder(given) and path.suffix and path.suffix.lower() not in PLOT_FORMATS:
        raise TinyattnError(f"--plot {path}: {path.suffix!r} is not an image format this writes; "
                            f"expected a file ending in {', '.join(PLOT_FORMATS)} (none: .png) or a folder")


def _check_plot_folder(path: Path) -> None:
    from tinyattn.system.storage import check_writable

    try:
        check_writable(path.parent)
    except TinyattnError as e:
        raise TinyattnError(f"{e}; or put the plot elsewhere with --plot PNG, or skip it with --no-plot"
                            ) from None


def _names_a_folder(given: str) -> bool:
    """--plot names a folder: one that exists, or a path ending in a separator (made if need be)."""
    return Path(given).is_dir() or given.endswith(("/", os.sep))


def _plot_file(given: str | None, default: Path) -> Path:
    """Where the plot goes: --plot as given, in a folder it names (the default file name), or with
    .png added where it has no extension (which the plotting library would add unsaid)."""
    if given is None:
        return default
    path = Path(given)
    if _names_a_folder(given):
        return path / default.name
    return path if path.suffix else path.with_name(path.name + ".png")


def _plot(args: argparse.Namespace, loaded, result, source: str, name: str) -> None:
    from tinyattn.analysis.evaluate import save_loss_by_position_plot
    from tinyattn.analysis.plotting import plotting_available

    if not plotting_available():  # a note beside the warnings, not among the scores on stdout
        import sys

        print("note: plot skipped: matplotlib is missing (pip install 'tinyattn[plot]'), or use --no-plot",
              file=sys.stderr)
        return
    path = _plot_file(args.plot, loaded.default_output(f"loss_by_position_{name}.png"))
    step = "" if loaded.hf_folder else f", step {loaded.step}"
    title = f"loss by position: {loaded.name}{step}, {source}"
    try:
        save_loss_by_position_plot(result.loss_by_position, path, title)
    except OSError as e:
        raise TinyattnError(f"{path}: cannot write the plot ({e.strerror or e})") from None
    print(f"wrote {path}")


def _split_tokens(loaded, split: str):
    from tinyattn.data.batches import prepare_data
    from tinyattn.data.relative_paths import data_where_started

    if loaded.config.data.dataset is None and loaded.config.data.files is None:
        raise DataError(f"{loaded.path.parent}: a Hugging Face folder has no data section to take "
                        f"--split {split} from; score a text with --text-file FILE")
    data = prepare_data(data_where_started(loaded.config, loaded.start_folder))  # the run's files, anywhere
    if data.tokenizer.to_json() != loaded.tokenizer.to_json():
        raise DataError(f"{data.cache_dir}: the data's tokenizer differs from the one in {loaded.path}; "
                        "the run's data or tokenizer settings no longer give the tokens it was trained on")
    _say_whether_data_changed(loaded, data.fingerprint, split)
    return data.validation if split == "validation" else data.train


def _say_whether_data_changed(loaded, fingerprint: dict, split: str) -> None:
    """A plain warning when the split scored now is not the one the run used (its checkpoint
    records the data it trained and validated on)."""
    import sys

    from tinyattn.data.token_cache import data_differences

    if loaded.data is None:
        print(f"note: {loaded.path} records no data fingerprint (saved by an older tinyattn): whether "
              f"this {split} split is the run's cannot be checked", file=sys.stderr)
        return
    changes = data_differences(loaded.data, fingerprint)
    if changes:
        validation = split == "validation"
        used, also = ("validated", " and may count text it trained on") if validation else ("trained", "")
        print(f"warning: the {split} split is not the one {loaded.path} was {used} on: the data changed "
              f"({'; '.join(changes)}); this loss is not comparable with the run's{also}", file=sys.stderr)
