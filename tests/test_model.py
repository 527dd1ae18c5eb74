"""The model's invariants: causality, fused == explicit, masks, weights, RoPE, dropout, the attention
path choice, init loss, learning."""

import math

import pytest
import torch

from tinyattn.config import ModelConfig
from tinyattn.model.attention import (
    CausalSelfAttention,
    apply_rotary,
    attention,
    causal_mask,
    recording_attention_weights,
    rotary_tables,
)
from tinyattn.model.attention_path import attention_path, prefer_explicit_attention
from tinyattn.model.dropout import Dropout
from tinyattn.model.transformer import IGNORE_INDEX, Block, LanguageModel
from tinyattn.system.device import Precision

VOCAB = 65  # conftest's tiny_model and random_tokens


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "attention_gate": True},
                                     {"qk_norm": True, "attention_gate": True, "attention_gate_rank": 4}],
                         ids=["llama", "gated", "gated-rank-4"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_causal_mask_leaks_nothing_from_the_future(tiny_model, random_tokens, need_weights, n_kv_head,
                                                   options):
    model = tiny_model(n_kv_head=n_kv_head, **options)
    idx = random_tokens()
    logits = model(idx, need_weights=need_weights).logits
    for t in (0, 5, 17):
        changed = idx.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 7) % VOCAB  # every later token differs
        after = model(changed, need_weights=need_weights).logits
        torch.testing.assert_close(after[:, :t + 1], logits[:, :t + 1], rtol=0, atol=1e-6)
        assert (after[:, t + 1:] - logits[:, t + 1:]).abs().max() > 1e-3  # later ones do change


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "attention_gate": True},
                                     {"qk_norm": True, "attention_gate": True, "attention_gate_rank": 4}],
                         ids=["llama", "gated", "gated-rank-4"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_fused_path_equals_explicit_path(tiny_model, random_tokens, n_kv_head, options):
    model = tiny_model(n_kv_head=n_kv_head, **options)
    idx = random_tokens()
    fused = model(idx).logits
    explicit = model(idx, need_weights=True).logits
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)
    bidirectional = torch.ones(24, 24, dtype=torch.bool)
    torch.testing.assert_close(model(idx, mask=bidirectional).logits,
                               model(idx, mask=bidirectional, need_weights=True).logits, rtol=0, atol=1e-5)


def _spread(model):
    """The model with every weight nudged well past its 0.02 init, so that its scores matter."""
    with torch.no_grad():
        for i, param in enumerate(model.parameters()):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)) * 0.3)
    return model


@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["mha", "gqa"])
def test_an_undivided_model_computes_the_same_on_both_paths_and_not_what_a_divided_one_does(
        tiny_model, random_tokens, n_kv_head):
    # model.scale_scores false (tinyattn lab scaling): the fused kernel is given scale 1, the explicit
    # path divides by 1; a path that kept 1/sqrt(d_k) would differ from the other, and both from a
    # divided model only if neither kept it.
    undivided = _spread(tiny_model(n_kv_head=n_kv_head, scale_scores=False))
    divided = _spread(tiny_model(n_kv_head=n_kv_head))
    idx = random_tokens()
    fused = undivided(idx).logits
    torch.testing.assert_close(fused, undivided(idx, need_weights=True).logits, rtol=0, atol=1e-4)
    assert (fused - divided(idx).logits).abs().max() > 1e-2


def test_an_undivided_models_attention_rows_are_softmax_of_sqrt_d_times_a_divided_ones_scores(
        tiny_model, random_tokens):
    # The same weights, undivided: every score is sqrt(d_k) times the divided model's, so each row
    # is softmax(sqrt(d_k) * log w) of the divided row w (log w is the scores less a row constant).
    divided, undivided = _spread(tiny_model(n_layer=1)), _spread(tiny_model(n_layer=1, scale_scores=False))
    idx = random_tokens()
    with recording_attention_weights(divided) as w, recording_attention_weights(undivided) as u:
        divided(idx), undivided(idx)
    d_k = divided.config.head_dim
    expected = torch.softmax(math.sqrt(d_k) * w[0].log(), dim=-1)  # masked keys: log 0 = -inf, weight 0
    torch.testing.assert_close(u[0], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
def test_bidirectional_mask_lets_later_tokens_change_earlier_outputs(tiny_model, random_tokens, need_weights):
    model = tiny_model()
    idx = random_tokens()
    everything = torch.ones(24, 24, dtype=torch.bool)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB  # only the last token differs
    before = model(idx, mask=everything, need_weights=need_weights).logits
    after = model(changed, mask=everything, need_weights=need_weights).logits
    assert (after[:, 0] - before[:, 0]).abs().max() > 1e-4  # position 0 saw position 23


def test_padding_mask_hides_padded_keys(tiny_model, random_tokens):
    model = tiny_model()
    idx = random_tokens(batch=1)
    # Padding mask: causal, and the last 4 positions are padding no query may look at.
    allowed = causal_mask(24, 24) & (torch.arange(24) < 20)
    allowed[20:, 20:] |= torch.eye(4, dtype=torch.bool)  # padded queries see themselves only
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 3) % VOCAB
    torch.testing.assert_close(model(idx, mask=allowed).logits[:, :20],
                               model(changed, mask=allowed).logits[:, :20], rtol=0, atol=1e-6)



