"""`tinyattn lab recurrence` and `tinyattn lab distance`: each measurement pinned on a model whose answer is known."""

import argparse
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.conftest import ROOT, lines_by_label, run_started_in
from tinyattn.config import ModelConfig, load_config
from tinyattn.errors import TinyattnError
from tinyattn.lab import distance, recurrence
from tinyattn.lab.distance import (
    KeyValueRecall,
    ProbeRow,
    RecallResult,
    gap_lengths,
    ordinary_tokens,
    recall_accuracy,
    repeat_probe,
)
from tinyattn.lab.lstm import LSTMConfig, LSTMLanguageModel, lstm_parameters, lstm_width_for
from tinyattn.lab.outputs import use_threads
from tinyattn.lab.recurrence import (
    Contender,
    at_initialisation,
    contenders_for,
    gradient_by_distance,
    train_and_measure,
)
from tinyattn.model.transformer import IGNORE_INDEX, LanguageModel, ModelOutput
from tinyattn.system.device import select_precision

# The lab runs trained here in process write to the page cache alone (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")


def local_text(tmp_path: Path) -> list[str]:
    """`written_corpus` of CORPUS * 4: enough text for the recurrence lab's windows."""
    from tests.conftest import CORPUS, written_corpus

    return written_corpus(tmp_path, CORPUS * 4)


@pytest.fixture
def figure_unread(monkeypatch):
    """Each lab's figure an empty file at its path, not drawn: for runs of a lab whose figure no
    assertion reads. What the figures show is pinned by their own tests, and the tests that run a
    lab to check its figure is written still draw it."""
    monkeypatch.setattr(recurrence, "save_figure", lambda contenders, path, *, contexts: path.touch())
    monkeypatch.setattr(distance, "save_figure", lambda probe, recall, path, *, length: path.touch())


@pytest.mark.parametrize("shape", [dict(n_layer=4, n_head=4, n_embd=192, vocab_size=65),  # the main config
                                   dict(n_layer=2, n_head=2, n_embd=32, vocab_size=20)])
def test_lstm_parameter_count_is_within_10_percent_of_the_attention_model(shape):
    attention = LanguageModel(ModelConfig(context_length=16, **shape))
    for layers in (1, 2, 3):
        width = lstm_width_for(attention.num_parameters(), shape["vocab_size"], layers)
        lstm = LSTMLanguageModel(LSTMConfig(shape["vocab_size"], width, layers))
        assert lstm.num_parameters() == lstm_parameters(shape["vocab_size"], width, layers)
        assert 0.9 < lstm.num_parameters() / attention.num_parameters() < 1.1


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_lstm_width_is_the_one_whose_parameter_count_is_nearest(layers):
    for target in (5_000, 40_000, 1_234_567):
        width = lstm_width_for(target, 65, layers)
        miss = abs(lstm_parameters(65, width, layers) - target)
        assert miss <= abs(lstm_parameters(65, width - 1, layers) - target)
        assert miss <= abs(lstm_parameters(65, width + 1, layers) - target)


def test_an_untrained_lstm_starts_at_the_loss_of_a_uniform_guess(random_tokens):
    # As LanguageModel: a small tied embedding starts every logit near 0, the loss near ln V.
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=2))
    x = random_tokens(batch=4, length=24)
    with torch.no_grad():
        loss = lstm(x, torch.roll(x, -1, 1)).loss.item()
    assert loss == pytest.approx(math.log(65), abs=0.05)


def test_the_lstms_head_reads_its_output_normalised(random_tokens):
    # The final RMSNorm, as LanguageModel's: the LSTM's output scaled by 10 gives the same logits.
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=1))
    x = random_tokens(batch=2, length=24)
    with torch.no_grad():
        plain = lstm(x).logits
        handle = lstm.lstm.register_forward_hook(lambda module, inputs, output: (output[0] * 10, output[1]))
        try:
            scaled = lstm(x).logits
        finally:
            handle.remove()
    torch.testing.assert_close(scaled, plain, rtol=1e-3, atol=1e-4)


def test_the_lstms_final_norm_reads_fp32_under_bf16_autocast_as_the_attention_models_does(random_tokens):
    # Under `lab recurrence --precision bf16` the LSTM's output is bf16, and RMSNorm's fp32 gain met it
    # in torch's unfused path, with a UserWarning and its file and line on the console; the attention
    # model's final norm reads its fp32 residual stream.
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=1))
    seen = []
    lstm.final_norm.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lstm(random_tokens(batch=2, length=8)).logits
    assert seen == [torch.float32]
    assert logits.dtype == torch.bfloat16  # the head still multiplies in bf16


def test_the_lstm_contender_has_the_layers_asked_and_about_the_attention_models_parameters():
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65"])
    device = torch.device("cpu")
    attention, lstm = contenders_for(config, 3, device, select_precision("fp32", device))
    built = lstm.build(16)
    assert built.lstm.num_layers == 3 and lstm.shape.startswith("3 layers")
    assert 0.9 < built.num_parameters() / attention.build(16).num_parameters() < 1.1


@pytest.mark.parametrize("layers, expected", [(3, 0.2), (1, 0.0)])
def test_the_lstm_contender_has_the_dropout_asked_between_its_layers(layers, expected):
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "model.dropout=0.2"])
    device = torch.device("cpu")
    _, lstm = contenders_for(config, layers, device, select_precision("fp32", device))
    assert lstm.build(16).lstm.dropout == expected  # torch drops only between layers: none for one


def test_threads_sets_torchs_cpu_threads():
    before = torch.get_num_threads()
    try:
        use_threads(before + 1)
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)


def test_threads_of_zero_or_fewer_are_refused_in_one_line():
    before = torch.get_num_threads()
    for threads in (0, -1):
        with pytest.raises(TinyattnError, match=rf"^--threads {threads}: expected a positive integer$"):
            use_threads(threads)
    assert torch.get_num_threads() == before


def _timed_setup(monkeypatch, call_times):
    """The tiny config, the CPU in fp32 and 600 random tokens, with `recurrence.call_times` (the
    timer the speed runs read) replaced by `call_times`: (config, device, precision, tokens)."""
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65"])
    device = torch.device("cpu")
    monkeypatch.setattr(recurrence, "call_times", call_times)
    tokens = np.random.default_rng(0).integers(0, 65, 600).astype(np.uint16)
    return config, device, select_precision("fp32", device), tokens


def test_each_context_is_timed_at_the_same_tokens_per_step(monkeypatch):
    # The speed table compares contexts at one number of tokens per step: the batch is that number
    # over the context (12 windows of 8, 6 of 16), not the config's batch of 4 at every context.
    config, device, precision, tokens = _timed_setup(monkeypatch, lambda step, **kwargs: [0.5, 0.5, 0.5])
    for contender in contenders_for(config, 1, device, precision):
        for context in (8, 16):
            assert recurrence.tokens_per_second(contender, config.train, tokens, context=context,
                                                tokens_per_step=96, device=device,
                                                precision=precision) == 96 / 0.5


def test_the_speed_is_the_median_of_three_timed_steps_after_an_untimed_one(monkeypatch):
    calls = []
    config, device, precision, tokens = _timed_setup(monkeypatch, lambda step, **kwargs: (
        calls.append(kwargs) or [0.25, 0.5, 0.125]))
    attention = contenders_for(config, 1, device, precision)[0]
    assert recurrence.tokens_per_second(attention, config.train, tokens, context=8, tokens_per_step=96,
                                        device=device, precision=precision) == 96 / 0.25  # not the fastest
    assert calls == [dict(repeats=3, warmup=1, device=device)]


def test_both_models_train_their_own_weights_without_a_moving_average():
    # The lab compares the two models' weights step for step: a config's train.ema is left out.
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.ema=0.9"])
    device = torch.device("cpu")
    tokens = np.random.default_rng(0).integers(0, 65, 600).astype(np.uint16)
    for contender in contenders_for(config, 1, device, select_precision("fp32", device)):
        trainer = recurrence.make_trainer(contender.build(8), config.train, tokens, batch_size=2, context=8,
                                          device=device, precision=select_precision("fp32", device))
        assert trainer.average is None


def test_the_lab_steps_each_model_eagerly_one_batch_a_step_whatever_the_configs_compile_and_accumulation():
    # The speed table's tokens per step and the schedule assume one batch a step, uncompiled (a compile
    # on the first timed step would be timed too).
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.compile=true",
                                                          "train.grad_accum_steps=4"])
    device = torch.device("cpu")
    tokens = np.random.default_rng(0).integers(0, 65, 600).astype(np.uint16)
    for contender in contenders_for(config, 1, device, select_precision("fp32", device)):
        model = contender.build(8)
        trainer = recurrence.make_trainer(model, config.train, tokens, batch_size=2, context=8, device=device,
                                          precision=select_precision("fp32", device))
        assert trainer.forward_model is model and trainer.tokens_per_step == 2 * 8, contender.name


def test_the_reported_parameter_count_is_the_models_own_its_tied_head_counted_once(tmp_path):
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.batch_size=2",
                                                          "train.eval_windows=2"])
    device = torch.device("cpu")
    lstm = contenders_for(config, 1, device, select_precision("fp32", device))[1]
    tokens = np.random.default_rng(0).integers(0, 65, 600).astype(np.uint16)
    train_and_measure(lstm, config, SimpleNamespace(train=tokens, validation=tokens), seconds=0.01,
                      folder=tmp_path, device=device, precision=select_precision("fp32", device))
    built = lstm.build(32)
    assert lstm.parameters == built.num_parameters() == lstm_parameters(65, built.config.n_embd, 1)


def test_each_contender_builds_the_same_weights_every_call():
    # The speed runs, the gradients at init and the training all start from one model per contender.
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65"])
    device = torch.device("cpu")
    for contender in contenders_for(config, 1, device, select_precision("fp32", device)):
        first = contender.build(16).state_dict()
        torch.randn(1000)  # whatever ran in between
        second = contender.build(16).state_dict()
        assert all(torch.equal(first[k], second[k]) for k in first), contender.name


def test_a_contenders_validation_loss_is_the_mean_over_the_positions():
    contender = Contender("lstm", "shape", lambda t: None, position_losses=np.array([3.0, 2.0, 1.0]))
    assert contender.val_loss == 2.0


def test_the_gradients_are_measured_on_windows_spread_over_the_whole_validation_split():
    x, y = next(recurrence.iter_validation(np.arange(1000), 8, 4))
    assert x.shape == y.shape == (4, 8) and torch.equal(y, x + 1)
    assert x[:, 0].tolist() == [0, 330, 661, 991]  # from the first token to the last, not the first 4 windows


