"""The CUDA paths: bf16 attention, compiled decoding, exact resume, fp16 with loss scaling, and
checkpoints that move between devices. Each CUDA case is marked `cuda` and skipped without a
GPU (benchmarks/gpu_check.sh runs them on one: `pytest -m cuda`); where a case means something on
the CPU too, it takes conftest's `device` fixture, so its CPU half runs everywhere (cached
decoding on CUDA is tests/test_generate.py's, over the same fixture).

Tolerances are stated where they are used, with the reason for each.
"""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tinyattn import checkpoint as ckpt
from tinyattn.config import load_config
from tinyattn.generate.decoder import CachedDecoder
from tinyattn.model.attention import attention, causal_mask
from tinyattn.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs these on one)")

# bf16 keeps 8 significant bits: one rounding moves a value by up to 2**-8 (0.4%) of itself.
# Results of a few hundred bf16 operations taken in two orders stay within a few roundings:
# compared within 2e-2 absolute plus 2e-2 relative (assert_close's atol + rtol * |expected|).
BF16_TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, corpus_text) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(corpus_text, encoding="utf-8")
    return path


def tiny_config(corpus: Path, out_dir: Path, *extra: str):
    return load_config(TINY, [f"data.files={corpus}", "data.url=null", "data.sha256=null",
                              f"data.cache_dir={out_dir / 'cache'}", f"train.out_dir={out_dir}",
                              "train.sample_tokens=0", *extra])


# ----------------------------------------------------------------------------- attention


def test_fused_attention_equals_explicit_in_bf16(device):
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 256, 64, generator=generator).unbind(0)  # each (B, H, T, D)
    reference = attention(q, k, v, causal_mask(256, 256))[0]  # fp32, on the CPU
    q, k, v = (t.to(device, torch.bfloat16) for t in (q, k, v))
    with torch.no_grad():
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        explicit = attention(q, k, v, causal_mask(256, 256, q.device))[0]
    assert fused.dtype == explicit.dtype == torch.bfloat16
    fused, explicit = fused.float().cpu(), explicit.float().cpu()
    torch.testing.assert_close(fused, explicit, rtol=BF16_TOLERANCE, atol=BF16_TOLERANCE)
    # Both are bf16 roundings of the same fp32 answer, not merely close to each other.
    torch.testing.assert_close(fused, reference, rtol=BF16_TOLERANCE, atol=BF16_TOLERANCE)
    torch.testing.assert_close(explicit, reference, rtol=BF16_TOLERANCE, atol=BF16_TOLERANCE)


def test_the_models_two_attention_paths_agree_under_bf16_autocast(tiny_model, random_tokens, device):
    idx = random_tokens().to(device)
    fused = tiny_model(attention="fused", n_kv_head=2).to(device)
    explicit = tiny_model(attention="explicit", n_kv_head=2).to(device)
    with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16):  # as training runs
        a, b = fused(idx).logits.float(), explicit(idx).logits.float()  # (B, T, V)
    torch.testing.assert_close(a, b, rtol=BF16_TOLERANCE, atol=BF16_TOLERANCE)


# ----------------------------------------------------------------------------- decoding


@pytest.mark.cuda
@requires_cuda
def test_compiled_decoding_on_cuda_equals_eager_token_for_token(tiny_model, random_tokens):
    # On CUDA the compiled step is replayed as a CUDA graph (mode "reduce-overhead").
    model = tiny_model(n_kv_head=2, context_length=16).to("cuda")
    prompt = random_tokens(batch=1, length=5).to("cuda")
    ids = random_tokens(batch=1, length=40, seed=2).to("cuda")
    with torch.inference_mode():
        ids = ids.clone()  # made inside inference mode, as generate_tokens' are
        eager, compiled = CachedDecoder(model, batch_size=1), CachedDecoder(model, batch_size=1, compile=True)
        torch.testing.assert_close(compiled.prefill(prompt), eager.prefill(prompt), rtol=0, atol=0)
        for t in range(40):  # past the context: refills after 16 tokens, then every 8
            torch.testing.assert_close(compiled.step(ids[:, t]), eager.step(ids[:, t]), rtol=0, atol=1e-4)
    assert compiled.refills == eager.refills == 4 and compiled.compiled_step is not None


# ----------------------------------------------------------------------------- training


