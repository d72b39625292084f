"""``config.json`` of the GPT-2, BERT, T5 and Llama families <-> a recipe's model section.

Each family is one function per direction. A config value that would change what the model computes
and that tfbuilder cannot express is refused, naming the field; values that only matter to training
(most dropouts) are carried where a recipe has a place for them.
"""

from __future__ import annotations

import math
import reprlib
from typing import TYPE_CHECKING, Any

from tfbuilder.errors import TfbuilderError

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import ModelSection

# architectures[0] in config.json -> family
FAMILIES = {
    "GPT2LMHeadModel": "gpt2",
    "BertForMaskedLM": "bert",
    "T5ForConditionalGeneration": "t5",
    "LlamaForCausalLM": "llama",
}
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
}
HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


class UnsupportedConfig(TfbuilderError):
    """A Hugging Face config that tfbuilder cannot reproduce exactly (exit 2)."""


# A size (width, layers, vocabulary, positions) beyond any published model: a config asking for more
# is damaged or hostile, and is refused by its key before anything is built.
MAX_SIZE = 1 << 24
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlong = 3, 40, 40, 4, 4, 40


def shown(value: Any) -> str:
    """A config value as a message shows it: bounded, however long or deeply nested it is."""
    return _REPR.repr(value)


def _require(cfg: dict, field: str, allowed: tuple, default: Any = None) -> Any:
    value = cfg.get(field, default)
    if not any(type(value) is type(a) and value == a for a in allowed):  # 1 is not True; a list is no choice
        choices = ", ".join(repr(a) for a in allowed)
        raise UnsupportedConfig(f"config.json: {field}: {shown(value)} is not supported (supported: {choices})")
    return value


def _int(cfg: dict, field: str, default: Any = None) -> int:
    """A positive size, at most MAX_SIZE (``null`` means ``default``, as in transformers)."""
    value = cfg.get(field)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedConfig(f"config.json: {field}: expected a positive integer, got {shown(value)}")
    if value > MAX_SIZE:
        raise UnsupportedConfig(
            f"config.json: {field}: {value:.3g} is larger than any model tfbuilder builds (at most {MAX_SIZE:,})"
        )
    return value