def test_the_machine_line_names_the_cpu_cores_precision_and_torchs_threads():
    from tinyattn.lab.outputs import machine_line

    line = machine_line(torch.device("cpu"), "fp32")
    assert line.startswith("measured on ") and " cores, fp32, " in line
    assert line.endswith(f", torch threads {torch.get_num_threads()}")


def test_the_training_curve_starts_at_the_first_step_then_every_tenth_and_ends_at_the_last(monkeypatch):
    class Stepping:  # a Trainer's interface, one step per call
        step, tokens_seen = 0, 0

        def train_step(self):
            self.step, self.tokens_seen = self.step + 1, self.tokens_seen + 8
            return torch.tensor(2.0), None

    clock = iter(range(1000))  # one second each time the clock is read: 20 to 29 steps in 25 seconds
    monkeypatch.setattr(recurrence.time, "perf_counter", lambda: float(next(clock)))
    logged = []
    writer = SimpleNamespace(add_scalar=lambda tag, value, step: logged.append((tag, step)))
    contender = Contender("lstm", "shape", lambda t: None)
    recurrence.train_for(Stepping(), contender, 25.0, writer)
    assert [step for tag, step in logged if tag == "train/loss"] == [1, 10, 20, 21]
    assert len(contender.curve) == 4 and contender.steps == 21
    # The curve is against wall time: the clock's seconds after each logged step, not the step.
    assert [seconds for seconds, _ in contender.curve] == [2.0, 12.0, 23.0, 26.0]


def test_the_recurrence_default_config_is_the_main_config():
    from tinyattn.lab.recurrence import DEFAULT_CONFIG

    assert load_config(ROOT / DEFAULT_CONFIG).model.n_embd == load_config(ROOT / "configs/shakespeare_char.yaml").model.n_embd


# ----------------------------------------------------------------------------- gradient by distance


def test_a_model_that_reads_only_the_last_token_has_zero_gradient_beyond_it(random_tokens):
    # zero_init_projections: attention output and MLP down start at 0, so each position's
    # logits depend on its own token alone and no gradient reaches an earlier embedding.
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24,
                                      zero_init_projections=True))
    x = random_tokens(batch=3, length=24)
    norms = gradient_by_distance(model, x, torch.roll(x, -1, 1))
    assert norms.shape == (24,)
    assert norms[0] > 1e-3
    assert np.all(norms[1:] == 0.0)


def test_attention_reaches_every_earlier_embedding_and_the_lstm_fades(random_tokens):
    torch.manual_seed(0)
    attention = LanguageModel(ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24))
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=1))
    x = random_tokens(batch=3, length=24)
    attended = gradient_by_distance(attention, x, torch.roll(x, -1, 1))
    recurrent = gradient_by_distance(lstm, x, torch.roll(x, -1, 1))
    assert np.all(attended > 0) and attended[-1] > 0.1 * attended[1:].mean()  # direct at every distance
    assert np.all(recurrent[:-1] > 0)
    assert recurrent[-1] < 1e-3 * recurrent[0]  # 23 steps of recurrence later


def test_an_untied_head_at_init_is_measured_as_the_tied_model_would_be(random_tokens):
    # The main config's head is untied and starts at zero, which passes no gradient back: the
    # path length at initialisation would read 0 at every distance.
    shape = dict(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24)
    x = random_tokens(batch=3, length=24)
    torch.manual_seed(0)
    untied = LanguageModel(ModelConfig(**shape, tie_embeddings=False))
    torch.manual_seed(0)
    tied = LanguageModel(ModelConfig(**shape))
    assert np.all(gradient_by_distance(untied, x, torch.roll(x, -1, 1)) == 0.0)
    measured = gradient_by_distance(at_initialisation(untied), x, torch.roll(x, -1, 1))
    np.testing.assert_allclose(measured, gradient_by_distance(tied, x, torch.roll(x, -1, 1)), rtol=1e-6)
    assert np.all(measured > 0)
    assert not untied.head.weight.any()  # the model itself is not changed
    assert at_initialisation(tied) is tied


def test_a_trained_untied_head_and_a_tied_one_are_measured_as_they_are():
    shape = dict(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24)
    trained = LanguageModel(ModelConfig(**shape, tie_embeddings=False))
    with torch.no_grad():
        trained.head.weight.normal_()  # no longer the zero head it started with
    before = trained.head.weight.clone()
    assert at_initialisation(trained) is trained and torch.equal(trained.head.weight, before)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32))
    assert at_initialisation(lstm) is lstm


def test_the_gradient_by_distance_is_the_euclidean_norm_of_each_embeddings_gradient(random_tokens):
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=1))
    x = random_tokens(batch=2, length=24)
    y = torch.roll(x, -1, 1)
    embedded = lstm.token_embedding(x).detach().requires_grad_()  # (B, T, C), fed in by a hook
    handle = lstm.token_embedding.register_forward_hook(lambda module, inputs, output: embedded)
    try:
        logits = lstm(x).logits
    finally:
        handle.remove()
    torch.nn.functional.cross_entropy(logits[:, -1], y[:, -1], reduction="sum").backward()
    expected = embedded.grad.norm(dim=-1).mean(0).flip(0)  # (T,): k = 0 the last position
    np.testing.assert_allclose(gradient_by_distance(lstm, x, y), expected.double().numpy(), rtol=1e-5)


def test_the_gradient_by_distance_is_the_mean_of_each_windows_own(random_tokens):
    # Three copies of one window measure what the window measures alone: each window's gradient
    # is that of its own loss (summed, not averaged, over the batch), then averaged.
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24))
    x = random_tokens(batch=1, length=24)
    alone = gradient_by_distance(model, x, torch.roll(x, -1, 1))
    copies = gradient_by_distance(model, x.repeat(3, 1), torch.roll(x, -1, 1).repeat(3, 1))
    np.testing.assert_allclose(copies, alone, rtol=1e-5)


def test_the_lstm_is_read_for_its_gradient_in_eval_mode_with_cudnn_off(random_tokens):
    # cuDNN refuses an RNN backward in eval mode ("cudnn RNN backward can only be called in
    # training mode"): on CUDA the lab lost its run after training. The CPU never uses cuDNN, so
    # this pins what makes CUDA work, that the LSTM's forward runs with cuDNN off and without
    # dropout; the CUDA case below runs the backward itself.
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=2, dropout=0.5))
    seen = []
    lstm.lstm.register_forward_hook(lambda module, inputs, output: seen.append(
        (torch.backends.cudnn.enabled, module.training)))
    x = random_tokens(batch=2, length=24)
    before = torch.backends.cudnn.enabled
    gradient_by_distance(lstm, x, torch.roll(x, -1, 1))
    assert seen == [(False, False)]
    assert torch.backends.cudnn.enabled == before and lstm.training  # both as they were


def test_the_gradient_by_distance_on_each_device_is_the_cpus(random_tokens, device):
    # The CUDA half is `lab recurrence --device cuda`'s measurement of a trained LSTM: before cuDNN
    # was turned off for it, a RuntimeError. The same weights give the CPU's numbers: fp32 on
    # both, summed in another order, within 1e-4 relative (plus 1e-7 for the norms far back,
    # near zero).
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(LSTMConfig(65, 32, n_layer=2, dropout=0.5))
    x = random_tokens(batch=2, length=24)
    expected = gradient_by_distance(lstm, x, torch.roll(x, -1, 1))
    measured = gradient_by_distance(lstm.to(device), x.to(device), torch.roll(x, -1, 1).to(device))
    np.testing.assert_allclose(measured, expected, rtol=1e-4, atol=1e-7)


def test_the_gradient_by_distance_leaves_no_hook_on_the_model(random_tokens):
    # A hook left on the embedding would keep every later forward's output (and its graph) alive
    # while the lab trains the model it measured at initialisation.
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=24))
    x = random_tokens(batch=1, length=24)
    gradient_by_distance(model, x, torch.roll(x, -1, 1))
    assert not model.token_embedding._forward_hooks


def test_an_untied_head_is_measured_at_init_as_a_tied_one_in_the_lab_and_the_model_still_trains(tmp_path):
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.batch_size=2",
                                                          "train.eval_windows=2"])
    assert not config.model.tie_embeddings  # the main config's untied head, zero at init
    device = torch.device("cpu")
    contender = contenders_for(config, 1, device, select_precision("fp32", device))[0]
    tokens = np.random.default_rng(0).integers(0, 65, 600).astype(np.uint16)
    train_and_measure(contender, config, SimpleNamespace(train=tokens, validation=tokens), seconds=0.05,
                      folder=tmp_path, device=device, precision=select_precision("fp32", device))
    assert contender.gradient_at_init.shape == (32,) and np.all(contender.gradient_at_init > 0)
    assert contender.steps >= 1 and contender.position_losses.shape == (32,)
    assert (tmp_path / "attention").is_dir()


def test_the_loss_by_position_and_the_trained_gradients_read_the_trained_model_on_the_validation_split(
        tmp_path, monkeypatch):
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.batch_size=2",
                                                          "train.eval_windows=2"])
    device = torch.device("cpu")
    contender = contenders_for(config, 1, device, select_precision("fp32", device))[1]  # the lstm
    read, measured = [], []
    real_losses, real_gradients = recurrence.validation_loss_by_position, recurrence.gradient_by_distance
    monkeypatch.setattr(recurrence, "validation_loss_by_position", lambda model, tokens, *args: (
        read.append(tokens) or real_losses(model, tokens, *args)))
    monkeypatch.setattr(recurrence, "gradient_by_distance", lambda model, x, y: (
        measured.append({k: v.clone() for k, v in model.state_dict().items()}) or real_gradients(model, x, y)))
    rng = np.random.default_rng(0)
    train, validation = (rng.integers(0, 65, 600).astype(np.uint16) for _ in range(2))
    train_and_measure(contender, config, SimpleNamespace(train=train, validation=validation), seconds=0.05,
                      folder=tmp_path, device=device, precision=select_precision("fp32", device))
    assert len(read) == 1 and read[0] is validation
    initial = contender.build(32).state_dict()
    assert len(measured) == 2  # at initialisation, then trained
    assert all(torch.equal(measured[0][k], initial[k]) for k in initial)
    assert not all(torch.equal(measured[1][k], initial[k]) for k in initial)
    assert not np.array_equal(contender.gradient_trained, contender.gradient_at_init)


