"""``config.json`` of the GPT-2, BERT and T5 families <-> a recipe's model section (the Llama-like
decoders are data: :mod:`.families`, read and written by :mod:`.decoders`).

Each of these three is one function per direction. A config value that would change what the model computes
and that tfbuilder cannot express is refused, naming the field; values that only matter to training
(most dropouts) are carried where a recipe has a place for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from tfbuilder.contracts import AttentionParams, ComponentParams
from tfbuilder.interop.hf import decoders
from tfbuilder.interop.hf.families import ARCHITECTURES, DECODERS
from tfbuilder.interop.hf.fields import UnsupportedConfig, shown
from tfbuilder.interop.hf.fields import read_float as _float
from tfbuilder.interop.hf.fields import read_int as _int
from tfbuilder.interop.hf.fields import require as _require
from tfbuilder.model.components.attention import MultiHeadParams
from tfbuilder.model.components.ffn import GEGLU, MLP, ReGLU, SwiGLU
from tfbuilder.model.components.latent_attention import LatentAttention
from tfbuilder.model.components.moe import MixtureOfExperts
from tfbuilder.model.components.norm import LayerNorm, RMSNorm, ScaleNorm
from tfbuilder.model.components.position import (
    LearnedPosition,
    RelativeBiasPosition,
    RotaryPosition,
    SinusoidalPosition,
)

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import ModelSection

# architectures[0] in config.json -> family
FAMILIES = {
    "GPT2LMHeadModel": "gpt2",
    "BertForMaskedLM": "bert",
    "T5ForConditionalGeneration": "t5",
    **ARCHITECTURES,  # the Llama-like decoders, as data (families.py)
}
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
}
HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


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
        f"config.json: architectures: missing, and model_type {shown(model_type)} is not one of "
        + ", ".join(dict.fromkeys(FAMILIES.values()))
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
    if family in DECODERS:
        return family, decoders.from_config(cfg, DECODERS[family])
    return family, {"gpt2": _gpt2, "bert": _bert, "t5": _t5}[family](cfg)


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


# The registered params that carry each value a config writes: the writers below read typed fields
# through isinstance on them, and write the family's default for a component that has no such field
# (the round trip in convert.hf_family then names the model key that differs).
_WITH_HIDDEN = (MLP.Params, SwiGLU.Params, GEGLU.Params, ReGLU.Params, MixtureOfExperts.Params)
_WITH_ACTIVATION = (MLP.Params, MixtureOfExperts.Params)
_WITH_BIAS_FFN = _WITH_HIDDEN
_WITH_EPS = (LayerNorm.Params, RMSNorm.Params, ScaleNorm.Params)
_WITH_MAX_LEN = (LearnedPosition.Params, SinusoidalPosition.Params, RotaryPosition.Params)
_ATTENTION_WITH_DROPOUT = (MultiHeadParams, LatentAttention.Params)


def stack_layers(model: ModelSection, part: Literal["encoder", "decoder"]) -> int:
    """The layers of the ``part`` stack of a family's model section (every family has the stacks it names)."""
    stack = model.stack(part)
    if stack is None:
        raise UnsupportedConfig(f"model.{part}: missing (the family has {'an' if part == 'encoder' else 'a'} {part})")
    return stack.layers


def ffn_bias(ffn: ComponentParams) -> bool:
    """Whether the feed-forward's projections learn biases (False for one that has no such field)."""
    return ffn.bias if isinstance(ffn, _WITH_BIAS_FFN) else False


def _query_heads(attention: ComponentParams, d_model: int) -> int:
    """The heads a recipe sets (a differential attention's h, not its 2h softmax maps)."""
    if isinstance(attention, MultiHeadParams):
        return attention.heads
    if isinstance(attention, AttentionParams):
        return attention.shape(d_model).heads
    raise UnsupportedConfig(f"model.attention: {attention.type} declares no heads (the family has multihead)")


def _attention_dropout(attention: ComponentParams) -> float:
    return attention.dropout if isinstance(attention, _ATTENTION_WITH_DROPOUT) else 0.0


