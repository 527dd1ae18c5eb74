"""`scripts/eval.py`: loss, perplexity, bits per character or byte, and loss by position."""

from __future__ import annotations

import argparse
from pathlib import Path

from tinyattn.cli import run_command
from tinyattn.errors import DataError, TinyattnError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval.py",
        description="Score a checkpoint on every token of a text: non-overlapping windows of the "
                    "context length plus the tail, deterministically. Prints the loss, perplexity "
                    "and bits per character (character tokenizer) or per UTF-8 byte, and the loss at "
                    "each position of the window, which it also plots.",
        epilog="example: python scripts/eval.py --checkpoint checkpoints/<run> --split validation")
    p.add_argument("--checkpoint", help="checkpoint file, run folder or Hugging Face Llama folder "
                                        "(default: the most recent run under checkpoints/)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--text-file", type=Path, metavar="FILE", help="a UTF-8 text file to score")
    source.add_argument("--split", choices=["validation", "train"],
                        help="a split of the run's data, from its saved config (default: validation)")
    p.add_argument("--batch-size", type=int, metavar="N", help="windows per forward pass "
                                                                "(default: the run's train.batch_size)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="where to save the loss-by-position plot "
                   "(default: loss_by_position_<split or file name>.png in the run folder)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command() -> int:
        import numpy as np

        from tinyattn.analysis.evaluate import (
            evaluate_tokens,
            format_loss_by_position,
            save_loss_by_position_plot,
        )
        from tinyattn.analysis.plotting import plotting_available
        from tinyattn.hf.folder import load_any_model
        from tinyattn.system.device import select_device

        if args.batch_size is not None and args.batch_size <= 0:
            raise TinyattnError(f"--batch-size {args.batch_size}: expected a positive integer")
        loaded = load_any_model(args.checkpoint, select_device(args.device))
        if args.text_file is not None:
            source, name = str(args.text_file), args.text_file.stem
            tokens = np.asarray(loaded.tokenizer.encode(_read_text(args.text_file)), dtype=np.int64)
        else:
            name = args.split or "validation"
            source = f"the {name} split"
            tokens = _split_tokens(loaded, name)
        batch_size = args.batch_size or loaded.config.train.batch_size
        char_level = loaded.config.tokenizer.kind == "char"
        result = evaluate_tokens(loaded.model, loaded.tokenizer, tokens, batch_size, char_level)

        T = loaded.config.model.context_length
        tail = f" + a tail of {result.tail_tokens}" if result.tail_tokens else ""
        print(f"{loaded.path} (step {loaded.step}) on {source}: {len(tokens):,} tokens, "
              f"{result.full_windows:,} windows of {T}{tail}")
        bits = f"bits per {result.unit}"
        print(f"{'loss':<19} {result.loss:.4f} nats per token")
        print(f"{'perplexity':<19} {result.perplexity:.3f}")
        print(f"{bits:<19} {result.bits_per_unit:.4f} ({result.units:,} {result.unit}s)")
        if result.full_windows == 0:
            print(f"loss by position: no full window ({len(tokens)} tokens < context_length + 1 = {T + 1})")
            return 0
        print(f"\nloss by position, mean over {result.full_windows:,} full windows:")
        print(format_loss_by_position(result.loss_by_position))
        if args.no_plot:
            return 0
        if not plotting_available():
            print("plot skipped: matplotlib is missing (pip install 'tinyattn[plot]'), or use --no-plot")
            return 0
        path = args.plot or loaded.path.parent / f"loss_by_position_{name}.png"
        title = f"loss by position: {loaded.path.parent.name}, step {loaded.step}, {source}"
        try:
            save_loss_by_position_plot(result.loss_by_position, path, title)
        except OSError as e:
            raise TinyattnError(f"{path}: cannot write the plot ({e.strerror or e})") from None
        print(f"wrote {path}")
        return 0

    return run_command(command)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: text file not found") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None


def _split_tokens(loaded, split: str):
    from tinyattn.data.batches import prepare_data

    if loaded.config.data.dataset is None and loaded.config.data.files is None:
        raise DataError(f"{loaded.path.parent}: a Hugging Face folder has no data section to take "
                        f"--split {split} from; score a text with --text-file FILE")
    data = prepare_data(loaded.config)
    if data.tokenizer.to_json() != loaded.tokenizer.to_json():
        raise DataError(f"{data.cache_dir}: the data's tokenizer differs from the one in {loaded.path}; "
                        "the run's data or tokenizer settings no longer give the tokens it was trained on")
    return data.validation if split == "validation" else data.train
