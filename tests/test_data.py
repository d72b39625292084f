"""Data: tokenizers, synthetic tasks, reading text, bucketing by a token budget."""

from __future__ import annotations

import gzip
import itertools

import numpy as np
import pytest

from conftest import multi30k_or_fixture
from tfbuilder.data import synthetic, text
from tfbuilder.data.batching import BucketBatchSampler, advance, pack, share
from tfbuilder.data.collate import Collate, pad
from tfbuilder.data.prepare import Split, Vocab
from tfbuilder.data.tokenizers import BOS, EOS, PAD, BPETokenizer, CharTokenizer, DataError, from_json


@pytest.fixture(scope="module")
def multi30k():
    """Multi30k (its first 3,000 training pairs) where it is here, else the generated stand-in
    (tests/fixtures/multi30k); the BPE vocabulary each can fill."""
    folder, real = multi30k_or_fixture()
    de = text.read_lines(folder / "train.de.gz")[:3000]
    en = text.read_lines(folder / "train.en.gz")[:3000]
    return folder, de, en, 2000 if real else 600


def test_bpe_round_trip_on_multi30k(multi30k):
    folder, de, en, vocab_size = multi30k
    tok = BPETokenizer.train(de + en, vocab_size)
    assert tok.vocab_size == vocab_size
    val = text.read_lines(folder / "val.de.gz")[:200] + text.read_lines(folder / "val.en.gz")[:200]
    for line in val:
        ids = tok.encode(line)
        assert all(5 <= i < vocab_size for i in ids)  # never a special token
        assert tok.decode(ids) == line.strip()
    # The saved form rebuilds the same tokenizer.
    again = from_json(tok.to_json())
    assert [again.encode(s) for s in val[:20]] == [tok.encode(s) for s in val[:20]]
    # Subwords, not characters: German and English sentences average well under 2 tokens per word.
    words = sum(len(s.split()) for s in val)
    assert sum(len(tok.encode(s)) for s in val) < 2 * words


def test_bpe_refuses_a_vocabulary_the_data_cannot_fill():
    with pytest.raises(DataError, match="fills only"):
        BPETokenizer.train(["a tiny corpus", "of two lines"], 5000)


def test_char_tokenizer_round_trip_and_unknowns():
    tok = CharTokenizer.train(["abcabc", "cab d"], 5 + 5)
    assert tok.decode(tok.encode("cab d")) == "cab d"
    assert tok.encode("z") == [3]  # <unk>
    assert from_json(tok.to_json()).encode("abc") == tok.encode("abc")
    shared = Vocab(tok, tok)
    assert Vocab.from_json(shared.to_json()).shared


@pytest.mark.parametrize("task, expect", [("copy", lambda s: s), ("reverse", lambda s: s[::-1]), ("sort", sorted)])
def test_synthetic_tasks(task, expect):
    src, tgt = synthetic.generate(task, n=50, symbols=6, lengths=(2, 9), seed=3)
    assert all(2 <= len(s) <= 9 and set(s) <= set("abcdef") for s in src)
    assert all(t == "".join(expect(s)) for s, t in zip(src, tgt))
    assert synthetic.generate(task, n=50, symbols=6, lengths=(2, 9), seed=3) == (src, tgt)  # deterministic
    assert synthetic.generate(task, n=50, symbols=6, lengths=(2, 9), seed=4) != (src, tgt)


def lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n).tolist(), rng.integers(1, 70, n).tolist()


def test_token_budget_batches_respect_the_budget_and_group_lengths():
    src, tgt = lengths()
    sampler = BucketBatchSampler(src, tgt, max_tokens=600, seed=1, shuffle=True)
    batches = sampler.epoch(0).tolist()
    for batch in batches:
        assert len(batch) * max(src[i] for i in batch) <= 600
        assert len(batch) * max(tgt[i] for i in batch) <= 600
    # Bucketing keeps padding small: far less than random batching would give.
    padded = sum(len(b) * max(src[i] for i in b) for b in batches)
    assert padded < 1.15 * sum(src)


def test_each_example_exactly_once_per_epoch_and_a_new_order_each_epoch():
    src, tgt = lengths()
    sampler = BucketBatchSampler(src, tgt, max_tokens=500, seed=7, shuffle=True)
    for epoch in range(3):
        flat = [i for b in sampler.epoch(epoch) for i in b]
        assert sorted(flat) == list(range(len(src)))
    assert sampler.epoch(0).tolist() != sampler.epoch(1).tolist()
    assert BucketBatchSampler(src, tgt, max_tokens=500, seed=7).epoch(1).tolist() == sampler.epoch(1).tolist()


