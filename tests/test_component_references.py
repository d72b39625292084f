"""Reference checks for the component zoo: published formulas and equivalences."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import tfbuilder
from conftest import tiny_model
from tfbuilder import registry
from tfbuilder.model.components.attention import MultiHeadAttention
from tfbuilder.model.components.ffn import MLP, SwiGLU, glu_hidden
from tfbuilder.model.components.moe import MixtureOfExperts
from tfbuilder.model.components.norm import RMSNorm, ScaleNorm
from tfbuilder.model.components.position import ALiBiPosition, AttentionPosition, RelativeBiasPosition, RotaryPosition, alibi_slopes
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.registry import BuildContext

D = 32


def test_rmsnorm_is_the_papers_formula_with_its_eps():
    """g * x / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019, eq. 4), on inputs small enough that eps
    matters (tfbuilder's RMSNorm is torch's: what is checked is the formula and that eps reaches it)."""
    ours = RMSNorm(RMSNorm.Params(eps=1e-2), BuildContext(d_model=D))
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
    x = 0.05 * torch.randn(3, 5, D)  # mean square about 2.5e-3, a quarter of eps
    torch.testing.assert_close(ours(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-2).sqrt() * ours.weight)
    assert not torch.allclose(ours(x), x / x.pow(2).mean(-1, keepdim=True).sqrt() * ours.weight, atol=1e-3)


def test_scalenorm_is_g_times_unit_vector():
    norm = ScaleNorm(ScaleNorm.Params(), BuildContext(d_model=D))
    x = torch.randn(4, D)
    torch.testing.assert_close(norm(x), D**0.5 * x / x.norm(dim=-1, keepdim=True))


def test_rotary_scores_depend_only_on_the_relative_offset():
    rotary = RotaryPosition(RotaryPosition.Params(), BuildContext(d_model=D))
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m: int, n: int) -> float:
        return float((rotary.rotate(q, m) * rotary.rotate(k, n)).sum())

    for m, n, shift in [(0, 3, 5), (7, 2, 11), (4, 4, 100)]:
        assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-4)
    assert score(0, 3) != pytest.approx(score(0, 4), abs=1e-4)  # ... and it does depend on the offset
    torch.testing.assert_close(rotary.rotate(q, 0), q)  # position 0 is not rotated


def test_alibi_slopes_are_the_papers_geometric_sequences():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # Not a power of two: the 8-head slopes, then every other slope of the 16-head sequence.
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 * (2 * i + 1)) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))
    bias = ALiBiPosition(ALiBiPosition.Params(), BuildContext(d_model=D, causal=True, heads=8)).bias(3, 3, 0, 8)
    assert bias.shape == (1, 8, 3, 3)
    assert bias[0, 0, 2, 0] == -0.5 * 2 and bias[0, 7, 2, 1] == -(2.0**-8)


def test_relative_bias_buckets_are_exact_nearby_and_log_spaced_far_away():
    causal = RelativeBiasPosition(RelativeBiasPosition.Params(buckets=32, max_distance=128), BuildContext(d_model=D, causal=True, heads=2))
    both = RelativeBiasPosition(RelativeBiasPosition.Params(buckets=32, max_distance=128), BuildContext(d_model=D, heads=2))
    rel = torch.arange(-200, 1)
    buckets = causal.bucket(rel)
    assert buckets[-16:].tolist() == list(range(15, -1, -1))  # distances 0..15 get their own bucket
    assert buckets.max() == 31 and (buckets.diff() <= 0).all()  # monotone, capped
    two_sided = both.bucket(torch.tensor([-3, 3]))
    assert two_sided[0] != two_sided[1]  # before and after are told apart in encoders


def test_moe_with_one_expert_and_top_1_is_the_plain_ffn():
    ctx = BuildContext(d_model=D)
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=1, top_k=1, hidden=48), ctx)
    mlp = MLP(MLP.Params(hidden=48), ctx)
    mlp.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(moe(x), mlp(x))
    assert moe.aux_loss.item() == pytest.approx(1.0)  # perfectly "balanced" over one expert


def switch_loss(logits: list[list[float]]) -> float:
    """The Switch Transformer's balancing loss written out (Fedus et al. 2021, eq. 4-6) for router
    logits (tokens x experts): N * sum_i f_i * P_i, f_i the share of tokens whose top expert is i and
    P_i the mean router probability of expert i."""
    experts = len(logits[0])
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits]
    top = [row.index(max(row)) for row in logits]
    f = [top.count(i) / len(logits) for i in range(experts)]
    p = [sum(row[i] for row in probs) / len(logits) for i in range(experts)]
    return experts * sum(fi * pi for fi, pi in zip(f, p))


def routed(moe: MixtureOfExperts, choices: list[int], margin: float = 2.0) -> list[list[float]]:
    """Hand-set router logits: token t (a one-hot input) scores ``margin`` for expert ``choices[t]``
    and 0 for the others. Runs ``moe`` on those tokens and returns the logits it was given."""
    experts = len(moe.experts)
    logits = [[margin if e == c else 0.0 for e in range(experts)] for c in choices]
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, : len(choices)] = torch.tensor(logits).T
    moe(torch.eye(len(choices), D)[None])
    return logits


def test_moe_balancing_loss_is_the_switch_formula():
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=4, top_k=2, hidden=16, aux_weight=0.05), BuildContext(d_model=D))
    logits = [[1.0, -0.5, 2.0, 0.3], [0.2, 0.1, -1.0, 3.0], [2.5, 2.4, 0.0, -2.0], [0.0, 1.5, 1.0, 0.5], [-1.0, 0.0, 0.5, 0.4]]
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :5] = torch.tensor(logits).T
    moe(torch.eye(5, D)[None])
    assert moe.aux_loss.item() == pytest.approx(switch_loss(logits), rel=1e-6)
    assert moe.auxiliary_loss().item() == pytest.approx(0.05 * switch_loss(logits), rel=1e-6)  # what training adds


def test_moe_balancing_loss_is_lowest_when_routing_is_uniform():
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=4, top_k=1, hidden=16), BuildContext(d_model=D))
    # Ever more of the eight tokens go to expert 0: uniform first, all on one expert last.
    routings = [[0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 2, 3, 0, 1, 2, 3], [0, 0, 0, 3, 0, 0, 2, 3], [0, 0, 0, 0, 0, 0, 2, 3], [0] * 8]
    losses = []
    for choices in routings:
        logits = routed(moe, choices)
        assert moe.aux_loss.item() == pytest.approx(switch_loss(logits), rel=1e-6)
        losses.append(moe.aux_loss.item())
    assert losses[0] == pytest.approx(1.0)  # uniform: N * sum_i (1/N) * (1/N) * N
    assert losses == sorted(losses) and losses[-1] > 2.0, losses


def test_glu_matches_the_mlp_parameter_count():
    swiglu = SwiGLU(SwiGLU.Params(), BuildContext(d_model=96))
    mlp = MLP(MLP.Params(bias=False), BuildContext(d_model=96))
    n_glu = sum(p.numel() for p in swiglu.parameters())
    n_mlp = sum(p.numel() for p in mlp.parameters())
    assert abs(n_glu - n_mlp) / n_mlp < 0.02
    assert glu_hidden(SwiGLU.Params(), 96) == 256


def attention(ctx=None, **params) -> MultiHeadAttention:
    return MultiHeadAttention(MultiHeadAttention.Params(**params), ctx or BuildContext(d_model=D)).eval()


def test_gqa_equals_multihead_with_shared_key_value_heads():
    gqa = attention(heads=4, kv_heads=2)
    mha = attention(heads=4)
    dk = D // 4
    with torch.no_grad():
        wq, wk, wv = gqa.to_qkv.weight.split([4 * dk, 2 * dk, 2 * dk])
        bq, bk, bv = gqa.to_qkv.bias.split([4 * dk, 2 * dk, 2 * dk])
        repeat = lambda w: w.reshape(2, dk, *w.shape[1:]).repeat_interleave(2, dim=0).reshape(4 * dk, *w.shape[1:])  # noqa: E731
        mha.to_qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.to_qkv.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        mha.to_out.load_state_dict(gqa.to_out.state_dict())
    x = torch.randn(2, 7, D)
    torch.testing.assert_close(gqa(x), mha(x))
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["multi-query", "grouped-query"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_gqa_is_torch_multihead_attention_with_repeated_key_value_heads(kv_heads, causal):
    """Grouped-query attention (Ainslie et al. 2023) is plain multi-head attention whose key and value
    heads are each repeated for heads / kv_heads consecutive query heads: checked against
    nn.MultiheadAttention given those repeated projections."""
    ours = attention(BuildContext(d_model=D, causal=causal), heads=4, kv_heads=kv_heads)
    ref = nn.MultiheadAttention(D, 4, batch_first=True).eval()
    dk, group = D // 4, 4 // kv_heads
    with torch.no_grad():
        wq, wk, wv = ours.to_qkv.weight.split([4 * dk, kv_heads * dk, kv_heads * dk])
        bq, bk, bv = ours.to_qkv.bias.split([4 * dk, kv_heads * dk, kv_heads * dk])
        repeat = lambda w: w.unflatten(0, (kv_heads, dk)).repeat_interleave(group, dim=0).flatten(0, 1)  # noqa: E731
        ref.in_proj_weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        ref.in_proj_bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        ref.out_proj.load_state_dict(ours.to_out.state_dict())
    x = torch.randn(2, 7, D)
    look_ahead = torch.ones(7, 7, dtype=torch.bool).triu(1) if causal else None  # True = may not attend
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x, x, x, attn_mask=look_ahead, need_weights=False)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["none", "rotary", "alibi", "relative_bias"])
@pytest.mark.parametrize("extra", [{}, {"window": 3}, {"kv_heads": 2}])
def test_kept_attention_weights_give_the_fast_paths_output(position, extra):
    ctx = BuildContext(d_model=D, causal=True, heads=4)
    pos = registry.build("position", registry.get("position", position).params(), ctx)
    if isinstance(pos, RelativeBiasPosition):
        nn.init.normal_(pos.table.weight)
    in_attention = pos if isinstance(pos, AttentionPosition) else None  # what the builder gives attention
    attn = attention(BuildContext(d_model=D, causal=True, heads=4, position=in_attention), heads=4, **extra)
    x = torch.randn(2, 6, D)
    mask = tfbuilder.masks.causal_mask(6)
    fast = attn(x, mask=mask)
    attn.keep_weights = True
    slow = attn(x, mask=mask)
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    weights = attn.weights
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert (weights.triu(1) == 0).all()  # nothing from the future


def test_sliding_window_sees_only_nearby_keys():
    attn = attention(BuildContext(d_model=D, causal=True), heads=4, window=3)
    x = torch.randn(1, 10, D)
    changed = x.clone()
    changed[0, 2] += 5.0  # 7 positions before the last query: outside its window
    mask = tfbuilder.masks.causal_mask(10)
    torch.testing.assert_close(attn(x, mask=mask)[0, -1], attn(changed, mask=mask)[0, -1])
    assert not torch.allclose(attn(x, mask=mask)[0, 3], attn(changed, mask=mask)[0, 3])


class Recording(nn.Module):
    """Stands in for a norm or a sub-layer: appends its name to ``log`` and applies ``fn``."""

    def __init__(self, name: str, fn, log: list[str]):
        super().__init__()
        self.name, self.fn, self.log = name, fn, log

    def forward(self, x, **kwargs):
        self.log.append(self.name)
        return self.fn(x)


@pytest.mark.parametrize(
    "placement, order, formula",
    [
        ("post", ["inner", "norm"], lambda x: 2 * (x + (x + 3))),  # Norm(x + f(x)), Vaswani et al. 2017
        ("pre", ["norm", "inner"], lambda x: x + (2 * x + 3)),  # x + f(Norm(x)), Xiong et al. 2020
        ("sandwich", ["norm", "inner", "norm_out"], lambda x: x + 5 * (2 * x + 3)),  # x + Norm'(f(Norm(x))), Ding et al. 2021
        ("output", ["inner", "norm"], lambda x: x + 2 * (x + 3)),  # x + Norm(f(x)), OLMo 2 (arXiv:2501.00656)
    ],
)
def test_norm_placement_applies_the_norms_in_the_papers_order(placement, order, formula):
    """Each residual block, as the builder makes it for the placement, with its norms and sub-layer
    replaced by recording stand-ins (norm: 2x, sub-layer: x + 3, second norm: 5x)."""
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model(placement=placement)))
    block = model.encoder.layers[0].self_attn
    log: list[str] = []
    block.norm = Recording("norm", lambda x: 2 * x, log)
    block.inner = Recording("inner", lambda x: x + 3, log)
    if placement == "sandwich":
        block.norm_out = Recording("norm_out", lambda x: 5 * x, log)
    else:
        assert block.norm_out is None
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(block(x), formula(x))
    assert log == order
    assert (model.encoder.final_norm is not None) == (placement != "post")  # pre-norm stacks end with a norm


def test_every_component_cites_its_source():
    for family in registry.FAMILIES:
        for entry in registry.entries(family):
            cited = any(ch.isdigit() for ch in entry.doc) or "ablation" in entry.doc
            assert cited, f"{family}/{entry.name}: the docstring's first line should cite the paper (author year)"


def test_moe_static_dispatch_equals_routing_each_token_to_its_experts():
    """The sync-free dispatch (accelerators, torch.compile) computes what per-expert gathering does;
    with a capacity, each expert keeps its highest-gated tokens and drops the rest (Switch)."""
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=4, top_k=2, hidden=16), BuildContext(d_model=D))
    x = torch.randn(3, 5, D)
    flat = x.reshape(-1, D)
    probs = moe.router(flat).softmax(-1)
    weights, chosen = probs.topk(2, dim=-1)
    gates = torch.zeros_like(probs).scatter_(1, chosen, weights / weights.sum(-1, keepdim=True))
    # Written out: each token's output is the gate-weighted sum of its experts' outputs.
    expected = torch.stack([sum(gates[t, e] * moe.experts[e](flat[t]) for e in range(4)) for t in range(len(flat))])
    torch.testing.assert_close(moe._dispatch_gather(flat, gates), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(moe._dispatch_static(flat, gates), expected, atol=1e-5, rtol=1e-5)
    moe.capacity_factor = 0.5  # 15 tokens * 2 / 4 experts * 0.5 -> 4 slots per expert
    assert moe.capacity(15) == 4
    capped = moe._dispatch_static(flat, gates)
    kept = torch.zeros_like(gates)
    for e in range(4):
        top = gates[:, e].topk(4).indices
        kept[top, e] = gates[top, e]
    expected = torch.stack([sum(kept[t, e] * moe.experts[e](flat[t]) for e in range(4)) for t in range(len(flat))])
    torch.testing.assert_close(capped, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(capped, moe._dispatch_gather(flat, gates), atol=1e-4)


# --- rotary's knobs against Hugging Face transformers (partial_rotary_factor, rope_type linear and llama3)


ROPE_CASES = {
    "linear": ({"scaling": {"type": "linear", "factor": 4.0}}, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama3": (
        {"scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    "partial": ({"fraction": 0.4}, {"partial_rotary_factor": 0.4}),
    "partial llama3": (
        {"fraction": 0.5, "scaling": {"type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 100}},
        {"partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 100}},
    ),
}


@pytest.mark.parametrize("case", ROPE_CASES)
def test_rotary_knobs_match_transformers(case):
    """Inverse frequencies equal transformers' ROPE_INIT_FUNCTIONS (or Phi's rotary, for a partial one
    unscaled) for a head of 40 features at base 500000, to 1e-6; queries rotated with pairing half equal
    transformers' apply_rotary_pos_emb on the first int(partial_rotary_factor * 40) features,
    the rest concatenated unchanged (as PhiAttention does), at positions 0..99."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    from tfbuilder.model.components.position import rotary_frequencies, rotary_width

    ours_params, theirs = ROPE_CASES[case]
    heads, k, base = 2, 40, 500000.0
    unscaled = "rope_scaling" not in theirs
    Config, Embedding = (transformers.PhiConfig, PhiRotaryEmbedding) if unscaled else (transformers.LlamaConfig, LlamaRotaryEmbedding)
    config = Config(hidden_size=heads * k, num_attention_heads=heads, rope_theta=base, max_position_embeddings=128, **theirs)
    want = Embedding(config).inv_freq if unscaled else ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu")[0]
    params = RotaryPosition.Params(base=base, pairing="half", max_len=32, **ours_params)
    width = rotary_width(k, params.fraction)
    assert width == int(k * theirs.get("partial_rotary_factor", 1.0))
    torch.testing.assert_close(rotary_frequencies(width, base=base, scaling=params.scaling), want, rtol=1e-6, atol=0)

    module = RotaryPosition(params, BuildContext(d_model=heads * k, heads=heads))
    q = torch.randn(1, heads, 100, k)
    cos, sin = Embedding(config)(q, torch.arange(100)[None])
    rotated, _ = apply_rotary_pos_emb(q[..., :width], q[..., :width], cos, sin)
    torch.testing.assert_close(module.rotate(q, 0), torch.cat([rotated, q[..., width:]], dim=-1), atol=1e-5, rtol=1e-5)
