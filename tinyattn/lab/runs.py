"""The short training runs a lab compares: their settings, training them one after another, their curves.

`lab_overrides(steps, out)` is what every lab run sets before the user's --set (a small model, fp32, a
fixed step count, one evaluation at the end); `train_runs(lab, args, out, runs)` trains a lab's runs
into <out>/<name> and ends the lab in one line when one is stopped; `training_curve(run_dir)` reads a
run's training loss back from TensorBoard; `check_steps` and `check_tokenizer` check a lab's --steps
and --checkpoint before anything trains. `tinyattn lab causal` and `tinyattn lab scaling` share them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tinyattn.errors import TinyattnError, counted
from tinyattn.system.invocation import quoted

DEFAULT_CONFIG = "configs/shakespeare_char.yaml"
# A smaller model than the config's (before --set, which may change it): the effects need no size.
SMALL_MODEL = ["model.n_layer=2", "model.n_head=4", "model.n_embd=64", "train.batch_size=16"]
# The config's tables by passes are tuned for its own model; here they would change the weight decay
# with --steps (the main config's from 3.5 passes, about 3,430 steps): train.weight_decay at any --steps.
NO_PASS_TABLES = ["train.dropout_by_passes={}", "train.floor_by_passes={}", "train.decay_by_passes={}"]
EVAL_WINDOWS = 64  # the runs' train.eval_windows (before --set), which their validation losses read


def check_steps(steps: int) -> None:
    if steps <= 0:
        raise TinyattnError(f"--steps {steps}: expected a positive integer")


def lab_overrides(steps: int, out: Path) -> list[str]:
    """A lab's settings for each of its runs: a small model, fp32, a fixed step count, the same dropout,
    floor and weight decay whatever the count (`NO_PASS_TABLES`), one evaluation at the end, of the
    weights themselves (no moving average: the lab compares models)."""
    return SMALL_MODEL + NO_PASS_TABLES + [
        f"train.max_steps={steps}", "train.time_budget=null", "train.precision=fp32",
        "train.compile=false", "train.show=[]", "train.ema=null", f"train.eval_interval={steps}",
        f"train.eval_windows={EVAL_WINDOWS}", f"train.warmup_steps={max(1, steps // 10)}",
        f"train.out_dir={out}"]


def train_runs(lab: str, args: argparse.Namespace, out: Path, runs: dict[str, list[str]]) -> dict:
    """Train each run of `runs` ({name: its --set items}) into <out>/<name>, one after another, for
    args.steps; returns {name: TrainResult}. A run stopped by Ctrl-C or SIGTERM (`TrainResult.interrupted`,
    or before its first step) ends the lab in one line saying how to run it again (with --out, naming
    it and --force), and exit status 130, as `tinyattn train` ends: the next run is not trained and no
    table is written, as one would set a few steps beside a whole run."""
    from tinyattn.config import load_config
    from tinyattn.lab.outputs import earlier_outputs
    from tinyattn.train.loop import train
    from tinyattn.train.owners import StoppedBeforeStart

    def stopped(how: str) -> KeyboardInterrupt:
        # A stop, not a mistake: `run_command` prints the message and exits 130, as for train. Into the
        # same --out only with --force (`clear_earlier_lab`); without --out each run of the lab makes a
        # new folder, as `stopped_midway` says of a stop after the training.
        every = "both runs" if len(runs) == 2 else f"all {len(runs)} runs"
        # --force only where the folder holds a run: a first run stopped before its first step left none
        force = " --force" if earlier_outputs(out, runs) else ""
        again = (f"with --out {quoted(out)}{force} to train {every} anew" if args.out is not None
                 else f"to train {every} anew in a new folder")
        return KeyboardInterrupt(f"lab {lab} stopped: the {how}; nothing was compared. Run the lab again "
                                 f"{again}")

    results = {}
    for name, items in runs.items():
        run_dir = out / name
        config = load_config(args.config, items)
        print(f"training {name} ({counted(args.steps, 'step')}) into {run_dir}/", flush=True)
        try:
            # Its stop line does not advise a resume: the lab would not read a resumed run (its own line says
            # what to do)
            results[name] = train(config, config_path=args.config, run_name=name, progress=False,
                                  overrides=items, resume_advice=False)
        except StoppedBeforeStart:  # train's line ("nothing was trained or saved; run the same command
            # again") speaks of its run alone: after an earlier run, this --out holds it and needs --force
            raise stopped(f"{name} run stopped before its first step") from None
        if results[name].interrupted:  # a comparison with a stopped run would compare its few steps
            raise stopped(f"{name} run stopped at step {results[name].step} of {args.steps} ({run_dir})")
    return results


def training_curve(run_dir: Path):
    """(steps, losses) of train/loss from a run's TensorBoard events, as numpy arrays."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars("train/loss")
    return np.array([p.step for p in points]), np.array([p.value for p in points])


def check_tokenizer(args: argparse.Namespace, loaded, tokenizer) -> None:
    """--checkpoint's tokenizer must be the one of --config (`tokenizer`), whose text the lab reads it on."""
    if loaded.tokenizer.to_json() != tokenizer.to_json():
        raise TinyattnError(f"--checkpoint {args.checkpoint}: its tokenizer is not the one of --config "
                            f"{args.config}; give the config it was trained with")
