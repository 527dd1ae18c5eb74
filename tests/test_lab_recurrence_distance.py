"""`tinyattn lab recurrence` and `tinyattn lab distance`: each measurement pinned on a model whose answer is known."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.conftest import ROOT
from tinyattn.config import ModelConfig, load_config
from tinyattn.lab.distance import KeyValueRecall, gap_lengths, repeat_probe
from tinyattn.lab.lstm import LSTMConfig, LSTMLanguageModel, lstm_parameters, lstm_width_for
from tinyattn.lab.recurrence import at_initialisation, gradient_by_distance
from tinyattn.model.transformer import IGNORE_INDEX, LanguageModel, ModelOutput


@pytest.mark.parametrize("shape", [dict(n_layer=4, n_head=4, n_embd=192, vocab_size=65),  # the main config
                                   dict(n_layer=2, n_head=2, n_embd=32, vocab_size=20)])
def test_lstm_parameter_count_is_within_10_percent_of_the_attention_model(shape):
    attention = LanguageModel(ModelConfig(context_length=16, **shape))
    for layers in (1, 2, 3):
        width = lstm_width_for(attention.num_parameters(), shape["vocab_size"], layers)
        lstm = LSTMLanguageModel(LSTMConfig(shape["vocab_size"], width, layers))
        assert lstm.num_parameters() == lstm_parameters(shape["vocab_size"], width, layers)
        assert 0.9 < lstm.num_parameters() / attention.num_parameters() < 1.1


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


# ----------------------------------------------------------------------------- the repeated-sequence probe


class InductionRule(nn.Module):
    """A hand-built copier: at each position, predict the token that followed the latest earlier
    occurrence of the current token (an induction head's rule), with logit 20; with
    copy=False (no such head) a fixed random bigram table: the logits depend on the current
    token alone, so both copies of a string get exactly the same loss."""

    def __init__(self, vocab_size: int, copy: bool = True):
        super().__init__()
        self.vocab_size, self.copy = vocab_size, copy
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
                if token in seen:
                    logits[b, t, int(idx[b, seen[token]])] = 20.0
                if t + 1 < T:
                    seen[token] = t + 1
        return ModelOutput(logits, None, None)


def probe(model, vocab_size=2000, length=8, distances=(0, 3, 10)):
    # The string draws from tokens 100..; the gap text from 0..99, so a copy is found only in the first copy.
    text = np.random.default_rng(2).integers(0, 100, size=500)
    return repeat_probe(model, string_tokens=np.arange(100, vocab_size), text=text, length=length,
                        distances=list(distances), rng=np.random.default_rng(1), samples=16)


def test_a_copying_model_predicts_the_second_copy_and_not_the_first():
    rows = probe(InductionRule(2000))
    assert [row.gap for row in rows] == [0, 3, 10]
    for row in rows:
        assert row.first > 7.0  # random tokens: about ln(2000) = 7.6
        assert row.second < 0.1  # copied


def test_a_model_without_a_copying_head_shows_no_drop():
    for row in probe(InductionRule(2000, copy=False)):
        assert row.first > 7.0
        assert row.second == pytest.approx(row.first, abs=1e-5)


def test_the_gaps_reach_the_largest_that_fits_the_context():
    gaps = gap_lengths(64, 8)
    assert gaps[0] == 0 and gaps[-1] == 64 + 1 - 2 * 8  # inputs 2 * 8 + 49 - 1 = 64
    assert gaps == sorted(set(gaps))


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


# ----------------------------------------------------------------------------- the commands


@pytest.mark.slow
def test_lab_recurrence_writes_its_table_figure_and_tensorboard_runs(tmp_path, capsys):
    from tests.conftest import CORPUS
    from tinyattn.cli.lab import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS * 4, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["recurrence", "--config", str(ROOT / "configs" / "tiny.yaml"), "--seconds", "0.5",
                 "--contexts", "8", "16", "--out", str(out), "--set", f"data.files={corpus}", "data.url=null",
                 "data.sha256=null", f"data.cache_dir={tmp_path / 'cache'}", "train.batch_size=4",
                 "train.eval_windows=4"]) == 0
    table = (out / "recurrence.txt").read_text()
    assert "training tokens/s" in table and "gradient norm" in table and table in capsys.readouterr().out + "\n"
    assert (out / "recurrence.png").stat().st_size > 0
    assert any((out / "attention").iterdir()) and any((out / "lstm").iterdir())


@pytest.mark.slow
def test_lab_distance_writes_its_table_and_figure(trained_run, tmp_path):
    from tinyattn.cli.lab import main

    out = tmp_path / "out"
    assert main(["distance", "--checkpoint", str(trained_run.run_dir), "--recall-steps", "3", "--pairs", "4",
                 "--string-length", "3", "--out", str(out)]) == 0
    table = (out / "distance.txt").read_text()
    assert "first copy" in table and "recall" in table
    assert (out / "distance.png").stat().st_size > 0 and any((out / "key_value").iterdir())
