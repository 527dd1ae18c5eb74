"""`tinyattn lab context`: attention makes a token's representation depend on its context, measured.

The chapter's claim: 'bank' beside a river and 'bank' beside money start as one vector (the token
embedding is a table lookup) and become different ones as attention mixes in the words around
them. For one word in two or more contexts, `hidden_states` reads the residual stream at the
word's last token at every depth (layer 0: the embedding, layer i: after block i) and
`similarity_table` gives the cosine similarity of each pair of contexts at each depth: exactly
what it is at the embedding (1.0 for the same token, as the embedding holds no position:
RoPE acts inside attention), and then how far the contexts pull it apart.

It writes <out>/context.md (the table) and <out>/context.png (similarity against depth, one
line per pair), and prints the table.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from pathlib import Path

from tinyattn.config import home_path
from tinyattn.errors import TinyattnError

DEFAULT_WORD = "bank"
DEFAULT_CONTEXTS = (  # the chapter's example: two river banks, one for money
    "They sat on the river bank and watched the water.",
    "The boat drifted to the muddy bank of the stream.",
    "She paid the money into the bank on Monday.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=home_path, metavar="RUN_DIR|FILE",
                        help="a run folder, checkpoint file or Hugging Face folder; default: the best "
                             "checkpoint of the most recent run under checkpoints/")
    parser.add_argument("--word", default=DEFAULT_WORD,
                        help=f"the word to follow (default: {DEFAULT_WORD!r})")
    parser.add_argument("--context", dest="contexts", action="append", metavar="TEXT",
                        help="a text holding the word; give it twice or more (default: the chapter's "
                             "river and money sentences)")
    parser.add_argument("--out", type=home_path, metavar="DIR",
                        help="where context.md and context.png go "
                             "(default: a new checkpoints/lab/context-<date>-<time>)")


def word_position(tokenizer, context: str, word: str) -> tuple[list[int], int]:
    """The context's token ids and the position of the word's last token (its first occurrence as a
    whole word: "an" is not found in "man"). The ids begin with `tokenizer.text_start` (an imported
    folder's bos, as generation reads a text; nothing for tinyattn's own tokenizers).

    The position is the length of the start and the encoded text up to the word's end, less one; a
    tokenizer that merges the word with what follows it is refused, as no token then ends the word,
    and so is a word whose last token is the unknown one ([UNK]: the table would compare it, the
    same token for every word the tokenizer never saw, and say nothing of the word)."""
    if not word.strip():
        raise TinyattnError(f"--word {word!r}: expected a word that each context holds (e.g. --word bank)")
    found = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", context)
    start = found.start() if found else -1
    if start < 0:
        raise TinyattnError(f"--word {word!r}: not in the context {context!r}; give contexts that hold it "
                            "(--context, twice or more)")
    ids = tokenizer.encode(context)
    prefix = tokenizer.encode(context[:start + len(word)])
    if ids[:len(prefix)] != prefix:
        raise TinyattnError(f"--context {context!r}: the tokenizer merges {word!r} with the text after it; "
                            "put a space or punctuation after the word")
    unknown = getattr(tokenizer, "unknown_id", None)
    if unknown is not None and prefix and prefix[-1] == unknown:
        from tinyattn.data.tokenizer import unknown_characters

        names = ", ".join(repr(c) for c in unknown_characters(tokenizer, word)) or repr(word)
        raise TinyattnError(f"--word {word!r}: its last token in the context {context!r} is [UNK] (the "
                            f"tokenizer has never seen {names}), so the table would compare [UNK], not the "
                            "word; give a word whose last character the tokenizer has seen")
    bos = tokenizer.text_start
    return bos + ids, len(bos) + len(prefix) - 1


def compared_token(tokenizer, context: str, word: str) -> str:
    """The token whose state is compared in `context`, as text and id: the word's last token. A subword
    tokenizer may end the word in another token in another context (' king' after a space, 'king'
    after a bracket), whose states differ from the embedding on; the table names each."""
    ids, position = word_position(tokenizer, context, word)
    return f"{tokenizer.decode([ids[position]])!r} (id {ids[position]})"


def fitted_position(model, tokenizer, context: str, word: str) -> tuple[list[int], int]:
    """`word_position`'s ids and position, where the ids fit the model's context; a context longer
    than that is refused in one line naming it (its first 40 characters), its tokens and the model's.
    One of DEFAULT_CONTEXTS (no --context given) is called the default context."""
    ids, position = word_position(tokenizer, context, word)
    limit = model.config.context_length
    if len(ids) > limit:
        shown = context if len(context) <= 40 else context[:37] + "..."
        if context in DEFAULT_CONTEXTS:
            raise TinyattnError(f"the default context {shown!r} has {len(ids)} tokens, longer than the "
                                f"model's context length {limit}; give --context texts of at most "
                                f"{limit} tokens")
        raise TinyattnError(f"--context {shown!r}: {len(ids)} tokens, longer than the model's context length "
                            f"{limit}; give a shorter text")
    return ids, position


def hidden_states(model, ids: list[int], position: int):
    """(n_layer + 1, C) float64: the residual stream at `position`, at the embedding (row 0)
    and after each block (row i), read by forward hooks (the model is unchanged). `ids` fit the
    model's context (`fitted_position` refuses a text that does not)."""
    import torch

    from tinyattn.model.transformer import evaluation_mode

    captured = []
    modules = [model.token_embedding, *model.blocks]
    handles = [m.register_forward_hook(lambda _m, _inputs, output: captured.append(output[0, position]))
               for m in modules]
    try:
        device = next(model.parameters()).device
        with evaluation_mode(model), torch.no_grad():
            model(torch.tensor([ids], device=device))
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(captured).double().cpu()  # (n_layer + 1, C)


