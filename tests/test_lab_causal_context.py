"""`tinyattn lab causal` and `tinyattn lab context` on tiny models: the causal mask leaves the
outputs before a changed token exactly equal and a bidirectional model does not; a bidirectional
model reads the answer and its training loss collapses on batches where a causal one cannot
learn; the prefix loss is the ordinary loss for a causal model; generate and export refuse a
bidirectional checkpoint; one token's hidden state is the same at the embedding in any context
and differs after a block that mixes context."""

import argparse
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import written_corpus
from tinyattn.cli.main import main
from tinyattn.config import ModelConfig, TrainConfig, load_config
from tinyattn.data.batches import eval_batches
from tinyattn.errors import TinyattnError
from tinyattn.lab.causal import (
    Row,
    causal_task_loss,
    check_position,
    format_table,
    leak_test,
    measure,
    prefix_losses,
    prefix_sample,
    train_both,
)
from tinyattn.lab.context import compared_token, hidden_states, similarity_table, word_position
from tinyattn.lab.context import format_table as context_table
from tinyattn.system.device import select_precision
from tinyattn.train.trainer import Trainer

# The lab runs trained here in process write to the page cache alone (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")

POSITION = 10  # the leak test changes the token at 11
NO_MATPLOTLIB = "error: plots need matplotlib, an optional extra: pip install 'tinyattn[plot]'\n"


@pytest.fixture
def figure_unread(monkeypatch):
    """Each lab's figure an empty file at its path, not drawn: for runs of a lab whose figure no
    assertion reads. What the figures show is pinned by their own tests, and the tests that run a
    lab to check its figure is written still draw it."""
    from tinyattn.lab import causal, context

    monkeypatch.setattr(causal, "save_figure", lambda rows, curves, path: path.touch() or path)
    monkeypatch.setattr(context, "save_figure", lambda word, pairs, table, path: path.touch() or path)


@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_changing_token_t_plus_1_leaves_every_causal_output_up_to_t_exactly_equal(
        tiny_model, random_tokens, attention):
    model = tiny_model(attention=attention)
    leak = leak_test(model, random_tokens(batch=1), POSITION)  # (T,)
    assert leak.shape == (24,)
    assert np.array_equal(leak[:POSITION + 1], np.zeros(POSITION + 1))  # exactly, not nearly
    assert leak[POSITION + 1:].min() > 1e-4  # the changed token and everything after it move


@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_a_model_with_the_mask_removed_fails_the_leak_test(tiny_model, random_tokens, attention):
    model = tiny_model(attention=attention, causal=False)
    leak = leak_test(model, random_tokens(batch=1), POSITION)
    assert leak[:POSITION + 1].min() > 1e-4  # every earlier position reads the changed token


def _final_losses(causal: bool, tokens: np.ndarray, steps: int = 120) -> float:
    """Mean training loss of the last 10 of `steps` steps of the real Trainer on `tokens`."""
    model_config = ModelConfig(vocab_size=32, n_layer=1, n_head=2, n_embd=32, context_length=16,
                               causal=causal)
    train_config = TrainConfig(batch_size=16, max_steps=steps, warmup_steps=5, lr=3e-2, min_lr=3e-3, seed=3,
                               precision="fp32")
    device = torch.device("cpu")
    trainer = Trainer.build(model_config, train_config, tokens, device=device,
                            precision=select_precision("fp32", device))
    losses = [trainer.train_step()[0].item() for _ in range(steps)]
    return float(np.mean(losses[-10:]))


@pytest.mark.slow  # 2 x 120 training steps
def test_a_bidirectional_models_training_loss_falls_far_below_a_causal_ones_on_the_same_batches():
    # Uniform random tokens: nothing before a token predicts it, so a causal model stays near
    # ln(32); a bidirectional one reads the target at the next position and copies it.
    tokens = np.random.default_rng(0).integers(0, 32, 20_000).astype(np.uint16)
    causal, bidirectional = _final_losses(True, tokens), _final_losses(False, tokens)
    assert causal > 0.9 * math.log(32)
    assert bidirectional < 0.5 * causal  # it is still falling: far below, and no more asked


def test_prefix_losses_are_the_ordinary_losses_for_a_causal_model_and_not_for_a_bidirectional_one(
        tiny_model, random_tokens):
    x, y = random_tokens(batch=2, length=13)[:, :-1], random_tokens(batch=2, length=13)[:, 1:]
    for causal in (True, False):
        model = tiny_model(causal=causal)
        ordinary = torch.nn.functional.cross_entropy(model(x).logits.transpose(1, 2), y, reduction="none")
        close = torch.allclose(prefix_losses(model, x, y), ordinary, atol=1e-5)
        assert close == causal


def test_the_leak_test_takes_every_position_whose_next_token_is_in_the_window_and_no_other(
        tiny_model, random_tokens):
    # The token at position + 1 is changed: position T - 2 is the last with one (the last asked
    # of a window of 24), and T - 1 has none, refused in one line rather than an IndexError.
    model, x = tiny_model(), random_tokens(batch=1)
    assert leak_test(model, x, 22)[:23].max() == 0 and leak_test(model, x, 0)[1] > 0
    with pytest.raises(TinyattnError, match=r"^--position 23: expected 0\.\.22 \(the token at position \+ 1"):
        leak_test(model, x, 23)


def test_the_leak_test_and_the_prefix_losses_run_without_dropout_and_keep_the_models_mode(
        tiny_model, random_tokens):
    # A model in training mode (dropout 0.5): dropout's noise would read as a leak at every position.
    model = tiny_model(dropout=0.5)
    x = random_tokens(batch=1)
    model.eval()
    evaluated = prefix_losses(model, x[:, :-1], x[:, 1:])
    model.train()  # as in the middle of training
    assert np.array_equal(leak_test(model, x, POSITION)[:POSITION + 1], np.zeros(POSITION + 1))
    assert torch.equal(prefix_losses(model, x[:, :-1], x[:, 1:]), evaluated)
    assert model.training


def test_the_leak_is_the_largest_absolute_logit_change_at_each_position(tiny_model, random_tokens):
    model = tiny_model(causal=False)
    x = random_tokens(batch=1)
    changed = x.clone()
    changed[0, POSITION + 1] = (changed[0, POSITION + 1] + 1) % 65
    with torch.no_grad():
        difference = (model(changed).logits - model(x).logits).abs()[0]  # (T, V)
    expected = difference.amax(-1).double().numpy()  # the largest over the vocabulary, not the mean
    np.testing.assert_allclose(leak_test(model, x, POSITION), expected, rtol=1e-6)
    # This model's largest changes are rises; with the final norm's gain negated every logit, and so
    # every change, turns sign: the largest change in size is the same, the largest rise is not.
    with torch.no_grad():
        model.final_norm.weight.neg_()
    np.testing.assert_allclose(leak_test(model, x, POSITION), expected, rtol=1e-6)


def test_the_leak_test_changes_the_vocabularys_last_token_to_another_one_not_past_the_vocabulary(
        tiny_model, random_tokens):
    # The first window of a user's validation split may hold the last id at position + 1: "any other
    # token" wraps round to 0, where one past the vocabulary is no token (an IndexError).
    model = tiny_model()
    x = random_tokens(batch=1).clone()
    x[0, POSITION + 1] = model.config.vocab_size - 1
    leak = leak_test(model, x, POSITION)
    assert np.array_equal(leak[:POSITION + 1], np.zeros(POSITION + 1)) and leak[POSITION + 1] > 0


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_the_causal_task_loss_is_the_mean_loss_per_target_over_the_evaluation_windows(tiny_model, causal):
    # Each target from its prefix alone: the model run on x[:, :t+1] for target t. For a causal model
    # that is its ordinary loss; a bidirectional one's ordinary loss would read the answer.
    model = tiny_model(causal=causal)
    tokens = np.random.default_rng(4).integers(0, 65, 400).astype(np.uint16)
    losses = []
    with torch.no_grad():
        for param in model.parameters():  # weights spread enough that the later tokens matter
            param.add_(torch.randn_like(param) * 0.15)  # (tiny_model seeded the generator)
        for x, y in eval_batches(tokens, 24, 2, 5):
            for t in range(24):
                logits = model(x[:, :t + 1]).logits[:, -1]  # (b, V): the prediction at t from t+1 tokens
                losses.append(torch.nn.functional.cross_entropy(logits, y[:, t], reduction="none"))
    expected = torch.cat(losses).double().mean().item()
    assert causal_task_loss(model, tokens, 24, windows=5, batch_size=2) == pytest.approx(expected, rel=1e-5)


