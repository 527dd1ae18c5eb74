"""Generation: cached == uncached, the context rule, sampling, seeds, stops, batches, the CLI."""

import contextlib
import copy
import functools
import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests import warm_python
from tests.conftest import llama_like_byte_fallback_tokenizer
from tinyattn.checkpoint import FORMAT, load_checkpoint, load_model, save_checkpoint
from tinyattn.cli.generate import main
from tinyattn.config import ModelConfig, SampleConfig, TokenizerConfig
from tinyattn.data.tokenizer import build_tokenizer
from tinyattn.errors import ConfigError, DataError
from tinyattn.generate import decoder as decoder_module
from tinyattn.generate.cpu_weights import (ONEDNN, PackedLinear, PackingOperators, _packing_works, has_row_weights,
                                           one_row_weight, pack_linear_weights)
from tinyattn.generate.decoder import (CachedDecoder, DecodeStep, generate_tokens, prepare_for_generation,
                                       row_weight_dtype)
from tinyattn.generate.sampling import (SamplingOptions, apply_repetition_penalty, nucleus_mask,
                                        sample_next_token)
from tinyattn.generate.text import (PromptWarning, SamplePiece, SampleStreams, StopStringFilter,
                                   encode_prompt, generate, generate_samples)
from tinyattn.model.attention import recording_attention_weights
from tinyattn.model.transformer import ModelOutput

ROOT = Path(__file__).resolve().parents[1]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


@pytest.fixture(scope="module")
def tokenizer(char_tokenizer):
    return char_tokenizer  # conftest's: it has never seen 'é' or 'ü'


@pytest.fixture(scope="module")
def tiny_model(tiny_model, tokenizer):
    """conftest's tiny model over the character vocabulary, with two key/value heads."""
    return functools.partial(tiny_model, vocab_size=tokenizer.vocab_size, n_kv_head=2)


def random_ids(vocab_size, length, batch=2, seed=1):
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


class BigramModel(torch.nn.Module):
    """A stand-in with the LanguageModel interface: the logits depend on the last token only."""

    def __init__(self, table: torch.Tensor, context_length: int = 16):
        super().__init__()
        self.config = ModelConfig(vocab_size=table.size(0), n_layer=1, n_head=1, n_embd=2,
                                  context_length=context_length)
        self.table = torch.nn.Parameter(table, requires_grad=False)  # (V, V): logits after each token

    def new_kv_caches(self, batch_size, **options):
        return []

    def forward(self, idx, kv_caches=None, start_pos=0, positions=None):
        return ModelOutput(self.table[idx], None, None)  # (B, T, V)

    def next_token_logits(self, idx, kv_caches=None, start_pos=0):
        return self.table[idx[:, -1]]  # (B, V)


# ----------------------------------------------------------------------------- the cached model


def test_cached_decoding_equals_recomputing_at_every_step(tiny_model, tokenizer, device):
    model = tiny_model(context_length=24).to(device)
    ids = random_ids(tokenizer.vocab_size, 24).to(device)
    decoder = CachedDecoder(model, batch_size=2)
    with torch.inference_mode():
        logits = decoder.prefill(ids[:, :5])
        for t in range(5, 24):
            full = model(ids[:, :t]).logits[:, -1]  # (B, V), recomputed from scratch
            # fp32 with the same kernels over a cache: only summation order differs.
            torch.testing.assert_close(logits, full, rtol=0, atol=1e-4)
            logits = decoder.step(ids[:, t])
    assert decoder.refills == 0


def test_an_undivided_models_cached_decoding_equals_its_full_forward_not_a_divided_ones(tiny_model,
                                                                                         tokenizer):
    # model.scale_scores false (tinyattn lab scaling's runs): the eager DecodeStep does not know the
    # field and hands the step to the model's own forward, which leaves the scores undivided.
    models = []
    for options in ({"scale_scores": False}, {}):
        model = tiny_model(context_length=24, **options)
        with torch.no_grad():  # weights well past their init, so that the scores' scale matters
            for i, param in enumerate(model.parameters()):
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)) * 0.3)
        models.append(model)
    undivided, divided = models
    ids = random_ids(tokenizer.vocab_size, 24)
    decoder = CachedDecoder(undivided, batch_size=2)
    with torch.inference_mode():
        logits = decoder.prefill(ids[:, :5])
        for t in range(5, 24):
            full = undivided(ids[:, :t]).logits[:, -1]  # (B, V)
            torch.testing.assert_close(logits, full, rtol=0, atol=1e-4)
            assert (full - divided(ids[:, :t]).logits[:, -1]).abs().max() > 1e-2
            logits = decoder.step(ids[:, t])


def test_a_prefill_of_no_tokens_or_more_than_the_context_and_an_empty_prompt_are_refused():
    decoder = CachedDecoder(BigramModel(torch.zeros(4, 4), context_length=8), batch_size=1)
    for length in (0, 9):
        with pytest.raises(ValueError, match=f"prefill takes 1 to 8 tokens per row, got {length}"):
            decoder.prefill(torch.zeros(1, length, dtype=torch.long))
    for shape in ((1, 0), (3,)):  # refused even where no token is asked for
        message = re.escape(f"prompt_ids must be (B, T) with T >= 1, got shape {shape}")
        with pytest.raises(ValueError, match=message):
            list(generate_tokens(BigramModel(torch.zeros(4, 4)), torch.zeros(shape, dtype=torch.long), 0))


@pytest.mark.parametrize("context, keep, refills", [(16, 8, 5), (15, 7, 5)])  # keep = context_length // 2
def test_past_the_context_the_cache_is_refilled_by_the_documented_rule(tiny_model, tokenizer, context, keep,
                                                                        refills):
    model = tiny_model(context_length=context)
    ids = random_ids(tokenizer.vocab_size, 60)
    decoder = CachedDecoder(model, batch_size=2)
    start = 0  # first token of the window the model sees, per the rule
    with torch.inference_mode():
        logits = decoder.prefill(ids[:, :5])
        for end in range(5, 60):  # the window is ids[:, start:end]
            torch.testing.assert_close(logits, model(ids[:, start:end]).logits[:, -1], rtol=0, atol=1e-4)
            if end + 1 - start > context:  # the next token does not fit: keep the last `keep`
                start = end + 1 - keep
            logits = decoder.step(ids[:, end])
    assert decoder.refills == refills  # after `context` tokens, then each time the window is full again


def test_prefills_and_refills_run_the_head_on_the_last_position_only(tiny_model, tokenizer):
    model = tiny_model(context_length=8)
    rows = []  # the head's input rows at each call: B for the last position of each sequence
    model.head.register_forward_hook(lambda module, inputs, output: rows.append(inputs[0].shape[:-1].numel()))
    decoder = CachedDecoder(model, batch_size=2)
    with torch.inference_mode():
        decoder.prefill(random_ids(tokenizer.vocab_size, 6))
        for token in random_ids(tokenizer.vocab_size, 4).unbind(1):
            decoder.step(token)
    # The prefill and the refill (of 4 tokens) call the head; the steps read its weight directly.
    assert decoder.refills == 1 and rows == [2, 2]


def greedy_by_the_rule(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens, each from a full forward pass over the window the context rule gives:
    once a token would make the window longer than the context, it restarts with the last
    context_length // 2 tokens (that one included)."""
    context, keep = model.config.context_length, model.config.context_length // 2
    sequence, start = list(prompt), 0
    with torch.no_grad():
        for _ in range(n):
            if len(sequence) - start > context:
                start = len(sequence) - keep
            logits = model(torch.tensor([sequence[start:]])).logits[0, -1]  # (V,)
            sequence.append(int(logits.argmax()))
    return sequence[len(prompt):]


def test_generating_past_the_context_length_matches_the_rule(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    prompt = random_ids(tokenizer.vocab_size, 5, batch=1)
    produced = torch.stack(list(generate_tokens(model, prompt, 50, temperature=0)), dim=1)  # (1, 50)
    assert produced[0].tolist() == greedy_by_the_rule(model, prompt[0].tolist(), 50)
    # The text interface follows the same rule: its text is those tokens, up to end-of-text.
    text = "".join(generate(model, tokenizer, "Speak", max_new_tokens=50, temperature=0))
    expected = tokenizer.decode(greedy_by_the_rule(model, tokenizer.encode("Speak"), 50))
    assert text == expected.split("<|endoftext|>")[0] and len("Speak" + text) > 16  # past the context


def test_a_context_of_one_token_predicts_each_token_from_the_one_before_alone(tiny_model, tokenizer):
    model = tiny_model(context_length=1)  # context_length // 2 is 0: a refill still keeps the new token
    prompt = random_ids(tokenizer.vocab_size, 3, batch=1)
    produced = torch.cat(list(generate_tokens(model, prompt, 6, temperature=0))).tolist()
    sequence = prompt[0].tolist() + produced
    with torch.no_grad():
        expected = [int(model(torch.tensor([[token]])).logits[0, -1].argmax()) for token in sequence[2:-1]]
    assert produced == expected


class PrefillRecorder(BigramModel):
    """A BigramModel that keeps the ids of each pass that fills the caches (`next_token_logits`)."""

    def __init__(self, table: torch.Tensor, context_length: int = 16):
        super().__init__(table, context_length)
        self.fed = []

    def next_token_logits(self, idx, kv_caches=None, start_pos=0):
        self.fed.append(idx.clone())
        return super().next_token_logits(idx, kv_caches, start_pos)


def test_a_prompt_longer_than_the_context_is_prefilled_with_its_last_context_length_tokens():
    model = PrefillRecorder(torch.zeros(30, 30), context_length=16)
    prompt = torch.arange(20).unsqueeze(0)  # (1, 20)
    list(generate_tokens(model, prompt, 1, temperature=0))
    [prefill] = model.fed
    assert prefill.tolist() == [list(range(4, 20))]


def test_a_compiled_step_under_a_lowered_capability_uses_its_own_compile_cache(tiny_model, monkeypatch):
    # Imported first, under this process's own capability: imported under the lowered one, inductor's
    # runtime keeps it for every later compile here, whose code read back from the cache aborts the process
    import torch._inductor.runtime.cache_dir_utils  # noqa: F401

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    decoder_module.compile_decode_step(tiny_model())  # compiles at its first call, not here
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2")


@pytest.mark.slow  # one compile of a tiny model: about 19 s on a 2-core CPU, 5 s from inductor's cache
def test_compiled_decoding_equals_eager_decoding_token_for_token(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    # As the command line runs: packed eager prefill, compiled steps (the plain model where oneDNN cannot
    # pack). Packed first, so one compile: packing swaps the Linear modules' type, a recompile after it.
    pack_linear_weights(model)
    prompt = random_ids(tokenizer.vocab_size, 5, batch=1)
    ids = random_ids(tokenizer.vocab_size, 40, batch=1, seed=2)
    with torch.inference_mode():  # as in generate_tokens: inputs made outside would mean a recompile
        ids = ids.clone()
        eager, compiled = CachedDecoder(model, batch_size=1), CachedDecoder(model, batch_size=1, compile=True)
        torch.testing.assert_close(compiled.prefill(prompt), eager.prefill(prompt), rtol=0, atol=0)
        for t in range(40):  # past the context: refills after 16 tokens, then every 8
            torch.testing.assert_close(compiled.step(ids[:, t]), eager.step(ids[:, t]), rtol=0, atol=1e-5)
    assert compiled.refills == eager.refills == 4
    assert compiled.compiled_step is not None and eager.compiled_step is None

    def greedy_and_sampled(compile):
        def run(**options):
            return torch.cat(list(generate_tokens(model, prompt, 60, compile=compile, **options))).tolist()
        return run(temperature=0), run(temperature=1.0, top_k=20, top_p=0.9, repetition_penalty=1.2,
                                       generator=torch.Generator().manual_seed(3))
    assert greedy_and_sampled(True) == greedy_and_sampled(False)


def test_compile_asked_of_generate_reaches_the_decoders_steps(monkeypatch):
    built, steps = [], []

    def compile_decode_step(model):  # stands in for torch.compile: the step itself, counted
        built.append(model)
        return lambda *args: steps.append(args[2].item()) or decoder_module.decode_one_token(*args)

    monkeypatch.setattr(decoder_module, "compile_decode_step", compile_decode_step)
    small, model = abc_chain()  # a -> b -> c -> end of text
    assert "".join(generate(model, small, "a", max_new_tokens=9, temperature=0, compile=True)) == "bc"
    assert built == [model] and steps == [1, 2]  # b and c stepped at positions 1 and 2; none after the end


# ----------------------------------------------------------------------------- the eager decode step


def perturbed(model, dtype=torch.float32, pack=False):
    """The model in `dtype` with every parameter nudged (norm gains included, so they matter), each its
    own way: two gains of one shape that a step swapped (the query's and the key's) would give other numbers.
    pack: False, True, or the dtype of copies for one-row products (`pack_linear_weights`'s row_dtype)."""
    with torch.no_grad():
        for i, param in enumerate(model.parameters()):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)) * 0.05)
    model = model.to(dtype)
    row_dtype = pack if isinstance(pack, torch.dtype) else None
    operators = ONEDNN if _packing_works(dtype, ONEDNN) else PLAIN  # bf16 on a CPU without bf16 units
    if pack is not False and not pack_linear_weights(model, operators, row_dtype=row_dtype):
        pytest.skip("this torch build cannot pack weights for oneDNN")
    return model


# Stands in for oneDNN where it refuses a dtype: what the decoder does with a packed model (which
# weight each product reads) is then still tested, on every CPU.
PLAIN = PackingOperators(reorder=torch.clone, linear=torch.nn.functional.linear)


