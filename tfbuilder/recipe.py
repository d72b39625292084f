"""The recipe schema (no tensors here), its loading, and the translation of errors to file:line:col.

Component slots (``attention``, ``position``, ``norm``, ``ffn``) are validated by the params model of
the registered type they name, so the schema grows with the registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    Strict,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from . import registry
from .errors import Problem, RecipeError, did_you_mean
from .registry import ComponentParams, ModelDims
from .sources import Source, apply_overrides, dotted_path, load_source


class _Dispatch:
    """Validates a component slot with the params model of the registered type it names."""

    def __init__(self, family: str):
        self.family = family

    def __call__(self, value: Any, handler: Any) -> ComponentParams:
        if isinstance(value, ComponentParams):
            if value.family != self.family:
                raise PydanticCustomError("component_family", "expected a {family} component", {"family": self.family})
            return value
        names = registry.types(self.family)
        if isinstance(value, str):
            value = {"type": value}  # shorthand: `position: learned` means `position: {type: learned}`
        if not isinstance(value, dict):
            raise PydanticCustomError(
                "component_mapping",
                "expected a mapping with a 'type' key (one of: {names}), got {got}",
                {"names": ", ".join(names), "got": repr(value)},
            )
        name = value.get("type")
        if name is None:
            raise PydanticCustomError("component_type_missing", "missing 'type' (one of: {names})", {"names": ", ".join(names)})
        if not isinstance(name, str) or name not in names:
            raise PydanticCustomError(
                "component_type_unknown",
                "unknown {family} type '{name}'{hint}",
                {"family": self.family, "name": str(name), "hint": did_you_mean(str(name), names)},
            )
        return registry.get(self.family, name).params.model_validate(value)

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        members = [e.params.model_json_schema() for e in registry.entries(self.family)]
        return {
            "oneOf": members,
            "discriminator": {"propertyName": "type"},
            "description": f"a registered {self.family} component: " + ", ".join(registry.types(self.family)),
        }


def slot(family: str) -> Any:
    """The annotation of a field that holds a registered component of ``family``."""
    dispatch = _Dispatch(family)
    return Annotated[SerializeAsAny[ComponentParams], WrapValidator(dispatch), dispatch]


def _default(family: str, name: str) -> Any:
    return lambda: registry.get(family, name).params()


Attention = slot("attention")
Position = slot("position")
Norm = slot("norm")
Ffn = slot("ffn")


class Section(BaseModel):
    """A recipe section: unknown keys are errors, no silent coercion (``yes`` is not 1.0), no inf/nan."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _fail(model: str, problems: list[tuple[tuple, str, Any]]) -> None:
    """Raise the cross-field ``problems`` (loc, message, value) as one ValidationError."""
    if problems:
        details = [
            InitErrorDetails(type=PydanticCustomError("cross_field", message), loc=loc, input=value)
            for loc, message, value in problems
        ]
        raise ValidationError.from_exception_data(model, details)


class StackSection(Section):
    """An encoder or decoder stack; components left out come from the model section."""

    layers: int = Field(6, ge=1, le=1000, description="number of identical layers N")
    attention: Attention | None = Field(None, description="self-attention; default model.attention")
    ffn: Ffn | None = Field(None, description="feed-forward sub-layer; default model.ffn")
    norm: Norm | None = Field(None, description="normalisation; default model.norm")


class DecoderSection(StackSection):
    """A decoder stack: masked self-attention, cross-attention (encoder-decoder only), feed-forward."""

    cross_attention: Attention | None = Field(
        None, description="attention over the encoder output; default the decoder's self-attention"
    )