def test_a_left_padded_row_that_may_read_no_key_is_zero_on_both_paths_not_nan(tiny_model, random_tokens):
    # Left padding: sequence 1's first 3 positions are padding, which no query may read, so those
    # queries have no key at all. Softmax over -inf alone is NaN, which the next layer spread.
    model = tiny_model(n_kv_head=2)
    idx = random_tokens(batch=2)
    real = torch.ones(2, 24, dtype=torch.bool)
    real[1, :3] = False
    allowed = causal_mask(24, 24)[None, None] & real[:, None, None, :]  # (B, 1, T, T)
    fused = model(idx, mask=allowed).logits
    explicit = model(idx, mask=allowed, need_weights=True)
    assert explicit.logits.isfinite().all()
    torch.testing.assert_close(explicit.logits[real], fused[real], rtol=0, atol=1e-5)
    assert all(torch.all(w[1, :, :3] == 0) for w in explicit.attention_weights)  # no key: no weight
    model.train()
    model(idx, mask=allowed, need_weights=True).logits[real].sum().backward()
    assert all(p.grad.isfinite().all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("n_kv_head", [4, 2], ids=["mha", "gqa"])
def test_the_output_of_a_query_that_may_read_no_key_is_zero_on_both_paths(n_kv_head):
    """Left padding at the layer: queries 0 and 1 may read no key. The explicit path zeroes their
    output (not only their weights), as the fused kernel does, and the two paths agree everywhere."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(ModelConfig(vocab_size=65, n_head=4, n_kv_head=n_kv_head, n_embd=32,
                                            context_length=6)).eval()
    x = torch.randn(2, 6, 32)
    cos, sin = rotary_tables(8, 6, 10000.0)
    allowed = causal_mask(6, 6) & (torch.arange(6) >= 2)  # (T, T): keys 0 and 1 are padding
    fused = layer(x, cos=cos, sin=sin, mask=allowed)
    layer.fused = False
    explicit = layer(x, cos=cos, sin=sin, mask=allowed)
    assert torch.all(explicit[:, :2] == 0) and torch.all(fused[:, :2] == 0)
    torch.testing.assert_close(explicit, fused, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_the_attention_gate_scales_each_output_element_by_the_sigmoid_of_its_own_row(fused):
    """model.attention_gate: the output projection reads attention(q, k, v) * sigmoid(x W_g), W_g
    the (C, C) rows stacked after the values in qkv; each element by its own row of W_g."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=65, n_head=4, n_kv_head=2, n_embd=32, context_length=6, qk_norm=True,
                         attention_gate=True)
    layer = CausalSelfAttention(config, fused=fused).eval()
    assert layer.qkv.weight.shape == (32 + 2 * 16 + 32, 32)
    x = torch.randn(2, 6, 32)
    cos, sin = rotary_tables(8, 6, 10000.0)
    read = []
    layer.output.register_forward_hook(lambda module, args, out: read.append(args[0]))
    gate = torch.randn(32, 32) * 0.5
    with torch.no_grad():
        layer.qkv.weight[64:] = gate
        layer(x, cos=cos, sin=sin)
        layer.qkv.weight[64:] = 0  # sigmoid(0) = 1/2 everywhere: the ungated output, halved
        layer(x, cos=cos, sin=sin)
    torch.testing.assert_close(read[0], 2 * read[1] * torch.sigmoid(x @ gate.T), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_a_gate_of_rank_r_is_the_gate_whose_matrix_is_the_product_of_its_two_and_merges_into_it(fused):
    """model.attention_gate_rank: sigmoid(x W_in^T W_out^T), the (C, C) gate matrix W_out W_in of
    rank r; `merge_gate` stacks that product into qkv as the gate's own rows, changing no output."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=65, n_head=4, n_kv_head=2, n_embd=32, context_length=6, qk_norm=True,
                         attention_gate=True, attention_gate_rank=3)
    ranked = _spread(CausalSelfAttention(config, fused=fused)).eval()
    assert ranked.qkv.weight.shape == (32 + 2 * 16, 32)  # no gate rows stacked: 2 x 3 x 32 weights instead
    assert ranked.gate_in.weight.shape == (3, 32) and ranked.gate_out.weight.shape == (32, 3)
    own_matrix = ModelConfig(**{**config.__dict__, "attention_gate_rank": None})
    full = CausalSelfAttention(own_matrix, fused=fused).eval()
    product = ranked.gate_out.weight @ ranked.gate_in.weight  # (C, C), of rank 3
    assert torch.linalg.matrix_rank(product) == 3
    with torch.no_grad():
        full.load_state_dict({**{k: v for k, v in ranked.state_dict().items() if "gate_" not in k},
                              "qkv.weight": torch.cat([ranked.qkv.weight, product])})
        x = torch.randn(2, 6, 32)
        cos, sin = rotary_tables(8, 6, 10000.0)
        expected = full(x, cos=cos, sin=sin)
        torch.testing.assert_close(ranked(x, cos=cos, sin=sin), expected, rtol=0, atol=1e-5)
        ranked.merge_gate()
        assert ranked.gate_in is None and ranked.qkv_split == full.qkv_split
        torch.testing.assert_close(ranked(x, cos=cos, sin=sin), expected, rtol=0, atol=1e-5)


def test_a_model_with_gates_of_rank_r_merges_them_and_its_config_says_so(tiny_model, random_tokens):
    model = _spread(tiny_model(qk_norm=True, attention_gate=True, attention_gate_rank=4))
    idx = random_tokens()
    with torch.no_grad():
        before = model(idx).logits
        model.merge_attention_gates()
        after = model(idx).logits
    assert model.config.attention_gate and model.config.attention_gate_rank is None
    assert all(block.attention.gate_in is None for block in model.blocks)
    assert model.num_parameters() == LanguageModel(model.config).num_parameters()  # the gate's own (C, C)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    with torch.no_grad():
        model.blocks[0].attention.qkv.weight[-32:] = 0  # the merged rows are the gate: without them,
        assert (model(idx).logits - before).abs().max() > 1e-2  # other logits


def test_attention_weights_rows_sum_to_one_and_are_zero_where_masked(tiny_model, random_tokens):
    model = tiny_model(n_kv_head=2)
    out = model(random_tokens(), need_weights=True)
    assert len(out.attention_weights) == 2
    future = ~causal_mask(24, 24)
    for weights in out.attention_weights:
        assert weights.shape == (2, 4, 24, 24)  # (B, H, T, T)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 24), rtol=0, atol=1e-6)
        assert torch.all(weights[..., future] == 0)  # exactly zero, not just small
        assert torch.all(weights >= 0)


def test_attention_function_matches_its_definition():
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    out, weights = attention(q, k, v, causal_mask(5, 5))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    expected = torch.zeros_like(scores)
    for i in range(5):  # row i: softmax over keys 0..i only
        expected[..., i, :i + 1] = torch.softmax(scores[..., i, :i + 1], dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ v)


def test_attention_returns_the_weights_before_dropout():
    """With dropout the values are mixed by dropped weights, but the weights handed back (the
    attention maps) are the softmax's own: rows that sum to 1."""
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    torch.manual_seed(0)
    out, weights = attention(q, k, v, causal_mask(5, 5), dropout_p=0.5)
    torch.testing.assert_close(weights, attention(q, k, v, causal_mask(5, 5))[1], rtol=0, atol=0)
    assert not torch.allclose(out, weights @ v)  # the mix itself did drop


def test_logits_shape_and_loss_ignores_padding(tiny_model, random_tokens):
    model = tiny_model()
    idx = random_tokens(length=10)
    targets = random_tokens(length=10, seed=2)
    out = model(idx)
    assert out.logits.shape == (2, 10, VOCAB) and out.loss is None
    with_targets = model(idx, targets)
    assert with_targets.logits.shape == (2, 10, VOCAB)
    padded = targets.clone()
    padded[:, 5:] = IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(out.logits[:, :5].reshape(-1, VOCAB), targets[:, :5].reshape(-1))
    torch.testing.assert_close(model(idx, padded).loss, expected)


def test_the_loss_of_a_bf16_model_is_computed_from_its_logits_in_fp32(tiny_model, random_tokens):
    model = tiny_model().to(torch.bfloat16)
    idx, targets = random_tokens(length=10), random_tokens(length=10, seed=2)
    out = model(idx, targets)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32  # not to 3 digits
    expected = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, VOCAB), targets.reshape(-1))
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-6)