STEP_MODELS = {  # ModelConfig overrides, dtype, packed (or the dtype of copies for one-row products)
    "mha": (dict(n_kv_head=4), torch.float32, False),
    "gqa-qk-norm-softcap": (dict(qk_norm=True, logit_softcap=5.0), torch.float32, False),
    "explicit-attention": (dict(attention="explicit"), torch.float32, False),
    "bf16-packed-qk-norm": (dict(qk_norm=True), torch.bfloat16, True),  # the main config's model on a bf16 CPU
    "fp32-packed": ({}, torch.float32, True),
    "fp32-packed-fp16-rows": ({}, torch.float32, torch.float16),  # what "auto" runs on an AVX2 CPU
    "fp16-rows-qk-norm": (dict(qk_norm=True), torch.float32, torch.float16),  # the main config's model there
    "gqa-gated": (dict(attention_gate=True), torch.float32, False),
    "bf16-packed-qk-norm-gated": (dict(qk_norm=True, attention_gate=True), torch.bfloat16, True),
    "fp16-rows-qk-norm-gated": (dict(qk_norm=True, attention_gate=True), torch.float32, torch.float16),
}


@pytest.mark.parametrize("batch", [1, 2])  # one row: packed bf16 weights multiply through aten's kernel
@pytest.mark.parametrize("name", STEP_MODELS)
def test_the_eager_decode_step_gives_the_models_own_cached_logits_bitwise(tiny_model, tokenizer, name, batch):
    overrides, dtype, pack = STEP_MODELS[name]
    model = perturbed(tiny_model(**overrides), dtype, pack)
    ids = random_ids(tokenizer.vocab_size, 24, batch=batch)
    with torch.inference_mode():
        fast, plain = CachedDecoder(model, batch_size=batch), CachedDecoder(model, batch_size=batch)
        plain.eager_step = None  # the model's own forward, one position at a time
        assert fast.eager_step is not None
        # one sequence by fp16 copies or bf16 weights: the products called directly (`one_row_weight`)
        direct = batch == 1 and (isinstance(pack, torch.dtype) or (pack is True and dtype == torch.bfloat16))
        assert fast.eager_step.one_row == direct
        torch.testing.assert_close(fast.prefill(ids[:, :3]), plain.prefill(ids[:, :3]), rtol=0, atol=0)
        for t in range(3, 24):
            assert torch.equal(fast.step(ids[:, t]), plain.step(ids[:, t])), f"position {t}"
        for ours, theirs in zip(fast.caches, plain.caches):  # the same keys and values were stored
            assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_the_decode_steps_qk_norm_off_the_cpu_gives_the_models_own_logits_bitwise(tiny_model, tokenizer):
    # Off the CPU the step normalises queries and keys in two calls, each with its own gain: run that
    # path here by taking away the CPU's one call for every head.
    model = perturbed(tiny_model(qk_norm=True))  # the query and key gains differ
    ids = random_ids(tokenizer.vocab_size, 12)
    with torch.inference_mode():
        fast, plain = CachedDecoder(model, batch_size=2), CachedDecoder(model, batch_size=2)
        plain.eager_step = None
        fast.eager_step.layers = [layer._replace(qk_gains=None) for layer in fast.eager_step.layers]
        fast.prefill(ids[:, :3]), plain.prefill(ids[:, :3])
        for t in range(3, 12):
            assert torch.equal(fast.step(ids[:, t]), plain.step(ids[:, t])), f"position {t}"


def test_a_bf16_model_decodes_on_the_cpu_over_fp32_caches(tiny_model, tokenizer):
    # fp32 holds every bf16 key and value exactly, and the CPU's attention is faster in fp32 (`cache_dtype`).
    model = perturbed(tiny_model(), torch.bfloat16)
    ids = random_ids(tokenizer.vocab_size, 10)
    caches = model.new_kv_caches(2, dtype=torch.float32)
    with torch.inference_mode():
        decoder = CachedDecoder(model, batch_size=2)
        logits = decoder.prefill(ids[:, :3])
        assert torch.equal(logits, model.next_token_logits(ids[:, :3], kv_caches=caches))
        for t in range(3, 10):
            logits = decoder.step(ids[:, t])
            expected = model(ids[:, t:t + 1], kv_caches=caches, start_pos=t).logits[:, -1]
            assert logits.dtype == torch.bfloat16 and torch.equal(logits, expected), f"position {t}"


