"""Evaluation: every token scored once, perplexity = exp(loss), bits per unit, loss by position, the CLI."""

import math
import re
import struct
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_started_in
from tinyattn.analysis import evaluate
from tinyattn.analysis.evaluate import (
    evaluate_tokens,
    format_loss_by_position,
    log_loss_by_position_to_tensorboard,
    loss_by_position,
    loss_by_position_image,
    position_ranges,
    save_loss_by_position_plot,
    text_units,
    token_losses,
)
from tinyattn.checkpoint import load_model
from tinyattn.cli.eval import main
from tinyattn.config import ModelConfig, TokenizerConfig
from tinyattn.data.batches import eval_batches, prepare_data, tail_window
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.errors import DataError
from tinyattn.model.transformer import IGNORE_INDEX, LanguageModel

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 12
CONTEXT = 32


@pytest.fixture(scope="module")
def run(trained_run):
    """conftest's run (30 steps of configs/tiny.yaml, so losses differ by position), loaded back."""
    loaded = load_model(trained_run.run_dir)
    assert loaded.config.model.context_length == CONTEXT
    data = prepare_data(loaded.config, progress=False)  # the run's own splits, from its token cache
    return {"model": loaded.model, "tokenizer": loaded.tokenizer, "data": data, "run_dir": trained_run.run_dir}


def reference_total_nats(model, tokens) -> float:
    """Summed loss over windows written out one at a time: [s, s+T) predicting [s+1, s+T+1)."""
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(tokens) - 1, CONTEXT):
            end = min(start + CONTEXT, len(tokens) - 1)
            x = torch.tensor(tokens[start:end], dtype=torch.long).unsqueeze(0)
            y = torch.tensor(tokens[start + 1:end + 1], dtype=torch.long).unsqueeze(0)
            total += model(x, y).loss.item() * x.size(1)
    return total


def test_every_token_is_scored_once_and_perplexity_is_exp_loss(run):
    model, tokenizer = run["model"], run["tokenizer"]
    tokens = np.asarray(tokenizer.encode(TEXT[:1000]))  # 999 targets: 31 full windows + a tail of 7
    result = evaluate_tokens(model, tokenizer, tokens, batch_size=8, char_level=True)
    assert result.predicted_tokens == 999
    assert (result.full_windows, result.tail_tokens) == (31, 7)
    assert result.loss * 999 == pytest.approx(reference_total_nats(model, tokens), rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(result.loss), rel=1e-12)
    assert (result.unit, result.units) == ("character", 999)
    assert result.bits_per_unit == pytest.approx(result.loss / math.log(2), rel=1e-12)


def test_evaluation_is_deterministic_and_does_not_depend_on_the_batch_size(run):
    model, tokenizer = run["model"], run["tokenizer"]
    tokens = np.asarray(tokenizer.encode(TEXT[:700]))
    first = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=True)
    again = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=True)
    assert first.loss == again.loss
    np.testing.assert_array_equal(first.loss_by_position, again.loss_by_position)
    other = evaluate_tokens(model, tokenizer, tokens, batch_size=7, char_level=True)
    assert other.loss == pytest.approx(first.loss, rel=1e-6)


def test_bits_per_byte_divides_total_nats_by_the_utf8_bytes_of_the_predicted_text():
    text = "café naïve — déjà vu. " * 10
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter([text]))
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=16)).eval()
    tokens = tokenizer.encode(text)
    result = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=False)
    predicted_bytes = len(text[1:].encode("utf-8"))
    assert result.unit == "byte" and result.units == predicted_bytes > len(text) - 1
    total_nats = result.loss * (len(tokens) - 1)
    assert result.bits_per_unit == pytest.approx(total_nats / math.log(2) / predicted_bytes)



def test_bytes_counted_in_decode_chunks_count_every_chunk_the_last_one_included(monkeypatch):
    text = "café naïve — déjà vu."
    tokenizer = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter([text * 20]))
    tokens = np.asarray(tokenizer.encode(text))
    whole = text_units(tokenizer, tokens, char_level=False)
    assert whole == len(tokenizer.decode(tokens.tolist()).encode("utf-8"))
    monkeypatch.setattr(evaluate, "DECODE_CHUNK", 1)  # every token a chunk: the last one alone
    assert text_units(tokenizer, tokens, char_level=False) == whole

def test_bits_per_byte_of_a_text_counts_the_bytes_an_unknown_token_stands_for():
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abcd "]))
    text = "ΩΩ abc ~é<|endoftext|>dd ßß"  # Ω, ~, é and ß unseen: each an [UNK], decoded as U+FFFD
    tokens = np.asarray(tokenizer.encode(text))
    assert int(np.count_nonzero(tokens == tokenizer.unknown_id)) == 6
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=16)).eval()
    result = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=False, text=text)
    predicted = text[1:].replace("<|endoftext|>", "")  # the first Ω is read, not predicted
    assert result.units == len(predicted.encode("utf-8")) == 17
    assert result.bits_per_unit == pytest.approx(result.loss * (len(tokens) - 1) / math.log(2) / 17)


