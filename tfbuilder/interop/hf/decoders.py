"""``config.json`` <-> recipe model section for the decoder families of :mod:`.families`: the fields
every one shares are a table of (config field, recipe path, reader, default); each feature a family
has is one reader and one writer. A writer only states what a recipe holds: the caller
(``convert.hf_family``) reads the config back and refuses a recipe that does not survive the trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfbuilder.contracts import default_head_dim
from tfbuilder.interop.hf import sparse
from tfbuilder.interop.hf.families import (
    ATTENTION_BIAS,
    DROPOUTS,
    FIRST_DENSE,
    GEMMA,
    LATENT,
    LAYER_ROPE,
    LAYER_TYPES,
    MLP_BIAS,
    MOE,
    ORIGINAL_MAX,
    PARTIAL_ROTARY,
    QK_NORM,
    QK_NORM_ALL,
    QKV_BIAS,
    QKV_BIAS_FLAG,
    SHARED_GATE,
    SIGMOID_MOE,
    SPARSE_STEP,
    WINDOW,
    DecoderFamily,
)
from tfbuilder.interop.hf.fields import UnsupportedConfig, read_float, read_int, require, shown
from tfbuilder.interop.hf.rope import rope_by_layer_type, rope_parameters, rope_position
from tfbuilder.model.components.attention import MultiHeadParams
from tfbuilder.model.components.ffn import GEGLU, ReGLU, SwiGLU, glu_hidden

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import ModelSection

# (config field, recipe path, reader, transformers' default: None = required)
SHARED: tuple[tuple[str, str, Callable[..., Any], Any], ...] = (
    ("vocab_size", "vocab_size", read_int, None),
    ("hidden_size", "d_model", read_int, None),
    ("num_hidden_layers", "decoder.layers", read_int, None),
    ("num_attention_heads", "attention.heads", read_int, None),
    ("intermediate_size", "ffn.hidden", read_int, None),
    ("initializer_range", "init.std", read_float, 0.02),
    ("attention_dropout", "attention.dropout", read_float, 0.0),
)


def _put(data: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


def _get(data: dict, path: str) -> Any:
    for key in path.split("."):
        data = data.get(key) or {}
    return data if data != {} else None


def _flag(cfg: dict, name: str, default: bool) -> bool:
    return bool(require(cfg, name, (True, False), default))


def from_config(cfg: dict, fam: DecoderFamily) -> dict:
    """The model section (plain data) of a ``config.json`` of ``fam``."""
    for name, allowed, default in fam.refused:
        require(cfg, name, allowed, default)
    # quantized weights (DeepSeek-V3's released fp8 blocks with their scales) are no plain weights to copy
    require(cfg, "quantization_config", (None,), None)
    require(cfg, fam.activation[0], (fam.activation[1],), fam.activation[1])
    ropes = rope_by_layer_type(cfg) if LAYER_ROPE in fam.features else {}
    position = ropes.get("full_attention") or rope_position(
        cfg, partial=PARTIAL_ROTARY in fam.features, types=fam.rope_types, top_original=ORIGINAL_MAX in fam.features
    )
    model: dict = {
        "kind": "decoder",
        "pad_id": None,  # these families mask nothing by id; padding is the caller's attention mask
        "dropout": 0.0,
        "placement": fam.placement,
        "final_norm": True,
        "embed_scale": 1.0,
        "tie_output": _flag(cfg, "tie_word_embeddings", fam.tie),
        "attention": {"type": "multihead", "bias": False},
        "ffn": {"type": "swiglu", "bias": False},
        "norm": {"type": "rmsnorm", "eps": read_float(cfg, "rms_norm_eps", fam.eps)},
    }
    for name, path, reader, default in SHARED:
        _put(model, path, reader(cfg, name, default))
    model["position"] = position
    if LATENT in fam.features:
        sparse.read_latent(cfg, model)
    else:
        _shape(cfg, model)
    for feature, reader in READERS.items():
        if feature in fam.features:
            reader(cfg, model)
    if LAYER_TYPES in fam.features and fam.sliding_pattern and cfg.get("layer_types") is None:
        _layer_types({**cfg, "layer_types": _pattern_types(cfg, model, fam)}, model)
    if ropes:
        _layer_positions(model, ropes)
    if MOE in fam.features:
        _moe(cfg, model, fam)
    if MOE in fam.features and fam.moe_hidden:
        _moe_fields(cfg, model, fam)
    _sparse_fields(cfg, model, fam)
    if not fam.attn_softcap:  # as transformers computes: the field is held, never applied
        model["attention"].pop("softcap", None)
    if not model["attention"]["dropout"]:
        del model["attention"]["dropout"]
    return model


def _shape(cfg: dict, model: dict) -> None:
    """Heads, key/value heads and the head width (transformers' default: hidden_size / heads)."""
    d, heads = model["d_model"], model["attention"]["heads"]
    if cfg.get("head_dim") is None and d % heads:
        raise UnsupportedConfig(f"config.json: num_attention_heads: hidden_size ({d}) is not divisible by it ({heads})")
    head_dim = read_int(cfg, "head_dim", default_head_dim(d, heads))
    kv = read_int(cfg, "num_key_value_heads", heads)
    model["attention"].update(key_dim=head_dim, value_dim=head_dim)
    if kv != heads:
        model["attention"]["kv_heads"] = kv


def _attention_bias(cfg: dict, model: dict) -> None:
    model["attention"]["bias"] = _flag(cfg, "attention_bias", False)


def _qkv_bias(cfg: dict, model: dict) -> None:
    model["attention"]["bias"] = "qkv"


def _mlp_bias(cfg: dict, model: dict) -> None:
    model["ffn"]["bias"] = _flag(cfg, "mlp_bias", False)


def _window(cfg: dict, model: dict) -> None:
    if cfg.get("sliding_window") is not None:
        model["attention"]["window"] = read_int(cfg, "sliding_window")


def _layer_types(cfg: dict, model: dict) -> None:
    """``layer_types`` (one per layer): every layer alike, or kinds ``local`` (sliding) and ``global``
    repeated by the shortest pattern that gives the list."""
    layers = model["decoder"]["layers"]
    types = cfg.get("layer_types")
    if types is None:  # configs written before transformers 5 (Qwen2): the last layers slide
        sliding = _flag(cfg, "use_sliding_window", False)
        first = read_int(cfg, "max_window_layers", layers) if sliding else layers
        types = ["sliding_attention" if sliding and i >= first else "full_attention" for i in range(layers)]
    allowed = ("full_attention", "sliding_attention")
    if not isinstance(types, list) or len(types) != layers or any(t not in allowed for t in types):
        raise UnsupportedConfig(
            f"config.json: layer_types: {shown(types)} is not supported (one of {', '.join(allowed)} per layer, "
            f"{layers} layers)"
        )
    if "sliding_attention" not in types:
        return
    window = read_int(cfg, "sliding_window")
    if "full_attention" not in types:
        model["attention"]["window"] = window
        return
    period = next(p for p in range(1, layers + 1) if all(t == types[i % p] for i, t in enumerate(types)))
    names = {"sliding_attention": "local", "full_attention": "global"}
    model["decoder"]["kinds"] = {"local": {"attention": {"window": window}}, "global": {"attention": {"window": None}}}
    model["decoder"]["pattern"] = [names[t] for t in types[:period]]


def _pattern_types(cfg: dict, model: dict, fam: DecoderFamily) -> list[str]:
    """``layer_types`` of a config without them (Gemma 3's on the Hub): every ``sliding_window_pattern``-th
    layer full, the others sliding (``Gemma3TextConfig``)."""
    n = read_int(cfg, "sliding_window_pattern", fam.sliding_pattern)
    return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(model["decoder"]["layers"])]


