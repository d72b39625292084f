"""The whole recipe (schema only, no tensors): its sections and the checks across them, and its
loading from a file or from data (with ``extends`` and ``--set`` overrides), errors placed at
file:line:col.

The sections are their own modules: the model (:mod:`~tfbuilder.spec.model_section`, its stacks
:mod:`~tfbuilder.spec.stacks` and component slots :mod:`~tfbuilder.spec.slots`), the data
(:mod:`~tfbuilder.spec.sections`) and the run (:mod:`~tfbuilder.spec.training`); the translation of
errors to positions is :mod:`~tfbuilder.spec.problems`.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tfbuilder.errors import Problem, RecipeError
from tfbuilder.spec.base import Issue, Section, fail
from tfbuilder.spec.model_section import ModelSection
from tfbuilder.spec.ports import tokenizer_files
from tfbuilder.spec.problems import translate
from tfbuilder.spec.sections import SPECIAL_COUNT, SYNTHETIC_ALPHABET, DataSection
from tfbuilder.spec.slots import slot_family
from tfbuilder.spec.sources import (
    RECIPE_SECTIONS,
    Key,
    Source,
    apply_overrides,
    check_bounds,
    dotted_path,
    load_source,
    merge,
)
from tfbuilder.spec.training import OptimSection, TrainerSection
from tfbuilder.specials import lacking

_slot_family = slot_family  # the name tfbuilder.cli.reference imports it by


class Recipe(Section):
    """A whole recipe: a name, the model, and how to train it."""

    name: str = Field(
        "recipe",
        min_length=1,
        pattern=r"^[\w.\-]+$",
        json_schema_extra={"not": {"pattern": "^\\.*$"}},  # what _not_dots checks, for editors
        description="run name (letters, digits, . _ -; not only dots)",
    )
    extends: str | None = Field(
        None, description="a recipe this one extends (path relative to this file); merged on load"
    )
    model: ModelSection = Field(description="the architecture")
    data: DataSection | None = Field(None, description="training data")
    optim: OptimSection = Field(default_factory=OptimSection, description="optimisation")
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="training loop")
    _source: Source | None = PrivateAttr(None)
    _path: Path | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _not_dots(cls, value: str) -> str:
        # The run goes to <trainer.output>/<name>/: '.' or '..' would put it beside or above that.
        if value.strip(".") == "":
            raise PydanticCustomError("run_name", "a run name needs a letter or digit ('.' and '..' name directories)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _vocab_from_data(cls, data: Any) -> Any:
        # The tokenizer decides the vocabulary: model.vocab_size may be left out when data says it.
        if isinstance(data, dict) and isinstance(data.get("model"), dict) and "vocab_size" not in data["model"]:
            try:
                size = (
                    DataSection.model_validate(data["data"]).vocab_size if isinstance(data.get("data"), dict) else None
                )
            except ValidationError:
                # The data section's own errors are reported where they are; its vocabulary may still
                # be plain to see, and then a missing model.vocab_size would be a false second error.
                size = _vocab_hint(data["data"])
            if size is not None:
                data = {**data, "model": {**data["model"], "vocab_size": size}}
        # A given tokenizer decides the padding id too.
        if (
            isinstance(data, dict)
            and isinstance(data.get("model"), dict)
            and "pad_id" not in data["model"]
            and isinstance(data.get("data"), dict)
        ):
            try:
                section = DataSection.model_validate(data["data"])
            except ValidationError:
                section = None
            if section is not None and section.tokenizer.given and section.pad_id is not None:
                data = {**data, "model": {**data["model"], "pad_id": section.pad_id}}
        return data

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        problems = self._data_problems() + self._monitor_problems()
        if self.trainer.val_bleu and self.model.kind != "encoder_decoder":
            problems.append(
                (
                    ("trainer", "val_bleu"),
                    f"val_bleu translates, so it needs an encoder_decoder model (this one is '{self.model.kind}')",
                    self.trainer.val_bleu,
                )
            )
        fail("Recipe", problems)
        return self

    def _data_problems(self) -> list[Issue]:
        """Whether the data suits the model: its type, vocabulary, padding and tokenizer."""
        if self.data is None:
            return []
        problems = self._data_type_problems(self.data)
        problems += self._vocabulary_problems(self.data) + self._padding_problems(self.data)
        facts = self.data.tokenizer.facts()
        if facts is not None:
            for why in lacking(facts.found, self.model.kind):
                problems.append(
                    (
                        ("data", "tokenizer", "path"),
                        f"a model of kind '{self.model.kind}' cannot train with this tokenizer: {why}; "
                        "name its tokens in data.tokenizer.specials",
                        self.data.tokenizer.path,
                    )
                )
        return problems

    def _data_type_problems(self, data: DataSection) -> list[Issue]:
        """The type of data a model of this kind (and head) trains on."""
        wanted = {
            "encoder_decoder": ("parallel", "synthetic"),
            "decoder": ("monolingual",),
            "encoder": ("monolingual",),
        }
        if self.model.head is not None:  # one prediction per text: labelled texts
            wanted = {kind: ("labelled",) for kind in wanted}
        if data.type == "labelled" and self.model.head is None and self.model.kind != "encoder_decoder":
            return [
                (
                    ("model", "head"),
                    "labelled data trains a sequence head: set model.head: {type: classify, classes: N} or "
                    "{type: regress}",
                    None,
                )
            ]
        if data.type not in wanted[self.model.kind]:
            message = f"a model of kind '{self.model.kind}' trains on {' or '.join(wanted[self.model.kind])} data"
            return [(("data", "type"), message, data.type)]
        return []

    def _vocabulary_problems(self, data: DataSection) -> list[Issue]:
        """The model's vocabularies against the data's, and a shared embedding over shared tokenizers."""
        problems: list[Issue] = []
        size = data.vocab_size
        if size is not None and size != self.model.vocab_size:
            problems.append(
                (
                    ("model", "vocab_size"),
                    f"model.vocab_size ({self.model.vocab_size}) differs from the data's vocabulary ({size}); "
                    "leave it out to use the data's",
                    self.model.vocab_size,
                )
            )
        if size is not None and self.model.src_vocab_size not in (None, size):
            # Each side's tokenizer has the data's vocabulary: a smaller source table cannot embed its ids.
            problems.append(
                (
                    ("model", "src_vocab_size"),
                    f"model.src_vocab_size ({self.model.src_vocab_size}) differs from the data's vocabulary ({size}); "
                    "leave it out to use the data's",
                    self.model.src_vocab_size,
                )
            )
        if self.model.share_embeddings and not data.tokenizer.shared and data.type == "parallel":
            problems.append((("model", "share_embeddings"), "share_embeddings needs data.tokenizer.shared: true", True))
        return problems

    def _padding_problems(self, data: DataSection) -> list[Issue]:
        """One pad id for masks, loss and batches: the data's tokenizers pad with <pad>."""
        pad = data.pad_id
        if self.model.pad_id is not None and pad is not None and self.model.pad_id != pad:
            return [
                (
                    ("model", "pad_id"),
                    f"the data pads with id {pad} (<pad>); model.pad_id ({self.model.pad_id}) must be {pad} when "
                    "training on data",
                    self.model.pad_id,
                )
            ]
        return []

    def _monitor_problems(self) -> list[Issue]:
        """A monitored score that the model's head does not produce."""
        problems: list[Issue] = []
        monitor, head = self.trainer.monitor, self.model.head.type if self.model.head is not None else None
        wanted = {"val_f1": "classify", "val_mse": "regress"}.get(monitor)
        if wanted is not None and head != wanted:
            problems.append(
                (
                    ("trainer", "monitor"),
                    f"{monitor} is a score of a {wanted} head (model.head: {{type: {wanted}}})",
                    monitor,
                )
            )
        if monitor == "val_acc" and head == "regress":
            problems.append(
                (("trainer", "monitor"), "a regress head has no accuracy: monitor val_mse or val_loss", monitor)
            )
        return problems

    @property
    def path(self) -> Path | None:
        """The file this recipe was loaded from, if any."""
        return self._path

    @property
    def source(self) -> Source | None:
        """Where each value was written (file, line, column, or the ``--set`` override), for a recipe
        loaded from YAML or data; None for one built in Python."""
        return self._source

    def problem(self, path: tuple, message: str) -> Problem:
        """A problem at ``path`` (keys into the recipe), placed where that value was written when known."""
        return self._source.problem(path, message) if self._source is not None else Problem(message, dotted_path(path))

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what ``show`` prints and checkpoints keep)."""
        data = self.model_dump(mode="json", exclude={"extends"}, exclude_none=True)
        if self.model.pad_id is None:  # null is a value here (no padding token), not "the default"
            data["model"]["pad_id"] = None
        if self.data is not None and self.data.tokenizer.given and self.data.tokenizer.vocab_size is None:
            # A given tokenizer's size, resolved: the recipe then validates where the file is absent.
            facts = self.data.tokenizer.facts()
            if facts is not None:
                data["data"]["tokenizer"]["vocab_size"] = facts.vocab_size
        return data


def _vocab_hint(data: dict) -> int:
    """The vocabulary an invalid data section names, or a placeholder (the model is then checked,
    but the data section's errors are what get fixed)."""
    if data.get("type", "synthetic") == "synthetic":
        default = DataSection.model_fields["symbols"].default
        symbols = data.get("symbols", default)
        valid = isinstance(symbols, int) and not isinstance(symbols, bool) and 2 <= symbols <= len(SYNTHETIC_ALPHABET)
        return SPECIAL_COUNT + (symbols if valid else default)
    size = data.get("tokenizer", {}).get("vocab_size") if isinstance(data.get("tokenizer"), dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and SPECIAL_COUNT + 1 <= size <= 10_000_000:
        return size
    return SPECIAL_COUNT + 11  # any vocabulary with ordinary tokens will do


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load, merge (``extends``), override (``dotted.key=value``) and validate a recipe file.

    Raises :class:`RecipeError` listing every problem as ``file:line:col: dotted.path: message``.
    """
    path = Path(path)
    src = load_source(path)
    src = apply_overrides(src, list(overrides))
    if "name" not in src.data:  # the run is named after the file: it must be a name a run can have
        src.forget(("name",))  # a parent's place: its name is not inherited
        if not re.fullmatch(r"[\w.\-]+", path.stem) or not path.stem.strip("."):
            message = (
                f"the recipe has no name, and its file name {path.stem!r} is not one (letters, digits, . _ -): "
                "add a name: line"
            )
            raise RecipeError([Problem(message, "name", str(path), 1, 1)])
        src.data["name"] = path.stem
    recipe = validate(src)
    recipe._path = path
    return recipe


def recipe_from_dict(
    data: dict[str, Any], overrides: list[str] | tuple[str, ...] = (), *, base: str | Path = "."
) -> Recipe:
    """Validate a recipe given as data (built in Python, or the resolved recipe a checkpoint keeps),
    with ``overrides``; bounded like a recipe file. ``extends`` names a recipe file relative to
    ``base``. Raises :class:`RecipeError` whose problems carry dotted paths (no file or line: the
    data has none; values a parent file gave keep that file's positions)."""
    if not isinstance(data, dict):
        raise RecipeError(
            [Problem(f"a recipe is a dict of sections ({', '.join(RECIPE_SECTIONS)}), not {type(data).__name__}", "")]
        )
    check_bounds(data, "the recipe")
    src = Source(copy.deepcopy(data))
    parent = src.data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, (str, Path)) or not str(parent).strip() or "\x00" in str(parent):
            raise RecipeError([Problem("extends must be the path of a recipe file", "extends")])
        inherited = load_source(Path(base) / parent)
        inherited.data.pop("name", None)  # a name belongs to its own recipe
        src = merge(inherited, src)
    return validate(apply_overrides(src, list(overrides)))


TOKENIZER_PATH: Key = ("data", "tokenizer", "path")


def _settle_tokenizer_path(src: Source) -> None:
    """A recipe file's relative ``data.tokenizer.path`` is relative to that file's folder (as ``data.path``
    and ``extends`` are). For one release, where nothing is there but the same relative path exists from
    the working directory (as such paths were read before), that file is used, with a warning naming the
    new form. Only whether the paths exist is asked (the tokenizer-files port), before validation reads it."""
    written = src.written.get(TOKENIZER_PATH)
    data = src.data.get("data")
    tokenizer = data.get("tokenizer") if isinstance(data, dict) else None
    if written is None or not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("path"), str):
        return
    files = tokenizer_files()
    if files.exists(tokenizer["path"]) or not files.exists(written.value):
        return
    found = os.path.abspath(written.value)
    try:
        new_form = os.path.relpath(found, Path(written.file).absolute().parent)
    except ValueError:  # another drive (Windows): only an absolute path names it
        new_form = found
    warnings.warn(
        f"{written.file}: data.tokenizer.path {written.value!r} is relative to the recipe's folder, where nothing "
        f"is; reading {found} (relative to the working directory, as before) instead. Relative paths in a recipe "
        f"start at the recipe file: write data.tokenizer.path: {new_form} (this fallback will be removed in a "
        "later release)",
        FutureWarning,
        stacklevel=3,
    )
    tokenizer["path"] = found
    del src.written[TOKENIZER_PATH]


def validate(src: Source) -> Recipe:
    """Validate loaded data against the schema, translating errors to positions."""
    _settle_tokenizer_path(src)
    try:
        recipe = Recipe.model_validate(src.data)
    except ValidationError as exc:
        raise RecipeError(translate(exc, src, Recipe)) from None
    recipe._source = src
    if recipe.data is not None:
        recipe.data._written = src.written.get(("data", "path"))
    return recipe


def json_schema() -> dict[str, Any]:
    """A JSON Schema of recipes (draft 2020-12), for editors' YAML language servers."""
    schema = Recipe.model_json_schema()
    # model.vocab_size may come from the data section (see Recipe._vocab_from_data).
    model = schema["$defs"]["ModelSection"]
    model["required"] = [r for r in model.get("required", []) if r != "vocab_size"]
    # A recipe that extends another may leave the model to its parent: `model` is required only
    # when there is no `extends`.
    schema["required"] = [r for r in schema.get("required", []) if r != "model"]
    schema.setdefault("anyOf", [{"required": ["model"]}, {"required": ["extends"]}])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tfbuilder recipe"
    return schema


__all__ = ["Recipe", "ModelSection", "load_recipe", "validate", "json_schema", "dotted_path"]
