"""`tinyattn lab scaling` on tiny models and made-up scores: softmax rows measured as their names say
(a uniform row's entropy share is 1, a one-hot row has no gradient, masked keys are not read), random
scores divided by sqrt(d_k) spread near 1 at every head width and undivided ones near sqrt(d_k), a
trained model's rows rescaled are those of its scores rescaled, the runs differ in their division
alone, and the command writes its tables, figure and runs, refusing what it cannot run before it trains."""

import argparse
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, lines_by_label, written_corpus
from tinyattn.cli.lab import main
from tinyattn.config import load_config
from tinyattn.errors import TinyattnError
from tinyattn.lab.scaling import (
    ROWS_FIELDS,
    Rows,
    Run,
    arithmetic,
    attention_rows,
    format_report,
    head_dims,
    initial_model,
    recorded_weights,
    rows_rescaled,
    save_figure,
    softmax_rows,
    train_runs,
)

# The lab's runs trained here in process write to the page cache alone (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")


def causal_keys(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): row t reads keys 0..t


# ----------------------------------------------------------------------------- softmax rows


def test_a_uniform_row_has_entropy_share_1_and_the_gradient_a_uniform_softmax_has():
    rows = softmax_rows(torch.zeros(5, 64))
    assert rows.spread == 0 and rows.one_hot == 0
    assert rows.entropy_share == pytest.approx(1, abs=1e-12)
    assert rows.largest == pytest.approx(1 / 64, abs=1e-12)
    # diag(p) - p p^T with p = 1/N everywhere: N(1/N - 1/N^2)^2 + (N^2 - N)/N^4 = 1/N - 1/N^2
    assert rows.gradient == pytest.approx(math.sqrt(1 / 64 - 1 / 64 ** 2), abs=1e-12)


def test_the_softmax_gradient_is_the_jacobians_frobenius_norm():
    # p = (0.9, 0.1): diag(p) - p p^T = [[0.09, -0.09], [-0.09, 0.09]], whose norm is 0.18
    rows = softmax_rows(torch.tensor([[math.log(0.9), math.log(0.1)]], dtype=torch.float64))
    assert rows.gradient == pytest.approx(0.18, abs=1e-12) and rows.largest == pytest.approx(0.9, abs=1e-12)


def test_a_row_with_one_far_larger_score_is_one_hot_and_softmax_has_no_gradient_there():
    scores = torch.zeros(3, 10)
    scores[:, 4] = 60.0
    rows = softmax_rows(scores)
    assert rows.one_hot == 1 and rows.largest == pytest.approx(1, abs=1e-12)
    assert rows.entropy_share < 1e-20 and rows.gradient < 1e-12
    assert rows.spread == pytest.approx(float(scores[0].double().std(unbiased=False)))


def test_rows_read_only_their_allowed_keys_and_leave_out_rows_of_a_single_key():
    T = 6
    scores = torch.full((T, T), 1e4).tril(-1).T.contiguous()  # huge scores at the masked keys only
    rows = softmax_rows(scores, causal_keys(T))
    assert rows.entropy_share == pytest.approx(1, abs=1e-12)  # every row uniform over its own keys
    assert rows.spread == 0
    # rows 1..5 have 2..6 keys; row 0, one key, would add a largest weight of 1
    assert rows.largest == pytest.approx(np.mean([1 / n for n in range(2, T + 1)]), abs=1e-12)


def test_a_models_rows_rescaled_are_the_rows_of_its_scores_times_the_factor():
    # The checkpoint part reads only weights: softmax(f * log w) must be the row f * scores give.
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 12, 12, generator=generator, dtype=torch.float64) * 2
    keys = causal_keys(12).expand(2, 3, 12, 12)
    weights = torch.softmax(scores.masked_fill(~keys, float("-inf")), dim=-1)
    for factor in (1.0, 4.0, 0.25):
        expected, measured = softmax_rows(scores * factor, keys), rows_rescaled(weights, factor)
        for field in ROWS_FIELDS:
            assert getattr(measured, field) == pytest.approx(getattr(expected, field), abs=1e-9), field


