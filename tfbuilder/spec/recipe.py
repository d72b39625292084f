"""The recipe schema (no tensors here), its loading, and the translation of errors to file:line:col.

Component slots (``attention``, ``position``, ``norm``, ``ffn``) are validated by the params model of
the registered type they name, so the schema grows with the registry.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tfbuilder import registry
from tfbuilder.errors import Problem, RecipeError, did_you_mean
from tfbuilder.registry import ComponentParams, ModelDims
from tfbuilder.spec.head import HeadSection, head_problems
from tfbuilder.spec.sections import (
    SPECIAL_COUNT,
    SYNTHETIC_ALPHABET,
    DataSection,
    OptimSection,
    Section,
    TrainerSection,
    fail,
)
from tfbuilder.spec.sources import (
    RECIPE_SECTIONS,
    Source,
    apply_overrides,
    check_bounds,
    dotted_path,
    load_source,
    merge,
)
from tfbuilder.specials import lacking

if TYPE_CHECKING:  # named in annotations only: the schema imports no tensors
    from tfbuilder.contracts import AttentionParams, AttentionShape


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
            raise PydanticCustomError(
                "component_type_missing", "missing 'type' (one of: {names})", {"names": ", ".join(names)}
            )
        if not isinstance(name, str) or name not in names:
            raise PydanticCustomError(
                "component_type_unknown",
                "unknown {family} type '{name}'{hint}",
                {"family": self.family, "name": str(name), "hint": did_you_mean(str(name), names)},
            )
        return registry.get(self.family, name).params.model_validate(value)

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        members = [e.params.model_json_schema() for e in registry.entries(self.family)]
        shorthand = {"type": "string", "enum": registry.types(self.family), "description": "shorthand for {type: NAME}"}
        return {
            # anyOf, not oneOf: a mapping with only `type` matches more than one member's schema.
            "anyOf": [*members, shorthand],
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


LAYER_FAMILIES = ("attention", "ffn", "norm")


class LayerChanges(Section):
    """Changes to some layers' components: each a partial mapping merged over the stack's component
    (``{window: null}`` changes one param; naming another ``type`` starts that type from its defaults).
    The merged params are validated as the type's own."""

    attention: dict[str, Any] | None = Field(None, description="changes to the self-attention's params")
    ffn: dict[str, Any] | None = Field(None, description="changes to the feed-forward's params")
    norm: dict[str, Any] | None = Field(None, description="changes to the norms' params")


class StackSection(Section):
    """An encoder or decoder stack; components left out come from the model section. Layers are alike
    unless ``pattern`` (named ``kinds`` repeated over the depth) or ``overrides`` (single layers)
    change their components."""

    layers: int = Field(6, ge=1, le=1000, description="number of layers N")
    attention: Attention | None = Field(None, description="self-attention; default model.attention")
    ffn: Ffn | None = Field(None, description="feed-forward sub-layer; default model.ffn")
    norm: Norm | None = Field(None, description="normalisation; default model.norm")
    kinds: dict[Annotated[str, Field(min_length=1, max_length=64)], LayerChanges] = Field(
        default_factory=dict,
        max_length=64,
        description="named kinds of layer, each its changes to the stack's components (used by pattern)",
    )
    pattern: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="the kinds of consecutive layers, repeated over the depth: layer i is pattern[i % len(pattern)] (Gemma 2: [local, global]); default all alike",
    )
    overrides: dict[Annotated[int, Field(strict=False)], LayerChanges] = Field(
        default_factory=dict,
        max_length=1000,
        description="changes to single layers by index (from 0; negative from the end: -1 is the last), applied over the pattern's",
    )


class DecoderSection(StackSection):
    """A decoder stack: masked self-attention, cross-attention (encoder-decoder only), feed-forward."""

    cross_attention: Attention | None = Field(
        None, description="attention over the encoder output; default the decoder's self-attention"
    )


PositiveFloat = Annotated[float, Field(gt=0.0, le=1e6)]


