"""The decoder families of ``tfbuilder/interop/hf/families.py`` (Llama 3.1, Mistral, Qwen2.5, Qwen3,
Phi-3, Gemma 2, Gemma 3, OLMo 2, Mixtral, Qwen3-MoE, DeepSeek-V3, Qwen2-MoE; YaRN and LongRoPE rope types)
are transformers' models
exactly: a tiny random model with every field the importer reads set off its default gives the reference logits after `import-hf` (float32, 1e-4, right-padded
rows compared on their real tokens), its export reads back to the same recipe and weights and loads in
transformers with the same logits, and what a recipe cannot express is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra

from test_hf_configs import Recording  # noqa: E402

from tfbuilder.cli.commands import main  # noqa: E402
from tfbuilder.interop.hf import export, import_hf  # noqa: E402
from tfbuilder.interop.hf.configs import from_config  # noqa: E402
from tfbuilder.interop.hf.families import DECODERS  # noqa: E402
from tfbuilder.runs.checkpoints import load_checkpoint  # noqa: E402

pytestmark = pytest.mark.xdist_group("hf")

V = 96
TOL = 1e-4
ROPE = {"rope_type": "default", "rope_theta": 300.0}
SHARED = dict(
    vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=0.1, bos_token_id=1, eos_token_id=2, initializer_range=0.05,
)
# Each family's config: every field the importer reads away from transformers' default (so that a field
# read wrongly, or not at all, changes the logits), on three layers (a pattern of two kinds repeats).
CONFIGS: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        head_dim=12, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.5,
            "high_freq_factor": 3.0, "original_max_position_embeddings": 16})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        head_dim=12, sliding_window=4, tie_word_embeddings=True, rope_parameters={
            "rope_type": "yarn", "rope_theta": 300.0, "factor": 4.0, "original_max_position_embeddings": 2048,  # the ramp spans pairs 2-6
            "beta_fast": 8.0, "beta_slow": 2.0, "mscale": 0.8, "mscale_all_dim": 0.5, "truncate": False})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=5, max_window_layers=1,
        layer_types=["full_attention", "sliding_attention", "full_attention"], tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 300.0, "factor": 3.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        head_dim=12, attention_bias=True, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        layer_types=["sliding_attention"] * 3, tie_word_embeddings=True, rope_parameters={
            "rope_type": "yarn", "rope_theta": 300.0, "factor": 3.0, "original_max_position_embeddings": 12,
            "attention_factor": 1.3})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(  # Phi-3 128k's longrope: factor from max_position_embeddings
        sliding_window=5, tie_word_embeddings=True, pad_token_id=0, max_position_embeddings=64,
        original_max_position_embeddings=8,  # 13 tokens: the long factors
        rope_parameters={"rope_type": "longrope", "rope_theta": 300.0, "partial_rotary_factor": 0.6,
                         "short_factor": [1.0, 1.5, 2.0], "long_factor": [1.2, 3.0, 7.5]})),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=12, attention_bias=True, query_pre_attn_scalar=20, sliding_window=4, attn_logit_softcapping=3.0,
        layer_types=["full_attention", "sliding_attention", "full_attention"],  # (default: sliding first)
        final_logit_softcapping=4.0, tie_word_embeddings=False, pad_token_id=0, rope_parameters=ROPE)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=12, attention_bias=True, query_pre_attn_scalar=20, sliding_window=4,
        attn_logit_softcapping=3.0,  # held, never applied by transformers' Gemma 3: read and dropped
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], final_logit_softcapping=4.0,
        tie_word_embeddings=False, pad_token_id=0, rope_parameters={  # a base and scaling per layer type
            "full_attention": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 30.0}})),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        head_dim=12, sliding_window=4, num_local_experts=4, num_experts_per_tok=3, tie_word_embeddings=True,
        rope_parameters=ROPE)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=12, attention_bias=True, sliding_window=4, num_local_experts=4, num_experts_per_tok=3,
        moe_intermediate_size=20, norm_topk_prob=True, tie_word_embeddings=True, rope_parameters=ROPE)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(  # latent attention, sigmoid-routed experts
        num_key_value_heads=4,  # latent attention: every head its own keys (refused otherwise)
        q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=8,
        rope_interleave=False,  # (default true: test_deepseek_v3_variants_give_the_reference_logits)
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=1.7,
        norm_topk_prob=False, n_shared_experts=2, moe_intermediate_size=20, first_k_dense_replace=1,
        tie_word_embeddings=True, rope_parameters={
            "rope_type": "yarn", "rope_theta": 300.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 8.0, "beta_slow": 2.0, "mscale": 0.8, "mscale_all_dim": 0.5})),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(  # a gated shared expert, dense layers 0 and 2
        qkv_bias=False, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        layer_types=["sliding_attention", "full_attention", "full_attention"], num_experts=4,
        num_experts_per_tok=3, moe_intermediate_size=20, shared_expert_intermediate_size=24, norm_topk_prob=True,
        decoder_sparse_step=2, mlp_only_layers=[2], router_aux_loss_coef=0.01, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 300.0, "factor": 2.0})),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(
        attention_bias=True, tie_word_embeddings=True, rope_parameters={  # 13 tokens: the short factors
            "rope_type": "longrope", "rope_theta": 300.0, "original_max_position_embeddings": 16, "factor": 4.0,
            "attention_factor": 1.4, "short_factor": [1.0, 1.5, 2.0, 3.0, 4.0], "long_factor": [1.0] * 5})),
}
FAMILIES = sorted(CONFIGS)

# Fields a config holds that change nothing the importer builds (beyond test_hf_configs.NOT_READ["*"]).
NOT_READ = {
    "*": {"model_type", "transformers_version", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id",
          "max_position_embeddings"},  # default and llama3 rotary positions are computed for any length
    "llama": {"pretraining_tp"},  # read, refused unless 1
    "mistral": set(),
    "qwen2": {"use_sliding_window", "max_window_layers"},  # transformers derives layer_types from them
    "qwen3": {"use_sliding_window", "max_window_layers"},
    "phi3": {"embd_pdrop"},  # training only
    "gemma2": {"use_bidirectional_attention"},  # read, refused unless null
    "gemma3": {"use_bidirectional_attention",  # read, refused unless false
               "_sliding_window_pattern"},  # written by save_pretrained, read by nothing (layer_types are)
    "olmo2": set(),
    "mixtral": {"output_router_logits", "router_jitter_noise"},  # training only
    "qwen3_moe": {"output_router_logits", "use_sliding_window",  # training only; transformers' model ignores it
                  "decoder_sparse_step", "mlp_only_layers"},  # read, refused unless every layer is sparse
    "deepseek_v3": {"output_router_logits",  # training only
                    "pretraining_tp", "attention_bias",  # read, refused unless 1 and false
                    "head_dim", "qk_head_dim",  # DeepseekV3Config derives them from qk_rope/nope_head_dim
                    "num_nextn_predict_layers"},  # multi-token prediction: not imported (not in transformers' logits)
    "qwen2_moe": {"output_router_logits", "use_sliding_window", "max_window_layers"},  # layer_types are read
}
TRAINING_ONLY = {"initializer_range", "attention_dropout", "resid_pdrop", "router_aux_loss_coef"}
FIXED = {"architectures", "hidden_act", "hidden_activation", "rope_scaling", "rope_theta", "partial_rotary_factor",
         "quantization_config"}  # read, refused unless null


def reference(family: str, path) -> tuple[torch.nn.Module, dict]:
    """The family's tiny model, every weight perturbed (norm gains and biases included), saved at ``path``."""
    config_class, model_class, fields = CONFIGS[family]
    config = getattr(transformers, config_class)(**{**SHARED, **fields})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's (a buffer: zero as built)
                b.add_(torch.randn_like(b) * 0.1)
    model.save_pretrained(path)
    return model, json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        model, cfg = reference(family, path)
        out[family] = (model, path, cfg)
    return out


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Ids (3, 13) with 0 among them, rows right-padded (the mask marks the real tokens)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = mask[2, 5:] = 0
    return ids, mask


