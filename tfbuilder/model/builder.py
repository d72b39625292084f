"""Validated recipe -> ``nn.Module``. The only caller of the registry's factories."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from torch import nn

from tfbuilder import registry
from tfbuilder.contracts import Attention, FeedForward
from tfbuilder.errors import Problem, RecipeError
from tfbuilder.model.blocks import DecoderLayer, EncoderLayer, ParallelLayer, Residual, Stack
from tfbuilder.model.components.position import AttentionPosition
from tfbuilder.model.heads import SequenceHead
from tfbuilder.model.model import (
    AuxiliaryLosses,
    DecoderOnly,
    Embedding,
    EncoderDecoder,
    EncoderOnly,
    MLMHead,
    Model,
    OutputProjection,
    token_embedding,
)
from tfbuilder.model.multi_token import MultiTokenPrediction, PredictionModule
from tfbuilder.registry import BuildContext, ComponentParams, StackShared
from tfbuilder.spec.model_section import InitSection, ModelSection
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.sources import dotted_path
from tfbuilder.spec.stacks import DecoderSection, StackSection


def build_model(recipe: Recipe | ModelSection) -> Model:
    """Build the model a recipe (or its ``model`` section) describes.

    ``encoder_decoder``: ``model(src, tgt)`` with int64 ids (b, j) and (b, i) -> logits (b, i, vocab);
    ``decoder`` and ``encoder``: ``model(tokens)`` (b, n) -> logits (b, n, vocab).
    """
    spec = recipe.model if isinstance(recipe, Recipe) else recipe
    return _Builder(spec, recipe if isinstance(recipe, Recipe) else None).model()


class _Builder:
    def __init__(self, spec: ModelSection, recipe: Recipe | None):
        self.spec = spec
        self.recipe = recipe

    def component(self, family: str, params: ComponentParams, ctx: BuildContext, where: tuple) -> nn.Module:
        try:
            return registry.build(family, params, ctx)
        except (ValueError, TypeError) as exc:
            # A component refusing its params is a recipe problem: report it where it was written.
            loc = ("model",) + where
            problem = (
                self.recipe.problem(loc, str(exc)) if self.recipe is not None else Problem(str(exc), dotted_path(loc))
            )
            raise RecipeError([problem]) from exc

    def norm(self, stack: StackSection | None, where: str, params: ComponentParams | None = None) -> nn.Module:
        """A norm: ``params``, else the stack's, else the model's."""
        params = params or (stack.norm if stack else None) or self.spec.norm
        return self.component("norm", params, BuildContext(d_model=self.spec.d_model), (where, "norm"))

    def residual(
        self,
        inner: nn.Module,
        stack: StackSection,
        where: str,
        *,
        norm: bool = True,
        norm_params: ComponentParams | None = None,
    ) -> Residual:
        """``inner`` wrapped with its norm(s) (``norm_params``: a layer's own), dropout and residual;
        ``norm=False``: an identity for its input norm (the feed-forward of a parallel layer that
        shares the attention's norm)."""
        sandwich = self.spec.placement == "sandwich"
        return Residual(
            inner,
            self.norm(stack, where, norm_params) if norm else nn.Identity(),
            placement=self.spec.placement,
            dropout=self.spec.dropout,
            norm_out=self.norm(stack, where, norm_params) if sandwich else None,
        )

    def attention_shape(self, part: Literal["encoder", "decoder"]) -> tuple[int, int]:
        """Heads and key width per head of the ``part`` stack's self-attention (the params' contract),
        or the width its rotary part has when that is narrower (latent attention's): what its layers
        and the position modules acting in it are built for (read here only, so they agree)."""
        shape = self.spec.attention_shape(part)
        return shape.heads, shape.key_dim if shape.rotary_dim is None else shape.rotary_dim

    def position_ctx(self, part: Literal["encoder", "decoder"]) -> BuildContext:
        """The build context of a position module feeding or acting in the ``part`` stack."""
        heads, head_dim = self.attention_shape(part)
        return BuildContext(d_model=self.spec.d_model, causal=part == "decoder", heads=heads, head_dim=head_dim)

    def layer_positions(
        self, part: Literal["encoder", "decoder"], shared: AttentionPosition | None, count: int
    ) -> tuple[list[AttentionPosition | None], list[nn.Module]]:
        """The position acting in each of ``count`` layers' self-attention: ``shared`` (the embedding's)
        where the layer's position params are the model's, else one built for those params and shared
        by the layers that have them (None for ``type: none``); and the modules built here."""
        built: list[tuple[ComponentParams, nn.Module]] = []
        out: list[AttentionPosition | None] = []
        for index in range(count):
            params = self.spec.layer_components(part, index)["position"]
            if params == self.spec.position:
                out.append(shared)
                continue
            module = next((m for p, m in built if p == params), None)
            if module is None:
                module = self.component("position", params, self.position_ctx(part), (part, "position"))
                built.append((params, module))
            out.append(module if isinstance(module, AttentionPosition) else None)
        return out, [m for _, m in built]

    def stack(self, part: Literal["encoder", "decoder"], position: nn.Module, *, layers: int | None = None) -> Stack:
        """The encoder or decoder stack (``layers`` of them, default the section's); ``position`` is its
        side's position module, given to self-attention when it acts there (an :class:`AttentionPosition`)."""
        spec = self.spec
        in_attention = position if isinstance(position, AttentionPosition) else None
        section = spec.present_stack(part)
        decoder = isinstance(section, DecoderSection)
        own_cross = section.cross_attention if isinstance(section, DecoderSection) else None
        cross_params = own_cross or spec.self_attention(part)
        heads, head_dim = self.attention_shape(part)
        count = section.layers if layers is None else layers
        stack_ctx = BuildContext(
            d_model=spec.d_model,
            causal=decoder,
            heads=heads,
            head_dim=head_dim,
            position=in_attention,
            num_layers=count,
            shared=StackShared(),
        )
        built: list[nn.Module] = []
        parallel = spec.block == "parallel"
        positions, own_positions = self.layer_positions(part, in_attention, count)
        for index in range(count):
            ctx = replace(stack_ctx, layer=index, position=positions[index])
            cross_ctx = BuildContext(d_model=spec.d_model, cross=True, layer=index, num_layers=count)
            own = spec.layer_components(part, index)  # the stack's, changed by pattern and overrides
            attention, ffn, norm = own["attention"], own["ffn"], own["norm"]
            self_attn = self.residual(
                self.component("attention", attention, ctx, (part, "attention")), section, part, norm_params=norm
            )
            own_norm = not (parallel and spec.parallel_norms == "shared")
            ff = self.residual(
                self.component("ffn", ffn, ctx, (part, "ffn")), section, part, norm=own_norm, norm_params=norm
            )
            if parallel:  # one-stack kinds only (validated): no cross-attention
                built.append(ParallelLayer(self_attn=self_attn, ffn=ff, shared_norm=not own_norm))
                continue
            if not decoder:
                built.append(EncoderLayer(self_attn=self_attn, ffn=ff))
                continue
            cross = None
            if spec.kind == "encoder_decoder":
                where = (part, "cross_attention" if own_cross else "attention")
                cross = self.residual(
                    self.component("attention", cross_params, cross_ctx, where), section, part, norm_params=norm
                )
            built.append(DecoderLayer(self_attn=self_attn, cross_attn=cross, ffn=ff))
        final = self.norm(section, part) if spec.uses_final_norm else None
        return Stack(built, final, positions=own_positions)

    def embedding(self, tokens: nn.Embedding, *, part: Literal["encoder", "decoder"]) -> Embedding:
        """Token embedding plus the position module of the side that feeds the ``part`` stack
        (positions acting inside attention take that stack's heads and key width)."""
        position = self.component("position", self.spec.position, self.position_ctx(part), ("position",))
        spec = self.spec
        types = None
        if spec.token_types:
            types = nn.Embedding(spec.token_types, spec.d_model)
            nn.init.normal_(types.weight, std=0.02)  # BERT's initializer_range
        norm = self.norm(None, "embed") if spec.embed_norm else None
        scale = None if spec.embed_scale == "sqrt_d_model" else spec.embed_scale
        return Embedding(tokens, position, dropout=spec.dropout, scale=scale, types=types, norm=norm)

    def multi_token(self, position: nn.Module) -> MultiTokenPrediction | None:
        """DeepSeek-V3's prediction modules (``model.mtp``): per depth two norms of the decoder's kind
        and one decoder layer with the decoder's components."""
        if self.spec.mtp is None:
            return None
        section = self.spec.decoder
        modules = [
            PredictionModule(
                d_model=self.spec.d_model,
                norm_hidden=self.norm(section, "decoder"),
                norm_embed=self.norm(section, "decoder"),
                layer=self.stack("decoder", position, layers=1),
            )
            for _ in range(self.spec.mtp.depth)
        ]
        return MultiTokenPrediction(modules, weight=self.spec.mtp.weight)

    def output(self, tokens: nn.Embedding) -> OutputProjection:
        spec = self.spec
        scale = spec.d_model**-0.5 if spec.output_scale == "rsqrt_d_model" else spec.output_scale
        out = OutputProjection(
            spec.d_model, spec.vocab_size, bias=spec.head_bias, scale=scale, softcap=spec.logit_softcap
        )
        if spec.tie_output:
            out.weight = tokens.weight
        else:
            nn.init.normal_(out.weight, std=spec.d_model**-0.5)
        if out.bias is not None:
            nn.init.zeros_(out.bias)
        return out

    def sequence_head(self) -> SequenceHead | None:
        """The recipe's ``model.head`` (classify or regress), None for the language-model output."""
        spec, head = self.spec, self.spec.head
        if head is None:
            return None
        dropout = spec.dropout if head.dropout is None else head.dropout
        return SequenceHead(
            d_model=spec.d_model,
            outputs=head.outputs,
            pooling=head.pooling_for(spec.kind),
            dropout=dropout,
            pad_id=spec.pad_id,
            bias=head.bias,
            pooler=head.pooler,
        )

    def model(self) -> Model:
        model = self._model()
        apply_init(model, self.spec.init)
        return model

    def _model(self) -> Model:
        spec = self.spec
        tgt_tokens = token_embedding(spec.vocab_size, spec.d_model)
        if spec.kind == "encoder_decoder":
            if spec.share_embeddings:
                src_tokens = tgt_tokens
            else:
                src_tokens = token_embedding(spec.src_vocab_size or spec.vocab_size, spec.d_model)
            src_embed, tgt_embed = (
                self.embedding(src_tokens, part="encoder"),
                self.embedding(tgt_tokens, part="decoder"),
            )
            return EncoderDecoder(
                src_embed=src_embed,
                tgt_embed=tgt_embed,
                encoder=self.stack("encoder", src_embed.position),
                decoder=self.stack("decoder", tgt_embed.position),
                head=self.output(tgt_tokens),
                pad_id=spec.pad_id,
            )
        if spec.kind == "decoder":
            embed = self.embedding(tgt_tokens, part="decoder")
            return DecoderOnly(
                embed=embed,
                decoder=self.stack("decoder", embed.position),
                head=self.sequence_head() or self.output(tgt_tokens),
                pad_id=spec.pad_id,
                mtp=self.multi_token(embed.position),
            )
        embed = self.embedding(tgt_tokens, part="encoder")
        head = self.sequence_head() or MLMHead(spec.d_model, self.norm(None, "encoder"), self.output(tgt_tokens))
        return EncoderOnly(embed=embed, encoder=self.stack("encoder", embed.position), head=head, pad_id=spec.pad_id)


def apply_init(model: AuxiliaryLosses, init: InitSection) -> None:
    """Every linear and embedding weight N(0, std), biases zero, norms left at their identity (GPT-2,
    Radford et al. 2019; BERT, Devlin et al. 2019). With ``residual_scaling``, the projections that end
    each residual branch (each attention's and feed-forward's ``output_projections()``, see
    :mod:`tfbuilder.contracts`) get std / sqrt(2 * layers), so that the residual stream's variance does
    not grow with depth (GPT-2, sec. 2.3). Without ``std``, each component keeps its own."""
    std = init.std
    if std is None:
        return
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    if not init.residual_scaling:
        return
    for stack in model.stacks().values():
        scaled = std / (2 * len(stack.layers)) ** 0.5
        for residual in (m for m in stack.modules() if isinstance(m, Residual)):
            branch = residual.inner
            if not isinstance(branch, (Attention, FeedForward)):
                raise TypeError(f"{type(branch).__name__} has no output_projections() (see tfbuilder.contracts)")
            for linear in branch.output_projections():
                nn.init.normal_(linear.weight, std=scaled)


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in module.parameters())
