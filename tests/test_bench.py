"""The benchmark suite runs end to end on the tiny config and writes every figure (no timing asserts);
the docs' attention-cost table is rendered from the saved figures."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import warm_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.bench  # the whole benchmark suite in a fresh process: make bench-check runs it
@pytest.mark.timeout(0)  # its subprocess has a timeout of its own
def test_bench_smoke_writes_every_field(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.suite", "--config", str(ROOT / "configs" / "tiny.yaml"),
         "--steps", "2", "--max-context", "64", "--precision", "fp32", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert {"cpu", "cores", "torch"} <= set(figures["machine"])
    training = figures["training"][0]
    for key in ("tokens_per_second", "mfu", "flops_per_token", "peak_flops", "peak_memory_bytes",
                "step_seconds_median", "parameters"):
        assert training[key] > 0, key
    assert training["precision"] == "fp32" and training["batch_size"] == 16
    decode = figures["decode"]
    for key in ("cached_tokens_per_s", "uncached_tokens_per_s", "ttft_ms", "speedup"):
        assert decode[key] > 0, key
    rows = figures["attention"]["rows"]
    assert [row["context_length"] for row in rows] == [64]
    assert rows[0]["fused_ms"] > 0 and rows[0]["explicit_ms"] > 0
    assert rows[0]["max_abs_difference"] < 1e-4  # both paths compute the same attention
    assert "training (fp32" in result.stdout and "decode" in result.stdout


def test_the_benchmarks_tokens_reach_every_id_of_a_vocabulary_over_65536():
    # drawn as uint16, the ids of a 100,000-token vocabulary wrapped below 65,536
    from benchmarks.measure import random_tokens

    large, small = random_tokens(100_000, 10_000), random_tokens(65, 10_000)
    assert large.max() >= 65_536 and large.dtype == np.uint32
    assert small.dtype == np.uint16 and set(small.tolist()) == set(range(65))


def test_the_attention_cost_table_in_the_docs_is_the_one_of_bench_cpu_json():
    from benchmarks.measure import attention_cost_table

    saved = json.loads((ROOT / "docs" / "bench-cpu.json").read_text(encoding="utf-8"))["attention"]
    table = attention_cost_table(saved)
    assert table.count("\n") == 1 + len(saved["rows"])  # a header, its rule, a row per context length
    assert table in (ROOT / "docs" / "ATTENTION.md").read_text(encoding="utf-8")
    assert "| fused ms |" not in (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")  # no copy


def test_decoding_a_batch_counts_every_sequences_tokens(monkeypatch):
    import time

    from benchmarks import measure
    from tinyattn.config import ModelConfig

    # A fake clock that moves 10 ms per sampled step, whatever the batch, and 5 ms per prefill of
    # the prompts: every figure is then known.
    clock, rows = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    real_sample, real_prefill = measure.sample_next_token, measure.CachedDecoder.prefill

    def sample(logits, *args, **kwargs):  # logits: (B, V), one row per sequence
        rows.append(logits.size(0))
        clock[0] += 0.010
        return real_sample(logits, *args, **kwargs)

    def prefill(self, ids):
        clock[0] += 0.005
        return real_prefill(self, ids)

    monkeypatch.setattr(measure, "sample_next_token", sample)
    monkeypatch.setattr(measure.CachedDecoder, "prefill", prefill)
    model = ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=16, context_length=16)
    r = measure.measure_decode(model_config=model, new_tokens=6, prompt_tokens=4, uncached_tokens=3,
                               repeats=1, batch_size=3)
    assert rows == [3] * (6 + 6 + 3)  # warm-up run, the timed run, the uncached tokens: all three sequences
    assert r["batch_size"] == 3 and r["refills"] == 0
    assert r["ttft_ms"] == pytest.approx(15.0)  # the prefill (5 ms) and the first draw (10 ms)
    assert r["first_run_s"] == pytest.approx(0.065)  # the warm-up: its prefill and six steps
    # 5 tokens after the first, 10 ms a step of the batch: 3 * 5 tokens in 0.05 s
    assert r["cached_ms_per_step"] == pytest.approx(10.0)
    assert r["cached_tokens_per_s"] == pytest.approx(300.0)
    assert r["uncached_ms_per_step"] == pytest.approx(10.0)
    assert r["uncached_tokens_per_s"] == pytest.approx(300.0)
    assert r["speedup"] == pytest.approx(1.0)


def test_a_training_rows_tokens_per_second_and_mfu_come_from_its_median_step_and_measured_peak(monkeypatch):
    from benchmarks import measure
    from tinyattn.config import load_config
    from tinyattn.model.transformer import LanguageModel

    calls = []

    def median_time(fn, repeats, warmup=1, device=None):
        calls.append(("median_time", repeats, warmup, device))
        return 0.5

    def measure_peak_flops(device, precision):
        calls.append(("measure_peak_flops", device, precision.name))
        return 4e9

    monkeypatch.setattr(measure, "median_time", median_time)
    monkeypatch.setattr(measure, "measure_peak_flops", measure_peak_flops)
    monkeypatch.setattr(measure, "seconds_of", lambda fn, device: 2.0)
    model = load_config(str(ROOT / "configs" / "tiny.yaml")).model  # context 32
    model.vocab_size = 65
    r = measure.measure_training(model, batch_size=2, device="cpu", precision="fp32", steps=5, warmup=3)
    cpu = measure.select_device("cpu")
    assert calls == [("measure_peak_flops", cpu, "fp32"), ("median_time", 5, 2, cpu)]
    flops = LanguageModel(model).flops_per_token()
    assert r["step_seconds_median"] == 0.5 and r["first_step_seconds"] == 2.0
    assert r["tokens_per_second"] == pytest.approx(2 * 32 / 0.5)  # batch x context per median step
    assert r["flops_per_token"] == flops and r["peak_flops"] == 4e9
    assert r["mfu"] == pytest.approx(flops * 128 / 4e9)


def test_serve_names_its_random_model_by_its_shape_and_zeroes_the_heads_end_of_text_row(tmp_path):
    import torch

    from benchmarks.serve import _random_run

    run = _random_run(tmp_path, str(ROOT / "configs" / "tiny.yaml"))  # 2 layers, 4 heads, width 32, untied
    assert run.name == "random-2x4x32"
    saved = torch.load(run / "best.pt", weights_only=False)
    eot = saved["config"]["model"]["vocab_size"] - 1  # the char tokenizer's end-of-text token: the last id
    assert not saved["model"]["head.weight"][eot].any()
    assert saved["model"]["token_embedding.weight"][eot].any()  # the input embedding keeps its row


def test_serve_in_process_tokens_per_s_counts_the_tokens_after_the_first_not_the_finish_piece(
        tmp_path, monkeypatch):
    import time

    from benchmarks import serve
    from tinyattn.generate import text
    from tinyattn.generate.text import SamplePiece

    clock = [0.0]

    def pieces(*args, max_new_tokens, **kwargs):  # a token every 10 ms, then the finish piece at once
        for _ in range(max_new_tokens):
            clock[0] += 0.010
            yield SamplePiece(0, "a")
        yield SamplePiece(0, "", "length")

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(text, "generate_samples", pieces)
    run = serve._random_run(tmp_path, str(ROOT / "configs" / "tiny.yaml"))
    # 5 tokens: 4 after the first in 40 ms, as the HTTP side counts (tokens - 1) / (end - first)
    assert serve._in_process_tokens_per_s(str(run), 5, 1) == pytest.approx(100.0)


@pytest.mark.parametrize("tokens", [0, 1])
def test_serve_in_process_tokens_per_s_of_a_model_that_ends_the_prompt_at_once_is_one_line(
        tmp_path, monkeypatch, tokens):
    # A model whose greedy continuation is its end of text at once (or after one token): an IndexError
    # (a ZeroDivisionError) ended the benchmark here, before the server's stream could say it.
    from benchmarks import serve
    from tinyattn.errors import TinyattnError
    from tinyattn.generate import text
    from tinyattn.generate.text import SamplePiece

    def pieces(*args, **kwargs):
        yield from [SamplePiece(0, "a")] * tokens
        yield SamplePiece(0, "", "eot")

    monkeypatch.setattr(text, "generate_samples", pieces)
    run = serve._random_run(tmp_path, str(ROOT / "configs" / "tiny.yaml"))
    with pytest.raises(TinyattnError) as caught:
        serve._in_process_tokens_per_s(str(run), 5, 1)
    assert f"gave {tokens} token(s) of text" in str(caught.value) and "nothing to time" in str(caught.value)


def test_a_training_rows_cpu_peak_memory_is_its_own_not_the_processs_peak_so_far():
    import resource

    import torch

    from benchmarks import measure
    from tinyattn.config import load_config

    if not measure._can_reset_peak_rss():
        pytest.skip("the peak-RSS mark cannot be reset here (/proc/self/clear_refs)")
    big = torch.ones(64 * 2**20)  # 256 MiB touched, then freed: the process's peak holds it
    del big
    peak_so_far = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = load_config(str(ROOT / "configs" / "tiny.yaml")).model
    model.vocab_size = 65
    r = measure.measure_training(model, batch_size=2, device="cpu", precision="fp32", steps=1, warmup=1,
                                 peak_flops=1e12)
    assert r["peak_memory_scope"] == "this row"
    assert 0 < r["peak_memory_bytes"] < peak_so_far - 128 * 2**20


def test_decode_times_the_configs_whole_model_and_its_default_is_the_nanogpt_comparisons(tmp_path):
    from benchmarks.decode import NANOGPT_SHAPE, _model_config
    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    default = _model_config(None, None)
    assert default == ModelConfig(**NANOGPT_SHAPE)
    assert LanguageModel(default).num_parameters() == 10_646_784  # tied head, as nanoGPT's
    config = tmp_path / "c.yaml"
    config.write_text(f"extends: {ROOT / 'configs' / 'tiny.yaml'}\n"
                      "model:\n  mlp_hidden: 48\n  logit_softcap: 15.0\n")
    model = _model_config(str(config), None)
    assert (model.n_layer, model.n_kv_head, model.vocab_size) == (2, 2, 65)
    assert model.qk_norm and not model.tie_embeddings  # the main config's, which tiny.yaml extends
    assert (model.mlp_hidden, model.logit_softcap) == (48, 15.0)
    assert _model_config(str(config), 80).vocab_size == 80


def test_a_decode_result_names_every_field_of_the_model_it_timed():
    from benchmarks import measure
    from tinyattn.config import ModelConfig
    from tinyattn.model.transformer import LanguageModel

    model = ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=16, context_length=16, qk_norm=True,
                        tie_embeddings=False)
    r = measure.measure_decode(model_config=model, new_tokens=3, prompt_tokens=2, uncached_tokens=2,
                               repeats=1)
    assert r["model"]["qk_norm"] is True and r["model"]["tie_embeddings"] is False
    assert r["model"]["parameters"] == LanguageModel(model).num_parameters()


def test_the_suite_decodes_the_configs_whole_model(monkeypatch):
    from benchmarks import measure

    timed = []

    def measure_decode(model_config=measure.DECODE_MODEL, **kwargs):  # its default, where none is given
        timed.append(model_config)
        return {"cached_tokens_per_s": 1.0, "uncached_tokens_per_s": 1.0, "ttft_ms": 1.0, "speedup": 1.0}

    monkeypatch.setattr(measure, "measure_decode", measure_decode)
    measure.run_suite(str(ROOT / "configs" / "tiny.yaml"), overrides=["model.mlp_hidden=48"], device="cpu",
                      precision="fp32", skip=["training", "attention"], report=lambda line: None)
    [model] = timed
    assert (model.n_layer, model.mlp_hidden, model.vocab_size) == (2, 48, 65)
    assert model.qk_norm and not model.tie_embeddings  # the main config's, which tiny.yaml extends


@pytest.mark.parametrize("module, arguments, named", [
    ("suite", ["--set", "train.batch_size=2"], "--set train.batch_size=2"),
    ("decode", ["--new-tokens", "1"], "--new-tokens 1"),
    ("decode", ["--new-tokens", "0"], "--new-tokens 0"),
    ("decode", ["--repeats", "0"], "--repeats 0"),
    ("decode", ["--threads", "1", "0"], "--threads 0"),
    ("decode", ["--vocab-size", "0"], "--vocab-size 0"),
    ("decode", ["--vocab-size", "-1"], "--vocab-size -1"),
    ("decode", ["--prompt-tokens", "0"], "--prompt-tokens 0"),
    ("decode", ["--batch-sizes", "1", "0"], "--batch-sizes 0"),
    ("decode", ["--uncached-tokens", "0"], "--uncached-tokens 0"),
    ("time_to_loss", ["--nanogpt", "/nonexistent"], "--nanogpt /nonexistent"),
    ("serve", ["--max-tokens", "1"], "--max-tokens 1"),
    ("serve", ["--repeats", "0"], "--repeats 0"),
    ("serve", ["--clients", "1", "0"], "--clients 0"),
    ("serve", ["--threads", "0"], "--threads 0"),
    ("muon_compare", ["--rounds", "0"], "--rounds 0"),
    ("muon_compare", ["--repeats", "0"], "--repeats 0"),
])
def test_a_benchmarks_refused_argument_is_one_line_naming_it_with_exit_2(module, arguments, named,
                                                                       monkeypatch, capsys):
    import importlib

    from tinyattn.cli import run_command

    main = importlib.import_module(f"benchmarks.{module}").main
    monkeypatch.setattr(sys, "argv", [module, "--config", str(ROOT / "configs" / "tiny.yaml"), *arguments]
                        if module not in ("time_to_loss", "muon_compare") else [module, *arguments])
    assert run_command(main) == 2  # before anything is measured
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and err.count("\n") == 1, err


def test_muon_compare_help_prints_its_options_and_measures_nothing_nor_imports_torch():
    # A fresh interpreter, not a warm fork (which has torch already): --help answers at once
    code = ("import runpy, sys\nsys.argv = ['muon_compare', '--help']\ntry:\n"
            "    runpy.run_module('benchmarks.muon_compare', run_name='__main__')\n"
            "finally:\n    print('torch imported:', 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "--rounds" in result.stdout, result.stderr[-2000:]
    assert "update difference" not in result.stdout  # it ran the comparison before it took arguments
    assert result.stdout.endswith("torch imported: False\n"), result.stdout


def test_the_benchmarks_answer_help_and_measure_memory_without_psutil_which_only_the_dev_extra_installs():
    # pip install -e . (no extra) has no psutil: `python -m benchmarks.attention --help` ended in its
    # ModuleNotFoundError. Each benchmark that measures memory reads /proc's figures without it.
    code = ("import contextlib, io, runpy, sys\nsys.modules['psutil'] = None\n"
            "for name in ('attention', 'decode', 'suite'):\n"
            "    sys.argv = [name, '--help']\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
            "        runpy.run_module(f'benchmarks.{name}', run_name='__main__')\n"
            "    print(name, out.getvalue().startswith('usage:'))\n"
            "import torch\nfrom benchmarks import measure\ncpu = torch.device('cpu')\n"
            # a number read from /proc/meminfo, not the no-limit that stands for a figure unknown
            "import math, os\nfree = measure._available_memory_bytes(cpu)\n"
            "print('available', 0 < free < math.inf if os.path.exists('/proc/meminfo') else free > 0)\n"
            "print('peak', measure._peak_memory_bytes(cpu, since_reset=False) > 0)\n"
            "print('child', measure._peak_rss_child('explicit', 64, 1, 1, 8) > 0 "
            "if measure._can_reset_peak_rss() else True)")
    result = warm_python.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == ("attention True\ndecode True\nsuite True\navailable True\npeak True\n"
                             "child True\n"), result.stdout


@pytest.mark.parametrize("module, arguments", [("serve", ["--max-tokens", "1"]),
                                               ("time_to_loss", ["--nanogpt", "/nonexistent"]),
                                               ("train_step", ["--variant", "model.dropuot=0.1"])])
def test_a_benchmark_run_as_a_module_says_a_refused_argument_in_one_line_with_exit_2(module, arguments):
    # `python -m benchmarks.X`, as the docs run them: the error goes through run_command, no traceback.
    result = warm_python.run([sys.executable, "-m", f"benchmarks.{module}", *arguments], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {' '.join(arguments)}") and "Traceback" not in result.stderr


@pytest.mark.parametrize("module, arguments, named, runner", [
    ("suite", ["--batch-size", "0"], "--batch-size 0", "run_suite"),  # was a reshape traceback
    ("suite", ["--steps", "0"], "--steps 0", "run_suite"),
    ("suite", ["--vocab-size", "1"], "--vocab-size 1", "run_suite"),
    ("suite", ["--max-context", "32"], "--max-context 32", "run_suite"),  # printed an empty attention table
    ("suite", ["--max-context", "63"], "--max-context 63", "run_suite"),  # the table starts at 64
    ("time_to_loss", ["--rounds", "0"], "--rounds 0", "one_round"),  # measured nothing and exited 0
])
def test_the_suite_and_time_to_loss_refuse_a_count_below_its_least_before_measuring(
        module, arguments, named, runner, monkeypatch, capsys):
    import importlib

    from tinyattn.cli import run_command

    benchmark = importlib.import_module(f"benchmarks.{module}")

    def measure(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(benchmark, runner, measure)
    where = (["--config", str(ROOT / "configs" / "tiny.yaml")] if module == "suite"
             else ["--nanogpt", "/nonexistent"])
    monkeypatch.setattr(sys, "argv", [module, *where, *arguments])
    assert run_command(benchmark.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and "expected" in err and err.count("\n") == 1, err


def test_the_serve_benchmark_without_the_serve_extra_is_tinyattn_serves_one_line_before_measuring(
        monkeypatch, capsys):
    # It timed generate() in this process first, then ended with status 1 on the server's error line.
    from benchmarks import serve
    from tinyattn.cli import run_command

    def measure(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(serve, "_in_process_tokens_per_s", measure)
    monkeypatch.setattr(serve, "_start_server", measure)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now raises ImportError
    monkeypatch.setattr(sys, "argv", ["serve", "--config", str(ROOT / "configs" / "tiny.yaml")])
    assert run_command(serve.main) == 2
    err = capsys.readouterr().err
    assert err == ("error: tinyattn serve needs the serve extra (fastapi is missing): "
                   "pip install 'tinyattn[serve]'\n"), err


def test_the_serve_benchmarks_warm_up_asks_for_no_more_tokens_than_the_server_allows(monkeypatch):
    import argparse

    from benchmarks import serve

    asked = []

    def stream_one(url, model_id, max_tokens):
        asked.append(max_tokens)
        return {"start": 0.0, "ttft": 0.1, "end": 1.0, "tokens": max_tokens, "tokens_per_s": 1.0}

    monkeypatch.setattr(serve, "_stream_one", stream_one)
    serve._measure("http://x", "m", 1, argparse.Namespace(max_tokens=5, repeats=1))
    assert asked == [5, 5]  # the warm-up within the server's --max-tokens 5, then the timed request


def test_the_serve_benchmark_against_a_server_that_refuses_its_prompt_is_one_line_naming_why(tmp_path):
    # The prompt is past a tiny model's context: the 400 was read as a stream, and a TypeError ended the run.
    import importlib.util

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("the serve extra is not installed")
    from benchmarks import serve
    from tinyattn.errors import TinyattnError
    from tinyattn.hf.folder import load_any_model
    from tinyattn.serve.app import create_app
    from tinyattn.serve.server import ServerThread, listening_socket

    run = serve._random_run(tmp_path, str(ROOT / "configs" / "tiny.yaml"))  # context 32 < the prompt's tokens
    app = create_app(load_any_model(str(run), "cpu"))
    with ServerThread(app, listening_socket("127.0.0.1", 0)) as server:
        with pytest.raises(TinyattnError) as caught:
            serve._stream_one(server.url, run.name, 5)
    message = str(caught.value)
    assert message.startswith(f"{server.url}: the server refused") and "at most 32" in message, message
    assert "\n" not in message


# ----------------------------------------------------------------------------- time_to_loss


def _nanogpt_checkout(folder: Path, data=("train.bin", "val.bin", "meta.pkl")) -> Path:
    """A stand-in for a nanoGPT checkout: train.py and the named files of its prepared data."""
    (folder / "data" / "shakespeare_char").mkdir(parents=True)
    (folder / "train.py").write_text("raise SystemExit('never run by these tests')\n")
    for name in data:
        (folder / "data" / "shakespeare_char" / name).write_bytes(b"")
    return folder


def _fake_rounds(monkeypatch, before=lambda command, cwd: None) -> list:
    """time_to_loss.stamped_run replaced: each command recorded after before(command, cwd), and
    one evaluation a program (nanoGPT's at 2.0, tinyattn's at 1.9) as its output."""
    from benchmarks import time_to_loss

    commands = []

    def stamped_run(command, cwd):
        before(command, cwd)
        commands.append(command)
        line = "step 0: validation loss 1.9" if "scripts/train.py" in command else \
            "step 0: train loss 4.0, val loss 2.0"
        return [(1.0, line)], 2.0

    monkeypatch.setattr(time_to_loss, "stamped_run", stamped_run)
    return commands


def test_time_to_loss_refuses_a_nanogpt_checkout_without_its_prepared_data_before_running_anything(
        tmp_path, monkeypatch, capsys):
    from benchmarks import time_to_loss
    from tinyattn.cli import run_command

    checkout = _nanogpt_checkout(tmp_path / "nanoGPT", data=["val.bin"])
    commands = _fake_rounds(monkeypatch)
    assert run_command(lambda: time_to_loss.main(["--nanogpt", str(checkout)])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: --nanogpt {checkout}: no train.bin, meta.pkl in data/shakespeare_char")
    assert "run `python data/shakespeare_char/prepare.py` in" in err
    assert commands == []


def test_time_to_loss_prepares_tinyattns_data_before_nanogpts_round_and_refuses_a_missing_file(
        tmp_path, monkeypatch, capsys, shakespeare_head):
    from benchmarks import time_to_loss
    from tinyattn.cli import run_command

    checkout = _nanogpt_checkout(tmp_path / "nanoGPT")
    cache = tmp_path / "cache"
    commands = _fake_rounds(monkeypatch)
    missing = ["--set", f"data.files={tmp_path / 'missing.txt'}", "data.url=null", f"data.cache_dir={cache}"]
    assert run_command(lambda: time_to_loss.main(["--nanogpt", str(checkout), "--rounds", "1",
                                                  *missing])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "file not found" in err and str(tmp_path / "missing.txt") in err, err
    assert commands == []  # refused before nanoGPT's 2,000 steps, not after them

    # With the file there, its token cache is made before the first round starts: no round tokenizes.
    caches = []
    commands = _fake_rounds(monkeypatch, before=lambda command, cwd: caches.append(sorted(cache.iterdir())))
    present = ["--set", f"data.files={shakespeare_head}", "data.url=null", f"data.cache_dir={cache}"]
    assert run_command(lambda: time_to_loss.main(["--nanogpt", str(checkout), "--rounds", "1",
                                                  *present])) == 0
    assert len(commands) == 2 and caches[0] and caches[0] == caches[1]
    assert f"data.files={shakespeare_head}" in commands[1]


# ----------------------------------------------------------------------------- train_step


@pytest.mark.parametrize("arguments, named", [
    (["--variant", "model.dropuot=0.1"], "--variant model.dropuot=0.1: unknown key 'model.dropuot'"),
    (["--variant", "model.dropout=0.0", "--variant", "model.dropout=0.1 train.precision=xx"],
     "--variant 'model.dropout=0.1 train.precision=xx': train.precision: 'xx' is not accepted"),
    (["--set", "model.dropuot=0.1"], "--set: unknown key 'model.dropuot'"),
    (["--steps", "0"], "--steps 0 is not accepted"),
    (["--rounds", "0"], "--rounds 0 is not accepted"),
    (["--warmup", "-1"], "--warmup -1 is not accepted"),
])
def test_train_step_refuses_a_bad_variant_or_count_in_one_line_before_any_process_starts(
        arguments, named, monkeypatch, capsys):
    from benchmarks import train_step
    from tinyattn.cli import run_command

    def run(*args, **kwargs):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["train_step", "--config", str(ROOT / "configs" / "tiny.yaml"),
                                      *arguments])
    assert run_command(train_step.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and err.count("\n") == 1, err


def test_train_step_shows_the_stderr_of_a_child_process_that_failed(monkeypatch):
    from benchmarks import train_step
    from tinyattn.cli import run_command

    def run(command, **kwargs):  # a child that fails as an out-of-memory step would
        stderr = "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory.\n"
        return subprocess.CompletedProcess(command, 1, stdout="", stderr=stderr)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["train_step", "--config", str(ROOT / "configs" / "tiny.yaml"),
                                      "--variant", "model.dropout=0.1"])
    with pytest.raises(SystemExit) as stopped:
        run_command(train_step.main)
    message = str(stopped.value.code)
    assert message.startswith("variant model.dropout=0.1: its process failed with exit code 1:\n"), message
    assert message.endswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_train_step_waits_for_the_device_after_the_warm_up_and_before_each_steps_clock_stops(monkeypatch):
    import time

    import torch

    from benchmarks import train_step
    from tinyattn.system import timing
    from tinyattn.train.trainer import Trainer

    # A fake GPU: a step returns at once (its launch), and its 250 ms pass while synchronize waits.
    clock, events = [0.0], []
    real_step = Trainer.train_step

    def step(self):
        events.append("step")
        return real_step(self)

    def synchronize(device):
        events.append(("synchronize", device))
        clock[0] += 0.250

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(Trainer, "train_step", step)
    monkeypatch.setattr(timing, "synchronize", synchronize)
    r = train_step.one_process(str(ROOT / "configs" / "tiny.yaml"), ["train.device=cpu"], 3, 2)
    waited = ("synchronize", torch.device("cpu"))
    assert events == ["step", "step", waited] + ["step", waited] * 3
    assert r["median_s"] == pytest.approx(0.250) and r["min_s"] == pytest.approx(0.250)


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("arguments, named", [
    (["--min-context", "0"], "--min-context 0"),  # doubled from 0: the list of lengths never ended
    (["--min-context", "-1"], "--min-context -1"),
    (["--max-context", "0"], "--max-context 0"),
    (["--repeats", "0"], "--repeats 0"),
    (["--batch-size", "0"], "--batch-size 0"),
    (["--heads", "0"], "--heads 0"),
    (["--head-dim", "1"], "--head-dim 1"),
    (["--min-context", "128", "--max-context", "64"], "--max-context 64 is below --min-context 128"),  # an empty table
])
def test_attention_refuses_a_count_below_its_least_in_one_line_before_measuring(arguments, named, monkeypatch,
                                                                               capsys):
    from benchmarks import attention
    from tinyattn.cli import run_command

    def measure(*args, **kwargs):
        raise AssertionError("measured")

    monkeypatch.setattr(attention, "measure_attention_cost", measure)
    monkeypatch.setattr(sys, "argv", ["attention", *arguments])
    assert run_command(attention.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and "expected" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("arguments, lengths", [
    (["--min-context", "64", "--max-context", "256"], [64, 128, 256]),  # the maximum itself is measured
    (["--min-context", "64", "--max-context", "64"], [64]),  # a minimum equal to the maximum: one length
    (["--min-context", "3", "--max-context", "20"], [3, 6, 12, 20]),
    (["--min-context", "64", "--max-context", "100"], [64, 100]),  # measured only 64, unsaid
])
def test_attention_measures_every_doubling_from_the_minimum_up_to_and_including_the_maximum(
        arguments, lengths, monkeypatch):
    from benchmarks import attention

    measured = []

    def measure(context_lengths, **kwargs):
        measured.append(list(context_lengths))
        raise KeyboardInterrupt  # stop before printing: only the lengths asked for matter here

    monkeypatch.setattr(attention, "measure_attention_cost", measure)
    monkeypatch.setattr(sys, "argv", ["attention", *arguments])
    with pytest.raises(KeyboardInterrupt):
        attention.main()
    assert measured == [lengths]


@pytest.mark.parametrize("max_context, lengths", [
    (100, [64, 100]),  # measured only 64, unsaid
    (16384, [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]),  # stopped at 8192, unsaid
])
def test_the_suites_attention_table_ends_at_its_max_context(max_context, lengths, monkeypatch):
    from benchmarks import measure

    measured = []

    def measure_cost(context_lengths, **kwargs):
        measured.append(list(context_lengths))
        return {"rows": []}

    monkeypatch.setattr(measure, "measure_attention_cost", measure_cost)
    measure.run_suite("configs/tiny.yaml", skip=("training", "decode"), max_context=max_context,
                      report=lambda line: None)
    assert measured == [lengths]


def test_attentions_table_from_reads_a_suite_files_attention_section_or_a_saved_file_whole(
        tmp_path, monkeypatch, capsys):
    from benchmarks import attention

    monkeypatch.setattr(attention, "attention_cost_table", lambda figures: f"table of {figures}")
    monkeypatch.setattr(attention, "measure_attention_cost", lambda *a, **k: pytest.fail("measured"))
    for saved, shown in [({"attention": {"rows": [], "n": 1}, "training": {}}, "{'rows': [], 'n': 1}"),
                         ({"rows": [], "n": 2}, "{'rows': [], 'n': 2}")]:
        path = tmp_path / "saved.json"
        path.write_text(json.dumps(saved))
        monkeypatch.setattr(sys, "argv", ["attention", "--table-from", str(path)])
        assert attention.main() == 0
        assert capsys.readouterr().out == f"table of {shown}\n"


def test_the_suite_takes_a_set_of_the_model_section_and_refuses_one_of_another_whatever_its_value(
        monkeypatch, capsys):
    from benchmarks import suite
    from tinyattn.cli import run_command

    runs = []
    monkeypatch.setattr(suite, "run_suite", lambda config, **kwargs: runs.append(kwargs["overrides"]) or {})
    config = ["--config", str(ROOT / "configs" / "tiny.yaml")]
    monkeypatch.setattr(sys, "argv", ["suite", *config, "--set", "model.n_layer=2"])
    assert run_command(suite.main) == 0 and runs == [["model.n_layer=2"]]
    monkeypatch.setattr(sys, "argv", ["suite", *config, "--set", "train.note=model.x"])
    assert run_command(suite.main) == 2 and len(runs) == 1
    assert capsys.readouterr().err.startswith("error: --set train.note=model.x: the suite uses only")


def test_train_step_accepts_no_warm_up_steps(monkeypatch):
    from benchmarks import train_step

    started = []

    def run(command, **kwargs):
        started.append(command)
        raise KeyboardInterrupt  # the first child process: the counts were accepted

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["train_step", "--config", str(ROOT / "configs" / "tiny.yaml"),
                                      "--warmup", "0", "--rounds", "1", "--steps", "1"])
    with pytest.raises(KeyboardInterrupt):
        train_step.main()
    assert started and started[0][started[0].index("--warmup") + 1] == "0"


def test_time_to_loss_reaches_nanogpts_final_loss_at_the_first_evaluation_at_or_below_it(monkeypatch):
    # nanoGPT's evaluations fall 2.0 -> 1.5 in a 100 s run; tinyattn's 1.7, 1.5 (exactly the target), 1.4
    # in a 50 s run: reached at its second, at 20 s, a fifth of nanoGPT's wall time.
    from benchmarks import time_to_loss

    outputs = {"train.py": ([(10.0, "step 0: train loss 4.0, val loss 2.0"),
                             (90.0, "step 2000: train loss 1.2, val loss 1.5")], 100.0),
               "scripts/train.py": ([(10.0, "step 100: validation loss 1.7"),
                                     (20.0, "step 200: validation loss 1.5"),
                                     (30.0, "step 300: validation loss 1.4")], 50.0)}
    monkeypatch.setattr(time_to_loss, "stamped_run", lambda command, cwd: outputs[command[1]])
    result = time_to_loss.one_round(Path("nanoGPT"), [], None)
    assert result["target"] == 1.5
    assert result["tinyattn_reached"] == {"step": 200, "val": 1.5, "seconds": 20.0}
    assert result["ratio_to_nanogpt_wall"] == 0.2


# ----------------------------------------------------------------------------- decode


def test_the_decode_tables_time_column_is_one_step_of_the_whole_batch(monkeypatch, capsys):
    from benchmarks import decode

    def measure_decode(**kwargs):  # batch 8 at 25,280 tok/s: a step of the batch, 8 tokens, in 0.32 ms
        return {"cpu": "a CPU", "torch": "2", "device": "cpu", "model": {"parameters": 1e6}, "new_tokens": 9,
                "prompt_tokens": 4, "refills": 0, "packed": False, "row_dtype": None, "batch_size": 8,
                "cached_tokens_per_s": 25_280.0, "cached_ms_per_step": 8 / 25_280 * 1000, "ttft_ms": 1.0,
                "first_run_s": 0.1, "uncached_tokens_per_s": 2_528.0, "uncached_ms_per_step": 3.2,
                "speedup": 10.0}

    monkeypatch.setattr(decode, "measure_decode", measure_decode)
    monkeypatch.setattr(sys, "argv", ["decode", "--dtypes", "fp32", "--threads", "1", "--pack", "no",
                                      "--batch-sizes", "8"])
    assert decode.main() == 0
    header, _, row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    cells = dict(zip(header.split("|"), row.split("|")))
    assert cells[" ms/step "] == " 0.32 " and cells[" cached tok/s "] == " 25280 "
    assert "ms/token" not in header


def test_time_to_loss_gives_each_nanogpt_round_a_temporary_out_dir_not_the_checkouts(
        tmp_path, monkeypatch, shakespeare_head):
    from benchmarks import time_to_loss

    checkout = _nanogpt_checkout(tmp_path / "nanoGPT")
    during = []

    def before(command, cwd):
        if command[1] == "train.py":  # nanoGPT's: where its --out_dir is while it runs
            [out_dir] = [a.removeprefix("--out_dir=") for a in command if a.startswith("--out_dir=")]
            during.append((Path(out_dir), Path(out_dir).is_dir()))
            # after the config file, which sets out_dir='out-shakespeare-char'
            assert command.index(f"--out_dir={out_dir}") > command.index("config/train_shakespeare_char.py")

    _fake_rounds(monkeypatch, before)
    data = ["--set", f"data.files={shakespeare_head}", "data.url=null",
            f"data.cache_dir={tmp_path / 'cache'}"]
    time_to_loss.main(["--nanogpt", str(checkout), "--rounds", "2", *data])
    assert len(during) == 2 and all(exists for _, exists in during)
    assert all(not out_dir.exists() and checkout not in out_dir.parents for out_dir, _ in during)


# ----------------------------------------------------------------------------- data


def test_the_data_benchmarks_shakespeare_line_claims_no_datasets_import_and_a_txt_corpus_makes_none(
        tmp_path, shakespeare_head):
    from benchmarks.data import shakespeare_summary

    figures = {"prepare_s": 1.234, "tokens": 60_000, "reuse_s": 0.0123, "train_s": 0.5, "encode_s": 0.25}
    assert shakespeare_summary(figures) == (
        "Tiny Shakespeare, 4096-token BPE: prepare_data 1.23 s (60,000 tokens; cache reuse 12 ms); "
        "alone: training 0.50 s, encoding all 0.25 s")
    # The phrase it dropped ("importing datasets included") was stale: a .txt corpus imports none.
    code = ("import sys; from pathlib import Path; from benchmarks.data import make_config; "
            "from tinyattn.data.batches import prepare_data; "
            "config = make_config([sys.argv[1]], Path(sys.argv[2]), {'kind': 'char'}); "
            "prepare_data(config, progress=False); print('datasets' in sys.modules)")
    # A fork of the warm Python (torch and torch._dynamo imported, no datasets) holds every module a fresh
    # Python would load here, and perhaps more: an import of datasets shows in both.
    result = warm_python.run([sys.executable, "-c", code, str(shakespeare_head), str(tmp_path / "cache")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]


# ----------------------------------------------------------------------------- --json

def _measuring_fails(monkeypatch, module: str) -> list[str]:
    """The module's measuring replaced by a failure; the arguments that reach it quickly."""
    import importlib

    benchmark = importlib.import_module(f"benchmarks.{module}")

    def measure(*args, **kwargs):
        raise AssertionError("measured")

    runner = {"suite": "run_suite", "decode": "measure_decode", "attention": "measure_attention_cost",
              "serve": "_random_run", "time_to_loss": "prepare_tinyattn_data"}[module]
    monkeypatch.setattr(benchmark, runner, measure)
    if module == "time_to_loss":
        monkeypatch.setattr(benchmark, "check_nanogpt", lambda folder: None)
        return ["--nanogpt", "nanoGPT"]
    return ["--config", str(ROOT / "configs" / "tiny.yaml")] if module in ("suite", "decode", "serve") else []


