"""A module tree with parameter counts, for ``tfbuilder show`` (tied weights counted once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import nn

from tfbuilder.model.blocks import DecoderLayer, ParallelLayer
from tfbuilder.model.model import AuxiliaryLosses


@runtime_checkable
class _SaysCacheSize(Protocol):
    """An attention that tells its KV cache's size (``AttentionBase.cache_per_token``)."""

    def cache_per_token(self) -> int | None: ...


@dataclass(frozen=True)
class ModuleRow:
    """One line of the tree: depth, name, class, distinct parameters it owns, and a note."""

    depth: int
    name: str
    kind: str
    params: int
    note: str = ""


def owners(model: nn.Module) -> dict[int, str]:
    """Each distinct parameter's first name (the one it is counted under)."""
    return {id(p): name for name, p in model.named_parameters()}


def tree(model: nn.Module, *, max_depth: int = 3) -> list[ModuleRow]:
    """Rows for ``model`` and its children down to ``max_depth``; runs of alike layers collapse."""
    first = owners(model)
    rows: list[ModuleRow] = []

    def count(module: nn.Module, prefix: str) -> tuple[int, list[str]]:
        total, tied = 0, []
        for name, p in module.named_parameters(remove_duplicate=False):
            full = f"{prefix}{name}"
            if first[id(p)] == full:
                total += p.numel()
            elif full.rsplit(".", 1)[0] != first[id(p)].rsplit(".", 1)[0] and first[id(p)] not in tied:
                tied.append(first[id(p)])
        return total, tied

    def visit(module: nn.Module, name: str, prefix: str, depth: int) -> None:
        total, tied = count(module, prefix)
        note = ("tied to " + ", ".join(tied)) if tied and total == 0 else ""
        rows.append(ModuleRow(depth, name, type(module).__name__, total, note))
        if depth >= max_depth:
            return
        children = list(module.named_children())
        if isinstance(module, nn.ModuleList) and len(children) > 1:
            kinds = {type(c).__name__ for _, c in children}
            sizes = {count(c, f"{prefix}{n}.")[0] for n, c in children}
            if len(kinds) == 1 and len(sizes) == 1:
                child_name, child = children[0]
                visit(
                    child,
                    f"{child_name}..{children[-1][0]} (x{len(children)}, each)",
                    f"{prefix}{child_name}.",
                    depth + 1,
                )
                return
        for child_name, child in children:
            visit(child, child_name, f"{prefix}{child_name}.", depth + 1)

    visit(model, "model", "", 0)
    return rows


def format_tree(rows: list[ModuleRow]) -> str:
    """The rows as an indented table with right-aligned counts."""
    labels = [f"{'  ' * r.depth}{r.name}: {r.kind}" for r in rows]
    width = max(len(label) for label in labels)
    lines = []
    for label, row in zip(labels, rows, strict=True):
        note = f"  ({row.note})" if row.note else ""
        lines.append(f"{label.ljust(width)}  {row.params:>14,}{note}")
    return "\n".join(lines)


def kv_cache_per_token(model: nn.Module) -> int | None:
    """Numbers the KV cache of incremental decoding keeps per generated token: the self-attention
    (``cache_per_token``) of every layer of the decoder stack; None for a model without one, or when
    a component does not say."""
    decoder = model.stacks().get("decoder") if isinstance(model, AuxiliaryLosses) else None
    if decoder is None:
        return None
    sizes: list[int] = []
    for layer in decoder.layers:
        attention = layer.self_attn.inner if isinstance(layer, (DecoderLayer, ParallelLayer)) else None
        size = attention.cache_per_token() if isinstance(attention, _SaysCacheSize) else None
        if size is None:
            return None
        sizes.append(size)
    return sum(sizes)