class ModelSection(Section):
    """The architecture. Defaults are the paper's base model (Vaswani et al. 2017, Table 3 'base')."""

    kind: Literal["encoder_decoder", "decoder", "encoder"] = Field(
        "encoder_decoder", description="encoder_decoder (the paper), decoder (GPT-like) or encoder (BERT-like)"
    )
    vocab_size: int = Field(ge=2, le=10_000_000, description="target (or shared) vocabulary size")
    src_vocab_size: int | None = Field(
        None, ge=2, le=10_000_000, description="source vocabulary size when not shared; default vocab_size"
    )
    pad_id: int = Field(0, ge=0, description="id of the padding token (masked as a key, ignored by the loss)")
    d_model: int = Field(512, ge=1, le=65536, description="model width d_model")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="P_drop: on embeddings+positions and every sub-layer output")
    placement: Literal["post", "pre"] = Field(
        "post", description="norm placement: post (the paper: Norm(x + f(x))) or pre (x + f(Norm(x)))"
    )
    final_norm: bool | None = Field(None, description="norm after each stack; default true for pre, false for post")
    share_embeddings: bool = Field(True, description="source and target share one embedding matrix (sec. 3.4)")
    tie_output: bool = Field(True, description="the pre-softmax projection reuses the target embedding (sec. 3.4)")
    position: Position = Field(default_factory=_default("position", "sinusoidal"), description="positional encoding")
    attention: Attention = Field(default_factory=_default("attention", "multihead"), description="attention")
    ffn: Ffn = Field(default_factory=_default("ffn", "mlp"), description="position-wise feed-forward")
    norm: Norm = Field(default_factory=_default("norm", "layernorm"), description="normalisation")
    encoder: StackSection | None = Field(None, description="the encoder stack (kinds encoder_decoder and encoder)")
    decoder: DecoderSection | None = Field(None, description="the decoder stack (kinds encoder_decoder and decoder)")

    @model_validator(mode="after")
    def _check(self) -> "ModelSection":
        problems: list[tuple[tuple, str, Any]] = []
        needs = {"encoder_decoder": ("encoder", "decoder"), "decoder": ("decoder",), "encoder": ("encoder",)}[self.kind]
        for part in ("encoder", "decoder"):
            present = getattr(self, part) is not None
            if part in needs and not present:
                problems.append(((part,), f"kind '{self.kind}' needs {'an' if part == 'encoder' else 'a'} {part} section (e.g. {part}: {{layers: 6}})", None))
            elif part not in needs and present:
                problems.append(
                    ((part,), f"kind '{self.kind}' has no {part}; remove this section (or set {part}: null where inherited)", None)
                )
        dims = ModelDims(d_model=self.d_model)
        for loc, params in self.components():
            for field, message in params.check(dims):
                problems.append((loc + (field,), message, getattr(params, field, None)))
        if self.src_vocab_size is not None and self.kind != "encoder_decoder":
            problems.append((("src_vocab_size",), f"kind '{self.kind}' has one vocabulary; remove src_vocab_size", self.src_vocab_size))
        if self.share_embeddings and self.src_vocab_size not in (None, self.vocab_size):
            problems.append(
                (
                    ("src_vocab_size",),
                    f"share_embeddings needs src_vocab_size ({self.src_vocab_size}) == vocab_size ({self.vocab_size})",
                    self.src_vocab_size,
                )
            )
        for name in ("vocab_size", "src_vocab_size"):
            size = getattr(self, name)
            if size is not None and self.pad_id >= size:
                problems.append((("pad_id",), f"pad_id ({self.pad_id}) must be smaller than {name} ({size})", self.pad_id))
        _fail("ModelSection", problems)
        return self

    def components(self) -> list[tuple[tuple, ComponentParams]]:
        """Every component the model uses, with its location in the recipe (defaults resolved)."""
        found: list[tuple[tuple, ComponentParams]] = [(("position",), self.position), (("norm",), self.norm)]
        found += [(("attention",), self.attention), (("ffn",), self.ffn)]
        for part in ("encoder", "decoder"):
            stack = getattr(self, part)
            if stack is None:
                continue
            for field in ("attention", "cross_attention", "ffn", "norm"):
                params = getattr(stack, field, None)
                if params is not None:
                    found.append(((part, field), params))
        return found

    @property
    def uses_final_norm(self) -> bool:
        return self.placement == "pre" if self.final_norm is None else self.final_norm


class TokenizerSection(Section):
    """How text becomes ids."""

    type: Literal["bpe", "char"] = Field("bpe", description="bpe (HF tokenizers, byte-level) or char")
    vocab_size: int | None = Field(None, ge=4, le=10_000_000, description="subword vocabulary size (bpe)")
    shared: bool = Field(True, description="one vocabulary for source and target (the paper)")