def test_the_table_puts_the_leak_up_to_t_and_after_t_in_their_own_columns():
    causal = Row("causal", 2.5, 2.6, 2.7, np.array([0.0, 0.0, 0.0, 0.5, 2.0]), 2, "")
    # Each column's largest value at its edge: position 2 for <= t, 3 for > t (an off-by-one loses it)
    leaky = Row("bidirectional", 0.5, 0.6, 4.0, np.array([0.25, 0.5, 0.75, 3.0, 1.0]), 2, "")
    lines = format_table([causal, leaky]).splitlines()
    assert [cell.strip() for cell in lines[2].split("|")[1:-1]] == [
        "causal", "2.500", "2.600", "2.700", "0 (exactly)", "2"]
    assert [cell.strip() for cell in lines[3].split("|")[1:-1]] == [
        "bidirectional", "0.500", "0.600", "4.000", "0.75", "3"]
    # "exactly" only for an exact 0: a change of 1e-7 (a leak however small) is shown as it is.
    nearly = Row("nearly", 2.5, 2.6, 2.7, np.array([0.0, 0.0, 1e-7, 0.5, 2.0]), 2, "")
    assert format_table([nearly]).splitlines()[2].split("|")[5].strip() == "1e-07"


def test_a_checkpoints_row_leaves_the_training_and_own_mask_loss_blank_not_nan():
    # A --checkpoint was not trained by the lab: it has no lab training loss or run evaluation.
    theirs = Row("runs/mine", float("nan"), float("nan"), 2.7, np.array([0.0, 0.0, 0.5]), 1, "")
    cells = [cell.strip() for cell in format_table([theirs]).splitlines()[2].split("|")[1:-1]]
    assert cells == ["runs/mine", "", "", "2.700", "0 (exactly)", "0.5"]


def test_a_models_row_runs_the_leak_test_at_the_position_asked(tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    config = SimpleNamespace(model=model.config, sample=SimpleNamespace(temperature=1.0))
    loaded = SimpleNamespace(model=model, tokenizer=char_tokenizer, config=config)
    text = "First Citizen: we speak. All: speak, speak. " * 4
    tokens = np.asarray(char_tokenizer.encode(text), dtype=np.uint16)
    row = measure("causal", loaded, tokens=tokens, position=5, prompt=[1, 2, 3], windows=None)
    assert row.position == 5
    assert np.all(row.leak[:6] == 0) and row.leak[6] > 0  # the token at 6 changed
    row = measure("causal", loaded, tokens=tokens, position=None, prompt=[1, 2, 3], windows=None)
    assert row.position == 24 // 2 - 1
    # The sample is drawn at the model's own sample.temperature: at 0 the greedy continuation.
    config.sample.temperature = 0.0
    row = measure("causal", loaded, tokens=tokens, position=None, prompt=[1, 2, 3], windows=None)
    greedy = prefix_sample(model, [1, 2, 3], tokens=120, temperature=0.0, seed=0)
    assert row.sample == char_tokenizer.decode(greedy)


@pytest.fixture(scope="module")
def lab_with_checkpoint(trained_run, tmp_path_factory, corpus_text):
    """One short `lab causal` run given --checkpoint, --position and train.eval_windows, its figure
    unread (as `figure_unread`) and no fsync (as `no_fsync`): its out folder, what it printed, and the
    calls it made of causal_task_loss (first argument, windows), leak_test (first argument, position)
    and prefix_sample (prompt). The two tests after it read it, each for what it pins."""
    import contextlib
    import io
    import os

    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.lab import causal, context

    folder = tmp_path_factory.mktemp("lab_with_checkpoint")
    corpus = folder / "corpus.txt"
    corpus.write_text(corpus_text * 4, encoding="utf-8")  # about 30 validation windows: 4 are not all
    calls = {"causal_task_loss": [], "leak_test": [], "prefix_sample": []}
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(io.StringIO()) as printed:
        monkeypatch.setattr(os, "fsync", lambda fd: None)  # as no_fsync, for the module's lab runs
        monkeypatch.setattr(causal, "save_figure", lambda rows, curves, path: path.touch() or path)
        monkeypatch.setattr(context, "save_figure", lambda word, pairs, table, path: path.touch() or path)
        real_loss, real_leak, real_sample = causal.causal_task_loss, causal.leak_test, causal.prefix_sample
        monkeypatch.setattr(causal, "causal_task_loss", lambda model, first, *args, **kwargs: (
            calls["causal_task_loss"].append((first, kwargs.get("windows", "its default")))
            or real_loss(model, first, *args, **kwargs)))
        monkeypatch.setattr(causal, "leak_test", lambda model, first, position: (
            calls["leak_test"].append((first, position)) or real_leak(model, first, position)))
        monkeypatch.setattr(causal, "prefix_sample", lambda model, prompt, **kwargs: (
            calls["prefix_sample"].append(prompt) or real_sample(model, prompt, **kwargs)))
        status = main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "2", "--out",
                       str(folder / "out"), "--checkpoint", str(trained_run.run_dir), "--position", "7",
                       "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                       f"data.cache_dir={folder / 'cache'}", "train.eval_windows=4"])
    assert status == 0, printed.getvalue()
    return folder / "out", printed.getvalue(), calls


def test_every_rows_causal_task_loss_reads_the_windows_the_runs_own_evaluation_read(lab_with_checkpoint):
    # With --set train.eval_windows=4 the runs evaluated 4 windows and the causal-task loss read 64:
    # the causal model's two validation columns, which must agree, read different text.
    _, printed, calls = lab_with_checkpoint
    read = [windows for _, windows in calls["causal_task_loss"]]
    assert read == [4, 4, 4]  # the causal run, the bidirectional one and the --checkpoint
    causal_row = next(line for line in printed.splitlines() if line.startswith("| causal |"))
    own_mask, causal_task = [float(cell) for cell in causal_row.split("|")[3:5]]
    assert own_mask == pytest.approx(causal_task, abs=1.5e-3)  # one loss for a causal model, rounded


def test_each_rows_train_and_val_loss_are_its_own_runs_last_logged_loss_and_evaluation(
        tmp_path, monkeypatch, capsys, corpus_text, figure_unread):
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.lab import causal
    from tinyattn.train import loop

    results = {}
    real = loop.train
    monkeypatch.setattr(loop, "train", lambda config, **options: results.setdefault(
        options["run_name"], real(config, **options)))
    read_curve = causal.training_curve

    def rising_at_the_end(run_dir):  # a falling curve's last point is also its least: make it the largest
        steps, losses = read_curve(run_dir)
        return steps, np.append(losses[:-1], losses.max() + 1.0)

    monkeypatch.setattr(causal, "training_curve", rising_at_the_end)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text * 4, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "6", "--out", str(out),
                 "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                 f"data.cache_dir={tmp_path / 'cache'}", "train.log_interval=2", "train.eval_windows=4"]) == 0
    table = capsys.readouterr().out
    for name in ("causal", "bidirectional"):
        steps, losses = causal.training_curve(results[name].run_dir)
        assert len(steps) > 1 and steps[-1] == 6  # the last point, not the first
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert row.split("|")[2:4] == [f" {losses[-1]:.3f} ", f" {results[name].last_val_loss:.3f} "], row
    # tiny.yaml's context is 32: the default position is 15, the changed token the one at 16
    assert "leak test: the token at position 16 changed;" in (out / "causal.md").read_text()


def test_every_rows_leak_test_runs_on_the_first_window_at_the_position_asked_and_samples_after_its_start(
        lab_with_checkpoint, trained_run):
    out, _, calls = lab_with_checkpoint
    scored, tested, prompts = calls["causal_task_loss"], calls["leak_test"], calls["prefix_sample"]
    validation = scored[0][0]  # what the causal-task loss reads: the validation split
    assert len(tested) == len(prompts) == 3  # the two runs and the --checkpoint
    for (x, position), prompt in zip(tested, prompts):
        assert position == 7
        assert x.tolist() == [validation[:32].tolist()]  # the first window (tiny.yaml's context: 32)
        assert prompt == validation[:24].tolist()  # the default prompt: its first 24 tokens
    report = (out / "causal.md").read_text()
    for name in ("causal", "bidirectional", str(trained_run.run_dir)):  # each row's sample, the --checkpoint's too
        assert f"\n## sample: {name}\n" in report


def test_the_report_names_the_default_prompt_its_samples_continue_the_validation_splits_start(
        lab_with_checkpoint, trained_run):
    # Without --prompt the samples continue text the user never typed: the report names that text.
    from tinyattn.hf.folder import load_any_model

    out, _, calls = lab_with_checkpoint
    prompt = load_any_model(trained_run.run_dir).tokenizer.decode(calls["prefix_sample"][0])
    assert len(prompt) == 24  # the validation split's first 24 characters
    assert f"\nthe samples continue the prompt {prompt!r}\n" in (out / "causal.md").read_text()


def test_both_runs_train_eagerly_for_their_steps_alone_and_evaluate_once_at_the_end(tmp_path, monkeypatch):
    # What --set's help promises of the two runs, where the main config compiles, stops at its time
    # budget, evaluates every few hundred steps and shows samples and maps at each evaluation.
    main_config, trained = configs_train_both_gives(tmp_path, monkeypatch, steps=200)
    main = main_config.train
    assert main.compile and main.time_budget and main.show and main.eval_interval != 200
    for config in trained:
        assert (config.train.compile, config.train.time_budget, config.train.show) == (False, None, [])
        assert config.train.eval_interval == 200


def test_both_runs_are_evaluated_on_their_own_weights_not_a_moving_average(tmp_path, monkeypatch):
    # The main config keeps an average of the weights (train.ema 0.98), which its evaluations and
    # checkpoints read: the lab compares the two models' own weights, as its short runs train them.
    main_config, trained = configs_train_both_gives(tmp_path, monkeypatch, steps=200)
    assert main_config.train.ema is not None
    assert [config.train.ema for config in trained] == [None, None]


def configs_train_both_gives(tmp_path, monkeypatch, steps: int) -> tuple:
    """(the main config, the configs `train_both` trains its two runs with), training mocked."""
    from tests.conftest import ROOT
    from tinyattn.train import loop

    trained = []
    monkeypatch.setattr(loop, "train", lambda config, **options: trained.append(config) or
                        SimpleNamespace(run_dir=tmp_path / options["run_name"], interrupted=False))
    args = argparse.Namespace(config=str(ROOT / "configs" / "shakespeare_char.yaml"), steps=steps, force=False,
                              overrides=[])
    train_both(args, tmp_path)
    return load_config(args.config), trained


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_sample_at_temperature_0_is_the_greedy_continuation_whatever_the_seed(tiny_model, causal):
    model = tiny_model(causal=causal)
    with torch.no_grad():
        for param in model.parameters():  # weights spread enough that the whole prefix matters
            param.add_(torch.randn_like(param) * 0.15)
    prompt = [int(i) for i in torch.randint(0, 65, (20,), generator=torch.Generator().manual_seed(0))]
    ids = list(prompt)
    with torch.no_grad():  # from scratch: the whole prefix, cropped to the context (24), at every step
        for _ in range(10):
            ids.append(int(model(torch.tensor([ids[-24:]])).logits[0, -1].argmax()))
    assert len(set(ids[20:])) > 2  # a real continuation, not one token repeated
    for seed in (1, 2):
        assert prefix_sample(model, prompt, tokens=10, temperature=0.0, seed=seed) == ids[20:]


def test_the_two_runs_differ_in_the_mask_alone_and_the_users_set_comes_after_the_labs(tmp_path, monkeypatch):
    from tests.conftest import ROOT
    from tinyattn.train import loop

    trained = []
    monkeypatch.setattr(loop, "train", lambda config, **options: trained.append((config, options)) or
                        SimpleNamespace(run_dir=tmp_path / options["run_name"], interrupted=False))
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=3, force=False,
                              overrides=["model.n_layer=3"])
    assert set(train_both(args, tmp_path)) == {"causal", "bidirectional"}
    assert [(options["run_name"], config.model.causal) for config, options in trained] == [
        ("causal", True), ("bidirectional", False)]
    for config, _ in trained:
        assert config.model.n_layer == 3  # the user's --set, over the lab's 2 layers
        assert (config.model.n_embd, config.train.max_steps, config.train.precision) == (64, 3, "fp32")
        assert config.train.warmup_steps == 1  # a tenth of the steps, at least 1: not the config's 2



