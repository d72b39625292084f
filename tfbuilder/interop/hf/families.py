"""The Llama-like decoder families of Hugging Face transformers, as data: one :class:`DecoderFamily`
a family, naming what its ``config.json`` holds beyond the fields every one of them shares, how its
weights are named, and what it refuses. :mod:`tfbuilder.interop.hf.decoders` reads and writes them
with the same small functions for every family.

=========  ==========================  =====================================================================
family     architecture                beyond Llama
=========  ==========================  =====================================================================
llama      LlamaForCausalLM            (Llama 2 and 3, 3.1's ``rope_type: llama3``; every family below but
                                       Phi-3 takes linear, llama3, yarn and longrope rope types)
mistral    MistralForCausalLM          sliding window on every layer
qwen2      Qwen2ForCausalLM            biases on q, k and v only; sliding layers by ``layer_types``
qwen3      Qwen3ForCausalLM            RMS norm of each head's queries and keys
phi3       Phi3ForCausalLM             fused ``qkv_proj`` and ``gate_up_proj``; partial rotary; LongRoPE (128k)
gemma2     Gemma2ForCausalLM           sandwich norms stored as gain - 1, GeGLU (tanh), soft-caps, scaled
                                       embeddings, local/global layers
gemma3     Gemma3ForCausalLM           Gemma 2 with q/k RMS norms (gains stored minus one), a rotary base (and
                                       scaling) per layer type, no soft-caps by default
qwen3_moe  Qwen3MoeForCausalLM         Qwen3 with a mixture of SwiGLU experts of moe_intermediate_size (softmax
                                       router, top k renormalised if norm_topk_prob), a window on every layer
olmo2      Olmo2ForCausalLM            norms on the sub-layers' outputs only; q and k normalised over all heads
mixtral    MixtralForCausalLM          Mistral with a mixture of SwiGLU experts (softmax router, top-k renormalised)
deepseek   DeepseekV3ForCausalLM       multi-head latent attention (rotary pairs interleaved by rope_interleave),
_v3                                    sigmoid-routed experts with a choice-only correction bias, group-limited
                                       routing, routed_scaling_factor and shared experts; the first
                                       first_k_dense_replace layers dense
qwen2_moe  Qwen2MoeForCausalLM         Qwen2 (qkv_bias) with softmax-routed experts and one shared expert scaled
                                       by a sigmoid gate; dense layers by decoder_sparse_step and mlp_only_layers
=========  ==========================  =====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfbuilder.interop.hf.rope import ROPE_TYPES

# Features: each names a config field (or a few) that the shared readers and writers handle.
ATTENTION_BIAS = "attention_bias"  # attention_bias: biases on q, k, v and o (or none)
QKV_BIAS = "qkv_bias"  # biases on q, k and v, none on o, always (Qwen2)
MLP_BIAS = "mlp_bias"  # mlp_bias: biases in the gated feed-forward
WINDOW = "window"  # sliding_window on every layer (null: none)
LAYER_TYPES = "layer_types"  # layer_types: full_attention / sliding_attention per layer, with sliding_window
QK_NORM = "qk_norm"  # q_norm and k_norm: an RMS norm over each head's queries and keys
QK_NORM_ALL = "qk_norm_all"  # q_norm and k_norm over the whole query and key projections (OLMo 2)
FUSED = "fused"  # qkv_proj and gate_up_proj: projections stored fused (Phi-3)
GEMMA = "gemma"  # embeddings times sqrt(d_model), norm gains stored minus one, query_pre_attn_scalar, soft-caps
DROPOUTS = "dropouts"  # resid_pdrop (training only)
MOE = "moe"  # num_local_experts, num_experts_per_tok: a softmax-routed mixture of SwiGLU experts (Mixtral)
ORIGINAL_MAX = "original_max"  # original_max_position_embeddings at the top level, over rope_parameters' (Phi-3)
LAYER_ROPE = "layer_rope"  # rope_parameters per layer type, or rope_theta and rope_local_base_freq (Gemma 3)
PARTIAL_ROTARY = "partial_rotary"  # rope_parameters.partial_rotary_factor: rotate that fraction of each head
LATENT = "latent"  # q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim, rope_interleave (DeepSeek's MLA)
SIGMOID_MOE = "sigmoid_moe"  # DeepSeek-V3's experts: sigmoid router, correction bias, groups, shared experts
FIRST_DENSE = "first_dense"  # first_k_dense_replace: the first k layers dense (DeepSeek-V3)
SHARED_GATE = "shared_gate"  # shared_expert_intermediate_size: one shared expert scaled by a sigmoid gate
SPARSE_STEP = "sparse_step"  # decoder_sparse_step, mlp_only_layers: which layers are dense (Qwen2-MoE)
QKV_BIAS_FLAG = "qkv_bias_flag"  # qkv_bias: biases on q, k and v (none on o), or none (Qwen2-MoE)

PRE_NORMS = (("self_attn.norm", "input_layernorm"), ("ffn.norm", "post_attention_layernorm"))
SANDWICH_NORMS = (
    ("self_attn.norm", "input_layernorm"),
    ("self_attn.norm_out", "post_attention_layernorm"),
    ("ffn.norm", "pre_feedforward_layernorm"),
    ("ffn.norm_out", "post_feedforward_layernorm"),
)

MLP_EXPERTS = ("mlp", "gate_proj", "up_proj", "down_proj")  # mlp.experts.e.gate_proj, ... (Qwen-MoE, DeepSeek)
OUTPUT_NORMS = (("self_attn.norm", "post_attention_layernorm"), ("ffn.norm", "post_feedforward_layernorm"))
PLACEMENTS = {PRE_NORMS: "pre", SANDWICH_NORMS: "sandwich", OUTPUT_NORMS: "output"}


@dataclass(frozen=True)
class DecoderFamily:
    """A decoder family of transformers: its names, its features, transformers' defaults for the
    fields its config may leave out, and the fields it refuses unless they hold an allowed value."""

    name: str
    architecture: str
    features: frozenset[str] = frozenset()
    activation: tuple[str, str] = ("hidden_act", "silu")  # the field and the only value the family takes
    eps: float = 1e-6  # rms_norm_eps
    tie: bool = False  # tie_word_embeddings
    ids: dict[str, int | None] = field(default_factory=dict)  # bos/eos/pad_token_id when the config says none
    refused: tuple[tuple[str, tuple, object], ...] = ()  # (field, allowed values, default)
    norms: tuple[tuple[str, str], ...] = PRE_NORMS  # (our norm, theirs) in each layer
    source: str = ""  # the paper or model card
    rope_types: tuple[str, ...] = ROPE_TYPES  # the rope_type values its config takes
    hf_model_type: str = ""  # config.json's model_type when it is not the family's name
    sliding_pattern: int = 0  # layer_types when a config has none: every n-th layer full (sliding_window_pattern)
    attn_softcap: bool = True  # False: its model holds attn_logit_softcapping but never applies it (Gemma 3)
    # MoE: the sparse block's and its experts' weight names (gate, up, down), and the fields of the experts'
    # width and of renormalising the top k ("": intermediate_size, always renormalised, as Mixtral)
    expert_names: tuple[str, str, str, str] = ("block_sparse_moe", "w1", "w3", "w2")
    moe_hidden: str = ""
    moe_normalize: str = ""
    experts_field: str = "num_local_experts"  # the field of the routed experts' count, as save_pretrained writes it
    shared_name: str = ""  # the shared expert's module in the sparse block (DeepSeek's shared_experts)

    @property
    def model_type(self) -> str:
        return self.hf_model_type or self.name

    @property
    def placement(self) -> str:
        return PLACEMENTS[self.norms]


FAMILY_LIST = (
    DecoderFamily(
        "llama",
        "LlamaForCausalLM",
        frozenset({ATTENTION_BIAS, MLP_BIAS}),
        ids={"bos_token_id": 1, "eos_token_id": 2},
        refused=(("pretraining_tp", (1, None), 1),),
        source="Touvron et al. 2023, arXiv:2302.13971; Llama 3: Grattafiori et al. 2024, arXiv:2407.21783",
    ),
    DecoderFamily(
        "mistral",
        "MistralForCausalLM",
        frozenset({WINDOW}),
        ids={"bos_token_id": 1, "eos_token_id": 2},
        source="Jiang et al. 2023, Mistral 7B, arXiv:2310.06825",
    ),
    DecoderFamily(
        "qwen2",
        "Qwen2ForCausalLM",
        frozenset({QKV_BIAS, LAYER_TYPES}),
        source="Qwen2 (Yang et al. 2024, arXiv:2407.10671); Qwen2.5 (arXiv:2412.15115)",
    ),
    DecoderFamily(
        "qwen3",
        "Qwen3ForCausalLM",
        frozenset({ATTENTION_BIAS, LAYER_TYPES, QK_NORM}),
        source="Qwen3 technical report (Yang et al. 2025, arXiv:2505.09388)",
    ),
    DecoderFamily(
        "phi3",
        "Phi3ForCausalLM",
        frozenset({WINDOW, FUSED, DROPOUTS, PARTIAL_ROTARY, ORIGINAL_MAX}),
        eps=1e-5,
        ids={"bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000},
        source="Abdin et al. 2024, Phi-3 technical report, arXiv:2404.14219",
        rope_types=("default", "longrope"),  # Phi3Config refuses the others
    ),
    DecoderFamily(
        "gemma2",
        "Gemma2ForCausalLM",
        frozenset({ATTENTION_BIAS, LAYER_TYPES, GEMMA}),
        activation=("hidden_activation", "gelu_pytorch_tanh"),
        tie=True,
        ids={"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
        refused=(("use_bidirectional_attention", (None, False), None),),
        norms=SANDWICH_NORMS,
        source="Gemma Team 2024, Gemma 2, arXiv:2408.00118",
    ),
    DecoderFamily(
        "gemma3",
        "Gemma3ForCausalLM",
        frozenset({ATTENTION_BIAS, LAYER_TYPES, GEMMA, QK_NORM, LAYER_ROPE}),
        activation=("hidden_activation", "gelu_pytorch_tanh"),
        tie=True,
        ids={"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
        refused=(("use_bidirectional_attention", (None, False), False),),
        norms=SANDWICH_NORMS,
        source="Gemma Team 2025, Gemma 3 technical report, arXiv:2503.19786",
        hf_model_type="gemma3_text",
        sliding_pattern=6,
        attn_softcap=False,
    ),
    DecoderFamily(
        "mixtral",
        "MixtralForCausalLM",
        frozenset({WINDOW, MOE}),
        eps=1e-5,
        ids={"bos_token_id": 1, "eos_token_id": 2},
        source="Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088",
    ),
    DecoderFamily(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        frozenset({ATTENTION_BIAS, WINDOW, QK_NORM, MOE}),
        refused=(("decoder_sparse_step", (1, None), 1), ("mlp_only_layers", ([], None), [])),
        source="Qwen3 technical report (Yang et al. 2025, arXiv:2505.09388)",
        expert_names=("mlp", "gate_proj", "up_proj", "down_proj"),
        moe_hidden="moe_intermediate_size",
        moe_normalize="norm_topk_prob",
    ),
    DecoderFamily(
        "olmo2",
        "Olmo2ForCausalLM",
        frozenset({ATTENTION_BIAS, QK_NORM_ALL}),
        eps=1e-5,
        ids={"bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1},
        norms=OUTPUT_NORMS,
        source="OLMo et al. 2024, 2 OLMo 2 Furious, arXiv:2501.00656",
    ),
    DecoderFamily(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        frozenset({LATENT, SIGMOID_MOE, FIRST_DENSE}),
        ids={"bos_token_id": 0, "eos_token_id": 1},
        refused=(("pretraining_tp", (1, None), 1), ("attention_bias", (False,), False)),
        source="DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv:2412.19437; MLA: DeepSeek-V2, arXiv:2405.04434",
        rope_types=("default", "yarn"),  # DeepSeek's attention rescales its scores by YaRN's mscale_all_dim alone
        expert_names=MLP_EXPERTS,
        moe_hidden="moe_intermediate_size",
        moe_normalize="norm_topk_prob",
        experts_field="n_routed_experts",
        shared_name="shared_experts",
    ),
    DecoderFamily(
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        frozenset({QKV_BIAS_FLAG, LAYER_TYPES, MOE, SHARED_GATE, SPARSE_STEP}),
        source="Qwen1.5-MoE (Qwen Team 2024, qwenlm.github.io/blog/qwen-moe); Qwen2 (arXiv:2407.10671)",
        expert_names=MLP_EXPERTS,
        moe_hidden="moe_intermediate_size",
        moe_normalize="norm_topk_prob",
        experts_field="num_experts",
        shared_name="shared_expert",
    ),
)
DECODERS = {f.name: f for f in FAMILY_LIST}
ARCHITECTURES = {f.architecture: f.name for f in FAMILY_LIST}