class InitSection(Section):
    """Initialisation. By default each component initialises itself (Xavier for attention, the paper's
    N(0, d^-1/2) embedding); ``std`` sets every linear and embedding weight to N(0, std), biases to 0."""

    std: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="normal std of every linear and embedding weight, biases zero (GPT-2, BERT, Llama: 0.02); default: each component's own",
    )
    residual_scaling: bool = Field(
        False,
        description="divide the std of each residual branch's output projection by sqrt(2 * layers) (GPT-2, Radford et al. 2019)",
    )

    @model_validator(mode="after")
    def _check(self) -> InitSection:
        if self.residual_scaling and self.std is None:
            fail("InitSection", [(("residual_scaling",), "residual_scaling needs init.std", True)])
        return self


class MultiTokenSection(Section):
    """Multi-token prediction (DeepSeek-V3, arXiv:2412.19437, sec. 2.2; Gloeckle et al. 2024,
    arXiv:2404.19737): sequential modules predicting tokens 2..depth+1 ahead, trained beside the main
    head; decoding uses the main head only."""

    depth: int = Field(1, ge=1, le=16, description="number D of extra tokens predicted (DeepSeek-V3: 1)")
    weight: float = Field(
        0.3,
        gt=0.0,
        le=10.0,
        description="lambda: the modules' mean loss is added times this (DeepSeek-V3: 0.3, then 0.1)",
    )


