"""Training objectives: label-smoothed cross-entropy on the positions that count (no Lightning here).

The losses have no data-dependent shapes and read nothing back to the host: positions that do not
count carry ``ignore`` as their target, so a step runs on an accelerator without waiting for it, and
compiles to one graph. The vocabulary projection and the loss are fused and chunked
(:class:`LinearCrossEntropy`): the logits of the whole batch never exist at once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, update_wrapper
from typing import TypeAlias, TypeVar

import torch
from torch import Tensor, nn

from tfbuilder import masks
from tfbuilder.data.packing import segments
from tfbuilder.model.model import (
    AuxiliaryLosses,
    DecoderOnly,
    EncoderDecoder,
    EncoderOnly,
    MLMHead,
    Model,
    OutputProjection,
)
from tfbuilder.model.multi_token import MultiTokenPrediction, targets_ahead
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.sections import MLM_PROBABILITY
from tfbuilder.specials import MASK
from tfbuilder.train.heads.objective import sequence_loss
from tfbuilder.train.result import Result

# Rows of logits computed at once: about 2^26 values (256 MB in float32) per chunk.
CHUNK_ELEMENTS = 1 << 26

Batch: TypeAlias = dict[str, Tensor]
Objective: TypeAlias = Callable[[Model, Batch], Result]


class LinearCrossEntropy(torch.autograd.Function):
    """Sum over rows of label-smoothed cross-entropy of ``x @ weight.T + bias``, computed in ``pieces``
    chunks of rows (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4: (1-eps) NLL + eps * uniform CE).

    ``softcap`` (Gemma 2, Gemma Team 2024, arXiv:2408.00118) takes the logits through
    ``softcap * tanh(logits / softcap)`` first; ``z_loss`` adds ``z_loss * log(Z)^2`` per row, Z the
    softmax's normaliser (PaLM, Chowdhery et al. 2022, arXiv:2204.02311, sec. 5), which keeps log Z
    near 0. The negative log-likelihood (``nll``) is of the capped logits, without the z-loss.

    Each chunk's logits live only while its loss and its gradients are computed (in the forward
    pass: softmax minus the smoothed target is the gradient of the logits), so memory holds one
    chunk of logits instead of the batch's, in float32 for the softmax whatever the input dtype. A
    chunk makes as many passes over its logits as ``F.cross_entropy`` forward and backward (log_softmax,
    a max for the count of targets predicted, a softmax for the gradient), so one chunk, what a batch of fewer
    than :data:`CHUNK_ELEMENTS` logits gets, costs no more than the unchunked loss."""

    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        epsilon: float,
        ignore: int,
        pieces: int,
        grad: bool,
        softcap: float | None = None,
        z_loss: float = 0.0,
    ):
        chunk = -(-x.shape[0] // pieces)  # a fixed number of pieces: compiled graphs stay shape-generic
        # The matrix products run in the autocast dtype when autocast is on (bf16-mixed), as nn.Linear's
        # would: the in-place accumulation of the weight's gradient is not autocast, and a float32
        # (vocabulary x d_model) product per chunk took a sixth of a paper-base step on an H200.
        device = x.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        loss = x.new_zeros((), dtype=torch.float32)
        nll = x.new_zeros((), dtype=torch.float32)
        correct = x.new_zeros((), dtype=torch.long)
        grad_x = torch.empty_like(x) if grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if grad else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if grad and bias is not None else None
        for piece in range(pieces):
            start = piece * chunk
            rows, t = x[start : start + chunk].to(compute), target[start : start + chunk]
            logits, tanh = LinearCrossEntropy._logits(rows, weight.to(compute), bias, softcap)
            valid = t != ignore
            safe = t.masked_fill(~valid, 0)
            logp = logits.log_softmax(dim=-1)  # one fused pass (logsumexp and a subtraction were three)
            sums, log_z = LinearCrossEntropy._sums(logits, logp, safe, valid, epsilon, z_loss)
            loss, nll, correct = loss + sums[0], nll + sums[1], correct + sums[2]
            if grad_x is not None and grad_w is not None:  # grad
                # written over the log-probabilities, which are not needed any more
                g = LinearCrossEntropy._grad_logits(logits, logp, log_z, safe, epsilon, z_loss, tanh=tanh).to(compute)
                # Rows that do not count are zeroed on the narrow side (d_model wide, not vocabulary wide).
                keep = valid[:, None].to(compute)
                grad_x[start : start + chunk] = ((g @ weight.to(compute)) * keep).to(x.dtype)
                kept_rows = rows * keep
                if rows.dtype == grad_w.dtype:
                    grad_w.addmm_(g.t(), kept_rows)  # no (vocab, d) temporary
                else:
                    grad_w.add_(g.t() @ kept_rows)
                if grad_b is not None:
                    grad_b.add_(keep[:, 0] @ g)
        if grad:
            ctx.save_for_backward(grad_x, grad_w, grad_b if grad_b is not None else None)
        ctx.mark_non_differentiable(nll, correct)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return loss, nll, correct

    @staticmethod
    def _sums(
        logits: Tensor, logp: Tensor, target: Tensor, valid: Tensor, epsilon: float, z_loss: float
    ) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor | None]:
        """A chunk's summed loss, summed negative log-likelihood and count of targets predicted (rows
        that count), and log Z per row where the z-loss needs it (else None)."""
        target_logp = logp.gather(1, target[:, None]).squeeze(1)
        # log Z is any logit minus its log-probability: the target's, already gathered.
        log_z = logits.gather(1, target[:, None]).squeeze(1) - target_logp if z_loss else None
        row_nll = -target_logp
        row_loss = row_nll if epsilon == 0 else (1 - epsilon) * row_nll - epsilon * logp.mean(dim=-1)
        if log_z is not None:
            row_loss = row_loss + z_loss * log_z.square()
        # The target is the prediction where its log-probability is the highest: a max is a cheaper
        # pass than an argmax (a target tied for the highest counts as predicted).
        correct = ((target_logp >= logp.amax(dim=-1)) & valid).sum()
        return (row_loss.masked_fill(~valid, 0.0).sum(), row_nll.masked_fill(~valid, 0.0).sum(), correct), log_z

    @staticmethod
    def _logits(
        rows: Tensor, weight: Tensor, bias: Tensor | None, softcap: float | None
    ) -> tuple[Tensor, Tensor | None]:
        """One chunk's float32 logits (soft-capped: ``softcap * tanh(z / softcap)``, Gemma 2) and the
        tanh they were capped with (None without a cap), from ``rows`` and ``weight`` in one dtype."""
        logits = rows @ weight.t()
        if bias is not None:
            logits = logits + bias.to(logits.dtype)
        logits = logits.float()
        tanh: Tensor | None = None
        if softcap is not None:
            tanh = torch.tanh(logits / softcap)
            logits = softcap * tanh
        return logits, tanh

    @staticmethod
    def _grad_logits(
        logits: Tensor,
        out: Tensor,
        log_z: Tensor | None,
        target: Tensor,
        epsilon: float,
        z_loss: float,
        *,
        tanh: Tensor | None,
    ) -> Tensor:
        """The gradient of a chunk's summed loss with respect to its (capped) logits, made in ``out``'s
        storage: softmax minus the smoothed one-hot target (plus the z-loss's term), through the soft
        cap. Rows that do not count are left to the caller to zero."""
        # softmax from the logits, not exp of the log-probabilities: exp of values near -100 (whose
        # results are subnormal) took twenty times longer on CPU than the fused softmax.
        g = torch.softmax(logits, dim=-1, out=out)
        if z_loss and log_z is not None:  # d(w log(Z)^2)/d logits = 2 w log(Z) softmax
            g.mul_(1 + 2 * z_loss * log_z[:, None])
        g.scatter_add_(1, target[:, None], torch.full_like(g[:, :1], -(1.0 - epsilon)))
        if epsilon:
            g.sub_(epsilon / g.shape[-1])
        if tanh is not None:  # through the cap: d(c tanh(l / c))/dl = 1 - tanh^2
            g.mul_(1 - tanh.square())
        return g

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _nll, _correct):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        gx = grad_x * grad_loss.to(grad_x.dtype)
        gw = (grad_w * grad_loss).to(w_dtype)
        gb = None if grad_b is None else (grad_b * grad_loss).to(b_dtype)
        return gx, gw, gb, None, None, None, None, None, None, None


def output_layer(head: nn.Module) -> tuple[Callable[[Tensor], Tensor], nn.Linear]:
    """Split an output head into what comes before its vocabulary projection (an MLM head's dense
    layer and norm, a scale before a tied projection) and the projection itself."""
    before: list[Callable[[Tensor], Tensor]] = []
    if isinstance(head, nn.Linear):
        linear = head
    elif isinstance(head, MLMHead):  # its dense layer and norm come first
        linear, before = head.out, [head.transform]
    else:
        raise TypeError(f"{type(head).__name__} has no vocabulary projection to fuse with the loss")
    if isinstance(linear, OutputProjection):  # its scale comes before the projection
        before.append(linear.transform)

    def transform(x: Tensor) -> Tensor:
        for step in before:
            x = step(x)
        return x

    return transform, linear


def head_loss(
    head: nn.Module, hidden: Tensor, target: Tensor, *, epsilon: float, ignore: int, z_loss: float = 0.0
) -> Result:
    """Label-smoothed cross-entropy of ``head(hidden)`` (..., d) against ``target`` (...), where
    targets equal to ``ignore`` do not count, plus ``z_loss * log(Z)^2`` per target (PaLM); logits are
    soft-capped where the output projection says so (Gemma 2)."""
    transform, linear = output_layer(head)
    softcap = linear.softcap if isinstance(linear, OutputProjection) else None
    x = transform(hidden).reshape(-1, hidden.shape[-1])
    target = target.reshape(-1)
    pieces = 1  # a power of two: batches of varying size cross few thresholds (few recompilations)
    while pieces * CHUNK_ELEMENTS < x.shape[0] * linear.out_features and pieces < 1024:
        pieces *= 2
    grad = torch.is_grad_enabled() and (x.requires_grad or linear.weight.requires_grad)
    loss, nll, correct = LinearCrossEntropy.apply(
        x, linear.weight, linear.bias, target, epsilon, ignore, pieces, grad, softcap, z_loss
    )
    tokens = (target != ignore).sum()
    return Result(loss / tokens.clamp(min=1), nll.detach(), correct, tokens)


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, *, ignore: int = -100) -> Result:
    """The same loss from logits already computed (``logits`` (t, vocab), ``target`` (t,)): the
    reference :class:`LinearCrossEntropy` is tested against, written plainly."""
    logp = logits.float().log_softmax(dim=-1)
    valid = target != ignore
    safe = target.masked_fill(~valid, 0)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)
    loss = nll if epsilon == 0 else (1 - epsilon) * nll - epsilon * logp.mean(dim=-1)
    tokens = valid.sum()
    correct = ((logits.argmax(dim=-1) == target) & valid).sum()
    return Result((loss * valid).sum() / tokens.clamp(min=1), (nll * valid).sum().detach(), correct, tokens)


def _ignored(model: AuxiliaryLosses) -> int:
    """The target id that does not count: the model's pad id, or one no token has (no pad id)."""
    return -100 if model.pad_id is None else model.pad_id


def seq2seq(model: EncoderDecoder, batch: Batch, epsilon: float, *, z_loss: float = 0.0) -> Result:
    """Teacher-forced translation: predict ``tgt_out`` from ``src`` and ``tgt_in``."""
    hidden = model.features(batch["src"], batch["tgt_in"])
    return head_loss(model.head, hidden, batch["tgt_out"], epsilon=epsilon, ignore=_ignored(model), z_loss=z_loss)


def causal_lm(
    model: DecoderOnly, batch: Batch, epsilon: float, *, documents: bool = False, z_loss: float = 0.0
) -> Result:
    """Next-token prediction on ``tokens`` (<s> x </s>, or a packed block); with ``documents``, a
    packed block's documents do not see each other."""
    tokens = batch["tokens"]
    inputs = tokens[:, :-1]
    segs = segments(inputs, model.specials.end) if documents else None
    hidden = model.features(inputs, segments=segs) if documents else model.features(inputs)
    result = head_loss(model.head, hidden, tokens[:, 1:], epsilon=epsilon, ignore=_ignored(model), z_loss=z_loss)
    if model.mtp is None or not model.training:  # the modules' loss trains; validation scores the main head
        return result
    mask = masks.document_mask(segs) if segs is not None else None
    extra = multi_token_loss(model, model.mtp, hidden, tokens, epsilon=epsilon, mask=mask)
    return Result(result.loss + extra, result.nll, result.correct, result.tokens)


def multi_token_loss(
    model: DecoderOnly,
    mtp: MultiTokenPrediction,
    hidden: Tensor,
    tokens: Tensor,
    *,
    epsilon: float,
    mask: Tensor | None = None,
) -> Tensor:
    """DeepSeek-V3's multi-token prediction loss (arXiv:2412.19437, eq. 24-25): ``weight / D`` times
    the sum over depths k of the mean cross-entropy of predicting ``tokens[:, i + k + 1]`` from
    depth k's states, through the model's output head. ``hidden`` (b, n, d): the trunk's states;
    ``mtp``: the model's prediction modules."""
    ignore = _ignored(model)
    fill = 0 if model.pad_id is None else model.pad_id
    states = mtp(hidden, tokens, embed=model.embed, fill=fill, mask=mask)
    losses = [
        head_loss(
            model.head, h, targets_ahead(tokens, k, hidden.shape[1], ignore=ignore), epsilon=epsilon, ignore=ignore
        ).loss
        for k, h in enumerate(states, start=1)
    ]
    return mtp.weight / len(losses) * torch.stack(losses).sum()


def masked_lm(
    model: EncoderOnly,
    batch: Batch,
    epsilon: float,
    *,
    probability: float,
    vocab_size: int,
    documents: bool = False,
    z_loss: float = 0.0,
) -> Result:
    """BERT's masked LM (Devlin et al. 2019): predict a random ``probability`` share of the real tokens,
    shown as <mask> 80% of the time, a random token 10%, unchanged 10%; with ``documents``, a packed
    block's documents do not see each other."""
    tokens = batch["tokens"]
    ids = model.specials
    reserved = ids.reserved()
    # tfbuilder's specials are ids 0-4; a given tokenizer's may lie anywhere.
    contiguous = reserved == tuple(range(len(reserved)))
    if contiguous:
        candidates = tokens >= len(reserved)
    else:
        candidates = ~torch.isin(tokens, torch.tensor(reserved, dtype=tokens.dtype, device=tokens.device))
    chosen = candidates & (torch.rand(tokens.shape, device=tokens.device) < probability)
    # Always predict at least one token: when a batch drew none, each row's first candidate (decided
    # on the device, without reading the draw back).
    first = torch.zeros_like(candidates).scatter_(1, candidates.long().argmax(dim=1, keepdim=True), True) & candidates
    chosen = chosen | (first & ~chosen.any())
    roll = torch.rand(tokens.shape, device=tokens.device)
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, MASK if ids.mask is None else ids.mask), tokens)
    random_ids = torch.randint(len(reserved) if contiguous else 0, vocab_size, tokens.shape, device=tokens.device)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, inputs)
    hidden = model.features(inputs, segments=segments(tokens, ids.end)) if documents else model.features(inputs)
    return head_loss(model.head, hidden, tokens.masked_fill(~chosen, -100), epsilon=epsilon, ignore=-100, z_loss=z_loss)


