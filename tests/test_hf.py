"""Hugging Face folders both ways: export, import, fine-tune from one; transformers is the reference.

Every model here is built locally and tiny (the hub is never reached: HF_HUB_OFFLINE=1).
Random weights are scaled up from the initialisation so logits are spread apart (a few
units, like a trained small model's): equal logits then mean equal functions, and greedy
choices never hang on a near tie. The differences left are float32 rounding: tinyattn
computes its RoPE tables in float64, transformers in float32, so they grow with the
logits' size.
"""

import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

pytest.importorskip("safetensors")
if importlib.util.find_spec("transformers") is None:  # looked up, not imported: every worker collects this
    pytest.skip("transformers is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tinyattn import checkpoint as ckpt  # noqa: E402
from tinyattn.analysis.evaluate import evaluate_tokens  # noqa: E402
from tinyattn.cli import attention as attention_cli  # noqa: E402
from tinyattn.cli import eval as eval_cli  # noqa: E402
from tinyattn.cli import export as export_cli  # noqa: E402
from tinyattn.cli import generate as generate_cli  # noqa: E402
from tinyattn.config import (
    Config,
    DataConfig,
    ModelConfig,
    SampleConfig,
    TokenizerConfig,
    TrainConfig,
    config_to_dict,
)
from tinyattn.data.tokenizer import Tokenizer, build_tokenizer  # noqa: E402
from tinyattn.errors import ConfigError  # noqa: E402
from tinyattn.generate.decoder import generate_tokens  # noqa: E402
from tinyattn.generate.text import encode_prompt, generate  # noqa: E402
from tinyattn.hf.folder import EXPORTED_FILES, export_folder, load_any_model  # noqa: E402
from tinyattn.model.transformer import LanguageModel  # noqa: E402
from tinyattn.train.loop import train  # noqa: E402
from tests import warm_python  # noqa: E402

# The exports, fine-tunes and token caches written here in process go to the page cache alone
# (conftest.no_fsync says why).
pytestmark = pytest.mark.usefixtures("no_fsync")

TEXT = ("ROMEO: But soft, what light through yonder window breaks?\n"
        "JULIET: Привет, мир! Καλημέρα. 日本語のテキスト, 中文.\n"
        "NURSE: Emoji too 😀🎉👍🏽 and done.\n") * 3
ROOT = Path(__file__).resolve().parents[1]
SAMPLES = {"ascii": "ROMEO: what light breaks?", "non-latin": "Привет, мир! 日本語 Καλημέρα",
           "emoji": "done 😀🎉👍🏽",
           # what transformers' clean_up_tokenization_spaces would join: decode must leave it as it is
           "spaced-punctuation": "what , light . breaks ? done !"}


_BUILT_TOKENIZERS: dict = {}  # tokenizer_of's, by kind, never handed out: each call gets a copy


def tokenizer_of(kind: str) -> Tokenizer:
    """A tokenizer of `kind` trained on TEXT, trained once per test process: each call gets a copy."""
    import copy

    if kind not in _BUILT_TOKENIZERS:
        _BUILT_TOKENIZERS[kind] = build_tokenizer(TokenizerConfig(kind=kind, vocab_size=300),
                                                  lambda: iter([TEXT]))
    return copy.deepcopy(_BUILT_TOKENIZERS[kind])


def random_model(tokenizer: Tokenizer, kind: str, n_kv_head: int, seed: int = 0, *, n_embd: int = 32,
                 context_length: int = 64, tie_embeddings: bool = True, qk_norm: bool = False,
                 attention_gate: bool = False, attention_gate_rank: Optional[int] = None):
    config = Config(model=ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4,
                                      n_kv_head=n_kv_head, n_embd=n_embd, context_length=context_length,
                                      tie_embeddings=tie_embeddings, qk_norm=qk_norm,
                                      attention_gate=attention_gate, attention_gate_rank=attention_gate_rank),
                    data=DataConfig(files=["corpus.txt"]), tokenizer=TokenizerConfig(kind=kind),
                    sample=SampleConfig(temperature=0.7, top_k=20, max_new_tokens=100))
    torch.manual_seed(seed)
    model = LanguageModel(config.model).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.15)
    return config, model


def hf_model(folder):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def max_logit_difference(model, reference, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(ids).logits - reference(ids).logits).abs().max().item()


def save_run(tmp_path, config, model, tokenizer, name="run"):
    run = tmp_path / name
    ckpt.save_checkpoint({"config": config_to_dict(config), "model": model.state_dict(),
                          "tokenizer": tokenizer.to_json(), "step": 20, "tokens_seen": 2560,
                          "best_val_loss": 2.3456}, run / "best.pt")
    return run


def char_run(tmp_path):
    """A run folder of a random tied char model (random_model's), for tests of where an export goes."""
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    return save_run(tmp_path, config, model, tokenizer)


@pytest.fixture
def blank_plots(monkeypatch):
    """Attention's heatmaps and eval's loss-by-position plot blank figures, still written where the
    command writes them: for runs whose PNGs no assertion here reads. What they show is pinned by
    tests/test_attention_maps.py and tests/test_evaluate.py."""
    from tinyattn.analysis import attention_maps, evaluate
    from tinyattn.analysis.plotting import new_figure

    monkeypatch.setattr(attention_maps, "layer_figure",
                        lambda maps, layer, heads=None, dpi=attention_maps.DPI: new_figure(0.1, 0.1, dpi))
    monkeypatch.setattr(evaluate, "loss_by_position_figure", lambda losses, title="", dpi=evaluate.PLOT_DPI:
                        new_figure(0.1, 0.1, dpi))


def run_main(main, argv, capsys):
    capsys.readouterr()  # drop what came before (transformers' progress bars)
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize("kind,n_kv_head", [("char", 4), ("char", 2), ("bpe", 4), ("bpe", 1)],
                         ids=["char", "char-gqa", "bpe", "bpe-gqa"])
def test_exported_folder_gives_transformers_equal_logits(tmp_path, kind, n_kv_head):
    tokenizer = tokenizer_of(kind)
    config, model = random_model(tokenizer, kind, n_kv_head)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    reference = hf_model(tmp_path / "out")
    assert type(reference).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])  # the whole context
    assert max_logit_difference(model, reference, ids) < 1e-5


def test_an_untied_export_says_tie_word_embeddings_false_and_imports_back_with_equal_logits(tmp_path):
    # Written true for every model, transformers would tie lm_head to the embedding (dropping the
    # stored head) and tinyattn's own import would refuse or tie the head just the same.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2, tie_embeddings=False)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(model, hf_model(tmp_path / "out"), ids) < 1e-5
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.tie_embeddings is False
    assert max_logit_difference(loaded.model, model, ids) < 1e-5


def test_a_tied_export_stores_the_embedding_once_and_no_lm_head(tmp_path):
    # transformers ties lm_head to the embedding as config.json says: a stored copy would only double
    # the file's largest tensor (llama.cpp reuses token_embd the same way: tests/test_gguf.py).
    from safetensors.torch import load_file

    folder, model, _ = exported_char_folder(tmp_path)
    stored = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in stored
    assert torch.equal(stored["model.embed_tokens.weight"], model.token_embedding.weight)
    from safetensors import safe_open
    with safe_open(folder / "model.safetensors", "pt") as f:  # what save_pretrained writes; readers check it
        assert f.metadata() == {"format": "pt"}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nothing can be made")
@pytest.mark.parametrize("out", ["/proc/nope", "/proc/nope/deeper", "/proc/nope.gguf"])
def test_an_export_to_a_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, out):
    # /proc refuses a new folder or file with ENOENT (a read-only mount says EROFS, a folder not
    # the user's EACCES): the path and the reason, not a FileNotFoundError traceback
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: cannot write {out}: ") and "No such file or directory" in err, err
    assert "choose another folder" in err, err


def test_an_exports_rope_base_is_written_where_transformers_5_and_4_read_it(tmp_path):
    # rope_parameters for transformers 5, the top-level rope_theta for transformers 4: both the model's.
    tokenizer = tokenizer_of("char")
    config, _ = random_model(tokenizer, "char", 2)
    config.model.rope_base = 500.0
    torch.manual_seed(0)
    model = LanguageModel(config.model).eval()  # its RoPE tables are made here, from the base
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.15)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    hf = json.loads((tmp_path / "out" / "config.json").read_text())
    assert hf["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    assert hf["rope_theta"] == 500.0
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(model, hf_model(tmp_path / "out"), ids) < 1e-5


def test_an_exports_rms_norm_eps_is_the_models_and_imports_back(tmp_path):
    # random_llama's folders (and common defaults) say 1e-5: an epsilon that is none of them.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.model.norm_eps = 3e-6
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rms_norm_eps"] == 3e-6
    assert load_any_model(tmp_path / "out").config.model.norm_eps == 3e-6


def test_exported_logits_stay_equal_at_the_end_of_a_long_context(tmp_path):
    # RoPE's angles grow with the position: computed otherwise than transformers computes them
    # (in float64, say), the logits drift apart by 1e-4 at position 2,048.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 4, n_embd=64, context_length=2048)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    ids = torch.randint(0, tokenizer.vocab_size, (1, 2048), generator=torch.Generator().manual_seed(0))
    assert max_logit_difference(model, hf_model(tmp_path / "out"), ids) < 1e-5


def test_an_exported_folder_and_its_files_get_the_permissions_a_plain_write_gives(tmp_path):
    import os

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 4)
    old = os.umask(0o022)
    try:
        export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755  # readable by a class, a container
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()} == {0o644}


def test_an_export_that_replaces_a_folder_keeps_the_folders_permissions_as_a_replaced_file_keeps_its(
        tmp_path):
    # Deliberate (storage.new_folder_mode): a folder made private (chmod 700) stays private under
    # --force, as atomic_write keeps a replaced file's mode; it cannot be told from an older export's 0700.
    import os

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 4)
    out = tmp_path / "out"
    export_folder(model.state_dict(), config, tokenizer, out)
    os.chmod(out, 0o700)
    before = (out / "config.json").stat().st_ino
    old = os.umask(0o022)
    try:
        export_folder(model.state_dict(), config, tokenizer, out, force=True)
    finally:
        os.umask(old)
    assert (out / "config.json").stat().st_ino != before  # replaced, not written into
    assert out.stat().st_mode & 0o777 == 0o700


def test_an_export_takes_an_empty_folder_but_never_one_holding_other_files_even_with_force(tmp_path):
    from tinyattn.errors import CheckpointError

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    out = tmp_path / "out"
    out.mkdir()
    export_folder(model.state_dict(), config, tokenizer, out)  # empty: no --force needed
    (out / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError) as refused:
        export_folder(model.state_dict(), config, tokenizer, out, force=True)
    assert str(refused.value) == f"{out}: the folder holds other files (notes.txt); choose another --out"
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces an export, never a user's files


@pytest.mark.parametrize("spelling", [".", "absolute"])
def test_an_export_into_the_folder_the_user_is_in_is_refused_saying_where_to_export(tmp_path, monkeypatch,
                                                                                   spelling):
    # `cd mymodel && tinyattn export ... --out .` (an empty folder, which --out accepts) was "error: .:
    # cannot be moved aside to replace it (Device or resource busy; a mount point?)"; the same folder
    # by its full path was swapped out from under the shell, which was left in a deleted folder.
    from tinyattn.errors import CheckpointError

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    here = tmp_path / "mymodel"
    here.mkdir()
    monkeypatch.chdir(here)
    out = "." if spelling == "." else str(here)
    with pytest.raises(CheckpointError) as refused:
        export_folder(model.state_dict(), config, tokenizer, out)
    assert str(refused.value) == (
        f"{out}: the folder you are in ({here}); an export puts a new folder in its place, which cannot "
        "be done to the current folder: export into a folder inside it, such as --out model, or from "
        "its parent folder")
    assert list(here.iterdir()) == [] and Path.cwd() == here


@pytest.mark.parametrize("card", [None, "---\nlicense: apache-2.0\ntags: [llama]\n---\n# SmolLM2\n",
                                  # tinyattn's tag line in the text, not in the front matter: not its card
                                  "---\nlicense: apache-2.0\n---\n# Notes\n\ntags: [tinyattn, llama]\n",
                                  # no front matter: the tag line above a rule (---) is text too
                                  "# Notes\ntags: [tinyattn, llama]\n---\n"],
                         ids=["no-card", "another-card", "tag-line-in-the-text", "tag-line-above-a-rule"])
def test_force_never_replaces_a_downloaded_model_holding_only_the_files_an_export_writes(
        tmp_path, capsys, card):
    # `hf download` leaves config.json, model.safetensors, tokenizer.json, ... (and often a
    # README.md): the names an export writes. It was called "an earlier export" and --force wiped it.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)
    downloaded = tmp_path / "models" / "SmolLM2"
    random_llama(downloaded, tokenizer_of("bpe"))
    (downloaded / "README.md").unlink(missing_ok=True)
    if card is not None:
        (downloaded / "README.md").write_text(card)
    before = {p.name: p.read_bytes() for p in downloaded.iterdir()}
    for force in ([], ["--force"]):
        code, out, err = run_main(export_cli.main, ["--checkpoint", run, "--out", downloaded, *force], capsys)
        assert code == 2 and out == "" and err == (
            f"error: {downloaded}: not empty and not an earlier tinyattn export (no README.md with "
            f"tinyattn's model card; it holds {', '.join(sorted(before)[:3])}, ...); choose another --out "
            "(--force replaces only an earlier tinyattn export)\n")
    assert {p.name: p.read_bytes() for p in downloaded.iterdir()} == before
    assert sorted(p.name for p in downloaded.parent.iterdir()) == ["SmolLM2"]
    again = tmp_path / "again"  # a folder tinyattn exported, its card's front matter as written
    export_folder(model.state_dict(), config, tokenizer, again)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", again], capsys)
    assert code == 2 and err == f"error: {again}: holds an earlier export; add --force to replace it\n"
    assert run_main(export_cli.main, ["--checkpoint", run, "--out", again, "--force"], capsys)[0] == 0


def test_a_bf16_export_stores_bf16_weights_and_float32_where_asked(tmp_path):
    # transformers casts to config.json's dtype on loading, so only the file shows what was stored.
    from safetensors.torch import load_file

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    for dtype in (torch.bfloat16, torch.float32):
        export_folder(model.state_dict(), config, tokenizer, tmp_path / str(dtype), dtype=dtype)
        stored = load_file(tmp_path / str(dtype) / "model.safetensors")
        assert {t.dtype for t in stored.values()} == {dtype}
        assert torch.equal(stored["model.norm.weight"], model.final_norm.weight.to(dtype))


