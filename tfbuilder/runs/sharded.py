"""Sharded checkpoints: the folders a fit under ``trainer.strategy: fsdp`` writes (no Lightning here).

    step-<n>.ckpt/          a folder, written at a temporary name and renamed whole
        meta.pt             everything but the tensors (recipe, vocabulary, step, loops), torch.save'd by rank 0
        .metadata           torch.distributed.checkpoint's index: each tensor's shape, dtype and where its
                            pieces lie
        __<rank>_0.distcp   each process's shard of the weights and optimizer state

:func:`read_sharded` turns such a folder into the dict a single-file checkpoint holds (the full
weights under ``state_dict``) in one process, without a process group, so that every command reads
it as it reads any checkpoint. Nothing it reads can run code: ``meta.pt`` is loaded with
``weights_only=True``, the shards' tensors are raw bytes, and ``.metadata`` (which torch itself
unpickles without restriction) is unpickled here by :class:`_IndexUnpickler`, which builds only the
index's own classes, plain data and dtypes; each piece's file must be a shard beside it.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo

from tfbuilder import atomic
from tfbuilder.errors import TfbuilderError

META = "meta.pt"  # Lightning's name for the non-tensor part of a distributed checkpoint
INDEX = ".metadata"
INDEX_LIMIT = 64 << 20  # bytes: an index larger than this is not one tfbuilder wrote
WEIGHTS = "state_dict."  # the weights' prefix in the index (the optimizer's is optimizer_<i>.)
OPTIMIZER = "optimizer_"
SHARDED_OPTIMIZER = "optimizer_sharded"  # read_sharded's mark: the shards hold an optimizer state (a resume needs it)

_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class ShardedError(TfbuilderError):
    """A sharded checkpoint folder is damaged or holds something other than a checkpoint's index."""


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` index building nothing but its own classes, dtypes and plain data."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")


def is_sharded(path: Path) -> bool:
    """Whether ``path`` is a sharded checkpoint folder."""
    return path.is_dir() and (path / INDEX).is_file() and (path / META).is_file()


def read_index(folder: Path) -> dcp_metadata.Metadata:
    """The folder's ``.metadata``, unpickled safely and checked: every piece lies in a shard file of this folder."""
    index = folder / INDEX
    if index.stat().st_size > INDEX_LIMIT:
        raise ShardedError(f"{index} is larger than any checkpoint index ({INDEX_LIMIT >> 20} MiB)")
    try:
        metadata = _IndexUnpickler(io.BytesIO(index.read_bytes())).load()
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise ShardedError(f"{index}: not a checkpoint index ({str(exc)[:200] or type(exc).__name__})") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(metadata.storage_data, dict):
        raise ShardedError(f"{index}: not a checkpoint index")
    for where in metadata.storage_data.values():
        name = where.relative_path if isinstance(where, _StorageInfo) else None
        if not isinstance(name, str) or Path(name).name != name or not name.endswith(".distcp"):
            raise ShardedError(f"{index}: names {name!r}, which is not a shard file of its folder")
        if not (folder / name).is_file():
            raise ShardedError(f"{folder}: the shard {name} is missing")
    return metadata


class _SafeReader(FileSystemReader):
    """torch's reader of a checkpoint folder, its index read by :func:`read_index`."""

    def read_metadata(self, *args: object, **kwargs: object) -> dcp_metadata.Metadata:
        metadata = read_index(Path(self.path))
        if metadata.storage_meta is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def weights(folder: Path, index: dcp_metadata.Metadata) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights a checkpoint folder holds, by their names in the Lightning
    ``state_dict`` (``model.…``), read in this process alone."""
    state: dict[str, torch.Tensor] = {}
    for key, entry in index.state_dict_metadata.items():
        if not key.startswith(WEIGHTS):
            continue
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise ShardedError(f"{folder}: {key} is not a tensor")
        state[key.removeprefix(WEIGHTS)] = torch.empty(entry.size, dtype=entry.properties.dtype)
    with warnings.catch_warnings():  # torch says it assumes one process: that is what is meant
        warnings.filterwarnings("ignore", message=r".*assuming the intent is to load in a single process")
        dcp.load({"state_dict": state}, storage_reader=_SafeReader(folder), no_dist=True)
    return state


def read_sharded(folder: Path) -> dict:
    """A sharded checkpoint as the dict of a single-file one: ``meta.pt``'s content and the full
    weights under ``state_dict`` (the optimizer state, needed only to resume, stays in the shards)."""
    meta = torch.load(folder / META, map_location="cpu", weights_only=True)
    if not isinstance(meta, dict):
        raise ShardedError(f"{folder / META} is not a checkpoint's metadata")
    index = read_index(folder)
    optimizer = any(key.startswith(OPTIMIZER) for key in index.state_dict_metadata)
    return {**meta, "state_dict": weights(folder, index), SHARDED_OPTIMIZER: optimizer}


def replace_folder(source: Path, target: Path) -> None:
    """Put folder ``source`` at ``target`` by renames (the old ``target``, if any, is renamed aside
    first and then removed): a reader sees the old folder or the new one whole, never a mixture."""
    old = atomic.temp_path(target).with_name(atomic.temp_path(target).name + "-old")
    if target.exists():
        os.replace(target, old)
    os.replace(source, target)
    atomic.fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def link_folder(source: Path, target: Path) -> None:
    """Make ``target`` a folder of hard links to the files of ``source`` (copies where links are not
    possible), replacing it whole: best.ckpt and last.ckpt share a sharded step checkpoint's files."""
    tmp = atomic.temp_path(target)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for each in source.iterdir():
        try:
            os.link(each, tmp / each.name)
        except OSError:
            shutil.copy2(each, tmp / each.name)
    replace_folder(tmp, target)


def remove(path: Path) -> None:
    """Delete a checkpoint: a file, or a sharded checkpoint's folder."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
