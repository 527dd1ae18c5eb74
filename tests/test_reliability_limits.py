"""Runaway inputs end in one short line, fast: alias bombs, huge values in errors, models
too big for the machine, a folder given as a tokenizer file, a stop during calibration.

Nothing here allocates a large model or expands a large bomb: the code under test must
refuse before it would. The bomb runs in a child process with a memory and time limit, so
code that expands it fails the test instead of the machine.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tinyattn.config import (
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_VALUES,
    Config,
    DataConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
    load_config,
    show_value,
)
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.errors import ConfigError, DataError
from tinyattn.model import memory
from tinyattn.model.memory import check_training_fits, parameter_count, training_memory
from tinyattn.model.transformer import LanguageModel
from tinyattn.train.loop import train
from tests import warm_python

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the quick brown fox jumps over the lazy dog.\n" * 60


def alias_bomb(levels: int) -> str:
    """A config whose train.probe_text is 9**levels x's through aliases of aliases."""
    items = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "data:\n  files: [c.txt]\ntrain:\n  probe_text: [" + ", ".join(items) + "]\n"


# ----------------------------------------------------------------------------- YAML aliases


def test_an_alias_bomb_is_refused_fast_in_one_short_line(tmp_path):
    """The 9-level bomb (about 420 bytes, 387 million x's) ends in a second, under a 2 GB cap."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))
    assert path.stat().st_size < 500
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
              "from tinyattn.config import load_config\n"
              f"load_config({str(path)!r})\n")
    start = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("the bomb was still expanding after 30 s")
    last = result.stderr.strip().splitlines()[-1]
    assert time.perf_counter() - start < 20
    assert last.startswith("tinyattn.errors.ConfigError: ") and "train.probe_text: expands" in last, last
    assert f"more than {MAX_CONFIG_VALUES:,} values" in last and len(last) < 300


@pytest.mark.parametrize("levels", [MAX_CONFIG_DEPTH + 1, 700])
def test_a_value_nested_hundreds_of_levels_deep_is_refused_as_too_deep_not_as_an_alias_bomb(tmp_path, levels):
    # The size count's recursion ran out at a few hundred levels, which was said as "expands to more
    # than 10,000 values (YAML aliases repeating aliases)" of a value of 700 lists and no alias; and
    # where torch's compiler had raised the recursion limit in the same process, not at all.
    path = tmp_path / "c.yaml"
    path.write_text("data: {files: [c.txt]}\ntrain: {max_steps: " + "[" * levels + "]" * levels + "}\n")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(2000)  # what torch._inductor sets while it compiles
    try:
        with pytest.raises(ConfigError) as refused:
            load_config(path)
    finally:
        sys.setrecursionlimit(limit)
    assert str(refused.value) == (f"{path}: train.max_steps: nests lists or mappings more than "
                                  f"{MAX_CONFIG_DEPTH} levels deep; no config value nests more than a few "
                                  "levels")


def test_a_value_nested_to_the_depth_limit_is_read(tmp_path):
    path = tmp_path / "c.yaml"
    levels = MAX_CONFIG_DEPTH
    path.write_text("data: {files: [c.txt]}\ntrain: {max_steps: " + "[" * levels + "]" * levels + "}\n")
    with pytest.raises(ConfigError, match="train.max_steps: expected an integer"):
        load_config(path)


def test_aliases_within_the_limit_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {files: [c.txt]}\ntrain: {lr: &lr 0.002, muon_lr: *lr, show: &s [sample]}\n")
    config = load_config(path)
    assert (config.train.lr, config.train.muon_lr, config.train.show) == (0.002, 0.002, ["sample"])


# ----------------------------------------------------------------------------- values in errors


def test_an_error_shows_a_huge_value_cut_to_a_readable_length(tmp_path):
    """6,561 x's under the alias limit, a 100,000-character string: each message stays short."""
    path = tmp_path / "c.yaml"
    path.write_text(alias_bomb(4))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "train.probe_text: expected a string, got [[" in message and len(message) < 250, message[:300]
    with pytest.raises(ConfigError) as error:
        load_config(_plain(tmp_path), ["model.n_layer=" + "y" * 100_000])
    assert "model.n_layer: expected an integer, got 'yyy" in str(error.value) and len(str(error.value)) < 250
    assert "\n" not in str(error.value)