def target_tokens(batch: Batch, pad_id: int | None, kind: str) -> int:
    """Target tokens a batch of a ``kind`` model feeds its objective (the masked LM: every real token,
    not only the masked ones it predicts), from host-side ids: counting on an accelerator would make the
    host wait for it. Throughput (tokens/s) counts these; losses and metrics divide by ``Result.tokens``."""
    ids = {"encoder_decoder": lambda: batch["tgt_out"], "decoder": lambda: batch["tokens"][:, 1:]}.get(
        kind, lambda: batch["tokens"]
    )()
    return int(ids.numel() if pad_id is None else (ids != pad_id).sum())


M = TypeVar("M", EncoderDecoder, DecoderOnly, EncoderOnly)


def _for(kind: type[M], fn: Callable[[M, Batch], Result]) -> Objective:
    """``fn``, taking any model and refusing one of another kind than ``kind`` (the recipe's kind
    chooses the objective; a model built from another recipe would fail deeper, less clearly)."""

    def run(model: Model, batch: Batch) -> Result:
        if not isinstance(model, kind):
            raise TypeError(f"this objective trains {kind.__name__} models, not {type(model).__name__}")
        return fn(model, batch)

    update_wrapper(run, fn)  # inspect.unwrap(objective(...)) gives the partial, with its keywords
    return run


