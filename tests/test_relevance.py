"""Relevance: the model's key and head masks on both paths, token and head ablation on a
hand-built model whose answer is known, windows for long texts, rank correlation, the table,
the TensorBoard grid, the command."""

import io
import math

import numpy as np
import pytest
import torch

from tinyattn.analysis.ablation import (
    HEAD_ABLATION_CELL,
    HEAD_ABLATION_GAP,
    Relevance,
    agreement,
    compute_relevance,
    format_head_ablation,
    format_relevance_table,
    head_ablation,
    head_ablation_image,
    log_head_ablation_to_tensorboard,
    rank_correlation,
    ranks,
    reading_starts,
    relevance_of_text,
    scaled_heads,
    window_starts,
)
from tinyattn.analysis.attention_maps import compute_attention_maps
from tinyattn.config import ModelConfig, TokenizerConfig
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.model.attention import causal_mask
from tinyattn.model.transformer import LanguageModel

VOCAB = 5
PERIOD = 3  # the hand-built model's text: START 0 1 2 0 1 2 ...
START = 3  # a token the model predicts nothing from


def random_model(seed=0, **overrides) -> LanguageModel:
    torch.manual_seed(seed)
    options = dict(vocab_size=11, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, context_length=16)
    options.update(overrides)
    return LanguageModel(ModelConfig(**options)).eval()


