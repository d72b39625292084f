"""Rotary positions of a decoder family's ``config.json``: ``rope_parameters`` (transformers >= 5) or
``rope_theta`` and ``rope_scaling`` (the configs written before), read into a recipe's ``position``
and written back. Each ``rope_type`` is read as transformers' ``ROPE_INIT_FUNCTIONS`` reads it
(``modeling_rope_utils.py``): the fields it needs, its defaults, and what it derives from
``max_position_embeddings`` when a field is left out.
"""

from __future__ import annotations

from typing import Any

from tfbuilder.interop.hf.fields import UnsupportedConfig, read_float, read_int, require, shown

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
YARN_OPTIONAL = ("mscale", "mscale_all_dim", "attention_factor")  # (None: derived, as in transformers)


def rope_position(cfg: dict, *, partial: bool, types: tuple[str, ...] = ROPE_TYPES, top_original: bool = False) -> dict:
    """Rotary positions: base, the rotated fraction of each head (``partial_rotary_factor``; refused
    unless ``partial``), and linear, Llama 3.1, YaRN or LongRoPE scaling (``types``: those the family
    takes). ``top_original``: a top-level ``original_max_position_embeddings`` overrides the one in
    the rope parameters (Phi-3's config, as transformers' ``standardize_rope_params`` reads it)."""
    rope, where = cfg.get("rope_parameters"), "rope_parameters"
    if rope is not None:  # transformers >= 5 writes no rope_scaling beside it
        require(cfg, "rope_scaling", (None,), None)
    else:
        legacy, where = cfg.get("rope_scaling"), "rope_scaling"
        if legacy is not None and not isinstance(legacy, dict):
            raise UnsupportedConfig(f"config.json: rope_scaling: expected an object, got {shown(legacy)}")
        rope = {"rope_theta": cfg.get("rope_theta", 10000.0), **(legacy or {})}
        rope.setdefault("rope_type", rope.get("type", "default"))
        rope.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return read_rope(rope, where, cfg, partial=partial, types=types, top_original=top_original)


def read_rope(
    rope: Any, where: str, cfg: dict, *, partial: bool, types: tuple[str, ...] = ROPE_TYPES, top_original: bool = False
) -> dict:
    """The rotary position of one set of rope parameters ``rope`` (named ``where`` in messages) of ``cfg``."""
    if not isinstance(rope, dict):
        raise UnsupportedConfig(f"config.json: {where}: expected an object, got {shown(rope)}")
    named = {f"{where}.{k}": v for k, v in rope.items()}
    kind = require(named, f"{where}.rope_type", types, "default")
    position: dict = {"type": "rotary", "base": read_float(named, f"{where}.rope_theta", 10000.0), "pairing": "half"}
    if not partial:  # the family rotates whole heads whatever the config says: a fraction is refused
        require(named, f"{where}.partial_rotary_factor", (1.0, 1), 1.0)
    fraction = read_float(named, f"{where}.partial_rotary_factor", 1.0)
    if fraction != 1.0:
        position["fraction"] = fraction
    if kind in ("yarn", "longrope"):
        original = f"{where}.original_max_position_embeddings"
        if top_original and "original_max_position_embeddings" in cfg:
            named[original] = cfg["original_max_position_embeddings"]
        if named.get(original) is None:  # transformers' default
            named[original] = cfg.get("max_position_embeddings")
        named[original] = read_int(named, original)
        if named.get(f"{where}.factor") is None:  # the implicit factor's numerator
            named["max_position_embeddings"] = cfg.get("max_position_embeddings")
    if kind == "linear":
        position["scaling"] = {"type": "linear", "factor": read_float(named, f"{where}.factor", 1.0)}
    elif kind == "llama3":
        position["scaling"] = _llama3(named, where)
    elif kind == "yarn":
        position["scaling"] = _yarn(named, where)
    elif kind == "longrope":
        position["scaling"] = _longrope(named, where)
    return position


LAYER_TYPES = ("full_attention", "sliding_attention")
THETAS = {"full_attention": ("rope_theta", 1_000_000.0), "sliding_attention": ("rope_local_base_freq", 10_000.0)}