def test_a_one_row_step_multiplies_with_onednn_off_and_switches_it_back_on_even_after_a_failure(
        tiny_model, tokenizer, monkeypatch):
    seen, real = [], torch.mv
    def mv(weight, x):
        seen.append(torch._C._get_mkldnn_enabled())
        return real(weight, x)
    monkeypatch.setattr(torch, "mv", mv)  # before the step takes its products
    model = perturbed(tiny_model(), pack=torch.float16)
    ids = random_ids(tokenizer.vocab_size, 6, batch=1)
    assert torch._C._get_mkldnn_enabled()
    with torch.inference_mode():
        decoder = CachedDecoder(model, batch_size=1)
        decoder.prefill(ids[:, :4])
        seen.clear()
        decoder.step(ids[:, 4])
        assert len(seen) == 4 * 2 + 1 and not any(seen)  # every product of the step with oneDNN off
        assert torch._C._get_mkldnn_enabled()  # and back on after it
        monkeypatch.setattr(decoder.eager_step, "block", lambda *args, **kwargs: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            decoder.step(ids[:, 5])
    assert torch._C._get_mkldnn_enabled()  # ... even after a step that failed


def test_a_step_of_two_sequences_leaves_onednn_on_for_the_rest_of_the_process(tiny_model, tokenizer,
                                                                              monkeypatch):
    # oneDNN's switch is process-wide: only a one-row step turns it off (another thread's bf16 products
    # meanwhile run aten's kernels, slower and rounded differently); a batch's step must leave it alone.
    seen, real = [], torch.nn.functional.linear

    def linear(*args, **kwargs):
        seen.append(torch._C._get_mkldnn_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", linear)  # before the step takes its products
    model = perturbed(tiny_model())
    ids = random_ids(tokenizer.vocab_size, 6, batch=2)
    with torch.inference_mode():
        decoder = CachedDecoder(model, batch_size=2)
        decoder.prefill(ids[:, :4])
        seen.clear()
        decoder.step(ids[:, 4])
    assert not decoder.eager_step.one_row and len(seen) == 4 * 2 + 1 and all(seen)


def test_decoding_with_fp16_row_copies_stays_near_the_fp32_models_logits(tiny_model, tokenizer):
    exact = perturbed(tiny_model(context_length=24))
    rows = perturbed(tiny_model(context_length=24), pack=torch.float16)
    ids = random_ids(tokenizer.vocab_size, 24, batch=1)
    decoder, largest = CachedDecoder(rows, batch_size=1), 0.0
    head_inputs = []  # what the head multiplies: the last position's row after the final norm
    for model in (rows, exact):
        model.head.register_forward_pre_hook(
            lambda module, inputs: head_inputs.append(inputs[0].flatten(0, -2)[-1]))  # (C,)
    with torch.inference_mode():
        logits = decoder.prefill(ids[:, :5])  # five rows through the blocks, the head's one row in fp16
        full = exact(ids[:, :5]).logits[:, -1]
        # Products of more than one row stay fp32: the row the head gets is the fp32 model's.
        torch.testing.assert_close(head_inputs[0], head_inputs[1], rtol=0, atol=1e-5)
        for t in range(5, 24):
            largest = max(largest, (logits - full).abs().max().item())
            logits = decoder.step(ids[:, t])  # one row: the fp16 copies
            full = exact(ids[:, :t + 1]).logits[:, -1]  # (1, V), the fp32 model recomputed
        largest = max(largest, (logits - full).abs().max().item())
    # fp16's rounding of weights and rows: far more than fp32 kernels' own (about 1e-6), several
    # times less than bf16's
    assert 1e-4 < largest < 4e-3


@pytest.mark.parametrize("path", ["eager-step", "model-forward", "one-token-prefill", "one-token-refill"])
def test_an_fp16_overflow_drops_the_row_copies_and_decodes_on_in_fp32(tiny_model, tokenizer, path):
    context = 2 if path == "one-token-refill" else 24  # context 2 refills one token at a time
    exact = perturbed(tiny_model(context_length=context))
    with torch.no_grad():
        exact.blocks[-1].mlp.down.weight.mul_(1e6)  # outputs far beyond fp16's 65,504, fine in fp32
    rows = copy.deepcopy(exact)
    if not pack_linear_weights(rows, row_dtype=torch.float16):
        pytest.skip("this torch build cannot pack weights for oneDNN")
    ids = random_ids(tokenizer.vocab_size, 12, batch=1)
    first = 1 if path == "one-token-prefill" else 2  # one row overflows; two through the blocks stay fp32
    overflowing = pytest.warns(RuntimeWarning, match="fp16 copies .* not finite .* decoding in fp32 from here on")
    with torch.inference_mode():
        decoder, reference = CachedDecoder(rows, batch_size=1), CachedDecoder(exact, batch_size=1)
        if path == "model-forward":
            decoder.eager_step = None  # the model's own forward for one position
        # Two rows go through the blocks in fp32 and the head's one row through its fp16 copy.
        near = dict(rtol=0, atol=4e-3) if first > 1 else {}
        with overflowing if path == "one-token-prefill" else contextlib.nullcontext():
            torch.testing.assert_close(decoder.prefill(ids[:, :first]), reference.prefill(ids[:, :first]),
                                       **near)
        if path != "one-token-prefill":
            with overflowing:
                torch.testing.assert_close(decoder.step(ids[:, first]), reference.step(ids[:, first]))
        assert not has_row_weights(rows) and not decoder.row_copies
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # fp32 from here on, without another warning
            for t in range(first + 1, 12):
                torch.testing.assert_close(decoder.step(ids[:, t]), reference.step(ids[:, t]))
    assert decoder.refills == reference.refills == (5 if path == "one-token-refill" else 0)  # every other step


def test_one_overflowing_logit_mid_sequence_recomputes_every_cached_position_in_fp32(tiny_model, tokenizer):
    exact = perturbed(tiny_model(context_length=24))
    rows = copy.deepcopy(exact)
    if not pack_linear_weights(rows, row_dtype=torch.float16):
        pytest.skip("this torch build cannot pack weights for oneDNN")
    ids = random_ids(tokenizer.vocab_size, 12, batch=1)
    with torch.inference_mode():
        decoder, reference = CachedDecoder(rows, batch_size=1), CachedDecoder(exact, batch_size=1)
        decoder.prefill(ids[:, :4]), reference.prefill(ids[:, :4])
        for t in range(4, 7):  # positions cached through the fp16 copies, near fp32 but not equal
            torch.testing.assert_close(decoder.step(ids[:, t]), reference.step(ids[:, t]), rtol=0, atol=4e-3)
        one_row_weight(rows.head)[5].fill_(float("inf"))  # from here one logit of V overflows
        with pytest.warns(RuntimeWarning, match="not finite"):
            logits = decoder.step(ids[:, 7])
        torch.testing.assert_close(logits, reference.step(ids[:, 7]))  # every position again in fp32
        for t in range(8, 12):
            torch.testing.assert_close(decoder.step(ids[:, t]), reference.step(ids[:, t]))


@pytest.mark.parametrize("name, capability, bf16_fast, expected", [
    ("auto", "AVX2", "0", torch.float16),  # a CPU without bf16 units: fp32, with fp16 copies
    ("auto", "AVX512", "0", torch.float16),
    ("fp32", "AVX2", "0", None),  # fp32 asked for by name: its numbers exactly
    ("auto", "AVX512", "1", None),  # bf16 units: bf16 weights, no copies
    ("auto", "DEFAULT", "0", None),  # fp16 rows not known to be fast (no AVX2): none
])
def test_fp16_row_copies_are_kept_only_where_auto_decodes_in_fp32_on_an_avx2_cpu(
        tiny_model, monkeypatch, name, capability, bf16_fast, expected):
    monkeypatch.setenv("TINYATTN_CPU_BF16", bf16_fast)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    prepared = prepare_for_generation(tiny_model(), name, torch.device("cpu"))
    assert row_weight_dtype(name, prepared.dtype, torch.device("cpu")) == expected
    assert row_weight_dtype(name, prepared.dtype, torch.device("cuda")) is None  # for CPU rows only
    assert prepared.dtype == (torch.bfloat16 if bf16_fast == "1" else torch.float32)
    if expected is not None and not prepared.packed:
        pytest.skip("this torch build cannot pack weights for oneDNN")
    linears = [m for m in prepared.model.modules() if isinstance(m, PackedLinear)]
    assert prepared.row_dtype == expected and len(linears) == (9 if prepared.packed else 0)
    assert all((m.row_weight is None) if expected is None else m.row_weight.dtype == expected for m in linears)
    assert ("float16 copies for one-row steps" in prepared.describe("cpu")) == (expected is not None)
    if expected is not None:  # compiled steps multiply by the fp32 weights: no copies to keep
        assert prepare_for_generation(tiny_model(), name, torch.device("cpu"), compile=True).row_dtype is None


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_a_model_with_gates_of_rank_r_generates_with_them_merged_through_the_eager_step(tiny_model, tokenizer,
                                                                                         name):
    """model.attention_gate_rank: generation merges each gate's two matrices into the gate's own (C, C)
    matrix (the model a Qwen3.5 export describes), which the eager step computes; its cached logits at
    every position are the unmerged model's full forward's."""
    model = perturbed(tiny_model(qk_norm=True, attention_gate=True, attention_gate_rank=4))
    ids = random_ids(tokenizer.vocab_size, 20, batch=1)
    with torch.inference_mode():
        expected = model(ids).logits[0]  # (T, V)
        assert CachedDecoder(model, batch_size=1).eager_step is None  # unmerged: the model's own forward
        prepared = prepare_for_generation(model, name, torch.device("cpu"))
        assert prepared.model.config.attention_gate_rank is None
        decoder = CachedDecoder(prepared.model, batch_size=1)
        assert decoder.eager_step is not None
        logits = [decoder.prefill(ids[:, :1])[0]] + [decoder.step(ids[:, t])[0] for t in range(1, 20)]
    tolerance = 1e-5 if name == "fp32" else 0.03  # bf16 weights round (0.0105 seen), not the merge
    torch.testing.assert_close(torch.stack(logits).float(), expected, rtol=0, atol=tolerance)


def test_where_weights_cannot_be_packed_no_row_copies_are_reported(tiny_model, monkeypatch):
    monkeypatch.setenv("TINYATTN_CPU_BF16", "0")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # auto wants fp16 copies
    monkeypatch.setattr(decoder_module, "pack_linear_weights", lambda model, row_dtype=None: False)
    prepared = prepare_for_generation(tiny_model(), "auto", torch.device("cpu"))
    assert (prepared.dtype, prepared.packed, prepared.row_dtype) == (torch.float32, False, None)
    assert prepared.describe("cpu") == "float32 on cpu"


def test_the_decode_step_leaves_to_the_model_what_it_cannot_compute_the_same(tiny_model, monkeypatch):
    model = tiny_model()
    caches = model.new_kv_caches(1)
    assert DecodeStep.for_model(model, caches) is not None
    assert DecodeStep.for_model(model.train(), caches) is None  # dropout runs in the model only
    # The main config's bf16 runs save dropout on the residual branches only: still the fast step.
    assert DecodeStep.for_model(tiny_model(dropout=0.1, attention_dropout=0.0), caches) is not None
    model.eval()
    with recording_attention_weights(model):  # the weights are recorded by the model's own layers
        assert DecodeStep.for_model(model, caches) is None
    monkeypatch.setattr(decoder_module, "_STEP_KNOWS", decoder_module._STEP_KNOWS - {"qk_norm"})
    assert DecodeStep.for_model(tiny_model(qk_norm=True), caches) is None  # an option it does not know
    assert DecodeStep.for_model(tiny_model(), caches) is not None  # ... only when set away from its default
    assert CachedDecoder(model, batch_size=1, compile=True).eager_step is None


class OperatorCounter(TorchDispatchMode):
    """Counts the operator calls that reach torch's dispatcher from Python, views included."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def operators_per_token(model, steps: int = 8) -> float:
    """Operator calls per token of the loop `tinyattn generate` runs: a step and a draw from its generator."""
    with torch.inference_mode():
        decoder = CachedDecoder(model, batch_size=1)
        generator = [torch.Generator().manual_seed(0)]
        token = sample_next_token(decoder.prefill(random_ids(model.config.vocab_size, 4, batch=1)), generator, 0.8)
        with OperatorCounter() as counter:
            for _ in range(steps):
                token = sample_next_token(decoder.step(token), generator, 0.8)
    return counter.calls / steps


def test_operator_calls_per_generated_token_stay_few(tiny_model):
    # Counted at batch 1 for the default options (temperature 0.8): each layer's 4 matmuls, 2 norms,
    # RoPE (4), the cache writes and reads (8), attention, the residual adds and the MLP's activation,
    # and views between them; then the final norm, the head and the draw. The model's own forward
    # took 51 calls a layer and 26 besides (docs/BENCHMARKS.md "Decoding").
    one_layer, three_layers = (operators_per_token(tiny_model(n_layer=n)) for n in (1, 3))
    per_layer = (three_layers - one_layer) / 2
    assert per_layer <= 28 and one_layer - per_layer <= 11, (per_layer, one_layer - per_layer)


def test_one_row_products_by_fp16_copies_add_few_calls(tiny_model):
    # The main config's model as `auto` decodes it on an AVX2 CPU (QK-norm, fp16 copies): each product
    # is called directly, its input cast once where a norm or the attention leaves it and its fp16
    # output read as it is; QK-norm is one call for all heads. Through `PackedLinear.product` (a cast
    # either side of each product) and a norm per query and key it took 40 calls a layer and 16 besides.
    # The row is a vector (C,) for `torch.mv` (one call here, as F.linear is, but none of F.linear's
    # four inside torch): a view of the embedding into it and of the logits out of it, 2 calls besides.
    one_layer, three_layers = (operators_per_token(perturbed(tiny_model(n_layer=n, qk_norm=True), pack=torch.float16))
                               for n in (1, 3))
    per_layer = (three_layers - one_layer) / 2
    assert per_layer <= 37 and one_layer - per_layer <= 18, (per_layer, one_layer - per_layer)


# ----------------------------------------------------------------------------- sampling


def test_greedy_is_deterministic_and_ignores_the_seed(tiny_model, tokenizer):
    model = tiny_model()
    texts = {"".join(generate(model, tokenizer, "All:", max_new_tokens=30, temperature=0, seed=s))
             for s in (1, 2, 3)}
    assert len(texts) == 1
    [text] = texts
    # The argmax at every step: 30 tokens of one character each (no end-of-text among them).
    ids = torch.cat(list(generate_tokens(model, torch.tensor([tokenizer.encode("All:")]), 30, temperature=0)))
    assert tokenizer.eot_id not in ids.tolist()
    assert len(text) == 30 and text == tokenizer.decode(ids.tolist())


def test_top_k_one_equals_greedy(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    prompt = random_ids(tokenizer.vocab_size, 4)
    greedy = list(generate_tokens(model, prompt, 30, temperature=0))
    top1 = list(generate_tokens(model, prompt, 30, temperature=1.5, top_k=1,
                                generator=torch.Generator().manual_seed(0)))
    assert torch.equal(torch.stack(greedy), torch.stack(top1))


# Hand-made distribution, listed out of order so the mask must map back to vocabulary order.
PROBS = torch.tensor([[0.0625, 0.5, 0.125, 0.0625, 0.25]])


@pytest.mark.parametrize("top_p, kept", [
    (1.0, {0, 1, 2, 3, 4}),
    (0.3, {1}),  # the most likely token alone reaches it
    (0.5, {1}),  # exactly reached by the first
    (0.6, {1, 4}),
    (0.75, {1, 4}),  # exactly reached by two
    (0.8, {1, 4, 2}),
    (0.95, {1, 4, 2, 0, 3}),  # 0.9375 is not enough: all five
])
def test_nucleus_keeps_the_smallest_set_reaching_p(top_p, kept):
    mask = nucleus_mask(PROBS, top_p)
    assert set(mask[0].nonzero().flatten().tolist()) == kept


@pytest.mark.parametrize("top_p", [1e-300, 5e-324])
def test_a_top_p_below_fp32s_smallest_number_still_keeps_the_most_likely_token(top_p):
    # Compared in fp32 such a top_p is 0: no token was kept, and torch.multinomial raised
    # (tinyattn serve answered a 500; tinyattn generate --top-p 1e-300 ended in a traceback).
    assert nucleus_mask(PROBS, top_p)[0].nonzero().flatten().tolist() == [1]
    drawn = sample_next_token(PROBS.log(), torch.Generator().manual_seed(0), temperature=1.0, top_p=top_p)
    assert drawn.tolist() == [1]


def test_nucleus_takes_one_of_two_tied_tokens_when_one_is_enough():
    kept = set(nucleus_mask(PROBS, 0.9)[0].nonzero().flatten().tolist())  # 0.875 + 0.0625 reaches it
    assert len(kept) == 4 and {1, 4, 2} < kept


def test_top_p_and_top_k_draw_only_from_the_kept_tokens():
    logits = PROBS.log().expand(4000, -1)  # (4000, V): many draws at once
    drawn = sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_p=0.75)
    assert set(drawn.tolist()) == {1, 4}
    assert abs((drawn == 1).float().mean().item() - 2 / 3) < 0.03  # renormalised 0.5 : 0.25
    drawn = sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_k=3)
    assert set(drawn.tolist()) == {1, 4, 2}


def test_temperature_zero_is_argmax_and_logits_are_not_modified():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]])
    before = logits.clone()
    assert sample_next_token(logits, None, temperature=0).tolist() == [1, 0]
    sample_next_token(logits, torch.Generator().manual_seed(0), temperature=0.7, top_k=2, top_p=0.9)
    assert torch.equal(logits, before)


def test_temperature_divides_the_logits_before_the_softmax(monkeypatch):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    drawn_from = []
    real = torch.multinomial

    def recording(probs, *args, **kwargs):
        drawn_from.append(probs.clone())
        return real(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording)
    for temperature in (0.5, 1.0, 2.0):
        sample_next_token(logits, torch.Generator().manual_seed(0), temperature=temperature)
    for probs, temperature in zip(drawn_from, (0.5, 1.0, 2.0)):
        torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))


def drawn_from(monkeypatch) -> list:
    """The probabilities each later `torch.multinomial` call draws from, recorded."""
    recorded, real = [], torch.multinomial

    def recording(probs, *args, **kwargs):
        recorded.append(probs.clone())
        return real(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording)
    return recorded


def test_a_top_p_just_below_one_still_drops_the_least_likely_tokens(monkeypatch):
    probs = torch.tensor([[0.6, 0.39995, 0.00005]])  # the last token: less than 1 - top_p
    recorded = drawn_from(monkeypatch)
    for top_p in (0.9999, 1.0):
        sample_next_token(probs.log(), torch.Generator().manual_seed(0), temperature=1.0, top_p=top_p)
    cut, whole = recorded
    assert cut[0, 2] == 0 and torch.equal(cut[0, :2], whole[0, :2])
    assert whole[0, 2] > 0  # top_p 1: every token


def test_a_top_p_of_one_is_off_even_for_tokens_below_fp32s_resolution(monkeypatch):
    # The mass ranked above the unlikely token is 1 in fp32: a nucleus of p 1 would drop it.
    recorded = drawn_from(monkeypatch)
    logits = torch.tensor([[0.0, -20.0, -30.0]])
    sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_p=1.0)
    [probs] = recorded
    assert (probs[0, 1:] > 0).all()
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1), rtol=0, atol=0)


def test_top_k_keeps_every_token_tied_with_the_kth_largest(monkeypatch):
    recorded = drawn_from(monkeypatch)
    logits = torch.tensor([[1.0, 2.0, 1.0, 0.0]])  # the 2nd largest is shared by tokens 0 and 2
    sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_k=2)
    [probs] = recorded
    assert probs[0].nonzero().flatten().tolist() == [0, 1, 2]
    assert probs[0, 0] == probs[0, 2]


def test_top_k_one_below_the_vocabulary_size_drops_the_least_likely_token(monkeypatch):
    recorded = drawn_from(monkeypatch)
    logits = torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log()
    sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_k=3)
    [probs] = recorded
    assert probs[0].nonzero().flatten().tolist() == [1, 2, 3]


def test_top_k_zero_is_off_as_none_is(monkeypatch):
    # --top-k 0 and serve's top_k 0 are accepted as "off": they must not reach torch.topk.
    recorded = drawn_from(monkeypatch)
    logits = torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log()
    for top_k in (0, None):
        sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1.0, top_k=top_k)
    for probs in recorded:
        torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logits_of_a_half_precision_model_are_sampled_from_fp32_probabilities(monkeypatch, dtype):
    logits = torch.tensor([[2.3, 1.7, 0.1, -1.3]]).to(dtype)
    recorded = drawn_from(monkeypatch)
    sample_next_token(logits, torch.Generator().manual_seed(0), temperature=0.7)
    [probs] = recorded
    assert probs.dtype == torch.float32  # not rounded to the model's 8 or 11 significant bits
    torch.testing.assert_close(probs, torch.softmax(logits.float() / 0.7, dim=-1), rtol=0, atol=1e-7)


def test_one_generator_per_row_must_match_the_rows():
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="3 generators for a batch of 2 rows"):
        sample_next_token(logits, [torch.Generator() for _ in range(3)], temperature=1.0)
    with pytest.raises(ValueError, match="1 generators for a batch of 2 rows"):
        sample_next_token(logits, [torch.Generator()], temperature=1.0)


def test_one_generator_for_the_batch_fixes_the_draws_by_its_seed_alone():
    logits = torch.zeros(64, 50)  # (64, V): uniform, so the draws are the generator's alone

    def draw(seed):
        return sample_next_token(logits, torch.Generator().manual_seed(seed), temperature=1.0).tolist()
    first = draw(0)
    torch.rand(8)  # torch's global generator moves on: the draws must not read it
    assert draw(0) == first
    assert draw(1) != first


def test_sampling_options_default_to_the_configs_sample_section():
    defaults, config = SamplingOptions(), SampleConfig()
    shared = [name for name in SampleConfig.__dataclass_fields__ if hasattr(defaults, name)]
    assert len(shared) == 5  # max_new_tokens, temperature, top_k, top_p, repetition_penalty
    assert [getattr(defaults, name) for name in shared] == [getattr(config, name) for name in shared]


def test_a_tiny_temperature_or_penalty_samples_the_top_token_instead_of_overflowing():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [-3.0, 5.0, 4.9, 0.0]])
    drawn = sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1e-40)
    assert drawn.tolist() == [0, 1]
    present = torch.tensor([[False, True, False, False], [False, False, True, False]])
    penalized = apply_repetition_penalty(logits, present, 1e-40)
    assert penalized.isfinite().all()
    for temperature in (1e-40, 1e-5, 1e-3, 0.5):  # 1e-5: 3.4e35 / 1e-5 would overflow unshifted
        drawn = sample_next_token(penalized, torch.Generator().manual_seed(0), temperature=temperature)
        assert drawn.tolist() == [1, 2]  # a penalty below 1 rewards what is present
    # Below fp32's smallest number a temperature would be 0 there, above its largest a penalty inf.
    drawn = sample_next_token(logits, torch.Generator().manual_seed(0), temperature=1e-46)
    assert drawn.tolist() == [0, 1]
    everything = torch.ones(1, 3, dtype=torch.bool)
    huge = apply_repetition_penalty(torch.tensor([[0.0, 1.0, -2.0]]), everything, 1e39)
    assert huge.isfinite().all() and huge.argmax().item() == 1  # 0 stays 0 (not 0 * inf), 1 nearly 0

def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    present = torch.tensor([[True, True, False, False]])
    assert apply_repetition_penalty(logits, present, 2.0).tolist() == [[1.0, -4.0, 1.0, -1.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_repetition_penalty_of_half_precision_logits_is_not_held_to_their_dtypes_range(dtype):
    # The hold against overflow (a thousandth of the largest number) was fp16's own, 65.5, though
    # sampling divides in fp32: a rewarded fp16 logit stopped at 65.5 and a penalised one at -65.5.
    logits = torch.tensor([[70.0, 68.0, -60.0, -70.0]], dtype=dtype)
    present = torch.tensor([[False, True, True, False]])
    rewarded = apply_repetition_penalty(logits, present, 0.8)
    near = dict(rtol=1e-3, atol=0)
    torch.testing.assert_close(rewarded.float(), torch.tensor([[70.0, 85.0, -48.0, -70.0]]), **near)
    assert sample_next_token(rewarded, temperature=0).item() == 1  # 68 / 0.8 = 85 > 70
    penalised = apply_repetition_penalty(logits, present, 2.0)
    torch.testing.assert_close(penalised.float(), torch.tensor([[70.0, 34.0, -120.0, -70.0]]), **near)


def test_repetition_penalty_counts_the_prompt_and_the_generated_tokens():
    # Bigram stand-in that always prefers token 0 (logit 10) over token 1 (logit 5).
    table = torch.zeros(3, 3)
    table[:, 0], table[:, 1] = 10.0, 5.0
    model = BigramModel(table)
    def greedy(prompt, penalty):
        ids = torch.tensor([prompt])
        tokens = generate_tokens(model, ids, 4, temperature=0, repetition_penalty=penalty)
        return torch.cat(list(tokens)).tolist()
    assert greedy([2], 1.0) == [0, 0, 0, 0]
    assert greedy([2], 4.0) == [0, 1, 0, 0]  # 10/4 < 5, then 5/4 < 10/4
    assert greedy([0], 4.0) == [1, 0, 0, 0]  # the prompt's token is penalised from the start
    assert greedy([0, 2], 4.0) == [1, 0, 0, 0]  # ... wherever it is in the prompt, not only last
    assert greedy([1], 0.25) == [1, 1, 1, 1]  # below 1 the present token is rewarded: 5 / 0.25 > 10


def test_repetition_penalty_counts_the_prompt_tokens_the_context_no_longer_holds():
    table = torch.zeros(3, 3)
    table[:, 0], table[:, 1] = 10.0, 5.0  # token 0 (logit 10) preferred over token 1 (logit 5)
    model = PrefillRecorder(table, context_length=4)
    tokens = generate_tokens(model, torch.tensor([[0, 2, 2, 2, 2]]), 2, temperature=0, repetition_penalty=4.0)
    assert torch.cat(list(tokens)).tolist() == [1, 0]  # 10/4 < 5: token 0 is in the prompt, then 5/4 < 10/4
    assert model.fed[0].tolist() == [[2, 2, 2, 2]]  # though the prefill no longer reads it


def test_same_seed_same_text_different_seed_different_text(tiny_model, tokenizer):
    model = tiny_model()
    def sample(seed):
        return "".join(generate(model, tokenizer, "All:", max_new_tokens=40, temperature=1.0, seed=seed))
    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    generator_text = "".join(generate(model, tokenizer, "All:", max_new_tokens=40, temperature=1.0,
                                      generator=torch.Generator().manual_seed(7)))
    assert generator_text == sample(7)


def test_a_seed_together_with_generators_is_refused(tiny_model, tokenizer):
    model = tiny_model()
    with pytest.raises(ValueError, match="either a seed or one generator per sample"):
        list(generate(model, tokenizer, "All:", max_new_tokens=2, seed=7, generator=torch.Generator()))
    with pytest.raises(ValueError, match="either a seed or one generator per sample"):
        list(generate_samples(model, tokenizer, "All:", 2, max_new_tokens=2, generators=[torch.Generator()]))


def test_batched_samples_equal_the_same_samples_decoded_one_by_one(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    options = dict(max_new_tokens=40, temperature=1.0, top_k=20, top_p=0.95, repetition_penalty=1.2)
    batched = collect(generate_samples(model, tokenizer, "Speak", 3, seed=11, **options))
    alone = ["".join(generate(model, tokenizer, "Speak", seed=11 + i, **options)) for i in range(3)]
    assert [text for text, _ in batched] == alone
    assert len(set(alone)) == 3
    greedy = collect(generate_samples(model, tokenizer, "Speak", 2, max_new_tokens=30, temperature=0))
    assert greedy[0] == greedy[1]


def test_sample_seeds_wrap_past_the_largest_seed_so_each_is_one_seed_takes(tiny_model, tokenizer):
    # Sample i uses (seed + i) mod 2**63: sample 2 of --seed 2**63 - 1 is --seed 0's one sample,
    # never 2**63, which --seed refuses (and torch's generator takes, so nothing failed before).
    from tinyattn.generate.text import sample_generators

    largest = 2**63 - 1
    seeds = [g.initial_seed() for g in sample_generators(3, largest, None, torch.device("cpu"))]
    assert seeds == [largest, 0, 1]
    model = tiny_model(context_length=16)
    options = dict(max_new_tokens=12, temperature=1.0)
    batched = collect(generate_samples(model, tokenizer, "Speak", 2, seed=largest, **options))
    assert batched[1][0] == "".join(generate(model, tokenizer, "Speak", seed=0, **options))


def collect(pieces) -> list[tuple[str, str]]:
    """(text, finish reason) of each sample; checks that pieces come in sample order."""
    texts, reasons, order = {}, {}, []
    for piece in pieces:
        assert piece.sample not in reasons, "a piece after the sample's last one"
        if not order or order[-1] != piece.sample:
            assert piece.sample not in order, "samples interleaved"
            order.append(piece.sample)
        texts[piece.sample] = texts.get(piece.sample, "") + piece.text
        if piece.finish_reason is not None:
            reasons[piece.sample] = piece.finish_reason
    assert order == sorted(order) and set(reasons) == set(order)
    return [(texts[i], reasons[i]) for i in order]


# ----------------------------------------------------------------------------- ending a sample


def test_streamed_bpe_text_never_shows_half_a_character():
    # Byte-level BPE splits a character the training text never had into single bytes: streamed
    # token by token, no piece may show U+FFFD for a character a later token completes.
    from tinyattn.generate.text import IncrementalDetokenizer

    text = "ab 😀 é 東京 done"
    bpe = build_tokenizer(TokenizerConfig(kind="bpe", vocab_size=300), lambda: iter(["ab done " * 20]))
    ids = bpe.encode(text)
    assert len(ids) > len(text)  # some characters really span several tokens
    stream = IncrementalDetokenizer(bpe)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in piece for piece in pieces)



def test_the_first_new_token_reads_as_it_does_after_the_prompt_with_a_sentencepiece_decoder():
    # Llama 2's decoder strips the space that starts a text ("▁A" alone decodes to "A"): decoded
    # after the prompt's last tokens, the first new token keeps it, as the whole text has it.
    from tokenizers import Tokenizer as Backend, decoders, models

    backend = Backend(models.WordLevel({"ROMEO:": 0, "▁A": 1, "▁b": 2, "<unk>": 3}, unk_token="<unk>"))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])

    class Llama2Like:
        eot_id = 3
        text_start = []  # no bos put before a prompt

        def encode(self, text):
            return [0] if text == "ROMEO:" else []

        def decode(self, ids):
            return backend.decode(list(ids), skip_special_tokens=False)

    table = torch.zeros(4, 4)
    table[0, 1] = table[1, 2] = table[2, 1] = 10.0  # ROMEO: -> ▁A -> ▁b -> ▁A
    text = "".join(generate(BigramModel(table), Llama2Like(), "ROMEO:", max_new_tokens=3, temperature=0))
    assert text == " A b A" and "ROMEO:" + text == backend.decode([0, 1, 2, 1])


@pytest.mark.parametrize("prompt", ["ab日日", "日日", "a日日日", "b 日日日", "é😀", "ab日 b"])
@pytest.mark.parametrize("continuation", ["日 a", "😀b", "é", " 日"])
def test_new_byte_tokens_after_a_prompt_ending_in_byte_tokens_stream_their_characters(prompt, continuation,
                                                                                     monkeypatch):
    # The detokenizer's context was the prompt's last 4 ids, which could start inside a character's
    # byte tokens: ByteFallback read the broken run, and the new byte tokens joining it, as U+FFFD.
    import tinyattn.generate.text as text_module

    tokenizer = llama_like_byte_fallback_tokenizer()
    prompt_ids = tokenizer.text_start + tokenizer.encode(prompt)
    new_ids = tokenizer.encode(continuation)[1:]  # not the "▁" the normalizer puts before a text
    monkeypatch.setattr(text_module, "generate_tokens", lambda *args, **kwargs: iter(
        torch.tensor([token]) for token in new_ids))
    model = BigramModel(torch.zeros(tokenizer.vocab_size, tokenizer.vocab_size), context_length=64)
    streamed = "".join(generate(model, tokenizer, prompt, max_new_tokens=len(new_ids), temperature=0))
    whole, before = tokenizer.decode(prompt_ids + new_ids), tokenizer.decode(prompt_ids)
    assert whole.startswith(before) and streamed == whole[len(before):] and "\ufffd" not in streamed


@pytest.mark.parametrize("prompt", ["日日", "😀日"])  # byte tokens only: 3 + 3 and 4 + 3
def test_a_prompt_of_byte_tokens_only_is_all_context_for_new_byte_tokens(prompt, monkeypatch):
    # Without a bos or a "▁" put before the text (Gemma's SentencePiece), the prompt's only character
    # boundary before its last character may be its first id: the context must reach back to it.
    from tokenizers import Tokenizer as Backend, decoders, normalizers

    import tinyattn.generate.text as text_module
    from tinyattn.data.tokenizer import Tokenizer

    backend = Backend.from_str(llama_like_byte_fallback_tokenizer().to_json())
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    tokenizer = Tokenizer.from_json(backend.to_str(), end_of_text="</s>")
    prompt_ids, new_ids = tokenizer.encode(prompt), tokenizer.encode("日")
    assert tokenizer.text_start == [] and tokenizer.decode(prompt_ids[1:]).startswith("\ufffd")
    monkeypatch.setattr(text_module, "generate_tokens", lambda *args, **kwargs: iter(
        torch.tensor([token]) for token in new_ids))
    model = BigramModel(torch.zeros(tokenizer.vocab_size, tokenizer.vocab_size), context_length=64)
    assert "".join(generate(model, tokenizer, prompt, max_new_tokens=len(new_ids), temperature=0)) == "日"


@pytest.mark.parametrize("continuation", ["a b", "ab 日", "日 a"])
def test_an_empty_prompts_text_has_no_space_before_its_first_word_with_a_stripping_decoder(continuation,
                                                                                        monkeypatch):
    # The empty prompt's context was its start token alone: the decoder's Strip took its one leading
    # space from "<s>"'s text, and every sample began with a space transformers' decoding lacks.
    import tinyattn.generate.text as text_module

    tokenizer = llama_like_byte_fallback_tokenizer()
    new_ids = tokenizer.encode(continuation)  # "▁a", ...: the word's own "▁", as a model generates it
    monkeypatch.setattr(text_module, "generate_tokens", lambda *args, **kwargs: iter(
        torch.tensor([token]) for token in new_ids))
    model = BigramModel(torch.zeros(tokenizer.vocab_size, tokenizer.vocab_size), context_length=64)
    streamed = "".join(generate(model, tokenizer, "", max_new_tokens=len(new_ids), temperature=0))
    assert streamed == tokenizer.decode(new_ids) == continuation


def test_stop_string_filter_holds_back_possible_starts():
    f = StopStringFilter(["\n\n", "END"])
    assert f.push("ab\n") == "ab"  # "\n" may start "\n\n"
    assert f.push("c") == "\nc"  # it did not
    assert f.push("E") == ""
    assert f.push("N") == ""
    assert f.push("Dzz") == ""  # "END" split across three pieces
    assert f.stopped and f.push("more") == "" and f.flush() == ""
    g = StopStringFilter(["xyz"])
    assert g.push("wxy") == "w" and g.flush() == "xy"  # the end of a sample releases held text
    h = StopStringFilter(["bc", "ab"])
    assert h.push("zabc") == "z"  # the earliest occurrence wins


def test_a_shorter_stop_string_listed_later_does_not_shorten_what_is_held_back():
    f = StopStringFilter(["xyzab", "ab"])
    assert f.push("..xyza") == ".."  # "xyza" may start "xyzab", though only "a" may start "ab"
    assert f.push("b") == "" and f.stopped  # "xyzab" is never shown, not even its start


class ByteTokenizer:
    """Tokens of raw bytes, decoded together as UTF-8 (U+FFFD for a character cut short), as
    byte-level BPE decodes: token 2 ends inside "é", so its text is held until what follows."""

    eot_id = 0
    BYTES = {1: b"a", 2: b"b\xc3", 3: b"\xa9"}

    def decode(self, ids):
        return b"".join(self.BYTES[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("ending", ["length", "eot"])
def test_a_stop_string_in_the_text_released_at_the_end_finishes_the_sample_as_stop(ending):
    streams = SampleStreams(ByteTokenizer(), 1, stop=["b"])
    streams.push([1])
    streams.push([2])  # "b" and half of "é": held by the detokenizer, not yet seen by the filter
    if ending == "eot":
        streams.push([ByteTokenizer.eot_id])
    else:
        streams.end_the_rest("length")  # max_new_tokens reached
    generated = 3 if ending == "eot" else 2  # the end-of-text token counts: it was generated
    assert list(streams.ready()) == [SamplePiece(0, "a", "stop", generated)]  # cut at "b", as the text says


def test_no_piece_but_a_samples_last_is_empty():
    # Token 2 ends inside "é": the detokenizer holds its text back, and nothing is let out for it.
    streams = SampleStreams(ByteTokenizer(), 1, stop=[])
    pieces = []
    for token in [1, 2, 3, 1]:
        streams.push([token])
        pieces += streams.ready()
    streams.end_the_rest("length")
    pieces += streams.ready()
    assert "".join(p.text for p in pieces) == "abéa" and pieces[-1].finish_reason == "length"
    assert all(p.text for p in pieces[:-1]), pieces


def test_stop_string_ends_the_sample_and_is_not_printed(tiny_model, tokenizer):
    model = tiny_model()
    # The untrained model may draw end-of-text early: take the first seed whose text is long.
    seed = next(s for s in range(100)
                if len("".join(generate(model, tokenizer, "All:", max_new_tokens=40, seed=s))) >= 20)
    options = dict(max_new_tokens=40, seed=seed)
    full = "".join(generate(model, tokenizer, "All:", **options))
    stop = full[12:15]  # three characters: three tokens of a character-level tokenizer
    pieces = list(generate_samples(model, tokenizer, "All:", 1, stop=[stop], **options))
    assert "".join(p.text for p in pieces) == full[:full.index(stop)]
    assert pieces[-1].finish_reason == "stop"
    assert all(stop not in p.text for p in pieces)


def test_a_single_string_for_stop_is_one_stop_string_not_one_per_character():
    small, model = abc_chain()  # a -> b -> c -> end of text
    assert SamplingOptions(stop="ca").stop == ("ca",)
    assert collect(generate_samples(model, small, "a", 1, max_new_tokens=20, temperature=0, stop="ca")) == [
        ("bc", "eot")]  # "c" alone is no stop string
    assert "".join(generate(model, small, "a", max_new_tokens=20, temperature=0, stop="bc")) == ""


def abc_chain(model_class=None):
    """A character tokenizer of "abc", and a bigram model that writes a -> b -> c -> end of text."""
    small = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["abc"]))
    a, b, c = small.encode("abc")
    table = torch.zeros(small.vocab_size, small.vocab_size)
    table[a, b] = table[b, c] = table[c, small.eot_id] = 10.0
    return small, (model_class or BigramModel)(table)


def test_end_of_text_ends_a_sample(tokenizer):
    small, model = abc_chain()
    samples = collect(generate_samples(model, small, "a", 2, max_new_tokens=20, temperature=0))
    assert samples == [("bc", "eot"), ("bc", "eot")]
    assert "".join(generate(model, small, "b", max_new_tokens=1, temperature=0)) == "c"


def test_generate_yields_each_tokens_text_and_no_empty_piece():
    small, model = abc_chain()  # a -> b -> c -> end of text
    assert list(generate(model, small, "a", max_new_tokens=2, temperature=0)) == ["b", "c"]  # "length"
    assert list(generate(model, small, "a", max_new_tokens=9, temperature=0)) == ["b", "c"]  # "eot"
    assert list(generate(model, small, "a", max_new_tokens=9, temperature=0, stop="c")) == ["b"]  # "stop"


class CountedBigramModel(BigramModel):
    """A BigramModel that counts its forward passes (prefills and steps: `next_token_logits`)."""

    def __init__(self, table: torch.Tensor, context_length: int = 16):
        super().__init__(table, context_length)
        self.passes = 0

    def next_token_logits(self, idx, kv_caches=None, start_pos=0):
        self.passes += 1
        return super().next_token_logits(idx, kv_caches, start_pos)


def test_decoding_stops_as_soon_as_every_sample_has_ended():
    small, model = abc_chain(CountedBigramModel)
    samples = collect(generate_samples(model, small, "a", 2, max_new_tokens=50, temperature=0))
    assert samples == [("bc", "eot"), ("bc", "eot")]
    assert model.passes == 3  # the prefill, then a step after b and after c: none after the end of text


def test_a_stop_string_ends_decoding_at_the_token_that_completes_it():
    small = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["ab"]))
    a, b = small.encode("ab")
    table = torch.zeros(small.vocab_size, small.vocab_size)
    table[a, b] = table[b, a] = 10.0  # a -> b -> a -> b ... never the end of text
    model = CountedBigramModel(table)
    pieces = list(generate_samples(model, small, "a", 1, max_new_tokens=20, temperature=0, stop="ba"))
    assert "".join(p.text for p in pieces) == ""  # b, then a: "ba"
    assert (pieces[-1].finish_reason, pieces[-1].tokens) == ("stop", 2)
    assert model.passes == 2  # the prefill and a step after b: none after the stop string


@pytest.mark.parametrize("n", [0, 1, 5])  # 0: not even a prefill
def test_the_last_token_is_not_followed_by_a_forward_pass(n):
    model = CountedBigramModel(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
    tokens = list(generate_tokens(model, torch.tensor([[1, 2]]), n, temperature=0))
    assert len(tokens) == n and model.passes == n  # the prefill and n - 1 steps


def test_an_empty_prompt_starts_from_the_end_of_text_token():
    small = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["Hi\n"]))
    h, i, newline = small.encode("Hi\n")
    table = torch.zeros(small.vocab_size, small.vocab_size)
    table[small.eot_id, h] = table[h, i] = table[i, small.eot_id] = 10.0  # end of text -> H -> i -> end
    table[newline, i] = 10.0  # from a newline (the fallback of a tokenizer without one) the text differs
    model = BigramModel(table)
    assert "".join(generate(model, small, "", max_new_tokens=20, temperature=0)) == "Hi"
    assert "".join(generate(model, small, "\n", max_new_tokens=20, temperature=0)) == "i"


def test_an_empty_prompt_starts_from_a_newline_where_the_tokenizer_has_no_start_token():
    small = build_tokenizer(TokenizerConfig(kind="char"), lambda: iter(["Hi\n "]))
    h, i, newline, space = small.encode("Hi\n ")

    class WithoutStart:  # start_id None: a folder's tokenizer with neither a bos nor an eos
        start_id = None

        def __getattr__(self, name):
            return getattr(small, name)

    table = torch.zeros(small.vocab_size, small.vocab_size)
    table[newline, i] = table[space, h] = table[small.eot_id, h] = 10.0
    table[i, small.eot_id] = table[h, small.eot_id] = 10.0
    assert "".join(generate(BigramModel(table), WithoutStart(), "", max_new_tokens=5, temperature=0)) == "i"


def test_a_prompt_longer_than_the_context_keeps_its_end_with_a_warning(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    prompt = TEXT[:40]
    with pytest.warns(PromptWarning, match="40 tokens, longer than the model's context of 16"):
        long = "".join(generate(model, tokenizer, prompt, max_new_tokens=10, temperature=0))
    assert long == "".join(generate(model, tokenizer, prompt[-16:], max_new_tokens=10, temperature=0))


def test_a_prompt_one_token_over_the_context_warns_and_one_that_fits_does_not(tiny_model, tokenizer):
    model = tiny_model(context_length=16)
    with pytest.warns(PromptWarning, match="17 tokens, longer than the model's context of 16"):
        list(generate(model, tokenizer, TEXT[:17], max_new_tokens=2, temperature=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(generate(model, tokenizer, TEXT[:16], max_new_tokens=2, temperature=0))


def test_a_prompt_that_encodes_to_no_tokens_is_an_error_naming_it():
    class Empty:  # a tokenizer that drops the whole prompt (it has no token for any of it)
        eot_id = 0

        def encode(self, text):
            return []

        def decode(self, ids):
            return ""

    model = BigramModel(torch.zeros(4, 4))
    with pytest.raises(DataError, match="the prompt '   ' encodes to no tokens"):
        list(generate(model, Empty(), "   ", max_new_tokens=3, temperature=0))


def test_unknown_characters_become_unk_with_a_warning_naming_them(tiny_model, tokenizer):
    model = tiny_model()
    with pytest.warns(PromptWarning, match="'é', 'ü'"):
        text = "".join(generate(model, tokenizer, "Spéak ü", max_new_tokens=5, seed=0))
    [unk] = tokenizer.encode("é")
    assert tokenizer.encode("ü") == [unk] and tokenizer.decode([unk]) == "\ufffd"
    prompt = tokenizer.encode("Sp") + [unk] + tokenizer.encode("ak ") + [unk]
    assert tokenizer.encode("Spéak ü") == prompt
    # The text is the continuation of that prompt, [UNK] in place of each unknown character.
    tokens = generate_tokens(model, torch.tensor([prompt]), 5, temperature=0.8,
                             generator=[torch.Generator().manual_seed(0)])
    assert text == tokenizer.decode(torch.cat(list(tokens)).tolist()).split("<|endoftext|>")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(generate(model, tokenizer, "Speak", max_new_tokens=2, seed=0))  # known text: no warning


def test_a_normalising_tokenizer_warns_only_for_text_it_reads_as_unk(tmp_path):
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    from tinyattn.data.tokenizer import Tokenizer

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "hello": 2, "world": 3, ",": 4, "cafe": 5}
    backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)  # and accents stripped
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.from_file(tmp_path / "tokenizer.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decoded as "hello, world cafe": other text, nothing unknown
        assert encode_prompt(tokenizer, "Hello, World Café", context_length=8) == [2, 4, 3, 5]
    with pytest.warns(PromptWarning, match=r"never seen, read as \[UNK\]: '☃', 'xyzzy'$"):
        assert encode_prompt(tokenizer, "Hello ☃ xyzzy ☃", context_length=8) == [2, 0, 0, 0]


@pytest.mark.parametrize("option, value", [
    ("temperature", -0.5), ("temperature", float("inf")), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("max_new_tokens", -1),
    ("repetition_penalty", 0.0), ("stop", [""]),
])
def test_bad_options_are_config_errors(tiny_model, tokenizer, option, value):
    model = tiny_model()
    with pytest.raises(ConfigError):
        list(generate(model, tokenizer, "All", **{option: value}))
    with pytest.raises(ConfigError, match="num-samples"):
        list(generate_samples(model, tokenizer, "All", 0))


def test_the_models_train_mode_is_restored(tiny_model, tokenizer):
    model = tiny_model().train()
    list(generate(model, tokenizer, "All", max_new_tokens=3, seed=0))
    assert model.training
    model.eval()  # and eval mode stays eval mode (no dropout switched on behind the caller's back)
    list(generate(model, tokenizer, "All", max_new_tokens=3, seed=0))
    assert not model.training


# ----------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def run_dir(trained_run):
    return trained_run.run_dir  # conftest's run "tiny": context 32, trained by tinyattn.train


def run_main(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow  # a fresh Python process
def test_cli_end_to_end_on_a_trained_checkpoint(run_dir):
    # No --checkpoint: the most recent run under --out-dir.
    result = warm_python.run([sys.executable, str(ROOT / "scripts" / "generate.py"), "--out-dir",
                              str(run_dir.parent), "--prompt", "All:", "--max-new-tokens", "30", "--seed",
                              "1", "--num-samples", "2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and run_dir.name in result.stderr
    assert result.stdout.startswith("--- sample 1/2 ---\nAll:")
    assert "\n--- sample 2/2 ---\nAll:" in result.stdout


def test_cli_streams_flushing_every_piece(run_dir, monkeypatch):
    events = []

    class Recorder:
        def write(self, text):
            events.append(("write", text))

        def flush(self):
            events.append(("flush", None))

    monkeypatch.setattr(sys, "stdout", Recorder())
    status = main(["--checkpoint", str(run_dir), "--prompt", "All:", "--max-new-tokens", "20",
                   "--temperature", "0", "--dtype", "fp32"])
    assert status == 0
    writes = [text for kind, text in events if kind == "write"]
    assert writes[0] == "All:" and len(writes) >= 10  # the prompt, then token by token
    assert all(events[i + 1][0] == "flush" for i, (kind, _) in enumerate(events) if kind == "write")


def test_cli_fp16_on_the_cpu_is_refused_in_one_line_naming_dtype(run_dir, capsys):
    # It named "precision", a word generate has no option for.
    status, out, err = run_main(["--checkpoint", str(run_dir), "--prompt", "All:", "--dtype", "fp16",
                                 "--device", "cpu"], capsys)
    assert status == 2 and out == ""
    assert err == "error: --dtype 'fp16' is not supported on the CPU; use bf16 or fp32\n"


def test_cli_names_a_small_models_parameter_count_exactly(run_dir, capsys):
    # The tests' 35,200-parameter model was announced as "0.04M parameters", 14% off its count.
    count = load_model(run_dir).model.num_parameters()
    status, _, err = run_main(["--checkpoint", str(run_dir), "--prompt", "All:", "--max-new-tokens", "2",
                               "--dtype", "fp32"], capsys)
    assert count < 1_000_000 and status == 0
    assert f": {count:,} parameters, " in err


def test_cli_compile_says_compiled_decoding_and_gives_the_eager_fp32_text(run_dir, capsys, monkeypatch):
    # The compile itself stands in as the eager step (torch.compile takes seconds): what the command
    # reports and streams with --compile, not what inductor makes of the step.
    monkeypatch.setattr(decoder_module, "compile_decode_step", lambda model: decoder_module.decode_one_token)
    argv = ["--checkpoint", str(run_dir), "--prompt", "All:", "--max-new-tokens", "8", "--temperature", "0",
            "--dtype", "fp32"]
    status, eager, eager_err = run_main(argv, capsys)
    assert status == 0 and "compiled decoding" not in eager_err
    status, compiled, err = run_main([*argv, "--compile"], capsys)
    assert status == 0 and compiled == eager
    assert err.splitlines()[-1].endswith(", compiled decoding"), err


def test_cli_same_seed_same_text_and_defaults_from_the_checkpoint(run_dir, capsys):
    argv = ["--checkpoint", str(run_dir / "best.pt"), "--prompt", "All:", "--seed", "5", "--dtype", "fp32",
            "--max-new-tokens", "25"]
    first, second = run_main(argv, capsys), run_main(argv, capsys)
    assert first[0] == 0 and first[1] == second[1] and first[1].startswith("All:")
    saved = ["--checkpoint", str(run_dir), "--seed", "5", "--dtype", "fp32", "--max-new-tokens", "25",
             "--top-k", "1"]
    status, out, _ = run_main(saved, capsys)
    # The saved sample.prompt is empty (start from <|endoftext|>), as an explicit empty prompt.
    assert status == 0 and out and out == run_main([*saved, "--prompt", ""], capsys)[1]


def test_cli_sampling_options_given_win_over_the_checkpoints(run_dir, capsys):
    # The run saved sample.max_new_tokens 32, temperature 0.8, no top-k, top-p 1, no penalty: each
    # option typed is the library's draw with that option and the checkpoint's others.
    loaded = load_model(run_dir)
    base = ["--checkpoint", str(run_dir), "--prompt", "All:", "--seed", "3", "--dtype", "fp32"]
    library = functools.partial(generate, loaded.model, loaded.tokenizer, "All:", seed=3, temperature=0.8)
    plain = "".join(library(max_new_tokens=20))
    for flags, option in ((["--max-new-tokens", "7"], {"max_new_tokens": 7}),
                          (["--top-k", "2"], {"top_k": 2}), (["--top-p", "0.3"], {"top_p": 0.3}),
                          (["--repetition-penalty", "3"], {"repetition_penalty": 3.0})):
        expected = "".join(library(**{"max_new_tokens": 20, **option}))
        assert expected != plain, option  # the option changes the text: it is seen to apply
        extra = [] if "max_new_tokens" in option else ["--max-new-tokens", "20"]
        status, out, err = run_main([*base, *extra, *flags], capsys)
        assert status == 0 and out == "All:" + expected + ("" if expected.endswith("\n") else "\n"), (flags, err)


def test_cli_without_a_prompt_continues_the_checkpoints_saved_prompt(run_dir, tmp_path, capsys):
    state = load_checkpoint(run_dir / "best.pt")
    state["config"]["sample"]["prompt"] = "All:"
    save_checkpoint(state, tmp_path / "prompted.pt")
    options = ["--seed", "5", "--dtype", "fp32", "--max-new-tokens", "10"]
    status, out, err = run_main(["--checkpoint", str(tmp_path / "prompted.pt"), *options], capsys)
    assert status == 0, err
    assert out.startswith("All:") and out == run_main(["--checkpoint", str(run_dir), "--prompt", "All:",
                                                       *options], capsys)[1]


def test_cli_an_empty_prompt_given_wins_over_the_saved_one_and_stdin_prompts_lose_their_byte_order_mark(
        run_dir, tmp_path, capsys, monkeypatch):
    state = load_checkpoint(run_dir / "best.pt")
    state["config"]["sample"]["prompt"] = "All:"
    save_checkpoint(state, tmp_path / "prompted.pt")
    options = ["--seed", "5", "--dtype", "fp32", "--max-new-tokens", "10"]
    empty = run_main(["--checkpoint", str(run_dir), "--prompt", "", *options], capsys)
    assert empty[0] == 0 and not empty[1].startswith("All:")
    given = run_main(["--checkpoint", str(tmp_path / "prompted.pt"), "--prompt", "", *options], capsys)
    assert given[:2] == empty[:2]  # not the saved "All:"
    typed = run_main(["--checkpoint", str(run_dir), "--prompt", "All:", *options], capsys)
    for source in (["--prompt-file", "-"], ["-"]):  # the mark a Windows pipe may start with: not prompt text
        status, out, err = run_main(["--checkpoint", str(run_dir), *source, *options], capsys,
                                    stdin="\ufeffAll:", monkeypatch=monkeypatch)
        assert (status, out) == typed[:2], (source, err)
    status, out, err = run_main(["--checkpoint", str(run_dir), "--interactive", *options], capsys,
                                stdin="\ufeffAll:\n", monkeypatch=monkeypatch)
    assert status == 0 and out == typed[1][len("All:"):] and "warning" not in err, err  # not echoed


def test_cli_a_samples_ending_newline_is_not_doubled_and_each_sample_has_its_header(monkeypatch):
    import tinyattn.generate.text as text_module

    from tinyattn.cli.generate import StreamPrinter

    pieces = [SamplePiece(0, "ab"), SamplePiece(0, "\n", "length", 2), SamplePiece(1, "cd", "eot", 3)]
    monkeypatch.setattr(text_module, "stream_samples", lambda *args, **kwargs: iter(pieces))
    out = io.StringIO()
    StreamPrinter(out, None, None, SamplingOptions(num_samples=2)).run("P:", echo=True)
    assert out.getvalue() == "--- sample 1/2 ---\nP:ab\n--- sample 2/2 ---\nP:cd\n"


def test_cli_interactive_reads_prompts_until_end_of_input(run_dir, capsys, monkeypatch):
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "8", "--temperature", "0", "--dtype", "fp32"]
    status, out, err = run_main([*options, "--interactive"], capsys, stdin="Speak\nAll:\n",
                                monkeypatch=monkeypatch)
    assert status == 0 and "Traceback" not in err
    # The same continuations as one-shot runs, without the echoed prompts.
    first = run_main([*options, "--prompt", "Speak"], capsys)[1]
    second = run_main([*options, "--prompt", "All:"], capsys)[1]
    assert out == first.removeprefix("Speak") + second.removeprefix("All:")


def test_cli_interactive_answers_each_prompt_with_its_own_line_even_an_empty_continuation(run_dir, capsys,
                                                                                           monkeypatch):
    # With --stop "\n" each answer is one line, and a model that ends a line at once answers nothing:
    # that answer printed no line at all, so a script pairing prompt lines with answer lines lost step.
    options = ["--checkpoint", str(run_dir), "--temperature", "0", "--dtype", "fp32", "--interactive"]
    status, out, err = run_main([*options, "--max-new-tokens", "0"], capsys, stdin="Speak\nAll:\n",
                                monkeypatch=monkeypatch)
    assert (status, out) == (0, "\n\n"), err


def test_cli_an_empty_interactive_answer_is_an_empty_line_and_the_others_are_not_doubled(monkeypatch):
    import tinyattn.generate.text as text_module

    from tinyattn.cli.generate import StreamPrinter

    answers = iter([[SamplePiece(0, "", "stop", 1)], [SamplePiece(0, "ab", "length", 2)],
                    [SamplePiece(0, "cd\n", "stop", 3)], [SamplePiece(0, "", "stop", 1)]])
    monkeypatch.setattr(text_module, "stream_samples", lambda *args, **kwargs: iter(next(answers)))
    out = io.StringIO()
    printer = StreamPrinter(out, None, None, SamplingOptions())
    for prompt in ("P:", "Q:", "R:"):
        printer.run(prompt, echo=False)
    assert out.getvalue() == "\nab\ncd\n"
    printer.run("", echo=True)  # a one-shot run echoes its prompt: an empty one prints nothing, as before
    assert out.getvalue() == "\nab\ncd\n"


def test_cli_interactive_with_several_samples_gives_each_sample_its_line_an_empty_one_too(monkeypatch):
    # --interactive --num-samples 2 --stop "\n": a sample that ended at once printed no line under its
    # header, so a script reading one line per sample lost step, as at an empty answer of one sample.
    import tinyattn.generate.text as text_module

    from tinyattn.cli.generate import StreamPrinter

    pieces = [SamplePiece(0, "", "stop", 1), SamplePiece(1, "ab", "length", 2)]
    monkeypatch.setattr(text_module, "stream_samples", lambda *args, **kwargs: iter(pieces))
    out = io.StringIO()
    printer = StreamPrinter(out, None, None, SamplingOptions(num_samples=2))
    printer.run("P:", echo=False)
    assert out.getvalue() == "--- sample 1/2 ---\n\n--- sample 2/2 ---\nab\n"
    printer.empty_answer()  # a skipped line: the same lines, each sample's empty
    assert out.getvalue().endswith("ab\n--- sample 1/2 ---\n\n--- sample 2/2 ---\n\n")
    out = io.StringIO()
    StreamPrinter(out, None, None, SamplingOptions(num_samples=2)).run("P:", echo=True)
    assert out.getvalue() == "--- sample 1/2 ---\nP:\n--- sample 2/2 ---\nP:ab\n"  # one-shot: as before


def test_cli_interactive_prompts_on_stderr_so_that_stdout_holds_only_the_text(capsys, monkeypatch):
    # `tinyattn generate --interactive > out.txt` at a terminal: the "> " marks are not the text.
    from tinyattn.cli.generate import _interactive

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    class Printer:
        def __init__(self):
            self.prompts = []

        def run(self, prompt, echo):
            self.prompts.append((prompt, echo))

    printer = Printer()
    monkeypatch.setattr(sys, "stdin", Terminal("Speak\nAll:\n"))
    assert _interactive(printer) == 0
    assert printer.prompts == [("Speak", False), ("All:", False)]
    assert capsys.readouterr() == ("", "> > > \n")  # one mark per read, a newline after Ctrl-D


def test_cli_interactive_skips_a_line_that_is_not_utf8_with_a_warning(run_dir, capsys, monkeypatch):
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "8", "--temperature", "0", "--dtype", "fp32",
               "--interactive"]
    stdin = io.TextIOWrapper(io.BytesIO(b"Speak\n\xff\xfe latin-1 \xe9\nAll:\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, out, err = run_main(options, capsys)
    assert status == 0 and "Traceback" not in err
    assert "warning: stdin line 2 is not utf-8 text (invalid start byte at byte 0); skipped" in err
    # Both good lines were answered, as when each is the only one, and the bad one has an empty line: a script
    # pairing prompt lines with answer lines (5ff6d7c) lost step at a skipped line, as at an empty answer.
    first = run_main(options, capsys, stdin="Speak\n", monkeypatch=monkeypatch)[1]
    assert out == first + "\n" + run_main(options, capsys, stdin="All:\n", monkeypatch=monkeypatch)[1]


def test_cli_interactive_skips_a_line_holding_a_nul_with_a_warning(run_dir, capsys, monkeypatch):
    # A prompts file saved as UTF-16 without a byte-order mark, piped in: each line valid UTF-8 with a
    # NUL after each character, continued as that prompt, where --prompt-file and `generate -` refuse it.
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "8", "--temperature", "0", "--dtype", "fp32",
               "--interactive"]
    lines = b"Speak\n" + "All:\n".encode("utf-16-le") + b"\nAll:\n"  # line 3: the "\0" of UTF-16's "\n\0"
    stdin = io.TextIOWrapper(io.BytesIO(lines), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, out, err = run_main(options, capsys)
    assert status == 0 and "Traceback" not in err
    assert ("warning: stdin line 2 holds a NUL at byte 1, which no text does: it is UTF-16 (without a "
            "byte-order mark) or not text; skipped") in err
    assert "warning: stdin line 3 holds a NUL at byte 0" in err
    assert "[UNK]" not in err, err
    first = run_main(options, capsys, stdin="Speak\n", monkeypatch=monkeypatch)[1]
    assert out == first + "\n\n" + run_main(options, capsys, stdin="All:\n", monkeypatch=monkeypatch)[1]


def test_cli_interactive_reads_windows_line_endings_as_the_same_prompts(run_dir, capsys, monkeypatch):
    # A prompt file saved on Windows: "Speak\r\n" is the prompt "Speak", not "Speak\r".
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "8", "--temperature", "0", "--dtype", "fp32",
               "--interactive"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Speak\r\nAll:\r\n"), encoding="utf-8"))
    status, out, err = run_main(options, capsys)
    assert status == 0, err
    assert out == run_main(options, capsys, stdin="Speak\nAll:\n", monkeypatch=monkeypatch)[1]


def test_cli_prompt_from_stdin_and_stop_escapes(run_dir, capsys, monkeypatch):
    # The draws without stop strings, from the library with the checkpoint's sampling options, for
    # the first seed whose text stops at a newline (the escape \n), not at an "e", with text on
    # both sides (the tiny model's text changes with its weights; the seed is chosen, not assumed).
    # A draw whose first "\n" or "e" already rules its seed out is not decoded further.
    loaded = load_model(run_dir)
    saved = loaded.config.sample
    for seed in range(50):
        whole, draw = "", generate(loaded.model, loaded.tokenizer, "All:\n", max_new_tokens=40, seed=seed,
                                   temperature=saved.temperature, top_k=saved.top_k, top_p=saved.top_p,
                                   repetition_penalty=saved.repetition_penalty)
        with contextlib.closing(draw):
            for piece in draw:
                whole += piece
                first = re.search("[\ne]", whole)
                if first and (first.start() < 10 or first.group() == "e"):
                    break
        cut = min([i for i in (whole.find("\n"), whole.find("e")) if i >= 0] or [len(whole)])
        if 10 <= cut < len(whole) - 10 and whole[cut] == "\n":
            break
    else:
        pytest.fail("no seed in 0..49 gives a text that stops at a newline with text on both sides")
    # One string per --stop: two flags give two strings, and the "-" after the last one is the stdin
    # prompt (once swallowed as a third stop string, which left the prompt empty).
    status, out, _ = run_main(["--checkpoint", str(run_dir), "--max-new-tokens", "40", "--seed", str(seed),
                               "--dtype", "fp32", "--stop", "\\n", "--stop", "e", "-"], capsys, stdin="All:\n",
                              monkeypatch=monkeypatch)
    # The command's text is the library's up to the first "\n" or "e", which is not printed.
    assert status == 0
    assert out == "All:\n" + whole[:cut] + "\n"  # the prompt read from stdin, the continuation, a newline


@pytest.mark.parametrize("typed, meant", [
    (r"\n\n", "\n\n"), (r"a\tb", "a\tb"), (r"\\n", "\\n"), (r"\u00e9\x41\101", "éAA"), (r"\N{BULLET}", "•"),
    (r"\日", "\\日"), (r"\é", "\\é"), (r"日\n", "日\n"), (r"\日\n", "\\日\n"), (r"\q", "\\q"), ("é😀", "é😀"),
])
def test_stop_escapes_are_read_and_a_backslash_before_any_other_character_stays(typed, meant):
    # The escapes were read by encoding the text to escapes first: a backslash before a character
    # above U+00FF ("\日") became the six characters "\u65e5", a stop string never found.
    from tinyattn.cli.generate import unescape

    assert unescape(typed) == meant


def test_cli_each_stop_flag_takes_one_string_and_a_dash_after_it_is_the_stdin_prompt():
    from tinyattn.cli.generate import build_parser

    args = build_parser().parse_args(["--stop", "\\n\\n", "-"])
    assert args.stop == ["\\n\\n"] and args.stdin == "-"
    args = build_parser().parse_args(["--stop", "a", "--stop", "b"])
    assert args.stop == ["a", "b"] and args.stdin is None


def test_cli_warns_about_unknown_characters_and_long_prompts(run_dir, capsys):
    status, out, err = run_main(["--checkpoint", str(run_dir), "--prompt", "Spéak " * 10,
                                 "--max-new-tokens", "3", "--dtype", "fp32"], capsys)
    assert status == 0
    assert "warning: the prompt has characters the tokenizer has never seen, read as [UNK]: 'é'" in err
    assert "warning: the prompt is 60 tokens, longer than the model's context of 32" in err
    assert "Traceback" not in err


def bad_checkpoints(tmp_path):
    not_a_checkpoint = tmp_path / "notes.txt"
    not_a_checkpoint.write_text("hello")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    future = tmp_path / "future.pt"
    torch.save({"format": FORMAT, "format_version": 99}, future)
    (tmp_path / "utf16.txt").write_bytes("ROMEO:\nSpeak".encode("utf-16-le"))  # as some Windows tools save
    return not_a_checkpoint, foreign, future


@pytest.mark.parametrize("args, message", [
    (["--num-samples", "0"], "error: --num-samples 0 is not accepted: expected an integer >= 1\n"),
    (["--top-p", "1.5"], "error: --top-p 1.5 is not accepted: expected a number in (0, 1] "
                         "(1 means no top-p)\n"),
    (["--repetition-penalty", "0"], "error: --repetition-penalty 0.0 is not accepted: expected a positive "
                                    "number (1 means none)\n"),
], ids=["num-samples", "top-p", "repetition-penalty"])
def test_cli_a_refused_sampling_option_is_named_as_typed_before_the_model_loads(capsys, args, message):
    status, out, err = run_main([*args, "--checkpoint", "nowhere"], capsys)  # no such checkpoint: not loaded
    assert status == 2 and err == message


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "--temperature -1.0 is not accepted"),
    (["--top-p", "0"], "--top-p 0.0 is not accepted"),
    (["--top-p", "1.5"], "--top-p 1.5 is not accepted"),
    (["--top-k", "-3"], "--top-k -3 is not accepted"),
    (["--max-new-tokens", "-1"], "--max-new-tokens -1 is not accepted"),
    (["--num-samples", "0"], "--num-samples 0 is not accepted"),
    (["--repetition-penalty", "0"], "--repetition-penalty 0.0 is not accepted"),
    (["--seed", "-1"], "--seed -1 is not accepted"),
    (["--stop", ""], "--stop '' is not accepted"),
    (["--stop", "\\x"], "--stop '\\\\x': not a valid escape sequence"),
    (["--device", "gpu"], "device 'gpu' is not accepted; expected auto, cpu, cuda, cuda:N or mps"),
    (["--prompt-file", "{tmp}/missing.txt"], "missing.txt: prompt file not found"),
    # ASCII in UTF-16 without a byte-order mark is valid UTF-8, a NUL after each character: it was the prompt
    (["--prompt-file", "{tmp}/utf16.txt"],
     "utf16.txt: the prompt file holds a NUL at byte 1 (line 1), which no text does: it is UTF-16 (without a "
     "byte-order mark) or not text"),
    (["--checkpoint", "{tmp}/nowhere"], "nowhere: no such checkpoint file, run folder or Hugging Face"),
    (["--checkpoint", "{tmp}/notes.txt"], "notes.txt: not a tinyattn checkpoint (a torch.save archive)"),
    (["--checkpoint", "{tmp}/foreign.pt"], "foreign.pt: not a tinyattn checkpoint"),
    (["--checkpoint", "{tmp}/future.pt"], "checkpoint format version 99 is not supported"),
    (["--out-dir", "{tmp}/empty"], "no checkpoints under"),
])
def test_cli_bad_input_is_one_line_and_exit_status_2(run_dir, tmp_path, capsys, args, message):
    bad_checkpoints(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--checkpoint" not in args and "--out-dir" not in args:
        args += ["--checkpoint", str(run_dir)]
    status, out, err = run_main(args, capsys)
    assert status == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["-"], ["--prompt-file", "-"]], ids=["dash", "prompt-file-dash"])
def test_cli_a_stdin_prompt_in_utf16_without_a_byte_order_mark_is_one_line_naming_its_first_nul(
        run_dir, capsys, monkeypatch, argv):
    # `tinyattn generate - < prompt.txt` of a file saved as UTF-16 without a mark: valid UTF-8 with a NUL
    # after each character, refused from --prompt-file FILE but continued as that prompt from stdin.
    stdin = io.TextIOWrapper(io.BytesIO("ROMEO:\nSpeak".encode("utf-16-le")), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, out, err = run_main(["--checkpoint", str(run_dir), "--max-new-tokens", "4", *argv], capsys)
    assert (status, out) == (2, ""), err
    assert err == ("error: stdin: the prompt holds a NUL after 1 character (line 1), which no text does: "
                   "it is UTF-16 (without a byte-order mark) or not text; save it as UTF-8\n")
    # Read through a text stream, whose newlines are translated: counted in characters, each \r\n one.
    stdin = io.TextIOWrapper(io.BytesIO(b"ab\r\ncd\r\nef\0"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, out, err = run_main(["--checkpoint", str(run_dir), *argv], capsys)
    assert status == 2 and "holds a NUL after 8 characters (line 3)" in err, err


def test_cli_prompt_that_is_not_utf8_is_one_line_and_exit_status_2(run_dir, capsys):
    status, out, err = run_main(["--checkpoint", str(run_dir), "--prompt", "ab\udcff"], capsys)
    assert status == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == "error: the prompt is not valid UTF-8 text (after 2 characters: '\\udcff')"


@pytest.mark.slow  # a fresh Python process
def test_cli_incompatible_checkpoint_in_a_real_process(tmp_path):
    _, _, future = bad_checkpoints(tmp_path)
    result = warm_python.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                              "--checkpoint", str(future)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_samples_whose_kv_caches_cannot_fit_are_refused_before_any_is_made(tiny_model, char_tokenizer,
                                                                           monkeypatch):
    from tinyattn.errors import ConfigError
    from tinyattn.model import memory

    from tinyattn.generate.decoder import cache_dtype

    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    c = model.config  # keys and values of every layer, at the positions "RO" and 2 new tokens reach:
    per_sample = 2 * c.n_layer * c.kv_heads * (2 + 2 - 1) * c.head_dim * torch.empty(
        (), dtype=cache_dtype(model)).element_size()
    monkeypatch.setattr(memory, "available_bytes", lambda device: (10 * per_sample, "available here"))
    assert len(list(generate_samples(model, char_tokenizer, "RO", 10, max_new_tokens=2, seed=0))) > 0
    with pytest.raises(ConfigError, match=r"decoding 11 sequences at once needs .* MB for their KV caches "
                                          r"alone, more than the .* MB available here; ask for fewer"):
        list(generate_samples(model, char_tokenizer, "RO", 11, max_new_tokens=2, seed=0))


def test_generate_tokens_refuses_kv_caches_that_cannot_fit_before_making_them(tiny_model, monkeypatch):
    # The token loop is public (benchmarks/decode.py calls it directly): its decoder sizes the caches
    # itself, so a batch whose caches cannot fit is one line, not a stall or an out-of-memory kill.
    from tinyattn.model import memory
    from tinyattn.model.transformer import LanguageModel

    model = tiny_model()
    monkeypatch.setattr(memory, "available_bytes", lambda device: (1000, "available here"))
    monkeypatch.setattr(LanguageModel, "new_kv_caches", lambda *args, **kwargs: pytest.fail("caches made"))
    refused = r"^decoding 3 sequences at once needs .* available here; ask for fewer"
    with pytest.raises(ConfigError, match=refused):
        next(generate_tokens(model, random_ids(model.config.vocab_size, 4, batch=3), 20))


def test_ten_million_samples_are_refused_before_anything_is_made_for_each(tiny_model, char_tokenizer,
                                                                          monkeypatch):
    from tinyattn.generate import text
    from tinyattn.model import memory

    def made_for_each_sample(*args, **kwargs):
        raise AssertionError("per-sample state made before the KV caches were sized")

    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    monkeypatch.setattr(memory, "available_bytes", lambda device: (10**6, "available here"))
    monkeypatch.setattr(text, "sample_generators", made_for_each_sample)  # 10^7 generators: seconds, GBs
    with pytest.raises(ConfigError, match=r"^decoding 10,000,000 sequences at once needs "):
        list(generate_samples(model, char_tokenizer, "RO", 10**7, max_new_tokens=1, seed=0))  # one token too


def test_a_short_generation_from_a_long_context_makes_caches_for_the_positions_it_reaches(
        tiny_model, char_tokenizer, monkeypatch):
    # A Hugging Face folder's context runs to tens of thousands of positions: caches for every one of
    # them, asked for a few tokens, took gigabytes (or were refused) where these few positions fit.
    from tinyattn.model import memory
    from tinyattn.model.transformer import LanguageModel

    model = tiny_model(vocab_size=char_tokenizer.vocab_size, context_length=4096)
    c, made = model.config, []
    position_bytes = 2 * c.n_layer * c.kv_heads * c.head_dim * 4  # fp32 keys and values of one position
    monkeypatch.setattr(memory, "available_bytes", lambda device: (100 * position_bytes, "available here"))
    new_kv_caches = LanguageModel.new_kv_caches
    monkeypatch.setattr(LanguageModel, "new_kv_caches", lambda self, *args, **kwargs: made.append(
        new_kv_caches(self, *args, **kwargs)) or made[-1])
    pieces = list(generate_samples(model, char_tokenizer, "ROMEO:", max_new_tokens=20, temperature=0.0))
    assert [cache.max_len for cache in made[0]] == [6 + 20 - 1] * c.n_layer
    ids = char_tokenizer.encode("ROMEO:")
    with torch.no_grad():  # greedy by the whole forward, with no cache: the same text
        for _ in range(20):
            ids.append(model(torch.tensor([ids])).logits[0, -1].argmax().item())
    assert "".join(piece.text for piece in pieces) == char_tokenizer.decode(ids[6:])
    assert decoder_module.cache_positions(model, 5000, 20) == 4096  # past the context: the refill rule's
    assert decoder_module.cache_positions(model, 6, 20, compile=True) == 4096  # one shape per compile


def test_a_refusal_of_kv_caches_advises_what_shrinks_them_not_fewer_samples_for_one(
        tiny_model, char_tokenizer, monkeypatch):
    # Sized to the positions a generation reaches, one sample's caches shrink with fewer new tokens or a
    # shorter prompt: "ask for fewer samples" told one sample to ask for none. A compiled step's caches
    # hold the whole context whatever the tokens: there, fewer tokens would not help.
    from tinyattn.model import memory

    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    monkeypatch.setattr(memory, "available_bytes", lambda device: (100, "available here"))
    eager, compiled = ("ask for fewer new tokens or a shorter prompt", "decode without --compile: a compiled "
                       "step's caches hold the whole context, an eager one's only the positions the prompt "
                       "and the new tokens reach")
    several = "ask for fewer samples, fewer new tokens or a shorter prompt"
    for n, compile, advice in [(1, False, eager), (3, False, several), (1, True, compiled),
                               (3, True, f"ask for fewer samples, or {compiled}")]:
        with pytest.raises(ConfigError) as refused:
            list(generate_samples(model, char_tokenizer, "RO", n, max_new_tokens=5, seed=0, compile=compile))
        assert str(refused.value).endswith(f" available here; {advice}"), (n, compile, str(refused.value))


def test_a_compiled_generation_that_reaches_the_whole_context_is_not_told_that_eager_caches_are_smaller(
        tiny_model, char_tokenizer, monkeypatch):
    # 100 new tokens on a context of 24: an eager generation's caches hold the whole context too, so
    # "decode without --compile" alone sent the user to a run refused all the same.
    from tinyattn.model import memory

    model = tiny_model(vocab_size=char_tokenizer.vocab_size)
    monkeypatch.setattr(memory, "available_bytes", lambda device: (100, "available here"))
    both = ("fewer new tokens or a shorter prompt, and decode without --compile: a compiled step's caches "
            "hold the whole context, an eager one's only the positions the prompt and the new tokens reach")
    for n, advice in [(1, f"ask for {both}"), (3, f"ask for fewer samples, or for {both}")]:
        with pytest.raises(ConfigError) as refused:
            list(generate_samples(model, char_tokenizer, "RO", n, max_new_tokens=100, seed=0, compile=True))
        assert str(refused.value).endswith(f" available here; {advice}"), (n, str(refused.value))
    with pytest.raises(ConfigError, match="; ask for fewer new tokens or a shorter prompt$"):
        list(generate_samples(model, char_tokenizer, "RO", 1, max_new_tokens=100, seed=0))


def test_one_sequence_whose_kv_caches_cannot_fit_is_named_in_the_singular(monkeypatch):
    from tinyattn.config import ModelConfig
    from tinyattn.errors import ConfigError
    from tinyattn.model import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: (1000, "available here"))
    config = ModelConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, context_length=64)
    with pytest.raises(ConfigError, match=r"^decoding 1 sequence at once needs .* for their KV caches alone, "
                                          r"more than the .* available here; free some memory first$"):
        memory.check_decoding_fits(config, 1, torch.device("cpu"), torch.float32)  # one: not "fewer samples"


def test_the_kv_caches_are_sized_in_their_own_dtype_and_a_gpus_reserved_blocks_count_as_free(monkeypatch):
    from tinyattn.model import memory

    config = ModelConfig(vocab_size=65, n_layer=2, n_head=2, n_embd=32, context_length=64)
    fp32_need = 2 * 2 * 3 * 2 * 64 * 16 * 4  # keys and values, layers, sequences, heads, positions, D, bytes
    monkeypatch.setattr(memory, "available_bytes", lambda device: (fp32_need - 1, "free here"))
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    with pytest.raises(ConfigError, match="decoding 3 sequences at once"):
        memory.check_decoding_fits(config, 3, cpu, torch.float32)
    memory.check_decoding_fits(config, 3, cpu, torch.bfloat16)  # half the bytes: fits
    # On a GPU, blocks torch keeps reserved but holds nothing in are free to the caches too.
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2999)
    memory.check_decoding_fits(config, 3, gpu, torch.float32)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3000)
    with pytest.raises(ConfigError, match="decoding 3 sequences at once"):
        memory.check_decoding_fits(config, 3, gpu, torch.float32)


# ----------------------------------------------------------------------------- stdout that fails, stops


class FullDisk(io.StringIO):
    """A stdout on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(28, "No space left on device")


def test_cli_a_stdout_that_cannot_take_the_text_is_one_line_not_a_traceback(monkeypatch):
    import tinyattn.generate.text as text_module

    from tinyattn.cli.generate import StreamPrinter
    from tinyattn.errors import StorageError

    monkeypatch.setattr(text_module, "stream_samples", lambda *args, **kwargs: iter([SamplePiece(0, "ab")]))
    printer = StreamPrinter(FullDisk(), None, None, SamplingOptions())
    message = r"^stdout: cannot write the generated text \(No space left on device\)$"
    with pytest.raises(StorageError, match=message):
        printer.run("P:", echo=True)


def test_cli_a_reader_that_goes_away_ends_quietly_with_status_141_not_as_a_full_disk(monkeypatch, capsys):
    # `tinyattn generate ... | head`: a closed pipe is not a stdout that cannot take the text.
    import tinyattn.generate.text as text_module

    from tinyattn.cli import run_command
    from tinyattn.cli.generate import StreamPrinter

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(text_module, "stream_samples", lambda *args, **kwargs: iter([SamplePiece(0, "ab")]))
    printer = StreamPrinter(Gone(), None, None, SamplingOptions())
    assert run_command(lambda: printer.run("P:", echo=True)) == 141
    assert capsys.readouterr().err == ""


def test_cli_a_stdin_prompt_that_is_not_in_stdins_encoding_is_a_data_error():
    from tinyattn.cli.generate import read_stdin

    def read():
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    with pytest.raises(DataError, match=r"^stdin: the prompt is not \S+ text \(invalid start byte\)$"):
        read_stdin(read)


@pytest.mark.parametrize("argv", [["-"], ["--prompt-file", "-"]], ids=["dash", "prompt-file-dash"])
def test_cli_a_stdin_prompt_is_decoded_in_stdins_own_encoding(monkeypatch, argv):
    # A Latin-1 terminal's "café" is one byte per character: read as UTF-8 it would be refused.
    from tinyattn.cli.generate import build_parser, read_prompt

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("café\n".encode("latin-1")),
                                                       encoding="latin-1"))
    assert read_prompt(build_parser().parse_args(argv)) == "café\n"