def compare(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor, family: str) -> None:
    real = mask.bool()
    diff = (got[real] - want[real]).abs().max().item()
    assert diff < TOL, f"{family}: max |logit difference| {diff:.2e}"


def their_logits(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask).logits


def our_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids)  # causal: right padding never reaches a real token


@pytest.mark.parametrize("family", FAMILIES)
def test_import_gives_the_reference_logits(family, saved, tmp_path):
    ref, path, _ = saved[family]
    loaded = load_checkpoint(import_hf(path, tmp_path / "run"))
    ids, mask = batch()
    compare(our_logits(loaded.model, ids), their_logits(ref, ids, mask), mask, family)
    assert sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_import_export_import_round_trips(family, saved, tmp_path):
    ref, path, _ = saved[family]
    first = load_checkpoint(import_hf(path, tmp_path / "run"))
    export(tmp_path / "run" / "checkpoints" / "last.ckpt", format="hf", out=tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [CONFIGS[family][1]]
    second = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "again"))
    assert second.recipe.model == first.recipe.model
    ours, again = first.model.state_dict(), second.model.state_dict()
    assert ours.keys() == again.keys() and all(torch.equal(ours[k], again[k]) for k in ours)
    ids, mask = batch()
    back = type(ref).from_pretrained(tmp_path / "hf")
    compare(their_logits(back, ids, mask), their_logits(ref, ids, mask), mask, family)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_is_read_and_set_off_its_default_here(family, saved):
    """No field of the family's config.json is silently ignored, and each field read is one CONFIGS varies."""
    cfg = saved[family][2]
    recording = Recording(cfg)
    from_config(recording)
    varied = set(SHARED) | set(CONFIGS[family][2])
    unexplained = recording.read - varied - TRAINING_ONLY - FIXED - NOT_READ[family] - {"head_dim", "rope_parameters"}
    assert not unexplained, f"{family}: the converter reads {sorted(unexplained)}; vary them in CONFIGS"
    ignored = set(cfg) - recording.read - NOT_READ["*"] - NOT_READ[family]
    assert not ignored, f"{family}: config.json's {sorted(ignored)} are ignored by the converter"


