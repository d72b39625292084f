"""Pooling a text's hidden states into one vector, and the linear layer over it.

Shapes: ``b`` texts, ``n`` positions, ``d`` model width, ``c`` outputs (classes, or 1 to regress).

    hidden (b, n, d) --pool--> (b, d) --dropout--> --linear--> (b, c)

``cls`` reads the first position, the <s> every text starts with (BERT's [CLS], Devlin et al. 2019,
arXiv:1810.04805, sec. 3); ``last`` the last real token, the only one a causal decoder lets see the
whole text (GPT, Radford et al. 2018, sec. 3.3); ``mean`` averages the real (non-pad) positions
(Sentence-BERT, Reimers and Gurevych 2019, arXiv:1908.10084).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tfbuilder.model.dropout import Dropout
from tfbuilder.spec.head import Pooling

INIT_STD = 0.02  # BERT's and GPT's initializer range for a new output layer


def real_tokens(tokens: Tensor, pad_id: int | None) -> Tensor:
    """``tokens`` (b, n) -> (b, n) bool, True where a token is not padding (all True without a pad id)."""
    if pad_id is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    return tokens != pad_id


def pool(hidden: Tensor, tokens: Tensor, *, pooling: Pooling, pad_id: int | None) -> Tensor:
    """``hidden`` (b, n, d) of right-padded ``tokens`` (b, n) -> (b, d)."""
    if pooling == "cls":
        return hidden[:, 0]
    keep = real_tokens(tokens, pad_id)
    if pooling == "mean":
        weights = keep.to(hidden.dtype).unsqueeze(-1)  # (b, n, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
    last = (keep.sum(dim=1) - 1).clamp(min=0)  # right padding: the real tokens come first
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


class SequenceHead(nn.Module):
    """One prediction per text: pool, dropout, linear (b, n, d) -> (b, c)."""

    def __init__(
        self,
        *,
        d_model: int,
        outputs: int,
        pooling: Pooling,
        dropout: float,
        pad_id: int | None,
        bias: bool = True,
        pooler: bool = False,
    ):
        super().__init__()
        self.pooling = pooling
        self.pad_id = pad_id
        # BERT's pooler (Devlin et al. 2019, arXiv:1810.04805): tanh(W h + b) of the pooled state
        self.pooler = nn.Linear(d_model, d_model) if pooler else None
        self.drop = Dropout(dropout)
        self.out = nn.Linear(d_model, outputs, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for linear in (self.pooler, self.out):
            if linear is not None:
                nn.init.normal_(linear.weight, std=INIT_STD)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)

    def forward(self, hidden: Tensor, *, tokens: Tensor) -> Tensor:
        """``hidden`` (b, n, d) of ``tokens`` (b, n) -> (b, c) logits (or, c = 1, the predicted number)."""
        pooled = pool(hidden, tokens, pooling=self.pooling, pad_id=self.pad_id)
        if self.pooler is not None:
            pooled = torch.tanh(self.pooler(pooled))
        return self.out(self.drop(pooled))

    def extra_repr(self) -> str:
        return f"pooling={self.pooling}"