@pytest.mark.parametrize("data, message", [
    (b"ab\xffcd", "error: stdin: the prompt is not utf-8 text (invalid start byte)"),
    (b"\xff\xfeR\x00", "error: stdin: the prompt is not utf-8 text (invalid start byte): it starts with "
                       "UTF-16's byte-order mark; save it as UTF-8"),
], ids=["not-utf8", "utf16-with-its-mark"])
@pytest.mark.parametrize("argv", [["-"], ["--prompt-file", "-"]], ids=["dash", "prompt-file-dash"])
def test_cli_a_stdin_prompt_not_in_stdins_encoding_is_named_as_stdins_where_python_escapes_its_bytes(
        run_dir, capsys, monkeypatch, argv, data, message):
    # Under the C and C.UTF-8 locales Python's stdin escapes the bytes it cannot decode (surrogateescape)
    # instead of failing: the prompt went on and ended in "the prompt is not valid UTF-8 text (after 2
    # characters: '\\udcff')", naming neither stdin nor its bytes.
    stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, out, err = run_main(["--checkpoint", str(run_dir), "--max-new-tokens", "4", *argv], capsys)
    assert (status, out) == (2, ""), err
    assert err.splitlines()[-1] == message


@pytest.mark.parametrize("argv, given", [(["-"], "-"), (["--prompt-file", "-"], "--prompt-file -"),
                                         (["--interactive"], "--interactive")],
                         ids=["dash", "prompt-file-dash", "interactive"])
