"""Fully sharded data parallel training (FSDP2) and activation checkpointing, applied to a plain model.

``trainer.strategy: fsdp`` runs Lightning's :class:`ModelParallelStrategy` with every process in one
data-parallel group (``data_parallel_size`` = world size, ``tensor_parallel_size`` = 1).
:func:`shard` applies ``torch.distributed.fsdp.fully_shard`` (Zhao et al. 2023, "PyTorch FSDP",
arXiv:2304.11277; FSDP2 shards each parameter along its first dimension as a DTensor) to every
encoder and decoder layer, then to the whole model: a layer's weights are gathered just before its
forward (and again for its backward) and freed after, so at most about one layer's full weights are
held at a time; what lies outside the layers (embeddings, a tied output projection, final norms) is
the root unit. Under ``bf16-mixed`` or ``16-mixed`` the gathered weights are cast to that type for
compute while gradients are reduced in float32 (:func:`mixed_precision`).

Checkpoints are written by every process at once through ``torch.distributed.checkpoint`` into a
folder (:class:`ShardedStrategy`; the format and how one process reads it: :mod:`tfbuilder.runs.sharded`).

``trainer.activation_checkpointing`` (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost", arXiv:1604.06174) keeps only each layer's input during the forward and recomputes the layer
in the backward (:func:`checkpoint_activations`), under any strategy.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from tfbuilder import atomic
from tfbuilder.model.blocks import DecoderLayer, EncoderLayer, ParallelLayer
from tfbuilder.runs.sharded import replace_folder
from tfbuilder.train.callbacks import NonFiniteLoss, non_finite

BLOCKS = (EncoderLayer, DecoderLayer, ParallelLayer)  # the unit of sharding and of recomputation
HALF = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# The model's entry point besides forward: the objectives call features, which gathers the root unit's
# weights as forward does. Not encode and decode, which features calls: FSDP2's hooks do not nest.
# (Decoding during a validation finds the root's weights still gathered by the validation's forward.)
ENTRY = "features"


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's encoder and decoder layers, in order."""
    return [m for m in model.modules() if isinstance(m, BLOCKS)]


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's precision for ``trainer.precision``: under ``bf16-mixed`` (``16-mixed``) the all-gathered
    weights are cast to bfloat16 (float16) for compute and gradients reduced in float32, the recipe of
    Micikevicius et al. 2018 (arXiv:1710.03740) that keeps the sum over ranks exact to float32; the
    sharded weights and the optimizer stay float32. Anything else: float32 throughout."""
    half = HALF.get(precision)
    if half is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)


def shard(model: nn.Module, mesh: DeviceMesh, precision: str) -> None:
    """``fully_shard`` every layer, then the root (its embeddings, head and norms), in place. A tied
    output projection is the embedding's own parameter, in the root unit, so it stays tied."""
    policy = mixed_precision(precision)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    # The root stays gathered after a forward: the objectives read the output head's weight after
    # calling features (a fused loss), and the backward would gather it again at once anyway.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    if callable(getattr(model, ENTRY, None)):
        register_fsdp_forward_method(model, ENTRY)


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each layer in the backward rather than keep its activations: the layer's forward runs
    under ``torch.utils.checkpoint`` (non-reentrant, with the RNG state saved so that dropout draws the
    same mask again) when gradients are being recorded; evaluation and decoding are untouched. The
    module tree and its parameter names stay as they are."""
    for block in blocks(model):
        if "forward" in vars(block):
            continue  # already applied
        inner = block.forward

        @functools.wraps(inner)
        def forward(*args: Any, _inner: Any = inner, _block: nn.Module = block, **kwargs: Any) -> Any:
            if not (_block.training and torch.is_grad_enabled()):
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)

        block.forward = forward


def digest(model: nn.Module) -> torch.Tensor:
    """A checksum of the model's full weights, the same on every rank exactly when the weights are: each
    parameter's full tensor (gathered from its shards under FSDP: a collective every rank must join)
    summed in float64 after weighting by position, so that swapped or shifted values also change it."""
    sums = []
    for p in model.parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        flat = full.detach().double().flatten()
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
        sums.append(torch.stack([flat.sum(), (flat * weights).sum()]))
    return torch.stack(sums).flatten()


class ShardedStrategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy, every process one data-parallel rank, checkpoints written as folders
    atomically: all ranks write into a temporary folder, which rank 0 renames over the target."""

    def __init__(self, world: int, **kwargs: Any):
        super().__init__(data_parallel_size=world, tensor_parallel_size=1, save_distributed_checkpoint=True, **kwargs)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        reshard(self.model)  # the root unit may still be gathered after a validation's forward
        return super().lightning_module_state_dict()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        bad = torch.tensor([len(non_finite(_local(checkpoint.get("state_dict", {}))))], device=self.root_device)
        if self.reduce(bad, reduce_op="sum").item():  # every rank stops together
            raise NonFiniteLoss(
                f"the weights became non-finite by step {checkpoint.get('global_step')}; training stopped "
                "and they were not saved. Lower the learning rate or set optim.grad_clip."
            )
        path = Path(self.broadcast(str(filepath)))
        tmp = Path(self.broadcast(str(atomic.temp_path(path))))  # rank 0's name: one folder for all
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        except BaseException:
            if self.global_rank == 0:  # the previous checkpoint stays; the half-written folder goes
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.barrier("sharded checkpoint written")
        if self.global_rank == 0:
            for each in tmp.iterdir():
                _fsync(each)
            replace_folder(tmp, path)
        self.barrier("sharded checkpoint renamed")


def reshard(model: nn.Module | None) -> None:
    """Free every gathered unit: each parameter back to its shard."""
    for module in model.modules() if model is not None else ():
        if isinstance(module, FSDPModule):
            module.reshard()


def _local(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