def _plain(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text("data: {files: [c.txt]}\n")
    return path


def test_show_value_is_short_and_cheap_for_any_value():
    nested = [["x"] * 9] * 9
    for _ in range(12):  # 9**14 items through shared references: only the first few are looked at
        nested = [nested] * 9
    start = time.perf_counter()
    shown = [show_value(v) for v in (nested, "z" * 10**6, 10**500, {"k": list(range(10**5))}, 3e-4)]
    assert time.perf_counter() - start < 0.5
    assert all(len(s) <= 120 for s in shown) and shown[-1] == "0.0003"


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize("model", [
    dict(),
    dict(tie_embeddings=False, n_kv_head=1),
    dict(n_head=4, n_kv_head=2, qk_norm=True, mlp_hidden=40),
    dict(n_layer=3, n_embd=48, n_head=6, n_kv_head=3, tie_embeddings=False, qk_norm=True),
    dict(n_kv_head=1, qk_norm=True, attention_gate=True),
    dict(n_kv_head=1, qk_norm=True, attention_gate=True, attention_gate_rank=5),
])
def test_parameter_count_from_the_config_is_the_built_models(model):
    config = ModelConfig(**{"vocab_size": 67, "n_layer": 2, "n_head": 2, "n_embd": 32,
                            "context_length": 16, **model})
    assert parameter_count(config) == LanguageModel(config).num_parameters()
    assert parameter_count(ModelConfig(**{**config.__dict__, "vocab_size": None}), vocab_size=67) \
        == parameter_count(config)


def test_the_estimate_counts_weights_gradients_optimizer_state_and_activations():
    model = ModelConfig(vocab_size=100, n_layer=2, n_head=2, n_embd=32, context_length=16)
    adamw = training_memory(model, TrainConfig(batch_size=4, precision="fp32"))
    assert adamw.state_bytes == 16 * parameter_count(model)
    assert adamw.activation_bytes > 2 * 4 * 16 * 100 * 4  # at least the fp32 logits and their gradient
    bigger_batch = training_memory(model, TrainConfig(batch_size=8, precision="fp32"))
    assert bigger_batch.activation_bytes == 2 * adamw.activation_bytes


def test_the_activation_estimate_of_a_grouped_query_model_in_auto_precision_counts_each_term():
    """A golden number: one key/value head of width 8 beside four query heads, precision auto (which
    may pick bf16: 2 bytes an activation), the fused path (no (H, T, T) weights), fp32 logits."""
    model = ModelConfig(vocab_size=100, n_layer=2, n_head=4, n_kv_head=1, n_embd=32, context_length=16,
                        attention="fused")
    tokens = 2 * 16  # batch_size x context_length
    per_token = (4 * 32  # both norms' inputs and outputs
                 + 32 + 2 * 8  # q, and k and v of the one key/value head
                 + 32  # the attention's output
                 + 3 * 128)  # gate and up (hidden 128) and their product
    estimate = training_memory(model, TrainConfig(batch_size=2, precision="auto"))
    assert estimate.activation_bytes == 2 * tokens * per_token * 2 + 2 * tokens * 100 * 4  # + logits, gradient



def test_the_activation_estimate_of_a_gated_attention_counts_the_gates_logits_and_the_gated_output():
    plain = ModelConfig(vocab_size=100, n_layer=2, n_head=4, n_embd=32, context_length=16, attention="fused")
    gated = ModelConfig(**{**plain.__dict__, "attention_gate": True})
    train = TrainConfig(batch_size=2, precision="fp32")
    extra = training_memory(gated, train).activation_bytes - training_memory(plain, train).activation_bytes
    assert extra == 2 * (2 * 16) * (2 * 32) * 4  # layers x tokens x (logits and gated output, C each) x fp32
    ranked = ModelConfig(**{**gated.__dict__, "attention_gate_rank": 5})  # and the 5 products between its two
    assert training_memory(ranked, train).activation_bytes - training_memory(gated, train).activation_bytes \
        == 2 * (2 * 16) * 5 * 4


@pytest.mark.parametrize("attention, dropout", [("explicit", 0.0), ("explicit", 0.1), ("fused", 0.0)])
def test_the_activation_estimate_is_a_floor_of_what_a_forward_keeps_for_the_backward(attention, dropout):
    # Long enough that the explicit path's (H, T, T) weights dominate: counted twice, the estimate
    # exceeded what the step keeps, and refused runs that fit.
    model = ModelConfig(vocab_size=65, n_layer=2, n_head=8, n_embd=64, context_length=512,
                        attention=attention, dropout=dropout)
    kept: dict[int, int] = {}

    def pack(tensor):
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    torch.manual_seed(0)
    x, y = torch.randint(0, 65, (1, 512)), torch.randint(0, 65, (1, 512))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        LanguageModel(model).train()(x, y)
    estimate = training_memory(model, TrainConfig(batch_size=1, precision="fp32")).activation_bytes
    scores = 2 * 512 * 8 * 512 * 4  # the two layers' (H, T, T) fp32 weights, one batch row
    assert estimate <= sum(kept.values())
    if attention == "explicit":  # and it counts them: once, twice with dropout on the weights
        fused = training_memory(ModelConfig(**{**model.__dict__, "attention": "fused"}),
                                TrainConfig(batch_size=1, precision="fp32")).activation_bytes
        assert estimate - fused == scores * (2 if dropout else 1)


def test_auto_attention_is_counted_as_the_path_the_run_will_take():
    auto = ModelConfig(vocab_size=65, n_layer=2, n_head=8, n_embd=64, context_length=512)
    cpu = torch.device("cpu")
    explicit = training_memory(ModelConfig(**{**auto.__dict__, "attention": "explicit"}),
                               TrainConfig(batch_size=1, precision="bf16"))
    assert check_training_fits(auto, TrainConfig(batch_size=1, precision="bf16"), cpu) == explicit
    fused = training_memory(auto, TrainConfig(batch_size=1, precision="fp32"))  # fp32: the fused kernel
    assert check_training_fits(auto, TrainConfig(batch_size=1, precision="fp32"), cpu) == fused
    # precision auto may train in fp32 on this CPU, fused: the floor counts no (H, T, T) weights
    maybe_bf16 = TrainConfig(batch_size=1, precision="auto")
    floor = training_memory(auto, maybe_bf16, explicit_attention=False)
    assert check_training_fits(auto, maybe_bf16, cpu) == floor


def test_auto_attention_with_dropout_on_the_residuals_alone_is_counted_as_the_explicit_path_once():
    """model.attention_dropout 0 beside model.dropout 0.1 (the main config in bf16): the run takes the
    explicit path (attention_path), which keeps one copy of the (H, T, T) weights, none dropped."""
    auto = ModelConfig(vocab_size=65, n_layer=2, n_head=8, n_embd=64, context_length=512, dropout=0.1,
                       attention_dropout=0.0)
    bf16 = TrainConfig(batch_size=1, precision="bf16")
    explicit = training_memory(ModelConfig(**{**auto.__dict__, "attention": "explicit"}), bf16)
    fused = training_memory(ModelConfig(**{**auto.__dict__, "attention": "fused"}), bf16)
    assert check_training_fits(auto, bf16, torch.device("cpu")) == explicit
    assert explicit.activation_bytes - fused.activation_bytes == 2 * 512 * 8 * 512 * 2  # layers x T x (H, T) in bf16


def tiny_config(tmp_path, **model) -> Config:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "context_length": 16, **model}
    return Config(model=ModelConfig(**shape),
                  data=DataConfig(files=[str(corpus)], cache_dir=str(tmp_path / "cache")),
                  train=TrainConfig(batch_size=2, max_steps=2, eval_interval=2, eval_windows=2, device="cpu",
                                    precision="fp32", out_dir=str(tmp_path / "runs")))


