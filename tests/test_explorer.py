"""The explorer page: its embedded data is the model's, it stays small and self-contained, the
command writes it; and in headless Chromium, the colours the page shows are the model's
weights, with no network request and no console error."""

import re

import numpy as np
import pytest

from tinyattn.analysis.ablation import Relevance, agreement, relevance_of_text
from tinyattn.analysis.explorer import (
    WEIGHT_LEVELS,
    data_of_page,
    explorer_html,
    page_part,
    weights_from_data,
    write_explorer,
)
from tinyattn.checkpoint import load_model
from tinyattn.cli.attention import main as attention_main

TEXT = "The book that the student borrowed from the library"  # 51 tokens: longer than the context
STEP = 0.5 / WEIGHT_LEVELS  # a stored weight is within half a level of the model's


@pytest.fixture(scope="module")
def run_dir(trained_run):
    return trained_run.run_dir  # conftest's run: 2 layers, 4 heads, context 32, trained by tinyattn.train


@pytest.fixture(scope="module")
def loaded(run_dir):
    return load_model(run_dir)


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded.tokenizer


@pytest.fixture(scope="module")
def model(loaded):
    return loaded.model


@pytest.fixture(scope="module")
def relevance(model, tokenizer):
    return relevance_of_text(model, tokenizer, TEXT)


# ----------------------------------------------------------------------------- the data


def test_the_page_holds_the_models_weights_relevance_losses_and_head_ablation(relevance):
    data = data_of_page(explorer_html(relevance, "t", "s"))
    assert data["tokens"] == relevance.labels and data["reach"] == list(relevance.reach)
    assert sorted(set(data["reach"])) == [0, 16, 32]  # 51 tokens read in windows of 32, 16 apart
    np.testing.assert_allclose(weights_from_data(data), relevance.weights, rtol=0, atol=STEP + 1e-7)
    rows = [relevance.token_relevance[t, relevance.reach[t]:t] for t in range(relevance.num_tokens)]
    stored = np.array([np.nan if v is None else v for v in data["relevance"]])
    np.testing.assert_allclose(stored, np.concatenate(rows), rtol=0, atol=5e-4)  # NaN where unmeasured, too
    losses = np.array([np.nan if v is None else v for v in data["loss"]])
    np.testing.assert_allclose(losses, relevance.losses, rtol=0, atol=5e-4)
    np.testing.assert_allclose(data["head_ablation"], relevance.head_relevance, rtol=0, atol=5e-4)
    assert data["mean_loss"] == pytest.approx(relevance.mean_loss, abs=5e-4)
    assert (data["layers"], data["heads"], data["context"]) == (2, 4, relevance.context_length) == (2, 4, 32)
    assert data["query"] == relevance.num_tokens - 2  # default: the last token that predicts one


def test_the_pages_losses_the_mean_among_them_are_kept_to_a_thousandth_of_a_nat():
    # As docs/ATTENTION.md says of the page's data; the page shows the mean to as many decimals
    T, L, H = 4, 1, 1
    weights = np.tril(np.ones((T, T), dtype=np.float32))[None, None] / np.arange(1, T + 1)[:, None]
    relevance = np.where(np.tril(np.ones((T, T)), k=-1) > 0, 0.1, np.nan)
    rel = Relevance(list(range(T)), ["a"] * T, T, np.zeros(T, dtype=int), weights,
                    np.append(np.full(T - 1, 2 / 3), np.nan), relevance, np.zeros((L, H)), 2 / 3)
    data = data_of_page(explorer_html(rel))
    assert (data["loss"], data["mean_loss"]) == ([0.667, 0.667, 0.667, None], 0.667)


@pytest.mark.parametrize("key, size", [("agreement", False), ("agreement_by_size", True)])
def test_the_page_holds_the_rank_correlation_of_weight_with_relevance_and_with_its_size(relevance, key, size):
    stored = data_of_page(explorer_html(relevance))[key]
    whole = agreement(relevance, size=size)
    assert stored["pairs"] == whole.pairs
    values = [stored["mean"], *stored["by_layer"], *np.ravel(stored["by_head"])]
    expected = [whole.mean, *whole.by_layer, *whole.by_head.ravel()]
    np.testing.assert_allclose(np.array(values, dtype=float), expected, rtol=0, atol=5e-4)