def test_the_model_cards_parameter_count_counts_a_tied_head_once(tmp_path):
    tokenizer = tokenizer_of("bpe")
    config, model = random_model(tokenizer, "bpe", 2, n_embd=64)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    count = sum(p.numel() for p in model.parameters())  # a shared tensor once
    card = (tmp_path / "out" / "README.md").read_text()
    assert count < 1_000_000  # a small model's card names its count exactly, not as "0.13M"
    assert f"# A {count:,}-parameter Llama-architecture language model" in card


def test_a_hugging_face_folder_exported_again_is_not_called_trained_with_tinyattn(tmp_path, capsys):
    # An imported folder tinyattn never trained, exported again: its card said "Trained with tinyattn"
    # on "unknown data".
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    # its own card, not tinyattn's, with rows of the names tinyattn's card gives its training rows
    (tmp_path / "llama" / "README.md").write_text("---\nlicense: apache-2.0\n---\n| | |\n|---|---|\n"
                                                  "| data | the web |\n| training | 2T tokens |\n")
    code, _, err = run_main(export_cli.main, ["--checkpoint", tmp_path / "llama", "--out", tmp_path / "out"],
                            capsys)
    card = (tmp_path / "out" / "README.md").read_text()
    assert code == 0 and "Exported by tinyattn as `LlamaForCausalLM` from a Hugging Face folder" in card, err
    assert "Trained with tinyattn" not in card and "| data |" not in card and "| training |" not in card


def test_a_tinyattn_export_exported_again_keeps_its_training_rows_and_is_not_called_untrained(
        tmp_path, capsys):
    # Exported again from its own export (to bf16, say), a trained run's card said "untrained by
    # tinyattn" and dropped its data, steps and validation loss.
    run = char_run(tmp_path)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "first"], capsys)
    assert code == 0, err
    rows = [line for line in (tmp_path / "first" / "README.md").read_text().splitlines()
            if line.startswith(("| data |", "| training |", "| validation loss |", "| exported from |"))]
    assert len(rows) == 4, rows
    source = tmp_path / "first"
    for again in ("second", "third"):  # and once more from that one
        code, _, err = run_main(export_cli.main, ["--checkpoint", source, "--out", tmp_path / again,
                                                  "--dtype", "bf16"], capsys)
        card = (tmp_path / again / "README.md").read_text()
        assert code == 0 and "untrained" not in card and "Trained with tinyattn" in card, err
        assert [line for line in card.splitlines() if line in rows] == rows
        source = tmp_path / again


def test_the_model_card_gives_no_validation_loss_for_a_run_that_never_evaluated(tmp_path):
    from tinyattn.hf.folder import ModelCard

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    card = ModelCard("runs/x/best.pt", step=3, best_val_loss=float("inf"))  # a Trainer's before any eval
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out", card=card)
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| training | 3 steps |" in text and "validation loss" not in text


def test_the_model_card_counts_a_runs_one_step_as_1_step(tmp_path):
    # It said "| training | 1 steps |"; a run's own lines count with errors.counted (274efcb)
    from tinyattn.hf.folder import ModelCard

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out",
                  card=ModelCard("runs/x/best.pt", step=1, best_val_loss=float("inf")))
    assert "| training | 1 step |" in (tmp_path / "out" / "README.md").read_text()


def test_the_model_card_of_a_fine_tune_names_the_model_it_started_from(tmp_path):
    from tinyattn.hf.folder import ModelCard

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.train.init_from = "models/SmolLM2-135M"
    card = ModelCard("runs/x/best.pt", step=3)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out", card=card)
    assert "| initialised from | `models/SmolLM2-135M` |" in (tmp_path / "out" / "README.md").read_text()


def test_the_model_card_names_a_hub_dataset_and_its_config(tmp_path):
    from tinyattn.hf.folder import ModelCard

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.data = DataConfig(dataset="wikitext", dataset_config="wikitext-103-raw-v1")
    card = ModelCard("runs/x/best.pt", step=3)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out", card=card)
    assert ("| data | the Hugging Face dataset `wikitext` (wikitext-103-raw-v1) |"
            in (tmp_path / "out" / "README.md").read_text())



@pytest.mark.parametrize("source, own", [("runs/x/best.pt", True), ("runs/x/step_0000030.pt", False)])
def test_the_model_card_calls_a_loss_the_exported_weights_own_only_for_best_pt(tmp_path, source, own):
    # a step checkpoint holds the run's best so far (step 20's 3.3103 on step 30's weights, which
    # scored 3.3448), and the card said it was these weights' "(best)"
    from tinyattn.hf.folder import ModelCard

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out",
                  card=ModelCard(source, step=30, best_val_loss=3.3103))
    text = (tmp_path / "out" / "README.md").read_text()
    assert ("| validation loss | 3.3103 nats per token (best) |" in text) == own
    assert ("| the run's best validation loss by then | 3.3103 nats per token, at this step or an earlier "
            "one (not measured on these weights) |" in text) == (not own)

def test_greedy_generation_matches_transformers_token_for_token(tmp_path):
    import transformers

    tokenizer = tokenizer_of("bpe")
    config, model = random_model(tokenizer, "bpe", 2, seed=1)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    prompt = torch.tensor([tokenizer.encode("ROMEO: But")])
    ours = torch.stack(list(generate_tokens(model, prompt, 50, temperature=0.0)), dim=1)  # (1, 50)
    greedy = transformers.GenerationConfig(max_new_tokens=50, do_sample=False, eos_token_id=None,
                                           bos_token_id=None, pad_token_id=None)
    theirs = hf_model(tmp_path / "out").generate(prompt, generation_config=greedy,
                                                 attention_mask=torch.ones_like(prompt))
    assert theirs[0, prompt.size(1):].tolist() == ours[0].tolist()
    assert len(set(ours[0].tolist())) > 5  # a real sequence, not one token repeated


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_tokenizer_round_trip_matches_auto_tokenizer(tmp_path, kind):
    import transformers

    tokenizer = tokenizer_of(kind)
    config, model = random_model(tokenizer, kind, 4)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == tokenizer.eot_id
    assert theirs.bos_token == "<|endoftext|>" and theirs("")["input_ids"] == []  # one token, never added
    assert theirs.model_max_length == config.model.context_length
    if kind == "char":
        assert theirs.unk_token == "[UNK]"
    for name, text in SAMPLES.items():
        ids = tokenizer.encode(text)
        assert theirs(text)["input_ids"] == ids, name
        assert theirs.decode(ids) == tokenizer.decode(ids) == text, name


def test_export_cli_writes_config_generation_defaults_and_card(tmp_path, capsys):
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.sample.top_p, config.sample.repetition_penalty = 0.9, 1.3  # not transformers' defaults (1)
    run = save_run(tmp_path, config, model, tokenizer)
    code, out, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    folder = tmp_path / "out"
    hf = json.loads((folder / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["dtype"] == "float32"
    assert (hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]) == (4, 2, 8)
    assert hf["rms_norm_eps"] == torch.finfo(torch.float32).eps  # what nn.RMSNorm(eps=None) uses
    assert hf["rope_parameters"]["rope_theta"] == 10000.0 and hf["tie_word_embeddings"] is True
    assert hf["max_position_embeddings"] == 64 and hf["eos_token_id"] == tokenizer.eot_id
    assert hf["bos_token_id"] == tokenizer.eot_id  # tinyattn's one special token starts texts too
    assert hf["pad_token_id"] is None  # no token is padding: token 0 is a character of the text
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["bos_token_id"] == generation["eos_token_id"] == tokenizer.eot_id
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is False
    assert (generation["do_sample"], generation["temperature"], generation["top_k"], generation["top_p"],
            generation["repetition_penalty"], generation["max_new_tokens"]) == (True, 0.7, 20, 0.9, 1.3, 100)
    sample = load_any_model(folder).config.sample  # and read back as written (500 is tinyattn's default)
    assert (sample.temperature, sample.top_k, sample.top_p, sample.repetition_penalty,
            sample.max_new_tokens) == (0.7, 20, 0.9, 1.3, 100)
    card = (folder / "README.md").read_text()
    assert "`corpus.txt`" in card and "20 steps, 2,560 tokens" in card and "2.3456" in card
    assert "tags: [tinyattn, llama]" in card
    # Exported again into the same folder: refused without --force, replaced with it.
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", folder], capsys)
    assert code == 2 and "--force" in err
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", folder, "--force",
                                              "--dtype", "bf16"], capsys)
    assert code == 0, err
    assert hf_model(folder).model.embed_tokens.weight.dtype == torch.bfloat16



def test_null_sampling_values_in_generation_config_read_as_transformers_reads_them(tmp_path):
    from tinyattn.errors import CheckpointError

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    folder = tmp_path / "out"
    export_folder(model.state_dict(), config, tokenizer, folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_p": None, "top_k": None,
                                "repetition_penalty": None, "max_new_tokens": None}))
    sample = load_any_model(folder).config.sample
    # null is "not given": transformers' defaults (top_k 50), as transformers 5 reads it
    assert (sample.temperature, sample.top_k, sample.top_p, sample.repetition_penalty) == (0.7, 50, 1.0, 1.0)
    path.write_text(json.dumps({"do_sample": True, "top_k": 0}))
    assert load_any_model(folder).config.sample.top_k is None  # 0: off
    path.write_text(json.dumps({"do_sample": True, "top_p": "high"}))
    with pytest.raises(CheckpointError, match=r"generation_config\.json: gives top_p='high': expected a number"):
        load_any_model(folder)

def test_a_failed_export_leaves_the_out_folder_as_it_was(tmp_path, capsys, monkeypatch):
    from tinyattn.errors import StorageError
    from tinyattn.hf import folder as hf

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)
    earlier = tmp_path / "earlier"
    assert run_main(export_cli.main, ["--checkpoint", run, "--out", earlier], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", earlier / "config.json" / "sub"], capsys)
    assert code == 2 and f"{earlier / 'config.json'} is a file, not a folder" in err and err.count("\n") == 1, err
    real_atomic_write = hf.atomic_write

    def disk_full_at_the_weights(path, **kwargs):
        if Path(path).name == "model.safetensors":
            raise StorageError(f"cannot write {path}: No space left on device")
        return real_atomic_write(path, **kwargs)

    monkeypatch.setattr(hf, "atomic_write", disk_full_at_the_weights)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "new"], capsys)
    assert code == 2 and err.startswith("error: cannot write ") and err.count("\n") == 1, err
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", earlier, "--force",
                                              "--dtype", "bf16"], capsys)
    assert code == 2, err
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before  # config.json not bf16's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "run"]  # no new/, no staging left


KILLED_EXPORT = """
import os, sys, torch
from pathlib import Path
from typing import Optional
from tinyattn.hf.folder import export_folder
from tinyattn.config import config_from_dict
from tinyattn.data.tokenizer import Tokenizer
state = torch.load(sys.argv[1], weights_only=True)
out, moves, real_replace = Path(sys.argv[2]), [], os.replace

def replace(src, dst):
    dst = Path(dst)
    if dst == out or dst.parent in (out, out.parent):  # a move into (or beside) the out folder
        moves.append(dst)
        if len(moves) == 2:
            os._exit(9)  # killed between two moves: no clean-up runs
    return real_replace(src, dst)

os.replace = replace
export_folder(state["model"], config_from_dict(state["config"]), Tokenizer.from_json(state["tokenizer"]),
              out, dtype=torch.bfloat16, force=True)
"""


def test_a_replaced_export_left_aside_after_the_new_one_is_in_place_is_deleted_not_put_back(tmp_path):
    # Killed after the second rename, before the old folder was deleted: `out` is the new export.
    from tinyattn.hf.folder import clean_interrupted_export

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    out = tmp_path / "out"
    export_folder(model.state_dict(), config, tokenizer, out)
    new = {p.name: p.read_bytes() for p in out.iterdir()}
    aside = tmp_path / ".out.abcd1234.old.tmp"
    aside.mkdir()
    (aside / "config.json").write_text("{}")  # the earlier export's
    clean_interrupted_export(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == new


@pytest.mark.slow  # a subprocess that dies mid-export
def test_an_export_killed_while_replacing_a_folder_loses_neither_and_is_cleaned_up(tmp_path):
    from tinyattn.errors import CheckpointError

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)
    out = tmp_path / "out"
    export_folder(model.state_dict(), config, tokenizer, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    killed = warm_python.run([sys.executable, "-c", KILLED_EXPORT, str(run / "best.pt"), str(out)],
                             capture_output=True, text=True, timeout=120)
    assert killed.returncode == 9, killed.stderr
    (tmp_path / ".out.abcd1234.tmp").mkdir()  # and a staging folder an export killed mid-write left
    (tmp_path / ".out.abcd1234.tmp" / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="holds an earlier export; add --force"):
        export_folder(model.state_dict(), config, tokenizer, out)  # the earlier export is back, whole
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # nothing left beside it
    export_folder(model.state_dict(), config, tokenizer, out, dtype=torch.bfloat16, force=True)
    assert hf_model(out).model.embed_tokens.weight.dtype == torch.bfloat16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


def refuse_to_move(out: Path, monkeypatch) -> None:
    """os.replace refuses to move `out` as it refuses a mount point (EBUSY); other moves go on."""
    import errno
    import os

    real_replace = os.replace

    def replace(src, dst):
        if Path(src) == out:
            raise OSError(errno.EBUSY, "Device or resource busy", str(src), 1, str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_an_export_to_a_folder_that_cannot_be_moved_aside_is_one_line_and_leaves_it_as_it_was(
        tmp_path, capsys, monkeypatch):
    # A mount point (a container's volume, a tmpfs) cannot be renamed: EBUSY was a traceback. Writing
    # into it instead could not be made safe: files the user put there meanwhile were deleted.
    run = char_run(tmp_path)
    out = tmp_path / "mounted"
    out.mkdir()
    refuse_to_move(out, monkeypatch)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", out], capsys)
    assert code == 2 and err == (f"error: {out}: cannot be moved aside to replace it (Device or resource busy; "
                                 f"a mount point?); export into a folder inside it, such as --out {out / 'model'}\n")
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["mounted", "run"]
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", out / "model"], capsys)
    assert code == 0 and sorted(p.name for p in (out / "model").iterdir()) == sorted(EXPORTED_FILES), err


def test_an_export_to_a_symlinked_folder_writes_through_the_link_and_keeps_it(tmp_path, capsys):
    # --force replaced the link with a real folder and left the link aside as .linked.XXX.old.tmp;
    # every later export to the path then failed with "Cannot call rmtree on a symbolic link".
    run = char_run(tmp_path)
    (tmp_path / "real").mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to("real")
    for force in ([], ["--force"], ["--force", "--dtype", "bf16"]):
        code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", linked, *force], capsys)
        assert code == 0, err
        assert linked.is_symlink() and sorted(p.name for p in (tmp_path / "real").iterdir()) == sorted(
            EXPORTED_FILES)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["linked", "real", "run"]  # nothing aside
    assert hf_model(linked).model.embed_tokens.weight.dtype == torch.bfloat16
    (tmp_path / "gone").symlink_to("nowhere")
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "gone"], capsys)
    assert code == 2 and err == (f"error: {tmp_path / 'gone'}: a symbolic link to nowhere, which does not "
                                 "exist; point it at a folder, or choose another --out\n")


