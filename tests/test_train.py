"""Training: the CLI end to end, TensorBoard tags, accumulation, exact resume, survival."""

import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests import warm_python
from tests.conftest import local_corpus, run_started_in
from tinyattn import checkpoint as ckpt
from tinyattn.config import SHOW_HOOKS, load_config
from tinyattn.errors import CheckpointError, TinyattnError
from tinyattn.train.loop import train
from tinyattn.train.optim import DECAYED, learning_rate
from tinyattn.train.trainer import Trainer, TrainingError

ROOT = Path(__file__).resolve().parents[1]

TINY = ROOT / "configs" / "tiny.yaml"  # evaluates the validation loss only (train.show: [])

# The runs trained here in process write to the page cache alone (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")


@pytest.fixture(scope="module")
def corpus(shakespeare_head) -> Path:
    return shakespeare_head


def tiny_overrides(corpus: Path, out_dir: Path, *extra: str) -> list[str]:
    return [*local_corpus(corpus, out_dir), *extra]


def tiny_config(corpus, out_dir, *extra):
    return load_config(TINY, tiny_overrides(corpus, out_dir, *extra))


def killed_at_the_save_of_step_9(monkeypatch, config, run_name: str) -> None:
    """Trains `config` as `run_name` until the save of step 9, which fails as a kill there would end it:
    the checkpoint before (step 6 at eval_interval 3) is the newest, and step 9 was logged."""
    from tinyattn.train.owners import Checkpointer

    save = Checkpointer.save

    def killed(checkpointer, trainer, best):
        if trainer.step == 9:
            raise RuntimeError("killed")
        save(checkpointer, trainer, best)

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "save", killed)
        with pytest.raises(RuntimeError, match="killed"):
            train(config, run_name=run_name, progress=False)


def run_cli(*args, cwd=ROOT, timeout=150, **kwargs):
    return warm_python.run([sys.executable, str(ROOT / "scripts" / "train.py"), *args], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.mark.slow
def test_cli_end_to_end_writes_a_complete_run(corpus, tmp_path):
    result = run_cli("--config", str(TINY), "--run-name", "e2e", "--no-progress",
                     "--set", *tiny_overrides(corpus, tmp_path, f"train.show=[{', '.join(SHOW_HOOKS)}]"))
    assert result.returncode == 0, result.stderr
    run = tmp_path / "e2e"
    assert (run / "config.yaml").is_file() and (run / "tokenizer.json").is_file()
    assert [p.name for p in ckpt.step_checkpoints(run)] == ["step_0000010.pt", "step_0000020.pt"]
    assert (run / "best.pt").is_file()
    assert "--- step 20 ---" in (run / "samples.txt").read_text(encoding="utf-8")
    saved = load_config(run / "config.yaml")
    assert saved.model.vocab_size is not None  # resolved from the tokenizer
    assert "validation loss" in result.stderr and "done: 20 steps" in result.stderr
    state = ckpt.load_checkpoint(run / "step_0000020.pt")
    assert state["step"] == 20 and state["tokens_seen"] == 20 * 4 * 32


def test_a_bpe_vocabulary_the_text_cannot_fill_is_said_with_the_asked_and_the_got_size(tmp_path, capsys):
    corpus = tmp_path / "small.txt"
    corpus.write_text("".join(f"Line {i}: to be, or not to be.\n" for i in range(100)), encoding="utf-8")
    config = tiny_config(corpus, tmp_path, "tokenizer.kind=bpe", "tokenizer.vocab_size=4096",
                         "train.max_steps=1", "train.eval_interval=1")
    train(config, run_name="small", progress=False)
    got = load_config(tmp_path / "small" / "config.yaml").model.vocab_size
    assert 257 < got < 4096  # the model is built with the vocabulary the tokenizer has
    lines = [line for line in capsys.readouterr().err.splitlines() if "vocab_size" in line]
    assert lines == [f"note: tokenizer.vocab_size asked for 4,096 tokens; BPE training on this text ran out "
                     f"of pairs to merge at {got:,}, so the vocabulary has {got:,}"]


def test_a_warmup_longer_than_the_run_is_said_at_the_start(corpus, tmp_path, capsys):
    """warmup 50 on a 20-step run ended mid-warmup at 40% of the rate, silently. Said before the first
    step: each run here stops after it."""
    train(tiny_config(corpus, tmp_path, "train.warmup_steps=50", "train.max_steps=20"), run_name="w",
          stop_at_step=1, progress=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: train.warmup_steps")]
    assert lines == ["warning: train.warmup_steps=50 is not below the 20 steps of train.max_steps: the rate ends "
                     "still warming up, at 40% of its peak, and never decays; give fewer warmup steps "
                     "(--set train.warmup_steps=2) or more train.max_steps"]
    train(tiny_config(corpus, tmp_path, "train.warmup_steps=19", "train.max_steps=20"), run_name="ok",
          stop_at_step=1, progress=False)
    assert "warning: train.warmup_steps" not in capsys.readouterr().err


def test_the_last_lines_total_is_given_to_the_tenth_of_a_second_as_its_parts_are(corpus, tmp_path, capsys):
    """"done: 20 steps in 3 s (start-up 3.1 s (93.6%), ...)": the total in whole seconds, its parts in
    tenths, so a part could read larger than the whole (and "in 5 s" had parts of 4.5 s)."""
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2"), run_name="t",
                   progress=False)
    line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("done: "))
    total = float(re.search(r" in ([\d.]+) s \(", line)[1])
    parts = [float(seconds) for seconds in re.findall(r"([\d.]+) s \([\d.]+%\)", line)]
    assert total == round(result.wall_seconds, 1) and f" in {total:.1f} s (" in line, line
    assert max(parts) <= total and sum(parts) <= total + 0.05 * len(parts), line


def test_options_the_user_gave_that_nothing_reads_are_noted_and_inherited_ones_are_not(corpus, tmp_path, capsys):
    """train.head_lr with a tied head, train.muon_* under adamw: accepted, then silently ignored.
    Noted only where --config's own file or --set gives them: tiny.yaml inherits muon_lr,
    muon_momentum and head_lr from the main config, which the user did not write for this run."""
    path = tmp_path / "mine.yaml"
    path.write_text(f"extends: {TINY}\nmodel:\n  tie_embeddings: true\ntrain:\n  head_lr: 0.01\n"
                    "  max_steps: 1\n  warmup_steps: 0\n", encoding="utf-8")
    overrides = tiny_overrides(corpus, tmp_path, "train.muon_ns_steps=3")
    train(load_config(path, overrides), config_path=path, overrides=overrides, run_name="mine", progress=False)
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: train.")] == [
        "note: train.head_lr has no effect: model.tie_embeddings is true, so the head is the token embedding "
        "and trains at train.embedding_lr",
        "note: train.muon_ns_steps has no effect: train.optimizer is adamw (Muon is used only with "
        "train.optimizer: muon)"]
    overrides = tiny_overrides(corpus, tmp_path, "model.tie_embeddings=true", "train.max_steps=1")
    train(load_config(TINY, overrides), config_path=TINY, overrides=overrides, run_name="tiny", progress=False)
    assert "has no effect" not in capsys.readouterr().err


def test_a_vocabulary_size_given_to_a_tokenizer_that_builds_none_is_noted(corpus, tmp_path, capsys):
    # A char run's --set tokenizer.vocab_size=100 was accepted and silently ignored (its vocabulary is
    # the text's characters); a bpe run reads it.
    from tinyattn.data.tokenizer import unused_tokenizer_options

    overrides = tiny_overrides(corpus, tmp_path, "tokenizer.vocab_size=100", "train.max_steps=1")
    train(load_config(TINY, overrides), config_path=TINY, overrides=overrides, run_name="char",
          progress=False)
    notes = capsys.readouterr().err.splitlines()
    assert ("note: tokenizer.vocab_size has no effect: tokenizer.kind is char, whose vocabulary is the "
            "text's characters (tokenizer.vocab_size sizes a bpe tokenizer)") in notes
    bpe = load_config(TINY, ["tokenizer.kind=bpe", "tokenizer.vocab_size=100"]).tokenizer
    assert unused_tokenizer_options(bpe, ["tokenizer.vocab_size"]) == []
    assert unused_tokenizer_options(load_config(TINY).tokenizer, ["tokenizer.kind"]) == []


def test_tensorboard_holds_every_curve(corpus, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(tiny_config(corpus, tmp_path, f"train.show=[{', '.join(SHOW_HOOKS)}]"), run_name="tb",
                   progress=False)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "val/loss", "train/learning_rate", "train/grad_norm", "perf/tokens_per_second",
            "perf/mfu", "train/tokens_seen"} <= scalars
    assert {"lr/adamw/embedding", "lr/adamw/gains", "lr/adamw/matrices"} <= scalars  # each group's rate
    assert {"loss_by_position/positions_0", "loss_by_position/positions_16-31"} <= scalars
    assert {"attention/layer_0", "attention/layer_1", "loss_by_position/plot",
            "head_ablation/grid"} <= set(events.Tags()["images"])
    tensors = set(events.Tags()["tensors"])
    assert {"sample/text_summary", "config/text_summary"} <= tensors
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    # The hyperparameters and the final losses, as TensorBoard's HParams tab reads them.
    from tensorboard.plugins.hparams import plugin_data_pb2

    runs = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload()
    content = runs.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    values = {k: (v.number_value if v.HasField("number_value") else v.string_value)
              for k, v in session.session_start_info.hparams.items()}
    assert values["model.n_layer"] == 2 and values["train.max_steps"] == 20
    assert values["train.optimizer"] == "adamw"
    assert values["tokenizer.kind"] == "char" and values["data.files"] == str(corpus)  # data tells runs apart
    # The tab's columns: both losses declared as the session's metrics
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {info.name.tag for info in experiment.metric_infos} == {"hparam/best_val_loss",
                                                                   "hparam/last_val_loss"}
    best = [e.value for e in runs.Scalars("hparam/best_val_loss")]
    last = [e.value for e in runs.Scalars("hparam/last_val_loss")]
    assert len(best) == 2 and best[-1] == pytest.approx(result.best_val_loss, abs=1e-5)
    assert best[0] >= best[1] and last[-1] == pytest.approx(result.last_val_loss, abs=1e-5)


def test_a_list_setting_is_one_comma_separated_text_in_tensorboards_hparams():
    from tinyattn.train.log import hparams_of

    config = load_config(TINY, ["data.files=[a.txt, b.txt]", "data.url=null", "data.sha256=null",
                                "train.show=[sample, loss_by_position]"])
    values = hparams_of(config)
    assert (values["data.files"], values["train.show"]) == ("a.txt, b.txt", "sample, loss_by_position")


def hparams_sessions(run: Path) -> list[dict]:
    """The HParams sessions in a run folder's event files: each one's hyperparameters."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    sessions = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    sessions.append({key: v.number_value if v.HasField("number_value") else v.string_value
                                     for key, v in data.session_start_info.hparams.items()})
    return sessions


def opened_a_second_earlier(run: Path) -> None:
    """Renames the TensorBoard event files in `run` as if their session had opened them a second earlier.

    Event files are named by the second they open in, then by a counter of this process's writers
    (a count of more digits can sort first), and TensorBoard reads a folder's files in name order. A later
    session, in a process of its own, opens its file in a later second; this process's next session
    opens its own in this second or a later one, so it sorts after these as a real one would, without
    waiting for the clock's second to change."""
    for path in run.glob("events.out.tfevents.*"):
        words = path.name.split(".")  # events, out, tfevents, the second, host, pid, counter
        words[3] = f"{int(words[3]) - 1:0{len(words[3])}d}"
        os.rename(path, path.with_name(".".join(words)))


def test_a_resumed_run_keeps_one_hparams_session(corpus, tmp_path):
    items = ("train.max_steps=4", "train.eval_interval=2")
    train(tiny_config(corpus, tmp_path, *items), run_name="tb", progress=False, stop_at_step=2)
    opened_a_second_earlier(tmp_path / "tb")
    train(tiny_config(corpus, tmp_path, *items), run_name="tb", resume=True, progress=False)
    assert len(hparams_sessions(tmp_path / "tb")) == 1
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2  # both runs wrote curves
    # Each session's config (a resume's may be edited) at the step it starts from
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0}).Reload()
    assert [event.step for event in events.Tensors("config/text_summary")] == [0, 2]


def test_a_forked_run_has_its_own_hparams_session_and_keeps_it_when_resumed(corpus, tmp_path):
    items = ("train.max_steps=6", "train.eval_interval=2")
    train(tiny_config(corpus, tmp_path, *items), run_name="tb", progress=False, stop_at_step=2)
    forked = tiny_config(corpus, tmp_path, *items, "train.lr=1e-3")
    train(forked, run_name="fork", resume=tmp_path / "tb" / ckpt.step_filename(2), progress=False,
          stop_at_step=4)
    train(forked, run_name="fork", resume=True, progress=False)  # in its own folder: no second session
    assert [session["train.lr"] for session in hparams_sessions(tmp_path / "fork")] == [pytest.approx(1e-3)]
    assert [session["train.lr"] for session in hparams_sessions(tmp_path / "tb")] == [pytest.approx(2e-3)]


def test_a_run_resumed_after_a_kill_holds_each_step_once_in_tensorboard(corpus, tmp_path, monkeypatch):
    """A kill after step 9's evaluation, before its checkpoint: the curves of steps 7-9 are in the
    killed session's event file; the resume from step 6 trains them again. TensorBoard then shows
    each step once, the resumed session's, and keeps step 6's validation loss, which the checkpoint
    covers and the resume does not log again."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    items = ("train.max_steps=9", "train.eval_interval=3", "train.log_interval=1")
    killed_at_the_save_of_step_9(monkeypatch, tiny_config(corpus, tmp_path, *items), "k9")
    assert ckpt.latest_checkpoint(tmp_path / "k9").name == ckpt.step_filename(6)
    opened_a_second_earlier(tmp_path / "k9")
    resumed_at = time.time()
    train(tiny_config(corpus, tmp_path, *items), run_name="k9", resume=True, progress=False)
    events = EventAccumulator(str(tmp_path / "k9")).Reload()
    losses, validations = events.Scalars("train/loss"), events.Scalars("val/loss")
    assert [e.step for e in losses] == list(range(1, 10))
    assert [e.step for e in validations] == [3, 6, 9]
    assert all((e.wall_time >= resumed_at) == (e.step > 6) for e in [*losses, *validations])


def test_a_run_resumed_after_a_kill_holds_each_steps_sample_once_in_samples_txt(corpus, tmp_path,
                                                                              monkeypatch):
    """A kill after step 9's evaluation, before its checkpoint: samples.txt held step 9's sample, and
    the resume from step 6 appended another step 9 after it (TensorBoard purges the first; the file
    kept both, the first from weights no checkpoint holds). Now a resume drops the samples past its
    checkpoint's step, as TensorBoard's view does."""
    items = ("train.max_steps=9", "train.eval_interval=3", "train.show=[sample]")
    killed_at_the_save_of_step_9(monkeypatch, tiny_config(corpus, tmp_path, *items), "k9")
    samples = tmp_path / "k9" / "samples.txt"
    killed = samples.read_text(encoding="utf-8")
    train(tiny_config(corpus, tmp_path, *items), run_name="k9", resume=True, progress=False)
    text = samples.read_text(encoding="utf-8")
    assert re.findall(r"^--- step (\d+) ---$", text, flags=re.M) == ["3", "6", "9"]
    assert text.startswith(killed[:killed.index("--- step 9 ---")])  # steps 3 and 6 as they were


def test_a_run_trained_again_where_an_attempt_died_before_its_first_checkpoint_shows_only_itself(
        corpus, tmp_path, monkeypatch, capsys):
    """An attempt that dies before its first checkpoint (a second Ctrl-C, a kill) leaves its curves
    of steps 1-5 and its HParams session (train.lr 1e-3) in the folder, and "run the same command
    again" trains there from step 1. The folder showed both attempts: the dead one's steps 4-5 after
    the new run's 1-3 (to TensorBoard's reader, a curve that zigzags back) and two HParams sessions,
    the dead attempt's hyperparameters in the HParams tab. Now the new run removes those events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tinyattn.train.owners import Checkpointer

    items = ("train.max_steps=9", "train.eval_interval=5", "train.log_interval=1")

    def killed(checkpointer, trainer, best):
        raise RuntimeError("killed")

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "save", killed)
        with pytest.raises(RuntimeError, match="killed"):
            train(tiny_config(corpus, tmp_path, *items, "train.lr=1e-3", "train.min_lr=1e-4"), run_name="d",
                  progress=False)
    assert ckpt.latest_checkpoint(tmp_path / "d") is None
    opened_a_second_earlier(tmp_path / "d")
    started = time.time()
    capsys.readouterr()
    train(tiny_config(corpus, tmp_path, *items), run_name="d", progress=False, stop_at_step=3)
    events = EventAccumulator(str(tmp_path / "d")).Reload()
    losses = events.Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2, 3] and all(e.wall_time >= started for e in losses)
    assert [session["train.lr"] for session in hparams_sessions(tmp_path / "d")] == [pytest.approx(2e-3)]
    aside = tmp_path / "d" / "earlier_attempt_1"
    assert (f"note: {tmp_path / 'd'} held the TensorBoard events or samples of an earlier attempt without a "
            f"checkpoint here (1 file); moved them to {aside} (TensorBoard shows it as a run of its own)"
            ) in capsys.readouterr().err.splitlines()
    kept = EventAccumulator(str(aside)).Reload()  # nothing is lost: the attempt's curves, on their own
    assert [e.step for e in kept.Scalars("train/loss")][:5] == [1, 2, 3, 4, 5]


def test_an_earlier_attempts_events_that_cannot_move_are_hidden_from_the_new_runs_curves(
        corpus, tmp_path, monkeypatch):
    """Events that cannot be set aside (held open elsewhere) stay, and the new run's writer purges them
    (purge_step 0): the folder's curves are the new run's alone."""
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    items = ("train.max_steps=5", "train.eval_interval=5", "train.log_interval=1")
    train(tiny_config(corpus, tmp_path, *items), run_name="h", progress=False)
    for path in (tmp_path / "h").glob("*.pt"):
        path.unlink()
    opened_a_second_earlier(tmp_path / "h")

    def refused(self, target):
        raise PermissionError(13, "in use", str(self))

    monkeypatch.setattr(Path, "rename", refused)
    train(tiny_config(corpus, tmp_path, *items), run_name="h", progress=False, stop_at_step=2)
    assert len(list((tmp_path / "h").glob("events.out.tfevents.*"))) == 2  # the earlier one stayed
    assert not (tmp_path / "h" / "earlier_attempt_1").exists()  # and no empty folder for it
    losses = EventAccumulator(str(tmp_path / "h")).Reload().Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2]


def test_a_run_trained_again_where_its_checkpoints_were_deleted_keeps_the_earlier_curves_and_samples(
        corpus, tmp_path, capsys):
    """A finished run whose checkpoints the user deleted (for disk space), trained again under its name:
    its curves and samples are set aside in the folder, not deleted, and the new run's start afresh."""
    items = ("train.max_steps=6", "train.eval_interval=3", "train.show=[sample]")
    train(tiny_config(corpus, tmp_path, *items), run_name="r", progress=False)
    first_samples = (tmp_path / "r" / "samples.txt").read_text(encoding="utf-8")
    for path in (tmp_path / "r").glob("*.pt"):
        path.unlink()
    train(tiny_config(corpus, tmp_path, *items, "train.max_steps=3"), run_name="r", progress=False)
    aside = tmp_path / "r" / "earlier_attempt_1"
    assert (aside / "samples.txt").read_text(encoding="utf-8") == first_samples
    assert len(list(aside.glob("events.out.tfevents.*"))) == 1
    samples = (tmp_path / "r" / "samples.txt").read_text(encoding="utf-8")
    assert re.findall(r"^--- step (\d+) ---$", samples, flags=re.M) == ["3"]


def test_a_resume_that_evaluates_at_other_steps_drops_the_killed_sessions_samples_past_its_checkpoint(
        corpus, tmp_path, monkeypatch):
    """Killed at step 9's save (checkpoint at 6), resumed with train.eval_interval 5: the killed session's
    sample of step 9 came from weights no checkpoint holds, and the resume never samples step 9 again."""
    items = ("train.max_steps=10", "train.eval_interval=3", "train.show=[sample]")
    killed_at_the_save_of_step_9(monkeypatch, tiny_config(corpus, tmp_path, *items), "k")
    train(tiny_config(corpus, tmp_path, *items, "train.eval_interval=5"), run_name="k", resume=True,
          progress=False, overrides=["train.eval_interval=5"])
    text = (tmp_path / "k" / "samples.txt").read_text(encoding="utf-8")
    assert re.findall(r"^--- step (\d+) ---$", text, flags=re.M) == ["3", "6", "10"]


def test_a_new_run_sets_an_earlier_attempt_aside_beside_one_set_aside_before(corpus, tmp_path, capsys):
    run = tmp_path / "r"
    (run / "earlier_attempt_1").mkdir(parents=True)
    (run / ".tinyattn-run").touch()  # a run folder whose attempts died before their first checkpoint
    (run / "earlier_attempt_1" / "samples.txt").write_text("the first attempt's", encoding="utf-8")
    (run / "samples.txt").write_text("the second attempt's", encoding="utf-8")
    train(tiny_config(corpus, tmp_path, "train.max_steps=1"), run_name="r", progress=False)
    assert (run / "earlier_attempt_1" / "samples.txt").read_text(encoding="utf-8") == "the first attempt's"
    assert (run / "earlier_attempt_2" / "samples.txt").read_text(encoding="utf-8") == "the second attempt's"


def test_cutting_samples_past_a_step_reads_a_header_like_line_of_text_past_it_as_text(tmp_path):
    from tinyattn.train.log import cut_samples_after

    path = tmp_path / "samples.txt"
    path.write_text("--- step 3 ---\na\n--- step 9 ---\n--- step x ---\nb\n--- step 12 ---\nc\n")
    cut_samples_after(path, 6)
    assert path.read_text() == "--- step 3 ---\na\n"


def test_learning_rate_schedule():
    config = load_config(TINY, ["train.lr=1.0", "train.min_lr=0.1", "train.warmup_steps=10",
                                "train.max_steps=111", "train.schedule=cosine"]).train
    assert learning_rate(0, config) == pytest.approx(0.1)  # warmup starts above zero
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(10, config) == pytest.approx(1.0)  # the first step after warmup: the peak
    assert learning_rate(60, config) == pytest.approx(0.55)  # cosine midpoint of steps 10..110
    assert learning_rate(110, config) == pytest.approx(0.1)  # the last step trains at the floor
    config.schedule = "linear"
    assert learning_rate(35, config) == pytest.approx(1.0 - 0.9 * 0.25)
    assert learning_rate(110, config) == pytest.approx(0.1)


class ListBatches:
    """A batch source that hands out given (x, y) batches in order (the Trainer's seam)."""

    def __init__(self, batches):
        self.queue = list(batches)
        self.batch_size, self.context_length = self.queue[0][0].shape

    def next_batch(self):
        return self.queue.pop(0)

    def plan_end(self, batches):
        pass  # given batches have no passes to end


