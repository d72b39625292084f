"""The special ids of a Hugging Face model: read from its ``config.json`` on import, written back on
export. A model keeps its own ids (T5 starts its decoder from its pad id, GPT-2 starts and ends at
50256, BERT generates nothing); see :mod:`tfbuilder.specials`."""

from __future__ import annotations

from tfbuilder.interop.hf.families import DECODERS
from tfbuilder.interop.hf.fields import UnsupportedConfig, shown
from tfbuilder.specials import SpecialIds

# What each family's config.json leaves unsaid (the values transformers assumes).
_DEFAULTS: dict[str, dict[str, int | None]] = {
    "gpt2": {"bos_token_id": 50256, "eos_token_id": 50256},
    **{name: fam.ids for name, fam in DECODERS.items()},
    "t5": {"pad_token_id": 0, "eos_token_id": 1},
    "bert": {"pad_token_id": 0},
}


def _id(cfg: dict, key: str, family: str, vocab_size: int) -> int | None:
    value = cfg.get(key, _DEFAULTS[family].get(key))
    if isinstance(value, list) and value:  # several end ids (Llama 3): the first ends an output here
        value = value[0]
    if value is None:
        return None
    if type(value) is not int:
        raise UnsupportedConfig(f"config.json: {key}: {shown(value)} is not a token id")
    # transformers writes its defaults (GPT-2's 50256) into configs of smaller vocabularies: no such token
    return value if 0 <= value < vocab_size else None


def special_ids(cfg: dict, family: str, vocab_size: int) -> SpecialIds:
    """The ids a model of ``family`` decodes with, as its ``config.json`` states them."""
    pad = _id(cfg, "pad_token_id", family, vocab_size)
    if family == "bert":  # an encoder: nothing to start or end
        return SpecialIds.of(start=None, end=None, pad=pad, unk=None)
    end = _id(cfg, "eos_token_id", family, vocab_size)
    if family == "t5":
        start = _id(cfg, "decoder_start_token_id", family, vocab_size)
        return SpecialIds.of(start=pad if start is None else start, end=end, pad=pad, unk=None)
    return SpecialIds.of(start=_id(cfg, "bos_token_id", family, vocab_size), end=end, pad=pad, unk=None)


def config_ids(specials: SpecialIds, family: str) -> dict[str, int | None]:
    """The ``config.json`` keys that state ``specials`` for ``family``."""
    if family == "bert":
        return {"pad_token_id": specials.pad}
    ids = {"bos_token_id": specials.start, "eos_token_id": specials.end, "pad_token_id": specials.pad}
    if family == "t5":
        ids = {"decoder_start_token_id": specials.start, "eos_token_id": specials.end, "pad_token_id": specials.pad}
    return ids