def test_the_trained_model_is_measured_on_the_eval_windows_in_its_precision_and_logged_at_its_step(
        tmp_path, monkeypatch, tensorboard_writer):
    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.batch_size=2",
                                                          "train.eval_windows=2"])
    device = torch.device("cpu")
    precision = select_precision("bf16", device)
    contender = contenders_for(config, 1, device, precision)[0]  # the attention model
    read, gradient_windows = [], []
    real_losses, real_gradients = recurrence.validation_loss_by_position, recurrence.gradient_by_distance
    monkeypatch.setattr(recurrence, "validation_loss_by_position", lambda model, tokens, *args: (
        read.append((args[-1], torch.is_autocast_enabled("cpu"))) or real_losses(model, tokens, *args)))
    monkeypatch.setattr(recurrence, "gradient_by_distance", lambda model, x, y: (
        gradient_windows.append(x) or real_gradients(model, x, y)))
    monkeypatch.setattr(recurrence, "tensorboard_writer", lambda folder, name: tensorboard_writer)
    rng = np.random.default_rng(0)
    train, validation = (rng.integers(0, 65, 600).astype(np.uint16) for _ in range(2))
    train_and_measure(contender, config, SimpleNamespace(train=train, validation=validation), seconds=0.05,
                      folder=tmp_path, device=device, precision=precision)
    assert read == [(2, True)]  # train.eval_windows, under the bf16 autocast the model trained in
    x, _ = next(recurrence.iter_validation(validation, 32, recurrence.GRADIENT_WINDOWS))
    assert len(gradient_windows) == 2 and all(torch.equal(windows, x) for windows in gradient_windows)
    logged = {}
    for tag, value, step in tensorboard_writer.scalars:
        logged.setdefault(tag, []).append((step, value))
    assert logged["val/loss"] == [(contender.steps, contender.val_loss)]
    assert logged["val/loss_after_seconds"] == [(round(contender.seconds), contender.val_loss)]
    assert [step for step, _ in logged["train/tokens_per_second"]] == [contender.steps]
    for name, norms in (("at_init", contender.gradient_at_init), ("trained", contender.gradient_trained)):
        assert logged[f"gradient_norm_by_distance/{name}"] == list(enumerate(norms)), name


# ----------------------------------------------------------------------------- the repeated-sequence probe


class InductionRule(nn.Module):
    """A hand-built copier: at each position, predict the token that followed the latest earlier
    occurrence of the current token (an induction head's rule), with logit 20, if that occurrence
    is at most `reach` tokens back; with
    copy=False (no such head) a fixed random bigram table: the logits depend on the current
    token alone, so both copies of a string get exactly the same loss."""

    def __init__(self, vocab_size: int, copy: bool = True, reach: int = 10**9):
        super().__init__()
        self.vocab_size, self.copy, self.reach = vocab_size, copy, reach  # reach: the farthest d copied
        self.bigram = nn.Parameter(torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(0)))

    def forward(self, idx: torch.Tensor) -> ModelOutput:
        if not self.copy:
            return ModelOutput(self.bigram.detach()[idx], None, None)  # (B, T, V)
        B, T = idx.shape
        logits = torch.zeros(B, T, self.vocab_size)
        for b in range(B):
            seen: dict[int, int] = {}  # token -> the position after its latest occurrence
            for t in range(T):
                token = int(idx[b, t])
                if token in seen and t - (seen[token] - 1) <= self.reach:
                    logits[b, t, int(idx[b, seen[token]])] = 20.0
                if t + 1 < T:
                    seen[token] = t + 1
        return ModelOutput(logits, None, None)


def probe(model, vocab_size=2000, length=8, distances=(0, 3, 10)):
    # The string draws from tokens 100..; the gap text from 0..99, so a copy is found only in the first copy.
    text = np.random.default_rng(2).integers(0, 100, size=500)
    return repeat_probe(model, string_tokens=np.arange(100, vocab_size), text=text, length=length,
                        distances=list(distances), rng=np.random.default_rng(1), samples=16)


def test_a_copying_model_predicts_the_second_copy_and_not_the_first_nor_the_fresh_string():
    rows = probe(InductionRule(2000))
    assert [row.gap for row in rows] == [0, 3, 10]
    for row in rows:
        assert row.first > 7.0 and row.fresh > 7.0  # random tokens: about ln(2000) = 7.6
        assert row.second < 0.1  # copied
        assert row.benefit > 7.0 and row.benefit > 10 * row.benefit_se


def test_the_probe_runs_without_dropout_and_keeps_the_models_mode():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=200, n_layer=1, n_head=2, n_embd=32, context_length=32,
                                      dropout=0.5))
    model.eval()
    evaluated = probe(model, vocab_size=200, length=4, distances=(0, 5))
    model.train()  # as in the middle of training
    assert probe(model, vocab_size=200, length=4, distances=(0, 5)) == evaluated
    assert model.training


def test_a_model_without_a_copying_head_shows_no_copy_benefit():
    for row in probe(InductionRule(2000, copy=False)):
        assert row.first > 7.0
        assert row.second == pytest.approx(row.first, abs=1e-5)
        assert abs(row.benefit) < 2 * row.benefit_se  # the fresh string costs what the copy does


def scored_sequences(monkeypatch, losses_of, start=()):
    """Run the probe (d = 0 and 5, 4 strings of 3, after `start`) on a stub scorer whose losses are
    `losses_of(sequences)`; returns the rows and the (2S, b + 2n + d) sequences of each d it scored."""
    scored = []

    def stub(model, x, y):
        sequences = torch.cat([x, y[:, -1:]], dim=1)
        scored.append(sequences)
        return losses_of(sequences)

    monkeypatch.setattr(distance, "token_losses", stub)
    rows = repeat_probe(nn.Linear(1, 1), string_tokens=np.arange(100, 2000), text=np.arange(50), length=3,
                        distances=[0, 5], rng=np.random.default_rng(1), samples=4, start=start)
    return rows, scored


def test_the_probes_control_is_a_fresh_string_of_the_same_length_where_the_second_copy_stands(monkeypatch):
    _, scored = scored_sequences(monkeypatch, lambda sequences: torch.zeros(sequences.shape[0],
                                                                            sequences.shape[1] - 1))
    for d, sequences in zip([0, 5], scored):
        copies, controls = sequences[:4], sequences[4:]
        assert sequences.shape == (8, 2 * 3 + d)
        assert torch.equal(copies[:, -3:], copies[:, :3])  # the copy: the first string again
        assert torch.equal(controls[:, :-3], copies[:, :-3])  # the same first string and gap
        assert (controls[:, -3:] >= 100).all()  # a string of the string tokens, not the gap text
        assert (controls[:, -3:] != copies[:, -3:]).any(dim=1).all()  # another string in each pair


def test_the_copy_benefit_is_the_mean_of_each_strings_fresh_minus_copy_with_its_paired_standard_error(
        monkeypatch):
    differences = torch.tensor([0.0, 2.0, 1.0, 5.0])  # string i's control costs this more per token

    def losses_of(sequences):  # (8, 2n + d) -> (8, 2n + d - 1), n = 3: the targets of tokens 2..n of
        losses = torch.full((8, sequences.shape[1] - 1), 1000.0)  # each string are its first 2 and last 2
        losses[:, :2] = 5.0
        losses[:4, -2:] = 2.0 + torch.arange(4.0)[:, None]  # the copies: string i loses 2 + i
        losses[4:, -2:] = 2.0 + torch.arange(4.0)[:, None] + differences[:, None]
        return losses

    rows, _ = scored_sequences(monkeypatch, losses_of)
    se = math.sqrt(sum((x - 2.0) ** 2 for x in [0.0, 2.0, 1.0, 5.0]) / 3) / 2  # std (ddof 1) / sqrt(4)
    for d, row in zip([0, 5], rows):
        assert (row.gap, row.first, row.second, row.fresh) == (d, 5.0, 3.5, 5.5)
        assert row.benefit == pytest.approx(2.0) and row.benefit_se == pytest.approx(se)


def test_each_gap_is_a_run_of_the_gap_text_from_any_start_the_text_holds(monkeypatch):
    # A gap text of 6 tokens holds a gap of 5 from two starts, 0 and 1: the draws take both.
    scored = []
    monkeypatch.setattr(distance, "token_losses",
                        lambda model, x, y: scored.append(x) or torch.zeros(x.shape[0], x.shape[1]))
    repeat_probe(nn.Linear(1, 1), string_tokens=np.arange(100, 2000), text=np.arange(6), length=3,
                 distances=[5], rng=np.random.default_rng(1), samples=32)
    gaps = scored[0][:, 3:8]  # (2S, 5): after the first string of 3
    assert {tuple(gap) for gap in gaps.tolist()} == {(0, 1, 2, 3, 4), (1, 2, 3, 4, 5)}


def test_after_a_start_token_each_strings_loss_is_read_at_its_own_positions(monkeypatch):
    # An imported folder's bos first: every target shifts by one; the bos's own prediction of the
    # first string's first token, like every token before a string's second, is in no mean.
    def losses_of(sequences):  # (8, 1 + 2n + d) -> (8, 2n + d), n = 3
        losses = torch.full((8, sequences.shape[1] - 1), 1000.0)
        losses[:, 1:3] = 5.0  # the first string's tokens 2..3 (targets 1 and 2)
        losses[:4, -2:] = 2.0  # the second copy's
        losses[4:, -2:] = 3.0  # the fresh string's
        return losses

    rows, scored = scored_sequences(monkeypatch, losses_of, start=(7,))
    assert all((sequences[:, 0] == 7).all() and sequences.shape[1] == 1 + 6 + d
               for d, sequences in zip([0, 5], scored))
    for row in rows:
        assert (row.first, row.second, row.fresh, row.benefit) == (5.0, 2.0, 3.0, 1.0)


def test_the_gaps_reach_the_largest_that_fits_the_context():
    gaps = gap_lengths(64, 8)
    assert gaps[0] == 0 and gaps[-1] == 64 + 1 - 2 * 8  # inputs 2 * 8 + 49 - 1 = 64
    assert gaps == sorted(set(gaps))
    # 0, the powers of 2 and every eighth of the way to the largest, 49: the curve is read at each
    assert gaps == [0, 1, 2, 4, 6, 8, 12, 16, 18, 24, 31, 32, 37, 43, 49]


# ----------------------------------------------------------------------------- key-value recall


def test_recall_batches_ask_for_the_pair_exactly_d_tokens_back():
    task = KeyValueRecall(pairs=6, batch_size=4, seed=0)
    x, y, distance = task.sample(np.random.default_rng(0), 5)
    assert x.shape == y.shape == (5, task.context_length)
    assert task.queries == 3
    queries = 2 * 6 + 2 * np.arange(3)
    assert (y[:, np.setdiff1d(np.arange(task.context_length), queries)] == IGNORE_INDEX).all()
    for n in range(5):
        assert len(set(x[n, :12:2].tolist())) == 6  # distinct keys
        assert len(set(x[n, queries].tolist())) == 3  # each asked once
        for q, d in zip(queries, distance[n]):
            assert x[n, q] == x[n, q - d]  # the key d tokens back is the query
            assert y[n, q] == x[n, q - d + 1]  # and the target is the value after it
    assert distance.min() >= 2


