"""Packing documents into blocks (tfbuilder/data/packing.py), the document mask, and the vectorised
batch cutter (tfbuilder/data/batching.cut), each against a plain reference written from the definition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tfbuilder
from conftest import ROOT, text_folder
from tfbuilder import masks
from tfbuilder.data.batching import cut
from tfbuilder.data.packing import Packed, packed_splits, segments
from tfbuilder.data import text
from tfbuilder.data.prepare import prepare
from tfbuilder.data.tokenizers import EOS
from tfbuilder.data.tokens import TokenArray


def random_docs(seed: int, n: int = 40, longest: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 100, rng.integers(1, longest)).tolist() for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window,stride", [(9, 8), (8, 8), (33, 32), (2, 1)])
def test_blocks_are_windows_of_the_documents_joined_by_eos(seed, window, stride):
    docs = random_docs(seed)
    stream = [t for doc in docs for t in doc + [EOS]]  # the definition: every document, then </s>
    packed = Packed(TokenArray.from_rows(docs), window=window, stride=stride)
    expected = [stream[i : i + window] for i in range(0, len(stream) - window + 1, stride)]
    assert [packed[i].tolist() for i in range(len(packed))] == expected
    assert list(packed.lengths) == [window] * len(expected)


def test_a_document_longer_than_the_block_is_spread_over_blocks_not_dropped():
    docs = [list(range(5, 105)), [7, 8]]
    packed = Packed(TokenArray.from_rows(docs), window=11, stride=10)
    seen = [t for i in range(len(packed)) for t in packed[i][:-1].tolist()]  # each block predicts its last token from the rest
    assert seen[:100] == docs[0] and len(packed) == (100 + 1 + 2 + 1 - 11) // 10 + 1


def test_segments_start_a_new_document_at_each_eos():
    tokens = torch.tensor([[5, 6, EOS, 7, 8, EOS, 9]])
    assert segments(tokens).tolist() == [[0, 0, 1, 1, 1, 2, 2]]
    mask = masks.document_mask(segments(tokens))[0, 0]
    assert mask[4].tolist() == [False, False, True, True, True, False, False]


def test_with_the_document_mask_a_document_does_not_see_the_one_before():
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "decoder-lm.yaml", ["model.d_model=32", "model.attention.heads=2", "model.decoder.layers=2", "model.dropout=0.0"])
    model = tfbuilder.build_model(recipe).eval()
    a = torch.tensor([[5, 6, 7, EOS, 10, 11, 12]])
    b = torch.tensor([[9, 8, 20, EOS, 10, 11, 12]])  # the first document differs
    with torch.no_grad():
        masked = [model.features(x, segments=segments(x)) for x in (a, b)]
        plain = [model.features(x) for x in (a, b)]
    assert torch.allclose(masked[0][:, 3:], masked[1][:, 3:], atol=1e-6)  # </s> and the second document: the same
    assert not torch.allclose(plain[0][:, 3:], plain[1][:, 3:], atol=1e-6)  # without the mask they see the first


def reference_cut(src, tgt, order, max_tokens, extra):
    """The greedy definition, one example at a time."""
    bounds, count, longest_s, longest_t = [0], 0, 0, 0
    for k, i in enumerate(order):
        s, t = src[i] + extra[0], tgt[i] + extra[1]
        if count and ((count + 1) * max(longest_s, s) > max_tokens or (count + 1) * max(longest_t, t) > max_tokens):
            bounds.append(k)
            count, longest_s, longest_t = 0, 0, 0
        count, longest_s, longest_t = count + 1, max(longest_s, s), max(longest_t, t)
    bounds.append(len(order))
    return bounds


@pytest.mark.parametrize("seed", range(8))
def test_the_vectorised_cut_equals_the_greedy_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    src = rng.integers(0, 80, n).astype(np.uint32)
    tgt = rng.integers(0, 90, n).astype(np.uint32)
    order = rng.permutation(n)
    if seed % 2:
        order = order[np.lexsort((tgt[order], src[order]))]  # sorted, as the sampler does
    budget = int(rng.choice([50, 300, 1000, 5000]))
    extra = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    got = cut(src, tgt, order, max_tokens=budget, batch_size=None, extra=extra).tolist()
    assert got == reference_cut(src.tolist(), tgt.tolist(), order.tolist(), budget, extra)


def test_a_packed_language_model_trains_on_documents_longer_than_its_block(tmp_path, monkeypatch):
    from tfbuilder.train.fit import fit

    monkeypatch.setenv("TFBUILDER_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat and then it ran far away to the big red house".split()
    documents = [" ".join(rng.choice(words, 60)) for _ in range(60)]  # each about 3x the block
    for split, docs in (("train", documents[:50]), ("val", documents[50:55]), ("test", documents[55:])):
        # Blank-line separated documents, each over several lines.
        (folder / f"{split}.en").write_text("\n\n".join(d[:100] + "\n" + d[100:] for d in docs) + "\n", encoding="utf-8")
    overrides = [
        "model.d_model=32", "model.attention.heads=2", "model.decoder.layers=1",
        *text_folder(folder), "data.documents=paragraphs", "data.packing=true", "data.block_size=32",
        "data.document_mask=true", "data.tokenizer.type=char", "data.tokenizer.vocab_size=25", "data.max_len=16",
        "data.max_tokens=null", "data.batch_size=4", "trainer.max_steps=3", "trainer.val_every=3",
        "trainer.progress=false", f"trainer.output={tmp_path / 'runs'}",
    ]
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "decoder-lm.yaml", overrides)
    prepared = prepare(recipe.data)
    train = prepared.splits["train"]
    assert len(train) == 50 and train.dropped == 0  # no document dropped although each is longer than max_len
    assert int(train.src.lengths.min()) > 3 * 32
    summary = fit(recipe)
    assert summary.steps == 3 and summary.best_val_loss is not None


@pytest.mark.parametrize("seed", range(4))
def test_sorting_by_length_equals_a_stable_sort_on_the_pair(seed):
    from tfbuilder.data.batching import by_length

    rng = np.random.default_rng(seed)
    n = 5000
    src = rng.integers(0, 70_000 if seed == 3 else 60, n).astype(np.uint32)  # 16-bit radix keys, and wider ones
    tgt = rng.integers(0, 60, n).astype(np.uint32)
    order = rng.permutation(n).astype(np.int32)
    expected = sorted(order.tolist(), key=lambda i: (src[i], tgt[i]))  # Python's sort is stable
    assert by_length(order, src, tgt).tolist() == expected


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "masked"])
def test_packing_the_stored_documents_gives_the_blocks_of_packing_them_in_memory(tmp_path, causal):
    """The prepared store on disk, packed, against the same documents tokenized and held in memory,
    for every split; each split's last document is longer than a block, so a stored split that lost
    its last document (its end offset) would give fewer blocks."""
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(1)
    words = "the cat sat on a mat and then it ran far away to the big red house".split()
    for split, n in (("train", 40), ("val", 7), ("test", 5)):
        docs = [" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(n - 1)]
        docs.append(" ".join(rng.choice(words, 30)))  # about 100 characters: over four blocks of 24
        (folder / f"{split}.en").write_text("\n".join(docs) + "\n", encoding="utf-8")
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "decoder-lm.yaml", [
        *text_folder(folder), f"data.cache={tmp_path / 'cache'}", "data.splits.test=test", "data.packing=true", "data.block_size=24",
        "data.tokenizer.type=char", "data.tokenizer.vocab_size=24", "data.max_len=16",
    ])
    prepared = prepare(recipe.data)
    assert prepared.store is not None and set(prepared.splits) == {"train", "val", "test"}
    packed = packed_splits(prepared.splits, recipe.data, causal=causal)
    for split in ("train", "val", "test"):
        documents = [prepared.vocab.src.encode(line) for line in text.read_lines(folder / f"{split}.en")]
        assert prepared.splits[split].src.tolist() == documents  # the store holds them all
        in_memory = Packed(TokenArray.from_rows(documents), window=24 + int(causal), stride=24)
        stored = packed[split].src
        assert len(stored) == len(in_memory) > 0, split
        assert [stored[i].tolist() for i in range(len(stored))] == [in_memory[i].tolist() for i in range(len(in_memory))], split
        assert list(stored.lengths) == list(in_memory.lengths)
