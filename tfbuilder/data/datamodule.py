"""The Lightning DataModule: prepared splits -> padded batches from the bucketing sampler."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
from torch.utils.data import DataLoader

from tfbuilder.data.batching import BucketBatchSampler, Position
from tfbuilder.data.collate import Collate, lengths
from tfbuilder.data.packing import packed_splits
from tfbuilder.data.prepare import Prepared
from tfbuilder.spec.sections import DataSection
from tfbuilder.specials import OWN, SpecialIds


class DataModule(L.LightningDataModule):
    """Serves prepared splits; the training sampler is infinite and resumable (``position``)."""

    def __init__(
        self,
        prepared: Prepared,
        data: DataSection,
        *,
        seed: int,
        batch_size_default: int = 32,
        workers: int = 0,
        pin_memory: bool = False,
        position_source: Callable[[], Position] = lambda: (0, 0),
        causal: bool = True,
        specials: SpecialIds = OWN,
    ):
        super().__init__()
        self.workers = workers  # batches are built in worker processes, off the training step's path
        self.pin_memory = pin_memory  # page-locked batches: copies to a GPU overlap the step
        self.prepared = prepared
        self.specials = specials  # the tokenizer's <s>, </s> and padding ids
        self.splits = packed_splits(prepared.splits, data, causal=causal, eos=specials.end)
        self.data = data
        self.seed = seed
        self.batch_size_default = batch_size_default
        # Where training resumes (the global position: epoch, batches of its order trained by all ranks):
        # called when the first batch is drawn, after a checkpoint is restored.
        self.position_source = position_source
        self._batches_in_epoch: int | None = None

    def sampler(self, split: str, *, train: bool) -> BucketBatchSampler:
        """The bucketing batch sampler of ``split``: shuffled and endless for training, this rank's
        share once a trainer is attached (rank 0 of 1 before)."""
        src, tgt, extra = lengths(self.splits[split])
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        budget = self.data.max_tokens
        size = None if budget else (self.data.batch_size or self.batch_size_default)
        if size is not None and not train:
            # Validation and test keep examples longer than data.max_len: one of them must not pad a
            # whole batch to its length (the batch's tokens stay what batch_size x max_len would hold).
            budget = size * self.data.max_len
        return BucketBatchSampler(
            src,
            tgt,
            max_tokens=budget,
            extra=extra,
            batch_size=size,
            seed=self.seed,
            shuffle=train,
            infinite=train,
            rank=rank,
            world=world,
        )

    def batches_in_epoch(self) -> int:
        """Batches in an epoch of the training split's global order (all ranks'), computed once."""
        if self._batches_in_epoch is None:
            self._batches_in_epoch = self.sampler("train", train=True).batches_in_epoch
        return self._batches_in_epoch

    def loader(self, split: str, *, train: bool = False) -> DataLoader:
        sampler = self.sampler(split, train=train)
        if train:
            sampler.start = self.position_source
        data = self.splits[split]
        # The dataset yields indices; Collate looks the examples up, so a batch is built in one go.
        return DataLoader(
            range(len(data)),  # type: ignore[arg-type]  # torch types a map-style dataset as Dataset; any indexable works
            batch_sampler=sampler,  # type: ignore[arg-type]  # batches are index arrays (no list each); torch says list
            collate_fn=Collate(data, self.specials),
            num_workers=self.workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.workers > 0,
            prefetch_factor=4 if self.workers else None,
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test" if "test" in self.splits else "val")