def test_sentence_count_batching():
    src, tgt = lengths(100)
    batches = BucketBatchSampler(src, tgt, batch_size=16, seed=0).epoch(0).tolist()
    assert sorted(len(b) for b in batches) == [4] + [16] * 6


def test_ranks_take_disjoint_equal_shares():
    src, tgt = lengths()
    ranks = [BucketBatchSampler(src, tgt, max_tokens=500, seed=2, infinite=True, rank=r, world=2) for r in range(2)]
    shares = [ranks[r].epoch(0).tolist() for r in range(2)]
    assert len(shares[0]) == len(shares[1])
    seen = [i for share in shares for b in share for i in b]
    assert len(seen) == len(set(seen))
    assert len(seen) > len(src) - max(len(b) for b in BucketBatchSampler(src, tgt, max_tokens=500, seed=2).epoch(0).tolist())


def test_infinite_sampler_resumes_at_any_position():
    src, tgt = lengths(500)
    sampler = BucketBatchSampler(src, tgt, max_tokens=400, seed=5, infinite=True)
    per_epoch = sampler.batches_per_epoch
    straight = [b.tolist() for b in itertools.islice(iter(sampler), 3 * per_epoch)]
    resumed = BucketBatchSampler(src, tgt, max_tokens=400, seed=5, infinite=True)
    resumed.start = lambda: (1, 3)
    assert [b.tolist() for b in itertools.islice(iter(resumed), 2 * per_epoch - 3)] == straight[per_epoch + 3 :]


def test_an_example_longer_than_the_budget_is_a_batch_alone():
    assert pack([3, 50, 3], [3, 3, 3], [0, 1, 2], max_tokens=20, batch_size=None) == [[0], [1], [2]]


def test_collate_adds_specials_and_pads():
    split = Split(src=[[5, 6], [7]], tgt=[[8], [9, 10, 11]])
    batch = Collate(split)([0, 1])
    assert batch["src"].tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch["tgt_in"].tolist() == [[BOS, 8, PAD, PAD], [BOS, 9, 10, 11]]
    assert batch["tgt_out"].tolist() == [[8, EOS, PAD, PAD], [9, 10, 11, EOS]]
    assert pad([[5]], bos=True, eos=True).tolist() == [[BOS, 5, EOS]]