@pytest.mark.parametrize("position, refused", [(-1, True), (0, False), (30, False), (31, True)])
def test_the_leak_tests_position_is_refused_outside_0_to_the_context_less_2(position, refused):
    # a context of 32: the token at position + 1 must be in the window, and a negative position is no token
    if refused:
        with pytest.raises(TinyattnError, match=rf"^--position {position}: expected 0..30 "):
            check_position(position, 32)
    else:
        check_position(position, 32)


def test_lab_without_an_experiment_is_a_usage_error_naming_them(capsys):
    from tinyattn.cli.lab import main as lab_main

    with pytest.raises(SystemExit) as stopped:
        lab_main([])
    assert stopped.value.code == 2 and "EXPERIMENT" in capsys.readouterr().err


@pytest.mark.parametrize("experiment", ["causal", "recurrence", "distance", "context", "scaling"])
def test_a_mistyped_option_of_an_experiment_shows_that_experiments_usage_not_the_labs(capsys, experiment):
    # It showed "usage: tinyattn lab [-h] EXPERIMENT ...", which hides the experiment's own options.
    from tinyattn.cli.lab import main as lab_main

    with pytest.raises(SystemExit) as stopped:
        lab_main([experiment, "--stepz", "5"])
    err = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2 and err[0].startswith(f"usage: tinyattn lab {experiment} [-h]"), err
    assert err[-1] == f"tinyattn lab {experiment}: error: unrecognized arguments: --stepz 5"


@pytest.mark.parametrize("steps", [0, -5])
def test_steps_of_zero_or_fewer_are_refused_before_anything_trains(tmp_path, monkeypatch, steps):
    from tests.conftest import ROOT
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained"))
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=steps, force=False, overrides=[])
    with pytest.raises(TinyattnError, match=rf"^--steps {steps}: expected a positive integer$"):
        train_both(args, tmp_path)


@pytest.mark.parametrize("item, option", [("train.max_steps=20", "--steps 20"),
                                          ("train.out_dir=elsewhere", "--out elsewhere")])
def test_a_set_of_what_steps_or_out_gives_is_refused_naming_the_option_before_anything_trains(
        tmp_path, monkeypatch, item, option):
    # `--set train.max_steps=20` trained 20 steps, printed "(200 steps)" and warmed up over all 20.
    from tests.conftest import ROOT
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained"))
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=200, force=False,
                              overrides=["model.n_layer=1", item])
    with pytest.raises(TinyattnError, match=rf"^--set {re.escape(item)}: .*; give {option} instead$"):
        train_both(args, tmp_path)
    assert not any(tmp_path.iterdir())