def _layer_positions(model: dict, ropes: dict[str, dict]) -> None:
    """Gemma 3: the full layers rotate by ``ropes["full_attention"]`` (the model's position), the sliding ones
    by ``ropes["sliding_attention"]`` (their kind's, or the model's when every layer slides)."""
    kinds = model["decoder"].get("kinds")
    if kinds:
        kinds["local"]["position"] = {"scaling": None, **ropes["sliding_attention"]}  # merged over the model's
    elif "window" in model["attention"]:
        model["position"] = ropes["sliding_attention"]


def _qk_norm(cfg: dict, model: dict) -> None:
    model["attention"].update(qk_norm="rms", qk_norm_eps=model["norm"]["eps"])


def _qk_norm_all(cfg: dict, model: dict) -> None:
    model["attention"].update(qk_norm="rms", qk_norm_eps=model["norm"]["eps"], qk_norm_over="all")


def _gemma(cfg: dict, model: dict) -> None:
    """Gemma 2: embeddings times sqrt(d_model), a GeGLU with tanh GELU, queries scaled by
    query_pre_attn_scalar^-1/2, soft-capped scores and logits (Gemma Team 2024, arXiv:2408.00118)."""
    model["embed_scale"] = "sqrt_d_model"
    model["ffn"] = {"type": "geglu", "approximate": "tanh", "hidden": model["ffn"]["hidden"], "bias": False}
    attention = model["attention"]
    scalar = read_float(cfg, "query_pre_attn_scalar", 256)
    if scalar != attention["key_dim"]:  # else the default 1/sqrt(d_k)
        attention["scale"] = scalar**-0.5
    if cfg.get("attn_logit_softcapping") is not None:
        attention["softcap"] = read_float(cfg, "attn_logit_softcapping", 0.0)
    if cfg.get("final_logit_softcapping") is not None:
        model["logit_softcap"] = read_float(cfg, "final_logit_softcapping", 0.0)


