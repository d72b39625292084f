"""Run directories and checkpoints (no Lightning here: a checkpoint loads without it).

    <trainer.output>/<recipe name>/version_<n>/
        recipe.yaml        the resolved recipe
        tokenizer.json     the vocabulary
        metrics.csv        (or TensorBoard event files)
        checkpoints/last.ckpt, checkpoints/best.ckpt
        summary.json       written when training ends
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from .errors import TfbuilderError

RUN_DIR_ENV = "TFBUILDER_RUN_DIR"  # set by rank 0 so that the other ranks of a job share its run directory


class CheckpointError(TfbuilderError):
    """A checkpoint is missing, damaged, or not a tfbuilder checkpoint."""


class RunDirError(TfbuilderError):
    """A run directory cannot be created or written."""


def new_run_dir(output: str | Path, name: str) -> Path:
    """Create ``<output>/<name>/version_<n>`` with the next free n; an existing run is never reused."""
    base = Path(output) / name
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run directory under {base}: {exc.strerror or exc}") from None
    if not os.access(base, os.W_OK):
        raise RunDirError(f"run directory {base} is not writable")
    taken = [int(p.name.split("_", 1)[1]) for p in base.glob("version_*") if p.name.split("_", 1)[1].isdigit()]
    version = max(taken, default=-1) + 1
    while True:
        path = base / f"version_{version}"
        try:
            path.mkdir()  # atomic: two runs starting together get different versions
            return path
        except FileExistsError:
            version += 1
        except OSError as exc:
            raise RunDirError(f"cannot create {path}: {exc.strerror or exc}") from None


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's ``checkpoints/last.ckpt``."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "last.ckpt", path / "last.ckpt"):
            if candidate.is_file():
                return candidate
        raise CheckpointError(f"{path} has no checkpoints/last.ckpt: is it a tfbuilder run directory?")
    if not path.exists():
        raise CheckpointError(f"no such checkpoint: {path}")
    return path


def read_checkpoint(path: str | Path) -> dict:
    """Load a checkpoint's raw dict with ``weights_only=True``; clear errors for anything else."""
    path = find_checkpoint(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: {first}") from None
    if not isinstance(data, dict) or "tfbuilder" not in data or "state_dict" not in data:
        raise CheckpointError(f"{path} is not a tfbuilder checkpoint")
    meta = data["tfbuilder"]
    if not isinstance(meta, dict) or not isinstance(meta.get("recipe"), dict) or not isinstance(meta.get("vocab"), str):
        raise CheckpointError(f"{path}: damaged checkpoint: its recipe or vocabulary is missing")
    if not isinstance(data["state_dict"], dict) or not all(isinstance(v, torch.Tensor) for v in data["state_dict"].values()):
        raise CheckpointError(f"{path}: damaged checkpoint: its weights are not a mapping of tensors")
    return data


@dataclass
class Loaded:
    """What a checkpoint rebuilds: the model (eval mode), its recipe and its vocabulary."""

    model: nn.Module
    recipe: "object"
    vocab: "object"
    path: Path
    step: int


def load_checkpoint(path: str | Path) -> Loaded:
    """Rebuild a ready model from a checkpoint alone (its recipe and tokenizer travel inside it)."""
    from .builder import build_model
    from .data.prepare import Vocab
    from .data.tokenizers import DataError
    from .errors import RecipeError
    from .recipe import recipe_from_dict

    ckpt_path = find_checkpoint(path)
    data = read_checkpoint(ckpt_path)
    meta = data["tfbuilder"]
    # The metadata is checked as a recipe file would be: a damaged checkpoint is an error, not a traceback.
    try:
        recipe = recipe_from_dict(meta["recipe"])
        model = build_model(recipe)
    except RecipeError as exc:
        shown = "; ".join(str(p) for p in exc.problems[:3]) + ("; ..." if len(exc.problems) > 3 else "")
        raise CheckpointError(f"{ckpt_path}: damaged checkpoint: the recipe inside it is not valid: {shown}") from None
    try:
        vocab = Vocab.from_json(meta["vocab"])
    except DataError as exc:
        raise CheckpointError(f"{ckpt_path}: damaged checkpoint: {exc}") from None
    for side, tok, size in (("target", vocab.tgt, recipe.model.vocab_size), ("source", vocab.src, recipe.model.src_vocab_size)):
        if size is not None and tok.vocab_size != size:
            raise CheckpointError(f"{ckpt_path}: damaged checkpoint: its {side} vocabulary has {tok.vocab_size} tokens, its model {size}")
    state = {k.removeprefix("model."): v for k, v in data["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{ckpt_path}: weights do not fit the recipe inside it: {str(exc).splitlines()[0]}") from None
    step = data.get("global_step", 0)
    return Loaded(model.eval(), recipe, vocab, ckpt_path, step if isinstance(step, int) else 0)


def write_recipe(run_dir: Path, recipe_dict: dict) -> None:
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe_dict, sort_keys=False), encoding="utf-8")
