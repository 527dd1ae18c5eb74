"""What an evaluation shows beyond the validation loss: the hooks `train.show` names.

The training core computes the validation loss (by position, `owners.Evaluator`); whatever
else an evaluation shows is a hook the config lists, e.g. `train.show: [sample,
loss_by_position, attention, head_ablation]` (the names: `config.SHOW_HOOKS`). A hook is a
function `hook(shown: Shown) -> None` called on the main process after each evaluation.

`IMPLEMENTATIONS` names where each hook lives as "module:function". A module is imported
only when a run lists one of its hooks, so `import tinyattn.train.loop` loads no analysis,
generation, plotting or Hugging Face code (tests/test_train.py pins that closure), and a
run whose config lists no hook runs none. Each hook lives with what it shows: the sample in
`tinyattn.generate.training_hooks`, the analysis in `tinyattn.analysis.training_hooks`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch.nn as nn

from tinyattn.config import Config

IMPLEMENTATIONS = {  # train.show name -> "module:function"
    "sample": "tinyattn.generate.training_hooks:show_sample",
    "loss_by_position": "tinyattn.analysis.training_hooks:show_loss_by_position",
    "attention": "tinyattn.analysis.training_hooks:show_attention",
    "head_ablation": "tinyattn.analysis.training_hooks:show_head_ablation",
}


@dataclass
class Shown:
    """What a hook is handed at one evaluation."""

    step: int
    model: nn.Module  # the plain LanguageModel (never a compiled or DDP wrapper)
    tokenizer: Any
    config: Config
    position_losses: np.ndarray  # (context_length,): the validation loss at each position
    writer: Any  # the run's TensorBoard SummaryWriter, or `DISCARD`
    run_dir: Optional[Path]  # where a hook may write files; None: write none


Hook = Callable[[Shown], None]


class _Discard:
    """A writer that keeps nothing: the time budget times the hooks without logging them."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


DISCARD = _Discard()


def resolve(path: str) -> Callable:
    """The function a "module:function" path names, importing its module."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def resolve_hooks(names: Iterable[str]) -> list[Hook]:
    """The hooks `train.show` lists, in its order (the config has checked the names)."""
    return [resolve(IMPLEMENTATIONS[name]) for name in names]
