"""Synthetic sequence tasks (copy, reverse, sort), generated deterministically from a seed: no files needed."""

from __future__ import annotations

import random

from tfbuilder.spec.sections import SYNTHETIC_ALPHABET

TASKS = {
    "copy": lambda s: s,
    "reverse": lambda s: s[::-1],
    "sort": lambda s: "".join(sorted(s)),
}


def generate(task: str, *, n: int, symbols: int, lengths: tuple[int, int], seed: int) -> tuple[list[str], list[str]]:
    """``n`` (source, target) string pairs over the first ``symbols`` letters of the alphabet."""
    rng = random.Random(seed)
    alphabet = SYNTHETIC_ALPHABET[:symbols]
    sources = ["".join(rng.choice(alphabet) for _ in range(rng.randint(*lengths))) for _ in range(n)]
    return sources, [TASKS[task](s) for s in sources]


def alphabet(symbols: int) -> str:
    return SYNTHETIC_ALPHABET[:symbols]
