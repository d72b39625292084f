"""tfbuilder state dicts <-> Hugging Face state dicts, for every family.

A mapping is a list of rules ``(ours, theirs, op)``: ``copy`` a tensor, ``T`` transpose it (GPT-2's
Conv1D stores (in, out)), ``cat`` several along dim 0 (tfbuilder fuses q, k, v and the GLU's gate
and value), or ``any``: one tensor that Hugging Face may store under any of several names (read from
the first present, written under all), ``plus1``: Gemma's norm gains, stored minus one. The same
rules read both ways, so export inverts import by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

from tfbuilder.contracts import ComponentParams
from tfbuilder.interop.hf.configs import UnsupportedConfig, ffn_bias, stack_layers
from tfbuilder.interop.hf.families import DECODERS, FUSED, GEMMA, LATENT, QK_NORM, QK_NORM_ALL, DecoderFamily
from tfbuilder.model.blocks import Residual
from tfbuilder.model.components.attention import MultiHeadParams
from tfbuilder.model.components.latent_attention import LatentAttention
from tfbuilder.model.components.moe import MixtureOfExperts

if TYPE_CHECKING:
    from tfbuilder.spec.recipe import ModelSection

Rule = tuple[str, tuple[str, ...], str]


@runtime_checkable
class _Fuses(Protocol):
    """An attention or feed-forward (the component contract): the widths of its fused projections."""

    def fused_widths(self) -> dict[str, list[int]]: ...


def _linear(ours: str, theirs: str, op: str = "copy", *, bias: bool = True) -> list[Rule]:
    rules: list[Rule] = [(f"{ours}.weight", (f"{theirs}.weight",), op)]
    if bias:
        rules.append((f"{ours}.bias", (f"{theirs}.bias",), "copy"))
    return rules


def _fused(ours: str, theirs: list[str], *, bias: bool) -> list[Rule]:
    rules: list[Rule] = [(f"{ours}.weight", tuple(f"{t}.weight" for t in theirs), "cat")]
    if bias:
        rules.append((f"{ours}.bias", tuple(f"{t}.bias" for t in theirs), "cat"))
    return rules


def rules(family: str, model: ModelSection) -> list[Rule]:
    """The mapping of ``family`` for a model section (shapes come from the tensors themselves)."""
    if family in DECODERS:
        return _decoder(DECODERS[family], model)
    return {"gpt2": _gpt2, "bert": _bert, "t5": _t5}[family](model)


def _gpt2(m: ModelSection) -> list[Rule]:
    out: list[Rule] = [("embed.tokens.weight", ("transformer.wte.weight",), "copy")]
    out.append(("head.weight", ("transformer.wte.weight" if m.tie_output else "lm_head.weight",), "copy"))
    out.append(("embed.position.table.weight", ("transformer.wpe.weight",), "copy"))
    for i in range(stack_layers(m, "decoder")):
        ours, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        out += _linear(f"{ours}.self_attn.norm", f"{theirs}.ln_1")
        out += _linear(f"{ours}.self_attn.inner.to_qkv", f"{theirs}.attn.c_attn", "T")
        out += _linear(f"{ours}.self_attn.inner.to_out", f"{theirs}.attn.c_proj", "T")
        out += _linear(f"{ours}.ffn.norm", f"{theirs}.ln_2")
        out += _linear(f"{ours}.ffn.inner.ff_in", f"{theirs}.mlp.c_fc", "T")
        out += _linear(f"{ours}.ffn.inner.ff_out", f"{theirs}.mlp.c_proj", "T")
    out += _linear("decoder.final_norm", "transformer.ln_f")
    return out


def _bert(m: ModelSection) -> list[Rule]:
    e = "bert.embeddings"
    out: list[Rule] = [("embed.tokens.weight", (f"{e}.word_embeddings.weight",), "copy")]
    out.append(("embed.position.table.weight", (f"{e}.position_embeddings.weight",), "copy"))
    out.append(("embed.types.weight", (f"{e}.token_type_embeddings.weight",), "copy"))
    out += _linear("embed.norm", f"{e}.LayerNorm")
    for i in range(stack_layers(m, "encoder")):
        ours, theirs = f"encoder.layers.{i}", f"bert.encoder.layer.{i}"
        att = f"{theirs}.attention"
        out += _fused(
            f"{ours}.self_attn.inner.to_qkv", [f"{att}.self.query", f"{att}.self.key", f"{att}.self.value"], bias=True
        )
        out += _linear(f"{ours}.self_attn.inner.to_out", f"{att}.output.dense")
        out += _linear(f"{ours}.self_attn.norm", f"{att}.output.LayerNorm")
        out += _linear(f"{ours}.ffn.inner.ff_in", f"{theirs}.intermediate.dense")
        out += _linear(f"{ours}.ffn.inner.ff_out", f"{theirs}.output.dense")
        out += _linear(f"{ours}.ffn.norm", f"{theirs}.output.LayerNorm")
    out += _linear("head.dense", "cls.predictions.transform.dense")
    out += _linear("head.norm", "cls.predictions.transform.LayerNorm")
    head = f"{e}.word_embeddings.weight" if m.tie_output else "cls.predictions.decoder.weight"
    out.append(("head.out.weight", (head,), "copy"))
    # transformers >= 5 computes with decoder.bias, tied to cls.predictions.bias only when the output is tied
    # (a tied file stores the latter alone); before, the two were always one tensor.
    out.append(("head.out.bias", ("cls.predictions.decoder.bias", "cls.predictions.bias"), "any"))
    return out


def _t5(m: ModelSection) -> list[Rule]:
    out: list[Rule] = [(f"{side}.tokens.weight", ("shared.weight",), "copy") for side in ("src_embed", "tgt_embed")]
    out.append(("head.weight", ("shared.weight",), "copy"))
    sides: tuple[tuple[Literal["encoder", "decoder"], str], ...] = (("encoder", "src_embed"), ("decoder", "tgt_embed"))
    for part, side in sides:
        bias = f"{part}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        out.append((f"{side}.position.table.weight", (bias,), "copy"))
        for i in range(stack_layers(m, part)):
            ours, theirs = f"{part}.layers.{i}", f"{part}.block.{i}.layer"
            sa = f"{theirs}.0.SelfAttention"
            out += _fused(f"{ours}.self_attn.inner.to_qkv", [f"{sa}.q", f"{sa}.k", f"{sa}.v"], bias=False)
            out += _linear(f"{ours}.self_attn.inner.to_out", f"{sa}.o", bias=False)
            out += _linear(f"{ours}.self_attn.norm", f"{theirs}.0.layer_norm", bias=False)
            ff = 1
            if part == "decoder":
                ca = f"{theirs}.1.EncDecAttention"
                out += _linear(f"{ours}.cross_attn.inner.to_q", f"{ca}.q", bias=False)
                out += _fused(f"{ours}.cross_attn.inner.to_kv", [f"{ca}.k", f"{ca}.v"], bias=False)
                out += _linear(f"{ours}.cross_attn.inner.to_out", f"{ca}.o", bias=False)
                out += _linear(f"{ours}.cross_attn.norm", f"{theirs}.1.layer_norm", bias=False)
                ff = 2
            out += _linear(f"{ours}.ffn.inner.ff_in", f"{theirs}.{ff}.DenseReluDense.wi", bias=False)
            out += _linear(f"{ours}.ffn.inner.ff_out", f"{theirs}.{ff}.DenseReluDense.wo", bias=False)
            out += _linear(f"{ours}.ffn.norm", f"{theirs}.{ff}.layer_norm", bias=False)
        out += _linear(f"{part}.final_norm", f"{part}.final_layer_norm", bias=False)
    return out


def _decoder(fam: DecoderFamily, m: ModelSection) -> list[Rule]:
    """A decoder family's names (Llama's, with the family's fused projections, query/key norms, and
    norms stored as gain - 1 for Gemma)."""
    out: list[Rule] = [("embed.tokens.weight", ("model.embed_tokens.weight",), "copy")]
    out.append(("head.weight", ("model.embed_tokens.weight" if m.tie_output else "lm_head.weight",), "copy"))
    attention: ComponentParams = m.attention
    bias = attention.bias if isinstance(attention, MultiHeadParams) else False
    norm_op = "plus1" if GEMMA in fam.features else "copy"
    for i in range(stack_layers(m, "decoder")):
        ours, theirs = f"decoder.layers.{i}", f"model.layers.{i}"
        sa, mlp = f"{theirs}.self_attn", f"{theirs}.mlp"
        if LATENT in fam.features and isinstance(attention, LatentAttention.Params):
            out += _latent(f"{ours}.self_attn.inner", sa, q_rank=attention.q_rank)
        else:
            if FUSED in fam.features:
                out += _linear(f"{ours}.self_attn.inner.to_qkv", f"{sa}.qkv_proj", bias=bool(bias))
            else:
                qkv = [f"{sa}.q_proj", f"{sa}.k_proj", f"{sa}.v_proj"]
                out += _fused(f"{ours}.self_attn.inner.to_qkv", qkv, bias=bool(bias))
            out += _linear(f"{ours}.self_attn.inner.to_out", f"{sa}.o_proj", bias=bias is True)
        ffn = m.layer_components("decoder", i)["ffn"]  # dense layers among sparse ones (DeepSeek-V3, Qwen2-MoE)
        out += _decoder_ffn(fam, ffn, f"{ours}.ffn.inner", mlp, bias=ffn_bias(ffn))
        if fam.features & {QK_NORM, QK_NORM_ALL}:
            qk = ("q_norm", "k_norm")
            out += [(f"{ours}.self_attn.inner.{n}.weight", (f"{sa}.{n}.weight",), norm_op) for n in qk]
        out += [(f"{ours}.{norm}.weight", (f"{theirs}.{name}.weight",), norm_op) for norm, name in fam.norms]
    out.append(("decoder.final_norm.weight", ("model.norm.weight",), norm_op))
    return out


def _latent(ours: str, theirs: str, *, q_rank: int | None) -> list[Rule]:
    """DeepSeek's latent attention (transformers' ``DeepseekV3Attention``), each projection as stored:
    the query latent ``q_a_proj``, its norm and ``q_b_proj`` (``q_proj`` without ``q_lora_rank``), the
    key/value latent beside the shared rotary key ``kv_a_proj_with_mqa``, its norm, every head's keys beside
    its values ``kv_b_proj``, and ``o_proj``."""
    out: list[Rule]
    if q_rank:
        out = [(f"{ours}.to_q_latent.weight", (f"{theirs}.q_a_proj.weight",), "copy")]
        out.append((f"{ours}.norm_q.weight", (f"{theirs}.q_a_layernorm.weight",), "copy"))
        out.append((f"{ours}.to_q.weight", (f"{theirs}.q_b_proj.weight",), "copy"))
    else:
        out = [(f"{ours}.to_q.weight", (f"{theirs}.q_proj.weight",), "copy")]
    out.append((f"{ours}.to_kv_latent.weight", (f"{theirs}.kv_a_proj_with_mqa.weight",), "copy"))
    out.append((f"{ours}.norm_kv.weight", (f"{theirs}.kv_a_layernorm.weight",), "copy"))
    out.append((f"{ours}.to_kv.weight", (f"{theirs}.kv_b_proj.weight",), "copy"))
    return out + [(f"{ours}.to_out.weight", (f"{theirs}.o_proj.weight",), "copy")]


def _decoder_ffn(fam: DecoderFamily, ffn: ComponentParams, ours: str, theirs: str, *, bias: bool) -> list[Rule]:
    """The feed-forward: a gated one (gate and up fused in Phi-3), or (Mixtral) a router and SwiGLU experts,
    as ``save_pretrained`` writes them: ``block_sparse_moe.experts.e.w1`` (gate), ``w3`` (up), ``w2`` (down)."""
    if isinstance(ffn, MixtureOfExperts.Params):
        block, gate, up, down = fam.expert_names
        sparse = theirs.replace(".mlp", f".{block}")
        out: list[Rule] = [(f"{ours}.router.weight", (f"{sparse}.gate.weight",), "copy")]
        for e in range(ffn.experts):
            expert = f"{sparse}.experts.{e}"
            out += _fused(f"{ours}.experts.{e}.ff_in", [f"{expert}.{gate}", f"{expert}.{up}"], bias=False)
            out += _linear(f"{ours}.experts.{e}.ff_out", f"{expert}.{down}", bias=False)
        return out + _shared(fam, ffn, ours, sparse)
    if FUSED in fam.features:
        out = _linear(f"{ours}.ff_in", f"{theirs}.gate_up_proj", bias=bias)
    else:
        out = _fused(f"{ours}.ff_in", [f"{theirs}.gate_proj", f"{theirs}.up_proj"], bias=bias)
    return out + _linear(f"{ours}.ff_out", f"{theirs}.down_proj", bias=bias)


def _shared(fam: DecoderFamily, ffn: MixtureOfExperts.Params, ours: str, sparse: str) -> list[Rule]:
    """DeepSeek-V3's selection-only ``gate.e_score_correction_bias``; the shared expert (DeepSeek-V3's
    ``shared_experts``, Qwen2-MoE's ``shared_expert``) and Qwen2-MoE's ``shared_expert_gate``."""
    out: list[Rule] = []
    if ffn.correction_bias:
        out.append((f"{ours}.correction_bias", (f"{sparse}.gate.e_score_correction_bias",), "copy"))
    if ffn.shared_experts:
        shared = f"{sparse}.{fam.shared_name or 'shared_expert'}"
        out += _fused(f"{ours}.shared.ff_in", [f"{shared}.gate_proj", f"{shared}.up_proj"], bias=False)
        out += _linear(f"{ours}.shared.ff_out", f"{shared}.down_proj", bias=False)
    if ffn.shared_gate:
        out.append((f"{ours}.shared_gate.weight", (f"{sparse}.shared_expert_gate.weight",), "copy"))
    return out


def _sources(rule: Rule, theirs: Mapping[str, object], file: str) -> tuple[str, ...]:
    """The Hugging Face names a rule reads (an ``any`` rule: the first present), each present in ``theirs``."""
    _, sources, op = rule
    if op == "any":
        sources = tuple(s for s in sources if s in theirs)[:1] or sources[:1]
    missing = [s for s in sources if s not in theirs]
    if missing:
        raise UnsupportedConfig(f"{file}: missing tensor {missing[0]}")
    return sources


def _shape(op: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape a rule makes of its sources' shapes (None: they do not concatenate)."""
    if op == "T":
        return tuple(reversed(shapes[0])) if len(shapes[0]) == 2 else None
    if op == "cat":
        if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
            return None
        return (sum(s[0] for s in shapes), *shapes[0][1:])
    return shapes[0]


