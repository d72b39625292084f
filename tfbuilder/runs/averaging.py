"""Checkpoint averaging: the mean of the weights of a run's last N kept checkpoints (no Lightning here).

Vaswani et al. 2017, sec. 6.1: "For the base models, we used a single model obtained by averaging the
last 5 checkpoints [...]. For the big models, we averaged the last 20 checkpoints."
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tfbuilder import atomic
from tfbuilder.runs.checkpoints import CheckpointError, mismatches, read_checkpoint, shown, step_checkpoints


def kept(run_dir: Path) -> list[tuple[int, Path]]:
    """A run's ``checkpoints/step-<n>.ckpt`` files, oldest first."""
    return step_checkpoints(Path(run_dir) / "checkpoints")


def average(paths: list[Path]) -> dict:
    """A checkpoint whose weights are the mean of ``paths``' (accumulated in float64, stored in each
    tensor's own dtype); refuses checkpoints of different models or vocabularies."""
    if not paths:
        raise CheckpointError("nothing to average")
    first = read_checkpoint(paths[0])
    meta = first["tfbuilder"]
    state = {k: v for k, v in first["state_dict"].items() if k.startswith("model.")}
    # Copies: .double() of a float64 tensor is the tensor itself, which the sum must not write into (one
    # stored expanded, one value repeated through a stride of 0, cannot be written into at all).
    sums = {k: v.to(torch.float64, copy=True) for k, v in state.items() if v.is_floating_point()}
    for path in paths[1:]:
        other = read_checkpoint(path)
        if (
            other["tfbuilder"]["recipe"].get("model") != meta["recipe"].get("model")
            or other["tfbuilder"]["vocab"] != meta["vocab"]
        ):
            raise CheckpointError(
                f"{path} and {paths[0]} come from different recipes (model or vocabulary): not averaging them"
            )
        weights = {k: v for k, v in other["state_dict"].items() if k.startswith("model.")}
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        problems = mismatches(shapes, weights, theirs=path.name, ours=paths[0].name)
        if problems:
            raise CheckpointError(
                f"{path} and {paths[0]} hold different parameters: not averaging them: {shown(problems)}"
            )
        for k in sums:
            sums[k] += weights[k].double()
    averaged = {k: (sums[k] / len(paths)).to(v.dtype) if k in sums else v for k, v in state.items()}
    last = read_checkpoint(paths[-1]) if len(paths) > 1 else first
    return {
        "state_dict": averaged,
        "global_step": int(last.get("global_step", 0)),
        "tfbuilder": {**last["tfbuilder"], "averaged_from": [str(p) for p in paths]},
    }


def write_average(run_dir: str | Path, *, last: int = 5, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Average the last ``last`` kept checkpoints of ``run_dir`` into ``out`` (default
    ``checkpoints/averaged.ckpt``); an existing file is never overwritten."""
    run_dir = Path(run_dir)
    if not (run_dir / "checkpoints").is_dir():
        raise CheckpointError(f"{run_dir} has no checkpoints/: is it a tfbuilder run directory?")
    if last < 1:
        raise CheckpointError("--last must be at least 1")
    steps = kept(run_dir)
    if len(steps) < last:
        raise CheckpointError(
            f"{run_dir} keeps {len(steps)} step checkpoint(s), fewer than --last {last}: "
            "train with trainer.keep_last set to at least N (or ask for fewer)"
        )
    paths = [p for _, p in steps[-last:]]
    target = Path(out) if out is not None else run_dir / "checkpoints" / "averaged.ckpt"
    if target.is_symlink():  # dangling or not: never written through, never replaced
        to = os.readlink(target)
        raise CheckpointError(f"{target} is a symbolic link (to {to}): not writing there; choose another --out")
    if target.exists():
        raise CheckpointError(f"{target} exists: not overwriting it; choose another --out")
    atomic.save(average(paths), target, what="averaged checkpoint")
    return target, paths