@pytest.mark.parametrize("reach, expected", [(10**9, [1.0, 1.0, 1.0]), (7, [1.0, 0.0, 0.0]),
                                             (15, [1.0, 1.0, 0.0])])
def test_recall_accuracy_is_the_share_of_queries_answered_in_each_bin_of_distance(reach, expected):
    # 8 pairs, 4 queries: d runs from 2 to 22, bins of 8. The copier answers a query exactly
    # when its key is at most `reach` back; beyond it every logit is 0 and argmax names a key.
    task = KeyValueRecall(pairs=8, batch_size=4, seed=0)
    starts, accuracy, counts = recall_accuracy(InductionRule(task.vocab_size, reach=reach), task, seed=3,
                                               sequences=64)
    assert list(starts) == [0, 8, 16]
    assert list(accuracy) == expected
    assert counts.sum() == 64 * task.queries


def test_each_recall_batch_is_a_fresh_draw_and_the_seed_repeats_the_draws():
    # The recall model trains on new sequences at every step, not on one batch over and over.
    first, again, other = (KeyValueRecall(pairs=4, batch_size=8, seed=seed) for seed in (0, 0, 1))
    batches = [first.next_batch() for _ in range(3)]
    assert not torch.equal(batches[0][0], batches[1][0]) and not torch.equal(batches[1][0], batches[2][0])
    for x, y in batches:
        repeated_x, repeated_y = again.next_batch()
        assert torch.equal(x, repeated_x) and torch.equal(y, repeated_y)
    assert not torch.equal(other.next_batch()[0], batches[0][0])


def test_the_recall_run_logs_every_tenth_loss_and_the_accuracy_by_distance_and_reports_its_last_loss(
        tmp_path, monkeypatch, tensorboard_writer):
    configs, real = [], distance.Trainer
    monkeypatch.setattr(distance, "Trainer", lambda model, optimizers, task, config, **kwargs: (
        configs.append(config) or real(model, optimizers, task, config, **kwargs)))
    monkeypatch.setattr(distance, "tensorboard_writer", lambda folder, part: tensorboard_writer)
    result = distance.train_recall(pairs=2, steps=20, seed=0, device=torch.device("cpu"),
                                   writer_folder=tmp_path)
    losses = [(step, value) for tag, value, step in tensorboard_writer.scalars if tag == "train/loss"]
    assert [step for step, _ in losses] == [10, 20]
    assert result.steps == 20 and result.final_loss == losses[-1][1] > 0  # the last step's loss
    accuracy = [(step, value) for tag, value, step in tensorboard_writer.scalars
                if tag == "recall_accuracy_by_distance"]
    assert accuracy == list(zip(result.distances, result.accuracy))  # at the first d of each bin
    assert (configs[0].max_steps, configs[0].warmup_steps) == (20, 4)  # warmup: a fifth of the steps


def test_ordinary_tokens_leave_out_end_of_text_and_the_unknown_token(char_tokenizer):
    # The random string draws from them. [UNK] (what the corpus never held: "é") reads as U+FFFD
    # in token_text, so it is told apart by its id.
    unknown = char_tokenizer.encode("é")[0]
    assert unknown != char_tokenizer.eot_id
    expected = [i for i in range(char_tokenizer.vocab_size) if i not in (unknown, char_tokenizer.eot_id)]
    assert list(ordinary_tokens(char_tokenizer)) == expected


# ----------------------------------------------------------------------------- the commands


@pytest.mark.slow
def test_lab_recurrence_writes_its_table_figure_and_tensorboard_runs(tmp_path, capsys):
    from tinyattn.cli.lab import main

    out = tmp_path / "lab out"  # a space: the TensorBoard command it prints must quote it
    # What it writes, not how well the models learn: a short training (at least a step) will do.
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--seconds", "0.1",
                 "--contexts", "8", "16", "--out", str(out), "--set", *local_text(tmp_path),
                 "train.batch_size=4", "train.eval_windows=4"]) == 0
    table, printed = (out / "recurrence.txt").read_text(), capsys.readouterr().out
    assert "training tokens/s" in table and "gradient norm" in table and table in printed + "\n"
    assert table.startswith(f"tinyattn lab recurrence: {ROOT / 'configs' / 'tiny.yaml'} "
                            f"({tmp_path / 'corpus.txt'}); ")
    assert f"(tensorboard --logdir '{out}')" in printed, printed
    assert (out / "recurrence.png").stat().st_size > 0
    assert any((out / "attention").iterdir()) and any((out / "lstm").iterdir())


def test_the_loss_comparisons_schedule_follows_the_speed_at_the_training_context(tmp_path, monkeypatch,
                                                                                 figure_unread):
    # --contexts without the training context (32 in tiny.yaml): the schedule must still span the
    # steps that fit, not the 10-step floor left when that speed was never measured.
    from tinyattn.cli.lab import main

    schedules = []
    real = recurrence.make_trainer
    monkeypatch.setattr(recurrence, "make_trainer", lambda model, train_config, *args, **kwargs: (
        schedules.append(train_config.max_steps) or real(model, train_config, *args, **kwargs)))
    # The schedule is fixed from --seconds before a contender trains; the training itself can be short.
    train_for = recurrence.train_for
    monkeypatch.setattr(recurrence, "train_for", lambda trainer, contender, seconds, writer:
                        train_for(trainer, contender, 0.05, writer))
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--seconds", "0.5",
                 "--contexts", "8", "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path),
                 "train.batch_size=4", "train.eval_windows=4"]) == 0
    assert min(schedules[-2:]) > 10  # the last two: the contenders' runs (the first, the speed's)


def test_every_context_is_timed_at_the_training_batch_of_tokens(tmp_path, monkeypatch):
    # The table's header promises batch_size x context_length tokens per step (4 x 32 in tiny.yaml).
    from tinyattn.cli.lab import main
    from tinyattn.errors import TinyattnError

    def reached(*args, **kwargs):
        raise TinyattnError("reached the training")

    timed = []
    monkeypatch.setattr(recurrence, "tokens_per_second", lambda contender, train_config, tokens, **kwargs: (
        timed.append((contender.name, kwargs["context"], kwargs["tokens_per_step"])) or 1000.0))
    monkeypatch.setattr(recurrence, "train_and_measure", reached)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--contexts", "8", "64",
                 "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path)]) == 2
    assert timed == [(name, context, 128) for name in ("attention", "lstm") for context in (8, 64, 32)]


@pytest.mark.parametrize("flag, values, shown", [("--contexts", ["64", "0"], "0"), ("--seconds", ["-1"], "-1"),
                                                 ("--seconds", ["nan"], "nan"), ("--seconds", ["inf"], "inf"),
                                                 ("--seconds", ["0"], "0"), ("--lstm-layers", ["0"], "0")])
def test_lab_recurrence_names_the_value_it_refuses_in_one_line(tmp_path, capsys, flag, values, shown):
    # nan and inf ended in a traceback from the schedule's int(seconds * speed ...), after the speed table.
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), flag, *values,
                 "--out", str(out)]) == 2
    accepted = "a positive, finite number of seconds" if flag == "--seconds" else "a positive integer"
    assert capsys.readouterr().err == f"error: {flag} {shown}: expected {accepted}\n"
    assert not out.exists()


def test_lab_recurrence_refuses_a_bidirectional_attention_model_in_one_line_before_anything_runs(
        tmp_path, monkeypatch, capsys):
    # model.causal false reads the token it predicts: its loss beside the LSTM's was that of the leaked
    # answer, printed as attention's win, where every command that scores predictions refuses it.
    from tinyattn.cli.lab import main

    monkeypatch.setattr(recurrence, "tokens_per_second", lambda *args, **kwargs: pytest.fail("timed"))
    out = tmp_path / "out"
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(out), "--set",
                 "model.causal=false", *local_text(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model.causal false: ") and "expected true" in err, err
    assert err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("speed, steps, warmup", [(1e4, 39, 7), (10.0, 10, 2)])
def test_the_schedule_is_the_steps_the_training_contexts_speed_fits_in_the_seconds(
        tmp_path, monkeypatch, speed, steps, warmup):
    # 0.5 s at 10,000 tokens/s (context 32, tiny.yaml's) in steps of 4 x 32 tokens: 39 steps, whatever
    # the other contexts' speeds (64 is far slower, 8 far faster); at 10 tokens/s none fits: the floor
    # of 10. The config's warmup of 20 steps is cut to a fifth of the schedule.
    from tinyattn.cli.lab import main
    from tinyattn.errors import TinyattnError

    def scheduled(model, train_config, *args, **kwargs):
        schedules.append((train_config.max_steps, train_config.warmup_steps))
        raise TinyattnError("reached the training")

    schedules, speeds = [], {8: 1e5, 64: 10.0, 32: speed}
    monkeypatch.setattr(recurrence, "tokens_per_second", lambda contender, train_config, tokens, **kwargs:
                        speeds[kwargs["context"]])
    monkeypatch.setattr(recurrence, "make_trainer", scheduled)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--seconds", "0.5",
                 "--contexts", "8", "64", "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path),
                 "train.warmup_steps=20"]) == 2
    assert schedules == [(steps, warmup)]


@pytest.mark.slow
def test_lab_distance_writes_its_table_and_figure(trained_run, tmp_path):
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    assert main(["distance", "--checkpoint", str(trained_run.run_dir), "--recall-steps", "3", "--pairs", "4",
                 "--string-length", "3", "--out", str(out)]) == 0
    table = (out / "distance.txt").read_text()
    assert "first copy" in table and "recall" in table
    assert "\npooled over the 14 gaps: mean benefit " in table  # context 32 less two strings of 3: d 0..27
    assert (out / "distance.png").stat().st_size > 0 and any((out / "key_value").iterdir())


@pytest.mark.parametrize("given_out", [True, False], ids=["out", "new-folder"])
def test_a_lab_stopped_by_ctrl_c_says_what_its_folder_holds_and_how_to_run_it_again(
        trained_run, tmp_path, monkeypatch, capsys, given_out):
    # It said "interrupted" alone, and a rerun into that --out was refused until --force.
    from tinyattn.cli.lab import main

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recurrence, "train_and_measure", stop)
    monkeypatch.setattr(distance, "train_recall", stop)
    labs = {"recurrence": ["--config", str(ROOT / "configs" / "tiny.yaml"), "--seconds", "0.5", "--contexts",
                           "8", "--set", *local_text(tmp_path), "train.batch_size=4"],
            "distance": ["--checkpoint", str(trained_run.run_dir), "--pairs", "4", "--string-length", "3"]}
    for lab, arguments in labs.items():
        out = tmp_path / f"{lab} out"
        assert main([lab, *arguments, *(["--out", str(out)] if given_out else [])]) == 130
        if not given_out:
            [out] = Path("checkpoints", "lab").glob(f"{lab}-*")  # as the user's folder names it
        again = (f"run it again with --out '{out}' --force to start over" if given_out
                 else "run it again to start over in a new folder")
        last = capsys.readouterr().err.splitlines()[-1]
        assert last == f"lab {lab} stopped before its table; {out} holds what it measured so far; {again}"


