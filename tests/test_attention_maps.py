"""Attention maps: weights that reproduce the fused output, heatmap PNGs and TensorBoard images,
the query table, the CLI."""

import functools
import io
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import unrendered_figures
from tinyattn.analysis import attention_maps as maps_module
from tinyattn.analysis.attention_maps import (
    TENSORBOARD_GAP,
    AttentionMaps,
    attention_heatmap_images,
    compute_attention_maps,
    format_query_table,
    heatmap_size_pixels,
    layer_image,
    log_attention_to_tensorboard,
    query_position_of_word,
    query_table,
    save_heatmaps,
    tensorboard_image_size,
    tensorboard_scale,
    visible,
)
from tinyattn.analysis.plotting import MASKED_RGB, VIRIDIS, WHITE, PlottingUnavailable, colormap
from tinyattn.cli.attention import main
from tinyattn.config import TokenizerConfig, load_config
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.errors import TinyattnError

CORPUS = ("The book that the student borrowed from the library was fascinating.\n"
          "ROMEO:\nBut soft, what light through yonder window breaks? It is the east.\n") * 4
SENTENCE = "The book that the student borrowed from the library was fascinating."


@pytest.fixture(scope="module")
def tokenizer(char_tokenizer):
    return char_tokenizer  # conftest's: its corpus holds SENTENCE and the ROMEO lines


