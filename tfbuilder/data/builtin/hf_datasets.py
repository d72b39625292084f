"""The ``datasets`` format: a Hugging Face dataset, the folder ``DatasetDict.save_to_disk`` wrote
(``data.path``) or a dataset on the Hub (``data.hub``, through ``datasets.load_dataset``), its splits
named by ``data.splits`` (:mod:`tfbuilder.data.arrow`; needs the optional package datasets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfbuilder.data import arrow
from tfbuilder.data.readers import Say, SplitSource, add_format, as_rows, fields_of, is_paired, numbers_of
from tfbuilder.spec.formats import FormatTraits
from tfbuilder.spec.sections import DataSection

KEYS = {"train": "data.splits.train", "val": "data.splits.val", "test": "data.splits.test"}


def dataset_splits(data: DataSection, stems: dict[str, str], say: Say) -> dict[str, SplitSource]:
    """The splits of the dataset. Loading maps its Arrow files; rows are read when asked for."""
    hub = data.hub
    loaded = None
    label = ""
    if hub is not None:
        label = arrow.hub_label(hub.name, hub.config, hub.revision)
        say(f"data: loading {label} with datasets.load_dataset (downloaded once into the Hugging Face cache)")
        loaded = arrow.load_hub(hub.name, hub.config, hub.revision)
    out: dict[str, SplitSource] = {}
    for name, split in stems.items():
        if loaded is not None:
            if name == "test" and split not in loaded:
                continue
            dataset = arrow.hub_split(loaded, split, label, KEYS[name])
            where = f"the {split} split of {label}"
        else:
            folder = Path(data.path or ".")
            if name == "test" and not (folder / split).is_dir():
                continue
            dataset = arrow.load_saved(folder, split, KEYS[name])
            where = f"{folder / split}"
        out[name] = _split(data, name, dataset, where)
    return out


def _split(data: DataSection, name: str, dataset: Any, where: str) -> SplitSource:
    fields, paired, labelled = fields_of(data), is_paired(data), data.type == "labelled"
    read = arrow.dataset_rows(dataset, fields, where, numbers=numbers_of(data, fields))
    return SplitSource(
        name,
        arrow.dataset_files(dataset),
        as_rows(read, paired, labelled),
        paired=paired,
        label=where,
        fingerprint=getattr(dataset, "_fingerprint", None),  # datasets' own content hash (no public accessor)
        labelled=labelled,
    )


add_format(
    FormatTraits(
        "datasets",
        "a Hugging Face dataset: a save_to_disk folder in data.path, or data.hub; data.splits names its splits",
        columns=True,
        hub=True,
        source=__name__,
    ),
    dataset_splits,
)
