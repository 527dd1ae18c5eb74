"""The KV cache: decoding one position at a time equals recomputing the whole sequence."""

import pytest
import torch

from tinyattn.model.attention import causal_mask
from tinyattn.model.kv_cache import KVCache, cache_writes


@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("prefill", [1, 9])
def test_cached_decoding_equals_full_forward(tiny_model, random_tokens, n_kv_head, prefill):
    model = tiny_model(n_kv_head=n_kv_head)
    idx = random_tokens(length=24)
    full = model(idx).logits  # (B, 24, V)
    caches = model.new_kv_caches(batch_size=2)
    with torch.no_grad():
        step_logits = [model(idx[:, :prefill], kv_caches=caches).logits]  # the prompt in one pass
        for pos in range(prefill, 24):
            step_logits.append(model(idx[:, pos:pos + 1], kv_caches=caches, start_pos=pos).logits)
    torch.testing.assert_close(torch.cat(step_logits, dim=1), full, rtol=0, atol=1e-5)


def test_chunked_prefill_uses_the_causal_mask_within_the_chunk(tiny_model, random_tokens):
    model = tiny_model()
    idx = random_tokens(length=24)
    caches = model.new_kv_caches(batch_size=2)
    with torch.no_grad():
        first = model(idx[:, :10], kv_caches=caches).logits
        second = model(idx[:, 10:], kv_caches=caches, start_pos=10).logits
    torch.testing.assert_close(torch.cat([first, second], 1), model(idx).logits, rtol=0, atol=1e-5)


def test_prefill_in_chunks_of_every_size_equals_the_full_forward(tiny_model, random_tokens):
    """Each chunk after the first reads the cache and is causal within itself, two tokens long too."""
    model = tiny_model(n_kv_head=2)
    idx = random_tokens(length=24)
    caches = model.new_kv_caches(batch_size=2)
    logits, start = [], 0
    with torch.no_grad():
        for size in (3, 2, 1, 4, 6, 8):  # 24 tokens
            logits.append(model(idx[:, start:start + size], kv_caches=caches, start_pos=start).logits)
            start += size
    torch.testing.assert_close(torch.cat(logits, dim=1), model(idx).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_a_callers_mask_holds_for_tokens_written_into_the_caches(tiny_model, random_tokens, attention):
    """A left-padded prompt prefilled into the caches reads what it reads without them; on the explicit
    path too, where a padded query that may read no key must give zeros, not NaN, to the next layer."""
    model = tiny_model(attention=attention)
    idx = random_tokens(length=10)
    real = torch.ones(2, 10, dtype=torch.bool)
    real[1, :3] = False  # sequence 1's first three tokens are padding
    allowed = causal_mask(10, 10)[None, None] & real[:, None, None, :]  # (B, 1, T, T)
    with torch.no_grad():
        cached = model(idx, mask=allowed, kv_caches=model.new_kv_caches(batch_size=2)).logits
        torch.testing.assert_close(cached[real], model(idx, mask=allowed).logits[real], rtol=0, atol=1e-5)


def test_explicit_path_with_cache_returns_weights_over_all_keys(tiny_model, random_tokens):
    model = tiny_model()
    idx = random_tokens(length=6)
    caches = model.new_kv_caches(batch_size=2)
    model(idx[:, :5], kv_caches=caches)
    out = model(idx[:, 5:], kv_caches=caches, start_pos=5, need_weights=True)
    assert out.attention_weights[0].shape == (2, 4, 1, 6)
    full = model(idx, need_weights=True).attention_weights[0][:, :, 5:]
    torch.testing.assert_close(out.attention_weights[0], full, rtol=0, atol=1e-6)


def test_cache_update_returns_prefix_and_refuses_overflow():
    cache = KVCache(batch_size=1, n_kv_head=2, max_len=4, head_dim=3)
    k = torch.randn(1, 2, 3, 3)
    keys, values = cache.update(0, k, k + 1)
    assert keys.shape == (1, 2, 3, 3) and torch.equal(keys, k) and torch.equal(values, k + 1)
    keys, _ = cache.update(3, k[:, :, :1], k[:, :, :1])
    assert keys.shape == (1, 2, 4, 3)
    with pytest.raises(ValueError, match="holds 4 positions"):
        cache.update(3, k, k)


@pytest.mark.parametrize("dtype", [None, torch.float32], ids=["weights-dtype", "fp32"])
def test_a_bf16_models_caches_keep_the_dtype_asked_for_and_decode_like_the_full_forward(tiny_model, random_tokens,
                                                                                        dtype):
    """None: the weights' bf16; fp32: what decoding on a CPU asks for. Attention computes in the cache's
    dtype and hands the model back its own."""
    model = tiny_model(n_kv_head=2).to(torch.bfloat16)
    idx = random_tokens(length=12)
    caches = model.new_kv_caches(batch_size=2, dtype=dtype)
    assert all(c.keys.dtype == c.values.dtype == (dtype or torch.bfloat16) for c in caches)
    with torch.no_grad():
        steps = [model(idx[:, :6], kv_caches=caches).logits]
        steps += [model(idx[:, pos:pos + 1], kv_caches=caches, start_pos=pos).logits for pos in range(6, 12)]
        full = model(idx).logits
    assert all(step.dtype == torch.bfloat16 for step in steps)
    torch.testing.assert_close(torch.cat(steps, dim=1).float(), full.float(), rtol=0, atol=2e-2)


@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["mha", "gqa"])
def test_decoding_at_position_tensors_equals_full_forward_and_hides_unwritten_slots(tiny_model, random_tokens, n_kv_head):
    model = tiny_model(n_kv_head=n_kv_head)
    idx = random_tokens(length=24)
    full = model(idx).logits  # (B, 24, V)
    caches = model.new_kv_caches(batch_size=2)
    for cache in caches:  # what a previous sequence left behind must not be seen
        cache.keys.normal_()
        cache.values.normal_()
    with torch.no_grad():
        step_logits = [model(idx[:, :9], kv_caches=caches, positions=torch.arange(9)).logits]
        for pos in range(9, 24):
            logits = model(idx[:, pos:pos + 1], kv_caches=caches, positions=torch.tensor([pos])).logits
            step_logits.append(logits)
    torch.testing.assert_close(torch.cat(step_logits, dim=1), full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="positions needs kv_caches"):
        model(idx[:, :1], positions=torch.tensor([0]))
    with pytest.raises(ValueError, match="builds its own mask"):  # a mask given would be ignored
        model(idx[:, :1], kv_caches=caches, positions=torch.tensor([0]), mask=torch.ones(1, 24).bool())