@pytest.fixture(scope="module")
def tiny_model(tiny_model, tokenizer):
    """conftest's tiny model over the character vocabulary, with two key/value heads and context 96."""
    return functools.partial(tiny_model, vocab_size=tokenizer.vocab_size, n_kv_head=2, context_length=96)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_weights_times_values_reproduce_the_fused_output_of_every_layer(tiny_model, tokenizer, n_kv_head):
    model = tiny_model(n_kv_head=n_kv_head)
    captured = {}

    def keep(layer):
        def hook(module, inputs, output):
            captured[layer] = (inputs[0].detach(), output.detach())  # layer input x, fused output
        return hook

    handles = [block.attention.register_forward_hook(keep(i)) for i, block in enumerate(model.blocks)]
    idx = torch.tensor([tokenizer.encode(SENTENCE)])
    with torch.no_grad():
        model(idx)  # the fused path (need_weights=False)
    for handle in handles:
        handle.remove()

    maps = compute_attention_maps(model, tokenizer, SENTENCE)
    for layer, block in enumerate(model.blocks):
        attention = block.attention
        x, fused = captured[layer]
        B, T, C = x.shape
        with torch.no_grad():
            v = attention.qkv(x).split(attention.qkv_split, dim=-1)[2]  # (B, T, Hkv*D)
            v = v.view(B, T, n_kv_head, attention.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
            v = v.repeat_interleave(attention.n_head // n_kv_head, dim=1)  # (B, H, T, D)
            weights = torch.from_numpy(maps.weights[layer]).unsqueeze(0)  # (1, H, T, T)
            mixed = (weights @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
            torch.testing.assert_close(attention.output(mixed), fused, rtol=0, atol=1e-5)


def test_maps_have_a_row_per_query_summing_to_one_and_nothing_in_the_future(tiny_model, tokenizer):
    model = tiny_model()
    maps = compute_attention_maps(model, tokenizer, SENTENCE)
    T = len(SENTENCE)
    assert maps.token_ids == tokenizer.encode(SENTENCE) and maps.dropped_tokens == 0
    assert len(maps.weights) == 2 and len(maps.labels) == T
    for weights in maps.weights:
        assert weights.shape == (4, T, T) and weights.dtype == np.float32
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert np.all(weights[:, np.triu(np.ones((T, T), dtype=bool), k=1)] == 0)


def test_long_text_keeps_its_end_and_training_mode_is_restored(tiny_model, tokenizer):
    model = tiny_model(context_length=24).train()
    maps = compute_attention_maps(model, tokenizer, SENTENCE)
    assert maps.token_ids == tokenizer.encode(SENTENCE)[-24:]
    assert maps.dropped_tokens == len(SENTENCE) - 24
    assert model.training
    if maps_module.plotting_available():  # the heatmap's title says how many went
        title = maps_module.layer_figure(maps, 0)._suptitle.get_text()
        assert title.endswith(f"24 tokens; the first {len(SENTENCE) - 24} cut to fit the context")


def test_maps_of_a_model_in_training_are_its_weights_without_dropout(tiny_model, tokenizer):
    # The training loop's attention hook hands over the model as it trains, dropout on.
    model = tiny_model(dropout=0.5)
    evaluated = compute_attention_maps(model, tokenizer, SENTENCE)
    model.train()
    in_training = compute_attention_maps(model, tokenizer, SENTENCE)
    for weights, expected in zip(in_training.weights, evaluated.weights):
        np.testing.assert_array_equal(weights, expected)
    assert model.training


def test_labels_make_whitespace_visible(tiny_model, tokenizer):
    assert visible(" a\tb\n") == "␣a\\tb\\n"
    assert visible("\u00a0") == "\\xa0"  # a no-break space would draw as nothing
    maps = compute_attention_maps(tiny_model(), tokenizer, "But soft,\nwhat")
    assert maps.labels == ["B", "u", "t", "␣", "s", "o", "f", "t", ",", "\\n", "w", "h", "a", "t"]


# ----------------------------------------------------------------------------- heatmaps


def test_heatmaps_are_small_pngs_of_the_documented_size_that_change_with_the_text(tiny_model, tokenizer, tmp_path):
    model = tiny_model()
    maps = compute_attention_maps(model, tokenizer, SENTENCE)
    paths = save_heatmaps(maps, tmp_path / "a")
    assert [p.name for p in paths] == ["layer_0.png", "layer_1.png"]
    for path in paths:
        assert png_size(path) == heatmap_size_pixels(4, len(SENTENCE))
        assert path.stat().st_size < 300_000

    short = "The book was fascinating."  # fewer labels to draw: matplotlib's text is the slow part
    first = save_heatmaps(compute_attention_maps(model, tokenizer, short), tmp_path / "b", layers=[0], head=3)
    other = short.replace("fascinating", "interesting")  # same length, other tokens
    changed = save_heatmaps(compute_attention_maps(model, tokenizer, other), tmp_path / "c", layers=[0], head=3)
    assert [p.name for p in changed] == ["layer_0_head_3.png"]
    assert png_size(changed[0]) == png_size(first[0]) == heatmap_size_pixels(1, len(short))
    assert changed[0].read_bytes() != first[0].read_bytes()


def test_each_heatmap_panel_of_the_png_is_its_heads_weights_queries_down_keys_across(tmp_path):
    """Each cell of the PNG is the colour of its weight: read back at the cell's centre, for every
    (layer, head), in the grid of heads and drawn alone (--head). Weights distinct in every layer
    and head, so a panel showing another layer's, another head's or the transposed map is seen."""
    import matplotlib
    from PIL import Image

    T, L, H = 6, 2, 3
    rng = np.random.default_rng(0)
    weights = [np.tril(rng.dirichlet(np.ones(T), size=(H, T))).astype(np.float32) for _ in range(L)]
    maps = AttentionMaps(list(range(T)), list("abcdef"), weights, 0)
    viridis = matplotlib.colormaps["viridis"]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for heads, head in ((list(range(H)), None), ([1], 1)):
        paths = save_heatmaps(maps, tmp_path / str(head), head=head)
        for layer, path in enumerate(paths):
            png = np.asarray(Image.open(path).convert("RGB")).astype(int)  # (height, width, 3)
            height, width = png.shape[:2]
            figure = maps_module.layer_figure(maps, layer, heads)
            panels = {ax.get_xlabel(): ax for ax in figure.axes if ax.images}
            assert sorted(panels) == [f"head {h}" for h in heads]
            for h in heads:
                ax = panels[f"head {h}"]
                drawn = np.ma.filled(ax.images[0].get_array().astype(np.float64), np.nan)
                np.testing.assert_array_equal(drawn, np.where(future, np.nan, weights[layer][h]))
                box = ax.get_position()  # in fractions of the figure, whose pixels the PNG is
                for q in range(T):
                    for k in range(T):
                        x = int((box.x0 + (k + 0.5) / T * box.width) * width)
                        y = int((1 - box.y1 + (q + 0.5) / T * box.height) * height)  # row 0 at the top
                        expected = (MASKED_RGB if k > q else
                                    np.round(np.array(viridis(float(weights[layer][h, q, k]))[:3]) * 255))
                        assert np.abs(png[y, x] - expected).max() <= 2, (path.name, h, q, k)


def test_masked_cells_are_drawn_grey_not_the_colour_of_weight_zero(tiny_model, tokenizer):
    maps = compute_attention_maps(tiny_model(), tokenizer, "ab")
    T = 2
    one_hot = np.zeros((4, T, T), dtype=np.float32)
    one_hot[:, :, 0] = 1.0  # every query puts all its weight on key 0: cell (1, 1) is an allowed 0
    grey = AttentionMaps(maps.token_ids, maps.labels, [one_hot], 0)
    figure = maps_module.layer_figure(grey, 0, heads=[0])
    image = figure.axes[0].get_images()[0]
    colours = image.to_rgba(image.get_array())  # (T, T, 4) as drawn
    masked, allowed_zero = colours[0, 1, :3], colours[1, 1, :3]
    assert np.allclose(masked, [0xc8 / 255] * 3, atol=0.01)
    assert not np.allclose(masked, allowed_zero, atol=0.1)


def test_a_long_texts_heatmap_labels_every_other_token_and_always_the_last():
    # 150 tokens in one head's panel of at most 12 inches fit 133 labels: every second, counted from
    # the last token back, so the last query and key are always named.
    T = 150
    maps = AttentionMaps(list(range(T)), [f"t{i}" for i in range(T)], [np.zeros((1, T, T), np.float32)], 0)
    panel = maps_module.layer_figure(maps, 0).axes[0]
    for ticks, labels in ((panel.get_yticks(), panel.get_yticklabels()),
                          (panel.get_xticks(), panel.get_xticklabels())):
        assert list(ticks) == list(range(1, T, 2))
        assert labels[-1].get_text() == "t149"


def test_a_heatmap_label_of_label_chars_is_whole_and_a_longer_one_cut_with_an_ellipsis():
    n = maps_module.LABEL_CHARS
    labels = ["x" * n, "y" * (n + 1)]
    maps = AttentionMaps([0, 1], labels, [np.zeros((1, 2, 2), np.float32)], 0)
    panel = maps_module.layer_figure(maps, 0).axes[0]
    assert [label.get_text() for label in panel.get_yticklabels()] == ["x" * n, "y" * (n - 1) + "…"]


def test_one_head_on_its_own_is_drawn_in_a_larger_panel_than_in_the_grid_of_heads():
    T = 10  # 0.9 inches of labels: each panel at its least, 5 inches alone (--head) and 3 in a grid
    maps = AttentionMaps(list(range(T)), [f"t{i}" for i in range(T)], [np.zeros((4, T, T), np.float32)], 0)

    def panel_inches(figure):
        return figure.axes[0].get_position().width * figure.get_figwidth()

    assert panel_inches(maps_module.layer_figure(maps, 0, heads=[2])) == pytest.approx(5.0)
    assert panel_inches(maps_module.layer_figure(maps, 0)) == pytest.approx(3.0)


def test_heads_fill_a_grid_as_square_as_possible_with_no_empty_row():
    grids = {heads: maps_module.head_grid(heads) for heads in (1, 2, 3, 4, 5, 6, 8, 9, 12)}
    assert grids == {1: (1, 1), 2: (1, 2), 3: (2, 2), 4: (2, 2), 5: (2, 3), 6: (2, 3), 8: (3, 3), 9: (3, 3),
                     12: (3, 4)}


def test_tensorboard_gets_one_image_per_layer(tiny_model, tokenizer, tensorboard_writer):
    model = tiny_model().train()
    images = attention_heatmap_images(model, tokenizer, "ROMEO:\nBut soft")
    width, height = tensorboard_image_size(4, 15)
    assert (width, height) == (2 * 15 * 9 + TENSORBOARD_GAP, 2 * 15 * 9 + TENSORBOARD_GAP)  # 2x2 heads, 9x
    assert [image.shape for image in images] == [(height, width, 3)] * 2
    assert all(image.dtype == np.uint8 for image in images)

    log_attention_to_tensorboard(tensorboard_writer, model, tokenizer, "ROMEO:\nBut soft", step=250)
    assert [(c[0], c[2], c[3]) for c in tensorboard_writer.images] == [("attention/layer_0", 250, "HWC"),
                                                                       ("attention/layer_1", 250, "HWC")]
    assert model.training


def test_tensorboard_image_is_each_heads_weights_through_the_colour_map_in_a_grid_of_heads():
    T = 3
    # Head h: every query q puts all its weight on key min(h, q), so which cell holds the 1
    # tells the heads apart; keys after the query are masked.
    weights = np.zeros((4, T, T), dtype=np.float32)
    for h in range(4):
        for q in range(T):
            weights[h, q, min(h, q)] = 1.0
    maps = AttentionMaps([0] * T, ["a"] * T, [weights], 0)
    image = layer_image(maps, 0)
    scale, gap = tensorboard_scale(T), TENSORBOARD_GAP
    assert scale == 43  # the least whole factor giving a head 128 pixels or more
    side = T * scale
    assert image.shape == (2 * side + gap, 2 * side + gap, 3) and image.dtype == np.uint8
    assert (image.shape[1], image.shape[0]) == tensorboard_image_size(4, T)

    def cell(head, query, key):  # the scale x scale block of one weight
        row, column = divmod(head, 2)  # heads fill the 2x2 grid row by row
        top, left = row * (side + gap) + query * scale, column * (side + gap) + key * scale
        return image[top:top + scale, left:left + scale]

    for h in range(4):
        for q in range(T):
            for k in range(T):
                expected = MASKED_RGB if k > q else VIRIDIS[-1] if k == min(h, q) else VIRIDIS[0]
                assert np.all(cell(h, q, k) == expected), (h, q, k)
    assert np.all(image[side:side + gap] == WHITE) and np.all(image[:, side:side + gap] == WHITE)


def test_tensorboard_image_of_a_model_is_its_attention_weights_through_the_colour_map(tiny_model, tokenizer):
    maps = compute_attention_maps(tiny_model(), tokenizer, "ROMEO:\nBut soft")
    T, scale = 15, tensorboard_scale(15)
    side = T * scale
    for layer in range(2):
        image = layer_image(maps, layer)
        for head in range(4):
            row, column = divmod(head, 2)
            top, left = row * (side + TENSORBOARD_GAP), column * (side + TENSORBOARD_GAP)
            drawn = image[top:top + side:scale, left:left + side:scale]  # (T, T, 3): a pixel per weight
            weights = maps.weights[layer][head]
            allowed = np.tril(np.ones((T, T), dtype=bool))
            np.testing.assert_array_equal(drawn[allowed], colormap(weights[allowed]))
            assert np.all(drawn[~allowed] == MASKED_RGB)
            assert len({tuple(c) for c in drawn[allowed]}) > T  # real, varied weights, not one colour


def test_tensorboard_images_need_no_matplotlib(tiny_model, tokenizer, monkeypatch, tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib now raises ImportError
    assert not maps_module.plotting_available()
    model = tiny_model()
    writer = SummaryWriter(str(tmp_path))
    log_attention_to_tensorboard(writer, model, tokenizer, "ROMEO:\nBut soft", step=7)
    writer.close()

    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0}).Reload()
    assert sorted(events.Tags()["images"]) == ["attention/layer_0", "attention/layer_1"]
    maps = compute_attention_maps(model, tokenizer, "ROMEO:\nBut soft")
    for layer in range(2):
        [logged] = events.Images(f"attention/layer_{layer}")
        assert logged.step == 7
        decoded = np.asarray(Image.open(io.BytesIO(logged.encoded_image_string)).convert("RGB"))
        np.testing.assert_array_equal(decoded, layer_image(maps, layer))


def test_missing_matplotlib_is_a_one_line_error_saying_how_to_install(tiny_model, tokenizer, monkeypatch, tmp_path):
    maps = compute_attention_maps(tiny_model(), tokenizer, "ab")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(PlottingUnavailable, match=r"pip install 'tinyattn\[plot\]'") as error:
        save_heatmaps(maps, tmp_path)
    assert "\n" not in str(error.value)
    assert not maps_module.plotting_available()  # still importable from here: train.py does


# ----------------------------------------------------------------------------- queries


def test_a_word_query_is_the_last_character_of_its_first_whole_word_occurrence(tokenizer):
    ids = tokenizer.encode(SENTENCE)
    assert query_position_of_word(tokenizer, ids, "was") == SENTENCE.index("was") + 2
    # "the" as a whole word, case-sensitive: not "The", not inside "that"
    assert query_position_of_word(tokenizer, ids, "the") == SENTENCE.index("the student") + 2
    assert query_position_of_word(tokenizer, ids, "The") == 2
    # nor at the end of a longer word: "breathe the east" finds the second "the"
    assert query_position_of_word(tokenizer, tokenizer.encode("breathe the east"), "the") == 10
    for absent in ("wa", "WAS", "dragon", " "):
        with pytest.raises(TinyattnError, match="not a word of the text"):
            query_position_of_word(tokenizer, ids, absent)
    for blank in ("", " ", "\n"):  # no word at all, in a text where it would match around punctuation
        with pytest.raises(TinyattnError, match="not a word of the text"):
            query_position_of_word(tokenizer, tokenizer.encode("the end . \n. "), blank)


def test_a_query_position_is_one_of_the_texts_tokens_negative_counting_from_the_end():
    assert [maps_module.check_query_position(5, p) for p in (0, 4, -1, -5)] == [0, 4, 4, 0]
    for outside in (5, 6, -6):
        message = rf"--query-position {outside}: the text has 5 tokens \(positions 0\.\.4, or -1 for the last"
        with pytest.raises(TinyattnError, match=message):
            maps_module.check_query_position(5, outside)


def test_a_word_query_of_the_text_read_as_unknown_says_which_characters_the_tokenizer_lacks(tokenizer):
    text = "the student wás here"  # á: never in the corpus, read as [UNK]
    ids = tokenizer.encode(text)
    with pytest.raises(TinyattnError) as error:
        query_position_of_word(tokenizer, ids, "wás", text=text)
    assert str(error.value) == ("--query 'wás': a word of the text, but not of the text the model reads: the "
                                "tokenizer has never seen 'á', read as [UNK] (use --query-position N for any token)")
    with pytest.raises(TinyattnError, match="not a word of the text"):  # not in the text either
        query_position_of_word(tokenizer, ids, "wás", text="the student was here")
    assert query_position_of_word(tokenizer, ids, "here", text=text) == len(text) - 1


def test_a_word_query_counts_a_start_token_only_where_the_ids_begin_with_it(tokenizer):
    # An imported folder's bos before the text shifts the position by one; of ids without it, no
    # token is skipped: the text's first word is found.
    import types

    bos = tokenizer.eot_id
    with_start = types.SimpleNamespace(text_start=[bos], decode=tokenizer.decode)
    ids = tokenizer.encode(SENTENCE)
    assert query_position_of_word(with_start, [bos] + ids, "The") == 3
    assert query_position_of_word(with_start, ids, "The") == 2


def test_a_word_query_does_not_find_a_word_in_the_spelling_of_the_start_token_before_the_text():
    import types

    spelling = {0: "<s>", 1: "s", 2: " ", 3: "a"}
    with_start = types.SimpleNamespace(text_start=[0], decode=lambda ids: "".join(spelling[i] for i in ids))
    assert query_position_of_word(with_start, [0, 3, 2, 1], "s") == 3  # the text's "s", not the bos's


def test_a_word_query_with_subword_tokens_is_the_token_that_completes_the_word():
    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter([CORPUS]))
    ids = bpe.encode(SENTENCE)
    position = query_position_of_word(bpe, ids, "library")
    assert bpe.decode(ids[:position + 1]).endswith("library")
    assert not bpe.decode(ids[:position]).endswith("library")


def test_a_word_query_ending_in_a_character_split_over_byte_tokens_is_the_token_that_completes_it():
    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter([CORPUS]))
    ids = bpe.encode("the café here")
    position = query_position_of_word(bpe, ids, "café")
    # é is two byte tokens: the word ends in the second, not the first
    assert bpe.decode(ids[:position]).endswith("caf\ufffd")
    assert bpe.decode(ids[:position + 1]).endswith("café")

