"""Behavioural tests for hyprun.runner.job.models.GPT (tiny CPU configs, the file well under a
minute)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from hyprun.runner.job.models import GPT
from hyprun.runner.job.models.gpt import CausalSelfAttention, MoE, Rotary, default_d_ff

VOCAB, SEQ = 64, 16
TINY = dict(vocab_size=VOCAB, seq_len=SEQ, n_layer=2, n_head=4, d_model=32)


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(**{**TINY, **overrides})


def batch(b: int = 4, t: int = SEQ, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (b, t), generator=g)
    y = torch.randint(0, VOCAB, (b, t), generator=g)
    return x, y


def capture_logits(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Run forward and return lm_head's output via a hook (forward itself returns the loss)."""
    out: list[torch.Tensor] = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: out.append(o.detach()))
    model(x, y)
    handle.remove()
    return out[0]


def train(model: GPT, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float = 3e-3) -> list:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# --- construction and basic training -------------------------------------------------------


@pytest.mark.parametrize(
    "norm,placement,mlp,pos",
    list(
        itertools.product(
            ("layernorm", "rmsnorm"), ("pre", "post"), ("gelu", "swiglu"), ("learned", "rope")
        )
    ),
)
def test_all_variants_forward_backward(norm: str, placement: str, mlp: str, pos: str) -> None:
    model = tiny(norm=norm, placement=placement, mlp=mlp, pos=pos)
    x, y = batch()
    loss = model(x, y)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert abs(loss.item() - math.log(VOCAB)) < 0.3, loss.item()
    loss.backward()
    grad = model.tok_emb.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    assert hasattr(model, "pos_emb") == (pos == "learned")
    assert isinstance(model.norm_f, torch.nn.Identity) == (placement == "post")


def test_shorter_sequence_than_seq_len() -> None:
    model = tiny()
    x, y = batch(t=5)
    assert torch.isfinite(model(x, y))
    with pytest.raises(ValueError, match="seq_len"):
        model(*batch(t=SEQ + 1))


def test_overfits_one_batch() -> None:
    model = tiny()
    x, y = batch(b=2)
    losses = train(model, x, y, steps=100)
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


def test_ignore_index_matches_ce_on_kept_positions() -> None:
    model = tiny()
    x, y = batch()
    keep = torch.rand(y.shape, generator=torch.Generator().manual_seed(3)) > 0.4
    y_masked = y.masked_fill(~keep, -100)
    loss = model(x, y_masked)
    logits = capture_logits(model, x, y_masked)
    expected = F.cross_entropy(logits[keep], y[keep])
    assert torch.allclose(loss, expected, atol=1e-6)
    # and the masked loss really differs from the unmasked one
    assert not torch.allclose(loss, model(x, y))


def test_blocks_take_and_return_residual_stream() -> None:
    model = tiny()
    seen: list[tuple] = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, i, o: seen.append((i[0].shape, o.shape)))
    model(*batch(b=3, t=7))
    assert seen == [((3, 7, 32), (3, 7, 32))] * 2


def test_attention_uses_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    tiny()(*batch())
    assert calls == [True, True]


def test_default_d_ff() -> None:
    assert default_d_ff(768, "gelu") == 3072
    assert default_d_ff(768, "swiglu") == 2048  # 8/3*768 = 2048 exactly
    assert default_d_ff(2048, "swiglu") == 5504  # 5461.3 -> next multiple of 64
    assert default_d_ff(32, "swiglu") == 88  # 85.3 -> next multiple of 8 (small model)
    assert tiny(mlp="swiglu").d_ff == 88


# --- parameter and FLOP accounting ---------------------------------------------------------


def _gpt2_params(vocab: int, seq: int, n_layer: int, d: int) -> int:
    """Hand count for tied, bias-free layernorm GELU GPT: 12 d^2 + 2 d per layer."""
    return vocab * d + seq * d + n_layer * (12 * d * d + 2 * d) + d


