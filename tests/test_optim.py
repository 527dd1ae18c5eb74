"""Optimizers and schedules: the schedule's shape, Muon's orthogonalisation, parameter groups,
and that each option trains a tiny model."""

import math

import pytest
import torch

from tinyattn.config import ModelConfig, TrainConfig
from tinyattn.model.transformer import LanguageModel
from tinyattn.train.optim import (
    Muon,
    build_optimizer,
    learning_rate,
    lr_factor,
    newton_schulz,
    parameter_groups,
    set_learning_rates,
)


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    config = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, schedule="wsd",
                         decay_fraction=0.2)
    assert learning_rate(0, config) == pytest.approx(0.1)
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(79, config) == pytest.approx(1.0)  # stable until step 79
    assert learning_rate(80, config) == pytest.approx(1.0 - 0.9 / 20)  # the first of the decay's 20 steps
    assert learning_rate(89, config) == pytest.approx(1.0 - 0.9 * 0.5)  # halfway down
    assert learning_rate(99, config) == pytest.approx(0.1)  # the last step trains at the floor


def test_wsd_whose_decay_would_begin_inside_warmup_starts_it_at_the_peak_where_warmup_ends():
    # 80% of 20 steps would start the decay at step 4, inside the 10 warmup steps
    config = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=20, schedule="wsd",
                         decay_fraction=0.8)
    assert learning_rate(9, config) == pytest.approx(1.0)  # warmup's last step
    assert learning_rate(10, config) == pytest.approx(1.0 - 0.9 / 10)  # the decay starts where warmup ends
    assert learning_rate(14, config) == pytest.approx(1.0 - 0.9 * 0.5)  # halfway down the last 10 steps
    assert learning_rate(19, config) == pytest.approx(0.1)


def test_wsd_decays_over_the_whole_number_of_steps_nearest_its_fraction():
    # 30 % of 12 steps is 3.6: the decay takes the last 4 steps (8..11), not 3
    config = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=12, schedule="wsd", decay_fraction=0.3)
    assert [learning_rate(step, config) for step in (7, 8, 9, 11)] == pytest.approx(
        [1.0, 1.0 - 0.9 / 4, 1.0 - 0.9 / 2, 0.1])


@pytest.mark.parametrize("schedule", ["cosine", "linear", "wsd"])
@pytest.mark.parametrize("steps, warmup", [(3, 1), (11, 1), (1000, 1), (1, 0), (2, 1), (5, 4), (4, 4), (3, 5)])
def test_every_decaying_schedule_trains_its_last_step_at_the_floor_and_never_below(schedule, steps, warmup):
    # (5, 4): the one step after warmup is the last, so it takes the floor; (4, 4) and (3, 5): the run
    # ends inside warmup (warned of); a step past the end (a lab's timing steps) is at the floor
    config = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=warmup, max_steps=steps, schedule=schedule,
                         decay_fraction=0.3)
    factors = [lr_factor(step, config) for step in range(steps)]
    past = [lr_factor(step, config) for step in range(max(steps, warmup), max(steps, warmup) + 3)]
    assert past == pytest.approx([0.1] * 3)
    assert max(factors) <= 1.0
    if warmup < steps:
        assert factors[-1] == pytest.approx(0.1)
        assert min(factors) == pytest.approx(0.1)
    after_warmup = factors[max(0, warmup - 1):]  # from warmup's last step, at the peak, down
    assert after_warmup == sorted(after_warmup, reverse=True)


def test_every_group_follows_the_schedule_in_proportion_to_its_base_rate():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=False))
    config = TrainConfig(optimizer="muon", lr=1e-3, muon_lr=5e-3, embedding_lr=4e-3, head_lr=2e-3,
                         min_lr=1e-4, max_steps=50, warmup_steps=5)
    optimizers = build_optimizer(model, config, torch.device("cpu"))
    factor = lr_factor(30, config)
    set_learning_rates(optimizers.optimizers, factor)
    rates = sorted(g["lr"] / factor for o in optimizers.optimizers for g in o.param_groups)
    assert rates == pytest.approx([1e-3, 2e-3, 4e-3, 5e-3])
    assert isinstance(optimizers.optimizers[1], Muon)