def test_an_export_killed_while_replacing_a_linked_folder_is_put_back_by_the_next(tmp_path, capsys):
    # The link's folder was aside when the kill came: the next export said the link led nowhere.
    run = char_run(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to("real")
    assert run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "linked"], capsys)[0] == 0
    (tmp_path / "real").rename(tmp_path / ".real.abcd1234.old.tmp")  # a kill between the two renames
    (tmp_path / ".real.abcd1234.tmp").mkdir()
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "linked", "--force"],
                            capsys)
    assert code == 0 and "put the folder it replaced back" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked", "real", "run"]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == sorted(EXPORTED_FILES)


def test_files_that_appear_in_the_out_folder_during_an_export_are_kept_and_nothing_replaced(
        tmp_path, capsys, monkeypatch):
    # Checked empty, then written beside it: a file put in meanwhile was deleted with the folder aside.
    import tinyattn.hf.folder as folder_module

    run = char_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    swap_in = folder_module._swap_in

    def meanwhile(staging, target):
        (target / "notes.txt").write_text("mine")
        swap_in(staging, target)
    monkeypatch.setattr(folder_module, "_swap_in", meanwhile)
    code, _, err = run_main(export_cli.main, ["--checkpoint", run, "--out", out], capsys)
    assert code == 2 and err == (f"error: {out}: files appeared in it during the export (notes.txt); nothing "
                                 "was replaced; export again, or choose another --out\n")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]


def test_a_symlink_left_beside_an_export_is_removed_never_followed(tmp_path):
    from tinyattn.hf.folder import clean_interrupted_export

    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "config.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / ".out.abcd1234.old.tmp").symlink_to("keep")  # what the old export left aside
    (tmp_path / ".out.abcd1234.tmp").symlink_to("keep")
    clean_interrupted_export(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "out"]
    assert (keep / "config.json").read_text() == "{}"  # what a link pointed to is never touched


# ----------------------------------------------------------------------------- import


# What random_llama built, by its arguments: (the model untouched, its folder's files as
# {name: (bytes, mode)}, torch's random state after building it).
_BUILT_LLAMAS: dict = {}


def random_llama(folder, tokenizer: Tokenizer, seed: int = 0, eos: Optional[int] = None,
                 bos: Optional[int] = None, *, vocab_size: Optional[int] = None):
    """A LlamaForCausalLM built by transformers: GQA, untied head, eps 1e-5, RoPE base 500; its
    eos and bos tokens `eos` and `bos` (None: the tokenizer's <|endoftext|>); `vocab_size` rows
    of embedding (None: the tokenizer's). Saved in `folder` with the tokenizer's tokenizer.json.

    Built once per test process for the same arguments into a new or empty folder: later calls write
    the same files, return a copy of the same model and leave torch's random state where building it
    left it."""
    import copy
    import os

    key = (tokenizer.to_json(), seed, eos, bos, vocab_size)
    if folder.exists() and any(folder.iterdir()):  # files of its own, which saving may replace
        return _build_random_llama(folder, tokenizer, seed, eos, bos, vocab_size)
    if key in _BUILT_LLAMAS:
        model, files, random_state = _BUILT_LLAMAS[key]
        folder.mkdir(parents=True, exist_ok=True)
        for name, (data, mode) in files.items():
            (folder / name).write_bytes(data)
            os.chmod(folder / name, mode)
        torch.manual_seed(seed)  # every device's generator, as building seeds them
        torch.set_rng_state(random_state)
        return copy.deepcopy(model)
    model = _build_random_llama(folder, tokenizer, seed, eos, bos, vocab_size)
    files = {p.name: (p.read_bytes(), p.stat().st_mode & 0o7777) for p in folder.iterdir()}
    _BUILT_LLAMAS[key] = copy.deepcopy(model), files, torch.get_rng_state()
    return model


def _build_random_llama(folder, tokenizer, seed, eos, bos, vocab_size):
    import transformers

    hf_config = transformers.LlamaConfig(
        vocab_size=vocab_size or tokenizer.vocab_size, hidden_size=48, intermediate_size=80,
        num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, tie_word_embeddings=False,
        bos_token_id=tokenizer.eot_id if bos is None else bos,
        eos_token_id=tokenizer.eot_id if eos is None else eos)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.15)
    model.save_pretrained(folder)
    tokenizer.save(folder / "tokenizer.json")
    return model


def test_imported_llama_gives_equal_logits(tmp_path):
    tokenizer = tokenizer_of("bpe")
    reference = random_llama(tmp_path / "llama", tokenizer)
    loaded = load_any_model(tmp_path / "llama")
    m = loaded.config.model
    assert (m.n_kv_head, m.tie_embeddings, m.norm_eps, m.rope_base) == (2, False, 1e-5, 500.0)
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


def test_rope_scaling_beside_rope_parameters_is_read_first_as_transformers_reads_it(tmp_path):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)  # rope_parameters' rope_theta 500
    edit_config(tmp_path / "llama", rope_scaling={"rope_type": "default"}, rope_theta=20000.0)
    reference = hf_model(tmp_path / "llama")  # the top-level rope_theta: rope_scaling names none
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.model.rope_base == 20000.0
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


def test_a_config_json_without_rope_theta_eps_or_context_takes_transformers_llama_defaults(tmp_path):
    # LlamaConfig's defaults: rope_theta 10000, rms_norm_eps 1e-6, max_position_embeddings 2048.
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    drop_config_keys(tmp_path / "llama", "rope_parameters", "rope_scaling", "rope_theta", "rms_norm_eps",
                     "max_position_embeddings")
    reference = hf_model(tmp_path / "llama")
    theirs = reference.config
    assert (theirs.rope_parameters["rope_theta"], theirs.rms_norm_eps, theirs.max_position_embeddings) == (
        10000.0, 1e-6, 2048)
    loaded = load_any_model(tmp_path / "llama")
    m = loaded.config.model
    assert (m.rope_base, m.norm_eps, m.context_length) == (10000.0, 1e-6, 2048)
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


def test_a_null_rope_theta_beside_rope_parameters_own_is_read_as_transformers_reads_it(tmp_path):
    # transformers 5 takes rope_parameters' rope_theta and ignores a top-level null (it was refused:
    # "rope_theta is None; expected a number"); a null with no other theta builds no model there.
    from tinyattn.errors import CheckpointError

    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)  # rope_parameters' rope_theta 500
    edit_config(tmp_path / "llama", rope_theta=None)
    reference = hf_model(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.model.rope_base == reference.config.rope_parameters["rope_theta"] == 500.0
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5
    drop_config_keys(tmp_path / "llama", "rope_parameters")
    with pytest.raises(TypeError):  # transformers' RoPE table: None ** tensor
        hf_model(tmp_path / "llama")
    with pytest.raises(CheckpointError, match=r"config\.json: rope_theta is None and rope_parameters gives "
                                              r"none; expected a number$"):
        load_any_model(tmp_path / "llama")


LLAMA_JSON = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 48,
              "num_hidden_layers": 2, "num_attention_heads": 6, "intermediate_size": 80}


def test_config_json_fields_left_out_or_null_read_as_transformers_reads_them():
    # hidden_act absent: silu; num_key_value_heads null: one per head; tie_word_embeddings absent
    # (and no weights to tell): tied, the transformers 4 default.
    import transformers

    from tinyattn.hf.convert import model_config_from_hf

    raw = {**LLAMA_JSON, "num_key_value_heads": None}
    theirs = transformers.LlamaConfig.from_dict(raw)
    assert (theirs.hidden_act, theirs.num_key_value_heads) == ("silu", 6)
    m = model_config_from_hf(raw, "config.json")
    assert (m.n_head, m.kv_heads, m.tie_embeddings) == (6, 6, True)


def test_rope_parameters_rope_theta_wins_over_the_top_level_one_as_transformers_5_reads_it():
    import transformers

    from tinyattn.hf.convert import model_config_from_hf

    raw = {**LLAMA_JSON, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
           "rope_theta": 20000.0}
    assert transformers.LlamaConfig.from_dict(raw).rope_parameters["rope_theta"] == 500.0
    assert model_config_from_hf(raw, "config.json").rope_base == 500.0


@pytest.mark.parametrize("change, expected", [
    # transformers 5 keeps partial_rotary_factor inside rope_parameters
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    # any layer kind but full attention (Qwen3-Next's linear attention): not only sliding windows
    ({"layer_types": ["full_attention", "linear_attention"]},
     "layers other than full attention ('linear_attention') (use_sliding_window"),
    # Qwen3.5 with no layer_types makes three layers in four linear attention; with no partial_rotary_factor
    # it rotates a quarter of each head (Qwen3_5TextConfig's defaults)
    ({"architectures": ["Qwen3_5ForCausalLM"]}, "layer_types is missing: Qwen3.5 then makes three layers"),
    ({"architectures": ["Qwen3_5ForCausalLM"], "layer_types": ["full_attention"] * 2},
     "partial_rotary_factor"),
    # a quantized folder (FP8, GPTQ, bitsandbytes) was refused only by its weights' names: "weight ...
    # q_proj.weight is missing" (GPTQ's qweight) or "weights ... do not have: ...weight_scale_inv"
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
     "quantization_config (quant_method 'fp8'): tinyattn reads unquantized weights only"),
    # one without quant_method said "(quant_method None)"
    ({"quantization_config": {"bits": 4}}, "config.json: quantization_config: tinyattn reads unquantized"),
], ids=["partial-rotary-in-rope-parameters", "linear-attention-layer", "qwen3.5-hybrid",
        "qwen3.5-partial-rotary", "quantized", "quantized-unnamed"])
def test_a_config_json_tinyattn_would_compute_otherwise_is_refused_naming_the_field(change, expected):
    from tinyattn.errors import CheckpointError
    from tinyattn.hf.convert import model_config_from_hf

    with pytest.raises(CheckpointError, match=r"^config\.json: ") as refused:
        model_config_from_hf({**LLAMA_JSON, **change}, "config.json")
    assert expected in str(refused.value)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_config_json_without_tie_word_embeddings_is_tied_as_its_weights_show(tmp_path, tied):
    # No tie_word_embeddings: an lm_head.weight stored means an untied head, none a tied one.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2, tie_embeddings=tied)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    drop_config_keys(tmp_path / "out", "tie_word_embeddings")
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.tie_embeddings is tied
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, model, ids) < 1e-5


def test_an_imported_folders_eos_token_ends_texts_and_survives_fine_tuning_and_export(tmp_path, corpus):
    tokenizer = tokenizer_of("bpe")
    eos = 5  # a Llama folder's "</s>": not <|endoftext|>
    random_llama(tmp_path / "llama", tokenizer, eos=eos)
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.tokenizer.eot_id == eos and loaded.config.tokenizer.end_of_text == tokenizer.token(eos)
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == eos
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == eos
    config = finetune_config(corpus, tmp_path, tmp_path / "llama")
    config.train.max_steps = config.train.eval_interval = 2
    result = train(config, run_name="ft", progress=False)
    assert load_any_model(result.run_dir).tokenizer.eot_id == eos  # the run's config keeps it


def llama_tokenizer() -> Tokenizer:
    """The bpe tokenizer with a Llama tokenizer's two special tokens, <s> (bos) and </s> (eos), and
    its post-processor, which puts <s> before every text transformers' tokenizer(text) encodes."""
    import tokenizers

    backend = tokenizers.Tokenizer.from_str(tokenizer_of("bpe").to_json())
    backend.add_special_tokens(["<s>", "</s>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return Tokenizer(backend)


def llama_with_bos_and_eos(folder):
    """A Llama folder as transformers' Llama checkpoints come: bos <s> put before texts, eos </s>."""
    tokenizer = llama_tokenizer()
    bos, eos = tokenizer.encode("<s></s>")
    model = random_llama(folder, tokenizer, seed=1, eos=eos, bos=bos)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "add_bos_token": True}))
    return model, bos, eos


@pytest.mark.parametrize("prompt", ["", "ROMEO: But"], ids=["empty", "prompt"])
def test_an_imported_folders_bos_starts_generation_as_transformers_generate_does(tmp_path, prompt):
    import transformers

    reference, bos, eos = llama_with_bos_and_eos(tmp_path / "llama")
    theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")
    theirs_ids = theirs_tokenizer(prompt, return_tensors="pt").input_ids
    assert theirs_ids[0, 0].item() == bos  # the folder's tokenizer puts <s> first
    loaded = load_any_model(tmp_path / "llama")
    ids = encode_prompt(loaded.tokenizer, prompt, 64)
    assert ids == theirs_ids[0].tolist()  # "": [<s>], not [</s>]; a prompt: <s> in front
    greedy = transformers.GenerationConfig(max_new_tokens=30, do_sample=False, eos_token_id=eos,
                                           bos_token_id=bos, pad_token_id=eos)
    theirs = reference.generate(theirs_ids, generation_config=greedy,
                                attention_mask=torch.ones_like(theirs_ids))[0, len(ids):].tolist()
    ours = torch.stack(list(generate_tokens(loaded.model, torch.tensor([ids]), 30, temperature=0.0)), dim=1)
    assert ours[0, :len(theirs)].tolist() == theirs and len(set(theirs)) > 5
    ended = theirs[:theirs.index(eos)] if eos in theirs else theirs  # transformers stops at </s>
    text = "".join(generate(loaded.model, loaded.tokenizer, prompt, max_new_tokens=30, temperature=0))
    assert text == loaded.tokenizer.decode(ended)


def test_a_folder_without_a_bos_token_id_starts_texts_with_what_its_tokenizer_puts_first(tmp_path):
    # transformers' tokenizer(text) follows the tokenizer.json's post-processor alone.
    import transformers

    folder = tmp_path / "llama"
    _, bos, eos = llama_with_bos_and_eos(folder)
    for name in ("config.json", "generation_config.json"):
        raw = json.loads((folder / name).read_text())
        raw.pop("bos_token_id", None)
        (folder / name).write_text(json.dumps(raw))
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer = load_any_model(folder).tokenizer
    for prompt in ("", "ROMEO: But"):
        assert encode_prompt(tokenizer, prompt, 64) == theirs(prompt)["input_ids"], prompt
    assert (tokenizer.start_id, tokenizer.eot_id, tokenizer.adds_start) == (bos, eos, True)