def test_a_key_whose_fp32_weight_underflowed_still_counts_and_its_row_stays_one_hot():
    # Rows 1 and 2 put all but e^-120 and e^-50 of their weight on key 0: in fp32 the e^-120 is 0. Such a
    # key was taken for a masked one, which dropped row 1 (one key left) and lowered the one-hot share.
    scores = torch.tensor([[0.0, -1e9, -1e9], [0.0, -120.0, -1e9], [0.0, -50.0, -120.0]])
    keys = causal_keys(3)
    weights = torch.softmax(scores.masked_fill(~keys, float("-inf")), dim=-1).view(1, 1, 3, 3)  # fp32
    assert weights[0, 0, 1, 1] == 0  # underflowed
    exact, measured = softmax_rows(scores, keys), rows_rescaled(weights)
    assert (measured.one_hot, measured.largest) == (1, 1) == (exact.one_hot, exact.largest)
    assert measured.entropy_share == pytest.approx(exact.entropy_share, abs=1e-15)
    assert measured.spread == pytest.approx(25.0 / 2, abs=1e-6)  # row 1 has one known score: spread 0


# ----------------------------------------------------------------------------- the arithmetic


def test_random_scores_divided_spread_near_1_at_every_width_and_undivided_near_sqrt_d_k():
    table = arithmetic(64, dims=(8, 64, 256), rows=512)
    for d, divided, undivided in table:
        # a row's spread is |q| / sqrt(d_k) times that of its keys' entries: about 1 on average (a row of
        # few dimensions has a |q| further from sqrt(d_k), and the standard deviation's mean sits below 1)
        assert divided.spread == pytest.approx(1, rel=0.1)
        assert undivided.spread == pytest.approx(math.sqrt(d), rel=0.1)
        assert divided.one_hot == 0
    shares = [undivided.entropy_share for _, _, undivided in table]
    assert shares == sorted(shares, reverse=True) and shares[-1] < 0.1  # wider heads, sharper rows
    assert max(divided.entropy_share for _, divided, _ in table) - min(
        divided.entropy_share for _, divided, _ in table) < 0.01  # divided: the same rows at any width
    assert table[-1][2].one_hot > 0.3 and table[-1][2].gradient < 0.7 * table[-1][1].gradient


def test_the_arithmetic_draws_fewer_rows_against_more_keys_as_many_scores_in_all():
    from tinyattn.lab.scaling import arithmetic_rows

    assert arithmetic_rows(64) == 1024 and arithmetic_rows(256) == 256 and arithmetic_rows(1024) == 64
    assert arithmetic_rows(100_000) == 64


# ----------------------------------------------------------------------------- a model's rows


def test_a_models_rows_are_the_mean_over_its_layers_read_in_eval_and_leave_its_mode(tiny_model,
                                                                                    random_tokens):
    model = tiny_model(dropout=0.5).train()
    x = random_tokens()
    per_layer = [rows_rescaled(w) for w in recorded_weights(model, x)]
    assert len(per_layer) == 2 and per_layer[0] != per_layer[1]
    rows = attention_rows(model, x)
    for field in ROWS_FIELDS:
        mean = np.mean([getattr(r, field) for r in per_layer])
        assert getattr(rows, field) == pytest.approx(mean, abs=1e-12)
    assert rows == attention_rows(model, x)  # no dropout drawn: the same rows twice
    assert model.training


def test_the_started_rows_read_the_weights_the_run_started_from(tmp_path):
    from tinyattn.system.device import select_precision
    from tinyattn.train.trainer import Trainer

    config = load_config(ROOT / "configs" / "tiny.yaml", ["model.vocab_size=65", "train.seed=7"])
    cpu = torch.device("cpu")
    trainer = Trainer.build(config.model, config.train, np.zeros(1000, dtype=np.uint16), device=cpu,
                            precision=select_precision("fp32", cpu))
    started = initial_model(config).state_dict()
    assert started.keys() == trainer.model.state_dict().keys()
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(started[name], tensor), name


# ----------------------------------------------------------------------------- the runs