def test_under_adamw_each_named_group_has_its_own_base_rate_and_the_cpu_gets_the_fused_kernel():
    """train.optimizer adamw: one AdamW whose matrices and gains train at train.lr, the embedding at
    train.embedding_lr, the untied head at train.head_lr; fused on the CPU (build_optimizer)."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=False))
    config = TrainConfig(optimizer="adamw", lr=1e-3, embedding_lr=4e-3, head_lr=2e-3)
    (adamw,) = build_optimizer(model, config, torch.device("cpu")).optimizers
    assert {g["name"]: g["base_lr"] for g in adamw.param_groups} == {
        "embedding": 4e-3, "head": 2e-3, "gains": 1e-3, "matrices": 1e-3}
    assert adamw.defaults["fused"] is True


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_parameter_groups_hold_every_parameter_exactly_once(tie):
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=2, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=tie, qk_norm=True))
    groups = parameter_groups(model, TrainConfig())
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.dim() == 2 for p in groups["matrices"]) and all(p.dim() == 1 for p in groups["gains"])
    assert len(groups["head"]) == (0 if tie else 1)


def test_parameter_groups_leave_out_a_frozen_parameter():
    """Only trainable parameters are grouped: a frozen one (requires_grad False) is in no group."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=False))
    model.token_embedding.weight.requires_grad_(False)
    groups = parameter_groups(model, TrainConfig())
    assert groups["embedding"] == [] and len(groups["head"]) == 1
    grouped = sum(len(ps) for ps in groups.values())
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert grouped == len(trainable) == len(list(model.parameters())) - 1


def test_newton_schulz_sets_every_singular_value_near_one_for_a_stack():
    g = torch.randn(3, 32, 96, generator=torch.Generator().manual_seed(0))
    g[1] *= 1000  # the scale of the input does not matter
    g[2, :, :48] *= 0.01  # nor do very unequal directions
    out = newton_schulz(g)
    singular = torch.linalg.svdvals(out)  # (3, 32)
    assert singular.min() > 0.6 and singular.max() < 1.25
    one = newton_schulz(g[1:2])  # batched equals one at a time
    torch.testing.assert_close(out[1:2], one, rtol=1e-4, atol=1e-5)
    tall = newton_schulz(g.transpose(-2, -1))  # a tall matrix is handled through its transpose
    torch.testing.assert_close(tall, out.transpose(-2, -1), rtol=1e-4, atol=1e-5)
    # Each step pushes the singular values further towards 1: one leaves the small ones small.
    assert torch.linalg.svdvals(newton_schulz(g, steps=1)).min() < 0.2
    smallest = [torch.linalg.svdvals(newton_schulz(g, steps=steps)).min() for steps in (2, 3)]
    assert smallest[1] > smallest[0]


def test_newton_schulz_of_a_zero_gradient_is_zero_not_nan():
    # An untied head starts at zero, so every block matrix's first gradient is zero: scaled by its
    # norm without a floor, the first Muon step would make every weight NaN.
    out = newton_schulz(torch.zeros(2, 8, 16))
    assert torch.equal(out, torch.zeros(2, 8, 16))