def _with(saved, tmp_path, family: str, **changes) -> str:
    hf_dir = tmp_path / "hf"
    saved[family][0].save_pretrained(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(changes)
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    return str(hf_dir)


@pytest.mark.parametrize(
    "family, changes, field",
    [
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0]}},
         "rope_parameters.long_factor"),
        ("phi3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
         "rope_parameters.rope_type"),  # Phi3Config takes default and longrope only
        ("olmo2", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0, "long_factor": [1.0] * 5,
                                       "short_factor": [1.0, "2"] * 2 + [1.0]}}, "rope_parameters.short_factor"),
        ("mistral", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "truncate": 1}},
         "rope_parameters.truncate"),
        ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "rope_parameters.low_freq_factor"),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 8.0}}, "rope_parameters.rope_type"),
        ("llama", {"pretraining_tp": 2}, "pretraining_tp"),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         "rope_parameters.partial_rotary_factor"),  # transformers' Llama rotates whole heads
        ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
         "rope_parameters.full_attention.rope_type"),
        ("gemma3", {"rope_parameters": {"sliding_attention": "default"}}, "rope_parameters.sliding_attention"),
        ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation"),
        ("qwen2", {"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
        ("qwen2", {"layer_types": ["full_attention"]}, "layer_types"),
        ("mistral", {"hidden_act": "gelu"}, "hidden_act"),
        ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads"),  # latent attention: every head its keys
        ("deepseek_v3", {"attention_bias": True}, "attention_bias"),  # biases on some latent projections only
        ("deepseek_v3", {"qk_rope_head_dim": 5}, "qk_rope_head_dim"),
        ("deepseek_v3", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
        ("deepseek_v3", {"rope_interleave": "yes"}, "rope_interleave"),
        ("deepseek_v3", {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
         "quantization_config"),  # DeepSeek-V3's released weights: fp8 blocks and their scales
        ("deepseek_v3", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
         "rope_parameters.rope_type"),  # DeepSeek's attention rescales by YaRN's mscale_all_dim under any type
        ("qwen2_moe", {"mlp_only_layers": [True]}, "mlp_only_layers"),
        ("qwen2_moe", {"layer_types": None}, "use_sliding_window"),  # Qwen2MoeConfig's own derivation: refused
        ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ("qwen3_moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
    ],
)
def test_what_a_recipe_cannot_express_exits_2_naming_the_field(saved, tmp_path, capsys, family, changes, field):
    hf_dir = _with(saved, tmp_path, family, **changes)
    assert main(["import-hf", hf_dir, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"config.json: {field}:" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_configs_written_before_transformers_5_read_the_same(saved):
    """rope_theta and rope_scaling (Llama 3.1's config.json on the Hub) read as rope_parameters do."""
    cfg = dict(saved["llama"][2])
    rope = dict(cfg.pop("rope_parameters"))
    old = {**cfg, "rope_theta": rope.pop("rope_theta"), "rope_scaling": {**rope, "type": rope.pop("rope_type")}}
    assert from_config(old) == from_config(saved["llama"][2])


def test_phi3_128k_config_reads_its_longrope(saved):
    """Phi-3 128k's config.json on the Hub: rope_scaling without original_max_position_embeddings or factor;
    the top-level original_max_position_embeddings counts, and factor is max_position_embeddings over it
    (transformers' standardize_rope_params and _compute_longrope_parameters)."""
    cfg = dict(saved["phi3"][2])
    rope = dict(cfg.pop("rope_parameters"))
    legacy = {"type": "longrope", "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]}
    old = {**cfg, "rope_theta": rope["rope_theta"], "partial_rotary_factor": rope["partial_rotary_factor"],
           "rope_scaling": legacy}
    assert from_config(old) == from_config(saved["phi3"][2])
    scaling = from_config(old)[1]["position"]["scaling"]
    assert scaling["factor"] == 64 / 8 and scaling["original_max_position_embeddings"] == 8


def test_gemma3_configs_on_the_hub_read_the_same(saved):
    """Gemma 3's config.json on the Hub: rope_theta with rope_scaling for the full layers, rope_local_base_freq
    for the sliding ones, sliding_window_pattern instead of layer_types (Gemma3TextConfig)."""
    cfg = dict(saved["gemma3"][2])
    rope = cfg.pop("rope_parameters")
    full = dict(rope["full_attention"])
    del cfg["layer_types"]
    old = {**cfg, "rope_theta": full.pop("rope_theta"), "rope_scaling": full, "sliding_window_pattern": 2,
           "rope_local_base_freq": rope["sliding_attention"]["rope_theta"]}
    assert from_config(old) == from_config(saved["gemma3"][2])
    model = from_config(saved["gemma3"][2])[1]
    assert model["decoder"]["pattern"] == ["local", "global"] and "softcap" not in model["attention"]
    assert model["decoder"]["kinds"]["local"]["position"] == {"type": "rotary", "base": 30.0, "pairing": "half",
                                                              "scaling": None}
    assert model["position"]["scaling"] == {"type": "linear", "factor": 2.0}


def test_qwen3_moe_configs_on_the_hub_read_the_same(saved):
    """Qwen3-MoE's config.json on the Hub names the experts' count num_experts (transformers maps it)."""
    cfg = dict(saved["qwen3_moe"][2])
    experts = cfg.pop("num_local_experts")
    old = {**cfg, "num_experts": experts}
    assert from_config(old) == from_config(saved["qwen3_moe"][2])
    assert from_config(old)[1]["ffn"]["experts"] == 4


@pytest.mark.parametrize("changes", [{"rope_interleave": True, "q_lora_rank": None}, {"rope_interleave": True}])
def test_deepseek_v3_variants_give_the_reference_logits(changes, tmp_path):
    """DeepSeek-V3's defaults beside the CONFIGS one: rotary pairs interleaved (x_2i, x_2i+1), queries from
    q_proj (q_lora_rank null); the multi-token prediction module a released checkpoint stores after the last
    layer (model.layers.{num_hidden_layers}, num_nextn_predict_layers 1) is left out, as transformers' model
    leaves it out of its logits."""
    from safetensors.torch import load_file, save_file

    config_class, model_class, fields = CONFIGS["deepseek_v3"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, "deepseek_v3", (config_class, model_class, {**fields, **changes}))
        ref, cfg = reference("deepseek_v3", tmp_path / "hf")
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["rope_interleave"] is True
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    weights["model.layers.3.eh_proj.weight"] = torch.randn(40, 80)  # the MTP module's projection
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    loaded = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "run"))
    assert loaded.recipe.model.position.pairing == "interleaved"
    ids, mask = batch()
    compare(our_logits(loaded.model, ids), their_logits(ref, ids, mask), mask, "deepseek_v3")
    export(tmp_path / "run" / "checkpoints" / "last.ckpt", format="hf", out=tmp_path / "out")
    back = type(ref).from_pretrained(tmp_path / "out")
    assert back.config.q_lora_rank == changes.get("q_lora_rank", 12) and back.config.num_nextn_predict_layers == 0
    compare(their_logits(back, ids, mask), their_logits(ref, ids, mask), mask, "deepseek_v3")


def test_deepseek_v3_dense_layers_and_qwen2_moe_mlp_only_layers_are_overrides(saved):
    """The dense layers among the sparse ones: DeepSeek-V3's first first_k_dense_replace; Qwen2-MoE's in
    mlp_only_layers or off decoder_sparse_step (layer 0 of three with step 2, and layer 2 by the list)."""
    dense = {"type": "swiglu", "hidden": 56, "bias": False}
    model = from_config(saved["deepseek_v3"][2])[1]
    assert model["decoder"]["overrides"] == {0: {"ffn": dense}}
    assert model["ffn"]["router"] == "sigmoid" and model["ffn"]["correction_bias"] is True
    model = from_config(saved["qwen2_moe"][2])[1]
    assert model["decoder"]["overrides"] == {0: {"ffn": dense}, 2: {"ffn": dense}}
    assert model["ffn"]["shared_gate"] is True and model["ffn"]["shared_hidden"] == 24


def test_every_other_layer_slides_by_a_pattern_of_kinds(saved):
    model = from_config(saved["gemma2"][2])[1]
    assert model["decoder"]["pattern"] == ["global", "local"]
    assert model["decoder"]["kinds"]["local"] == {"attention": {"window": 4}}
    assert model["attention"]["scale"] == 20**-0.5 and model["embed_scale"] == "sqrt_d_model"


ARCH = {"llama3.1-small": "llama", "mistral-small": "mistral", "qwen2.5-small": "qwen2", "qwen3-small": "qwen3",
        "phi3-small": "mistral",  # Phi-3 computes what Mistral does: the first family in the table that fits is written
        "gemma2-small": "gemma2", "gemma3-small": "gemma3", "qwen3-moe-small": "qwen3_moe", "olmo2-small": "olmo2", "mixtral-small": "mixtral",
        "deepseek-v3-small": "deepseek_v3", "qwen2-moe-small": "qwen2_moe"}
SHRINK = {"mistral-small": ["model.attention.window=4"],
          # the defaults a DeepSeek-V3 config spells out: sigmoid routing renormalises, a shared expert as wide
          "deepseek-v3-small": ["model.ffn.normalize=null",
                                "model.ffn.shared_hidden=48"], "phi3-small": ["model.attention.window=5"],
          "gemma2-small": ["model.decoder.kinds.local.attention.window=4"],
          "gemma3-small": ["model.decoder.kinds.local.attention.window=4", "model.decoder.pattern=[local, global]"]}


@pytest.mark.parametrize("name", sorted(ARCH))
def test_architecture_recipe_exports_to_its_reference(name, tmp_path):
    """A model built from a recipes/architectures/ file (shrunk, every weight perturbed) exports as its family
    and loads in transformers with equal logits."""
    from conftest import ROOT

    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.model.builder import build_model
    from tfbuilder.spec.recipe import load_recipe

    overrides = ["model.d_model=64", "model.decoder.layers=3", "model.ffn.hidden=48", f"model.vocab_size={V}", *SHRINK.get(name, [])]
    recipe = load_recipe(ROOT / "recipes" / "architectures" / f"{name}.yaml", overrides)
    torch.manual_seed(0)
    model = build_model(recipe).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tok = HFTokenizer.ids(V)
    torch.save(checkpoint_dict(model, recipe, Vocab(tok, tok), source="test"), tmp_path / "x.ckpt")
    export(tmp_path / "x.ckpt", format="hf", out=tmp_path / "hf")
    (arch,) = json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"]
    assert arch == DECODERS[ARCH[name]].architecture
    ref = getattr(transformers, arch).from_pretrained(tmp_path / "hf")
    ids, mask = batch()
    compare(our_logits(model, ids), their_logits(ref, ids, mask), mask, name)


CLASSIFIERS = {"llama-small": "LlamaForSequenceClassification", "mistral-small": "MistralForSequenceClassification",
               "qwen2.5-small": "Qwen2ForSequenceClassification"}


def classifier(name: str, tmp_path, *changes: str):
    """A recipes/architectures/ decoder (shrunk) with a three-class head, every weight perturbed, saved."""
    overrides = ["model.d_model=64", "model.decoder.layers=2", "model.ffn.hidden=48", f"model.vocab_size={V}",
                 "model.pad_id=0", "model.head={type: classify, labels: [neg, neu, pos], bias: false}", *changes]
    return saved_classifier(f"{name}.yaml", overrides, tmp_path)


def saved_classifier(file: str, overrides: list[str], tmp_path):
    """recipes/architectures/FILE with OVERRIDES, built, every weight perturbed, saved as tmp_path/x.ckpt."""
    from conftest import ROOT

    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.model.builder import build_model
    from tfbuilder.spec.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "architectures" / file, overrides)
    torch.manual_seed(0)
    model = build_model(recipe).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tok = HFTokenizer.ids(V)
    torch.save(checkpoint_dict(model, recipe, Vocab(tok, tok), source="test"), tmp_path / "x.ckpt")
    return model


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_a_sequence_head_exports_as_for_sequence_classification(name, tmp_path):
    """transformers reads the score at the last token that is not pad_token_id: on right-padded rows the
    same token tfbuilder's pooling: last reads."""
    model = classifier(name, tmp_path)
    export(tmp_path / "x.ckpt", format="hf", out=tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == [CLASSIFIERS[name]] and cfg["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
    ref = getattr(transformers, CLASSIFIERS[name]).from_pretrained(tmp_path / "hf").eval()
    same_scores(model, ref)


@pytest.mark.parametrize(
    "changes, key",
    [(["model.head.bias=true"], "model.head.bias"), (["model.head.pooling=mean"], "model.head.pooling"),
     (["model.head.pooler=true"], "model.head.pooler")],
)
def test_a_sequence_head_transformers_does_not_compute_is_refused(changes, key, tmp_path, capsys):
    classifier("llama-small", tmp_path, *changes)
    assert main(["export", str(tmp_path / "x.ckpt"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    assert key in capsys.readouterr().err and not (tmp_path / "hf").exists()


def bert_classifier(tmp_path, *changes: str):
    """recipes/architectures/bert-base.yaml (shrunk) with a three-class head read through BERT's pooler,
    every weight perturbed, saved."""
    overrides = ["model.d_model=64", "model.attention.heads=4", "model.encoder.layers=2", "model.ffn.hidden=48",
                 f"model.vocab_size={V}", "model.head={type: classify, labels: [neg, neu, pos], pooler: true}",
                 *changes]
    return saved_classifier("bert-base.yaml", overrides, tmp_path)


def test_bert_with_a_sequence_head_exports_as_bert_for_sequence_classification(tmp_path):
    """BertForSequenceClassification: the [CLS] state through the pooler, tanh(W h + b), then the classifier
    with its bias (pooling: cls, pooler: true); padding (pad id 0) masked as the attention mask masks it."""
    model = bert_classifier(tmp_path)
    export(tmp_path / "x.ckpt", format="hf", out=tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"] and cfg["id2label"]["2"] == "pos"
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    same_scores(model, ref)


def same_scores(model, ref) -> None:
    """Our classifier and transformers' give the same three scores on right-padded rows (pad id 0)."""
    ids, mask = batch()
    ids[ids == 0] = 1
    ids[mask == 0] = 0  # right padding with the pad id
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = model(ids)
    assert got.shape == want.shape == (3, 3)
    assert (got - want).abs().max().item() < TOL


@pytest.mark.parametrize("change, key", [("model.head.pooler=false", "model.head.pooler"),
                                         ("model.head.pooling=mean", "model.head.pooling"),
                                         ("model.head.bias=false", "model.head.bias")])
def test_a_bert_head_transformers_does_not_compute_is_refused(change, key, tmp_path, capsys):
    bert_classifier(tmp_path, change)
    assert main(["export", str(tmp_path / "x.ckpt"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    assert key in capsys.readouterr().err and not (tmp_path / "hf").exists()


def test_export_refuses_a_recipe_no_family_computes(tmp_path, capsys):
    """A window on one layer only: Mistral slides on every layer, and the families that slide some layers
    (Qwen2, Qwen3, Gemma 2) differ elsewhere; refused, naming what differs, nothing written."""
    from conftest import ROOT

    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.model.builder import build_model
    from tfbuilder.spec.recipe import load_recipe

    overrides = ["model.d_model=32", "model.decoder.layers=2", "model.ffn.hidden=48", f"model.vocab_size={V}",
                 "model.decoder.overrides={0: {attention: {window: null}}}"]
    recipe = load_recipe(ROOT / "recipes" / "architectures" / "mistral-small.yaml", overrides)
    tok = HFTokenizer.ids(V)
    torch.save(checkpoint_dict(build_model(recipe), recipe, Vocab(tok, tok), source="test"), tmp_path / "x.ckpt")
    assert main(["export", str(tmp_path / "x.ckpt"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "not one of the Hugging Face families" in err and "model.decoder" in err
    assert not (tmp_path / "hf").exists()