def test_query_table_names_real_tokens_of_the_text_with_their_weights(tiny_model, tokenizer):
    maps = compute_attention_maps(tiny_model(), tokenizer, SENTENCE)
    position = query_position_of_word(tokenizer, maps.token_ids, "was")
    rows = query_table(maps, position)
    assert [(r.layer, r.head) for r in rows] == [(layer, head) for layer in range(2) for head in range(4)]
    for row in rows:
        assert len(row.keys) == 5
        weights = [w for _, _, w in row.keys]
        assert weights == sorted(weights, reverse=True)
        for key, label, weight in row.keys:
            assert 0 <= key <= position  # earlier tokens or the query itself, never the future
            assert label == visible(SENTENCE[key])
            assert weight == pytest.approx(float(maps.weights[row.layer][row.head, position, key]))
    table = format_query_table(maps, position, rows)
    lines = table.splitlines()
    assert len(lines) == 2 + 8 and f"position {position} " in lines[0]
    key, label, weight = rows[0].keys[0]
    assert f"{label}@{key} {weight:.3f}" in lines[2]
    assert query_table(maps, position, layers=[1], heads=[2])[0].layer == 1


def test_query_table_keeps_only_the_layers_and_heads_asked(tiny_model, tokenizer):
    maps = compute_attention_maps(tiny_model(), tokenizer, SENTENCE)
    rows = query_table(maps, 10, top_k=3, layers=[1], heads=[2, 0])
    assert [(row.layer, row.head) for row in rows] == [(1, 2), (1, 0)]
    assert rows[0].keys[0][2] == pytest.approx(float(maps.weights[1][2, 10, :11].max()))