def test_newton_schulz_is_the_documented_quintic_applied_exactly_steps_times():
    """X / |X|_F, then `steps` times X <- aX + b(XX^T)X + c(XX^T)^2 X, (a, b, c) = Keller Jordan's:
    written out here in plain matmuls (a golden check of the coefficients and of the count)."""
    g = torch.randn(2, 8, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / g.norm(dim=(-2, -1), keepdim=True)
    for steps in range(1, 6):
        gram = x @ x.transpose(-2, -1)
        x = a * x + b * gram @ x + c * gram @ gram @ x
        torch.testing.assert_close(newton_schulz(g, steps=steps), x, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(newton_schulz(g.transpose(-2, -1), steps=steps), x.transpose(-2, -1),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
def test_a_muon_step_is_the_orthogonalised_momentum_at_its_documented_scale(nesterov):
    """Two steps on a (16, 64) matrix by hand: buffer = m * buffer + (1 - m) * g, the direction
    g.lerp(buffer, m) (Nesterov; nesterov=False: the buffer itself), its Newton-Schulz
    orthogonalisation (3 steps here), times lr * 0.2 * sqrt(max(rows, cols)); decoupled weight
    decay first."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, 64, generator=gen)
    grads = [torch.randn(16, 64, generator=gen) for _ in range(2)]
    p = torch.nn.Parameter(w.clone())
    lr, m, decay = 0.05, 0.9, 0.1
    muon = Muon([p], lr=lr, momentum=m, weight_decay=decay, ns_steps=3, nesterov=nesterov)
    expected, buffer = w.clone(), torch.zeros_like(w)
    for g in grads:
        p.grad = g.clone()
        muon.step()
        buffer = m * buffer + (1 - m) * g
        direction = newton_schulz((g.lerp(buffer, m) if nesterov else buffer)[None], steps=3)[0]
        expected = expected * (1 - lr * decay) - lr * 0.2 * math.sqrt(64) * direction
    torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-6)


def test_a_muon_step_given_bf16_orthogonalises_in_bf16():
    """ns_dtype bf16 (a run that trains in bf16): the Newton-Schulz chain runs in bf16, and the
    update is added to the fp32 weight; not the fp32 chain, which differs here by far more than
    the rounding of the add."""
    gen = torch.Generator().manual_seed(0)
    w, g = torch.randn(16, 64, generator=gen), torch.randn(16, 64, generator=gen)
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    lr, m = 0.5, 0.9
    Muon([p], lr=lr, momentum=m, ns_steps=3, ns_dtype=torch.bfloat16).step()
    direction = g.lerp((1 - m) * g, m)[None]  # the first step's Nesterov direction
    scale = lr * 0.2 * math.sqrt(64)
    in_bf16 = w - scale * newton_schulz(direction.bfloat16(), steps=3)[0].float()
    in_fp32 = w - scale * newton_schulz(direction, steps=3)[0]
    torch.testing.assert_close(p.detach(), in_bf16, rtol=1e-5, atol=1e-6)
    assert (in_bf16 - in_fp32).abs().max() > 1e-3


def test_the_embedding_and_head_without_their_own_rates_train_at_train_lr():
    """train.embedding_lr or train.head_lr unset (None): that group steps at train.lr, as do the
    gains, and Muon's matrices without train.muon_lr; an untied head does not borrow the
    embedding's rate."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=False))
    cpu = torch.device("cpu")
    adamw = build_optimizer(model, TrainConfig(lr=1e-3, embedding_lr=4e-3), cpu)
    assert adamw.rates() == pytest.approx({"adamw/embedding": 4e-3, "adamw/head": 1e-3, "adamw/gains": 1e-3,
                                           "adamw/matrices": 1e-3})
    muon = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, head_lr=2e-3), cpu)
    assert muon.rates() == pytest.approx({"adamw/embedding": 1e-3, "adamw/head": 2e-3, "adamw/gains": 1e-3,
                                          "muon/matrices": 1e-3})


@pytest.mark.parametrize("precision, ns_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                               ("fp16", torch.float32)], ids=["fp32", "bf16", "fp16"])
def test_muon_orthogonalises_in_bf16_only_in_a_run_that_trains_in_bf16(precision, ns_dtype):
    """A run trains in fp16 where the hardware has no fast bf16 (`select_precision`'s auto):
    there bf16 would be emulated and many times slower, so Muon works in fp32."""
    from tinyattn.system.device import DTYPES, Precision
    from tinyattn.train.trainer import Trainer

    model_config = ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8)
    autocast = None if precision == "fp32" else DTYPES[precision]  # as on a GPU: the CPU refuses fp16 runs
    tokens = torch.zeros(100, dtype=torch.int64).numpy()
    trainer = Trainer.build(model_config, TrainConfig(optimizer="muon"), tokens, device=torch.device("cpu"),
                            precision=Precision(precision, autocast, use_grad_scaler=precision == "fp16"))
    assert trainer.optimizers.optimizers[1].ns_dtype == ns_dtype


def test_muon_refuses_a_vector():
    with pytest.raises(ValueError, match="matrices only"):
        Muon([torch.nn.Parameter(torch.zeros(4))])


OPTIONS = {
    "adamw-cosine": {},
    "muon": {"optimizer": "muon", "muon_lr": 2e-2},
    "wsd": {"schedule": "wsd"},
    "muon-wsd-untied": {"optimizer": "muon", "muon_lr": 2e-2, "schedule": "wsd", "head_lr": 1e-2,
                        "embedding_lr": 2e-2},
}
CYCLE_STEPS = 60
MODEL_OPTIONS = {"untied": {"tie_embeddings": False}, "muon-wsd-untied": {"tie_embeddings": False},
                 "qk-norm-cap-zero": {"qk_norm": True, "logit_softcap": 10.0, "zero_init_projections": True}}


@pytest.mark.slow  # trains six tiny models to a loss bound
@pytest.mark.parametrize("name", list(OPTIONS) + ["untied", "qk-norm-cap-zero"])
def test_each_option_trains_a_tiny_model_below_a_loss_bound(name):
    """A 2-layer model learns a fixed 8-token cycle: from ln(16) = 2.77 to below 0.1 in CYCLE_STEPS steps."""
    from tinyattn.system.device import select_precision
    from tinyattn.train.trainer import Trainer

    torch.manual_seed(0)
    model_config = ModelConfig(vocab_size=16, n_layer=2, n_head=2, n_embd=32, context_length=16,
                               **MODEL_OPTIONS.get(name, {}))
    train_config = TrainConfig(lr=1e-2, min_lr=1e-3, warmup_steps=10, max_steps=CYCLE_STEPS, batch_size=8,
                               **OPTIONS.get(name, {}))
    cycle = torch.tensor([3, 1, 4, 15, 9, 2, 6, 5]).repeat(200).numpy().astype("uint16")
    cpu = torch.device("cpu")
    trainer = Trainer.build(model_config, train_config, cycle, device=cpu, precision=select_precision("fp32", cpu))
    first = trainer.train_step()[0].item()
    for _ in range(CYCLE_STEPS - 1):
        loss = trainer.train_step()[0].item()
    assert first > 2.0 and math.isfinite(loss)
    assert loss < 0.1, f"{name}: loss {loss:.3f} after {CYCLE_STEPS} steps"


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_the_optimizers_hold_every_parameter_once_and_decay_neither_embedding_nor_gains(optimizer, tie):
    """As built from train.weight_decay, and after `set_weight_decay` (the time budget's
    train.decay_by_passes) changes it: the matrices and the head take it, nothing else does."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=2, n_head=2, n_embd=16, context_length=8,
                                      tie_embeddings=tie, qk_norm=True))
    optimizers = build_optimizer(model, TrainConfig(optimizer=optimizer, weight_decay=0.1), torch.device("cpu"))
    for wanted_decay in (0.1, 0.3):
        if wanted_decay != 0.1:  # 0.1: as built
            optimizers.set_weight_decay(wanted_decay)
        decay = {}  # id(parameter) -> the weight decay of the one group that holds it
        for opt in optimizers.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    assert id(p) not in decay, "a parameter in two optimizer groups"
                    decay[id(p)] = group["weight_decay"]
        assert set(decay) == {id(p) for p in model.parameters()}
        for name, p in model.named_parameters():
            wanted = 0.0 if name == "token_embedding.weight" or p.dim() < 2 else wanted_decay
            assert decay[id(p)] == wanted, name


# ----------------------------------------------------------------------------- Muon on stacked weights


def _muon_step(weights: list[torch.Tensor], grads: list[torch.Tensor], rows=None) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    Muon([{"params": params, "rows": rows}], lr=0.1, weight_decay=0.1).step()
    return [p.detach() for p in params]


def test_muon_updates_each_matrix_of_a_stacked_weight_as_if_it_were_its_own_parameter():
    """q, k, v stacked into one (C + 2 * kv, C) weight move exactly as three separate weights
    would (grouped-query shapes, so the pieces differ in size and batch apart)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, 16, generator=g) for rows in (16, 8, 8))
    dq, dk, dv = (torch.randn(rows, 16, generator=g) for rows in (16, 8, 8))
    (stacked,) = _muon_step([torch.cat([q, k, v])], [torch.cat([dq, dk, dv])], rows=[(16, 8, 8)])
    separate = torch.cat(_muon_step([q, k, v], [dq, dk, dv]))
    torch.testing.assert_close(stacked, separate, rtol=1e-5, atol=1e-6)
    (whole,) = _muon_step([torch.cat([q, k, v])], [torch.cat([dq, dk, dv])])  # rows None: one matrix
    assert (whole - separate).abs().max() > 1e-3  # the split is not a no-op