class RecordGradients(torch.optim.Optimizer):
    """An optimizer whose step keeps a copy of every gradient and moves nothing."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = []

    def step(self, closure=None):
        self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]


def test_gradient_accumulation_equals_one_large_batch(corpus, tmp_path):
    from tinyattn.model.transformer import LanguageModel
    from tinyattn.system.device import select_precision
    from tinyattn.train.optim import Optimizers

    cpu = torch.device("cpu")
    # Tied: an untied head starts at zero, so at the first step only the head has a gradient.
    config = tiny_config(corpus, tmp_path, "train.grad_clip=0", "model.vocab_size=67", "model.tie_embeddings=true")
    tokens = np.random.default_rng(0).integers(0, 67, size=(8, 33))
    batch = torch.from_numpy(tokens)
    x, y = batch[:, :-1], batch[:, 1:]

    def gradients(micro_batches):
        """(every parameter's gradient, the loss train_step returns)"""
        torch.manual_seed(0)
        model = LanguageModel(config.model)
        recorder = RecordGradients(model.parameters())
        config.train.grad_accum_steps = len(micro_batches)
        trainer = Trainer(model, Optimizers([recorder]), ListBatches(micro_batches), config.train, device=cpu,
                          precision=select_precision("fp32", cpu))
        loss, _ = trainer.train_step()
        return recorder.grads, loss.item()

    (whole, whole_loss), (halves, halves_loss), (quarters, quarters_loss) = (
        gradients([(x, y)]), gradients([(x[:4], y[:4]), (x[4:], y[4:])]),
        gradients([(x[i:i + 2], y[i:i + 2]) for i in range(0, 8, 2)]))
    # The loss logged is the mean over the whole batch too, not the last micro-batch's share.
    assert [halves_loss, quarters_loss] == pytest.approx([whole_loss] * 2, rel=1e-6)
    assert len(whole) == len(list(LanguageModel(config.model).parameters()))
    for a, b, c in zip(whole, halves, quarters):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


def test_a_checkpoint_whose_sampler_state_predates_the_windows_drawn_resumes_at_another_batch_size(corpus,
                                                                                                   tmp_path):
    """Its windows drawn are its batches times the batch size of its config, not of the resume's."""
    extra = ("train.max_steps=4", "train.eval_interval=2", "train.sampling=passes", "train.batch_size=4")
    train(tiny_config(corpus, tmp_path, *extra), run_name="run", progress=False, stop_at_step=2)
    path = tmp_path / "run" / ckpt.step_filename(2)
    state = ckpt.load_checkpoint(path)
    for key in ("windows_drawn", "batch_size"):  # as checkpoints written before the sampler held them
        state["sampler"].pop(key, None)
    ckpt.save_checkpoint(state, path)
    train(tiny_config(corpus, tmp_path, *extra, "train.batch_size=8"), run_name="run", resume=True, progress=False)
    sampler = ckpt.load_checkpoint(tmp_path / "run" / ckpt.step_filename(4))["sampler"]
    assert sampler["windows_drawn"] == 2 * 4 + 2 * 8


def test_a_resume_that_halves_the_batch_and_doubles_the_accumulation_ends_its_passes_with_the_run(
        corpus, tmp_path):
    # The Trainer told the sampler the run's total batches at the new accumulation, counted against
    # the batches drawn at the old: the passes were sized for a longer run, and the last one cut short.
    small = tmp_path / "small.txt"  # 2,880 training tokens: 89 windows of 32 a pass, so 128 windows make two
    small.write_text(corpus.read_text(encoding="utf-8")[:3200], encoding="utf-8")
    extra = ("train.max_steps=16", "train.eval_interval=8", "train.sampling=passes", "train.batch_size=8")
    train(tiny_config(small, tmp_path, *extra), run_name="straight", progress=False)
    train(tiny_config(small, tmp_path, *extra), run_name="split", progress=False, stop_at_step=8)
    train(tiny_config(small, tmp_path, *extra, "train.batch_size=4", "train.grad_accum_steps=2"),
          run_name="split", resume=True, progress=False)
    straight, split = (ckpt.load_checkpoint(tmp_path / name / ckpt.step_filename(16))["sampler"]
                       for name in ("straight", "split"))
    assert len(straight["pass_starts"]) == 2  # the run makes passes to end
    assert (split["windows_drawn"], split["pass_starts"]) == (straight["windows_drawn"], straight["pass_starts"])


@pytest.mark.parametrize("sampling, ema, peak_flops", [("random", None, "null"), ("passes", None, "1e12"),
                                                       ("passes", 0.8, "1e12")])
def test_resume_is_exact(corpus, tmp_path, count_train_steps, monkeypatch, sampling, ema, peak_flops):
    # peak_flops null (once): the start-up matmul measurement must not move the random generators;
    # it measures 256 x 256 only (a few ms a run, not half a second), drawing its matrices all the same.
    # With train.ema the checkpoint's "model" is the average: a resume that restarted it from the
    # weights would differ from the straight run's by far more than the tolerance.
    from tinyattn.system import device

    monkeypatch.setitem(device.PEAK_SIZE_LIMIT, "cpu", 256)
    extra = ("train.max_steps=8", "train.eval_interval=4", "model.dropout=0.1", "train.precision=fp32",
             f"train.peak_flops={peak_flops}", f"train.sampling={sampling}", f"train.ema={ema or 'null'}")
    straight = train(tiny_config(corpus, tmp_path, *extra), run_name="straight", progress=False)
    first = train(tiny_config(corpus, tmp_path, *extra), run_name="split", progress=False, stop_at_step=4)
    assert first.step == 4
    steps = count_train_steps()
    resumed = train(tiny_config(corpus, tmp_path, *extra), run_name="split", resume=True, progress=False)
    # Only the steps left: a restore that did nothing would retrain them all from the seed and match.
    assert resumed.step == 8 and steps.calls == 4
    a = ckpt.load_checkpoint(straight.run_dir / "step_0000008.pt")
    b = ckpt.load_checkpoint(resumed.run_dir / "step_0000008.pt")
    # Within 1e-6, not bitwise: an op in the CPU backward accumulates in a thread-dependent
    # order (two fresh runs differ by ~1e-8 per step; torch.use_deterministic_algorithms
    # removes it). A wrong batch, learning rate or random state would differ by ~1e-2.
    for key in ("model", "trained_model") if ema else ("model",):
        for name, tensor in a[key].items():
            torch.testing.assert_close(tensor, b[key][name], rtol=0, atol=1e-6, msg=f"{key}: {name}")
    assert a["tokens_seen"] == b["tokens_seen"] and a["sampler"] == b["sampler"]
    assert a["best_val_loss"] == pytest.approx(b["best_val_loss"], abs=1e-6)


@pytest.mark.parametrize("entry, here_holds", [("data/corpus.txt", "nothing"),
                                               ("data/corpus.txt", "another text"),
                                               ("data/*.txt", "nothing"), ("data", "another text")])
def test_a_run_resumed_from_another_folder_reads_its_relative_data_where_it_started(
        corpus, tmp_path, monkeypatch, capsys, entry, here_holds):
    # Read from the folder run from, the run's data.files would be missing (and, with data.url,
    # downloaded again), or another text of that name that the data check refuses.
    start, items = run_started_in(corpus, tmp_path, monkeypatch, f"data.files=[{entry}]")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    if here_holds == "another text":
        (elsewhere / "data" / "corpus.txt").write_text("not the run's text\n" * 400, encoding="utf-8")
    monkeypatch.chdir(elsewhere)
    resumed = train(load_config(TINY, items), run_name="run", resume=True, progress=False)
    assert resumed.step == 8
    assert (f"note: data.files and data.cache_dir read from {start}, the folder the run started in"
            in capsys.readouterr().err)
    assert not (elsewhere / "data" / "cache").exists()  # the run's token cache, not a second one here
    assert (yaml.safe_load((tmp_path / "runs" / "run" / "config.yaml").read_text())["data"]["files"]
            == [entry])  # the run's own spelling stays


def test_a_data_path_given_to_a_resume_from_another_folder_is_read_from_the_folder_run_from(
        corpus, tmp_path, monkeypatch):
    start, items = run_started_in(corpus, tmp_path, monkeypatch)
    (start / "data" / "given.txt").write_text("not the run's text\n" * 400, encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    shutil.copy(corpus, elsewhere / "data" / "given.txt")  # the run's text, under the name the user gives
    monkeypatch.chdir(elsewhere)
    given = [*items, "data.files=[data/given.txt]"]
    assert train(load_config(TINY, given), run_name="run", resume=True, progress=False).step == 8


def test_a_run_whose_start_folder_moved_reads_and_records_the_folder_it_resumed_from(
        corpus, tmp_path, monkeypatch):
    start, items = run_started_in(corpus, tmp_path, monkeypatch, "train.max_steps=12")
    moved = start.rename(tmp_path / "moved")
    monkeypatch.chdir(moved)  # the project moved: its relative paths are read here
    train(load_config(TINY, items), run_name="run", resume=True, progress=False, stop_at_step=8)
    latest = ckpt.load_checkpoint(tmp_path / "runs" / "run" / ckpt.step_filename(8))
    assert latest[ckpt.START_FOLDER] == str(moved)
    monkeypatch.chdir(tmp_path)  # and a later resume from elsewhere reads them where it moved
    assert train(load_config(TINY, items), run_name="run", resume=True, progress=False).step == 12


def test_compiled_training_under_a_lowered_capability_uses_its_own_compile_cache(corpus, tmp_path, monkeypatch):
    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision

    import torch._inductor.runtime.cache_dir_utils  # noqa: F401  (first: tests/test_generate.py's twin says why)

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    config = tiny_config(corpus, tmp_path, "train.max_steps=2", "train.compile=true")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    cpu = torch.device("cpu")
    Trainer.build(config.model, config.train, data.train, device=cpu, precision=select_precision("fp32", cpu))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2")  # compiled at the first step, not here


def test_a_trainer_takes_back_what_it_saved_and_an_average_added_on_resume_starts_from_it(corpus, tmp_path):
    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision

    cpu, fp32 = torch.device("cpu"), select_precision("fp32", torch.device("cpu"))

    def trainer_of(*extra):
        config = tiny_config(corpus, tmp_path, "train.max_steps=6", *extra)
        data = prepare_data(config, progress=False)
        config.model.vocab_size = data.tokenizer.vocab_size
        return Trainer.build(config.model, config.train, data.train, device=cpu, precision=fp32), config

    saved, config = trainer_of()
    saved.train_step()
    saved.train_step()
    saved.best_val_loss = 2.5
    state = saved.state_dict()
    resumed, _ = trainer_of("train.ema=0.9")  # the average asked for only now
    resumed.load_state_dict(state, tmp_path / "step.pt")
    assert (resumed.step, resumed.tokens_seen, resumed.best_val_loss) == (2, saved.tokens_seen, 2.5)
    with resumed.evaluated_weights():  # the average starts from the loaded weights, not the random init
        for name, p in resumed.model.named_parameters():
            torch.testing.assert_close(p, saved.model.state_dict()[name], rtol=0, atol=0, msg=name)
    # Accumulated micro-batches count as tokens seen: B * T per micro-batch.
    accumulating, _ = trainer_of("train.grad_accum_steps=2")
    accumulating.train_step()
    assert accumulating.tokens_seen == 2 * config.train.batch_size * config.model.context_length


def test_a_checkpoint_saved_without_loss_scaling_resumes_into_an_fp16_run_with_a_fresh_scaler(
        corpus, tmp_path):
    # An fp32 or bf16 run saves a switched-off GradScaler's empty state; a resume in fp16 (--set
    # train.precision=fp16, or `auto` on an older GPU) switches one on, which refused that state.
    from pathlib import Path

    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import Precision, select_precision

    config = tiny_config(corpus, tmp_path, "train.max_steps=4")
    cpu = torch.device("cpu")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    saved = Trainer.build(config.model, config.train, data.train, device=cpu,
                          precision=select_precision("fp32", cpu))
    saved.train_step()
    state = saved.state_dict()
    assert state["scaler"] == {}
    fp16 = Precision("fp16", torch.float16, use_grad_scaler=True)  # as on a GPU; the CPU refuses fp16 runs
    resumed = Trainer.build(config.model, config.train, data.train, device=cpu, precision=fp16)
    resumed.load_state_dict(state, Path("step_0000001.pt"))
    assert resumed.step == 1 and resumed.scaler.is_enabled()


def test_an_fp16_runs_loss_scale_is_restored_on_resume(corpus, tmp_path):
    # The scale an fp16 run reached (lowered after overflows) goes on, not GradScaler's 65536 again.
    from pathlib import Path

    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import Precision

    config = tiny_config(corpus, tmp_path, "train.max_steps=4")
    cpu = torch.device("cpu")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    fp16 = Precision("fp16", torch.float16, use_grad_scaler=True)  # as on a GPU; the CPU refuses fp16 runs
    saved = Trainer.build(config.model, config.train, data.train, device=cpu, precision=fp16)
    saved.train_step()
    saved.scaler.update(1024.0)  # as a run whose scale came down after overflows
    state = saved.state_dict()
    assert state["scaler"]["scale"] == 1024.0
    resumed = Trainer.build(config.model, config.train, data.train, device=cpu, precision=fp16)
    resumed.load_state_dict(state, Path("step_0000001.pt"))
    assert resumed.scaler.get_scale() == 1024.0
    assert resumed.scaler.state_dict() == state["scaler"]


@pytest.mark.parametrize("missing", ["0.weight", "1.weight"])  # the first of the names too
def test_an_average_saved_without_one_of_the_weights_is_refused_naming_it(missing):
    """A checkpoint's average ("model") that lacks a trained weight: refused naming the weight, the
    average left as it was; a whole one is taken back exactly."""
    from tinyattn.train.averaging import WeightAverage

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    average = WeightAverage(model, 0.8)
    saved = average.model_state_dict()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    average.update()
    before = [a.clone() for a in average.averages]
    with pytest.raises(KeyError, match=rf"the saved average has no '{missing}'"):
        average.load_model_state_dict({k: v for k, v in saved.items() if k != missing})
    assert all(torch.equal(a, b) for a, b in zip(average.averages, before))
    average.load_model_state_dict(saved)
    assert all(torch.equal(a, saved[name]) for name, a in zip(average.names, average.averages))


@pytest.mark.parametrize("decay", [0.0, 1.0])
def test_an_average_whose_decay_is_not_strictly_between_zero_and_one_is_refused(decay):
    """decay 1 would never move from the first weights, decay 0 would be the weights themselves."""
    from tinyattn.train.averaging import WeightAverage

    with pytest.raises(ValueError, match=f"between 0 and 1, got {decay}"):
        WeightAverage(torch.nn.Linear(4, 3), decay)


def test_an_average_loaded_from_another_device_is_on_the_models():
    """A checkpoint is read onto the CPU (`load_checkpoint`); the averages go to the model's device,
    where every update lerps them with its weights (a "meta" model stands for a GPU's here)."""
    from tinyattn.train.averaging import WeightAverage

    average = WeightAverage(torch.nn.Linear(4, 3, device="meta"), 0.8)
    average.load_model_state_dict({"weight": torch.zeros(3, 4), "bias": torch.zeros(3)})
    assert [a.device.type for a in average.averages] == ["meta", "meta"]
    average.update()


@pytest.mark.parametrize("tied", [False, True])  # tied: the head's name must hold the average too
def test_the_moving_average_is_what_a_run_evaluates_and_saves(corpus, tmp_path, tied):
    from tinyattn.analysis.evaluate import loss_by_position
    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision

    # decay 0.8, not 0.5: at 0.5 the decay and its complement are the same number, and swapping them passes
    config = tiny_config(corpus, tmp_path, "train.ema=0.8", "train.max_steps=6", f"model.tie_embeddings={tied}")
    cpu = torch.device("cpu")
    data = prepare_data(config, progress=False)
    config.model.vocab_size = data.tokenizer.vocab_size
    trainer = Trainer.build(config.model, config.train, data.train, device=cpu, precision=select_precision("fp32", cpu))
    weights = [{k: v.clone() for k, v in trainer.model.state_dict().items()}]
    for _ in range(3):
        trainer.train_step()
        weights.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    state = trainer.state_dict()
    for name, p in trainer.model.named_parameters():
        expected = weights[0][name]
        for w in weights[1:]:
            expected = 0.8 * expected + 0.2 * w[name]  # average_t = decay * average_(t-1) + (1 - decay) * w_t
        torch.testing.assert_close(state["model"][name], expected, msg=name)
        torch.testing.assert_close(state["trained_model"][name], p.detach(), rtol=0, atol=0, msg=name)
        assert not torch.equal(expected, p.detach())  # the two differ: the check above can fail
    with trainer.evaluated_weights():
        inside = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(inside[name], state["model"][name], rtol=0, atol=0, msg=name)
        assert torch.equal(p.detach(), weights[-1][name])  # the trained weights back after the block

    # A whole run: best.pt holds the average, and its validation loss is the one the run reported.
    result = train(config, run_name="ema", progress=False)
    loaded = ckpt.load_model(result.run_dir / "best.pt")
    losses = loss_by_position(loaded.model, data.validation, config.model.context_length,
                              config.train.batch_size, config.train.eval_windows)
    assert float(losses.mean()) == pytest.approx(result.best_val_loss, abs=1e-6)


@pytest.mark.slow  # torch.compile (dynamo, eager backend)
def test_compiled_training_saves_the_plain_module(corpus, tmp_path, monkeypatch):
    # torch.compile wraps the module whatever the backend; dynamo's "eager" backend makes
    # the same wrapper without inductor's C++ build, so the test takes seconds, not half a minute.
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    result = train(tiny_config(corpus, tmp_path, "train.compile=true", "train.max_steps=3",
                               "train.eval_interval=3"), run_name="compiled", progress=False)
    state = ckpt.load_checkpoint(result.run_dir / "best.pt")
    assert not any(key.startswith(("_orig_mod", "module")) for key in state["model"])
    loaded = ckpt.load_model(result.run_dir)  # loads into an uncompiled model as it is
    assert loaded.step == 3


def test_the_step_that_compiles_the_model_is_timed_as_compile_and_left_out_of_the_throughput(
        corpus, tmp_path, monkeypatch, capsys):
    # A run of train.max_steps with train.compile: the first step's compiling was training time, and the
    # last line said "train 74.0 s (94.0%) ..., 21 tok/s" where the steps ran at 20,000 tok/s. A time
    # budget's calibration compiles before step 1 and says so; this is a step count's first step (and a
    # resumed session's). The compiler here takes a second at its first call, as a compile does: a
    # second on the clock every timer reads (time.perf_counter, the run's clock), without the wait.
    skipped = [0.0]
    real_clock = time.perf_counter

    def clock() -> float:
        return real_clock() + skipped[0]

    class SlowFirstCall(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, *args):
            self.calls += 1
            if self.calls == 1:
                skipped[0] += 1.0
            return self.module(*args)

    monkeypatch.setattr(torch, "compile", SlowFirstCall)
    monkeypatch.setattr(time, "perf_counter", clock)
    config = tiny_config(corpus, tmp_path, "train.compile=true", "train.max_steps=6", "train.eval_interval=6",
                         "train.log_interval=1")
    result = train(config, run_name="compiled", progress=False, clock=clock)
    err = capsys.readouterr().err
    assert result.seconds["compile"] >= 1.0 > result.seconds["train"]
    assert "step 1: loss " in err and "the step that compiled the model" in err.split("step 2:")[0]
    tokens = 6 * 4 * 32  # six steps of batch 4, context 32
    assert result.tokens_per_second > 2 * tokens / (result.seconds["train"] + result.seconds["compile"])
    assert re.search(r"done: 6 steps in [\d.]+ s \(start-up [\d.]+ s \([\d.]+%\), compile 1\.\d s", err), err


def test_a_session_of_the_one_step_that_compiled_the_model_says_it_timed_no_step(
        corpus, tmp_path, monkeypatch, capsys):
    # Its step is compiling's, left out of the throughput: none is left to time, and the last line said
    # "..., compile 0.2 s (86.2%)), nan tok/s" (a resumed session of one step too).
    monkeypatch.setattr(torch, "compile", lambda module: module)
    config = tiny_config(corpus, tmp_path, "train.compile=true", "train.max_steps=1", "train.eval_interval=1")
    result = train(config, run_name="one", progress=False)
    lines = capsys.readouterr().err.splitlines()
    first, done = next(line for line in lines if line.startswith("run ")), lines[-1]
    assert first.endswith(" train tokens, 1 step"), first  # not "1 steps"
    assert math.isnan(result.tokens_per_second) and "compile" in result.seconds
    assert re.search(r"^done: 1 step in [\d.]+ s \(.*compile [\d.]+ s .*\), no tok/s \(its one step "
                     r"compiled the model\), best validation loss ", done), done


def test_resume_names_the_run_it_cannot_find_and_refuses_a_changed_tokenizer(corpus, tmp_path):
    config = tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2")
    train(config, run_name="real", progress=False)
    with pytest.raises(CheckpointError, match=r"typo: no such run to resume"):
        train(tiny_config(corpus, tmp_path), run_name="typo", resume=True, progress=False)
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text(encoding="utf-8")[:30_000] + "ZZZ{}~", encoding="utf-8")
    changed = load_config(TINY, tiny_overrides(other, tmp_path, "train.max_steps=4"))
    with pytest.raises(CheckpointError, match="its tokenizer differs"):
        train(changed, run_name="real", resume=True, progress=False)


def _file_digests(folder: Path) -> dict:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.pt"))}


def _tree_digests(folder: Path) -> dict:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class TrainedOnce:
    """A folder of runs trained once a module (a process, under pytest-xdist) and given back to each
    test as the training left it, at the path it was trained under: its config.yaml, data.json,
    checkpoints and train.log name that folder (train.out_dir, data.cache_dir), never the copy kept
    of it, so a test's resume or fine-tune writes and reads only the folder it was given."""

    def __init__(self, tmp_path_factory, name: str, build):
        self.folder = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as patch:  # as no_fsync does for each test
            patch.setattr(os, "fsync", lambda fd: None)
            build(self.folder)
        self.kept = tmp_path_factory.mktemp(f"{name}_as_trained")
        shutil.copytree(self.folder, self.kept, dirs_exist_ok=True)
        self.digests = _tree_digests(self.kept)

    def fresh(self) -> Path:
        """The folder as its training left it: what the test before wrote there is gone."""
        shutil.rmtree(self.folder)
        shutil.copytree(self.kept, self.folder)
        assert _tree_digests(self.folder) == self.digests
        return self.folder


@pytest.fixture(scope="module")
def twelve_steps_trained(corpus, tmp_path_factory) -> TrainedOnce:
    def build(out):
        train(tiny_config(corpus, out, "train.max_steps=12", "train.eval_interval=3", "train.keep_last=4"),
              run_name="orig", progress=False)

    return TrainedOnce(tmp_path_factory, "twelve_steps", build)


@pytest.fixture
def twelve_steps(twelve_steps_trained):
    """A run 'orig' of 12 steps with checkpoints at 3, 6, 9, 12, its data cache beside it, in a folder
    of their own (run.parent): the test may write there. Returns (its folder, digests)."""
    run = twelve_steps_trained.fresh() / "orig"
    return run, _file_digests(run)


def test_a_fine_tune_of_a_folder_whose_best_pt_is_damaged_logs_the_checkpoint_it_read(corpus,
                                                                                      twelve_steps):
    # The console said "best.pt is damaged; using step_0000012.pt" before train.log was open, and the
    # run's config.yaml names only the folder: nothing kept which weights the fine-tune started from.
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    best = run / "best.pt"
    best.write_bytes(best.read_bytes()[:-100])  # cut short
    config = tiny_config(corpus, out, "train.max_steps=2", f"train.init_from={run}")
    result = train(config, run_name="tuned", progress=False)
    log = (result.run_dir / "train.log").read_text()
    assert f"note: train.init_from {run}: the weights come from {run / 'step_0000012.pt'}" in log
    tuned = tiny_config(corpus, out, "train.max_steps=2", f"train.init_from={run / 'step_0000009.pt'}")
    log = (train(tuned, run_name="named", progress=False).run_dir / "train.log").read_text()
    assert "the weights come from" not in log  # the file the user named: nothing to add


def test_a_fine_tune_of_a_folder_whose_best_pt_is_read_notes_nothing(tmp_path):
    """best.pt is what naming a folder means: only another checkpoint read instead is worth a note."""
    from tinyattn.config import ModelConfig, TokenizerConfig
    from tinyattn.train.finetune import InitSource

    def source(file):
        return InitSource(str(tmp_path), tmp_path / file, ModelConfig(), TokenizerConfig(), tmp_path, {})

    assert source(ckpt.BEST).notes() == []
    assert source("step_0000012.pt").notes() == [
        f"note: train.init_from {tmp_path}: the weights come from {tmp_path / 'step_0000012.pt'}"]


def test_a_fine_tune_takes_the_end_of_text_token_of_its_source(tmp_path):
    """A Llama folder's "</s>" ends the fine-tune's texts and its generation too."""
    from tinyattn.config import Config, ModelConfig, TokenizerConfig
    from tinyattn.train.finetune import InitSource

    tokenizer = TokenizerConfig(kind="pretrained", path=str(tmp_path / "tokenizer.json"), end_of_text="</s>")
    source = InitSource(str(tmp_path), tmp_path / "model.safetensors", ModelConfig(), tokenizer,
                        tmp_path / "tokenizer.json", {})
    config = Config()
    source.adopt(config, written=())
    assert (config.tokenizer.kind, config.tokenizer.end_of_text) == ("pretrained", "</s>")


def test_resuming_an_earlier_checkpoint_with_a_new_run_name_forks(corpus, twelve_steps):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    result = train(tiny_config(corpus, out, "train.max_steps=12", "train.eval_interval=3",
                               "train.keep_last=4", "train.lr=5e-3"),
                   run_name="fork", resume=run / "step_0000006.pt", progress=False)
    assert result.run_dir == out / "fork" and result.step == 12
    assert _file_digests(run) == before  # the original is never written
    fork = out / "fork"
    assert [p.name for p in ckpt.step_checkpoints(fork)] == [ckpt.step_filename(s) for s in (6, 9, 12)]
    start = ckpt.load_checkpoint(fork / "step_0000006.pt")
    assert start["step"] == 6 and start["config"]["train"]["lr"] == pytest.approx(2e-3)  # the copy
    assert ckpt.load_checkpoint(fork / "step_0000012.pt")["config"]["train"]["lr"] == pytest.approx(5e-3)
    assert "forked from" in (fork / "train.log").read_text(encoding="utf-8")



def test_a_fork_that_fails_before_its_first_step_leaves_no_folder_behind(corpus, twelve_steps):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    fork_from = run / "step_0000006.pt"  # named, as a fork starts from it
    with pytest.raises(TinyattnError,
                       match=rf"^--stop-at-step 5: {re.escape(str(fork_from))} is already at step 6"):
        train(tiny_config(corpus, out, "train.max_steps=12"), run_name="fork",
              resume=run / "step_0000006.pt", stop_at_step=5, progress=False)
    assert not (out / "fork").exists()
    assert _file_digests(run) == before
    # A folder the user made for it is not this command's to take back
    (out / "made").mkdir()
    with pytest.raises(TinyattnError, match=r"^--stop-at-step 5: "):
        train(tiny_config(corpus, out, "train.max_steps=12"), run_name="made",
              resume=run / "step_0000006.pt", stop_at_step=5, progress=False)
    assert (out / "made").is_dir() and _file_digests(run) == before

def test_a_new_named_run_that_fails_before_its_first_step_leaves_no_folder_behind(corpus, tmp_path):
    config = tiny_config(corpus, tmp_path, f"data.files={tmp_path / 'missing.txt'}")
    with pytest.raises(TinyattnError, match="missing.txt"):
        train(config, run_name="fresh", progress=False)
    assert not (tmp_path / "fresh").exists()


def test_a_fork_never_takes_a_later_best_nor_trains_into_another_runs_checkpoints(corpus, twelve_steps):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    assert ckpt.saved_value(run / "best.pt", "step") > 6  # the original's best is past the fork's start
    from tinyattn.train.resume import ResumePoint

    (out / "fork").mkdir()
    ResumePoint.find(run / "step_0000006.pt", "fork", out).fork_into(out / "fork")
    assert sorted(p.name for p in (out / "fork").iterdir()) == ["step_0000006.pt"]  # no later best.pt
    config = tiny_config(corpus, out, "train.max_steps=12", "train.eval_interval=3", "train.keep_last=4")
    train(tiny_config(corpus, out, "train.max_steps=3", "train.eval_interval=3"), run_name="other",
          progress=False)
    other = _file_digests(out / "other")
    with pytest.raises(CheckpointError, match=r"other already holds checkpoints"):
        train(config, run_name="other", resume=run / "step_0000006.pt", progress=False)
    assert _file_digests(out / "other") == other and _file_digests(run) == before


def test_a_fork_refused_for_a_folder_with_checkpoints_leaves_that_folder_unheld(tmp_path):
    # A pid file left there would tell the folder's next run that a killed training held it.
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.resume import ResumePoint, open_run_folder
    from tinyattn.train.run_folder import RunLock

    config = load_config(TINY, [f"train.out_dir={tmp_path}"])
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / ckpt.step_filename(2)).touch()
    point = ResumePoint(tmp_path / "orig" / ckpt.step_filename(4), {}, config, 4)
    with pytest.raises(CheckpointError, match=r"taken already holds checkpoints"):
        open_run_folder(config, None, "taken", point, Distributed())
    assert not (taken / ".lock").exists() and RunLock.holder(taken) is None