def objective(recipe: Recipe, *, epsilon: float) -> Objective:
    """``fn(model, batch) -> Result`` for the recipe's model kind and label smoothing ``epsilon``, with
    the recipe's z-loss (``optim.z_loss``) in ``Result.loss``."""
    kind = recipe.model.kind
    z_loss = recipe.optim.z_loss
    data = recipe.data
    if recipe.model.head is not None:  # one prediction per text (tfbuilder.train.heads)
        head = partial(sequence_loss, epsilon=epsilon, regress=recipe.model.head.type == "regress")
        return _for(DecoderOnly, head) if kind == "decoder" else _for(EncoderOnly, head)
    documents = data is not None and data.packing and data.document_mask
    if kind == "encoder_decoder":
        return _for(EncoderDecoder, partial(seq2seq, epsilon=epsilon, z_loss=z_loss))
    if kind == "decoder":
        return _for(DecoderOnly, partial(causal_lm, epsilon=epsilon, documents=documents, z_loss=z_loss))
    probability = data.mlm_probability if data is not None else MLM_PROBABILITY
    masked = partial(
        masked_lm,
        epsilon=epsilon,
        probability=probability,
        vocab_size=recipe.model.vocab_size,
        documents=documents,
        z_loss=z_loss,
    )
    return _for(EncoderOnly, masked)