def saved_run(run_dir):
    """A run folder as a run that trained (or was stopped after a step) leaves it: a checkpoint."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "best.pt").write_bytes(b"run")


def test_a_run_stopped_by_ctrl_c_ends_the_lab_in_one_line_before_the_second_run_or_a_table(
        tmp_path, monkeypatch, capsys, corpus_text):
    # A stop saves the run and returns (TrainResult.interrupted): the lab went on to train the other
    # run and printed a table setting 9 steps beside 300, exit 0. It ends as `tinyattn train` does
    # when stopped: status 130, not 2 (a user's mistake).
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    trained = []
    out = tmp_path / "out"

    def train(config, **options):  # a stop saves the run: its folder holds a checkpoint
        trained.append(options["run_name"])
        saved_run(out / options["run_name"])
        return SimpleNamespace(run_dir=out / options["run_name"], step=9, interrupted=True)

    monkeypatch.setattr(loop, "train", train)
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "300",
                 "--out", str(out), "--set", *written_corpus(tmp_path, corpus_text)]) == 130
    stdout, err = capsys.readouterr()
    assert trained == ["causal"]  # the bidirectional run is not trained after the stop
    assert err == (f"lab causal stopped: the causal run stopped at step 9 of 300 ({out / 'causal'}); "
                   f"nothing was compared. Run the lab again with --out {out} --force to train both runs "
                   "anew\n"), err
    assert "| model |" not in stdout
    assert not (out / "causal.md").exists() and not (out / "causal.png").exists()


def test_a_bidirectional_run_stopped_before_its_first_step_ends_the_lab_naming_out_and_force_not_a_rerun(
        tmp_path, monkeypatch, capsys, corpus_text):
    # The causal run trained into --out, then a stop before the bidirectional run's first step ended
    # the lab on train's own line, "nothing was trained or saved; run the same command again to
    # train", and the same command was refused: --out held the causal run.
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop
    from tinyattn.train.owners import StoppedBeforeStart

    def train(config, **options):
        if options["run_name"] == "bidirectional":
            raise StoppedBeforeStart("SIGTERM")
        saved_run(out / options["run_name"])
        return SimpleNamespace(run_dir=out / options["run_name"], step=300, interrupted=False)

    out = tmp_path / "out"
    monkeypatch.setattr(loop, "train", train)
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "300",
                 "--out", str(out), "--set", *written_corpus(tmp_path, corpus_text)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lab causal stopped: the bidirectional run stopped before its first step; nothing was compared. "
        f"Run the lab again with --out {out} --force to train both runs anew")


def test_a_lab_causal_of_one_step_says_1_step_as_every_count_of_steps_does(tmp_path, monkeypatch, capsys,
                                                                          corpus_text):
    # Its line before each run said "training causal (1 steps)", where a run's first line says "1 step"
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop
    from tinyattn.train.owners import StoppedBeforeStart

    def train(config, **options):  # the line is said before the run trains: none needs to
        raise StoppedBeforeStart("SIGINT")

    out = tmp_path / "out"
    monkeypatch.setattr(loop, "train", train)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "1", "--out", str(out),
                 "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                 f"data.cache_dir={tmp_path / 'cache'}"]) == 130
    assert capsys.readouterr().out.splitlines() == [f"training causal (1 step) into {out / 'causal'}/"]


@pytest.mark.parametrize("given_out", [True, False], ids=["out", "new-folder"])
def test_a_lab_causal_stopped_while_it_measures_its_runs_says_what_its_folder_holds_and_how_to_run_it_again(
        tmp_path, monkeypatch, capsys, corpus_text, given_out):
    # A stop after both runs trained, while they were measured, said "interrupted" alone, and a rerun
    # into that --out was refused until --force, as docs/LAB.md says every lab's stop tells.
    from pathlib import Path

    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.hf import folder
    from tinyattn.train import loop

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "lab out"
    monkeypatch.setattr(loop, "train", lambda config, **options: SimpleNamespace(
        run_dir=Path(config.train.out_dir) / options["run_name"], step=3, interrupted=False))
    monkeypatch.setattr(folder, "load_any_model", stop)  # the first thing the measurement reads
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 *(["--out", str(out)] if given_out else []), "--set", f"data.files={corpus}",
                 "data.url=null", "data.sha256=null", f"data.cache_dir={tmp_path / 'cache'}"]) == 130
    if not given_out:
        [out] = Path("checkpoints", "lab").glob("causal-*")  # as the user's folder names it
    again = (f"run it again with --out '{out}' --force to start over" if given_out
             else "run it again to start over in a new folder")
    stdout, err = capsys.readouterr()
    assert err.splitlines()[-1] == (f"lab causal stopped before its table; {out} holds its two trained "
                                    f"runs; {again}")
    assert "| model |" not in stdout


def test_both_runs_keep_the_configs_weight_decay_at_any_steps_without_its_tables_by_passes(tmp_path,
                                                                                        monkeypatch):
    # The main config's train.decay_by_passes gives 0.2 from 3.5 passes: the lab's 4,000 steps of
    # batch 16 and context 64 make about 4.1, where 200 make 0.2 (both arms alike either way).
    main, trained = configs_train_both_gives(tmp_path, monkeypatch, steps=4000)
    main_config = main.train
    assert main_config.decay_by_passes  # the table the lab leaves out
    assert len(trained) == 2
    for config in trained:
        tables = (config.train.dropout_by_passes, config.train.floor_by_passes, config.train.decay_by_passes)
        assert tables == ({}, {}, {}) and config.train.weight_decay == main_config.weight_decay


def test_both_runs_warm_up_over_a_tenth_of_their_steps_not_the_configs_warmup(tmp_path, monkeypatch):
    main_config, trained = configs_train_both_gives(tmp_path, monkeypatch, steps=200)
    assert main_config.train.warmup_steps == 100  # sized for the main config's own schedule
    assert [config.train.warmup_steps for config in trained] == [20, 20]


def test_the_figure_puts_each_causal_task_loss_beside_its_curve_and_marks_the_changed_token(
        tmp_path, drawn_figures):
    from tests.conftest import lines_by_label
    from tinyattn.lab.causal import save_figure

    causal = Row("causal", 2.5, 2.6, 2.7, np.array([0.0, 0.0, 0.0, 0.5, 2.0]), 2, "")
    leaky = Row("bidirectional", 0.5, 0.6, 4.0, np.array([0.25, 0.5, 0.75, 3.0, 1.0]), 2, "")
    curves = {"causal": (np.array([1, 2]), np.array([3.0, 2.75])),
              "bidirectional": (np.array([1, 2]), np.array([3.0, 0.5]))}
    save_figure([causal, leaky], curves, tmp_path / "causal.png")
    [figure] = drawn_figures
    left, right = (lines_by_label(axes) for axes in figure.axes)
    assert left["causal: training loss"] == ([1, 2], [3.0, 2.75])
    # The dashed level is each row's causal-task loss (2.7, 4.0), not its own-mask one (2.6, 0.6).
    assert left["causal: val loss, causal task (2.70)"][1] == [2.7, 2.7]
    assert left["bidirectional: val loss, causal task (4.00)"][1] == [4.0, 4.0]
    assert right["bidirectional"] == ([0, 1, 2, 3, 4], [0.25, 0.5, 0.75, 3.0, 1.0])
    assert right["changed token (position 3)"][0] == [3, 3]  # position + 1, where the leak begins


def test_a_training_curve_of_one_logged_point_is_drawn_as_a_marker(tmp_path, figures_unrendered):
    # `lab causal --steps 5` logs each run's training loss once (at its last step): a line through
    # one point draws nothing, and the panel showed the legend over an empty plot.
    from tinyattn.lab.causal import save_figure

    causal = Row("causal", 2.5, 2.6, 2.7, np.array([0.0, 0.5]), 0, "")
    leaky = Row("bidirectional", 0.5, 0.6, 4.0, np.array([0.25, 3.0]), 0, "")
    curves = {"causal": (np.array([5]), np.array([3.0])),
              "bidirectional": (np.array([1, 5]), np.array([3.0, 0.5]))}
    save_figure([causal, leaky], curves, tmp_path / "causal.png")
    lines = {line.get_label(): line for line in figures_unrendered[0].axes[0].lines}
    assert lines["causal: training loss"].get_marker() not in ("None", "", " ", None)
    assert list(lines["causal: training loss"].get_ydata()) == [3.0]


@pytest.mark.parametrize("earlier", ["causal.md", "causal.png", "bidirectional"])
def test_an_out_holding_what_the_lab_writes_is_refused_before_anything_trains_and_force_clears_it(
        tmp_path, monkeypatch, earlier):
    from tests.conftest import ROOT
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: SimpleNamespace(run_dir=tmp_path / "x",
                                                                          interrupted=False))
    path = tmp_path / earlier
    if earlier == "bidirectional":  # an earlier lab's second run: found before the first run trains
        path.mkdir()
        (path / "best.pt").write_bytes(b"run")
    else:
        path.write_text("my own notes")
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=3, force=False, overrides=[])
    with pytest.raises(TinyattnError, match=rf"holds {earlier}, which this lab writes; add --force"):
        train_both(args, tmp_path)
    assert path.exists()
    args.force = True
    train_both(args, tmp_path)
    assert not path.exists()


@pytest.mark.parametrize("option, message", [
    (["--position", "100"], "--position 100: expected 0..30"),
    (["--checkpoint", "no/such/run"],
     "no/such/run: no such checkpoint file, run folder or Hugging Face folder"),
], ids=["position", "checkpoint"])
def test_a_bad_position_or_checkpoint_is_refused_before_anything_trains(tmp_path, monkeypatch, capsys,
                                                                        corpus_text, option, message):
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3", "--out", str(out),
                 *option, "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                 f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_context_of_one_token_is_refused_before_anything_trains_naming_the_context(tmp_path, monkeypatch,
                                                                                     capsys, corpus_text):
    # The leak test changes the token after position t, both in the window: a context of 1 holds no
    # such pair. Both runs trained, then the lab ended in "--position -1: expected 0..-1", an option
    # never given.
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3", "--out", str(out),
                 "--set", "model.context_length=1", f"data.files={corpus}", "data.url=null",
                 "data.sha256=null", f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    assert capsys.readouterr().err == ("error: model.context_length 1: the leak test changes the token after "
                                       "a position, both in the window: expected a context of at least 2\n")
    assert not out.exists()


def test_lab_causal_without_matplotlib_is_refused_in_one_line_before_anything_trains(
        tmp_path, monkeypatch, capsys, corpus_text):
    # It trained both runs (minutes) and then failed drawing causal.png, before the table was printed.
    import sys

    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the optional extra were not installed
    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 "--out", str(out), "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                 f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    assert capsys.readouterr().err == NO_MATPLOTLIB
    assert not out.exists()


def test_a_device_the_machine_lacks_is_refused_before_a_run_says_it_trains(tmp_path, monkeypatch, capsys,
                                                                            corpus_text):
    # It printed "training causal (3 steps) into <out>/causal/" and made --out before the refusal.
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3", "--out",
                 str(tmp_path / "out"), "--set", *written_corpus(tmp_path, corpus_text),
                 "train.device=cuda"]) == 2
    stdout, err = capsys.readouterr()
    assert (stdout, err) == ("", "error: device 'cuda' was asked for but CUDA is not available here; use "
                                 "--set train.device=cpu or auto\n")  # a lab has no --device
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_another_context_than_the_runs_is_refused_before_anything_trains(
        trained_run, tmp_path, monkeypatch, capsys, corpus_text):
    # Its row would be measured on other windows and its leak test at another position than the runs'.
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    def reached(*args, **kwargs):
        raise TinyattnError("reached training")

    monkeypatch.setattr(loop, "train", reached)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    out = tmp_path / "out"
    command = ["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3", "--out", str(out),
               "--checkpoint", str(trained_run.run_dir), "--set", f"data.files={corpus}", "data.url=null",
               "data.sha256=null", f"data.cache_dir={tmp_path / 'cache'}"]
    assert main([*command, "model.context_length=16"]) == 2  # the checkpoint's is tiny.yaml's 32
    err = capsys.readouterr().err
    assert "its context is 32 tokens and the lab's runs' is 16; train the runs with --set model.context_length=32" in err
    assert err.count("\n") == 1 and not out.exists(), err
    assert main(command) == 2  # the same context: checked, and on to training
    assert capsys.readouterr().err == "error: reached training\n"


def test_a_checkpoint_of_another_tokenizer_than_the_configs_is_refused_before_anything_trains(
        trained_run, tmp_path, monkeypatch, capsys):
    # Its row would read the validation windows' ids as tokens of another vocabulary.
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("0123456789 abc\n" * 400, encoding="utf-8")  # other characters: another vocabulary
    out = tmp_path / "out"
    config = ROOT / "configs" / "tiny.yaml"
    assert main(["causal", "--config", str(config), "--steps", "3", "--out", str(out),
                 "--checkpoint", str(trained_run.run_dir), "--set", f"data.files={corpus}", "data.url=null",
                 "data.sha256=null", f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --checkpoint {trained_run.run_dir}: its tokenizer is not the one of --config {config}; "
                   "give the config it was trained with\n"), err
    assert not out.exists()


@pytest.fixture(scope="module")
def bidirectional_run(tmp_path_factory, corpus_text):
    from tests.conftest import ROOT
    from tinyattn.config import load_config
    from tinyattn.train.loop import train

    folder = tmp_path_factory.mktemp("bidirectional")
    corpus = folder / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    config = load_config(ROOT / "configs" / "tiny.yaml", [
        f"data.files={corpus}", "data.url=null", "data.sha256=null", f"data.cache_dir={folder / 'cache'}",
        f"train.out_dir={folder / 'runs'}", "train.max_steps=2", "train.eval_interval=2",
        "model.causal=false"])
    return train(config, run_name="bidirectional", progress=False).run_dir


@pytest.mark.parametrize("command", [
    ["generate", "--prompt", "To be"], ["export", "--out", "exported"], ["export", "--gguf", "exported.gguf"],
    ["eval", "--no-plot"], ["lab", "distance", "--recall-steps", "1"], ["attention", "--text", "To be"],
    ["attention", "--relevance"], ["attention", "--html"], ["serve", "--port", "0"],
    ["lab", "context", "--word", "speak", "--context", "we speak", "--context", "All: speak"],
    ["lab", "scaling", "--steps", "1"]],
    ids=["generate", "export", "export-gguf", "eval", "lab-distance", "attention", "attention-relevance",
         "attention-html", "serve", "lab-context", "lab-scaling"])
def test_commands_that_score_predictions_refuse_a_bidirectional_checkpoint_in_one_line(
        bidirectional_run, tmp_path, capsys, monkeypatch, command):
    # Each position of a bidirectional model read the token it predicts: its losses, recall and
    # relevance would all be of the leaked answer, and attention's maps grey out later keys as masked.
    # lab context's word would have read the text after it, which its reading (docs/LAB.md) rules out.
    if command[0] == "export":
        pytest.importorskip("safetensors" if command[1] == "--out" else "gguf")
        command = ["export", command[1], str(tmp_path / command[2])]
    if command[0] == "serve":
        pytest.importorskip("fastapi")
        pytest.importorskip("uvicorn")
        import tinyattn.serve.server as server_module

        def served(app, sock):  # instead of serving until Ctrl-C
            raise AssertionError("the bidirectional model was served")
        monkeypatch.setattr(server_module, "serve_forever", served)
    if command[0] == "lab":
        command = [*command, "--out", str(tmp_path / command[1])]
    if command[-1] == "--html":
        command = [*command, str(tmp_path / "page.html")]
    where = 2 if command[0] == "lab" else 1
    argv = [*command[:where], "--checkpoint", str(bidirectional_run), *command[where:]]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {bidirectional_run}") and "model.causal is false" in err
    assert f"tinyattn {' '.join(command[:where])}" in err and "needs a causal model" in err
    assert not [*tmp_path.iterdir()]  # nothing written: no export, no lab folder, no page
    assert not (bidirectional_run.parent / "attention").exists() and not (bidirectional_run / "attention").exists()


# ----------------------------------------------------------------------------- lab context

CONTEXTS = ["First Citizen: we speak", "All: speak, speak"]


def test_the_word_position_is_its_last_token(char_tokenizer):
    ids, position = word_position(char_tokenizer, "All: speak, speak", "speak")
    assert char_tokenizer.decode(ids[:position + 1]) == "All: speak"
    with pytest.raises(TinyattnError, match=r"--word 'zebra': not in the context 'All: speak, speak'; give "):
        word_position(char_tokenizer, "All: speak, speak", "zebra")


def test_the_word_is_found_as_a_whole_word_not_inside_another(char_tokenizer):
    ids, position = word_position(char_tokenizer, "The man ran to an inn.", "an")
    assert char_tokenizer.decode(ids[:position + 1]) == "The man ran to an"
    with pytest.raises(TinyattnError, match=r"--word 'an': not in the context"):
        word_position(char_tokenizer, "The man ran.", "an")


def test_an_empty_word_is_refused_in_one_line(char_tokenizer):
    # '' is found everywhere as a regular expression: read as a word, it compared each context's last token.
    for blank in ("", " "):
        with pytest.raises(TinyattnError, match=rf"^--word '{blank}': expected a word that each context "):
            word_position(char_tokenizer, "All: speak", blank)


def test_a_tokenizer_that_merges_the_word_with_what_follows_is_refused_in_one_line():
    class Merging:  # "speak," is one token, as a subword vocabulary may have it
        text_start: list[int] = []  # nothing put before a text, as tinyattn's own tokenizers

        def encode(self, text):
            return [100 if piece == "speak," else ord(piece) for piece in re.findall(r"speak,|.", text, re.S)]

    with pytest.raises(TinyattnError, match=r"the tokenizer merges 'speak' with the text after it; put a "):
        word_position(Merging(), "All: speak, speak", "speak")
    assert word_position(Merging(), "All: speak and speak,", "speak")[1] == 9  # ends a token there


class Subwords:  # a word after a space is one token with it, as in byte-level BPE: ' speak' and 'speak'
    text_start: list[int] = []  # nothing put before a text, as tinyattn's own tokenizers

    def __init__(self):
        self.pieces = []

    def encode(self, text):
        found = re.findall(r" ?\w+|.", text, re.S)
        self.pieces += [piece for piece in found if piece not in self.pieces]
        return [self.pieces.index(piece) for piece in found]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_the_table_names_each_contexts_compared_token_which_a_subword_tokenizer_may_change():
    tokenizer, contexts = Subwords(), ["we speak now", "(speak) now"]
    tokens = [compared_token(tokenizer, text, "speak") for text in contexts]
    assert tokens == ["' speak' (id 1)", "'speak' (id 4)"]
    table = context_table("speak", contexts, [(0, 1)], np.array([[0.5], [0.25]]), tokens=tokens)
    assert "- context 1: 'we speak now'; compared token ' speak' (id 1)\n" in table
    assert "- context 2: '(speak) now'; compared token 'speak' (id 4)\n" in table
    # The columns are numbered as the legend numbers the contexts, from 1.
    assert "| depth | cos(context 1, 2) |\n" in table
    assert table.endswith("| embedding | 0.5000 |\n| after block 1 | 0.2500 |")  # row i: after block i


def test_the_table_tells_an_exact_1_from_a_similarity_just_below_it():
    # After block 1 a trained model's similarities are 1 - ~1e-5: at four decimals they read 1.0000,
    # the same as the embedding's exact 1, and the docs' "below 1 after every block" looked false.
    table = np.array([[1.0, 1.0, 0.5], [0.9999881338467833, 1.0 + 2.0 ** -52, 0.99994],
                      [0.9505, 0.927398, 0.0]])
    rows = context_table("bank", ["a", "b", "c"], [(0, 1), (0, 2), (1, 2)], table,
                         tokens=["'k' (id 1)"] * 3).splitlines()[-3:]
    assert rows == ["| embedding | 1 (exactly) | 1 (exactly) | 0.5000 |",
                    "| after block 1 | 1 - 1.2e-05 | 1 + 2.2e-16 | 0.9999 |",
                    "| after block 2 | 0.9505 | 0.9274 | 0.0000 |"]


def test_lab_context_names_the_token_compared_in_each_context_not_the_firsts(tiny_model, tmp_path,
                                                                            monkeypatch, figure_unread):
    from tinyattn.hf import folder

    model, tokenizer = tiny_model(vocab_size=16), Subwords()
    monkeypatch.setattr(folder, "load_any_model", lambda checkpoint: SimpleNamespace(
        model=model, tokenizer=tokenizer, label="stub", config=SimpleNamespace(model=model.config)))
    assert main(["lab", "context", "--checkpoint", "unused", "--word", "speak", "--context", "we speak now",
                 "--context", "(speak) now", "--out", str(tmp_path)]) == 0
    written = (tmp_path / "context.md").read_text()
    assert "- context 1: 'we speak now'; compared token ' speak' (id 1)\n" in written
    assert "- context 2: '(speak) now'; compared token 'speak' (id 4)\n" in written


def _lab_context(tiny_model, char_tokenizer, monkeypatch, word, contexts, out) -> int:
    """`tinyattn lab context` on the tests' tiny model and the character tokenizer of CORPUS."""
    from tinyattn.hf import folder

    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    monkeypatch.setattr(folder, "load_any_model", lambda checkpoint: SimpleNamespace(
        model=model, tokenizer=char_tokenizer, label="stub", config=SimpleNamespace(model=model.config)))
    context_options = [option for text in contexts for option in ("--context", text)]
    return main(["lab", "context", "--checkpoint", "unused", "--word", word, *context_options, "--out", str(out)])