def test_a_fork_from_the_step_of_the_originals_best_takes_its_best_pt(corpus, twelve_steps):
    # Without it the fork's best.pt would only come from an evaluation that beats the loss the
    # checkpoint carries, perhaps never: the fork's "best" model would be missing.
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    from tinyattn.train.resume import ResumePoint

    best_step = ckpt.saved_value(run / "best.pt", "step")
    (out / "fork").mkdir()
    ResumePoint.find(run / ckpt.step_filename(best_step), "fork", out).fork_into(out / "fork")
    assert sorted(p.name for p in (out / "fork").iterdir()) == ["best.pt", ckpt.step_filename(best_step)]
    assert (out / "fork" / "best.pt").read_bytes() == (run / "best.pt").read_bytes()


def test_a_fork_without_the_originals_best_pt_starts_its_best_afresh_and_resumes_exactly(
        corpus, twelve_steps):
    """A fork from before the original's best.pt kept the checkpoint's best loss, reached at a step
    the fork does not have: no evaluation beat it, so no best.pt, and the run reported a loss whose
    model was not in its folder. The step-6 checkpoint is given a best of 0.5 (as if an earlier
    step had reached it), which nothing here beats."""
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    assert ckpt.saved_value(run / "best.pt", "step") > 6
    start = ckpt.load_checkpoint(run / "step_0000006.pt")
    ckpt.save_checkpoint({**start, "best_val_loss": 0.5}, run / "step_0000006.pt")
    config = tiny_config(corpus, out, "train.max_steps=12", "train.eval_interval=3", "train.keep_last=4")
    result = train(config, run_name="fork", resume=run / "step_0000006.pt", progress=False)
    fork = out / "fork"
    assert ckpt.saved_value(fork / "step_0000006.pt", "best_val_loss") == math.inf  # as the fork started
    best = ckpt.load_checkpoint(fork / "best.pt")
    assert best["step"] in (9, 12) and result.best_val_loss == best["best_val_loss"] > 0.5
    # Stopped before its first evaluation and resumed in place, the fork ends as it did at once.
    train(config, run_name="split", resume=run / "step_0000006.pt", stop_at_step=7, progress=False)
    again = train(config, run_name="split", resume=True, progress=False)
    assert again.best_val_loss == result.best_val_loss
    assert ckpt.saved_value(out / "split" / "best.pt", "step") == best["step"]


def test_a_checkpoint_saved_before_the_schedule_ended_at_the_floor_resumes_with_a_note(
        corpus, twelve_steps):
    # Its plan state lacks ends_at_floor: the run continues with today's schedule, and says so once;
    # a checkpoint of today's code resumes without the note.
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    config = tiny_config(corpus, out, "train.max_steps=18", "train.eval_interval=3", "train.keep_last=4")
    train(config, run_name="orig", resume=True, stop_at_step=15, progress=False)
    log = (run / "train.log").read_text()
    assert "was saved before 2026-12-05" not in log
    state = ckpt.load_checkpoint(run / "step_0000015.pt")
    assert state["plan"] == {"kind": "steps", "ends_at_floor": True}
    ckpt.save_checkpoint({**state, "plan": {"kind": "steps"}}, run / "step_0000015.pt")
    train(config, run_name="orig", resume=True, progress=False)
    log = (run / "train.log").read_text()
    note = f"note: {run / 'step_0000015.pt'} was saved before 2026-12-05, when a schedule's last step"
    assert log.count(note) == 1


def test_a_resume_in_place_whose_best_pt_is_gone_starts_its_best_afresh(corpus, twelve_steps):
    """best.pt deleted (or damaged) before a resume in place: the checkpoint's best of 0.5, which
    nothing here beats, would leave the run without a best.pt and report a loss whose model is not
    in its folder; its first evaluation writes best.pt instead."""
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    inplace = out / "inplace"
    shutil.copytree(run, inplace)
    for name in ("best.pt", "step_0000009.pt", "step_0000012.pt"):
        (inplace / name).unlink(missing_ok=True)
    start = ckpt.load_checkpoint(inplace / "step_0000006.pt")
    ckpt.save_checkpoint({**start, "best_val_loss": 0.5}, inplace / "step_0000006.pt")
    config = tiny_config(corpus, out, "train.max_steps=12", "train.eval_interval=3", "train.keep_last=4")
    result = train(config, run_name="inplace", resume=True, progress=False)
    best = ckpt.load_checkpoint(inplace / "best.pt")
    assert best["step"] in (9, 12) and result.best_val_loss == best["best_val_loss"] > 0.5


def test_a_resume_in_place_whose_best_pt_fails_its_crc_check_writes_a_best_pt_that_verifies(
        corpus, tmp_path, monkeypatch):
    """Bit rot in best.pt's weights (its step and loss still read): the run went on with the best of 2.0
    that no later evaluation beat, so the damaged best.pt stayed for good; every `--checkpoint <run>`
    then noted it and fell back to a step checkpoint, and train.keep_last pruned those in turn."""
    from tinyattn.train.owners import EvalResult, Evaluator

    losses = {3: 3.0, 6: 2.0, 9: 2.5, 12: 2.6}
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(32, losses[step])))
    items = ("train.eval_interval=3", "train.keep_last=1")
    train(tiny_config(corpus, tmp_path, "train.max_steps=6", *items), run_name="run", progress=False)
    best = tmp_path / "run" / ckpt.BEST
    size = best.stat().st_size
    with open(best, "r+b") as f:  # 4 KB of the weights overwritten in place, same size
        f.seek(size // 2)
        f.write(bytes(4096))
    assert ckpt.verify_checkpoint(best) and ckpt.saved_value(best, "step") == 6  # damaged, yet it reads
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), run_name="run", resume=True,
                   progress=False)
    assert ckpt.verify_checkpoint(best) is None
    assert (ckpt.load_checkpoint(best)["step"], result.best_val_loss) == (9, 2.5)


def test_a_floor_or_weight_decay_given_for_a_resume_wins_over_the_checkpoints_table_choice(tmp_path):
    from tinyattn.train.resume import ResumePoint

    tables = ["train.floor_by_passes={0: 0.5}", "train.decay_by_passes={0: 0.5}"]
    chosen = load_config(TINY, [*tables, "train.min_lr=1e-3", "train.weight_decay=0.5"])  # as the run saved
    point = ResumePoint(tmp_path / "step_0000010.pt", {}, chosen, 10)
    given = load_config(TINY, [*tables, "train.min_lr=1e-4", "train.weight_decay=0.01"])
    point.adopt(given, given=["train.min_lr", "train.weight_decay"])
    assert (given.train.min_lr, given.train.weight_decay) == (1e-4, 0.01)
    not_given = load_config(TINY, [*tables, "train.min_lr=1e-4", "train.weight_decay=0.01"])  # a --config file's
    point.adopt(not_given)
    assert (not_given.train.min_lr, not_given.train.weight_decay) == (1e-3, 0.5)


def test_a_resume_may_change_how_attention_is_computed_but_not_the_models_shape(tmp_path):
    from tinyattn.train.resume import ResumePoint

    point = ResumePoint(tmp_path / "step_0000010.pt", {}, load_config(TINY, ["model.attention=fused"]), 10)
    point.adopt(load_config(TINY, ["model.attention=explicit", "model.dropout=0.2"]))  # the same weights
    with pytest.raises(CheckpointError, match=r"the config's model differs from the checkpoint's: "
                                              r"model\.n_layer: checkpoint \d+, config 7$"):
        point.adopt(load_config(TINY, ["model.attention=explicit", "model.n_layer=7"]))


def test_a_resume_whose_config_leaves_the_vocabulary_size_unset_takes_the_checkpoints(tmp_path):
    # A run given a vocabulary above its tokenizer's, resumed with a config that does not give it
    # (its --config file without the --set): the model must be built at the checkpoint's size.
    from tinyattn.train.resume import ResumePoint

    point = ResumePoint(tmp_path / "step_0000010.pt", {}, load_config(TINY, ["model.vocab_size=96"]), 10)
    config = load_config(TINY)
    assert config.model.vocab_size is None
    point.adopt(config)
    assert config.model.vocab_size == 96


def test_a_resume_in_place_may_name_the_parent_of_the_link_it_is_reached_through_or_of_the_folder(tmp_path):
    from tinyattn.errors import ConfigError
    from tinyattn.train.resume import ResumePoint

    (tmp_path / "runs" / "orig").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "link").symlink_to(tmp_path / "runs" / "orig", target_is_directory=True)
    point = ResumePoint(tmp_path / "links" / "link" / "step_0000010.pt", {}, load_config(TINY), 10)
    for parent in (tmp_path / "links", tmp_path / "runs"):  # the link's, the folder's
        point.keep_out_dir(load_config(TINY, [f"train.out_dir={parent}"]), None, given=["train.out_dir"])
    with pytest.raises(ConfigError, match=rf"^train\.out_dir '{re.escape(str(tmp_path))}' \(--set\): "):
        point.keep_out_dir(load_config(TINY, [f"train.out_dir={tmp_path}"]), None, given=["train.out_dir"])


def test_a_time_budget_edited_into_the_config_yaml_of_a_step_count_run_is_refused_naming_the_edit(tmp_path):
    # As one given with --set: only a --config file's is turned off (its budget is the family's default).
    from tinyattn.errors import ConfigError
    from tinyattn.train.resume import ResumePoint

    run = tmp_path / "run"
    point = ResumePoint(run / "step_0000002.pt", {}, load_config(TINY, ["train.max_steps=4"]), 2,
                        edited=("train.time_budget",))
    config = load_config(TINY, ["train.max_steps=4", "train.time_budget=5m"])
    edited = re.escape(str(run / "config.yaml"))
    with pytest.raises(ConfigError, match=rf"^train\.time_budget 5m \(edited in {edited}\): "
                                          rf"the run {re.escape(str(run))} trains a step count"):
        point.adopt(config)


def test_a_bpe_run_resumed_with_another_vocabulary_size_is_refused_naming_the_key(tmp_path):
    # Refused from the settings, before any data is read: a BPE tokenizer would be trained for nothing.
    from tinyattn.train.resume import ResumePoint

    bpe = ["tokenizer.kind=bpe", "tokenizer.vocab_size=300"]
    point = ResumePoint(tmp_path / "step_0000010.pt", {}, load_config(TINY, bpe), 10)
    with pytest.raises(CheckpointError, match=r"the config's tokenizer differs from the checkpoint's: "
                                              r"tokenizer\.vocab_size: checkpoint 300, config 500; "):
        point.adopt(load_config(TINY, ["tokenizer.kind=bpe", "tokenizer.vocab_size=500"]))


def test_resuming_an_earlier_checkpoint_in_place_is_refused(corpus, twelve_steps, capsys):
    from tinyattn.cli.train import main

    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    with pytest.raises(CheckpointError, match=r"step_0000006\.pt is step 6, but .*orig goes on to step 12: "
                                              r".*--resume .*step_0000006\.pt --run-name NEW_NAME"):
        train(tiny_config(corpus, out, "train.max_steps=12"), resume=run / "step_0000006.pt",
              progress=False)
    assert main(["--resume", str(run / "step_0000006.pt"), "--no-progress", "--set",
                 f"train.out_dir={out}"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert _file_digests(run) == before


def test_resuming_in_place_the_step_just_before_the_folders_latest_is_refused(tmp_path):
    # A stop between evaluations saves at its own step, so a folder may hold steps N-1 and N: only N
    # continues in place (one step earlier would overwrite step N's checkpoint as well).
    from tinyattn.train.resume import ResumePoint

    run = tmp_path / "orig"
    run.mkdir()
    for step in (4, 5):
        (run / ckpt.step_filename(step)).touch()
    earlier = ResumePoint(run / ckpt.step_filename(4), {}, load_config(TINY), 4)
    with pytest.raises(CheckpointError, match=r"is step 4, but .*orig goes on to step 5: "):
        earlier.target(None, tmp_path)
    assert ResumePoint(run / ckpt.step_filename(5), {}, load_config(TINY), 5).target(None, tmp_path) == run


def test_the_commands_a_run_prints_work_where_its_path_holds_a_space(corpus, tmp_path, capsys, monkeypatch):
    """"Resume with: ..." and the fork advice quote a path for the shell (a plain one prints as it is),
    and so does the script's own path in `python <checkout>/scripts/train.py`."""
    import shlex

    from tinyattn.system.invocation import command
    from tinyattn.train.resume import ResumePoint

    code, err = run_main(["--config", str(TINY), "--run-name", "my run", "--no-progress", "--stop-at-step",
                          "2", "--set", *tiny_overrides(corpus, tmp_path, "train.max_steps=4")], capsys)
    assert code == 0, err
    run = tmp_path / "my run"
    words = shlex.split(err.split("Resume with: ")[1])
    assert words == ["tinyattn", "train", "--resume", str(run)]
    code, err = run_main([*words[2:], "--no-progress"], capsys)
    assert code == 0 and "done: 2 steps (steps 3-4)" in err, err
    with pytest.raises(CheckpointError) as refused:
        ResumePoint.find(run / ckpt.step_filename(2), None, tmp_path).target(None, tmp_path)
    advice = shlex.split(str(refused.value).split("fork it into a new folder: ")[1])
    assert advice == ["--resume", str(run / ckpt.step_filename(2)), "--run-name", "NEW_NAME"]
    script = tmp_path / "my checkout" / "scripts" / "train.py"
    script.parent.mkdir(parents=True)
    script.touch()
    monkeypatch.setattr(sys, "argv", [str(script)])
    assert shlex.split(command("train")) == ["python", str(script)]


def test_the_advice_of_a_refused_resume_quotes_a_run_path_that_holds_a_space(corpus, twelve_steps,
                                                                            capsys):
    # Each command a refusal prints can be pasted into a shell as it is: a path with a space is quoted.
    import shutil

    from tinyattn.cli.train import main

    out = twelve_steps[0].parent  # the folder the run was trained under
    run = Path(shutil.copytree(twelve_steps[0], out / "the run"))
    config = tiny_config(corpus, out, "train.max_steps=15")
    with pytest.raises(CheckpointError) as caught:
        train(config, resume=run / "config.yaml", progress=False)
    assert shlex.split(str(caught.value).split("such as ")[1]) == ["--resume", str(run)]
    other = out / "other dir"
    assert main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={other}"]) == 2
    advice = shlex.split(capsys.readouterr().err.split("fork it there: ")[1])
    assert advice == ["--resume", str(run / "step_0000012.pt"), "--run-name", "NEW_NAME", "--set",
                      f"train.out_dir={other}"]
    with pytest.raises(CheckpointError) as caught:
        train(config, run_name="the run", resume=twelve_steps[0] / "step_0000006.pt", progress=False)
    advice = str(caught.value).split("continue it with ")[1].split(",")[0]
    assert shlex.split(advice) == ["--resume", str(run)]
    with open(run / "step_0000012.pt", "r+b") as f:  # bit rot: the newest checkpoint no longer verifies
        f.seek(f.seek(0, 2) // 2)
        f.write(bytes(4096))
    with pytest.raises(CheckpointError) as caught:
        train(config, resume=run, progress=False)
    resumed, forked = str(caught.value).split("resume from it with ")[1].split(", or fork from it with ")
    assert shlex.split(resumed) == ["--resume", str(run / "best.pt")]  # best.pt of step 12 verifies
    assert shlex.split(forked) == ["--resume", str(run / "best.pt"), "--run-name", "NEW_NAME"]
    (run / "best.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as caught:
        train(config, resume=run, progress=False)
    moved, forked = str(caught.value).split("resume with ")[1].split(", or fork from it with ")
    assert shlex.split(moved) == ["--resume", str(run)]
    assert shlex.split(forked) == ["--resume", str(run / "step_0000009.pt"), "--run-name", "NEW_NAME"]
    with pytest.raises(CheckpointError) as caught:
        ckpt.load_model(run / "best.pt")
    good, folder = str(caught.value).split("use --checkpoint ")[1].split(", or --checkpoint ")
    assert shlex.split(good) == [str(run / "step_0000009.pt")]
    assert shlex.split(folder.split(" to take it")[0]) == [str(run)]


def test_a_resume_without_config_looks_for_the_run_under_a_set_out_dir_written_with_a_tilde(
        twelve_steps, monkeypatch):
    # The config's train.out_dir=~/... is under the home folder, but --resume without --config looked
    # for the run in a folder named '~' under the one run from: "~/orig: no such run to resume".
    from tinyattn.cli.train import main

    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    monkeypatch.setenv("HOME", str(out))
    monkeypatch.chdir(out / "orig")  # no folder "~" here
    assert main(["--resume", "--run-name", "orig", "--no-progress", "--set", "train.out_dir=~/",
                 "train.max_steps=13"]) == 0
    assert (run / "step_0000013.pt").is_file() and not (out / "orig" / "~").exists()


def test_a_resume_in_place_refuses_another_out_dir_given_for_it(
        corpus, twelve_steps, capsys):
    from tinyattn.cli.train import main

    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    config_yaml = (run / "config.yaml").read_text()
    other = out / "other"
    assert main(["--resume", str(run), "--no-progress", "--set", f"train.out_dir={other}",
                 "train.max_steps=15"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: train.out_dir '{other}' (--set): --resume {run} continues the run in its "
                          f"own folder, under {out}; to train under {other}, fork it there: ") and \
        err.count("\n") == 1, err
    assert not other.exists() and _file_digests(run) == before
    assert (run / "config.yaml").read_text() == config_yaml
    # Edited in the run's config.yaml: the same refusal, naming the edit.
    (run / "config.yaml").write_text(config_yaml.replace(f"out_dir: {out}", f"out_dir: {other}"))
    assert main(["--resume", str(run), "--no-progress", "--set", "train.max_steps=15"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: train.out_dir '{other}' (edited in {run / 'config.yaml'}): ") and \
        err.count("\n") == 1, err
    (run / "config.yaml").write_text(config_yaml)
    assert not other.exists() and _file_digests(run) == before
    # The folder's parent is no other out_dir, also when the run is reached through a link elsewhere.
    (out / "links").mkdir()
    (out / "links" / "link").symlink_to(run, target_is_directory=True)
    assert main(["--resume", str(out / "links" / "link"), "--no-progress", "--set",
                 f"train.out_dir={out}", "train.max_steps=15"]) == 0
    assert load_config(run / "config.yaml").train.out_dir == str(out)
    assert (run / "step_0000015.pt").is_file() and not (out / "links" / "step_0000015.pt").exists()
    # Not given for this resume (a --config file's): kept as that config says it, not rewritten to the
    # folder's absolute parent (a later fork would go back there after the user moved the runs).
    result = train(tiny_config(corpus, out, "train.max_steps=18", "train.out_dir=relative"), resume=run,
                   progress=False)
    assert result.run_dir == run and result.step == 18
    assert load_config(run / "config.yaml").train.out_dir == "relative"


def test_resuming_a_folder_a_training_still_writes_says_it_is_in_use_not_fork(corpus, twelve_steps):
    # A resume picks the newest checkpoint, and the training holding the folder saves a later one
    # meanwhile: the answer is that the folder is in use, not that the run goes on past it.
    from tinyattn.errors import StorageError
    from tinyattn.train.run_folder import RunLock

    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    with RunLock.acquire(run):  # another training's hold
        with pytest.raises(StorageError, match=rf"orig is in use by pid {os.getpid()}: another training"):
            train(tiny_config(corpus, out, "train.max_steps=12"), resume=run / "step_0000006.pt",
                  progress=False)
    assert RunLock.holder(run) is None  # released: nothing holds it now
    assert _file_digests(run) == before

def test_best_checkpoint_is_never_replaced_by_a_worse_one(corpus, tmp_path):
    config = tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=3")
    train(config, run_name="best", progress=False)
    best = tmp_path / "best" / "best.pt"
    state = ckpt.load_checkpoint(best)
    state["best_val_loss"] = 0.5  # a better model than this run will reach
    ckpt.save_checkpoint({k: v for k, v in state.items() if not k.startswith("format")}, best)
    before = best.read_bytes()
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=12", "train.eval_interval=3"),
                   run_name="best", resume=True, progress=False)
    assert result.best_val_loss > 0.5 and result.step == 12
    assert best.read_bytes() == before


def test_the_best_validation_loss_is_the_lowest_evaluations_not_the_last(corpus, tmp_path, monkeypatch):
    from tinyattn.train.owners import EvalResult, Evaluator

    losses = iter([3.0, 2.0, 2.5])  # the evaluations at steps 3, 6 and 9
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(32, next(losses))))
    config = tiny_config(corpus, tmp_path, "train.max_steps=9", "train.eval_interval=3")
    result = train(config, run_name="best", progress=False)
    assert (result.best_val_loss, result.last_val_loss) == (2.0, 2.5)
    best = ckpt.load_checkpoint(tmp_path / "best" / "best.pt")
    assert (best["step"], best["best_val_loss"]) == (6, 2.0)
    # What a resume continues from: a later evaluation must beat 2.0 to be the best.
    assert ckpt.load_checkpoint(tmp_path / "best" / ckpt.step_filename(9))["best_val_loss"] == 2.0


def test_a_save_cut_short_at_best_pt_leaves_the_best_model_in_best_pt_after_the_resume(corpus, tmp_path,
                                                                                     monkeypatch):
    """The disk fills as best.pt of step 6 (the best) is written. best.pt was written after the step's
    checkpoint: the resume went on from step 6 with best 2.0, no later evaluation beat it, so best.pt
    kept step 3's model (3.0) while the run reported 2.0, and keep_last=1 had pruned step 6: lost."""
    from tinyattn.errors import StorageError
    from tinyattn.train.owners import EvalResult, Evaluator

    losses = {3: 3.0, 6: 2.0, 9: 2.5, 12: 2.6}
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(32, losses[step])))
    save, failed = ckpt.save_checkpoint, []

    def full_at_the_best_of_step_6(state, path):
        if Path(path).name == ckpt.BEST and state["step"] == 6 and not failed:
            failed.append(path)
            raise StorageError(f"cannot write {path}: No space left on device")
        save(state, path)

    items = ("train.eval_interval=3", "train.keep_last=1")
    monkeypatch.setattr(ckpt, "save_checkpoint", full_at_the_best_of_step_6)
    with pytest.raises(StorageError, match="No space left"):
        train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), run_name="run", progress=False)
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), run_name="run", resume=True,
                   progress=False)
    best = ckpt.load_checkpoint(tmp_path / "run" / ckpt.BEST)
    assert (result.step, result.best_val_loss) == (12, 2.0)
    assert (best["step"], best["best_val_loss"]) == (6, 2.0)


def test_a_resume_after_a_save_cut_short_at_the_step_checkpoint_takes_best_pts_loss_as_its_best(
        corpus, tmp_path, monkeypatch, capsys):
    """Killed after best.pt of step 6 (2.0), before step 6's checkpoint: the resume went on from step 3
    with step 3's best (3.0), called step 5's 2.8 its best and reported it, while best.pt held 2.0."""
    from tinyattn.train.owners import EvalResult, Evaluator

    losses = {3: 3.0, 5: 2.8, 6: 2.0}
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(32, losses[step])))
    save = ckpt.save_checkpoint

    def killed_at_the_step_checkpoint_of_step_6(state, path):
        if Path(path).name == ckpt.step_filename(6):
            raise KeyboardInterrupt
        save(state, path)

    items = ("train.eval_interval=3", "train.keep_last=1", "train.max_steps=12")
    monkeypatch.setattr(ckpt, "save_checkpoint", killed_at_the_step_checkpoint_of_step_6)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(corpus, tmp_path, *items), run_name="run", progress=False)
    monkeypatch.setattr(ckpt, "save_checkpoint", save)
    capsys.readouterr()
    result = train(tiny_config(corpus, tmp_path, *items), run_name="run", resume=True, progress=False,
                   stop_at_step=5)
    assert "step 5: validation loss 2.8000\n" in capsys.readouterr().err  # not '(best)'
    assert result.best_val_loss == 2.0 == ckpt.saved_value(tmp_path / "run" / ckpt.BEST, "best_val_loss")
    assert ckpt.load_checkpoint(tmp_path / "run" / ckpt.step_filename(5))["best_val_loss"] == 2.0


