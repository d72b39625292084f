"""tfbuilder diff: resolved differences, key by key."""

from __future__ import annotations

import pytest

import tfbuilder
from conftest import ROOT
from test_recipes import TABLE3
from tfbuilder.cli.commands import main
from tfbuilder.spec.diffing import MISSING, differences


@pytest.mark.parametrize("row", sorted(TABLE3))
def test_diff_of_a_table3_row_shows_exactly_the_keys_it_changes(row, capsys):
    vanilla = ROOT / "recipes" / "vanilla.yaml"
    rowfile = ROOT / "recipes" / "table3" / f"{row}.yaml"
    rows = differences(tfbuilder.load_recipe(vanilla), tfbuilder.load_recipe(rowfile))
    assert {k: (None if b is MISSING else b) for k, _, b in rows} == TABLE3[row]
    assert main(["diff", str(vanilla), str(rowfile)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[2:]] == sorted(TABLE3[row])


def test_identical_recipes_and_bad_ones(tmp_path, capsys):
    vanilla = str(ROOT / "recipes" / "vanilla.yaml")
    assert main(["diff", vanilla, vanilla]) == 0
    assert capsys.readouterr().out.strip() == "no differences"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_modle: 3}\n")
    assert main(["diff", vanilla, str(bad)]) == 2
    assert "did you mean 'd_model'" in capsys.readouterr().err