def test_the_page_is_self_contained_and_a_token_cannot_end_its_script(relevance):
    labels = list(relevance.labels)
    labels[3] = "</script><img src=x>"
    tricky = Relevance(**{**relevance.__dict__, "labels": labels})
    page = explorer_html(tricky)
    assert not re.search(r"https?://|//cdn|\bsrc=\"|@import|url\(", page.replace("<img src=x>", ""))
    assert page.count("</script>") == 2  # the data block's and the code's, nothing from the token
    assert data_of_page(page)["tokens"][3] == "</script><img src=x>"


def test_placeholders_in_a_title_or_token_stay_text_and_the_page_is_whole(relevance):
    labels = list(relevance.labels)
    labels[5] = "%SCRIPT%"
    labels[6] = "%STYLE%%DATA%"
    tricky = Relevance(**{**relevance.__dict__, "labels": labels})
    page = explorer_html(tricky, title="see %DATA% and %SCRIPT%")
    assert "<title>see %DATA% and %SCRIPT%</title>" in page and "<h1>see %DATA% and %SCRIPT%</h1>" in page
    data = data_of_page(page)
    assert data["tokens"][5:7] == ["%SCRIPT%", "%STYLE%%DATA%"] and data["title"] == "see %DATA% and %SCRIPT%"
    # The page is intact: one style block, the data block and the code, each once, in that order.
    assert page.count("<style>") == 1 and page.count("</script>") == 2
    assert page.index("<style>") < page.index('id="data">') < page.rindex("<script>")
    assert page.count(page_part("SCRIPT").strip()) == 1 and page.count(page_part("STYLE").strip()) == 1


def test_the_title_is_html_escaped_in_the_page_and_kept_as_it_is_in_the_data():
    T, L, H = 4, 1, 1
    weights = np.tril(np.ones((T, T), dtype=np.float32))[None, None] / np.arange(1, T + 1)[:, None]
    relevance = np.where(np.tril(np.ones((T, T)), k=-1) > 0, 0.1, np.nan)
    rel = Relevance(list(range(T)), ["a"] * T, T, np.zeros(T, dtype=int), weights,
                    np.append(np.ones(T - 1), np.nan), relevance, np.zeros((L, H)), 1.0)
    title = '<b>Tom & "Jerry"</b><script>alert(1)</script>'
    page = explorer_html(rel, title=title)
    escaped = "&lt;b&gt;Tom &amp; &quot;Jerry&quot;&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    assert f"<title>{escaped}</title>" in page and f"<h1>{escaped}</h1>" in page
    assert "<b>Tom" not in page and page.count("</script>") == 2 and data_of_page(page)["title"] == title


def test_a_page_without_a_title_is_titled_attention_explorer(relevance):
    page = explorer_html(relevance)
    assert "<title>attention explorer</title>" in page and "<h1>attention explorer</h1>" in page


def test_a_256_token_text_of_a_6x6_model_makes_a_page_well_under_two_megabytes():
    T, L, H = 256, 6, 6
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(T), size=(L, H, T)).astype(np.float32) * np.tril(np.ones((T, T), dtype=np.float32))
    relevance = np.where(np.tril(np.ones((T, T)), k=-1) > 0, rng.normal(0, 0.1, (T, T)), np.nan)
    rel = Relevance(list(range(T)), ["x"] * T, T, np.zeros(T, dtype=int), weights,
                    np.append(rng.uniform(0, 4, T - 1), np.nan), relevance, rng.normal(0, 0.1, (L, H)), 1.5)
    size = len(explorer_html(rel).encode("utf-8"))
    assert size < 2_000_000, size
    print(f"page of {T} tokens, {L}x{H} heads: {size:,} bytes")


# ----------------------------------------------------------------------------- the screenshot script