def test_a_damaged_checkpoint_is_refused_and_the_newest_good_one_named(corpus, twelve_steps):
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    latest = run / "step_0000012.pt"
    size = latest.stat().st_size
    with open(latest, "r+b") as f:  # bit rot: 4 KB of the weights overwritten in place, same size
        f.seek(size // 2)
        f.write(bytes(4096))
    assert latest.stat().st_size == size
    with pytest.raises(CheckpointError, match=r"step_0000012\.pt: not a readable checkpoint .*CRC-32"):
        ckpt.load_model(latest)
    with pytest.raises(CheckpointError, match=r"CRC-32.*; best\.pt \(step 12\) verifies and is further on "):
        train(tiny_config(corpus, out, "train.max_steps=12"), resume=run, progress=False)
    (run / ckpt.BEST).unlink()  # the step checkpoints alone: the newest of them that verifies
    with pytest.raises(CheckpointError, match=r"CRC-32.*the newest checkpoint in .*orig that verifies is "
                                              r"step_0000009\.pt"):
        train(tiny_config(corpus, out, "train.max_steps=12"), resume=run, progress=False)


def test_a_resume_from_a_checkpoint_of_a_newer_format_names_it_without_advice_to_move_it_away(tmp_path):
    # It verifies (a whole archive): it is the newest that does, so no other checkpoint is named for it.
    from tinyattn.train.resume import ResumePoint

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"format": ckpt.FORMAT, "format_version": 99, "step": 3}, run / "step_0000003.pt")
    with pytest.raises(CheckpointError) as refused:
        ResumePoint.find(run, None, tmp_path)
    assert str(refused.value) == (f"{run / 'step_0000003.pt'}: checkpoint format version 99 is not supported "
                                  f"by this tinyattn (it reads version {ckpt.FORMAT_VERSION})")


def test_resuming_from_a_file_that_is_no_checkpoint_points_at_the_run_not_at_moving_it(corpus,
                                                                                        twelve_steps):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    with pytest.raises(CheckpointError) as caught:
        train(tiny_config(corpus, out, "train.max_steps=15"), resume=run / "config.yaml", progress=False)
    message = str(caught.value)
    assert "config.yaml: not a tinyattn checkpoint (a torch.save archive): another kind of file; " in message
    assert f"such as --resume {run}" in message
    assert "move the damaged file away" not in message  # the user's config.yaml is not damaged
    assert _file_digests(run) == before


@pytest.mark.parametrize("change, named", [
    ("tokenizer.kind=bpe", "tokenizer.kind: checkpoint 'char', config 'bpe'"),
    ("tokenizer.vocab_size=300", None)])
def test_a_resume_under_another_tokenizer_setting_names_the_key(corpus, twelve_steps, change,
                                                                named):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    config = tiny_config(corpus, out, "train.max_steps=15", change)
    if named is None:  # vocab_size is BPE's: a char run ignores it
        assert train(config, run_name="orig", resume=True, progress=False).step == 15
        return
    with pytest.raises(CheckpointError, match=rf"the config's tokenizer differs from the checkpoint's: "
                                              rf"{named}; "):
        train(config, run_name="orig", resume=True, progress=False)
    assert _file_digests(run) == before


def test_an_emptied_config_yaml_resumes_with_the_checkpoints_config_and_says_so(corpus,
                                                                                twelve_steps, capsys):
    run, _ = twelve_steps
    from tinyattn.cli.train import main

    (run / "config.yaml").write_text("")
    assert main(["--resume", str(run), "--no-progress", "--set", "train.max_steps=15"]) == 0
    assert "config.yaml is empty; the run continues with its checkpoint's config" in capsys.readouterr().err
    assert ckpt.step_of(ckpt.latest_checkpoint(run)) == 15
    assert "max_steps: 15" in (run / "config.yaml").read_text()


@pytest.mark.parametrize("max_steps", [12, 5])
def test_resuming_a_run_with_no_step_left_is_refused_before_anything_is_written(corpus,
                                                                                twelve_steps, max_steps):
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    with pytest.raises(TinyattnError, match=rf"^{re.escape(str(run))}: the run is at step 12, and "
                                            rf"train\.max_steps is {max_steps}: nothing is left to train; "
                                            r"--set train\.max_steps=N with N above 12"):
        train(tiny_config(corpus, out, f"train.max_steps={max_steps}"), run_name="orig", resume=True,
              progress=False)
    assert _file_digests(run) == before  # config.yaml keeps max_steps 12; no new TensorBoard file