def test_a_lab_stopped_by_sigterm_says_what_its_folder_holds_as_after_ctrl_c(trained_run, tmp_path,
                                                                              monkeypatch, capsys):
    # SIGTERM ended the lab at once: status 143, nothing said, the lines printed so far lost.
    import os
    import signal

    from tinyattn.cli.lab import main

    def unhandled(signum, frame):
        raise AssertionError("the lab left SIGTERM to its default: the process would end silently")

    monkeypatch.setattr(distance, "train_recall",
                        lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        out = tmp_path / "out"
        assert main(["distance", "--checkpoint", str(trained_run.run_dir), "--pairs", "4",
                     "--string-length", "3", "--out", str(out)]) == 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"lab distance stopped before its table; {out} holds what it measured so far; "
        f"run it again with --out {out} --force to start over")


@pytest.mark.parametrize("flag, value", [("--seed", "-1"), ("--seed", str(2**64)), ("--seed", str(2**63)),
                                         ("--pairs", "1"), ("--string-length", "0"), ("--string-length", "1"),
                                         ("--recall-steps", "0")])
def test_lab_distance_names_the_value_it_refuses_in_one_line(tmp_path, capsys, flag, value):
    from tinyattn.cli.lab import main

    assert main(["distance", "--checkpoint", str(tmp_path / "nowhere"), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {value}: expected an integer >= ") and err.count("\n") == 1, err


@pytest.mark.parametrize("context, message", [
    (2, "--string-length 2: two copies must fit the context of 2 tokens (as inputs: the last token is only "
        "predicted); the probe needs a context of at least 3, and this model's holds no string of 2 tokens, "
        "the fewest --string-length takes"),
    (5, "--string-length 4: two copies must fit the context of 5 tokens (as inputs: the last token is only "
        "predicted); give at most 3"),
], ids=["too-short-for-any", "too-long-for-this"])
def test_lab_distance_refuses_a_string_that_does_not_fit_with_advice_it_accepts(
        tmp_path, monkeypatch, capsys, char_tokenizer, tiny_model, context, message):
    # A context of 2 fits no string of 2 tokens (2 + 2 - 1 inputs): the advice was "give at most 1",
    # which --string-length itself refuses (it takes 2 or more).
    from tinyattn.cli.lab import main
    from tinyattn.config import Config

    config = Config(model=ModelConfig(vocab_size=char_tokenizer.vocab_size, context_length=context))
    loaded = SimpleNamespace(model=tiny_model(vocab_size=char_tokenizer.vocab_size, context_length=context),
                             tokenizer=char_tokenizer, config=config, label="tiny", path="tiny")
    monkeypatch.setattr(distance, "load_any_model", lambda *args: loaded)
    text = tmp_path / "gap.txt"
    text.write_text("ROMEO: But soft, what light through yonder window breaks?", encoding="utf-8")
    out = tmp_path / "out"
    length = "2" if context == 2 else "4"
    assert main(["distance", "--checkpoint", "tiny", "--text", str(text), "--string-length", length,
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not out.exists()


def test_lab_distance_takes_each_count_at_its_least_and_the_largest_seed(tmp_path, capsys):
    # Every count at the least it accepts, and the seed at both ends: only the missing checkpoint is refused.
    from tinyattn.cli.lab import main

    nowhere = str(tmp_path / "nowhere")
    for seed in ("0", str(2**63 - 1)):
        assert main(["distance", "--checkpoint", nowhere, "--string-length", "2", "--pairs", "2",
                     "--recall-steps", "1", "--seed", seed]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {nowhere}") and err.count("\n") == 1, err


def test_the_labs_defaults_are_the_ones_their_help_and_docs_give():
    from tinyattn.cli.lab import parser

    recurrence_args = parser().parse_args(["recurrence"])
    assert (recurrence_args.precision, recurrence_args.lstm_layers, recurrence_args.seconds,
            recurrence_args.contexts) == ("fp32", 2, 40.0, [64, 256, 1024])
    distance_args = parser().parse_args(["distance"])
    assert (distance_args.string_length, distance_args.recall_steps, distance_args.pairs, distance_args.seed,
            distance_args.device) == (8, 1500, 8, 1337, None)


def test_lab_recurrence_measures_in_the_precision_asked_not_the_configs(tmp_path, monkeypatch):
    # tiny.yaml trains in fp32; --precision bf16 is what both models are timed and trained in.
    from tinyattn.cli.lab import main

    def timed(contender, train_config, tokens, *, precision, **kwargs):
        used.append(precision.name)
        raise TinyattnError("reached the timing")

    used = []
    monkeypatch.setattr(recurrence, "tokens_per_second", timed)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--precision", "bf16",
                 "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path)]) == 2
    assert used == ["bf16"]


def test_lab_recurrence_runs_on_the_device_asked_not_the_configs(tmp_path, monkeypatch):
    from tinyattn.cli.lab import main

    asked = []

    def select_device(name):
        asked.append(name)
        raise TinyattnError("reached the device")

    monkeypatch.setattr(recurrence, "select_device", select_device)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--device", "cuda:3",
                 "--out", str(tmp_path / "out")]) == 2
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.device=mps",
                 "--out", str(tmp_path / "out")]) == 2
    assert asked == ["cuda:3", "mps"]


@pytest.mark.parametrize("fit, pairs", [(2, 3), (2, 8), (5, 6), (5, 40), (999, 1000)])
def test_pairs_that_cannot_fit_name_exactly_the_most_that_can(monkeypatch, fit, pairs):
    limit = distance.recall_bytes(fit)  # `fit` pairs fit exactly, one more does not
    monkeypatch.setattr(distance, "available_bytes", lambda device: (limit, "of memory available here"))
    with pytest.raises(TinyattnError, match=rf"; give at most --pairs {fit}$"):
        distance.check_recall_fits(pairs, torch.device("cpu"))


@pytest.mark.parametrize("lab, refused", [("distance", ["--seed", "-1"]), ("recurrence", ["--seconds", "0"])])
def test_threads_are_set_before_a_lab_checks_its_other_options(lab, refused, tmp_path):
    from tinyattn.cli.lab import main

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        config = ["--config", str(ROOT / "configs" / "tiny.yaml")] if lab == "recurrence" else []
        assert main([lab, *config, "--threads", "1", *refused, "--out", str(tmp_path / "out")]) == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_pairs_of_which_not_even_two_fit_advise_freeing_memory_not_a_pairs_that_is_refused(monkeypatch):
    limit = distance.recall_bytes(1)  # one pair fits, and the recall needs at least two
    monkeypatch.setattr(distance, "available_bytes", lambda device: (limit, "of memory available here"))
    with pytest.raises(TinyattnError, match=r"more than the .* of memory available here; free some memory$"):
        distance.check_recall_fits(8, torch.device("cpu"))


def test_lab_distance_refuses_pairs_that_cannot_fit_naming_the_most_that_can_before_loading_anything(
        tmp_path, monkeypatch, capsys):
    from tinyattn.cli.lab import main

    limit = distance.recall_bytes(1000)  # 1,000 pairs fit exactly; 1,001 do not
    assert distance.recall_bytes(1001) > limit
    monkeypatch.setattr(distance, "available_bytes", lambda device: (limit, "of memory available here"))
    distance.check_recall_fits(1000, torch.device("cpu"))
    assert main(["distance", "--checkpoint", str(tmp_path / "nowhere"), "--pairs", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --pairs 100000: the key-value recall needs at least 184,319.4 GB ") and \
        err.endswith("more than the 18.4 GB of memory available here; give at most --pairs 1000\n"), err
    assert err.count("\n") == 1  # the checkpoint (there is none) is not read first


def test_the_distance_table_shows_each_strings_loss_and_the_copy_benefit_and_the_recall_by_distance():
    recall = RecallResult(np.array([0, 8]), np.array([0.75, 0.125]), np.array([40, 24]), steps=3, seconds=1.0,
                          parameters=1000, final_loss=1.5, pairs=8)
    text = distance.report([ProbeRow(4, 7.5, 0.25, 7.75, 7.5, 0.125)], recall, "run", "cpu",
                           argparse.Namespace(string_length=8, pairs=8), wall=2.0)
    lines = text.splitlines()
    assert lines[4].split() == ["d", "first", "copy", "second", "copy", "fresh", "string", "benefit", "SE",
                                "z"]
    assert lines[5].split() == ["4", "7.500", "0.250", "7.750", "7.500", "0.125", "60.00", "*"]
    assert lines[6].startswith("pooled over the 1 gaps: mean benefit 7.500, SE 0.125")
    assert [line.split() for line in lines[10:12]] == [["0-7", "0.750", "40"], ["8-15", "0.125", "24"]]
    assert "(chance 0.125)" in lines[8]  # one value of the 8 pairs'
    assert "key-value recall: 8 pairs then 4 queries" in lines[8]


def probe_rows(benefits, errors):
    return [ProbeRow(d, 8.0, 8.0, 8.0, benefit, se) for d, (benefit, se) in enumerate(zip(benefits, errors))]


def test_the_pooled_benefit_is_the_mean_over_the_gaps_and_its_error_adds_their_independent_variances():
    # Each d draws its own strings, gap texts and fresh strings: the gaps' estimates are independent,
    # so the variance of their mean is the sum of theirs over G squared.
    pooled = distance.pooled_benefit(probe_rows([0.1, 0.3, -0.1, 0.5], [0.3, 0.4, 0.0, 1.2]))
    assert pooled.gaps == 4 and pooled.mean == pytest.approx(0.2)
    assert pooled.se == pytest.approx(math.sqrt(0.09 + 0.16 + 0.0 + 1.44) / 4)  # 1.3 / 4 = 0.325
    assert pooled.z == pytest.approx(0.2 / 0.325)
    # 15 gaps of SE 0.2: the mean's SE is 0.2 / sqrt(15), a quarter of any one gap's
    pooled = distance.pooled_benefit(probe_rows([0.0] * 15, [0.2] * 15))
    assert pooled.se == pytest.approx(0.2 / math.sqrt(15))


def test_the_per_gap_threshold_is_the_normal_quantile_corrected_for_the_number_of_gaps():
    from statistics import NormalDist

    assert distance.gap_threshold(1) == pytest.approx(1.960, abs=5e-4)  # one test at 5%, two-sided
    assert distance.gap_threshold(15) == pytest.approx(2.935, abs=5e-4)  # about 3 SE for lab_main's 15 gaps
    for gaps in (1, 7, 15, 40):  # noise alone marks any of `gaps` gaps with a chance of at most 5%
        assert gaps * 2 * (1 - NormalDist().cdf(distance.gap_threshold(gaps))) == pytest.approx(0.05)


@pytest.mark.parametrize("benefits, ending", [
    ([0.3] * 15, "measurable use of the copy, on average over d (beyond 1.96 SE of 0)"),
    ([-0.3] * 15, "the second copy costs measurably more than a fresh string, on average over d "
                  "(beyond 1.96 SE of 0)"),
    ([0.0] * 14 + [-0.7], "no measurable use of the copy, on average over d (within 1.96 SE of 0)"),
], ids=["use", "cost", "none"])
def test_the_verdict_rests_on_the_pooled_test_not_on_any_one_gap(benefits, ending):
    # SE 0.2 per gap, pooled 0.052: a mean of 0.3 is z 5.8; one gap at -0.7 (3.5 SE, marked) among
    # 14 at zero is a mean of -0.047, z -0.9: no verdict of use or cost from one gap.
    lines = distance.probe_lines(probe_rows(benefits, [0.2] * 15), 8)
    assert lines[-1].startswith("pooled over the 15 gaps: mean benefit ")
    assert lines[-1].endswith(ending), lines[-1]
    assert "1 gap in 20 lands beyond 2 SE of 0: * marks a gap beyond 2.94 SE (the 5% threshold corrected " \
           "for 15 gaps, Bonferroni)" in lines[1]


def test_a_gap_is_marked_only_beyond_the_corrected_threshold():
    # 2.5 SE, as d = 37 once gave on a real model: beyond 2 SE, within 2.94, so not marked among 15 gaps.
    rows = probe_rows([0.0] * 13 + [-0.5, 0.7], [0.2] * 15)
    table = distance.probe_lines(rows, 8)[3:-1]
    assert [row.split()[6:] for row in table[-2:]] == [["-2.50"], ["3.50", "*"]]
    assert sum(row.endswith("*") for row in table) == 1


def test_a_probe_without_a_standard_error_gives_no_verdict():
    lines = distance.probe_lines(probe_rows([0.5, 0.1], [float("nan")] * 2), 8)
    assert lines[-1].endswith("no verdict (a standard error needs two strings per d)")
    assert distance.pooled_benefit(probe_rows([0.0, 0.0], [0.0, 0.0])).z == 0.0  # no spread, no benefit


@pytest.mark.parametrize("context, rows", [(1, [0]), (2, [0, 1]), (3, [0, 1, 2]),
                                           (16, [0, 1, 2, 4, 8, 15]), (17, [0, 1, 2, 4, 8, 16]),
                                           (33, [0, 1, 2, 4, 8, 16, 32])])
def test_the_distance_rows_double_to_the_farthest_and_show_it_once(context, rows):
    assert recurrence.distance_rows(context) == rows


def test_the_recurrence_table_gives_each_models_gradient_at_init_and_trained_to_the_farthest_k():
    config = load_config(ROOT / "configs" / "tiny.yaml")
    T = config.model.context_length

    def contender(name, scale):
        return Contender(name, "shape", lambda t: None, speed={8: 100.0 * scale, 16: 50.0 * scale}, steps=5, seconds=1.0,
                         gradient_at_init=np.full(T, 1.0 * scale), gradient_trained=np.full(T, 10.0 * scale),
                         position_losses=np.full(T, 2.0), parameters=1000)

    args = argparse.Namespace(config="tiny.yaml", contexts=[8, 16], seconds=1.0)
    text = recurrence.report([contender("attention", 1), contender("lstm", 2)], config, args, "cpu", wall=1.0)
    rows = {int(line.split()[0]): [float(v) for v in line.split()[1:]]
            for line in text.split("gradient norm", 1)[1].splitlines()[2:] if line.strip()[:1].isdigit()}
    assert sorted(rows) == [0, 1, 2, 4, 8, 16, T - 1]  # doubling, and the farthest
    assert rows[T - 1] == [1.0, 2.0, 10.0, 20.0]  # attn init, lstm init, attn trained, lstm trained
    speeds = text.split("training tokens/s", 1)[1].splitlines()[2:4]
    assert speeds[0].split() == ["8", "100", "200", "2.00"]  # lstm/attn: the lstm's speed over attention's
    assert speeds[1].split() == ["16", "50", "100", "2.00"]  # a row for each of --contexts


def speed_table(contexts):
    """The speed rows of a report over tiny.yaml (4 x 32 = 128 tokens a training step) at `contexts`."""
    config = load_config(ROOT / "configs" / "tiny.yaml")
    T = config.model.context_length
    attn, lstm = (Contender(name, "shape", lambda t: None, speed={c: 1000.0 for c in contexts}, steps=5,
                            seconds=1.0, gradient_at_init=np.ones(T), gradient_trained=np.ones(T),
                            position_losses=np.full(T, 2.0), parameters=1000) for name in ("attention", "lstm"))
    args = argparse.Namespace(config="tiny.yaml", contexts=contexts, seconds=1.0)
    text = recurrence.report([attn, lstm], config, args, "cpu", wall=1.0)
    return text.split("\n\ntraining tokens/s", 1)[1].split("\n\n", 1)[0].splitlines()


@pytest.mark.parametrize("contexts, title", [
    ([8, 16, 32], " (128 tokens per step, median of 3 steps)"),  # 16, 8 and 4 windows
    ([48], " (96 tokens per step, median of 3 steps)"),  # 2 whole windows of 48 fit 128
], ids=["same", "fewer"])
def test_the_speed_table_says_the_tokens_every_context_steps(contexts, title):
    table = speed_table(contexts)
    assert table[0] == title
    assert table[1].split() == ["context", "attention", "lstm", "lstm/attn"]


def test_a_context_longer_than_the_training_step_is_labelled_with_the_one_window_it_steps():
    # --contexts 8192 with 2048 tokens a step timed 8192 (batch 1) under a "2048 tokens per step" title.
    table = speed_table([8, 256, 1024])
    assert "each context steps as many whole windows as fit the training step's 128 tokens" in table[0]
    assert "128 tokens per step" not in table[0]
    assert table[1].split() == ["context", "tokens/step", "attention", "lstm", "lstm/attn"]
    assert [row.split()[:2] for row in table[2:]] == [["8", "128"], ["256", "256"], ["1024", "1024"]]


def test_the_tokens_a_context_steps_are_the_ones_its_speed_is_measured_on(monkeypatch):
    config, device, precision, tokens = _timed_setup(monkeypatch, lambda step, **kwargs: [1.0, 1.0, 1.0])
    contender = contenders_for(config, 1, device, precision)[0]
    # 100 tokens a step: 4 whole windows of 24 (96 tokens, not 100); one of 150, more than 100
    for context, stepped in ((24, 96), (150, 150)):
        assert recurrence.speed_batch(100, context) * context == stepped  # what the table's label says
        assert recurrence.tokens_per_second(contender, config.train, tokens, context=context,
                                            tokens_per_step=100, device=device, precision=precision) == stepped


def test_the_recurrence_report_gives_the_parameter_ratio_and_each_models_loss_over_all_windows():
    config = load_config(ROOT / "configs" / "tiny.yaml", ["train.eval_windows=null"])
    T = config.model.context_length

    def contender(name, parameters, loss):
        return Contender(name, "shape", lambda t: None, speed={8: 100.0}, steps=5, seconds=1.0,
                         gradient_at_init=np.ones(T), gradient_trained=np.ones(T),
                         position_losses=np.full(T, loss), parameters=parameters)

    args = argparse.Namespace(config="tiny.yaml", contexts=[8], seconds=1.0)
    text = recurrence.report([contender("attention", 1000, 2.5), contender("lstm", 1250, 3.25)], config, args,
                             "cpu", wall=1.0)
    assert "parameters (shape); ratio 1.250\n" in text  # the lstm's over the attention model's
    assert "validation loss after 1 s of training each (context 32, all windows)\n" in text
    assert " attention: 2.500 after 5 steps" in text and "      lstm: 3.250 after 5 steps" in text


def test_the_recurrence_and_distance_reports_count_steps_as_a_runs_lines_do_one_step_and_thousands():
    # "after 1 steps", "trained 1500 steps": errors.counted's "1 step" and "1,500 steps" (274efcb)
    config = load_config(ROOT / "configs" / "tiny.yaml", ["train.eval_windows=null"])
    T = config.model.context_length

    def contender(name, steps):
        return Contender(name, "shape", lambda t: None, speed={8: 100.0}, steps=steps, seconds=1.0,
                         gradient_at_init=np.ones(T), gradient_trained=np.ones(T),
                         position_losses=np.full(T, 2.5), parameters=1000)

    args = argparse.Namespace(config="tiny.yaml", contexts=[8], seconds=1.0)
    text = recurrence.report([contender("attention", 1), contender("lstm", 1500)], config, args, "cpu",
                             wall=1.0)
    assert " attention: 2.500 after 1 step in " in text and "      lstm: 2.500 after 1,500 steps in " in text
    for steps, said in ((1, "trained 1 step in "), (1500, "trained 1,500 steps in ")):
        recall = RecallResult(np.array([0, 8]), np.array([0.75, 0.125]), np.array([40, 24]), steps=steps,
                              seconds=1.0, parameters=1000, final_loss=1.5, pairs=8)
        text = distance.report([ProbeRow(4, 7.5, 0.25, 7.75, 7.5, 0.125)], recall, "run", "cpu",
                               argparse.Namespace(string_length=8, pairs=8), wall=2.0)
        assert said in text, text


def test_the_recurrence_figure_draws_loss_by_tokens_read_and_each_models_gradients_trained_and_at_init(
        tmp_path, figures_unrendered):
    def contender(name, scale):
        return Contender(name, "shape", lambda t: None, speed={8: 100.0 * scale, 32: 50.0 * scale},
                         curve=[(0.5, 4.0 * scale), (1.0, 3.0 * scale)],
                         position_losses=np.array([3.0, 2.0, 1.0]) * scale,
                         gradient_at_init=np.array([1.0, 0.5, 0.25]) * scale,
                         gradient_trained=np.array([2.0, 1.0, 0.5]) * scale)

    recurrence.save_figure([contender("attention", 1), contender("lstm", 2)], tmp_path / "recurrence.png",
                           contexts=[8, 32])
    speed, curve, position, gradient = (lines_by_label(axes) for axes in figures_unrendered[0].axes)
    assert speed["lstm"] == ([8, 32], [200.0, 100.0])
    assert curve["lstm (val 4.000)"] == ([0.5, 1.0], [8.0, 6.0])  # against wall seconds
    assert position["attention"] == ([1, 2, 3], [3.0, 2.0, 1.0])  # position p has read p + 1 tokens
    assert gradient["lstm, trained"] == ([0, 1, 2], [4.0, 2.0, 1.0])
    assert gradient["lstm, at init"] == ([0, 1, 2], [2.0, 1.0, 0.5])


def test_the_distance_figure_draws_each_strings_loss_by_gap_and_the_recall_at_each_bins_middle_over_chance(
        tmp_path, figures_unrendered):
    probe = [ProbeRow(0, 7.5, 0.25, 7.75, 7.5, 0.1), ProbeRow(4, 7.25, 1.5, 7.5, 6.0, 0.2)]
    recall = RecallResult(np.array([0, 8]), np.array([0.75, 0.125]), np.array([40, 24]), steps=3, seconds=1.0,
                          parameters=1000, final_loss=1.5, pairs=8)
    distance.save_figure(probe, recall, tmp_path / "distance.png", length=3)
    left, right = (lines_by_label(axes) for axes in figures_unrendered[0].axes)
    assert left["first copy (random)"] == ([0, 4], [7.5, 7.25])
    assert left["second copy (seen d tokens before)"] == ([0, 4], [0.25, 1.5])
    assert left["fresh string there instead (control)"] == ([0, 4], [7.75, 7.5])
    assert right["trained model"] == ([4.0, 12.0], [0.75, 0.125])  # bins 0-7 and 8-15 at their middles
    assert right["chance"][1] == [0.125, 0.125]  # one in 8 pairs


@pytest.mark.parametrize("lab, written, next_step", [
    ("recurrence", "attention", "experiment_folder"), ("recurrence", "lstm", "experiment_folder"),
    ("distance", "key_value", "repeat_probe")])
def test_an_out_holding_an_earlier_runs_output_is_refused_and_force_clears_only_it(
        tmp_path, monkeypatch, capsys, trained_run, lab, written, next_step):
    # A rerun's TensorBoard events beside the earlier run's drew one zig-zag curve from both.
    from tinyattn.cli.lab import main
    from tinyattn.errors import TinyattnError

    def reached(*args, **kwargs):
        raise TinyattnError("reached the work")

    module = recurrence if lab == "recurrence" else distance
    monkeypatch.setattr(module, next_step, reached)  # what comes right after the check
    out = tmp_path / "out"
    (out / written).mkdir(parents=True)
    (out / written / "events.out.tfevents.1").write_bytes(b"earlier run")
    (out / f"{lab}.txt").write_text("earlier table")
    (out / "notes.txt").write_text("the user's own")
    command = ([lab, "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", *local_text(tmp_path)]
               if lab == "recurrence" else [lab, "--checkpoint", str(trained_run.run_dir)])
    if lab == "distance":  # a mistake with --force: refused before anything earlier is removed
        assert main([*command, "--string-length", "40", "--out", str(out), "--force"]) == 2
        assert "--string-length 40: two copies must fit" in capsys.readouterr().err
        assert (out / written / "events.out.tfevents.1").exists()
    assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {out} holds {lab}.txt, {written}, which this lab writes; add --force to replace "
                   "them or choose another --out\n"), err
    assert (out / written / "events.out.tfevents.1").exists()
    assert main([*command, "--out", str(out), "--force"]) == 2
    assert capsys.readouterr().err == "error: reached the work\n"
    assert sorted(path.name for path in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("given", ["text", "validation"])
def test_a_gap_text_too_short_for_the_probe_is_refused_in_one_line_before_force_clears_anything(
        trained_run, tmp_path, monkeypatch, capsys, given):
    # --force cleared the earlier output, then repeat_probe refused the text naming neither --text
    # nor the file.
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "distance.txt").write_text("earlier table")
    command = ["distance", "--checkpoint", str(trained_run.run_dir), "--string-length", "3",
               "--out", str(out), "--force"]
    short = tmp_path / "short.txt"
    short.write_text("To be, or not", encoding="utf-8")  # 13 tokens of the character tokenizer
    if given == "text":
        command += ["--text", str(short)]
        where, advice = f"--text {short}", "give a longer text"
    else:  # a checkpoint whose validation split is that short
        monkeypatch.setattr(distance, "gap_text", lambda path, loaded: np.arange(13))
        where, advice = "the validation split of the checkpoint's data", "give a longer text with --text FILE"
    assert main(command) == 2
    # The context of 32 less two strings of 3 leaves gaps up to 27 tokens, which need 28 to draw from.
    assert capsys.readouterr().err == f"error: {where}: 13 tokens; the probe needs at least 28 ({advice})\n"
    assert (out / "distance.txt").read_text() == "earlier table"

def test_a_gap_text_of_exactly_the_tokens_the_probe_needs_is_taken():
    distance.check_gap_text(np.arange(28), 28, "gap.txt")  # the longest gap, 27, and one more
    with pytest.raises(TinyattnError, match=r"^--text gap.txt: 27 tokens; the probe needs at least 28 "):
        distance.check_gap_text(np.arange(27), 28, "gap.txt")


def test_a_gap_text_with_characters_the_tokenizer_never_saw_names_them_as_the_other_commands_do(
        tmp_path, capsys, char_tokenizer):
    # The gap would hold [UNK] where the file has text: said in one warning line, as generate's prompt,
    # eval --text-file, attention --text and the other labs' texts are.
    text = tmp_path / "gap.txt"
    text.write_text("They are at the caf\u00e9.", encoding="utf-8")
    loaded = SimpleNamespace(tokenizer=char_tokenizer)
    ids = distance.gap_text(str(text), loaded)
    assert char_tokenizer.unknown_id in ids.tolist()
    assert capsys.readouterr().err == (f"warning: --text {text}: 1 character the tokenizer has never seen, "
                                       "read as [UNK]: '\u00e9'\n")


def test_a_gap_text_the_tokenizer_reads_whole_warns_of_nothing(tmp_path, capsys, char_tokenizer):
    text = tmp_path / "gap.txt"
    text.write_text("the cat sat on the mat", encoding="utf-8")
    distance.gap_text(str(text), SimpleNamespace(tokenizer=char_tokenizer))
    assert capsys.readouterr().err == ""


def test_the_gap_text_is_the_checkpoints_validation_split_only_under_its_own_tokenizer(monkeypatch,
                                                                                    char_tokenizer):
    # Another tokenizer's ids would be read as other tokens: the gap would be noise, not text.
    from tinyattn.config import Config, DataConfig, TokenizerConfig
    from tinyattn.data.tokenizer import build_tokenizer

    other = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["0123456789 abc"]))
    config = Config(data=DataConfig(files=["corpus.txt"]))  # a run's data section (stubbed below)
    loaded = SimpleNamespace(tokenizer=char_tokenizer, config=config, start_folder=None)
    validation = np.arange(40, dtype=np.uint16)
    for tokenizer in (char_tokenizer, other):
        monkeypatch.setattr(distance, "prepare_data", lambda config, progress: SimpleNamespace(
            tokenizer=tokenizer, validation=validation, cache_dir="data/cache"))
        if tokenizer is char_tokenizer:
            np.testing.assert_array_equal(distance.gap_text(None, loaded), validation)
        else:
            with pytest.raises(TinyattnError, match=r"^data/cache: the data's tokenizer is not the checkpoint's; "
                                                    r"give --text FILE$"):
                distance.gap_text(None, loaded)


