"""What the decoders need of a model, written as types.

A :class:`Translator` encodes a source once and decodes the target one token at a time through a
key/value cache (tfbuilder's ``EncoderDecoder``, an :class:`~tfbuilder.inference.ensemble.Ensemble`);
a :class:`LanguageModel` is called on tokens with the same cache (``DecoderOnly``). Both carry the
special ids they decode with and the id they pad with. The types are structural: a module written
down for a test that has these members is decoded as a built one is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from tfbuilder.specials import SpecialIds

Cache = list[dict]
"""The key/value cache of a decoder: one :data:`~tfbuilder.contracts.KVCache`-holding dict per layer."""


@runtime_checkable
class Decodable(Protocol):
    """What every decoder reads of a model: its special ids, its pad id, its modules (position tables)."""

    @property
    def specials(self) -> SpecialIds: ...

    @property
    def pad_id(self) -> int | None: ...

    def modules(self) -> Iterator[nn.Module]: ...

    def eval(self) -> nn.Module: ...


@runtime_checkable
class Translator(Decodable, Protocol):
    """A translation model: ``encode`` a source (b, j) once, ``decode`` target tokens (b, i) against it."""

    def new_cache(self) -> Cache: ...

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]: ...

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, *, cache: Cache | None = None, offset: int = 0
    ) -> Tensor: ...


@runtime_checkable
class LanguageModel(Decodable, Protocol):
    """A decoder-only model: ``model(tokens, cache=..., offset=...)`` -> next-token logits (b, n, vocab);
    ``attention_mask`` (b, offset + n) marks the real tokens of left-padded prompts (only passed when
    there are some)."""

    def new_cache(self) -> Cache: ...

    def __call__(
        self, tokens: Tensor, *, cache: Cache | None = None, offset: int = 0, attention_mask: Tensor | None = None
    ) -> Tensor: ...


def translator(model: object) -> Translator:
    """``model`` as a :class:`Translator`; a ``TypeError`` naming the members it lacks otherwise."""
    if not isinstance(model, Translator):
        raise TypeError(f"{type(model).__name__} is not a translation model (encode, decode, new_cache, specials)")
    return model


def language_model(model: object) -> LanguageModel:
    """``model`` as a :class:`LanguageModel`; a ``TypeError`` otherwise."""
    if not isinstance(model, LanguageModel):
        raise TypeError(f"{type(model).__name__} is not a decoder-only model (new_cache, specials)")
    return model


def decodable(model: object) -> Decodable:
    """``model`` as a :class:`Decodable` (its special ids and pad id); a ``TypeError`` otherwise."""
    if not isinstance(model, Decodable):
        raise TypeError(f"{type(model).__name__} carries no special ids (specials, pad_id)")
    return model
