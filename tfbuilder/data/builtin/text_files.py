"""The ``text`` format: ``<stem>.<lang>[.gz]``, a file per language, one example per line (or one
document per blank-line-separated block, ``data.documents: paragraphs``)."""

from __future__ import annotations

from pathlib import Path

from tfbuilder.data import text
from tfbuilder.data.readers import Say, SplitSource, add_format
from tfbuilder.errors import DataError
from tfbuilder.spec.formats import FormatTraits
from tfbuilder.spec.sections import DataSection


def text_splits(data: DataSection, stems: dict[str, str], say: Say) -> dict[str, SplitSource]:
    """A split per stem: ``<stem>.<src_lang>`` and ``<stem>.<tgt_lang>`` aligned line by line, or ``<stem>.<lang>``."""
    directory = Path(data.path or ".")
    langs = (data.src_lang, data.tgt_lang) if data.type == "parallel" else (data.lang,)
    named = tuple(lang for lang in langs if lang is not None)
    if len(named) != len(langs):  # the schema requires them; a section built without validation gets this
        raise DataError(f"{data.type} text data needs {'src_lang and tgt_lang' if len(langs) == 2 else 'lang'}")
    out: dict[str, SplitSource] = {}
    for name, stem in stems.items():
        if name == "test" and not any(text.exists(directory, stem, lang) for lang in named):
            continue  # a test split is optional for training
        paths = tuple(text.find(directory, stem, lang) for lang in named)
        out[name] = _split(data, name, paths)
    return out


def _split(data: DataSection, name: str, paths: tuple[Path, ...]) -> SplitSource:
    if len(paths) == 2:
        return SplitSource(name, paths, lambda: text.parallel_lines(*paths), paired=True)
    read = text.paragraphs if data.documents == "paragraphs" else text.lines
    return SplitSource(name, paths, lambda: ((line, None) for line in read(paths[0])), paired=False)


add_format(
    FormatTraits(
        "text",
        "<stem>.<lang>[.gz]: one example per line (data.src_lang and data.tgt_lang, or data.lang, name the files)",
        languages=True,
        source=__name__,
    ),
    text_splits,
)