def test_bits_per_character_of_a_text_count_its_characters_not_its_bytes():
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["hé "]))
    text = "héé hé"  # é: one character, two bytes
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, n_embd=16,
                                      context_length=16)).eval()
    result = evaluate_tokens(model, tokenizer, np.asarray(tokenizer.encode(text)), batch_size=4,
                             char_level=True, text=text)
    assert result.unit == "character" and result.units == len(text) - 1 == 5


def test_predicted_bytes_of_a_text_count_a_first_separator_as_read_not_twice():
    from tinyattn.analysis.evaluate import predicted_text_bytes

    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abcd"]))
    text = "<|endoftext|>ab<|endoftext|>é"  # the first token is the separator: read, not predicted
    tokens = np.asarray(tokenizer.encode(text))
    assert predicted_text_bytes(tokenizer, text, tokens) == len("abé".encode("utf-8")) == 4


def test_predicted_bytes_of_a_text_after_an_imported_start_token_count_its_first_token():
    import types

    from tinyattn.analysis.evaluate import predicted_text_bytes

    # The bos is read, so the text's first token is predicted: every byte of the text counts.
    with_start = types.SimpleNamespace(eot_id=None, text_start=[9], end_of_text="</s>",
                                       first_token_chars=lambda text: 1)
    assert predicted_text_bytes(with_start, "ab", np.asarray([9, 0, 1])) == 2


def test_document_separators_count_as_no_text():
    text = "ab<|endoftext|>cd"
    tokenizer = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abcd"]))
    tokens = np.asarray(tokenizer.encode(text))
    assert len(tokens) == 5 and tokens[2] == tokenizer.eot_id
    assert text_units(tokenizer, tokens, char_level=True) == 4
    assert text_units(tokenizer, tokens, char_level=False) == 4
    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter(["né\n" * 20]))
    assert text_units(bpe, np.asarray(bpe.encode("né<|endoftext|>né")), char_level=False) == 6


def test_an_imported_tokenizers_own_end_of_text_counts_as_no_text():
    import tokenizers

    from tinyattn.data.tokenizer import Tokenizer

    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter(["né\n" * 20]))
    backend = tokenizers.Tokenizer.from_str(bpe.to_json())
    backend.add_special_tokens(["</s>"])  # as an imported Llama-style tokenizer ends its texts
    tokenizer = Tokenizer(backend, end_of_text="</s>")
    tokens = np.asarray(tokenizer.encode("né</s>né"))
    assert int(np.count_nonzero(tokens == tokenizer.eot_id)) == 1
    assert text_units(tokenizer, tokens, char_level=False) == 6  # the 3 + 3 bytes of "né" twice


def test_separators_count_the_bytes_of_their_end_of_text_token_not_its_characters():
    import types

    from tinyattn.analysis.evaluate import predicted_text_bytes

    pieces = {0: "a", 1: "b", 2: "c", 7: "«e»"}  # an end-of-text token of 3 characters, 5 bytes
    tokenizer = types.SimpleNamespace(eot_id=7, text_start=[], end_of_text="«e»",
                                      first_token_chars=lambda text: 1,  # "a", read not predicted
                                      decode=lambda tokens: "".join(pieces[int(t)] for t in tokens))
    tokens = np.asarray([0, 1, 7, 2])
    assert text_units(tokenizer, tokens, char_level=False) == len(b"abc") == 3
    assert predicted_text_bytes(tokenizer, "ab«e»c", tokens) == len(b"bc") == 2


def test_loss_by_position_has_one_entry_per_position_and_averages_to_the_loss_of_its_windows(run):
    model, validation = run["model"], run["data"].validation
    for max_windows in (None, 3):
        losses = loss_by_position(model, validation, CONTEXT, batch_size=2, max_windows=max_windows)
        assert losses.shape == (CONTEXT,) and losses.dtype == np.float64
        with torch.no_grad():  # the training loop's validation loss over the same windows
            batches = list(eval_batches(validation, CONTEXT, 2, max_windows))
            windows = sum(x.size(0) for x, _ in batches)
            loss = sum(model(x, y).loss.item() * x.size(0) for x, y in batches) / windows
        assert losses.mean() == pytest.approx(loss, rel=1e-5)
    every_window = loss_by_position(model, validation, CONTEXT, batch_size=2)
    result = evaluate_tokens(model, run["tokenizer"], validation, batch_size=2, char_level=True)
    np.testing.assert_allclose(result.loss_by_position, every_window, rtol=1e-6)
    # The trained model predicts better with context than without: position 0 sees one character.
    assert every_window[0] > every_window[CONTEXT // 2:].mean()


def test_a_model_in_training_is_evaluated_without_dropout_and_left_training():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=16,
                                      dropout=0.5)).eval()
    tokens = np.random.default_rng(0).integers(0, 20, 200)
    by_position = loss_by_position(model, tokens, 16, batch_size=4)
    model.train()
    np.testing.assert_array_equal(loss_by_position(model, tokens, 16, batch_size=4), by_position)
    assert model.training


