"""The one place masks are made.

Convention: a mask is a boolean tensor broadcastable to (b, h, i, j), True where query i may attend
to key j; ``None`` means "attend everywhere". Padding is on the right.

Masks are made on the device of the ids and never inspected on the host: deciding "is there any
padding?" would wait for the accelerator (a host-device sync) and break compiled graphs, so a key
mask is always a tensor. Causal self-attention needs no padding mask at all: with right padding,
a real query only ever sees earlier positions, which are real; the outputs at padded positions are
unspecified and never used (the losses ignore them).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: ``ids`` (b, j) -> (b, 1, 1, j)."""
    return (ids != pad_id)[:, None, None, :]


def key_mask(ids: Tensor, pad_id: int | None) -> Tensor | None:
    """The mask of a model's keys ``ids`` (b, j): its :func:`padding_mask`, or None for a model without
    a pad id (every token is real). Encoder self-attention uses it, and the decoder's cross-attention
    over the encoder's output; the decoder's self-attention needs none (causal, see above)."""
    return None if pad_id is None else padding_mask(ids, pad_id)


def causal_mask(n_query: int, n_key: int | None = None, *, offset: int = 0, device=None) -> Tensor:
    """Look-ahead mask (1, 1, i, j): query ``offset + i`` may attend to keys ``0 .. offset + i``."""
    n_key = n_query + offset if n_key is None else n_key
    i = torch.arange(offset, offset + n_query, device=device)[:, None]
    j = torch.arange(n_key, device=device)[None, :]
    return (j <= i)[None, None]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of masks, ignoring Nones."""
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


def window_mask(n_query: int, n_key: int, window: int, *, offset: int = 0, causal: bool = True, device=None) -> Tensor:
    """Sliding-window mask (1, 1, i, j): query ``offset + i`` may attend to keys less than ``window``
    positions away (behind it when ``causal``; on either side otherwise)."""
    i = torch.arange(offset, offset + n_query, device=device)[:, None]
    j = torch.arange(n_key, device=device)[None, :]
    distance = i - j
    near = distance < window if causal else distance.abs() < window
    return near[None, None]


def document_mask(segments: Tensor) -> Tensor:
    """Block-diagonal mask (b, 1, i, j) of packed documents: query i may attend to key j only inside
    its own document. ``segments`` (b, n) numbers each position's document (see
    :func:`tfbuilder.data.packing.segments`); made on their device."""
    return (segments[:, :, None] == segments[:, None, :])[:, None]


def left_padding(ids: Tensor, pad_id: int | None) -> Tensor:
    """Which tokens of left-padded prompts ``ids`` (b, n) are real: (b, n) bool, True from each row's first
    token that is not ``pad_id`` on (a pad id later in a row, GPT-2's end-of-text as a separator, is
    real). All True without a pad id."""
    if pad_id is None:
        return torch.ones_like(ids, dtype=torch.bool)
    return (ids != pad_id).cumsum(dim=1) > 0


def padded_causal(real: Tensor, n_query: int) -> Tensor:
    """The self-attention key mask (b, 1, i, j) of the last ``n_query`` tokens of rows whose tokens
    ``real`` (b, j) marks (True: a real token, False: padding; transformers' ``attention_mask``): a
    real query never attends to a pad. A pad query attends to every key (attention adds the look-ahead),
    so that no row of scores is empty (an empty one would give NaN, which the values would carry into
    real rows); what a pad computes is never read."""
    return real[:, None, None, :] | ~real[:, None, -n_query:, None]


def position_ids(real: Tensor, n_query: int) -> Tensor:
    """The positions (b, i) of the last ``n_query`` tokens of rows ``real`` (b, j): each row counts from
    its first real token, as transformers' ``generate`` does (``attention_mask.cumsum(-1) - 1``); pads
    get position 0."""
    return (real.long().cumsum(dim=1) - 1).clamp(min=0)[:, real.shape[1] - n_query :]