def check_shapes(
    rules: list[Rule], theirs: Mapping[str, tuple[int, ...]], ours: Mapping[str, tuple[int, ...]], *, file: str
) -> None:
    """Refuse, before any weight is read or the model is built, a file whose tensors (``theirs``: name ->
    shape, from its header) do not fit the model the config describes (``ours``: its parameters' shapes),
    naming the tensor, the parameter, and the shape expected and found."""
    for rule in rules:
        key, _, op = rule
        sources = _sources(rule, theirs, file)
        if key not in ours:
            raise UnsupportedConfig(f"{file}: {sources[0]} has no place in the recipe ({key})")
        got = [tuple(theirs[s]) for s in sources]
        if _shape(op, got) != tuple(ours[key]):
            found = got[0] if len(got) == 1 else " + ".join(str(g) for g in got)
            raise UnsupportedConfig(
                f"{file}: {', '.join(sources)}: expected shape {_their_shape(op, tuple(ours[key]), len(sources))} "
                f"for {key} (from config.json), got {found}"
            )


def _their_shape(op: str, ours: tuple[int, ...], parts: int) -> str:
    """The shape a single Hugging Face tensor must have for ``ours`` (for a message)."""
    if op == "T":
        return str(tuple(reversed(ours)))
    if op == "cat" and parts > 1:
        return f"{parts} parts of {ours} along the first dimension"
    return str(ours)


