"""Fine-tuning with a new head: ``fit --init-from`` a checkpoint whose head differs from the recipe's
(an imported BERT's masked-LM head, a GPT-2's tied output, another classifier's classes) loads the
body and initialises the head. Everything outside ``head.`` must still fit exactly."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

HEAD = "head."


def _describe(head: dict | None, kind: str) -> str:
    if head is None:
        return {"encoder": "masked-LM head", "decoder": "language-model output"}.get(kind, "output")
    if head.get("type") == "regress":
        return "regress head"
    count = head.get("classes") or len(head.get("labels") or ())
    return f"classify head ({count} classes)"


def new_head(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """Whether the recipe's head (``ours``, a recipe as data) differs from the checkpoint's (``theirs``)."""
    return ours["model"].get("head") != theirs["model"].get("head")


def load_body(model: nn.Module, weights: dict[str, Tensor]) -> list[str]:
    """Load every weight outside the head into ``model`` (the head keeps its initialisation);
    returns the checkpoint's head weights that were left out. A head weight tied to the body (an
    output projection sharing the embedding) follows the body."""
    body = {k: v for k, v in weights.items() if not k.startswith(HEAD)}
    missing, unexpected = model.load_state_dict(body, strict=False)
    stray = [k for k in missing if not k.startswith(HEAD)] + list(unexpected)
    if stray:  # fits(..., new=HEAD) checked this before; a programming error if reached
        raise RuntimeError(f"weights outside the head do not fit: {stray[:6]}")
    return [k for k in weights if k.startswith(HEAD)]


def note(source: str, ours: dict[str, Any], theirs: dict[str, Any], model: nn.Module, dropped: list[str]) -> str:
    """The line ``fit`` prints: what was loaded, what is new, what was left out."""
    new = [k for k in model.state_dict() if k.startswith(HEAD)]
    head = _describe(ours["model"].get("head"), ours["model"].get("kind", ""))
    their_head = _describe(theirs["model"].get("head"), theirs["model"].get("kind", ""))
    left_out = ""
    if dropped:
        shown = ", ".join(dropped[:4]) + (", ..." if len(dropped) > 4 else "")
        left_out = f" ({len(dropped)} weight{'s' if len(dropped) > 1 else ''} left out: {shown})"
    return (
        f"init-from: the body comes from {source}; a new {head} is initialised "
        f"({', '.join(new)}) in place of its {their_head}{left_out}"
    )
