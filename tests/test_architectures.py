"""The keys that make published architectures exact, each validated and defaulting to the paper's
behaviour, and the recipes in recipes/architectures/ at their reference sizes."""

from __future__ import annotations

import math

import pytest
import torch

import tfbuilder
from tfbuilder.model.builder import count_parameters
from tfbuilder.cli.commands import main
from tfbuilder.errors import RecipeError
from tfbuilder.spec.recipe import json_schema
from tfbuilder.registry import BuildContext
from conftest import ROOT

ARCH = ROOT / "recipes" / "architectures"
VANILLA = ROOT / "recipes" / "vanilla.yaml"


def reference_count(name: str) -> int:
    """Parameters of the Hugging Face reference, built on the meta device from its config (no weights)."""
    T = pytest.importorskip("transformers")
    build = {
        "gpt2-small": lambda: T.GPT2LMHeadModel(T.GPT2Config()),
        "bert-base": lambda: T.BertForMaskedLM(T.BertConfig()),
        "t5-small": lambda: T.T5ForConditionalGeneration(T.T5Config()),
        "llama-small": lambda: T.LlamaForCausalLM(
            T.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=2, vocab_size=32000, rms_norm_eps=1e-6)
        ),
        "llama3.1-small": lambda: T.LlamaForCausalLM(T.LlamaConfig(
            hidden_size=512, intermediate_size=1792, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=32000, rms_norm_eps=1e-5, max_position_embeddings=131072, rope_parameters={
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        "mistral-small": lambda: T.MistralForCausalLM(T.MistralConfig(
            hidden_size=512, intermediate_size=1792, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            head_dim=64, vocab_size=32000, sliding_window=256, rms_norm_eps=1e-5)),
        "qwen2.5-small": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=32000, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "qwen3-small": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
            hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
            head_dim=128, vocab_size=32000, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "phi3-small": lambda: T.Phi3ForCausalLM(T.Phi3Config(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, vocab_size=32064,
            sliding_window=2047, rms_norm_eps=1e-5)),
        "gemma2-small": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
            hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
            head_dim=64, query_pre_attn_scalar=64, vocab_size=32000, sliding_window=256)),
        "gemma3-small": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
            hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
            head_dim=64, query_pre_attn_scalar=64, vocab_size=32000, sliding_window=256, rope_parameters={
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
        "qwen3-moe-small": lambda: T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(
            hidden_size=512, intermediate_size=256, moe_intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, vocab_size=32000, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "olmo2-small": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8, vocab_size=32000,
            rms_norm_eps=1e-6, eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        "mixtral-small": lambda: T.MixtralForCausalLM(T.MixtralConfig(
            hidden_size=512, intermediate_size=1792, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            head_dim=64, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "deepseek-v3-small": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
            hidden_size=256, intermediate_size=704, moe_intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
            routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True, vocab_size=32000,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_interleave=True)),
        "qwen2-moe-small": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
            hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, shared_expert_intermediate_size=1024,
            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, vocab_size=32000, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    }[name]
    with torch.device("meta"):
        model = build()
    # distinct tensors: tied embeddings count once
    return sum({id(p): p.numel() for p in model.parameters()}.values())


REFERENCED = ["gpt2-small", "bert-base", "t5-small", "llama-small", "llama3.1-small", "mistral-small", "qwen2.5-small",
              "qwen3-small", "phi3-small", "gemma2-small", "gemma3-small", "olmo2-small",
              "mixtral-small", "qwen3-moe-small", "deepseek-v3-small", "qwen2-moe-small"]


@pytest.mark.parametrize("name", REFERENCED)
def test_architecture_recipe_has_the_reference_parameter_count(name):
    recipe = tfbuilder.load_recipe(ARCH / f"{name}.yaml")
    with torch.device("meta"):
        model = tfbuilder.build_model(recipe)
    assert count_parameters(model) == reference_count(name)


def test_defaults_are_the_papers():
    """A recipe that says nothing of the new keys builds what it built before."""
    recipe = tfbuilder.load_recipe(VANILLA, ["model.encoder.layers=1", "model.decoder.layers=1", "model.vocab_size=40", "data=null"])
    spec = recipe.model
    assert (spec.embed_scale, spec.output_scale, spec.pad_id, spec.token_types) == ("sqrt_d_model", 1.0, 0, 0)
    assert (spec.embed_norm, spec.head_bias, spec.init.std) == (False, False, None)
    model = tfbuilder.build_model(recipe)
    assert model.src_embed.scale == math.sqrt(512) and model.src_embed.types is None and model.src_embed.norm is None
    assert model.head.bias is None and model.head.scale == 1.0
    assert spec.attention.scale is None and model.encoder.layers[0].self_attn.inner.scale == 1 / math.sqrt(64)
    assert spec.position.type == "sinusoidal"
    rotary = tfbuilder.load_recipe(ROOT / "recipes" / "ablations" / "rotary.yaml", ["data=null", "model.vocab_size=40"])
    assert rotary.model.position.pairing == "interleaved"


@pytest.mark.parametrize(
    "overrides, where, message",
    [
        (["model.init={residual_scaling: true}"], "model.init.residual_scaling", "needs init.std"),
        (["model.attention.qk_norm=true", "model.attention.scale=1.0"], "model.attention.scale", "qk_norm learns its own scale"),
        (["model.token_types=2"], "model.token_types", "one-stack models"),
        (["model.pad_id=null"], "model.pad_id", "needs pad_id"),
        (["model.embed_scale=sqrt"], "model.embed_scale", "sqrt_d_model"),
        (["model.output_scale=-1"], "model.output_scale", ""),
        (["model.position={type: rotary, pairing: halves}"], "model.position.pairing", "'interleaved' or 'half'"),
        (["model.init={std: 0}"], "model.init.std", "greater than 0"),
    ],
)
def test_bad_values_are_reported_where_they_are(overrides, where, message):
    with pytest.raises(RecipeError) as info:
        tfbuilder.load_recipe(VANILLA, overrides)
    text = "\n".join(str(p) for p in info.value.problems)
    assert f"{where}:" in text and message in text


def test_output_scale_cannot_be_negative_or_zero():
    # a recipe key that scales logits must be a positive number or the keyword
    with pytest.raises(RecipeError):
        tfbuilder.load_recipe(VANILLA, ["model.output_scale=0"])


def test_new_keys_are_described_in_the_schema_and_components(capsys):
    props = json_schema()["$defs"]["ModelSection"]["properties"]
    for key in ("embed_scale", "output_scale", "token_types", "embed_norm", "head_bias", "init", "pad_id"):
        assert props[key].get("description"), key
    assert main(["components", "position"]) == 0
    assert "pairing: default 'interleaved'" in capsys.readouterr().out
    assert main(["components", "attention"]) == 0
    assert "scale: default None" in capsys.readouterr().out


def test_half_rotation_is_gpt_neox_and_llamas():
    """x*cos + rotate_half(x)*sin with rotate_half(x) = (-x2, x1), written out (Black et al. 2022)."""
    from tfbuilder.model.components.position import RotaryPosition

    rope = RotaryPosition(RotaryPosition.Params(pairing="half"), BuildContext(d_model=16))
    x = torch.randn(2, 3, 5, 8)
    k, offset = x.shape[-1], 4
    inv = 1.0 / (10000 ** (torch.arange(0, k, 2).float() / k))
    angles = torch.arange(offset, offset + 5).float()[:, None] * inv
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotate_half = torch.cat([-x[..., k // 2 :], x[..., : k // 2]], dim=-1)
    torch.testing.assert_close(rope.rotate(x, offset), x * cos + rotate_half * sin)
    interleaved = RotaryPosition(RotaryPosition.Params(), BuildContext(d_model=16))
    assert not torch.allclose(interleaved.rotate(x, offset), rope.rotate(x, offset))


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_attention_scale_multiplies_the_scores(scale):
    from tfbuilder.model.components.attention import MultiHeadAttention

    attn = MultiHeadAttention(MultiHeadAttention.Params(heads=2, scale=scale), BuildContext(d_model=8)).eval()
    x = torch.randn(3, 4, 8)
    q, k, v = attn.to_qkv(x).split([8, 8, 8], dim=-1)
    q, k, v = (t.reshape(3, 4, 2, 4).transpose(1, 2) for t in (q, k, v))
    weights = (q @ k.transpose(-2, -1) * scale).softmax(-1)
    want = attn.to_out((weights @ v).transpose(1, 2).reshape(3, 4, 8))
    torch.testing.assert_close(attn(x), want)


def tiny(path, *extra):
    overrides = ["model.d_model=32", "model.attention.heads=4", "model.ffn.hidden=48", "model.vocab_size=50", *extra]
    return tfbuilder.load_recipe(path, overrides)


def test_bert_embedding_adds_types_then_normalises():
    recipe = tiny(ARCH / "bert-base.yaml", "model.encoder.layers=1", "model.dropout=0.0")
    model = tfbuilder.build_model(recipe).eval()
    ids = torch.randint(5, 50, (2, 6))
    types = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    e = model.embed
    want = e.norm(e.tokens(ids) + e.types(types) + e.position.table.weight[:6])
    torch.testing.assert_close(e(ids, token_types=types), want)
    torch.testing.assert_close(e(ids), e(ids, token_types=torch.zeros_like(ids)))
    assert model.head.out.bias is not None and model.head.out.weight is model.embed.tokens.weight


def test_t5_scales_before_its_tied_head_and_keeps_its_start_token():
    recipe = tiny(ARCH / "t5-small.yaml", "model.encoder.layers=1", "model.decoder.layers=1", "model.attention.key_dim=8", "model.attention.value_dim=8")
    model = tfbuilder.build_model(recipe).eval()
    h = torch.randn(2, 3, 32)
    torch.testing.assert_close(model.head(h), (h * 32**-0.5) @ model.tgt_embed.tokens.weight.T)
    src = torch.randint(3, 50, (2, 5))
    tgt = torch.tensor([[0, 7, 9], [0, 8, 0]])  # starts with the pad id 0, which is a real token here
    # Position 0 attends to itself: were the start token masked as padding, it would have no key at all.
    assert torch.isfinite(model(src, tgt)).all()


def test_no_pad_id_makes_id_zero_a_token():
    """GPT-2 has no padding token: id 0 is a target the loss counts (with a pad id it is ignored).
    Decoders never mask by id (causal attention needs no padding mask), so the logits agree."""
    from tfbuilder.train.objectives import objective

    small = ("model.decoder.layers=1", "model.dropout=0.0", "model.position.max_len=16")
    recipe = tiny(ARCH / "gpt2-small.yaml", *small)
    with_pad_recipe = tiny(ARCH / "gpt2-small.yaml", *small, "model.pad_id=0")
    model = tfbuilder.build_model(recipe).eval()
    with_pad = tfbuilder.build_model(with_pad_recipe).eval()
    with_pad.load_state_dict(model.state_dict())
    ids = torch.tensor([[7, 0, 9, 11, 0]])
    torch.testing.assert_close(model(ids), with_pad(ids))
    counted = objective(recipe, epsilon=0.0)(model, {"tokens": ids})
    ignored = objective(with_pad_recipe, epsilon=0.0)(with_pad, {"tokens": ids})
    assert (int(counted.tokens), int(ignored.tokens)) == (4, 2)  # targets 0 9 11 0
    assert tfbuilder.Recipe.model_validate(recipe.to_dict()).model.pad_id is None  # null survives a checkpoint


def test_init_std_and_gpt2_residual_scaling():
    torch.manual_seed(0)
    recipe = tfbuilder.load_recipe(ARCH / "gpt2-small.yaml", ["model.decoder.layers=8", "model.vocab_size=1000"])
    model = tfbuilder.build_model(recipe)
    layer = model.decoder.layers[0]
    qkv = layer.self_attn.inner.to_qkv
    assert abs(qkv.weight.std().item() - 0.02) < 0.001 and qkv.bias.abs().sum() == 0
    for proj in (layer.self_attn.inner.to_out, layer.ffn.inner.ff_out):
        assert abs(proj.weight.std().item() - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(model.embed.tokens.weight.std().item() - 0.02) < 0.001
    assert abs(model.embed.position.table.weight.std().item() - 0.02) < 0.001
    assert torch.equal(layer.self_attn.norm.weight, torch.ones(768))


def test_a_model_without_pad_id_trains_only_on_unpadded_batches(tmp_path):
    from tfbuilder.errors import TfbuilderError

    small = ("model.decoder.layers=1", "model.position.max_len=16", f"trainer.output={tmp_path}")
    data = "data={type: monolingual, path: %s, lang: en, tokenizer: {type: char, vocab_size: 50}}" % tmp_path
    with pytest.raises(TfbuilderError, match="data.batch_size: 1"):
        tfbuilder.fit(tiny(ARCH / "gpt2-small.yaml", *small, data, "data.max_tokens=512"))
    assert not any(tmp_path.iterdir())  # refused before anything was written
