"""`scripts/attention.py`: a checkpoint's attention maps for one text, and a query's top keys."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tinyattn.cli import run_command
from tinyattn.errors import TinyattnError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="attention.py",
        description="Draw a model's attention weights for a text: one PNG per layer, every head in "
                    "a grid, query tokens down the side, key tokens along the top, future (masked) "
                    "cells grey. With --query, also print the keys each head weights most.",
        epilog="example: python scripts/attention.py --checkpoint checkpoints/<run> --text "
               "\"The book that the student borrowed from the library was fascinating.\" --query was")
    p.add_argument("--checkpoint", help="checkpoint file or run folder (default: the most recent run "
                                        "under checkpoints/)")
    p.add_argument("--text", help="the text to look at (default: the run's train.probe_text); a text "
                                  "longer than the context keeps its end")
    p.add_argument("--layer", type=int, help="draw only this layer (default: every layer)")
    p.add_argument("--head", type=int, help="draw only this head, large (default: every head in a grid)")
    query = p.add_mutually_exclusive_group()
    query.add_argument("--query", metavar="WORD",
                       help="print the top 5 keys of this word's token for each head: the token "
                            "holding the last character of the word's first whole-word, "
                            "case-sensitive occurrence")
    query.add_argument("--query-position", type=int, metavar="N",
                       help="the same for the token at position N (negative: from the end)")
    p.add_argument("--out-dir", help="folder for the PNGs (default: attention/ in the checkpoint's "
                                     "run folder)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def command() -> int:
        from tinyattn.attention_maps import (check_query_position, compute_attention_maps,
                                             format_query_table, query_position_of_word, query_table,
                                             save_heatmaps)
        from tinyattn.checkpoint import load_model
        from tinyattn.plotting import require_matplotlib
        from tinyattn.runtime import select_device

        require_matplotlib()  # before any work: a missing extra is a one-line error
        loaded = load_model(args.checkpoint, select_device(args.device))
        model_config = loaded.config.model
        _check_index("--layer", args.layer, model_config.n_layer, "layers")
        _check_index("--head", args.head, model_config.n_head, "heads")
        text = loaded.config.train.probe_text if args.text is None else args.text
        maps = compute_attention_maps(loaded.model, loaded.tokenizer, text)
        position = None
        if args.query is not None:
            position = query_position_of_word(loaded.tokenizer, maps.token_ids, args.query)
        elif args.query_position is not None:
            position = check_query_position(maps, args.query_position)
        if maps.dropped_tokens:
            kept = len(maps.token_ids)
            print(f"warning: the text is {kept + maps.dropped_tokens} tokens, longer than the context of "
                  f"{kept}: kept the last {kept}", file=sys.stderr)

        out_dir = Path(args.out_dir) if args.out_dir else loaded.path.parent / "attention"
        layers = None if args.layer is None else [args.layer]
        try:
            paths = save_heatmaps(maps, out_dir, layers, args.head)
        except OSError as e:
            raise TinyattnError(f"{out_dir}: cannot write the heatmaps ({e.strerror or e})") from None
        for path in paths:
            print(f"wrote {path}")
        if position is not None:
            heads = None if args.head is None else [args.head]
            print()
            if args.query is not None:
                print(f"--query {args.query!r}: its first occurrence ends in token {maps.labels[position]} "
                      f"at position {position}")
            print(format_query_table(maps, position, query_table(maps, position, layers=layers, heads=heads)))
        return 0

    return run_command(command)


def _check_index(option: str, value: int | None, count: int, what: str) -> None:
    if value is not None and not 0 <= value < count:
        raise TinyattnError(f"{option} {value}: the model has {count} {what} (0..{count - 1})")