def test_lab_context_refuses_a_word_whose_last_token_is_unk_before_writing_anything(
        tiny_model, char_tokenizer, monkeypatch, tmp_path, capsys):
    # The tokenizer never saw 'é': 'Café' ends in [UNK] in every context, and the table would compare
    # the [UNK] token's states, not the word's.
    out = tmp_path / "out"
    assert _lab_context(tiny_model, char_tokenizer, monkeypatch, "Café", ["Café bank", "a Café"], out) == 2
    err = capsys.readouterr().err
    assert err == ("error: --word 'Café': its last token in the context 'Café bank' is [UNK] (the "
                   "tokenizer has never seen 'é'), so the table would compare [UNK], not the word; give a "
                   "word whose last character the tokenizer has seen\n")
    assert not out.exists()
    with pytest.raises(TinyattnError, match=r"^--word 'Café': its last token in the context 'Café bank' is "):
        word_position(char_tokenizer, "Café bank", "Café")


def test_lab_context_warns_of_characters_the_tokenizer_never_saw_as_generate_and_eval_do(
        tiny_model, char_tokenizer, monkeypatch, tmp_path, capsys, figure_unread):
    # 'speak' is read as itself; the second context's 'é' and 'ü' are [UNK]: measured, with a warning
    # naming that context alone, in the words of the other commands' warning.
    contexts = ["First Citizen: we speak", "héllo, speak, über"]
    assert _lab_context(tiny_model, char_tokenizer, monkeypatch, "speak", contexts, tmp_path) == 0
    err = capsys.readouterr().err
    assert err == ("warning: --context 'héllo, speak, über': 2 characters the tokenizer has never seen, "
                   "read as [UNK]: 'é', 'ü'\n")
    assert "compared token 'k'" in (tmp_path / "context.md").read_text()


