"""Text in, token batches out: `prepare_data`, the batch sampler and the evaluation windows.

`prepare_data(config)` turns the `data:` and `tokenizer:` sections of a config into two flat
token files, one per split, memory-mapped for training:

1. Source (`tinyattn.data.sources`): a hub dataset or local files (text, JSON lines, CSV, TSV,
   Parquet, compressed or not).
2. Split (`tinyattn.data.splits`): the dataset's own validation split, every tenth document, or
   for one long text its last tenth of characters.
3. Tokenizer, trained on the training split only (`tinyattn.data.tokenizer`).
4. Token cache (`tinyattn.data.token_cache`): one flat uint16/uint32 file per split, keyed by
   everything that produced it, rebuilt when any of that changes or a file fails its checksum.

`BatchSampler` draws random training windows; `eval_batches` walks fixed ones, and
`tail_window` holds the targets after the last full one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from tinyattn.config import SAMPLINGS, Config
from tinyattn.data.sources import resolve_source
from tinyattn.data.splits import split
from tinyattn.data.token_cache import TokenCache, check_split_lengths, data_fingerprint
from tinyattn.data.tokenizer import Tokenizer
from tinyattn.errors import DataError, counted

# The passes whose starts a sampler keeps (and saves). It needs only the pass its next window falls
# in; the rest is a record of where a run's passes ended, whole for a run over a text of thousands
# of windows a pass (it makes tens), and bounded for a text of a few, where a pass begins every few
# windows drawn and the whole list grew the state and each batch's search without end.
PASSES_KEPT = 1000


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # memmap, uint16 or uint32, flat tokens
    validation: np.ndarray
    cache_dir: Path
    fingerprint: dict = field(default_factory=dict)  # what the data is (token_cache.data_fingerprint)


def prepare_data(config: Config, *, progress: bool = True) -> TokenData:
    """Tokenize the configured corpus once into a cache folder and memory-map it.

    Uses `config.data`, `config.tokenizer`, and `config.model.context_length` (each split
    must hold at least one window of context_length + 1 tokens).
    """
    source = resolve_source(config.data, progress)
    cache = TokenCache(source, config)
    meta = cache.trusted_meta()
    if meta is None:
        splits = split(source, config.data)  # first: a source that cannot be read makes no cache folder
        # meta: a cache another process completed (waited for or not), else None
        with cache.sole_builder() as meta:
            if meta is None:
                meta = cache.build(splits.train, splits.validation, splits.rule, config, progress)
                check_split_lengths(meta, config)  # before meta.json: short splits are never trusted
                cache.commit(meta)
    check_split_lengths(meta, config)
    folder = cache.folder
    return TokenData(
        tokenizer=Tokenizer.from_file(folder / "tokenizer.json", config.tokenizer.end_of_text,
                                      stop_tokens=config.tokenizer.stop_tokens),
        train=np.memmap(folder / "train.bin", dtype=meta["dtype"], mode="r"),
        validation=np.memmap(folder / "validation.bin", dtype=meta["dtype"], mode="r"),
        cache_dir=folder,
        fingerprint=data_fingerprint(meta),
    )


# ----------------------------------------------------------------------------- batches


class BatchSampler:
    """Windows of context_length + 1 tokens -> (x, y) int64 tensors of shape (B, T),
    y = x shifted by one.

    sampling "random": batch k of rank r is drawn by a numpy Generator seeded with
    (seed, r, k). Windows may overlap and repeat; with far more windows than draws that
    costs nothing and keeps sampling O(batch) instead of O(corpus).
    sampling "passes": pass p over the text cuts it into non-overlapping windows from an
    offset below T, and visits them in an order, both drawn from (seed, p) (`_pass_starts`);
    the ranks deal the windows of one sequence between them (rank r takes batches r, r + W,
    ...). Every window of a pass is seen once before any is seen again; a pass holds at most
    len / T windows, and its order is made when it begins (O(corpus / T) memory).
    The passes end with the run: told how many batches the run is planned to draw yet
    (`plan_end`, before each step), the sampler shares the windows left between the fewest
    passes that hold them, in equal parts, so the run's last window is a pass's last (validation is lowest
    at the end of a pass, where the windows seen longest ago come: docs/BENCHMARKS.md).
    A pass's end is placed only when the windows reach it, from the plan then; the last
    pass follows the plan to the end (up to a whole pass).

    Either way the state is the number of batches drawn, and for passes the windows all ranks
    have drawn and where the last PASSES_KEPT passes began, with how many began before them:
    `state_dict` saves them, a resumed run draws exactly the batches it would have drawn, and
    any rank can resume from the state rank 0 saved (the rank is not restored from it, so ranks
    keep drawing different windows). A run resumed with another batch size or number of ranks
    goes on from the window the passes stood at: no window of a pass is left out or seen twice.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, context_length: int, *, seed: int,
                 rank: int = 0, world_size: int = 1, sampling: str = "random"):
        if len(tokens) < context_length + 1:
            raise DataError(f"{counted(len(tokens), 'token')} cannot fill one window of "
                            f"model.context_length + 1 = {context_length + 1}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling {sampling!r}: expected one of {', '.join(SAMPLINGS)}")
        if sampling == "passes" and len(tokens) < 2 * context_length:
            raise DataError(f"{counted(len(tokens), 'token')} cannot fill a pass of train.sampling: "
                            f"passes (it needs at least 2 * model.context_length = {2 * context_length}); "
                            "set train.sampling: random")
        self.tokens = tokens
        self.batch_size = batch_size
        self.context_length = context_length
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.sampling = sampling
        self.batches_drawn = 0
        self.windows_drawn = 0  # by all ranks: where their next batches begin in the sequence of all passes
        self._offsets = np.arange(context_length + 1)  # (T+1,)
        self._per_pass = (len(tokens) - context_length) // context_length  # windows in a whole pass
        self._pass = (-1, None)  # (pass number, its window starts in visiting order)
        self.pass_starts = [0]  # the window (in the sequence of all passes) each of the last passes began at
        self.passes_before = 0  # the passes that began before pass_starts[0]: it is pass passes_before
        self.end: Optional[int] = None  # the window the run is planned to end before (None: not told)

    def plan_end(self, batches_left: int) -> None:
        """The run is planned to end after this rank has drawn `batches_left` more batches (the
        Trainer says so before every step; a time budget not yet measured says the step it is at;
        below 0 where a plan shrank past what was drawn). Counted from the windows drawn, at this
        batch size: a resume may have changed it, or the micro-batches a step draws."""
        self.end = self.windows_drawn + batches_left * self.world_size * self.batch_size

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sampling == "passes":
            # Every rank places the pass ends through the windows all ranks draw now, from the
            # same plan: their passes agree.
            first = self.windows_drawn
            self._place_pass_ends(first, first + self.world_size * self.batch_size - 1)
            mine = first + self.rank * self.batch_size  # in the sequence all ranks deal from
            starts = self._pass_window_starts(mine + np.arange(self.batch_size))  # (B,)
            self._keep_the_last_passes()
        else:
            # SeedSequence needs non-negative entropy; the modulo maps a negative seed into range.
            rng = np.random.default_rng([self.seed % (1 << 64), self.rank, self.batches_drawn])
            starts = rng.integers(0, len(self.tokens) - self.context_length, size=self.batch_size)  # (B,)
        self.batches_drawn += 1
        self.windows_drawn += self.world_size * self.batch_size
        # One fancy-indexing gather: numpy reads only the pages these windows touch, so the
        # memmap is never loaded whole and no Python loop runs over tokens.
        windows = self.tokens[starts[:, None] + self._offsets].astype(np.int64)  # (B, T+1)
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (B, T)
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (B, T)
        return x, y

    def _place_pass_ends(self, first: int, last: int) -> None:
        """Begins the passes that windows first..last (those drawn now) fall in.

        A pass ends after `_pass_length` windows, but never before `first`: windows already
        drawn stay in the pass they were drawn in.
        """
        while True:
            start = self.pass_starts[-1]
            end = max(start + self._pass_length(start), first)
            if end > last:
                return
            self.pass_starts.append(end)

    def _keep_the_last_passes(self) -> None:
        """Forgets the starts of all but the last PASSES_KEPT passes. Only the last is looked at
        again: the windows drawn from now on lie in it or in passes that begin later."""
        forget = len(self.pass_starts) - PASSES_KEPT
        if forget > 0:
            del self.pass_starts[:forget]
            self.passes_before += forget

    def _pass_length(self, start: int) -> int:
        """Windows in the pass that begins at window `start`: those the plan leaves, shared
        equally between the fewest passes that hold them; a whole pass without a plan, or
        where the plan leaves none (a run that goes on past it, or a budget still measuring)."""
        left = None if self.end is None else self.end - start
        if left is None or left <= 0:
            return self._per_pass
        passes = -(-left // self._per_pass)  # the fewest that hold what is left
        return -(-left // passes)

    def _pass_window_starts(self, windows: np.ndarray) -> np.ndarray:
        """Start tokens of windows (their numbers in the sequence of all passes), (B,) -> (B,)."""
        kept = np.searchsorted(self.pass_starts, windows, side="right") - 1  # (B,): the pass, of those kept
        within = windows - np.asarray(self.pass_starts)[kept]  # (B,): the place in it
        starts = np.empty_like(windows)
        for number in np.unique(kept):  # one pass, or two where the batch crosses into the next
            chosen = kept == number
            starts[chosen] = self._pass_starts(self.passes_before + int(number))[within[chosen]]
        return starts

    def _pass_starts(self, number: int) -> np.ndarray:
        """Pass `number`'s window starts in visiting order: offset + T * (a permutation of the windows).

        With offset < T, the last window ends at most at token per_pass * T + T <= len(tokens).
        """
        if self._pass[0] != number:
            # Seeded by (seed, 2, pass), not by the rank: every rank deals from the same sequence.
            rng = np.random.default_rng([self.seed % (1 << 64), 2, number])
            offset = int(rng.integers(0, self.context_length))
            self._pass = (number, offset + self.context_length * rng.permutation(self._per_pass))
        return self._pass[1]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches_drawn": self.batches_drawn, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size,
                "windows_drawn": self.windows_drawn, "pass_starts": list(self.pass_starts),
                "passes_before": self.passes_before}

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` saved. A state saved before it held the windows drawn gives
        them as its batches times its world size times its batch size (where it holds none, the
        given one: `Trainer.load_state_dict` gives the checkpoint's config's, else this sampler's);
        one saved before it kept only the last passes' starts held every pass's."""
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])
        batch_size = int(state.get("batch_size", self.batch_size))
        before = self.batches_drawn * state["world_size"] * batch_size  # a state without windows_drawn
        self.windows_drawn = int(state.get("windows_drawn", before))
        self.passes_before = int(state.get("passes_before", 0))
        if "pass_starts" in state:
            self.pass_starts = [int(start) for start in state["pass_starts"]]
        elif self._per_pass > 0:  # saved before passes could end early: every pass so far was whole
            begun = -(-self.windows_drawn // self._per_pass)  # those that began before the next window
            self.passes_before = max(0, begun - PASSES_KEPT)
            self.pass_starts = [number * self._per_pass for number in range(self.passes_before, begun)] or [0]
        else:  # a text too short for a pass, which only random sampling takes: it has none
            self.pass_starts = [0]
        self._keep_the_last_passes()  # a state saved before they were forgotten holds them all
        self._pass = (-1, None)  # made again from the restored seed


def full_window_count(n_tokens: int, context_length: int) -> int:
    """How many non-overlapping windows of context_length inputs, each with the target after it, fit."""
    return max(0, n_tokens - 1) // context_length


def tail_window(tokens, context_length: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The (1, r) window of the r < context_length targets after all full windows, or None."""
    start = full_window_count(len(tokens), context_length) * context_length
    if start >= len(tokens) - 1:
        return None
    chunk = torch.from_numpy(np.asarray(tokens[start:], dtype=np.int64))
    return chunk[:-1].unsqueeze(0), chunk[1:].unsqueeze(0)  # (1, r) each


def eval_batches(tokens: np.ndarray, context_length: int, batch_size: int,
                 max_windows: Optional[int] = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed evaluation windows -> (x, y) int64 tensors of shape (b, T), b <= batch_size.

    All non-overlapping windows in order, or `max_windows` of them spread evenly from the
    first token to the last; either way the same tokens every call, so the same model
    always gets the same loss.
    """
    T = context_length
    available = full_window_count(len(tokens), T)
    if available == 0:
        raise DataError(f"{counted(len(tokens), 'token')} cannot fill one window of "
                        f"model.context_length + 1 = {T + 1}")
    if max_windows is None or max_windows >= available:
        starts = np.arange(available, dtype=np.int64) * T
    else:
        starts = np.linspace(0, len(tokens) - T - 1, max_windows).round().astype(np.int64)
    offsets = np.arange(T + 1)
    for first in range(0, len(starts), batch_size):
        windows = tokens[starts[first:first + batch_size, None] + offsets].astype(np.int64)  # (b, T+1)
        yield (torch.from_numpy(np.ascontiguousarray(windows[:, :-1])),
               torch.from_numpy(np.ascontiguousarray(windows[:, 1:])))
