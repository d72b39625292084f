"""``config.json`` <-> recipe for what DeepSeek-V3 and Qwen2-MoE add to the Llama-like decoders of
:mod:`.decoders`: multi-head latent attention, DeepSeek's sigmoid-routed experts, Qwen2-MoE's gated shared
expert, and the dense layers among the sparse ones. Each feature is one reader (config -> model section
data) and one writer (model section -> config fields); the caller reads the written config back and
refuses a recipe that does not survive the trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfbuilder.interop.hf.families import FIRST_DENSE, DecoderFamily
from tfbuilder.interop.hf.fields import UnsupportedConfig, read_float, read_int, require, shown
from tfbuilder.model.components.latent_attention import LatentAttention
from tfbuilder.model.components.moe import MixtureOfExperts

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import ModelSection


def _flag(cfg: dict, name: str, default: bool) -> bool:
    return bool(require(cfg, name, (True, False), default))


def read_latent(cfg: dict, model: dict) -> None:
    """DeepSeek's multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, sec. 2.1; transformers'
    ``DeepseekV3Attention``): queries from ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj`` (or ``q_proj``
    when ``q_lora_rank`` is null), keys and values from one latent of ``kv_lora_rank``, ``qk_nope_head_dim``
    + ``qk_rope_head_dim`` per query/key head, ``v_head_dim`` per value head. ``rope_interleave`` (default
    true) turns the rotary part's pairs (x_2i, x_2i+1), else (x_i, x_i+r/2): the position's ``pairing``."""
    heads = model["attention"]["heads"]
    kv_heads = read_int(cfg, "num_key_value_heads", heads)
    if kv_heads != heads:  # every head has its own keys, up-projected from the shared latent
        raise UnsupportedConfig(
            f"config.json: num_key_value_heads: {kv_heads} is not supported (latent attention: num_attention_heads, "
            f"{heads})"
        )
    rope = read_int(cfg, "qk_rope_head_dim", 64)
    if rope % 2:
        raise UnsupportedConfig(f"config.json: qk_rope_head_dim: {rope} is not supported (rotary pairs: even)")
    q_rank = None if "q_lora_rank" in cfg and cfg["q_lora_rank"] is None else read_int(cfg, "q_lora_rank", 1536)
    model["attention"] = {
        "type": "latent",
        "heads": heads,
        "head_dim": read_int(cfg, "qk_nope_head_dim", 128),
        "value_dim": read_int(cfg, "v_head_dim", 128),
        "kv_rank": read_int(cfg, "kv_lora_rank", 512),
        "q_rank": q_rank,
        "rope_dim": rope,
        "latent_norm": True,
        "bias": False,
        "dropout": read_float(cfg, "attention_dropout", 0.0),
    }
    interleave = _flag(cfg, "rope_interleave", True)
    model["position"]["pairing"] = "interleaved" if interleave else "half"


def write_latent(m: ModelSection) -> dict:
    """The latent attention's fields (``head_dim``: the rotary part's width, as ``DeepseekV3Config`` sets it)."""
    att = m.attention
    if not isinstance(att, LatentAttention.Params):
        raise UnsupportedConfig(f"model.attention: {att.type} is not supported (the family has latent attention)")
    nope, value, kv_rank, rope = att.widths(m.d_model)
    pairing = m.position.model_dump().get("pairing")
    return {
        "q_lora_rank": att.q_rank,
        "kv_lora_rank": kv_rank,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": value,
        "head_dim": rope,
        "num_key_value_heads": att.heads,
        "rope_interleave": pairing == "interleaved",
        "attention_bias": att.bias,
    }


def read_sigmoid_moe(cfg: dict, model: dict) -> None:
    """DeepSeek-V3's sparse block (arXiv:2412.19437, sec. 2.1.2; transformers' ``DeepseekV3MoE``): each
    expert's sigmoid score; ``e_score_correction_bias`` added to choose, not to weight; experts chosen from
    the ``topk_group`` of ``n_group`` groups best by their two highest scores; the chosen scores
    renormalised if ``norm_topk_prob``, times ``routed_scaling_factor``; plus ``n_shared_experts`` SwiGLUs
    of ``moe_intermediate_size`` each (one module) that every token passes through."""
    model["ffn"] = {
        "type": "moe",
        "experts": read_int(cfg, "n_routed_experts", 256),
        "top_k": read_int(cfg, "num_experts_per_tok", 8),
        "expert": "swiglu",
        "hidden": read_int(cfg, "moe_intermediate_size", 2048),
        "bias": False,
        "router": "sigmoid",
        "normalize": _flag(cfg, "norm_topk_prob", True),
        "correction_bias": True,
        "groups": read_int(cfg, "n_group", 8),
        "top_groups": read_int(cfg, "topk_group", 4),
        "routed_scale": read_float(cfg, "routed_scaling_factor", 2.5),
        "shared_experts": read_int(cfg, "n_shared_experts", 1),
        "aux_weight": 0.0,  # the config holds no balancing loss (the paper's bias updates: bias_update)
    }


def write_sigmoid_moe(m: ModelSection) -> dict:
    ffn = m.ffn
    if not isinstance(ffn, MixtureOfExperts.Params):
        raise UnsupportedConfig(f"model.ffn: {ffn.type} is not supported (the family has a mixture of experts)")
    return {
        "n_routed_experts": ffn.experts,
        "num_experts_per_tok": ffn.top_k,
        "moe_intermediate_size": ffn.hidden,
        "norm_topk_prob": ffn.normalizes(),
        "n_group": ffn.groups,
        "topk_group": ffn.top_groups,
        "routed_scaling_factor": ffn.routed_scale,
        "n_shared_experts": ffn.shared_experts,
        "num_nextn_predict_layers": 0,  # no multi-token prediction modules are written
    }


def read_shared_gate(cfg: dict, model: dict) -> None:
    """Qwen2-MoE's shared expert (transformers' ``Qwen2MoeSparseMoeBlock``): one SwiGLU of
    ``shared_expert_intermediate_size`` on every token, scaled by sigmoid(x w) (``shared_expert_gate``)."""
    model["ffn"].update(shared_experts=1, shared_hidden=read_int(cfg, "shared_expert_intermediate_size", 5632))
    model["ffn"]["shared_gate"] = True


def write_shared_gate(m: ModelSection) -> dict:
    ffn = m.ffn
    if not isinstance(ffn, MixtureOfExperts.Params) or ffn.shared_experts == 0:
        return {}  # reads back with a shared expert: refused by the round trip
    return {"shared_expert_intermediate_size": ffn.shared_hidden or (ffn.hidden or 0) * ffn.shared_experts or None}


def read_qkv_bias_flag(cfg: dict, model: dict) -> None:
    """Qwen2-MoE's ``qkv_bias`` (default true): biases on q, k and v, none on o."""
    model["attention"]["bias"] = "qkv" if _flag(cfg, "qkv_bias", True) else False


