"""Each fact the package relies on is defined once: a second definition is found here before it can
drift from the first (scans of the package's source, plus checks that the users agree with the one
definition)."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
from pathlib import Path

import pytest

import tfbuilder
from tfbuilder import contracts, specials
from tfbuilder.runs import checkpoints as runs
from tfbuilder.spec import sections

PACKAGE = Path(tfbuilder.__file__).parent
ROOT = PACKAGE.parent


def sources(*, skip_data: bool = True) -> list[tuple[Path, str]]:
    """The package's modules (the data layer, owned by the prepared store, is checked separately)."""
    return [
        (p.relative_to(PACKAGE), p.read_text(encoding="utf-8"))
        for p in sorted(PACKAGE.rglob("*.py"))
        if not (skip_data and p.relative_to(PACKAGE).parts[0] == "data")
    ]


@functools.cache
def parsed(text: str) -> ast.Module:
    """A module's syntax tree, parsed once for all the scans below (which only read it)."""
    return ast.parse(text)


@functools.cache
def code_lines(text: str) -> tuple[tuple[int, str], ...]:
    """Lines without their comments and docstrings' prose (a formula quoted in a docstring is fine)."""
    tree = parsed(text)
    prose = {
        n
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for n in range(node.lineno, node.end_lineno + 1)
    }
    # Prose in strings (a params description saying "default 4 * d_model") is not a definition.
    return tuple((i, PROSE.sub('""', line.split("#", 1)[0])) for i, line in enumerate(text.splitlines(), start=1) if i not in prose)


PROSE = re.compile(r'f?"[^"]*\s[^"]*"|f?'"'[^']*\\s[^']*'")


def where(pattern: str, *, allowed: set[str]) -> list[str]:
    found = []
    for rel, text in sources():
        for number, line in code_lines(text):
            # A family's own default is marked on its line or in a comment up to three lines above.
            marked = any("transformers' own default" in above for above in text.splitlines()[max(number - 4, 0) : number])
            if re.search(pattern, line) and str(rel) not in allowed and not marked:
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


# --- the special tokens ------------------------------------------------------------------------


def test_the_special_tokens_are_defined_once():
    assigned = []
    for rel, text in sources(skip_data=False):
        for node in ast.walk(parsed(text)):
            if isinstance(node, ast.Assign):
                names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                if {"SPECIAL_TOKENS", "PAD", "BOS", "EOS", "UNK", "MASK"} & set(names):
                    assigned.append(str(rel))
    assert assigned == ["specials.py", "specials.py"]
    assert sections.SPECIAL_TOKENS is specials.SPECIAL_TOKENS
    assert specials.COUNT == len(specials.SPECIAL_TOKENS) == 5
    assert specials.OWN.pad == specials.PAD == specials.SPECIAL_TOKENS.index("<pad>")


def test_tokenizers_put_the_specials_at_their_ids():
    from tfbuilder.data.tokenizers import BPETokenizer, CharTokenizer

    bpe = BPETokenizer.train(["a cat sat on the mat"] * 20, vocab_size=270)
    added = json.loads(json.loads(bpe.to_json())["tokenizer"])["added_tokens"]
    assert [(t["id"], t["content"]) for t in added] == list(enumerate(specials.SPECIAL_TOKENS))
    char = CharTokenizer.train(["abc"], vocab_size=specials.COUNT + 3)
    assert char.encode("a") == [specials.COUNT]  # ordinary tokens start after the specials


def test_no_literal_stands_for_the_number_of_specials():
    """`5 + symbols`, a vocabulary of 15 or 16 as a placeholder: each written from specials.COUNT."""
    from tfbuilder.spec.recipe import _vocab_hint

    assert _vocab_hint({}) == specials.COUNT + sections.DataSection.model_fields["symbols"].default
    assert where(r"\b5 \+|\+ 5\b|len\(SPECIAL_TOKENS\)", allowed={"specials.py"}) == []


# --- default widths ----------------------------------------------------------------------------


def test_default_widths_are_written_once():
    """d_model // heads and 4 * d_model: only in contracts.py (a Hugging Face family's own default is
    marked as such where the converter reads it)."""
    assert where(r"\b4 \* (ctx\.|m\.|self\.)?d(_model)?\b", allowed={"contracts.py"}) == []
    assert where(r"d(_model)? // (h|heads|att\.heads|att\[\"heads\"\]|self\.heads|max\(ctx\.heads, 1\))\b", allowed={"contracts.py"}) == []
    assert contracts.default_ffn_hidden(512) == 2048 and contracts.default_head_dim(512, 8) == 64


