"""Pre-flight: what ``tfbuilder validate`` and ``fit`` check beyond the schema, so that "OK" means the
model builds, runs forward and backward, fits this machine, and the run can start.

Checks, all before anything big is allocated or any run directory is made:

1. lengths: a learned position table must cover the longest sequence the data can hold (with
   packing, a block of ``data.block_size`` tokens);
2. size (:mod:`tfbuilder.model.sizing`): parameters are counted on the ``meta`` device (no memory) from models
   of one and two layers per stack, extrapolated to the recipe's depth; training needs about 16 bytes per parameter
   (weights, gradients and Adam's two moments in float32), refused when that exceeds the memory of
   the devices the run would use;
3. a trial step: the recipe's model with one layer per stack and a small vocabulary (every width,
   head count and component kept as written) runs forward and backward on a batch of 2 x 8 ids on
   the meta device (shapes only, nothing computed or allocated), so that shape errors (an odd rotary
   width, a learned table shorter than the data) surface here;
4. this machine: a launcher for several nodes, the loggers' packages and MLflow's tracking store
   (:mod:`tfbuilder.train.loggers`), and the data's files (:func:`check_data`: the folder, each split's
   file, the training file's first records, a tokenizer file; never the Hugging Face Hub).

Problems are reported at the recipe's positions, like schema errors.
"""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tfbuilder.data.location import locate
from tfbuilder.data.readers import SplitSource, reader, split_sources
from tfbuilder.errors import ColumnError, DataError, Problem, RecipeError
from tfbuilder.model.sizing import build_located, check_size, count_parameters, max_positions, specials, with_layers
from tfbuilder.spec import formats
from tfbuilder.spec.ports import tokenizer_files
from tfbuilder.spec.recipe import ModelSection, Recipe
from tfbuilder.spec.sources import dotted_path
from tfbuilder.train import loggers