class DataSection(Section):
    """Where examples come from and how they are batched."""

    type: Literal["synthetic", "parallel", "monolingual"] = Field(
        "synthetic", description="synthetic tasks, parallel text (translation) or monolingual text (LM)"
    )
    task: Literal["copy", "reverse", "sort"] | None = Field(None, description="the synthetic task")
    path: str | None = Field(None, description="directory of the text files (parallel, monolingual)")
    src_lang: str | None = Field(None, description="source language suffix, e.g. 'de' for train.de.gz")
    tgt_lang: str | None = Field(None, description="target language suffix, e.g. 'en'")
    tokenizer: TokenizerSection = Field(default_factory=TokenizerSection, description="the tokenizer")
    max_tokens: int | None = Field(None, ge=1, description="token budget per batch (source and target each)")
    batch_size: int | None = Field(None, ge=1, description="sentences per batch, when not batching by tokens")

    @model_validator(mode="after")
    def _check(self) -> "DataSection":
        problems: list[tuple[tuple, str, Any]] = []
        if self.type == "synthetic" and self.task is None:
            problems.append((("task",), "synthetic data needs a task (copy, reverse or sort)", None))
        if self.type in ("parallel", "monolingual") and self.path is None:
            problems.append((("path",), f"{self.type} data needs a path", None))
        if self.type == "parallel":
            for lang in ("src_lang", "tgt_lang"):
                if getattr(self, lang) is None:
                    problems.append(((lang,), f"parallel data needs {lang}", None))
        _fail("DataSection", problems)
        return self


class ScheduleSection(Section):
    """Learning-rate schedule."""

    type: Literal["inverse_sqrt", "cosine", "constant"] = Field(
        "inverse_sqrt", description="inverse_sqrt: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (sec. 5.3)"
    )
    warmup: int = Field(4000, ge=0, description="warm-up steps")
    scale: float = Field(1.0, gt=0.0, description="multiplies the schedule (inverse_sqrt) ")


class OptimSection(Section):
    """Optimisation: the paper's Adam and warm-up by default (sec. 5.3), label smoothing (sec. 5.4)."""

    optimizer: Literal["adam", "adamw"] = Field("adam", description="adam or adamw")
    lr: float = Field(1.0, gt=0.0, description="peak learning rate (cosine, constant); inverse_sqrt uses scale")
    betas: tuple[Annotated[float, Strict()], Annotated[float, Strict()]] = Field(
        (0.9, 0.98), strict=False, description="Adam beta1, beta2"
    )
    eps: float = Field(1e-9, gt=0.0, description="Adam epsilon")
    weight_decay: float = Field(0.0, ge=0.0, description="decoupled weight decay (adamw)")
    schedule: ScheduleSection = Field(default_factory=ScheduleSection, description="learning-rate schedule")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls of the smoothed cross-entropy")
    grad_clip: float | None = Field(None, gt=0.0, description="clip the gradient norm to this value")
    accumulate: int = Field(1, ge=1, description="batches per optimizer step")

    @model_validator(mode="after")
    def _check(self) -> "OptimSection":
        problems = [
            (("betas", i), f"Adam beta{i + 1} must be in [0, 1), got {b}", b) for i, b in enumerate(self.betas) if not 0 <= b < 1
        ]
        _fail("OptimSection", problems)
        return self


class TrainerSection(Section):
    """What Lightning's Trainer is told."""

    max_steps: int = Field(100_000, ge=1, description="optimizer steps to train (the paper: 100k base, 300k big)")
    max_epochs: int | None = Field(None, ge=1, description="stop after this many epochs, if sooner")
    val_every: int = Field(1000, ge=1, description="validate every this many steps")
    precision: Literal["32", "64", "bf16-mixed", "16-mixed"] = Field("32", description="numeric precision")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = Field("auto", description="device kind")
    devices: int | Literal["auto"] = Field("auto", description="devices per node")
    strategy: Literal["auto", "ddp", "fsdp"] = Field("auto", description="distribution strategy")
    num_nodes: int = Field(1, ge=1, description="machines")
    deterministic: bool = Field(False, description="deterministic algorithms (bit-equal resume on the CPU)")
    seed: int = Field(0, ge=0, description="random seed")
    compile: bool = Field(False, description="torch.compile the model (slower on CPU; opt-in)")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_number(cls, value: Any) -> Any:
        # `precision: 32` is what people write (and what Lightning accepts).
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Recipe(Section):
    """A whole recipe: a name, the model, and how to train it."""

    name: str = Field("recipe", min_length=1, pattern=r"^[\w.\-]+$", description="run name (letters, digits, . _ -)")
    extends: str | None = Field(None, description="a recipe this one extends (path relative to this file); merged on load")
    model: ModelSection = Field(description="the architecture")
    data: DataSection | None = Field(None, description="training data")
    optim: OptimSection = Field(default_factory=OptimSection, description="optimisation")
    trainer: TrainerSection = Field(default_factory=TrainerSection, description="training loop")
    _source: Source | None = PrivateAttr(None)
    _path: Path | None = PrivateAttr(None)

    @property
    def path(self) -> Path | None:
        """The file this recipe was loaded from, if any."""
        return self._path

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what ``show`` prints and checkpoints keep)."""
        return self.model_dump(mode="json", exclude={"extends"}, exclude_none=True)


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load, merge (``extends``), override (``dotted.key=value``) and validate a recipe file.

    Raises :class:`RecipeError` listing every problem as ``file:line:col: dotted.path: message``.
    """
    path = Path(path)
    src = load_source(path)
    src = apply_overrides(src, list(overrides))
    src.data.setdefault("name", path.stem)
    recipe = validate(src)
    recipe._path = path
    return recipe