def _float(cfg: dict, field: str, default: float) -> float:
    value = cfg.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnsupportedConfig(f"config.json: {field}: expected a number, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise UnsupportedConfig(f"config.json: {field}: expected a finite number, got {shown(value)}")
    return number


def family_of(cfg: dict) -> str:
    """The family a config belongs to, from ``architectures`` (or ``model_type``)."""
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        if len(archs) != 1 or not isinstance(archs[0], str) or archs[0] not in FAMILIES:
            raise UnsupportedConfig(
                f"config.json: architectures: {shown(archs)} is not supported (supported: {', '.join(FAMILIES)})"
            )
        return FAMILIES[archs[0]]
    if archs is not None and not isinstance(archs, list):
        raise UnsupportedConfig(f"config.json: architectures: expected a list of class names, got {shown(archs)}")
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILIES.values():
        return model_type
    raise UnsupportedConfig(
        f"config.json: architectures: missing, and model_type {shown(model_type)} is not one of gpt2, bert, t5, llama"
    )


def _activation(cfg: dict, field: str, default: str) -> str:
    return ACTIVATIONS[_require(cfg, field, tuple(ACTIVATIONS), default)]


def _heads(cfg: dict, d_field: str, h_field: str) -> tuple[int, int]:
    d, h = _int(cfg, d_field), _int(cfg, h_field)
    if d % h:
        raise UnsupportedConfig(f"config.json: {h_field}: {d_field} ({d}) is not divisible by {h_field} ({h})")
    return d, h


def from_config(cfg: dict) -> tuple[str, dict]:
    """(family, model section as plain data) of a Hugging Face ``config.json``."""
    family = family_of(cfg)
    return family, {"gpt2": _gpt2, "bert": _bert, "t5": _t5, "llama": _llama}[family](cfg)


def _gpt2(cfg: dict) -> dict:
    d, heads = _heads(cfg, "n_embd", "n_head")
    _require(cfg, "scale_attn_weights", (True,), True)
    _require(cfg, "scale_attn_by_inverse_layer_idx", (False,), False)
    _require(cfg, "add_cross_attention", (False,), False)
    return {
        "kind": "decoder",
        "vocab_size": _int(cfg, "vocab_size"),
        "pad_id": None,  # GPT-2 has no padding token; every id is text
        "d_model": d,
        "dropout": _float(cfg, "resid_pdrop", 0.1),
        "placement": "pre",
        "final_norm": True,
        "embed_scale": 1.0,
        "tie_output": _require(cfg, "tie_word_embeddings", (True, False), True),
        "position": {"type": "learned", "max_len": _int(cfg, "n_positions", 1024)},
        "attention": {"type": "multihead", "heads": heads, "dropout": _float(cfg, "attn_pdrop", 0.1), "bias": True},
        # n_inner: transformers' own default for GPT-2 is 4 * n_embd (a fact of GPT-2, not tfbuilder's default).
        "ffn": {
            "type": "mlp",
            "hidden": _int(cfg, "n_inner", 4 * d),
            "activation": _activation(cfg, "activation_function", "gelu_new"),
            "bias": True,
        },
        "norm": {"type": "layernorm", "eps": _float(cfg, "layer_norm_epsilon", 1e-5)},
        "init": {"std": _float(cfg, "initializer_range", 0.02), "residual_scaling": True},
        "decoder": {"layers": _int(cfg, "n_layer")},
    }


def _bert(cfg: dict) -> dict:
    d, heads = _heads(cfg, "hidden_size", "num_attention_heads")
    _require(cfg, "position_embedding_type", ("absolute", None), "absolute")
    _require(cfg, "is_decoder", (False,), False)
    _require(cfg, "add_cross_attention", (False,), False)
    _require(cfg, "hidden_act", ("gelu",), "gelu")  # the masked-LM head's activation is GELU
    pad = cfg.get("pad_token_id", 0)
    return {
        "kind": "encoder",
        "vocab_size": _int(cfg, "vocab_size"),
        "pad_id": pad,
        "d_model": d,
        "dropout": _float(cfg, "hidden_dropout_prob", 0.1),
        "placement": "post",
        "final_norm": False,
        "embed_scale": 1.0,
        "token_types": _int(cfg, "type_vocab_size", 2),
        "embed_norm": True,
        "head_bias": True,
        "tie_output": _require(cfg, "tie_word_embeddings", (True, False), True),
        "position": {"type": "learned", "max_len": _int(cfg, "max_position_embeddings", 512)},
        "attention": {
            "type": "multihead",
            "heads": heads,
            "dropout": _float(cfg, "attention_probs_dropout_prob", 0.1),
            "bias": True,
        },
        "ffn": {"type": "mlp", "hidden": _int(cfg, "intermediate_size"), "activation": "gelu", "bias": True},
        "norm": {"type": "layernorm", "eps": _float(cfg, "layer_norm_eps", 1e-12)},
        "init": {"std": _float(cfg, "initializer_range", 0.02)},
        "encoder": {"layers": _int(cfg, "num_hidden_layers")},
    }


def _t5(cfg: dict) -> dict:
    _require(cfg, "feed_forward_proj", ("relu",), "relu")
    # transformers >= 5 names it scale_decoder_outputs; before, tie_word_embeddings decided it.
    scaled = cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True))
    field = "scale_decoder_outputs" if "scale_decoder_outputs" in cfg else "tie_word_embeddings"
    _require({field: scaled}, field, (True,))
    pad = cfg.get("pad_token_id", 0)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise UnsupportedConfig(f"config.json: pad_token_id: expected an id, got {pad!r}")
    start = cfg.get("decoder_start_token_id", pad)
    if start != pad:
        raise UnsupportedConfig(
            f"config.json: decoder_start_token_id: {start!r} is not supported (T5 starts with pad_token_id, {pad})"
        )
    d_kv, heads = _int(cfg, "d_kv", 64), _int(cfg, "num_heads")
    layers = _int(cfg, "num_layers")
    return {
        "kind": "encoder_decoder",
        "vocab_size": _int(cfg, "vocab_size"),
        "pad_id": pad,
        "d_model": _int(cfg, "d_model"),
        "dropout": _float(cfg, "dropout_rate", 0.1),
        "placement": "pre",
        "final_norm": True,
        "share_embeddings": True,
        "tie_output": True,
        "embed_scale": 1.0,
        "output_scale": "rsqrt_d_model",
        "position": {
            "type": "relative_bias",
            "buckets": _int(cfg, "relative_attention_num_buckets", 32),
            "max_distance": _int(cfg, "relative_attention_max_distance", 128),
        },
        "attention": {
            "type": "multihead",
            "heads": heads,
            "key_dim": d_kv,
            "value_dim": d_kv,
            "bias": False,
            "scale": 1.0,
        },
        "ffn": {"type": "mlp", "hidden": _int(cfg, "d_ff"), "activation": "relu", "bias": False},
        "norm": {"type": "rmsnorm", "eps": _float(cfg, "layer_norm_epsilon", 1e-6)},
        "encoder": {"layers": layers},
        "decoder": {"layers": _int(cfg, "num_decoder_layers", layers)},
    }


