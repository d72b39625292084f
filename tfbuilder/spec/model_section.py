"""The recipe's ``model`` section: the architecture, its initialisation and multi-token prediction,
with the checks across its fields (schema only, no tensors). Defaults are the paper's base model
(Vaswani et al. 2017, arXiv:1706.03762, Table 3 'base')."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tfbuilder.params import AttentionParams, AttentionShape, ComponentParams, ModelDims, PositionParams
from tfbuilder.spec.base import Issue, Section, fail
from tfbuilder.spec.head import HeadSection, head_problems
from tfbuilder.spec.slots import Attention, Ffn, Norm, Position, default_component, merged_params
from tfbuilder.spec.stacks import (
    LAYER_FAMILIES,
    DecoderSection,
    LayerChanges,
    StackSection,
    change_problems,
    index_problems,
    pattern_problems,
)

Part = Literal["encoder", "decoder"]
PARTS: tuple[Part, ...] = ("encoder", "decoder")

PositiveFloat = Annotated[float, Field(gt=0.0, le=1e6)]


class InitSection(Section):
    """Initialisation. By default each component initialises itself (Xavier for attention, the paper's
    N(0, d^-1/2) embedding); ``std`` sets every linear and embedding weight to N(0, std), biases to 0."""

    std: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="normal std of every linear and embedding weight, biases zero (GPT-2, BERT, Llama: 0.02); default: "
        "each component's own",
    )
    residual_scaling: bool = Field(
        False,
        description="divide the std of each residual branch's output projection by sqrt(2 * layers) (GPT-2, "
        "Radford et al. 2019)",
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
        description="id of the padding token (masked as a key, ignored by the loss); null: no padding token (GPT-2, "
        "Llama)",
    )
    d_model: int = Field(512, ge=1, le=65536, description="model width d_model")
    dropout: float = Field(
        0.1, ge=0.0, lt=1.0, description="P_drop: on embeddings+positions and every sub-layer output"
    )
    placement: Literal["post", "pre", "sandwich", "output"] = Field(
        "post",
        description="norm placement: post (the paper: Norm(x + f(x))), pre (x + f(Norm(x))), sandwich (x + "
        "Norm(f(Norm(x)))) or output (x + Norm(f(x)): OLMo 2's reordered norm, arXiv:2501.00656)",
    )
    final_norm: bool | None = Field(None, description="norm after each stack; default false for post, true otherwise")
    block: Literal["sequential", "parallel"] = Field(
        "sequential",
        description="sequential (the paper: attention, then feed-forward) or parallel (GPT-J, PaLM arXiv:2204.02311: "
        "x + attn(norm(x)) + ffn(norm(x)); one-stack kinds, placement pre or sandwich)",
    )
    parallel_norms: Literal["shared", "separate"] = Field(
        "shared",
        description="parallel blocks: one norm shared by both branches (GPT-J, PaLM) or one norm per branch (GPT-NeoX)",
    )
    share_embeddings: bool = Field(True, description="source and target share one embedding matrix (sec. 3.4)")
    tie_output: bool = Field(True, description="the pre-softmax projection reuses the target embedding (sec. 3.4)")
    position: Position = Field(
        default_factory=default_component("position", "sinusoidal", PositionParams), description="positional encoding"
    )
    attention: Attention = Field(
        default_factory=default_component("attention", "multihead", AttentionParams), description="attention"
    )
    ffn: Ffn = Field(
        default_factory=default_component("ffn", "mlp", ComponentParams), description="position-wise feed-forward"
    )
    norm: Norm = Field(
        default_factory=default_component("norm", "layernorm", ComponentParams), description="normalisation"
    )
    embed_scale: PositiveFloat | Literal["sqrt_d_model"] = Field(
        "sqrt_d_model",
        description="token embeddings are multiplied by this: sqrt_d_model (the paper, "
        "sec. 3.4) or a number (1 for GPT-2, BERT, T5, Llama)",
    )
    output_scale: PositiveFloat | Literal["rsqrt_d_model"] = Field(
        1.0,
        description="hidden states are multiplied by this before the output head: a number, "
        "or rsqrt_d_model (T5's d_model^-0.5 before its tied head)",
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
        description="soft-cap the output logits to softcap * tanh(logits / softcap) (Gemma 2, Gemma Team 2024, "
        "arXiv:2408.00118: 30); default none",
    )
    init: InitSection = Field(default_factory=InitSection, description="initialisation of the weights")
    encoder: StackSection | None = Field(None, description="the encoder stack (kinds encoder_decoder and encoder)")
    decoder: DecoderSection | None = Field(None, description="the decoder stack (kinds encoder_decoder and decoder)")
    mtp: MultiTokenSection | None = Field(
        None, description="multi-token prediction modules trained beside the output head (kind decoder); default none"
    )
    head: HeadSection | None = Field(
        None,
        description="a sequence head (classify or regress) instead of the language-model output; default: "
        "none (kinds encoder and decoder)",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        problems = self._stack_problems() + self._layer_problems()
        if problems:  # the checks below read the stacks and their layers
            fail("ModelSection", problems)
        problems = self._component_problems() + self._vocabulary_problems() + self._kind_feature_problems()
        problems += self._padding_problems() + self._head_problems()
        fail("ModelSection", problems)
        return self

    def _stack_problems(self) -> list[Issue]:
        """The stacks the kind needs, present, and no others."""
        problems: list[Issue] = []
        needs = {"encoder_decoder": ("encoder", "decoder"), "decoder": ("decoder",), "encoder": ("encoder",)}[self.kind]
        for part in PARTS:
            present = self.stack(part) is not None
            if part in needs and not present:
                article = "an" if part == "encoder" else "a"
                example = f"{part}: {{layers: 6}}"
                problems.append(((part,), f"kind '{self.kind}' needs {article} {part} section (e.g. {example})", None))
            elif part not in needs and present:
                message = f"kind '{self.kind}' has no {part}; remove this section (or set {part}: null where inherited)"
                problems.append(((part,), message, None))
        return problems

    def _layer_problems(self) -> list[Issue]:
        """Patterns naming unknown kinds, kinds never used, layer indices out of range, and merged
        params that their type refuses (each at the kind or override that wrote it)."""
        problems: list[Issue] = []
        for part in PARTS:
            stack = self.stack(part)
            if stack is None:
                continue
            problems += pattern_problems(part, stack) + index_problems(part, stack)
            base = self._stack_components(part)
            for loc, changes in self._changes(part):
                for family in LAYER_FAMILIES:
                    change = getattr(changes, family)
                    if change is not None:
                        problems += change_problems(loc + (family,), base[family], change, self.d_model)
        return problems

    def _component_problems(self) -> list[Issue]:
        """What each component's params refuse given the model's shared dimensions, and what each
        position refuses given the self-attention it acts in."""
        dims = ModelDims(d_model=self.d_model)
        problems: list[Issue] = [
            (loc + (field,), message, getattr(params, field, None))
            for loc, params in self.components()
            for field, message in params.check(dims)
        ]
        for part, stack in self.stacks().items():
            shape = self.attention_shape(part)
            changed = any(changes.position is not None for _, changes in self._changes(part))
            for index in range(stack.layers if changed else 1):  # each layer's position, changes merged
                params = self.layer_components(part, index)["position"]
                checks = params.check_shape(shape) if isinstance(params, PositionParams) else []
                for field, message in checks:
                    issue = (self._position_source(part, index) + (field,), message, getattr(params, field, None))
                    problems += [] if issue in problems else [issue]
        return problems

    def _position_source(self, part: Part, index: int) -> tuple:
        """Where layer ``index``'s position was last changed: its override's, its kind's, or ``model.position``."""
        stack = self.present_stack(part)
        for key in (index - stack.layers, index):
            if key in stack.overrides and stack.overrides[key].position is not None:
                return (part, "overrides", key, "position")
        kind = stack.pattern[index % len(stack.pattern)] if stack.pattern else None
        if kind is not None and stack.kinds[kind].position is not None:
            return (part, "kinds", kind, "position")
        return ("position",)

    def _vocabulary_problems(self) -> list[Issue]:
        """A source vocabulary where there is none, or one that a shared embedding cannot hold."""
        problems: list[Issue] = []
        if self.src_vocab_size is not None and self.kind != "encoder_decoder":
            message = f"kind '{self.kind}' has one vocabulary; remove src_vocab_size"
            problems.append((("src_vocab_size",), message, self.src_vocab_size))
        if self.share_embeddings and self.src_vocab_size not in (None, self.vocab_size):
            message = f"share_embeddings needs src_vocab_size ({self.src_vocab_size}) == vocab_size ({self.vocab_size})"
            problems.append((("src_vocab_size",), message, self.src_vocab_size))
        return problems

    def _kind_feature_problems(self) -> list[Issue]:
        """Features that only some kinds of model, or only parallel blocks, have."""
        problems: list[Issue] = []
        if self.mtp is not None and self.kind != "decoder":
            message = (
                f"multi-token prediction is for decoder-only language models (kind decoder), not kind '{self.kind}'"
            )
            problems.append((("mtp",), message, None))
        if self.block == "parallel" and self.kind == "encoder_decoder":
            message = (
                "parallel blocks are for one-stack models (kinds decoder and encoder): "
                "a decoder with cross-attention has no parallel form"
            )
            problems.append((("block",), message, self.block))
        if self.block == "parallel" and self.placement in ("post", "output"):
            message = "parallel blocks normalise before their branches: use placement pre or sandwich"
            problems.append((("placement",), message, self.placement))
        if self.parallel_norms == "separate" and self.block != "parallel":
            problems.append((("parallel_norms",), "parallel_norms is for block: parallel", self.parallel_norms))
        if self.token_types and self.kind == "encoder_decoder":
            message = "token_types are for one-stack models (kinds decoder and encoder)"
            problems.append((("token_types",), message, self.token_types))
        return problems

    def _padding_problems(self) -> list[Issue]:
        """A padding id where one is needed, inside every vocabulary."""
        problems: list[Issue] = []
        if self.pad_id is None and self.kind == "encoder_decoder":
            message = "an encoder_decoder model needs pad_id (source padding must be masked)"
            problems.append((("pad_id",), message, None))
        for name, size in (("vocab_size", self.vocab_size), ("src_vocab_size", self.src_vocab_size)):
            if size is not None and self.pad_id is not None and self.pad_id >= size:
                message = f"pad_id ({self.pad_id}) must be smaller than {name} ({size})"
                problems.append((("pad_id",), message, self.pad_id))
        return problems

    def _head_problems(self) -> list[Issue]:
        """A sequence head on a model that can carry one, and no next-token modules beside it."""
        if self.head is None:
            return []
        problems = head_problems(self.head, self.kind)
        if self.mtp is not None:
            message = (
                "multi-token prediction trains next-token outputs; a model with a sequence head (model.head) has none"
            )
            problems.append((("mtp",), message, None))
        return problems

    def _stack_components(self, part: Part) -> dict[str, ComponentParams]:
        """The ``part`` stack's own components (its section's, else the model's), by family."""
        stack = self.present_stack(part)
        return {
            "attention": self.self_attention(part),
            "ffn": stack.ffn or self.ffn,
            "norm": stack.norm or self.norm,
            "position": self.position,
        }

    def _changes(self, part: Part) -> list[tuple[tuple, LayerChanges]]:
        """Every set of layer changes of the ``part`` stack, with its location (kinds, then overrides)."""
        stack = self.present_stack(part)
        found = [((part, "kinds", name), changes) for name, changes in stack.kinds.items()]
        return found + [((part, "overrides", index), changes) for index, changes in stack.overrides.items()]

    def layer_components(self, part: Part, index: int) -> dict[str, ComponentParams]:
        """Layer ``index``'s attention, ffn, norm and position params in the ``part`` stack: the stack's
        (the position: the model's), changed by its kind in the pattern, then by an override of that
        layer (validated recipes only)."""
        stack = self.present_stack(part)
        components = self._stack_components(part)
        steps: list[LayerChanges] = []
        if stack.pattern:
            steps.append(stack.kinds[stack.pattern[index % len(stack.pattern)]])
        for key in (index, index - stack.layers):
            if key in stack.overrides:
                steps.append(stack.overrides[key])
        for changes in steps:
            for family in LAYER_FAMILIES:
                change = getattr(changes, family)
                if change is not None:
                    components[family] = merged_params(components[family], change)
        return components

    def layer_kinds(self, part: Part) -> list[str]:
        """A label for each layer of the ``part`` stack: its kind in the pattern (else ``layer``), with
        ``+override`` where an override changes it (what ``tfbuilder show`` prints)."""
        stack = self.present_stack(part)
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
        for part in PARTS:
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
                    (loc + (f,), merged_params(base[f], getattr(changes, f)))
                    for f in LAYER_FAMILIES
                    if getattr(changes, f) is not None
                ]
        return found

    def stack(self, part: Part) -> StackSection | DecoderSection | None:
        """The ``part`` stack's section, None when the kind has no such stack."""
        return self.encoder if part == "encoder" else self.decoder

    def stacks(self) -> dict[Part, StackSection]:
        """The sections of the stacks the kind has, encoder first."""
        return {part: stack for part in PARTS if (stack := self.stack(part)) is not None}

    def present_stack(self, part: Part) -> StackSection:
        """The ``part`` stack's section, for a model whose kind has that stack (LookupError otherwise)."""
        stack = self.stack(part)
        if stack is None:
            raise LookupError(f"a model of kind '{self.kind}' has no {part} stack")
        return stack

    def self_attention(self, part: Part) -> AttentionParams:
        """The self-attention of the ``part`` stack (encoder or decoder): its own, else ``model.attention``."""
        stack = self.stack(part)
        return (stack.attention if stack is not None else None) or self.attention

    def attention_shape(self, part: Part) -> AttentionShape:
        """Heads and key width per head of the ``part`` stack's self-attention, from its params'
        contract: what its layers and the position module of the side feeding it are built for."""
        return self.self_attention(part).shape(self.d_model)

    @property
    def uses_final_norm(self) -> bool:
        return self.placement != "post" if self.final_norm is None else self.final_norm
