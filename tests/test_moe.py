"""The mixture of experts' routings against transformers' own blocks with random weights (Mixtral,
Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) and against their definitions written out: sigmoid scores, the
selection-only correction bias and its update (DeepSeek-V3, arXiv:2412.19437, sec. 2.1.2; Wang et al.
2024, arXiv:2408.15664), group-limited routing, the routed scale, shared experts and Qwen2-MoE's
shared-expert gate. The recipe checks are rows of tests/test_validation_rules.py."""

from __future__ import annotations

import pytest
import torch

from tfbuilder.model.components.moe import MixtureOfExperts, fused_experts, load_fused_experts
from tfbuilder.registry import BuildContext

D = 16


def moe(**params) -> MixtureOfExperts:
    return MixtureOfExperts(MixtureOfExperts.Params(**params), BuildContext(d_model=D)).eval()


def randomize(module: torch.nn.Module) -> None:
    """Every parameter and buffer drawn from N(0, 0.5): transformers leaves the fused experts empty."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.normal_(0.0, 0.5)


def load_mlp(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """transformers' separate gate/up/down projections into a GLU's fused ff_in (gate first) and ff_out."""
    with torch.no_grad():
        ours.ff_in.weight.copy_(torch.cat([theirs.gate_proj.weight, theirs.up_proj.weight]))
        ours.ff_out.weight.copy_(theirs.down_proj.weight)


def compare(ours: MixtureOfExperts, block: torch.nn.Module) -> None:
    x = torch.randn(3, 7, D)
    with torch.no_grad():
        want = block(x.clone())
        torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=1e-5)
        ours.capacity_factor = 64.0  # the static dispatch (accelerators) gives the same
        torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=1e-5)


def test_mixtral_sparse_moe_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=D, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    block = MixtralSparseMoeBlock(config).eval()
    randomize(block)
    ours = moe(experts=4, top_k=2, expert="swiglu", hidden=24, bias=False)
    with torch.no_grad():
        ours.router.weight.copy_(block.gate.weight)
    load_fused_experts(ours, block.experts.gate_up_proj, block.experts.down_proj)
    gate_up, down = fused_experts(ours)
    assert torch.equal(gate_up, block.experts.gate_up_proj) and torch.equal(down, block.experts.down_proj)
    compare(ours, block)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_qwen2_moe_sparse_block_with_its_gated_shared_expert(norm_topk_prob):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    torch.manual_seed(1)
    config = Qwen2MoeConfig(
        hidden_size=D, moe_intermediate_size=12, shared_expert_intermediate_size=20, num_experts=6,
        num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
    )
    block = Qwen2MoeSparseMoeBlock(config).eval()
    randomize(block)
    ours = moe(
        experts=6, top_k=2, expert="swiglu", hidden=12, bias=False, normalize=norm_topk_prob,
        shared_experts=1, shared_hidden=20, shared_gate=True,
    )
    with torch.no_grad():
        ours.router.weight.copy_(block.gate.weight)
        assert ours.shared_gate is not None
        ours.shared_gate.weight.copy_(block.shared_expert_gate.weight)
    load_fused_experts(ours, block.experts.gate_up_proj, block.experts.down_proj)
    load_mlp(ours.shared, block.shared_expert)
    compare(ours, block)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_qwen3_moe_sparse_block(norm_topk_prob):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(2)
    config = Qwen3MoeConfig(
        hidden_size=D, moe_intermediate_size=12, num_experts=6, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob
    )
    block = Qwen3MoeSparseMoeBlock(config).eval()
    randomize(block)
    ours = moe(experts=6, top_k=3, expert="swiglu", hidden=12, bias=False, normalize=norm_topk_prob)
    with torch.no_grad():
        ours.router.weight.copy_(block.gate.weight)
    load_fused_experts(ours, block.experts.gate_up_proj, block.experts.down_proj)
    compare(ours, block)


@pytest.mark.parametrize("groups, top_groups, norm_topk_prob", [(4, 2, True), (1, 1, False), (2, 1, True)])
def test_deepseek_v3_moe(groups, top_groups, norm_topk_prob):
    """Sigmoid scores, a random correction bias (choosing, not weighting), group-limited routing, the
    routed scale and two shared experts as one MLP twice as wide (the default shared_hidden)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    torch.manual_seed(3)
    config = DeepseekV3Config(
        hidden_size=D, moe_intermediate_size=8, n_routed_experts=8, num_experts_per_tok=2, n_group=groups,
        topk_group=top_groups, routed_scaling_factor=2.5, norm_topk_prob=norm_topk_prob, n_shared_experts=2,
    )
    block = DeepseekV3MoE(config).eval()
    randomize(block)
    ours = moe(
        experts=8, top_k=2, expert="swiglu", hidden=8, bias=False, router="sigmoid", normalize=norm_topk_prob,
        correction_bias=True, groups=groups, top_groups=top_groups, routed_scale=2.5, shared_experts=2,
    )
    assert ours.correction_bias is not None
    with torch.no_grad():
        ours.router.weight.copy_(block.gate.weight)
        ours.correction_bias.copy_(block.gate.e_score_correction_bias)
    load_fused_experts(ours, block.experts.gate_up_proj, block.experts.down_proj)
    load_mlp(ours.shared, block.shared_experts)
    compare(ours, block)