def test_next_token_logits_are_the_full_forwards_last_position(tiny_model, random_tokens):
    model = tiny_model()
    idx = random_tokens(length=10)
    last = model.next_token_logits(idx)
    assert last.shape == (2, VOCAB)
    torch.testing.assert_close(last, model(idx).logits[:, -1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_embd, vocab", [(32, 65), (384, 65), (256, 4096)])
def test_loss_at_initialisation_is_about_ln_vocab(n_embd, vocab):
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=vocab, n_layer=2, n_head=4, n_embd=n_embd,
                                      context_length=64)).eval()
    idx = torch.randint(0, vocab, (8, 64))
    targets = torch.randint(0, vocab, (8, 64))
    loss = model(idx, targets).loss.item()
    assert abs(loss - math.log(vocab)) < 0.1, (loss, math.log(vocab))


def test_tiny_model_overfits_one_batch(tiny_model, random_tokens):
    torch.manual_seed(0)
    model = tiny_model(n_kv_head=2).train()
    batch = random_tokens(batch=4, length=25, seed=3)
    x, y = batch[:, :-1], batch[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(150):
        loss = model(x, y).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_tied_head_shares_the_embedding_and_parameter_count(tiny_model):
    tied = tiny_model()
    untied = tiny_model(tie_embeddings=False)
    assert tied.head.weight is tied.token_embedding.weight
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * 32
    # 2 blocks x (q, k, v, out: 4*32*32; SwiGLU: 3*32*128; 2 norms) + embedding + final norm
    per_block = 4 * 32 * 32 + 3 * 32 * 128 + 2 * 32
    assert tied.num_parameters() == 2 * per_block + VOCAB * 32 + 32


def test_initialisation_is_reproducible_and_documented_scales(tiny_model):
    a, b = tiny_model(seed=5), tiny_model(seed=5)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    residual = a.blocks[0].attention.output.weight
    assert abs(residual.std().item() - 0.02 / math.sqrt(4)) < 0.003
    assert abs(a.blocks[0].attention.qkv.weight.std().item() - 0.02) < 0.003


def test_every_norm_gain_starts_at_one(tiny_model):
    model = tiny_model(qk_norm=True)
    gains = {name: p for name, p in model.named_parameters() if name.endswith("norm.weight")}
    assert len(gains) == 2 * 4 + 1  # per block the attention, MLP, query and key norms; the final norm
    assert all(torch.equal(gain, torch.ones_like(gain)) for gain in gains.values()), gains


def test_positions_beyond_context_are_refused(tiny_model, random_tokens):
    model = tiny_model()
    with pytest.raises(ValueError, match="exceed the context length 24"):
        model(random_tokens(length=25))


def test_attention_setting_chooses_the_path_and_both_agree(tiny_model, random_tokens):
    fused, explicit = tiny_model(attention="fused"), tiny_model(attention="explicit")
    assert [b.attention.fused for b in fused.blocks] == [True, True]
    assert [b.attention.fused for b in explicit.blocks] == [False, False]
    idx = random_tokens()
    torch.testing.assert_close(fused(idx).logits, explicit(idx).logits, rtol=0, atol=1e-5)
    assert tiny_model(attention="auto").attention_path == "fused"  # auto, unresolved: the kernel


def test_qk_norm_normalises_queries_and_keys_and_stays_causal(tiny_model, random_tokens, monkeypatch):
    import tinyattn.model.attention as attention_module

    model = tiny_model(qk_norm=True)
    seen = {}
    norm_heads = attention_module.norm_heads

    def recording(norm, x):
        out = norm_heads(norm, x)
        seen.setdefault("q", out)  # the first call: layer 0's queries
        return out

    monkeypatch.setattr(attention_module, "norm_heads", recording)
    idx = random_tokens()
    logits = model(idx).logits
    rms = seen["q"].pow(2).mean(-1).sqrt()  # (B, H, T): unit RMS per head and position
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-3)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 3) % VOCAB
    torch.testing.assert_close(model(changed).logits[:, :10], logits[:, :10], rtol=0, atol=1e-6)
    assert "blocks.0.attention.q_norm.weight" in model.state_dict()
    assert "blocks.0.attention.q_norm.weight" not in tiny_model().state_dict()


