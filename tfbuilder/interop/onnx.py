"""The forward pass as ONNX, checked with onnxruntime against PyTorch before it is kept.

``decoder`` and ``encoder`` models take ``tokens`` (b, n); ``encoder_decoder`` models take ``src`` (b, j)
and ``tgt`` (b, i); the output is ``logits``. Batch and lengths are dynamic.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from tfbuilder import atomic
from tfbuilder.errors import TfbuilderError
from tfbuilder.inference.interfaces import decodable
from tfbuilder.model.model import EncoderDecoder

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import Recipe

TOLERANCE = 1e-4
MAX_LENGTH = 1 << 16


def example_inputs(model: nn.Module, vocab_size: int) -> dict[str, torch.Tensor]:
    """Inputs that exercise padding (a pad id at the end of one row) when the model has a pad id."""
    g = torch.Generator().manual_seed(0)
    pad = decodable(model).pad_id
    low = 0 if pad is None else min(pad + 1, vocab_size - 1)

    def ids(n: int) -> torch.Tensor:
        x = torch.randint(low, vocab_size, (2, n), generator=g)
        if pad is not None:
            x[1, -2:] = pad
        return x

    if isinstance(model, EncoderDecoder):
        return {"src": ids(7), "tgt": ids(5)}
    return {"tokens": ids(6)}


class _Forward(nn.Module):
    """Positional ids in, logits out: the signature an exporter traces (no keyword-only extras)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *ids: torch.Tensor) -> torch.Tensor:
        return self.model(*ids)


def export_onnx(model: nn.Module, recipe: Recipe, path: Path) -> Path:
    """Write ``model``'s forward pass to ``path`` and check it with onnxruntime; returns ``path``."""
    try:
        import onnxruntime
    except ImportError:
        raise TfbuilderError(
            "ONNX export needs onnx, onnxscript and onnxruntime: pip install 'tfbuilder[onnx]'"
        ) from None
    model = model.eval()
    inputs = example_inputs(model, recipe.model.vocab_size)
    names = list(inputs)
    batch = torch.export.Dim("batch", min=1, max=4096)
    shapes = tuple({0: batch, 1: torch.export.Dim(f"{name}_length", min=2, max=MAX_LENGTH)} for name in names)
    with torch.no_grad():
        program = torch.onnx.export(
            _Forward(model).eval(),
            tuple(inputs.values()),
            input_names=names,
            output_names=["logits"],
            dynamic_shapes=(shapes,),
            dynamo=True,
            verbose=False,
        )
    # Checked at a temporary name first: a graph that differs from PyTorch is never in place.
    tmp = atomic.temp_path(path).with_name(atomic.temp_path(path).name + ".onnx")
    try:
        if program is None:  # torch.onnx.export returns the program whenever dynamo=True
            raise TfbuilderError("the ONNX exporter returned no program")
        program.save(str(tmp))
        check(model, tmp, inputs, onnxruntime)
        atomic.copy(tmp, path, what="ONNX model")
    finally:
        atomic.discard(tmp)
    return path


def check(model: nn.Module, path: Path, inputs: dict[str, torch.Tensor], onnxruntime) -> float:
    """Max |logit difference| between onnxruntime and PyTorch, on ``inputs`` and on a longer batch."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    longer = {k: torch.cat([v, v.flip(1)], dim=1).repeat(2, 1) for k, v in inputs.items()}
    for feed in (inputs, longer):
        with torch.no_grad():
            want = model(*feed.values()).numpy()
        got = session.run(["logits"], {k: v.numpy() for k, v in feed.items()})[0]
        worst = max(worst, float(abs(got - want).max()))
    if worst > TOLERANCE:
        path.unlink()
        raise TfbuilderError(f"the ONNX graph differs from PyTorch by {worst:.2e} (> {TOLERANCE}); not kept")
    return worst