def test_an_export_of_an_imported_folder_keeps_its_bos_and_eos(tmp_path):
    import transformers

    _, bos, eos = llama_with_bos_and_eos(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    imported = loaded.tokenizer
    assert (imported.start_id, imported.eot_id, imported.adds_start) == (bos, eos, True)
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    for name in ("config.json", "generation_config.json"):
        written = json.loads((tmp_path / "out" / name).read_text())
        assert (written["bos_token_id"], written["eos_token_id"]) == (bos, eos), name
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (theirs.bos_token, theirs.eos_token, theirs("ab")["input_ids"][0]) == ("<s>", "</s>", bos)
    again = load_any_model(tmp_path / "out").tokenizer
    assert (again.start_id, again.eot_id, again.adds_start) == (bos, eos, True)


def test_an_export_of_a_model_that_reads_no_bos_writes_a_tokenizer_that_adds_none(tmp_path):
    # A fine-tune of an imported Llama folder (train.init_from) keeps the folder's tokenizer.json,
    # whose post-processor puts <s> first, but trains and reads texts without it (one token, </s>).
    import transformers

    from tinyattn.data.tokenizer import Tokenizer

    _, bos, eos = llama_with_bos_and_eos(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    finetuned = Tokenizer.from_file(tmp_path / "llama" / "tokenizer.json", end_of_text="</s>")
    assert (finetuned.start_id, finetuned.adds_start) == (eos, False)
    export_folder(loaded.model.state_dict(), loaded.config, finetuned, tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert theirs("ROMEO: But")["input_ids"] == finetuned.encode("ROMEO: But") and theirs("")["input_ids"] == []
    assert load_any_model(tmp_path / "out").tokenizer.encode("ab") == finetuned.encode("ab")


def test_an_export_of_an_imported_folder_names_its_unknown_token(tmp_path):
    # A Llama folder's <unk> (here a char vocabulary's [UNK] renamed): transformers' unk_token after
    # an export, as before it.
    import transformers

    spelled = tokenizer_of("char").to_json().replace('"[UNK]"', '"<unk>"')
    tokenizer = Tokenizer.from_json(spelled, end_of_text="<|endoftext|>")
    random_llama(tmp_path / "llama", tokenizer)
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.tokenizer.token(loaded.tokenizer.unknown_id) == "<unk>"
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out").unk_token == "<unk>"


def test_attention_and_the_explorer_read_an_imported_folders_text_after_its_bos(tmp_path, capsys,
                                                                                blank_plots):
    # What generation read (and transformers' tokenizer gives): the maps and the explorer's
    # prediction at a clicked token are of those ids, <s> first.
    import transformers

    llama = tmp_path / "llama"
    _, bos, _ = llama_with_bos_and_eos(llama)
    text = "ROMEO: But soft"
    theirs = transformers.AutoTokenizer.from_pretrained(llama)(text)["input_ids"]
    assert theirs[0] == bos
    code, out, err = run_main(attention_cli.main, ["--checkpoint", llama, "--text", text, "--relevance",
                                                   "--query-position", "1", "--device", "cpu"], capsys)
    assert code == 0 and f"of {len(theirs)} tokens" in out, out + err
    # --query finds a word of the text, never the bos's spelling ("<s>"), at its position after the bos
    code, out, err = run_main(attention_cli.main, ["--checkpoint", llama, "--text", text, "--relevance",
                                                   "--query", "s", "--device", "cpu"], capsys)
    assert code == 2 and "--query 's': not a word of the text" in err, out + err
    code, out, err = run_main(attention_cli.main, ["--checkpoint", llama, "--text", text, "--relevance",
                                                   "--query", "ROMEO", "--device", "cpu"], capsys)
    romeo = len(transformers.AutoTokenizer.from_pretrained(llama)("ROMEO")["input_ids"]) - 1
    assert code == 0 and f"at position {romeo}\n" in out, out + err
    pytest.importorskip("fastapi")
    import types

    from tinyattn.serve.app import _explorer_query
    from tinyattn.serve.schemas import ExploreRequest, Limits

    loaded = load_any_model(llama)
    served = types.SimpleNamespace(tokenizer=loaded.tokenizer, model=loaded.model, limits=Limits())
    assert _explorer_query(served, ExploreRequest(text=text, offset=0)) == (theirs, 0, "")  # <s> predicted "R..."
    assert _explorer_query(served, ExploreRequest(text=text, offset=len(text) - 1)) == (theirs, len(theirs) - 2, "")


def test_lab_context_and_lab_distance_read_an_imported_folders_text_after_its_bos(tmp_path, monkeypatch,
                                                                                   capsys):
    # As generation and transformers read a text: <s> first, the word's position shifted past it,
    # and every probe sequence of lab distance (the copy and its control) begins with it.
    import transformers

    from tinyattn.cli.lab import main as lab_main
    from tinyattn.lab import distance
    from tinyattn.lab.context import word_position

    llama = tmp_path / "llama"
    _, bos, _ = llama_with_bos_and_eos(llama)
    theirs = transformers.AutoTokenizer.from_pretrained(llama)
    context = "They sat on the river bank and watched the water."
    ids, position = word_position(load_any_model(llama).tokenizer, context, "bank")
    assert ids[0] == bos and ids == theirs(context)["input_ids"]
    assert position == len(theirs(context[:context.index("bank") + 4])["input_ids"]) - 1
    scored = []
    real = distance.token_losses
    monkeypatch.setattr(distance, "token_losses", lambda model, x, y: scored.append(x) or real(model, x, y))
    # the figure an empty file at its path: no assertion here reads it (test_lab_recurrence_distance does)
    monkeypatch.setattr(distance, "save_figure", lambda probe, recall, path, *, length: path.touch())
    (tmp_path / "gap.txt").write_text(TEXT, encoding="utf-8")
    code, out, err = run_main(lab_main, ["distance", "--checkpoint", llama, "--text", tmp_path / "gap.txt",
                                         "--string-length", "4", "--recall-steps", "1", "--pairs", "2",
                                         "--out", tmp_path / "out"], capsys)
    assert code == 0, out + err
    assert scored and all((x[:, 0] == bos).all() for x in scored)
    assert max(x.shape[1] for x in scored) == 64  # the largest d's inputs, <s> among them, fill the context


def test_eval_scores_an_imported_folders_text_after_its_bos_as_transformers_does(tmp_path, capsys):
    import transformers

    reference, bos, _ = llama_with_bos_and_eos(tmp_path / "llama")
    text = "ROMEO: But soft, what light through yonder window breaks?"
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")(text, return_tensors="pt").input_ids
    assert ids[0, 0].item() == bos and ids.size(1) <= 64  # one tail window: scored exactly as below
    with torch.no_grad():
        theirs = reference(ids, labels=ids).loss.item()
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    code, out, err = run_main(eval_cli.main, ["--checkpoint", tmp_path / "llama", "--text-file",
                                              tmp_path / "text.txt", "--no-plot", "--device", "cpu"], capsys)
    assert code == 0, err
    assert f": {ids.size(1)} tokens" in out  # <s> and the text's
    assert "bits per byte       " in out and f"({len(text.encode())} bytes)" in out  # all predicted
    loss = float(next(line for line in out.splitlines() if line.startswith("loss ")).split()[1])
    assert loss == pytest.approx(theirs, abs=1e-4)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT * 20, encoding="utf-8")
    return path


def finetune_config(corpus, tmp_path, init_from, **model) -> Config:
    return Config(model=ModelConfig(context_length=32, **model), data=DataConfig(
        files=[str(corpus)], cache_dir=str(tmp_path / "cache")), train=TrainConfig(
        init_from=str(init_from), batch_size=4, max_steps=20, warmup_steps=2, lr=1e-2, min_lr=1e-3,
        eval_interval=20, eval_windows=4, log_interval=10, sample_tokens=0, precision="fp32",
        device="cpu", peak_flops=1e12, out_dir=str(tmp_path / "runs")))


def test_finetune_from_imported_llama_lowers_loss_and_exports_equal(tmp_path, corpus):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    result = train(finetune_config(corpus, tmp_path, tmp_path / "llama"), run_name="ft", progress=False)
    assert result.step == 20
    before, after = load_any_model(tmp_path / "llama"), load_any_model(result.run_dir)
    assert after.config.tokenizer.kind == "pretrained" and after.tokenizer.to_json() == tokenizer.to_json()
    assert after.config.model.context_length == 32 and after.config.model.n_embd == 48
    tokens = torch.tensor(tokenizer.encode(TEXT * 2))
    loss_before = evaluate_tokens(before.model, tokenizer, tokens, 4, False).loss
    loss_after = evaluate_tokens(after.model, tokenizer, tokens, 4, False).loss
    assert loss_after < loss_before - 0.5
    export_folder(after.model.state_dict(), after.config, after.tokenizer, tmp_path / "again")
    ids = torch.tensor([tokens[:32].tolist()])
    assert max_logit_difference(after.model, hf_model(tmp_path / "again"), ids) < 1e-5


def test_init_from_names_every_conflicting_key(tmp_path, corpus):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    # The dropouts are the fine-tune's own (the main config sets attention_dropout 0, the folder
    # says nothing of it): never a conflict.
    config = finetune_config(corpus, tmp_path, tmp_path / "llama", n_layer=3, n_embd=64, dropout=0.1,
                             attention_dropout=0.0)
    with pytest.raises(ConfigError) as caught:
        train(config, run_name="ft", progress=False)
    message = str(caught.value)
    assert "model.n_layer: config 3, source 2" in message and "model.n_embd: config 64, source 48" in message
    assert "dropout" not in message and "\n" not in message
    assert not (tmp_path / "runs" / "ft").exists()


def test_an_export_into_the_folder_it_reads_is_refused_even_with_force(tmp_path, capsys):
    # --force replaces a folder holding only an export's files: the one being read, too.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    folder = tmp_path / "exported"
    code, _, err = run_main(export_cli.main, ["--checkpoint", save_run(tmp_path, config, model, tokenizer),
                                              "--out", folder], capsys)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, out, err = run_main(export_cli.main, ["--checkpoint", folder, "--out", folder, "--force"], capsys)
    assert code == 2 and out == "" and err == (
        f"error: {folder}: the folder this export reads ({folder}); choose another path to write\n")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_generate_eval_and_attention_take_a_hf_folder(tmp_path, capsys, blank_plots):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    code, out, err = run_main(generate_cli.main, ["--checkpoint", tmp_path / "llama", "--prompt", "ROMEO:",
                                                  "--max-new-tokens", "8", "--temperature", "0",
                                                  "--device", "cpu"], capsys)
    assert code == 0, err
    assert out.startswith("ROMEO:") and f"{tmp_path / 'llama'} (a Hugging Face folder)" in err
    assert "(step 0)" not in err  # a folder records no step
    code, out, err = run_main(export_cli.main, ["--checkpoint", tmp_path / "llama", "--out", tmp_path / "again"],
                              capsys)
    assert code == 0, err
    assert "| training |" not in (tmp_path / "again" / "README.md").read_text()  # no run: no "0 steps"
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    code, out, err = run_main(eval_cli.main, ["--checkpoint", tmp_path / "llama", "--text-file", text,
                                              "--no-plot", "--device", "cpu"], capsys)
    assert code == 0, err
    assert "perplexity" in out and "bits per byte" in out
    code, out, err = run_main(eval_cli.main, ["--checkpoint", tmp_path / "llama", "--split", "validation",
                                              "--no-plot", "--device", "cpu"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--text-file" in err, err
    code, out, err = run_main(attention_cli.main, ["--checkpoint", tmp_path / "llama", "--text", "ROMEO: soft",
                                                   "--layer", "1", "--head", "0", "--out-dir", tmp_path / "maps",
                                                   "--device", "cpu"], capsys)
    assert code == 0, err
    assert [p.name for p in (tmp_path / "maps").iterdir()], out


@pytest.mark.parametrize("main", [generate_cli.main, eval_cli.main, export_cli.main],
                         ids=["generate", "eval", "export"])
def test_a_checkpoint_that_is_not_there_names_a_hugging_face_folder_and_how_to_get_one(
        tmp_path, capsys, monkeypatch, main):
    # A hub id given as transformers takes one was called no checkpoint file or run folder: nothing
    # said that a Hugging Face folder is taken, nor that it is read from a local download.
    monkeypatch.chdir(tmp_path)
    extra = {eval_cli.main: ["--text-file", "t.txt"], export_cli.main: ["--out", "out"]}.get(main, [])
    code, out, err = run_main(main, ["--checkpoint", "HuggingFaceTB/SmolLM2-135M", *extra], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err == ("error: HuggingFaceTB/SmolLM2-135M: no such checkpoint file, run folder or Hugging Face "
                   "folder (a Hugging Face model is read from a local folder: download it first, with its "
                   "config.json, model.safetensors and tokenizer.json)\n")


def test_plots_of_a_hf_folder_go_to_the_current_folder_not_into_the_model_folder(
        tmp_path, capsys, monkeypatch, blank_plots):
    # A Hugging Face folder is a model's own (or the hub's cache): attention's PNGs and eval's plot
    # land beside the command, named after the folder (an export into a folder holding them is refused).
    pytest.importorskip("matplotlib")
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    before = sorted(p.name for p in (tmp_path / "llama").iterdir())
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = run_main(attention_cli.main, ["--checkpoint", tmp_path / "llama", "--text", "ROMEO: soft",
                                                   "--layer", "0", "--device", "cpu"], capsys)
    assert code == 0, err
    assert [p.name for p in (work / "llama_attention").iterdir()] == ["layer_0.png"]
    code, out, err = run_main(eval_cli.main, ["--checkpoint", tmp_path / "llama", "--text-file", text,
                                              "--device", "cpu"], capsys)
    assert code == 0, err
    assert (work / "llama_loss_by_position_text.png").is_file(), out
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == before


def test_checkpoint_dot_inside_a_hf_folder_or_a_run_folder_keeps_the_models_name(
        tmp_path, capsys, monkeypatch, blank_plots):
    # `--checkpoint .` (Path('.').name is ''): attention wrote `_attention/`, eval's plot lost the
    # name in its file and title, an export's model card said it came from `best.pt`.
    import tinyattn.analysis.evaluate as evaluate_module
    import tinyattn.analysis.plotting as plotting_module

    pytest.importorskip("matplotlib")  # attention's heatmaps; eval's plot is caught below
    plots = []
    monkeypatch.setattr(plotting_module, "plotting_available", lambda: True)
    monkeypatch.setattr(evaluate_module, "save_loss_by_position_plot",
                        lambda losses, path, title: plots.append((str(path), title)))
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    monkeypatch.chdir(tmp_path / "llama")
    code, out, err = run_main(attention_cli.main, ["--checkpoint", ".", "--text", "ROMEO: soft", "--layer", "0",
                                                   "--device", "cpu"], capsys)
    assert code == 0 and f"wrote {Path('llama_attention', 'layer_0.png')}" in out, err
    code, out, err = run_main(eval_cli.main, ["--checkpoint", ".", "--text-file", text, "--device", "cpu"], capsys)
    assert code == 0 and "(a Hugging Face folder)" in out, err  # the path as given: '.'
    assert plots.pop() == ("llama_loss_by_position_text.png", f"loss by position: llama, {text}")

    char = tokenizer_of("char")
    config, model = random_model(char, "char", 2)
    monkeypatch.chdir(save_run(tmp_path, config, model, char))
    code, out, err = run_main(eval_cli.main, ["--checkpoint", ".", "--text-file", text, "--device", "cpu"], capsys)
    assert code == 0 and out.startswith("best.pt (step 20) on "), err
    assert plots.pop() == ("loss_by_position_text.png", f"loss by position: run, step 20, {text}")
    code, out, err = run_main(export_cli.main, ["--checkpoint", ".", "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "| exported from | `run/best.pt` |" in (tmp_path / "out" / "README.md").read_text()
    code, out, err = run_main(export_cli.main, ["--checkpoint", tmp_path / "run", "--out", tmp_path / "again"],
                              capsys)
    assert code == 0, err  # a path naming the run's folder is kept as given
    assert f"| exported from | `{tmp_path / 'run' / 'best.pt'}` |" in (tmp_path / "again" / "README.md").read_text()
    monkeypatch.chdir(tmp_path / "llama")
    assert load_any_model(".").name == load_any_model("./").name == "llama"


# ----------------------------------------------------------------------------- refusals


def edit_config(folder, **changes):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def drop_config_keys(folder, *keys):
    """config.json without `keys` (absent, as an older or hand-written file leaves them; not null)."""
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    for key in keys:
        raw.pop(key, None)
    path.write_text(json.dumps(raw))


def edit_tensor(folder, name, tensor):
    from safetensors.torch import load_file, save_file
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = tensor
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def drop_tensor(folder, name):
    from safetensors.torch import load_file, save_file
    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def shard_with_a_missing_file(folder):
    """The folder as two shards listed in model.safetensors.index.json, the second never written."""
    from safetensors.torch import load_file
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    names = list(load_file(folder / "model.safetensors"))
    (folder / "model.safetensors").rename(folder / first)
    weight_map = {name: second if name == "lm_head.weight" else first for name in names}
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def add_stray_tensors(folder, count):
    for i in range(count):
        edit_tensor(folder, f"model.extra.{i}.weight", torch.ones(2))


def index_without_a_weight_map(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))


REFUSALS = {
    # Types and shapes, checked before anything is built or concatenated (issue 23):
    "k-proj-shape": (lambda f: edit_tensor(f, "model.layers.0.self_attn.k_proj.weight", torch.zeros(16, 31)),
                     "weight model.layers.0.self_attn.k_proj.weight has shape 16x31; "
                     "config.json gives 16x48"),
    # A tensor config.json's model needs and the file lacks: named, not a KeyError's traceback.
    "missing-weight": (lambda f: drop_tensor(f, "model.layers.1.mlp.up_proj.weight"),
                       "weight model.layers.1.mlp.up_proj.weight is missing"),
    # A tensor tinyattn has no place for, config.json saying nothing of it: never dropped silently.
    "stray-bias-weight": (lambda f: edit_tensor(f, "model.layers.0.self_attn.q_proj.bias", torch.ones(48)),
                          "weights a Llama model of this config does not have: "
                          "model.layers.0.self_attn.q_proj.bias (biases are not supported)"),
    # Many: the first three named and the rest counted, so the line stays one line.
    "many-stray-weights": (lambda f: add_stray_tensors(f, 5),
                           "weights a Llama model of this config does not have: model.extra.0.weight, "
                           "model.extra.1.weight, model.extra.2.weight and 2 more\n"),
    "rope-scaling-text": (lambda f: edit_config(f, rope_parameters=None, rope_scaling="linear"),
                          "rope_scaling is 'linear'; expected an object or null"),
    "layer-types-number": (lambda f: edit_config(f, layer_types=2),
                           "layer_types is 2; expected a list of strings or null"),
    "huge-vocab": (lambda f: edit_config(f, vocab_size=10**11),
                   "weight model.embed_tokens.weight has shape 300x48; config.json gives 100000000000x48"),
    "vocab-as-text": (lambda f: edit_config(f, vocab_size="300"), "vocab_size is '300'; expected an integer"),
    "vocab-null": (lambda f: edit_config(f, vocab_size=None), "vocab_size is None; expected an integer"),
    # JSON's true is no integer (Python's bool is one): it was read as a context of 1 when unchecked.
    "context-as-bool": (lambda f: edit_config(f, max_position_embeddings=True),
                        "max_position_embeddings is True; expected an integer"),
    "eps-as-bool": (lambda f: edit_config(f, rms_norm_eps=True), "rms_norm_eps is True; expected a number"),
    # Values of the right types that no tinyattn model has: ModelConfig.validate's line, not a traceback.
    "heads-not-dividing-width": (lambda f: (edit_config(f, num_attention_heads=5, num_key_value_heads=5),
                                            drop_config_keys(f, "head_dim")), "which tinyattn cannot build"),
    "no-tokenizer-json": (lambda f: (f / "tokenizer.json").rename(f / "tokenizer.model"),
                          "no tokenizer.json (a tokenizers-library tokenizer); tokenizer.model or vocab "
                          "files alone are not read"),
    "architecture": (lambda f: edit_config(f, architectures=["MistralForCausalLM"]),
                     "architectures ['MistralForCausalLM']"),
    # The architecture is settled first: a foreign folder is named as one, whatever else it lacks.
    "architecture-and-no-tokenizer": (lambda f: (edit_config(f, architectures=["MistralForCausalLM"]),
                                                 (f / "tokenizer.json").unlink()),
                                      "architectures ['MistralForCausalLM']"),
    "two-architectures": (lambda f: edit_config(f, architectures=["LlamaForCausalLM", "MistralForCausalLM"]),
                          "architectures ['LlamaForCausalLM', 'MistralForCausalLM']"),
    "model-type-only": (lambda f: edit_config(f, architectures=None, model_type="mistral"),
                        "no architectures field and model_type 'mistral'"),
    # Not names at all: was a TypeError (unhashable type: 'list') and a traceback.
    "model-type-list": (lambda f: edit_config(f, architectures=None, model_type=["llama"]),
                        "no architectures field and model_type ['llama']"),
    "architecture-nested": (lambda f: edit_config(f, architectures=[["LlamaForCausalLM"]]),
                            "architectures [['LlamaForCausalLM']]"),
    "rope-theta-text": (lambda f: edit_config(f, rope_parameters={"rope_type": "default",
                                                                  "rope_theta": "500"}),
                        "rope_parameters.rope_theta is '500'; expected a number"),
    # rope_scaling's fields are checked as rope_parameters' are: true was read as a RoPE base of 1.
    "rope-scaling-theta-bool": (lambda f: edit_config(f, rope_scaling={"rope_type": "default",
                                                                       "rope_theta": True}),
                                "rope_scaling.rope_theta is True; expected a number"),
    # A tied head's stored copy is ignored, but one of another shape is a broken file, not a copy.
    "tied-lm-head-shape": (lambda f: (edit_config(f, tie_word_embeddings=True),
                                      edit_tensor(f, "lm_head.weight", torch.zeros(300, 47))),
                           "weight lm_head.weight has shape 300x47; config.json gives 300x48"),
    "rope-scaling": (lambda f: edit_config(f, rope_parameters={"rope_type": "llama3", "rope_theta": 500.0,
                                                               "factor": 8.0}), "rope scaling 'llama3'"),
    "rope-scaling-beside-parameters": (lambda f: edit_config(f, rope_scaling={"rope_type": "linear",
                                                                              "factor": 2.0}),
                                       "rope scaling 'linear'"),  # transformers reads rope_scaling first
    # transformers 4's files name the kind "type", not "rope_type": read as the same field.
    "rope-scaling-type-key": (lambda f: edit_config(f, rope_scaling={"type": "linear", "factor": 2.0}),
                              "rope scaling 'linear'"),
    "attention-bias": (lambda f: edit_config(f, attention_bias=True), "attention_bias true"),
    "mlp-bias": (lambda f: edit_config(f, mlp_bias=True), "mlp_bias true"),
    "head-dim": (lambda f: edit_config(f, head_dim=16), "head_dim 16"),
    "activation": (lambda f: edit_config(f, hidden_act="gelu"), "hidden_act 'gelu'"),
    "sliding-window": (lambda f: edit_config(f, use_sliding_window=True), "layers other than full attention"),
    "sliding-layer-types": (lambda f: edit_config(f, layer_types=["sliding_attention", "full_attention"]),
                            "layers other than full attention ('sliding_attention')"),
    "partial-rotary": (lambda f: edit_config(f, partial_rotary_factor=0.5), "partial_rotary_factor"),
    "pickle": (lambda f: ((f / "model.safetensors").rename(f / "pytorch_model.bin")),
               "pytorch_model.bin, a pickle"),
    # JSON, but not an object: was an AttributeError's traceback when its check went.
    "config-json-a-list": (lambda f: (f / "config.json").write_text("[]"),
                           "config.json: expected a JSON object"),
    # A damaged weights file: safetensors' own error (SafetensorError) named in one line.
    "damaged-weights": (lambda f: (f / "model.safetensors").write_bytes(b"not weights"),
                        "model.safetensors: not a readable safetensors file (Error while deserializing "
                        "header"),
    # An index file that lists no shards: was an AttributeError's traceback when its check went.
    "index-without-weight-map": (index_without_a_weight_map,
                                 "model.safetensors.index.json: no weight_map"),
    "missing-shard": (shard_with_a_missing_file, "model-00002-of-00002.safetensors: not found "
                      "(listed in model.safetensors.index.json)"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_unsupported_folder_is_refused_in_one_line(tmp_path, capsys, case):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    change, expected = REFUSALS[case]
    change(tmp_path / "llama")
    code, out, err = run_main(generate_cli.main, ["--checkpoint", tmp_path / "llama", "--prompt", "a",
                                                  "--device", "cpu"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
    assert "Traceback" not in err


def test_export_refuses_soft_capping_which_no_standard_architecture_holds(tmp_path, capsys):
    tokenizer = tokenizer_of("char")
    config, _ = random_model(tokenizer, "char", 4)
    config.model.logit_softcap = 30.0
    run = save_run(tmp_path, config, LanguageModel(config.model), tokenizer)
    code, out, err = run_main(export_cli.main, ["--checkpoint", run, "--out", tmp_path / "out"], capsys)
    assert code == 2 and err.startswith("error: model.logit_softcap: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_the_library_refuses_to_export_a_bidirectional_model_as_a_causal_architecture():
    # The commands refuse it first (`require_causal`); a caller of hf_config gets the same refusal
    # instead of a config.json whose model would read the keys it never saw in training.
    from tinyattn.errors import CheckpointError
    from tinyattn.hf.convert import hf_config

    config, _ = random_model(tokenizer_of("char"), "char", 4)
    config.model.causal = False
    with pytest.raises(CheckpointError, match=r"^model\.causal: false \(a bidirectional model\) cannot be"):
        hf_config(config.model, None, None, torch.float32)


def test_an_undivided_model_from_lab_scaling_is_refused_as_llama_and_qwen3_divide_every_score():
    # model.scale_scores false (tinyattn lab scaling's experiment) leaves q.k undivided: a config.json
    # would give transformers a model whose every score is sqrt(d_k) times smaller than trained.
    from tinyattn.errors import CheckpointError
    from tinyattn.hf.convert import hf_config

    config, _ = random_model(tokenizer_of("char"), "char", 4)
    config.model.scale_scores = False
    with pytest.raises(CheckpointError, match=r"^model\.scale_scores: false \(tinyattn lab scaling's "
                                              r"experiment\) cannot be exported: .* divide every score by "
                                              r"sqrt\(d_k\)$"):
        hf_config(config.model, None, None, torch.float32)


def test_qk_norm_exports_as_qwen3_and_imports_back(tmp_path):
    tokenizer = tokenizer_of("bpe")
    config, model = random_model(tokenizer, "bpe", 2, seed=2, qk_norm=True)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    reference = hf_model(tmp_path / "out")
    assert type(reference).__name__ == "Qwen3ForCausalLM"
    assert "tags: [tinyattn, qwen3]" in (tmp_path / "out" / "README.md").read_text()
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(model, reference, ids) < 1e-5
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.qk_norm and max_logit_difference(loaded.model, reference, ids) < 1e-5


@pytest.mark.parametrize("n_kv_head, tied", [(2, False), (4, True)], ids=["gqa-untied", "mha-tied"])
def test_the_attention_gate_exports_as_qwen3_5_and_imports_back(tmp_path, n_kv_head, tied):
    # Qwen3.5's q_proj holds each head's query rows, then its gate rows; its norms scale by 1 + weight.
    tokenizer = tokenizer_of("bpe")
    config, model = random_model(tokenizer, "bpe", n_kv_head, seed=2, qk_norm=True, attention_gate=True,
                                 tie_embeddings=tied)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    reference = hf_model(tmp_path / "out")
    assert type(reference).__name__ == "Qwen3_5ForCausalLM"
    assert "tags: [tinyattn, qwen3.5]" in (tmp_path / "out" / "README.md").read_text()
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(model, reference, ids) < 1e-5
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.attention_gate and loaded.config.model.qk_norm
    assert loaded.config.model.tie_embeddings is tied
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


def test_a_gate_of_rank_r_exports_as_qwen3_5_with_its_product_and_imports_back_as_a_gate_of_its_own(tmp_path):
    tokenizer = tokenizer_of("bpe")
    config, model = random_model(tokenizer, "bpe", 2, seed=3, qk_norm=True, attention_gate=True,
                                 attention_gate_rank=4)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    reference = hf_model(tmp_path / "out")
    assert type(reference).__name__ == "Qwen3_5ForCausalLM"
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(model, reference, ids) < 1e-5
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.attention_gate and loaded.config.model.attention_gate_rank is None
    gate_rows = loaded.model.blocks[0].attention.qkv.weight[-32:]  # the gate's own (C, C), of rank 4
    assert torch.linalg.matrix_rank(gate_rows) == 4
    assert max_logit_difference(loaded.model, model, ids) < 1e-5


def test_an_attention_gate_without_qk_norm_is_refused_in_one_line_for_transformers_and_gguf():
    from tinyattn.errors import CheckpointError
    from tinyattn.gguf.writer import architecture_of
    from tinyattn.hf.convert import hf_config

    tokenizer = tokenizer_of("char")
    config, _ = random_model(tokenizer, "char", 2, attention_gate=True)
    refused = r"^model\.attention_gate: true without model\.qk_norm cannot be exported: Qwen3_5ForCausalLM"
    with pytest.raises(CheckpointError, match=refused):
        hf_config(config.model, None, None, torch.float32)
    refused_gguf = (r"^model\.attention_gate: true without model\.qk_norm cannot be exported to GGUF: "
                    r"llama\.cpp's qwen35")
    with pytest.raises(CheckpointError, match=refused_gguf) as gguf:
        architecture_of(config.model)
    assert str(gguf.value).endswith("; a run trained with --set model.qk_norm=true as well exports to GGUF")
    config.model.qk_norm = True
    assert architecture_of(config.model) == "qwen35"


QWEN3_5_JSON = {**LLAMA_JSON, "architectures": ["Qwen3_5ForCausalLM"], "head_dim": 8,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                    "partial_rotary_factor": 1.0}}


@pytest.mark.parametrize("interval, expected", [
    (1, None),  # every layer full attention, as layer_types would say
    (2, "layer_types is missing and full_attention_interval is 2: Qwen3.5 then makes"),
    (0, "full_attention_interval is 0; expected a positive integer"),
], ids=["every-layer", "every-second", "zero"])
def test_a_qwen3_5_config_json_without_layer_types_reads_full_attention_interval_as_transformers_does(
        interval, expected):
    import transformers

    from tinyattn.errors import CheckpointError
    from tinyattn.hf.convert import model_config_from_hf

    raw = {**QWEN3_5_JSON, "full_attention_interval": interval}
    if expected is None:
        theirs = transformers.Qwen3_5TextConfig(**{k: v for k, v in raw.items() if k != "architectures"})
        assert theirs.layer_types == ["full_attention"] * 2
        assert model_config_from_hf(raw, "config.json").attention_gate
        return
    with pytest.raises(CheckpointError, match=r"^config\.json: ") as refused:
        model_config_from_hf(raw, "config.json")
    assert expected in str(refused.value)


@pytest.mark.parametrize("architecture, default", [("Qwen3ForCausalLM", 128), ("Qwen3_5ForCausalLM", 256)])
def test_a_config_json_without_head_dim_takes_its_architectures_default_as_transformers_does(
        architecture, default):
    # Qwen3Config's head_dim defaults to 128 and Qwen3_5TextConfig's to 256, not hidden_size / heads
    # (LlamaConfig's): a folder read with hidden_size / heads computed another model than transformers'.
    from tinyattn.errors import CheckpointError
    from tinyattn.hf.convert import model_config_from_hf

    raw = {k: v for k, v in QWEN3_5_JSON.items() if k != "head_dim"}
    raw.update(architectures=[architecture], layer_types=["full_attention"] * 2)
    expected = (rf"^config\.json: head_dim is missing: {architecture} then takes {default}, not "
                "hidden_size / num_attention_heads = 48 / 6")
    with pytest.raises(CheckpointError, match=expected):
        model_config_from_hf(raw, "config.json")
    raw.update(hidden_size=6 * default)
    assert model_config_from_hf(raw, "config.json").head_dim == default


@pytest.mark.parametrize("qk_norm, context", [(False, 2048), (True, 32768)], ids=["llama", "qwen3"])
def test_a_config_json_without_a_context_takes_its_architectures_default_as_transformers_does(tmp_path, qk_norm,
                                                                                            context):
    # LlamaConfig's max_position_embeddings default is 2048, Qwen3Config's 32768.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2, qk_norm=qk_norm)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    drop_config_keys(tmp_path / "out", "max_position_embeddings")
    assert hf_model(tmp_path / "out").config.max_position_embeddings == context
    assert load_any_model(tmp_path / "out").config.model.context_length == context


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_a_config_json_naming_only_its_model_type_is_read_as_that_architecture(tmp_path, qk_norm):
    # Older files give model_type alone: "qwen3" is Qwen3ForCausalLM (QK-norm), "llama" LlamaForCausalLM.
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2, qk_norm=qk_norm)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    edit_config(tmp_path / "out", architectures=None)
    loaded = load_any_model(tmp_path / "out")
    assert loaded.config.model.qk_norm is qk_norm
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, model, ids) < 1e-5


def test_without_safetensors_the_command_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors now fails
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    code, out, err = run_main(export_cli.main, ["--checkpoint", tmp_path, "--out", tmp_path / "out"], capsys)
    # The extra by the package's name, as the plot, gguf and serve extras are named: what a wheel's
    # install takes, and an editable one too (pip -e ".[hf]" reads the folder it is run in)
    assert code == 2 and err.count("\n") == 1 and err.endswith(": pip install 'tinyattn[hf]'\n"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ema", [None, 0.99])
def test_init_from_starts_from_the_source_weights(tmp_path, corpus, ema):
    # With train.ema the saved model is the average: it must start from the source, not the random init.
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    config = finetune_config(corpus, tmp_path, tmp_path / "llama")
    config.train.lr, config.train.min_lr, config.train.max_steps = 1e-7, 1e-8, 2  # barely moves
    config.train.ema = ema
    result = train(config, run_name="ft", progress=False)
    source, tuned = load_any_model(tmp_path / "llama").model, load_any_model(result.run_dir).model
    for (name, before), after in zip(source.state_dict().items(), tuned.state_dict().values()):
        assert (after - before).abs().max().item() < 1e-5, name


def test_finetune_example_config_trains_from_a_folder(tmp_path, corpus):
    from tinyattn.config import load_config

    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    example = ROOT / "configs" / "finetune_example.yaml"
    items = [f"train.init_from={tmp_path / 'llama'}", f"data.files={corpus}", "data.url=null", "data.sha256=null",
             f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path / 'runs'}", "train.time_budget=null",
             "train.max_steps=2", "train.eval_interval=2", "train.eval_windows=2", "train.peak_flops=1e12",
             "train.sample_tokens=0", "train.device=cpu", "train.precision=fp32"]
    # As `tinyattn train --config` runs it: the keys the file and --set give are the ones compared.
    result = train(load_config(example, items), config_path=example, overrides=items, run_name="example",
                   progress=False)
    saved = load_any_model(result.run_dir).config
    assert result.step == 2 and saved.model.n_embd == 48 and saved.model.context_length == 128
    assert saved.tokenizer.path == str(tmp_path / "llama" / "tokenizer.json")


def test_a_finetune_resumes_without_its_source_weights(tmp_path, corpus):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    first = train(finetune_config(corpus, tmp_path, tmp_path / "llama"), run_name="ft", progress=False,
                  stop_at_step=10)
    assert first.step == 10
    for name in ("model.safetensors", "config.json"):
        (tmp_path / "llama" / name).unlink()  # only the tokenizer.json is still read (tokenizer.path)
    result = train(finetune_config(corpus, tmp_path, tmp_path / "llama"), run_name="ft", progress=False,
                   resume=True)
    assert result.step == 20 and load_any_model(result.run_dir).config.model.n_embd == 48


def test_a_resume_or_fork_refuses_another_init_from_naming_both_before_anything_is_written(tmp_path, corpus,
                                                                                           capsys):
    # A resume reads no source: another train.init_from would only be recorded, in config.yaml and
    # an export's model card, as a source the weights never came from.
    from tinyattn.cli import train as train_cli
    from tinyattn.config import load_config

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    train(finetune_config(corpus, tmp_path, tmp_path / "llama"), run_name="ft", progress=False, stop_at_step=4)
    runs, ft, other = tmp_path / "runs", tmp_path / "runs" / "ft", tmp_path / "qwen3_tied"
    before = {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()}
    for fork in (["--run-name", "fork_q"], []):
        code, out, err = run_main(train_cli.main, ["--resume", ft, *fork, "--no-progress", "--set",
                                                   "train.max_steps=6", f"train.init_from={other}"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert f"train.init_from: checkpoint '{tmp_path / 'llama'}', config '{other}' (--set)" in err
        assert f"fine-tune from {other} in a new run" in err
        assert {p: p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()} == before  # no fork_q/
    text = (ft / "config.yaml").read_text(encoding="utf-8")
    edited = text.replace(f"init_from: {tmp_path / 'llama'}\n", f"init_from: {other}\n")
    assert edited != text
    (ft / "config.yaml").write_text(edited, encoding="utf-8")
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress"], capsys)
    assert code == 2 and "config.yaml: train.init_from was edited" in err and str(other) in err, err
    (ft / "config.yaml").write_text(text, encoding="utf-8")
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--run-name", "fork_l", "--no-progress", "--set",
                                               "train.max_steps=6", f"train.init_from={tmp_path / 'llama'}"], capsys)
    assert code == 0, err  # the same value is no change
    assert load_config(runs / "fork_l" / "config.yaml").train.init_from == str(tmp_path / "llama")
    scratch = save_run(tmp_path, *random_model(tokenizer_of("char"), "char", 2), tokenizer_of("char"))
    code, out, err = run_main(train_cli.main, ["--resume", scratch / "best.pt", "--run-name", "fork_s",
                                               "--no-progress", "--set", f"train.init_from={other}"], capsys)
    assert code == 2 and f"train.init_from: checkpoint None, config '{other}' (--set)" in err, err
    assert not (tmp_path / "runs" / "fork_s").exists()


@pytest.mark.parametrize("change", ["ids-swapped", "without-eos"])
def test_a_finetune_whose_source_tokenizer_changed_names_the_file_and_the_runs_copy_to_resume_with(
        tmp_path, corpus, capsys, change):
    # The source folder downloaded again: its tokenizer.json, which a resume reads while it is there,
    # now has two ids swapped, or is another tokenizer without the run's </s>. Refused before any
    # data is read, naming the file, not blaming the settings or the data; the run's copy resumes.
    from tinyattn.cli import train as train_cli

    llama_with_bos_and_eos(tmp_path / "llama")
    train(finetune_config(corpus, tmp_path, tmp_path / "llama"), run_name="ft", progress=False, stop_at_step=4)
    source, ft = tmp_path / "llama" / "tokenizer.json", tmp_path / "runs" / "ft"
    if change == "ids-swapped":
        spec = json.loads(source.read_text(encoding="utf-8"))
        vocab = spec["model"]["vocab"]
        first, second = sorted(vocab, key=vocab.get)[10:12]
        vocab[first], vocab[second] = vocab[second], vocab[first]
        source.write_text(json.dumps(spec), encoding="utf-8")
        what = f"2 tokens have other ids ({first!r}, {second!r})"
    else:
        tokenizer_of("bpe").save(source)
        what = "it lacks 2 tokens of the run's ('</s>', '<s>')"
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress", "--set", "train.max_steps=6"],
                              capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"tokenizer.path {source} changed since the run started: " in err
    assert f"changed since the run started: {what}; token ids would no longer mean" in err
    assert err.rstrip().endswith(f"Resume with the run's own copy: --set tokenizer.path={ft / 'tokenizer.json'}")
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before  # no cache built
    other = tmp_path / "other.json"
    other.write_bytes(source.read_bytes())  # a file given for the resume: named as not the run's
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress", "--set", f"tokenizer.path={other}"],
                              capsys)
    assert code == 2 and f"tokenizer.path {other} is not the tokenizer the run started with (from {source}): " \
        f"{what};" in err, err
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress", "--set", "train.max_steps=6",
                                               f"tokenizer.path={ft / 'tokenizer.json'}"], capsys)
    assert code == 0 and "step 6:" in err, err
    # The run's own copy changed too, where the run now reads it: no copy left to advise
    (ft / "tokenizer.json").write_bytes(source.read_bytes())
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress", "--set", "train.max_steps=8"],
                              capsys)
    copy = ft / "tokenizer.json"
    assert code == 2 and f"tokenizer.path {copy} changed since the run started: {what};" in err
    assert err.rstrip().endswith("Restore the file the run started with, or start a new run"), err


@pytest.mark.parametrize("moved", [False, True], ids=["plain", "tokenizer-path-given"])
def test_a_finetune_resumes_exactly_after_its_source_and_token_cache_are_gone(tmp_path, corpus, capsys,
                                                                              moved):
    # The source (a lone checkpoint: its tokenizer is copied under data.cache_dir) and that copy are gone;
    # the run folder's tokenizer.json is the run's, or one given with --set tokenizer.path.
    import shutil

    from tinyattn.cli import train as train_cli
    from tinyattn.config import load_config

    tokenizer = tokenizer_of("char")
    run = save_run(tmp_path, *random_model(tokenizer, "char", 2), tokenizer)
    whole = train(finetune_config(corpus, tmp_path, run), run_name="whole", progress=False)
    train(finetune_config(corpus, tmp_path, run), run_name="ft", progress=False, stop_at_step=10)
    shutil.rmtree(run)
    shutil.rmtree(tmp_path / "cache")
    ft = tmp_path / "runs" / "ft"
    given = []
    if moved:
        shutil.copy(ft / "tokenizer.json", tmp_path / "moved.json")
        given = ["--set", f"tokenizer.path={tmp_path / 'moved.json'}"]
    code, out, err = run_main(train_cli.main, ["--resume", ft, "--no-progress", *given], capsys)
    assert code == 0, err
    expected = tmp_path / "moved.json" if moved else ft / "tokenizer.json"
    assert load_config(ft / "config.yaml").tokenizer.path == str(expected)
    resumed, uninterrupted = (ckpt.load_checkpoint(folder / "step_0000020.pt")["model"]
                              for folder in (ft, whole.run_dir))
    for name, weights in uninterrupted.items():  # within 1e-6: see test_train's resume test
        torch.testing.assert_close(resumed[name], weights, rtol=0, atol=1e-6, msg=name)


def test_init_from_names_the_tokenizer_key_the_config_sets_otherwise(tmp_path, corpus):
    from tinyattn.train.finetune import init_source

    tokenizer = tokenizer_of("char")
    run = save_run(tmp_path, *random_model(tokenizer, "char", 2), tokenizer)
    tokenizer.save(tmp_path / "other.json")
    config = finetune_config(corpus, tmp_path, run)
    config.tokenizer = TokenizerConfig(kind="pretrained", path=str(tmp_path / "other.json"))
    with pytest.raises(ConfigError) as caught:
        init_source(config)
    message = str(caught.value)
    assert f"tokenizer.path: config '{tmp_path / 'other.json'}', source " in message
    assert "tokenizer.kind" not in message


def test_init_from_a_char_run_takes_a_config_that_writes_its_char_or_its_pretrained_form(tmp_path, corpus):
    # The run trained with kind char; the fine-tune reads its tokenizer.json as a pretrained one.
    # A config may write either (the shipped configs write kind char), never another tokenizer.
    from tinyattn.train.finetune import init_source

    tokenizer = tokenizer_of("char")
    run = save_run(tmp_path, *random_model(tokenizer, "char", 2), tokenizer)
    (run / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")
    pretrained = TokenizerConfig(kind="pretrained", path=str(run / "tokenizer.json"))
    for given, written in ((TokenizerConfig(kind="char"), {"tokenizer.kind"}),
                           (pretrained, {"tokenizer.kind", "tokenizer.path"})):
        config = finetune_config(corpus, tmp_path, run)
        config.tokenizer = given
        init_source(config, written)
        assert config.tokenizer == pretrained
    config = finetune_config(corpus, tmp_path, run)
    config.tokenizer = TokenizerConfig(kind="bpe")
    with pytest.raises(ConfigError, match="tokenizer.kind: config 'bpe', source 'char'"):
        init_source(config, written={"tokenizer.kind"})


def test_init_from_a_tinyattn_run_takes_its_weights_and_tokenizer(tmp_path, corpus):
    """From a run folder: its best.pt's weights (as generate and eval read it), not a later step's."""
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)  # best.pt: the tokenizer is inside it
    later = random_model(tokenizer, "char", 2, seed=1)[1]
    ckpt.save_checkpoint({**ckpt.load_checkpoint(run / ckpt.BEST), "model": later.state_dict(), "step": 30},
                         run / ckpt.step_filename(30))
    tuned_config = finetune_config(corpus, tmp_path, run)
    tuned_config.train.lr, tuned_config.train.min_lr, tuned_config.train.max_steps = 1e-7, 1e-8, 2
    result = train(tuned_config, run_name="ft", progress=False)
    tuned = load_any_model(result.run_dir)
    assert tuned.tokenizer.to_json() == tokenizer.to_json() and tuned.config.tokenizer.kind == "pretrained"
    assert tuned.config.model.n_kv_head == 2 and tuned.config.model.context_length == 32
    for (name, before), after in zip(model.state_dict().items(), tuned.model.state_dict().values()):
        assert (after - before).abs().max().item() < 1e-5, name


def exported_char_folder(tmp_path):
    """A tied char model exported by tinyattn (no transformers needed): the folder, model, tokenizer."""
    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    return tmp_path / "out", model, tokenizer


@pytest.mark.parametrize("values,expected", [
    ({"do_sample": True, "top_p": 1.5}, "gives top_p=1.5: expected a number in (0, 1]"),
    ({"repetition_penalty": -1.0}, "gives repetition_penalty=-1.0: expected a positive number"),
    # JSON's true is no number (Python's bool is one): it was read as a temperature of 1 unchecked.
    ({"do_sample": True, "temperature": True}, "gives temperature=True: expected a number or null"),
], ids=["top-p", "repetition-penalty", "temperature-true"])
def test_a_generation_config_value_no_sampler_takes_is_refused_in_one_line_naming_it(tmp_path, values,
                                                                                     expected):
    from tinyattn.errors import CheckpointError

    folder, _, _ = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps(values))
    with pytest.raises(CheckpointError) as refused:
        load_any_model(folder)
    assert str(refused.value).startswith(f"{folder / 'generation_config.json'}: {expected}")


def test_a_generation_configs_repetition_penalty_is_imported(tmp_path):
    folder, _, _ = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.3}))
    assert load_any_model(folder).config.sample.repetition_penalty == 1.3
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True,
                                                               "repetition_penalty": 1.15}))
    assert load_any_model(folder).config.sample.repetition_penalty == 1.15


