"""Embeddings, output heads and the three model kinds. Plain ``nn.Module``s: no Lightning here.

             encoder_decoder                          decoder             encoder
src ids -> Embedding -> Stack(EncoderLayer)       ids -> Embedding     ids -> Embedding
                                | memory               |                    |
tgt ids -> Embedding -> Stack(DecoderLayer) -> Head    Stack(Decoder)       Stack(Encoder)
                                                       -> Head              -> MLMHead
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, TypeAlias

import torch
from torch import Tensor, nn

from tfbuilder import masks
from tfbuilder.model.blocks import Stack
from tfbuilder.model.dropout import Dropout
from tfbuilder.model.heads import SequenceHead
from tfbuilder.model.multi_token import MultiTokenPrediction
from tfbuilder.registry import AuxiliaryLoss, RoutingBalance
from tfbuilder.specials import OWN, SpecialIds

Kind = Literal["encoder_decoder", "decoder", "encoder"]


class Embedding(nn.Module):
    """Token embedding times ``scale`` (sqrt(d_model) in Vaswani et al. 2017, sec. 3.4-3.5), plus positions,
    plus token types (BERT), then an optional norm (BERT, Devlin et al. 2019) and dropout."""

    def __init__(
        self,
        tokens: nn.Embedding,
        position: nn.Module,
        *,
        dropout: float,
        scale: float | None = None,
        types: nn.Embedding | None = None,
        norm: nn.Module | None = None,
    ):
        super().__init__()
        self.tokens = tokens
        self.position = position
        self.scale = math.sqrt(tokens.embedding_dim) if scale is None else float(scale)
        self.types = types
        self.norm = norm
        self.drop = Dropout(dropout)

    def forward(self, ids: Tensor, *, offset: int = 0, token_types: Tensor | None = None) -> Tensor:
        """``ids`` (b, n) int64, ``token_types`` (b, n) int64 or None (all type 0) -> (b, n, d)."""
        x = self.tokens(ids)
        if self.scale != 1.0:  # most modern models do not scale; skip a pass over the activations
            x = x * self.scale
        if self.types is not None:
            x = x + (self.types(token_types) if token_types is not None else self.types.weight[0])
        x = self.position(x, offset=offset)
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x)


class OutputProjection(nn.Linear):
    """The pre-softmax projection; hidden states are multiplied by ``scale`` first (T5 scales by
    d_model^-0.5 before its tied head, Raffel et al. 2020), and the logits soft-capped to
    ``softcap * tanh(logits / softcap)`` when ``softcap`` is set (Gemma 2, Gemma Team 2024,
    arXiv:2408.00118, sec. 2). State keys are nn.Linear's."""

    def __init__(self, d_model: int, vocab_size: int, *, bias: bool, scale: float = 1.0, softcap: float | None = None):
        super().__init__(d_model, vocab_size, bias=bias)
        self.scale = float(scale)
        self.softcap = softcap  # the training loss applies it inside its fused projection (objectives.py)

    def transform(self, x: Tensor) -> Tensor:
        """What comes before the projection itself: the scale."""
        return x * self.scale if self.scale != 1.0 else x

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., d) -> logits (..., vocab)."""
        logits = super().forward(self.transform(x))
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)


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


class AuxiliaryLosses(nn.Module):
    """What every kind shares: its stacks by name, the auxiliary losses its components computed in the
    last forward, and the special ids it decodes with (tfbuilder's own 0-4; an imported model's own,
    set when it is loaded from its checkpoint)."""

    specials: SpecialIds = OWN
    pad_id: int | None
    head: nn.Module  # an OutputProjection, an MLMHead or a SequenceHead

    def stacks(self) -> dict[str, Stack]:
        """The model's stacks by name ("encoder", "decoder")."""
        raise NotImplementedError

    def auxiliary_loss(self) -> Tensor | None:
        """The sum of the weighted auxiliary losses of the last forward (the load-balancing losses of
        mixture-of-experts layers, see :class:`~tfbuilder.registry.AuxiliaryLoss`), or None when no
        component has one. Training adds it to the objective."""
        total: Tensor | None = None
        for m in self.modules():
            if isinstance(m, AuxiliaryLoss):
                total = m.auxiliary_loss() if total is None else total + m.auxiliary_loss()
        return total

    def balance_routing(self, reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        """Update the routing state of every component that balances its routing between steps (the
        correction biases of DeepSeek-V3-style mixtures of experts, see
        :class:`~tfbuilder.registry.RoutingBalance`) from the loads counted since the last call, each
        summed over ranks by ``reduce``. Training calls it once per optimizer step."""
        for m in self.modules():
            if isinstance(m, RoutingBalance) and (load := m.routing_load()) is not None:
                m.balance(load if reduce is None else reduce(load))


class IncrementalDecoding:
    """What the kinds with a decoder share: a key/value cache for decoding one token at a time."""

    decoder: Stack

    def new_cache(self) -> list[dict]:
        """An empty key/value cache for incremental decoding, one entry per decoder layer."""
        return [{} for _ in self.decoder.layers]


class EncoderDecoder(IncrementalDecoding, AuxiliaryLosses, nn.Module):
    """The sequence-to-sequence transformer of Vaswani et al. 2017: ``model(src, tgt) -> logits``."""

    kind: Kind = "encoder_decoder"

    def __init__(
        self,
        *,
        src_embed: Embedding,
        tgt_embed: Embedding,
        encoder: Stack,
        decoder: Stack,
        head: nn.Module,
        pad_id: int | None,
    ):
        super().__init__()
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.encoder = encoder
        self.decoder = decoder
        self.head = head
        self.pad_id = pad_id

    def stacks(self) -> dict[str, Stack]:
        """The encoder and the decoder, by name."""
        return {"encoder": self.encoder, "decoder": self.decoder}

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        """``src`` (b, j) -> memory (b, j, d) and its key mask (b, 1, 1, j), None without a pad id."""
        src_mask = masks.key_mask(src, self.pad_id)
        return self.encoder(self.src_embed(src), mask=src_mask), src_mask

    def decode_features(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: list[dict] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """``tgt`` (b, i) and the encoder's output -> the decoder's last hidden states (b, i, d).
        With ``cache`` (see :meth:`new_cache`), ``tgt`` continues the ``offset`` tokens fed before.
        Self-attention is causal by construction: right padding needs no mask (see :mod:`masks`), and
        a start token equal to the pad id (T5) is an ordinary token."""
        x = self.tgt_embed(tgt, offset=offset)
        return self.decoder(x, memory=memory, memory_mask=memory_mask, cache=cache)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: list[dict] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """``tgt`` (b, i) and the encoder's output -> logits (b, i, vocab)."""
        return self.head(self.decode_features(tgt, memory, memory_mask, cache=cache, offset=offset))

    def features(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Hidden states before the output head (b, i, d): training applies the head only where needed."""
        memory, memory_mask = self.encode(src)
        return self.decode_features(tgt, memory, memory_mask)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """``src`` (b, j), ``tgt`` (b, i) int64 ids -> logits (b, i, vocab)."""
        return self.head(self.features(src, tgt))


class DecoderOnly(IncrementalDecoding, AuxiliaryLosses, nn.Module):
    """A decoder-only (GPT-like) language model: ``model(tokens) -> logits`` for the next token."""

    kind: Kind = "decoder"

    def __init__(
        self,
        *,
        embed: Embedding,
        decoder: Stack,
        head: nn.Module,
        pad_id: int | None,
        mtp: MultiTokenPrediction | None = None,
    ):
        super().__init__()
        self.embed = embed
        self.decoder = decoder
        self.head = head
        self.pad_id = pad_id
        self.mtp = mtp  # multi-token prediction modules, for training only (see objectives.causal_lm)

    def stacks(self) -> dict[str, Stack]:
        """The decoder, by name."""
        return {"decoder": self.decoder}

    def features(
        self,
        tokens: Tensor,
        *,
        cache: list[dict] | None = None,
        offset: int = 0,
        token_types: Tensor | None = None,
        segments: Tensor | None = None,
    ) -> Tensor:
        """``tokens`` (b, n) -> hidden states before the output head (b, n, d); with ``cache``,
        ``tokens`` continue the ``offset`` tokens fed before. Self-attention is causal by
        construction: right padding needs no mask (see :mod:`masks`). ``segments`` (b, n), for
        packed documents, keeps attention inside each document."""
        x = self.embed(tokens, offset=offset, token_types=token_types)
        if segments is None:
            return self.decoder(x, cache=cache)
        return self.decoder(x, cache=cache, mask=masks.document_mask(segments))

    def forward(
        self, tokens: Tensor, *, cache: list[dict] | None = None, offset: int = 0, token_types: Tensor | None = None
    ) -> Tensor:
        """``tokens`` (b, n) int64 -> logits (b, n, vocab); with a sequence head, (b, classes)."""
        hidden = self.features(tokens, cache=cache, offset=offset, token_types=token_types)
        return self.head(hidden, tokens=tokens) if isinstance(self.head, SequenceHead) else self.head(hidden)


class EncoderOnly(AuxiliaryLosses, nn.Module):
    """An encoder-only (BERT-like) model with a masked-LM head (or a sequence head,
    :mod:`tfbuilder.model.heads`): ``model(tokens) -> logits``."""

    kind: Kind = "encoder"

    def __init__(self, *, embed: Embedding, encoder: Stack, head: nn.Module, pad_id: int | None):
        super().__init__()
        self.embed = embed
        self.encoder = encoder
        self.head = head
        self.pad_id = pad_id

    def stacks(self) -> dict[str, Stack]:
        """The encoder, by name."""
        return {"encoder": self.encoder}

    def features(self, tokens: Tensor, *, token_types: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """``tokens`` (b, n), ``token_types`` (b, n) or None -> hidden states before the masked-LM head (b, n, d);
        ``segments`` (b, n), for packed documents, keeps attention inside each document."""
        mask = masks.key_mask(tokens, self.pad_id)
        if segments is not None:
            mask = masks.combine(mask, masks.document_mask(segments))
        return self.encoder(self.embed(tokens, token_types=token_types), mask=mask)

    def forward(self, tokens: Tensor, *, token_types: Tensor | None = None) -> Tensor:
        """``tokens`` (b, n) int64 -> logits (b, n, vocab); with a sequence head, (b, classes)."""
        hidden = self.features(tokens, token_types=token_types)
        return self.head(hidden, tokens=tokens) if isinstance(self.head, SequenceHead) else self.head(hidden)


Model: TypeAlias = EncoderDecoder | DecoderOnly | EncoderOnly
"""What :func:`~tfbuilder.model.builder.build_model` makes: one of the three kinds."""
