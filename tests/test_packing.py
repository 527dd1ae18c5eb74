"""Packed weights: the same numbers as nn.Linear, and a model left alone where packing fails."""

import copy
import types

import pytest
import torch

from tinyattn.generate.cpu_weights import (ONEDNN, PackedLinear, _packing_works, aten_kernels, matrix_vector,
                                           pack_linear_weights)
from tinyattn.generate.decoder import generate_tokens


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_weights_give_the_same_logits_and_tokens(tiny_model, random_tokens, dtype):
    model = tiny_model(n_kv_head=2).to(dtype)
    packed = copy.deepcopy(model)
    if dtype == torch.bfloat16 and not pack_linear_weights(packed):
        pytest.skip("this CPU's oneDNN does not multiply bf16")  # refused, as it should be
    assert dtype == torch.bfloat16 or pack_linear_weights(packed)
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 2 * 4 + 1  # 4 per block, head
    assert packed.head.weight is packed.token_embedding.weight  # still tied, counted once
    assert packed.num_parameters() == model.num_parameters()
    ids = random_tokens(length=16)
    with torch.inference_mode():
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(packed(ids).logits, model(ids).logits, rtol=0, atol=tolerance)
    prompt = ids[:, :4]
    if dtype == torch.float32:
        assert torch.equal(torch.stack(list(generate_tokens(packed, prompt, 40, temperature=0))),
                           torch.stack(list(generate_tokens(model, prompt, 40, temperature=0))))
    with pytest.raises(RuntimeError, match="inference only"):
        packed(ids)  # gradients would be wrong: refused


def test_a_model_off_the_cpu_is_left_unpacked():
    # A GPU model multiplies through its own kernels; a meta model stands in for it on any machine.
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False)).to("meta")
    assert not pack_linear_weights(model)
    assert type(model[0]) is torch.nn.Linear


@pytest.mark.parametrize("missing", ["namespace", "operator", "failing"])
def test_without_the_private_operators_the_model_is_left_unchanged(tiny_model, random_tokens, monkeypatch, missing):
    operators = ONEDNN
    if missing == "namespace":  # a build without oneDNN's operators at all
        monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())
    elif missing == "operator":  # renamed or removed in a later release
        operators = ONEDNN._replace(reorder=lambda weight: torch.ops.mkldnn._no_such_operator(weight))
    else:  # present, but refuses this input
        def refuse(x, packed):
            raise RuntimeError("unsupported")
        operators = ONEDNN._replace(linear=refuse)
    model = tiny_model()
    before = {name: type(module) for name, module in model.named_modules()}
    assert not pack_linear_weights(model, operators)
    assert {name: type(module) for name, module in model.named_modules()} == before
    ids = random_tokens(length=8)
    torch.testing.assert_close(model(ids).logits, tiny_model()(ids).logits, rtol=0, atol=0)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_one_bf16_row_multiplies_through_atens_kernel_and_more_rows_through_onednn():
    if not _packing_works(torch.bfloat16, ONEDNN):
        pytest.skip("this CPU's oneDNN does not multiply bf16")  # packing refuses bf16 here
    calls = []
    def counted(x, packed):
        calls.append(x.shape)
        return ONEDNN.linear(x, packed)
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    layer = PackedLinear(weight, ONEDNN._replace(linear=counted))
    one, two = (torch.randn(*shape, generator=torch.Generator().manual_seed(1)).bfloat16() for shape in [(1, 1, 32), (2, 1, 32)])
    with torch.inference_mode():
        torch.testing.assert_close(layer(one), torch.nn.functional.linear(one, weight), rtol=0, atol=3e-2)
        assert calls == []  # a decode step of one sequence: aten's matrix-vector kernel
        torch.testing.assert_close(layer(two), torch.nn.functional.linear(two, weight), rtol=0, atol=3e-2)
        assert calls == [(2, 1, 32)]  # two sequences: the packed weight