def test_a_bare_resume_with_no_step_left_names_the_run_it_picked(corpus, twelve_steps, capsys):
    """--resume alone picks the most recent run: its refusal says which one, as the start line would."""
    run, before = twelve_steps
    out = run.parent  # the folder the run was trained under
    from tinyattn.cli.train import main

    assert main(["--resume", "--no-progress", "--set", f"train.out_dir={out}"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {run}: the run is at step 12, and train.max_steps is 12: nothing is left to train; "
        "--set train.max_steps=N with N above 12 trains on")
    assert _file_digests(run) == before


def test_a_stop_at_a_step_between_evaluations_evaluates_and_saves_it_and_a_resume_goes_on_from_it(
        corpus, tmp_path, capsys):
    """--stop-at-step 3 with evaluations every 4 steps: step 3 is evaluated and saved (the run's last
    step for now), a resume continues from it, and one told to stop at the step it is at is refused."""
    items = ("train.max_steps=6", "train.eval_interval=4")
    first = train(tiny_config(corpus, tmp_path, *items), run_name="run", stop_at_step=3, progress=False)
    assert ckpt.latest_checkpoint(first.run_dir).name == ckpt.step_filename(3)
    assert first.last_val_loss == ckpt.load_checkpoint(first.run_dir / ckpt.step_filename(3))["best_val_loss"]
    with pytest.raises(TinyattnError, match=rf"^--stop-at-step 3: {re.escape(str(first.run_dir))} is "
                                            r"already at step 3; give a "):
        train(tiny_config(corpus, tmp_path, *items), run_name="run", resume=True, stop_at_step=3,
              progress=False)
    capsys.readouterr()
    resumed = train(tiny_config(corpus, tmp_path, *items), run_name="run", resume=True, progress=False)
    assert resumed.step == 6 and "done: 3 steps (steps 4-6)" in capsys.readouterr().err


def test_leftovers_of_a_killed_save_are_removed_and_the_latest_step_is_by_number(corpus,
                                                                                  twelve_steps):
    run, _ = twelve_steps
    out = run.parent  # the folder the run was trained under
    leftover = run / ".step_0000015.pt.k1ll3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    os.utime(run / "step_0000003.pt")  # touch: the oldest step now has the newest file time
    assert ckpt.latest_checkpoint(run).name == "step_0000012.pt"
    result = train(tiny_config(corpus, out, "train.max_steps=15", "train.eval_interval=3",
                               "train.keep_last=4"), run_name="orig", resume=True, progress=False)
    assert result.step == 15 and not leftover.exists()
    assert [p.name for p in ckpt.step_checkpoints(run)] == [ckpt.step_filename(s) for s in (6, 9, 12, 15)]


def test_a_run_folder_is_held_by_one_process(corpus, tmp_path):
    from tinyattn.errors import StorageError
    from tinyattn.train.run_folder import RunLock

    with RunLock.acquire(tmp_path / "held"):  # another training holds it
        with pytest.raises(StorageError, match=rf"held is in use by pid {os.getpid()}"):
            train(tiny_config(corpus, tmp_path, "train.max_steps=2"), run_name="held", progress=False)
    assert not (tmp_path / "held" / "config.yaml").exists()
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=2"), run_name="held", progress=False)
    assert result.step == 2 and not (tmp_path / "held" / ".lock").exists()  # released at the end
    log = (tmp_path / "held" / "train.log").read_text(encoding="utf-8")
    assert "(starting)" in log and "done: 2 steps" in log


def test_a_lock_a_killed_run_left_is_noted_once_on_the_console_and_in_train_log(corpus, tmp_path, capsys):
    # train.log holds every line the run printed once its folder existed: the note that a killed
    # session's lock was taken over too, which says the session before this one did not end.
    config = tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2")
    train(config, run_name="k9", progress=False, stop_at_step=2)
    (tmp_path / "k9" / ".lock").write_text("4194304\n")  # what a kill -9 leaves
    capsys.readouterr()
    train(tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2"), run_name="k9",
          resume=True, progress=False)
    note = f"note: {tmp_path / 'k9' / '.lock'} was left by pid 4194304, which is no longer running"
    assert capsys.readouterr().err.count(note) == 1
    assert note in (tmp_path / "k9" / "train.log").read_text(encoding="utf-8")


def test_a_killed_runs_lock_taken_over_by_a_refused_start_is_still_noted(corpus, tmp_path, capsys):
    # A start without --resume into the killed run's folder takes the lock over, is refused (it holds
    # checkpoints) and removes the .lock: the note, kept for a train.log that never opens, was lost.
    config = tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2")
    train(config, run_name="k9", progress=False, stop_at_step=2)
    (tmp_path / "k9" / ".lock").write_text("4194304\n")  # what a kill -9 leaves
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train(tiny_config(corpus, tmp_path, "train.max_steps=4"), run_name="k9", progress=False)
    note = f"note: {tmp_path / 'k9' / '.lock'} was left by pid 4194304, which is no longer running"
    assert capsys.readouterr().err.count(note) == 1


def run_main(args, capsys) -> tuple[int, str]:
    from tinyattn.cli.train import main

    code = main(args)
    return code, capsys.readouterr().err


def test_a_resume_into_a_read_only_run_folder_changes_nothing(corpus, tmp_path, small_tmpfs, capsys):
    config = tiny_config(corpus, small_tmpfs, "train.max_steps=2", "train.eval_interval=2",
                         "model.n_embd=16", "model.n_layer=1", f"data.cache_dir={tmp_path / 'cache'}")
    train(config, run_name="ro", progress=False)
    before = (small_tmpfs / "ro" / "config.yaml").read_bytes()
    small_tmpfs.make_read_only()
    capsys.readouterr()
    code, err = run_main(["--resume", str(small_tmpfs / "ro"), "--no-progress", "--set",
                          f"train.out_dir={small_tmpfs}", "train.max_steps=3"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot write {small_tmpfs / 'ro'}: Read-only file system; make it writable")
    assert (small_tmpfs / "ro" / "config.yaml").read_bytes() == before


def test_a_read_only_out_dir_and_cache_dir_are_one_line(corpus, tmp_path, small_tmpfs, capsys):
    small_tmpfs.make_read_only()
    code, err = run_main(["--config", str(TINY), "--no-progress", "--set",
                          *tiny_overrides(corpus, small_tmpfs / "runs")], capsys)
    assert code == 2 and err == f"error: cannot write {small_tmpfs / 'runs'}: Read-only file system; " \
                                "make it writable or choose another folder\n"
    code, err = run_main(["--config", str(TINY), "--no-progress", "--set",
                          *tiny_overrides(corpus, tmp_path), f"data.cache_dir={small_tmpfs / 'cache'}"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot write {small_tmpfs / 'cache'}") and "Read-only file system" in err


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(corpus, tmp_path, small_tmpfs,
                                                                             capsys):
    # A 256 KiB disk holds the run's small files and one checkpoint of this model, not two.
    args = ["--config", str(TINY), "--run-name", "full", "--no-progress", "--set",
            *tiny_overrides(corpus, small_tmpfs, "train.max_steps=4", "train.eval_interval=2",
                            "model.n_embd=16", "model.n_layer=1", "model.tie_embeddings=true",
                            "train.keep_last=1"),
            f"data.cache_dir={tmp_path / 'cache'}"]
    code, err = run_main(args, capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write {small_tmpfs / 'full'}/") and "No space left on device" in last
    run = small_tmpfs / "full"
    assert not list(run.glob(".*.tmp"))  # no half file
    assert [ckpt.load_checkpoint(p)["step"] for p in ckpt.step_checkpoints(run)] == [2]
    assert "No space left on device" in (run / "train.log").read_text(encoding="utf-8")


def test_a_full_disk_while_building_the_cache_is_one_line(corpus, tmp_path, small_tmpfs, capsys):
    big = tmp_path / "big.txt"
    big.write_text(corpus.read_text(encoding="utf-8") * 3, encoding="utf-8")  # 360 KB of uint16 tokens
    code, err = run_main(["--config", str(TINY), "--no-progress", "--set",
                          *tiny_overrides(big, tmp_path), f"data.cache_dir={small_tmpfs}"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: cannot write {small_tmpfs}/") and "No space left on device" in err
    # Nothing half-written is left, nor the failed build's lock file beside the cache folder.
    assert not [p for p in small_tmpfs.rglob("*") if p.is_file()]


def test_refuses_to_overwrite_a_run(corpus, tmp_path, capsys):
    args = ["--config", str(TINY), "--run-name", "taken", "--no-progress",
            "--set", *tiny_overrides(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2")]
    assert run_main(args, capsys)[0] == 0
    before = (tmp_path / "taken" / "best.pt").stat().st_mtime_ns
    status, stderr = run_main(args, capsys)
    assert status == 2
    assert "already holds checkpoints" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1
    assert (tmp_path / "taken" / "best.pt").stat().st_mtime_ns == before


def test_resume_refuses_a_different_model_shape(corpus, tmp_path, capsys):
    config = tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2")
    train(config, run_name="shape", progress=False)
    status, stderr = run_main(["--config", str(TINY), "--resume", str(tmp_path / "shape"), "--no-progress",
                               "--set", *tiny_overrides(corpus, tmp_path, "model.n_layer=3", "model.n_embd=64")],
                              capsys)
    assert status == 2 and "Traceback" not in stderr
    assert "model.n_layer: checkpoint 2, config 3" in stderr
    assert "model.n_embd: checkpoint 32, config 64" in stderr


def test_corrupt_checkpoint_is_named(corpus, tmp_path, capsys):
    train(tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2"), run_name="bad",
          progress=False)
    file = tmp_path / "bad" / "step_0000002.pt"
    file.write_bytes(file.read_bytes()[:1000])  # truncated
    with pytest.raises(CheckpointError, match=r"step_0000002\.pt: not a readable checkpoint"):
        ckpt.load_checkpoint(file)
    status, stderr = run_main(["--resume", str(tmp_path / "bad"), "--no-progress", "--set",
                               f"train.out_dir={tmp_path}"], capsys)
    assert status == 2 and "Traceback" not in stderr
    assert "step_0000002.pt: not a readable checkpoint" in stderr
    file.write_bytes(b"import os; os.system('echo pwned')")  # not even a zip: never executed
    with pytest.raises(CheckpointError, match=r"step_0000002\.pt: not a tinyattn checkpoint \(a torch\.save "
                                              r"archive\): another kind of file$"):
        ckpt.load_checkpoint(file)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": "tinyattn-checkpoint", "format_version": 1, "evil": Payload()}, file)
    with pytest.raises(CheckpointError, match="Python objects beyond tensors.*never loaded"):
        ckpt.load_checkpoint(file)


def test_a_vocabulary_size_below_the_tokenizers_is_refused_before_a_folder_is_made(corpus, tmp_path):
    with pytest.raises(TinyattnError, match=r"^model\.vocab_size=10 is smaller than the tokenizer's "
                                            r"vocabulary \(\d+\); leave it unset$"):
        train(tiny_config(corpus, tmp_path, "model.vocab_size=10"), run_name="small", progress=False)
    assert not (tmp_path / "small").exists()


def test_weights_that_do_not_fit_are_named(corpus, tmp_path):
    train(tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2"), run_name="old",
          progress=False)
    file = tmp_path / "old" / "best.pt"
    state = ckpt.load_checkpoint(file)
    state["model"]["blocks.0.attention.query.weight"] = state["model"].pop("blocks.0.attention.qkv.weight")
    ckpt.save_checkpoint({k: v for k, v in state.items() if not k.startswith("format")}, file)
    with pytest.raises(CheckpointError, match=r"missing: blocks\.0\.attention\.qkv\.weight; "
                                              r"unexpected: blocks\.0\.attention\.query\.weight"):
        ckpt.load_model(file)


@pytest.mark.parametrize("log_interval", [5, 20], ids=["logged-at-evaluations", "logged-less-often"])
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(corpus, tmp_path, monkeypatch,
                                                                   log_interval):
    # log_interval 20 > eval_interval 5: the losses must still be read (and the NaN caught) before
    # the evaluation at step 10 writes its checkpoint, else the NaN weights are "the last good" one.
    original = Trainer.train_step

    def poisoned(self):
        loss, norm = original(self)
        if self.step >= 7:
            loss = loss * float("nan")
        return loss, norm

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    config = tiny_config(corpus, tmp_path, "train.max_steps=20", "train.eval_interval=5",
                         f"train.log_interval={log_interval}")
    with pytest.raises(TrainingError, match=r"the loss became nan at step 7; .*step_0000005\.pt"):
        train(config, run_name="nan", progress=False)
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "nan")] == ["step_0000005.pt"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_saves_and_says_how_to_resume(corpus, tmp_path, sig):
    args = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(TINY), "--run-name", "sig",
            "--no-progress", "--set",
            *tiny_overrides(corpus, tmp_path, "train.max_steps=100000", "train.eval_interval=100000",
                            "train.log_interval=1")]
    process = warm_python.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:  # wait until training really runs
        lines.append(line)
        if line.startswith("step 3:"):
            break
    process.send_signal(sig)
    _, rest = process.communicate(timeout=120)
    stderr = "".join(lines) + rest
    assert process.returncode == 130, stderr
    assert f"stopped by {sig.name}" in stderr and f"Resume with: python {args[1]} --resume" in stderr
    latest = ckpt.latest_checkpoint(tmp_path / "sig")
    assert latest is not None and ckpt.load_checkpoint(latest)["step"] >= 3


def logged_steps(log: Path) -> list[int]:
    """The steps whose training line train.log holds (complete lines only), oldest first."""
    text = log.read_text(encoding="utf-8")
    return [int(step) for step in re.findall(r"^[\d-]+ [\d:]+ step (\d+): loss .*\n", text, re.MULTILINE)]


@pytest.mark.slow
@pytest.mark.parametrize("nohup", [False, True], ids=["closed-terminal", "nohup"])
def test_a_closed_terminal_saves_and_logs_the_stop_unless_the_run_ignores_hangups(corpus, tmp_path, nohup):
    # A closed terminal: SIGHUP (twice), then every console write fails (here EPIPE: the reader is gone).
    args = [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(TINY), "--run-name", "hup",
            "--no-progress", "--set",
            *tiny_overrides(corpus, tmp_path, "train.max_steps=100000", "train.eval_interval=100000",
                            "train.log_interval=1")]
    process = warm_python.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True,
                                ignored_signals=[signal.SIGHUP] if nohup else [])
    for line in process.stderr:  # wait until training really runs
        if line.startswith("step 3:"):
            break
    process.stderr.close()
    process.send_signal(signal.SIGHUP)
    time.sleep(0.002)
    process.send_signal(signal.SIGHUP)  # a closed terminal hangs up twice: its shell, then the kernel
    if nohup:  # still training, writing to no console: steps past any a hangup could have stopped at
        log = tmp_path / "hup" / "train.log"
        after = logged_steps(log)[-1] + 3
        deadline = time.monotonic() + 60
        while process.poll() is None and logged_steps(log)[-1] < after and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.poll() is None and logged_steps(log)[-1] >= after, log.read_text(encoding="utf-8")
        process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 130
    log = (tmp_path / "hup" / "train.log").read_text(encoding="utf-8")
    assert f"stopped by {'SIGTERM' if nohup else 'SIGHUP'} at step" in log and "failed" not in log, log
    latest = ckpt.latest_checkpoint(tmp_path / "hup")
    assert latest is not None and ckpt.load_checkpoint(latest)["step"] >= 3


def test_once_the_console_is_gone_a_print_to_standard_output_goes_to_dev_null_too(monkeypatch):
    # `tinyattn train ... 2>&1 | head`: both streams are the pipe whose reader went away. The run's
    # own line fails on stderr; a later print on stdout (a library's) must not end the run either.
    from tinyattn.train.log import say

    reader, writer = os.pipe()
    os.close(reader)
    out, err = open(os.dup(writer), "w", encoding="utf-8"), open(writer, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    try:
        say("step 1: loss 1.0000")
        print("a library's line", flush=True)
    finally:
        for stream in (out, err):
            with contextlib.suppress(OSError):
                stream.close()


def test_a_ctrl_c_during_the_last_step_ends_the_run_as_done_not_stopped(corpus, tmp_path, monkeypatch, capsys):
    import os

    original = Trainer.train_step

    def interrupted_at_the_end(self):
        result = original(self)
        if self.step == 6:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the last step runs
        return result

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_the_end)
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=3"), run_name="end",
                   progress=False)
    err = capsys.readouterr().err
    assert result.step == 6 and not result.interrupted  # exit 0: nothing was left undone
    assert "done: 6 steps" in err and "stopped by" not in err and "Resume with" not in err, err


def test_train_log_keeps_the_runs_lines_its_warnings_and_the_error_that_ends_it(tmp_path, monkeypatch):
    import warnings

    from tinyattn.train.log import RunLog, say

    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *where: shown.append(str(message)))
    with pytest.raises(TinyattnError), RunLog(tmp_path, enabled=True):
        say("a line")
        warnings.warn("a warning", UserWarning)
        raise TinyattnError("the error")
    text = (tmp_path / "train.log").read_text(encoding="utf-8")
    lines = [line.split(" ", 2)[2] for line in text.splitlines()]  # less the date and time
    assert lines == ["a line", "warning: a warning", "error: the error"]
    assert shown == ["a warning"]  # shown as ever


def test_a_plain_step_line_gives_the_windows_mean_loss_the_gains_rate_and_mfu_over_every_rank(
        tmp_path, capsys):
    from types import SimpleNamespace

    from tinyattn.train.log import Logger

    trainer = SimpleNamespace(
        model=SimpleNamespace(flops_per_token=lambda: 100.0), dist=SimpleNamespace(world_size=2), step=0,
        tokens_per_step=50, tokens_seen=200, optimizers=SimpleNamespace(
            rates=lambda: {"adamw/embedding": 0.5, "adamw/gains": 2e-3, "adamw/matrices": 0.25}))
    logger = Logger(tmp_path, load_config(TINY), trainer, peak_flops=2e4, enabled=True, progress=False)
    logger.writer = SimpleNamespace(add_scalar=lambda *args: None)  # TensorBoard: test_tensorboard_holds_...
    logger.train(4, [1.0, 2.0, 6.0, 5.0], 1.0, torch.tensor(1.0))  # 200 tokens in a second, on two ranks
    assert capsys.readouterr().err == "step 4: loss 3.5000, lr 2.00e-03, 200 tok/s, mfu 50.0%\n"


def test_the_progress_bar_counts_every_step_whatever_the_log_interval(corpus, tmp_path, monkeypatch):
    from tinyattn.train import log as train_log

    counted = []

    class Counted(train_log.tqdm):
        def close(self):
            counted.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(train_log, "tqdm", Counted)
    config = tiny_config(corpus, tmp_path, "train.max_steps=10", "train.log_interval=5",
                         "train.eval_interval=10")
    train(config, run_name="bar", progress=True)
    assert counted and set(counted) == {(10, 10)}  # a window of five steps moves it by five


def test_with_a_progress_bar_train_log_still_keeps_every_line(corpus, tmp_path, capsys):
    config = tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2")
    result = train(config, run_name="bar", progress=True)
    log = (result.run_dir / "train.log").read_text(encoding="utf-8")
    assert "step 2: validation loss" in log and "step 4: validation loss" in log and "done: 4 steps" in log


def test_train_log_keeps_an_unexpected_error_that_ends_the_run_naming_its_kind(tmp_path):
    from tinyattn.train.log import RunLog

    with pytest.raises(ZeroDivisionError), RunLog(tmp_path, enabled=True):
        raise ZeroDivisionError("a bug")
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    assert log.endswith(" failed: ZeroDivisionError: a bug\n")


def test_a_second_stop_before_the_first_checkpoint_says_to_run_the_command_again(tmp_path):
    from tinyattn.train.log import stopped_at_once
    from tinyattn.train.owners import StoppedAtOnce

    assert stopped_at_once(StoppedAtOnce("SIGINT"), tmp_path) == (
        f"stopped at once by a second SIGINT before any checkpoint was saved in {tmp_path}: run the same "
        "command again to train")


def test_a_second_stop_cutting_the_first_step_checkpoint_after_best_pt_names_best_pt_to_resume_from(tmp_path):
    """best.pt is written before its step's checkpoint: a second Ctrl-C between them at the first
    evaluation leaves best.pt alone, which a resume continues from; 'run the same command again' would
    be refused, as the folder holds a checkpoint."""
    from tinyattn.train.log import stopped_at_once
    from tinyattn.train.owners import StoppedAtOnce

    ckpt.save_checkpoint({"step": 5}, tmp_path / ckpt.BEST)
    assert stopped_at_once(StoppedAtOnce("SIGINT"), tmp_path).startswith(
        f"stopped at once by a second SIGINT; the last checkpoint saved is step 5's (best.pt) in {tmp_path}, "
        "what was trained after it is lost. Resume with: ")
    assert stopped_at_once(StoppedAtOnce("SIGINT"), tmp_path).endswith(f" --resume {tmp_path}")
    assert ckpt.resolve_checkpoint(tmp_path, prefer="latest") == tmp_path / ckpt.BEST


def test_a_second_ctrl_c_stops_at_once_saying_which_checkpoint_is_kept_and_how_to_resume(corpus, tmp_path,
                                                                                         monkeypatch):
    original = Trainer.train_step

    def interrupted_twice(self):
        result = original(self)
        if self.step == 7:  # two steps after the evaluation's checkpoint
            os.kill(os.getpid(), signal.SIGINT)  # stop after this step
            os.kill(os.getpid(), signal.SIGINT)  # no: stop now, before the checkpoint of step 7
        return result

    monkeypatch.setattr(Trainer, "train_step", interrupted_twice)
    config = tiny_config(corpus, tmp_path, "train.max_steps=20", "train.eval_interval=5")
    line = (r"stopped at once by a second SIGINT; the last checkpoint saved is step 5's \(step_0000005\.pt\) "
            rf"in {re.escape(str(tmp_path / 'twice'))}, .* Resume with: .* "
            rf"--resume {re.escape(str(tmp_path))}")
    with pytest.raises(KeyboardInterrupt, match=line):
        train(config, run_name="twice", progress=False)
    assert [p.name for p in ckpt.step_checkpoints(tmp_path / "twice")] == ["step_0000005.pt"]
    log = (tmp_path / "twice" / "train.log").read_text()
    assert "stopped at once by a second SIGINT; the last checkpoint" in log


def test_a_second_hangup_is_not_a_second_ctrl_c_and_a_late_one_cannot_kill_the_last_lines():
    import os

    from tinyattn.train.owners import StopRequest

    before = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal's run, even where pytest runs under nohup
    try:
        stop = StopRequest()
        with stop.installed():
            os.kill(os.getpid(), signal.SIGHUP)  # the shell's hangup: stop after this step
            try:
                os.kill(os.getpid(), signal.SIGHUP)  # the kernel's: not "a second Ctrl-C, stop now"
            except KeyboardInterrupt:
                pytest.fail("a second hangup stopped the run at once, mid-step")
            assert stop.signal_name == "SIGHUP"
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # the checkpoint is saved: stay for the rest
        with pytest.raises(KeyboardInterrupt), StopRequest().installed():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C still stops at once
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_second_signal_before_the_first_step_cannot_cut_the_clean_up_of_the_first():
    from tinyattn.train.owners import StoppedBeforeStart, StopRequest

    stop = StopRequest(at_once=True)
    with stop.installed():
        with pytest.raises(StoppedBeforeStart):
            os.kill(os.getpid(), signal.SIGINT)  # the first: the run ends at once
        try:
            os.kill(os.getpid(), signal.SIGINT)  # a second, while the new run's folder is taken back
        except KeyboardInterrupt:
            pytest.fail("a second signal cut the clean-up of a run stopped before its first step")
    assert stop.signal_name == "SIGINT"


def test_the_ranks_agree_on_a_stop_that_one_got_and_a_single_process_needs_no_collective(monkeypatch):
    """`SharedStop`: under DDP the loop stops on the highest signal any rank got (a rank stepping on
    alone hangs the run); a rank that got none keeps its own flag unset. One process: no collective.
    On a GPU the ranks agree only where the loop reads its losses (its one host sync)."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.owners import SharedStop, StopRequest

    other_rank, calls = [0], []

    def all_reduce(flag, op):  # rank 1's flag, maxed in
        calls.append(op)
        flag.copy_(torch.maximum(flag, torch.tensor(other_rank)))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    own, cpu = StopRequest(), torch.device("cpu")
    alone = SharedStop(own, Distributed(), cpu)
    assert alone.agreed(reading=True) is None and calls == []
    own.signal_name = "SIGINT"
    assert alone.agreed(reading=False) == "SIGINT" and calls == []
    own.signal_name = None
    ranks = SharedStop(own, Distributed(rank=0, world_size=2), cpu)
    assert ranks.agreed(reading=False) is None and len(calls) == 1  # the CPU: after every step
    other_rank[0] = signal.SIGTERM.value
    assert ranks.agreed(reading=False) == "SIGTERM" and own.signal_name is None
    ranks.every_step = False  # a GPU's: only with the loss window's read
    assert ranks.agreed(reading=False) is None and len(calls) == 2
    assert ranks.agreed(reading=True) == "SIGTERM" and len(calls) == 3


SAVE_AND_PAUSE = """
import os, sys, time, torch
import tinyattn.system.storage as files
from tinyattn.checkpoint import save_checkpoint, step_filename

run, pause_at = sys.argv[1], sys.argv[2]  # pause_at: mid-write or before-rename
real_fdopen, real_replace = os.fdopen, os.replace
step = 0

class PausingFile:
    # Pauses the second checkpoint's write half way through, so a kill lands mid-write.
    def __init__(self, f):
        self.f, self.written = f, 0
    def write(self, data):
        if step == 2 and pause_at == "mid-write" and self.written > 4_000_000:
            print("paused", flush=True); time.sleep(600)
        self.written += len(data)
        return self.f.write(data)
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

def replace(src, dst):
    if step == 2 and pause_at == "before-rename":
        print("paused", flush=True); time.sleep(600)
    return real_replace(src, dst)

files.os.fdopen = lambda fd, mode: PausingFile(real_fdopen(fd, mode))
files.os.replace = replace
for step in (1, 2):
    save_checkpoint({"model": {"w": torch.full((2_000_000,), float(step))}, "step": step},
                    f"{run}/{step_filename(step)}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("pause_at", ["mid-write", "before-rename"])
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one_whole(tmp_path, pause_at):
    """The child is killed at a known point of the second save: half of its bytes written,
    or all of them fsynced with only the rename left. Either way the first checkpoint is
    the latest, loads and is whole, and the half-written file never has a checkpoint's name."""
    process = warm_python.Popen([sys.executable, "-c", SAVE_AND_PAUSE, str(tmp_path), pause_at], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "paused"
        temporary = list(tmp_path.glob(".step_0000002.pt.*.tmp"))
        assert len(temporary) == 1 and temporary[0].stat().st_size > 4_000_000  # the kill lands mid-save
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert [p.name for p in ckpt.step_checkpoints(tmp_path)] == ["step_0000001.pt"]
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))
    assert state["step"] == 1 and torch.all(state["model"]["w"] == 1.0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_workers(launcher: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of a torchrun launcher's worker processes (its children, by their RANK)."""
    pids = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    ranks = {}
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = [v[5:] for v in environ if v.startswith(b"RANK=")]
        if rank:
            ranks[int(rank[0])] = int(pid)
    return ranks


def start_ranks(args: list[str], consoles: Path, world_size: int = 2, *,
                torchrun_id: bool = False) -> list[warm_python.Popen]:
    """`python scripts/train.py *args` started as each rank of a data-parallel run, in the environment
    torchrun gives its workers, each a fork of the warm Python writing its console to
    consoles/rank<N>.txt. A torchrun launch starts three fresh Pythons (the launcher and two workers),
    each importing torch: the suite's largest cost. The tests of torchrun's own part (its SIGTERM to
    the ranks left once one exits, its summary of their exit codes) launch it. `torchrun_id`: with
    torchrun's TORCHELASTIC_RUN_ID too, where a rank acts on what torchrun does (no torchrun here ends a
    rank that waits for it, `cli._let_rank_0_say_it`)."""
    port, script = str(free_port()), str(ROOT / "scripts" / "train.py")
    processes = []
    try:
        for rank in range(world_size):
            env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   **({"TORCHELASTIC_RUN_ID": "none"} if torchrun_id else {})}
            with open(consoles / f"rank{rank}.txt", "w") as console:
                processes.append(warm_python.Popen([sys.executable, script, *args], cwd=ROOT,
                                                   stdout=subprocess.DEVNULL, stderr=console, env=env))
    except BaseException:  # the ranks started would wait for their peer in the rendezvous, past the test
        for process in processes:
            process.kill()
            process.wait()
        raise
    return processes


def test_a_rank_that_fails_to_start_takes_the_ranks_started_before_it_down(monkeypatch, tmp_path):
    """start_ranks: a rank whose start fails (the warm Python gone, a console not opened) left the ranks
    started before it waiting for their peer in the process group's rendezvous, outliving the test."""
    started = []

    class Rank:
        def __init__(self, args, **kwargs):
            if started:
                raise OSError("no second rank")
            self.ended = []
            started.append(self)

        def kill(self):
            self.ended.append("kill")

        def wait(self, timeout=None):
            self.ended.append("wait")

    monkeypatch.setattr(warm_python, "Popen", Rank)
    with pytest.raises(OSError, match="no second rank"):
        start_ranks(["--config", str(TINY)], tmp_path)
    assert [rank.ended for rank in started] == [["kill", "wait"]]


# torch's C++ warnings, "[W1206 21:03:56.897621108 ProcessGroupGloo.cpp:524] Warning: ...": gloo's on a
# machine whose hostname does not resolve (a container), which every rank prints
TORCH_WARNING = re.compile(r"^\[W\d{4} [^\]]*\] Warning: .*\n?", re.MULTILINE)


def own_lines(console: str) -> str:
    """A rank's console (`run_ranks`) without torch's C++ warnings: what tinyattn and Python said."""
    return TORCH_WARNING.sub("", console)


def test_own_lines_drops_torchs_warnings_and_keeps_everything_else():
    gloo = ("[W1206 21:03:56.897621108 ProcessGroupGloo.cpp:524] Warning: Unable to resolve hostname to a "
            "(local) address. Using the loopback address as fallback. (function operator())\n")
    said = "rank 1: error: another rank left the run\nTraceback (most recent call last):\n"
    assert own_lines(gloo + said + gloo) == said and own_lines(gloo) == ""


def run_ranks(args: list[str], consoles: Path, timeout: float = 120) -> tuple[list[int], list[str]]:
    """Each rank's exit status and console (stderr) once all of them ended (`start_ranks`)."""
    processes = start_ranks(args, consoles)
    try:
        for process in processes:
            process.wait(timeout=timeout)
    finally:
        for process in processes:  # a hung rank waits in a collective for its peer
            process.kill()
            process.wait()
    return ([p.returncode for p in processes],
            [(consoles / f"rank{r}.txt").read_text() for r in range(len(processes))])


@pytest.mark.slow
def test_two_process_gloo_run(corpus, tmp_path):
    codes, consoles = run_ranks(
        ["--config", str(TINY), "--run-name", "ddp", "--no-progress", "--device", "cpu", "--set",
         *tiny_overrides(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=3")], tmp_path)
    assert codes == [0, 0], consoles
    state = ckpt.load_checkpoint(tmp_path / "ddp" / "step_0000006.pt")
    assert state["world_size"] == 2 and state["sampler"]["batches_drawn"] == 6
    assert state["tokens_seen"] == 6 * 2 * 4 * 32
    # The checkpoint is an ordinary one: it loads into a single process for sampling.
    loaded = ckpt.load_model(tmp_path / "ddp")
    assert loaded.step == 6
    # DDP averages the two ranks' gradients: the weights are those of one process stepping over
    # the same global batches (rank 0's batch k and rank 1's batch k as one batch of 8). Without
    # the averaging each rank would follow its own batches and differ by ~lr (2e-3) a step.
    reference = one_process_over_global_batches(load_config(tmp_path / "ddp" / "config.yaml"), steps=6,
                                                world_size=2)
    for name, tensor in reference.items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=0, atol=1e-5, msg=name)


def test_each_rank_draws_dropout_masks_of_its_own_and_a_resume_draws_them_again(monkeypatch):
    """Every rank seeds alike (the model starts the same everywhere), so every rank dropped the same
    elements of its own batch. Rank r > 0 now draws from (seed, r, step): apart from rank 0, and again
    after a resume from a checkpoint that keeps rank 0's generators only. The ranks are set on the
    trainer after it is built (no process group: one step here needs none), with the same batches."""
    from tinyattn.config import ModelConfig, TrainConfig
    from tinyattn.system.device import select_precision
    from tinyattn.system.distributed import Distributed

    cpu = torch.device("cpu")
    tokens = (np.arange(3000) * 7 % 13).astype("uint16")

    def trainer_at(rank: int) -> Trainer:
        trainer = Trainer.build(ModelConfig(vocab_size=13, n_layer=1, n_head=2, n_embd=16, context_length=16,
                                            dropout=0.3), TrainConfig(batch_size=4, seed=5), tokens,
                                device=cpu, precision=select_precision("fp32", cpu))
        trainer.dist = Distributed(rank=rank, world_size=2)
        return trainer

    def losses(trainer: Trainer, steps: int) -> list[float]:
        return [trainer.train_step()[0].item() for _ in range(steps)]

    from tinyattn.system.seeding import rank_seed

    rank0, first_rank1 = losses(trainer_at(0), 3), trainer_at(1)
    seeds, seed = [], torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda value: (seeds.append(value), seed(value))[1])
    rank1 = losses(first_rank1, 3)
    monkeypatch.undo()
    assert seeds == [rank_seed(5, 1, step) for step in range(3)] and len(set(seeds)) == 3
    assert rank_seed(5, 2, 0) not in seeds and rank_seed(6, 1, 0) not in seeds
    assert all(a != b for a, b in zip(rank0, rank1))  # the same weights and batch at step 0: masks differ
    assert losses(trainer_at(0), 3) == rank0 and losses(trainer_at(1), 3) == rank1
    stopped = trainer_at(1)
    losses(stopped, 2)
    state = stopped.state_dict()
    resumed = trainer_at(1)
    torch.manual_seed(123)  # whatever the process drew before
    resumed.load_state_dict(state, Path("step_2.pt"))
    assert losses(resumed, 1) == rank1[2:]


RANK_0_LINGERS = """import atexit, os, runpy, sys, time
if os.environ["RANK"] == "0":
    atexit.register(time.sleep, 1.0)  # after the command's exit status is set
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def signal_one_rank(corpus: Path, tmp_path: Path, sig: int, *, after: str):
    """A two-process torchrun training of configs/tiny.yaml (run 'ddp' under tmp_path) whose rank 1
    gets `sig` once rank 0's console shows a line starting `after`; (the launcher, all it printed).
    Rank 0 lingers a second at its exit, so rank 1 exits first and torchrun's SIGTERM to the rank
    left reaches rank 0 after its run has ended."""
    pytest.importorskip("torch.distributed.run")
    lingers = tmp_path / "rank_0_lingers.py"
    lingers.write_text(RANK_0_LINGERS, encoding="utf-8")
    process = warm_python.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
         str(lingers), str(ROOT / "scripts" / "train.py"), "--config", str(TINY), "--run-name", "ddp",
         "--no-progress",
         "--device", "cpu", "--set",
         *tiny_overrides(corpus, tmp_path, "train.max_steps=100000", "train.eval_interval=100000",
                         "train.log_interval=1")],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines, workers = [], {}
    try:
        for line in process.stderr:
            lines.append(line)
            if line.startswith(after):
                break
        workers = torchrun_workers(process)
        os.kill(workers[1], sig)
        _, rest = process.communicate(timeout=20)
    finally:
        for pid in [process.pid, *workers.values()]:  # a hung run: torchrun's workers outlive it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
    return process, "".join(lines) + rest


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds torchrun's workers in /proc")
def test_a_stop_signal_to_one_rank_stops_every_rank_with_a_checkpoint(corpus, tmp_path):
    """`kill -TERM` to rank 1 alone: every rank stops after the same step and rank 0 saves. Each
    rank acting on its own flag hung: rank 1 waited in the checkpoint's barrier, rank 0 in the next
    step's all-reduce (gloo's timeout is 30 minutes). The rank that exits last ignores torchrun's
    SIGTERM, which follows the first exit: it ended by that signal (-15), its run already over."""
    # once training really runs
    process, stderr = signal_one_rank(corpus, tmp_path, signal.SIGTERM, after="step 3:")
    # torchrun exits 1 when its workers do not exit 0: here each with a stop's 130
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)
    assert process.returncode == 1 and set(codes) == {"130"}, stderr[-3000:]
    assert "stopped by SIGTERM at step" in stderr, stderr[-3000:]
    latest = ckpt.latest_checkpoint(tmp_path / "ddp")
    assert latest is not None and ckpt.load_checkpoint(latest)["step"] >= 3


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["checkpoints", "no-data"])
def test_a_refusal_on_rank_0_ends_every_rank_with_its_one_line(corpus, tmp_path, refusal):
    """Rank 0 alone opens the run folder and builds the token cache while the others wait for it:
    its refusal is one line on the console and every rank exits 2. The others printed gloo's
    "Connection closed by peer" traceback (exit 1) as rank 0 exited."""
    overrides = tiny_overrides(corpus, tmp_path)
    if refusal == "checkpoints":
        (tmp_path / "ddp").mkdir()
        (tmp_path / "ddp" / "best.pt").write_bytes(b"")
        expected = f"error: {tmp_path / 'ddp'} already holds checkpoints"
    else:
        overrides = [o if not o.startswith("data.files=") else f"data.files={tmp_path / 'gone.txt'}"
                     for o in overrides]
        expected = f"error: data.files: file not found: {tmp_path / 'gone.txt'}"
    codes, (rank0, rank1) = run_ranks(["--config", str(TINY), "--run-name", "ddp", "--no-progress",
                                       "--device", "cpu", "--set", *overrides], tmp_path, timeout=60)
    assert codes == [2, 2], (rank0, rank1)
    assert rank0.count("error: ") == 1 and expected in rank0, rank0
    assert own_lines(rank1) == "", rank1  # gloo's traceback was here



GLOO_PEER_GONE = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:31892. This is typically caused by a remote worker crashing.")


def test_a_rank_that_left_alone_ends_the_others_with_a_line_each_and_a_new_runs_folder_goes(
        monkeypatch, corpus, tmp_path):
    """A stop signal to one rank before step 1 (`kill -TERM <pid>`) ends it at once; the others, waiting
    in a collective (rank 0's data preparation, the time budget's measuring steps), met
    gloo's "Connection closed by peer" RuntimeError: a traceback on each, rank 0's cut off by torchrun's
    SIGTERM, and the new run's folder left with a train.log ending 'failed: RuntimeError'. Now rank 0
    says one line (`shared`: the others print nothing), the folder goes as any failed start's, and the
    signal torchrun then sends the ranks left is ignored."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train import loop

    def peer_gone(*args, **kwargs):
        raise RuntimeError(GLOO_PEER_GONE)

    monkeypatch.setattr(loop, "init_distributed", lambda device: Distributed(rank=0, world_size=2))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: None)
    monkeypatch.setattr(torch.distributed, "all_gather_object", lambda gathered, mine: gathered.__setitem__(
        slice(None), [mine] * len(gathered)))
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", lambda objects, src: None)
    monkeypatch.setattr(loop, "_build", peer_gone)  # the data's collectives, then the measuring steps
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(TinyattnError, match="^another rank left the run") as raised:
            train(tiny_config(corpus, tmp_path), run_name="ddp", progress=False)
        # torchrun's SIGTERM to the ranks left, which follows, cannot kill rank 0 before its line
        assert {signal.getsignal(sig) for sig in handlers} == {signal.SIG_IGN}
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert not getattr(raised.value, "shared", False)  # each rank says it: rank 0 may be the one gone
    assert not (tmp_path / "ddp").exists()


@pytest.mark.parametrize("world_size, rank", [(1, 0), (2, 0), (2, 1)])
def test_rank_0_outlives_torchruns_sigterm_until_it_has_said_an_error_every_rank_shares(
        monkeypatch, corpus, tmp_path, world_size, rank):
    """A NaN in the ranks' mean loss ends every rank with rank 0's line alone (`shared`): the others
    exit at once, and torchrun's SIGTERM to rank 0, which follows, killed it before its line (in
    shutdown_distributed's wait, say): the console said nothing. From such an error on, the run
    ignores it, as after a rank left. One process, an error of one rank's own, or another rank: signals as
    before (another rank waits for torchrun's SIGTERM, `cli._let_rank_0_say_it`: ignored, it was lost)."""
    from tinyattn.system.distributed import Distributed, said_once
    from tinyattn.train import loop

    def nan_in_the_mean(*args):
        raise said_once(TrainingError("the loss became nan at step 3; training stopped"), world_size > 1)

    monkeypatch.setattr(loop, "init_distributed",
                        lambda device: Distributed(rank=rank, world_size=world_size))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: None)
    monkeypatch.setattr(loop, "_train", nan_in_the_mean)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(TrainingError, match="^the loss became nan"):
            train(tiny_config(corpus, tmp_path), run_name="ddp", progress=False)
        after = {sig: signal.getsignal(sig) for sig in handlers}
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if rank == 0 and world_size > 1:
        assert set(after.values()) == {signal.SIG_IGN}
    else:
        assert after == handlers


@pytest.mark.parametrize("signalled", [False, True])
def test_a_rank_that_had_torchruns_stop_before_an_error_every_rank_shares_is_marked_not_to_wait(
        monkeypatch, corpus, tmp_path, signalled):
    """torchrun stopping its workers (Ctrl-C or SIGTERM to it) signals each once; the stop reads the
    losses, which may hold a NaN: an error every rank shares. Rank 1 then waited for a second SIGTERM
    (`cli._let_rank_0_say_it`) that never came, the whole wait. It is marked `stop_seen` now."""
    from tinyattn.system.distributed import Distributed, said_once
    from tinyattn.train import loop

    def stopped_then_nan(config, request, dist, stopper):
        stopper.signal_name = "SIGTERM" if signalled else None
        raise said_once(TrainingError("the loss became nan at step 3; training stopped"), True)

    monkeypatch.setattr(loop, "init_distributed", lambda device: Distributed(rank=1, world_size=2))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: None)
    monkeypatch.setattr(loop, "_train", stopped_then_nan)
    with pytest.raises(TrainingError, match="^the loss became nan") as raised:
        train(tiny_config(corpus, tmp_path), run_name="ddp", progress=False)
    assert raised.value.shared and raised.value.stop_seen == signalled


def test_torchruns_sigterm_during_the_clean_up_after_a_rank_left_is_ignored(monkeypatch, corpus, tmp_path):
    """torchrun's SIGTERM to the ranks left comes while rank 0 cleans up (train.log, the lock, a new
    run's folder): `StopRequest.end_deaf` makes the handler ignore it there, where it raised
    StoppedBeforeStart, left the new run's folder and ended rank 0 without its line."""
    import os

    from tinyattn.system.distributed import Distributed
    from tinyattn.train import loop

    def peer_gone(*args, **kwargs):
        raise RuntimeError(GLOO_PEER_GONE)

    def signalled_then_removed(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before kill returns
        return remove_failed_start(*args)

    remove_failed_start = loop.remove_failed_start
    monkeypatch.setattr(loop, "init_distributed", lambda device: Distributed(rank=0, world_size=2))
    monkeypatch.setattr(loop, "shutdown_distributed", lambda dist: None)
    monkeypatch.setattr(torch.distributed, "all_gather_object", lambda gathered, mine: gathered.__setitem__(
        slice(None), [mine] * len(gathered)))
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", lambda objects, src: None)
    monkeypatch.setattr(loop, "_build", peer_gone)
    monkeypatch.setattr(loop, "remove_failed_start", signalled_then_removed)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(TinyattnError, match="^another rank left the run"):
            train(tiny_config(corpus, tmp_path), run_name="ddp", progress=False)
    except KeyboardInterrupt as stop:  # a failure of this test, not the end of the session
        pytest.fail(f"the signal cut the clean-up: {stop}")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert not (tmp_path / "ddp").exists()


def test_a_peer_gone_mid_training_is_said_by_each_rank_left_with_the_checkpoint_kept(tmp_path):
    """Mid-training the line names the checkpoint kept; it stays each rank's, as before step 1: rank 0
    may be the one gone (kill -9, the OOM killer), and a line marked as rank 0's was then said by none."""
    from tinyattn.system.distributed import PeerGone
    from tinyattn.train.loop import _said_what_is_kept
    from tinyattn.train.owners import StopRequest

    with pytest.raises(PeerGone, match="^another rank left the run; every rank stops before any checkpoint") \
            as raised:
        with _said_what_is_kept(tmp_path, StopRequest()):  # not at_once: training started
            raise PeerGone("another rank left the run; every rank stops")
    assert not getattr(raised.value, "shared", False)


def console_shows(console: Path, start: str, timeout: float = 60) -> None:
    """Waits until the file `console` (a rank's, `start_ranks`) holds a line starting `start`."""
    deadline = time.monotonic() + timeout
    while not any(line.startswith(start) for line in console.read_text().splitlines()):
        assert time.monotonic() < deadline, f"no line {start!r} in {timeout} s:\n{console.read_text()}"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("killed", [0, 1])
def test_a_rank_killed_mid_training_ends_the_other_with_the_checkpoint_it_keeps_and_the_resume(
        corpus, tmp_path, killed):
    """`kill -9` to one rank (the OOM killer) after checkpoints: where rank 0 was killed rank 1 said
    nothing (its line was marked as rank 0's); now the rank left says `error: another rank left the run
    ...; every rank stops` (`rank 1: ` before it off rank 0), naming the folder's last checkpoint and the
    resume, as a second stop's line does."""
    processes = start_ranks(["--config", str(TINY), "--run-name", "ddp", "--no-progress", "--device", "cpu",
                             "--set", *tiny_overrides(corpus, tmp_path, "train.max_steps=100000",
                                                      "train.eval_interval=2", "train.log_interval=1")],
                            tmp_path)
    try:
        console_shows(tmp_path / "rank0.txt", "step 4: validation loss")  # after a checkpoint is saved
        processes[killed].kill()
        left = processes[1 - killed]
        left.wait(timeout=30)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert left.returncode == 2
    run, console = tmp_path / "ddp", (tmp_path / f"rank{1 - killed}.txt").read_text()
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and ckpt.load_checkpoint(latest)["step"] >= 2
    said = re.search(rf"^{'rank 1: ' if killed == 0 else ''}error: another rank left the run .*$", console,
                     re.MULTILINE)
    assert said is not None, console[-3000:]
    assert said.group(0).endswith(
        f"every rank stops; the last checkpoint saved is step {ckpt.step_of(latest)}'s ({latest.name}) in "
        f"{run}, what was trained after it is lost. Resume with: torchrun --nproc_per_node=2 "
        f"{ROOT / 'scripts' / 'train.py'} --resume {run}"), said.group(0)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def ended(pid: int) -> bool:
    """Whether process `pid` (not this process's child) has ended: gone, or a zombie left unreaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_whose_launcher_is_killed_stop_with_a_checkpoint_rather_than_train_on_unseen(corpus, tmp_path):
    """`kill -9` to torchrun (or the OOM killer choosing it): its ranks run in a session of their own,
    so no signal reached them and they trained on with no one to stop them (`sigterm_when_the_parent_ends`).
    Here each rank's launcher is the warm Python's process that forked it."""
    processes = start_ranks(["--config", str(TINY), "--run-name", "ddp", "--no-progress", "--device", "cpu",
                             "--set", *tiny_overrides(corpus, tmp_path, "train.max_steps=100000",
                                                      "train.eval_interval=100000", "train.log_interval=1")],
                            tmp_path, torchrun_id=True)
    ranks = [process.pid for process in processes]
    try:
        if not all(process.forked for process in processes):  # their parent is this process
            pytest.skip("the ranks' launcher must be the warm Python's (the suite's OMP_NUM_THREADS=1)")
        console_shows(tmp_path / "rank0.txt", "step 3:")  # once training really runs
        for rank in ranks:
            os.kill(parent_of(rank), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not all(map(ended, ranks)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(ended, ranks)), "the ranks trained on after their launcher was killed"
    finally:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
        for process in processes:
            process.wait()
    console = (tmp_path / "rank0.txt").read_text()
    assert re.search(r"^stopped by SIGTERM at step \d+", console, re.MULTILINE), console[-3000:]
    latest = ckpt.latest_checkpoint(tmp_path / "ddp")
    assert latest is not None and ckpt.load_checkpoint(latest)["step"] >= 3


@pytest.mark.slow
# Two of the refusals the fix covers, one before the run's folder (every rank's check, agreed) and one
# after (rank 0's plan, shared): a budget no step fits and a bad --run-name are marked shared alike.
@pytest.mark.parametrize("mistake", ["init_from", "stop-at-step"])
def test_a_mistake_every_rank_meets_is_one_line_on_the_console(corpus, tmp_path, mistake):
    """Every rank checks the fine-tune's source, --stop-at-step and a budget no step fits alike: rank 0
    alone says it, as README's "one line on the console, rank 0's" promises. Each rank printed its
    copy (`rank 1: error: ...` above rank 0's line)."""
    extra = {"init_from": ["--set", f"train.init_from={tmp_path / 'gone.pt'}"],
             "stop-at-step": ["--stop-at-step", "0"]}[mistake]
    expected = {"init_from": f"error: train.init_from: {tmp_path / 'gone.pt'}: no such checkpoint",
                "stop-at-step": "error: --stop-at-step 0: the run is already at step 0"}[mistake]
    codes, (rank0, rank1) = run_ranks(["--config", str(TINY), "--run-name", "ddp", "--no-progress",
                                       "--device", "cpu", "--set", *tiny_overrides(corpus, tmp_path), *extra],
                                      tmp_path)
    assert codes == [2, 2], (rank0, rank1)
    assert rank0.count("error: ") == 1 and expected in rank0, rank0
    assert own_lines(rank1) == "", rank1  # each rank printed its copy here
    assert not (tmp_path / "ddp").exists()  # a new run's failed start leaves no folder


@pytest.mark.slow
def test_a_resume_on_changed_data_is_refused_in_one_line_under_torchrun(corpus, tmp_path):
    """Every rank compares the data with the checkpoint's alike (after rank 0 built the cache): rank 0
    alone says the refusal. Each rank printed its copy ('rank 1: error: ...' beside rank 0's)."""
    text = tmp_path / "text.txt"
    shutil.copyfile(corpus, text)
    overrides = [o if not o.startswith("data.files=") else f"data.files={text}"
                 for o in tiny_overrides(corpus, tmp_path, "train.max_steps=2")]
    train(load_config(TINY, overrides), run_name="ddp")
    text.write_text(text.read_text(encoding="utf-8") + "more text\n", encoding="utf-8")
    codes, (rank0, rank1) = run_ranks(["--resume", str(tmp_path / "ddp"), "--no-progress", "--device", "cpu",
                                       "--set", "train.max_steps=4"], tmp_path)
    assert codes == [2, 2], (rank0, rank1)
    assert rank0.count("error: ") == 1, rank0
    assert "the data differs from what the run trained on" in rank0, rank0
    assert own_lines(rank1) == "", rank1

class GlobalBatches:
    """Every rank's batch k of a world_size-process run, concatenated: one process's view of it."""

    def __init__(self, tokens, config, world_size: int):
        from tinyattn.data.batches import BatchSampler

        self.ranks = [BatchSampler(tokens, config.train.batch_size, config.model.context_length,
                                   seed=config.train.seed, rank=r, world_size=world_size,
                                   sampling=config.train.sampling)
                      for r in range(world_size)]
        self.batch_size = config.train.batch_size * world_size
        self.context_length = config.model.context_length

    def plan_end(self, batches):
        for sampler in self.ranks:  # each rank's trainer tells its own sampler the same end
            sampler.plan_end(batches)

    def next_batch(self):
        xs, ys = zip(*(sampler.next_batch() for sampler in self.ranks))
        return torch.cat(xs), torch.cat(ys)  # (world_size * B, T) each


def one_process_over_global_batches(config, steps: int, world_size: int) -> dict:
    """The weights after `steps` single-process steps over a world_size-process run's batches."""
    from tinyattn.data.batches import prepare_data
    from tinyattn.system.device import select_precision

    cpu = torch.device("cpu")
    data = prepare_data(config, progress=False)
    trainer = Trainer.build(config.model, config.train, data.train, device=cpu,
                            precision=select_precision("fp32", cpu))
    trainer.batches = GlobalBatches(data.train, config, world_size)
    for _ in range(steps):
        trainer.train_step()
    return trainer.model.state_dict()


@pytest.mark.slow
@pytest.mark.bench  # a wall-clock assertion: `make test` skips it, `make bench-check` runs it
def test_time_budget_run_ends_within_its_budget(corpus, tmp_path):
    """The whole process, start-up included, ends within its 20 s budget and uses it.

    Without the budget this config stops after 20 steps (about 3 s). The run re-plans from
    the time left after every step, so it lands within its budget whatever the shared CPU
    does; tests/test_budget.py pins how, with a fake clock. The bound here is loose (the
    process's own start-up and exit are outside the plan's view); how close the budget lands
    is a benchmark figure (docs/BENCHMARKS.md), not this test's.
    """
    start = time.perf_counter()
    result = subprocess.run(  # a fresh Python: its start-up is part of the budget
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config", str(TINY), "--run-name", "budget",
         "--no-progress", "--set",
         *tiny_overrides(corpus, tmp_path, "train.time_budget=20s", "train.eval_interval=400",
                         "train.log_interval=50", "train.batch_size=16")],
        cwd=ROOT, capture_output=True, text=True, timeout=150, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert 17.0 <= wall <= 21.0, f"{wall:.1f} s\n{result.stderr[-2000:]}"
    assert "-> about " in result.stderr and "the schedule follows the time left" in result.stderr
    done = [line for line in result.stderr.splitlines() if line.startswith("done: ")]
    # the count with its thousands separators ("done: 1,206 steps"), as every count in the log
    assert done and int(done[0].split()[1].replace(",", "")) > 100 and "of the 20s budget spent" in done[0]


def test_a_budget_too_small_for_one_step_is_one_line(corpus, tmp_path):
    with pytest.raises(TinyattnError, match=r"train.time_budget 0.01s: .* no step fits"):
        train(tiny_config(corpus, tmp_path, "train.time_budget=0.01s"), run_name="small", progress=False)


# ----------------------------------------------------------------------------- the step's arithmetic


def tiny_trainer(batches, *, precision=None, **train_options) -> Trainer:
    """A Trainer over a 2-layer model of a 67-token vocabulary (AdamW) and the given batches, in
    `precision` (a Precision; default fp32)."""
    from tinyattn.config import ModelConfig, TrainConfig
    from tinyattn.system.device import select_precision

    cpu = torch.device("cpu")
    model_config = ModelConfig(vocab_size=67, n_layer=2, n_head=2, n_embd=32, context_length=32)
    tokens = np.random.default_rng(0).integers(0, 67, size=2000).astype(np.uint16)
    trainer = Trainer.build(model_config, TrainConfig(batch_size=8, **train_options), tokens, device=cpu,
                            precision=precision or select_precision("fp32", cpu))
    if batches is not None:
        trainer.batches = batches
    return trainer


def test_an_evaluation_runs_in_the_precision_the_run_trains_in():
    """A bf16 run's validation loss is computed under its autocast, as its steps are: the model's
    matmuls in bf16, not in fp32 at several times the cost (and another loss than training's)."""
    from types import SimpleNamespace

    from tinyattn.config import Config, ModelConfig, TrainConfig
    from tinyattn.model.transformer import LanguageModel
    from tinyattn.system.device import select_precision
    from tinyattn.train.owners import Evaluator

    cpu = torch.device("cpu")
    config = Config(model=ModelConfig(vocab_size=67, n_layer=1, n_head=2, n_embd=32, context_length=32),
                    train=TrainConfig(batch_size=8, eval_windows=2))
    trainer = SimpleNamespace(model=LanguageModel(config.model), device=cpu,
                              precision=select_precision("bf16", cpu))  # what an evaluation reads of it
    dtypes = []
    trainer.model.head.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    validation = np.random.default_rng(1).integers(0, 67, size=200).astype(np.uint16)
    Evaluator(trainer, config, validation, tokenizer=None).run(step=0)
    assert dtypes and set(dtypes) == {torch.bfloat16}


def test_a_resume_by_another_number_of_processes_is_warned_of_naming_the_checkpoint(tmp_path):
    trainer = tiny_trainer(None)
    file = tmp_path / "step_0000000.pt"
    with pytest.warns(UserWarning, match=rf"^{re.escape(str(file))} was written by 2 process\(es\), this run "
                                         r"has 1: the batches and tokens per step differ"):
        trainer.load_state_dict({**trainer.state_dict(), "world_size": 2}, file)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same count: nothing to say
        trainer.load_state_dict(trainer.state_dict(), file)


def test_the_trainer_draws_its_windows_as_train_sampling_says():
    assert tiny_trainer(None).batches.sampling == "random"
    assert tiny_trainer(None, sampling="passes").batches.sampling == "passes"


def test_the_trainer_ends_its_last_pass_with_the_run():
    trainer = tiny_trainer(None, sampling="passes", max_steps=12, grad_accum_steps=2)
    for _ in range(12):
        trainer.train_step()
    # 12 steps of 2 batches of 8 windows, 61 windows a pass: 192 windows in 4 passes of 48.
    assert trainer.batches.pass_starts == [0, 48, 96, 144]


def test_the_trainer_ends_its_last_pass_with_a_time_budgets_run():
    # The plan's run length is the step reached plus the steps that still fit (TimePlan.total_steps):
    # told only the steps left, the sampler would place every pass end from a shrinking run.
    from tinyattn.train.budget import TimePlan

    trainer = tiny_trainer(None, sampling="passes", eval_interval=100_000)
    now = [0.0]
    trainer.plan = TimePlan("10s", trainer.config, lambda: now[0])
    # 10 s less 1.5 % and 1 s of exit: 8.85 s, 35 steps of 0.25 s (the fake clock's), evaluations free.
    assert trainer.plan.seed(step_seconds=0.25, eval_seconds=0.0, save_seconds=0.0) == 35
    trainer.plan.start()
    while not trainer.plan.done(trainer.step):
        trainer.train_step()
        now[0] += 0.25
        trainer.plan.after_step(trainer.step)
    # 35 steps of 8 windows, 61 windows a pass: 280 windows in 5 passes of 56, the last ending the run.
    assert trainer.step == 35 and trainer.batches.batches_drawn * 8 == 280
    assert trainer.batches.pass_starts == [0, 56, 112, 168, 224]


def test_the_trainer_steps_with_the_rate_of_the_schedule():
    trainer = tiny_trainer(None, lr=1e-2, min_lr=1e-3, embedding_lr=3e-2, warmup_steps=2, max_steps=6,
                           schedule="cosine")
    used = []  # per step: {group name: the lr the optimizer stepped with}
    for optimizer in trainer.optimizers.optimizers:
        optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: used.append({g["name"]: g["lr"] for g in opt.param_groups}))
    for _ in range(6):
        trainer.train_step()
    # Warmup 5e-3, 1e-2; then cosine from 1e-2 to the 1e-3 floor over steps 2..5 (0-based), the
    # last step at the floor: 1e-3 + (1e-2 - 1e-3) * (1 + cos(pi * (k - 2) / 3)) / 2.
    expected = [5e-3, 1e-2, 1e-2, 7.75e-3, 3.25e-3, 1e-3]
    assert [step["matrices"] for step in used] == pytest.approx(expected, rel=1e-6)
    assert [step["gains"] for step in used] == pytest.approx(expected, rel=1e-6)
    assert [step["embedding"] for step in used] == pytest.approx([3 * r for r in expected], rel=1e-6)


def test_the_logged_learning_rates_are_read_from_the_optimizers(tmp_path, tensorboard_writer):
    from tinyattn.config import Config
    from tinyattn.train.log import Logger

    trainer = tiny_trainer(None, optimizer="muon", lr=1e-2)
    rates = {"embedding": 0.25, "gains": 0.125}  # no schedule gives these: they can only be read
    for group in trainer.optimizers.optimizers[0].param_groups:
        group["lr"] = rates[group["name"]]
    trainer.optimizers.optimizers[1].param_groups[0]["lr"] = 0.5
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = tensorboard_writer
    log.train(step=1, losses=[2.0], seconds=1.0, grad_norm=torch.tensor(1.0))
    logged = {tag: value for tag, value, _ in tensorboard_writer.scalars}
    assert logged["train/learning_rate"] == 0.125  # the norm gains' group: the one train.lr sets
    assert {tag: value for tag, value in logged.items() if tag.startswith("lr/")} == {
        "lr/adamw/embedding": 0.25, "lr/adamw/gains": 0.125, "lr/muon/matrices": 0.5}


def test_the_progress_bar_shows_the_figures_of_the_step_it_reaches(tmp_path, tensorboard_writer):
    import io

    from tqdm import tqdm

    from tinyattn.config import Config
    from tinyattn.train.log import Logger

    trainer = tiny_trainer(None, max_steps=20)
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=True)
    log.writer = tensorboard_writer
    screen = io.StringIO()
    log.bar = tqdm(total=20, file=screen, mininterval=0, miniters=1)  # draws at each update, as slow steps do
    log.train(step=5, losses=[3.0] * 5, seconds=1.0, grad_norm=torch.tensor(1.0))
    log.train(step=10, losses=[2.5, 2.5, 1.5, 3.0, 0.5], seconds=4.0, grad_norm=torch.tensor(1.0))
    last = screen.getvalue().split("\r")[-1]
    assert " 10/20 " in last and "loss=2.0000" in last  # the mean of the steps since the last line
    assert [(value, step) for tag, value, step in tensorboard_writer.scalars if tag == "train/loss"] == [
        (3.0, 5), (2.0, 10)]
    assert f"tok_s={5 * trainer.tokens_per_step / 4.0:,.0f}" in last
    log.bar.close()


def test_the_logged_tokens_are_the_runs_since_step_0_and_the_throughput_this_sessions_over_every_rank(
        tmp_path, tensorboard_writer):
    from tinyattn.config import Config
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.log import Logger

    trainer = tiny_trainer(None)
    trainer.dist = Distributed(rank=0, world_size=2)  # a step's tokens_per_step are every rank's
    trainer.tokens_seen = 123_456  # resumed: what the checkpoint's steps saw, and this session's since
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = tensorboard_writer
    log.train(step=5, losses=[2.0] * 5, seconds=1.0, grad_norm=torch.tensor(1.0))
    log.train(step=10, losses=[2.0] * 5, seconds=3.0, grad_norm=torch.tensor(1.0))
    logged = {(tag, step): value for tag, value, step in tensorboard_writer.scalars}
    assert logged["train/tokens_seen", 10] == 123_456
    tokens_per_second = 5 * trainer.tokens_per_step / 3.0
    assert logged["perf/tokens_per_second", 10] == pytest.approx(tokens_per_second)
    assert logged["perf/mfu", 10] == pytest.approx(trainer.model.flops_per_token() * tokens_per_second / 2e12)
    assert log.tokens_per_second == pytest.approx(10 * trainer.tokens_per_step / 4.0)  # the session's, whole


def test_the_throughput_counts_only_the_timed_steps_tokens_and_seconds(tmp_path, tensorboard_writer):
    # A window whose first step compiled the model: its seconds are of its other steps only, and the
    # compiling step's tokens are left out with its time, in perf/tokens_per_second and the last line.
    from tinyattn.config import Config
    from tinyattn.train.log import Logger

    trainer = tiny_trainer(None)
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = tensorboard_writer
    log.train(step=1, losses=[2.0], seconds=0.5, grad_norm=torch.tensor(1.0), timed=0)  # compiling alone
    log.train(step=4, losses=[2.0] * 3, seconds=1.0, grad_norm=torch.tensor(1.0), timed=2)
    logged = {(tag, step): value for tag, value, step in tensorboard_writer.scalars}
    assert ("perf/tokens_per_second", 1) not in logged
    assert logged["perf/tokens_per_second", 4] == pytest.approx(2 * trainer.tokens_per_step)
    assert log.tokens_per_second == pytest.approx(2 * trainer.tokens_per_step)


def test_the_last_line_splits_the_runs_time_as_shares_of_its_wall_time(tmp_path, tensorboard_writer, capsys):
    """Each activity's share is of the whole process's wall time (what the shares leave is time no
    activity counted), not of their sum."""
    from tinyattn.config import Config
    from tinyattn.train.log import Logger
    from tinyattn.train.trainer import TrainResult

    trainer = tiny_trainer(None)
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = tensorboard_writer
    seconds = {"start-up": 1.0, "train": 6.0, "eval": 1.0}
    log.finish(TrainResult(tmp_path, 4, 0, 2.0, 2.0, 100.0, 10.0, False, seconds), None)
    assert "(start-up 1.0 s (10.0%), train 6.0 s (60.0%), eval 1.0 s (10.0%))" in capsys.readouterr().err


def test_the_last_line_counts_steps_with_thousands_separators_as_every_other_line(
        tmp_path, tensorboard_writer, capsys):
    # "done: 1345 steps (steps 1001-2345)" beside "about 1,147 steps" in the lines above it. The steps
    # it names stay as every line names a step ("step 2345: validation loss", step_0002345.pt).
    from tinyattn.config import Config
    from tinyattn.train.log import Logger
    from tinyattn.train.trainer import TrainResult

    trainer = tiny_trainer(None)
    trainer.step = 1000  # resumed there: this session trains steps 1,001 to 2,345
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = tensorboard_writer
    log.finish(TrainResult(tmp_path, 2345, 0, 2.0, 2.0, 100.0, 10.0, False, {"train": 6.0}), None)
    assert "done: 1,345 steps (steps 1001-2345) in 10.0 s" in capsys.readouterr().err
    log.finish(TrainResult(tmp_path, 1001, 0, 2.0, 2.0, 100.0, 10.0, False, {"train": 6.0}), None)
    assert "done: 1 step (step 1001) in 10.0 s" in capsys.readouterr().err


def test_an_evaluation_is_in_tensorboard_at_once_with_the_runs_best_loss(tmp_path, tensorboard_writer,
                                                                        capsys):
    from types import SimpleNamespace

    from tinyattn.config import Config
    from tinyattn.train.log import Logger
    from tinyattn.train.owners import EvalResult

    class FlushedWriter(type(tensorboard_writer)):
        def flush(self):  # SummaryWriter's: what was added is on disk, where TensorBoard reads it mid-run
            self.flushed = list(self.scalars)

    trainer = tiny_trainer(None)
    trainer.best_val_loss = 1.25  # an earlier evaluation's
    log = Logger(tmp_path, Config(), trainer, peak_flops=1e12, enabled=True, progress=False)
    log.writer = writer = FlushedWriter()
    log.evaluation(EvalResult(10, np.full(8, 1.5)), best=False,
                   evaluator=SimpleNamespace(show=lambda result, writer, run_dir: None))
    expected = [("val/loss", 1.5, 10), ("hparam/best_val_loss", 1.25, 10), ("hparam/last_val_loss", 1.5, 10)]
    assert writer.scalars == expected and writer.flushed == expected
    assert capsys.readouterr().err == "step 10: validation loss 1.5000\n"


def test_a_resumed_runs_progress_bar_starts_at_its_step_and_its_total_follows_the_plan(tmp_path):
    from types import SimpleNamespace

    from tinyattn.config import Config
    from tinyattn.train.log import Logger
    from tinyattn.train.resume import ResumePoint

    trainer = tiny_trainer(None, max_steps=20)
    trainer.step = 12
    config = Config()
    config.train.max_steps = 20
    (tmp_path / "config.yaml").write_text("train:\n  max_steps: 20\n", encoding="utf-8")
    log = Logger(tmp_path, config, trainer, peak_flops=1e12, enabled=True, progress=True)
    try:
        log.start(ResumePoint(tmp_path / "step_0000012.pt", {}, config, 12))
        assert (log.bar.n, log.bar.total) == (12, 20)
        trainer.plan = SimpleNamespace(total_steps=lambda step: step + 9)  # a time budget's, planned again
        log.train(step=15, losses=[2.0] * 3, seconds=1.0, grad_norm=torch.tensor(1.0))
        assert (log.bar.n, log.bar.total) == (15, 24)
    finally:
        log.close()


def test_the_gradient_norm_is_clipped_to_grad_clip():
    batch = torch.from_numpy(np.random.default_rng(1).integers(0, 67, size=(8, 33)))
    x, y = batch[:, :-1], batch[:, 1:]

    def step(grad_clip: float) -> tuple[float, float]:
        trainer = tiny_trainer(ListBatches([(x, y)]), grad_clip=grad_clip)
        recorder = RecordGradients(trainer.model.parameters())
        trainer.optimizers.optimizers = [recorder]
        _, norm = trainer.train_step()
        stepped = torch.linalg.vector_norm(torch.stack([g.norm() for g in recorder.grads]))
        return norm.item(), stepped.item()  # (the norm before clipping, the one the optimizer saw)

    unclipped, seen = step(grad_clip=0)  # 0: no clipping
    assert seen == pytest.approx(unclipped, rel=1e-5) and unclipped > 0.5
    before, seen = step(grad_clip=0.1)
    assert before == pytest.approx(unclipped, rel=1e-5)  # the logged norm is the one before clipping
    assert seen == pytest.approx(0.1, rel=1e-4)


def fp16():
    from tinyattn.system.device import Precision

    return Precision("fp16", torch.float16, use_grad_scaler=True)  # as on a GPU; the CPU refuses fp16 runs


def test_under_loss_scaling_the_gradient_norm_is_clipped_and_logged_unscaled():
    batch = torch.from_numpy(np.random.default_rng(1).integers(0, 67, size=(8, 33)))
    x, y = batch[:, :-1], batch[:, 1:]

    def step(grad_clip: float) -> tuple[float, float]:
        trainer = tiny_trainer(ListBatches([(x, y)]), precision=fp16(), grad_clip=grad_clip)
        recorder = RecordGradients(trainer.model.parameters())
        trainer.optimizers.optimizers = [recorder]
        _, norm = trainer.train_step()
        stepped = torch.linalg.vector_norm(torch.stack([g.norm() for g in recorder.grads]))
        return norm.item(), stepped.item()  # (the norm logged, the one the optimizer saw)

    norm, seen = step(grad_clip=0)  # the scaled loss's gradients are 65,536 times as large
    assert seen == pytest.approx(norm, rel=1e-4) and 0.5 < norm < 50
    _, seen = step(grad_clip=0.1)
    assert seen == pytest.approx(0.1, rel=1e-3)


def test_an_fp16_step_whose_gradients_overflow_moves_no_weight_and_lowers_the_loss_scale():
    trainer = tiny_trainer(None, precision=fp16())
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.model.final_norm.weight.register_hook(lambda grad: grad * math.inf)  # an overflow
    trainer.train_step()
    assert trainer.scaler.get_scale() == 65536.0 / 2
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


@pytest.mark.parametrize("grad_clip", [0.0, 1.0], ids=["no-clip", "clip"])
def test_an_fp16_overflow_in_one_optimizers_weights_moves_no_weight_of_the_others(grad_clip):
    # Muon holds the matrices, AdamW the rest: the scaler alone would skip only AdamW's step, while the
    # clipping over every parameter made Muon's gradients 0 (clipped) or NaN (0 x inf, no clipping).
    trainer = tiny_trainer(None, precision=fp16(), optimizer="muon", grad_clip=grad_clip)
    assert len(trainer.optimizers.optimizers) == 2
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.model.final_norm.weight.register_hook(lambda grad: grad * math.inf)  # AdamW's: an overflow
    trainer.train_step()
    assert trainer.scaler.get_scale() == 65536.0 / 2
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


def test_an_fp32_step_whose_gradient_is_not_finite_is_taken_and_the_next_loss_is_not_finite():
    """Without loss scaling no step is skipped for a non-finite gradient (no host sync a step): the
    weights take it, and the next step's loss, which the run reads, stops the run naming that step,
    rather than the run skipping its steps silently."""
    trainer = tiny_trainer(None)
    hook = trainer.model.final_norm.weight.register_hook(lambda grad: grad * math.inf)
    trainer.train_step()
    hook.remove()
    loss, _ = trainer.train_step()
    assert not math.isfinite(loss.item())


def test_checkpoints_are_written_at_every_eval_interval_and_the_last_step(corpus, tmp_path):
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=7", "train.eval_interval=3",
                               "train.keep_last=5", "train.sample_tokens=0"), run_name="cadence",
                   progress=False)
    files = ckpt.step_checkpoints(result.run_dir)
    assert [p.name for p in files] == [ckpt.step_filename(s) for s in (3, 6, 7)]
    assert [ckpt.load_checkpoint(p)["step"] for p in files] == [3, 6, 7]
    assert (result.run_dir / "best.pt").is_file()


# ----------------------------------------------------------------------------- the core and its hooks


@pytest.mark.slow  # a fresh interpreter
def test_importing_the_training_core_loads_no_analysis_generation_hf_or_matplotlib():
    # A fork of the warm Python (torch and torch._dynamo imported, no tinyattn or matplotlib module) holds
    # every module a fresh Python would load here, and perhaps more: a periphery module shows in both.
    code = ("import sys, tinyattn.train.loop\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('tinyattn', 'matplotlib')))))")
    done = warm_python.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    print("tinyattn.train.loop loads:", ", ".join(loaded))
    assert "tinyattn.train.loop" in loaded
    periphery = [m for m in loaded if m.startswith(("tinyattn.analysis", "tinyattn.generate", "tinyattn.hf",
                                                    "matplotlib"))]
    assert not periphery, f"the training core imports {periphery}"


def test_every_hook_name_of_the_config_has_an_implementation():
    from tinyattn.config import SHOW_HOOKS
    from tinyattn.train.hooks import IMPLEMENTATIONS, resolve_hooks

    assert set(IMPLEMENTATIONS) == set(SHOW_HOOKS)
    assert all(callable(hook) for hook in resolve_hooks(SHOW_HOOKS))


def test_the_hooks_resolve_to_their_own_function_in_the_order_train_show_lists_them():
    from tinyattn.config import SHOW_HOOKS
    from tinyattn.train.hooks import resolve_hooks

    for names in (list(SHOW_HOOKS), list(reversed(SHOW_HOOKS))):
        assert [hook.__name__ for hook in resolve_hooks(names)] == [f"show_{name}" for name in names]


def test_the_discarding_writer_takes_any_writer_call_and_keeps_nothing():
    """The time budget runs the hooks with `DISCARD` as their writer: every SummaryWriter call is a no-op."""
    from tinyattn.train.hooks import DISCARD

    assert DISCARD.add_scalar("val/loss", 1.0, 3) is None
    assert DISCARD.add_text("sample", "text", global_step=3) is None
    assert DISCARD.flush() is None


def test_the_analysis_hooks_show_the_probe_text_at_the_evaluations_step(tiny_model, char_tokenizer,
                                                                         tensorboard_writer):
    from tinyattn.analysis import training_hooks
    from tinyattn.analysis.ablation import head_ablation, head_ablation_image
    from tinyattn.analysis.attention_maps import attention_heatmap_images
    from tinyattn.train.hooks import Shown

    config = load_config(TINY)
    config.train.probe_text = "ROMEO:\nBut soft, what light"
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    shown = Shown(step=7, model=model, tokenizer=char_tokenizer, config=config,
                  position_losses=np.linspace(3.0, 2.0, 24), writer=tensorboard_writer, run_dir=None)
    for hook in (training_hooks.show_loss_by_position, training_hooks.show_attention,
                 training_hooks.show_head_ablation):
        hook(shown)
    assert {step for _, _, step in tensorboard_writer.scalars} == {7}
    images = {tag: (image, step) for tag, image, step, _ in tensorboard_writer.images}
    assert sorted(images) == ["attention/layer_0", "attention/layer_1", "head_ablation/grid",
                              "loss_by_position/plot"]
    assert {step for _, step in images.values()} == {7}
    for layer, image in enumerate(attention_heatmap_images(model, char_tokenizer, config.train.probe_text)):
        np.testing.assert_array_equal(images[f"attention/layer_{layer}"][0], image)
    rises, _ = head_ablation(model, char_tokenizer.encode(config.train.probe_text))
    np.testing.assert_array_equal(images["head_ablation/grid"][0], head_ablation_image(rises))


def test_the_training_sample_uses_every_sampling_option_of_the_config(tiny_model, char_tokenizer,
                                                                         tensorboard_writer, tmp_path):
    import torch

    from tinyattn.generate import training_hooks
    from tinyattn.generate.text import generate
    from tinyattn.train.hooks import Shown

    config = load_config(TINY)
    config.sample.prompt, config.sample.temperature, config.train.sample_tokens = "ROMEO:", 0.0, 40
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)

    def expected(penalty):
        return "".join(generate(model, char_tokenizer, "ROMEO:", max_new_tokens=40, temperature=0.0,
                                repetition_penalty=penalty, generator=torch.Generator()))

    for penalty in (1.0, 5.0):
        config.sample.repetition_penalty = penalty
        training_hooks.show_sample(Shown(step=penalty, model=model, tokenizer=char_tokenizer, config=config,
                                         position_losses=None, writer=tensorboard_writer, run_dir=tmp_path))
    assert expected(1.0) != expected(5.0)  # the penalty changes this model's greedy text
    shown = [text for _, text, _ in tensorboard_writer.texts]
    assert shown == [f"```\n{expected(p)}\n```" for p in (1.0, 5.0)]
    assert f"--- step 5.0 ---\n{expected(5.0)}\n" in (tmp_path / "samples.txt").read_text(encoding="utf-8")