def test_sampling_without_a_top_k_key_takes_transformers_default_of_50(tmp_path):
    folder, _, _ = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.8}))
    sample = load_any_model(folder).config.sample
    assert (sample.temperature, sample.top_k, sample.top_p) == (0.8, 50, 1.0)


def test_a_generation_config_without_do_sample_is_greedy_and_do_sample_alone_samples_at_temperature_1(
        tmp_path):
    # transformers' generate() ignores temperature and top_k unless do_sample; its temperature defaults to 1.
    folder, _, _ = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_k": 20}))
    assert load_any_model(folder).config.sample.temperature == 0.0
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True}))
    sample = load_any_model(folder).config.sample
    assert (sample.temperature, sample.top_k, sample.top_p) == (1.0, 50, 1.0)


@pytest.mark.parametrize("temperature,top_k", [(0.0, 20), (0.8, None)], ids=["greedy", "top-k-off"])
def test_greedy_and_top_k_off_export_as_transformers_reads_them_and_import_back(tmp_path, temperature, top_k):
    # Greedy goes out as do_sample false; top-k off as top_k 0, since transformers (and tinyattn's
    # import) read a missing or null top_k as 50.
    import transformers

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.sample.temperature, config.sample.top_k = temperature, top_k
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    theirs = transformers.GenerationConfig.from_pretrained(tmp_path / "out")
    sample = load_any_model(tmp_path / "out").config.sample
    if temperature == 0:
        assert theirs.do_sample is False and sample.temperature == 0.0
    else:
        assert (theirs.do_sample, theirs.temperature, theirs.top_k) == (True, 0.8, 0)
        assert (sample.temperature, sample.top_k) == (0.8, None)


