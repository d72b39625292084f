"""Batches as training gets them, from files on disk: within ``data.max_tokens`` once the special
tokens are added, and every source still with its own target after the filters (empty lines,
examples longer than ``data.max_len``). Each line carries its index ("17 aaa" / "17 bbb"), so a
shifted pair shows as two different numbers in one row."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from tfbuilder.data.datamodule import DataModule
from tfbuilder.data.prepare import prepare
from tfbuilder.data.tokenizers import PAD, DataError
from tfbuilder.spec.sections import SPECIAL_TOKENS, DataSection

MAX_LEN = 20  # characters (the char tokenizer: one token each)
VOCAB = len(SPECIAL_TOKENS) + 13  # digits, space, a, b


def numbered(i: int, letter: str, length: int) -> str:
    """Line ``i``: its index, a space, then ``letter`` up to ``length`` characters in all."""
    head = f"{i} "
    return head + letter * max(0, length - len(head))


def parallel_corpus(n: int, *, seed: int = 0, filtered: bool = True) -> tuple[list[str], list[str], set[int]]:
    """Sources, targets and the indices the filters keep. When ``filtered``, every tenth pair from 3
    on has an empty source, from 5 an empty target, from 7 a source and from 8 a target one token
    over max_len (dropped); from 9 a source of exactly max_len (kept)."""
    rng = random.Random(seed)
    src, tgt, kept = [], [], set()
    for i in range(n):
        s, t = numbered(i, "a", rng.randint(3, 16)), numbered(i, "b", rng.randint(3, 16))
        kind = i % 10 if filtered else 0
        if kind == 3:
            s = ""
        elif kind == 5:
            t = ""
        elif kind == 7:
            s = numbered(i, "a", MAX_LEN + 1)
        elif kind == 8:
            t = numbered(i, "b", MAX_LEN + 1)
        elif kind == 9:
            s = numbered(i, "a", MAX_LEN)
        if kind not in (3, 5, 7, 8):
            kept.add(i)
        src.append(s)
        tgt.append(t)
    return src, tgt, kept


def write(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def parallel_section(tmp_path, *, max_tokens: int, train=None, val=None) -> DataSection:
    src, tgt, _ = train or parallel_corpus(300)
    val_src, val_tgt, _ = val or parallel_corpus(40, seed=1, filtered=False)
    write(tmp_path / "train.de", src)
    write(tmp_path / "train.en", tgt)
    write(tmp_path / "val.de", val_src)
    write(tmp_path / "val.en", val_tgt)
    return DataSection.model_validate(
        {
            "type": "parallel", "path": str(tmp_path), "src_lang": "de", "tgt_lang": "en", "max_len": MAX_LEN,
            "tokenizer": {"type": "char", "vocab_size": VOCAB}, "max_tokens": max_tokens,
        }
    )


def one_epoch(module: DataModule, split: str):
    if split == "train":
        per_epoch = module.sampler("train", train=True).batches_per_epoch
        return list(itertools.islice(iter(module.train_dataloader()), per_epoch))
    return list(module.val_dataloader())


def test_sources_and_targets_stay_paired_after_every_filter(tmp_path):
    src, tgt, kept = parallel_corpus(300)
    data = parallel_section(tmp_path, max_tokens=48, train=(src, tgt, kept))
    prepared = prepare(data)
    assert prepared.splits["train"].dropped == 300 - len(kept) == 120
    vocab = prepared.vocab
    seen = []
    for batch in one_epoch(DataModule(prepared, data, seed=3), "train"):
        for s, t_in, t_out in zip(batch["src"].tolist(), batch["tgt_in"].tolist(), batch["tgt_out"].tolist()):
            source, target = vocab.src.decode(s), vocab.tgt.decode(t_in)
            assert source.split()[0] == target.split()[0], (source, target)
            assert vocab.tgt.decode(t_out) == target  # the shifted target of the same pair
            index = int(source.split()[0])
            assert (source, target) == (src[index], tgt[index])  # the whole pair, as written
            seen.append(index)
    assert sorted(seen) == sorted(kept)  # every kept pair once an epoch, every dropped one never


@pytest.mark.parametrize("max_tokens", [MAX_LEN + 1, 48, 200])
@pytest.mark.parametrize("split", ["train", "val"])
def test_no_batch_exceeds_the_token_budget_with_its_special_tokens(tmp_path, max_tokens, split):
    data = parallel_section(tmp_path, max_tokens=max_tokens)
    for batch in one_epoch(DataModule(prepare(data), data, seed=0), split):
        for key in ("src", "tgt_in", "tgt_out"):  # x</s>, <s>y and y</s>: padded rows x width
            assert batch[key].numel() <= max_tokens, (key, tuple(batch[key].shape))


@pytest.mark.parametrize("side", ["source", "target"])
def test_an_example_the_budget_cannot_hold_is_refused_on_either_side(tmp_path, side):
    """Validation lines are not filtered by max_len: one of MAX_LEN + 5 characters needs MAX_LEN + 6
    positions with its special token, more than a budget of MAX_LEN + 1."""
    val_src, val_tgt, kept = parallel_corpus(40, seed=1, filtered=False)
    long = numbered(0, "a" if side == "source" else "b", MAX_LEN + 5)
    (val_src if side == "source" else val_tgt)[0] = long
    data = parallel_section(tmp_path, max_tokens=MAX_LEN + 1, val=(val_src, val_tgt, kept))
    with pytest.raises(DataError, match=r"data.max_tokens \(21\) is smaller than the longest example \(26 tokens"):
        prepare(data)


def test_a_long_validation_example_does_not_pad_its_batch(tmp_path):
    """With batch_size, validation keeps an example far longer than max_len (as it keeps every one):
    it is a batch alone, and no batch holds more than batch_size x max_len tokens beside it (a
    36,000-character line padded 16 sentences to its length)."""
    val_src, val_tgt, kept = parallel_corpus(40, seed=1, filtered=False)
    val_src[5] = numbered(5, "a", MAX_LEN * 30)
    data = parallel_section(tmp_path, max_tokens=48, val=(val_src, val_tgt, kept))
    data = data.model_copy(update={"max_tokens": None, "batch_size": 8})
    batches = one_epoch(DataModule(prepare(data), data, seed=0), "val")
    assert sum(len(b["src"]) for b in batches) == 40  # every example, once
    sizes = sorted((b["src"].shape[1], len(b["src"])) for b in batches)
    assert sizes[-1] == (MAX_LEN * 30 + 1, 1)  # the long one (x</s>), alone
    assert all(n <= 8 and n * width <= 8 * MAX_LEN for width, n in sizes[:-1]), sizes
    train = one_epoch(DataModule(prepare(data), data, seed=0), "train")
    assert max(len(b["src"]) for b in train) == 8  # training batches: batch_size examples, as before


def monolingual_section(tmp_path, lines: list[str], *, max_tokens: int) -> DataSection:
    write(tmp_path / "train.en", lines)
    write(tmp_path / "val.en", lines[:20])
    return DataSection.model_validate(
        {
            "type": "monolingual", "path": str(tmp_path), "lang": "en", "max_len": 100,
            "tokenizer": {"type": "char", "vocab_size": VOCAB - 1}, "max_tokens": max_tokens,
        }
    )


def test_language_model_batches_count_both_special_tokens(tmp_path):
    """A language model's row is <s> x </s>: two positions beyond the text."""
    rng = random.Random(2)
    lines = [numbered(i, "a", rng.randint(3, 22)) for i in range(200)]
    data = monolingual_section(tmp_path, lines, max_tokens=24)
    prepared = prepare(data)
    for split in ("train", "val"):
        for batch in one_epoch(DataModule(prepared, data, seed=0), split):
            assert batch["tokens"].numel() <= 24, tuple(batch["tokens"].shape)
    too_long = monolingual_section(tmp_path, [*lines, numbered(999, "a", 23)], max_tokens=24)
    with pytest.raises(DataError, match=r"smaller than the longest example \(25 tokens"):
        prepare(too_long)