def test_query_table_counts_the_query_itself_and_ranks_ties_earlier_key_first():
    T = 40
    weights = np.zeros((1, T, T), dtype=np.float32)  # one head
    weights[0, 2, :3] = [0.1, 0.2, 0.7]  # query 2's own key weighs most
    maps = maps_module.AttentionMaps(list(range(T)), [f"t{i}" for i in range(T)], [weights], 0)
    [row] = query_table(maps, 2)
    assert [(key, label) for key, label, _ in row.keys] == [(2, "t2"), (1, "t1"), (0, "t0")]
    assert [weight for _, _, weight in row.keys] == pytest.approx([0.7, 0.2, 0.1])
    weights[0, T - 1] = np.where(np.arange(T) % 2, 0.04, 0.01)  # query 39: 20 keys tie for the most
    [row] = query_table(maps, T - 1)
    assert [key for key, _, _ in row.keys] == [1, 3, 5, 7, 9]  # the earliest of them, in text order


# ----------------------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def run_dir(trained_run):
    return trained_run.run_dir  # conftest's run: context 32, trained by tinyattn.train


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """scripts/attention.py's main in this process: (exit status, stdout, stderr)."""
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def draw_blank_heatmaps(monkeypatch) -> None:
    """Each heatmap a blank figure, still written by `save_heatmaps` under its name: for CLI runs whose
    PNGs no assertion reads. Matplotlib's tick labels are most of a CLI run's time; what the heatmaps
    show is pinned by the tests above and by the first run of the query table's test."""
    from tinyattn.analysis.plotting import new_figure

    monkeypatch.setattr(maps_module, "layer_figure", lambda maps, layer, heads=None, dpi=maps_module.DPI:
                        new_figure(0.1, 0.1, dpi))