def test_token_losses_hold_a_bounded_block_of_logits_and_give_the_losses_of_the_whole_logits(monkeypatch):
    torch.manual_seed(0)
    V = 97
    model = LanguageModel(ModelConfig(vocab_size=V, n_layer=1, n_head=2, n_embd=16, context_length=24)).eval()
    x, y = torch.randint(0, V, (3, 24)), torch.randint(0, V, (3, 24))
    y[1, 5] = IGNORE_INDEX
    with torch.no_grad():
        whole = F.cross_entropy(model(x).logits.float().transpose(1, 2), y, reduction="none")  # (3, 24)
        assert torch.equal(token_losses(model, x, y), whole)  # 3 * 24 * 97 logits: one block
        blocks = []  # the (b, t, C) hidden states each call of the head turns into logits
        real = model.head_logits
        monkeypatch.setattr(model, "head_logits",
                            lambda hidden: blocks.append(tuple(hidden.shape)) or real(hidden))
        monkeypatch.setattr(evaluate, "LOSS_CHUNK_ELEMENTS", 2 * 24 * V, raising=False)  # two whole windows
        assert torch.equal(token_losses(model, x, y), whole)  # cut between windows: the same bits
        assert blocks == [(2, 24, 16), (1, 24, 16)]
        blocks.clear()
        # 10 positions of one window a block
        monkeypatch.setattr(evaluate, "LOSS_CHUNK_ELEMENTS", 10 * V + 5, raising=False)
        chunked = token_losses(model, x, y)
    assert blocks == [(1, 10, 16), (1, 10, 16), (1, 4, 16)] * 3  # never the whole (3, 24, V) logits
    assert chunked[1, 5] == 0.0  # an ignored target still counts nothing
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)  # cross_entropy's last bit may differ


def test_cli_scores_an_imported_folder_in_batches_of_its_context_not_the_default_train_batch_size(
        run, tmp_path, capsys, monkeypatch):
    from tinyattn.cli import eval as eval_cli
    from tinyattn.hf.folder import export_folder

    loaded = load_model(run["run_dir"])
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "hf")
    (tmp_path / "text.txt").write_text(TEXT[:300], encoding="utf-8")
    sizes = []
    real = evaluate.evaluate_tokens
    monkeypatch.setattr(evaluate, "evaluate_tokens",
                        lambda model, tokenizer, tokens, batch_size, *a, **k:
                        sizes.append(batch_size) or real(model, tokenizer, tokens, batch_size, *a, **k))
    monkeypatch.setattr(eval_cli, "EVAL_BATCH_TOKENS", 3 * CONTEXT + 1, raising=False)
    for checkpoint, more in ((tmp_path / "hf", ()), (run["run_dir"], ()),
                             (tmp_path / "hf", ("--batch-size", "5"))):
        status, _, stderr = run_cli(capsys, "--checkpoint", str(checkpoint), "--text-file",
                                    str(tmp_path / "text.txt"), "--no-plot", *more)
        assert status == 0, stderr
    # The folder: windows of its context holding EVAL_BATCH_TOKENS; the run: its train.batch_size.
    assert sizes == [3, loaded.config.train.batch_size, 5] and loaded.config.train.batch_size != 3


def test_a_text_shorter_than_one_window_is_only_a_tail(run):
    model, tokenizer = run["model"], run["tokenizer"]
    tokens = np.asarray(tokenizer.encode("First Citizen:"))  # 14 tokens, 13 targets < CONTEXT
    result = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=True)
    assert (result.full_windows, result.tail_tokens, result.predicted_tokens) == (0, 13, 13)
    assert np.isnan(result.loss_by_position).all()
    assert result.loss * 13 == pytest.approx(reference_total_nats(model, tokens), rel=1e-5)
    x, y = tail_window(tokens, CONTEXT)
    assert x.shape == y.shape == (1, 13)
    with pytest.raises(DataError, match="needs at least one full window"):
        loss_by_position(model, tokens, CONTEXT, batch_size=4)


@pytest.mark.parametrize("length", [CONTEXT + 2, 2])  # a full window and one target after it; a lone target
def test_a_single_leftover_target_is_a_tail_of_one_and_is_scored(run, length):
    model, tokenizer = run["model"], run["tokenizer"]
    tokens = np.asarray(tokenizer.encode(TEXT[:length]))
    assert len(tokens) == length
    x, y = tail_window(tokens, CONTEXT)
    assert x.shape == y.shape == (1, 1) and int(y[0, 0]) == tokens[-1] and int(x[0, 0]) == tokens[-2]
    result = evaluate_tokens(model, tokenizer, tokens, batch_size=4, char_level=True)
    assert (result.tail_tokens, result.predicted_tokens) == (1, length - 1)
    assert result.loss > 0  # a dropped target scored nothing: a 2-token text had loss 0
    assert result.loss * (length - 1) == pytest.approx(reference_total_nats(model, tokens), rel=1e-5)