def test_sigmoid_routing_with_bias_groups_and_scale_written_out():
    """Each token: s = sigmoid(x W); choose from the two best groups (a group scores its two highest
    s + b), the top-2 of s + b there; weight them by s, renormalised, times the routed scale."""
    torch.manual_seed(4)
    routing = {"router": "sigmoid", "correction_bias": True, "groups": 4, "top_groups": 2, "routed_scale": 3.0}
    m = moe(experts=8, top_k=2, hidden=8, **routing)
    assert m.correction_bias is not None
    with torch.no_grad():
        m.correction_bias.copy_(torch.randn(8))
    x = torch.randn(11, D)
    want = []
    for token in x:
        s = m.router(token).sigmoid()
        biased = (s + m.correction_bias).tolist()
        group_score = [sum(sorted(biased[2 * g : 2 * g + 2])[-2:]) for g in range(4)]
        groups = sorted(range(4), key=lambda g: group_score[g])[-2:]
        allowed = [e for e in range(8) if e // 2 in groups]
        chosen = sorted(allowed, key=lambda e: biased[e])[-2:]
        total = sum(s[e] for e in chosen)
        want.append(sum(3.0 * s[e] / total * m.experts[e](token) for e in chosen))
    with torch.no_grad():
        torch.testing.assert_close(m(x[None])[0], torch.stack(want), atol=1e-5, rtol=1e-5)


def test_the_correction_bias_chooses_but_does_not_weight():
    """A large bias on expert 0 makes every token choose it, at the weight of its unbiased score."""
    torch.manual_seed(5)
    m = moe(experts=4, top_k=1, hidden=8, router="sigmoid", normalize=False, correction_bias=True)
    assert m.correction_bias is not None
    with torch.no_grad():
        m.correction_bias.copy_(torch.tensor([10.0, 0.0, 0.0, 0.0]))
        x = torch.randn(1, 6, D)
        want = torch.stack([m.router(t).sigmoid()[0] * m.experts[0](t) for t in x[0]])
        torch.testing.assert_close(m(x)[0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "params, normalizes",
    [
        ({"top_k": 1}, False),
        ({"top_k": 2}, True),
        ({"top_k": 1, "router": "sigmoid"}, True),
        ({"top_k": 2, "router": "sigmoid", "normalize": False}, False),
        ({"top_k": 1, "normalize": True}, True),
    ],
)
def test_the_normalize_rule(params, normalizes):
    """Default: softmax renormalises from top_k 2 (Switch's top-1 keeps its probability), sigmoid always."""
    torch.manual_seed(6)
    m = moe(experts=4, hidden=8, **params)
    x = torch.randn(9, D)
    chosen, weights, _ = m.route(x)
    logits = m.router(x)
    scores = logits.sigmoid() if params.get("router") == "sigmoid" else logits.softmax(dim=-1)
    want = scores.gather(1, chosen)
    want = want / want.sum(dim=-1, keepdim=True) if normalizes else want
    torch.testing.assert_close(weights, want)


def test_switch_routing_trains_the_router_from_the_task_loss_with_sigmoid_scores_too():
    """Unnormalised sigmoid top-1: the task's gradient reaches the router through the weight."""
    m = moe(experts=4, top_k=1, hidden=8, router="sigmoid", normalize=False, aux_weight=0.0).train()
    m(torch.randn(2, 5, D)).square().sum().backward()
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 1e-2


def test_the_balancing_loss_with_sigmoid_routing_normalises_each_tokens_scores():
    """Switch's loss over sigmoid scores divided by their sum (DeepSeek-V3, eq. 19's s'), first choices."""
    torch.manual_seed(7)
    m = moe(experts=4, top_k=2, hidden=8, router="sigmoid")
    x = torch.randn(1, 10, D)
    m(x)
    s = m.router(x[0]).sigmoid()
    p = s / s.sum(dim=-1, keepdim=True)
    share = torch.nn.functional.one_hot(s.argmax(dim=-1), 4).float().mean(dim=0)
    assert m.aux_loss.item() == pytest.approx(4 * (share * p.mean(dim=0)).sum().item(), rel=1e-5)


def test_shared_experts_add_their_output_gated_by_a_sigmoid():
    torch.manual_seed(8)
    m = moe(experts=4, top_k=2, hidden=8, shared_experts=3, shared_gate=True)
    assert m.shared is not None and m.shared_gate is not None
    assert m.shared.ff_out.in_features == 24  # hidden * shared_experts
    x = torch.randn(1, 5, D)
    with torch.no_grad():
        routed = moe(experts=4, top_k=2, hidden=8)
        routed.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("shared")})
        want = routed(x) + m.shared(x) * torch.sigmoid(x @ m.shared_gate.weight.T)
        torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)