def test_cli_a_prompt_from_a_closed_stdin_is_one_line_and_exit_status_2(run_dir, capsys, monkeypatch, argv,
                                                                        given):
    # `tinyattn generate - <&-` (or a service started without stdin): Python's sys.stdin is None, and
    # the command ended in AttributeError: 'NoneType' object has no attribute 'read' (or 'isatty').
    monkeypatch.setattr(sys, "stdin", None)
    status, out, err = run_main(["--checkpoint", str(run_dir), "--max-new-tokens", "4", *argv], capsys)
    assert (status, out) == (2, ""), err
    what = "prompts" if given == "--interactive" else "the prompt"
    assert err == (f"error: {given} reads {what} from stdin, which is closed; give the prompt with --prompt "
                   "TEXT or --prompt-file FILE\n")


@pytest.mark.parametrize("argv", [["-"], ["--prompt-file", "-"]], ids=["dash", "prompt-file-dash"])
def test_cli_a_stdin_prompt_reads_windows_newlines_as_the_same_prompt_file_does(
        run_dir, tmp_path, capsys, monkeypatch, argv):
    # `tinyattn generate - < prompt.txt` of a file saved with \r\n: Python's stdin translates no newline
    # on Linux (newline="\n"), so each \r was read as [UNK], with a warning, where --prompt-file
    # prompt.txt reads a newline.
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"All:\r\nno\rmore")
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "4", "--seed", "1"]
    status, from_file, _ = run_main([*options, "--prompt-file", str(path)], capsys)
    assert status == 0 and from_file.startswith("All:\nno\nmore")
    stdin = io.TextIOWrapper(io.BytesIO(path.read_bytes()), encoding="utf-8", newline="\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    status, from_stdin, err = run_main([*options, *argv], capsys)
    assert (status, from_stdin) == (0, from_file), err
    assert "[UNK]" not in err, err


@pytest.mark.slow  # a fresh Python process
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_cli_generating_into_a_full_disk_ends_in_one_line_with_status_2(run_dir):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"), "--checkpoint",
                                 str(run_dir), "--prompt", "All:", "--max-new-tokens", "5"],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: stdout: cannot write the generated text")