def test_table_plot_and_tensorboard_show_ranges_of_positions_doubling_the_context(tmp_path, tensorboard_writer):
    assert position_ranges(128) == [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127)]
    assert position_ranges(96)[-1] == (64, 95) and position_ranges(1) == [(0, 0)]
    # a context one past a power of two (or of 2) ends in a row of its last position alone
    assert position_ranges(2) == [(0, 0), (1, 1)] and position_ranges(5)[-2:] == [(2, 3), (4, 4)]
    losses = np.linspace(4.0, 2.0, 32)
    table = format_loss_by_position(losses).splitlines()
    assert [line.split()[0] for line in table[1:]] == ["0", "1", "2-3", "4-7", "8-15", "16-31"]
    last, before = losses[16:].mean(), losses[8:16].mean()
    assert table[-1].split() == ["16-31", f"{last:.3f}", f"{before - last:+.3f}"]

    assert save_loss_by_position_plot(losses, tmp_path / "new" / "plot.png").is_file()  # its folder made
    path = save_loss_by_position_plot(losses, tmp_path / "plot.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (700, 400)
    [curve] = evaluate.loss_by_position_figure(losses).axes[0].get_lines()  # x: tokens read, 1..32
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(1, 33))
    np.testing.assert_array_equal(curve.get_ydata(), losses)

    writer = tensorboard_writer
    log_loss_by_position_to_tensorboard(writer, losses, step=500)
    assert [tag for tag, _, _ in writer.scalars] == [f"loss_by_position/positions_{name}" for name in
                                                     ("0", "1", "2-3", "4-7", "8-15", "16-31")]
    assert writer.scalars[-1] == ("loss_by_position/positions_16-31", pytest.approx(last), 500)
    assert [(tag, image.shape, image.dtype, step, layout) for tag, image, step, layout in writer.images] == [
        ("loss_by_position/plot", (240, 420, 3), np.uint8, 500, "HWC")]


