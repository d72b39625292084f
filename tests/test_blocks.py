"""Parallel blocks against the papers' equation, written out from each layer's own sub-modules:
x + Attn(Norm(x)) + FFN(Norm(x)) (GPT-J; PaLM, Chowdhery et al. 2022, arXiv:2204.02311, sec. 2)."""

from __future__ import annotations

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.inference import decoding
from tfbuilder.spec.recipe import ModelSection


def parallel_model(kind: str = "decoder", **changes) -> torch.nn.Module:
    torch.manual_seed(0)
    stacks = {"encoder": None} if kind == "decoder" else {"decoder": None}
    spec = tiny_model(kind=kind, block="parallel", **{"placement": "pre", **stacks, **changes})
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


@pytest.mark.parametrize("norms", ["shared", "separate"])
def test_a_parallel_layer_adds_both_branches_to_the_same_input(norms):
    model = parallel_model(parallel_norms=norms, norm={"type": "rmsnorm"})
    tokens = torch.randint(5, 53, (2, 6))
    x = model.embed(tokens)
    for layer in model.decoder.layers:
        attn, ffn = layer.self_attn, layer.ffn
        h_attn = attn.norm(x)
        h_ffn = h_attn if norms == "shared" else ffn.norm(x)
        x = x + attn.inner(h_attn) + ffn.inner(h_ffn)
    torch.testing.assert_close(model(tokens), model.head(model.decoder.final_norm(x)), atol=1e-5, rtol=1e-5)
    norms_per_layer = sum(p.numel() for p in model.decoder.layers[0].parameters() if p.ndim == 1 and p.shape[0] == 32)
    assert norms_per_layer == (1 if norms == "shared" else 2) * 32 + 32 + 32  # + to_out and ff_out biases


@pytest.mark.parametrize("placement", ["pre", "sandwich"])
def test_parallel_blocks_decode_with_a_cache_as_without(placement):
    model = parallel_model(placement=placement, position={"type": "rotary"}, attention={"type": "multihead", "heads": 4, "kv_heads": 2})
    tokens = torch.randint(5, 53, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(decoding.incremental_logits(model, tokens), model(tokens), atol=1e-5, rtol=1e-5)


def test_parallel_blocks_are_refused_where_the_papers_do_not_define_them():
    for changes, where in (({"kind": "encoder_decoder"}, "block"), ({"placement": "post"}, "placement")):
        spec = tiny_model(kind="decoder", encoder=None, placement="pre", block="parallel")
        spec.update(changes)
        if changes.get("kind") == "encoder_decoder":
            spec["encoder"] = {"layers": 1}
        with pytest.raises(ValueError, match=where):
            ModelSection.model_validate(spec)
    with pytest.raises(ValueError, match="parallel_norms"):
        ModelSection.model_validate(tiny_model(parallel_norms="separate"))


def test_output_placement_normalises_each_branch_output_only():
    """placement: output (OLMo 2's reordered norm, arXiv:2501.00656): x + Norm(Sublayer(x)), no input norm."""
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="output", norm={"type": "rmsnorm"}, dropout=0.0)
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tokens = torch.randint(5, 53, (2, 6))
    x = model.embed(tokens)
    for layer in model.decoder.layers:
        attn, ffn = layer.self_attn, layer.ffn
        x = x + attn.norm(attn.inner(x))
        x = x + ffn.norm(ffn.inner(x))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model.head(model.decoder.final_norm(x)), atol=1e-5, rtol=1e-5)


def test_parallel_blocks_refuse_output_placement():
    with pytest.raises(ValueError, match="placement pre or sandwich"):
        ModelSection.model_validate(tiny_model(kind="decoder", encoder=None, block="parallel", placement="output"))