@pytest.fixture
def blank_heatmaps(monkeypatch):
    draw_blank_heatmaps(monkeypatch)


@pytest.fixture
def heatmaps_unrendered(monkeypatch) -> list:
    """The heatmap figures `layer_figure` makes during the test, each built whole (its panels, ticks and
    title) but saved as an empty file at its path rather than rendered: for CLI runs that read which
    figures were drawn and of what, none of their pixels. Rendering is pinned by the tests above."""
    return unrendered_figures(monkeypatch, maps_module)


def test_cli_writes_heatmaps_and_prints_the_query_table(run_dir, capsys, monkeypatch):
    context = load_config(run_dir / "config.yaml").model.context_length
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE, "--query", "was",
                                     "--device", "cpu")
    assert status == 0, stderr
    assert f"warning: the text is {len(SENTENCE)} tokens, longer than the context of {context}" in stderr
    for name in ("layer_0.png", "layer_1.png"):
        assert png_size(run_dir / "attention" / name) == heatmap_size_pixels(4, context)
        assert f"wrote {run_dir / 'attention' / name}" in stdout
    table = stdout.split("\n\n", 1)[1].splitlines()
    position = SENTENCE.index("was") + 2 - (len(SENTENCE) - context)  # its "s", in the kept end of the text
    in_text = SENTENCE.index("was") + 2
    assert table[0] == (f"--query 'was': its first occurrence ends in token s at position {position} of the "
                        f"kept window (token {in_text} of the text)")
    assert table[1].startswith(f"query s at position {position} (of {context} tokens)")
    assert len(table) == 3 + 8
    draw_blank_heatmaps(monkeypatch)  # the runs below read the table alone
    # --query-position counts in the text too, as --relevance does; the cut-off start is one line.
    # It says, as --query does, which token of the text the kept window's position is.
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE,
                                     "--query-position", str(in_text), "--device", "cpu")
    assert status == 0, stderr
    table = stdout.split("\n\n", 1)[1].splitlines()
    assert table[0] == (f"--query-position {in_text}: token s at position {position} of the kept window "
                        f"(token {in_text} of the text)")
    assert table[1].startswith(f"query s at position {position} (of {context} tokens)")
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE,
                                     "--query-position", "-1", "--device", "cpu")
    assert status == 0 and (f"--query-position -1: token {visible(SENTENCE[-1])} at position {context - 1} of "
                            f"the kept window (token {len(SENTENCE) - 1} of the text)\n") in stdout, stderr
    # A text that fits has nothing cut: the table's position is the text's, and no such line.
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE[:context],
                                     "--query-position", "5", "--device", "cpu")
    assert status == 0 and stdout.split("\n\n", 1)[1].startswith("query "), stderr
    first_word = SENTENCE.split()[0].strip(",.;:")
    for option in (["--query", first_word], ["--query-position", "0"]):
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE, *option,
                                         "--device", "cpu")
        assert status == 2 and "cut to fit the context" in stderr and stderr.count("error:") == 1, stderr