def test_bias_update_moves_each_bias_towards_the_mean_load():
    """bias_e += gamma * sign(mean load - load_e): the overloaded expert's bias falls, the idle ones'
    rise, an expert at the mean stays (arXiv:2408.15664, eq. 5); the count restarts."""
    m = moe(experts=4, top_k=1, hidden=8, router="sigmoid", correction_bias=True, bias_update=0.25).train()
    assert m.correction_bias is not None and m.expert_load is not None
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.weight[0, 0] = 5.0  # tokens with a positive first feature go to expert 0
        m.router.weight[1, 0] = -5.0  # the others to expert 1
    x = torch.zeros(1, 8, D)
    x[0, :6, 0], x[0, 6:, 0] = 1.0, -1.0
    m(x)
    torch.testing.assert_close(m.routing_load(), torch.tensor([6.0, 2.0, 0.0, 0.0]))
    m.eval()(x)  # evaluation counts nothing
    torch.testing.assert_close(m.routing_load(), torch.tensor([6.0, 2.0, 0.0, 0.0]))
    m.balance(m.routing_load())
    torch.testing.assert_close(m.correction_bias, torch.tensor([-0.25, 0.0, 0.25, 0.25]))
    torch.testing.assert_close(m.routing_load(), torch.zeros(4))


def test_the_model_balances_every_layer_from_its_load_summed_over_ranks():
    """model.balance_routing(reduce) gives each layer its load as reduce sums it (over ranks)."""
    from conftest import tiny_model
    from test_components import KINDS

    import tfbuilder
    from tfbuilder.spec.recipe import Recipe

    ffn = {"type": "moe", "experts": 4, "top_k": 2, "hidden": 8, "router": "sigmoid", "correction_bias": True,
           "bias_update": 0.125}
    spec = tiny_model(kind="decoder", ffn=ffn, **KINDS["decoder"])
    model = tfbuilder.build_model(Recipe.model_validate({"model": spec}))
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    model.train()(torch.randint(5, 50, (2, 6)))
    loads = [m.routing_load().clone() for m in layers]
    other_rank = torch.tensor([0.0, 5.0, 10.0, 15.0])
    model.balance_routing(reduce=lambda load: load + other_rank)
    for m, load in zip(layers, loads, strict=True):
        total = load + other_rank
        torch.testing.assert_close(m.correction_bias, 0.125 * torch.sign(total.mean() - total))
        assert m.routing_load().sum() == 0


def test_the_training_step_balances_from_the_load_summed_over_ranks(monkeypatch):
    """Task.on_before_optimizer_step gives balance_routing the strategy's sum over ranks (with DDP,
    every rank then moves its biases alike)."""
    from conftest import QUICKSTART

    import tfbuilder
    from tfbuilder.train.task import Task

    other_rank = torch.tensor([0.0, 0.0, 40.0, 0.0])  # another rank sent everything to expert 2

    class Strategy:
        def reduce(self, tensor, reduce_op):
            assert reduce_op == "sum"
            return tensor + other_rank

    class Trainer:
        world_size = 2
        strategy = Strategy()

    ffn = "model.ffn={type: moe, experts: 4, top_k: 1, hidden: 8, router: sigmoid, correction_bias: true, " \
          "bias_update: 0.5}"
    recipe = tfbuilder.load_recipe(QUICKSTART, [ffn, "model.encoder.layers=1", "model.decoder.layers=1"])
    task = Task(recipe, tfbuilder.build_model(recipe), "{}")
    monkeypatch.setattr(Task, "trainer", property(lambda self: Trainer()))
    layers = [m for m in task.model.modules() if isinstance(m, MixtureOfExperts)]
    with torch.no_grad():
        for m in layers:
            m.expert_load.copy_(torch.tensor([3.0, 2.0, 1.0, 2.0]))  # this rank's load
    task.on_before_optimizer_step(None)
    for m in layers:  # total [3, 2, 41, 2], mean 12: only expert 2 is above it
        torch.testing.assert_close(m.correction_bias, torch.tensor([0.5, 0.5, -0.5, 0.5]))


def test_a_recipe_with_gated_experts_reads_back_from_its_resolved_form():
    """A checkpoint keeps the resolved recipe (every field, activation's default too): it must load."""
    import tfbuilder
    from conftest import ROOT
    from tfbuilder.spec.recipe import recipe_from_dict

    ffn = "model.ffn={type: moe, experts: 4, top_k: 2, expert: swiglu, hidden: 64, bias: false}"
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "architectures" / "llama-small.yaml", [ffn])
    assert recipe_from_dict(recipe.to_dict()).model == recipe.model