def write_gz(path, lines):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def test_reading_reports_missing_mismatched_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        text.read_parallel(tmp_path / "nowhere", "train", "de", "en")
    write_gz(tmp_path / "train.de.gz", ["a", "b", "c"])
    with pytest.raises(DataError, match=r"missing data file: .*train\.en"):
        text.read_parallel(tmp_path, "train", "de", "en")
    (tmp_path / "train.en").write_text("a\nb\n")
    with pytest.raises(DataError, match="has 3 lines but .* has 2"):
        text.read_parallel(tmp_path, "train", "de", "en")
    (tmp_path / "val.de").write_text("\n\n")
    with pytest.raises(DataError, match="is empty"):
        text.read_lines(tmp_path / "val.de")
    (tmp_path / "bad.de.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        text.read_lines(tmp_path / "bad.de.gz")


def test_a_gzip_of_blank_lines_is_refused_where_the_run_passes_the_bound(tmp_path):
    """A small gzip can expand to gigabytes of empty lines, read for minutes: past MAX_BLANK_RUN blank
    lines in a row the file is refused, naming where the run began; blank lines a corpus has (one
    fewer than the bound, then text) are read."""
    bomb = tmp_path / "train.de.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(b"ein Satz\n" + b"\n" * (text.MAX_BLANK_RUN * 20))
    with pytest.raises(DataError, match=rf"lines 2 to {text.MAX_BLANK_RUN + 2:,} are all blank"):
        for _ in text.lines(bomb):
            pass
    windows = tmp_path / "crlf.de"  # blank lines with Windows line ends count the same
    windows.write_bytes(b"a\r\n" + b"\r\n" * (text.MAX_BLANK_RUN + 1))
    with pytest.raises(DataError, match="are all blank"):
        list(text.lines(windows))
    padded = tmp_path / "ok.de"
    padded.write_bytes(b"a\n" + b"\r\n" * text.MAX_BLANK_RUN + b"b\n" + b"\n" * text.MAX_BLANK_RUN)
    got = list(text.lines(padded))
    assert got[0] == "a" and got[text.MAX_BLANK_RUN + 1] == "b" and len(got) == 2 * text.MAX_BLANK_RUN + 2


def test_a_data_file_that_is_not_a_file_is_named_for_what_it_is(tmp_path):
    import os

    os.mkfifo(tmp_path / "train.de")
    with pytest.raises(DataError, match=r"train.de: not a regular file \(a FIFO\)"):
        list(text.lines(tmp_path / "train.de"))


# --- the global data position: a resume on another number of ranks continues the global order --------
def stepped(world: int, start: tuple[int, int], steps: int, **kw) -> list[list[int]]:
    """The batches ``world`` ranks train in ``steps`` steps from ``start``, step by step, rank by rank."""
    ranks = [BucketBatchSampler(**kw, infinite=True, rank=r, world=world) for r in range(world)]
    for sampler in ranks:
        sampler.start = lambda: start
    return [b.tolist() for step in zip(*(itertools.islice(iter(s), steps) for s in ranks), strict=True) for b in step]


def uninterrupted(world: int, start: tuple[int, int], batches: int, **kw) -> list[list[int]]:
    """The definition: each epoch's global order from ``start``, as many batches of it as ``world`` ranks
    can share evenly (the few left at its end are not trained), epoch after epoch; the first ``batches``."""
    whole = BucketBatchSampler(**kw)
    out: list[list[int]] = []
    epoch, done = start
    while len(out) < batches:
        order = [b.tolist() for b in whole.whole(epoch)]
        out += order[done : done + (len(order) - done) // world * world]
        epoch, done = epoch + 1, 0
    return out[:batches]


@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("steps", [0, 1, 3, 4, 7, 9, 13])
def test_a_resume_on_another_world_size_continues_the_global_order(before, after, steps):
    """An epoch of 9 batches; ``before`` ranks train ``steps`` steps, then ``after`` ranks resume at the
    global position: each phase trains exactly what an uninterrupted run of its ranks trains from where
    it starts (no batch twice, none of the global order skipped but the few at an epoch's end that its
    ranks cannot share), and the resumed run starts at the first batch no rank trained."""
    src, tgt = lengths(90, seed=4)
    kw = dict(src_lens=src, tgt_lens=tgt, batch_size=10, seed=3)
    count = BucketBatchSampler(**kw).batches_in_epoch
    assert count == 9
    first = stepped(before, (0, 0), steps, **kw)
    assert first == uninterrupted(before, (0, 0), steps * before, **kw)
    position = advance((0, 0), steps, count=count, world=before)
    then = stepped(after, position, 6, **kw)
    assert then == uninterrupted(after, position, 6 * after, **kw)
    if position[0] == 0:  # a stop in the first epoch: both phases together follow its global order
        rest = then[: (count - position[1]) // after * after]
        assert first + rest == uninterrupted(1, (0, 0), len(first) + len(rest), **kw)


def test_the_global_position_by_hand():
    """9 batches an epoch: two ranks take 8 (4 steps), three take 9 (3 steps), four take 8 (2 steps)."""
    assert advance((0, 0), 0, count=9, world=2) == (0, 0)
    assert advance((0, 0), 3, count=9, world=2) == (0, 6)
    assert advance((0, 0), 4, count=9, world=2) == (1, 0)  # the 9th batch is left: two ranks cannot share it
    assert advance((0, 0), 5, count=9, world=2) == (1, 2)
    assert advance((0, 6), 1, count=9, world=1) == (0, 7)
    assert advance((0, 6), 3, count=9, world=1) == (1, 0)
    assert advance((0, 7), 1, count=9, world=2) == (1, 0)  # 2 left: one step ends the epoch
    assert advance((0, 7), 2, count=9, world=2) == (1, 2)
    assert advance((0, 8), 1, count=9, world=2) == (1, 2)  # 1 left: not shared; the next epoch at once
    assert advance((0, 3), 10, count=9, world=3) == (3, 6)  # 2 steps to the epoch's end, 2 epochs, 2 steps
    assert advance((2, 0), 0, count=9, world=4) == (2, 0)
    with pytest.raises(ValueError, match="smaller than the number of processes"):
        advance((0, 0), 1, count=3, world=4)


def test_each_rank_takes_every_world_th_batch_from_the_position():
    assert share(9, 0, rank=0, world=2) == slice(0, 8, 2)
    assert share(9, 0, rank=1, world=2) == slice(1, 8, 2)
    assert share(9, 3, rank=1, world=2) == slice(4, 9, 2)
    assert share(9, 3, rank=0, world=1) == slice(3, 9, 1)
    assert share(9, 0, rank=1, world=2, even=False) == slice(1, 9, 2)  # validation: every batch, uneven
