"""Hostile command lines and inputs outside recipes and stores: counts that would run for ever, long
lines, files that are not files. Each is refused with exit 2 naming the argument, file or line, or
done within the bounds of tests/hostile.py."""

from __future__ import annotations

import pytest

from conftest import ROOT
from hostile import assert_refused, run_cli
from tfbuilder.cli.arguments import MAX_ARGUMENT, MAX_BEAM, MAX_SEEDS


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sweep", "recipes/quickstart.yaml", "--seeds", "1000000000", "--dry-run"], f"between 1 and {MAX_SEEDS:,}"),
        (["sweep", "recipes/quickstart.yaml", "--seeds", str(MAX_SEEDS + 1), "--dry-run"], "argument --seeds"),
        (["translate", "runs/none", "--beam", str(MAX_BEAM + 1)], "argument --beam"),
        (["translate", "runs/none", "--nbest", "1000000000"], "argument --nbest"),
        (["translate", "runs/none", "--max-tokens", str(MAX_ARGUMENT + 1)], "argument --max-tokens"),
        (["compare", "runs/none", "--beam", "100000000000000000000"], "argument --beam"),
    ],
)
def test_counts_on_the_command_line_are_bounded(args, expected, capsys):
    assert_refused(run_cli(args, capsys, cwd=ROOT), expected)