def muon_rows(model, config) -> dict[str, tuple]:
    """How the Muon group built for `config` splits each of the model's weights it splits."""
    (group,) = build_optimizer(model, config, torch.device("cpu")).optimizers[1].param_groups
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: rows for p, rows in zip(group["params"], group["rows"]) if rows}


@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
@pytest.mark.parametrize("split, heads", [(True, False), (False, False), (True, True), (False, True)])
def test_the_muon_group_splits_the_models_stacked_weights_as_the_config_says(split, heads, gated):
    """4 query heads and 2 key/value heads of width 8: per head, the query's 32 rows are four
    matrices and the key's 16 two, the value whole (and the attention gate's 32 rows after it);
    the MLP's gate and up split only with muon_split_stacked."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                                      context_length=8, attention_gate=gated))
    config = TrainConfig(optimizer="muon", muon_lr=1e-2, muon_split_stacked=split, muon_split_heads=heads)
    expected = {}
    gate = (32,) if gated else ()
    for i in range(2):
        if heads or split:
            qkv = (8,) * 4 + (8,) * 2 + (16,) if heads else (32, 16, 16)
            expected[f"blocks.{i}.attention.qkv.weight"] = qkv + gate
        if split:
            expected[f"blocks.{i}.mlp.gate_up.weight"] = (model.config.hidden_dim,) * 2
    assert muon_rows(model, config) == expected


def test_a_gate_of_rank_r_has_two_matrices_of_its_own_each_stepped_whole_by_muon():
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                                      context_length=8, attention_gate=True, attention_gate_rank=3))
    config = TrainConfig(optimizer="muon", muon_lr=1e-2, muon_split_stacked=True)
    (group,) = build_optimizer(model, config, torch.device("cpu")).optimizers[1].param_groups
    names = {id(p): name for name, p in model.named_parameters()}
    rows = {names[id(p)]: rows for p, rows in zip(group["params"], group["rows"])}
    for i in range(2):  # the query's, key's and value's rows in qkv, no gate's; the gate's two apart, whole
        assert rows[f"blocks.{i}.attention.qkv.weight"] == (32, 16, 16)
        assert rows[f"blocks.{i}.attention.gate_in.weight"] is None  # (3, 32)
        assert rows[f"blocks.{i}.attention.gate_out.weight"] is None  # (32, 3)


def test_a_resume_splits_muon_as_its_own_config_says_whatever_the_checkpoint_did():
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=4, n_embd=32, context_length=8))
    for before, after in ((False, True), (True, False)):
        saved = build_optimizer(model, TrainConfig(optimizer="muon", muon_split_heads=before),
                                torch.device("cpu"))
        resumed = build_optimizer(model, TrainConfig(optimizer="muon", muon_split_heads=after),
                                  torch.device("cpu"))
        resumed.load_state_dict(saved.state_dict())
        (group,) = resumed.optimizers[1].param_groups
        qkv_rows = (8,) * 8 + (32,) if after else (32, 32, 32)
        assert qkv_rows in group["rows"]


def test_a_config_saved_before_the_split_existed_keeps_muon_orthogonalising_whole_weights(tmp_path):
    from tinyattn import checkpoint as ckpt
    from tinyattn.config import Config, DataConfig, config_to_dict

    saved = config_to_dict(Config(data=DataConfig(files="corpus.txt")))
    del saved["train"]["muon_split_stacked"]
    assert ckpt.config_from_checkpoint({"config": saved}, tmp_path / "old.pt").train.muon_split_stacked is False
    assert Config().train.muon_split_stacked is True


def test_an_optimizer_state_saved_before_muon_loads_and_another_count_is_refused_naming_the_key():
    """A checkpoint from before Muon holds one AdamW's state (a dict), which still resumes; a
    Muon run's two states into an AdamW run (or back) are refused naming train.optimizer."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8))
    cpu = torch.device("cpu")
    saved = build_optimizer(model, TrainConfig(), cpu)
    model(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)).loss.backward()
    saved.optimizers[0].step()
    resumed = build_optimizer(model, TrainConfig(), cpu)
    resumed.load_state_dict(saved.optimizers[0].state_dict())  # as the older checkpoint held it
    states, stepped = resumed.optimizers[0].state.values(), saved.optimizers[0].state.values()
    assert len(states) == len(stepped) > 0 and all(int(state["step"]) == 1 for state in states)
    assert all(torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in zip(states, stepped))  # the moments came back
    muon = build_optimizer(model, TrainConfig(optimizer="muon"), cpu)
    with pytest.raises(ValueError, match=r"^the checkpoint holds 1 optimizer state\(s\), this run has 2 "
                                         r"\(was train.optimizer changed\?\)$"):
        muon.load_state_dict(saved.state_dict())
    with pytest.raises(ValueError, match=r"^the checkpoint holds 2 optimizer state\(s\), this run has 1 "):
        resumed.load_state_dict(muon.state_dict())