@pytest.mark.parametrize("side", ["q_norm", "k_norm"])
def test_a_zero_query_or_key_norm_gain_makes_every_query_attend_uniformly(tiny_model, random_tokens, side):
    """QK-norm normalises the queries with q_norm's gain and the keys with k_norm's: with either
    gain at zero every score is 0, and each query spreads its weight evenly over the keys it may read."""
    model = tiny_model(qk_norm=True)
    with torch.no_grad():
        for block in model.blocks:
            getattr(block.attention, side).weight.zero_()
    uniform = causal_mask(24, 24) / torch.arange(1, 25).unsqueeze(1)  # (T, T): row i is 1 / (i + 1) on keys 0..i
    for weights in model(random_tokens(), need_weights=True).attention_weights:
        torch.testing.assert_close(weights, uniform.expand_as(weights), rtol=0, atol=1e-6)



def test_qk_norm_is_the_rmsnorm_of_its_own_gain_and_the_models_epsilon():
    from tinyattn.model.attention import norm_heads

    layer = CausalSelfAttention(ModelConfig(vocab_size=65, n_head=4, n_embd=32, qk_norm=True, norm_eps=0.5))
    assert layer.q_norm.eps == layer.k_norm.eps == 0.5
    with torch.no_grad():
        layer.k_norm.weight.copy_(torch.randn(8))
    x = 0.1 * torch.randn(2, 4, 5, 8)  # (B, H, T, D), mean square 0.01: an epsilon of 0.5 outweighs it
    torch.testing.assert_close(norm_heads(layer.k_norm, x), layer.k_norm(x))


def test_logit_softcap_bounds_every_logit(tiny_model, random_tokens):
    model = tiny_model(logit_softcap=2.0)
    with torch.no_grad():
        model.head.weight.mul_(500)  # without the cap these logits would be in the hundreds
    logits = model(random_tokens()).logits
    assert logits.abs().max() <= 2.0 and logits.abs().max() > 1.9


def test_logit_softcap_is_cap_times_tanh_of_the_logit_over_cap(tiny_model, random_tokens):
    """Soft, not a clamp: every logit is squashed, small ones too (Gemma 2's formula)."""
    capped, plain = tiny_model(logit_softcap=2.0), tiny_model()  # the same weights: the cap adds none
    with torch.no_grad():
        for model in (capped, plain):
            model.head.weight.mul_(50)
    idx = random_tokens()
    torch.testing.assert_close(capped(idx).logits, 2.0 * torch.tanh(plain(idx).logits / 2.0))