class ModelSection(Section):
    """The architecture. Defaults are the paper's base model (Vaswani et al. 2017, Table 3 'base')."""

    kind: Literal["encoder_decoder", "decoder", "encoder"] = Field(
        "encoder_decoder", description="encoder_decoder (the paper), decoder (GPT-like) or encoder (BERT-like)"
    )
    vocab_size: int = Field(
        ge=2, le=10_000_000, description="target (or shared) vocabulary size; default: the data's (data.tokenizer)"
    )
    src_vocab_size: int | None = Field(
        None, ge=2, le=10_000_000, description="source vocabulary size when not shared; default vocab_size"
    )
    pad_id: int | None = Field(
        0,
        ge=0,
        description="id of the padding token (masked as a key, ignored by the loss); null: no padding token (GPT-2, Llama)",
    )
    d_model: int = Field(512, ge=1, le=65536, description="model width d_model")
    dropout: float = Field(
        0.1, ge=0.0, lt=1.0, description="P_drop: on embeddings+positions and every sub-layer output"
    )
    placement: Literal["post", "pre", "sandwich"] = Field(
        "post",
        description="norm placement: post (the paper: Norm(x + f(x))), pre (x + f(Norm(x))) or sandwich (x + Norm(f(Norm(x))))",
    )
    final_norm: bool | None = Field(None, description="norm after each stack; default false for post, true otherwise")
    block: Literal["sequential", "parallel"] = Field(
        "sequential",
        description="sequential (the paper: attention, then feed-forward) or parallel (GPT-J, PaLM arXiv:2204.02311: x + attn(norm(x)) + ffn(norm(x)); one-stack kinds, placement pre or sandwich)",
    )
    parallel_norms: Literal["shared", "separate"] = Field(
        "shared",
        description="parallel blocks: one norm shared by both branches (GPT-J, PaLM) or one norm per branch (GPT-NeoX)",
    )
    share_embeddings: bool = Field(True, description="source and target share one embedding matrix (sec. 3.4)")
    tie_output: bool = Field(True, description="the pre-softmax projection reuses the target embedding (sec. 3.4)")
    position: Position = Field(default_factory=_default("position", "sinusoidal"), description="positional encoding")
    attention: Attention = Field(default_factory=_default("attention", "multihead"), description="attention")
    ffn: Ffn = Field(default_factory=_default("ffn", "mlp"), description="position-wise feed-forward")
    norm: Norm = Field(default_factory=_default("norm", "layernorm"), description="normalisation")
    embed_scale: PositiveFloat | Literal["sqrt_d_model"] = Field(
        "sqrt_d_model",
        description="token embeddings are multiplied by this: sqrt_d_model (the paper, sec. 3.4) or a number (1 for GPT-2, BERT, T5, Llama)",
    )
    output_scale: PositiveFloat | Literal["rsqrt_d_model"] = Field(
        1.0,
        description="hidden states are multiplied by this before the output head: a number, or rsqrt_d_model (T5's d_model^-0.5 before its tied head)",
    )
    token_types: int = Field(
        0, ge=0, le=1024, description="token-type (segment) embeddings added to the input (BERT: 2); 0: none"
    )
    embed_norm: bool = Field(
        False, description="a norm (model.norm) after embeddings, positions and token types (BERT)"
    )
    head_bias: bool = Field(False, description="learn a bias on the output projection (BERT's masked-LM head)")
    logit_softcap: float | None = Field(
        None,
        gt=0.0,
        le=1e4,
        description="soft-cap the output logits to softcap * tanh(logits / softcap) (Gemma 2, Gemma Team 2024, arXiv:2408.00118: 30); default none",
    )
    init: InitSection = Field(default_factory=InitSection, description="initialisation of the weights")
    encoder: StackSection | None = Field(None, description="the encoder stack (kinds encoder_decoder and encoder)")
    decoder: DecoderSection | None = Field(None, description="the decoder stack (kinds encoder_decoder and decoder)")
    mtp: MultiTokenSection | None = Field(
        None, description="multi-token prediction modules trained beside the output head (kind decoder); default none"
    )
    head: HeadSection | None = Field(
        None,
        description="a sequence head (classify or regress) instead of the language-model output; default: none (kinds encoder and decoder)",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        problems: list[tuple[tuple, str, Any]] = []
        needs = {"encoder_decoder": ("encoder", "decoder"), "decoder": ("decoder",), "encoder": ("encoder",)}[self.kind]
        for part in ("encoder", "decoder"):
            present = self.stack(part) is not None
            if part in needs and not present:
                problems.append(
                    (
                        (part,),
                        f"kind '{self.kind}' needs {'an' if part == 'encoder' else 'a'} {part} section (e.g. {part}: {{layers: 6}})",
                        None,
                    )
                )
            elif part not in needs and present:
                problems.append(
                    (
                        (part,),
                        f"kind '{self.kind}' has no {part}; remove this section (or set {part}: null where inherited)",
                        None,
                    )
                )
        problems += self._layer_problems()
        if problems:
            fail("ModelSection", problems)
        dims = ModelDims(d_model=self.d_model)
        for loc, params in self.components():
            for field, message in params.check(dims):
                problems.append((loc + (field,), message, getattr(params, field, None)))
        if self.src_vocab_size is not None and self.kind != "encoder_decoder":
            problems.append(
                (
                    ("src_vocab_size",),
                    f"kind '{self.kind}' has one vocabulary; remove src_vocab_size",
                    self.src_vocab_size,
                )
            )
        if self.share_embeddings and self.src_vocab_size not in (None, self.vocab_size):
            problems.append(
                (
                    ("src_vocab_size",),
                    f"share_embeddings needs src_vocab_size ({self.src_vocab_size}) == vocab_size ({self.vocab_size})",
                    self.src_vocab_size,
                )
            )
        if self.mtp is not None and self.kind != "decoder":
            problems.append(
                (
                    ("mtp",),
                    f"multi-token prediction is for decoder-only language models (kind decoder), not kind '{self.kind}'",
                    None,
                )
            )
        if self.block == "parallel" and self.kind == "encoder_decoder":
            problems.append(
                (
                    ("block",),
                    "parallel blocks are for one-stack models (kinds decoder and encoder): a decoder with cross-attention has no parallel form",
                    self.block,
                )
            )
        if self.block == "parallel" and self.placement == "post":
            problems.append(
                (
                    ("placement",),
                    "parallel blocks normalise before their branches: use placement pre or sandwich",
                    self.placement,
                )
            )
        if self.parallel_norms == "separate" and self.block != "parallel":
            problems.append((("parallel_norms",), "parallel_norms is for block: parallel", self.parallel_norms))
        if self.token_types and self.kind == "encoder_decoder":
            problems.append(
                (("token_types",), "token_types are for one-stack models (kinds decoder and encoder)", self.token_types)
            )
        if self.pad_id is None and self.kind == "encoder_decoder":
            problems.append(
                (("pad_id",), "an encoder_decoder model needs pad_id (source padding must be masked)", None)
            )
        for name in ("vocab_size", "src_vocab_size"):
            size = getattr(self, name)
            if size is not None and self.pad_id is not None and self.pad_id >= size:
                problems.append(
                    (("pad_id",), f"pad_id ({self.pad_id}) must be smaller than {name} ({size})", self.pad_id)
                )
        if self.head is not None:
            problems += head_problems(self.head, self.kind)
            if self.mtp is not None:
                problems.append(
                    (
                        ("mtp",),
                        "multi-token prediction trains next-token outputs; a model with a sequence head (model.head) has none",
                        None,
                    )
                )
        fail("ModelSection", problems)
        return self

    def _stack_components(self, part: Literal["encoder", "decoder"]) -> dict[str, ComponentParams]:
        """The ``part`` stack's own components (its section's, else the model's), by family."""
        stack = self.stack(part)
        return {"attention": self.self_attention(part), "ffn": stack.ffn or self.ffn, "norm": stack.norm or self.norm}

    def _changes(self, part: Literal["encoder", "decoder"]) -> list[tuple[tuple, LayerChanges]]:
        """Every set of layer changes of the ``part`` stack, with its location (kinds, then overrides)."""
        stack = self.stack(part)
        found = [((part, "kinds", name), changes) for name, changes in stack.kinds.items()]
        return found + [((part, "overrides", index), changes) for index, changes in stack.overrides.items()]

    def _layer_problems(self) -> list[tuple[tuple, str, Any]]:
        """Patterns naming unknown kinds, kinds never used, layer indices out of range, and merged
        params that their type refuses (each at the kind or override that wrote it)."""
        problems: list[tuple[tuple, str, Any]] = []
        for part in ("encoder", "decoder"):
            stack = self.stack(part)
            if stack is None:
                continue
            kinds = sorted(stack.kinds)
            for i, name in enumerate(stack.pattern or []):
                if name not in stack.kinds:
                    known = ", ".join(kinds) if kinds else "none; define them under kinds"
                    problems.append(
                        (
                            (part, "pattern", i),
                            f"unknown layer kind '{name}' (kinds: {known}){did_you_mean(name, kinds)}",
                            name,
                        )
                    )
            for name in kinds:
                if name not in (stack.pattern or []):
                    problems.append(((part, "kinds", name), f"kind '{name}' is not in {part}.pattern", None))
            for index in stack.overrides:
                if not -stack.layers <= index < stack.layers:
                    problems.append(
                        (
                            (part, "overrides", index),
                            f"no layer {index} in a stack of {stack.layers} layers (0 to {stack.layers - 1}, or -1 to -{stack.layers})",
                            index,
                        )
                    )
            base = self._stack_components(part)
            for loc, changes in self._changes(part):
                for family in LAYER_FAMILIES:
                    change = getattr(changes, family)
                    if change is None:
                        continue
                    try:
                        merged = _merged(base[family], change)
                    except ValidationError as exc:
                        for err in exc.errors():
                            problems.append((loc + (family, *err["loc"]), err["msg"], err.get("input")))
                        continue
                    except PydanticCustomError as exc:
                        problems.append((loc + (family, "type"), exc.message(), change.get("type")))
                        continue
                    if family == "attention" and merged.shape(self.d_model) != base[family].shape(self.d_model):
                        problems.append(
                            (
                                loc + (family,),
                                "a layer's heads and key width must be the stack's (positions inside attention are built for them)",
                                None,
                            )
                        )
                    residual = [getattr(p, "value_residual", "none") for p in (merged, base[family])]
                    if family == "attention" and residual[0] != residual[1]:
                        problems.append(
                            (
                                loc + (family, "value_residual"),
                                f"value_residual must be the stack's ({residual[1]}) in every layer (the first layer hands its values on); "
                                "to leave some layers out (Sparse-ResFormer), give them value_lambdas: [0, 1]",
                                residual[0],
                            )
                        )
        return problems

    def layer_components(self, part: Literal["encoder", "decoder"], index: int) -> dict[str, ComponentParams]:
        """Layer ``index``'s attention, ffn and norm params in the ``part`` stack: the stack's, changed
        by its kind in the pattern, then by an override of that layer (validated recipes only)."""
        stack = self.stack(part)
        components = self._stack_components(part)
        steps = []
        if stack.pattern:
            steps.append(stack.kinds[stack.pattern[index % len(stack.pattern)]])
        for key in (index, index - stack.layers):
            if key in stack.overrides:
                steps.append(stack.overrides[key])
        for changes in steps:
            for family in LAYER_FAMILIES:
                change = getattr(changes, family)
                if change is not None:
                    components[family] = _merged(components[family], change)
        return components

    def layer_kinds(self, part: Literal["encoder", "decoder"]) -> list[str]:
        """A label for each layer of the ``part`` stack: its kind in the pattern (else ``layer``), with
        ``+override`` where an override changes it (what ``tfbuilder show`` prints)."""
        stack = self.stack(part)
        labels = []
        for index in range(stack.layers):
            label = stack.pattern[index % len(stack.pattern)] if stack.pattern else "layer"
            if index in stack.overrides or index - stack.layers in stack.overrides:
                label += "+override"
            labels.append(label)
        return labels

    def components(self) -> list[tuple[tuple, ComponentParams]]:
        """Every component the model uses, with its location in the recipe (defaults resolved)."""
        found: list[tuple[tuple, ComponentParams]] = [(("position",), self.position), (("norm",), self.norm)]
        found += [(("attention",), self.attention), (("ffn",), self.ffn)]
        for part in ("encoder", "decoder"):
            stack = self.stack(part)
            if stack is None:
                continue
            cross = stack.cross_attention if isinstance(stack, DecoderSection) else None
            for field, params in (
                ("attention", stack.attention),
                ("cross_attention", cross),
                ("ffn", stack.ffn),
                ("norm", stack.norm),
            ):
                if params is not None:
                    found.append(((part, field), params))
            base = self._stack_components(part)
            for loc, changes in self._changes(part):  # (merged: checked already by _layer_problems)
                found += [
                    (loc + (f,), _merged(base[f], getattr(changes, f)))
                    for f in LAYER_FAMILIES
                    if getattr(changes, f) is not None
                ]
        return found

    def stack(self, part: Literal["encoder", "decoder"]) -> StackSection | DecoderSection | None:
        """The ``part`` stack's section, None when the kind has no such stack."""
        return self.encoder if part == "encoder" else self.decoder

    def self_attention(self, part: Literal["encoder", "decoder"]) -> AttentionParams:
        """The self-attention of the ``part`` stack (encoder or decoder): its own, else ``model.attention``."""
        stack = self.stack(part)
        return (stack.attention if stack is not None else None) or self.attention

    def attention_shape(self, part: Literal["encoder", "decoder"]) -> AttentionShape:
        """Heads and key width per head of the ``part`` stack's self-attention, from its params'
        contract: what its layers and the position module of the side feeding it are built for."""
        return self.self_attention(part).shape(self.d_model)

    @property
    def uses_final_norm(self) -> bool:
        return self.placement != "post" if self.final_norm is None else self.final_norm


def _merged(base: ComponentParams, change: dict[str, Any]) -> ComponentParams:
    """``base`` changed by the partial mapping ``change``: merged over its params, or, when ``change``
    names another type, that type from its defaults; validated by the type's params model."""
    name = change.get("type", base.type)
    if not isinstance(name, str) or name not in registry.types(base.family):
        names = registry.types(base.family)
        raise PydanticCustomError(
            "component_type_unknown",
            "unknown {family} type '{name}'{hint}",
            {"family": base.family, "name": str(name), "hint": did_you_mean(str(name), names)},
        )
    data = {**base.model_dump(), **change} if name == base.type else dict(change)
    return registry.get(base.family, name).params.model_validate(data)


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
        problems: list[tuple[tuple, str, Any]] = []
        if self.data is not None:
            wanted = {
                "encoder_decoder": ("parallel", "synthetic"),
                "decoder": ("monolingual",),
                "encoder": ("monolingual",),
            }
            if self.model.head is not None:  # one prediction per text: labelled texts
                wanted = {kind: ("labelled",) for kind in wanted}
            if self.data.type == "labelled" and self.model.head is None and self.model.kind != "encoder_decoder":
                problems.append(
                    (
                        ("model", "head"),
                        "labelled data trains a sequence head: set model.head: {type: classify, classes: N} or {type: regress}",
                        None,
                    )
                )
            elif self.data.type not in wanted[self.model.kind]:
                problems.append(
                    (
                        ("data", "type"),
                        f"a model of kind '{self.model.kind}' trains on {' or '.join(wanted[self.model.kind])} data",
                        self.data.type,
                    )
                )
            size = self.data.vocab_size
            if size is not None and size != self.model.vocab_size:
                problems.append(
                    (
                        ("model", "vocab_size"),
                        f"model.vocab_size ({self.model.vocab_size}) differs from the data's vocabulary ({size}); leave it out to use the data's",
                        self.model.vocab_size,
                    )
                )
            if size is not None and self.model.src_vocab_size not in (None, size):
                # Each side's tokenizer has the data's vocabulary: a smaller source table cannot embed its ids.
                problems.append(
                    (
                        ("model", "src_vocab_size"),
                        f"model.src_vocab_size ({self.model.src_vocab_size}) differs from the data's vocabulary ({size}); leave it out to use the data's",
                        self.model.src_vocab_size,
                    )
                )
            if self.model.share_embeddings and not self.data.tokenizer.shared and self.data.type == "parallel":
                problems.append(
                    (("model", "share_embeddings"), "share_embeddings needs data.tokenizer.shared: true", True)
                )
            pad = self.data.pad_id
            if self.model.pad_id is not None and pad is not None and self.model.pad_id != pad:
                # One pad id for masks, loss and batches: the data's tokenizers pad with <pad>.
                problems.append(
                    (
                        ("model", "pad_id"),
                        f"the data pads with id {pad} (<pad>); model.pad_id ({self.model.pad_id}) must be {pad} when training on data",
                        self.model.pad_id,
                    )
                )
            facts = self.data.tokenizer.facts()
            if facts is not None:
                for why in lacking(facts.found, self.model.kind):
                    problems.append(
                        (
                            ("data", "tokenizer", "path"),
                            f"a model of kind '{self.model.kind}' cannot train with this tokenizer: {why}; name its tokens in data.tokenizer.specials",
                            self.data.tokenizer.path,
                        )
                    )
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

    _path: Path | None = PrivateAttr(None)

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
    valid = isinstance(size, int) and not isinstance(size, bool) and SPECIAL_COUNT + 1 <= size <= 10_000_000
    return size if valid else SPECIAL_COUNT + 11  # any vocabulary with ordinary tokens will do


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
            message = f"the recipe has no name, and its file name {path.stem!r} is not one (letters, digits, . _ -): add a name: line"
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
    import copy

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


def validate(src: Source) -> Recipe:
    """Validate loaded data against the schema, translating errors to positions."""
    try:
        recipe = Recipe.model_validate(src.data)
    except ValidationError as exc:
        raise RecipeError(translate(exc, src)) from None
    recipe._source = src
    return recipe


MAX_SUGGESTIONS = 100  # unknown keys of one recipe that get a "did you mean"


def translate(exc: ValidationError, src: Source) -> list[Problem]:
    """Pydantic errors -> problems with file, line, column, dotted path and a helpful message."""
    merged: dict[tuple, tuple[str, str, Any]] = {}  # data path -> (kind, message, input)
    suggestions = MAX_SUGGESTIONS  # "did you mean" costs a fuzzy search: thousands of unknown keys get none
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
            suggestions -= 1
            message = f"unknown key '{key}'" + (
                did_you_mean(str(key), cls.model_fields) if cls and suggestions >= 0 else ""
            )
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
            elif isinstance(got, (datetime.date, datetime.datetime)):
                message = f"{message} (YAML reads {got.isoformat()} as a date: quote it, '{got.isoformat()}')"
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
