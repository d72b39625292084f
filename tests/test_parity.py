"""The vanilla recipe is torch.nn.Transformer: same weights in, same outputs out (eval mode)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import tfbuilder
from conftest import ROOT

PAD = 0


def paper_sinusoids(n: int, d: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), written out from the paper."""
    pe = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(0, d, 2):
            angle = pos / 10000 ** (i / d)
            pe[pos, i] = math.sin(angle)
            if i + 1 < d:
                pe[pos, i + 1] = math.cos(angle)
    return pe.float()


def copy_weights_from(ref: nn.Transformer, model: nn.Module) -> None:
    """Load nn.Transformer's encoder/decoder weights into a tfbuilder encoder-decoder."""
    d = ref.d_model
    with torch.no_grad():
        for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
            ours.self_attn.inner.to_qkv.weight.copy_(theirs.self_attn.in_proj_weight)
            ours.self_attn.inner.to_qkv.bias.copy_(theirs.self_attn.in_proj_bias)
            ours.self_attn.inner.to_out.load_state_dict(theirs.self_attn.out_proj.state_dict())
            ours.self_attn.norm.load_state_dict(theirs.norm1.state_dict())
            ours.ffn.inner.ff_in.load_state_dict(theirs.linear1.state_dict())
            ours.ffn.inner.ff_out.load_state_dict(theirs.linear2.state_dict())
            ours.ffn.norm.load_state_dict(theirs.norm2.state_dict())
        for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
            ours.self_attn.inner.to_qkv.weight.copy_(theirs.self_attn.in_proj_weight)
            ours.self_attn.inner.to_qkv.bias.copy_(theirs.self_attn.in_proj_bias)
            ours.self_attn.inner.to_out.load_state_dict(theirs.self_attn.out_proj.state_dict())
            ours.self_attn.norm.load_state_dict(theirs.norm1.state_dict())
            cross, w, b = ours.cross_attn.inner, theirs.multihead_attn.in_proj_weight, theirs.multihead_attn.in_proj_bias
            cross.to_q.weight.copy_(w[:d])
            cross.to_q.bias.copy_(b[:d])
            cross.to_kv.weight.copy_(w[d:])
            cross.to_kv.bias.copy_(b[d:])
            cross.to_out.load_state_dict(theirs.multihead_attn.out_proj.state_dict())
            ours.cross_attn.norm.load_state_dict(theirs.norm2.state_dict())
            ours.ffn.inner.ff_in.load_state_dict(theirs.linear1.state_dict())
            ours.ffn.inner.ff_out.load_state_dict(theirs.linear2.state_dict())
            ours.ffn.norm.load_state_dict(theirs.norm3.state_dict())
        for ours, theirs in ((model.encoder, ref.encoder), (model.decoder, ref.decoder)):
            if ours.final_norm is not None:
                ours.final_norm.load_state_dict(theirs.norm.state_dict())


def reference_logits(ref: nn.Transformer, table: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    d = ref.d_model
    src_x = table[src] * math.sqrt(d) + paper_sinusoids(src.shape[1], d)
    tgt_x = table[tgt] * math.sqrt(d) + paper_sinusoids(tgt.shape[1], d)
    n = tgt.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = may not attend (torch's convention)
    out = ref(
        src_x,
        tgt_x,
        tgt_mask=causal,
        src_key_padding_mask=src == PAD,
        tgt_key_padding_mask=tgt == PAD,
        memory_key_padding_mask=src == PAD,
        tgt_is_causal=True,
    )
    return out @ table.T  # tied pre-softmax projection


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(1, vocab, (3, 11))
    tgt = torch.randint(1, vocab, (3, 9))
    src[0, 7:] = PAD  # sources of different lengths
    src[2, 4:] = PAD
    tgt[1, 5:] = PAD  # and targets
    return src, tgt


@pytest.mark.parametrize(
    "placement, activation, final_norm",
    [("post", "relu", False), ("pre", "relu", True), ("post", "gelu", True)],
    ids=["vanilla-post-relu", "pre-norm", "gelu-final-norm"],
)
def test_vanilla_recipe_equals_nn_transformer(placement, activation, final_norm):
    # The vanilla recipe at its full width and depth; only the vocabulary is smaller.
    overrides = [
        "data.tokenizer.vocab_size=301",
        f"model.placement={placement}",
        f"model.ffn.activation={activation}",
        f"model.final_norm={str(final_norm).lower()}",
    ]
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=overrides)
    spec = recipe.model
    model = tfbuilder.build_model(recipe).eval()
    ref = nn.Transformer(
        d_model=spec.d_model,
        nhead=spec.attention.heads,
        num_encoder_layers=spec.encoder.layers,
        num_decoder_layers=spec.decoder.layers,
        dim_feedforward=spec.ffn.hidden,
        dropout=spec.dropout,
        activation=activation,
        batch_first=True,
        norm_first=placement == "pre",
    ).eval()
    if not final_norm:  # the paper's post-norm stacks end with the last layer's norm, no extra one
        ref.encoder.norm = None
        ref.decoder.norm = None
    copy_weights_from(ref, model)
    src, tgt = padded_batch(spec.vocab_size)
    with torch.no_grad():
        ours = model(src, tgt)
        theirs = reference_logits(ref, model.src_embed.tokens.weight, src, tgt)
    assert ours.shape == (3, 9, spec.vocab_size)
    # Every real target position is equal. Padded target positions are unspecified in tfbuilder
    # (its causal self-attention needs no padding mask, and nothing reads those outputs).
    real = tgt != PAD
    assert not real.all()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)


def test_parity_fails_when_a_weight_differs():
    """The comparison above is sharp: perturb one weight and it no longer holds."""
    recipe = tfbuilder.load_recipe(
        ROOT / "recipes" / "vanilla.yaml", overrides=["data.tokenizer.vocab_size=101", "model.encoder.layers=1", "model.decoder.layers=1"]
    )
    model = tfbuilder.build_model(recipe).eval()
    ref = nn.Transformer(d_model=512, nhead=8, num_encoder_layers=1, num_decoder_layers=1, batch_first=True).eval()
    ref.encoder.norm = ref.decoder.norm = None
    copy_weights_from(ref, model)
    with torch.no_grad():
        model.decoder.layers[0].ffn.inner.ff_out.bias[3] += 1e-3
        src, tgt = padded_batch(101)
        diff = (model(src, tgt) - reference_logits(ref, model.src_embed.tokens.weight, src, tgt)).abs().max()
    assert diff > 1e-5


def test_vanilla_parameter_count_matches_the_paper():
    """Base model: 65M parameters in the paper's Table 3 (with a 37k shared vocabulary)."""
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml")
    with torch.device("meta"):
        model = tfbuilder.build_model(recipe)
    n = tfbuilder.count_parameters(model)
    assert 60e6 < n < 66e6, n