# --- checkpoints, scores, recipe differences ---------------------------------------------------


def test_best_else_last_is_chosen_in_one_place(tmp_path):
    """Only runs.default_checkpoint falls back from best.ckpt to last.ckpt; sweeps and commands call it."""
    fallback = [
        f"{rel}:{node.lineno}"
        for rel, text in sources()
        for node in ast.walk(parsed(text))
        if isinstance(node, ast.IfExp) and "best" in ast.unparse(node.test) and "last" in ast.unparse(node.orelse)
    ]
    assert [f.split(":")[0] for f in fallback] == ["runs/checkpoints.py"], fallback
    (tmp_path / "checkpoints").mkdir()
    assert runs.default_checkpoint(tmp_path).name == "last.ckpt"
    (tmp_path / "checkpoints" / "best.ckpt").write_bytes(b"")
    assert runs.default_checkpoint(tmp_path).name == "best.ckpt"


def test_scores_have_one_writer_with_one_overwrite_rule(tmp_path):
    """evaluation.save_scores is the only code that writes a scores file, and never over an earlier one."""
    from types import SimpleNamespace

    from tfbuilder.use.evaluation import Scores, save_scores

    writers = [str(rel) for rel, text in sources() if "scores_path(" in text and "write" in text and rel.name != "evaluation.py"]
    assert writers == ["cli/scoring.py"]  # which says where save_scores wrote; it writes nothing itself
    assert "write_new_text" not in (PACKAGE / "cli" / "scoring.py").read_text(encoding="utf-8").split("def _save_scores_new")[1].split("\ndef ")[0]
    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    ckpt.parent.mkdir(parents=True)
    loaded = SimpleNamespace(path=ckpt)
    scores = Scores("val", 3, 1.0, 2.7, accuracy=0.5)
    first, second = save_scores(loaded, scores), save_scores(loaded, scores)
    assert first.name == "test-val-best.json" and second.name == "test-val-best-2.json"


def test_recipe_differences_are_computed_once():
    """A resume's recorded changes come from diffing.differences, as `tfbuilder diff` and sweeps do."""
    from tfbuilder.train.lifecycle import _changes

    assert [rel for rel, text in sources() if re.search(r"def (flatten|differences)\(", text)] == [Path("spec/diffing.py")]
    # Nobody else flattens recipes to compare them key by key (tensors' .flatten() are another thing).
    assert [rel for rel, text in sources() if re.search(r"(?<![.\w])flatten\(", text)] == [Path("spec/diffing.py")]
    before = {"name": "a", "trainer": {"max_steps": 10}, "model": {"pad_id": None}}
    after = {"name": "b", "trainer": {"max_steps": 20, "seed": 3}}
    assert _changes(before, after) == {"name": ["a", "b"], "trainer.max_steps": [10, 20], "trainer.seed": [None, 3]}


# --- the masked-LM rate and the batch size -----------------------------------------------------


def test_the_masked_lm_rate_is_stated_once():
    from tfbuilder.train import objectives
    from tfbuilder.spec.recipe import recipe_from_dict

    assert sections.DataSection.model_fields["mlm_probability"].default == sections.MLM_PROBABILITY
    assert where(r"\b0\.15\b", allowed={"spec/sections.py", "use/reports.py"}) == []  # reports: a plot's transparency
    model = {"kind": "encoder", "vocab_size": 20, "d_model": 8, "attention": {"type": "multihead", "heads": 2}, "encoder": {"layers": 1}, "decoder": None}
    fn = objectives.objective(recipe_from_dict({"model": model}), epsilon=0.0)
    assert inspect.unwrap(fn).keywords["probability"] == sections.MLM_PROBABILITY


def test_the_default_batch_size_is_stated_in_the_schema_and_the_docs():
    from tfbuilder.data.datamodule import DataModule

    default = inspect.signature(DataModule).parameters["batch_size_default"].default
    assert default == sections.DEFAULT_BATCH_SIZE
    assert f"default {default} when neither is set" in sections.DataSection.model_fields["batch_size"].description
    assert f"({default} when neither is set)" in (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert f"default {default} when neither is set" in (ROOT / "docs" / "reference" / "recipe.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("fact", ["SPECIAL_TOKENS", "MLM_PROBABILITY", "DEFAULT_BATCH_SIZE", "FFN_WIDTH"])
def test_each_named_fact_is_assigned_in_one_module(fact):
    assigned = [
        str(rel)
        for rel, text in sources(skip_data=False)
        for node in ast.walk(parsed(text))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == fact for t in node.targets)
    ]
    assert len(assigned) == 1, assigned
