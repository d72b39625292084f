"""Generated over the registry: the training computation (features and loss) compiles as one graph,
for every registered component, kind, placement and attention variant, and batches of varying
shape cause a small, bounded number of recompilations.

Run with dynamo's ``eager`` backend: graph capture is what is tested (on any machine), not code
generation. A graph break would make ``fullgraph=True`` raise.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import tfbuilder
from conftest import tiny_model
from test_components import KINDS
from tfbuilder import registry
from tfbuilder.train.objectives import objective
from tfbuilder.spec.recipe import Recipe

VOCAB = tiny_model()["vocab_size"]


ATTENTION_VARIANTS = [
    {},
    {"kv_heads": 2, "gate": "elementwise"},
    {"window": 3},
    {"qk_norm": True},
    {"dropout": 0.1, "gate": "headwise"},
    {"softcap": 50.0},
]
PLACEMENTS = ["post", "pre", "sandwich"]


def _cases() -> list:
    """Every registered type of every family, every model kind, placement and attention variant
    (grouped-query, sliding window, qk-norm, attention dropout, soft-capped scores, output gates), with and without the
    model's dropout, soft-capped logits and the z-loss:
    combined into as few models as cover them all, case i taking the i-th of each (cycling). Tracing
    is what costs here; a graph break anywhere in a model fails its case, named by all it combines."""
    types = {family: registry.types(family) for family in registry.FAMILIES}
    count = max(len(KINDS), len(PLACEMENTS), len(ATTENTION_VARIANTS), *map(len, types.values()))
    cases = []
    for i in range(count):
        changes: dict = {family: {"type": names[i % len(names)]} for family, names in types.items()}
        if changes["attention"]["type"] in ("multihead", "differential"):  # the variants are options of both
            changes["attention"].update(heads=4, **ATTENTION_VARIANTS[i % len(ATTENTION_VARIANTS)])
        if changes["ffn"]["type"] == "moe":
            changes["ffn"]["capacity_factor"] = 1.5  # (compiled, the dispatch is the static one either way)
            # DeepSeek-V3's routing (the correction bias counted in the training forward) and Qwen2-MoE's gated shared expert
            changes["ffn"].update(expert="swiglu", router="sigmoid", correction_bias=True, bias_update=0.001, groups=2,
                                  shared_experts=1, shared_gate=True)
        changes["placement"] = PLACEMENTS[i % len(PLACEMENTS)]
        changes["dropout"] = 0.1 * (i % 2)
        if i % 3 == 1:
            changes["logit_softcap"] = 30.0  # with the recipe's z-loss (see _setup)
        if i in (4, 5):  # a decoder with pre-norm, an encoder with sandwich norms (the kinds and placements it allows)
            changes.update(block="parallel", parallel_norms=("shared", "separate")[i % 2])
        kind = list(KINDS)[i % len(KINDS)]
        name = "-".join([kind, changes["placement"], *(["parallel"] if "block" in changes else []), *(c["type"] for c in (changes[f] for f in registry.FAMILIES))])
        variant = "-".join(f"{k}={v}" for k, v in changes["attention"].items() if k not in ("type", "heads"))
        cases.append(pytest.param(changes, kind, id=name + (f"-{variant}" if variant else "") + ("-dropout" if i % 2 else "")))
    return cases


def _setup(changes: dict, kind: str):
    spec = tiny_model(kind=kind, **KINDS[kind])
    for part in ("encoder", "decoder"):  # one layer of each is every code path, traced faster
        if spec.get(part):
            spec[part] = {"layers": 1}
    spec.update(changes)
    z_loss = 1e-4 if spec.get("logit_softcap") else 0.0
    recipe = Recipe.model_validate({"model": spec, "optim": {"label_smoothing": 0.1, "z_loss": z_loss}})
    model = tfbuilder.build_model(recipe).train()
    return model, objective(recipe, epsilon=0.1)


def _batch(kind: str, b: int, n: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (b, n))
    ids[0, n // 2 :] = 0  # padding
    if kind == "encoder_decoder":
        return {"src": torch.randint(5, VOCAB, (b, n + 1)), "tgt_in": ids, "tgt_out": ids}
    return {"tokens": ids}


@pytest.mark.parametrize("changes, kind", _cases())
def test_features_and_loss_compile_without_graph_breaks(changes, kind):
    model, fn = _setup(changes, kind)
    torch._dynamo.reset()
    compiled = torch.compile(lambda m, b: fn(m, b).loss, backend="eager", fullgraph=True)
    loss = compiled(model, _batch(kind, 4, 6))
    loss.backward()  # the fused loss's backward runs through the captured graph too
    assert torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_varying_batch_shapes_recompile_a_bounded_number_of_times():
    kind = "encoder_decoder"  # both stacks, cross-attention and the fused loss
    model, fn = _setup({}, kind)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(lambda m, b: fn(m, b).loss, backend=counter, fullgraph=True)
    generator = torch.Generator().manual_seed(0)
    shapes = [(int(b), int(n)) for b, n in torch.randint(2, 12, (10, 2), generator=generator)]
    for b, n in shapes:
        compiled(model, _batch(kind, b, n)).backward()
    assert len(set(shapes)) >= 8
    assert counter.frame_count <= 3, f"{counter.frame_count} compilations for {len(set(shapes))} shapes"