def test_a_batch_fills_its_budget_exactly():
    """Examples x longest may equal max_tokens: four examples of 5 tokens fill a budget of 20, and
    the fifth starts the next batch (and a budget of 19 holds three)."""
    from tfbuilder.data.batching import pack

    sizes = [5] * 9
    assert [len(b) for b in pack(sizes, sizes, range(9), max_tokens=20, batch_size=None)] == [4, 4, 1]
    assert [len(b) for b in pack(sizes, sizes, range(9), max_tokens=19, batch_size=None)] == [3, 3, 3]
    assert [len(b) for b in pack(sizes, sizes, range(9), max_tokens=None, batch_size=4)] == [4, 4, 1]


@pytest.mark.parametrize("kind", ["translation", "language model"])
def test_the_budget_counts_exactly_the_positions_a_batch_takes(tmp_path, kind):
    """What bucketing counts per example is what collation makes of it (x</s> and <s>y; <s>x</s>), no
    more (batches would be needlessly small) and no less (over the budget)."""
    from tfbuilder.data.collate import Collate, lengths

    data = parallel_section(tmp_path, max_tokens=200)
    split = prepare(data).splits["train"]
    if kind == "language model":
        split = type(split)(split.src)
    src, tgt, extra = lengths(split)
    batch = Collate(split)(list(range(len(split))))
    if kind == "language model":
        assert ((batch["tokens"] != PAD).sum(1) == torch.as_tensor(src.astype("int64") + extra[0])).all()
        return
    assert ((batch["src"] != PAD).sum(1) == torch.as_tensor(src.astype("int64") + extra[0])).all()
    assert ((batch["tgt_in"] != PAD).sum(1) == torch.as_tensor(tgt.astype("int64") + extra[1])).all()