def test_zero_init_projections_make_every_block_the_identity_at_start(tiny_model):
    model = tiny_model(zero_init_projections=True)
    for block in model.blocks:
        assert block.attention.output.weight.abs().sum() == 0 and block.mlp.down.weight.abs().sum() == 0
    x = torch.randn(2, 24, 32)
    cos, sin = model.rope_cos[:24], model.rope_sin[:24]
    out = model.blocks[0](x, cos=cos, sin=sin)
    torch.testing.assert_close(out, x)


def test_untied_head_starts_at_zero_so_the_first_loss_is_ln_vocab(tiny_model, random_tokens):
    model = tiny_model(tie_embeddings=False)
    assert model.head.weight is not model.token_embedding.weight
    idx = random_tokens()
    loss = model(idx, idx).loss
    assert loss.item() == pytest.approx(math.log(VOCAB), abs=1e-5)


# ----------------------------------------------------------------------------- recording weights


def test_recording_weights_takes_the_explicit_path_and_restores_the_layers(tiny_model, random_tokens):
    model = tiny_model(n_kv_head=2)
    idx = random_tokens()
    with recording_attention_weights(model) as weights:
        model(idx)
        assert all(not b.attention.fused for b in model.blocks)
    assert [w.shape for w in weights] == [(2, 4, 24, 24)] * 2
    torch.testing.assert_close(weights, model(idx, need_weights=True).attention_weights, rtol=0, atol=0)
    assert all(b.attention.fused and b.attention.weights_hook is None for b in model.blocks)


# ----------------------------------------------------------------------------- RoPE


def test_rotated_query_key_product_depends_only_on_their_offset():
    D = 8
    cos, sin = rotary_tables(D, 64, base=10000.0)  # (64, D/2)
    q, k = torch.randn(2, D, dtype=torch.float64).unbind(0)

    def score(query_pos, key_pos):  # q at query_pos . k at key_pos, each rotated alone
        rq = apply_rotary(q.view(1, 1, 1, D).float(), cos[query_pos:query_pos + 1], sin[query_pos:query_pos + 1])
        rk = apply_rotary(k.view(1, 1, 1, D).float(), cos[key_pos:key_pos + 1], sin[key_pos:key_pos + 1])
        return (rq * rk).sum().item()

    for offset in (0, 1, 5, 20):
        at_start = score(offset, 0)
        for shift in (3, 17, 40):
            assert score(offset + shift, shift) == pytest.approx(at_start, abs=1e-4)
    scores = [score(offset, 0) for offset in range(8)]
    assert max(scores) - min(scores) > 0.1  # yet the offset itself matters


