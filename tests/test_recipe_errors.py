"""A corpus of broken recipes: every one must fail validation with a precise, positioned message.

Each ``tests/broken_recipes/*.yaml`` starts with one or more lines of the form::

    # expect: [<file>:]<line>:<col>: <dotted.path>: <substring of the message>

``<file>`` is optional and relative to the case file (for problems reported in a parent it
extends); without it the problem is expected in the case file itself. ``<dotted.path>`` may be
empty for file-level problems (``# expect: 1:1: : the recipe is empty``). Files under
``tests/broken_recipes/helpers/`` are parents used by the cases, not cases themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import tfbuilder
from tfbuilder.cli.commands import main

REPO = Path(__file__).resolve().parent.parent
CASES_DIR = REPO / "tests" / "broken_recipes"
CASES = sorted(CASES_DIR.glob("*.yaml"))
VANILLA = "recipes/vanilla.yaml"

# every line the CLI prints for a broken recipe: file:line:col: ...
PROBLEM_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): \S")
EXPECT = re.compile(
    r"^#\s*expect:\s*(?:(?P<file>[^\s:]*[^\s:\d][^\s:]*):)?(?P<line>\d+):(?P<col>\d+): (?P<rest>.*)$"
)


@dataclass(frozen=True)
class Expectation:
    file: str  # as the CLI prints it when run from the repository root
    line: int
    col: int
    dotted: str
    substring: str

    @property
    def prefix(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}: "
        return where + (f"{self.dotted}: " if self.dotted else "")

    def __str__(self) -> str:
        return f"{self.prefix}...{self.substring}..."


def _rel(path: Path) -> str:
    """A path as the CLI prints it from the repository root (relative, forward slashes)."""
    return Path(os.path.relpath(path, REPO)).as_posix()


def expectations(case: Path) -> list[Expectation]:
    found = []
    for text in case.read_text(encoding="utf-8").splitlines():
        if not text.startswith("#"):
            break
        if not re.match(r"^#\s*expect:", text):
            continue
        m = EXPECT.match(text)
        assert m, f"{_rel(case)}: malformed expectation line: {text!r}"
        file = _rel((case.parent / m["file"]).resolve()) if m["file"] else _rel(case)
        rest = m["rest"]
        if rest.startswith(": "):  # empty dotted path
            dotted, substring = "", rest[2:]
        else:
            dotted, sep, substring = rest.partition(": ")
            assert sep, f"{_rel(case)}: expectation needs '<dotted.path>: <substring>': {text!r}"
        assert substring.strip(), f"{_rel(case)}: expectation has an empty message substring: {text!r}"
        found.append(Expectation(file, int(m["line"]), int(m["col"]), dotted, substring.strip()))
    return found


@pytest.fixture
def at_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from the repository root so the CLI prints paths like tests/broken_recipes/x.yaml."""
    monkeypatch.chdir(REPO)
    return REPO


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30, f"only {len(CASES)} broken recipes in {CASES_DIR}"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case_declares_expectations(case: Path) -> None:
    first = case.read_text(encoding="utf-8").splitlines()[:1]
    assert first and first[0].startswith("# expect: "), f"{_rel(case)}: the first line must be '# expect: ...'"
    assert expectations(case)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_broken_recipe(case: Path, at_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _rel(case)
    rc = main(["validate", path])
    captured = capsys.readouterr()
    err = captured.err
    report = f"\n--- stderr of `tfbuilder validate {path}` ---\n{err}--- stdout ---\n{captured.out}"

    assert rc == 2, f"expected exit code 2, got {rc}{report}"
    assert "Traceback" not in err, report
    lines = err.splitlines()
    assert lines, f"no problem printed{report}"
    for text in lines:
        assert PROBLEM_LINE.match(text), f"not shaped file:line:col: ...: {text!r}{report}"
    assert f"{path}: OK" not in captured.out, report

    for exp in expectations(case):
        hits = [text for text in lines if text.startswith(exp.prefix) and exp.substring in text[len(exp.prefix) :]]
        assert hits, f"expected a line {exp}{report}"


# --- the API ---------------------------------------------------------------------------------


def test_load_recipe_raises_positioned_problems(at_repo: Path) -> None:
    path = "tests/broken_recipes/unknown_key_model.yaml"
    with pytest.raises(tfbuilder.RecipeError) as info:
        tfbuilder.load_recipe(path)
    problems = info.value.problems
    assert problems
    for p in problems:
        assert p.file == path
        assert isinstance(p.line, int) and p.line >= 1
        assert isinstance(p.col, int) and p.col >= 1
        assert p.path
    (p,) = problems
    assert (p.line, p.col, p.path) == (4, 3, "model.d_modle")
    assert "did you mean 'd_model'" in p.message
    assert str(p).startswith(f"{path}:4:3: model.d_modle: unknown key 'd_modle'")


def test_load_recipe_problem_in_parent_names_the_parent(at_repo: Path) -> None:
    with pytest.raises(tfbuilder.RecipeError) as info:
        tfbuilder.load_recipe("tests/broken_recipes/broken_parent_schema.yaml")
    (p,) = info.value.problems
    assert p.file == "tests/broken_recipes/helpers/parent_unknown_key.yaml"
    assert (p.line, p.col, p.path) == (4, 20, "model.ffn.hidden_size")


def test_recipe_error_lists_every_problem(at_repo: Path) -> None:
    with pytest.raises(tfbuilder.RecipeError) as info:
        tfbuilder.load_recipe("tests/broken_recipes/parallel_without_path.yaml")
    paths = {p.path for p in info.value.problems}
    assert {"data.path", "data.src_lang"} <= paths
    assert str(info.value).count("\n") == len(info.value.problems) - 1


def test_override_problem_is_labelled_with_the_override(at_repo: Path) -> None:
    with pytest.raises(tfbuilder.RecipeError) as info:
        tfbuilder.load_recipe(VANILLA, overrides=["model.encoder.layers=abc"])
    (p,) = info.value.problems
    assert p.file is not None and p.file.startswith("--set")
    assert p.file == "--set model.encoder.layers=abc"
    assert p.path == "model.encoder.layers"
    assert p.line == 1
    assert p.col == len("model.encoder.layers=") + 1  # where the value starts
    assert "valid integer" in p.message and "'abc'" in p.message


def test_override_problem_through_the_cli(at_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["validate", VANILLA, "--set", "model.attention.heads=0"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("--set model.attention.heads=0:1:23: model.attention.heads: "), err
    assert "greater than or equal to 1" in err


def test_vanilla_is_valid(at_repo: Path) -> None:
    """The corpus leans on recipes/vanilla.yaml: it must itself be valid."""
    recipe = tfbuilder.load_recipe(VANILLA)
    assert recipe.model.vocab_size == 37000


# --- the real console entry point ------------------------------------------------------------


def test_console_script_exits_2_without_traceback(at_repo: Path) -> None:
    bad = "tests/broken_recipes/unknown_param_attention.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "tfbuilder", "validate", bad],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and all(PROBLEM_LINE.match(text) for text in lines), proc.stderr
    assert any(
        text.startswith(f"{bad}:5:5: model.attention.head: ") and "did you mean 'heads'" in text for text in lines
    ), proc.stderr
