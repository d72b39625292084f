"""The Lightning DataModule: prepared splits -> padded batches from the bucketing sampler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from ..sections import DataSection
from .batching import BucketBatchSampler
from .prepare import Prepared, Split
from .tokenizers import BOS, EOS, PAD

Batch = dict[str, torch.Tensor]


def pad(rows: Sequence[Sequence[int]], *, bos: bool = False, eos: bool = False) -> torch.Tensor:
    """Right-padded int64 (b, n) from ragged rows, adding <s> and/or </s>."""
    extra = int(bos) + int(eos)
    out = np.full((len(rows), max(map(len, rows)) + extra), PAD, dtype=np.int64)
    for r, row in enumerate(rows):
        start = 0
        if bos:
            out[r, 0] = BOS
            start = 1
        out[r, start : start + len(row)] = row
        if eos:
            out[r, start + len(row)] = EOS
    return torch.from_numpy(out)


class Collate:
    """Examples -> a batch. Seq2seq: ``src`` x</s>, ``tgt_in`` <s>y, ``tgt_out`` y</s>;
    language models: ``tokens`` <s>x</s> (the objective shifts or masks them)."""

    def __init__(self, split: Split):
        self.split = split

    def __call__(self, indices: list[int]) -> Batch:
        src = [self.split.src[i] for i in indices]
        if self.split.tgt is None:
            return {"tokens": pad(src, bos=True, eos=True), "index": torch.tensor(indices)}
        tgt = [self.split.tgt[i] for i in indices]
        return {
            "src": pad(src, eos=True),
            "tgt_in": pad(tgt, bos=True),
            "tgt_out": pad(tgt, eos=True),
            "index": torch.tensor(indices),
        }


def lengths(split: Split) -> tuple[list[int], list[int]]:
    src = [len(s) + 2 for s in split.src]  # room for the specials
    tgt = [len(t) + 1 for t in split.tgt] if split.tgt is not None else src
    return src, tgt


class DataModule(L.LightningDataModule):
    """Serves prepared splits; the training sampler is infinite and resumable (``position``)."""

    def __init__(self, prepared: Prepared, data: DataSection, *, seed: int, batch_size_default: int = 32):
        super().__init__()
        self.prepared = prepared
        self.data = data
        self.seed = seed
        self.batch_size_default = batch_size_default
        # Where training resumes: called when the first batch is drawn, after a checkpoint is restored.
        self.position_source: Callable[[], int] = lambda: 0
        self.train_sampler: BucketBatchSampler | None = None

    def _sampler(self, split: str, *, train: bool) -> BucketBatchSampler:
        src, tgt = lengths(self.prepared.splits[split])
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        budget = self.data.max_tokens
        return BucketBatchSampler(
            src,
            tgt,
            max_tokens=budget,
            batch_size=None if budget else (self.data.batch_size or self.batch_size_default),
            seed=self.seed,
            shuffle=train,
            infinite=train,
            rank=rank,
            world=world,
        )

    def loader(self, split: str, *, train: bool = False) -> DataLoader:
        sampler = self._sampler(split, train=train)
        if train:
            sampler.start = self.position_source
            self.train_sampler = sampler
        data = self.prepared.splits[split]
        # The dataset yields indices; Collate looks the examples up, so a batch is built in one go.
        return DataLoader(range(len(data)), batch_sampler=sampler, collate_fn=Collate(data))

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test" if "test" in self.prepared.splits else "val")
