"""Attention maps: the weights every attention layer gives each token, and their heatmaps
(``tfbuilder attention``). The pictures of Vaswani et al. 2017, figures 3-5, for any checkpoint.

Each PNG holds one layer's attention of one kind (encoder self-attention, decoder masked
self-attention, or cross-attention), one panel per head, rows = queries, columns = keys, labelled
with the tokens. The weights drawn are also stored in the PNG's text metadata (key
``tfbuilder:weights``, JSON, heads x queries x keys) so that the picture can be checked or re-used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from tfbuilder import atomic
from tfbuilder.contracts import Attention
from tfbuilder.data.tokenizers import Tokenizer, specials
from tfbuilder.devices import model_device
from tfbuilder.errors import TfbuilderError
from tfbuilder.inference.decoding import greedy
from tfbuilder.inference.interfaces import decodable, translator
from tfbuilder.model.blocks import DecoderLayer, EncoderLayer, ParallelLayer
from tfbuilder.model.model import DecoderOnly, EncoderDecoder, EncoderOnly
from tfbuilder.runs.checkpoints import Loaded
from tfbuilder.specials import BOS, EOS, OWN, SPECIAL_TOKENS

if TYPE_CHECKING:  # matplotlib is imported when a map is drawn (start-up time)
    from matplotlib.figure import Figure

METADATA_KEY = "tfbuilder:weights"
_SPECIAL = dict(enumerate(SPECIAL_TOKENS))  # id -> "<pad>", "<s>", ...


class AttentionMapError(TfbuilderError):
    """The model's attention cannot be shown (a component that does not keep weights, a bad layer)."""


def attention_modules(model: nn.Module) -> dict[str, Attention]:
    """``{"encoder-self-L0": module, "decoder-self-L0": ..., "decoder-cross-L0": ...}`` in layer order."""
    if not isinstance(model, (EncoderDecoder, DecoderOnly, EncoderOnly)):
        raise AttentionMapError(f"{type(model).__name__} is not a model tfbuilder builds: it has no stacks to show")
    found: dict[str, Attention] = {}
    for part, stack in model.stacks().items():
        for index, layer in enumerate(stack.layers):
            if isinstance(layer, (EncoderLayer, DecoderLayer, ParallelLayer)):
                found[f"{part}-self-L{index}"] = _attention(layer.self_attn.inner)
            if isinstance(layer, DecoderLayer) and layer.cross_attn is not None:
                found[f"{part}-cross-L{index}"] = _attention(layer.cross_attn.inner)
    return found


def _attention(module: nn.Module) -> Attention:
    """A layer's attention, through the component contract (it keeps its weights when asked)."""
    if not isinstance(module, Attention):
        raise AttentionMapError(f"attention of type {type(module).__name__} does not satisfy the attention contract")
    return module


@torch.no_grad()
def attention_weights(model: nn.Module, tokens: Tensor, tgt: Tensor | None = None) -> dict[str, Tensor]:
    """Run ``model`` once (eval mode) on one sequence, or one source ``tokens`` and target ``tgt``
    (each (1, n)), keeping every attention layer's weights: name -> (heads, queries, keys)."""
    modules = attention_modules(model)
    lacking = sorted({type(m).__name__ for m in modules.values() if not m.keeps_weights})
    if lacking:
        raise AttentionMapError(
            f"attention of type {', '.join(lacking)} does not keep its weights (keeps_weights is False)"
        )
    was_training = model.training
    model.eval()
    for module in modules.values():
        module.keep_weights, module.weights = True, None
    try:
        model(tokens, tgt) if tgt is not None else model(tokens)
        return {name: m.weights[0].float().cpu() for name, m in modules.items() if m.weights is not None}
    finally:
        for module in modules.values():
            module.keep_weights, module.weights = False, None
        model.train(was_training)