@pytest.mark.parametrize("text, width, message", [
    ("16,48", 128, "--head-dims 16,48: 48 does not divide the model's width 128 (model.n_embd) into heads"),
    ("3", 96, "--head-dims 3: 3 is odd; RoPE rotates pairs of a head's dimensions, so each head width must "
              "be even"),
    ("0", 128, "--head-dims 0: 0 is no head width; expected positive integers"),
    ("16,-64", 128, "--head-dims 16,-64: -64 is no head width; expected positive integers"),
    ("16,16", 128, "--head-dims 16,16: a head width given twice"),
    ("16;64", 128, "--head-dims '16;64': expected head widths separated by commas, such as 16,64"),
])
def test_head_widths_must_be_even_divisors_of_the_width_each_given_once(text, width, message):
    with pytest.raises(TinyattnError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        head_dims(text, width)
    assert head_dims("16,64", 128) == [16, 64] and head_dims("8", 32) == [8]


def configs_trained(tmp_path, monkeypatch, *overrides, dims="16,64", config="shakespeare_char.yaml") -> list:
    """(run name, config) of each run `train_runs` trains, training mocked."""
    from tinyattn.lab.scaling import run_names
    from tinyattn.train import loop

    trained = []
    monkeypatch.setattr(loop, "train", lambda config, **options: trained.append((options["run_name"], config))
                        or SimpleNamespace(run_dir=tmp_path / options["run_name"], interrupted=False))
    args = argparse.Namespace(config=str(ROOT / "configs" / config), steps=40, force=False,
                              overrides=list(overrides), head_dims=dims)
    width = load_config(args.config, ["model.n_embd=128", *overrides]).model.n_embd
    train_runs(args, tmp_path, run_names(head_dims(dims, width)), width)
    return trained


def test_each_head_width_trains_divided_then_undivided_its_heads_the_width_over_d_k(tmp_path, monkeypatch):
    trained = configs_trained(tmp_path, monkeypatch)
    assert [(name, c.model.n_head, c.model.scale_scores) for name, c in trained] == [
        ("divided_d16", 8, True), ("undivided_d16", 8, False),
        ("divided_d64", 2, True), ("undivided_d64", 2, False)]
    first = trained[0][1]
    for _, config in trained:  # the same model, data and steps: only the heads and the division differ
        assert config.model.kv_heads == config.model.n_head  # keys and values for every head
        assert (config.model.n_layer, config.model.n_embd, config.train.max_steps) == (2, 128, 40)
        assert (config.train.precision, config.train.compile, config.train.ema) == ("fp32", False, None)
        assert config.train.seed == first.train.seed and config.data == first.data


def test_the_users_set_comes_after_the_labs_and_the_heads_follow_a_width_it_sets(tmp_path, monkeypatch):
    # tiny.yaml shares each key and value head between two query heads: the runs give every head its own
    trained = configs_trained(tmp_path, monkeypatch, "model.n_embd=64", "model.n_layer=3", dims="16,32",
                              config="tiny.yaml")
    assert load_config(ROOT / "configs" / "tiny.yaml").model.n_kv_head == 2
    assert [(c.model.n_embd, c.model.n_head, c.model.kv_heads, c.model.n_layer) for _, c in trained] == [
        (64, 4, 4, 3), (64, 4, 4, 3), (64, 2, 2, 3), (64, 2, 2, 3)]


def test_a_set_of_the_division_is_refused_as_every_head_width_trains_both_ways(tmp_path, monkeypatch, capsys):
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--out", str(tmp_path / "out"), "--set", "model.scale_scores=false"]) == 2
    assert capsys.readouterr().err == ("error: --set model.scale_scores=false: lab scaling trains each head "
                                       "width both divided and undivided; remove it\n")
    assert not (tmp_path / "out").exists()


def test_a_width_the_configs_own_heads_do_not_divide_is_read_when_the_head_dims_do(
        tmp_path, monkeypatch, capsys, corpus_text):
    # 100 / 4 heads (the config's) is 25, odd for RoPE: the width was refused before --head-dims set the
    # heads, 20 and 50 of which give 5 heads and 2.
    from pathlib import Path

    from tinyattn.train import loop

    trained = []
    monkeypatch.setattr(loop, "train", lambda config, **options: trained.append(config.model.n_head) or
                        SimpleNamespace(run_dir=Path(config.train.out_dir) / options["run_name"], step=1,
                                        interrupted=True))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--head-dims", "20,50", "--set", "model.n_embd=100",
                 *written_corpus(tmp_path, corpus_text)]) == 130
    assert trained == [5]  # the first run trained (and was stopped), with its own heads


@pytest.mark.parametrize("item, option", [("model.n_head=2", "--head-dims"),
                                          ("train.max_steps=20", "--steps 20")])