def test_num_params_gpt2_small() -> None:
    with torch.device("meta"):
        model = GPT(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768)
    n = model.num_params()
    assert n == _gpt2_params(50304, 1024, 12, 768) == 124_373_760
    assert abs(n - 124.4e6) / 124.4e6 < 0.01
    assert model.num_params(non_embedding=True) == n - 50304 * 768 - 1024 * 768


def test_num_params_1b() -> None:
    with torch.device("meta"):
        model = GPT(vocab_size=50304, seq_len=2048, n_layer=18, n_head=16, d_model=2048)
    n = model.num_params()
    assert n == _gpt2_params(50304, 2048, 18, 2048)
    assert 0.95e9 <= n <= 1.05e9


def test_num_params_untied_counts_head_separately() -> None:
    tied, untied = tiny(), tiny(tied_embeddings=False)
    assert untied.num_params() - tied.num_params() == VOCAB * 32
    # the untied head is a real matmul, so it stays in the non-embedding count
    assert untied.num_params(True) - tied.num_params(True) == VOCAB * 32


def test_flops_per_token_hand_computed() -> None:
    d, L, H, T = 32, 2, 4, SEQ
    model = tiny()
    n = L * (4 * d * d + 2 * d * 4 * d + 2 * d) + d  # attn, mlp, 2 norms per layer; final norm
    assert model.num_params(non_embedding=True) == n
    assert model.flops_per_token() == 6 * n + 12 * L * H * (d // H) * T
    assert model.flops_per_token(seq_len=8) == 6 * n + 12 * L * H * (d // H) * 8


def test_flops_per_token_moe_counts_active_experts_only() -> None:
    d, L, H, E, k = 32, 2, 4, 4, 2
    model = tiny(n_experts=E, top_k=k)
    expert = 2 * d * 4 * d
    n_total = L * (4 * d * d + E * expert + d * E + 2 * d) + d
    assert model.num_params(non_embedding=True) == n_total
    n_active = n_total - L * (E - k) * expert
    assert model.flops_per_token() == 6 * n_active + 12 * L * H * (d // H) * SEQ


# --- rotary positions ----------------------------------------------------------------------


def test_rotary_scores_depend_only_on_relative_position() -> None:
    rot = Rotary(head_dim=8)
    g = torch.Generator().manual_seed(0)
    qv, kv = torch.randn(8, generator=g), torch.randn(8, generator=g)
    # put the same q vector and k vector at every position, then compare q_m . k_n
    q, k = rot(qv.expand(1, 1, 12, 8), kv.expand(1, 1, 12, 8))
    scores = (q @ k.transpose(-1, -2))[0, 0]
    assert torch.allclose(scores[5, 2], scores[9, 6], atol=1e-5)
    assert torch.allclose(scores[3, 3], scores[11, 11], atol=1e-5)
    assert not torch.allclose(scores[5, 2], scores[5, 4], atol=1e-3)


def test_rope_distinguishes_token_order() -> None:
    """A one-layer causal model without positions sees the prefix only as a set, so two
    sequences whose prefixes are permutations of each other get exactly the same final state
    (loss floor ln 2 below). With rope the model must tell them apart and learn both targets."""
    model = tiny(pos="rope", n_layer=1)
    assert not hasattr(model, "pos_emb")
    x = torch.tensor([[1, 2, 3], [2, 1, 3]])
    y = torch.full_like(x, -100)
    y[0, -1], y[1, -1] = 10, 20
    logits = capture_logits(model, x, y)
    assert not torch.equal(logits[0, -1], logits[1, -1])
    losses = train(model, x, y, steps=100)
    assert losses[-1] < 0.2, losses[-1]  # ln 2 = 0.69 if positions were ignored


# --- attention entropy probe ---------------------------------------------------------------


def _enable_capture(model: GPT, heads: int, rows: int = 64) -> None:
    for block in model.blocks:
        block.attn.capture_heads = heads
        block.attn.capture_rows = rows


def test_capture_off_by_default_and_does_not_change_output() -> None:
    model = tiny()
    x, y = batch()
    assert all(b.attn.capture_heads == 0 and b.attn.last_entropy is None for b in model.blocks)
    loss_off = model(x, y)
    logits_off = capture_logits(model, x, y)
    _enable_capture(model, heads=3)
    loss_on = model(x, y)
    logits_on = capture_logits(model, x, y)
    assert torch.equal(loss_off, loss_on) and torch.equal(logits_off, logits_on)
    for block in model.blocks:
        ent = block.attn.last_entropy
        assert isinstance(block.attn, CausalSelfAttention)
        assert ent.shape == (3,) and not ent.requires_grad
        assert ((ent >= 0) & (ent <= 1 + 1e-6)).all()


def test_capture_uniform_attention_has_entropy_one() -> None:
    model = tiny(pos="rope")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * 32].zero_()  # q and k rows -> all scores 0
    _enable_capture(model, heads=4)
    model(*batch())
    for block in model.blocks:
        assert torch.allclose(block.attn.last_entropy, torch.ones(4), atol=1e-5)


def test_capture_collapsed_attention_has_low_entropy() -> None:
    attn = CausalSelfAttention(d_model=8, n_head=1, rope=False, dropout=0.0, bias=False)
    attn.capture_heads = 1
    T = 10
    q = torch.full((1, 1, T, 8), 30.0)
    k = torch.zeros(1, 1, T, 8)
    k[..., 0, :] = 1.0  # every row puts (almost) all mass on key 0
    assert attn._attention_entropy(q, k).item() < 1e-3


def test_capture_matches_explicit_computation() -> None:
    model = tiny()
    _enable_capture(model, heads=2, rows=1000)  # more rows than T -> all rows 1..T-1
    x, y = batch(b=2)
    qs: list[torch.Tensor] = []
    attn = model.blocks[0].attn
    attn.qkv.register_forward_hook(lambda m, i, o: qs.append(o.detach()))
    model(x, y)
    q, k, _ = qs[0].split(32, dim=2)
    q = q.view(2, SEQ, 4, 8).transpose(1, 2)[:, :2]
    k = k.view(2, SEQ, 4, 8).transpose(1, 2)[:, :2]
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    p = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, float("-inf")).softmax(-1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)[:, :, 1:]  # [B, h, T-1], skip row 0
    ent = ent / torch.log(torch.arange(2, SEQ + 1).float())
    assert torch.allclose(attn.last_entropy, ent.mean(dim=(0, 2)), atol=1e-5)


def test_capture_rows_subsample_includes_last_row() -> None:
    attn = CausalSelfAttention(d_model=8, n_head=1, rope=False, dropout=0.0, bias=False)
    attn.capture_heads, attn.capture_rows = 1, 1
    T = 10
    q = torch.zeros(1, 1, T, 8)
    q[..., -1, :] = 30.0  # only the last row is sharp
    k = torch.zeros(1, 1, T, 8)
    k[..., 0, :] = 1.0
    assert attn._attention_entropy(q, k).item() < 1e-3  # sampled row was the last one
    attn.capture_rows = 3
    assert attn._attention_entropy(q, k).item() > 0.6  # two of three rows uniform


# --- mixture of experts --------------------------------------------------------------------


def test_moe_load_and_diagnostics() -> None:
    model = tiny(n_experts=4, top_k=2)
    model(*batch())
    for block in model.blocks:
        moe = block.mlp
        assert isinstance(moe, MoE)
        assert moe.last_load.shape == (4,)
        assert torch.allclose(moe.last_load.sum(), torch.tensor(1.0))
        assert not moe.last_aux_loss.requires_grad
        assert moe.last_aux_loss.item() >= 1.0 - 1e-5  # balanced minimum is 1
        assert 0.0 <= moe.last_router_entropy.item() <= 1.0


def test_moe_aux_loss_is_added() -> None:
    with_aux = tiny(n_experts=4, moe_aux_weight=0.5)
    without = tiny(n_experts=4, moe_aux_weight=0.0)
    without.load_state_dict(with_aux.state_dict())
    x, y = batch()
    l_aux, l_plain = with_aux(x, y), without(x, y)
    assert l_aux > l_plain
    aux = torch.stack([b.mlp.last_aux_loss for b in with_aux.blocks]).mean()
    assert torch.allclose(l_aux - l_plain, 0.5 * aux, atol=1e-5)
    l_aux.backward()
    assert with_aux.blocks[0].mlp.router.weight.grad.abs().sum() > 0


def test_moe_router_collapse() -> None:
    torch.manual_seed(0)
    E = 4
    moe = MoE(d_model=16, d_ff=32, kind="gelu", n_experts=E, top_k=1, dropout=0.0, bias=False)
    with torch.no_grad():
        moe.router.weight.fill_(-1.0)
        moe.router.weight[0].fill_(1.0)
    x = torch.rand(2, 8, 16) + 0.1  # positive inputs -> expert 0 wins by a wide margin
    moe(x)
    assert moe.last_load[0].item() == pytest.approx(1.0)
    assert moe.last_aux_loss.item() > 0.9 * E  # collapse -> ~E, balanced -> 1
    assert moe.last_router_entropy.item() < 0.05


def test_moe_matches_dense_expert_when_single_expert() -> None:
    """With one expert and top_k=1 the routed output must equal that expert's output."""
    torch.manual_seed(0)
    moe = MoE(d_model=16, d_ff=32, kind="swiglu", n_experts=1, top_k=1, dropout=0.0, bias=False)
    x = torch.randn(2, 5, 16)
    assert torch.allclose(moe(x), moe.experts[0](x), atol=1e-6)


# --- checkpointing, determinism, validation ------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"n_experts": 4, "mlp": "swiglu", "pos": "rope"}])
def test_activation_checkpointing_matches(extra: dict) -> None:
    plain = tiny(**extra)
    ckpt = tiny(activation_checkpointing=True, **extra)
    ckpt.load_state_dict(plain.state_dict())
    x, y = batch()
    l1, l2 = plain(x, y), ckpt(x, y)
    l1.backward()
    l2.backward()
    assert torch.allclose(l1, l2, atol=1e-6)
    for (name, p1), (_, p2) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        assert p1.grad is not None, name
        assert torch.allclose(p1.grad, p2.grad, atol=1e-6), name


def test_determinism() -> None:
    a, b = tiny(), tiny()
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    x, y = batch()
    assert torch.equal(a(x, y), b(x, y))
    torch.manual_seed(1)
    c = GPT(**TINY)
    assert not torch.equal(c.tok_emb.weight, a.tok_emb.weight)


def test_init_scales() -> None:
    model = GPT(vocab_size=256, seq_len=16, n_layer=8, n_head=4, d_model=128, init_std=0.05)
    assert model.lm_head.weight is model.tok_emb.weight
    std_fc = model.blocks[0].mlp.fc.weight.std().item()
    std_proj = model.blocks[0].mlp.proj.weight.std().item()
    assert std_fc == pytest.approx(0.05, rel=0.05)
    assert std_proj == pytest.approx(0.05 / math.sqrt(16), rel=0.05)
    assert model.blocks[0].attn.proj.weight.std().item() == pytest.approx(std_proj, rel=0.1)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"d_model": 30}, "d_model"),
        ({"norm": "batchnorm"}, "norm"),
        ({"placement": "sandwich"}, "placement"),
        ({"mlp": "relu"}, "mlp"),
        ({"pos": "alibi"}, "pos"),
        ({"n_experts": -1}, "n_experts"),
        ({"n_experts": 4, "top_k": 5}, "top_k"),
        ({"n_experts": 4, "top_k": 0}, "top_k"),
        ({"dropout": 1.0}, "dropout"),
        ({"init_std": 0.0}, "init_std"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"n_layer": 0}, "n_layer"),
        ({"d_ff": 0}, "d_ff"),
        ({"moe_aux_weight": -0.1}, "moe_aux_weight"),
        ({"d_model": 24, "n_head": 8, "pos": "rope"}, "rope"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        GPT(**{**TINY, **kwargs})