def test_a_run_whose_max_new_tokens_is_0_exports_a_folder_transformers_loads(tmp_path):
    # sample.max_new_tokens: 0 (accepted: generate nothing) went out as "max_new_tokens": 0, which
    # transformers' GenerationConfig refuses: from_pretrained of the folder raised a ValueError.
    import transformers

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    config.sample.max_new_tokens = 0
    export_folder(model.state_dict(), config, tokenizer, tmp_path / "out")
    theirs = transformers.GenerationConfig.from_pretrained(tmp_path / "out")
    assert theirs.max_new_tokens is None and (theirs.do_sample, theirs.top_k) == (True, 20)


def test_generation_configs_eos_token_wins_over_config_jsons_and_config_jsons_is_the_fallback(tmp_path):
    # transformers' generate() stops at generation_config.json's eos_token_id when the file gives one.
    folder, _, tokenizer = exported_char_folder(tmp_path)
    edit_config(folder, eos_token_id=5)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    loaded = load_any_model(folder)
    assert loaded.tokenizer.eot_id == 7 and loaded.config.tokenizer.end_of_text == tokenizer.token(7)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    loaded = load_any_model(folder)
    assert loaded.tokenizer.eot_id == 5 and loaded.config.tokenizer.end_of_text == tokenizer.token(5)