def similarity_table(model, tokenizer, word: str, contexts: list[str]):
    """Cosine similarity of the word's hidden state between each pair of contexts, by depth.

    Returns (pairs, table): pairs [(i, j), ...] of context indices, and a (n_layer + 1, pairs)
    float64 numpy array, row 0 the embedding, row i after block i."""
    import torch
    import torch.nn.functional as F

    if len(contexts) < 2:
        raise TinyattnError(f"--context: {len(contexts)} given; give at least two texts holding {word!r}")
    states = [hidden_states(model, *fitted_position(model, tokenizer, text, word)) for text in contexts]
    pairs = list(itertools.combinations(range(len(contexts)), 2))
    one = torch.tensor(1.0, dtype=torch.float64)
    below_one = torch.nextafter(one, torch.zeros_like(one))  # the largest float64 below 1
    columns = []
    for i, j in pairs:
        # The same vector is exactly 1; the cosine's rounding can give 1 +- 1e-16 for it, and 1 or more
        # for two vectors that differ only in their last bits, which is printed just below 1.
        same = (states[i] == states[j]).all(dim=-1)  # (L + 1,)
        cosine = F.cosine_similarity(states[i], states[j], dim=-1).clamp(max=below_one)  # (L + 1,)
        columns.append(torch.where(same, torch.ones_like(cosine), cosine))
    return pairs, torch.stack(columns, dim=1).numpy()  # (L + 1, pairs)


def format_table(word: str, contexts: list[str], pairs, table, *, tokens: list[str]) -> str:
    """The markdown table `run` prints and writes: one row per depth, one column per pair; the legend
    names each context's compared token (`tokens`, from `compared_token`)."""
    legend = "\n".join(f"- context {i + 1}: {text!r}; compared token {token}"
                       for i, (text, token) in enumerate(zip(contexts, tokens)))
    head = "| depth | " + " | ".join(f"cos(context {i + 1}, {j + 1})" for i, j in pairs) + " |"
    lines = [f"{word!r} at its last token\n\n{legend}\n", head, "| --- |" + " ---: |" * len(pairs)]
    for depth, row in enumerate(table):
        name = "embedding" if depth == 0 else f"after block {depth}"
        lines.append(f"| {name} | " + " | ".join(format_similarity(value) for value in row) + " |")
    return "\n".join(lines)


def format_similarity(value: float) -> str:
    """A cosine similarity as the table prints it: four decimals, but `1 (exactly)` for an exact 1 and
    `1 - 1.2e-05` for one that four decimals would round to 1.0000, so a learner sees which
    states are the same vector and which only nearly (after block 1 they differ by ~1e-5)."""
    if value == 1.0:
        return "1 (exactly)"
    if f"{value:.4f}" != "1.0000":
        return f"{value:.4f}"
    return f"1 {'-' if value < 1 else '+'} {abs(1.0 - value):.1e}"


def save_figure(word: str, pairs, table, path: Path) -> Path:
    from tinyattn.analysis.plotting import new_figure

    figure = new_figure(6.0, 4.0, 100, layout="constrained")
    axes = figure.subplots()
    depths = range(len(table))
    for column, (i, j) in enumerate(pairs):
        axes.plot(depths, table[:, column], marker="o", label=f"contexts {i + 1} and {j + 1}")
    axes.set_xticks(list(depths), ["emb"] + [str(d) for d in depths][1:])
    axes.set(xlabel="depth (blocks)", ylabel="cosine similarity",
             title=f"{word!r}: one token, different contexts")
    axes.legend(fontsize=8)
    figure.savefig(path)
    return path


def run(args: argparse.Namespace) -> int:
    from tinyattn.analysis.plotting import require_matplotlib
    from tinyattn.checkpoint import require_causal
    from tinyattn.data.tokenizer import warn_unknown_characters
    from tinyattn.hf.folder import load_any_model
    from tinyattn.lab.outputs import command_started, stopped_before_writing

    started = command_started()  # the command's, start-up included
    require_matplotlib()  # before any work: without it context.png cannot be drawn (one line)
    contexts = args.contexts or list(DEFAULT_CONTEXTS)
    with stopped_before_writing("context"):  # nothing is written before the table is measured
        loaded = load_any_model(args.checkpoint)
        # A bidirectional model's word has read the text after it too: the table's reading (the state
        # holds the word and what came before it) would not hold.
        require_causal(loaded, "tinyattn lab context (it reads what the text before a word makes of it)")
        for context in contexts:  # a word read as [UNK] refused; other unknown characters named (as generate)
            ids, _ = word_position(loaded.tokenizer, context, args.word)
            warn_unknown_characters(loaded.tokenizer, context, ids, f"--context {context!r}")
        pairs, table = similarity_table(loaded.model, loaded.tokenizer, args.word, contexts)
    from tinyattn.lab.outputs import experiment_folder

    out = experiment_folder(args.out, "context")
    out.mkdir(parents=True, exist_ok=True)
    tokens = [compared_token(loaded.tokenizer, context, args.word) for context in contexts]
    text = format_table(args.word, contexts, pairs, table, tokens=tokens)
    figure = save_figure(args.word, pairs, table, out / "context.png")
    (out / "context.md").write_text(f"# tinyattn lab context: {loaded.label}\n\n{text}\n",
                                    encoding="utf-8")
    print(f"{loaded.label}\n{text}")
    print(f"wrote {out / 'context.md'} and {figure} in {time.perf_counter() - started:.1f} s")
    return 0