def test_a_set_of_what_the_labs_options_give_is_refused_naming_the_option_before_anything_trains(
        tmp_path, monkeypatch, capsys, item, option):
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--out", str(tmp_path / "out"), "--set", item]) == 2
    key = item.split("=")[0]
    assert capsys.readouterr().err == (f"error: --set {item}: lab scaling sets {key} from "
                                       f"{option.split()[0]}; give {option} instead\n")
    assert not (tmp_path / "out").exists()


def test_heads_the_users_grouped_queries_cannot_share_are_refused_before_any_run_trains(
        tmp_path, monkeypatch, capsys, corpus_text):
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--head-dims", "8,16", "--set", "model.n_embd=32", "model.n_kv_head=4",
                 *written_corpus(tmp_path, corpus_text)]) == 2  # d_k 16: 2 heads cannot share 4 key heads
    err = capsys.readouterr().err
    assert err.startswith("error: --head-dims 8,16: d_k 16 gives the divided_d16 run model.n_head=2, "
                          "which its config refuses (") and "model.n_kv_head=4" in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_lab_scaling_without_matplotlib_is_refused_in_one_line_before_anything_trains(
        tmp_path, monkeypatch, capsys, corpus_text):
    import sys

    from tinyattn.train import loop

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the optional extra were not installed
    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: pytest.fail("trained before checking"))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--set", *written_corpus(tmp_path, corpus_text)]) == 2
    assert capsys.readouterr().err == ("error: plots need matplotlib, an optional extra: "
                                       "pip install 'tinyattn[plot]'\n")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_another_tokenizer_than_the_configs_is_refused_before_anything_trains(
        tmp_path, monkeypatch, capsys, trained_run):
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--checkpoint", str(trained_run.run_dir),
                 "--set", *written_corpus(tmp_path, "Other letters entirely: qqq zzz xxx.\n" * 400)]) == 2
    config = ROOT / "configs" / "tiny.yaml"
    assert capsys.readouterr().err == (f"error: --checkpoint {trained_run.run_dir}: its tokenizer is not the "
                                       f"one of --config {config}; give the config it was trained with\n")
    assert not (tmp_path / "out").exists()


# divided_d8: a run of a head width the lab does not train now (an earlier --head-dims), which would
# stand beside its runs in TensorBoard; divided_dx is no run of the lab's and is left alone
@pytest.mark.parametrize("earlier", ["scaling.txt", "scaling.png", "undivided_d64", "divided_d8"])
def test_an_out_holding_what_the_lab_writes_is_refused_before_anything_trains_and_force_clears_it(
        tmp_path, monkeypatch, earlier):
    from tinyattn.lab.scaling import run_names
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: SimpleNamespace(run_dir=tmp_path / "x",
                                                                          interrupted=False))
    path = tmp_path / earlier
    path.mkdir() if "." not in earlier else path.write_text("mine")
    (tmp_path / "divided_dx").mkdir()
    (tmp_path / "divided_dx" / "notes.txt").write_text("mine")
    (path / "best.pt").write_bytes(b"run") if path.is_dir() else None
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=3, force=False, overrides=[])
    with pytest.raises(TinyattnError, match=rf"holds {earlier}, which this lab writes; add --force"):
        train_runs(args, tmp_path, run_names([16, 64]), 128)
    assert path.exists()
    args.force = True
    train_runs(args, tmp_path, run_names([16, 64]), 128)
    assert not path.exists() and (tmp_path / "divided_dx" / "notes.txt").exists()


def test_a_run_stopped_ends_the_lab_in_one_line_naming_all_its_runs_before_the_next_or_a_table(
        tmp_path, monkeypatch, capsys, corpus_text):
    from tinyattn.train import loop

    from tests.test_lab_causal_context import saved_run

    trained, out = [], tmp_path / "out"
    monkeypatch.setattr(loop, "train", lambda config, **options: trained.append(options["run_name"]) or
                        saved_run(out / options["run_name"]) or
                        SimpleNamespace(run_dir=out / options["run_name"], step=9, interrupted=True))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "300",
                 "--out", str(out), "--head-dims", "8,16", "--set", "model.n_embd=32",
                 *written_corpus(tmp_path, corpus_text)]) == 130
    stdout, err = capsys.readouterr()
    assert trained == ["divided_d8"]
    assert err == (f"lab scaling stopped: the divided_d8 run stopped at step 9 of 300 "
                   f"({out / 'divided_d8'}); nothing was compared. Run the lab again with --out {out} "
                   "--force to train all 4 runs anew\n")
    assert not (out / "scaling.txt").exists() and not (out / "scaling.png").exists()


