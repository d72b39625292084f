"""The data formats a recipe may name (``data.format``): each format's name and traits, as registered.

The schema cannot import the data layer (it sits below it), yet it must know which formats exist and
what each asks of a recipe. So a format's traits live here, and the data layer's registration
(:func:`tfbuilder.data.readers.register_format`) declares them when it registers the format's reader:
a format is one code file, whether it is built in or comes from a plugin. tfbuilder's own formats are
imported by name the first time a format is asked for, as :mod:`tfbuilder.registry` imports its own
components; installed entry points (group ``tfbuilder.components``) and ``--plugins`` files may
register more.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic_core import CoreSchema, PydanticCustomError

from tfbuilder import registry
from tfbuilder.errors import did_you_mean

# tfbuilder's own formats, in the order messages list them (each module registers its formats on import).
_BUILTIN_MODULES = (
    "tfbuilder.data.builtin.text_files",
    "tfbuilder.data.builtin.records",
    "tfbuilder.data.builtin.parquet",
    "tfbuilder.data.builtin.hf_datasets",
)


@dataclass(frozen=True)
class FormatTraits:
    """What a format asks of a recipe, for the schema's checks and messages."""

    name: str
    description: str  # one line for docs and listings: the files a split is read from
    columns: bool = False  # rows are records whose fields data.columns names (else rows are the texts themselves)
    languages: bool = False  # a file per language, <stem>.<lang> (data.src_lang, data.tgt_lang, data.lang)
    hub: bool = False  # may read a dataset on the Hugging Face Hub (data.hub) instead of data.path
    suffixes: tuple[str, ...] = ()  # file suffixes of its files (".jsonl"): how predict knows an input file
    source: str = ""  # the module that registered it
    plugin: str | None = None  # the --plugins file or module that registered it (tfbuilder.plugins)


_formats: dict[str, FormatTraits] = {}
_loaded = False


def load() -> None:
    """Register tfbuilder's own formats and the installed plugins' (entry points), once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    registry.load()  # an installed plugin may register formats as well as components


def declare(traits: FormatTraits) -> None:
    """Add a format's traits (the data layer's registration calls this; see the module docstring)."""
    load()  # tfbuilder's own first: messages list them before any plugin's
    existing = _formats.get(traits.name)
    if existing is not None:
        raise registry.RegistryError(f"data format '{traits.name}' is already registered by {existing.source}")
    _formats[traits.name] = replace(traits, plugin=registry._plugin)  # what a --plugins file registers is its


def forget(name: str) -> None:
    """Remove a format's traits (for tests and interactive work; the data layer's unregister calls this)."""
    del _formats[name]


def names() -> list[str]:
    """The registered format names, tfbuilder's own first, in registration order."""
    load()
    return list(_formats)


def get(name: str) -> FormatTraits:
    load()
    return _formats[name]


def choices(*, columns: bool | None = None, hub: bool | None = None) -> str:
    """The names of the formats with the given traits, for a message: ``jsonl, csv, tsv, parquet or datasets``."""
    load()
    picked = [
        t.name for t in _formats.values() if (columns is None or t.columns == columns) and (hub is None or t.hub == hub)
    ]
    return ", ".join(picked[:-1]) + " or " + picked[-1] if len(picked) > 1 else "".join(picked)


def _known(value: str) -> str:
    if value not in names():
        raise PydanticCustomError("data_format", "unknown format{hint}", {"hint": did_you_mean(value, names())})
    return value


class _RegisteredNames:
    """The JSON Schema of a format name: one of the formats registered when the schema is made."""

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        schema = handler(core_schema)
        schema["enum"] = names()
        return schema


FormatName = Annotated[str, AfterValidator(_known), _RegisteredNames()]
"""A ``data.format`` value: a registered format's name; an unknown one gets a did-you-mean."""

__all__ = ["FormatName", "FormatTraits", "choices", "declare", "forget", "get", "load", "names"]
