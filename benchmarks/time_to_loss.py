"""Time to a validation loss, tinyattn against nanoGPT, on this machine.

Both programs run as a user would run them, as whole processes: nanoGPT's CPU recipe from
its README (4 layers, 4 heads, width 128, context 64, batch 12, 2,000 steps, an evaluation
every 250 steps) from a checkout you name, and tinyattn's main config at the same size
with its own optimizer, schedule and rates (`TINYATTN_SETS`). Every line a program prints
is stamped with the seconds since it started; the figure is the stamp of the first
evaluation at or below the target (nanoGPT's own final loss by default, 1.8857 in its
README), and each program's whole wall time. Rounds alternate the two programs, since
this machine's speed drifts within minutes.

    python -m benchmarks.time_to_loss --nanogpt /path/to/nanoGPT --rounds 2

nanoGPT needs its data prepared once (`python data/shakespeare_char/prepare.py` there,
with input.txt beside it); nothing of it is part of this project. Each round gives it a
temporary --out_dir for its checkpoints, removed after the round, so the checkout's
out-shakespeare-char/ is left as it was.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from benchmarks.arguments import check_counts, check_output, write_figures
from tinyattn.cli import run_command
from tinyattn.errors import ConfigError, TinyattnError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/shakespeare_char.yaml"  # tinyattn's, relative to ROOT, where its runs start
NANOGPT_DATA = ("train.bin", "val.bin", "meta.pkl")  # what nanoGPT's data/shakespeare_char/prepare.py writes
NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
TINYATTN_SETS = ["model.n_layer=4",
                 "model.n_head=4", "model.n_embd=128", "model.context_length=64", "train.batch_size=12",
                 "train.max_steps=1000", "train.time_budget=null", "train.precision=fp32",
                 "train.compile=false", "train.eval_interval=250", "train.show=[]"]
NANOGPT_VAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")
TINYATTN_VAL = re.compile(r"^step (\d+): validation loss ([\d.]+)")


def stamped_run(command: list[str], cwd: Path) -> tuple[list[tuple[float, str]], float]:
    """Run `command`, return each output line with its seconds since start, and the wall time."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in process.stdout]
    if process.wait() != 0:
        tail = "\n".join(line for _, line in lines[-15:])
        raise SystemExit(f"{command[:3]} failed with exit code {process.returncode}:\n{tail}")
    return lines, time.perf_counter() - start


def evaluations(lines: list[tuple[float, str]], pattern: re.Pattern) -> list[dict]:
    """Each evaluation's step, validation loss and seconds since the process started."""
    found = []
    for seconds, line in lines:
        match = pattern.match(line.strip())
        if match:
            found.append({"step": int(match[1]), "val": float(match[2]), "seconds": round(seconds, 2)})
    return found


def first_at_or_below(evals: list[dict], target: float) -> Optional[dict]:
    return next((e for e in evals if e["val"] <= target), None)


def one_round(nanogpt: Path, tinyattn_extra: list[str], target: Optional[float]) -> dict:
    # Its checkpoints in a folder of its own, not <checkout>/out-shakespeare-char (each round's overwrote it).
    with tempfile.TemporaryDirectory(prefix="time-to-loss-nanogpt-") as out_dir:
        command = [sys.executable, "train.py", *NANOGPT_ARGS, f"--out_dir={out_dir}"]
        lines, wall = stamped_run(command, nanogpt)
    theirs = {"wall": round(wall, 1), "evaluations": evaluations(lines, NANOGPT_VAL)}
    if not theirs["evaluations"]:  # its final loss: the default target, and every round's line
        raise TinyattnError(f"--nanogpt {nanogpt}: its train.py printed no evaluation (a line like "
                            "'step 250: train loss 1.9, val loss 2.0'); expected nanoGPT's train.py, which "
                            "prints one every 250 steps")
    target = target if target is not None else theirs["evaluations"][-1]["val"]
    run_name = f"time-to-loss-{os.getpid()}-{time.time_ns()}"
    command = [sys.executable, "scripts/train.py", "--config", CONFIG, "--no-progress",
               "--run-name", run_name, "--set", *tinyattn_overrides(tinyattn_extra)]
    lines, wall = stamped_run(command, ROOT)
    ours = {"wall": round(wall, 1), "evaluations": evaluations(lines, TINYATTN_VAL)}
    reached = first_at_or_below(ours["evaluations"], target)
    ratio = reached["seconds"] / theirs["wall"] if reached else None
    return {"target": target, "nanogpt": theirs, "tinyattn": ours, "tinyattn_reached": reached,
            "ratio_to_nanogpt_wall": None if ratio is None else round(ratio, 3)}


