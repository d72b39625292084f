"""Labelled data, settled for a run: each prepared split gets its label array (class ids or numbers),
and the recipe records the label mapping (``model.head.labels``), so the checkpoint carries it.

Above :mod:`~tfbuilder.data.prepare` (it takes a :class:`~tfbuilder.data.prepare.Prepared`), which
writes the labels through :mod:`~tfbuilder.data.labels`.
"""

from __future__ import annotations

import numpy as np

from tfbuilder.data.labels import class_ids, names_of, numbers, positions, read
from tfbuilder.data.prepare import Prepared
from tfbuilder.errors import DataError
from tfbuilder.model.sizing import max_positions
from tfbuilder.spec.recipe import Recipe, recipe_from_dict


def settle(recipe: Recipe, prepared: Prepared) -> Recipe:
    """Give every prepared split of labelled data its label array, and return the recipe with its
    mapping recorded (``model.head.labels``); other recipes are returned as they are."""
    head = recipe.model.head
    if head is None or recipe.data is None or recipe.data.type != "labelled":
        return recipe
    if prepared.store is None:
        raise DataError("labelled data is prepared into a store (data.path)")
    read_back = {name: read(prepared.store, name) for name in prepared.splits}
    names = None
    if head.type == "classify":
        for file, records, values in read_back.values():
            blank = next((i for i, v in enumerate(values) if not v.strip()), None)
            if blank is not None:
                raise DataError(f"{file}: record {records[blank]}: the label is empty")
        file, _, values = read_back["train"]
        names = head.labels or names_of(values, head.outputs, file)
    for name, split in prepared.splits.items():
        file, records, values = read_back[name]
        if len(values) != len(split):
            raise DataError(
                f"the prepared data in {prepared.store} is damaged "
                f"({name}: {len(values)} labels for {len(split)} examples)"
            )
        split.labels = numbers(values, records, file) if names is None else class_ids(values, records, names, file)
    check_positions(recipe, prepared)
    if names is None or head.labels == names:
        return recipe
    data = recipe.to_dict()
    data["model"]["head"]["labels"] = names
    settled = recipe_from_dict(data)
    settled._source, settled._path = recipe._source, recipe._path  # errors still point at the file
    return settled


def check_positions(recipe: Recipe, prepared: Prepared) -> None:
    limit = max_positions(recipe.model)
    if limit is None:
        return
    for name, split in prepared.splits.items():
        over = np.flatnonzero(positions(split) > limit)
        if len(over):
            index = int(over[0])
            raise DataError(
                f"the {name} split's example {index + 1:,} takes {int(positions(split)[index]):,} positions "
                f"with its special tokens, more than the {limit:,} the model covers (model.position.max_len); "
                "raise it or shorten the data"
            )