def test_cli_a_negative_query_position_counts_from_the_end_of_the_text(run_dir, tmp_path, capsys,
                                                                       blank_heatmaps):
    context = load_config(run_dir / "config.yaml").model.context_length
    short = SENTENCE[:20]  # 20 tokens, within the context
    # (text, options, the query's position as printed, the tokens it is among: the kept end of a long text)
    for text, options, shown, tokens in ((short, ["--query-position", "-1"], 19, 20),
                                         (SENTENCE, ["--query-position", "-1"], context - 1, context),
                                         (short, ["--query-position", "-2", "--relevance"], 18, 20)):
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", text, *options,
                                         "--out-dir", str(tmp_path), "--device", "cpu")
        assert status == 0, stderr
        label = visible(text[len(text) + int(options[1])])
        assert f"query {label} at position {shown} (of {tokens} tokens)" in stdout, stdout
    assert f"predicts {visible(short[19])} with loss" in stdout  # with --relevance: the text's last token


@pytest.mark.parametrize("options", [["--query", "was"], ["--query", "was", "--relevance"]],
                         ids=["heatmaps", "relevance"])
def test_cli_encodes_the_text_once_for_the_query_and_the_model(run_dir, tmp_path, monkeypatch, capsys,
                                                               blank_heatmaps, options):
    import tinyattn.hf.folder as folder

    encoded, load = [], folder.load_any_model

    def load_counting_encodes(*args, **kwargs):
        loaded = load(*args, **kwargs)
        encode = loaded.tokenizer.encode
        monkeypatch.setattr(loaded.tokenizer, "encode", lambda text: encoded.append(text) or encode(text))
        return loaded
    monkeypatch.setattr(folder, "load_any_model", load_counting_encodes)
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE, *options,
                                     "--out-dir", str(tmp_path), "--device", "cpu")
    assert status == 0 and "--query 'was': its first occurrence ends in token s" in stdout, stderr
    assert encoded == [SENTENCE]