def _llama(cfg: dict) -> dict:
    d, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    _require(cfg, "hidden_act", ("silu",), "silu")
    _require(cfg, "rope_scaling", (None,), None)
    rope = cfg.get("rope_parameters") or {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
    if not isinstance(rope, dict):
        raise UnsupportedConfig(f"config.json: rope_parameters: expected an object, got {shown(rope)}")
    _require({"rope_parameters.rope_type": rope.get("rope_type", "default")}, "rope_parameters.rope_type", ("default",))
    _require(cfg, "pretraining_tp", (1, None), 1)
    if cfg.get("head_dim") is None and d % heads:
        raise UnsupportedConfig(f"config.json: num_attention_heads: hidden_size ({d}) is not divisible by it ({heads})")
    head_dim = _int(cfg, "head_dim", d // heads)  # transformers' own default for Llama (not tfbuilder's)
    kv = _int(cfg, "num_key_value_heads", heads)
    attention = {
        "type": "multihead",
        "heads": heads,
        "key_dim": head_dim,
        "value_dim": head_dim,
        "bias": bool(cfg.get("attention_bias", False)),
    }
    if kv != heads:
        attention["kv_heads"] = kv
    if _float(cfg, "attention_dropout", 0.0):
        attention["dropout"] = _float(cfg, "attention_dropout", 0.0)
    return {
        "kind": "decoder",
        "vocab_size": _int(cfg, "vocab_size"),
        "pad_id": None,  # Llama masks nothing by id; padding is the caller's attention mask
        "d_model": d,
        "dropout": 0.0,
        "placement": "pre",
        "final_norm": True,
        "embed_scale": 1.0,
        "tie_output": _require(cfg, "tie_word_embeddings", (True, False), False),
        "position": {"type": "rotary", "base": _float(rope, "rope_theta", 10000.0), "pairing": "half"},
        "attention": attention,
        "ffn": {"type": "swiglu", "hidden": _int(cfg, "intermediate_size"), "bias": bool(cfg.get("mlp_bias", False))},
        "norm": {"type": "rmsnorm", "eps": _float(cfg, "rms_norm_eps", 1e-6)},
        "init": {"std": _float(cfg, "initializer_range", 0.02)},
        "decoder": {"layers": _int(cfg, "num_hidden_layers")},
    }


def to_config(model: ModelSection, family: str) -> dict:
    """The ``config.json`` of ``family`` for a model section; the caller checks that it round-trips."""
    m = model
    att, ffn, norm, pos = m.attention, m.ffn, m.norm, m.position
    if family == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": m.vocab_size,
            "n_embd": m.d_model,
            "n_layer": m.decoder.layers,
            "n_head": att.heads,
            "n_inner": getattr(ffn, "hidden", None),
            "n_positions": getattr(pos, "max_len", 1024),
            "activation_function": HF_ACTIVATION.get(getattr(ffn, "activation", ""), "?"),
            "resid_pdrop": m.dropout,
            "embd_pdrop": m.dropout,
            "attn_pdrop": getattr(att, "dropout", 0.0),
            "layer_norm_epsilon": getattr(norm, "eps", 1e-5),
            "initializer_range": m.init.std or 0.02,
            "tie_word_embeddings": m.tie_output,
            "scale_attn_weights": True,
            "bos_token_id": m.vocab_size - 1,
            "eos_token_id": m.vocab_size - 1,
        }
    if family == "bert":
        return {
            "architectures": ["BertForMaskedLM"],
            "model_type": "bert",
            "vocab_size": m.vocab_size,
            "hidden_size": m.d_model,
            "num_hidden_layers": m.encoder.layers,
            "num_attention_heads": att.heads,
            "intermediate_size": getattr(ffn, "hidden", None),
            "hidden_act": "gelu",
            "hidden_dropout_prob": m.dropout,
            "attention_probs_dropout_prob": getattr(att, "dropout", 0.0),
            "max_position_embeddings": getattr(pos, "max_len", 512),
            "type_vocab_size": m.token_types,
            "layer_norm_eps": getattr(norm, "eps", 1e-12),
            "pad_token_id": m.pad_id,
            "initializer_range": m.init.std or 0.02,
            "tie_word_embeddings": m.tie_output,
            "position_embedding_type": "absolute",
        }
    if family == "t5":
        return {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "vocab_size": m.vocab_size,
            "d_model": m.d_model,
            "d_kv": att.key_dim,
            "d_ff": getattr(ffn, "hidden", None),
            "num_layers": m.encoder.layers,
            "num_decoder_layers": m.decoder.layers,
            "num_heads": att.heads,
            "relative_attention_num_buckets": getattr(pos, "buckets", 32),
            "relative_attention_max_distance": getattr(pos, "max_distance", 128),
            "dropout_rate": m.dropout,
            "layer_norm_epsilon": getattr(norm, "eps", 1e-6),
            "feed_forward_proj": "relu",
            "is_encoder_decoder": True,
            "pad_token_id": m.pad_id,
            "decoder_start_token_id": m.pad_id,
            "eos_token_id": 1,
            "tie_word_embeddings": True,
            "scale_decoder_outputs": True,
        }
    kv = getattr(att, "kv_heads", None) or att.heads
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": getattr(ffn, "hidden", None),
        "num_hidden_layers": m.decoder.layers,
        "num_attention_heads": att.heads,
        "num_key_value_heads": kv,
        "head_dim": att.shape(m.d_model).key_dim,
        "hidden_act": "silu",
        "rms_norm_eps": getattr(norm, "eps", 1e-6),
        "attention_bias": att.bias,
        "attention_dropout": getattr(att, "dropout", 0.0),
        "mlp_bias": getattr(ffn, "bias", False),
        "rope_parameters": {"rope_type": "default", "rope_theta": getattr(pos, "base", 10000.0)},
        "rope_theta": getattr(pos, "base", 10000.0),
        "tie_word_embeddings": m.tie_output,
        "initializer_range": m.init.std or 0.02,
        "max_position_embeddings": 2048,
    }