def test_a_run_stopped_without_out_says_to_run_the_lab_again_in_a_new_folder_as_a_later_stop_does(
        tmp_path, monkeypatch, capsys, corpus_text):
    # Without --out the lab makes a new folder each time: the stop named the one it made with --force,
    # where a stop while the runs are measured says "in a new folder".
    from pathlib import Path

    from tinyattn.train import loop

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loop, "train", lambda config, **options: SimpleNamespace(
        run_dir=Path(config.train.out_dir) / options["run_name"], step=2, interrupted=True))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 "--head-dims", "8", "--set", "model.n_embd=32",
                 *written_corpus(tmp_path, corpus_text)]) == 130
    [out] = Path("checkpoints", "lab").glob("scaling-*")
    assert capsys.readouterr().err == (f"lab scaling stopped: the divided_d8 run stopped at step 2 of 3 "
                                       f"({out / 'divided_d8'}); nothing was compared. Run the lab again to "
                                       "train both runs anew in a new folder\n")


def test_a_lab_scaling_stopped_while_it_measures_says_its_folder_holds_its_trained_runs(
        tmp_path, monkeypatch, capsys, corpus_text):
    from pathlib import Path

    from tinyattn.hf import folder
    from tinyattn.train import loop

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "out"
    monkeypatch.setattr(loop, "train", lambda config, **options: SimpleNamespace(
        run_dir=Path(config.train.out_dir) / options["run_name"], step=3, interrupted=False))
    monkeypatch.setattr(folder, "load_any_model", stop)  # the first thing the measurement reads
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 "--out", str(out), "--head-dims", "8", "--set", "model.n_embd=32",
                 *written_corpus(tmp_path, corpus_text)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"lab scaling stopped before its table; {out} holds its 2 trained runs; run it again with "
        f"--out {out} --force to start over")


# ----------------------------------------------------------------------------- the report


def _rows(share: float) -> Rows:
    return Rows(spread=1.0, entropy_share=share, largest=0.5, one_hot=0.0, gradient=0.2)


def test_the_report_gives_each_head_widths_validation_loss_undivided_minus_divided():
    runs = [Run("divided_d16", 16, True, 1.7, 1.80, _rows(0.9), _rows(0.6)),
            Run("undivided_d16", 16, False, 1.7, 1.85, _rows(0.4), _rows(0.3)),
            Run("divided_d64", 64, True, 1.7, 1.81, _rows(0.9), _rows(0.4)),
            Run("undivided_d64", 64, False, 1.9, 1.79, _rows(0.2), _rows(0.03))]
    text = format_report("header", arithmetic(64, dims=(8,), rows=16), runs, keys=64, context=64, steps=300,
                         windows=12)
    lines = text.splitlines()
    assert lines[0] == "header"
    assert "d_k 16: validation loss undivided minus divided +0.050" in lines
    assert "d_k 64: validation loss undivided minus divided -0.020" in lines
    [started] = [line for line in lines if line.lstrip().startswith("undivided_d64")]
    assert started.split()[1:5] == ["1.900", "1.790", "started", "1.000"]
    assert "a uniform row's 0.124" in text
    assert "its attention rows on 12 validation windows" in text  # the windows read, not the most it reads
    # a uniform causal row of n = 2..64 keys: sqrt(1/n - 1/n^2), averaged over the 63 rows
    causal = np.mean([math.sqrt(1 / n - 1 / n ** 2) for n in range(2, 65)])
    assert f"a uniform one's softmax gradient is {causal:.3f} on average" in text