def test_the_training_sample_draws_with_the_configs_temperature_top_k_top_p_and_the_runs_seed(
        tiny_model, char_tokenizer, tensorboard_writer):
    import torch

    from tinyattn.generate import training_hooks
    from tinyattn.generate.text import generate
    from tinyattn.train.hooks import Shown

    config = load_config(TINY)
    config.sample.prompt, config.train.sample_tokens = "ROMEO:", 30
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    base = dict(temperature=1.0, top_k=None, top_p=1.0, seed=1337)
    variants = [{}, dict(temperature=0.3), dict(top_k=2), dict(top_p=0.3), dict(seed=7)]
    expected = []
    for step, variant in enumerate(variants):
        options = {**base, **variant}
        seed = options.pop("seed")
        for name, value in options.items():
            setattr(config.sample, name, value)
        config.train.seed = seed
        training_hooks.show_sample(Shown(step=step, model=model, tokenizer=char_tokenizer, config=config,
                                         position_losses=None, writer=tensorboard_writer, run_dir=None))
        expected.append("".join(generate(model, char_tokenizer, "ROMEO:", max_new_tokens=30,
                                         generator=torch.Generator().manual_seed(seed), **options)))
    assert len(set(expected)) == len(variants)  # each option changes this model's sample
    assert [text for _, text, _ in tensorboard_writer.texts] == [f"```\n{text}\n```" for text in expected]


