"""`tinyattn attention` (`scripts/attention.py`): a checkpoint's attention maps for one text, a query's
top keys, its relevance table and the explorer page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tinyattn.cli import run_command
from tinyattn.cli.options import add_checkpoint, add_device, command_parser
from tinyattn.config import home_path
from tinyattn.errors import TinyattnError, counted


def parser() -> argparse.ArgumentParser:
    p = command_parser(
        "attention",
        "Draw a model's attention weights for a text: one PNG per layer, every head in "
        "a grid, query tokens down the side, key tokens along the top, future (masked) "
        "cells grey. With --query, also print the keys each head weights most.",
        "example: tinyattn attention --checkpoint checkpoints/<run> --text "
        "\"The book that the student borrowed from the library was fascinating.\" --query was")
    add_checkpoint(p)
    p.add_argument("--text", help="the text to look at (default: the run's train.probe_text); for the "
                                  "PNGs a text longer than the context keeps its end, --relevance and "
                                  "--html read all of it in windows of the context length")
    p.add_argument("--layer", type=int, help="draw only this layer (default: every layer); --html's page "
                                             "opens on it")
    p.add_argument("--head", type=int, help="draw only this head, large (default: every head in a grid); "
                                            "--html's page opens on it")
    query = p.add_mutually_exclusive_group()
    query.add_argument("--query", metavar="WORD",
                       help="print the top 5 keys of this word's token for each head: the token "
                            "holding the last character of the word's first whole-word, "
                            "case-sensitive occurrence")
    query.add_argument("--query-position", type=int, metavar="N",
                       help="the same for token N of the text (negative: from the end); where a text "
                            "longer than the context loses its start, the table counts in the kept "
                            "window, after a line naming both positions")
    p.add_argument("--relevance", action="store_true",
                   help="instead of the PNGs, print for the query token (--query, --query-position; "
                        "default the last token that predicts one) each earlier token's relevance (the "
                        "rise in the query's loss when that token is masked out of attention in every "
                        "layer) beside its weights, the rank correlation of weight with relevance, and "
                        "head ablation. A text longer than the context is read in windows of the "
                        "context length, half a context apart")
    p.add_argument("--top", type=int, metavar="N", help="with --relevance: only the N tokens whose removal "
                                                         "changes the loss most, either way")
    p.add_argument("--html", type=home_path, metavar="PATH",
                   help="instead of the PNGs, write the explorer: one self-contained HTML page of the "
                        "weights, relevance, losses and head ablation of the text (windows as --relevance)")
    p.add_argument("--out-dir", type=home_path, metavar="DIR",
                   help="folder for the PNGs (default: attention/ in the checkpoint's "
                        "run folder, attention_step_N/ for a step checkpoint; for a Hugging "
                        "Face folder, <its name>_attention/ in the current folder)")
    add_device(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: command(args))


def command(args: argparse.Namespace) -> int:
    from tinyattn.analysis.plotting import PlottingUnavailable, require_matplotlib
    from tinyattn.checkpoint import require_causal
    from tinyattn.data.tokenizer import warn_unknown_characters
    from tinyattn.hf.folder import load_any_model
    from tinyattn.system.device import select_device

    if args.top is not None and not args.relevance:
        raise TinyattnError(f"--top {args.top}: only with --relevance (it shortens the relevance table); "
                            "add --relevance")
    if not (args.relevance or args.html):
        try:  # before any work: a missing extra is a one-line error, which says what runs without it
            require_matplotlib()
        except PlottingUnavailable as e:
            raise PlottingUnavailable(f"{e}; --relevance and --html run without it") from None
    loaded = load_any_model(args.checkpoint, select_device(args.device))
    # Its maps would grey out, as masked, the weight a bidirectional model puts on later tokens
    require_causal(loaded, "tinyattn attention (its maps, relevance and explorer assume the causal mask)")
    model_config = loaded.config.model
    _check_index("--layer", args.layer, model_config.n_layer, "layers")
    _check_index("--head", args.head, model_config.n_head, "heads")
    text = loaded.config.train.probe_text if args.text is None else args.text
    if args.text is None and not text:
        why = (f"{loaded.label}: records no train.probe_text (a run's config does)" if loaded.hf_folder
               else f"{loaded.path}: its run sets no train.probe_text")
        raise TinyattnError(f"{why}, so there is no text to look at: give one with --text \"...\"")
    where = "train.probe_text" if args.text is None else "--text"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: bytes in the argument that were not UTF-8
        raise TinyattnError(f"{where} is not valid UTF-8 text (after {counted(e.start, 'character')}: "
                            f"{text[e.start:e.end]!r}); give it as UTF-8") from None
    # Once: the query's position and the model read the same ids; an imported folder's bos first
    # where its tokenizer puts it there, as generation and transformers read the text.
    ids = loaded.tokenizer.encode(text)
    warn_unknown_characters(loaded.tokenizer, text, ids, where)
    token_ids = loaded.tokenizer.text_start + ids
    if args.relevance or args.html:
        return _relevance_and_explorer(args, loaded, text, token_ids)
    return _heatmaps(args, loaded, text, token_ids)


def _heatmaps(args: argparse.Namespace, loaded, text: str, token_ids: list[int]) -> int:
    """The PNGs, and with --query / --query-position the query's top keys."""
    from tinyattn.analysis.attention_maps import (
        attention_maps_of_tokens,
        check_query_position,
        format_query_table,
        query_position_of_word,
        query_table,
        save_heatmaps,
    )

    maps = attention_maps_of_tokens(loaded.model, loaded.tokenizer, token_ids)
    kept, dropped = len(maps.token_ids), maps.dropped_tokens
    position = None  # in the text, as --relevance counts; then in the kept window
    if args.query is not None:
        position = query_position_of_word(loaded.tokenizer, token_ids, args.query, text=text)
    elif args.query_position is not None:
        position = check_query_position(kept + dropped, args.query_position)
    if position is not None and position < dropped:
        what = f"--query {args.query!r}" if args.query is not None else f"--query-position {args.query_position}"
        raise TinyattnError(f"{what}: token {position} of the text, in the first "
                            f"{counted(dropped, 'token')}, cut to fit the context of {kept}; shorten the "
                            "text or ask about a later token")
    position = None if position is None else position - dropped
    if dropped:
        print(f"warning: the text is {kept + dropped} tokens, longer than the context of "
              f"{kept}: kept the last {kept}", file=sys.stderr)

    out_dir = Path(args.out_dir) if args.out_dir else loaded.default_output("attention")
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
            where = f" of the kept window (token {position + dropped} of the text)" if dropped else ""
            print(f"--query {args.query!r}: its first occurrence ends in token {maps.labels[position]} "
                  f"at position {position}{where}")
        elif dropped:  # N counts in the text; the table below counts in the kept window
            print(f"--query-position {args.query_position}: token {maps.labels[position]} at position "
                  f"{position} of the kept window (token {position + dropped} of the text)")
        print(format_query_table(maps, position, query_table(maps, position, layers=layers, heads=heads)))
    return 0


