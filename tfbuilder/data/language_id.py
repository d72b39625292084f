"""A classification task made from a parallel corpus: which language is this sentence in?

From ``<stem>.<a>[.gz]`` and ``<stem>.<b>[.gz]`` (Multi30k's ``de`` and ``en``), each split becomes
``<out>/<split>.jsonl`` records ``{"text": ..., "label": "de"}``: sentence pair i gives its line in
language ``a`` when i is even and in ``b`` when odd, so the classes are balanced and no split holds a
sentence together with its translation (the content cannot give the language away).

    python -m tfbuilder.data.language_id /path/to/multi30k data/multi30k-langid
    tfbuilder fit recipes/tasks/multi30k-langid.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from pathlib import Path

from tfbuilder import atomic
from tfbuilder.data import text
from tfbuilder.errors import TfbuilderError

SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}  # Multi30k's file stems


def records(directory: Path, stem: str, langs: tuple[str, str], *, limit: int | None = None) -> list[dict]:
    """The language-identification records of one split (at most ``limit`` sentence pairs)."""
    pairs = text.parallel_lines(text.find(directory, stem, langs[0]), text.find(directory, stem, langs[1]))
    out = []
    for i, pair in enumerate(islice(pairs, limit)):
        out.append({"text": pair[i % 2], "label": langs[i % 2]})
    return out


def write(
    directory: str | Path,
    out: str | Path,
    *,
    langs: tuple[str, str] = ("de", "en"),
    splits: dict[str, str] = SPLITS,
    limit: int | None = None,
) -> dict[str, int]:
    """Write ``<out>/<split>.jsonl`` for each split; returns the records per split. Existing files
    are never replaced."""
    directory, out = Path(directory), Path(out)
    made = {
        name: records(directory, stem, langs, limit=limit) for name, stem in splits.items()
    }  # all read before anything is written
    taken = [out / f"{name}.jsonl" for name in made if (out / f"{name}.jsonl").exists()]
    if taken:
        raise TfbuilderError(f"{taken[0]} exists: not overwriting it; choose another output folder")
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in made.items():
        target = out / f"{name}.jsonl"
        if (
            atomic.write_new_text(
                target, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), what="records"
            )
            is None
        ):
            raise TfbuilderError(f"{target} exists: not overwriting it; choose another output folder")
    return {name: len(rows) for name, rows in made.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tfbuilder.data.language_id", description=__doc__.splitlines()[0])
    p.add_argument("corpus", help="folder of the parallel text (Multi30k: train.de.gz, train.en.gz, ...)")
    p.add_argument("out", help="folder for train.jsonl, val.jsonl, test.jsonl (files there are never replaced)")
    p.add_argument(
        "--langs", nargs=2, default=["de", "en"], metavar=("A", "B"), help="the two language suffixes (default de en)"
    )
    p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N sentence pairs per split")
    args = p.parse_args(argv)
    try:
        counts = write(args.corpus, args.out, langs=tuple(args.langs), limit=args.limit)
    except TfbuilderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(", ".join(f"{name}: {n:,} records" for name, n in counts.items()) + f" in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