def test_the_gap_text_of_a_run_scored_from_another_folder_is_its_validation_split_where_it_started(
        shakespeare_head, tmp_path, monkeypatch, capsys):
    # Read from the folder run from, the run's relative data.files would be missing there
    from tinyattn.checkpoint import load_model
    from tinyattn.data.batches import prepare_data

    start, items = run_started_in(shakespeare_head, tmp_path, monkeypatch)
    validation = np.asarray(prepare_data(load_config(ROOT / "configs" / "tiny.yaml", items)).validation)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    np.testing.assert_array_equal(distance.gap_text(None, load_model(tmp_path / "runs" / "run")), validation)
    assert f"note: data.files and data.cache_dir read from {start}" in capsys.readouterr().err


def test_lab_distance_takes_the_longest_strings_whose_two_copies_fit_as_inputs(trained_run, monkeypatch, capsys):
    # Two copies of n with no gap are 2n tokens, of which the model reads 2n - 1: n = (context + 1) // 2.
    from tinyattn.cli.lab import main
    from tinyattn.errors import TinyattnError

    import dataclasses

    context = 33  # odd: (33 + 1) // 2 = 17 strings fit, where 2n <= context would allow only 16
    longest = (context + 1) // 2
    load = distance.load_any_model

    def load_with_an_odd_context(*args, **kwargs):
        loaded = load(*args, **kwargs)
        loaded.model.config = dataclasses.replace(loaded.model.config, context_length=context)
        return loaded

    def reached(*args, **kwargs):
        raise TinyattnError("reached the probe")

    monkeypatch.setattr(distance, "load_any_model", load_with_an_odd_context)
    monkeypatch.setattr(distance, "repeat_probe", reached)
    command = ["distance", "--checkpoint", str(trained_run.run_dir), "--out", "unused"]
    assert main([*command, "--string-length", str(longest)]) == 2
    assert capsys.readouterr().err == "error: reached the probe\n"
    assert main([*command, "--string-length", str(longest + 1)]) == 2
    assert f"give at most {longest}" in capsys.readouterr().err