def test_of_a_list_of_eos_token_ids_the_first_ends_texts_and_each_stops_generation(tmp_path):
    from tinyattn.errors import CheckpointError

    folder, _, tokenizer = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 5]}))
    loaded = load_any_model(folder)
    assert loaded.tokenizer.eot_id == 7 and loaded.config.tokenizer.end_of_text == tokenizer.token(7)
    assert loaded.tokenizer.stop_ids == {7, 5}
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 10**6]}))
    with pytest.raises(CheckpointError, match=r"eos_token_id \[7, 1000000\] holds 1000000, which is not a "
                                              r"token id of its tokenizer\.json \(0 to "):
        load_any_model(folder)


def test_an_export_of_a_folder_with_a_list_of_eos_ids_writes_the_list_back(tmp_path):
    # Generation from the folder stops at each id of the list: so must generation from its export,
    # in transformers (generation_config.json) and imported again; the first still ends texts.
    folder, _, tokenizer = exported_char_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9, 5]}))
    loaded = load_any_model(folder)
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "again")
    written = {name: json.loads((tmp_path / "again" / name).read_text())["eos_token_id"]
               for name in ("generation_config.json", "config.json")}
    assert written == {"generation_config.json": [7, 5, 9], "config.json": 7}
    again = load_any_model(tmp_path / "again")
    assert again.tokenizer.stop_ids == {7, 9, 5} and again.tokenizer.eot_id == 7
    import transformers

    assert transformers.GenerationConfig.from_pretrained(tmp_path / "again").eos_token_id == [7, 5, 9]


def test_generation_stops_at_any_eos_id_of_a_list_as_transformers_generate_does(tmp_path):
    # Qwen3's generation_config.json names <|im_end|> and <|endoftext|>: transformers stops at either,
    # tinyattn went on past the second (it stopped at the list's first alone).
    import transformers

    reference, bos, eos = llama_with_bos_and_eos(tmp_path / "llama")
    ids = encode_prompt(load_any_model(tmp_path / "llama").tokenizer, "ROMEO: But", 64)
    free = transformers.GenerationConfig(max_new_tokens=30, do_sample=False, eos_token_id=None,
                                         bos_token_id=bos, pad_token_id=eos)
    ran = reference.generate(torch.tensor([ids]), generation_config=free,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    at = next(i for i in range(5, len(ran)) if ran[i] not in ran[:i] and ran[i] != eos)  # a token met once
    generation = json.loads((tmp_path / "llama" / "generation_config.json").read_text())
    generation["eos_token_id"] = [eos, ran[at]]
    (tmp_path / "llama" / "generation_config.json").write_text(json.dumps(generation))
    theirs = reference.generate(torch.tensor([ids]), generation_config=transformers.GenerationConfig(
        max_new_tokens=30, do_sample=False, eos_token_id=[eos, ran[at]], bos_token_id=bos, pad_token_id=eos),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    assert theirs == ran[:at + 1]  # transformers stops at the list's second id
    loaded = load_any_model(tmp_path / "llama")
    text = "".join(generate(loaded.model, loaded.tokenizer, "ROMEO: But", max_new_tokens=30, temperature=0))
    assert text == loaded.tokenizer.decode(ran[:at])  # the text before it, as at the first id


def test_a_finetune_of_a_folder_with_two_eos_ids_stops_at_the_second_resumed_loaded_and_exported(
        tmp_path, corpus):
    # A fine-tune of a Qwen3 folder (eos_token_id [<|im_end|>, <|endoftext|>]) kept the first alone: it
    # generated on past the second, and its export wrote the first alone.
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer, eos=5)
    prompt = "ROMEO: But"

    def finetune(name, eos_ids):
        (tmp_path / "llama" / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
        for stop_at_step, resume in ((1, None), (None, True)):  # a resume keeps them too
            config = finetune_config(corpus, tmp_path, tmp_path / "llama")
            config.train.max_steps = config.train.eval_interval = 2
            config.train.warmup_steps = 1
            run = train(config, run_name=name, progress=False, stop_at_step=stop_at_step, resume=resume)
        return load_any_model(run.run_dir)

    first = finetune("first", [5])  # the same weights: the stop tokens change no training step
    ids = encode_prompt(first.tokenizer, prompt, 32)
    ran = [int(t) for t in generate_tokens(first.model, torch.tensor([ids]), 30, temperature=0.0)]
    at = next(i for i in range(3, len(ran)) if ran[i] not in ran[:i] and ran[i] != 5)  # a token met once
    loaded = finetune("ft", [5, ran[at]])
    assert loaded.tokenizer.stop_ids == {5, ran[at]} and loaded.tokenizer.eot_id == 5
    text = "".join(generate(loaded.model, loaded.tokenizer, prompt, max_new_tokens=30, temperature=0))
    assert text == loaded.tokenizer.decode(ran[:at])  # stopped at the second id, as at the first
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"]
    assert written == [5, ran[at]]


def test_a_tied_folder_that_also_stores_lm_head_imports_as_tied_as_its_config_json_says(tmp_path):
    # Some tools write the tied head's copy too; config.json's tie_word_embeddings true decides.
    folder, model, tokenizer = exported_char_folder(tmp_path)
    from safetensors.torch import load_file
    embedding = load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    edit_tensor(folder, "lm_head.weight", embedding.clone())
    loaded = load_any_model(folder)
    assert loaded.config.model.tie_embeddings is True
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    with torch.no_grad():
        assert (loaded.model(ids).logits - model(ids).logits).abs().max().item() < 1e-5


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_a_tied_folder_whose_lm_head_differs_from_its_embedding_loads_untied_as_transformers_does(
        tmp_path, capsys, qk_norm):
    # transformers 5 warns "both are present ... with different values, so we will NOT tie them";
    # tinyattn used the embedding as the head, logits off by tens.
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)  # untied: its lm_head differs from its embedding
    edit_config(tmp_path / "llama", tie_word_embeddings=True)
    if qk_norm:
        edit_config(tmp_path / "llama", architectures=["Qwen3ForCausalLM"], model_type="qwen3")
        for layer in range(2):
            for name in ("q_norm", "k_norm"):
                edit_tensor(tmp_path / "llama", f"model.layers.{layer}.self_attn.{name}.weight",
                            1 + 0.2 * torch.randn(8))
    reference = hf_model(tmp_path / "llama")
    capsys.readouterr()
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.model.tie_embeddings is False
    assert capsys.readouterr().err == (
        f"note: {tmp_path / 'llama' / 'config.json'}: tie_word_embeddings is true, but the weights hold an "
        "lm_head.weight that differs from the embedding; it is loaded untied, as transformers loads it\n")
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["tie_word_embeddings"] is False
    assert max_logit_difference(hf_model(tmp_path / "again"), reference, ids) < 1e-5


def test_a_tied_folders_head_stored_in_another_dtype_is_compared_as_transformers_loads_it(tmp_path, capsys):
    # The embedding in float32, the head its bf16 copy: equal after casting the embedding down, not in
    # float32, the dtype config.json names and transformers loads; it leaves them untied (logits 0.008 off).
    from safetensors.torch import load_file

    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    embedding = load_file(tmp_path / "llama" / "model.safetensors")["model.embed_tokens.weight"]
    edit_tensor(tmp_path / "llama", "lm_head.weight", embedding.to(torch.bfloat16))
    edit_config(tmp_path / "llama", tie_word_embeddings=True, dtype="float32")
    reference = hf_model(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.model.tie_embeddings is False
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])  # torch_dtype: transformers 4's name
def test_a_tied_folders_bf16_head_copy_stays_tied_where_config_json_says_bfloat16(tmp_path, capsys, key):
    # transformers loads both in bfloat16, where the copy equals the embedding, and ties them.
    from safetensors.torch import load_file

    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    embedding = load_file(tmp_path / "llama" / "model.safetensors")["model.embed_tokens.weight"]
    assert not torch.equal(embedding.to(torch.bfloat16).float(), embedding)  # float32 would tell them apart
    edit_tensor(tmp_path / "llama", "lm_head.weight", embedding.to(torch.bfloat16))
    drop_config_keys(tmp_path / "llama", "dtype", "torch_dtype")
    edit_config(tmp_path / "llama", tie_word_embeddings=True, **{key: "bfloat16"})
    capsys.readouterr()
    assert load_any_model(tmp_path / "llama").config.model.tie_embeddings is True
    assert capsys.readouterr().err == ""