# The weights after a stopped-and-resumed run against an uninterrupted one. In fp32 the CUDA
# backward of the embedding adds with atomics (an order that varies), so two fresh runs differ
# by ~1e-7 per step; in bf16 such a difference can flip a rounding in the next forward. A wrong
# batch, learning rate or random state moves weights by ~lr per step (2e-3 here) after step 8.
RESUME_TOLERANCE = {"fp32": 1e-5, "bf16": 1e-3}


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_on_cuda_is_exact_within_tolerance(corpus, tmp_path, precision, count_train_steps):
    extra = ("train.max_steps=16", "train.eval_interval=4", "model.dropout=0.1",
             f"train.precision={precision}", "train.peak_flops=null")  # the peak is measured on the GPU
    straight = train(tiny_config(corpus, tmp_path, *extra), run_name="straight", device="cuda",
                     progress=False)
    first = train(tiny_config(corpus, tmp_path, *extra), run_name="split", device="cuda", progress=False,
                  stop_at_step=8)
    assert first.step == 8
    steps = count_train_steps()
    resumed = train(tiny_config(corpus, tmp_path, *extra), run_name="split", resume=True, device="cuda",
                    progress=False)
    # Only the 8 steps left: a restore that did nothing would retrain all 16 from the seed and match.
    assert resumed.step == 16 and steps.calls == 8
    a = ckpt.load_checkpoint(straight.run_dir / "step_0000016.pt")
    b = ckpt.load_checkpoint(resumed.run_dir / "step_0000016.pt")
    for name, tensor in a["model"].items():
        assert tensor.device.type == "cpu", name  # checkpoints load on the CPU, whatever wrote them
        torch.testing.assert_close(tensor, b["model"][name], rtol=0, atol=RESUME_TOLERANCE[precision],
                                   msg=name)
    assert a["tokens_seen"] == b["tokens_seen"] and a["sampler"] == b["sampler"]


@pytest.mark.cuda
@requires_cuda
def test_fp16_with_the_grad_scaler_trains_with_finite_losses(corpus, tmp_path):
    result = train(tiny_config(corpus, tmp_path, "train.precision=fp16", "train.max_steps=8",
                               "train.eval_interval=4", "train.log_interval=2"),
                   run_name="fp16", device="cuda", progress=False)
    assert result.step == 8 and math.isfinite(result.last_val_loss) and math.isfinite(result.best_val_loss)
    state = ckpt.load_checkpoint(result.run_dir / "step_0000008.pt")
    scale = state["scaler"]["scale"]  # the scaler ran (an fp32 run saves an empty state)
    assert math.isfinite(scale) and scale > 0
    # Steps were taken, not skipped. A scaler that found inf/NaN gradients at every step would
    # skip every optimizer step (halving its scale each time) and leave the weights as they were;
    # each skip resets its count of steps taken in a row, so a count > 0 means the last ones ran.
    assert state["scaler"]["_growth_tracker"] > 0
    four = ckpt.load_checkpoint(result.run_dir / "step_0000004.pt")
    assert any(not torch.equal(four["model"][name], tensor) for name, tensor in state["model"].items())
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    log = (result.run_dir / "train.log").read_text()
    assert "precision fp16" in log  # and a non-finite loss would have stopped the run


def test_a_checkpoint_saved_on_a_device_loads_on_the_cpu_with_the_same_logits(corpus, tmp_path,
                                                                              random_tokens, device):
    result = train(tiny_config(corpus, tmp_path, "train.max_steps=4", "train.eval_interval=4"),
                   run_name=f"on-{device}", device=device, progress=False)
    on_cpu = ckpt.load_model(result.run_dir, device="cpu")
    on_device = ckpt.load_model(result.run_dir, device=device)
    assert {p.device.type for p in on_cpu.model.parameters()} == {"cpu"}
    assert {p.device.type for p in on_device.model.parameters()} == {device}
    idx = random_tokens(vocab_size=on_cpu.config.model.vocab_size)
    with torch.no_grad():
        cpu_logits = on_cpu.model(idx).logits
        device_logits = on_device.model(idx.to(device)).logits.cpu()
    # fp32 both: the same weights through two devices' kernels (CUDA matmuls sum in another order).
    torch.testing.assert_close(cpu_logits, device_logits, rtol=0, atol=1e-4)
    assert on_cpu.step == 4


# ----------------------------------------------------------------------------- MFU


@pytest.mark.cuda
@requires_cuda
def test_the_cuda_peak_climbs_to_8192_and_leaves_the_global_generators_alone(monkeypatch):
    from tinyattn.system import device
    from tinyattn.system.device import measure_peak_flops, select_precision

    cuda = torch.device("cuda")
    bf16 = select_precision("bf16", cuda)
    cpu_state, cuda_state = torch.get_rng_state(), torch.cuda.get_rng_state()
    assert measure_peak_flops(cuda, bf16) > 0
    assert torch.equal(torch.get_rng_state(), cpu_state) and torch.equal(torch.cuda.get_rng_state(), cuda_state)
    # Every matmul "takes" 1 ms, so the ladder climbs to its limit; the FLOP/s give away the size there.
    monkeypatch.setattr(device, "call_times", lambda fn, n, warmup, device: [1e-3] * n)
    monkeypatch.setattr(device, "seconds_of", lambda fn, device: 1e-3)
    assert measure_peak_flops(cuda, bf16) == 2 * 8192 ** 3 / 1e-3