def test_a_warmup_as_long_as_the_run_is_warned_of_and_one_step_shorter_is_not():
    """warmup_steps == max_steps: the last step trains at 100 % of the peak and nothing decays."""
    from tinyattn.train.optim import warmup_warning

    config = TrainConfig(warmup_steps=20, max_steps=20)
    assert warmup_warning(config, 20) == (
        "warning: train.warmup_steps=20 is not below the 20 steps of train.max_steps: the rate reaches its "
        "peak only at the last step and never decays; give fewer warmup steps "
        "(--set train.warmup_steps=2) or more train.max_steps")
    assert "the rate ends still warming up, at 50% of its peak, and never decays" in warmup_warning(
        TrainConfig(warmup_steps=40, max_steps=20), 20)
    assert warmup_warning(TrainConfig(warmup_steps=19, max_steps=20), 20) is None
    assert "is not below the 1 step of train.max_steps: " in warmup_warning(TrainConfig(warmup_steps=1), 1)
    assert "is not below the about 1 step the 20s budget first fits: " in warmup_warning(
        TrainConfig(warmup_steps=1), 1, budget=20)
    # a run of fewer than 10 steps is advised one warmup step, not 0
    assert "(--set train.warmup_steps=1)" in warmup_warning(TrainConfig(warmup_steps=8, max_steps=5), 5)