def test_tensorboard_curve_is_drawn_with_numpy_at_the_losses_on_a_log_scale(monkeypatch, tensorboard_writer):
    from tinyattn.analysis.plotting import CHART_MARGIN as m
    from tinyattn.analysis.plotting import GRID_RGB, LINE_RGB

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    seen = np.arange(1, 33)  # 32 positions; position p has read p + 1 tokens
    losses = 3.0 - 0.5 * np.log2(seen)  # 3.0 down to 0.5: a straight line on a log-x chart
    image = loss_by_position_image(losses)
    assert image.shape == (240, 420, 3) and image.dtype == np.uint8
    plot_w, plot_h = 420 - 2 * m, 240 - 2 * m
    line = np.all(image == LINE_RGB, axis=-1)
    # Left edge: 1 token read, right edge: 32; bottom: 0 nats, top: the largest loss, 3, rounded up.
    for column in range(m, m + plot_w, 7):
        log_seen = (column - m) / (plot_w - 1) * 5
        row = m + (3.0 - (3.0 - 0.5 * log_seen)) / 3.0 * (plot_h - 1)
        drawn = np.flatnonzero(line[:, column])
        assert drawn.size and abs(drawn.mean() - row) <= 1.5, column
    grid = np.all(image == GRID_RGB, axis=-1)
    for nats in (0, 1, 2):  # a grey line every nat (3 is the top, under the curve's start)
        assert grid[round(m + (3 - nats) / 3 * (plot_h - 1)), m + plot_w // 2 + 3]
    for doublings in range(5):  # a grey line at 1, 2, 4, 8, 16 tokens, above the curve
        assert grid[m + 2, round(m + doublings / 5 * (plot_w - 1))]

    log_loss_by_position_to_tensorboard(tensorboard_writer, losses, step=3)
    log_loss_by_position_to_tensorboard(tensorboard_writer, losses, step=4, image=False)
    [(tag, logged, step, _)] = tensorboard_writer.images
    assert (tag, step) == ("loss_by_position/plot", 3)
    np.testing.assert_array_equal(logged, image)


def test_tensorboard_curve_has_a_grid_line_at_every_power_of_two_up_to_a_context_that_is_not_one():
    from tinyattn.analysis.plotting import CHART_MARGIN as m
    from tinyattn.analysis.plotting import GRID_RGB

    losses = np.full(24, 0.5)  # the right edge is 24 tokens read: the last line is at 16, inside the chart
    grid = np.all(loss_by_position_image(losses) == GRID_RGB, axis=-1)
    plot_w = 420 - 2 * m
    lines = [int(np.rint(m + np.log2(tokens) / np.log2(24) * (plot_w - 1))) for tokens in (1, 2, 4, 8, 16)]
    assert np.flatnonzero(grid[m + 2]).tolist() == lines  # a row under the top, clear of the curve


def test_tensorboard_curve_tops_out_at_the_largest_loss_rounded_up_not_down():
    from tinyattn.analysis.plotting import CHART_MARGIN as m
    from tinyattn.analysis.plotting import LINE_RGB

    losses = np.full(16, 1.5)
    losses[0] = 2.4  # the top of the chart is 3 nats: the curve starts below it, unclipped
    line = np.all(loss_by_position_image(losses) == LINE_RGB, axis=-1)
    plot_h = 240 - 2 * m
    start = np.flatnonzero(line[:, m])
    assert start.size and abs(start.min() - (m + (3 - 2.4) / 3 * (plot_h - 1))) <= 1.5
    flat = np.flatnonzero(line[:, 420 - m - 1])
    assert flat.size and abs(flat.min() - (m + (3 - 1.5) / 3 * (plot_h - 1))) <= 1.5

def test_tensorboard_curve_of_losses_under_one_nat_tops_out_at_one():
    from tinyattn.analysis.plotting import CHART_MARGIN as m
    from tinyattn.analysis.plotting import LINE_RGB

    losses = np.full(16, 0.25)
    losses[0] = 0.75  # the largest loss rounded up: a chart 1 nat high, the curve in its top quarter
    line = np.all(loss_by_position_image(losses) == LINE_RGB, axis=-1)
    plot_h = 240 - 2 * m
    start = np.flatnonzero(line[:, m])
    assert start.size and abs(start.min() - (m + (1 - 0.75) * (plot_h - 1))) <= 1.5


def test_a_curve_of_nan_losses_only_draws_an_empty_chart_instead_of_raising():
    from tinyattn.analysis.plotting import LINE_RGB

    image = loss_by_position_image(np.full(8, np.nan))  # e.g. no full window was scored
    assert image.shape == (240, 420, 3) and image.dtype == np.uint8
    assert not np.all(image == LINE_RGB, axis=-1).any()  # no curve: nothing to draw


# ----------------------------------------------------------------------------- command line


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """scripts/eval.py's main in this process: (exit status, stdout, stderr)."""
    status = main([*args, "--device", "cpu"])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def blank_plots(monkeypatch):
    """The loss-by-position plot (and attention's heatmaps) blank figures, still saved by the command
    where it saves them, in the format the path's extension names: for CLI runs that check where a
    plot goes and what kind of file it is, not what it shows (test_table_plot_and_tensorboard_...
    and test_cli_scores_a_text_file_... draw the real one)."""
    from tinyattn.analysis import attention_maps
    from tinyattn.analysis.plotting import new_figure

    monkeypatch.setattr(evaluate, "loss_by_position_figure", lambda losses, title="", dpi=evaluate.PLOT_DPI:
                        new_figure(0.1, 0.1, dpi))
    monkeypatch.setattr(attention_maps, "layer_figure",
                        lambda maps, layer, heads=None, dpi=attention_maps.DPI: new_figure(0.1, 0.1, dpi))


def printed(name: str, stdout: str) -> float:
    return float(re.search(rf"^{name}\s+([0-9.]+)", stdout, re.MULTILINE).group(1))


def test_cli_scores_a_text_file_and_plots_loss_by_position(run, tmp_path, capsys):
    text_file = tmp_path / "speech.txt"
    text_file.write_text(TEXT[:500], encoding="utf-8")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file", str(text_file),
                                     "--batch-size", "4")
    assert status == 0, stderr
    expected = evaluate_tokens(run["model"], run["tokenizer"], run["tokenizer"].encode(TEXT[:500]), 4, True)
    assert printed("loss", stdout) == pytest.approx(expected.loss, abs=1e-4)
    assert printed("perplexity", stdout) == pytest.approx(math.exp(expected.loss), abs=1e-3)
    assert printed("bits per character", stdout) == pytest.approx(expected.bits_per_unit, abs=1e-4)
    assert "15 windows of 32 + a tail of 19" in stdout
    plot = run["run_dir"] / "loss_by_position_speech.png"
    assert f"wrote {plot}" in stdout and plot.read_bytes()[:4] == b"\x89PNG"


