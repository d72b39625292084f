"""The special token ids a model decodes with: where an output starts and ends, what pads, and what a
decoder never generates. No tensors here.

A model trained by tfbuilder uses ids 0-4 (``<pad> <s> </s> <unk> <mask>``, :data:`SPECIAL_TOKENS`,
defined here once: the recipe schema and the tokenizers import it); a model imported from Hugging Face keeps its own (T5
starts its decoder from its pad id 0 and ends at 1, GPT-2 starts and ends at 50256, Llama at 1 and
2). The ids travel in the checkpoint's metadata (``tfbuilder.specials``), the model carries them as
``model.specials``, and every decoder reads them from there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<mask>")
"""The special tokens every tfbuilder tokenizer starts with, at ids 0..4 in this order."""
COUNT = len(SPECIAL_TOKENS)
"""How many ids the specials take: a vocabulary's ordinary tokens start at this id."""
PAD, BOS, EOS, UNK, MASK = range(COUNT)


TRANSLATION_ADDED = 1
"""Tokens collation adds to each side of a translation example: x</s> on the source, <s>y (and y</s>) on the target."""
LANGUAGE_MODEL_ADDED = 2
"""Tokens collation adds to a language model's example: <s>x</s>."""


def positions_beyond_tokens(kind: str) -> int:
    """Positions a model of ``kind`` sees beyond an example's tokens: </s> on the source, <s> on the
    target (seq2seq); <s> (causal LM: it reads <s>x and only predicts the final </s>); <s> and </s>
    (masked LM)."""
    if kind == "encoder_decoder":
        return TRANSLATION_ADDED
    return LANGUAGE_MODEL_ADDED - 1 if kind == "decoder" else LANGUAGE_MODEL_ADDED


@dataclass(frozen=True)
class SpecialIds:
    """Ids with a role in decoding; ``None`` where the model has no such token."""

    start: int | None  # the decoder's first input (<s>; T5: its pad id)
    end: int | None  # ends an output (</s>)
    pad: int | None
    unk: int | None
    never: tuple[int, ...] = field(default=())  # ids no decoder may emit (<pad>, <s>, <mask>)
    mask: int | None = None  # what a masked LM shows in place of a hidden token (<mask>)

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "never": list(self.never)}
        if self.mask is None:  # as checkpoints wrote them before masks were recorded
            del out["mask"]
        return out

    def reserved(self) -> tuple[int, ...]:
        """Every id with a role (sorted): a masked LM never hides these."""
        return tuple(
            sorted({i for i in (self.start, self.end, self.pad, self.unk, self.mask, *self.never) if i is not None})
        )

    @classmethod
    def from_dict(cls, data: object, *, vocab_size: int) -> SpecialIds:
        """The ids :meth:`to_dict` wrote, each checked to be an id of the vocabulary; a ``ValueError``
        naming the field for anything else."""
        # "mask" was added later: checkpoints written before it lack it.
        if not isinstance(data, dict) or set(data) - {"mask"} != {"start", "end", "pad", "unk", "never"}:
            raise ValueError("specials: expected the keys start, end, pad, unk, never (and mask)")

        def an_id(name: str, value: object) -> int:
            if not isinstance(value, int) or type(value) is not int or not 0 <= value < vocab_size:
                raise ValueError(f"specials.{name}: {value!r} is not an id of a {vocab_size}-token vocabulary")
            return value

        def one(name: str, value: object) -> int | None:
            return None if value is None else an_id(name, value)

        never = data["never"]
        if not isinstance(never, list) or len(never) > COUNT * 4:
            raise ValueError("specials.never: expected a short list of ids")
        return cls(
            start=one("start", data["start"]),
            end=one("end", data["end"]),
            pad=one("pad", data["pad"]),
            unk=one("unk", data["unk"]),
            never=tuple(an_id(f"never[{i}]", v) for i, v in enumerate(never)),
            mask=one("mask", data.get("mask")),
        )

    @classmethod
    def of(
        cls,
        *,
        start: int | None,
        end: int | None,
        pad: int | None,
        unk: int | None,
        extra: tuple[int | None, ...] = (),
        mask: int | None = None,
    ) -> SpecialIds:
        """Ids with ``never`` derived: the pad, the start, the mask and ``extra``, except the end
        (GPT-2's start and end are one token, which must stay possible)."""
        banned = {i for i in (pad, start, mask, *extra) if i is not None} - {end}
        return cls(start=start, end=end, pad=pad, unk=unk, never=tuple(sorted(banned)), mask=mask)


def filled(ids: SpecialIds, named: SpecialIds) -> SpecialIds:
    """``ids`` with the roles it leaves unset taken from ``named`` (an imported model's config says
    some roles, its tokenizer names the rest: BERT's [CLS] and [SEP] are in no config id)."""
    pick = lambda ours, theirs: theirs if ours is None else ours  # noqa: E731
    return SpecialIds.of(
        start=pick(ids.start, named.start),
        end=pick(ids.end, named.end),
        pad=pick(ids.pad, named.pad),
        unk=pick(ids.unk, named.unk),
        extra=ids.never,
        mask=pick(ids.mask, named.mask),
    )


OWN = SpecialIds.of(start=BOS, end=EOS, pad=PAD, unk=UNK, mask=MASK)
"""The ids of every model trained by tfbuilder."""


# --- the roles of a given tokenizer's special tokens (data.tokenizer.path) ---------------------

ROLES = ("pad", "bos", "eos", "unk", "mask")
# The names each role's token goes by in common tokenizers (fairseq/T5/RoBERTa, BERT, GPT-2, Llama 3).
CANDIDATES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "bos": ("<s>", "[CLS]", "<|startoftext|>", "<|begin_of_text|>", "<bos>", "<|im_start|>"),
    "eos": ("</s>", "[SEP]", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
    "mask": ("<mask>", "[MASK]", "<|mask|>"),
}
# What each model kind cannot train without (the masked LM shows <mask>; every kind pads batches).
NEEDED = {
    "encoder_decoder": ("pad", "bos", "eos"),
    "decoder": ("pad", "bos", "eos"),
    "encoder": ("pad", "bos", "eos", "mask"),
}


def lacking(found: dict[str, int | None], kind: str) -> list[str]:
    """What a model of ``kind`` needs that the tokenizer's specials lack (or cannot be: padding with the
    end token would hide every end from the loss)."""
    out = [f"no {role} token ({' or '.join(CANDIDATES[role][:2])})" for role in NEEDED[kind] if found[role] is None]
    if found["pad"] is not None and found["pad"] == found["eos"]:
        out.append(
            f"its pad and end token are one token (id {found['pad']}): the end of every example would count as padding"
        )
    return out
