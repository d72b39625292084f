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
    return data


@dataclass
class Loaded:
    """What a checkpoint rebuilds: the model (eval mode), its recipe and its vocabulary."""

    model: nn.Module
    recipe: "object"
    vocab: "object"
    path: Path
    step: int


def load_checkpoint(path: str | Path, *, device: str | torch.device | None = None) -> Loaded:
    """Rebuild a ready model from a checkpoint alone (its recipe and tokenizer travel inside it), on
    ``device`` (``None``: a GPU when present, see :func:`tfbuilder.devices.default_device`)."""
    from .devices import resolve
    from .builder import build_model
    from .data.prepare import Vocab
    from .recipe import Recipe

    ckpt_path = find_checkpoint(path)
    data = read_checkpoint(ckpt_path)
    meta = data["tfbuilder"]
    recipe = Recipe.model_validate(meta["recipe"])
    model = build_model(recipe)
    state = {k.removeprefix("model."): v for k, v in data["state_dict"].items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{ckpt_path}: weights do not fit the recipe inside it: {str(exc).splitlines()[0]}") from None
    model = model.to(resolve(device)).eval()
    return Loaded(model, recipe, Vocab.from_json(meta["vocab"]), ckpt_path, int(data.get("global_step", 0)))


def write_recipe(run_dir: Path, recipe_dict: dict) -> None:
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe_dict, sort_keys=False), encoding="utf-8")