def test_matrix_vector_switches_onednn_back_on_even_after_a_failure(monkeypatch):
    one = torch.randn(1, 1, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert torch._C._get_mkldnn_enabled()
    seen = []
    def mv(w, x):
        seen.append(torch._C._get_mkldnn_enabled())
        return w @ x
    monkeypatch.setattr(torch, "mv", mv)
    torch.testing.assert_close(matrix_vector(one, weight), one @ weight.T, rtol=0, atol=0)
    assert seen == [False] and torch._C._get_mkldnn_enabled()  # off for the call, back on after it
    monkeypatch.setattr(torch, "mv", lambda w, x: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        matrix_vector(one, weight)
    assert torch._C._get_mkldnn_enabled()  # ... even after one that failed


def test_onednn_comes_back_on_when_the_last_open_block_closes_whichever_opened_first():
    # Two threads' blocks overlapping: the first to open closes first. oneDNN stays off while the
    # second is open and is back on, as it was, after both (saving the flag per block left it off).
    assert torch._C._get_mkldnn_enabled()
    first, second = aten_kernels(), aten_kernels()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not torch._C._get_mkldnn_enabled()
    second.__exit__(None, None, None)
    assert torch._C._get_mkldnn_enabled()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_with_fp16_copies_one_row_multiplies_in_fp16_and_more_rows_by_the_fp32_weight():
    calls = []
    def counted(x, packed):
        calls.append(x.shape)
        return ONEDNN.linear(x, packed)
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0))
    layer = PackedLinear(weight, ONEDNN._replace(linear=counted), row_dtype=torch.float16)
    assert layer.row_weight.dtype == torch.float16 and layer.weight.dtype == torch.float32
    one, two = (torch.randn(*shape, generator=torch.Generator().manual_seed(1)) for shape in [(1, 1, 32), (2, 1, 32)])
    with torch.inference_mode():
        product = layer(one)  # a decode step of one sequence: row and weight rounded to fp16
        assert product.dtype == torch.float32 and calls == []
        assert torch.equal(product, matrix_vector(one.half(), weight.half()).float())
        assert not torch.equal(product, torch.nn.functional.linear(one, weight))  # not fp32's own numbers ...
        torch.testing.assert_close(product, torch.nn.functional.linear(one, weight), rtol=0, atol=1e-2)  # ... near them
        torch.testing.assert_close(layer(two), torch.nn.functional.linear(two, weight), rtol=0, atol=1e-5)
        assert calls == [(2, 1, 32)]  # two sequences (a prefill too): the fp32 packed weight
    assert PackedLinear(weight, row_dtype=torch.float32).row_weight is None  # a copy in its own dtype: none
    with pytest.raises(ValueError, match="beside fp32 weights only; this model's are torch.bfloat16"):
        pack_linear_weights(torch.nn.Sequential(torch.nn.Linear(32, 48, bias=False)).bfloat16(),
                            row_dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matrix_vector_gives_aten_linears_numbers_for_one_row(dtype):
    # torch.mv is the same kernel as F.linear of one row with oneDNN off, in fewer calls: the tokens
    # of a decode step did not change when it replaced F.linear
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1152, 384, generator=generator).to(dtype)
    one = torch.randn(1, 1, 384, generator=generator).to(dtype)
    with aten_kernels():
        expected = torch.nn.functional.linear(one, weight)  # (1, 1, 1152)
    product = matrix_vector(one, weight)
    assert product.shape == expected.shape and torch.equal(product, expected)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_a_linear_layer_with_a_bias_is_not_packed_and_keeps_its_output():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8, bias=False)).eval()
    x = torch.randn(3, 16)
    with torch.inference_mode():
        expected = model(x)
        assert pack_linear_weights(model)
        assert type(model[0]) is torch.nn.Linear and isinstance(model[1], PackedLinear)  # bias-free only
        torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-5)  # its bias still added


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_operators_that_give_wrong_numbers_leave_the_model_unpacked(tiny_model):
    def off_by_a_little(x, packed):
        return ONEDNN.linear(x, packed) * 1.01
    model = tiny_model()
    before = {name: type(module) for name, module in model.named_modules()}
    assert not pack_linear_weights(model, ONEDNN._replace(linear=off_by_a_little))
    assert {name: type(module) for name, module in model.named_modules()} == before
    assert pack_linear_weights(model, ONEDNN)  # the same model, with the right numbers: packed


def test_aten_kernels_puts_back_the_onednn_setting_it_found_even_when_it_was_off():
    assert torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)  # switched off by the user (torch.backends.mkldnn.flags)
    try:
        with aten_kernels():
            assert not torch._C._get_mkldnn_enabled()
        assert not torch._C._get_mkldnn_enabled()  # left off, not switched on
    finally:
        torch._C._set_mkldnn_enabled(True)