def _check_index(option: str, value: int | None, count: int, what: str) -> None:
    if value is not None and not 0 <= value < count:
        raise TinyattnError(f"{option} {value}: the model has {count} {what} (0..{count - 1})")


def _relevance_and_explorer(args: argparse.Namespace, loaded, text: str, token_ids: list[int]) -> int:
    """--relevance and --html: measure once, print the table, write the page."""
    from tinyattn.analysis.ablation import format_head_ablation, format_relevance_table, relevance_of_tokens

    if args.top is not None and args.top < 1:
        raise TinyattnError(f"--top {args.top}: expected a positive number of tokens")
    position = _relevance_query(args, loaded, text, token_ids)
    rel = relevance_of_tokens(loaded.model, loaded.tokenizer, token_ids)
    if args.relevance:
        if args.query is not None:
            print(f"--query {args.query!r}: its first occurrence ends in token {rel.labels[position]} "
                  f"at position {position}")
        layers = None if args.layer is None else [args.layer]
        heads = None if args.head is None else [args.head]
        print(format_relevance_table(rel, position, args.top, layers, heads))
        print()
        print(format_head_ablation(rel))
    if args.html:
        _write_page(args, loaded, text, rel, position)
    return 0


def _relevance_query(args: argparse.Namespace, loaded, text: str, token_ids: list[int]) -> int:
    """The query's position, checked against the text (and a note when it is read in windows)."""
    from tinyattn.analysis.ablation import check_text, window_stride
    from tinyattn.analysis.attention_maps import check_query_position, query_position_of_word

    T, context = len(token_ids), loaded.config.model.context_length
    check_text(loaded.model, token_ids)  # before the query checks: they assume a text to measure
    if args.query is not None:
        position = query_position_of_word(loaded.tokenizer, token_ids, args.query, text=text)
    elif args.query_position is not None:
        position = check_query_position(T, args.query_position)
    else:
        position = T - 2  # the last token that predicts one
    if position == T - 1 and args.relevance:
        raise TinyattnError(f"the query is the text's last token (position {position}): it predicts nothing "
                            "in the text, so nothing can be relevant to it; choose an earlier one")
    if T > context:
        stride = window_stride(context)
        print(f"note: the text is {T} tokens, longer than the context of {context}: it is read in windows "
              f"of {context} tokens starting every {stride}, and each token is measured in the first window "
              f"that holds it (it reads at least {context - stride} earlier tokens; those before its window "
              "are out of its reach)", file=sys.stderr)
    return position


def _write_page(args: argparse.Namespace, loaded, text: str, rel, position: int) -> None:
    from tinyattn.analysis.explorer import write_explorer

    source = loaded.label
    shown = text if len(text) <= 80 else text[:79] + "…"
    try:
        path = write_explorer(args.html, rel, title="attention explorer: " + shown, source=source,
                              query=position, layer=args.layer, head=args.head)
    except OSError as e:
        folder = Path(args.html).parent
        why = f"{folder} is a file, not a folder" if folder.is_file() else e.strerror or e
        raise TinyattnError(f"{args.html}: cannot write the page ({why})") from None
    print(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB)")