def test_cli_without_matplotlib_scores_the_text_and_says_it_skipped_the_plot(run, tmp_path, capsys,
                                                                            monkeypatch):
    # An install without the plot extra: the scores and the table, then one line naming the extra.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    text_file = tmp_path / "unplotted.txt"
    text_file.write_text(TEXT[:500], encoding="utf-8")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]),
                                     "--text-file", str(text_file), "--batch-size", "4")
    assert status == 0, stderr
    assert "15 windows of 32 + a tail of 19" in stdout
    assert "loss by position, mean over 15 full windows" in stdout
    assert "plot skipped" not in stdout  # the scores alone on stdout; the skipped plot is a note
    assert stderr == ("note: plot skipped: matplotlib is missing (pip install 'tinyattn[plot]'), "
                      "or use --no-plot\n"), stderr
    assert not list(run["run_dir"].glob("loss_by_position_unplotted*"))


def test_cli_loss_by_position_over_one_full_window_says_window(run, tmp_path, capsys):
    text_file = tmp_path / "short.txt"
    text_file.write_text(TEXT[:45], encoding="utf-8")  # one window of 32 and a tail
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]),
                                     "--text-file", str(text_file), "--no-plot")
    assert status == 0, stderr
    assert "\nloss by position, mean over 1 full window:\n" in stdout, stdout


def test_cli_bits_per_byte_of_a_text_file_count_its_own_bytes_where_a_character_is_unknown(
        run, tmp_path, capsys):
    from tinyattn.hf.folder import export_folder

    loaded = load_model(run["run_dir"])
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "hf")
    text = TEXT[:90] + "~~~ ΩΩ " + TEXT[:30]  # ~ and Ω: never in the corpus
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "hf"), "--text-file",
                                     str(tmp_path / "text.txt"), "--no-plot")
    assert status == 0 and "scored as [UNK]: '~', 'Ω'" in stderr, stderr
    assert f"({len(text[1:].encode('utf-8'))} bytes)" in stdout, stdout  # 5 [UNK]: not 3 bytes each


def test_cli_a_text_files_byte_order_mark_is_not_scored(run, tmp_path, capsys):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text(TEXT[:200], encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())  # as a Windows editor saves UTF-8
    scores = []
    for path in (plain, marked):
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file", str(path),
                                         "--no-plot")
        assert status == 0 and "warning" not in stderr, stderr  # the mark is no unknown character either
        scores.append(stdout.replace(str(path), "TEXT"))
    assert scores[1] == scores[0]


def test_plots_of_a_step_checkpoint_are_named_after_it_and_leave_best_pts_alone(run, tmp_path, capsys,
                                                                               blank_plots):
    # eval and attention on step_N.pt wrote the names best.pt's plots have, replacing them unsaid.
    import shutil

    from tinyattn.cli.attention import main as attention_main

    folder = tmp_path / "run"  # without the plots other tests of the shared run wrote (any order)
    shutil.copytree(run["run_dir"], folder, ignore=shutil.ignore_patterns("attention*", "*.png"))
    step = sorted(folder.glob("step_*.pt"))[0]
    for checkpoint in (folder, step):
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(checkpoint), "--split", "validation")
        assert status == 0, stderr
        assert attention_main(["--checkpoint", str(checkpoint), "--text", "ROMEO: soft", "--layer", "0",
                               "--device", "cpu"]) == 0
    capsys.readouterr()
    assert (folder / "loss_by_position_validation.png").is_file()
    assert (folder / f"loss_by_position_validation_{step.stem}.png").is_file()
    assert [p.name for p in (folder / "attention").iterdir()] == ["layer_0.png"]
    assert [p.name for p in (folder / f"attention_{step.stem}").iterdir()] == ["layer_0.png"]


def test_a_run_scored_on_its_split_from_another_folder_reads_its_data_where_it_started(
        shakespeare_head, tmp_path, monkeypatch, capsys):
    # Read from the folder run from, the run's relative data.files would be missing there
    start, _ = run_started_in(shakespeare_head, tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # the training's lines
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "runs" / "run"), "--split",
                                     "validation", "--no-plot")
    assert status == 0, stderr
    assert f"note: data.files and data.cache_dir read from {start}, the folder the run started in" in stderr
    assert "on the validation split" in stdout and "warning" not in stderr


def test_cli_plot_goes_where_it_says_and_a_format_it_cannot_write_is_one_line(run, tmp_path, capsys,
                                                                              blank_plots):
    args = ("--checkpoint", str(run["run_dir"]), "--split", "validation", "--plot")
    default = "loss_by_position_validation.png"
    for given, written in ((str(tmp_path / "lbp"), tmp_path / "lbp.png"),  # no extension: .png, said
                           (str(tmp_path), tmp_path / default),  # a folder
                           # A path ending in a separator: a folder, made, whatever its name looks like
                           (f"{tmp_path / 'plots'}/", tmp_path / "plots" / default),
                           (f"{tmp_path / 'plots.v2'}/", tmp_path / "plots.v2" / default)):
        status, stdout, stderr = run_cli(capsys, *args, given)
        assert status == 0, stderr
        assert f"wrote {written}\n" in stdout and written.read_bytes()[:4] == b"\x89PNG"
    status, stdout, stderr = run_cli(capsys, *args, str(tmp_path / "lbp.txt"))
    assert status == 2 and stdout == "" and stderr.count("\n") == 1
    assert "'.txt' is not an image format this writes" in stderr