@pytest.mark.parametrize("options", [[], ["--relevance"]], ids=["heatmaps", "relevance"])
def test_cli_warns_of_characters_read_as_unknown_and_names_them_for_a_query_it_cannot_find(
        run_dir, tmp_path, capsys, blank_heatmaps, options):
    text = "the student wás here"  # á: never in the run's corpus
    warning = "warning: --text: 1 character the tokenizer has never seen, read as [UNK]: 'á'\n"
    args = ("--checkpoint", str(run_dir), "--text", text, *options, "--out-dir", str(tmp_path), "--device", "cpu")
    status, _, stderr = run_cli(capsys, *args, "--query", "wás")
    assert status == 2 and stderr == warning + (
        "error: --query 'wás': a word of the text, but not of the text the model reads: the tokenizer has "
        "never seen 'á', read as [UNK] (use --query-position N for any token)\n")
    status, stdout, stderr = run_cli(capsys, *args, "--query", "student")
    assert status == 0 and stderr == warning and "ends in token t at position 10" in stdout, stderr
    status, _, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE[:30], *options,
                                "--out-dir", str(tmp_path), "--device", "cpu")
    assert status == 0 and "warning" not in stderr, stderr


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "no/such/run"],
     "no/such/run: no such checkpoint file, run folder or Hugging Face folder"),
    (["--query", "dragon"], "--query 'dragon': not a word of the text"),
    (["--layer", "5"], "--layer 5: the model has 2 layers (0..1)"),
    (["--layer", "2"], "--layer 2: the model has 2 layers (0..1)"),
    (["--layer", "-1"], "--layer -1: the model has 2 layers (0..1)"),
    (["--head", "4"], "--head 4: the model has 4 heads (0..3)"),
], ids=["missing-checkpoint", "word-not-in-text", "bad-layer", "layer-one-past", "negative-layer",
        "head-one-past"])
def test_cli_bad_input_is_one_line_and_exit_status_2(run_dir, args, message, capsys):
    if args[0] != "--checkpoint":
        args = ["--checkpoint", str(run_dir), "--text", SENTENCE[:40], *args]
    status, _, stderr = run_cli(capsys, *args, "--out-dir", str(run_dir / "unused"))
    assert status == 2
    assert stderr.startswith("error: ") and message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert not (run_dir / "unused").exists()


def test_cli_layer_and_head_draw_and_tabulate_only_that_head_and_the_first_kept_token_can_be_asked(
        run_dir, tmp_path, capsys, heatmaps_unrendered):
    context = load_config(run_dir / "config.yaml").model.context_length
    dropped = len(SENTENCE) - context  # the first token of the kept end is token `dropped` of the text
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE, "--layer",
                                     "1", "--head", "2", "--query-position", str(dropped), "--out-dir",
                                     str(tmp_path), "--device", "cpu")
    assert status == 0, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer_1_head_2.png"]
    [figure] = heatmaps_unrendered  # one figure: layer 1, one panel, head 2's
    assert figure._suptitle.get_text().startswith("layer 1: ")
    assert [ax.get_xlabel() for ax in figure.axes if ax.images] == ["head 2"]
    table = stdout.split("\n\n", 1)[1].splitlines()
    assert table[0].endswith(f"at position 0 of the kept window (token {dropped} of the text)")
    assert table[1].startswith(f"query {visible(SENTENCE[dropped])} at position 0 (of {context} tokens)")
    assert len(table) == 3 + 1 and table[3].split()[:2] == ["1", "2"]  # a header, then layer 1 head 2 only


def test_cli_relevance_with_layer_and_head_tabulates_only_that_layer_and_head(run_dir, capsys):
    context = load_config(run_dir / "config.yaml").model.context_length
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", SENTENCE[:context],
                                     "--relevance", "--layer", "1", "--head", "2", "--query-position", "5",
                                     "--device", "cpu")
    assert status == 0, stderr
    header = stdout.splitlines()[2].split()
    assert header == ["pos", "token", "relevance", "weight", "L1", "L1H2"], header