def token_labels(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """One readable label per token id (special tokens by name; a leading space shown as '_')."""

    named = _SPECIAL if specials(tokenizer) == OWN else {}  # a given tokenizer's ids 0-4 may be words
    labels = []
    for i in ids:
        text = named.get(int(i)) or tokenizer.decode([int(i)])
        labels.append(text.replace(" ", "_") if text.strip() else repr(text))
    return labels


def plot(weights: Tensor, queries: list[str], keys: list[str], *, title: str) -> Figure:
    """A figure with one heatmap per head of ``weights`` (heads, queries, keys). A bare
    ``matplotlib.figure.Figure``: no pyplot state, no change to the caller's backend."""
    from matplotlib.figure import Figure

    heads = weights.shape[0]
    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    size = max(2.4, 0.22 * max(len(queries), len(keys)) + 1.0)
    fig = Figure(figsize=(cols * size, rows * size + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.set_visible(False)
            continue
        ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=8)
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
        ax.set_yticks(range(len(queries)), queries, fontsize=6)
    fig.suptitle(title, fontsize=9)
    return fig


MAX_MAP_TOKENS = 256  # a map's side: a heatmap of a sentence, readable, drawn in seconds


def _check_length(what: str, tokens: int) -> None:
    if tokens > MAX_MAP_TOKENS:
        raise AttentionMapError(
            f"{what} is {tokens:,} tokens; attention maps are drawn for at most {MAX_MAP_TOKENS} "
            "(each map has a cell per query and key): give a sentence"
        )


def write_maps(
    loaded: Loaded, src: str, *, tgt: str | None = None, out_dir: Path, layers: Sequence[int] | None = None
) -> list[Path]:
    """PNG heatmaps of every attention layer (or only ``layers``) for ``src`` (and ``tgt``; for a
    translation model without ``tgt``, its own greedy translation) into ``out_dir``."""

    model, vocab, kind = loaded.model.eval(), loaded.vocab, loaded.recipe.model.kind
    device = model_device(model)
    # The model's own start and end ids (a given tokenizer's; tfbuilder's 1 and 2 otherwise).
    ids_of = decodable(model).specials
    start = ids_of.start if ids_of.start is not None else BOS
    end = ids_of.end if ids_of.end is not None else EOS
    if kind == "encoder_decoder":
        source = vocab.src.encode(src) + [end]
        _check_length("the source", len(source))
        if tgt is not None:
            _check_length("--tgt", len(vocab.tgt.encode(tgt)) + 1)
        src_ids = torch.tensor([source], device=device)
        target = vocab.tgt.encode(tgt) if tgt is not None else greedy(translator(model), src_ids)[0]
        tgt_ids = torch.tensor([[start] + target], device=device)
        weights = attention_weights(model, src_ids, tgt_ids)
        labels = {"encoder": token_labels(vocab.src, source), "decoder": token_labels(vocab.tgt, [start] + target)}
    else:
        if tgt is not None:
            raise AttentionMapError(f"--tgt is for translation models; this one is '{kind}'")
        ids = ([start] if kind == "decoder" else []) + vocab.tgt.encode(src)
        _check_length("the text", len(ids))
        weights = attention_weights(model, torch.tensor([ids], device=device))
        labels = {"encoder": token_labels(vocab.tgt, ids), "decoder": token_labels(vocab.tgt, ids)}
    available = sorted({int(name.rsplit("-L", 1)[1]) for name in weights})
    wanted = list(available) if layers is None else list(dict.fromkeys(layers))
    missing = [n for n in wanted if n not in available]
    if missing:
        raise AttentionMapError(f"no layer {', '.join(map(str, missing))}: layers are 0..{available[-1]}")
    chosen = {name: w for name, w in weights.items() if int(name.rsplit("-L", 1)[1]) in wanted}
    taken = [f"{name}.png" for name in chosen if (out_dir / f"{name}.png").exists()]
    if taken:
        raise AttentionMapError(f"{out_dir} already has {', '.join(taken)}: not overwriting; choose another --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, w in chosen.items():
        part, what, layer = name.split("-")
        queries = labels[part]
        keys = labels["encoder"] if what == "cross" else labels[part]
        title = {"self": "self-attention", "cross": "cross-attention (decoder queries, encoder keys)"}[what]
        title = "masked " + title if (part, what) == ("decoder", "self") else title
        fig = plot(w, queries, keys, title=f"{part} layer {layer[1:]}: {title}")
        path = out_dir / f"{name}.png"
        _write_png(path, fig, {METADATA_KEY: json.dumps(w.tolist())})
        written.append(path)
    return written


def _write_png(path: Path, fig: Figure, metadata: dict[str, str]) -> None:
    """``fig`` as a PNG at ``path`` (written atomically), with ``metadata`` in its text chunks."""
    atomic.write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=120, metadata=metadata), what="attention map")