def test_a_run_of_max_steps_ends_its_last_pass_over_the_text_with_its_last_step():
    """train.sampling passes: 15 steps of 4 windows over a text of 40 windows a pass take 60 windows,
    shared between two passes of 30, so the run's last window is the second pass's last."""
    from tinyattn.system.device import select_precision
    from tinyattn.train.trainer import Trainer

    tokens = (torch.arange(16 * 41) % 16).numpy().astype("uint16")  # (41 - 1) windows of 16 a pass
    model_config = ModelConfig(vocab_size=16, n_layer=1, n_head=2, n_embd=16, context_length=16)
    train_config = TrainConfig(max_steps=15, warmup_steps=2, batch_size=4, sampling="passes")
    cpu = torch.device("cpu")
    trainer = Trainer.build(model_config, train_config, tokens, device=cpu, precision=select_precision("fp32", cpu))
    for _ in range(15):
        trainer.train_step()
    assert trainer.batches.pass_starts == [0, 30]


def test_a_fork_with_other_rates_and_betas_trains_with_its_own_not_the_checkpoints():
    """Optimizer states saved by a run at lr 1e-3 (muon 2e-3), beta2 0.99, loaded by a fork given
    lr 4e-3 (muon 8e-3) and beta2 0.95: every group steps at the fork's rates and betas."""
    model = LanguageModel(ModelConfig(vocab_size=20, n_layer=1, n_head=2, n_embd=16, context_length=8))
    cpu = torch.device("cpu")
    saved = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=2e-3, beta2=0.99), cpu)
    set_learning_rates(saved.optimizers, 0.5)  # as a run does before each of its steps
    fork = build_optimizer(model, TrainConfig(optimizer="muon", lr=4e-3, muon_lr=8e-3, beta1=0.8, beta2=0.95), cpu)
    fork.load_state_dict(saved.state_dict())
    set_learning_rates(fork.optimizers, 0.5)
    assert fork.rates() == pytest.approx({"adamw/embedding": 2e-3, "adamw/gains": 2e-3, "muon/matrices": 4e-3})
    assert {group["betas"] for group in fork.optimizers[0].param_groups} == {(0.8, 0.95)}


