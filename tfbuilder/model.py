"""Embeddings, output heads and the three model kinds. Plain ``nn.Module``s: no Lightning here.

                 encoder_decoder                          decoder             encoder
    src ids -> Embedding -> Stack(EncoderLayer)       ids -> Embedding     ids -> Embedding
                                    | memory               |                    |
    tgt ids -> Embedding -> Stack(DecoderLayer) -> Head    Stack(Decoder)       Stack(Encoder)
                                                           -> Head              -> MLMHead
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from .dropout import Dropout

from . import masks
from .blocks import Stack

Kind = Literal["encoder_decoder", "decoder", "encoder"]


class Embedding(nn.Module):
    """Token embedding times sqrt(d_model), plus positions, then dropout (Vaswani et al. 2017, sec. 3.4-3.5)."""

    def __init__(self, tokens: nn.Embedding, position: nn.Module, *, dropout: float):
        super().__init__()
        self.tokens = tokens
        self.position = position
        self.scale = math.sqrt(tokens.embedding_dim)
        self.drop = Dropout(dropout)

    def forward(self, ids: Tensor, *, offset: int = 0) -> Tensor:
        """``ids`` (b, n) int64 -> (b, n, d)."""
        return self.drop(self.position(self.tokens(ids) * self.scale, offset=offset))


def token_embedding(vocab_size: int, d_model: int) -> nn.Embedding:
    """An embedding table initialised N(0, d^-1/2), so that scaled by sqrt(d) it has unit variance."""
    table = nn.Embedding(vocab_size, d_model)
    nn.init.normal_(table.weight, std=d_model**-0.5)
    return table


class MLMHead(nn.Module):
    """Masked-LM head: dense, GELU, norm, then the vocabulary projection (Devlin et al. 2019, arXiv:1810.04805)."""

    def __init__(self, d_model: int, norm: nn.Module, out: nn.Linear):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = nn.GELU()
        self.norm = norm
        self.out = out

    def transform(self, x: Tensor) -> Tensor:
        """What comes before the vocabulary projection: (b, n, d) -> (b, n, d)."""
        return self.norm(self.act(self.dense(x)))

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> logits (b, n, vocab)."""
        return self.out(self.transform(x))


class EncoderDecoder(nn.Module):
    """The sequence-to-sequence transformer of Vaswani et al. 2017: ``model(src, tgt) -> logits``."""

    kind: Kind = "encoder_decoder"

    def __init__(
        self, *, src_embed: Embedding, tgt_embed: Embedding, encoder: Stack, decoder: Stack, head: nn.Module, pad_id: int
    ):
        super().__init__()
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.encoder = encoder
        self.decoder = decoder
        self.head = head
        self.pad_id = pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """``src`` (b, j) -> memory (b, j, d) and its key mask (b, 1, 1, j)."""
        src_mask = masks.padding_mask(src, self.pad_id)
        return self.encoder(self.src_embed(src), mask=src_mask), src_mask

    def decode_features(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, *, cache: list[dict] | None = None, offset: int = 0
    ) -> Tensor:
        """``tgt`` (b, i) and the encoder's output -> the decoder's last hidden states (b, i, d).
        With ``cache`` (see :func:`new_cache`), ``tgt`` continues the ``offset`` tokens fed before.
        Self-attention is causal by construction: right padding needs no mask (see :mod:`masks`)."""
        x = self.tgt_embed(tgt, offset=offset)
        return self.decoder(x, memory=memory, memory_mask=memory_mask, cache=cache)

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor | None, *, cache: list[dict] | None = None, offset: int = 0
    ) -> Tensor:
        """``tgt`` (b, i) and the encoder's output -> logits (b, i, vocab)."""
        return self.head(self.decode_features(tgt, memory, memory_mask, cache=cache, offset=offset))

    def new_cache(self) -> list[dict]:
        """An empty key/value cache for incremental decoding, one entry per decoder layer."""
        return [{} for _ in self.decoder.layers]

    def features(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Hidden states before the output head (b, i, d): training applies the head only where needed."""
        memory, memory_mask = self.encode(src)
        return self.decode_features(tgt, memory, memory_mask)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """``src`` (b, j), ``tgt`` (b, i) int64 ids -> logits (b, i, vocab)."""
        return self.head(self.features(src, tgt))


class DecoderOnly(nn.Module):
    """A decoder-only (GPT-like) language model: ``model(tokens) -> logits`` for the next token."""

    kind: Kind = "decoder"

    def __init__(self, *, embed: Embedding, decoder: Stack, head: nn.Module, pad_id: int):
        super().__init__()
        self.embed = embed
        self.decoder = decoder
        self.head = head
        self.pad_id = pad_id

    def features(self, tokens: Tensor, *, cache: list[dict] | None = None, offset: int = 0) -> Tensor:
        """``tokens`` (b, n) -> hidden states before the output head (b, n, d); with ``cache``,
        ``tokens`` continue the ``offset`` tokens fed before. Self-attention is causal by
        construction: right padding needs no mask (see :mod:`masks`)."""
        return self.decoder(self.embed(tokens, offset=offset), cache=cache)

    def forward(self, tokens: Tensor, *, cache: list[dict] | None = None, offset: int = 0) -> Tensor:
        """``tokens`` (b, n) int64 -> logits (b, n, vocab)."""
        return self.head(self.features(tokens, cache=cache, offset=offset))

    def new_cache(self) -> list[dict]:
        """An empty key/value cache for incremental decoding, one entry per decoder layer."""
        return [{} for _ in self.decoder.layers]


class EncoderOnly(nn.Module):
    """An encoder-only (BERT-like) model with a masked-LM head: ``model(tokens) -> logits``."""

    kind: Kind = "encoder"

    def __init__(self, *, embed: Embedding, encoder: Stack, head: nn.Module, pad_id: int):
        super().__init__()
        self.embed = embed
        self.encoder = encoder
        self.head = head
        self.pad_id = pad_id

    def features(self, tokens: Tensor) -> Tensor:
        """``tokens`` (b, n) -> hidden states before the masked-LM head (b, n, d)."""
        return self.encoder(self.embed(tokens), mask=masks.padding_mask(tokens, self.pad_id))

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens`` (b, n) int64 -> logits (b, n, vocab)."""
        return self.head(self.features(tokens))
