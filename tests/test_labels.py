"""Labelled data: labels read from records, the label mapping settled per run and recorded, unknown
labels named by file and record, pairs collated with token types (tfbuilder/data/labels.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tfbuilder.data.collate import Collate, labelled
from tfbuilder.data.settle import settle
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import DataError
from tfbuilder.spec.recipe import recipe_from_dict

MODEL = {"kind": "encoder", "d_model": 16, "attention": {"type": "multihead", "heads": 2}, "ffn": {"type": "mlp", "hidden": 32}, "encoder": {"layers": 1}}


def jsonl(folder: Path, split: str, records: list[dict]) -> None:
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def recipe(folder: Path, head: dict, *, columns: dict | None = None, fmt: str = "jsonl"):
    data = {
        "type": "labelled", "format": fmt, "path": str(folder), "cache": str(folder / "cache"),
        "columns": columns or {"text": "text", "label": "label"}, "tokenizer": {"type": "char", "vocab_size": 8},
    }
    return recipe_from_dict({"model": {**MODEL, "head": head}, "data": data})


def settled(folder: Path, head: dict, **options):
    r = recipe(folder, head, **options)
    prepared = prepare(r.data, model_vocab=r.model.vocab_size, say=lambda line: None)
    return settle(r, prepared), prepared


TRAIN = [{"text": "abc", "label": "pos"}, {"text": "cab", "label": "neg"}, {"text": "", "label": "odd"}, {"text": "bca", "label": "pos"}]


def test_names_come_from_the_training_split_sorted_and_are_recorded_in_the_recipe(tmp_path):
    jsonl(tmp_path, "train", TRAIN)
    jsonl(tmp_path, "val", [{"text": "ab", "label": "neg"}])
    r, prepared = settled(tmp_path, {"type": "classify", "classes": 2})
    # The empty text (and its label 'odd') is left out, as empty examples always are.
    assert r.model.head.labels == ["neg", "pos"] and r.to_dict()["model"]["head"]["labels"] == ["neg", "pos"]
    assert prepared.splits["train"].labels.tolist() == [1, 0, 1]
    assert prepared.splits["val"].labels.tolist() == [0]


def test_labels_given_in_the_recipe_fix_the_order(tmp_path):
    jsonl(tmp_path, "train", TRAIN[:2])
    jsonl(tmp_path, "val", TRAIN[:2])
    r, prepared = settled(tmp_path, {"type": "classify", "labels": ["pos", "neg", "maybe"]})
    assert prepared.splits["train"].labels.tolist() == [0, 1] and r.model.head.labels == ["pos", "neg", "maybe"]


def test_integer_labels_are_class_ids(tmp_path):
    jsonl(tmp_path, "train", [{"text": "abc", "label": 2}, {"text": "cab", "label": "0"}])
    jsonl(tmp_path, "val", [{"text": "ab", "label": 1}])
    r, prepared = settled(tmp_path, {"type": "classify", "classes": 3})
    assert r.model.head.labels == ["0", "1", "2"]
    assert prepared.splits["train"].labels.tolist() == [2, 0] and prepared.splits["val"].labels.tolist() == [1]


@pytest.mark.parametrize(
    "train, val, head, message",
    [
        (TRAIN, [{"text": "ab", "label": "pos"}, {"text": "ba", "label": "meh"}], {"type": "classify", "classes": 2},
         "val.jsonl: record 2: label 'meh' is not one of the model's labels ('neg', 'pos')"),
        (TRAIN[:2], TRAIN[:1], {"type": "classify", "classes": 3}, "train.jsonl: the training split has 2 labels ('neg', 'pos'), but model.head.classes is 3"),
        ([{"text": "abc", "label": 5}], TRAIN[:1], {"type": "classify", "classes": 3}, "train.jsonl: integer labels are class ids 0..2"),
        ([{"text": "abc", "label": 0.5}], [{"text": "ab", "label": "high"}], {"type": "regress"}, "val.jsonl: record 1: label 'high' is not a finite number"),
        ([{"text": "abc", "label": None}], TRAIN[:1], {"type": "regress"}, "train.jsonl:1: field 'label' is null, not text"),
        (TRAIN, [{"text": "ab", "label": "pos"}, {"text": "ab", "label": " "}], {"type": "classify", "classes": 2}, "val.jsonl: record 2: the label is empty"),
    ],
)
def test_bad_labels_are_named_by_file_and_record(tmp_path, train, val, head, message):
    jsonl(tmp_path, "train", train)
    jsonl(tmp_path, "val", val)
    with pytest.raises(DataError, match=re.escape(message)):
        settled(tmp_path, head)


def test_regression_targets_are_numbers(tmp_path):
    jsonl(tmp_path, "train", [{"text": "abc", "label": 0.25}, {"text": "cab", "label": "-3"}, {"text": "b", "label": True}])
    jsonl(tmp_path, "val", [{"text": "ab", "label": 1}])
    with pytest.raises(DataError, match="record 3: label 'true' is not a finite number"):
        settled(tmp_path, {"type": "regress"})
    jsonl(tmp_path, "train", [{"text": "abc", "label": 0.25}, {"text": "cab", "label": "-3"}])
    _, prepared = settled(tmp_path, {"type": "regress"})
    assert prepared.splits["train"].labels.tolist() == [0.25, -3.0]


def test_pairs_in_csv_are_collated_with_token_types(tmp_path):
    rows = "premise,hypothesis,label\nab,c,yes\n\"b,a\",cab,no\n"
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "val.csv").write_text(rows)
    r, prepared = settled(tmp_path, {"type": "classify", "classes": 2}, fmt="csv", columns={"text": "premise", "text_pair": "hypothesis", "label": "label"})
    batch = Collate(prepared.splits["train"])([0, 1])
    # <s> a b </s> c </s> <pad> <pad> and <s> b , a </s> c a b </s>: types 1 over the pair and its </s>.
    assert batch["tokens"][:, 0].tolist() == [1, 1] and (batch["tokens"] == 2).sum(dim=1).tolist() == [2, 2]
    assert batch["token_types"].tolist() == [[0, 0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [1, 0]  # sorted names: no, yes


def test_a_single_text_has_type_zero_everywhere():
    batch = labelled([np.array([7, 8]), np.array([9])])
    assert batch["tokens"].tolist() == [[1, 7, 8, 2], [1, 9, 2, 0]]
    assert batch["token_types"].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]


def test_parquet_labels_may_be_integers_or_numbers(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for split in ("train", "val"):
        table = pa.table({"text": ["abc", "cab", "bca"], "label": [1, 0, 1], "score": [0.5, -1.0, 2.0]})
        pq.write_table(table, tmp_path / f"{split}.parquet")
    _, prepared = settled(tmp_path, {"type": "classify", "classes": 2}, fmt="parquet")
    assert prepared.splits["train"].labels.tolist() == [1, 0, 1]
    _, prepared = settled(tmp_path, {"type": "regress"}, fmt="parquet", columns={"text": "text", "label": "score"})
    assert prepared.splits["val"].labels.tolist() == [0.5, -1.0, 2.0]