def test_apply_rotary_equals_a_reference_rotation_by_position_times_frequency():
    B, H, T, D, base = 2, 3, 10, 8, 500.0
    x = torch.randn(B, H, T, D)
    cos, sin = rotary_tables(D, T, base)
    # Reference: pair i is the complex number x[i] + j x[i + D/2], turned by the angle
    # position * base^(-2i / D), in float64.
    pairs = torch.complex(x[..., :D // 2].double(), x[..., D // 2:].double())  # (B, H, T, D/2)
    frequency = base ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)  # (D/2,)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * frequency  # (T, D/2)
    turned = pairs * torch.polar(torch.ones_like(angle), angle)
    expected = torch.cat([turned.real, turned.imag], dim=-1).float()  # (B, H, T, D)
    torch.testing.assert_close(apply_rotary(x, cos, sin), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(apply_rotary(x, cos, sin)[:, :, 0], x[:, :, 0])  # position 0: no turn


def test_an_attention_layer_sees_positions_only_through_their_offsets():
    """Queries and keys are both rotated: the same tokens placed 30 positions later give the same
    output, while the same tokens without their rotations (all at one position) do not."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(ModelConfig(vocab_size=65, n_layer=1, n_head=4, n_embd=32, context_length=64))
    with torch.no_grad():
        layer.qkv.weight.mul_(10)  # scores of order 1, so that where a key sits changes the weights
    x = torch.randn(2, 8, 32)
    cos, sin = rotary_tables(8, 64, 10000.0)  # (64, D/2)
    at_start = layer(x, cos=cos[:8], sin=sin[:8])
    torch.testing.assert_close(layer(x, cos=cos[30:38], sin=sin[30:38]), at_start, rtol=1e-4, atol=1e-4)
    unturned = layer(x, cos=cos[:1].expand(8, -1), sin=sin[:1].expand(8, -1))
    assert (unturned - at_start).abs().max() > 1e-2


# ----------------------------------------------------------------------------- dropout


def test_dropout_acts_in_training_only_and_eval_is_deterministic(tiny_model, random_tokens):
    idx = random_tokens()
    model = tiny_model(dropout=0.2)
    first, second = model(idx).logits, model(idx).logits
    torch.testing.assert_close(first, second, rtol=0, atol=0)  # eval: deterministic
    model.train()
    torch.manual_seed(1)
    trained = model(idx).logits
    assert (trained - first).abs().max() > 1e-3  # training drops something
    assert (model(idx).logits - trained).abs().max() > 1e-3  # a new draw each forward
    for site in ("embedding", "residual", "attention"):  # each of the three on its own
        model.dropout.p = 0.2 if site == "embedding" else 0.0
        for block in model.blocks:
            block.dropout.p = 0.2 if site == "residual" else 0.0
            block.attention.dropout = 0.2 if site == "attention" else 0.0
        assert (model(idx).logits - first).abs().max() > 1e-3, site
    without = tiny_model(dropout=0.0).train()
    torch.testing.assert_close(without(idx).logits, without.eval()(idx).logits, rtol=0, atol=0)


def test_set_dropout_sets_the_embedding_and_every_residual_branch_not_the_attention_weights(tiny_model):
    model = tiny_model(dropout=0.1, attention_dropout=0.05)
    model.set_dropout(0.3)
    assert model.dropout.p == 0.3 and [block.dropout.p for block in model.blocks] == [0.3, 0.3]
    assert [block.attention.dropout for block in model.blocks] == [0.05, 0.05]


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_keeps_each_element_with_probability_1_minus_p_and_scales_the_rest(p):
    """The mask drawn two elements per 32-bit random integer is nn.Dropout's distribution:
    each element kept with probability 1 - p, independently of its neighbour (the other half
    of the same draw), the kept ones scaled by 1 / (1 - p), and a new mask on each call."""
    torch.manual_seed(0)
    n = 1 << 20
    dropout = Dropout(p).train()
    first, second = dropout(torch.ones(n)), dropout(torch.ones(n))
    kept = first != 0
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * sigma
    both = (kept[0::2] & kept[1::2]).float().mean().item()  # the two halves of each draw
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / (n // 2))
    torch.testing.assert_close(first[kept], torch.full_like(first[kept], 1 / (1 - p)))
    assert (kept != (second != 0)).float().mean() > p * (1 - p)  # independent draws: at about 2p(1-p)
    x = torch.randn(7, 5)  # an odd number of elements; eval mode is the identity
    assert dropout(x).shape == x.shape and torch.equal(dropout.eval()(x), x)


def test_cpu_dropout_at_the_top_of_its_range_keeps_one_element_in_2_to_the_15():
    """p = 1 - 2^-15: of the 15-bit numbers u only the largest is kept (u >= round(p * 2^15)), so
    about 32 of 2^20 elements survive, not none."""
    torch.manual_seed(0)
    kept = int((Dropout(1 - 2**-15).train()(torch.ones(1 << 20)) != 0).sum())
    assert 10 <= kept <= 64, kept


def test_cpu_dropout_within_a_65536th_of_1_keeps_nothing_not_everything():
    """model.dropout accepts any p below 1. p * 2^15 = 32767.75 rounds to 32768, above every 15-bit
    number: nothing is kept, as nn.Dropout keeps almost nothing. The threshold compared with the
    int16 numbers wrapped to -32768 and every element was kept, multiplied by 1 / (1 - p) = 131072."""
    torch.manual_seed(0)
    out = Dropout(1 - 2**-17).train()(torch.ones(1 << 16))
    assert int((out != 0).sum()) == 0


def test_compiled_dropout_gradient_uses_the_forward_mask():
    """Under torch.compile the mask is one opaque call: backward multiplies by the mask the
    forward drew (not a second draw), and each forward draws a new one."""
    torch.manual_seed(0)
    dropout = Dropout(0.3).train()
    x, w = torch.randn(64, 96, requires_grad=True), torch.randn(96, 96)
    step = torch.compile(lambda x: dropout(x @ w), backend="aot_eager", fullgraph=True)
    masks = []
    for _ in range(2):
        x.grad = None
        h = step(x)
        h.sum().backward()
        kept = (h != 0).float()
        torch.testing.assert_close(x.grad, (kept / 0.7) @ w.T)
        masks.append(kept)
    assert not torch.equal(*masks)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_attention_dropout_drops_weights_in_training_on_both_paths(fused):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=65, n_layer=1, n_head=4, n_embd=32, context_length=24, dropout=0.5)
    layer = CausalSelfAttention(config, fused=fused)
    x = torch.randn(2, 24, 32)
    cos, sin = rotary_tables(8, 24, 10000.0)
    evaluated = layer.eval()(x, cos=cos, sin=sin)
    torch.testing.assert_close(layer(x, cos=cos, sin=sin), evaluated, rtol=0, atol=0)
    dropped = layer.train()(x, cos=cos, sin=sin)
    assert (dropped - evaluated).abs().max() > 1e-3


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
def test_attention_dropout_sets_the_weights_dropout_apart_from_the_residuals(fused):
    """model.attention_dropout=0 with model.dropout=0.5: the attention layer, alone, is the same
    in training as in evaluation, while the block around it still drops its residual branch."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=65, n_layer=1, n_head=4, n_embd=32, context_length=24, dropout=0.5,
                         attention_dropout=0.0)
    layer = CausalSelfAttention(config, fused=fused)
    x = torch.randn(2, 24, 32)
    cos, sin = rotary_tables(8, 24, 10000.0)
    torch.testing.assert_close(layer.train()(x, cos=cos, sin=sin), layer.eval()(x, cos=cos, sin=sin),
                               rtol=0, atol=0)
    block = Block(config, fused)
    evaluated = block.eval()(x, cos=cos, sin=sin)
    assert (block.train()(x, cos=cos, sin=sin) - evaluated).abs().max() > 1e-3
    assert CausalSelfAttention(ModelConfig(vocab_size=65, n_embd=32, dropout=0.5)).dropout == 0.5  # None: dropout


# ----------------------------------------------------------------------------- the attention path


FP32, BF16 = Precision("fp32", None, False), Precision("bf16", torch.bfloat16, False)
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_explicit_path_is_preferred_only_for_short_bf16_training_on_the_cpu_without_dropout():
    assert prefer_explicit_attention(CPU, BF16, 512, 0.0)
    assert not prefer_explicit_attention(CPU, BF16, 513, 0.0)  # longer contexts: the flash kernel
    assert not prefer_explicit_attention(CPU, FP32, 256, 0.0)
    assert not prefer_explicit_attention(CUDA, BF16, 256, 0.0)
    assert not prefer_explicit_attention(CPU, BF16, 256, 0.1)  # the kernel draws dropout itself
    # Dropout on the residual branches only (the main config in bf16) keeps the explicit path.
    residual_only = ModelConfig(context_length=64, dropout=0.1, attention_dropout=0.0)
    assert attention_path("auto", CPU, BF16, residual_only) == "explicit"
    assert attention_path("auto", CPU, BF16, ModelConfig(context_length=64, dropout=0.1)) == "fused"


def test_auto_resolves_for_the_hardware_and_a_setting_is_kept(tiny_model, random_tokens):
    short, long = ModelConfig(context_length=256), ModelConfig(context_length=1024)
    assert attention_path("auto", CPU, BF16, short) == "explicit"
    assert attention_path("auto", CPU, BF16, long) == "fused"
    assert attention_path("auto", CPU, FP32, short) == "fused"
    assert attention_path("fused", CPU, BF16, short) == "fused"
    assert attention_path("explicit", CUDA, FP32, long) == "explicit"
    # Whatever auto picks computes the numbers of the other path.
    config = ModelConfig(vocab_size=65, n_layer=2, n_head=4, n_embd=32, context_length=24)
    idx = random_tokens()
    for precision in (BF16, FP32):
        chosen = attention_path("auto", CPU, precision, config)
        other = "fused" if chosen == "explicit" else "explicit"
        torch.manual_seed(0)
        model = LanguageModel(config, chosen).eval()
        assert model.attention_path == chosen
        torch.manual_seed(0)
        torch.testing.assert_close(model(idx).logits, LanguageModel(config, other).eval()(idx).logits,
                                   rtol=0, atol=1e-5)


def test_qk_norm_under_bf16_autocast_runs_without_a_mixed_dtype_warning(recwarn):
    """The projections give bf16 under autocast while the gains stay fp32: norm_heads casts the
    gain, so torch's fused RMSNorm runs instead of warning on every call of every step."""
    model = LanguageModel(ModelConfig(vocab_size=65, n_layer=1, n_head=2, n_embd=32, context_length=16,
                                      qk_norm=True))
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx, idx).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert not [w for w in recwarn if "Mismatch dtype" in str(w.message)]


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_training_flops_per_token_are_6_per_weight_read_plus_the_attention_term(tie):
    # PaLM's estimate, which the MFU figures use: 6 per parameter a token's forward and backward
    # multiply by (not the embedding's lookup; a tied head's matmul does read it), plus 12 * L * T * C.
    model = LanguageModel(ModelConfig(vocab_size=65, n_layer=2, n_head=4, n_embd=32, context_length=24,
                                      tie_embeddings=tie))
    read = sum(p.numel() for name, p in model.named_parameters() if tie or name != "token_embedding.weight")
    assert model.flops_per_token() == 6 * read + 12 * 2 * 24 * 32