@pytest.mark.parametrize("module", ["suite", "decode", "attention", "serve", "time_to_loss"])
def test_a_json_path_that_is_a_folder_is_refused_in_one_line_before_measuring(module, tmp_path, monkeypatch,
                                                                              capsys):
    # It was written after every figure was measured: an IsADirectoryError traceback, the figures lost.
    import importlib

    from tinyattn.cli import run_command

    arguments = _measuring_fails(monkeypatch, module)
    main = importlib.import_module(f"benchmarks.{module}").main
    monkeypatch.setattr(sys, "argv", [module, *arguments, "--json", str(tmp_path)])
    assert run_command(lambda: main(sys.argv[1:]) if module == "time_to_loss" else main()) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --json {tmp_path}: a folder") and "expected" in err, err
    assert err.count("\n") == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_json_path_that_cannot_be_written_is_refused_and_a_writable_one_left_unmade(tmp_path):
    from benchmarks.arguments import check_output
    from tinyattn.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--json /proc/figures.json: cannot be written .*expected"):
        check_output(Path("/proc/figures.json"))  # os.access says yes to root there
    check_output(tmp_path / "figures.json")
    assert list(tmp_path.iterdir()) == []


def test_a_run_refused_after_its_json_was_checked_leaves_no_folder_behind(tmp_path, capsys):
    # The check made --json's folders and left them, empty, when a later check refused the run.
    from benchmarks import time_to_loss
    from tinyattn.cli import run_command

    out = tmp_path / "new" / "deeper" / "figures.json"
    status = run_command(lambda: time_to_loss.main(["--nanogpt", str(tmp_path / "none"), "--json", str(out)]))
    assert status == 2 and "--nanogpt" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["decode", "attention"])