TRIAL_VOCAB = 64  # the trial model's vocabulary (the real one only widens the embedding and the head)
TRIAL_LENGTH = 8
HEAD_ROWS = 100  # training records the pre-flight reads (fit reads every one as it prepares the data)
LAUNCHER_VARIABLES = ("SLURM_NTASKS", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def check(recipe: Recipe, *, environment: bool = True, data: bool = True, vocab_given: bool = False) -> int:
    """Raise :class:`RecipeError` with every pre-flight problem of ``recipe``; returns the parameter
    count. ``environment``: also check what depends on this machine (memory, a launcher, loggers, and
    with ``data`` the data's files: :func:`check_data`). ``vocab_given``: the run takes its vocabulary
    from a checkpoint, so a tokenizer file the recipe names need not be here."""
    problems = check_lengths(recipe)
    parameters = count_parameters(recipe)
    if environment:
        problems += (
            check_size(recipe, parameters)
            + check_launcher(recipe)
            + check_strategy(recipe)
            + loggers.check(recipe)
            + check_tokenizer(recipe)
        )
        if data:
            problems += check_data(recipe, vocab_given=vocab_given)
    if problems:
        raise RecipeError(problems)
    trial_step(recipe)
    return parameters


def check_run(recipe: Recipe, *, vocab_given: bool = False) -> None:
    """What ``fit`` checks before it creates a run directory (the same as ``validate``)."""
    check(recipe, vocab_given=vocab_given)


def check_strategy(recipe: Recipe) -> list[Problem]:
    """A strategy this machine cannot run: FSDP shards over CUDA GPUs (NCCL) or CPU processes (gloo), but
    no collective library reaches an Apple GPU's memory."""
    t = recipe.trainer
    if t.strategy != "fsdp" or t.accelerator != "mps":
        return []
    return [
        recipe.problem(
            ("trainer", "strategy"),
            "fsdp shards the model over CUDA GPUs or CPU processes, and trainer.accelerator is mps (no process "
            "group reaches an Apple GPU): use strategy auto here, or accelerator cpu",
        )
    ]


# --- lengths ---------------------------------------------------------------------------------


def check_lengths(recipe: Recipe) -> list[Problem]:
    limit = max_positions(recipe.model)
    data = recipe.data
    if limit is None or data is None:
        return []
    extra = specials(recipe.model.kind)
    if data.type == "synthetic":
        longest, where = data.lengths[1], ("data", "lengths")
    elif data.packing and data.block_size is not None:
        # Packed examples are blocks of block_size tokens, specials included (data.max_len drops nothing).
        longest, where, extra = data.block_size, ("data", "block_size"), 0
    else:
        longest, where = data.max_len, ("data", "max_len")
    if longest + extra <= limit:
        return []
    needs = (
        f"packs blocks of {longest} tokens"
        if where == ("data", "block_size")
        else f"allows {longest} tokens ({longest + extra} positions with the special tokens)"
    )
    return [
        recipe.problem(
            ("model", "position", "max_len"),
            f"learned positions cover {limit} but {dotted_path(where)} {needs}: "
            f"raise max_len to at least {longest + extra}, or lower {dotted_path(where)}",
        )
    ]


def check_split_lengths(recipe: Recipe, splits: dict[str, Any]) -> None:
    """Every example of every prepared split fits the model's positions (validation and test lines
    are not filtered by data.max_len; packed blocks are block_size tokens); a :class:`DataError`
    naming the split and the example if not. Reads the length arrays only (vectorised)."""
    limit = max_positions(recipe.model)
    if limit is None:
        return
    data = recipe.data
    if data is not None and data.packing and data.block_size is not None:
        if data.block_size > limit:
            raise DataError(
                f"data.block_size ({data.block_size:,}) is more than the {limit:,} positions the model covers "
                f"(model.position.max_len {limit})"
            )
        return
    extra = specials(recipe.model.kind)
    for name, split in splits.items():
        for side, rows in (("source", split.src), ("target", split.tgt)):
            if rows is None or len(rows) == 0:
                continue
            too_long = np.flatnonzero(rows.lengths.astype(np.int64) + extra > limit)
            if len(too_long):
                index = int(too_long[0])
                side_name = side if split.tgt is not None else "text"
                raise DataError(
                    f"the {name} split's example {index + 1:,} has {int(rows.lengths[index]):,} {side_name} tokens, "
                    "more than the "
                    f"{limit - extra:,} the learned positions cover (model.position.max_len {limit}); "
                    "raise max_len or shorten the data"
                )


# --- the data's files ------------------------------------------------------------------------


def check_data(recipe: Recipe, *, vocab_given: bool = False) -> list[Problem]:
    """What ``fit`` would refuse in the data before preparing it, read cheaply: the folder ``data.path``
    names (settled as ``fit`` settles it, :func:`tfbuilder.data.location.locate`), each split's file,
    the first :data:`HEAD_ROWS` records of the training file (the columns ``data.columns`` names, with a
    "did you mean"), and a tokenizer file. Data on the Hugging Face Hub is not looked at (no network)."""
    data = recipe.data
    if data is None or data.type == "synthetic":
        return []
    problems = [] if vocab_given else check_tokenizer_file(recipe)
    if data.hub is not None or data.path is None:
        return problems
    locate(data)
    try:
        directory = Path(data.path)
        if not directory.is_dir():
            raise DataError(
                f"{directory} is a file, not a directory"
                if directory.exists()
                else f"data directory {directory} does not exist"
            )
        if formats.get(data.format).hub:
            return problems  # a save_to_disk folder: opening its splits is loading the dataset (fit does)
        sources = split_sources(data)
        if reader(data.format).rows is not None:  # a file per split, streamed: its head is cheap to read
            read_head(sources["train"])
    except ColumnError as exc:
        columns = data.columns.model_dump() if data.columns is not None else {}
        role = next((r for r, name in columns.items() if name == exc.column), None)
        problems.append(recipe.problem(("data", "columns", role) if role else ("data", "columns"), str(exc)))
    except DataError as exc:
        problems.append(recipe.problem(("data", "path"), str(exc).removesuffix(" (data.path)")))
    return problems


def read_head(source: SplitSource) -> None:
    """Read the first :data:`HEAD_ROWS` rows of ``source``: a bad record there is a :class:`DataError`."""
    rows = source.rows()
    try:
        for _ in islice(rows, HEAD_ROWS):
            pass
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()  # the reader's own clean-up (files, the csv field limit) runs now


def check_tokenizer_file(recipe: Recipe) -> list[Problem]:
    """A tokenizer file the recipe names is one that reads (the schema lets a recipe that states the
    vocabulary size load without it, as a checkpoint's recipe does; training needs it)."""
    tokenizer = recipe.data.tokenizer if recipe.data is not None else None
    if tokenizer is None or tokenizer.path is None or tokenizer.facts() is not None:
        return []
    named = tokenizer.specials.model_dump() if tokenizer.specials else None
    why = tokenizer_files().unreadable(tokenizer.type, tokenizer.path, named)
    return [recipe.problem(("data", "tokenizer", "path"), why)]


# --- size ------------------------------------------------------------------------------------


def check_tokenizer(recipe: Recipe) -> list[Problem]:
    """A SentencePiece tokenizer needs its package (an optional extra)."""
    if (
        recipe.data is not None
        and recipe.data.tokenizer.type == "sentencepiece"
        and not loggers.installed("sentencepiece")
    ):
        return [
            recipe.problem(
                ("data", "tokenizer", "type"),
                "a sentencepiece tokenizer needs the sentencepiece package: pip install 'tfbuilder[sentencepiece]'",
            )
        ]
    return []


def check_launcher(recipe: Recipe) -> list[Problem]:
    nodes = recipe.trainer.num_nodes
    if nodes > 1 and not any(v in os.environ for v in LAUNCHER_VARIABLES):
        return [
            recipe.problem(
                ("trainer", "num_nodes"),
                f"num_nodes {nodes} needs a launcher that starts every node (SLURM's srun or torchrun); "
                f"none is set here ({', '.join(LAUNCHER_VARIABLES)})",
            )
        ]
    return []


# --- a trial step ----------------------------------------------------------------------------


def trial_model(model: ModelSection) -> ModelSection:
    """``model`` with one layer per stack and a small vocabulary: the same shapes per layer, cheap."""
    small = max(TRIAL_VOCAB, (model.pad_id or 0) + 1)
    update: dict[str, Any] = {"vocab_size": min(model.vocab_size, small)}
    if model.src_vocab_size is not None:
        update["src_vocab_size"] = min(model.src_vocab_size, small)
    return with_layers(model, {p: 1 for p in ("encoder", "decoder") if model.stack(p) is not None}, **update)


def trial_step(recipe: Recipe) -> None:
    """One forward and backward pass of :func:`trial_model` on a batch of 2 x 8 ids; a failure is a
    recipe problem at ``model``."""
    spec = trial_model(recipe.model)
    limit = max_positions(spec)
    n = max(1, min(TRIAL_LENGTH, (limit or TRIAL_LENGTH) - specials(spec.kind) + 1))
    # On the meta device: the model reads no values back (masks are tensors, nothing branches on
    # data), so shapes and every check run without computing or allocating anything.
    device = torch.device("meta")
    state = torch.random.get_rng_state()
    # (No torch.set_num_threads here: changing it and back slowed later training in the same process.)
    try:
        with torch.device(device):
            model = build_located(recipe, spec)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(5, max(6, spec.vocab_size), (2, n), generator=generator).to(device)
        src = torch.randint(5, max(6, spec.src_vocab_size or spec.vocab_size), (2, n), generator=generator).to(device)
        model.train()
        logits = model(src, ids) if spec.kind == "encoder_decoder" else model(ids)
        expected = (
            (2, n, spec.vocab_size) if spec.head is None else (2, spec.head.outputs)
        )  # a sequence head: one output per text
        if tuple(logits.shape) != expected:
            raise RecipeError(
                [recipe.problem(("model",), f"the model gives logits of shape {tuple(logits.shape)}, not {expected}")]
            )
        logits.float().square().mean().backward()
    except RecipeError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "meta" in text:
            return  # the meta device cannot run this step (it reads a value); the shapes built
        raise RecipeError([recipe.problem(("model",), f"the model fails a forward/backward pass: {text}")]) from None
    finally:
        torch.random.set_rng_state(state)


__all__ = ["check", "check_data", "check_run", "check_split_lengths", "count_parameters", "max_positions", "trial_step"]