def test_cli_ctrl_c_ends_the_partial_texts_line_before_the_message(monkeypatch):
    import tinyattn.generate.text as text_module

    from tinyattn.cli.generate import StreamPrinter

    def pieces(*args, **kwargs):
        yield SamplePiece(0, "half a li")
        raise KeyboardInterrupt

    monkeypatch.setattr(text_module, "stream_samples", pieces)
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        StreamPrinter(out, None, None, SamplingOptions()).run("P:", echo=True)
    assert out.getvalue() == "P:half a li\n"  # "interrupted" then starts a line of its own


@pytest.mark.slow  # a fresh Python process, stopped by a signal
def test_cli_sigterm_stops_as_ctrl_c_does(run_dir):
    import signal

    # --interactive, waiting for its second prompt: a stop that no end-of-text token can pre-empt.
    # A seed: a continuation whose first token ended the text would print nothing, not even its
    # newline, and the readline below would wait for ever (it did, once in a dozen runs).
    import select

    process = warm_python.Popen([sys.executable, str(ROOT / "scripts" / "generate.py"), "--checkpoint",
                                 str(run_dir), "--interactive", "--max-new-tokens", "3", "--seed", "1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    process.stdin.write("All:\n")
    process.stdin.flush()
    assert select.select([process.stdout], [], [], 60)[0], "no continuation in 60 s"
    assert process.stdout.readline()  # the first continuation, ended by its newline
    process.send_signal(signal.SIGTERM)
    err = process.communicate(timeout=60)[1]
    assert process.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "stopped by SIGTERM"


# ----------------------------------------------------------------------------- greedy, length, row copies


def test_temperature_zero_takes_the_first_of_tied_tokens_and_draws_nothing():
    # Greedy is argmax, not a draw at a tiny temperature: a tie goes to the first token whatever the
    # seed, and the generator is left as it was.
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        state = generator.get_state()
        assert sample_next_token(logits, generator, temperature=0.0).tolist() == [1]
        assert torch.equal(generator.get_state(), state)


def test_a_sample_that_reaches_max_new_tokens_finishes_as_length_with_its_tokens_counted():
    small, model = abc_chain()  # a -> b -> c -> end of text
    pieces = list(generate_samples(model, small, "a", 2, max_new_tokens=2, temperature=0))
    assert [(p.sample, p.text, p.finish_reason, p.tokens) for p in pieces if p.finish_reason] == [
        (0, "", "length", 2), (1, "bc", "length", 2)]


def test_a_batchs_logits_that_are_not_finite_leave_the_row_copies_it_does_not_multiply_by(tiny_model,
                                                                                          tokenizer):
    # Only one sequence multiplies by the fp16 copies: a batch's logits are the fp32 weights', so no
    # fp16 overflow made them what they are, and the copies stay, without a warning saying otherwise.
    rows = perturbed(tiny_model(context_length=24))
    with torch.no_grad():
        rows.final_norm.weight.fill_(float("inf"))  # logits no fp32 arithmetic makes finite
    if not pack_linear_weights(rows, row_dtype=torch.float16):
        pytest.skip("this torch build cannot pack weights for oneDNN")
    ids = random_ids(tokenizer.vocab_size, 4, batch=2)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder = CachedDecoder(rows, batch_size=2)
        logits = decoder.step(decoder.prefill(ids[:, :2]).argmax(-1))
    assert not torch.isfinite(logits).all() and has_row_weights(rows)


# ----------------------------------------------------------------------------- command defaults, warnings


def test_cli_options_not_typed_are_the_checkpoints_saved_ones():
    # The trained run saves no top-k, top-p 1 and no penalty: here every field is saved away from its default.
    from tinyattn.cli.generate import build_parser, sampling_options

    saved = SampleConfig(max_new_tokens=9, temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.3)
    o = sampling_options(build_parser().parse_args([]), saved, [])
    assert (o.max_new_tokens, o.temperature, o.top_k, o.top_p, o.repetition_penalty) == (9, 0.7, 5, 0.9, 1.3)
    o = sampling_options(build_parser().parse_args(["--top-k", "0", "--top-p", "1"]), saved, [])
    assert (o.top_k, o.top_p) == (0, 1.0)  # typed values win, "off" ones too


def test_cli_interactive_warns_about_each_prompt_not_only_the_first_alike(run_dir, capsys, monkeypatch):
    options = ["--checkpoint", str(run_dir), "--max-new-tokens", "2", "--temperature", "0", "--dtype", "fp32"]
    status, _, err = run_main([*options, "--interactive"], capsys, stdin="Spéak\nSpéak\n",
                              monkeypatch=monkeypatch)
    assert status == 0 and err.count("read as [UNK]: 'é'") == 2, err