def test_a_json_path_in_a_folder_not_made_yet_is_written_there_as_the_suites_is(
        module, tmp_path, monkeypatch):
    # decode and attention wrote into the folder as it was: a FileNotFoundError after the measuring.
    import importlib

    benchmark = importlib.import_module(f"benchmarks.{module}")
    figures = {"device": "cpu", "threads": 1, "batch_size": 1, "n_head": 1, "head_dim": 2, "repeats": 1,
               "memory_method": "not measured", "rows": [], "skipped_context_lengths": [],
               "cpu": "a CPU", "torch": "2", "model": {"parameters": 1e6}, "new_tokens": 9,
               "prompt_tokens": 4, "refills": 0, "packed": False, "row_dtype": None,
               "cached_tokens_per_s": 1.0, "cached_ms_per_step": 1.0, "ttft_ms": 1.0, "first_run_s": 0.1,
               "uncached_tokens_per_s": 1.0, "uncached_ms_per_step": 1.0, "speedup": 1.0}
    monkeypatch.setattr(benchmark, "measure_decode" if module == "decode" else "measure_attention_cost",
                        lambda *args, **kwargs: figures)
    out = tmp_path / "new" / "figures.json"
    arguments = ["--dtypes", "fp32", "--threads", "1", "--pack", "no"] if module == "decode" else []
    monkeypatch.setattr(sys, "argv", [module, *arguments, "--json", str(out)])
    assert benchmark.main() == 0
    saved = json.loads(out.read_text())
    assert (saved[0] if module == "decode" else saved)["device"] == "cpu"