def test_a_tied_folder_naming_no_dtype_compares_its_head_in_float32_as_transformers_loads_it(tmp_path):
    # Every tensor float32 and config.json naming no dtype: transformers loads float32, where a head
    # equal to the embedding only after rounding to bfloat16 differs from it, and leaves them untied.
    from safetensors.torch import load_file

    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer)
    embedding = load_file(tmp_path / "llama" / "model.safetensors")["model.embed_tokens.weight"]
    edit_tensor(tmp_path / "llama", "lm_head.weight", embedding.to(torch.bfloat16).float())
    edit_config(tmp_path / "llama", tie_word_embeddings=True)
    drop_config_keys(tmp_path / "llama", "dtype", "torch_dtype")
    reference = hf_model(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.model.tie_embeddings is False
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


def test_a_folder_is_loaded_ready_for_inference_in_eval_mode(tmp_path):
    folder, _, _ = exported_char_folder(tmp_path)
    assert load_any_model(folder).model.training is False


def test_a_rotary_inv_freq_tensor_in_the_weights_is_ignored_not_refused(tmp_path):
    # Older transformers saved each layer's RoPE frequencies as a buffer; tinyattn computes its own.
    folder, model, tokenizer = exported_char_folder(tmp_path)
    edit_tensor(folder, "model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones(4))
    loaded = load_any_model(folder)
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    with torch.no_grad():
        assert (loaded.model(ids).logits - model(ids).logits).abs().max().item() < 1e-5


def test_init_from_with_context_length_left_unset_takes_the_sources(tmp_path, corpus):
    from tinyattn.train.finetune import init_source

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)  # context_length 64
    run = save_run(tmp_path, config, model, tokenizer)
    tuned = finetune_config(corpus, tmp_path, run)
    tuned.model.context_length = ModelConfig().context_length  # left at the default
    assert ModelConfig().context_length != 64
    init_source(tuned)
    assert tuned.model.context_length == 64


def test_init_from_a_run_whose_tokenizer_json_differs_from_its_checkpoints_uses_the_checkpoints(
        tmp_path, corpus):
    from tinyattn.train.finetune import init_source

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)
    run = save_run(tmp_path, config, model, tokenizer)
    (run / "tokenizer.json").write_text(tokenizer_of("bpe").to_json(), encoding="utf-8")  # not best.pt's
    tuned = finetune_config(corpus, tmp_path, run)
    init_source(tuned)
    assert Path(tuned.tokenizer.path) != run / "tokenizer.json"
    assert Path(tuned.tokenizer.path).read_text(encoding="utf-8") == tokenizer.to_json()
    (run / "tokenizer.json").write_text(tokenizer.to_json(), encoding="utf-8")  # the same: used as it is
    tuned = finetune_config(corpus, tmp_path, run)
    init_source(tuned)
    assert Path(tuned.tokenizer.path) == run / "tokenizer.json"


def test_init_from_names_a_tie_embeddings_conflict(tmp_path, corpus):
    from tinyattn.train.finetune import init_source

    tokenizer = tokenizer_of("char")
    config, model = random_model(tokenizer, "char", 2)  # tied
    run = save_run(tmp_path, config, model, tokenizer)
    with pytest.raises(ConfigError) as caught:
        init_source(finetune_config(corpus, tmp_path, run, tie_embeddings=False))
    assert "model.tie_embeddings: config False, source True" in str(caught.value)


def test_sharded_folder_imports_with_equal_logits(tmp_path):
    tokenizer = tokenizer_of("bpe")
    reference = random_llama(tmp_path / "llama", tokenizer)
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    tokenizer.save(tmp_path / "sharded" / "tokenizer.json")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    loaded = load_any_model(tmp_path / "sharded")
    ids = torch.tensor([tokenizer.encode(TEXT)[:64]])
    assert max_logit_difference(loaded.model, reference, ids) < 1e-5


def test_a_missing_init_from_is_one_line_naming_the_key(tmp_path, corpus, capsys):
    from tinyattn.cli import train as train_cli

    code, out, err = run_main(train_cli.main, [
        "--config", ROOT / "configs" / "finetune_example.yaml", "--no-progress", "--set",
        f"train.init_from={tmp_path / 'nowhere'}", f"data.files={corpus}", "data.url=null",
        "data.sha256=null", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.startswith("error: train.init_from: ") and "nowhere" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs").exists()


def vocab_commands(tmp_path, corpus):
    """generate, eval and train (train.init_from) on the folder tmp_path / "llama", as argv."""
    from tinyattn.cli import train as train_cli

    folder = tmp_path / "llama"
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    return {
        "generate": (generate_cli.main, ["--checkpoint", folder, "--prompt", "ROMEO: But soft",
                                         "--max-new-tokens", "5", "--device", "cpu"]),
        "eval": (eval_cli.main, ["--checkpoint", folder, "--text-file", tmp_path / "text.txt", "--no-plot",
                                 "--device", "cpu"]),
        "train": (train_cli.main, [
            "--config", ROOT / "configs" / "finetune_example.yaml", "--no-progress", "--set",
            f"train.init_from={folder}", f"data.files={corpus}", "data.url=null", "data.sha256=null",
            f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path / 'runs'}",
            "train.time_budget=null", "train.max_steps=2", "train.eval_interval=2", "train.eval_windows=2",
            "train.peak_flops=1e12", "train.sample_tokens=0", "train.show=[]", "train.device=cpu",
            "train.precision=fp32"]),
    }


@pytest.mark.parametrize("command", ["generate", "eval", "train"])
def test_a_folder_whose_vocab_size_is_below_its_tokenizers_is_refused_in_one_line_naming_config_json(
        tmp_path, corpus, capsys, command):
    # Was an IndexError traceback from the embedding at generate's prefill, and for train.init_from
    # "model.vocab_size=... leave it unset", a key the user never set: config.json gave it.
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer, vocab_size=tokenizer.vocab_size - 20)
    main, argv = vocab_commands(tmp_path, corpus)[command]
    code, out, err = run_main(main, argv, capsys)
    expected = (f"{tmp_path / 'llama' / 'config.json'}: vocab_size {tokenizer.vocab_size - 20} is smaller "
                f"than its tokenizer.json's {tokenizer.vocab_size} tokens; a model cannot read tokens it "
                "has no embedding for")
    prefix = "train.init_from: " if command == "train" else ""
    assert (code, out, err) == (2, "", f"error: {prefix}{expected}\n")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["generate", "eval", "train"])
def test_a_folder_whose_vocab_size_is_padded_above_its_tokenizers_is_used(tmp_path, corpus, capsys, command):
    tokenizer = tokenizer_of("bpe")
    random_llama(tmp_path / "llama", tokenizer, vocab_size=tokenizer.vocab_size + 20)
    main, argv = vocab_commands(tmp_path, corpus)[command]
    code, out, err = run_main(main, argv, capsys)
    assert code == 0, err
    if command == "train":
        assert load_any_model(out_dir=tmp_path / "runs").config.model.vocab_size == tokenizer.vocab_size + 20


# A key the config gives (in its file, a file it extends, or with --set) is compared with the source
# even where it holds tinyattn's default: "given" is what the user wrote, not what differs from
# ModelConfig(). The folder random_llama writes has 2 layers, an untied head, RoPE base 500 and
# context 64; ModelConfig's defaults are 4 layers, tied, 10000 and 256.


def finetune_yaml(tmp_path, corpus, **sections) -> Path:
    """A fine-tune's config file for the command line (`sections` merged in: {"model": {...}})."""
    import yaml

    raw = {"data": {"files": str(corpus), "cache_dir": str(tmp_path / "cache")},
           "train": {"init_from": str(tmp_path / "llama"), "batch_size": 2, "max_steps": 2, "warmup_steps": 1,
                     "eval_interval": 2, "eval_windows": 2, "sample_tokens": 0, "precision": "fp32",
                     "device": "cpu", "peak_flops": 1e12, "out_dir": str(tmp_path / "runs")}}
    for name, keys in sections.items():
        raw.setdefault(name, {}).update(keys)
    path = tmp_path / "ft.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_init_from_keeps_a_given_context_length_that_equals_the_default(tmp_path, corpus, capsys):
    from tinyattn.cli import train as train_cli
    from tinyattn.config import load_config

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))  # context 64
    assert ModelConfig().context_length == 256
    code, out, err = run_main(train_cli.main, ["--config", finetune_yaml(tmp_path, corpus), "--no-progress",
                                               "--run-name", "ft", "--set", "train.max_steps=1",
                                               "model.context_length=256"], capsys)
    assert code == 0, err
    saved = load_config(tmp_path / "runs" / "ft" / "config.yaml").model
    assert (saved.context_length, saved.n_layer) == (256, 2)


@pytest.mark.parametrize("item,expected", [
    ("model.n_layer=4", "model.n_layer: config 4, source 2"),
    ("model.tie_embeddings=true", "model.tie_embeddings: config True, source False"),
    ("model.rope_base=10000", "model.rope_base: config 10000.0, source 500.0"),
], ids=["n_layer", "tie_embeddings", "rope_base"])
def test_init_from_refuses_a_given_model_key_that_equals_the_default(tmp_path, corpus, capsys, item, expected):
    from tinyattn.cli import train as train_cli

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    code, out, err = run_main(train_cli.main, ["--config", finetune_yaml(tmp_path, corpus), "--no-progress",
                                               "--run-name", "ft", "--set", item], capsys)
    assert code == 2 and err.startswith("error: train.init_from ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs" / "ft").exists()


def test_init_from_refuses_a_model_key_a_parent_config_gives(tmp_path, corpus, capsys):
    # Given in the file the config extends, at the default: given all the same.
    from tinyattn.cli import train as train_cli

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    (tmp_path / "parent.yaml").write_text("model:\n  n_layer: 4\n", encoding="utf-8")
    child = finetune_yaml(tmp_path, corpus)
    child.write_text("extends: parent.yaml\n" + child.read_text(encoding="utf-8"), encoding="utf-8")
    code, out, err = run_main(train_cli.main, ["--config", child, "--no-progress", "--run-name", "ft"], capsys)
    assert code == 2 and "model.n_layer: config 4, source 2" in err, err


@pytest.mark.parametrize("key,value,expected", [
    ("rope_base", 10000.0, "model.rope_base: config 10000.0, source 500.0"),  # was trained on another RoPE
    ("n_layer", 3, "model.n_layer: config 3, source 2"),  # was 'weights do not fit ... another version?'
], ids=["rope_base", "n_layer"])
def test_init_from_refuses_a_model_key_the_configs_by_precision_gives(tmp_path, corpus, capsys, key, value,
                                                                       expected):
    # by_precision is applied to the config the source's model was adopted into: its keys are given too.
    from tinyattn.cli import train as train_cli

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    config = finetune_yaml(tmp_path, corpus, by_precision={"fp32": {"model": {key: value}}})
    argv = ["--config", config, "--no-progress", "--run-name", "ft"]
    code, out, err = run_main(train_cli.main, argv, capsys)
    assert code == 2 and err.startswith("error: train.init_from ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs" / "ft").exists()


def test_a_fork_of_a_finetune_refuses_a_given_model_key_that_equals_the_default(tmp_path, corpus, capsys):
    from tinyattn.cli import train as train_cli

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    code, out, err = run_main(train_cli.main, ["--config", finetune_yaml(tmp_path, corpus), "--no-progress",
                                               "--run-name", "ft", "--stop-at-step", "2", "--set",
                                               "train.max_steps=4"], capsys)
    assert code == 0, err
    code, out, err = run_main(train_cli.main, ["--resume", tmp_path / "runs" / "ft", "--run-name", "fork",
                                               "--no-progress", "--set", "model.n_layer=4"], capsys)
    assert code == 2 and "model.n_layer: config 4, source 2" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "runs" / "fork").exists()


def test_init_from_names_only_the_tokenizer_keys_given(tmp_path, corpus, capsys):
    from tinyattn.cli import train as train_cli

    random_llama(tmp_path / "llama", tokenizer_of("bpe"))
    code, out, err = run_main(train_cli.main, ["--config", finetune_yaml(tmp_path, corpus), "--no-progress",
                                               "--run-name", "ft", "--set", "tokenizer.vocab_size=512"], capsys)
    assert code == 2 and "tokenizer.vocab_size: config 512, source none: a pretrained tokenizer's size is its own" \
        in err, err  # it said "source 4096", the default its kind never reads
    for key in ("tokenizer.kind", "tokenizer.path", "tokenizer.end_of_text"):
        assert key not in err, err


def test_a_folder_that_gives_a_bos_but_no_eos_starts_texts_with_its_bos(tmp_path):
    folder, _, tokenizer = exported_char_folder(tmp_path)
    edit_config(folder, eos_token_id=None, bos_token_id=5)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    loaded = load_any_model(folder)
    assert (loaded.tokenizer.start_id, loaded.tokenizer.start_of_text) == (5, tokenizer.token(5))
    assert loaded.tokenizer.eot_id == tokenizer.eot_id  # <|endoftext|> still ends texts


@pytest.mark.parametrize("key", ["eos_token_id", "bos_token_id"])
def test_a_folder_token_id_outside_its_vocabulary_is_refused_in_one_line(tmp_path, key):
    from tinyattn.errors import CheckpointError

    folder, _, tokenizer = exported_char_folder(tmp_path)
    # JSON's true is no id (Python's 1); an empty list names none (it was read as no eos at all,
    # config.json's not even consulted)
    for outside in (tokenizer.vocab_size, -1, True, []):
        (folder / "generation_config.json").write_text(json.dumps({key: outside}))
        with pytest.raises(CheckpointError) as error:
            load_any_model(folder)
        assert str(error.value) == (f"{folder / 'generation_config.json'}: {key} {outside} is not a "
                                    f"token id of its tokenizer.json (0 to {tokenizer.vocab_size - 1})")
    (folder / "generation_config.json").write_text(json.dumps({key: tokenizer.vocab_size - 1}))
    load_any_model(folder)  # the last id is one


def test_an_exports_tokenizer_config_says_add_bos_token_where_its_tokenizer_adds_the_bos(tmp_path):
    # Readers that do not run tokenizer.json's post-processor (llama.cpp's converter, a slow tokenizer)
    # learn from add_bos_token whether a text starts with <s>.
    _, bos, _ = llama_with_bos_and_eos(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert (written["bos_token"], written["add_bos_token"], written["add_eos_token"]) == ("<s>", True, False)
    folder, _, _ = exported_char_folder(tmp_path / "own")  # tinyattn's own: nothing added
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is False


def test_the_model_cards_example_for_an_empty_prompt_gives_transformers_the_start_token_once(tmp_path):
    # tinyattn's empty prompt is [start token]: the card passes "<|endoftext|>" for tinyattn's own
    # tokenizer, and "" where the tokenizer puts <s> before every text (tokenizer("<s>") would give two).
    _, bos, _ = llama_with_bos_and_eos(tmp_path / "llama")
    loaded = load_any_model(tmp_path / "llama")
    assert loaded.config.sample.prompt == ""
    export_folder(loaded.model.state_dict(), loaded.config, loaded.tokenizer, tmp_path / "out")
    assert "ids = tokenizer('', return_tensors=" in (tmp_path / "out" / "README.md").read_text()
    folder, _, _ = exported_char_folder(tmp_path / "own")
    assert "ids = tokenizer('<|endoftext|>', return_tensors=" in (folder / "README.md").read_text()
