"""The vanilla recipe is torch.nn.Transformer: same weights in, same outputs out (eval and training
mode, any pad id). Per-head widths other than d_model / heads, which nn.Transformer cannot express,
are checked against the model written out from the paper with its attention as einsums."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
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


def reference_logits(ref: nn.Transformer, table: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    d = ref.d_model
    src_x = table[src] * math.sqrt(d) + paper_sinusoids(src.shape[1], d)
    tgt_x = table[tgt] * math.sqrt(d) + paper_sinusoids(tgt.shape[1], d)
    n = tgt.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = may not attend (torch's convention)
    out = ref(
        src_x,
        tgt_x,
        tgt_mask=causal,
        src_key_padding_mask=src == pad,
        tgt_key_padding_mask=tgt == pad,
        memory_key_padding_mask=src == pad,
        tgt_is_causal=True,
    )
    return out @ table.T  # tied pre-softmax projection


def padded_batch(vocab: int, pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(0, vocab, (3, 11))
    tgt = torch.randint(0, vocab, (3, 9))
    src[src == pad] = tgt[tgt == pad] = pad + 1  # real tokens are never the pad id (0 among them when it is not)
    src[0, 7:] = pad  # sources of different lengths
    src[2, 4:] = pad
    tgt[1, 5:] = pad  # and targets
    return src, tgt


def nn_transformer_for(spec, *, activation: str = "relu", norm_first: bool = False, final_norm: bool = False) -> nn.Transformer:
    ref = nn.Transformer(
        d_model=spec.d_model,
        nhead=spec.attention.heads,
        num_encoder_layers=spec.encoder.layers,
        num_decoder_layers=spec.decoder.layers,
        dim_feedforward=spec.ffn.hidden,
        dropout=spec.dropout,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    )
    if not final_norm:  # the paper's post-norm stacks end with the last layer's norm, no extra one
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref


@pytest.mark.parametrize(
    "placement, activation, final_norm, mode",
    [("post", "relu", False, "eval"), ("pre", "relu", True, "eval"), ("post", "gelu", True, "eval"), ("post", "relu", False, "train")],
    ids=["vanilla-post-relu", "pre-norm", "gelu-final-norm", "training-mode"],
)
def test_vanilla_recipe_equals_nn_transformer(placement, activation, final_norm, mode):
    # The vanilla recipe at its full width and depth (only the vocabulary is smaller); its variants,
    # which take other code paths but no other sizes, two layers a stack at width 64. In training
    # mode (dropout 0, so that both are deterministic) both take their training code paths.
    overrides = [
        "data.tokenizer.vocab_size=301",
        f"model.placement={placement}",
        f"model.ffn.activation={activation}",
        f"model.final_norm={str(final_norm).lower()}",
    ]
    if (placement, activation, final_norm, mode) != ("post", "relu", False, "eval"):
        overrides += ["model.d_model=64", "model.ffn.hidden=128", "model.attention.key_dim=16", "model.attention.value_dim=16"]
        overrides += ["model.attention.heads=4", "model.encoder.layers=2", "model.decoder.layers=2"]
    overrides += ["model.dropout=0.0"] if mode == "train" else []
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=overrides)
    spec = recipe.model
    model = tfbuilder.build_model(recipe).train(mode == "train")
    ref = nn_transformer_for(spec, activation=activation, norm_first=placement == "pre", final_norm=final_norm).train(mode == "train")
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


def small_vanilla(*overrides: str):
    """The vanilla recipe, narrower and shallower (two layers a stack), without its data section."""
    base = ["data=null", "model.vocab_size=101", "model.dropout=0.0", "model.d_model=64", "model.ffn.hidden=128"]
    base += ["model.attention.key_dim=16", "model.attention.value_dim=16", "model.attention.heads=4"]
    base += ["model.encoder.layers=2", "model.decoder.layers=2"]
    return tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=base + list(overrides))


def test_a_pad_id_other_than_0_masks_what_nn_transformer_masks():
    pad = 7
    recipe = small_vanilla(f"model.pad_id={pad}")
    model = tfbuilder.build_model(recipe).eval()
    ref = nn_transformer_for(recipe.model).eval()
    copy_weights_from(ref, model)
    src, tgt = padded_batch(101, pad)
    src[1, 0] = tgt[0, 2] = 0  # id 0 is an ordinary token here
    with torch.no_grad():
        ours = model(src, tgt)
        theirs = reference_logits(ref, model.src_embed.tokens.weight, src, tgt, pad)
        wrong = reference_logits(ref, model.src_embed.tokens.weight, src, tgt, PAD)  # masking id 0 instead
    real = tgt != pad
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours[real], wrong[real], atol=1e-4)


def written_out_logits(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """The post-norm encoder-decoder of the paper written out with the model's weights: attention as
    einsums over per-head widths d_k and d_v of any size (Table 3 rows A and B), LayerNorm(x +
    Sublayer(x)) (sec. 5.4), ReLU feed-forward (sec. 3.3), tied embeddings scaled by sqrt(d_model)
    plus sinusoids (sec. 3.4-3.5)."""
    table = model.src_embed.tokens.weight
    d = table.shape[1]

    def embed(ids):
        return table[ids] * math.sqrt(d) + paper_sinusoids(ids.shape[1], d)

    def attention(block, x, context, allowed):  # allowed: (b or 1, i or 1, j), True where a query may look
        a = block.inner
        h, dk, dv = a.heads, a.key_dim, a.value_dim
        if context is None:
            q, k, v = a.to_qkv(x).split([h * dk, h * dk, h * dv], dim=-1)
        else:
            q, (k, v) = a.to_q(x), a.to_kv(context).split([h * dk, h * dv], dim=-1)
        q, k, v = q.unflatten(-1, (h, dk)), k.unflatten(-1, (h, dk)), v.unflatten(-1, (h, dv))
        scores = torch.einsum("bihk,bjhk->bhij", q, k) / math.sqrt(dk)
        weights = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)
        return a.to_out(torch.einsum("bhij,bjhv->bihv", weights, v).flatten(-2))

    def norm(block, x):
        return F.layer_norm(x, (d,), block.norm.weight, block.norm.bias, block.norm.eps)

    def ffn(block, x):
        return block.inner.ff_out(torch.relu(block.inner.ff_in(x)))

    keys = (src != pad)[:, None, :]
    x = embed(src)
    for layer in model.encoder.layers:
        x = norm(layer.self_attn, x + attention(layer.self_attn, x, None, keys))
        x = norm(layer.ffn, x + ffn(layer.ffn, x))
    n = tgt.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
    y = embed(tgt)
    for layer in model.decoder.layers:
        y = norm(layer.self_attn, y + attention(layer.self_attn, y, None, causal))
        y = norm(layer.cross_attn, y + attention(layer.cross_attn, y, x, keys))
        y = norm(layer.ffn, y + ffn(layer.ffn, y))
    return y @ table.T


def test_per_head_widths_nn_transformer_cannot_express_equal_the_written_out_model():
    src, tgt = padded_batch(101)
    real = tgt != PAD
    # The written-out reference is nn.Transformer where nn.Transformer applies (d_k = d_v = 64 / 4) ...
    model = tfbuilder.build_model(small_vanilla()).eval()
    ref = nn_transformer_for(small_vanilla().model).eval()
    copy_weights_from(ref, model)
    with torch.no_grad():
        torch.testing.assert_close(
            written_out_logits(model, src, tgt)[real], reference_logits(ref, model.src_embed.tokens.weight, src, tgt)[real], atol=1e-5, rtol=1e-5
        )
    # ... and the model equals it where nn.Transformer cannot go: d_k = 24, d_v = 40 with 4 heads of 64.
    wide = tfbuilder.build_model(small_vanilla("model.attention.key_dim=24", "model.attention.value_dim=40")).eval()
    assert wide.encoder.layers[0].self_attn.inner.to_qkv.out_features == 4 * (24 + 24 + 40)
    with torch.no_grad():
        torch.testing.assert_close(wide(src, tgt)[real], written_out_logits(wide, src, tgt)[real], atol=1e-5, rtol=1e-5)


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