def _moe(cfg: dict, model: dict, fam: DecoderFamily) -> None:
    """Mixtral's sparse block (Jiang et al. 2024, arXiv:2401.04088): a softmax over the experts, the top
    k kept and renormalised to sum to one, each a SwiGLU without biases."""
    model["ffn"] = {
        "type": "moe",
        "experts": read_int(cfg, fam.experts_field, 8),
        "top_k": read_int(cfg, "num_experts_per_tok", 2),
        "expert": "swiglu",
        "hidden": model["ffn"]["hidden"],
        "bias": False,
        "router": "softmax",
        "normalize": True,
        "aux_weight": read_float(cfg, "router_aux_loss_coef", 0.001),
    }


def _moe_fields(cfg: dict, model: dict, fam: DecoderFamily) -> None:
    """Qwen2-MoE and Qwen3-MoE (Yang et al. 2025, arXiv:2505.09388): experts of ``moe_intermediate_size``,
    the top k renormalised only if ``norm_topk_prob`` (default false)."""
    ffn = model["ffn"]
    if fam.experts_field == "num_local_experts" and cfg.get("num_local_experts") is None:  # Qwen3-MoE on the Hub
        ffn["experts"] = read_int(cfg, "num_experts", 8)
    ffn["hidden"] = read_int(cfg, fam.moe_hidden)
    ffn["normalize"] = _flag(cfg, fam.moe_normalize, False)


def _sparse_fields(cfg: dict, model: dict, fam: DecoderFamily) -> None:
    """Qwen2-MoE's shared expert and q/k/v biases; the dense layers of DeepSeek-V3 and Qwen2-MoE."""
    if SHARED_GATE in fam.features:
        sparse.read_shared_gate(cfg, model)
    if QKV_BIAS_FLAG in fam.features:
        sparse.read_qkv_bias_flag(cfg, model)
    if SPARSE_STEP in fam.features and cfg.get("layer_types") is None:  # Qwen2MoeConfig derives them otherwise
        require(cfg, "use_sliding_window", (False,), False)
    if fam.features & {FIRST_DENSE, SPARSE_STEP}:
        sparse.read_dense_layers(cfg, model, fam)


def _dropouts(cfg: dict, model: dict) -> None:
    model["dropout"] = read_float(cfg, "resid_pdrop", 0.0)


READERS: dict[str, Callable[[dict, dict], None]] = {
    ATTENTION_BIAS: _attention_bias,
    QKV_BIAS: _qkv_bias,
    MLP_BIAS: _mlp_bias,
    WINDOW: _window,
    LAYER_TYPES: _layer_types,
    QK_NORM: _qk_norm,
    QK_NORM_ALL: _qk_norm_all,
    GEMMA: _gemma,
    DROPOUTS: _dropouts,
    SIGMOID_MOE: sparse.read_sigmoid_moe,
}