def from_hf(
    rules: list[Rule], theirs: dict[str, Tensor], ours: dict[str, Tensor], *, file: str = "model.safetensors"
) -> dict[str, Tensor]:
    """Fill ``ours`` (a freshly built model's state dict: names and shapes) from ``theirs``; refuses
    (naming the tensor) one of another shape, one that is not floating point, and NaN or infinite values."""
    import torch

    shapes = {k: tuple(v.shape) for k, v in theirs.items()}
    check_shapes(rules, shapes, {k: tuple(v.shape) for k, v in ours.items()}, file=file)
    out = dict(ours)
    for rule in rules:
        key, _, op = rule
        sources = _sources(rule, theirs, file)
        tensors = [theirs[s] for s in sources]
        for name, tensor in zip(sources, tensors, strict=True):
            if not tensor.is_floating_point():
                dtype = str(tensor.dtype).removeprefix("torch.")
                raise UnsupportedConfig(f"{file}: {name} holds {dtype} values, not floating point weights")
            if not bool(torch.isfinite(tensor).all()):
                raise UnsupportedConfig(f"{file}: {name} holds NaN or infinite values")
        value = tensors[0].t() if op == "T" else torch.cat(tensors, dim=0) if op == "cat" else tensors[0]
        if op == "plus1":  # Gemma's RMSNorm multiplies by (1 + weight)
            value = value + 1
        out[key] = value.to(out[key].dtype).contiguous()
    return out