def screenshot_main():
    """scripts/explorer_screenshot.py's main, loaded from its file (scripts/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "explorer_screenshot.py"
    spec = importlib.util.spec_from_file_location("explorer_screenshot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("args, message", [
    (["--layer", "2"], "--layer 2: the page has 2 layers; expected 0..1 or mean"),
    (["--head", "4"], "--head 4: the page has 4 heads; expected 0..3 or mean"),
    (["--query", "51"], "--query 51: the page has 51 tokens; expected 0..50"),
    (["--query", "-1"], "--query -1: the page has 51 tokens; expected 0..50"),
], ids=["layer", "head", "query", "negative-query"])
def test_the_screenshot_script_refuses_a_choice_the_page_lacks_in_one_line_before_any_browser(
        relevance, tmp_path, capsys, args, message):
    # Playwright would wait 30 s for the missing option or token, then end in a traceback.
    page = tmp_path / "page.html"
    write_explorer(page, relevance)
    assert screenshot_main()([str(page), str(tmp_path / "out.png"), *args]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n"
    assert not (tmp_path / "out.png").exists()


def test_the_screenshot_script_refuses_a_file_that_is_no_explorer_page_in_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("relevance table", encoding="utf-8")
    assert screenshot_main()([str(tmp_path / "notes.txt"), str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'notes.txt'}: not an explorer page") and err.count("\n") == 1


# ----------------------------------------------------------------------------- the command


def test_the_command_prints_the_table_and_writes_the_page(run_dir, relevance, tmp_path, capsys):
    page = tmp_path / "new folder" / "explorer.html"  # made, as eval --plot makes its folder
    pngs_before = sorted((run_dir / "attention").glob("*.png"))  # other tests may have drawn some
    status = attention_main(["--checkpoint", str(run_dir), "--text", TEXT, "--query", "student", "--relevance",
                             "--top", "3", "--html", str(page), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "it is read in windows of 32 tokens starting every 16" in err
    position = TEXT.index("student") + len("student") - 1
    lines = out.splitlines()
    assert lines[0] == f"--query 'student': its first occurrence ends in token t at position {position}"
    assert lines[1].startswith(f"query t at position {position} (of 51 tokens) predicts ␣ with loss")
    assert len([line for line in lines[4:] if re.match(r"\s+\d+ ", line)]) == 3 + 2  # 3 keys, 2 layers
    assert "head ablation: rise in the mean loss" in out and f"wrote {page}" in out
    data = data_of_page(page.read_text(encoding="utf-8"))
    assert data["query"] == position
    np.testing.assert_allclose(weights_from_data(data), relevance.weights, rtol=0, atol=STEP + 1e-6)
    assert sorted((run_dir / "attention").glob("*.png")) == pngs_before  # no PNGs with --relevance / --html


def test_a_text_one_token_longer_than_the_context_is_said_to_be_read_in_windows(run_dir, capsys):
    # Of exactly the context, the text is read whole: no note. One token more and it is not.
    for length, noted in ((32, False), (33, True)):
        status = attention_main(["--checkpoint", str(run_dir), "--text", TEXT[:length], "--query", "student",
                                 "--relevance", "--device", "cpu"])
        err = capsys.readouterr().err
        assert status == 0, err
        assert (f"note: the text is {length} tokens, longer than the context of 32" in err) == noted, err


def test_the_commands_layer_and_head_are_the_pages_first_view(run_dir, tmp_path, capsys):
    # --layer and --head drew only that layer and head but the page still opened on layer 0, head 0.
    page = tmp_path / "explorer.html"
    status = attention_main(["--checkpoint", str(run_dir), "--text", "The book", "--layer", "1",
                             "--head", "2", "--html", str(page), "--device", "cpu"])
    assert status == 0, capsys.readouterr().err
    data = data_of_page(page.read_text(encoding="utf-8"))
    assert (data["layer"], data["head"]) == (1, 2)
    default = data_of_page(write_explorer(tmp_path / "default.html", relevance_of_text(
        load_model(run_dir).model, load_model(run_dir).tokenizer, "The book")).read_text(encoding="utf-8"))
    assert (default["layer"], default["head"]) == (0, 0)


def test_the_pages_title_is_the_text_cut_to_eighty_characters(run_dir, tmp_path, capsys):
    text = ("The book that the student borrowed from the library was fascinating, "
            "and she read it twice.")  # 93 characters
    page = tmp_path / "explorer.html"
    status = attention_main(["--checkpoint", str(run_dir), "--text", text, "--html", str(page),
                             "--device", "cpu"])
    assert status == 0, capsys.readouterr().err
    title = data_of_page(page.read_text(encoding="utf-8"))["title"]
    assert title == "attention explorer: " + text[:79] + "…"


@pytest.mark.parametrize("args, message", [
    (["--relevance", "--query-position", "-1"],  # said before any measuring
     "the query is the text's last token (position 7): it predicts nothing in the text"),
    (["--relevance", "--top", "0"], "--top 0: expected a positive number"),
    (["--top", "3"], "--top 3: only with --relevance"),
    (["--html", "{run}/config.yaml/page.html"], "config.yaml is a file, not a folder"),
], ids=["last-token", "top-zero", "top-without-relevance", "unwritable"])
def test_command_mistakes_are_one_line(run_dir, capsys, args, message):
    args = [arg.format(run=run_dir) for arg in args]
    status = attention_main(["--checkpoint", str(run_dir), "--text", "The book", "--device", "cpu", *args])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_a_text_that_is_not_utf8_is_one_line_naming_the_character(run_dir, capsys):
    # Bytes that are not UTF-8 reach Python as lone surrogates; the tokenizer ended in a TypeError traceback.
    status = attention_main(["--checkpoint", str(run_dir), "--text", "ab\udcffcd", "--html", "x.html",
                             "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 2
    assert err == "error: --text is not valid UTF-8 text (after 2 characters: '\\udcff'); give it as UTF-8\n"


# ----------------------------------------------------------------------------- in a browser


def check_head_ablation_colours(page, head_relevance):
    """Each cell of the page's ablation grid: its rise, red for a rise, teal for a fall, opaque as its
    size over the largest either way."""
    cells = page.eval_on_selector_all("#ablation td",
                                      "tds => tds.map(td => [td.dataset.rise, td.style.background])")
    rises = np.array([float(rise) for rise, _ in cells])  # as stored: three decimals
    np.testing.assert_allclose(rises, head_relevance.ravel(), rtol=0, atol=5e-4)
    for rise, (_, background) in zip(rises, cells):
        colour, opacity = re.fullmatch(r"rgba?\((\d+, \d+, \d+)(?:, ([0-9.]+))?\)", background).groups()
        assert colour == ("207, 34, 46" if rise >= 0 else "26, 127, 120"), (rise, background)
        expected = abs(rise) / np.abs(rises).max()
        assert float(opacity or 1) == pytest.approx(expected, abs=5e-3), (rise, background)  # in 255ths


@pytest.mark.slow
def test_in_chromium_the_highlighted_weights_are_the_models_and_nothing_is_fetched(new_page, relevance,
                                                                                   tmp_path):
    page_file = write_explorer(tmp_path / "explorer.html", relevance, "test", "a tiny model")
    page = new_page(viewport={"width": 1200, "height": 900}, own_cache=True)
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file.as_uri())

    def shown(row, attribute, query):
        values = page.eval_on_selector_all(f"#{row}-row .tok", f"spans => spans.map(s => s.dataset.{attribute})")
        assert len(values) == relevance.num_tokens
        keys = range(relevance.reach[query], query + 1 if attribute == "weight" else query)
        assert all(values[j] == "" for j in range(relevance.num_tokens) if j not in keys)  # future, out of reach
        return np.array([float(values[j]) for j in keys])

    query = 40  # in the second window: it reads keys 16..40
    page.hover(f"#weights-row .tok[data-pos='{query}']")
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    expected = relevance.weights[1, 2, query, 16:query + 1]
    np.testing.assert_allclose(shown("weights", "weight", query), expected, rtol=0, atol=STEP + 1e-4)
    classes = page.eval_on_selector_all("#weights-row .tok", "spans => spans.map(s => s.className)")
    assert [c.split()[1:] for c in classes[14:18]] == [["far"], ["far"], [], []]  # keys 0..15: out of reach
    assert classes[query].split()[1:] == ["query"] and classes[query + 1].split()[1:] == ["future"]
    key = 16 + int(np.argmax(expected))  # the colour's opacity is the weight
    background = page.eval_on_selector(f"#weights-row .tok[data-pos='{key}']", "s => s.style.background")
    assert float(re.search(r"rgba\(9, 105, 218, ([0-9.]+)\)", background).group(1)) == pytest.approx(
        expected.max(), abs=STEP + 5e-3)  # the browser keeps opacity in 255ths
    np.testing.assert_allclose(shown("relevance", "relevance", query),
                               relevance.token_relevance[query, 16:query], rtol=0, atol=1e-3)
    assert f"query {relevance.labels[query]} at {query}" in page.inner_text("#query-info")
    row = relevance.token_relevance[query, 16:query]  # red where a key is needed, teal where better without
    assert row.min() < 0 < row.max()
    for key, colour in ((16 + np.argmax(row), "207, 34, 46"), (16 + np.argmin(row), "26, 127, 120")):
        span = f"#relevance-row .tok[data-pos='{key}']"
        background = page.eval_on_selector(span, "s => s.style.background")
        assert colour in background, (key, relevance.token_relevance[query, key], background)
    # The surprise row: token j shows the loss of predicting it, made at position j - 1 (losses[j - 1]);
    # nothing predicts token 0. Three decimals shown.
    surprise = page.eval_on_selector_all("#loss-row .tok", "spans => spans.map(s => s.dataset.loss)")
    assert len(surprise) == relevance.num_tokens and surprise[0] == ""
    shown_losses = [float(v) if v else np.nan for v in surprise[1:]]
    np.testing.assert_allclose(shown_losses, relevance.losses[:-1], rtol=0, atol=5e-4 + 1e-6)

    page.select_option("#head", "mean")
    np.testing.assert_allclose(shown("weights", "weight", query), relevance.weights[1, :, query, 16:query + 1].mean(0),
                               rtol=0, atol=STEP + 1e-4)
    page.select_option("#head", "2")
    page.select_option("#layer", "mean")  # every layer and head, whichever head was chosen
    everything = relevance.weights[:, :, query, 16:query + 1].mean((0, 1))
    np.testing.assert_allclose(shown("weights", "weight", query), everything, rtol=0, atol=STEP + 1e-4)
    page.select_option("#layer", "1")

    page.click("#weights-row .tok[data-pos='12']")  # pins query 12 ...
    page.hover("#relevance-row .tok[data-pos='30']")  # ... so hovering elsewhere does not move it
    page.click("#grid canvas[data-layer='0'][data-head='3']")  # a heatmap selects its head
    assert page.input_value("#layer") == "0" and page.input_value("#head") == "3"
    np.testing.assert_allclose(shown("weights", "weight", 12), relevance.weights[0, 3, 12, :13], rtol=0,
                               atol=STEP + 1e-4)
    check_head_ablation_colours(page, relevance.head_relevance)
    page.click("#ablation td[data-layer='1'][data-head='0']")  # so does a cell of the ablation grid
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "0"
    page.keyboard.press("Escape")  # unpins: hovering moves the query again
    page.hover("#relevance-row .tok[data-pos='30']")
    assert "query " + relevance.labels[30] + " at 30 " in page.inner_text("#query-info")

    page.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)
    assert (tmp_path / "explorer.png").stat().st_size > 10_000
    assert requests == [page_file.as_uri()]  # the page itself, nothing else
    assert errors == []


@pytest.mark.slow
def test_in_chromium_a_text_without_a_rank_correlation_says_n_a(new_page, relevance, tmp_path):
    flat = np.where(relevance.measured(), 0.0, np.nan)  # every relevance alike: no correlation
    falls = -np.abs(relevance.head_relevance)  # and every head's removal lowers the loss
    alike = Relevance(**{**relevance.__dict__, "token_relevance": flat, "head_relevance": falls})
    page_file = write_explorer(tmp_path / "explorer.html", alike)
    page = new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file.as_uri())
    assert errors == []
    said = page.inner_text("#agreement")
    assert "pairs: n/a for the mean over every head; by layer 0: n/a, 1: n/a." in said
    assert "With |relevance| (how much a key matters, either way): n/a; by layer 0: n/a, 1: n/a." in said
    assert page.inner_text("#query-info").endswith("(Spearman): n/a; vs |relevance|: n/a")
    check_head_ablation_colours(page, falls)


@pytest.mark.slow
def test_in_chromium_arrow_keys_move_the_query_and_leave_a_focused_selector_alone(new_page, relevance,
                                                                                   tmp_path):
    # After a head was chosen in its selector, the selector keeps the focus: ArrowRight moved the query
    # and, as the select's own key, chose the next head too.
    page = new_page()
    page.goto(write_explorer(tmp_path / "explorer.html", relevance).as_uri())
    page.click("#weights-row .tok[data-pos='20']")  # pins query 20
    page.select_option("#head", "1")
    page.focus("#head")
    page.keyboard.press("ArrowRight")
    assert page.input_value("#head") == "1"
    assert page.inner_text("#weights-title").startswith("layer 0, head 1;")
    assert page.inner_text("#query-info").startswith(f"query {relevance.labels[21]} at 21 (pinned)")
    page.focus("#layer")
    page.keyboard.press("ArrowLeft")
    assert page.input_value("#layer") == "0" and page.inner_text("#query-info").startswith(
        f"query {relevance.labels[20]} at 20 (pinned)")
    page.focus("body")
    for keys in ("Alt+ArrowRight", "Control+ArrowRight"):  # the browser's (Alt+ArrowLeft: back)
        page.keyboard.press(keys)
        assert page.inner_text("#query-info").startswith(f"query {relevance.labels[20]} at 20 (pinned)"), keys


@pytest.mark.slow
def test_in_chromium_the_page_opens_on_the_layer_and_head_it_was_written_for(new_page, relevance, tmp_path):
    page = new_page()
    page.goto(write_explorer(tmp_path / "explorer.html", relevance, layer=1, head=2).as_uri())
    assert (page.input_value("#layer"), page.input_value("#head")) == ("1", "2")
    assert page.inner_text("#weights-title").startswith("layer 1, head 2;")


@pytest.mark.slow
def test_in_chromium_tokens_stand_in_position_order_whatever_their_script(new_page, tmp_path):
    # Right-to-left tokens (Hebrew, Arabic) were laid out right to left by the bidi algorithm: a run of
    # them showed in reverse order, and a control such as U+202E reversed every later token.
    labels = ["a", "\u05e9", "\u05dc", "\u05d5", "\u2423", "\u0633\u0644", "\u0627\u0645", "b", "\u202e", "x",
              "y"]
    T, L, H = len(labels), 1, 1
    weights = np.tril(np.ones((T, T), dtype=np.float32))[None, None] / np.arange(1, T + 1)[:, None]
    relevance = np.where(np.tril(np.ones((T, T)), k=-1) > 0, 0.1, np.nan)
    rel = Relevance(list(range(T)), labels, T, np.zeros(T, dtype=int), weights,
                    np.append(np.ones(T - 1), np.nan), relevance, np.zeros((L, H)), 1.0)
    page = new_page(viewport={"width": 1000, "height": 600})
    page.goto(write_explorer(tmp_path / "explorer.html", rel).as_uri())
    for row in ("weights", "relevance", "loss"):
        spans = page.eval_on_selector_all(
            f"#{row}-row .tok", "s => s.map(x => [x.textContent, x.getBoundingClientRect().left])")
        assert [text for text, _ in spans] == labels
        lefts = [left for _, left in spans]
        assert lefts == sorted(lefts) and len(set(lefts)) == T, (row, lefts)