def test_cli_a_plot_it_cannot_write_is_one_line_before_the_scoring(run, tmp_path, capsys, small_tmpfs):
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT, encoding="utf-8")
    small_tmpfs.make_read_only()  # as a run folder on a read-only disk
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                     str(text_file), "--plot", str(small_tmpfs / "lbp.png"))
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr  # nothing scored first
    assert f"cannot write {small_tmpfs}: Read-only file system" in stderr and "--no-plot" in stderr


def test_cli_no_plot_wins_over_a_plot_path_it_would_refuse(run, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT[:200], encoding="utf-8")
    (tmp_path / "a_file").write_text("", encoding="utf-8")
    for plot in (str(tmp_path / "lbp.txt"), str(tmp_path / "a_file" / "lbp.png")):  # a bad format, no folder
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                         str(text_file), "--plot", plot, "--no-plot")
        assert status == 0 and stderr == "" and "wrote" not in stdout, (plot, stderr)


def test_cli_plot_keeps_a_format_extension_given_in_any_case(run, tmp_path, capsys, blank_plots):
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT[:200], encoding="utf-8")
    for name, magic in (("lbp.pdf", b"%PDF"), ("upper.PNG", b"\x89PNG")):
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                         str(text_file), "--plot", str(tmp_path / name))
        assert status == 0, stderr
        assert f"wrote {tmp_path / name}\n" in stdout and (tmp_path / name).read_bytes()[:4] == magic
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lbp.pdf", "text.txt", "upper.PNG"]


def test_cli_a_text_without_a_full_window_is_not_plotted_and_one_with_no_tail_says_no_tail(
        run, tmp_path, capsys):
    text_file, plot = tmp_path / "text.txt", tmp_path / "lbp.png"
    text_file.write_text(TEXT[:CONTEXT], encoding="utf-8")  # 31 targets: a tail only
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                     str(text_file), "--plot", str(plot))
    assert status == 0, stderr
    assert f"no full window ({CONTEXT} tokens < context_length + 1 = {CONTEXT + 1})" in stdout
    assert "wrote" not in stdout and not plot.exists()
    text_file.write_text(TEXT[:2 * CONTEXT + 1], encoding="utf-8")  # exactly two windows of targets
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                     str(text_file), "--no-plot")
    assert status == 0 and f"{2 * CONTEXT + 1} tokens, 2 windows of {CONTEXT}\n" in stdout, stdout


def test_cli_an_imported_folder_with_a_context_over_the_batch_tokens_scores_one_window_at_a_time(
        run, tmp_path, capsys, monkeypatch):
    from tinyattn.cli import eval as eval_cli
    from tinyattn.hf.folder import export_folder

    loaded = load_model(run["run_dir"])
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "hf")
    (tmp_path / "text.txt").write_text(TEXT[:300], encoding="utf-8")
    sizes, real = [], evaluate.evaluate_tokens
    monkeypatch.setattr(evaluate, "evaluate_tokens",
                        lambda model, tokenizer, tokens, batch_size, *a, **k:
                        sizes.append(batch_size) or real(model, tokenizer, tokens, batch_size, *a, **k))
    monkeypatch.setattr(eval_cli, "EVAL_BATCH_TOKENS", CONTEXT - 1)
    status, _, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "hf"), "--text-file",
                                str(tmp_path / "text.txt"), "--no-plot")
    assert status == 0 and sizes == [1], stderr


def test_cli_a_checkpoint_without_a_data_fingerprint_is_scored_with_a_note(run, tmp_path, capsys):
    from tinyattn import checkpoint as ckpt

    state = ckpt.load_checkpoint(run["run_dir"] / "best.pt")
    del state["data"]  # as an older tinyattn saved it
    ckpt.save_checkpoint({k: v for k, v in state.items() if k not in ("format", "format_version")},
                         tmp_path / "old.pt")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "old.pt"), "--split", "train",
                                     "--no-plot")
    assert status == 0 and "on the train split" in stdout, stderr
    assert stderr == (f"note: {tmp_path / 'old.pt'} records no data fingerprint (saved by an older "
                      "tinyattn): whether this train split is the run's cannot be checked\n")


def test_cli_says_which_characters_of_a_text_file_a_character_model_scores_as_unknown(run, tmp_path, capsys):
    text_file = tmp_path / "accents.txt"
    for added, named in (("héllo wörld", "2 characters the tokenizer has never seen, scored as [UNK]: 'é', 'ö'"),
                         ("héllo héllo", "1 character the tokenizer has never seen, scored as [UNK]: 'é'")):
        text_file.write_text(TEXT[:200] + added, encoding="utf-8")
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                         str(text_file), "--no-plot")
        assert status == 0, stderr
        assert f"warning: {text_file}: {named}\n" in stderr
    text_file.write_text(TEXT[:200], encoding="utf-8")
    assert "warning" not in run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file", str(text_file),
                                    "--no-plot")[2]


