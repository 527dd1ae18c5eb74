"""Golden numbers: the main config's maths, at a size that trains in a second, gives the losses it gave
when they were recorded.

The other tests pin equalities (fused attention equals the explicit path, cached decoding equals a full
forward, a resumed run equals an uninterrupted one), which hold just as well after a change of the maths
on both sides of them. These numbers move with any change of what a run computes: the main config's
settings, the initialisation, the attention, the optimizers and their schedules, the order of the
batches, the moving average, the tokenizer. A change meant to move them updates them in the same commit
and says why. The tolerance is far above what another CPU's kernels change (checked with AVX2's kernels
against AVX-512's, `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`)."""

import re

import pytest

from tests.conftest import CORPUS, ROOT, local_corpus
from tinyattn.config import load_config
from tinyattn.train.loop import train

# The main config at 2 layers, width 32, context 32, batch 4, 30 steps, fp32, on the CPU, on CORPUS.
TINY_MAIN = ["model.n_layer=2", "model.n_head=4", "model.n_embd=32", "model.context_length=32",
             "train.batch_size=4", "train.max_steps=30", "train.time_budget=null", "train.precision=fp32",
             "train.compile=false", "train.show=[]", "train.eval_interval=10", "train.eval_windows=8",
             "train.log_interval=5", "train.warmup_steps=5", "train.peak_flops=1e12", "train.device=cpu"]
TRAIN_LOSSES = {5: 3.7407, 10: 3.5642, 15: 3.3581, 20: 3.1931, 25: 3.1107, 30: 3.0581}
VALIDATION_LOSSES = {10: 3.7421, 20: 3.6577, 30: 3.5395}


def test_the_main_configs_maths_at_a_tiny_size_gives_its_recorded_losses(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    config = load_config(ROOT / "configs" / "shakespeare_char.yaml",
                         [*local_corpus(corpus, tmp_path), *TINY_MAIN])
    result = train(config, run_name="golden", progress=False)
    err = capsys.readouterr().err
    trained = {int(s): float(v) for s, v in re.findall(r"^step (\d+): loss ([\d.]+),", err, re.M)}
    validated = {int(s): float(v) for s, v in re.findall(r"^step (\d+): validation loss ([\d.]+)", err, re.M)}
    assert trained == pytest.approx(TRAIN_LOSSES, abs=1.5e-4), err
    assert validated == pytest.approx(VALIDATION_LOSSES, abs=1.5e-4), err
    assert result.best_val_loss == pytest.approx(VALIDATION_LOSSES[30], abs=1e-4)