def to_config(m: ModelSection, fam: DecoderFamily) -> dict:
    """The ``config.json`` of ``fam`` for a model section (what the recipe holds, as the family names it)."""
    data = m.model_dump(mode="json")
    cfg: dict = {"architectures": [fam.architecture], "model_type": fam.model_type}
    for name, path, _, default in SHARED:
        value = _get(data, path)
        cfg[name] = default if value is None else value
    att, ffn = data["attention"], data["ffn"]
    heads = att.get("heads")
    cfg["num_key_value_heads"] = att.get("kv_heads") or heads
    cfg["head_dim"] = m.attention_shape("decoder").key_dim
    cfg[fam.activation[0]] = fam.activation[1]
    cfg["rms_norm_eps"] = _get(data, "norm.eps")
    cfg["tie_word_embeddings"] = m.tie_output
    cfg["rope_parameters"] = _layer_ropes(m) if LAYER_ROPE in fam.features else rope_parameters(data["position"])
    cfg["max_position_embeddings"] = _get(data, "position.max_len") or 2048
    original = _get(data, "position.scaling.original_max_position_embeddings")
    if ORIGINAL_MAX in fam.features and original is not None:  # overrides the one in rope_parameters
        cfg["original_max_position_embeddings"] = original
    bias = att.get("bias")
    if ATTENTION_BIAS in fam.features:
        cfg["attention_bias"] = bias is True
    if MLP_BIAS in fam.features:
        cfg["mlp_bias"] = ffn.get("bias") is True
    for feature in (WINDOW, LAYER_TYPES, GEMMA):
        if feature in fam.features:
            cfg.update(WRITERS[feature](m, data))
    if DROPOUTS in fam.features:
        cfg["resid_pdrop"] = cfg["embd_pdrop"] = m.dropout
    if MOE in fam.features:
        cfg.update({fam.experts_field: ffn.get("experts"), "num_experts_per_tok": ffn.get("top_k")})
        cfg["router_aux_loss_coef"] = ffn.get("aux_weight")
        if fam.moe_hidden:
            cfg.update({fam.moe_hidden: ffn.get("hidden"), fam.moe_normalize: ffn.get("normalize")})
    cfg.update(_sparse_config(m, fam))
    glu = m.ffn
    if isinstance(glu, (SwiGLU.Params, GEGLU.Params, ReGLU.Params)):  # its width as resolved (match_params)
        cfg["intermediate_size"] = glu_hidden(glu, m.d_model)
    return cfg


def _sparse_config(m: ModelSection, fam: DecoderFamily) -> dict:
    """The fields of :mod:`.sparse`'s features (they override the shared ones they restate)."""
    cfg: dict = {}
    for feature, writer in ((LATENT, sparse.write_latent), (SIGMOID_MOE, sparse.write_sigmoid_moe),
                            (SHARED_GATE, sparse.write_shared_gate), (QKV_BIAS_FLAG, sparse.write_qkv_bias_flag)):
        if feature in fam.features:
            cfg.update(writer(m))
    if fam.features & {FIRST_DENSE, SPARSE_STEP}:
        cfg.update(sparse.write_dense_layers(m, fam))
    return cfg


def _windows(m: ModelSection) -> list[int | None]:
    """The sliding window of each layer's self-attention (None: attends to every earlier key)."""
    layers = m.present_stack("decoder").layers
    windows = []
    for i in range(layers):
        att = m.layer_components("decoder", i)["attention"]
        windows.append(att.window if isinstance(att, MultiHeadParams) else None)
    return windows


def _layer_ropes(m: ModelSection) -> dict:
    """Gemma 3's ``rope_parameters`` per layer type: the position of the first full and of the first sliding
    layer (the model's where there is none; layers of one type that rotate differently do not read back)."""
    windows = _windows(m)
    out = {}
    for kind, sliding in (("full_attention", False), ("sliding_attention", True)):
        layer = next((i for i, w in enumerate(windows) if (w is not None) == sliding), None)
        position = m.position if layer is None else m.layer_components("decoder", layer)["position"]
        out[kind] = rope_parameters(position.model_dump(mode="json"))
    return out


def _write_window(m: ModelSection, data: dict) -> dict:
    windows = _windows(m)
    return {"sliding_window": windows[0]}  # a window on some layers only does not read back: refused


def _write_layer_types(m: ModelSection, data: dict) -> dict:
    windows = _windows(m)
    sliding = [w for w in windows if w is not None]
    return {
        "layer_types": ["full_attention" if w is None else "sliding_attention" for w in windows],
        "sliding_window": sliding[0] if sliding else None,
        "use_sliding_window": bool(sliding),
    }


def _write_gemma(m: ModelSection, data: dict) -> dict:
    att = data["attention"]
    shape = m.attention_shape("decoder")
    scale = att.get("scale")
    scalar = shape.key_dim if scale is None else 1.0 / scale**2
    if abs(scalar - round(scalar)) < 1e-9 * scalar:
        scalar = round(scalar)
    return {
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": att.get("softcap"),
        "final_logit_softcapping": m.logit_softcap,
    }


WRITERS: dict[str, Callable[[ModelSection, dict], dict]] = {
    WINDOW: _write_window,
    LAYER_TYPES: _write_layer_types,
    GEMMA: _write_gemma,
}