@pytest.mark.parametrize("split", [["--split", "validation"], []], ids=["given", "default"])
def test_cli_scores_the_runs_validation_split(run, capsys, split):
    # Without --split or --text-file: the validation split, never the text it trained on.
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"] / "best.pt"), *split,
                                     "--no-plot")
    assert status == 0, stderr
    expected = evaluate_tokens(run["model"], run["tokenizer"], run["data"].validation, 16, True)
    assert printed("loss", stdout) == pytest.approx(expected.loss, abs=1e-4)
    assert "on the validation split" in stdout and "wrote" not in stdout


def test_cli_a_text_file_too_short_to_predict_from_is_one_line_naming_it(run, tmp_path, capsys):
    for name, text, tokens in (("empty.txt", "", "0 tokens"), ("one.txt", "A", "1 token")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"]), "--text-file",
                                         str(tmp_path / name), "--no-plot")
        assert status == 2 and stdout == "", stderr
        assert stderr == (f"error: {tmp_path / name} has {tokens}; evaluation needs at least 2 "
                          "(one to read, one to predict)\n")


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "no/such/run"],
     "no/such/run: no such checkpoint file, run folder or Hugging Face folder"),
    (["--text-file", "no/such/file.txt"], "no/such/file.txt: text file not found"),
    (["--batch-size", "0"], "--batch-size 0: expected a positive integer"),
], ids=["missing-checkpoint", "missing-text-file", "zero-batch-size"])
def test_cli_bad_input_is_one_line_and_exit_status_2(run, args, message, capsys):
    if args[0] != "--checkpoint":
        args = ["--checkpoint", str(run["run_dir"]), *args]
    status, _, stderr = run_cli(capsys, *args)
    assert status == 2
    assert stderr.startswith("error: ") and message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_cli_split_train_scores_the_runs_training_split(run, capsys):
    # --split train: the text the run trained on, not the validation split under another name.
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run["run_dir"] / "best.pt"),
                                     "--split", "train", "--no-plot")
    assert status == 0, stderr
    expected = evaluate_tokens(run["model"], run["tokenizer"], run["data"].train, 16, True)
    validation = evaluate_tokens(run["model"], run["tokenizer"], run["data"].validation, 16, True)
    assert expected.loss != pytest.approx(validation.loss, abs=1e-4)  # the two splits tell apart
    assert printed("loss", stdout) == pytest.approx(expected.loss, abs=1e-4)
    assert f"on the train split: {len(run['data'].train):,} tokens" in stdout


def test_cli_bits_per_byte_are_the_texts_nats_over_its_bytes_not_per_token(run, tmp_path, capsys):
    from tinyattn.hf.folder import export_folder

    loaded = load_model(run["run_dir"])
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "hf")
    text = TEXT[:90] + "ΩΩΩΩΩΩ " + TEXT[:30]  # Ω: one token, two bytes: bytes and tokens differ by 6
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "hf"), "--text-file",
                                     str(tmp_path / "text.txt"), "--no-plot")
    assert status == 0, stderr
    tokens = int(re.search(r": ([0-9,]+) tokens,", stdout).group(1).replace(",", ""))
    units = int(re.search(r"\(([0-9,]+) bytes\)", stdout).group(1).replace(",", ""))
    assert units == tokens - 1 + 6
    nats = printed("loss", stdout) * (tokens - 1)  # the loss is per predicted token
    assert printed("bits per byte", stdout) == pytest.approx(nats / math.log(2) / units, rel=1e-3)


def test_cli_a_split_whose_data_now_builds_another_tokenizer_is_refused_in_one_line(run, tmp_path, capsys):
    # The run's corpus with a character it never had: the char tokenizer built from it gives other
    # ids, so its tokens are not the ones the checkpoint reads; scoring them would be noise.
    from tinyattn import checkpoint as ckpt

    state = ckpt.load_checkpoint(run["run_dir"] / "best.pt")
    corpus = tmp_path / "corpus.txt"
    text = open(state["config"]["data"]["files"][0], encoding="utf-8").read()
    corpus.write_text("§" + text, encoding="utf-8")
    state["config"]["data"].update(files=[str(corpus)], cache_dir=str(tmp_path / "cache"))
    ckpt.save_checkpoint({k: v for k, v in state.items() if k not in ("format", "format_version")},
                         tmp_path / "moved.pt")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "moved.pt"), "--no-plot")
    assert status == 2 and stdout == "", stderr
    last = stderr.splitlines()[-1]  # after the cache build's progress bars
    assert last.startswith("error: ") and "Traceback" not in stderr, stderr
    assert f"the data's tokenizer differs from the one in {tmp_path / 'moved.pt'}" in last