# ----------------------------------------------------------------------------- memory estimate


@pytest.mark.parametrize("optimizer, per_param", [("adamw", 16), ("muon", 12)])
def test_the_memory_estimate_counts_the_ema_average_and_the_weights_an_evaluation_sets_aside(optimizer,
                                                                                           per_param):
    from tinyattn.config import TrainConfig
    from tinyattn.model.memory import parameter_count, training_memory

    model = ModelConfig(vocab_size=100, n_layer=2, n_head=2, n_embd=32, context_length=16)
    plain = training_memory(model, TrainConfig(batch_size=4, precision="fp32", optimizer=optimizer))
    averaged = training_memory(model, TrainConfig(batch_size=4, precision="fp32", optimizer=optimizer,
                                                  ema=0.98))
    assert plain.state_bytes == per_param * parameter_count(model)
    assert averaged.state_bytes == plain.state_bytes + 2 * 4 * parameter_count(model)  # two fp32 copies
    assert averaged.activation_bytes == plain.activation_bytes

# ----------------------------------------------------------------------------- the wiring of the blocks


def test_a_block_is_x_plus_attention_of_its_norm_then_plus_the_swiglu_of_its_norm(tiny_model):
    """Pre-norm residual block, Llama's: h = x + attention(norm1(x)); h + down(silu(gate) * up)
    of norm2(h), gate the first half of gate_up's rows (the half an export names gate_proj)."""
    model = tiny_model()
    block = model.blocks[0]
    torch.manual_seed(3)
    with torch.no_grad():
        for param in block.parameters():
            param.add_(0.1 * torch.randn_like(param))  # norm gains away from 1
    x = torch.randn(2, 24, 32)
    cos, sin = model.rotary_angles(24)
    with torch.no_grad():
        h = x + block.attention(block.attention_norm(x), cos=cos, sin=sin)
        gate, up = block.mlp.gate_up(block.mlp_norm(h)).chunk(2, dim=-1)
        expected = h + block.mlp.down(gate * torch.sigmoid(gate) * up)
        torch.testing.assert_close(block(x, cos=cos, sin=sin), expected)