def previous_token_model(sharpness: float = 60.0, logit: float = 30.0) -> LanguageModel:
    """Two heads in one layer, MLP off. Head 0 attends to the previous token and copies it;
    head 1 writes nothing. The head reads only the copy and predicts (previous + 2) mod 3,
    which is the next token of 0 1 2 0 1 2 ..., so each prediction needs exactly the token
    before the query, and nothing else. After START (and at START itself, which reads only
    itself) every logit is 0: a uniform guess, loss ln 5.

    Residual stream (width 32): dims 0..4 the token (one-hot), dim 5 a constant 1, dims
    6..10 the copied previous token. Head 0's queries and keys are the same constant
    vector, the keys turned one RoPE step ahead, so a query's score is largest on the key
    one position back (rope_base 10: with head width 16 the margin is large).
    """
    config = ModelConfig(vocab_size=VOCAB, n_layer=1, n_head=2, n_kv_head=2, n_embd=32, context_length=24,
                         tie_embeddings=False, rope_base=10.0, mlp_hidden=8)
    model = LanguageModel(config).eval()
    C, D = 32, 16
    norm = math.sqrt(C / 2)  # RMSNorm of one-hot + constant: every entry times sqrt(C / 2)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # norm gains
        model.token_embedding.weight[:, 5] = 1.0
        model.token_embedding.weight[torch.arange(VOCAB), torch.arange(VOCAB)] = 1.0
        qkv = model.blocks[0].attention.qkv.weight  # (C + 2 * 32, C): q rows, k rows, v rows
        theta = model.rope_sin[1].atan2(model.rope_cos[1])  # (D/2,): one step's angle per pair
        scale = sharpness / norm
        qkv[0:D // 2, 5] = scale  # head 0's query: (1, ..., 1 | 0, ..., 0) * sharpness
        qkv[C:C + D // 2, 5] = torch.cos(theta) * scale  # head 0's key: the same, one step turned
        qkv[C + D // 2:C + D, 5] = torch.sin(theta) * scale
        qkv[2 * C + torch.arange(VOCAB), torch.arange(VOCAB)] = 1.0 / norm  # head 0's value: the token
        model.blocks[0].attention.output.weight[6 + torch.arange(VOCAB), torch.arange(VOCAB)] = 1.0
        for previous in range(PERIOD):
            model.head.weight[(previous + 2) % PERIOD, 6 + previous] = logit
    return model


def periodic_text(length: int) -> list[int]:
    return [START] + [i % PERIOD for i in range(length - 1)]


# ----------------------------------------------------------------------------- the model's masks


@pytest.mark.parametrize("n_kv_head", [4, 1], ids=["mha", "mqa"])
def test_fused_and_explicit_paths_agree_with_a_key_mask_and_a_head_mask(n_kv_head):
    model = random_model(n_kv_head=n_kv_head)
    idx = torch.randint(0, 11, (3, 16), generator=torch.Generator().manual_seed(1))
    mask = causal_mask(16, 16).repeat(3, 1, 1, 1)  # (3, 1, T, T): each sequence its own
    mask[0, 0, 5:, 4] = False  # sequence 0 without key 4, sequence 1 without key 0
    mask[1, 0, 1:, 0] = False
    heads = torch.ones(3, 2, 4)
    heads[2, 1, 2] = 0.0  # sequence 2: head 2 of layer 1 and every head of layer 0
    heads[2, 0, :] = 0.0
    with scaled_heads(model, heads):
        fused = model(idx, mask=mask).logits
        explicit = model(idx, mask=mask, need_weights=True).logits
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)
    plain = model(idx).logits
    assert (fused - plain).abs().amax((1, 2)).min() > 1e-3  # every sequence was changed
    torch.testing.assert_close(fused[0, :5], plain[0, :5], rtol=0, atol=1e-5)  # queries before key 4 were not


def test_a_masked_key_gets_weight_zero_from_later_queries_only():
    model = random_model()
    idx = torch.randint(0, 11, (1, 16), generator=torch.Generator().manual_seed(2))
    mask = causal_mask(16, 16).clone()
    mask[8:, 7] = False
    weights = model(idx, mask=mask, need_weights=True).attention_weights
    for layer in weights:
        assert torch.all(layer[0, :, 8:, 7] == 0) and torch.all(layer[0, :, 7, 7] > 0)
        torch.testing.assert_close(layer.sum(-1), torch.ones(1, 4, 16))


def test_a_zero_head_mask_equals_zeroing_that_heads_slice_of_the_output_projection():
    model = random_model()
    idx = torch.randint(0, 11, (1, 16), generator=torch.Generator().manual_seed(3))
    heads = torch.ones(2, 4)
    heads[1, 3] = 0.0
    plain = model(idx).logits
    with scaled_heads(model, heads):
        masked = model(idx).logits
    torch.testing.assert_close(model(idx).logits, plain, rtol=0, atol=0)  # the hooks are gone after
    with torch.no_grad():
        model.blocks[1].attention.output.weight[:, 24:32] = 0.0  # head 3's inputs to the projection
    torch.testing.assert_close(masked, model(idx).logits, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- known answers


def test_the_hand_built_model_reads_the_previous_token_and_predicts_the_text():
    model = previous_token_model()
    ids = periodic_text(24)
    rel = compute_relevance(model, ids)
    head0 = rel.weights[0, 0]
    for t in range(1, 24):
        assert head0[t, t - 1] > 0.99
    np.testing.assert_allclose(rel.losses[:2], np.log(VOCAB), atol=1e-6)  # from START: a uniform guess
    assert np.nanmax(rel.losses[2:]) < 1e-3  # every later prediction is right


def test_token_ablation_finds_the_previous_token_most_relevant_for_every_query():
    rel = compute_relevance(previous_token_model(), periodic_text(24))
    for t in range(1, 23):
        row = rel.token_relevance[t, :t]
        assert np.argmax(row) == t - 1
        assert row[t - 1] > 5.0  # without it the head copies the wrong token: a confident mistake
        assert np.all(np.abs(np.delete(row, t - 1)) < 1e-3)  # nothing else matters
    measured = rel.measured()
    assert np.array_equal(measured, np.tril(np.ones((24, 24), dtype=bool), k=-1) & (np.arange(24) < 23)[:, None])
    assert agreement(rel).by_head[0, 0] > 0.5  # this head's weight ranks the pairs as relevance does


def test_head_ablation_finds_the_copying_head_and_exactly_nothing_for_the_silent_one():
    rises, mean_loss = head_ablation(previous_token_model(), periodic_text(24))
    assert rises.shape == (1, 2)
    # 23 predictions: 2 uniform guesses (ln 5) and 21 right ones (0); without head 0 all are guesses.
    assert mean_loss == pytest.approx(2 * np.log(VOCAB) / 23, abs=1e-4)
    assert rises[0, 0] == pytest.approx(21 * np.log(VOCAB) / 23, abs=1e-4)
    assert rises[0, 1] == 0.0  # its output is zero whether zeroed or not


def test_relevance_is_the_loss_of_a_forward_with_that_key_masked():
    model = random_model()
    ids = torch.randint(0, 11, (16,), generator=torch.Generator().manual_seed(4)).tolist()
    rel = compute_relevance(model, ids)
    x, y = torch.tensor([ids[:-1] + [0]]), torch.tensor([ids[1:] + [0]])
    for key in (0, 6, 13):
        mask = causal_mask(16, 16).clone()
        mask[key + 1:, key] = False
        with torch.no_grad():
            losses = torch.nn.functional.cross_entropy(model(x, mask=mask).logits[0], y[0], reduction="none")
        expected = losses[key + 1:15].double().numpy() - rel.losses[key + 1:15]
        np.testing.assert_allclose(rel.token_relevance[key + 1:15, key], expected, atol=1e-5)
    heads = torch.ones(2, 4)
    heads[1, 2] = 0.0
    with torch.no_grad():
        with scaled_heads(model, heads):
            zeroed = torch.nn.functional.cross_entropy(model(x).logits[0, :15], y[0, :15])
    assert rel.head_relevance[1, 2] == pytest.approx(float(zeroed) - rel.mean_loss, abs=1e-5)


def test_head_ablation_of_a_model_in_training_runs_without_dropout_and_leaves_it_training():
    # The training loop's head_ablation hook hands over the model as it trains, dropout on.
    model = random_model(dropout=0.5)
    ids = torch.randint(0, 11, (16,), generator=torch.Generator().manual_seed(6)).tolist()
    rises, mean_loss = head_ablation(model, ids)
    model.train()
    in_training = head_ablation(model, ids)
    np.testing.assert_array_equal(in_training[0], rises)
    assert in_training[1] == mean_loss and model.training
    model.eval()
    evaluated = compute_relevance(model, ids)
    model.train()
    trained = compute_relevance(model, ids)  # token ablation and weights too: no dropout, left training
    np.testing.assert_array_equal(trained.token_relevance, evaluated.token_relevance)
    np.testing.assert_array_equal(trained.weights, evaluated.weights)
    assert model.training


def test_relevance_and_head_ablation_do_not_depend_on_how_the_variants_are_batched(monkeypatch):
    # One ablated variant per forward: every chunk boundary, the last one included, is crossed.
    from tinyattn.analysis import ablation

    model = random_model()
    ids = torch.randint(0, 11, (16,), generator=torch.Generator().manual_seed(8)).tolist()
    whole = compute_relevance(model, ids)
    monkeypatch.setattr(ablation, "CHUNK_ELEMENTS", 1)
    one_at_a_time = compute_relevance(model, ids)
    np.testing.assert_array_equal(one_at_a_time.measured(), whole.measured())
    np.testing.assert_allclose(one_at_a_time.token_relevance, whole.token_relevance, atol=1e-5)
    np.testing.assert_allclose(one_at_a_time.head_relevance, whole.head_relevance, atol=1e-5)


def test_a_text_with_nothing_to_predict_or_a_token_outside_the_vocabulary_is_a_one_line_error():
    from tinyattn.errors import TinyattnError

    model = random_model()  # vocabulary 0..10
    with pytest.raises(TinyattnError, match=r"the text has 1 token: relevance needs at least 2"):
        compute_relevance(model, [3])
    for ids in ([1, 11], [-1, 2]):
        with pytest.raises(TinyattnError, match=r"token ids must lie in 0\.\.10, the model's vocabulary"):
            compute_relevance(model, ids)
        with pytest.raises(TinyattnError, match="the model's vocabulary"):
            head_ablation(model, ids)
    assert compute_relevance(model, [0, 10]).num_tokens == 2  # both ends of the vocabulary


# ----------------------------------------------------------------------------- windows


def test_windows_start_every_half_context_and_each_token_reads_at_least_half_a_context():
    assert window_starts(10, 16) == [0]
    assert window_starts(16, 16) == [0]
    assert window_starts(128, 64) == [0, 32, 64]
    assert window_starts(129, 64) == [0, 32, 64, 96]
    reach = reading_starts(128, 64)
    assert list(reach[:64]) == [0] * 64 and list(reach[64:96]) == [32] * 32 and list(reach[96:]) == [64] * 32
    assert np.all(np.arange(128)[64:] - reach[64:] >= 32)


def test_a_long_text_measures_each_query_in_its_window_as_the_model_sees_that_window_alone():
    model = random_model()
    ids = torch.randint(0, 11, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    rel = compute_relevance(model, ids)
    assert list(rel.reach[[0, 15, 16, 23, 24, 31, 32, 39]]) == [0, 0, 8, 8, 16, 16, 24, 24]
    alone = compute_relevance(model, ids[16:32])  # the window that measures queries 24..31
    np.testing.assert_allclose(rel.weights[:, :, 24:32, 16:32], alone.weights[:, :, 8:16], atol=1e-6)
    np.testing.assert_allclose(rel.token_relevance[24:31, 16:31], alone.token_relevance[8:15, :15], atol=1e-5)
    assert np.all(rel.weights[:, :, 24:32, :16] == 0) and np.all(np.isnan(rel.token_relevance[24:32, :16]))
    assert np.isnan(rel.losses[39]) and not np.isnan(rel.losses[:39]).any()
    # Head ablation scores the same predictions, each once, in the window that owns it.
    _, mean_loss = head_ablation(model, ids)
    assert mean_loss == pytest.approx(float(np.mean(rel.losses[:39])), abs=1e-5)


def test_a_last_window_that_owns_only_the_last_token_measures_nothing_there_and_raises_nothing():
    # 25 tokens, context 16: windows start at 0, 8 and 16, and the last owns token 24 alone, which
    # predicts nothing.
    model = random_model()
    ids = torch.randint(0, 11, (25,), generator=torch.Generator().manual_seed(9)).tolist()
    assert window_starts(25, 16) == [0, 8, 16] and list(reading_starts(25, 16)[23:]) == [8, 16]
    rel = compute_relevance(model, ids)
    assert np.isnan(rel.losses[24]) and np.all(np.isnan(rel.token_relevance[24]))
    assert not np.isnan(rel.losses[:24]).any() and rel.measured()[23, 8:23].all()
    np.testing.assert_array_equal(rel.weights[:, :, 24, :16], 0.0)
    assert rel.weights[:, :, 24, 16:25].sum() == pytest.approx(rel.num_layers * rel.num_heads, abs=1e-4)


def test_head_ablation_of_a_long_text_counts_each_prediction_once_in_the_window_that_owns_it():
    # 60 tokens read in windows of 24 starting every 12: each window also holds queries an earlier
    # window measured. Without head 0 every prediction is a uniform guess, so the rise is exactly
    # the loss of the 57 right predictions spread over the 59.
    rises, mean_loss = head_ablation(previous_token_model(), periodic_text(60))
    assert mean_loss == pytest.approx(2 * np.log(VOCAB) / 59, abs=1e-4)
    assert rises[0, 0] == pytest.approx(57 * np.log(VOCAB) / 59, abs=1e-4)
    assert rises[0, 1] == 0.0


# ----------------------------------------------------------------------------- correlation, table, images


def test_ranks_share_ties_and_rank_correlation_is_spearmans():
    np.testing.assert_array_equal(ranks(np.array([10.0, 30.0, 20.0, 20.0])), [1, 4, 2.5, 2.5])
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert rank_correlation(a, a ** 3) == pytest.approx(1.0)  # monotone, not linear
    assert rank_correlation(a, -a) == pytest.approx(-1.0)
    assert rank_correlation(a, np.array([2.0, 1.0, 4.0, 3.0, 5.0])) == pytest.approx(0.8)  # 1 - 6*4/(5*24)
    assert math.isnan(rank_correlation(a, np.ones(5)))


def test_a_rank_correlation_of_too_few_or_constant_values_is_nan_without_a_warning(char_tokenizer):
    # The first query has no earlier key: its table's correlations are over no pairs at all.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice", "invalid value" would reach the user
        for a, b in (([], []), ([1.0], [2.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])):
            assert math.isnan(rank_correlation(np.array(a), np.array(b)))
        model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
        table = format_relevance_table(relevance_of_text(model, char_tokenizer, "abc"), 0)
    assert "this query's 0 keys n/a (mean weight)" in table


@pytest.fixture(scope="module")
def char_tokenizer():
    return build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abcdefghij klmnop.\n"]))


def test_the_table_has_a_row_per_earlier_token_with_its_weights_and_relevance(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    rel = relevance_of_text(model, char_tokenizer, "abc defg hij")
    assert rel.labels[3] == "␣"
    lines = format_relevance_table(rel, 7).splitlines()
    assert lines[0].startswith("query g at position 7 (of 12 tokens) predicts ␣ with loss")
    assert lines[2].split()[:4] == ["pos", "token", "relevance", "weight"] and lines[2].split()[-1] == "L1H3"
    rows = lines[3:-2]
    assert [int(r.split()[0]) for r in rows] == list(range(7))  # every earlier token, in text order
    key = 5
    cells = rows[key].split()
    assert cells[1] == "e" and float(cells[2]) == pytest.approx(rel.token_relevance[7, key], abs=5e-4)
    assert float(cells[3]) == pytest.approx(rel.weights[:, :, 7, key].mean(), abs=5e-4)
    assert [float(c) for c in cells[6:]] == pytest.approx(list(rel.weights[:, :, 7, key].ravel()), abs=5e-4)
    assert lines[-2].startswith("rank correlation (Spearman) of weight with relevance: this query's 7 keys")
    by_size = f"{agreement(rel, 7, size=True).mean:+.2f} (mean weight)"
    assert lines[-1].startswith("rank correlation (Spearman) of weight with |relevance| (how much the key "
                                f"matters, either way): this query's 7 keys {by_size}")
    # The first token reads no earlier key: no correlation, said as the explorer says it, not +nan.
    first = format_relevance_table(rel, 0).splitlines()
    assert first[3:-2] == [] and "this query's 0 keys n/a (mean weight); the whole text's" in first[-1]
    assert "nan" not in first[-1] + first[-2]
    top = format_relevance_table(rel, 7, top=2).splitlines()[3:-2]
    assert [int(r.split()[0]) for r in top] == list(np.argsort(-np.abs(rel.token_relevance[7, :7]), kind="stable")[:2])
    assert len(format_head_ablation(rel).splitlines()) == 2 + 2


def test_the_tables_columns_stay_aligned_under_labels_longer_than_the_token_header():
    # Subword tokens: labels of any length; each row's numbers start where the header's do.
    labels = ["a", "subword", "x", "a-longer-label", "b", "ok"]
    rel = compute_relevance(random_model(), [1, 2, 3, 4, 5, 6], labels)
    lines = format_relevance_table(rel, 4).splitlines()
    header, rows = lines[2], lines[3:-2]
    assert [row.split()[1] for row in rows] == labels[:4]
    column = header.index("relevance") + len("relevance")
    assert all(row[column - 9:column].strip().startswith(("+", "-")) for row in rows)
    assert len({len(row) for row in rows}) == 1


def test_the_table_of_a_query_in_a_later_window_lists_only_the_keys_in_its_reach(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size)  # context 16: windows at 0, 8 and 16
    rel = relevance_of_text(model, char_tokenizer, "abc defg hij klmnop abc defg hij")  # 32 tokens
    assert rel.reach[28] == 16
    lines = format_relevance_table(rel, 28).splitlines()
    assert lines[0].endswith("it reads keys 16..28")
    rows = lines[3:-2]
    assert [int(row.split()[0]) for row in rows] == list(range(16, 28))  # no row for a key out of reach
    assert "nan" not in "\n".join(rows)


def test_the_head_ablation_table_prints_each_layers_and_heads_rise(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    measured = relevance_of_text(model, char_tokenizer, "abc defg hij")
    # Rises distinct in every cell at the printed precision, so a row or column from elsewhere shows.
    rises = np.array([[0.125, -0.031, 0.5, 0.0], [1.25, 0.062, -0.75, 0.017]])
    rel = Relevance(**{**measured.__dict__, "head_relevance": rises})
    lines = format_head_ablation(rel).splitlines()
    assert lines[0] == (f"head ablation: rise in the mean loss ({rel.mean_loss:.3f} nats over 11 "
                        "predictions) with one head's output zeroed")
    assert lines[1].split() == ["layer", "head", "0", "head", "1", "head", "2", "head", "3"]
    assert [int(line.split()[0]) for line in lines[2:]] == [0, 1]
    grid = np.array([[float(cell) for cell in line.split()[1:]] for line in lines[2:]])
    np.testing.assert_allclose(grid, rises, rtol=0, atol=5e-4)
    assert lines[2].split()[1:] == ["+0.125", "-0.031", "+0.500", "+0.000"]  # signed, three decimals


def test_the_last_token_has_no_relevance_table(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    rel = relevance_of_text(model, char_tokenizer, "abc")
    with pytest.raises(Exception, match="the last token: it predicts nothing"):
        format_relevance_table(rel, 2)


def test_weights_match_the_attention_maps_of_a_text_within_the_context(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    rel = relevance_of_text(model, char_tokenizer, "abc defg hij klm")
    maps = compute_attention_maps(model, char_tokenizer, "abc defg hij klm")
    np.testing.assert_allclose(rel.weights, np.stack(maps.weights), atol=1e-6)


def test_head_ablation_image_is_a_cell_per_head_red_for_a_rise_blue_for_a_fall():
    rises = np.array([[0.5, 0.0, -0.5], [2.0, 0.25, -0.1]])
    image = head_ablation_image(rises)
    cell, gap = HEAD_ABLATION_CELL, HEAD_ABLATION_GAP
    assert image.shape == (2 * cell + gap, 3 * cell + 2 * gap, 3)

    def color(layer, head):
        return tuple(image[layer * (cell + gap) + cell // 2, head * (cell + gap) + cell // 2])

    assert color(0, 0) == (178, 24, 43) and color(1, 0) == (178, 24, 43)  # full scale and beyond
    assert color(0, 1) == (255, 255, 255) and color(0, 2) == (33, 102, 172)
    assert color(1, 1)[0] > color(1, 1)[2] and color(1, 2)[2] > color(1, 2)[0]


def test_head_ablation_is_logged_to_tensorboard_as_an_image(char_tokenizer, tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    writer = SummaryWriter(str(tmp_path))
    log_head_ablation_to_tensorboard(writer, model, char_tokenizer, "abc defg", step=3)
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0}).Reload()
    [logged] = events.Images("head_ablation/grid")
    decoded = np.asarray(Image.open(io.BytesIO(logged.encoded_image_string)).convert("RGB"))
    rises, _ = head_ablation(model, char_tokenizer.encode("abc defg"))
    assert logged.step == 3
    np.testing.assert_array_equal(decoded, head_ablation_image(rises))


def test_a_one_token_probe_text_logs_no_head_ablation_and_raises_nothing(char_tokenizer, tensorboard_writer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    log_head_ablation_to_tensorboard(tensorboard_writer, model, char_tokenizer, "a", step=3)
    assert tensorboard_writer.images == []


def test_agreement_ranks_each_layers_and_each_heads_weight_against_relevance():
    model = random_model()
    ids = torch.randint(0, 11, (16,), generator=torch.Generator().manual_seed(7)).tolist()
    rel = compute_relevance(model, ids)
    pairs, relevance = rel.measured(), rel.token_relevance[rel.measured()]
    result = agreement(rel)
    for layer in range(2):
        expected = rank_correlation(rel.weights[layer].mean(0)[pairs], relevance)
        assert result.by_layer[layer] == pytest.approx(expected)
        for head in range(4):
            assert result.by_head[layer, head] == pytest.approx(
                rank_correlation(rel.weights[layer, head][pairs], relevance))
    assert result.by_layer[0] != pytest.approx(result.by_layer[1])  # the layers tell apart
    assert result.mean == pytest.approx(rank_correlation(rel.weights.mean((0, 1))[pairs], relevance))
    by_size = agreement(rel, size=True)  # against how much each key matters, either way
    assert by_size.mean == pytest.approx(rank_correlation(rel.weights.mean((0, 1))[pairs], np.abs(relevance)))
    assert by_size.by_head[1, 2] == pytest.approx(rank_correlation(rel.weights[1, 2][pairs], np.abs(relevance)))
    assert by_size.mean != pytest.approx(result.mean)


def test_a_heavily_weighted_key_whose_masking_helps_agrees_by_size_and_disagrees_by_sign():
    """The chapter's reading: weight finding the keys that matter (either way) is what |relevance| ranks."""
    weights = np.zeros((1, 1, 4, 4))
    weights[0, 0, 3, :3] = [0.05, 0.15, 0.8]  # query 3 weights key 2 most, then 1, then 0
    relevance = np.full((4, 4), np.nan)
    relevance[3, :3] = [0.01, 0.1, -0.9]  # masking key 2 helps the prediction most
    rel = Relevance(token_ids=[0, 1, 2, 3], labels=list("abcd"), context_length=8,
                    reach=np.zeros(4, dtype=int), weights=weights, losses=np.array([1.0, 1.0, 1.0, 1.0]),
                    token_relevance=relevance, head_relevance=np.zeros((1, 1)), mean_loss=1.0)
    assert agreement(rel, 3).mean < 0 < agreement(rel, 3, size=True).mean == pytest.approx(1.0)


def test_the_table_shows_only_the_layers_and_heads_asked(char_tokenizer):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    rel = relevance_of_text(model, char_tokenizer, "abc defg hij")
    lines = format_relevance_table(rel, 7, layers=[1], heads=[2]).splitlines()
    assert lines[2].split() == ["pos", "token", "relevance", "weight", "L1", "L1H2"]
    cells = lines[3 + 5].split()  # key 5
    expected = [rel.weights[1, :, 7, 5].mean(), rel.weights[1, 2, 7, 5]]
    assert [float(c) for c in cells[4:]] == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("layers, heads, columns, described", [
    (None, None, ["L0", "L1", "L0H0", "L1H3"],
     "mean over every head, each layer's mean, then each head (LxHy)"),
    (None, [], ["L0", "L1"], "mean over every head, each layer's mean"),  # as notebooks/tour.ipynb asks
    ([], [], [], "mean over every head"),
], ids=["all", "no-heads", "mean-only"])
def test_the_tables_header_describes_only_the_weight_columns_it_prints(char_tokenizer, layers, heads, columns,
                                                                       described):
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    rel = relevance_of_text(model, char_tokenizer, "abc defg hij")
    lines = format_relevance_table(rel, 7, layers=layers, heads=heads).splitlines()
    assert lines[1].endswith("; weights: " + described), lines[1]
    printed = lines[2].split()[4:]
    assert all(column in printed for column in columns) and len(printed) == len(set(printed))
    assert any("H" in column for column in printed) == ("LxHy" in lines[1])


def test_the_tables_weight_columns_are_the_mean_of_all_heads_of_each_layer_and_each_head(char_tokenizer):
    # Weights made distinct in every layer and head, so a column averaged over the wrong ones shows.
    model = random_model(vocab_size=char_tokenizer.vocab_size, context_length=32)
    measured = relevance_of_text(model, char_tokenizer, "abc defg hij")
    weights = measured.weights.copy()
    weights[:, :, 7, 5] = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]
    rel = Relevance(**{**measured.__dict__, "weights": weights})
    cells = format_relevance_table(rel, 7).splitlines()[3 + 5].split()  # key 5
    assert cells[1] == "e"
    assert [float(c) for c in cells[3:6]] == pytest.approx([0.45, 0.25, 0.65], abs=5e-4)
    assert [float(c) for c in cells[6:]] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], abs=5e-4)
