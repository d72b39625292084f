"""What a recipe's model takes, found on the ``meta`` device (no memory, no time): the positions it
covers, its parameters and buffers, and whether they fit the memory of the devices a run would use.

Used by the pre-flight (:mod:`tfbuilder.train.preflight`), by loading a checkpoint
(:mod:`tfbuilder.runs.checkpoints`: a model too big for this machine is refused before it is
allocated), by the data's length checks and by predictions; so it sits in the model layer.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tfbuilder import devices
from tfbuilder.errors import Problem, RecipeError
from tfbuilder.model.builder import build_model
from tfbuilder.spec.recipe import ModelSection, Recipe
from tfbuilder.specials import positions_beyond_tokens

BYTES_PER_PARAMETER = {"32": 16, "64": 32, "bf16-mixed": 16, "16-mixed": 16}  # weights, grads, Adam m and v


# --- lengths ---------------------------------------------------------------------------------


def max_positions(model: ModelSection) -> int | None:
    """The longest sequence the model's positions cover, or None when unbounded."""
    return model.position.max_positions()  # the position's contract (tfbuilder.contracts.PositionParams)


def specials(kind: str) -> int:
    """Positions a sequence takes beyond its tokens (:func:`tfbuilder.specials.positions_beyond_tokens`)."""
    return positions_beyond_tokens(kind)


# --- size ------------------------------------------------------------------------------------


def count_parameters(recipe: Recipe) -> int:
    """Parameters of the recipe's model, counted on the meta device from one- and two-layer stacks
    (layers alike), or from the whole model where a stack's layers differ (``pattern``, ``overrides``)."""
    model = recipe.model
    stacks = model.stacks()
    if any(stack.pattern or stack.overrides for stack in stacks.values()):
        return meta_parameters(recipe, model)
    parts: list[str] = list(stacks)
    base = meta_parameters(recipe, with_layers(model, {p: 1 for p in parts}))
    total = base
    for part, stack in stacks.items():
        layers = stack.layers
        if layers > 1:
            two = meta_parameters(recipe, with_layers(model, {p: 2 if p == part else 1 for p in parts}))
            total += (two - base) * (layers - 1)
    return total


def machine_memory(recipe: Recipe) -> tuple[int, str]:
    """Bytes one copy of the training state may take, and what they are (for the message). Under DDP
    (and on one device) every process holds a whole replica: on GPUs each device must hold one, on
    CPUs one machine holds all its processes' replicas. FSDP shards one copy over every process of
    every node."""
    trainer = recipe.trainer
    wants_gpu = trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and torch.cuda.is_available())
    nodes = trainer.num_nodes
    sharded = trainer.strategy == "fsdp"
    if wants_gpu and torch.cuda.is_available():
        count = devices.count(trainer.devices, gpu=True)
        per = torch.cuda.get_device_properties(0).total_memory
        if sharded:
            return per * count * nodes, f"{count * nodes} GPU(s) of {gib(per)} each, sharded"
        return (
            per,
            f"one GPU of {gib(per)} (each of the {count * nodes} holds a replica)"
            if count * nodes > 1
            else f"one GPU of {gib(per)}",
        )
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, "unknown memory"
    processes = devices.count(trainer.devices, gpu=False)
    if sharded:
        return ram * nodes, "this machine's memory" if nodes == 1 else f"{nodes} machines of {gib(ram)} each, sharded"
    if processes == 1:
        return ram, "this machine's memory" if nodes == 1 else f"one machine's {gib(ram)} (each holds a replica)"
    return ram // processes, f"a {processes}-th of one machine's {gib(ram)} ({processes} processes, a replica each)"


def count_buffers(recipe: Recipe) -> int:
    """Elements of the buffers (position tables, masks) of the recipe's model with one layer per
    stack, counted on the meta device: a table of 10^6 positions is memory the parameters do not show."""
    model = recipe.model
    spec = with_layers(model, {p: 1 for p in ("encoder", "decoder") if getattr(model, p) is not None})
    with torch.device("meta"):
        built = build_located(recipe, spec)
    return sum(b.numel() for b in built.buffers())


def check_size(recipe: Recipe, parameters: int, *, training: bool = True) -> list[Problem]:
    """The model (parameters, plus Adam's state when ``training``, plus its buffers) fits the devices."""
    per = BYTES_PER_PARAMETER[recipe.trainer.precision] if training else 4
    need = parameters * per + count_buffers(recipe) * 4
    have, what = machine_memory(recipe)
    if have and need > have:
        purpose = (
            "training needs about {} for weights, gradients, Adam's state and buffers"
            if training
            else "loading it needs about {}"
        )
        return [
            recipe.problem(
                ("model",),
                f"the model has {parameters:,} parameters ({parameters:.2g}); {purpose.format(gib(need))}, "
                f"more than the {gib(have)} of {what}",
            )
        ]
    return []


# --- helpers ---------------------------------------------------------------------------------


def with_layers(model: ModelSection, layers: dict[str, int], **update: Any) -> ModelSection:
    """``model`` with the stacks named in ``layers`` cut (or grown) to that many layers, and ``update``'s fields."""
    for part, stack in model.stacks().items():
        if part in layers:
            update[part] = stack.model_copy(update={"layers": layers[part]})
    return model.model_copy(update=update)


def build_located(recipe: Recipe, spec: ModelSection) -> torch.nn.Module:
    """``build_model(spec)``, its problems put at the recipe's positions."""
    try:
        return build_model(spec)
    except RecipeError as exc:  # the builder without a recipe has no positions: put them back
        raise RecipeError([locate(recipe, p) for p in exc.problems]) from None


def meta_parameters(recipe: Recipe, spec: ModelSection) -> int:
    with torch.device("meta"):
        model = build_located(recipe, spec)
    return sum(p.numel() for p in model.parameters())


def locate(recipe: Recipe, problem: Problem) -> Problem:
    if problem.file is not None or recipe.source is None:
        return problem
    path = tuple(int(p) if p.isdigit() else p for p in problem.path.split(".")) if problem.path else ()
    return recipe.problem(path, problem.message)


def gib(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} bytes"


__all__ = ["check_size", "count_buffers", "count_parameters", "machine_memory", "max_positions", "specials"]