@pytest.mark.parametrize("model", [dict(n_layer=100_000), dict(n_embd=10_000_000)])
def test_a_model_too_big_for_this_machine_is_refused_before_its_run_folder(tmp_path, model):
    config = tiny_config(tmp_path, **model)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        train(config, run_name="big", progress=False)
    assert time.perf_counter() - start < 10
    message = str(error.value)
    assert f"({parameter_count(config.model):,} parameters" in message and "available" in message, message
    assert "\n" not in message and not (tmp_path / "runs").exists()


def test_a_refusal_before_the_vocabulary_is_known_says_its_count_leaves_out_the_embedding_and_head(tmp_path):
    # The first check runs before the tokenizer: "1,544,000,032 parameters" for a model of 1,544,004,320,
    # its embedding and head left out unsaid.
    config = tiny_config(tmp_path, n_layer=100_000)
    assert config.model.vocab_size is None
    with pytest.raises(ConfigError) as error:
        check_training_fits(config.model, config.train, torch.device("cpu"))
    assert (f"({parameter_count(config.model):,} parameters besides the token embedding and head, which the "
            "tokenizer sizes: ") in str(error.value)
    with pytest.raises(ConfigError) as error:
        check_training_fits(config.model, config.train, torch.device("cpu"), vocab_size=67)
    assert f"({parameter_count(config.model, 67):,} parameters: " in str(error.value)


def test_the_limit_is_the_memory_the_device_has(tmp_path, monkeypatch):
    """A model that trains fine is refused when the limit is made smaller than its estimate."""
    config = tiny_config(tmp_path)
    needed = training_memory(config.model, config.train).total_bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: (needed - 1, "of memory available here"))
    with pytest.raises(ConfigError, match=r"more than the .* of memory available here"):
        check_training_fits(config.model, config.train, torch.device("cpu"))
    with pytest.raises(ConfigError, match="parameters"):
        train(config, run_name="small", progress=False)
    assert not (tmp_path / "runs").exists()