def tinyattn_overrides(extra: list[str]) -> list[str]:
    """tinyattn's --set items for a round: the recipe's, the user's, then the runs' folder."""
    return [*TINYATTN_SETS, *extra, "train.out_dir=/tmp/tinyattn-time-to-loss"]


def check_nanogpt(folder: Path) -> None:
    """A nanoGPT checkout with its Shakespeare data prepared, else a one-line refusal."""
    if not (folder / "train.py").is_file():
        raise TinyattnError(f"--nanogpt {folder}: no train.py there; expected a nanoGPT checkout")
    data = folder / "data" / "shakespeare_char"
    missing = [name for name in NANOGPT_DATA if not (data / name).is_file()]
    if missing:
        raise TinyattnError(f"--nanogpt {folder}: no {', '.join(missing)} in data/shakespeare_char (its data "
                            f"is not prepared); run `python data/shakespeare_char/prepare.py` in {folder}")


def prepare_tinyattn_data(extra: list[str]) -> None:
    """tinyattn's corpus and token cache made as its runs will find them (from ROOT), before
    nanoGPT's minutes: a missing file or a bad --set is refused now, and no round tokenizes."""
    from tinyattn.config import load_config
    from tinyattn.data.batches import prepare_data
    from tinyattn.errors import DataError

    saved = os.getcwd()
    os.chdir(ROOT)  # the config's relative paths (data.files, data.cache_dir) are the runs' own
    try:
        prepare_data(load_config(CONFIG, tinyattn_overrides(extra)), progress=False)
    except DataError as e:
        raise DataError(f"tinyattn's data (its runs start in {ROOT}): {e}") from None
    finally:
        os.chdir(saved)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout, data prepared")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", type=float, default=None,
                        help="validation loss to reach (default: nanoGPT's final loss in the same round)")
    parser.add_argument("--set", nargs="*", default=[], help="more tinyattn overrides, KEY=VALUE")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    check_counts(args, {"rounds": (1, "")})
    if args.target is not None and not 0 < args.target < math.inf:  # not one of nan's comparisons is true
        raise ConfigError(f"--target {args.target} is not a loss a run can aim at; expected a positive, "
                          "finite validation loss (default: nanoGPT's final one)")
    check_output(args.json)
    check_nanogpt(args.nanogpt)
    prepare_tinyattn_data(args.set)
    rounds = []
    for r in range(args.rounds):
        result = one_round(args.nanogpt, args.set, args.target)
        rounds.append(result)
        reached = result["tinyattn_reached"]
        print(f"round {r}: nanoGPT {result['nanogpt']['wall']} s for 2,000 steps "
              f"(final val {result['nanogpt']['evaluations'][-1]['val']}); tinyattn reached "
              f"{result['target']} " + (f"at step {reached['step']} after {reached['seconds']} s "
                                        f"= {result['ratio_to_nanogpt_wall']}x" if reached else "never")
              + f"; tinyattn whole run {result['tinyattn']['wall']} s, final val "
              f"{result['tinyattn']['evaluations'][-1]['val']}", flush=True)
        if args.json:  # after each round: a later round that fails loses none of the earlier ones
            write_figures(args.json, json.dumps(rounds, indent=1))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