def to_hf(rules: list[Rule], ours: dict[str, Tensor], sizes: dict[str, list[int]]) -> dict[str, Tensor]:
    """The Hugging Face tensors of ``ours``; ``sizes[key]`` splits a fused tensor (tied ones appear once)."""
    out: dict[str, Tensor] = {}
    for key, targets, op in rules:
        if all(t in out for t in targets):
            continue  # a tied tensor, already written under its Hugging Face name
        value = ours[key]
        if op == "T":
            out[targets[0]] = value.t().contiguous()
        elif op == "cat":
            for t, part in zip(targets, value.split(sizes[key], dim=0), strict=True):
                out[t] = part.contiguous()
        elif op == "plus1":
            out[targets[0]] = (value - 1).contiguous()
        elif op == "any":
            for t in targets:
                out[t] = value.clone()  # safetensors refuses tensors that share memory
        else:
            out[targets[0]] = value.contiguous()
    return out


def split_sizes(model: nn.Module, family: str) -> dict[str, list[int]]:
    """How each fused tensor of a built model splits into its Hugging Face parts (by the modules' widths)."""
    sizes: dict[str, list[int]] = {}
    for name, module in model.named_modules():
        # A residual's attention or feed-forward says what it fused (the contract: every one has fused_widths).
        if isinstance(module, Residual) and isinstance(module.inner, _Fuses):
            for projection, widths in module.inner.fused_widths().items():
                sizes[f"{name}.inner.{projection}.weight"] = sizes[f"{name}.inner.{projection}.bias"] = widths
    return sizes