@pytest.mark.parametrize("model_py, why", [
    ("x = 1\n", "no GPTConfig or GPT"),  # another project's model.py
    ("import nanogpt_needs_this\n", "No module named 'nanogpt_needs_this'"),
    ("class GPTConfig:\n    pass\nclass GPT:\n    pass\n", "GPTConfig() takes no arguments"),
])
def test_decode_against_a_model_py_that_is_not_nanogpts_is_one_line_naming_it(
        model_py, why, tmp_path, monkeypatch, capsys):
    # Each was a traceback (AttributeError, ModuleNotFoundError, TypeError) from inside the import.
    from benchmarks import decode
    from tinyattn.cli import run_command

    (tmp_path / "model.py").write_text(model_py)
    monkeypatch.setattr(decode, "_our_model", lambda: pytest.fail("built ours before nanoGPT's"))
    monkeypatch.setattr(sys, "argv", ["decode", "--nanogpt", str(tmp_path)])
    assert run_command(decode.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --nanogpt {tmp_path}: {tmp_path / 'model.py'}") and why in err, err
    assert "expected a nanoGPT checkout" in err and err.count("\n") == 1


@pytest.mark.parametrize("saved", [
    [{"clients": 1}],  # time_to_loss's or decode's --json: a list
    {"in_process_tokens_per_s": 1.0, "results": []},  # serve's
    {"machine": {}, "training": []},  # a suite file made with --skip attention
    {"rows": [{"context_length": 64}]},  # a row without its times
])
def test_attentions_table_from_a_json_of_other_figures_is_one_line_naming_the_file(
        saved, tmp_path, monkeypatch, capsys):
    # Each was a traceback: AttributeError ('list' has no 'get') or KeyError ('rows', 'fused_ms').
    from benchmarks import attention
    from tinyattn.cli import run_command

    path = tmp_path / "other.json"
    path.write_text(json.dumps(saved))
    monkeypatch.setattr(sys, "argv", ["attention", "--table-from", str(path)])
    assert run_command(attention.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and "expected" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("target", [None, 1.5])
def test_time_to_loss_when_nanogpt_prints_no_evaluation_is_one_line_naming_the_checkout(
        target, monkeypatch, capsys):
    # A fork or version whose train.py logs its evaluations otherwise: an IndexError after its run.
    from benchmarks import time_to_loss
    from tinyattn.cli import run_command

    outputs = {"train.py": ([(1.0, "iter 0: loss 4.0"), (2.0, "iter 1: loss 3.9")], 3.0),
               "scripts/train.py": ([(1.0, "step 100: validation loss 1.7")], 2.0)}
    monkeypatch.setattr(time_to_loss, "stamped_run", lambda command, cwd: outputs[command[1]])
    assert run_command(lambda: time_to_loss.one_round(Path("nanoGPT"), [], target)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --nanogpt nanoGPT: its train.py printed no evaluation"), err
    assert "expected" in err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("arguments, named", [
    # A typo: ../shared/data's file was copied there and measured (or a traceback without it).
    (["--shakespeare", "{tmp}/typo.txt"], "--shakespeare {tmp}/typo.txt: no such file"),
    (["--shakespeare", "{tmp}"], "--shakespeare {tmp}: a folder"),  # an IsADirectoryError from the pool
    (["--sizes-mb", "25", "0"], "--sizes-mb 0"),  # measured a 1 MB corpus and called it 0 MB
    (["--sizes-mb", "-5"], "--sizes-mb -5"),
])
def test_the_data_benchmark_refuses_a_bad_argument_in_one_line_before_measuring(
        arguments, named, tmp_path, monkeypatch, capsys):
    from benchmarks import data
    from tinyattn.cli import run_command

    monkeypatch.setattr(data, "bench_shakespeare", lambda *args: pytest.fail("measured"))
    monkeypatch.setattr(sys, "argv", ["data", *[a.format(tmp=tmp_path) for a in arguments]])
    assert run_command(data.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named.format(tmp=tmp_path)}") and "expected" in err, err
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []  # nothing written in the user's place


# ----------------------------------------------------------------------------- muon_compare


def test_muon_compare_on_a_torch_without_torch_optim_muon_is_one_line_naming_the_version(
        monkeypatch, capsys):
    # pyproject accepts torch 2.5; torch.optim.Muon came later: an AttributeError traceback.
    import torch

    from benchmarks import muon_compare
    from tinyattn.cli import run_command

    monkeypatch.delattr(torch.optim, "Muon")
    monkeypatch.setattr(muon_compare, "matrices", lambda: pytest.fail("built the matrices first"))
    monkeypatch.setattr(sys, "argv", ["muon_compare"])
    assert run_command(muon_compare.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: torch {torch.__version__} has no torch.optim.Muon"), err
    assert "expected" in err
    assert err.count("\n") == 1


def test_muon_compares_median_of_an_even_number_of_steps_is_the_mean_of_the_middle_two(monkeypatch):
    # Steps of 1, 2, 4 and 9 ms: the median is 3 ms; sorted(times)[len // 2] said 4 (of 2 steps: the slower).
    import types

    from benchmarks import muon_compare

    clock = iter([0.0, 0.001, 1.0, 1.002, 2.0, 2.004, 3.0, 3.009])
    monkeypatch.setattr(muon_compare, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))

    class Optimizer:
        def step(self):
            pass

    assert muon_compare.median_ms(Optimizer(), repeats=4) == pytest.approx(3.0)


@pytest.mark.parametrize("arguments, named", [
    (["--nanogpt", "{tmp}", "--json", "{tmp}/d.json"], "--json"),  # no file was written, nothing said
    (["--nanogpt", "{tmp}", "--dtypes", "bf16"], "--dtypes"),  # ours ran in the dtype `auto` picks
    (["--nanogpt", "{tmp}", "--config", "configs/tiny.yaml"], "--config"),  # the baby GPT's shape was timed
    (["--nanogpt", "{tmp}", "--batch-sizes", "4"], "--batch-sizes"),
    (["--nanogpt-bf16"], "--nanogpt-bf16"),  # without --nanogpt: the usual table, no nanoGPT row
])
def test_decode_refuses_an_option_its_nanogpt_comparison_would_ignore(
        arguments, named, tmp_path, monkeypatch, capsys):
    from benchmarks import decode
    from tinyattn.cli import run_command

    monkeypatch.setattr(decode, "_nanogpt_model", lambda folder: pytest.fail("measured"))
    monkeypatch.setattr(decode, "measure_decode", lambda **kwargs: pytest.fail("measured"))
    monkeypatch.setattr(sys, "argv", ["decode", *[a.format(tmp=tmp_path) for a in arguments]])
    assert run_command(decode.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named} ") and "expected" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("target", ["0", "-1.5", "nan", "inf"])
def test_time_to_loss_refuses_a_target_no_loss_can_reach_before_running_anything(
        target, tmp_path, monkeypatch, capsys):
    # Rounds of minutes each ran, then said "reached -1.5 never" (nan: never; inf: at the first evaluation).
    from benchmarks import time_to_loss
    from tinyattn.cli import run_command

    checkout = _nanogpt_checkout(tmp_path / "nanoGPT")
    commands = _fake_rounds(monkeypatch)
    assert run_command(lambda: time_to_loss.main(["--nanogpt", str(checkout), "--target", target])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --target {target}") and "expected" in err and err.count("\n") == 1, err
    assert commands == []


@pytest.mark.parametrize("config, vocab_size, expected", [
    ("gpt2_small.yaml", None, 50304),  # its BPE's vocabulary: was 65, a 124M-shaped model with a tiny head
    ("gpt2_small.yaml", 1000, 1000),  # --vocab-size wins
    ("tiny.yaml", None, 65),  # a character vocabulary comes from the data: 65, Tiny Shakespeare's
])
def test_decodes_default_vocabulary_is_the_configs_bpe_vocabulary_else_65(config, vocab_size, expected):
    from benchmarks import decode

    assert decode._model_config(str(ROOT / "configs" / config), vocab_size).vocab_size == expected


def test_time_to_loss_writes_each_finished_round_to_its_json_before_the_next_starts(
        tmp_path, monkeypatch, shakespeare_head):
    # Written once after the last round: a second round that failed lost the first one's figures.
    from benchmarks import time_to_loss

    checkout = _nanogpt_checkout(tmp_path / "nanoGPT")
    nanogpt_runs = []

    def before(command, cwd):
        if command[1] == "train.py":
            nanogpt_runs.append(command)
            if len(nanogpt_runs) == 2:
                raise SystemExit("['python', 'train.py'] failed with exit code 1")

    _fake_rounds(monkeypatch, before)
    out = tmp_path / "rounds.json"
    data = ["--set", f"data.files={shakespeare_head}", "data.url=null",
            f"data.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(SystemExit):
        time_to_loss.main(["--nanogpt", str(checkout), "--rounds", "2", "--json", str(out), *data])
    [saved] = json.loads(out.read_text())
    assert saved["target"] == 2.0 and saved["tinyattn"]["evaluations"][0]["val"] == 1.9


def test_decode_writes_each_finished_row_to_its_json_before_the_next_is_measured(tmp_path, monkeypatch):
    # Written once after the last row: a sweep interrupted (or failing) in its last row lost every row.
    from benchmarks import decode

    rows = []

    def measure_decode(**kwargs):
        if rows:
            raise KeyboardInterrupt
        rows.append({"cpu": "a CPU", "torch": "2", "device": "cpu", "model": {"parameters": 1e6},
                     "new_tokens": 9, "prompt_tokens": 4, "refills": 0, "packed": False, "row_dtype": None,
                     "cached_tokens_per_s": 1.0, "cached_ms_per_step": 1.0, "ttft_ms": 1.0,
                     "first_run_s": 0.1, "uncached_tokens_per_s": 1.0, "uncached_ms_per_step": 1.0,
                     "speedup": 1.0})
        return rows[-1]

    monkeypatch.setattr(decode, "measure_decode", measure_decode)
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["decode", "--dtypes", "fp32", "--threads", "1", "2", "--pack", "no",
                                      "--json", str(out)])
    with pytest.raises(KeyboardInterrupt):
        decode.main()
    assert json.loads(out.read_text()) == rows


@pytest.mark.parametrize("arguments, named", [
    (["--set", "train.precision=fp16"],
     "--set train.precision=fp16: train.precision 'fp16' is not supported"),
    (["--variant", "train.precision=fp16"], "--variant train.precision=fp16: train.precision 'fp16'"),
    (["--variant", "train.device=cuda:7"], "--variant train.device=cuda:7: device 'cuda:7'"),
])
def test_train_step_refuses_a_device_or_precision_this_machine_lacks_before_any_process_starts(
        arguments, named, monkeypatch, capsys):
    # A child process started, failed, and its error came back as two lines, exit 1, naming --device.
    import torch

    from benchmarks import train_step
    from tinyattn.cli import run_command

    if torch.cuda.device_count() > (7 if "cuda:7" in named else 0):
        pytest.skip("this machine has the GPU asked for")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("started a process"))
    monkeypatch.setattr(sys, "argv", ["train_step", "--config", str(ROOT / "configs" / "tiny.yaml"),
                                      *arguments])
    assert run_command(train_step.main) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and err.count("\n") == 1, err


def test_the_serve_benchmark_fails_in_one_line_when_a_client_of_a_round_fails_not_with_fewer_clients(
        monkeypatch):
    # A client thread's error was printed as a thread's traceback and the round's figures were
    # computed from the clients left: a 4-client row that timed 3.
    import argparse

    from benchmarks import serve
    from tinyattn.errors import TinyattnError

    calls = []

    def stream_one(url, model_id, max_tokens):
        calls.append(max_tokens)
        if len(calls) == 3:  # the warm-up, then the round's second client
            raise TinyattnError(f"{url}: the server streamed no text")
        return {"start": 0.0, "ttft": 0.01, "end": 1.0, "tokens": 10, "tokens_per_s": 10.0}

    monkeypatch.setattr(serve, "_stream_one", stream_one)
    args = argparse.Namespace(max_tokens=10, repeats=1)
    with pytest.raises(TinyattnError, match="the server streamed no text"):
        serve._measure("http://127.0.0.1:1", "m", 4, args)


def test_decode_refuses_fp16_rows_alone_with_no_fp32_in_one_line_instead_of_measuring_nothing(
        monkeypatch, capsys):
    # fp16 row copies are kept beside fp32 weights only: every row was skipped, nothing printed, exit 0.
    from benchmarks import decode
    from tinyattn.cli import run_command

    monkeypatch.setattr(decode, "measure_decode", lambda **kwargs: pytest.fail("measured"))
    monkeypatch.setattr(sys, "argv", ["decode", "--dtypes", "bf16", "--pack", "fp16-rows"])
    assert run_command(decode.main) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --pack fp16-rows") and "--dtypes bf16" in err and "expected" in err, err
    assert err.count("\n") == 1