def test_a_run_whose_config_lists_no_hook_shows_only_the_validation_loss(corpus, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(tiny_config(corpus, tmp_path, "train.show=[]", "train.max_steps=4", "train.eval_interval=4"),
                   run_name="bare", progress=False)
    events = EventAccumulator(str(result.run_dir), size_guidance={"tensors": 0}).Reload()
    assert events.Tags()["images"] == []  # no attention maps, head ablation or loss-by-position plot
    assert set(events.Tags()["tensors"]) == {"config/text_summary"}  # no sample
    scalars = set(events.Tags()["scalars"])
    assert "val/loss" in scalars and not [tag for tag in scalars if tag.startswith("loss_by_position")]
    assert not (result.run_dir / "samples.txt").exists()


def test_the_probe_text_belongs_to_the_config_that_sets_it():
    from tinyattn.config import TrainConfig
    from tinyattn.errors import ConfigError

    assert TrainConfig().probe_text == "" and TrainConfig().show == []  # by default: none, and no hook
    assert "ROMEO" not in load_config(ROOT / "configs" / "tinystories.yaml").train.probe_text
    assert "ROMEO" not in load_config(ROOT / "configs" / "gpt2_small.yaml").train.probe_text
    with pytest.raises(ConfigError, match=r"^--set: train\.show: 'attenton' is not accepted; expected a list "
                                          r"of sample, .* \(did you mean 'attention'\?\)$"):
        load_config(TINY, ["train.show=[sample, attenton]"])
    with pytest.raises(ConfigError, match=r"^--set: train\.probe_text: '' is not accepted; expected a text "
                                          r"for train\.show's attention, head_ablation$"):
        load_config(TINY, ["train.show=[attention, head_ablation]", "train.probe_text="])


def test_the_cores_validation_loss_equals_the_analysis_loss_by_position(tiny_model):
    from tinyattn.analysis.evaluate import loss_by_position
    from tinyattn.train.owners import validation_loss_by_position

    model = tiny_model(seed=3)
    tokens = np.random.default_rng(2).integers(0, 65, size=1000).astype(np.uint16)
    core = validation_loss_by_position(model, tokens, 24, 4, 7)
    assert core.shape == (24,) and core.dtype == np.float64
    np.testing.assert_array_equal(core, loss_by_position(model, tokens, 24, 4, 7))


def test_a_model_in_training_gets_the_cores_validation_loss_without_dropout_and_stays_training(tiny_model):
    # The loop evaluates the model it trains, in training mode: dropout must be off for the
    # evaluation (else the loss is noisy and higher), and on again for the next step.
    from tinyattn.train.owners import validation_loss_by_position

    model = tiny_model(seed=3, dropout=0.3, attention_dropout=0.3)  # eval mode
    tokens = np.random.default_rng(2).integers(0, 65, size=1000).astype(np.uint16)
    in_eval_mode = validation_loss_by_position(model, tokens, 24, 4, 7)
    model.train()
    for _ in range(2):  # the same value every call: no dropout drew a mask
        np.testing.assert_array_equal(validation_loss_by_position(model, tokens, 24, 4, 7), in_eval_mode)
        assert model.training and all(module.training for module in model.modules())


@pytest.mark.slow  # measures a time budget
def test_an_explicit_max_steps_wins_over_the_time_budget(corpus, tmp_path, capsys, monkeypatch):
    from tinyattn.train.budget import Calibration
    budgeted = tmp_path / "budgeted.yaml"
    budgeted.write_text(f"extends: {TINY}\ntrain:\n  time_budget: 30s\n", encoding="utf-8")
    code, err = run_main(["--config", str(budgeted), "--run-name", "steps", "--no-progress", "--set",
                          *tiny_overrides(corpus, tmp_path, "train.max_steps=3", "train.eval_interval=3")], capsys)
    assert code == 0, err
    assert "train.max_steps=3 given with --set: the time budget 30s is off for this run" in err
    assert "measured" not in err and "done: 3 steps" in err
    saved = load_config(tmp_path / "steps" / "config.yaml").train
    assert saved.max_steps == 3 and saved.time_budget is None
    # A budget run resumed with a step count: the typed count wins over the recorded one too.
    # (In this process, not through main(): the command line counts the process's age against the budget.)
    # Its step is timed for 0.1 s, not 1.5 s: a 30 s budget then plans thousands of steps all the same.
    monkeypatch.setattr(Calibration, "_measure_for", lambda calibration, budget_seconds: 0.1)
    train(load_config(budgeted, tiny_overrides(corpus, tmp_path, "train.eval_interval=2")), run_name="resumed",
          stop_at_step=2, progress=False)
    assert load_config(tmp_path / "resumed" / "config.yaml").train.max_steps > 4
    code, err = run_main(["--resume", str(tmp_path / "resumed"), "--no-progress", "--set",
                          f"train.out_dir={tmp_path}", "train.max_steps=4"], capsys)
    assert code == 0, err
    assert "the time budget 30s is off for this run" in err and "done: 2 steps (steps 3-4)" in err


def test_a_time_budget_given_to_a_resumed_step_count_run_is_refused_and_a_config_files_is_off(
        corpus, tmp_path, capsys):
    # A step count cannot become a time plan on resume (the plan is measured at a run's start): the
    # budget given for it is refused, and a --config file's is off, as config.yaml then records.
    train(tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2"), run_name="the steps",
          stop_at_step=2, progress=False)
    capsys.readouterr()
    run = tmp_path / "the steps"  # a space: the advice's path is quoted for the shell
    written = (run / "config.yaml").read_bytes()
    code, err = run_main(["--resume", str(run), "--no-progress", "--set", "train.time_budget=5m"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: train.time_budget 5m (--set): the run {run} trains a step count "
                          "(train.max_steps 4), which a resume continues")
    assert "--set train.max_steps=N" in err and (run / "config.yaml").read_bytes() == written
    assert shlex.split(err.rsplit(" with ", 1)[1]) == ["--set", f"train.init_from={run / 'step_0000002.pt'}"]
    assert ckpt.latest_checkpoint(run).name == "step_0000002.pt"
    budgeted = tmp_path / "budgeted.yaml"
    # The file's max_steps is its budget's first estimate, not the run's count: the run's 4 stays.
    budgeted.write_text(f"extends: {TINY}\ntrain:\n  time_budget: 30s\n  max_steps: 9\n  eval_interval: 2\n",
                        encoding="utf-8")
    note = (f"the run {run} trains a step count (train.max_steps 4), which a resume continues; --set "
            "train.max_steps=N changes it")
    code, err = run_main(["--resume", str(run), "--config", str(budgeted), "--no-progress", "--stop-at-step", "3",
                          "--set", *tiny_overrides(corpus, tmp_path), "train.time_budget=null"], capsys)
    assert code == 0, err  # the budget turned off by --set: the file's max_steps is still its estimate
    assert f"note: {note}" in err and "4 steps\n" in err and "stopped by --stop-at-step at step 3" in err
    code, err = run_main(["--resume", str(run), "--config", str(budgeted), "--no-progress", "--set",
                          *tiny_overrides(corpus, tmp_path)], capsys)
    assert code == 0, err
    assert f"note: train.time_budget 30s (the config's) is off; {note}" in err
    assert "done: 1 step (step 4)" in err
    saved = load_config(run / "config.yaml").train
    assert saved.time_budget is None and saved.max_steps == 4


def test_a_seed_or_a_table_by_passes_given_to_a_resume_is_said_and_the_run_keeps_its_own(corpus, tmp_path, capsys):
    # A resume continues the checkpoint's random generators and the choices its start made: a train.seed
    # given for it was recorded in config.yaml but used nowhere, a --set table read by nothing, unsaid.
    config = tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2",
                         "train.decay_by_passes={0: 0.3}")
    seed = config.train.seed
    train(config, run_name="r", stop_at_step=2, progress=False)
    run = tmp_path / "r"
    capsys.readouterr()
    code, err = run_main(["--resume", str(run), "--no-progress", "--stop-at-step", "3", "--set",
                          f"train.seed={seed + 6}", "train.decay_by_passes={0: 0.5}"], capsys)
    assert code == 0, err
    assert (f"note: train.seed {seed + 6} (--set) does not apply: a resume continues the run's random "
            f"generators (seed {seed}), which it keeps") in err
    assert ("note: train.decay_by_passes (--set) is read at a run's start: this one keeps its "
            "train.weight_decay; --set train.weight_decay=X changes it") in err
    saved = load_config(run / "config.yaml").train
    assert (saved.seed, saved.weight_decay, saved.decay_by_passes) == (seed, 0.3, {0: 0.5})
    # Edited in config.yaml: the edit's own line says the run keeps its seed, and no note contradicts it
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace(f"seed: {seed}", f"seed: {seed + 6}"))
    code, err = run_main(["--resume", str(run), "--no-progress"], capsys)
    assert code == 0, err
    assert (f"train.seed {seed} -> {seed + 6} (a run draws from it at its start: this one continues its "
            "random generators and keeps its seed)") in err and "does not apply" not in err
    assert load_config(run / "config.yaml").train.seed == seed


def test_a_step_run_resumed_with_a_config_of_another_step_count_says_its_schedule_changes(
        corpus, tmp_path, capsys):
    # A --config file's train.max_steps is the run's from here on (the way to train further): a
    # schedule shortened or lengthened that way was shown only by the count on the first line.
    train(tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=2"), run_name="r",
          stop_at_step=2, progress=False)
    shorter = tmp_path / "shorter.yaml"
    shorter.write_text(f"extends: {TINY}\ntrain:\n  max_steps: 4\n  eval_interval: 2\n", encoding="utf-8")
    code, err = run_main(["--resume", str(tmp_path / "r"), "--config", str(shorter), "--no-progress", "--set",
                          *tiny_overrides(corpus, tmp_path)], capsys)
    assert code == 0, err
    assert "note: train.max_steps 6 -> 4 (the config's): the run's schedule spans that from here on" in err
    assert "done: 2 steps (steps 3-4)" in err


def test_a_signal_during_an_evaluation_stops_at_its_step_without_another(corpus, tmp_path, monkeypatch):
    # One process read its stop before the evaluation (which takes seconds): a Ctrl-C during it
    # trained one more step and wrote one more checkpoint than the evaluation's.
    from tinyattn.train.owners import Evaluator

    real_run = Evaluator.run

    def interrupted_at_step_2(evaluator, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would, while the evaluation runs
        return real_run(evaluator, step)

    monkeypatch.setattr(Evaluator, "run", interrupted_at_step_2)
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=2"), run_name="r",
                   progress=False)
    assert result.interrupted and result.step == 2
    assert sorted(p.name for p in (tmp_path / "r").glob("step_*.pt")) == ["step_0000002.pt"]


def test_a_stop_between_log_intervals_reads_the_losses_first_and_saves_no_checkpoint_after_a_nan(
        corpus, tmp_path, monkeypatch):
    # The window is read only every train.log_interval steps; a stop's checkpoint must follow a read
    # of the losses too, else a NaN step's weights are saved as the checkpoint to resume from.
    original = Trainer.train_step

    def poisoned_then_stopped(self):
        loss, norm = original(self)
        if self.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            loss = loss * float("nan")
        return loss, norm

    monkeypatch.setattr(Trainer, "train_step", poisoned_then_stopped)
    config = tiny_config(corpus, tmp_path, "train.max_steps=20", "train.eval_interval=100",
                         "train.log_interval=20")
    with pytest.raises(TrainingError, match=r"the loss became nan at step 3"):
        train(config, run_name="r", progress=False)
    assert ckpt.step_checkpoints(tmp_path / "r") == []


def test_a_signal_during_an_evaluation_writes_that_steps_checkpoint_once(corpus, tmp_path, monkeypatch):
    from tinyattn.train.owners import Evaluator

    real_run, real_save, saved = Evaluator.run, ckpt.save_checkpoint, []

    def interrupted_at_step_2(evaluator, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_run(evaluator, step)

    def counted(state, path):
        saved.append(path.name)
        return real_save(state, path)

    monkeypatch.setattr(Evaluator, "run", interrupted_at_step_2)
    monkeypatch.setattr(ckpt, "save_checkpoint", counted)
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=2"), run_name="r",
                   progress=False)
    assert result.interrupted and result.step == 2
    assert saved == [ckpt.BEST, "step_0000002.pt"]


def test_the_throughput_leaves_the_evaluations_time_out(corpus, tmp_path, monkeypatch):
    # The loss window's clock restarts after an evaluation: its seconds are not a training step's.
    from tinyattn.train import owners

    offset = [0.0]

    class Clock:
        @staticmethod
        def perf_counter():
            return time.perf_counter() + offset[0]

    real_run = owners.Evaluator.run

    def slow_evaluation(evaluator, step):
        offset[0] += 1000.0  # an evaluation of 1000 s, as the loss window's clock sees it
        return real_run(evaluator, step)

    monkeypatch.setattr(owners, "time", Clock)
    monkeypatch.setattr(owners.Evaluator, "run", slow_evaluation)
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2",
                               "train.log_interval=1"), run_name="r", progress=False)
    assert result.tokens_per_second * 100 > result.tokens_seen  # the 1000 s would make it far less


def test_only_an_evaluation_lower_than_every_earlier_one_is_said_to_be_the_best(corpus, tmp_path, monkeypatch,
                                                                               capsys):
    import numpy as np

    from tinyattn.train.owners import EvalResult, Evaluator

    losses = {2: 2.0, 4: 3.0, 6: 1.0}
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(4, losses[step])))
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=6", "train.eval_interval=2"), run_name="r",
                   progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if ": validation loss" in line]
    assert said == ["step 2: validation loss 2.0000 (best)", "step 4: validation loss 3.0000",
                        "step 6: validation loss 1.0000 (best)"]
    assert result.best_val_loss == 1.0 and ckpt.saved_value(tmp_path / "r" / ckpt.BEST, "step") == 6


def test_an_evaluation_that_only_ties_the_best_loss_is_not_said_to_be_the_best(corpus, tmp_path, monkeypatch,
                                                                               capsys):
    import numpy as np

    from tinyattn.train.owners import EvalResult, Evaluator

    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(4, 2.0)))
    train(tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=2"), run_name="r",
          progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if ": validation loss" in line]
    assert said == ["step 2: validation loss 2.0000 (best)", "step 4: validation loss 2.0000"]
    assert ckpt.saved_value(tmp_path / "r" / ckpt.BEST, "step") == 2


def test_a_run_without_run_name_is_named_after_its_config_file_and_the_time(corpus, tmp_path, capsys):
    import re

    code, err = run_main(["--config", str(TINY), "--no-progress", "--stop-at-step", "1", "--set",
                          *tiny_overrides(corpus, tmp_path)], capsys)
    assert code == 0, err
    [run] = [folder.name for folder in tmp_path.iterdir() if (folder / "config.yaml").exists()]
    assert re.fullmatch(r"tiny-\d{8}-\d{6}", run), run  # configs/tiny.yaml's stem, not "run"


def test_a_device_given_with_dash_dash_device_is_recorded_and_its_resume_runs_there(corpus, tmp_path, capsys):
    # --device overrides train.device: config.yaml and the checkpoints record it, so a plain
    # --resume (the command the run prints) runs where the run ran, not on train.device's "auto".
    from tinyattn.train.resume import ResumePoint

    code, err = run_main(["--config", str(TINY), "--run-name", "dev", "--no-progress", "--device", "cpu",
                          "--stop-at-step", "1", "--set", *tiny_overrides(corpus, tmp_path)], capsys)
    assert code == 0, err
    run = tmp_path / "dev"
    assert load_config(run / "config.yaml").train.device == "cpu"
    assert ResumePoint.find(run, None, tmp_path).edited_config().train.device == "cpu"


@pytest.mark.parametrize("probe_text, shown", [
    ("ROMEO: ", ["sample", "loss_by_position", "attention", "head_ablation"]),
    ("", ["sample", "loss_by_position"]),
])
def test_a_checkpoint_saved_before_train_show_goes_on_showing_what_it_showed(tmp_path, probe_text, shown):
    from tinyattn.config import config_to_dict

    saved = config_to_dict(load_config("configs/tiny.yaml"))
    saved["train"]["probe_text"] = probe_text
    del saved["train"]["show"]  # as written by tinyattn before train.show
    config = ckpt.config_from_checkpoint({"config": saved}, tmp_path / "old.pt")
    assert config.train.show == shown
    saved["train"]["show"] = []  # a run that chose to show nothing keeps its choice
    assert ckpt.config_from_checkpoint({"config": saved}, tmp_path / "new.pt").train.show == []


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_resume_steps_at_the_peak_rate_and_weight_decay_of_its_own_config_not_the_checkpoints(optimizer):
    """A fork with --set train.lr=..., train.weight_decay=..., train.beta1/beta2=... or
    train.muon_momentum/muon_ns_steps=... must train with them: loading the optimizer state keeps
    the moments and step counts, not the saved run's hyperparameters."""
    saved = tiny_trainer(None, optimizer=optimizer, lr=2e-3, muon_lr=2e-3, weight_decay=0.1,
                         warmup_steps=0, max_steps=10, schedule="constant", beta1=0.9, beta2=0.95,
                         muon_momentum=0.95, muon_ns_steps=5)
    saved.train_step()
    resumed = tiny_trainer(None, optimizer=optimizer, lr=5e-3, muon_lr=5e-3, weight_decay=0.3,
                           warmup_steps=0, max_steps=10, schedule="constant", beta1=0.8, beta2=0.99,
                           muon_momentum=0.85, muon_ns_steps=3)
    resumed.load_state_dict(saved.state_dict(), Path("saved.pt"))
    used, hyper = [], []
    for opt in resumed.optimizers.optimizers:
        opt.register_step_pre_hook(lambda o, args, kwargs: used.extend(
            (g["name"], g["base_lr"], g["weight_decay"]) for g in o.param_groups))
        opt.register_step_pre_hook(lambda o, args, kwargs: hyper.extend(
            g.get("betas") or (g["momentum"], g["ns_steps"]) for g in o.param_groups))
    resumed.train_step()
    assert used and all(base_lr == pytest.approx(5e-3) for _, base_lr, _ in used)
    assert [(name, decay) for name, _, decay in used] == [(name, 0.3 if name in DECAYED else 0.0) for name, _, _ in used]
    assert "matrices" in {name for name, _, _ in used}  # a decayed group was checked (the tiny model ties its head)
    assert set(hyper) == ({(0.8, 0.99)} if optimizer == "adamw" else {(0.8, 0.99), (0.85, 3)})
    state = resumed.optimizers.optimizers[0].state_dict()["state"]
    assert all(int(s["step"]) == 2 for s in state.values())  # the moments came from the checkpoint


def test_by_precision_sizes_a_new_run_for_its_precision_and_the_saved_config_holds_the_result(corpus, tmp_path):
    """A config's by_precision entry for the precision the run resolves to is applied before the
    model is built (a --set key wins over it); config.yaml holds the result with by_precision
    empty, so a resume builds the same model whatever precision its machine would pick."""
    config = tiny_config(corpus, tmp_path, "train.max_steps=2", "train.eval_interval=2", "train.precision=fp32",
                         "by_precision.fp32.model.n_layer=1", "by_precision.fp32.model.n_embd=48",
                         "by_precision.bf16.model.n_layer=3", "model.n_embd=32")
    result = train(config, run_name="sized", progress=False, overrides=["model.n_embd=32"])
    saved = load_config(result.run_dir / "config.yaml")
    assert (saved.model.n_layer, saved.model.n_embd, saved.by_precision) == (1, 32, {})
    weights = torch.load(result.run_dir / "best.pt", map_location="cpu", weights_only=False)["model"]
    assert not any(name.startswith("blocks.1.") for name in weights)  # one block was built
    log = (result.run_dir / "train.log").read_text()
    assert "precision fp32: model.n_layer=1 (the config's by_precision)" in log


def test_a_resume_with_the_config_file_applies_its_by_precision_as_the_start_did(corpus, tmp_path):
    """--config FILE --resume RUN: the file's by_precision entry is applied again, so the model
    matches the weights and the rates are the ones the run started with."""
    items = ("train.max_steps=4", "train.eval_interval=2", "train.precision=fp32",
             "by_precision.fp32.model.n_layer=1", "by_precision.fp32.train.lr=1e-3")
    first = train(tiny_config(corpus, tmp_path, *items), run_name="sized", progress=False, stop_at_step=2)
    resumed = train(tiny_config(corpus, tmp_path, *items), resume=first.run_dir, progress=False)
    assert resumed.step == 4
    assert "done: 2 steps (steps 3-4) in" in (resumed.run_dir / "train.log").read_text()  # this session's
    saved = load_config(resumed.run_dir / "config.yaml")
    assert (saved.model.n_layer, saved.train.lr, saved.by_precision) == (1, pytest.approx(1e-3), {})