def test_after_a_start_token_the_probes_longest_sequence_still_fits_the_context(trained_run, monkeypatch):
    # An imported folder's bos begins every sequence: the strings and the gaps fill what it leaves.
    from tinyattn.cli.lab import main
    from tinyattn.data.tokenizer import Tokenizer

    probed = []

    def reached(model, **kwargs):
        probed.append(kwargs)
        raise TinyattnError("reached the probe")

    monkeypatch.setattr(Tokenizer, "text_start", property(lambda self: [self.eot_id]))
    monkeypatch.setattr(distance, "repeat_probe", reached)
    assert main(["distance", "--checkpoint", str(trained_run.run_dir), "--string-length", "3",
                 "--out", "unused"]) == 2
    [kwargs] = probed
    assert len(kwargs["start"]) == 1
    inputs = len(kwargs["start"]) + 2 * 3 + max(kwargs["distances"]) - 1  # the last token is only predicted
    assert inputs == 32  # tiny.yaml's context: filled, not overrun


def test_the_report_is_written_as_name_txt_and_printed(tmp_path, capsys):
    from tinyattn.lab.outputs import save_report

    assert save_report(tmp_path, "distance", "the table\n\n") == tmp_path / "distance.txt"
    assert (tmp_path / "distance.txt").read_text() == "the table\n"
    assert capsys.readouterr().out == "the table\n"