def test_after_a_start_token_the_word_position_is_still_its_last_token(char_tokenizer, monkeypatch):
    # An imported folder's bos begins the ids: the position counts it.
    from tinyattn.data.tokenizer import Tokenizer

    monkeypatch.setattr(Tokenizer, "text_start", property(lambda self: [self.eot_id]))
    ids, position = word_position(char_tokenizer, "All: speak, speak", "speak")
    assert ids[0] == char_tokenizer.eot_id
    assert char_tokenizer.decode(ids[1:position + 1]) == "All: speak"


def test_a_context_longer_than_the_models_is_one_line(tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)  # context 24
    long = "All: speak, speak, and all speak at once, now"  # 45 characters, named by its first 37
    refused = (r"^--context 'All: speak, speak, and all speak at o\.\.\.': 45 tokens, longer than the "
               r"model's context length 24; give a shorter text$")
    with pytest.raises(TinyattnError, match=refused):
        similarity_table(model, char_tokenizer, "speak", ["All: speak, speak", long])  # named, not the first
    full = "All: speak, speak, and a"  # exactly the 24 tokens the model reads: measured
    assert similarity_table(model, char_tokenizer, "speak", [full, "All: speak, speak"])[1].shape == (3, 1)
    with pytest.raises(TinyattnError, match=r"^--context 'All: speak, speak, and al': 25 tokens, longer "):
        similarity_table(model, char_tokenizer, "speak", [full + "l", "All: speak, speak"])  # one token over


def test_lab_context_names_the_context_too_long_for_the_model_in_one_line(
        tiny_model, char_tokenizer, monkeypatch, tmp_path, capsys, figure_unread):
    out = tmp_path / "out"
    contexts = ["All: speak", "speak, speak, and all"]  # 10 and 21 tokens: both fit the model's 24 ...
    assert _lab_context(tiny_model, char_tokenizer, monkeypatch, "speak", contexts, out) == 0
    contexts = ["All: speak", "speak, speak, and all speak"]  # ... 27 do not
    assert _lab_context(tiny_model, char_tokenizer, monkeypatch, "speak", contexts, tmp_path / "long") == 2
    assert capsys.readouterr().err == ("error: --context 'speak, speak, and all speak': 27 tokens, longer "
                                       "than the model's context length 24; give a shorter text\n")
    assert not (tmp_path / "long").exists()
    # With no --context, the default contexts (each longer than this model's 24 tokens): called so
    assert _lab_context(tiny_model, char_tokenizer, monkeypatch, "bank", [], tmp_path / "default") == 2
    assert capsys.readouterr().err.endswith(
        "error: the default context 'They sat on the river bank and watche...' has 49 tokens, longer than "
        "the model's context length 24; give --context texts of at most 24 tokens\n")


