"""Settings that follow the passes a run makes over its training text.

Overfitting follows the passes a run makes, so the config's tables by passes
(`train.dropout_by_passes`, `train.floor_by_passes`, `train.decay_by_passes`; config.PASS_TABLES)
set the dropout, the schedule's floor and the weight decay from the count: the faster the
machine, the more steps fit, and the more dropout and decay the model gets (and, where the
table says so, the higher its rate stays at the end).

- `entry_for`: the rule: the entry with the most passes at or below the count.
- `PassTables`: the tables in play, and what the floor's and the decay's make of a count.
- `PassChoices`: what a new run chose from them (None: left as the config has it).
- `choose_by_steps`: the choices of a run of train.max_steps, from the passes its steps make.
  A time budget's calibration (`budget.Calibration`) counts the passes that fit instead, and
  measures a dropout's dearer step before it takes the dropout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from tinyattn.config import TrainConfig

if TYPE_CHECKING:
    from tinyattn.train.trainer import Trainer


def entry_for(table: dict[float, float], passes: float, *, below: Optional[float] = None) -> Optional[float]:
    """What a table keyed by passes (one of config.PASS_TABLES) gives a run that expects
    `passes` over its text: the entry with the most passes at or below
    `passes` (and under `below`, where given); None when no entry is that low (or none)."""
    reached = [key for key in table if key <= passes and (below is None or key < below)]
    return table[max(reached)] if reached else None


@dataclass
class PassChoices:
    """What the tables chose for a new run: the passes it expects at the model's own dropout, and
    the dropout, the schedule's floor and the weight decay it is to take (None: unchanged)."""

    passes: float
    dropout: Optional[float] = None
    min_lr: Optional[float] = None
    weight_decay: Optional[float] = None
    tried: Optional[tuple[float, float]] = None  # a dropout the model was measured with, and its passes
    below: Optional[float] = None  # that dropout was not taken: the tables read their entries under this

    @property
    def passes_chosen(self) -> float:
        """The passes the tables read: the run's with the dropout chosen."""
        return self.tried[1] if self.dropout is not None and self.tried else self.passes


def shown_passes(passes: float, digits: int, tables: "PassTables") -> str:
    """`passes` to `digits` decimals as a line shows it, on the same side of every entry of the
    tables as the count itself: rounded down where rounding would reach an entry the count falls
    short of, and with more decimals where the shown count would fall below an entry the count
    reaches (one with more decimals than the line shows, or one the count is exactly at that
    rounds to even below it) or entries closer together than the line's decimals leave no count.
    A count above zero never reads as none: a vast corpus under a short budget shows its first
    digit ("about 0.003 passes", not "about 0.0")."""
    entries = {key for table in tables.by_name.values() for key in table}
    for places in range(digits, digits + 4):
        for value in (passes, math.floor(passes * 10 ** places) / 10 ** places):
            text = f"{value:.{places}f}"
            shown = float(text)
            same_side = all((passes >= key) == (shown >= key) for key in entries)
            if same_side and (passes > 0) == (shown > 0):
                return text
    return str(passes)  # exact


class PassTables:
    """The tables by passes in play (config.PASS_TABLES; {} for one whose key --set gave).

    `choose` gives what the floor's and the decay's tables make of a count of passes, against
    what `config` holds now. The dropout's table is read by the caller: under a budget its entry
    changes the step's cost and so the passes (`budget.Calibration`).
    """

    def __init__(self, config: TrainConfig, *, dropout_by_passes: Optional[dict[float, float]] = None,
                 floor_by_passes: Optional[dict[float, float]] = None,
                 decay_by_passes: Optional[dict[float, float]] = None):
        self.config = config
        self.by_name = {"dropout_by_passes": dropout_by_passes or {}, "floor_by_passes": floor_by_passes or {},
                        "decay_by_passes": decay_by_passes or {}}

    def __bool__(self) -> bool:
        return any(self.by_name.values())

    @property
    def dropout_by_passes(self) -> dict[float, float]:
        return self.by_name["dropout_by_passes"]

    def choose(self, passes: float, dropout: Optional[float] = None, *, own_passes: Optional[float] = None,
               tried: Optional[tuple[float, float]] = None, below: Optional[float] = None) -> PassChoices:
        """The choices for `passes` (the passes of the model chosen), with the dropout the caller
        chose: train.min_lr and train.weight_decay by `entry_for` (only the entries under `below`,
        where given), each None where it leaves the config's value as it is. Nothing is set here:
        a budget's snapshot, put back after measuring, would undo it (the loop takes them, and
        config.yaml records them). own_passes: the passes at the model's own dropout (default
        `passes`)."""
        share = entry_for(self.by_name["floor_by_passes"], passes, below=below)
        min_lr = None if share is None else share * self.config.lr
        decay = entry_for(self.by_name["decay_by_passes"], passes, below=below)
        return PassChoices(passes if own_passes is None else own_passes, dropout,
                           None if min_lr == self.config.min_lr else min_lr,
                           None if decay == self.config.weight_decay else decay, tried, below)


def choose_by_steps(trainer: Trainer, tables: PassTables) -> PassChoices:
    """What the tables give a new run of train.max_steps: the passes its steps make over the
    training text, counted exactly (a dropout does not change the count)."""
    passes = trainer.config.max_steps * trainer.tokens_per_step / len(trainer.batches.tokens)
    dropout = entry_for(tables.dropout_by_passes, passes)
    return tables.choose(passes, None if dropout == trainer.model.dropout.p else dropout)