def test_the_start_line_names_each_optimizers_own_rate_and_the_average():
    from tinyattn.train.optim import optimizer_description

    muon = TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02, ema=0.98)
    assert optimizer_description(muon) == "Muon (lr 0.02) + AdamW (lr 0.001), weights averaged (ema 0.98)"
    plain = TrainConfig(optimizer="muon", lr=1e-3)
    assert optimizer_description(plain) == "Muon (lr 0.001) + AdamW (lr 0.001)"
    assert optimizer_description(TrainConfig(optimizer="adamw", lr=3e-4)) == "AdamW (lr 0.0003)"


def test_head_lr_is_noted_as_unused_only_with_a_tied_head():
    from tinyattn.train.optim import unused_options

    config = TrainConfig(optimizer="muon", head_lr=1e-2)
    assert unused_options(config, False, ["train.head_lr", "train.muon_lr"]) == []
    assert unused_options(config, True, ["train.head_lr"]) == [
        "note: train.head_lr has no effect: model.tie_embeddings is true, so the head is the token embedding "
        "and trains at train.embedding_lr"]


@pytest.mark.parametrize("grad_clip", [1.0, 0.0], ids=["clipped", "unclipped"])
def test_an_fp16_step_with_an_overflow_in_one_optimizers_gradients_is_skipped_by_every_optimizer(grad_clip):
    """Under loss scaling (fp16, on a GPU) an inf gradient in one Muon matrix made the scaler skip
    Muon's step only: AdamW stepped with gradients the clipping over every parameter had made 0
    (clipped) or NaN (0 x inf: unclipped, which left NaN weights). The whole step is skipped."""
    from tinyattn.system.device import Precision
    from tinyattn.train.trainer import Trainer

    model_config = ModelConfig(vocab_size=16, n_layer=1, n_head=2, n_embd=16, context_length=8)
    tokens = torch.randint(0, 16, (400,), generator=torch.Generator().manual_seed(0)).numpy()
    fp16 = Precision("fp16", None, use_grad_scaler=True)  # the scaler as on a GPU, no fp16 autocast here
    trainer = Trainer.build(model_config, TrainConfig(optimizer="muon", batch_size=2, grad_clip=grad_clip),
                            tokens, device=torch.device("cpu"), precision=fp16)
    trainer.train_step()
    gate_up = trainer.model.blocks[0].mlp.gate_up.weight  # one of Muon's matrices
    hook = gate_up.register_hook(lambda grad: grad.index_fill(0, torch.tensor([0]), float("inf")))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    scale = trainer.scaler.get_scale()
    trainer.train_step()
    hook.remove()
    assert trainer.scaler.get_scale() == scale / 2  # the scaler saw the overflow
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, before[name]), f"{name} changed in a step the scaler skipped"
    trainer.train_step()  # and the next step trains again
    assert not torch.equal(trainer.model.token_embedding.weight, before["token_embedding.weight"])


def test_a_step_count_the_config_file_gives_beside_a_time_budget_is_noted_as_unused():
    """`extends: shakespeare_char.yaml` with `train: {max_steps: 500}` trained for the parent's 10 minutes,
    silently: under a budget train.max_steps is only its first estimate (--set train.max_steps turns
    the budget off before this is asked, see budget.explicit_steps)."""
    from tinyattn.train.optim import unused_options

    assert unused_options(TrainConfig(time_budget="10m", max_steps=500), False, ["train.max_steps"]) == [
        "note: train.max_steps=500 has no effect: train.time_budget 10m sets the run's length (config.yaml "
        "records the budget's first estimate instead); for 500 steps, --set train.max_steps=500 (the budget "
        "is then off) or give train.time_budget: null"]
    assert unused_options(TrainConfig(max_steps=500), False, ["train.max_steps"]) == []
    assert unused_options(TrainConfig(time_budget="10m", max_steps=500), False, ["train.lr"]) == []