def test_without_out_each_lab_gets_a_new_folder_named_after_it(tmp_path, monkeypatch):
    from tinyattn.lab.outputs import experiment_folder

    monkeypatch.chdir(tmp_path)
    folder = experiment_folder(None, "distance")
    assert folder.parent.as_posix() == "checkpoints/lab" and folder.name.startswith("distance-")


def test_force_removes_a_link_the_lab_would_write_to_and_never_what_it_points_to(tmp_path):
    from tinyattn.lab.outputs import clear_earlier_lab

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "events.out.tfevents.1").write_bytes(b"the user's")
    out = tmp_path / "out"
    out.mkdir()
    (out / "key_value").symlink_to(mine, target_is_directory=True)
    clear_earlier_lab(out, ["key_value", "distance.txt"], force=True)
    assert not (out / "key_value").exists() and not (out / "key_value").is_symlink()
    assert (mine / "events.out.tfevents.1").read_bytes() == b"the user's"


def test_an_empty_folder_by_a_name_the_lab_writes_is_not_refused(tmp_path):
    # Nothing in it a rerun could mix with (a folder made ready for the lab, an earlier lab stopped early).
    from tinyattn.errors import TinyattnError
    from tinyattn.lab.outputs import clear_earlier_lab

    (tmp_path / "key_value").mkdir()
    clear_earlier_lab(tmp_path, ["key_value", "distance.txt"], force=False)
    assert (tmp_path / "key_value").is_dir()
    (tmp_path / "key_value" / "events.out.tfevents.1").write_bytes(b"")
    with pytest.raises(TinyattnError, match=r"holds key_value, which this lab writes; add --force"):
        clear_earlier_lab(tmp_path, ["key_value", "distance.txt"], force=False)


def test_lab_distance_on_a_hugging_face_folder_without_text_asks_for_text_in_one_line(
        tmp_path, capsys, char_tokenizer):
    # An imported folder records no data (no data section): the gap text must come from --text, in one
    # line naming it, not a traceback from reading a data section that is not there.
    pytest.importorskip("safetensors")
    from tinyattn.cli.lab import main
    from tinyattn.config import Config, DataConfig, TokenizerConfig
    from tinyattn.hf.folder import export_folder

    config = Config(model=ModelConfig(vocab_size=char_tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=24),
                    data=DataConfig(files=["corpus.txt"]), tokenizer=TokenizerConfig(kind="char"))
    export_folder(LanguageModel(config.model).state_dict(), config, char_tokenizer, tmp_path / "hf")
    assert main(["distance", "--checkpoint", str(tmp_path / "hf"), "--recall-steps", "1",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "give --text FILE" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_the_train_loss_curve_ends_at_the_last_step_so_a_short_run_draws_a_line():
    # `lab recurrence --seconds 1` trained 5 and 6 steps: with a point every LOG_EVERY steps and
    # at step 1 alone, each curve was one point, and the figure's panel drew nothing.
    class Stepper:
        step = tokens_seen = 0

        def train_step(self):
            self.step += 1
            self.tokens_seen += 8
            time.sleep(0.01)
            return torch.tensor(5.0 - self.step), None

    class Writer:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

    trainer, writer = Stepper(), Writer()
    contender = Contender("attention", "shape", lambda t: None)
    recurrence.train_for(trainer, contender, 0.05, writer)
    assert 1 < trainer.step < recurrence.LOG_EVERY
    assert [value for _, value in contender.curve] == [4.0, 5.0 - trainer.step]
    assert [(value, step) for tag, value, step in writer.scalars if tag == "train/loss"] == [
        (4.0, 1), (5.0 - trainer.step, trainer.step)]


def test_the_recurrence_report_names_the_validation_windows_the_config_evaluates():
    # train.eval_windows 8 (tiny.yaml's): the losses are over those 8 windows, and the report says so.
    config = load_config(ROOT / "configs" / "tiny.yaml")
    T = config.model.context_length
    contenders = [Contender(name, "shape", lambda t: None, speed={8: 100.0}, steps=5, seconds=1.0,
                            gradient_at_init=np.ones(T), gradient_trained=np.ones(T),
                            position_losses=np.full(T, 2.5), parameters=1000)
                  for name in ("attention", "lstm")]
    args = argparse.Namespace(config="tiny.yaml", contexts=[8], seconds=1.0)
    text = recurrence.report(contenders, config, args, "cpu", wall=1.0)
    assert config.train.eval_windows == 8
    assert "validation loss after 1 s of training each (context 32, 8 windows)\n" in text


def test_the_figures_speed_panel_shows_the_contexts_the_table_shows(tmp_path, monkeypatch,
                                                                     figures_unrendered):
    # The training context (32 in tiny.yaml) is timed for the schedule even where --contexts leaves it
    # out; the table leaves it out too, and the figure drew it: a point the table has no row for.
    from tinyattn.cli.lab import main

    def measured(contender, config, data, **kwargs):
        T = config.model.context_length
        contender.curve, contender.steps, contender.seconds, contender.parameters = [(0.1, 4.0)], 1, 0.1, 1
        contender.position_losses = np.full(T, 3.0)
        contender.gradient_at_init = contender.gradient_trained = np.ones(T)

    monkeypatch.setattr(recurrence, "tokens_per_second", lambda contender, config, tokens, **kwargs: 1000.0)
    monkeypatch.setattr(recurrence, "train_and_measure", measured)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--contexts", "8", "64",
                 "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path)]) == 0
    speed = figures_unrendered[0].axes[0]
    assert speed.get_title() == "speed by context"
    drawn = ([8, 64], [1000.0, 1000.0])  # the table's rows, not 32
    assert lines_by_label(speed) == {"attention": drawn, "lstm": drawn}


def test_the_wall_time_of_the_command_counts_from_the_process_start(tmp_path, monkeypatch, figure_unread):
    # 'wall time of the command' counted from the experiment's own start: a run the shell timed at 26 s
    # (the interpreter, torch's import and the figure) said 15 s; LAB.md's times are the whole command's.
    from tinyattn.cli.lab import main
    from tinyattn.lab import outputs

    def measured(contender, config, data, **kwargs):
        T = config.model.context_length
        contender.curve, contender.steps, contender.seconds, contender.parameters = [(0.1, 4.0)], 1, 0.1, 1
        contender.position_losses = np.full(T, 3.0)
        contender.gradient_at_init = contender.gradient_trained = np.ones(T)

    monkeypatch.setattr(outputs, "process_age", lambda: 600.0, raising=False)  # started 10 minutes ago
    monkeypatch.setattr(recurrence, "tokens_per_second", lambda contender, config, tokens, **kwargs: 1000.0)
    monkeypatch.setattr(recurrence, "train_and_measure", measured)
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--contexts", "8",
                 "--out", str(tmp_path / "out"), "--set", *local_text(tmp_path)]) == 0
    wall = re.search(r"wall time of the command: (\d+) s", (tmp_path / "out" / "recurrence.txt").read_text())
    assert 600 <= int(wall.group(1)) < 660, wall.group(0)


@pytest.mark.parametrize("lab", ["recurrence", "distance"])
def test_a_lab_without_matplotlib_is_refused_in_one_line_before_it_measures(
        tmp_path, monkeypatch, capsys, trained_run, lab):
    # The figure is drawn before the report (its time counts in the wall time): without the optional
    # extra the command measured for minutes, then failed drawing and wrote no table either.
    import sys

    from tinyattn.cli.lab import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the optional extra were not installed
    module, work = (recurrence, "tokens_per_second") if lab == "recurrence" else (distance, "repeat_probe")
    monkeypatch.setattr(module, work, lambda *args, **kwargs: pytest.fail("measured before checking"))
    out = tmp_path / "out"
    command = ([lab, "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", *local_text(tmp_path)]
               if lab == "recurrence" else [lab, "--checkpoint", str(trained_run.run_dir)])
    assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "error: plots need matplotlib, an optional extra: pip install 'tinyattn[plot]'\n", err
    assert not out.exists()


def test_lab_distances_wall_time_of_the_command_counts_from_the_process_start(
        trained_run, tmp_path, monkeypatch, figure_unread):
    # aadbe5a's clock for every lab: recurrence's test alone pinned it, distance's could go back unseen.
    from tinyattn.cli.lab import main
    from tinyattn.lab import outputs

    monkeypatch.setattr(outputs, "process_age", lambda: 600.0)  # started 10 minutes ago
    out = tmp_path / "out"
    assert main(["distance", "--checkpoint", str(trained_run.run_dir), "--recall-steps", "1", "--pairs", "2",
                 "--string-length", "3", "--out", str(out)]) == 0
    wall = re.search(r"wall time of the command: (\d+) s", (out / "distance.txt").read_text())
    assert 600 <= int(wall.group(1)) < 660, wall.group(0)


def test_the_recall_memory_floor_counts_the_fused_attention_the_recall_model_trains_with():
    from tinyattn.config import TrainConfig
    from tinyattn.model.memory import training_memory

    task = distance.KeyValueRecall(64, batch_size=distance.RECALL_BATCH, seed=0)
    train = TrainConfig(batch_size=distance.RECALL_BATCH, precision="fp32")
    fused, explicit = (training_memory(distance.recall_config(task), train, explicit_attention=flag)
                       .total_bytes for flag in (False, True))
    logits = distance.RECALL_EVAL_SEQUENCES * task.context_length * task.vocab_size * distance.FP32
    assert distance.recall_bytes(64) == max(fused, logits) < explicit  # explicit scores would refuse too soon


@pytest.mark.parametrize("item, option", [("train.max_steps=3", "--seconds"),
                                          ("train.time_budget=5s", "--seconds"),
                                          ("train.out_dir=elsewhere", "--out elsewhere"),
                                          ("train.precision=bf16", "--precision bf16")])
def test_lab_recurrence_refuses_a_set_of_what_its_own_options_set_naming_the_option(tmp_path, capsys, item,
                                                                                     option):
    # --seconds set each model's steps and --precision the arithmetic: such a --set was ignored unsaid.
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", item,
                 "--out", str(out)]) == 2
    key = item.split("=")[0]
    assert capsys.readouterr().err == (f"error: --set {item}: lab recurrence sets {key} from "
                                       f"{option.split()[0]}; give {option} instead\n")
    assert not out.exists()


def test_a_set_without_a_value_is_refused_in_the_words_of_every_set_not_a_traceback(tmp_path, capsys):
    # A key the lab sets itself, given without '=': load_config's refusal, not the lab's reading of a value.
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.max_steps",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("error: --set: expected key=value (e.g. model.n_layer=8), got "
                                       "'train.max_steps'\n")
    assert not out.exists()