def write_qkv_bias_flag(m: ModelSection) -> dict:
    return {"qkv_bias": m.model_dump(mode="json")["attention"].get("bias") == "qkv"}


def dense_layers(cfg: dict, model: dict, fam: DecoderFamily) -> list[int]:
    """The layers whose feed-forward is dense rather than sparse: DeepSeek-V3's first
    ``first_k_dense_replace`` (default 3); Qwen2-MoE's in ``mlp_only_layers`` and those whose number is no
    multiple of ``decoder_sparse_step`` (transformers' ``Qwen2MoeDecoderLayer``)."""
    layers = model["decoder"]["layers"]
    if FIRST_DENSE in fam.features:  # DeepSeek-V3
        first = cfg.get("first_k_dense_replace", 3)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise UnsupportedConfig(f"config.json: first_k_dense_replace: expected an integer >= 0, got {shown(first)}")
        return list(range(min(first, layers)))
    step = read_int(cfg, "decoder_sparse_step", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise UnsupportedConfig(f"config.json: mlp_only_layers: expected a list of layer numbers, got {shown(only)}")
    return [i for i in range(layers) if i in only or (i + 1) % step]


def read_dense_layers(cfg: dict, model: dict, fam: DecoderFamily) -> None:
    """Each dense layer an override of the model's mixture: a SwiGLU of ``intermediate_size``."""
    hidden = read_int(cfg, "intermediate_size")
    dense = dense_layers(cfg, model, fam)
    if dense:
        swiglu = {"type": "swiglu", "hidden": hidden, "bias": False}
        model["decoder"]["overrides"] = {i: {"ffn": dict(swiglu)} for i in dense}


def write_dense_layers(m: ModelSection, fam: DecoderFamily) -> dict:
    """``first_k_dense_replace`` (the dense layers before the first sparse one), or ``decoder_sparse_step`` 1
    and ``mlp_only_layers``; ``intermediate_size``: the dense layers' width."""
    layers = m.present_stack("decoder").layers
    ffns = [m.layer_components("decoder", i)["ffn"] for i in range(layers)]
    dense = [i for i, f in enumerate(ffns) if not isinstance(f, MixtureOfExperts.Params)]
    out: dict = {}
    hidden = ffns[dense[0]].model_dump().get("hidden") if dense else None
    if hidden is not None:
        out["intermediate_size"] = hidden
    if FIRST_DENSE in fam.features:
        out["first_k_dense_replace"] = next((i for i in range(layers) if i not in dense), layers)
    else:
        out.update(decoder_sparse_step=1, mlp_only_layers=dense)
    return out