def test_the_logits_are_the_head_of_the_final_norm_of_the_last_block(tiny_model, random_tokens):
    model = tiny_model(norm_eps=1e-5)
    with torch.no_grad():
        model.final_norm.weight.copy_(torch.rand(32) + 0.5)
        idx = random_tokens()
        x = model.hidden_states(idx)
        torch.testing.assert_close(model(idx).logits, model.head(model.final_norm(x)))
        rms = x.pow(2).mean(-1, keepdim=True).add(1e-5).rsqrt()
        torch.testing.assert_close(model.final_norm(x), x * rms * model.final_norm.weight)


def test_every_norm_of_the_model_takes_the_configured_epsilon(tiny_model):
    model = tiny_model(norm_eps=0.25, qk_norm=True)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 2 * 4 + 1 and all(norm.eps == 0.25 for norm in norms)


def test_the_rotary_tables_use_the_configured_base(tiny_model):
    model = tiny_model(rope_base=100.0)
    cos, sin = rotary_tables(8, 24, 100.0)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    assert not torch.equal(tiny_model().rope_cos, cos)  # the default base gives other angles


def test_the_configured_dropout_reaches_the_embedding_and_every_residual_branch(tiny_model):
    model = tiny_model(dropout=0.2, attention_dropout=0.05)
    assert model.dropout.p == 0.2 and [block.dropout.p for block in model.blocks] == [0.2, 0.2]
    assert [block.attention.dropout for block in model.blocks] == [0.05, 0.05]


def test_next_token_logits_after_a_cached_prefix_are_the_full_forwards(tiny_model, random_tokens):
    """start_pos reaches the RoPE rows and the caches: the logits after tokens 10..15, their
    prefix 0..9 in the caches, are the full forward's at position 15."""
    model = tiny_model()
    idx = random_tokens(length=16)
    caches = model.new_kv_caches(2)
    model.next_token_logits(idx[:, :10], kv_caches=caches)
    last = model.next_token_logits(idx[:, 10:], kv_caches=caches, start_pos=10)
    torch.testing.assert_close(last, model(idx).logits[:, -1], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- dropout's details


def test_cpu_dropout_at_zero_or_in_evaluation_is_the_input_itself_and_draws_nothing():
    """p 0 in training (the default) costs nothing: no mask, no draw from the generator that a
    checkpoint saves, so turning dropout off leaves the rest of a run's random stream as it was."""
    x = torch.randn(4, 6)
    torch.manual_seed(0)
    expected = torch.rand(3)
    for dropout in (Dropout(0.0).train(), Dropout(0.3).eval()):
        torch.manual_seed(0)
        assert dropout(x) is x
        assert torch.equal(torch.rand(3), expected)


def test_cpu_dropout_draws_its_mask_with_keep_mask_from_the_default_generator():
    from tinyattn.model.dropout import keep_mask

    x = torch.randn(33, 7)  # an odd count: the last draw's second half unused
    torch.manual_seed(4)
    dropped = Dropout(0.25).train()(x)
    torch.manual_seed(4)
    torch.testing.assert_close(dropped, x * keep_mask(x, 0.25) / 0.75, rtol=0, atol=1e-6)


def test_cpu_dropout_rounds_p_to_the_nearest_of_its_levels():
    """p * 2^15 = 32766.75 rounds to 32767: only the largest 15-bit number is kept, about 32 of
    2^20 elements (truncating to 32766 would keep twice as many)."""
    torch.manual_seed(0)
    kept = int((Dropout(1 - 1.25 * 2**-15).train()(torch.ones(1 << 20)) != 0).sum())
    assert 10 <= kept <= 50, kept


def test_apply_rotary_keeps_the_dtype_of_its_input():
    """Under bf16 the fp32 tables are cast to the queries' dtype: the rotation gives bf16, not fp32
    (type promotion), so attention never runs on a mix of fp32 queries and bf16 values."""
    cos, sin = rotary_tables(8, 5, 10000.0)  # fp32
    x = torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16
