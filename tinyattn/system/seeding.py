"""Seeds and random states: every global generator seeded at once, saved and restored.

A checkpoint keeps `random_states()` so that a resumed run draws the same dropout masks
and batches as a run that never stopped; the states are kept in types that
`torch.load(weights_only=True)` accepts.
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed a rank above 0 of a torchrun run draws its dropout masks from at `step`.

    Every rank seeds alike (the model starts the same everywhere), so without this each rank
    would drop the same elements of its own batch. A function of (seed, rank, step), not a
    stream: a resume draws what the run it continues drew, with nothing more to keep."""
    return int(np.random.SeedSequence([seed % 2**64, rank, step]).generate_state(1, np.uint64)[0] >> 1)


def random_states(device: Optional[torch.device] = None) -> dict:
    """Every global random generator's state, in types `torch.load(weights_only=True)` accepts.

    CUDA's: the generator of `device` (None: the current GPU), the one a run there draws from,
    as a list of one state. Under torchrun the checkpoint keeps rank 0's: the other ranks seed
    their draws at each step (`rank_seed`). Not every GPU's: a machine with fewer could not take
    them back, and rank 0's process holds the other GPUs' generators as seeded, not as drawn."""
    numpy_state = np.random.get_state()
    python_version, python_keys, gauss_next = random.getstate()
    states = {
        # The Mersenne Twister's 625 words as one tensor: as a tuple, every checkpoint's save and
        # load pickled each word as an object of its own (a large share of a small model's load)
        "python": {"version": python_version, "keys": torch.tensor(python_keys, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"name": numpy_state[0], "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
                  "pos": int(numpy_state[2]), "has_gauss": int(numpy_state[3]),
                  "cached_gaussian": float(numpy_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        states["cuda"] = [torch.cuda.get_rng_state(device if device is not None else "cuda")]
    return states


def set_random_states(states: dict, device: Optional[torch.device] = None) -> None:
    """`random_states`' states back; CUDA's into the generator of `device` (None: the current GPU)."""
    python = states["python"]
    if isinstance(python, dict):
        random.setstate((python["version"], tuple(python["keys"].tolist()), python["gauss_next"]))
    else:  # written before 2026-12-07: the tuple random.getstate() gives (lists once loaded)
        random.setstate(_as_tuple(python))
    n = states["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    saved = states.get("cuda")
    if saved and torch.cuda.is_available() and (device is None or device.type == "cuda"):
        index = torch.cuda.current_device() if device is None or device.index is None else device.index
        # Several: an older checkpoint, with every GPU's; this device's where it is among them.
        torch.cuda.set_rng_state(saved[index] if 1 < len(saved) and index < len(saved) else saved[0],
                                 torch.device("cuda", index))


def _as_tuple(value):
    """random.setstate wants tuples all the way down; a saved state may come back as lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value