def validate(src: Source) -> Recipe:
    """Validate loaded data against the schema, translating errors to positions."""
    try:
        recipe = Recipe.model_validate(src.data)
    except ValidationError as exc:
        raise RecipeError(translate(exc, src)) from None
    recipe._source = src
    return recipe


def translate(exc: ValidationError, src: Source) -> list[Problem]:
    """Pydantic errors -> problems with file, line, column, dotted path and a helpful message."""
    merged: dict[tuple, tuple[str, str, Any]] = {}  # data path -> (kind, message, input)
    for err in exc.errors(include_url=False):
        if err["type"] == "cross_field":  # our own checks name real paths, defaults included
            loc, branch = tuple(err["loc"]), False
        else:
            named = err["type"] in ("missing", "extra_forbidden")
            loc, branch = _data_path(tuple(err["loc"]), src.data, named=named)
        kind, message = err["type"], err["msg"]
        if kind == "extra_forbidden":
            key = loc[-1]
            cls = _model_at(loc[:-1], src.data)
            message = f"unknown key '{key}'" + (did_you_mean(str(key), cls.model_fields) if cls else "")
        elif kind == "missing":
            what = f"item [{loc[-1]}]" if isinstance(loc[-1], int) else f"required key '{loc[-1]}'"
            message = f"missing {what}"
        if loc in merged and branch:
            # One value failing every member of a union (e.g. `int | 'auto'`): one line, alternatives joined.
            _, earlier, got = merged[loc]
            merged[loc] = (kind, f"{earlier}, or {message.removeprefix('Input should be ')}", got)
        else:
            merged[loc] = (kind, message, err.get("input"))
    problems = []
    for loc, (kind, message, got) in merged.items():
        if kind.startswith("component_") and (*loc, "type") in src.values:
            loc = (*loc, "type")
        elif kind not in ("extra_forbidden", "missing", "cross_field") and not kind.startswith("component_"):
            if isinstance(got, (str, int, float, bool)) or got is None:
                message = f"{message} (got {got!r})"
        problems.append(src.problem(loc, message, key=kind in ("extra_forbidden", "missing")))
    problems.sort(key=lambda p: (p.file or "", p.line or 0, p.col or 0))
    return problems


def _data_path(loc: tuple, data: Any, *, named: bool) -> tuple[tuple, bool]:
    """Drop the parts of a pydantic location that are not in the data (union branch names such as
    ``int`` or ``literal['auto']``); returns the path and whether anything was dropped."""
    path: list[Any] = []
    node = data
    dropped = False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif last and named:
            pass  # a key that is missing, or unknown, is still named
        else:
            dropped = True
            continue
        path.append(part)
    return tuple(path), dropped


def _model_at(loc: tuple, data: Any) -> type[BaseModel] | None:
    """The schema class that validates the mapping at ``loc`` (for 'did you mean' on unknown keys)."""
    cls: type[BaseModel] | None = Recipe
    node = data
    for part in loc:
        if cls is None or part not in cls.model_fields:
            return None
        node = node.get(part) if isinstance(node, dict) else None
        field = cls.model_fields[part]
        family = _slot_family((field.annotation, *field.metadata))
        if family is not None:
            name = node.get("type") if isinstance(node, dict) else None
            cls = registry.get(family, name).params if name in registry.types(family) else None
        else:
            cls = _first_model(field.annotation)
    return cls


def _slot_family(things: tuple) -> str | None:
    for thing in things:
        if isinstance(thing, _Dispatch):
            return thing.family
        if isinstance(thing, WrapValidator) and isinstance(thing.func, _Dispatch):
            return thing.func.family
        found = _slot_family(get_args(thing)) if get_args(thing) else None
        if found:
            return found
    return None


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _first_model(arg)
        if found:
            return found
    return None


def json_schema() -> dict[str, Any]:
    """A JSON Schema of recipes (draft 2020-12), for editors' YAML language servers."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tfbuilder recipe"
    return schema


__all__ = ["Recipe", "ModelSection", "load_recipe", "validate", "json_schema", "dotted_path"]
