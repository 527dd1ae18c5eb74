"""Optimizers and learning-rate schedules: how the weights move, and how fast, at each step.

- `lr_factor(step, config)`: the schedule, a multiplier in [min_lr / lr, 1] applied to every
  parameter group's own base rate (so AdamW and Muon groups follow one schedule).
  Warmup is linear from near 0; then `cosine` or `linear` decay to the floor over the
  whole run, `constant`, or `wsd` (warmup-stable-decay): the full rate until the last
  `train.decay_fraction` of the run, then a linear decay to the floor. WSD trains at
  the full rate for longest and suits a run whose length is fixed late (a time budget).
- `progress_lr_factor(step, progress, config)`: the same shapes for a run whose length is
  not a step count (train.time_budget): after warmup (still by step) they follow a
  recorded progress p in [0, 1] that `budget.TimePlan` advances by the time left.
- `StepPlan`: what the trainer asks for its rate and its end when the run is train.max_steps
  long (`budget.TimePlan` answers the same questions under a time budget).
- `build_optimizer(model, config, ...)`: the parameter groups and their optimizers.
  `adamw`: AdamW everywhere, weight decay on matrices only. `muon`: Muon for the
  matrices inside the blocks (attention and MLP projections), AdamW for the token
  embedding, the output head and the norm gains, which Muon does not suit (an embedding
  row is updated only when its token appears; a gain is not a matrix).
- `Muon`: momentum SGD whose update for each matrix is replaced by the nearest
  orthogonal matrix (all singular values set to 1), computed by a few Newton-Schulz
  iterations. Every direction of the update then moves at the same rate, so rare
  directions learn as fast as common ones. Same-shaped matrices are orthogonalised
  together in one batched matmul chain.

The embedding and head may have their own rates (`train.embedding_lr`, `train.head_lr`):
they see one row per token, not every row every step, and often want a larger one.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
import torch.nn as nn

from tinyattn.config import TrainConfig, duration_text
from tinyattn.errors import counted

# ----------------------------------------------------------------------------- schedule


def lr_factor(step: int, config: TrainConfig) -> float:
    """The learning rate at `step` (0-based) as a fraction of the peak rate, for a run of
    train.max_steps steps: the last step, train.max_steps - 1, trains at the floor, and so does any
    step past it. cosine and linear start from the peak on the step after warmup (where that step
    is the last, it takes the floor); wsd's decay takes the last round(decay_fraction x max_steps)
    steps (none inside warmup), each one share lower."""
    floor = config.min_lr / config.lr
    last = config.max_steps - 1  # the last step trains at the floor
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    if config.schedule == "wsd":
        decay_steps = max(1, round(config.decay_fraction * config.max_steps))
        decay_start = max(config.warmup_steps, config.max_steps - decay_steps)
        if step < decay_start:
            return 1.0
        # The decay's steps decay_start..last each step down by one share, the last to the floor.
        progress = min(1.0, (step - decay_start + 1) / max(1, config.max_steps - decay_start))
        return floor + (1.0 - progress) * (1.0 - floor)
    span = last - config.warmup_steps  # the steps after warmup's first one
    progress = min(1.0, (step - config.warmup_steps) / span) if span > 0 else 1.0
    return floor + _decay(progress, config.schedule) * (1.0 - floor)


def progress_lr_factor(step: int, progress: float, config: TrainConfig) -> float:
    """The learning rate at `step` as a fraction of the peak rate, when `progress` in [0, 1] is
    the share of the run after warmup done so far (a time budget's `TimePlan` keeps it).

    Warmup still counts steps. cosine and linear span progress 0 -> 1; wsd holds the full rate
    until progress 1 - decay_fraction, then decays linearly: the decay is the last
    decay_fraction of the run after warmup, placed by the progress, hence by the time left.
    """
    floor = config.min_lr / config.lr
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, progress))
    if config.schedule == "wsd":
        decay_start = 1.0 - config.decay_fraction
        if progress <= decay_start:
            return 1.0
        return floor + (1.0 - (progress - decay_start) / config.decay_fraction) * (1.0 - floor)
    return floor + _decay(progress, config.schedule) * (1.0 - floor)


def warmup_warning(config: TrainConfig, steps: int, budget: Optional[str] = None) -> Optional[str]:
    """One line when train.warmup_steps is not below the `steps` the run takes (under the time
    budget `budget`, its first estimate): the rate would end still warming up, never decayed.
    A budget does not shorten warmup to fit: warmup counts steps, and a step count taken from
    a first estimate would make the schedule depend on the machine's speed; it warns instead."""
    if config.warmup_steps < steps:
        return None
    reached = steps / config.warmup_steps
    run, longer = ((f"about {counted(steps, 'step')} the {duration_text(budget)} budget first fits",
                    "a longer train.time_budget")
                   if budget is not None
                   else (f"{counted(steps, 'step')} of train.max_steps", "more train.max_steps"))
    ends = ("reaches its peak only at the last step" if reached >= 1
            else f"ends still warming up, at {reached:.0%} of its peak,")
    return (f"warning: train.warmup_steps={config.warmup_steps} is not below the {run}: the rate {ends} "
            f"and never decays; give fewer warmup steps "
            f"(--set train.warmup_steps={max(1, steps // 10)}) or {longer}")


def _decay(progress: float, schedule: str) -> float:
    """cosine or linear: 1 at progress 0, 0 at progress 1."""
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress  # linear


class StepPlan:
    """The rate and the end of a run of train.max_steps steps: `lr_factor` of the step.

    `budget.TimePlan` has the same methods; this one measures nothing and its state is only
    its kind, so a run of a step count behaves (and checkpoints) as it always did.
    """

    kind = "steps"

    def __init__(self, config: TrainConfig):
        self.config = config

    def factor(self, step: int) -> float:
        return lr_factor(step, self.config)

    def done(self, step: int) -> bool:
        return step >= self.config.max_steps

    def no_step_fits(self, step: int) -> bool:
        return False  # a step count has no time to run out of

    def total_steps(self, step: int) -> int:
        return self.config.max_steps

    def start(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def measuring(self, kind: str):
        return nullcontext()

    def note(self, step: int) -> Optional[str]:
        return None

    def describe(self) -> Optional[str]:
        return None

    def state_dict(self) -> dict:
        return {"kind": self.kind, "ends_at_floor": True}  # the schedule since 2026-12-05 (`floor_note`)

    def load_state_dict(self, state: dict) -> None:
        pass


def learning_rate(step: int, config: TrainConfig) -> float:
    """The peak-rate group's learning rate at `step`: lr * lr_factor."""
    return config.lr * lr_factor(step, config)


def set_learning_rates(optimizers: list[torch.optim.Optimizer], factor: float) -> None:
    """Every group's lr = its base lr * factor. The base is set when the optimizer is built
    (`build_optimizer`); a group without one takes its lr at the first call as its base."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = group.setdefault("base_lr", group.get("lr", 0.0)) * factor


# ----------------------------------------------------------------------------- Muon


def newton_schulz(grads: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise each matrix of a stack: (N, rows, cols) -> same shape.

    The quintic iteration X <- aX + b(XX^T)X + c(XX^T)^2 X with (a, b, c) =
    (3.4445, -4.7750, 2.0315) (Keller Jordan's Muon) pushes every singular value of X
    towards 1 after X is scaled to spectral norm <= 1 (by its Frobenius norm). It
    converges only roughly (to [0.7, 1.2]), which is enough for an update direction and
    takes 5 steps instead of ~15. Each step is three batched matmuls, the sums folded into
    them (`baddbmm`) rather than made by separate elementwise passes. Runs in the input's
    dtype: bf16 where the hardware has fast bf16, fp32 elsewhere (emulated bf16 is many times
    slower; docs/BENCHMARKS.md).
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    x = grads
    transposed = x.size(-2) > x.size(-1)
    if transposed:  # iterate on the wide orientation: (rows x rows) Gram matrices are smaller
        x = x.transpose(-2, -1)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)  # (N, r, r)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b * gram + c * gram @ gram
        x = torch.baddbmm(x, poly, x, beta=a)  # a * x + poly @ x
    return x.transpose(-2, -1) if transposed else x


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weight matrices: momentum, then the orthogonalised direction.

    A group's optional "rows" lists, per parameter, how its rows split into the separate
    matrices it stacks (None: one matrix); each is orthogonalised on its own, as it would be
    if it were its own parameter. The update of a (rows, cols) matrix is scaled by
    0.2 * sqrt(max(rows, cols)), which
    gives it about the root-mean-square size of an AdamW update; Muon's lr therefore
    sits in AdamW's range (Moonshot's "match RMS" rule, `adjust_lr_fn="match_rms_adamw"`
    in torch.optim.Muon). Weight decay is decoupled, as in AdamW.
    """

    def __init__(self, params, *, lr: float = 1e-3, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, ns_steps: int = 5, ns_dtype: torch.dtype = torch.float32):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay, ns_steps=ns_steps))
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon updates matrices only; got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            momenta = {p: self._momentum(p, group) for p in group["params"] if p.grad is not None}
            rows_of = dict(zip(group["params"], group.get("rows") or [None] * len(group["params"])))
            # Each matrix a weight holds (several when stacked), grouped by shape so that
            # same-shaped ones are orthogonalised together in one batched chain.
            pieces = {p: m.split(rows_of[p] or (m.size(0),)) for p, m in momenta.items()}
            by_shape: dict[tuple, list[torch.Tensor]] = {}
            for piece in (piece for parts in pieces.values() for piece in parts):
                by_shape.setdefault(tuple(piece.shape), []).append(piece)
            done = {}
            for shape, same in by_shape.items():
                updates = newton_schulz(torch.stack(same).to(self.ns_dtype), group["ns_steps"])  # (N, rows, cols)
                scale = 0.2 * math.sqrt(max(shape))
                done.update({id(piece): (update.to(piece.dtype), scale) for piece, update in zip(same, updates)})
            for p, parts in pieces.items():
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                if len(parts) == 1:
                    update, scale = done[id(parts[0])]
                    p.add_(update, alpha=-group["lr"] * scale)
                else:  # each stacked matrix at its own scale
                    p.add_(torch.cat([update * scale for update, scale in map(done.get, map(id, parts))]),
                           alpha=-group["lr"])

    def _momentum(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        """Update the momentum buffer with p.grad; return the direction to orthogonalise."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buffer = state["momentum_buffer"]
        buffer.lerp_(p.grad, 1 - group["momentum"])  # buffer = m * buffer + (1 - m) * grad
        return p.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer


# ----------------------------------------------------------------------------- parameter groups


DECAYED = ("head", "matrices")  # the groups train.weight_decay applies to (build_optimizer)


@dataclass
class Optimizers:
    """The optimizers of one run; the training loop steps and saves them together."""

    optimizers: list[torch.optim.Optimizer]

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> list[dict]:
        return [optimizer.state_dict() for optimizer in self.optimizers]

    def load_state_dict(self, states) -> None:
        if isinstance(states, dict):  # written before Muon existed: one AdamW
            states = [states]
        if len(states) != len(self.optimizers):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer state(s), this run has "
                             f"{len(self.optimizers)} (was train.optimizer changed?)")
        for optimizer, state in zip(self.optimizers, states):
            # torch puts back the saved groups' hyperparameters too. Every one of them is this
            # run's config's (a fork with --set train.lr=..., train.beta2=... or
            # train.muon_momentum=... trains with what it names; Muon's row split is this run's
            # choice); the step counts and moments are the checkpoint's. Under the same config
            # both are the same. The current rate is set before every step (`set_learning_rates`).
            kept = [{key: value for key, value in group.items() if key not in ("params", "lr")}
                    for group in optimizer.param_groups]
            optimizer.load_state_dict(state)
            for group, mine in zip(optimizer.param_groups, kept):
                group.update(mine)

    def set_weight_decay(self, decay: float) -> None:
        """train.weight_decay changed after the optimizers were built (a new run's
        train.decay_by_passes): every group that takes it (DECAYED) steps with `decay` from now."""
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                if group.get("name") in DECAYED:
                    group["weight_decay"] = decay

    def rates(self) -> dict[str, float]:
        """The rate each parameter group steps with now, by '<optimizer>/<group>' (e.g.
        'muon/matrices', 'adamw/embedding'): read from the optimizers, not recomputed."""
        return {f"{type(optimizer).__name__.lower()}/{group.get('name', f'group{i}')}": group["lr"]
                for optimizer in self.optimizers for i, group in enumerate(optimizer.param_groups)}


def parameter_groups(model: nn.Module, config: TrainConfig) -> dict[str, list[nn.Parameter]]:
    """Each trainable parameter in exactly one named group (checked):

    matrices: 2-D weights inside the blocks; embedding: the token embedding (and the
    head, when tied); head: an untied output head; gains: every 1-D parameter.
    """
    groups: dict[str, list[nn.Parameter]] = {"matrices": [], "embedding": [], "head": [], "gains": []}
    for name, p in model.named_parameters():  # a tied head is listed once, as the embedding
        if not p.requires_grad:
            continue
        if name == "token_embedding.weight":
            groups["embedding"].append(p)
        elif name == "head.weight":
            groups["head"].append(p)
        elif p.dim() < 2:
            groups["gains"].append(p)
        else:
            groups["matrices"].append(p)
    grouped = [id(p) for ps in groups.values() for p in ps]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    if sorted(grouped) != sorted(trainable):
        raise AssertionError("every trainable parameter must be in exactly one optimizer group")
    return groups


def unused_options(config: TrainConfig, tied: bool, given: Iterable[str]) -> list[str]:
    """A line for each option among `given` (the dotted keys the user wrote) that this run's
    optimizers never read: train.head_lr with a tied head (it is the embedding, at
    train.embedding_lr), train.muon_* under train.optimizer adamw (no Muon is built), train.max_steps
    under train.time_budget (the budget sets the length; --set train.max_steps turns it off before)."""
    given = set(given)
    lines = []
    if config.time_budget is not None and "train.max_steps" in given:
        steps = config.max_steps
        lines.append(f"note: train.max_steps={steps} has no effect: train.time_budget "
                     f"{duration_text(config.time_budget)} "
                     "sets the run's length (config.yaml records the budget's first estimate instead); for "
                     f"{steps} steps, --set train.max_steps={steps} (the budget is then off) or give "
                     "train.time_budget: null")
    if tied and "train.head_lr" in given:
        lines.append("note: train.head_lr has no effect: model.tie_embeddings is true, so the head is the "
                     "token embedding and trains at train.embedding_lr")
    if config.optimizer == "adamw":
        lines.extend(f"note: {key} has no effect: train.optimizer is adamw (Muon is used only with "
                     "train.optimizer: muon)" for key in sorted(given) if key.startswith("train.muon_"))
    return lines


def build_optimizer(model: nn.Module, config: TrainConfig, device: torch.device,
                    ns_dtype: torch.dtype = torch.float32) -> Optimizers:
    """The optimizers for `train.optimizer`; each group's `base_lr` is its peak rate.

    Weight decay applies to matrices (and the head); never to gains or the embedding,
    whose rows are decayed every step but updated only when their token appears.
    ns_dtype: the dtype Muon orthogonalises in (see `newton_schulz`).
    """
    groups = parameter_groups(model, config)
    embedding_lr = config.embedding_lr or config.lr
    head_lr = config.head_lr or config.lr
    # The fused kernel exists for CUDA and the CPU; it does the whole update in one pass
    # over the parameters instead of a chain of foreach ops.
    fused = device.type in ("cuda", "cpu")
    betas = (config.beta1, config.beta2)

    def adamw(param_groups: list[dict]) -> torch.optim.AdamW:
        param_groups = [g for g in param_groups if g["params"]]
        for g in param_groups:
            g["base_lr"] = g["lr"]
        return torch.optim.AdamW(param_groups, lr=config.lr, betas=betas, fused=fused,
                                 foreach=None if fused else True)

    def decay(name: str) -> float:
        return config.weight_decay if name in DECAYED else 0.0

    adamw_groups = [  # "name" labels each group's logged rate (Optimizers.rates)
        {"name": name, "params": groups[name], "lr": lr, "weight_decay": decay(name)}
        for name, lr in (("embedding", embedding_lr), ("head", head_lr), ("gains", config.lr))
    ]
    if config.optimizer == "adamw":
        adamw_groups.append({"name": "matrices", "params": groups["matrices"], "lr": config.lr,
                             "weight_decay": decay("matrices")})
        return Optimizers([adamw(adamw_groups)])
    muon_lr = config.muon_lr or config.lr
    stacked = {}
    if hasattr(model, "stacked_matrices"):  # how Muon splits stacked weights (Muon's "rows")
        stacked = model.stacked_matrices(by_matrix=config.muon_split_stacked,
                                         query_key_heads=config.muon_split_heads)
    names = {id(p): name for name, p in model.named_parameters()}
    rows = [stacked.get(names[id(p)]) for p in groups["matrices"]]
    muon = Muon([{"name": "matrices", "params": groups["matrices"], "lr": muon_lr, "base_lr": muon_lr,
                  "rows": rows}],
                momentum=config.muon_momentum, weight_decay=decay("matrices"),
                ns_steps=config.muon_ns_steps, ns_dtype=ns_dtype)
    return Optimizers([adamw(adamw_groups), muon])


def optimizer_description(config: TrainConfig) -> str:
    """One line for the run's start-up message."""
    average = f", weights averaged (ema {config.ema:g})" if config.ema is not None else ""
    if config.optimizer == "muon":
        return f"Muon (lr {config.muon_lr or config.lr:g}) + AdamW (lr {config.lr:g}){average}"
    return f"AdamW (lr {config.lr:g}){average}"


def ns_dtype_for(autocast_dtype: Optional[torch.dtype]) -> torch.dtype:
    """Muon orthogonalises in bf16 exactly where training runs in bf16: there the hardware
    is fast at it; elsewhere bf16 may be emulated and many times slower than fp32."""
    return torch.bfloat16 if autocast_dtype == torch.bfloat16 else torch.float32