def _ffn_hidden(ffn: ComponentParams) -> int | None:
    """The feed-forward's inner width as set (None: its default; the family's config says 4 * d_model)."""
    return ffn.hidden if isinstance(ffn, _WITH_HIDDEN) else None


def _hf_activation(ffn: ComponentParams) -> str:
    """transformers' name of the feed-forward's activation; ``?`` (which from_config refuses, naming the
    key) for a feed-forward without one (a gated one)."""
    return HF_ACTIVATION.get(ffn.activation, "?") if isinstance(ffn, _WITH_ACTIVATION) else "?"


def _eps(norm: ComponentParams, default: float) -> float:
    return norm.eps if isinstance(norm, _WITH_EPS) else default


def _max_len(position: ComponentParams, default: int) -> int:
    return position.max_len if isinstance(position, _WITH_MAX_LEN) else default


def to_config(model: ModelSection, family: str) -> dict:
    """The ``config.json`` of ``family`` for a model section; the caller checks that it round-trips."""
    if family in DECODERS:
        return decoders.to_config(model, DECODERS[family])
    return {"gpt2": _gpt2_config, "bert": _bert_config, "t5": _t5_config}[family](model)


def _gpt2_config(m: ModelSection) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": m.vocab_size,
        "n_embd": m.d_model,
        "n_layer": stack_layers(m, "decoder"),
        "n_head": _query_heads(m.attention, m.d_model),
        "n_inner": _ffn_hidden(m.ffn),
        "n_positions": _max_len(m.position, 1024),
        "activation_function": _hf_activation(m.ffn),
        "resid_pdrop": m.dropout,
        "embd_pdrop": m.dropout,
        "attn_pdrop": _attention_dropout(m.attention),
        "layer_norm_epsilon": _eps(m.norm, 1e-5),
        "initializer_range": m.init.std or 0.02,
        "tie_word_embeddings": m.tie_output,
        "scale_attn_weights": True,
        "bos_token_id": m.vocab_size - 1,
        "eos_token_id": m.vocab_size - 1,
    }


def _bert_config(m: ModelSection) -> dict:
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": stack_layers(m, "encoder"),
        "num_attention_heads": _query_heads(m.attention, m.d_model),
        "intermediate_size": _ffn_hidden(m.ffn),
        "hidden_act": "gelu",
        "hidden_dropout_prob": m.dropout,
        "attention_probs_dropout_prob": _attention_dropout(m.attention),
        "max_position_embeddings": _max_len(m.position, 512),
        "type_vocab_size": m.token_types,
        "layer_norm_eps": _eps(m.norm, 1e-12),
        "pad_token_id": m.pad_id,
        "initializer_range": m.init.std or 0.02,
        "tie_word_embeddings": m.tie_output,
        "position_embedding_type": "absolute",
    }


def _t5_config(m: ModelSection) -> dict:
    att: ComponentParams = m.attention
    pos: ComponentParams = m.position
    # T5's own defaults (32 buckets, distance 128) for a position that is not a relative bias
    buckets, distance = (pos.buckets, pos.max_distance) if isinstance(pos, RelativeBiasPosition.Params) else (32, 128)
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": m.vocab_size,
        "d_model": m.d_model,
        "d_kv": att.key_dim if isinstance(att, MultiHeadParams) else None,
        "d_ff": _ffn_hidden(m.ffn),
        "num_layers": stack_layers(m, "encoder"),
        "num_decoder_layers": stack_layers(m, "decoder"),
        "num_heads": _query_heads(att, m.d_model),
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": distance,
        "dropout_rate": m.dropout,
        "layer_norm_epsilon": _eps(m.norm, 1e-6),
        "feed_forward_proj": "relu",
        "is_encoder_decoder": True,
        "pad_token_id": m.pad_id,
        "decoder_start_token_id": m.pad_id,
        "eos_token_id": 1,
        "tie_word_embeddings": True,
        "scale_decoder_outputs": True,
    }