def test_fewer_than_two_contexts_is_one_line(tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)  # one context has no pair to compare
    with pytest.raises(TinyattnError, match=r"^--context: 1 given; give at least two texts holding 'speak'$"):
        similarity_table(model, char_tokenizer, "speak", ["All: speak, speak"])


def test_three_contexts_are_compared_in_every_pair_each_column_its_own_pairs_similarity(
        tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    contexts = [*CONTEXTS, "We speak of it"]
    pairs, table = similarity_table(model, char_tokenizer, "speak", contexts)
    assert pairs == [(0, 1), (0, 2), (1, 2)] and table.shape == (3, 3)
    states = [hidden_states(model, *word_position(char_tokenizer, text, "speak")) for text in contexts]
    for column, (i, j) in enumerate(pairs):
        expected = torch.nn.functional.cosine_similarity(states[i], states[j], dim=-1).numpy()
        np.testing.assert_allclose(table[:, column], expected, rtol=1e-12)
    assert len({round(float(value), 6) for value in table[-1]}) == 3  # three pairs, three similarities


def test_one_tokens_similarity_is_1_at_the_embedding_and_below_1_after_a_block_that_mixes_context(
        tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    pairs, table = similarity_table(model, char_tokenizer, "speak", CONTEXTS)
    assert pairs == [(0, 1)] and table.shape == (3, 1)  # the embedding and after each of 2 blocks
    assert table[0, 0] == 1.0  # one table row, whatever the context: exactly 1 (not 1 +- 1e-16)
    assert table[1, 0] < 0.999 and table[2, 0] < 0.999  # attention mixed different contexts in


def test_the_states_compared_are_those_of_the_words_last_token_at_the_embedding_and_after_the_last_block(
        tiny_model, char_tokenizer):
    # The similarity tests hold with the state of any one position read in both contexts (the one
    # before the word's last token too: 'a' of 'speak' in each): these pin which position is read.
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    ids, position = word_position(char_tokenizer, "All: speak, speak", "speak")
    states = hidden_states(model, ids, position)  # (n_layer + 1, C)
    with torch.no_grad():
        embedding = model.token_embedding.weight[ids[position]].double()  # the row of 'k'
        last = model.hidden_states(torch.tensor([ids]))[0, position].double()  # after the last block
    assert states.shape == (3, 32)
    assert torch.equal(states[0], embedding)
    torch.testing.assert_close(states[-1], last)

def test_a_model_that_attends_only_to_itself_keeps_the_similarity_at_1(tiny_model, char_tokenizer,
                                                                        monkeypatch):
    # The control: with each position attending only to itself nothing of the context is mixed
    # in, so the same token at different positions stays the same vector at every depth.
    from tinyattn.model import attention

    monkeypatch.setattr(attention, "causal_mask",
                        lambda queries, keys, device=None: torch.eye(queries, keys, dtype=torch.bool))
    model = tiny_model(vocab_size=char_tokenizer.vocab_size, attention="explicit")
    _, table = similarity_table(model, char_tokenizer, "speak", CONTEXTS)
    assert np.array_equal(table, np.ones((3, 1)))  # the same vector at every depth: exactly 1


@pytest.mark.parametrize("word", ["speak", "the", "of", "it", "we", "a"])
def test_the_embedding_row_is_exactly_1_for_any_word_and_no_similarity_exceeds_1(
        tiny_model, char_tokenizer, word):
    # The cosine of a float64 vector with itself rounds to 1 +- 1e-16 for about half of all vectors:
    # the table says 1 (exactly) for the same vector, and never more than 1.
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    _, table = similarity_table(model, char_tokenizer, word, ["we speak of it to the a",
                                                              "of the a; it we speak"])
    assert table[0, 0] == 1.0
    assert (table <= 1.0).all()


def test_two_states_that_differ_only_in_their_last_bits_are_shown_just_below_1_never_above(
        tiny_model, char_tokenizer, monkeypatch):
    # The same text before the word, another after it: the states are equal but for rounding, and the
    # float64 cosine of two such vectors rounds to 1 + 2.2e-16 for some, which no similarity can be.
    from tinyattn.lab import context

    generator = torch.Generator().manual_seed(0)
    for _ in range(100):  # a pair whose cosine rounds above 1 (about one in six)
        state = torch.randn(3, 32, dtype=torch.float64, generator=generator)
        nudged = state.clone()
        nudged[:, 0] = torch.nextafter(nudged[:, 0], nudged[:, 0] + 1)
        if (torch.nn.functional.cosine_similarity(state, nudged, dim=-1) > 1).any():
            break
    else:
        pytest.fail("no pair rounds above 1")
    states = iter([state, nudged])
    monkeypatch.setattr(context, "hidden_states", lambda model, ids, position: next(states))
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    _, table = similarity_table(model, char_tokenizer, "speak", CONTEXTS)
    assert (table < 1.0).all() and (table > 1.0 - 1e-15).all()


def test_the_words_state_reads_only_the_text_before_it(tiny_model, char_tokenizer):
    # The same text up to the word, another after it: under the causal mask the word's state is
    # the same at every depth, so the similarity is 1 throughout.
    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    _, table = similarity_table(model, char_tokenizer, "speak", ["All: speak, speak", "All: speak to me"])
    assert table == pytest.approx(np.ones((3, 1)), abs=1e-6)


def test_lab_context_writes_and_prints_its_table_under_the_models_name(trained_run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["lab", "context", "--checkpoint", str(trained_run.run_dir), "--word", "speak",
                 "--context", CONTEXTS[0], "--context", CONTEXTS[1], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = (out / "context.md").read_text()
    label, table = written.split("\n\n", 1)
    assert label.startswith("# tinyattn lab context: ") and label[len("# tinyattn lab context: "):] in printed
    assert "| depth | cos(context 1, 2) |" in table and table.rstrip() in printed
    assert (out / "context.png").stat().st_size > 0


def test_lab_context_stopped_while_it_measures_says_nothing_was_written(trained_run, tmp_path, monkeypatch,
                                                                       capsys):
    # It said "interrupted" alone.
    import tinyattn.lab.context as context_lab

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(context_lab, "similarity_table", stop)
    out = tmp_path / "out"
    assert main(["lab", "context", "--checkpoint", str(trained_run.run_dir), "--word", "speak",
                 "--context", CONTEXTS[0], "--context", CONTEXTS[1], "--out", str(out)]) == 130
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == "lab context stopped before its table; nothing was written"
    assert not out.exists()


def test_lab_contexts_time_counts_from_the_process_start(trained_run, tmp_path, capsys, monkeypatch,
                                                         figure_unread):
    # aadbe5a's clock for every lab ('wrote ... in N s'): only recurrence's was pinned.
    from tinyattn.lab import outputs

    monkeypatch.setattr(outputs, "process_age", lambda: 600.0)  # started 10 minutes ago
    assert main(["lab", "context", "--checkpoint", str(trained_run.run_dir), "--word", "speak",
                 "--context", CONTEXTS[0], "--context", CONTEXTS[1], "--out", str(tmp_path / "out")]) == 0
    seconds = float(re.search(r"context.png in ([\d.]+) s", capsys.readouterr().out).group(1))
    assert 600 <= seconds < 660, seconds


def test_lab_context_without_matplotlib_is_refused_in_one_line_before_it_writes_anything(
        trained_run, tmp_path, monkeypatch, capsys):
    # It measured, made --out and failed drawing context.png before context.md was written.
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the optional extra were not installed
    out = tmp_path / "out"
    assert main(["lab", "context", "--checkpoint", str(trained_run.run_dir), "--word", "speak",
                 "--context", CONTEXTS[0], "--context", CONTEXTS[1], "--out", str(out)]) == 2
    assert capsys.readouterr().err == NO_MATPLOTLIB
    assert not out.exists()

def test_hidden_states_are_read_without_dropout_and_the_models_mode_is_kept(tiny_model, char_tokenizer):
    model = tiny_model(vocab_size=char_tokenizer.vocab_size, dropout=0.5)
    _, evaluated = similarity_table(model, char_tokenizer, "speak", CONTEXTS)
    model.train()  # as in the middle of training
    _, training = similarity_table(model, char_tokenizer, "speak", CONTEXTS)
    np.testing.assert_array_equal(training, evaluated)
    assert model.training


@pytest.mark.parametrize("lab", ["causal", "recurrence"])
def test_a_labs_repeated_set_flags_add_up(lab):
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(f"tinyattn.lab.{lab}").add_arguments(parser)
    args = parser.parse_args(["--set", "model.n_layr=1", "--set", "train.batch_size=2", "train.lr=1e-3"])
    # The typo in the first is not dropped:
    assert args.overrides == ["model.n_layr=1", "train.batch_size=2", "train.lr=1e-3"]


def lab_causal_up_to_training(tmp_path, monkeypatch, corpus_text):
    """`tinyattn lab causal` on tiny.yaml and a small corpus, stopped where its two runs would train:
    a function of the --prompt, giving the command's exit status."""
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main
    from tinyattn.lab import causal

    def no_training(args, out):
        raise TinyattnError("stopped before training")

    monkeypatch.setattr(causal, "train_both", no_training)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text * 4, encoding="utf-8")
    options = ["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "2", "--out",
               str(tmp_path / "out"), "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
               f"data.cache_dir={tmp_path / 'cache'}", "--prompt"]
    return lambda prompt: main(options + [prompt])


def test_lab_causal_names_the_prompts_characters_the_tokenizer_never_saw_before_anything_trains(
        tmp_path, monkeypatch, capsys, corpus_text):
    # As generate names them: a sample from a prompt read as [UNK] says why, before the runs' minutes.
    assert lab_causal_up_to_training(tmp_path, monkeypatch, corpus_text)("Café ROMEO") == 2
    err = capsys.readouterr().err
    assert err == ("warning: --prompt: 1 character the tokenizer has never seen, read as [UNK]: 'é'\n"
                   "error: stopped before training\n"), err


def test_lab_causal_says_a_prompt_longer_than_the_context_is_read_from_its_end_before_anything_trains(
        tmp_path, monkeypatch, capsys, corpus_text):
    # As generate says it: each sample step reads the prompt's last context tokens, never its start.
    run = lab_causal_up_to_training(tmp_path, monkeypatch, corpus_text)
    assert run("ROMEO: " * 5) == 2  # 35 characters, tiny.yaml's context 32
    assert capsys.readouterr().err == ("warning: --prompt: 35 tokens, longer than the runs' context of 32; "
                                       "the samples read only its last 32\nerror: stopped before training\n")
    assert run("ROMEO: " * 4) == 2  # 28: read whole
    assert capsys.readouterr().err == "error: stopped before training\n"


def test_lab_causal_reads_a_prompt_of_exactly_the_context_whole_without_a_warning(
        tmp_path, monkeypatch, capsys, corpus_text):
    run = lab_causal_up_to_training(tmp_path, monkeypatch, corpus_text)
    assert run("ROMEO: " * 4 + "ROME") == 2  # 32 characters: tiny.yaml's context, read whole
    assert capsys.readouterr().err == "error: stopped before training\n"


def test_lab_causal_refuses_a_set_of_what_steps_gives_before_it_makes_its_out_folder(tmp_path, capsys):
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main as lab_main

    out = tmp_path / "out"
    assert lab_main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                     "--out", str(out), "--set", "train.max_steps=20"]) == 2
    assert capsys.readouterr().err == ("error: --set train.max_steps=20: lab causal sets train.max_steps "
                                       "from --steps; give --steps 20 instead\n")
    assert not out.exists()


def test_both_runs_evaluate_the_labs_windows_not_the_configs(tmp_path, monkeypatch):
    # The main config evaluates 200 windows; the lab's runs, and so each row's causal-task loss (a
    # forward per position of every window), read EVAL_WINDOWS: what keeps the lab within its minutes.
    from tinyattn.lab.runs import EVAL_WINDOWS

    main_config, trained = configs_train_both_gives(tmp_path, monkeypatch, steps=200)
    assert main_config.train.eval_windows != EVAL_WINDOWS
    assert [config.train.eval_windows for config in trained] == [EVAL_WINDOWS, EVAL_WINDOWS]


def test_the_tables_columns_name_the_pair_of_contexts_each_compares():
    # Three contexts give the pairs (1, 2), (1, 3), (2, 3): each column's header names its own pair, so
    # a learner reads 0.8000 as the similarity of contexts 1 and 3, not of 1 and 2 again.
    pairs = [(0, 1), (0, 2), (1, 2)]
    table = np.array([[1.0, 1.0, 1.0], [0.9, 0.8, 0.7]])
    text = context_table("bank", ["a bank.", "b bank.", "c bank."], pairs, table, tokens=["k", "k", "k"])
    lines = text.splitlines()
    assert "| depth | cos(context 1, 2) | cos(context 1, 3) | cos(context 2, 3) |" in lines
    assert "| after block 1 | 0.9000 | 0.8000 | 0.7000 |" in lines


def test_the_report_names_the_prompt_its_samples_continue(tmp_path):
    # A sample is the text drawn after the prompt, not the prompt itself: without the prompt beside
    # them (by default the validation split's first tokens, which the user never typed) the samples
    # read as text from nowhere.
    import numpy as np

    from tinyattn.lab.causal import Row, write_report

    rows = [Row(name, 1.0, 1.0, 1.0, np.zeros(4), 1, f"{name}'s text")
            for name in ("causal", "bidirectional")]
    write_report(rows, tmp_path, 1.0, prompt="ROMEO:\n")
    report = (tmp_path / "causal.md").read_text()
    assert "\nthe samples continue the prompt 'ROMEO:\\n'" in report
    assert report.index("the samples continue the prompt") < report.index("## sample: causal")


def test_an_empty_prompt_starts_the_samples_from_the_start_token_not_the_default_prompt(char_tokenizer):
    # `--prompt ''` asks for samples from nothing, as generate's empty prompt starts from <|endoftext|>;
    # it read as no --prompt and the samples continued the validation split's first tokens unsaid.
    from tinyattn.lab.causal import _prompt_ids

    validation = np.arange(5, 40)
    assert _prompt_ids(None, char_tokenizer, validation, 32) == list(range(5, 29))  # no --prompt: the default
    assert char_tokenizer.start_id is not None
    assert _prompt_ids("", char_tokenizer, validation, 32) == [char_tokenizer.start_id]


@pytest.mark.parametrize("steps", ["0", "-2"])
def test_lab_causal_refuses_steps_of_zero_or_fewer_naming_steps_before_reading_the_data(
        tmp_path, monkeypatch, capsys, steps):
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main as lab_main
    from tinyattn.data import batches

    monkeypatch.setattr(batches, "prepare_data", lambda *args, **kwargs: pytest.fail("read the data"))
    out = tmp_path / "out"
    assert lab_main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", steps,
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--steps {steps}: expected a positive integer" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_lab_causal_without_out_refuses_a_bad_position_in_one_line_and_makes_no_folder(
        tmp_path, monkeypatch, capsys, corpus_text):
    from tests.conftest import ROOT
    from tinyattn.cli.lab import main as lab_main
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text, encoding="utf-8")
    assert lab_main(["causal", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                     "--position", "-1", "--set", f"data.files={corpus}", "data.url=null", "data.sha256=null",
                     f"data.cache_dir={tmp_path / 'cache'}"]) == 2
    err = capsys.readouterr().err
    assert "--position -1: expected 0.." in err and err.count("\n") == 1, err
    assert not (tmp_path / "checkpoints").exists()


def test_the_context_figure_draws_each_pairs_similarity_by_depth_from_the_embedding(tmp_path,
                                                                                   figures_unrendered):
    from tests.conftest import lines_by_label
    from tinyattn.lab.context import save_figure as context_figure

    table = np.array([[1.0, 1.0], [0.9, 0.8], [0.7, 0.5]])  # (depth, pair): embedding, blocks 1 and 2
    path = context_figure("king", [(0, 1), (0, 2)], table, tmp_path / "context.png")
    assert path.is_file()
    axes = figures_unrendered[-1].axes[0]
    assert lines_by_label(axes) == {"contexts 1 and 2": ([0, 1, 2], [1.0, 0.9, 0.7]),
                                    "contexts 1 and 3": ([0, 1, 2], [1.0, 0.8, 0.5])}
    assert [label.get_text() for label in axes.get_xticklabels()] == ["emb", "1", "2"]
    assert list(axes.get_xticks()) == [0, 1, 2]
    legend = axes.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ["contexts 1 and 2", "contexts 1 and 3"]