def rope_by_layer_type(cfg: dict) -> dict[str, dict]:
    """Gemma 3's rotary position of each layer type (Gemma Team 2025, arXiv:2503.19786): transformers 5's
    ``rope_parameters`` keyed by ``full_attention`` and ``sliding_attention``, or (configs written before)
    ``rope_theta`` (default 1,000,000) with ``rope_scaling`` for the full layers and
    ``rope_local_base_freq`` (default 10,000) for the sliding ones (``Gemma3TextConfig``)."""
    rope = cfg.get("rope_parameters")
    out = {}
    for kind in LAYER_TYPES:
        theta, default = THETAS[kind]
        if rope is None:
            legacy = cfg.get("rope_scaling") if kind == "full_attention" else None
            if legacy is not None and not isinstance(legacy, dict):
                raise UnsupportedConfig(f"config.json: rope_scaling: expected an object, got {shown(legacy)}")
            sub = {"rope_theta": cfg.get(theta, default), **(legacy or {})}
            sub.setdefault("rope_type", sub.get("type", "default"))
            where = "rope_scaling" if legacy else theta
        elif not isinstance(rope, dict):
            raise UnsupportedConfig(f"config.json: rope_parameters: expected an object, got {shown(rope)}")
        else:
            require(cfg, "rope_scaling", (None,), None)
            sub, where = rope.get(kind) or {"rope_type": "default"}, f"rope_parameters.{kind}"
            if isinstance(sub, dict):
                sub = {"rope_theta": default, **sub}
        out[kind] = read_rope(sub, where, cfg, partial=False)
    return out


def _llama3(named: dict, where: str) -> dict:
    """Llama 3.1's scaling: every one of its four fields is needed (transformers has no defaults for them)."""
    scaling: dict = {"type": "llama3"}
    for key in LLAMA3_KEYS:
        value = named.get(f"{where}.{key}")
        if value is None:
            raise UnsupportedConfig(f"config.json: {where}.{key}: missing (rope_type llama3 needs it)")
        read = read_int if key == "original_max_position_embeddings" else read_float
        scaling[key] = read(named, f"{where}.{key}", value)
    return scaling


def _implicit_factor(named: dict, where: str) -> float:
    """``factor`` when the config leaves it null: max_position_embeddings / original_max_position_embeddings
    (transformers' ``_compute_yarn_parameters`` and ``_compute_longrope_parameters``; Phi-3 128k's)."""
    original = named[f"{where}.original_max_position_embeddings"]
    return read_int(named, "max_position_embeddings") / original


def _yarn(named: dict, where: str) -> dict:
    """YaRN (Peng et al. 2023, arXiv:2309.00071): transformers' ``_compute_yarn_parameters`` reads
    factor (null: the implicit one), original_max_position_embeddings (default max_position_embeddings),
    beta_fast and beta_slow (null: 32 and 1), mscale, mscale_all_dim, attention_factor and truncate."""
    factor = named.get(f"{where}.factor")
    scaling: dict = {
        "type": "yarn",
        "factor": _implicit_factor(named, where) if factor is None else read_float(named, f"{where}.factor", 1.0),
        "original_max_position_embeddings": named[f"{where}.original_max_position_embeddings"],
        "beta_fast": read_float(named, f"{where}.beta_fast", 32.0),
        "beta_slow": read_float(named, f"{where}.beta_slow", 1.0),
        "truncate": require(named, f"{where}.truncate", (True, False), True),
    }
    for key in YARN_OPTIONAL:
        if named.get(f"{where}.{key}") is not None:
            scaling[key] = read_float(named, f"{where}.{key}", 0.0)
    return scaling


def _longrope(named: dict, where: str) -> dict:
    """LongRoPE (Ding et al. 2024, arXiv:2402.13753): the short and long factors per pair (needed), factor
    (null: max_position_embeddings / original_max_position_embeddings, as transformers computes Phi-3
    128k's) and attention_factor (null: derived from factor)."""
    scaling: dict = {"type": "longrope"}
    for key in ("short_factor", "long_factor"):
        values = named.get(f"{where}.{key}")
        if not isinstance(values, list) or not values:
            raise UnsupportedConfig(f"config.json: {where}.{key}: expected a list of numbers, got {shown(values)}")
        scaling[key] = [read_float({f"{where}.{key}": v}, f"{where}.{key}", 1.0) for v in values]
    scaling["original_max_position_embeddings"] = named[f"{where}.original_max_position_embeddings"]
    factor = named.get(f"{where}.factor")
    scaling["factor"] = _implicit_factor(named, where) if factor is None else read_float(named, f"{where}.factor", 1.0)
    if named.get(f"{where}.attention_factor") is not None:
        scaling["attention_factor"] = read_float(named, f"{where}.attention_factor", 1.0)
    return scaling


def rope_parameters(position: dict) -> dict:
    """``rope_parameters`` of a rotary position (the round trip refuses any other position)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": position.get("base", 10000.0)}
    if position.get("fraction", 1.0) != 1.0:
        out["partial_rotary_factor"] = position["fraction"]
    scaling = position.get("scaling")
    if scaling:
        out.update({k: v for k, v in scaling.items() if k != "type" and v is not None}, rope_type=scaling["type"])
    return out