def test_the_figure_draws_the_arithmetic_and_each_runs_curve_dashed_when_undivided(tmp_path,
                                                                                  figures_unrendered):
    table = arithmetic(64, dims=(8, 16), rows=16)
    runs = [Run("divided_d8", 8, True, 1.7, 1.8, _rows(0.9), _rows(0.6)),
            Run("undivided_d8", 8, False, 1.7, 1.9, _rows(0.4), _rows(0.3))]
    curves = {"divided_d8": (np.array([1, 2]), np.array([3.0, 2.5])),
              "undivided_d8": (np.array([1, 2]), np.array([3.0, 2.9]))}
    save_figure(table, runs, curves, tmp_path / "scaling.png")
    [figure] = figures_unrendered
    rows_axes, gradient_axes, loss_axes = figure.axes
    rows_lines = lines_by_label(rows_axes)
    shares = [table[0][2].entropy_share, table[1][2].entropy_share]
    assert rows_lines["entropy share, undivided"] == ([8, 16], shares)
    assert rows_lines["largest weight, divided"][1] == [table[0][1].largest, table[1][1].largest]
    gradients = [row[2].gradient for row in table]
    assert lines_by_label(gradient_axes)["softmax gradient, undivided"][1] == gradients
    styles = {line.get_label(): line.get_linestyle() for line in loss_axes.lines}
    assert styles == {"divided_d8 (val 1.800)": "-", "undivided_d8 (val 1.900)": "--"}
    assert lines_by_label(loss_axes)["undivided_d8 (val 1.900)"] == ([1, 2], [3.0, 2.9])


# ----------------------------------------------------------------------------- the command


def test_lab_scaling_writes_its_tables_figure_and_runs_and_reads_a_checkpoint(
        tmp_path, capsys, corpus_text, trained_run):
    out = tmp_path / "out"
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 "--out", str(out), "--head-dims", "8,16", "--checkpoint", str(trained_run.run_dir),
                 "--set", "model.n_embd=32",
                 "train.eval_windows=2", *written_corpus(tmp_path, corpus_text)]) == 0
    stdout = capsys.readouterr().out
    text = (out / "scaling.txt").read_text(encoding="utf-8")
    assert text.startswith("tinyattn lab scaling: ")
    assert text.splitlines()[-1].startswith("wall time of the command: ")
    for name in ("divided_d8", "undivided_d8", "divided_d16", "undivided_d16"):
        assert f"{name} " in text and (out / name / "best.pt").is_file()
        assert [*(out / name).glob("events.out.tfevents.*")]
    assert "d_k 16: validation loss undivided minus divided " in text
    layers = [line.split()[0] for line in text.splitlines()[text.splitlines().index(next(
        line for line in text.splitlines() if line.startswith(str(trained_run.run_dir)))) + 2:-2]]
    assert layers == ["0", "undivided", "1", "undivided"]  # each layer as trained, then undivided
    [trained, undivided] = [line for line in text.splitlines() if line.split()[:1] == ["0"] or
                            line.startswith("      undivided")][:2]
    d_k = 8  # tiny.yaml: width 32, 4 heads
    assert float(undivided.split()[1]) == pytest.approx(math.sqrt(d_k) * float(trained.split()[3]), rel=2e-3)
    assert text.split("\n\nwall time")[0] in stdout  # printed as written
    assert (out / "scaling.png").stat().st_size > 10_000
    assert "fp32, torch threads" in text.splitlines()[0]
    # an undivided model of yours: its rows as trained, and with its scores divided (times 1 / sqrt(d_k))
    from tinyattn.data.batches import prepare_data
    from tinyattn.lab.scaling import checkpoint_layers

    data = prepare_data(load_config(ROOT / "configs" / "tiny.yaml", written_corpus(tmp_path, corpus_text)),
                        progress=False)
    assert f"attention rows on {min(16, len(data.validation) // 32)} validation windows" in text
    args = argparse.Namespace(checkpoint=out / "undivided_d16", config=str(ROOT / "configs" / "tiny.yaml"))
    name, divided, d, _, per_layer = checkpoint_layers(args, data, 32)
    assert (divided, d) == (False, 16)
    for trained, rescaled in per_layer:
        assert rescaled.spread == pytest.approx(trained.spread / 4, rel=1e-9)
        assert rescaled.entropy_share > trained.entropy_share  # divided: flatter rows


def test_a_runs_row_reads_its_last_logged_loss_its_evaluation_and_its_rows_as_started_and_as_trained(
        trained_run, random_tokens):
    from tinyattn.hf.folder import load_any_model
    from tinyattn.lab.runs import training_curve
    from tinyattn.lab.scaling import measure_run

    loaded = load_any_model(trained_run.run_dir)
    x = random_tokens(batch=3, length=32, vocab_size=loaded.config.model.vocab_size)
    result = SimpleNamespace(run_dir=trained_run.run_dir, last_val_loss=1.25)
    row = measure_run("divided_d8", 8, True, result, x)
    steps, losses = training_curve(trained_run.run_dir)
    assert len(losses) > 1 and row.train_loss == float(losses[-1]) and row.val_loss == 1.25
    assert row.trained == attention_rows(loaded.model, x)
    assert row.started == attention_rows(initial_model(loaded.config), x) != row.trained