def test_a_resume_with_another_lr_keeps_the_floor_its_table_chose_as_a_share_of_the_new_peak(corpus, tmp_path):
    """train.floor_by_passes chooses the floor as a share of train.lr: a resume with --config and
    --set train.lr=... keeps the share, so the floor never rises above the new peak (the rate
    would climb past it, and the run's config.yaml would no longer load)."""
    table = ("train.floor_by_passes={0: 0.5}",)
    first = train(tiny_config(corpus, tmp_path, *table), run_name="floor", progress=False, stop_at_step=10)
    assert load_config(first.run_dir / "config.yaml").train.min_lr == pytest.approx(1e-3)  # 0.5 x 2e-3
    resumed = train(tiny_config(corpus, tmp_path, *table, "train.lr=5e-4"), resume=first.run_dir,
                    progress=False, overrides=["train.lr=5e-4"])
    saved = load_config(resumed.run_dir / "config.yaml").train
    assert (saved.lr, saved.min_lr) == (pytest.approx(5e-4), pytest.approx(2.5e-4))
    assert max(learning_rate(step, saved) for step in range(10, 20)) <= 5e-4


# Fine-tuning a tinyattn run with the config it trained with (`--set train.init_from=RUN`, as the
# resume's advice says): every shipped config extends shakespeare_char.yaml, which writes
# tokenizer.kind char, and a key a parent writes cannot be unset. A written tokenizer or model key
# is compared with what the source run trained with (its char tokenizer, its model section), not
# with the pretrained form the fine-tune reads its tokenizer.json through.


def own_config_file(corpus, tmp_path) -> Path:
    """A config that extends tiny.yaml (and so shakespeare_char.yaml) with a local corpus."""
    path = tmp_path / "base.yaml"
    path.write_text(f"extends: {TINY}\ndata:\n  files: {corpus}\n  cache_dir: {tmp_path / 'cache'}\n"
                    f"train:\n  out_dir: {tmp_path}\n  max_steps: 2\n  eval_interval: 2\n"
                    "  sample_tokens: 0\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def source_run_trained(corpus, tmp_path_factory) -> TrainedOnce:
    def build(out):
        from tinyattn.cli.train import main

        base = own_config_file(corpus, out)
        assert main(["--config", str(base), "--run-name", "src", "--no-progress"]) == 0

    return TrainedOnce(tmp_path_factory, "source_run", build)


@pytest.fixture
def source_run(source_run_trained) -> Path:
    """A folder holding own_config_file's base.yaml, the run `src` trained with it from the command
    line, and their data cache; the test may write there."""
    return source_run_trained.fresh()


def test_init_from_a_run_with_the_config_it_trained_with_trains(source_run, capsys):
    out = source_run  # base.yaml, the run src it trained, their cache
    base = out / "base.yaml"
    code, err = run_main(["--config", str(base), "--run-name", "ft", "--no-progress",
                          "--set", f"train.init_from={out / 'src'}"], capsys)
    assert code == 0, err
    source, tuned = (load_config(out / name / "config.yaml") for name in ("src", "ft"))
    assert source.tokenizer.kind == "char" and tuned.tokenizer.kind == "pretrained"
    assert tuned.model == source.model  # the model keys base.yaml writes are the run's own


def test_a_finetune_with_the_bpe_config_its_source_trained_with_has_no_vocabulary_size_note(corpus, tmp_path,
                                                                                           capsys):
    # The source's tokenizer.kind bpe and vocab_size, written again, agree with it (adopt_model); the
    # note said "tokenizer.kind is pretrained" (the section the fine-tune reads its tokenizer.json
    # through) against the bpe the config writes, and that the size sizes a bpe tokenizer.
    from tinyattn.data.tokenizer import unused_tokenizer_options

    def bpe(name, *extra):
        return ["--config", str(own_config_file(corpus, tmp_path)), "--no-progress", "--run-name", name,
                "--set", "tokenizer.kind=bpe", "tokenizer.vocab_size=300", *extra]

    code, err = run_main(bpe("src"), capsys)
    assert code == 0 and "has no effect" not in err, err
    code, err = run_main(bpe("ft", f"train.init_from={tmp_path / 'src'}"), capsys)
    assert code == 0 and "has no effect" not in err, err
    pretrained = load_config(tmp_path / "ft" / "config.yaml").tokenizer
    assert unused_tokenizer_options(pretrained, ["tokenizer.vocab_size"]) == [
        "note: tokenizer.vocab_size has no effect: tokenizer.kind is pretrained, whose vocabulary is its "
        "tokenizer.json's (tokenizer.vocab_size sizes a bpe tokenizer)"]


def test_a_finetune_of_a_char_run_on_text_of_other_characters_warns_of_the_unk_it_trains_on(corpus, tmp_path,
                                                                                           capsys):
    # The source's character tokenizer reads what its corpus lacked as [UNK]: 'é', 'ü' here (a fifth of
    # the tokens). The cache's build said nothing, and the fine-tune trained on [UNK] in their place.
    base = own_config_file(corpus, tmp_path)
    code, err = run_main(["--config", str(base), "--run-name", "src", "--no-progress"], capsys)
    assert code == 0 and "[UNK]" not in err, err  # a char run's own training split: every character seen
    other = tmp_path / "other.txt"
    text = corpus.read_text(encoding="utf-8")
    other.write_text(text.replace("e", "é").replace("u", "ü"), encoding="utf-8")
    code, err = run_main(["--config", str(base), "--run-name", "ft", "--no-progress",
                          "--set", f"train.init_from={tmp_path / 'src'}", f"data.files={other}"], capsys)
    assert code == 0, err
    warning = next((line for line in err.splitlines() if "[UNK]" in line), err)
    assert warning.startswith("warning: ") and "of the training split's tokens are [UNK]" in warning, err
    assert "'é', 'ü'" in warning and str(tmp_path / "src" / "tokenizer.json") in warning, err


def test_a_finetune_of_a_finetune_with_the_config_it_started_with_trains(source_run, capsys):
    # The fine-tune's own section is the pretrained form; the chain is compared with the section its
    # first source trained with, which each fine-tune's checkpoints record and pass on (refused before:
    # "tokenizer.kind: config 'char', source 'pretrained'").
    out = source_run  # base.yaml, the run src it trained, their cache
    base = out / "base.yaml"
    for name, source in (("ft", "src"), ("ft_of_ft", "ft")):
        code, err = run_main(["--config", str(base), "--run-name", name, "--no-progress",
                              "--set", f"train.init_from={out / source}"], capsys)
        assert code == 0, err
    latest = ckpt.latest_checkpoint(out / "ft_of_ft")
    assert ckpt.saved_value(latest, ckpt.SOURCE_TOKENIZER)["kind"] == "char"
    assert load_config(out / "ft_of_ft" / "config.yaml").tokenizer.kind == "pretrained"
    # the fine-tune's own config.yaml (its pretrained section, another path) is the source's as well
    code, err = run_main(["--config", str(out / "ft" / "config.yaml"), "--run-name", "ft_own",
                          "--no-progress", "--set", f"train.init_from={out / 'ft'}"], capsys)
    assert code == 0, err
    code, err = run_main(["--config", str(base), "--run-name", "ft3", "--no-progress",
                          "--set", f"train.init_from={out / 'ft_of_ft'}", "tokenizer.kind=bpe"], capsys)
    assert code == 2 and "tokenizer.kind: config 'bpe', source 'char'" in err, err


def test_an_empty_init_from_is_no_fine_tune_and_reads_nothing(tmp_path, monkeypatch):
    """--set train.init_from= (an empty value) leaves the run a new one, as null does: no source is
    looked for (an empty path would name the working folder)."""
    from tinyattn.train.finetune import init_source

    monkeypatch.chdir(tmp_path)
    config = load_config(TINY, ["train.init_from="])
    model = dataclasses.asdict(config.model)
    assert config.train.init_from == "" and init_source(config) is None
    assert dataclasses.asdict(config.model) == model


@pytest.mark.parametrize("item,expected", [
    ("tokenizer.kind=bpe", "tokenizer.kind: config 'bpe', source 'char'"),
    ("model.n_layer=4", "model.n_layer: config 4, source 2"),  # ModelConfig's default: given all the same
    ("model.n_embd=48", "model.n_embd: config 48, source 32"),
], ids=["tokenizer.kind", "n_layer", "n_embd"])
def test_init_from_a_run_refuses_a_key_that_differs_from_the_runs(source_run, capsys, item, expected):
    out = source_run  # base.yaml, the run src it trained, their cache
    base = out / "base.yaml"
    code, err = run_main(["--config", str(base), "--run-name", "ft", "--no-progress",
                          "--set", f"train.init_from={out / 'src'}", item], capsys)
    assert code == 2 and expected in err, err
    assert err.startswith(f"error: train.init_from {out / 'src'}: the config conflicts with the model")
    assert err.count("\n") == 1 and err.count(": config ") == 1 and not (out / "ft").exists()


def test_a_finetune_of_a_run_resumes_with_the_config_it_started_with(source_run, capsys):
    # --config FILE --resume: the file's tokenizer.kind char is compared with what the source trained
    # with, which the fine-tune's checkpoints record (the source itself is not read again).
    out = source_run  # base.yaml, the run src it trained, their cache
    base = out / "base.yaml"
    finetune = ["--config", str(base), "--no-progress", "--set", f"train.init_from={out / 'src'}"]
    code, err = run_main([*finetune, "--run-name", "ft", "--stop-at-step", "1"], capsys)
    assert code == 0, err
    code, err = run_main([*finetune, "--resume", str(out / "ft"), "--set", "train.max_steps=3"], capsys)
    assert code == 0, err
    latest = ckpt.latest_checkpoint(out / "ft")
    assert latest.name == "step_0000003.pt"  # its session carries the record on, for the next resume
    assert ckpt.saved_value(latest, ckpt.SOURCE_TOKENIZER)["kind"] == "char"
    code, err = run_main([*finetune, "--resume", str(out / "ft"), "--set", "train.max_steps=4",
                          "tokenizer.kind=bpe"], capsys)
    assert code == 2 and "tokenizer.kind: config 'bpe', source 'char'" in err and err.count("\n") == 1, err


def test_a_source_is_the_same_spelled_otherwise_when_gone_and_resolved_only_while_it_exists(tmp_path,
                                                                                             monkeypatch):
    # A resumed fine-tune's source may be gone (it reads it no more): its spelling is compared then.
    from tinyattn.train.resume import same_source

    monkeypatch.chdir(tmp_path)
    assert same_source(None, None) and not same_source(None, "gone") and not same_source("gone", None)
    for spelled in ("gone/", "./gone", "other/../gone"):
        assert same_source("gone", spelled)
    assert not same_source("gone", "gone2")
    # A gone path is not resolved (a relative one may have been read from another folder)...
    assert not same_source("gone", str(tmp_path / "gone"))
    # ...an existing one is, links included
    (tmp_path / "src").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "src", target_is_directory=True)
    assert same_source("src", str(tmp_path / "src")) and same_source(str(tmp_path / "link"), "src")


def test_init_from_keeps_the_model_keys_of_the_config_that_train_or_run_the_weights(tmp_path):
    # The source gives every key that shapes the weights; the config keeps how they are trained and run.
    from tinyattn.config import ModelConfig, TokenizerConfig
    from tinyattn.train.finetune import adopt_model

    source = ModelConfig(vocab_size=67, n_layer=2, n_head=2, n_embd=32, context_length=64)
    ours = dict(context_length=32, dropout=0.25, attention_dropout=0.125, attention="explicit",
                zero_init_projections=True)
    assert all(getattr(source, key) != value for key, value in ours.items())
    config = load_config(TINY, [f"model.{key}={value}" for key, value in ours.items()])
    tokenizer = TokenizerConfig(kind="pretrained", path=str(tmp_path / "tokenizer.json"))
    adopt_model(config, source, tokenizer, "test", written={f"model.{key}" for key in ours})
    assert config.model == dataclasses.replace(source, **ours) and config.tokenizer == tokenizer


def test_init_from_a_bidirectional_model_is_refused_unless_the_config_writes_causal_false(tmp_path):
    # Its fine-tune would be bidirectional too, which every inference command refuses (require_causal).
    from tinyattn.config import ModelConfig, TokenizerConfig
    from tinyattn.errors import ConfigError
    from tinyattn.train.finetune import InitSource

    source = InitSource("src", tmp_path / "src" / "best.pt",
                        ModelConfig(vocab_size=67, n_layer=2, n_head=2, n_embd=32, causal=False),
                        TokenizerConfig(kind="char"), tmp_path / "tokenizer.json", {})
    message = (f"train.init_from src: model.causal is false in {source.file} (a bidirectional model, trained by "
               "tinyattn lab causal to show the mask's effect): a fine-tune of it is bidirectional too, which "
               "generate, eval, attention and export refuse (they need a causal model); start from a causal "
               "model, or write model.causal: false in the config to train one all the same")
    for written in ((), None):  # the file's and --set's keys; None: the keys held at other than the default
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            source.adopt(load_config(TINY), written)
    config = load_config(TINY, ["model.causal=false"])  # the user asks for a bidirectional fine-tune
    source.adopt(config, {"model.causal"})
    assert config.model.causal is False and config.model.n_embd == 32


def test_a_resume_naming_its_source_otherwise_spelled_continues_and_keeps_the_runs_spelling(
        source_run, capsys, monkeypatch):
    # train.init_from compared as text: a trailing slash, a relative path or an edit of config.yaml to
    # either was refused as another source ("a resume continues the run's own weights")
    out = source_run  # base.yaml, the run src it trained, their cache
    monkeypatch.chdir(out)
    base = out / "base.yaml"
    finetune = ["--config", str(base), "--no-progress", "--set"]
    code, err = run_main([*finetune, f"train.init_from={out / 'src'}", "--run-name", "ft",
                          "--stop-at-step", "1"], capsys)
    assert code == 0, err
    for steps, spelling in ((2, f"{out / 'src'}/"), (3, "src"), (4, "./src/../src")):
        code, err = run_main([*finetune, f"train.init_from={spelling}", f"train.max_steps={steps}",
                              "--resume", str(out / "ft")], capsys)
        assert code == 0, err
    saved = out / "ft" / "config.yaml"
    assert load_config(saved).train.init_from == str(out / "src")
    saved.write_text(saved.read_text().replace(f"init_from: {out / 'src'}", "init_from: src/"))
    code, err = run_main(["--resume", str(out / "ft"), "--no-progress", "--set", "train.max_steps=5"],
                         capsys)
    assert code == 0, err
    assert ckpt.latest_checkpoint(out / "ft").name == "step_0000005.pt"
    assert load_config(saved).train.init_from == str(out / "src")
    code, err = run_main([*finetune, "train.init_from=ft", "train.max_steps=6",
                          "--resume", str(out / "ft")], capsys)
    assert code == 2 and f"train.init_from: checkpoint '{out / 'src'}', config 'ft' (--set)" in err, err


def _source_and_its_finetune(out: Path, capsys) -> list[str]:
    """Fine-tunes `src` (source_run's, under `out`) one step into `ft` with the config it trained with,
    and returns the fine-tune's command line (without --run-name)."""
    base = out / "base.yaml"
    finetune = ["--config", str(base), "--no-progress", "--set", f"train.init_from={out / 'src'}"]
    assert run_main([*finetune, "--run-name", "ft", "--stop-at-step", "1"], capsys)[0] == 0
    return finetune


def test_a_finetune_resumed_with_its_config_after_its_source_tokenizer_changed_resumes_as_advised(
        source_run, capsys):
    # The advice `--set tokenizer.path=<run>/tokenizer.json` was refused with a --config that writes
    # tokenizer.kind char ("tokenizer.path ... is read only with tokenizer.kind=pretrained"): it gives
    # the kind too where the config's is not pretrained, and the command it gives resumes.
    import json

    out = source_run  # base.yaml, the run src it trained, their cache
    finetune = _source_and_its_finetune(out, capsys)
    source = out / "src" / "tokenizer.json"
    spec = json.loads(source.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    source.write_text(json.dumps(spec), encoding="utf-8")
    own = out / "ft" / "tokenizer.json"
    code, err = run_main(["--resume", str(out / "ft"), "--no-progress"], capsys)
    # without --config: the run's own section, pretrained already
    assert code == 2 and err.rstrip().endswith(f"own copy: --set tokenizer.path={own}"), err
    code, err = run_main([*finetune, "--resume", str(out / "ft")], capsys)
    assert code == 2 and f"tokenizer.path {source} changed since the run started" in err, err
    advice = shlex.split(err.rsplit("Resume with the run's own copy: ", 1)[1])
    assert advice == ["--set", "tokenizer.kind=pretrained", f"tokenizer.path={own}"]
    code, err = run_main([*finetune, "--resume", str(out / "ft"), *advice], capsys)
    assert code == 0, err
    assert ckpt.latest_checkpoint(out / "ft").name == "step_0000002.pt"


def test_a_finetune_saved_before_checkpoints_recorded_its_sources_tokenizer_resumes_with_its_config(
        source_run, capsys):
    # such a checkpoint (no SOURCE_TOKENIZER) resumed with --config at fed0684: its written char kind
    # may not be compared with the pretrained form it cannot tell from the source's
    import torch

    out = source_run  # base.yaml, the run src it trained, their cache
    finetune = _source_and_its_finetune(out, capsys)
    old = ckpt.latest_checkpoint(out / "ft")
    state = torch.load(old, weights_only=True)
    del state[ckpt.SOURCE_TOKENIZER]
    torch.save(state, old)
    code, err = run_main([*finetune, "--resume", str(out / "ft"), "--set", "train.max_steps=3"], capsys)
    assert code == 0, err


def test_a_log_interval_far_past_the_run_holds_only_the_steps_taken():
    """train.log_interval=1e11 (no log lines: the evaluations say enough) allocated 1e11 losses
    up front: a traceback after the run folder was made."""
    from tinyattn.train.owners import LossWindow

    window = LossWindow(10**11, torch.device("cpu"))
    for loss in (1.0, 2.0, 3.0):
        window.add(torch.tensor(loss), torch.tensor(0.5))
    assert (window.pending, window.full) == (3, False)
    losses, _ = window.read(3, Path("."))
    assert losses == [1.0, 2.0, 3.0] and window.pending == 0
    small = LossWindow(2, torch.device("cpu"))
    small.add(torch.tensor(1.0), torch.tensor(0.5))
    small.add(torch.tensor(2.0), torch.tensor(0.5))
    assert small.full and small.read(2, Path("."))[0] == [1.0, 2.0]


def test_under_data_parallel_the_logged_loss_is_the_ranks_mean_and_a_nan_is_said_once(monkeypatch):
    """Each rank's loss is its own windows'; the step's gradient is the mean over every rank's. The log
    showed rank 0's loss alone; a NaN on another rank alone ended that rank, the others with 'another
    rank left the run'. Here the other rank's losses arrive through the (faked) all-reduce."""
    from tinyattn.system.distributed import Distributed
    from tinyattn.train.owners import LossWindow

    other_rank, reduced = [torch.tensor([3.0, 6.0])], []

    def all_reduce(tensor, op):
        assert op == torch.distributed.ReduceOp.SUM
        tensor += other_rank[0]
        reduced.append(tensor)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    dist = Distributed(rank=0, world_size=2)
    window = LossWindow(2, torch.device("cpu"), dist)
    for loss in (1.0, 2.0):
        window.add(torch.tensor(loss), torch.tensor(0.5))
    assert window.read(2, Path("."))[0] == [2.0, 4.0]
    # kept for shutdown_distributed to wait on: a tensor gloo's thread freed last aborted the exit (SIGABRT)
    assert any(kept is reduced[0] for kept in dist.handed.values())
    other_rank[0] = torch.tensor([1.0, float("nan")])
    for loss in (1.0, 2.0):
        window.add(torch.tensor(loss), torch.tensor(0.5))
    with pytest.raises(TrainingError, match="the loss became nan at step 4") as raised:
        window.read(4, Path("."))
    assert raised.value.shared  # every rank read the same mean: rank 0 says it, once
    alone = LossWindow(1, torch.device("cpu"))  # one process: no collective
    alone.add(torch.tensor(float("nan")), torch.tensor(0.5))
    with pytest.raises(TrainingError) as raised:
        alone.read(1, Path("."))
    assert not getattr(raised.value, "shared", False)


def test_the_timers_add_up_every_period_of_an_activity():
    """The run's last line splits its time by activity: each is the sum of its periods, not the last."""
    from tinyattn.train.owners import Timers

    ticks = iter([0.0, 1.0, 5.0, 7.0, 7.5, 8.0])
    timers = Timers(clock=lambda: next(ticks))
    for name in ("train", "eval", "train"):
        with timers(name):
            pass
    assert timers.seconds == {"train": 1.5, "eval": 2.0}


def test_a_run_keeps_its_last_keep_last_step_checkpoints_and_no_more(corpus, tmp_path):
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=8", "train.eval_interval=2",
                               "train.keep_last=2", "train.sample_tokens=0"), run_name="kept", progress=False)
    assert [ckpt.step_of(p) for p in ckpt.step_checkpoints(result.run_dir)] == [6, 8]


def test_a_header_like_line_in_an_earlier_sample_is_text_to_the_resumes_cut(tmp_path):
    from tinyattn.train.log import cut_samples_after

    path = tmp_path / "samples.txt"
    kept = "--- step 3 ---\nROMEO:\n--- step 12 ---\nmore text\n--- step 6 ---\nsample six\n"
    path.write_text(kept + "--- step 9 ---\nnine\n--- step 12 ---\ntwelve\n", encoding="utf-8")
    cut_samples_after(path, 6)
    assert path.read_text(encoding="utf-8") == kept  # step 3's text and step 6's sample, whole
    cut_samples_after(path, 6)
    assert path.read_text(encoding="utf-8") == kept  # nothing past step 6 left to cut
    cut_samples_after(tmp_path / "none.txt", 6)  # a run that sampled nothing: no file, nothing to do


def test_what_the_data_warns_of_while_a_run_builds_its_cache_is_in_train_log(corpus, tmp_path):
    """train.log holds every line the run printed, its warnings: the data's (skipped records, a
    pretrained tokenizer's [UNK], documents run together) were printed by a layer below the run's
    logger and were on the console only."""
    records = tmp_path / "records.jsonl"
    lines = [json.dumps({"text": line}) for line in corpus.read_text(encoding="utf-8").splitlines()[:3000]]
    records.write_text("\n".join(lines + ['{"text": null}'] * 2) + "\n", encoding="utf-8")
    config = load_config(TINY, tiny_overrides(records, tmp_path, "train.max_steps=1", "train.show=[]"))
    result = train(config, run_name="warned", progress=False)
    log = (result.run_dir / "train.log").read_text(encoding="utf-8")
    assert re.search(r"warning: \S+records.jsonl: skipped [\d,]+ of [\d,]+ records: 2 with no 'text' \(null or "
                     r"missing\)", log), log


def test_a_run_name_naming_the_checkpoints_own_folder_otherwise_spelled_still_refuses_an_earlier_step(
        tmp_path, monkeypatch):
    # --run-name of the checkpoint's own folder continues in place: from an earlier step it would
    # overwrite the later ones, however out_dir is spelled (relative here, the file's path absolute).
    from tinyattn.train.resume import ResumePoint

    run = tmp_path / "out" / "run"
    for step in (6, 9):
        ckpt.save_checkpoint({"step": step}, run / ckpt.step_filename(step))
    monkeypatch.chdir(tmp_path)
    earlier = ResumePoint(run / ckpt.step_filename(6), {}, load_config(TINY), 6)
    with pytest.raises(CheckpointError, match=r"is step 6, but .* goes on to step 9: continuing there"):
        earlier.target("run", "out")
    assert ResumePoint(run / ckpt.step_filename(9), {}, load_config(TINY), 9).target("run", "out") == run


def test_a_damaged_latest_checkpoint_names_a_best_pt_further_on_than_the_step_checkpoints_that_verify(
        corpus, tmp_path, monkeypatch, capsys):
    """The run's latest step checkpoint cut short, best.pt of that same step whole: the advice named step 6
    as 'the newest checkpoint that verifies' and resuming it trained steps 7-9 again; best.pt holds step 9's
    whole state, and a resume from it goes on at step 9."""
    from tinyattn.train.owners import EvalResult, Evaluator

    losses = {3: 3.0, 6: 2.5, 9: 2.0, 12: 1.9}
    monkeypatch.setattr(Evaluator, "run", lambda evaluator, step: EvalResult(step, np.full(32, losses[step])))
    items = ("train.eval_interval=3", "train.keep_last=2")
    train(tiny_config(corpus, tmp_path, "train.max_steps=9", *items), run_name="run", progress=False)
    run = tmp_path / "run"
    latest = run / ckpt.step_filename(9)
    latest.write_bytes(latest.read_bytes()[:-1000])
    with pytest.raises(CheckpointError) as refused:
        train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), run_name="run", resume=True,
              progress=False)
    best = run / ckpt.BEST
    assert str(refused.value).endswith(
        f"; best.pt (step 9) verifies and is further on than every step checkpoint in {run} that does: "
        f"resume from it with --resume {best}, or fork from it with --resume {best} --run-name NEW_NAME")
    later = run / ckpt.step_filename(10)  # a damaged step after best.pt's, in the way of a resume in place
    later.write_bytes(latest.read_bytes())
    moved = r"further on than every step checkpoint in .* that does: move the damaged checkpoints after "
    with pytest.raises(CheckpointError, match=moved + "step 9 away and resume from it with "):
        train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), resume=run, progress=False)
    later.unlink()
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=12", *items), resume=best, progress=False)
    assert result.step == 12 and "resuming from " + str(best) + " at step 9" in capsys.readouterr().err