def test_a_run_whose_estimate_is_exactly_the_memory_available_is_not_refused(tmp_path, monkeypatch):
    """The estimate is a floor: a run that needs at least all of the memory there is may still fit."""
    config = tiny_config(tmp_path)
    needed = training_memory(config.model, config.train).total_bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: (needed, "of memory available here"))
    assert check_training_fits(config.model, config.train, torch.device("cpu")).total_bytes == needed


def test_with_psutil_the_cpu_limit_is_the_memory_available_not_the_machines_total(monkeypatch):
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=3 << 30, total=64 << 30))
    assert memory.available_bytes(torch.device("cpu")) == (3 << 30, "of memory available on this machine")


def test_on_a_gpu_the_limit_is_its_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 << 30, 8 << 30))
    assert memory.available_bytes(torch.device("cuda", 0)) == (3 << 30, "free on cuda:0")
    model = ModelConfig(vocab_size=50_000, n_layer=24, n_embd=1024, n_head=16, context_length=1024)
    with pytest.raises(ConfigError, match=r"more than the 3.2 GB free on cuda:0"):
        check_training_fits(model, TrainConfig(batch_size=8), torch.device("cuda", 0))


def test_without_psutil_the_cpu_limit_comes_from_proc_meminfo(monkeypatch):
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo here")
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now fails
    read, seen = memory._meminfo_available, []  # MemAvailable moves between two reads: keep the one used
    monkeypatch.setattr(memory, "_meminfo_available", lambda: seen.append(read()) or seen[-1])
    limit, where = memory.available_bytes(torch.device("cpu"))
    assert seen and limit == seen[-1] > 0 and where == "of memory available on this machine"


def test_proc_meminfos_available_kilobytes_are_read_as_bytes(monkeypatch):
    class Meminfo:
        def __init__(self, path):
            assert path == "/proc/meminfo"

        def read_text(self):
            return "MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:    2000000 kB\n"

    monkeypatch.setattr(memory, "Path", Meminfo)
    assert memory._meminfo_available() == 2_000_000 * 1024


# ----------------------------------------------------------------------------- the tokenizer


def test_a_folder_as_the_pretrained_tokenizer_is_one_line(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    with pytest.raises(DataError, match=r"^tokenizer.path: .*tok is a folder; expected the path of a "
                                        r"tokenizer.json file$"):
        build_tokenizer(TokenizerConfig(kind="pretrained", path=str(folder)), lambda: iter([]))
    # a folder that holds one (a Hugging Face download): the file meant is named
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError) as error:
        build_tokenizer(TokenizerConfig(kind="pretrained", path=str(folder)), lambda: iter([]))
    assert str(error.value).endswith(f"is a folder; expected the path of a tokenizer.json file; did you mean "
                                     f"{folder / 'tokenizer.json'}?")
    (folder / "tokenizer.json").unlink()
    config = tiny_config(tmp_path)
    config.tokenizer = TokenizerConfig(kind="pretrained", path=str(folder))
    with pytest.raises(DataError, match="is a folder"):
        train(config, run_name="t", progress=False)


# ----------------------------------------------------------------------------- a stop during calibration


@pytest.mark.slow  # a subprocess killed with SIGTERM
def test_sigterm_during_the_time_budgets_calibration_ends_at_once_and_takes_back_the_new_runs_folder(
        tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{files: [{tmp_path / 'corpus.txt'}], cache_dir: {tmp_path / 'cache'}}}\n"
                      "model: {n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}\n"
                      "train: {batch_size: 2, eval_interval: 1000, device: cpu, "
                      f"peak_flops: 1.0e+12, out_dir: {tmp_path / 'runs'}}}\n")  # no start-up matmul for MFU
    (tmp_path / "corpus.txt").write_text(TEXT)
    command = [sys.executable, "-m", "tinyattn", "train", "--config", str(config), "--run-name", "s",
               "--no-progress", "--set", "train.time_budget=300s"]
    child = warm_python.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)  # -m: ROOT's tinyattn
    try:
        first = child.stderr.readline()
        assert "measuring a few steps" in first, first
        time.sleep(0.3)  # inside the measurement
        child.send_signal(signal.SIGTERM)
        rest = child.stderr.read()
        code = child.wait(timeout=60)
    finally:
        child.kill()
    assert code == 130, rest
    # one line, as a stop while the data is prepared, and no folder left (no probe checkpoint)
    assert rest == ("stopped by SIGTERM before the first step: nothing was trained or saved; "
                    "run the same command again to train\n"), rest
    assert list((tmp_path / "runs").iterdir()) == []