def test_caches_shorter_than_the_context_hold_the_length_asked_for(tiny_model, random_tokens):
    model = tiny_model()  # context 24
    idx = random_tokens(length=10)
    caches = model.new_kv_caches(batch_size=2, max_len=10)
    assert all(c.max_len == 10 and c.keys.shape == (2, 4, 10, 8) for c in caches)
    with torch.no_grad():
        logits = model(idx, kv_caches=caches).logits
        torch.testing.assert_close(logits, model(idx).logits, rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="KV cache holds 10 positions; asked to write up to 11"):
            model(idx[:, :1], kv_caches=caches, start_pos=10)


def test_cache_write_stores_at_the_positions_and_returns_every_slot():
    cache = KVCache(batch_size=1, n_kv_head=2, max_len=4, head_dim=3)
    k = torch.randn(1, 2, 2, 3)
    keys, values = cache.write(torch.tensor([1, 3]), k, k + 1)
    assert keys is cache.keys and values is cache.values and keys.shape == (1, 2, 4, 3)
    assert torch.equal(keys[:, :, [1, 3]], k) and torch.equal(values[:, :, [1, 3]], k + 1)
    assert torch.all(keys[:, :, [0, 2]] == 0)


def test_a_cache_write_gives_back_the_keys_values_and_mask_attention_reads():
    caches = [KVCache(batch_size=1, n_kv_head=2, max_len=5, head_dim=3) for _ in range(2)]
    k = torch.randn(1, 2, 2, 3)
    dynamic = cache_writes(caches, start_pos=1)
    keys, values, mask = dynamic[1].store(k, k + 1)
    assert keys.shape == (1, 2, 3, 3) and mask is None and not dynamic[1].reads_every_slot
    assert torch.equal(caches[1].keys[:, :, 1:3], k) and torch.all(caches[0].keys == 0)
    static = cache_writes(caches, positions=torch.tensor([3, 4]))
    keys, values, mask = static[0].store(k, k + 1)
    assert keys is caches[0].keys and values is caches[0].values and static[0].reads_every_slot
    assert torch.equal(mask, torch.tensor([[True, True, True, True, False], [True] * 5]))
    assert static[1].mask is mask  # built once per forward, shared by the layers