def test_cli_html_alone_writes_the_page_for_any_query_and_notes_windows_only_past_the_context(
        run_dir, tmp_path, capsys):
    context = load_config(run_dir / "config.yaml").model.context_length
    text = (SENTENCE * 2)[:80]  # a title of 80 characters is shown whole
    for words, note in ((text[:context], False), (text, True)):
        page = tmp_path / "page.html"
        status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", words, "--html",
                                         str(page), "--query-position", "-1", "--device", "cpu")
        assert status == 0, stderr  # the last token: nothing to rank, but its weights can be looked at
        assert stdout.startswith(f"wrote {page} (") and stdout.count("\n") == 1  # no relevance table
        assert ("it is read in windows" in stderr) == note, stderr
        assert f"<title>attention explorer: {words}</title>" in page.read_text(encoding="utf-8")


def test_cli_with_an_empty_text_says_so_rather_than_drawing_the_probe_text(run_dir, tmp_path, capsys):
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", "", "--out",
                                     str(tmp_path / "maps"), "--device", "cpu")
    assert (status, stdout) == (2, "")
    assert stderr == "error: the text is empty: attention maps need at least one token\n"
    assert not (tmp_path / "maps").exists()


def test_cli_without_matplotlib_refuses_the_pngs_before_any_work_and_still_measures_relevance(
        run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", "To be", "--out-dir",
                                     str(tmp_path / "maps"), "--device", "cpu")
    assert (status, stdout) == (2, "")
    assert stderr == ("error: plots need matplotlib, an optional extra: pip install 'tinyattn[plot]'; "
                      "--relevance and --html run without it\n")  # as the second call below shows
    assert not (tmp_path / "maps").exists()  # refused before the model was loaded or a folder made
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", "To be", "--relevance",
                                     "--device", "cpu")
    assert status == 0 and "head ablation" in stdout, stderr


def test_cli_without_text_on_a_run_without_a_probe_text_says_to_give_one(run_dir, tmp_path, capsys):
    from tinyattn import checkpoint as ckpt

    state = ckpt.load_checkpoint(run_dir / "best.pt")
    state["config"]["train"].update(probe_text="", show=["sample"])  # a run that sets no probe text
    ckpt.save_checkpoint({k: v for k, v in state.items() if k not in ("format", "format_version")},
                         tmp_path / "no_probe.pt")
    status, _, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "no_probe.pt"), "--device", "cpu")
    assert status == 2
    assert stderr == (f"error: {tmp_path / 'no_probe.pt'}: its run sets no train.probe_text, so there is no "
                      "text to look at: give one with --text \"...\"\n")


def test_cli_without_text_on_a_hugging_face_folder_says_it_records_no_probe_text(run_dir, tmp_path, capsys):
    # Was "<folder>/model.safetensors: its run sets no train.probe_text": a Hugging Face folder has no run.
    from tinyattn.cli.export import main as export_main

    assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    status, _, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "hf"), "--device", "cpu")
    assert status == 2
    assert stderr == (f"error: {tmp_path / 'hf'} (a Hugging Face folder): records no train.probe_text "
                      "(a run's config does), so there is no text to look at: give one with --text \"...\"\n")


def test_cli_a_heatmap_it_cannot_write_is_one_line_naming_the_folder(run_dir, tmp_path, capsys,
                                                                     blank_heatmaps):
    (tmp_path / "layer_0.png").mkdir()  # a folder where the first PNG goes: EISDIR, no storage errno
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", "To be", "--out-dir",
                                     str(tmp_path), "--device", "cpu")
    assert (status, stdout) == (2, "")
    assert stderr.startswith(f"error: {tmp_path}: cannot write the heatmaps (") and stderr.count("\n") == 1


def test_cli_reads_an_imported_folders_start_token_before_the_text(run_dir, capsys, monkeypatch):
    # An imported folder's tokenizer puts bos before a text (`text_start`); the model reads it there, as
    # generation does, and positions count it. Stood in for by the run's end-of-text token.
    from tinyattn.data.tokenizer import Tokenizer

    monkeypatch.setattr(Tokenizer, "text_start", property(lambda self: [self.eot_id]))
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", "To be", "--relevance",
                                     "--query-position", "1", "--device", "cpu")
    assert status == 0, stderr
    assert stdout.startswith("query T at position 1 (of 6 tokens) predicts o "), stdout


def test_cli_relevance_without_a_query_asks_about_the_last_token_that_predicts_one(run_dir, capsys):
    # --relevance's help: the default query is the last token that predicts one, the next to last.
    context = load_config(run_dir / "config.yaml").model.context_length
    text = SENTENCE[:context]  # a character model: a token per character, ending "borrow"
    status, stdout, stderr = run_cli(capsys, "--checkpoint", str(run_dir), "--text", text, "--relevance",
                                     "--device", "cpu")
    assert status == 0, stderr
    T = len(text)
    expected = f"query {text[-2]} at position {T - 2} (of {T} tokens) predicts {text[-1]} "
    assert stdout.startswith(expected), stdout
