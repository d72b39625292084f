"""Multi-token prediction for decoder-only language models: DeepSeek-V3's sequential MTP modules
(DeepSeek-AI 2024, arXiv:2412.19437, sec. 2.2), after Gloeckle et al. 2024 (arXiv:2404.19737).

Module ``k`` (1..D) predicts the token ``k + 1`` places ahead. It joins the previous depth's hidden
state at position i with the embedding of the token at ``i + k`` (eq. 21), passes them through one
transformer layer of the model's own kind (eq. 22), and reuses the model's output head (eq. 23);
the embedding is the model's too. Training adds ``weight / D`` times the modules' summed
cross-entropy to the objective (eq. 24-25); decoding uses the main head only.

Shapes: ``b`` batch, ``n`` positions, ``d`` model width.

::

    h^0 = trunk(t_1..t_n)                                         (b, n, d): the main model's states
    h^k_i = Layer_k(W_k [Norm(h^{k-1}_i); Norm(Emb(t_{i+k}))])    predicts t_{i+k+1}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfbuilder.model.blocks import Stack


class PredictionModule(nn.Module):
    """One depth of multi-token prediction: two norms, the merging projection ``W_k`` (2d -> d,
    no bias) and a one-layer stack of the model's kind."""

    def __init__(self, *, d_model: int, norm_hidden: nn.Module, norm_embed: nn.Module, layer: Stack):
        super().__init__()
        self.norm_hidden = norm_hidden
        self.norm_embed = norm_embed
        self.merge = nn.Linear(2 * d_model, d_model, bias=False)
        self.layer = layer

    def forward(self, hidden: Tensor, embedded: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """``hidden`` (b, n, d) the previous depth's states, ``embedded`` (b, n, d) the embeddings of
        the tokens k places on -> (b, n, d). Causal like the trunk: position i sees positions <= i."""
        merged = self.merge(torch.cat([self.norm_hidden(hidden), self.norm_embed(embedded)], dim=-1))
        return self.layer(merged) if mask is None else self.layer(merged, mask=mask)


class MultiTokenPrediction(nn.Module):
    """D sequential prediction modules and the weight of their loss."""

    def __init__(self, modules: list[PredictionModule], *, weight: float):
        super().__init__()
        self.depths = nn.ModuleList(modules)
        self.weight = float(weight)

    def forward(
        self, hidden: Tensor, tokens: Tensor, *, embed: nn.Module, fill: int, mask: Tensor | None = None
    ) -> list[Tensor]:
        """``hidden`` (b, n, d): the trunk's states for ``tokens[:, :n]``; ``tokens`` (b, n + 1) the
        whole sequence. Returns each depth's states (b, n, d), position i of depth k predicting
        ``tokens[:, i + k + 1]``. Shapes stay (b, n) at every depth (the tokens past the end are
        ``fill``, and their positions predict nothing), so a compiled step sees one shape."""
        n = hidden.shape[1]
        states = []
        for k, module in enumerate(self.depths, start=1):
            ahead = F.pad(tokens[:, k : k + n], (0, k - 1), value=fill)  # t_{i+k}, (b, n)
            hidden = module(hidden, embed(ahead), mask=mask)
            states.append(hidden)
        return states


def targets_ahead(tokens: Tensor, k: int, n: int, *, ignore: int) -> Tensor:
    """What position i of depth k predicts: ``tokens[:, i + k + 1]`` (b, n), ``ignore`` past the end."""
    return F.pad(tokens[:, k + 1 : k + 1 + n], (0, k), value=ignore)