def test_a_device_the_machine_lacks_is_refused_before_a_run_says_it_trains(tmp_path, monkeypatch, capsys,
                                                                            corpus_text):
    from tinyattn.train import loop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--set", "train.device=cuda", *written_corpus(tmp_path, corpus_text)]) == 2
    stdout, err = capsys.readouterr()
    assert (stdout, err) == ("", "error: device 'cuda' was asked for but CUDA is not available here; use "
                                 "--set train.device=cpu or auto\n")  # a lab has no --device
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting, refused", [
    # A causal row of one key is one-hot whatever its scores: the lab would read no row at all.
    ("model.context_length=1", "error: model.context_length 1: a causal row weighs "),
    # Its rows would weigh later keys and its losses read the token they predict: a table as of causal ones.
    ("model.causal=false", "error: model.causal false: lab scaling reads causal "),
], ids=["a-context-of-one-token", "a-bidirectional-config"])
def test_a_config_the_lab_cannot_read_is_refused_before_anything_trains(tmp_path, monkeypatch, capsys,
                                                                        corpus_text, setting, refused):
    from tinyattn.train import loop

    monkeypatch.setattr(loop, "train", lambda config, **options: pytest.fail("trained"))
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(tmp_path / "out"),
                 "--set", setting, *written_corpus(tmp_path, corpus_text)]) == 2
    assert capsys.readouterr().err.startswith(refused)
    assert not (tmp_path / "out").exists()


def test_a_labs_run_stopped_says_where_it_saved_but_advises_no_resume_which_the_lab_would_not_read(
        tmp_path, monkeypatch, capsys, corpus_text):
    # A lab's stopped run printed train's "Resume with: tinyattn train --resume <run>", then the lab's line
    # saying to run the lab again with --force: a resumed run finishes, and the lab never reads it.
    from tinyattn.train import loop

    options_given = []
    monkeypatch.setattr(loop, "train", lambda config, **options: options_given.append(options) or
                        SimpleNamespace(run_dir=tmp_path / options["run_name"], step=1, interrupted=True))
    args = argparse.Namespace(config=str(ROOT / "configs" / "tiny.yaml"), steps=3, force=False, overrides=[],
                              out=None)
    with pytest.raises(KeyboardInterrupt):
        train_runs(args, tmp_path, {"divided_d8": (8, True)}, 32)
    assert [options["resume_advice"] for options in options_given] == [False]
    # what the flag does, in a run of train's own
    monkeypatch.undo()
    items = [*written_corpus(tmp_path, corpus_text), f"train.out_dir={tmp_path / 'runs'}",
             "train.sample_tokens=0"]
    config = load_config(ROOT / "configs" / "tiny.yaml", items)
    for advice in (False, True):
        loop.train(config, run_name=f"advice-{advice}", progress=False, stop_at_step=2, resume_advice=advice)
        last = capsys.readouterr().err.splitlines()[-1]
        assert last.startswith("stopped by --stop-at-step at step 2; checkpoint saved in ")
        assert ("Resume with: " in last) is advice, last


def test_a_first_run_stopped_before_its_first_step_says_to_run_the_lab_again_without_force(
        tmp_path, monkeypatch, capsys, corpus_text):
    # Such a run leaves no folder (train takes a new run's folder back), so --out holds nothing of the
    # lab and a rerun needs no --force, which the line advised.
    from tinyattn.train import loop
    from tinyattn.train.owners import StoppedBeforeStart

    def train(config, **options):
        raise StoppedBeforeStart("SIGINT")

    out = tmp_path / "out"
    monkeypatch.setattr(loop, "train", train)
    assert main(["scaling", "--config", str(ROOT / "configs" / "tiny.yaml"), "--steps", "3",
                 "--out", str(out), "--head-dims", "8", "--set", "model.n_embd=32",
                 *written_corpus(tmp_path, corpus_text)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lab scaling stopped: the divided_d8 run stopped before its first step; nothing was compared. Run "
        f"the lab again with --out {out} to train both runs anew")
